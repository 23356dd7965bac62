//! Failed deliveries (`lifecycle_deliveries`): retry state, dead letters and replays, and the
//! acknowledgements that clear or record retry state in the same statement.

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
/// trip, no explicit transaction). Fenced like [`ACK`](super::ACK): returns `acked` = 0, and
/// changes nothing, when the lease is no longer ours.
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
/// Fenced like [`ACK`](super::ACK): returns `acked` = 0, and changes nothing, when the lease is
/// gone.
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
