//! Every SQL statement of the consumer runtime, as templates over `{{schema}}`.
//!
//! Fenced statements take `$1` project, `$2` consumer, `$3` lease owner, `$4` generation and
//! change nothing unless that lease is still the current one of an active consumer.
//!
//! A consumer's lease and state live in its `lifecycle_consumers` row; its position is the
//! newest of its `lifecycle_consumer_positions` rows (migration 0011). A position write locks
//! the consumer row under the fence (a row lock writes no new version), appends the new
//! position and deletes the one it replaces by its exact key, so no read of a position ever
//! walks the versions an old snapshot keeps. The lock is what keeps the position current for
//! the statement: every other writer of a consumer's positions (a claim, a takeover, a
//! reactivation) changes the lease generation or the state, which voids the fence.
//!
//! Renewals are written the same way (migration 0012): a heartbeat appends the lease's new
//! expiry to `lifecycle_lease_renewals` under the fence and deletes the renewal it replaces,
//! so the consumer row changes only when the lease changes hands or the consumer its state,
//! and the row every fenced write locks keeps one version however old the oldest snapshot is.
//! The row's `claimed_until` and `claimed_at` are what the claim gave the lease; the lease's
//! expiry and heartbeat are the newest renewal's when it belongs to the row's generation (see
//! `lease_expiry!`).

/// The fence as a row lock on the consumer row: one row while lease `$3`/`$4` is current.
macro_rules! fence {
    () => {
        "SELECT 1 FROM {{schema}}.lifecycle_consumers
     WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
       AND state = 'active'
     FOR NO KEY UPDATE"
    };
}

/// The newest row of an append-only table keyed `(project_id, consumer_id, $id)` at or below
/// `(project, consumer)` in key order, from the high end of its key: the current row of that
/// consumer when it has one (the caller keeps the row only if it is that consumer's). Every
/// replaced row lies below the current one in the key, so the backward scan stops at its
/// first entry however many a held snapshot keeps. The bound is a row comparison rather than
/// equalities so that the plan is that scan whatever the statistics: with equalities the
/// planner estimates one row, which leaves the ordered scan no cheaper than a bitmap scan and
/// a sort, which read every entry of the consumer (measured under a held snapshot: 261
/// buffers a consumer against 3). The bound's estimate (a third of the table) makes the scan
/// that stops at once the cheap plan.
macro_rules! newest_at_or_below {
    ($table:literal, $id:literal, $columns:literal, $project:literal, $consumer:literal) => {
        concat!(
            "SELECT ctid AS row_id, project_id, consumer_id, ",
            $id,
            ", ",
            $columns,
            "
     FROM {{schema}}.",
            $table,
            "
     WHERE (project_id, consumer_id, ",
            $id,
            ") <= (",
            $project,
            ", ",
            $consumer,
            ", 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, ",
            $id,
            " DESC
     LIMIT 1"
        )
    };
}

/// The newest positions row at or below `(project, consumer)` (see [`newest_at_or_below!`]).
macro_rules! newest_position_at_or_below {
    ($project:literal, $consumer:literal) => {
        newest_at_or_below!(
            "lifecycle_consumer_positions",
            "position_id",
            "last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at",
            $project,
            $consumer
        )
    };
}

/// The newest renewals row at or below `(project, consumer)` (see [`newest_at_or_below!`]).
macro_rules! newest_renewal_at_or_below {
    ($project:literal, $consumer:literal) => {
        newest_at_or_below!(
            "lifecycle_lease_renewals",
            "renewal_id",
            "lease_generation, lease_expires_at, heartbeat_at",
            $project,
            $consumer
        )
    };
}

/// `$column` of the newest renewal of consumer row `c`, when that renewal belongs to the row's
/// lease generation (NULL when the lease has not been renewed since it was claimed). A renewal
/// of an earlier generation, committed just before a takeover, is never the new lease's.
macro_rules! current_renewal {
    ($column:literal) => {
        concat!(
            "(SELECT newest.",
            $column,
            " FROM (",
            newest_renewal_at_or_below!("c.project_id", "c.consumer_id"),
            ") AS newest
      WHERE newest.project_id = c.project_id AND newest.consumer_id = c.consumer_id
        AND newest.lease_generation = c.lease_generation)"
        )
    };
}

