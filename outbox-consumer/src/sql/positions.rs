//! The cursor: positions (`lifecycle_consumer_positions`) appended under the fence, a set's
//! grouped acknowledgement, and the reads of the cursor and its identity (the
//! `lifecycle_consumer_cursors` view).

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

/// Whether the consumer ever had a position (a cursor, or the missing one a reactivation
/// records): a consumer registered by a process that stopped before its first position is as
/// new as one registered now.
pub const EVER_POSITIONED: &str = "
SELECT EXISTS (SELECT 1 FROM {{schema}}.lifecycle_consumer_positions
               WHERE project_id = $1 AND consumer_id = $2) AS positioned";

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
/// set sends its multi-row writes, this and [`HEARTBEAT_SET`](super::HEARTBEAT_SET), one at a
/// time; every other write to a consumer row touches that row alone, and no other process
/// acknowledges for a lease this set holds.
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
