//! Every SQL statement of the retention sweep, as templates over `{{schema}}`.
//!
//! A consumer is "non-retired" when `state <> 'retired'`, not `state = 'active'`: should a
//! later migration add a state, a consumer in it holds retention back until the sweep is
//! taught otherwise (the safe direction).

/// Bounds a batch transaction (its first statement): `$1` idle-in-transaction timeout, so a
/// paused sweeper cannot keep its locks, and `$2` lock timeout, so a batch never queues for
/// long behind another sweep or (and so in front of) the sequencer on a heads row; both
/// milliseconds as text.
pub(super) const BOUND_BATCH: &str = "
SELECT set_config('idle_in_transaction_session_timeout', $1, true),
       set_config('lock_timeout', $2, true)";

/// Takes the sweep lock for the rest of the batch transaction (`$1`: the schema's `prune`
/// key), waiting for another sweep's batch to commit (at most the lock timeout).
pub(super) const LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

/// Projects with sequenced events, in order: `$1` one project or NULL for all.
pub(super) const PROJECTS: &str = "
SELECT project_id
FROM {{schema}}.lifecycle_project_heads
WHERE ($1::text IS NULL OR project_id = $1)
ORDER BY project_id";

/// What bounds a project's floor from above: its head, its floor, the first non-retired
/// consumer with a missing cursor (it holds back everything) and the slowest non-retired
/// consumer with its cursor. `$1` project.
pub(super) const PROJECT_STATE: &str = "
SELECT h.head_sequence, h.pruned_through,
       missing.consumer_id AS missing_consumer,
       slowest.consumer_id AS slowest_consumer,
       slowest.last_acked_sequence AS slowest_cursor
FROM {{schema}}.lifecycle_project_heads AS h
LEFT JOIN LATERAL (
    SELECT c.consumer_id
    FROM {{schema}}.lifecycle_consumer_cursors AS c
    WHERE c.project_id = h.project_id AND c.state <> 'retired'
      AND c.last_acked_sequence IS NULL
    ORDER BY c.consumer_id
    LIMIT 1) AS missing ON true
LEFT JOIN LATERAL (
    SELECT c.consumer_id, c.last_acked_sequence
    FROM {{schema}}.lifecycle_consumer_cursors AS c
    WHERE c.project_id = h.project_id AND c.state <> 'retired'
      AND c.last_acked_sequence IS NOT NULL
    ORDER BY c.last_acked_sequence, c.consumer_id
    LIMIT 1) AS slowest ON true
WHERE h.project_id = $1";

/// The lowest sequence in `($2, $3]` of project `$1` that must be retained whatever the
/// cursors say: an event younger than the retention period (`$4` seconds), or one an
/// unresolved dead letter of a non-retired consumer refers to (replay needs the row). Pruning
/// is contiguous, so the floor stops just below it. Returns no row when nothing in the range
/// is held. `kind` is `retention` or `dead_letter`.
pub(super) const FIRST_HELD: &str = "
SELECT kind, sequence, consumer_id, event_id
FROM (
    (SELECT 'retention' AS kind, o.sequence, NULL::text AS consumer_id, o.event_id
     FROM {{schema}}.lifecycle_outbox AS o
     WHERE o.project_id = $1 AND o.sequence > $2 AND o.sequence <= $3
       AND o.occurred_at >= now() - make_interval(secs => $4::float8)
     ORDER BY o.sequence
     LIMIT 1)
    UNION ALL
    (SELECT 'dead_letter' AS kind, d.sequence, d.consumer_id, d.event_id
     FROM {{schema}}.lifecycle_deliveries AS d
     JOIN {{schema}}.lifecycle_consumers AS c
       ON c.project_id = d.project_id AND c.consumer_id = d.consumer_id
     WHERE d.project_id = $1 AND d.sequence > $2 AND d.sequence <= $3
       AND d.state IN ('dead', 'replay_requested')
       AND c.state <> 'retired'
     ORDER BY d.sequence, d.consumer_id
     LIMIT 1)
) AS held
ORDER BY sequence, kind DESC
LIMIT 1";

