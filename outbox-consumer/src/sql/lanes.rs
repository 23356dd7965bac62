//! The transactional handler with lanes: the consumer row's fence in share mode, the receipts
//! of events handled above the cursor (`lifecycle_lane_receipts`, migration 0018) and the
//! acknowledgement that deletes the receipts it passes.

/// [`LOCK_FENCE`](super::LOCK_FENCE) in share mode, for the transaction of a transactional
/// handler with lanes: several of them hold it at once (each lane its own), while a takeover,
/// a claim or a renewal, which update or lock the row exclusively, still wait for their
/// commits.
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
/// the acknowledgement does not wait for the handlers running. Fenced like
/// [`ACK`](super::ACK): returns `acked` = 0, and changes nothing, when the lease is gone or
/// the cursor is not at `$6`.
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
