-- Every statement the consumer runtime sends (outbox-consumer/src/sql.rs), its macros
-- expanded and rendered for the default schema `outbox`; each ends with `;` here only.
-- Generated; do not edit by hand. Regenerate with:
--   OUTBOX_BLESS=1 cargo test -p outbox-consumer --lib statements_file

-- LOCK_FOR_CLAIM
SELECT 1 FROM "outbox".lifecycle_consumers
WHERE project_id = $1 AND consumer_id = $2
FOR NO KEY UPDATE;

-- CLAIM
INSERT INTO "outbox".lifecycle_consumers AS c
    (project_id, consumer_id, lease_owner, lease_generation, claimed_until, claimed_at)
VALUES ($1, $2, $3, 1, now() + make_interval(secs => $4), now())
ON CONFLICT (project_id, consumer_id) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner,
    lease_generation = c.lease_generation + 1,
    claimed_until = EXCLUDED.claimed_until,
    claimed_at = EXCLUDED.claimed_at
WHERE c.state = 'active'
  AND (c.lease_owner IS NULL OR COALESCE((SELECT newest.lease_expires_at FROM (SELECT ctid AS row_id, project_id, consumer_id, renewal_id, lease_generation, lease_expires_at, heartbeat_at
     FROM "outbox".lifecycle_lease_renewals
     WHERE (project_id, consumer_id, renewal_id) <= (c.project_id, c.consumer_id, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, renewal_id DESC
     LIMIT 1) AS newest
      WHERE newest.project_id = c.project_id AND newest.consumer_id = c.consumer_id
        AND newest.lease_generation = c.lease_generation), c.claimed_until) <= now())
RETURNING c.lease_generation, (c.xmax = 0) AS created;

-- TAKE_OVER
UPDATE "outbox".lifecycle_consumers
SET lease_owner = $3, lease_generation = lease_generation + 1,
    claimed_until = now() + make_interval(secs => $4), claimed_at = now()
WHERE project_id = $1 AND consumer_id = $2 AND state = 'active'
  AND lease_owner = $5 AND lease_generation = $6
RETURNING lease_generation, false AS created;

-- CONSUMER_ROW
SELECT c.state, c.lease_owner, c.lease_generation,
       GREATEST(extract(epoch FROM COALESCE((SELECT newest.lease_expires_at FROM (SELECT ctid AS row_id, project_id, consumer_id, renewal_id, lease_generation, lease_expires_at, heartbeat_at
     FROM "outbox".lifecycle_lease_renewals
     WHERE (project_id, consumer_id, renewal_id) <= (c.project_id, c.consumer_id, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, renewal_id DESC
     LIMIT 1) AS newest
      WHERE newest.project_id = c.project_id AND newest.consumer_id = c.consumer_id
        AND newest.lease_generation = c.lease_generation), c.claimed_until) - now()), 0)::float8 AS expires_in,
       c.retired_by, c.retired_reason
FROM "outbox".lifecycle_consumers AS c
WHERE c.project_id = $1 AND c.consumer_id = $2;

-- REACTIVATE
WITH reactivated AS (
    UPDATE "outbox".lifecycle_consumers AS c
    SET state = 'active', retired_at = NULL, retired_by = NULL, retired_reason = NULL,
        lease_generation = c.lease_generation + 1,
        claimed_until = COALESCE((SELECT newest.lease_expires_at FROM (SELECT ctid AS row_id, project_id, consumer_id, renewal_id, lease_generation, lease_expires_at, heartbeat_at
     FROM "outbox".lifecycle_lease_renewals
     WHERE (project_id, consumer_id, renewal_id) <= (c.project_id, c.consumer_id, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, renewal_id DESC
     LIMIT 1) AS newest
      WHERE newest.project_id = c.project_id AND newest.consumer_id = c.consumer_id
        AND newest.lease_generation = c.lease_generation), c.claimed_until),
        claimed_at = COALESCE((SELECT newest.heartbeat_at FROM (SELECT ctid AS row_id, project_id, consumer_id, renewal_id, lease_generation, lease_expires_at, heartbeat_at
     FROM "outbox".lifecycle_lease_renewals
     WHERE (project_id, consumer_id, renewal_id) <= (c.project_id, c.consumer_id, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, renewal_id DESC
     LIMIT 1) AS newest
      WHERE newest.project_id = c.project_id AND newest.consumer_id = c.consumer_id
        AND newest.lease_generation = c.lease_generation), c.claimed_at)
    WHERE c.project_id = $1 AND c.consumer_id = $2 AND c.state = 'retired'
    RETURNING 1
),
was AS (SELECT position_id, last_acked_sequence, last_acked_at, reconciled_at
     FROM (SELECT ctid AS row_id, project_id, consumer_id, position_id, last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at
     FROM "outbox".lifecycle_consumer_positions
     WHERE (project_id, consumer_id, position_id) <= ($1, $2, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, position_id DESC
     LIMIT 1) AS newest
     WHERE project_id = $1 AND consumer_id = $2),
replaced AS (
    DELETE FROM "outbox".lifecycle_consumer_positions AS p
    WHERE p.project_id = $1 AND p.consumer_id = $2
      AND p.position_id = (SELECT was.position_id FROM reactivated, was)
),
missing AS (
    INSERT INTO "outbox".lifecycle_consumer_positions
        (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
         reconciled_at)
    SELECT $1, $2, NULL, NULL, was.last_acked_at, was.reconciled_at
    FROM reactivated LEFT JOIN was ON true
)
SELECT count(*) AS reactivated FROM reactivated;

-- HEARTBEAT
WITH fence AS (SELECT 1 FROM "outbox".lifecycle_consumers
     WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
       AND state = 'active'
     FOR NO KEY UPDATE),
was AS (
    SELECT newest.renewal_id
    FROM (SELECT ctid AS row_id, project_id, consumer_id, renewal_id, lease_generation, lease_expires_at, heartbeat_at
     FROM "outbox".lifecycle_lease_renewals
     WHERE (project_id, consumer_id, renewal_id) <= ($1, $2, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, renewal_id DESC
     LIMIT 1) AS newest
    WHERE newest.project_id = $1 AND newest.consumer_id = $2
),
replaced AS (
    DELETE FROM "outbox".lifecycle_lease_renewals AS r
    WHERE r.project_id = $1 AND r.consumer_id = $2
      AND r.renewal_id = (SELECT was.renewal_id FROM fence, was)
)
INSERT INTO "outbox".lifecycle_lease_renewals
    (project_id, consumer_id, lease_generation, lease_expires_at, heartbeat_at)
SELECT $1, $2, $4, now() + make_interval(secs => $5), now()
FROM fence;

-- RELEASE
UPDATE "outbox".lifecycle_consumers
SET lease_owner = NULL, claimed_until = NULL
WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4;

-- LOCK_FENCE
SELECT set_config('idle_in_transaction_session_timeout', $5, true)
FROM "outbox".lifecycle_consumers
WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
  AND state = 'active'
FOR NO KEY UPDATE;

-- ACK
WITH fence AS (SELECT 1 FROM "outbox".lifecycle_consumers
     WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
       AND state = 'active'
     FOR NO KEY UPDATE),
was AS (SELECT position_id, last_acked_sequence, last_acked_at, reconciled_at
     FROM (SELECT ctid AS row_id, project_id, consumer_id, position_id, last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at
     FROM "outbox".lifecycle_consumer_positions
     WHERE (project_id, consumer_id, position_id) <= ($1, $2, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, position_id DESC
     LIMIT 1) AS newest
     WHERE project_id = $1 AND consumer_id = $2),
replaced AS (DELETE FROM "outbox".lifecycle_consumer_positions AS p
     WHERE p.project_id = $1 AND p.consumer_id = $2
       AND p.position_id = (SELECT was.position_id FROM fence, was WHERE was.last_acked_sequence = $6))
INSERT INTO "outbox".lifecycle_consumer_positions
        (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
         reconciled_at)
SELECT $1, $2, $5, (SELECT o.event_id FROM "outbox".lifecycle_outbox AS o
         WHERE o.project_id = $1 AND o.sequence = $5), now(), was.reconciled_at
FROM fence, was
WHERE was.last_acked_sequence = $6;

-- HAS_UNSEQUENCED
SELECT EXISTS (SELECT FROM (SELECT project_id FROM "outbox".lifecycle_outbox_unsequenced
                            OFFSET 0) AS work
               WHERE project_id = $1) AS waiting;

-- MOVE_CURSOR
WITH fence AS (SELECT 1 FROM "outbox".lifecycle_consumers
     WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
       AND state = 'active'
     FOR NO KEY UPDATE),
was AS (SELECT position_id, last_acked_sequence, last_acked_at, reconciled_at
     FROM (SELECT ctid AS row_id, project_id, consumer_id, position_id, last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at
     FROM "outbox".lifecycle_consumer_positions
     WHERE (project_id, consumer_id, position_id) <= ($1, $2, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, position_id DESC
     LIMIT 1) AS newest
     WHERE project_id = $1 AND consumer_id = $2),
replaced AS (DELETE FROM "outbox".lifecycle_consumer_positions AS p
     WHERE p.project_id = $1 AND p.consumer_id = $2
       AND p.position_id = (SELECT was.position_id FROM fence, was WHERE true))
INSERT INTO "outbox".lifecycle_consumer_positions
        (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
         reconciled_at)
SELECT $1, $2, $5, (SELECT o.event_id FROM "outbox".lifecycle_outbox AS o
         WHERE o.project_id = $1 AND o.sequence = $5), was.last_acked_at, was.reconciled_at
FROM fence LEFT JOIN was ON true;

-- RECORD_RECONCILED
WITH fence AS (SELECT 1 FROM "outbox".lifecycle_consumers
     WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
       AND state = 'active'
     FOR NO KEY UPDATE),
was AS (SELECT position_id, last_acked_sequence, last_acked_at, reconciled_at
     FROM (SELECT ctid AS row_id, project_id, consumer_id, position_id, last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at
     FROM "outbox".lifecycle_consumer_positions
     WHERE (project_id, consumer_id, position_id) <= ($1, $2, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, position_id DESC
     LIMIT 1) AS newest
     WHERE project_id = $1 AND consumer_id = $2),
replaced AS (DELETE FROM "outbox".lifecycle_consumer_positions AS p
     WHERE p.project_id = $1 AND p.consumer_id = $2
       AND p.position_id = (SELECT was.position_id FROM fence, was WHERE true))
INSERT INTO "outbox".lifecycle_consumer_positions
        (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
         reconciled_at)
SELECT $1, $2, $5, (SELECT o.event_id FROM "outbox".lifecycle_outbox AS o
         WHERE o.project_id = $1 AND o.sequence = $5), was.last_acked_at, now()
FROM fence LEFT JOIN was ON true;

-- PROJECT_BOUNDS
SELECT COALESCE(max(head_sequence), 0) AS head_sequence,
       COALESCE(max(pruned_through), 0) AS pruned_through
FROM "outbox".lifecycle_project_heads
WHERE project_id = $1;

-- EVER_POSITIONED
SELECT EXISTS (SELECT 1 FROM "outbox".lifecycle_consumer_positions
               WHERE project_id = $1 AND consumer_id = $2) AS positioned;

-- CONTRACTS
SELECT event_type, major FROM "outbox".lifecycle_event_contracts;

-- READ_BATCH
SELECT o.sequence, o.event_type, o.event_id, o.task_id, o.deleted_at, o.writer_process_id,
       o.occurred_at, o.payload_version, o.payload, o.type_minor, o.traceparent
FROM "outbox".lifecycle_outbox AS o
WHERE o.project_id = $1 AND o.sequence > $2
ORDER BY o.sequence
LIMIT $3;

-- HELD_DELIVERY
SELECT sequence, event_id, attempts,
       GREATEST(extract(epoch FROM next_attempt_at - now()), 0)::float8 AS wait
FROM "outbox".lifecycle_deliveries
WHERE project_id = $1 AND consumer_id = $2 AND state = 'retrying' AND sequence = $3;

-- LANE_RETRIES
SELECT sequence, attempts, state = 'retrying' AS retrying,
       GREATEST(extract(epoch FROM next_attempt_at - now()), 0)::float8 AS wait
FROM "outbox".lifecycle_deliveries
WHERE project_id = $1 AND consumer_id = $2 AND sequence > $3 AND sequence <= $4;

-- RECORD_RETRY
INSERT INTO "outbox".lifecycle_deliveries AS d
    (project_id, consumer_id, event_id, sequence, attempts, next_attempt_at,
     last_failure_class, state)
VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6), $7, 'retrying')
ON CONFLICT (project_id, consumer_id, event_id) DO UPDATE
SET attempts = EXCLUDED.attempts, next_attempt_at = EXCLUDED.next_attempt_at,
    last_failure_class = EXCLUDED.last_failure_class, state = 'retrying', updated_at = now(),
    first_failed_at = CASE WHEN d.state = 'retrying' THEN d.first_failed_at ELSE now() END,
    parked_at = NULL, resolved_at = NULL, resolved_by = NULL, resolved_reason = NULL;

-- PARK
INSERT INTO "outbox".lifecycle_deliveries AS d
    (project_id, consumer_id, event_id, sequence, attempts, next_attempt_at,
     last_failure_class, state, parked_at)
VALUES ($1, $2, $3, $4, $5, NULL, $6, 'dead', now())
ON CONFLICT (project_id, consumer_id, event_id) DO UPDATE
SET attempts = EXCLUDED.attempts, next_attempt_at = NULL,
    last_failure_class = EXCLUDED.last_failure_class, state = 'dead', parked_at = now(),
    updated_at = now(), resolved_at = NULL, resolved_by = NULL, resolved_reason = NULL;

-- CLEAR_PASSED_RETRIES
DELETE FROM "outbox".lifecycle_deliveries
WHERE project_id = $1 AND consumer_id = $2 AND state = 'retrying' AND sequence <= $3;

-- ACK_CLEARING
WITH fence AS (SELECT 1 FROM "outbox".lifecycle_consumers
     WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
       AND state = 'active'
     FOR NO KEY UPDATE),
was AS (SELECT position_id, last_acked_sequence, last_acked_at, reconciled_at
     FROM (SELECT ctid AS row_id, project_id, consumer_id, position_id, last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at
     FROM "outbox".lifecycle_consumer_positions
     WHERE (project_id, consumer_id, position_id) <= ($1, $2, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, position_id DESC
     LIMIT 1) AS newest
     WHERE project_id = $1 AND consumer_id = $2),
replaced AS (DELETE FROM "outbox".lifecycle_consumer_positions AS p
     WHERE p.project_id = $1 AND p.consumer_id = $2
       AND p.position_id = (SELECT was.position_id FROM fence, was WHERE was.last_acked_sequence = $6)),
acked AS (
    INSERT INTO "outbox".lifecycle_consumer_positions
        (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
         reconciled_at)
    SELECT $1, $2, $5, (SELECT o.event_id FROM "outbox".lifecycle_outbox AS o
         WHERE o.project_id = $1 AND o.sequence = $5), now(), was.reconciled_at
    FROM fence, was
    WHERE was.last_acked_sequence = $6
    RETURNING 1
),
cleared AS (
    DELETE FROM "outbox".lifecycle_deliveries
    WHERE project_id = $1 AND consumer_id = $2 AND state = 'retrying' AND sequence <= $5
      AND EXISTS (SELECT 1 FROM acked)
)
SELECT count(*) AS acked FROM acked;

-- ACK_AND_RETRY
WITH fence AS (SELECT 1 FROM "outbox".lifecycle_consumers
     WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
       AND state = 'active'
     FOR NO KEY UPDATE),
was AS (SELECT position_id, last_acked_sequence, last_acked_at, reconciled_at
     FROM (SELECT ctid AS row_id, project_id, consumer_id, position_id, last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at
     FROM "outbox".lifecycle_consumer_positions
     WHERE (project_id, consumer_id, position_id) <= ($1, $2, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, position_id DESC
     LIMIT 1) AS newest
     WHERE project_id = $1 AND consumer_id = $2),
replaced AS (DELETE FROM "outbox".lifecycle_consumer_positions AS p
     WHERE p.project_id = $1 AND p.consumer_id = $2
       AND p.position_id = (SELECT was.position_id FROM fence, was WHERE was.last_acked_sequence = $11)),
acked AS (
    INSERT INTO "outbox".lifecycle_consumer_positions
        (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
         reconciled_at)
    SELECT $1, $2, $5, (SELECT o.event_id FROM "outbox".lifecycle_outbox AS o
         WHERE o.project_id = $1 AND o.sequence = $5),
           CASE WHEN $5 IS DISTINCT FROM was.last_acked_sequence THEN now()
                ELSE was.last_acked_at END,
           was.reconciled_at
    FROM fence, was
    WHERE was.last_acked_sequence = $11
    RETURNING 1
),
cleared AS (
    DELETE FROM "outbox".lifecycle_deliveries
    WHERE project_id = $1 AND consumer_id = $2 AND state = 'retrying' AND sequence <= $5
      AND EXISTS (SELECT 1 FROM acked)
),
retried AS (
    INSERT INTO "outbox".lifecycle_deliveries AS d
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
SELECT count(*) AS acked FROM acked;

-- LOCK_FENCE_SHARED
SELECT set_config('idle_in_transaction_session_timeout', $5, true)
FROM "outbox".lifecycle_consumers
WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
  AND state = 'active'
FOR SHARE;

-- INSERT_RECEIPT
INSERT INTO "outbox".lifecycle_lane_receipts (project_id, consumer_id, sequence)
VALUES ($1, $2, $3);

-- LANE_RECEIPTS
SELECT sequence FROM "outbox".lifecycle_lane_receipts
WHERE project_id = $1 AND consumer_id = $2 AND sequence > $3;

-- LANE_ACK
WITH fence AS (
    SELECT 1 FROM "outbox".lifecycle_consumers
    WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
      AND state = 'active'
    FOR SHARE),
was AS (SELECT position_id, last_acked_sequence, last_acked_at, reconciled_at
     FROM (SELECT ctid AS row_id, project_id, consumer_id, position_id, last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at
     FROM "outbox".lifecycle_consumer_positions
     WHERE (project_id, consumer_id, position_id) <= ($1, $2, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, position_id DESC
     LIMIT 1) AS newest
     WHERE project_id = $1 AND consumer_id = $2),
replaced AS (DELETE FROM "outbox".lifecycle_consumer_positions AS p
     WHERE p.project_id = $1 AND p.consumer_id = $2
       AND p.position_id = (SELECT was.position_id FROM fence, was WHERE was.last_acked_sequence = $6)),
acked AS (
    INSERT INTO "outbox".lifecycle_consumer_positions
        (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
         reconciled_at, handled_through)
    SELECT $1, $2, $5, (SELECT o.event_id FROM "outbox".lifecycle_outbox AS o
         WHERE o.project_id = $1 AND o.sequence = $5),
           CASE WHEN $5 IS DISTINCT FROM was.last_acked_sequence THEN now()
                ELSE was.last_acked_at END,
           was.reconciled_at, $7
    FROM fence, was
    WHERE was.last_acked_sequence = $6
    RETURNING 1
),
cleared AS (
    DELETE FROM "outbox".lifecycle_deliveries
    WHERE project_id = $1 AND consumer_id = $2 AND state = 'retrying' AND sequence <= $5
      AND $8 AND EXISTS (SELECT 1 FROM acked)
),
passed AS (
    DELETE FROM "outbox".lifecycle_lane_receipts
    WHERE project_id = $1 AND consumer_id = $2 AND sequence <= $5
      AND EXISTS (SELECT 1 FROM acked)
)
SELECT count(*) AS acked FROM acked;

-- REPLAY_REQUESTED
SELECT o.sequence, o.event_type, o.event_id, o.task_id, o.deleted_at, o.writer_process_id,
       o.occurred_at, o.payload_version, o.payload, o.type_minor, o.traceparent, d.attempts
FROM "outbox".lifecycle_deliveries AS d
JOIN "outbox".lifecycle_outbox AS o
  ON o.project_id = d.project_id AND o.event_id = d.event_id
WHERE d.project_id = $1 AND d.consumer_id = $2 AND d.state = 'replay_requested'
ORDER BY o.sequence
LIMIT 100;

-- MARK_REPLAYED
UPDATE "outbox".lifecycle_deliveries
SET state = 'replayed', attempts = attempts + 1, updated_at = now()
WHERE project_id = $1 AND consumer_id = $2 AND event_id = $3 AND state = 'replay_requested'
RETURNING attempts, replay_requested_by;

-- MARK_REPLAY_FAILED
UPDATE "outbox".lifecycle_deliveries
SET state = 'dead', attempts = attempts + 1, last_failure_class = $4, updated_at = now()
WHERE project_id = $1 AND consumer_id = $2 AND event_id = $3 AND state = 'replay_requested'
RETURNING attempts, replay_requested_by;

-- HEARTBEAT_SET
WITH h AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
        AS h(project_id, consumer_id, generation)
),
fence AS (
    SELECT c.project_id, c.consumer_id, c.lease_generation
    FROM "outbox".lifecycle_consumers AS c
    JOIN h ON c.project_id = h.project_id AND c.consumer_id = h.consumer_id
    WHERE c.lease_owner = $4 AND c.lease_generation = h.generation AND c.state = 'active'
    FOR NO KEY UPDATE OF c
),
was AS (
    SELECT w.row_id
    FROM fence
    CROSS JOIN LATERAL (SELECT ctid AS row_id, project_id, consumer_id, renewal_id, lease_generation, lease_expires_at, heartbeat_at
     FROM "outbox".lifecycle_lease_renewals
     WHERE (project_id, consumer_id, renewal_id) <= (fence.project_id, fence.consumer_id, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, renewal_id DESC
     LIMIT 1) AS w
    WHERE w.project_id = fence.project_id AND w.consumer_id = fence.consumer_id
),
replaced AS (
    DELETE FROM "outbox".lifecycle_lease_renewals
    WHERE ctid = ANY (ARRAY(SELECT row_id FROM was))
)
INSERT INTO "outbox".lifecycle_lease_renewals
    (project_id, consumer_id, lease_generation, lease_expires_at, heartbeat_at)
SELECT project_id, consumer_id, lease_generation, now() + make_interval(secs => $5), now()
FROM fence
RETURNING project_id, consumer_id;

-- ACK_SET
WITH a AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $6::bigint[])
        AS a(project_id, consumer_id, generation, through, left_at)
),
fence AS (
    SELECT c.project_id, c.consumer_id
    FROM "outbox".lifecycle_consumers AS c
    JOIN a ON c.project_id = a.project_id AND c.consumer_id = a.consumer_id
    WHERE c.lease_owner = $5 AND c.lease_generation = a.generation AND c.state = 'active'
    FOR NO KEY UPDATE OF c
),
was AS (
    SELECT a.project_id, a.consumer_id, a.through, w.row_id, w.reconciled_at
    FROM a
    JOIN fence ON fence.project_id = a.project_id AND fence.consumer_id = a.consumer_id
    CROSS JOIN LATERAL (SELECT ctid AS row_id, project_id, consumer_id, position_id, last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at
     FROM "outbox".lifecycle_consumer_positions
     WHERE (project_id, consumer_id, position_id) <= (a.project_id, a.consumer_id, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, position_id DESC
     LIMIT 1) AS w
    WHERE w.project_id = a.project_id AND w.consumer_id = a.consumer_id
      AND w.last_acked_sequence = a.left_at
),
replaced AS (
    DELETE FROM "outbox".lifecycle_consumer_positions
    WHERE ctid = ANY (ARRAY(SELECT row_id FROM was))
)
INSERT INTO "outbox".lifecycle_consumer_positions
    (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
     reconciled_at)
SELECT was.project_id, was.consumer_id, was.through,
       (SELECT o.event_id FROM "outbox".lifecycle_outbox AS o
        WHERE o.project_id = was.project_id AND o.sequence = was.through),
       now(), was.reconciled_at
FROM was
RETURNING project_id, consumer_id;

-- KEY_SCANS_ONLY
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true);

-- POLL_SET
SELECT h.project_id, h.head_sequence,
       ARRAY(SELECT DISTINCT d.consumer_id
             FROM "outbox".lifecycle_deliveries AS d
             WHERE d.project_id = h.project_id AND d.consumer_id = ANY($2::text[])
               AND d.state = 'replay_requested') AS replay_requested
FROM "outbox".lifecycle_project_heads AS h
WHERE $1::text[] IS NULL OR h.project_id = ANY($1::text[]);

-- READ_RANGE
SELECT o.sequence, o.event_type, o.event_id, o.task_id, o.deleted_at, o.writer_process_id,
       o.occurred_at, o.payload_version, o.payload, o.type_minor, o.traceparent
FROM "outbox".lifecycle_outbox AS o
WHERE o.project_id = $1 AND o.sequence > $2 AND o.sequence <= $3
  AND NOT EXISTS (
      SELECT 1 FROM "outbox".lifecycle_deliveries AS d
      WHERE d.project_id = o.project_id AND d.consumer_id = $5 AND d.event_id = o.event_id
        AND d.state IN ('dead', 'replay_requested', 'resolved'))
ORDER BY o.sequence
LIMIT $4;

-- GAUGES
SELECT COALESCE((SELECT head_sequence FROM "outbox".lifecycle_project_heads
                 WHERE project_id = $1), 0) AS head,
       (SELECT last_acked_sequence FROM "outbox".lifecycle_consumer_cursors
        WHERE project_id = $1 AND consumer_id = $2) AS cursor,
       (SELECT count(*) FROM "outbox".lifecycle_deliveries
        WHERE project_id = $1 AND consumer_id = $2 AND state = 'dead') AS dead_letters,
       backlog.unsequenced, backlog.oldest_unsequenced
FROM (SELECT count(*) AS unsequenced,
             GREATEST(extract(epoch FROM now() - min(occurred_at)), 0)::float8
                 AS oldest_unsequenced
      FROM "outbox".lifecycle_outbox_unsequenced) AS backlog;

-- POSITION_CHECK
SELECT c.last_acked_sequence, c.last_acked_event_id,
       COALESCE(h.head_sequence, 0) AS head_sequence,
       COALESCE(h.pruned_through, 0) AS pruned_through,
       (SELECT o.event_id FROM "outbox".lifecycle_outbox AS o
        WHERE o.project_id = $1 AND o.sequence = $3) AS event_at_position
FROM "outbox".lifecycle_consumer_cursors AS c
LEFT JOIN "outbox".lifecycle_project_heads AS h ON h.project_id = c.project_id
WHERE c.project_id = $1 AND c.consumer_id = $2;

-- RESUME_POINT
SELECT COALESCE(max(h.head_sequence), 0) AS head_sequence,
       COALESCE(max(h.pruned_through), 0) AS pruned_through,
       (SELECT o.event_id FROM "outbox".lifecycle_outbox AS o
        WHERE o.project_id = $1 AND o.sequence = $2) AS event_at_position
FROM "outbox".lifecycle_project_heads AS h
WHERE h.project_id = $1;

-- EVENT_AT
SELECT event_id FROM "outbox".lifecycle_outbox WHERE project_id = $1 AND sequence = $2;

-- CURSOR_UNDER_LEASE
SELECT last_acked_sequence
FROM "outbox".lifecycle_consumer_cursors
WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
  AND state = 'active';

-- CLAIMED_POSITION
SELECT last_acked_sequence, last_acked_event_id
FROM (SELECT ctid AS row_id, project_id, consumer_id, position_id, last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at
     FROM "outbox".lifecycle_consumer_positions
     WHERE (project_id, consumer_id, position_id) <= ($1, $2, 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, position_id DESC
     LIMIT 1) AS newest
WHERE project_id = $1 AND consumer_id = $2;

-- CURSOR
SELECT last_acked_sequence
FROM "outbox".lifecycle_consumer_cursors
WHERE project_id = $1 AND consumer_id = $2;

-- BACKEND_PID
SELECT pg_backend_pid() AS pid;

-- CANCEL_BACKEND
SELECT pg_cancel_backend($1) AS cancelled;
