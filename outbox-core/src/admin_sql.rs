//! Every SQL statement of the operator surface ([`crate::admin`]), as templates over
//! `{{schema}}`.
//!
//! Reads take optional filters as nullable parameters (`$n::text IS NULL OR ...`). Writes
//! lock their target row before checking its state, so a check and the change it guards are
//! one decision; the consumer runtime's fenced writes lock the consumer row before delivery
//! rows, and so do these, so the two never wait on each other in a cycle.

/// Projects with their head, retention floor and unsequenced backlog; `$1` project or NULL.
/// A project is known once it has a head, a consumer or an unsequenced (committed) event.
/// Ages are measured on the database clock.
pub const PROJECTS: &str = "
WITH unsequenced AS (
    SELECT project_id, count(*) AS pending, min(occurred_at) AS oldest
    FROM {{schema}}.lifecycle_outbox
    WHERE sequence IS NULL AND ($1::text IS NULL OR project_id = $1)
    GROUP BY project_id
),
projects AS (
    SELECT project_id FROM {{schema}}.lifecycle_project_heads
    WHERE $1::text IS NULL OR project_id = $1
    UNION
    SELECT project_id FROM {{schema}}.lifecycle_consumer_cursors
    WHERE $1::text IS NULL OR project_id = $1
    UNION
    SELECT project_id FROM unsequenced
)
SELECT p.project_id,
       COALESCE(h.head_sequence, 0) AS head_sequence,
       COALESCE(h.pruned_through, 0) AS pruned_through,
       COALESCE(u.pending, 0) AS unsequenced,
       u.oldest AS oldest_unsequenced_at,
       extract(epoch FROM now() - u.oldest)::float8 AS oldest_unsequenced_age
FROM projects AS p
LEFT JOIN {{schema}}.lifecycle_project_heads AS h USING (project_id)
LEFT JOIN unsequenced AS u USING (project_id)
ORDER BY p.project_id";

/// The first retained event of project `$1` above sequence `$2`, with its age (database
/// clock): one probe of `lifecycle_outbox_sequence_idx`. Above the floor it is the oldest
/// retained event by sequence; `occurred_at` follows sequence closely but not exactly, and
/// the true `min(occurred_at)` would read every retained row of the project.
pub const RETAINED_AFTER: &str = "
SELECT o.occurred_at, extract(epoch FROM now() - o.occurred_at)::float8 AS age
FROM {{schema}}.lifecycle_outbox AS o
WHERE o.project_id = $1 AND o.sequence > $2
ORDER BY o.sequence
LIMIT 1";

/// Consumers with cursor, head, lease, the retrying delivery holding the cursor and their
/// dead-letter counts; `$1` project or NULL, `$2` consumer or NULL.
pub const CONSUMERS: &str = "
SELECT c.project_id, c.consumer_id, c.state, c.last_acked_sequence,
       COALESCE(h.head_sequence, 0) AS head_sequence,
       c.lease_owner, c.lease_generation, c.lease_expires_at,
       (c.lease_owner IS NOT NULL AND c.lease_expires_at > now()) AS lease_live,
       c.heartbeat_at,
       extract(epoch FROM now() - c.heartbeat_at)::float8 AS heartbeat_age,
       c.created_at, c.reconciled_at, c.retired_at, c.retired_by, c.retired_reason,
       r.event_id, r.sequence, r.attempts, r.next_attempt_at, r.first_failed_at,
       extract(epoch FROM now() - r.first_failed_at)::float8 AS retrying_age,
       r.last_failure_class,
       COALESCE(d.dead, 0) AS dead,
       COALESCE(d.replay_requested, 0) AS replay_requested
FROM {{schema}}.lifecycle_consumer_cursors AS c
LEFT JOIN {{schema}}.lifecycle_project_heads AS h USING (project_id)
LEFT JOIN LATERAL (
    SELECT event_id, sequence, attempts, next_attempt_at, first_failed_at, last_failure_class
    FROM {{schema}}.lifecycle_deliveries
    WHERE project_id = c.project_id AND consumer_id = c.consumer_id AND state = 'retrying'
    ORDER BY sequence
    LIMIT 1
) AS r ON true
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE state = 'dead') AS dead,
           count(*) FILTER (WHERE state = 'replay_requested') AS replay_requested
    FROM {{schema}}.lifecycle_deliveries
    WHERE project_id = c.project_id AND consumer_id = c.consumer_id
      AND state IN ('dead', 'replay_requested')
) AS d ON true
WHERE ($1::text IS NULL OR c.project_id = $1)
  AND ($2::text IS NULL OR c.consumer_id = $2)
ORDER BY c.project_id, c.consumer_id";

/// Deliveries (dead letters and retrying events) by filter: `$1` project or NULL, `$2`
/// consumer or NULL, `$3` states, `$4` row limit.
pub const DEAD_LETTERS: &str = "
SELECT project_id, consumer_id, event_id, sequence, state, attempts, last_failure_class,
       first_failed_at, updated_at, parked_at, next_attempt_at, resolved_at, resolved_by,
       resolved_reason
FROM {{schema}}.lifecycle_deliveries
WHERE ($1::text IS NULL OR project_id = $1)
  AND ($2::text IS NULL OR consumer_id = $2)
  AND state = ANY($3::text[])
ORDER BY project_id, consumer_id, sequence
LIMIT $4";

/// One delivery with its event, if the event is still retained: `$1` project, `$2` consumer,
/// `$3` event. Columns 0..=13 as in [`DEAD_LETTERS`], then the event's.
pub const DEAD_LETTER: &str = "
SELECT d.project_id, d.consumer_id, d.event_id, d.sequence, d.state, d.attempts,
       d.last_failure_class, d.first_failed_at, d.updated_at, d.parked_at, d.next_attempt_at,
       d.resolved_at, d.resolved_by, d.resolved_reason,
       o.event_type, o.task_id, o.deleted_at, o.writer_process_id, o.occurred_at,
       o.payload_version, o.payload, o.sequenced_at
