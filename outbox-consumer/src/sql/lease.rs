//! The lease: the consumer row (`lifecycle_consumers`: claim, take-over, release, reactivation,
//! the fence's lock) and its renewals (`lifecycle_lease_renewals`: a consumer's heartbeat and a
//! set's).

/// The insert of a renewal, every column the runtime writes.
macro_rules! insert_renewal {
    () => {
        "INSERT INTO {{schema}}.lifecycle_lease_renewals
    (project_id, consumer_id, lease_generation, lease_expires_at, heartbeat_at)"
    };
}

/// Locks the consumer row (when it exists) for the claim that follows in the same
/// transaction. A renewal holds this lock until it commits, so once it is granted every
/// renewal sent before it has committed, and the claim's own statement, which takes its
/// snapshot after this one, reads them all. In one statement the claim would read the
/// renewals in a snapshot taken before it waited: a renewal in flight would then go unseen,
/// the claim would take a lease its holder had just renewed, and the holder, told its renewal
/// succeeded, would dispatch until its next fenced write, beside the new holder.
pub const LOCK_FOR_CLAIM: &str = "
SELECT 1 FROM {{schema}}.lifecycle_consumers
WHERE project_id = $1 AND consumer_id = $2
FOR NO KEY UPDATE";

/// Claims the consumer's row when it is free or its lease has expired (generation + 1).
/// Creates the row, with a missing (NULL) cursor, for a new consumer, and says whether it did
/// (`xmax = 0` holds only for a freshly inserted row). `$4`: lease seconds. Sent after
/// [`LOCK_FOR_CLAIM`], in its transaction.
pub const CLAIM: &str = concat!(
    "
INSERT INTO {{schema}}.lifecycle_consumers AS c
    (project_id, consumer_id, lease_owner, lease_generation, claimed_until, claimed_at)
VALUES ($1, $2, $3, 1, now() + make_interval(secs => $4), now())
ON CONFLICT (project_id, consumer_id) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner,
    lease_generation = c.lease_generation + 1,
    claimed_until = EXCLUDED.claimed_until,
    claimed_at = EXCLUDED.claimed_at
WHERE c.state = 'active'
  AND (c.lease_owner IS NULL OR ",
    lease_expiry!(),
    " <= now())
RETURNING c.lease_generation, (c.xmax = 0) AS created"
);

/// Takes a lease over from a holder known to be gone before it expired. `$5`, `$6`: the
/// holder and generation just read; if either moved since, nothing changes (the claim looks
/// again). The generation is bumped as in a claim, so the old holder's fence is void.
pub const TAKE_OVER: &str = "
UPDATE {{schema}}.lifecycle_consumers
SET lease_owner = $3, lease_generation = lease_generation + 1,
    claimed_until = now() + make_interval(secs => $4), claimed_at = now()
WHERE project_id = $1 AND consumer_id = $2 AND state = 'active'
  AND lease_owner = $5 AND lease_generation = $6
RETURNING lease_generation, false AS created";

/// Why a claim found nothing: who holds the row, until when, and whether it is retired.
pub const CONSUMER_ROW: &str = concat!(
    "
SELECT c.state, c.lease_owner, c.lease_generation,
       GREATEST(extract(epoch FROM ",
    lease_expiry!(),
    " - now()), 0)::float8 AS expires_in,
       c.retired_by, c.retired_reason
FROM {{schema}}.lifecycle_consumers AS c
WHERE c.project_id = $1 AND c.consumer_id = $2"
);

/// Makes a retired consumer active again with a missing cursor, so it reconciles. The
/// generation is bumped so that a runtime that held the lease before retirement never finds its
/// fence valid again; an unexpired lease is kept (its last renewal carried into the row, as
/// the bumped generation leaves the renewals behind), so the new claim waits for it to run out
/// rather than overlap with a holder that has not noticed yet.
pub const REACTIVATE: &str = concat!(
    "
WITH reactivated AS (
    UPDATE {{schema}}.lifecycle_consumers AS c
    SET state = 'active', retired_at = NULL, retired_by = NULL, retired_reason = NULL,
        lease_generation = c.lease_generation + 1,
        claimed_until = ",
    lease_expiry!(),
    ",
        claimed_at = COALESCE(",
    current_renewal!("heartbeat_at"),
    ", c.claimed_at)
    WHERE c.project_id = $1 AND c.consumer_id = $2 AND c.state = 'retired'
    RETURNING 1
),
was AS (",
    current_position!(),
    "),
replaced AS (
    DELETE FROM {{schema}}.lifecycle_consumer_positions AS p
    WHERE p.project_id = $1 AND p.consumer_id = $2
      AND p.position_id = (SELECT was.position_id FROM reactivated, was)
),
missing AS (
    ",
    insert_position!(),
    "
    SELECT $1, $2, NULL, NULL, was.last_acked_at, was.reconciled_at
    FROM reactivated LEFT JOIN was ON true
)
SELECT count(*) AS reactivated FROM reactivated"
);

/// Extends the lease: appends a renewal under the fence and deletes the one it replaces by
/// its exact key, as a position write does. One row changed (inserted) when the lease was
/// still ours. `$5`: lease seconds.
pub const HEARTBEAT: &str = concat!(
    "
WITH fence AS (",
    fence!(),
    "),
was AS (
    SELECT newest.renewal_id
    FROM (",
    newest_renewal_at_or_below!("$1", "$2"),
    ") AS newest
    WHERE newest.project_id = $1 AND newest.consumer_id = $2
),
replaced AS (
    DELETE FROM {{schema}}.lifecycle_lease_renewals AS r
    WHERE r.project_id = $1 AND r.consumer_id = $2
      AND r.renewal_id = (SELECT was.renewal_id FROM fence, was)
)
",
    insert_renewal!(),
    "
SELECT $1, $2, $4, now() + make_interval(secs => $5), now()
FROM fence"
);

/// Gives the lease up at shutdown so a successor need not wait for expiry.
pub const RELEASE: &str = "
UPDATE {{schema}}.lifecycle_consumers
SET lease_owner = NULL, claimed_until = NULL
WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4";

/// Locks the consumer row for the rest of a transaction if the lease is still ours; every
/// multi-statement fenced write starts with it, so a takeover waits for the commit. `$5`
/// (milliseconds, as text) bounds the transaction's idle time: a holder paused with the row
/// locked is disconnected by the server rather than blocking its successor forever.
pub const LOCK_FENCE: &str = "
SELECT set_config('idle_in_transaction_session_timeout', $5, true)
FROM {{schema}}.lifecycle_consumers
WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
  AND state = 'active'
FOR NO KEY UPDATE";

/// Extends every lease a consumer set holds, in one statement however many it holds: `$1`
/// projects, `$2` consumers and `$3` generations (parallel arrays), `$4` the set's lease
/// owner, `$5` lease seconds. Returns the pairs renewed; a pair missing from the answer lost
/// its lease (claimed by another process, retired or gone). Each renewal is written as in
/// [`HEARTBEAT`], the replaced ones deleted by the addresses the read of the newest found, as
/// [`ACK_SET`](super::ACK_SET) deletes positions and for its reason. Its lock order is safe
/// for the reason [`ACK_SET`](super::ACK_SET) gives: a set never runs the two at the same
/// time.
pub const HEARTBEAT_SET: &str = concat!(
    "
WITH h AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
        AS h(project_id, consumer_id, generation)
),
fence AS (
    SELECT c.project_id, c.consumer_id, c.lease_generation
    FROM {{schema}}.lifecycle_consumers AS c
    JOIN h ON c.project_id = h.project_id AND c.consumer_id = h.consumer_id
    WHERE c.lease_owner = $4 AND c.lease_generation = h.generation AND c.state = 'active'
    FOR NO KEY UPDATE OF c
),
was AS (
    SELECT w.row_id
    FROM fence
    CROSS JOIN LATERAL (",
    newest_renewal_at_or_below!("fence.project_id", "fence.consumer_id"),
    ") AS w
    WHERE w.project_id = fence.project_id AND w.consumer_id = fence.consumer_id
),
replaced AS (
    DELETE FROM {{schema}}.lifecycle_lease_renewals
    WHERE ctid = ANY (ARRAY(SELECT row_id FROM was))
)
",
    insert_renewal!(),
    "
SELECT project_id, consumer_id, lease_generation, now() + make_interval(secs => $5), now()
FROM fence
RETURNING project_id, consumer_id"
);