/// When the lease of consumer row `c` expires: its newest renewal's expiry, or the claim's
/// (`claimed_until`) while it has none. Read against the row version the statement locked, so a claim that
/// waited for another claim judges the lease that one took.
macro_rules! lease_expiry {
    () => {
        concat!(
            "COALESCE(",
            current_renewal!("lease_expires_at"),
            ", c.claimed_until)"
        )
    };
}

/// The consumer's current position row (none while it never had one).
macro_rules! current_position {
    () => {
        concat!(
            "SELECT position_id, last_acked_sequence, last_acked_at, reconciled_at
     FROM (",
            newest_position_at_or_below!("$1", "$2"),
            ") AS newest
     WHERE project_id = $1 AND consumer_id = $2"
        )
    };
}

/// The identity of project `$1`'s event numbered `$seq` (NULL when none is retained).
macro_rules! event_id_at {
    ($seq:literal) => {
        concat!(
            "(SELECT o.event_id FROM {{schema}}.lifecycle_outbox AS o
         WHERE o.project_id = $1 AND o.sequence = ",
            $seq,
            ")"
        )
    };
}

/// Deletes the position `was` names, when the fence holds and `$cond` (over `was`) is true:
/// the replaced half of a position write. The position is given as a value (a scalar
/// subquery, at most one row), so the delete is one probe of the whole key: written as a join
/// with `was`, the plan matches the key on project and consumer only and filters the position,
/// walking every entry the consumer's replaced positions left in the index, which a held
/// snapshot keeps (248 buffers after 20,000 acknowledgements, against 4).
macro_rules! replace_position {
    ($cond:literal) => {
        concat!(
            "DELETE FROM {{schema}}.lifecycle_consumer_positions AS p
     WHERE p.project_id = $1 AND p.consumer_id = $2
       AND p.position_id = (SELECT was.position_id FROM fence, was WHERE ",
            $cond,
            ")"
        )
    };
}

/// The head of every fenced position write: `fence` (the lock), `was` (the current position)
/// and `replaced` (its deletion when `$cond` holds). The statement then appends the new
/// position under the same condition.
macro_rules! replacing_position {
    ($cond:literal) => {
        concat!(
            "
WITH fence AS (",
            fence!(),
            "),
was AS (",
            current_position!(),
            "),
replaced AS (",
            replace_position!($cond),
            ")"
        )
    };
}

/// The insert of a new position, every column the runtime writes.
macro_rules! insert_position {
    () => {
        "INSERT INTO {{schema}}.lifecycle_consumer_positions
        (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
         reconciled_at)"
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

/// The insert of a renewal, every column the runtime writes.
macro_rules! insert_renewal {
    () => {
        "INSERT INTO {{schema}}.lifecycle_lease_renewals
    (project_id, consumer_id, lease_generation, lease_expires_at, heartbeat_at)"
    };
}

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

/// Advances the cursor. `$5`: the new last acknowledged sequence; `$6`: the cursor this
/// process left (the acknowledgement changes nothing unless the database's cursor is still
/// there: after a failover that lost a tail it is not). The cursor records the identity of
/// the event it now stands on.
pub const ACK: &str = concat!(
    replacing_position!("was.last_acked_sequence = $6"),
    "
",
    insert_position!(),
    "
SELECT $1, $2, $5, ",
    event_id_at!("$5"),
    ", now(), was.reconciled_at
FROM fence, was
WHERE was.last_acked_sequence = $6"
);

/// Whether project `$1` has committed events still waiting for a number, read from the
/// sequencer's frontier (migration 0010): what it has not numbered yet, however old the
/// oldest snapshot is.
///
/// The frontier's work is read in its `(xid, id)` order, which only the frontier index yields
/// without a sort, and the project is matched outside that subquery (`OFFSET 0` keeps the
/// filter from being pushed into it). Statistics taken during a backlog make
/// `sequence IS NULL` look common; with both conditions on the table, the planner then answers
/// with a sequential scan of the whole table (for a project holding most of it) or a walk of
/// the project's whole history through the `(project_id, event_id)` key (for a small one),
/// even when nothing waits. During a real backlog this reads the work up to the project's
/// first waiting event.
pub const HAS_UNSEQUENCED: &str = "
SELECT EXISTS (SELECT FROM (SELECT project_id FROM {{schema}}.lifecycle_outbox_unsequenced
                            OFFSET 0) AS work
               WHERE project_id = $1) AS waiting";

/// Moves the cursor without acknowledging a delivery (past a parked event, or to the floor for
/// an earliest start). `$5`: the new cursor.
pub const MOVE_CURSOR: &str = concat!(
    replacing_position!("true"),
    "
",
    insert_position!(),
    "
SELECT $1, $2, $5, ",
    event_id_at!("$5"),
    ", was.last_acked_at, was.reconciled_at
FROM fence LEFT JOIN was ON true"
);

/// Records a reconciliation's cursor. `$5`: the snapshot's head.
pub const RECORD_RECONCILED: &str = concat!(
    replacing_position!("true"),
    "
",
    insert_position!(),
    "
SELECT $1, $2, $5, ",
    event_id_at!("$5"),
    ", was.last_acked_at, now()
FROM fence LEFT JOIN was ON true"
);

/// The project's head and retention floor (zero for a project with no events yet).
pub const PROJECT_BOUNDS: &str = "
SELECT COALESCE(max(head_sequence), 0) AS head_sequence,
       COALESCE(max(pruned_through), 0) AS pruned_through
FROM {{schema}}.lifecycle_project_heads
WHERE project_id = $1";

/// Whether the consumer ever had a position (a cursor, or the missing one a reactivation
/// records): a consumer registered by a process that stopped before its first position is as
/// new as one registered now.
pub const EVER_POSITIONED: &str = "
SELECT EXISTS (SELECT 1 FROM {{schema}}.lifecycle_consumer_positions
               WHERE project_id = $1 AND consumer_id = $2) AS positioned";

/// The event's columns, of `lifecycle_outbox AS o`, that every statement whose rows
/// `store::decode` reads starts with, in the order it reads them by position.
macro_rules! event_columns {
    () => {
        "o.sequence, o.event_type, o.event_id, o.task_id, o.deleted_at, o.writer_process_id,
       o.occurred_at, o.payload_version, o.payload, o.type_minor, o.traceparent"
    };
}

/// Every registered contract's type and major (a consumer's declared types are checked
/// against them at its start).
pub const CONTRACTS: &str = "
SELECT event_type, major FROM {{schema}}.lifecycle_event_contracts";

/// Up to `$3` sequenced events after cursor `$2`, in order.
pub const READ_BATCH: &str = concat!(
    "
SELECT ",
    event_columns!(),
    "
FROM {{schema}}.lifecycle_outbox AS o
WHERE o.project_id = $1 AND o.sequence > $2
ORDER BY o.sequence
LIMIT $3"
);

/// The retrying delivery that holds the cursor, with the time left until its next attempt
/// measured on the database clock (so a restarted process honours it exactly).
pub const HELD_DELIVERY: &str = "
SELECT sequence, event_id, attempts,
       GREATEST(extract(epoch FROM next_attempt_at - now()), 0)::float8 AS wait
FROM {{schema}}.lifecycle_deliveries
WHERE project_id = $1 AND consumer_id = $2 AND state = 'retrying' AND sequence = $3";

/// The deliveries a run with lanes finds ahead of its cursor when it starts over from the
/// cursor: a retrying one waits for its next attempt (measured on the database clock) and
/// holds its key; any other was parked by lanes before the cursor reached it, and is not
/// delivered again. `$3` the cursor, `$4` the end of the window.
pub const LANE_RETRIES: &str = "
SELECT sequence, attempts, state = 'retrying' AS retrying,
       GREATEST(extract(epoch FROM next_attempt_at - now()), 0)::float8 AS wait
FROM {{schema}}.lifecycle_deliveries
WHERE project_id = $1 AND consumer_id = $2 AND sequence > $3 AND sequence <= $4";

/// Counts a failed attempt. An existing row of an earlier pass over the same event (parked,
/// resolved or replayed before a reactivated consumer went through history again) starts a
/// new delivery history; the audit trail keeps the old one. `$3` event, `$4` sequence, `$5` attempts so far, `$6` seconds
/// until the next attempt, `$7` failure class. Run inside a fenced transaction.
pub const RECORD_RETRY: &str = "
INSERT INTO {{schema}}.lifecycle_deliveries AS d
    (project_id, consumer_id, event_id, sequence, attempts, next_attempt_at,
     last_failure_class, state)
VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6), $7, 'retrying')
ON CONFLICT (project_id, consumer_id, event_id) DO UPDATE
SET attempts = EXCLUDED.attempts, next_attempt_at = EXCLUDED.next_attempt_at,
    last_failure_class = EXCLUDED.last_failure_class, state = 'retrying', updated_at = now(),
    first_failed_at = CASE WHEN d.state = 'retrying' THEN d.first_failed_at ELSE now() END,
    parked_at = NULL, resolved_at = NULL, resolved_by = NULL, resolved_reason = NULL";

/// Parks an event as a dead letter. Same parameters as [`RECORD_RETRY`] without `$6`.
pub const PARK: &str = "
INSERT INTO {{schema}}.lifecycle_deliveries AS d
    (project_id, consumer_id, event_id, sequence, attempts, next_attempt_at,
     last_failure_class, state, parked_at)
VALUES ($1, $2, $3, $4, $5, NULL, $6, 'dead', now())
ON CONFLICT (project_id, consumer_id, event_id) DO UPDATE
SET attempts = EXCLUDED.attempts, next_attempt_at = NULL,
    last_failure_class = EXCLUDED.last_failure_class, state = 'dead', parked_at = now(),
    updated_at = now(), resolved_at = NULL, resolved_by = NULL, resolved_reason = NULL";

/// Forgets retry state of events the cursor has passed. `$3`: the cursor.
pub const CLEAR_PASSED_RETRIES: &str = "
DELETE FROM {{schema}}.lifecycle_deliveries
WHERE project_id = $1 AND consumer_id = $2 AND state = 'retrying' AND sequence <= $3";

/// Advances the cursor to `$5` and forgets retry state it passed, in one statement (one round
/// trip, no explicit transaction). Fenced like [`ACK`]: returns `acked` = 0, and changes
/// nothing, when the lease is no longer ours.
pub const ACK_CLEARING: &str = concat!(
    replacing_position!("was.last_acked_sequence = $6"),
    ",
acked AS (
    ",
    insert_position!(),
    "
    SELECT $1, $2, $5, ",
    event_id_at!("$5"),
    ", now(), was.reconciled_at
    FROM fence, was
    WHERE was.last_acked_sequence = $6
    RETURNING 1
),
cleared AS (
    DELETE FROM {{schema}}.lifecycle_deliveries
    WHERE project_id = $1 AND consumer_id = $2 AND state = 'retrying' AND sequence <= $5
      AND EXISTS (SELECT 1 FROM acked)
)
SELECT count(*) AS acked FROM acked"
);

/// A failed attempt recorded with the acknowledgement of the prefix handled before it, in one
/// statement: the cursor advances to `$5` (unchanged when nothing was handled), retry state it
/// passed is forgotten, and the failed event (`$6` event, `$7` sequence, `$8` attempts so far,
/// `$9` seconds until the next attempt, `$10` failure class) is saved as in [`RECORD_RETRY`].
/// Fenced like [`ACK`]: returns `acked` = 0, and changes nothing, when the lease is gone.
pub const ACK_AND_RETRY: &str = concat!(
    replacing_position!("was.last_acked_sequence = $11"),
    ",
acked AS (
    ",
    insert_position!(),
    "
    SELECT $1, $2, $5, ",
    event_id_at!("$5"),
    ",
           CASE WHEN $5 IS DISTINCT FROM was.last_acked_sequence THEN now()
                ELSE was.last_acked_at END,
           was.reconciled_at
    FROM fence, was
    WHERE was.last_acked_sequence = $11
    RETURNING 1
),
cleared AS (
    DELETE FROM {{schema}}.lifecycle_deliveries
    WHERE project_id = $1 AND consumer_id = $2 AND state = 'retrying' AND sequence <= $5
      AND EXISTS (SELECT 1 FROM acked)
),
retried AS (
    INSERT INTO {{schema}}.lifecycle_deliveries AS d
        (project_id, consumer_id, event_id, sequence, attempts, next_attempt_at,
         last_failure_class, state)
    SELECT $1, $2, $6, $7, $8, now() + make_interval(secs => $9), $10, 'retrying'
    WHERE EXISTS (SELECT 1 FROM acked)
    ON CONFLICT (project_id, consumer_id, event_id) DO UPDATE
    SET attempts = EXCLUDED.attempts, next_attempt_at = EXCLUDED.next_attempt_at,
        last_failure_class = EXCLUDED.last_failure_class, state = 'retrying',
        updated_at = now(),
        first_failed_at = CASE WHEN d.state = 'retrying' THEN d.first_failed_at ELSE now() END,
        parked_at = NULL, resolved_at = NULL, resolved_by = NULL, resolved_reason = NULL
)
SELECT count(*) AS acked FROM acked"
);

/// [`LOCK_FENCE`] in share mode, for the transaction of a transactional handler with lanes:
/// several of them hold it at once (each lane its own), while a takeover, a claim or a
/// renewal, which update or lock the row exclusively, still wait for their commits.
pub const LOCK_FENCE_SHARED: &str = "
SELECT set_config('idle_in_transaction_session_timeout', $5, true)
FROM {{schema}}.lifecycle_consumers
WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
  AND state = 'active'
FOR SHARE";

/// The receipt of event `$3` handled above the cursor by a transactional handler with lanes,
/// inserted in the handler's transaction (migration 0018). A receipt already there fails the
/// insert, and with it the handler's transaction: its effect is never applied twice.
pub const INSERT_RECEIPT: &str = "
INSERT INTO {{schema}}.lifecycle_lane_receipts (project_id, consumer_id, sequence)
VALUES ($1, $2, $3)";

/// The events above cursor `$3` a transactional handler with lanes already handled: a run
/// that starts over from the cursor skips them.
pub const LANE_RECEIPTS: &str = "
SELECT sequence FROM {{schema}}.lifecycle_lane_receipts
WHERE project_id = $1 AND consumer_id = $2 AND sequence > $3";

/// The acknowledgement of lanes: the cursor moves from `$6` to `$5` (or stays, `$5` = `$6`,
/// to record only `$7`), the position records `$7`, the highest sequence handled or parked
/// beyond it, retry state it passed is forgotten when `$8`, and the receipts it passes are
/// deleted. The fence is taken in share mode, as the lanes' handler transactions take it, so
/// the acknowledgement does not wait for the handlers running. Fenced like [`ACK`]: returns
/// `acked` = 0, and changes nothing, when the lease is gone or the cursor is not at `$6`.
pub const LANE_ACK: &str = concat!(
    "
WITH fence AS (
    SELECT 1 FROM {{schema}}.lifecycle_consumers
    WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
      AND state = 'active'
    FOR SHARE),
was AS (",
    current_position!(),
    "),
replaced AS (",
    replace_position!("was.last_acked_sequence = $6"),
    "),
acked AS (
    INSERT INTO {{schema}}.lifecycle_consumer_positions
        (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
         reconciled_at, handled_through)
    SELECT $1, $2, $5, ",
    event_id_at!("$5"),
    ",
           CASE WHEN $5 IS DISTINCT FROM was.last_acked_sequence THEN now()
                ELSE was.last_acked_at END,
           was.reconciled_at, $7
    FROM fence, was
    WHERE was.last_acked_sequence = $6
    RETURNING 1
),
cleared AS (
    DELETE FROM {{schema}}.lifecycle_deliveries
    WHERE project_id = $1 AND consumer_id = $2 AND state = 'retrying' AND sequence <= $5
      AND $8 AND EXISTS (SELECT 1 FROM acked)
),
passed AS (
    DELETE FROM {{schema}}.lifecycle_lane_receipts
    WHERE project_id = $1 AND consumer_id = $2 AND sequence <= $5
      AND EXISTS (SELECT 1 FROM acked)
)
SELECT count(*) AS acked FROM acked"
);

/// Dead letters an operator asked to replay, with their events.
pub const REPLAY_REQUESTED: &str = concat!(
    "
SELECT ",
    event_columns!(),
    ", d.attempts
FROM {{schema}}.lifecycle_deliveries AS d
JOIN {{schema}}.lifecycle_outbox AS o
  ON o.project_id = d.project_id AND o.event_id = d.event_id
WHERE d.project_id = $1 AND d.consumer_id = $2 AND d.state = 'replay_requested'
ORDER BY o.sequence
LIMIT 100"
);

/// Marks a replayed dead letter. `$3` event. Run inside a fenced transaction.
pub const MARK_REPLAYED: &str = "
UPDATE {{schema}}.lifecycle_deliveries
SET state = 'replayed', attempts = attempts + 1, updated_at = now()
WHERE project_id = $1 AND consumer_id = $2 AND event_id = $3 AND state = 'replay_requested'
RETURNING attempts, replay_requested_by";

/// Returns a failed replay to the dead letters. `$3` event, `$4` failure class.
pub const MARK_REPLAY_FAILED: &str = "
UPDATE {{schema}}.lifecycle_deliveries
SET state = 'dead', attempts = attempts + 1, last_failure_class = $4, updated_at = now()
WHERE project_id = $1 AND consumer_id = $2 AND event_id = $3 AND state = 'replay_requested'
RETURNING attempts, replay_requested_by";

/// Extends every lease a consumer set holds, in one statement however many it holds: `$1`
/// projects, `$2` consumers and `$3` generations (parallel arrays), `$4` the set's lease
/// owner, `$5` lease seconds. Returns the pairs renewed; a pair missing from the answer lost
/// its lease (claimed by another process, retired or gone). Each renewal is written as in
/// [`HEARTBEAT`], the replaced ones deleted by the addresses the read of the newest found, as
/// [`ACK_SET`] deletes positions and for its reason. Its lock order is safe for the reason
/// [`ACK_SET`] gives: a set never runs the two at the same time.
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

/// Acknowledges for many consumers of a set in one statement: `$1` projects, `$2`
/// consumers, `$3` generations, `$4` new cursors (parallel arrays, one consumer at most once),
/// `$5` the set's lease owner. Fenced per consumer like [`ACK`] (a row changed meanwhile is
/// checked again in its new version); returns the pairs it acknowledged, so a pair missing
/// from the answer lost its lease.
///
/// Each consumer's position is replaced as in [`ACK`]: its row is locked (not rewritten), its
/// new position appended and the old one deleted, by the physical addresses the read of the
/// current positions found (one array, so the plan is a TID scan of exactly those rows; as a
/// join on the key the planner may match project and consumer only and walk every replaced
/// entry a held snapshot keeps: 3 → 2,970 buffers in the regression test). Nothing else
/// removes a fenced consumer's position, so the addresses cannot change in between. The set
/// runs it under [`KEY_SCANS_ONLY`].
///
/// The row locks are taken in whatever order the plan visits them, which is safe because a
/// set sends its multi-row writes, this and [`HEARTBEAT_SET`], one at a time; every other
/// write to a consumer row touches that row alone, and no other process acknowledges for a
/// lease this set holds.
pub const ACK_SET: &str = concat!(
    "
WITH a AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $6::bigint[])
        AS a(project_id, consumer_id, generation, through, left_at)
),
fence AS (
    SELECT c.project_id, c.consumer_id
    FROM {{schema}}.lifecycle_consumers AS c
    JOIN a ON c.project_id = a.project_id AND c.consumer_id = a.consumer_id
    WHERE c.lease_owner = $5 AND c.lease_generation = a.generation AND c.state = 'active'
    FOR NO KEY UPDATE OF c
),
was AS (
    SELECT a.project_id, a.consumer_id, a.through, w.row_id, w.reconciled_at
    FROM a
    JOIN fence ON fence.project_id = a.project_id AND fence.consumer_id = a.consumer_id
    CROSS JOIN LATERAL (",
    newest_position_at_or_below!("a.project_id", "a.consumer_id"),
    ") AS w
    WHERE w.project_id = a.project_id AND w.consumer_id = a.consumer_id
      AND w.last_acked_sequence = a.left_at
),
replaced AS (
    DELETE FROM {{schema}}.lifecycle_consumer_positions
    WHERE ctid = ANY (ARRAY(SELECT row_id FROM was))
)
INSERT INTO {{schema}}.lifecycle_consumer_positions
    (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
     reconciled_at)
SELECT was.project_id, was.consumer_id, was.through,
       (SELECT o.event_id FROM {{schema}}.lifecycle_outbox AS o
        WHERE o.project_id = was.project_id AND o.sequence = was.through),
       now(), was.reconciled_at
FROM was
RETURNING project_id, consumer_id"
);

/// Planner settings for the rest of a grouped acknowledgement's transaction: key scans only.
/// The set's statement is prepared once per connection and its generic plan kept; a plan made
/// while the positions table was a page or two may scan it whole for each consumer, and keeps
/// doing so while a held snapshot grows the table, until the statistics change (in the
/// benchmark, 1,193 buffers an acknowledgement in the first minute of a hold, 47 once
/// autovacuum had refreshed them). Made under these settings, the kept plan is the key scans.
pub const KEY_SCANS_ONLY: &str = "
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)";

/// A consumer set's fallback poll, one statement for all its consumers: the head of every
/// project in `$1` (every project with a head when `$1` is NULL, which is how a set following
/// all projects discovers new ones), with the consumers among `$2` that have a dead letter
/// waiting for replay.
pub const POLL_SET: &str = "
SELECT h.project_id, h.head_sequence,
       ARRAY(SELECT DISTINCT d.consumer_id
             FROM {{schema}}.lifecycle_deliveries AS d
             WHERE d.project_id = h.project_id AND d.consumer_id = ANY($2::text[])
               AND d.state = 'replay_requested') AS replay_requested
FROM {{schema}}.lifecycle_project_heads AS h
WHERE $1::text[] IS NULL OR h.project_id = ANY($1::text[])";
/// Retained events `$2 < sequence <= $3`, at most `$4`, in order: read-only history for
/// ephemeral followers (SSE clients), which own no cursor. Events consumer `$5` parked
/// without handling them (dead, waiting for a replay, or resolved by hand) are left out: the
/// followers see what that consumer handled.
pub const READ_RANGE: &str = concat!(
    "
SELECT ",
    event_columns!(),
    "
FROM {{schema}}.lifecycle_outbox AS o
WHERE o.project_id = $1 AND o.sequence > $2 AND o.sequence <= $3
  AND NOT EXISTS (
      SELECT 1 FROM {{schema}}.lifecycle_deliveries AS d
      WHERE d.project_id = o.project_id AND d.consumer_id = $5 AND d.event_id = o.event_id
        AND d.state IN ('dead', 'replay_requested', 'resolved'))
ORDER BY o.sequence
LIMIT $4"
);

/// The figures behind the runtime's gauges, in one round trip: head, this consumer's cursor,
/// its dead letters, and the unsequenced backlog of the whole outbox with the age of its
/// oldest event (the sequencer is shared by every project). Both come from one read of the
/// frontier's work (migration 0010), in the order only the frontier index yields without a
/// sort: a bare `count(*) ... WHERE sequence IS NULL` is answered with a sequential scan of
/// the whole table once statistics taken during a backlog make unsequenced rows look common,
/// even when nothing waits.
pub const GAUGES: &str = "
SELECT COALESCE((SELECT head_sequence FROM {{schema}}.lifecycle_project_heads
                 WHERE project_id = $1), 0) AS head,
       (SELECT last_acked_sequence FROM {{schema}}.lifecycle_consumer_cursors
        WHERE project_id = $1 AND consumer_id = $2) AS cursor,
       (SELECT count(*) FROM {{schema}}.lifecycle_deliveries
        WHERE project_id = $1 AND consumer_id = $2 AND state = 'dead') AS dead_letters,
       backlog.unsequenced, backlog.oldest_unsequenced
FROM (SELECT count(*) AS unsequenced,
             GREATEST(extract(epoch FROM now() - min(occurred_at)), 0)::float8
                 AS oldest_unsequenced
      FROM {{schema}}.lifecycle_outbox_unsequenced) AS backlog";

/// What the identity check compares, in one snapshot: the consumer's cursor and the identity
/// it records, the project's head and floor, and the identity of the event at `$3` (the
/// process's position; NULL when no retained event has that number).
pub const POSITION_CHECK: &str = "
SELECT c.last_acked_sequence, c.last_acked_event_id,
       COALESCE(h.head_sequence, 0) AS head_sequence,
       COALESCE(h.pruned_through, 0) AS pruned_through,
       (SELECT o.event_id FROM {{schema}}.lifecycle_outbox AS o
        WHERE o.project_id = $1 AND o.sequence = $3) AS event_at_position
FROM {{schema}}.lifecycle_consumer_cursors AS c
LEFT JOIN {{schema}}.lifecycle_project_heads AS h ON h.project_id = c.project_id
WHERE c.project_id = $1 AND c.consumer_id = $2";

/// Where a follower that owns no cursor (an SSE client) may resume after sequence `$2`, in
/// one snapshot: the project's head and floor, and the identity of the retained event at `$2`
/// (NULL when none has that number), which the follower's ID is checked against.
pub const RESUME_POINT: &str = "
SELECT COALESCE(max(h.head_sequence), 0) AS head_sequence,
       COALESCE(max(h.pruned_through), 0) AS pruned_through,
       (SELECT o.event_id FROM {{schema}}.lifecycle_outbox AS o
        WHERE o.project_id = $1 AND o.sequence = $2) AS event_at_position
FROM {{schema}}.lifecycle_project_heads AS h
WHERE h.project_id = $1";

/// The identity of event `$2` of project `$1` (none when no retained event has that number).
pub const EVENT_AT: &str = "
SELECT event_id FROM {{schema}}.lifecycle_outbox WHERE project_id = $1 AND sequence = $2";

/// The consumer's cursor when this lease is still ours: after a rejected conditional
/// acknowledgement, whether the lease was lost or the cursor moved under it.
pub const CURSOR_UNDER_LEASE: &str = "
SELECT last_acked_sequence
FROM {{schema}}.lifecycle_consumer_cursors
WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
  AND state = 'active'";

/// The consumer's current position and the identity it records (no row, or NULLs, while the
/// cursor is missing). Read by a claim once it has committed: a claim that waited for the
/// previous holder's last position write took its snapshot before that write committed.
pub const CLAIMED_POSITION: &str = concat!(
    "
SELECT last_acked_sequence, last_acked_event_id
FROM (",
    newest_position_at_or_below!("$1", "$2"),
    ") AS newest
WHERE project_id = $1 AND consumer_id = $2"
);

/// A consumer's acknowledged cursor (NULL while missing), read without taking its lease.
pub const CURSOR: &str = "
SELECT last_acked_sequence
FROM {{schema}}.lifecycle_consumer_cursors
WHERE project_id = $1 AND consumer_id = $2";

/// The server process of this session: read inside a reconciliation's snapshot, so that an
/// abandoned snapshot's live query can be cancelled (behind a transaction pooler the session
/// is the snapshot transaction's).
pub const BACKEND_PID: &str = "SELECT pg_backend_pid() AS pid";

/// Cancels the statement server process `$1` runs (a role may cancel its own sessions').
pub const CANCEL_BACKEND: &str = "SELECT pg_cancel_backend($1) AS cancelled";

/// Every statement above by its constant's name, in the order of this file: what
/// `sql/statements.sql` holds rendered (checked by `statements_file`).
#[cfg(test)]
pub(crate) fn all() -> Vec<(&'static str, &'static str)> {
    macro_rules! named {
        ($($name:ident),* $(,)?) => { vec![$((stringify!($name), $name)),*] };
    }
    named![
        LOCK_FOR_CLAIM,
        CLAIM,
        TAKE_OVER,
        CONSUMER_ROW,
        REACTIVATE,
        HEARTBEAT,
        RELEASE,
        LOCK_FENCE,
        ACK,
        HAS_UNSEQUENCED,
        MOVE_CURSOR,
        RECORD_RECONCILED,
        PROJECT_BOUNDS,
        EVER_POSITIONED,
        CONTRACTS,
        READ_BATCH,
        HELD_DELIVERY,
        LANE_RETRIES,
        RECORD_RETRY,
        PARK,
        CLEAR_PASSED_RETRIES,
        ACK_CLEARING,
        ACK_AND_RETRY,
        LOCK_FENCE_SHARED,
        INSERT_RECEIPT,
        LANE_RECEIPTS,
        LANE_ACK,
        REPLAY_REQUESTED,
        MARK_REPLAYED,
        MARK_REPLAY_FAILED,
        HEARTBEAT_SET,
        ACK_SET,
        KEY_SCANS_ONLY,
        POLL_SET,
        READ_RANGE,
        GAUGES,
        POSITION_CHECK,
        RESUME_POINT,
        EVENT_AT,
        CURSOR_UNDER_LEASE,
        CLAIMED_POSITION,
        CURSOR,
        BACKEND_PID,
        CANCEL_BACKEND,
    ]
}

#[cfg(test)]
mod statements_file;

#[cfg(test)]
mod tests {
    use outbox_core::{AuditKind, ConsumerState, DeliveryState};

    /// The runtime's statements match and write only values of the shared enums.
    #[test]
    fn every_literal_in_the_statements_is_a_known_value() {
        let (states, kinds) = outbox_core::states::stored_literals(include_str!("sql.rs"));
        assert!(states.len() > 10, "the scan found only {states:?}");
        for state in &states {
            assert!(
                state.parse::<DeliveryState>().is_ok() || state.parse::<ConsumerState>().is_ok(),
                "{state:?} is neither a delivery nor a consumer state"
            );
        }
        for kind in &kinds {
            kind.parse::<AuditKind>().unwrap();
        }
    }
}