FROM {{schema}}.lifecycle_deliveries AS d
LEFT JOIN {{schema}}.lifecycle_outbox AS o
  ON o.project_id = d.project_id AND o.event_id = d.event_id
WHERE d.project_id = $1 AND d.consumer_id = $2 AND d.event_id = $3";

/// The consumer row's state, locked against retirement (and reactivation) for the rest of
/// the transaction but not against the runtime's cursor and lease writes (`FOR KEY SHARE`
/// does not conflict with `FOR NO KEY UPDATE`): `$1` project, `$2` consumer.
pub const CONSUMER_FOR_SHARE: &str = "
SELECT state, retired_by, retired_at
FROM {{schema}}.lifecycle_consumer_cursors
WHERE project_id = $1 AND consumer_id = $2
FOR KEY SHARE";

/// The consumer row, locked for a state change: `$1` project, `$2` consumer.
pub const CONSUMER_FOR_UPDATE: &str = "
SELECT state, retired_by, retired_at
FROM {{schema}}.lifecycle_consumer_cursors
WHERE project_id = $1 AND consumer_id = $2
FOR UPDATE";

/// One delivery, locked, with whether its event is still retained: `$1` project,
/// `$2` consumer, `$3` event.
pub const DELIVERY_FOR_UPDATE: &str = "
SELECT d.state, d.attempts, d.resolved_by, d.resolved_at,
       EXISTS (SELECT 1 FROM {{schema}}.lifecycle_outbox AS o
               WHERE o.project_id = d.project_id AND o.event_id = d.event_id) AS retained
FROM {{schema}}.lifecycle_deliveries AS d
WHERE d.project_id = $1 AND d.consumer_id = $2 AND d.event_id = $3
FOR UPDATE OF d";

/// Every dead letter of a consumer, locked, with whether its event is retained: `$1`
/// project, `$2` consumer.
pub const DEAD_FOR_UPDATE: &str = "
SELECT d.event_id,
       EXISTS (SELECT 1 FROM {{schema}}.lifecycle_outbox AS o
               WHERE o.project_id = d.project_id AND o.event_id = d.event_id) AS retained
FROM {{schema}}.lifecycle_deliveries AS d
WHERE d.project_id = $1 AND d.consumer_id = $2 AND d.state = 'dead'
ORDER BY d.sequence
FOR UPDATE OF d";

/// Marks dead letters for replay by the consumer's lease holder: `$1` project, `$2`
/// consumer, `$3` events. Only rows still `dead` change.
pub const REQUEST_REPLAY: &str = "
UPDATE {{schema}}.lifecycle_deliveries
SET state = 'replay_requested', updated_at = now()
WHERE project_id = $1 AND consumer_id = $2 AND event_id = ANY($3::text[]) AND state = 'dead'";

/// Resolves a dead letter without delivering it: `$1` project, `$2` consumer, `$3` event,
/// `$4` operator, `$5` reason. Returns the attempt count and the resolution time.
pub const RESOLVE: &str = "
UPDATE {{schema}}.lifecycle_deliveries
SET state = 'resolved', next_attempt_at = NULL, resolved_at = now(), resolved_by = $4,
    resolved_reason = $5, updated_at = now()
WHERE project_id = $1 AND consumer_id = $2 AND event_id = $3
  AND state IN ('dead', 'replay_requested')
RETURNING attempts, resolved_at";

/// Retires an active consumer: `$1` project, `$2` consumer, `$3` operator, `$4` reason.
/// The lease columns stay as they are: the holder finds out at its next fenced write (every
/// one requires `state = 'active'`) and the operator can see whom that concerns.
pub const RETIRE: &str = "
UPDATE {{schema}}.lifecycle_consumer_cursors
SET state = 'retired', retired_at = now(), retired_by = $3, retired_reason = $4
WHERE project_id = $1 AND consumer_id = $2 AND state = 'active'
RETURNING retired_at, lease_owner, lease_generation,
          (lease_owner IS NOT NULL AND lease_expires_at > now()) AS lease_live";

/// Unresolved dead letters of a consumer (dead or awaiting replay): `$1` project,
/// `$2` consumer.
pub const UNRESOLVED_COUNT: &str = "
SELECT count(*)
FROM {{schema}}.lifecycle_deliveries
WHERE project_id = $1 AND consumer_id = $2 AND state IN ('dead', 'replay_requested')";

/// Appends an audit row: `$1` kind, `$2` project, `$3` consumer, `$4` event (or NULL),
/// `$5` actor, `$6` count (or NULL). Identifiers and counts only: never a reason.
pub const AUDIT: &str = "
INSERT INTO {{schema}}.lifecycle_audit (kind, project_id, consumer_id, event_id, actor, count)
VALUES ($1, $2, $3, $4, $5, $6)";

/// The audit trail, newest first: `$1` project or NULL, `$2` consumer or NULL, `$3` kinds,
/// `$4` event or NULL, `$5` row limit.
pub const AUDIT_TRAIL: &str = "
SELECT id, recorded_at, kind, project_id, consumer_id, event_id, actor, count
FROM {{schema}}.lifecycle_audit
WHERE ($1::text IS NULL OR project_id = $1)
  AND ($2::text IS NULL OR consumer_id = $2)
  AND kind = ANY($3::text[])
  AND ($4::text IS NULL OR event_id = $4)
ORDER BY id DESC
LIMIT $5";