/// Deletes the events of project `$1` in `($2, $3]`; the count is the number removed.
pub(super) const DELETE_EVENTS: &str = "
DELETE FROM {{schema}}.lifecycle_outbox
WHERE project_id = $1 AND sequence > $2 AND sequence <= $3";

/// Counts the events of project `$1` in `($2, $3]` (what a dry run would delete).
pub(super) const COUNT_EVENTS: &str = "
SELECT count(*) AS events FROM {{schema}}.lifecycle_outbox
WHERE project_id = $1 AND sequence > $2 AND sequence <= $3";

/// Moves the floor of project `$1` from `$2` to `$3`, in the transaction that deleted the
/// events: changes nothing (0 rows) if the floor is no longer `$2`.
pub(super) const ADVANCE_FLOOR: &str = "
UPDATE {{schema}}.lifecycle_projects
SET pruned_through = $3
WHERE project_id = $1 AND pruned_through = $2";

/// The rule for delivery rows that may go (`d` and `c` as in [`DELETE_DELIVERIES`]): every
/// row of a retired consumer; a resolved dead letter once `resolved_at` is older than the
/// retention period; a replayed one once its replay (`updated_at`) is.
macro_rules! prunable_delivery {
    () => {
        "(c.state = 'retired'
          OR (d.state = 'resolved'
              AND d.resolved_at < now() - make_interval(secs => $2::float8))
          OR (d.state = 'replayed'
              AND d.updated_at < now() - make_interval(secs => $2::float8)))"
    };
}

/// Deletes up to `$3` prunable delivery rows of project `$1` (`$2`: retention seconds);
/// returns the consumer of each. Rows an operator is changing right now are skipped.
pub(super) const DELETE_DELIVERIES: &str = concat!(
    "
WITH doomed AS (
    SELECT d.project_id, d.consumer_id, d.event_id
    FROM {{schema}}.lifecycle_deliveries AS d
    JOIN {{schema}}.lifecycle_consumers AS c
      ON c.project_id = d.project_id AND c.consumer_id = d.consumer_id
    WHERE d.project_id = $1 AND ",
    prunable_delivery!(),
    "
    LIMIT $3
    FOR UPDATE OF d SKIP LOCKED
)
DELETE FROM {{schema}}.lifecycle_deliveries AS d
USING doomed
WHERE d.project_id = doomed.project_id AND d.consumer_id = doomed.consumer_id
  AND d.event_id = doomed.event_id
RETURNING d.consumer_id"
);

/// How many delivery rows of project `$1` would go, per consumer (`$2`: retention seconds).
pub(super) const COUNT_DELIVERIES: &str = concat!(
    "
SELECT d.consumer_id, count(*) AS deliveries
FROM {{schema}}.lifecycle_deliveries AS d
JOIN {{schema}}.lifecycle_consumers AS c
  ON c.project_id = d.project_id AND c.consumer_id = d.consumer_id
WHERE d.project_id = $1 AND ",
    prunable_delivery!(),
    "
GROUP BY d.consumer_id
ORDER BY d.consumer_id"
);

/// Whether project `$1` has any prunable delivery row (`$2`: retention seconds).
pub(super) const ANY_DELIVERIES: &str = concat!(
    "
SELECT EXISTS (
    SELECT 1
    FROM {{schema}}.lifecycle_deliveries AS d
    JOIN {{schema}}.lifecycle_consumers AS c
      ON c.project_id = d.project_id AND c.consumer_id = d.consumer_id
    WHERE d.project_id = $1 AND ",
    prunable_delivery!(),
    ") AS any_prunable"
);

/// Adds a later batch's count to this sweep's audit row `$1`.
pub(super) const AUDIT_ADD: &str = "
UPDATE {{schema}}.lifecycle_audit SET count = count + $2 WHERE id = $1";
