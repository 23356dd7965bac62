-- Sharp edges found by trying the project as a new user and an operator would.
--
-- 1. write_task_deleted names every NULL or invalid argument with SQLSTATE 22023.
--
-- In 0001 the fast path's test `NOT (project_id ~ ... AND ...)` is NULL, not true, when an
-- identifier is NULL, so the named checks were skipped and the INSERT failed instead with
-- 23502 naming a column (`project_id`, or `event_id` for a NULL task_id). The fast path now
-- treats "not known to be valid" (`IS NOT TRUE`) as invalid.
CREATE OR REPLACE FUNCTION {{schema}}.write_task_deleted(
    project_id        text,
    task_id           text,
    deleted_at        timestamptz,
    writer_process_id text,
    prior             jsonb DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_payload  jsonb;
    v_event_id text;
BEGIN
    -- Fast path: one expression for the common, valid case; the checks below name the
    -- problem when it is not known to hold (NULL arguments included).
    IF (project_id ~ '^[A-Za-z0-9._:@-]{1,128}$'
        AND task_id ~ '^[A-Za-z0-9._:@-]{1,128}$'
        AND writer_process_id ~ '^[A-Za-z0-9._:@-]{1,128}$') IS NOT TRUE THEN
        PERFORM {{schema}}.check_identifier('project_id', project_id, 128);
        PERFORM {{schema}}.check_identifier('task_id', task_id, 128);
        PERFORM {{schema}}.check_identifier('writer_process_id', writer_process_id, 128);
    END IF;
    IF deleted_at IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'invalid deleted_at: must not be null';
    END IF;
    IF deleted_at > now() + interval '5 minutes' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('invalid deleted_at: %s is more than 5 minutes in the future',
                to_char(deleted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
    END IF;
    IF prior IS NULL THEN
        v_payload := '{}'::jsonb;
    ELSIF (jsonb_typeof(prior) = 'object'
          AND prior - 'column' - 'status' = '{}'::jsonb
          AND (NOT prior ? 'column' OR (jsonb_typeof(prior -> 'column') = 'string'
               AND prior ->> 'column' ~ '^[A-Za-z0-9._:@-]{1,64}$'))
          AND (NOT prior ? 'status' OR (jsonb_typeof(prior -> 'status') = 'string'
               AND prior ->> 'status' ~ '^[A-Za-z0-9._:@-]{1,64}$'))) IS TRUE THEN
        v_payload := prior;
    ELSE
        v_payload := {{schema}}.check_prior(prior);
    END IF;
    v_event_id := 'task-deleted:' || task_id || ':'
        || to_char(deleted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
    INSERT INTO {{schema}}.lifecycle_outbox AS o
        (project_id, event_type, event_id, task_id, deleted_at, writer_process_id,
         payload_version, payload)
    VALUES
        (write_task_deleted.project_id, 'task:deleted', v_event_id, write_task_deleted.task_id,
         write_task_deleted.deleted_at, write_task_deleted.writer_process_id, 1, v_payload)
    ON CONFLICT ON CONSTRAINT lifecycle_outbox_event_key DO NOTHING;
    RETURN v_event_id;
END
$fn$;

-- 2. A complete audit trail. An operator's reason is kept on the audit row of the action it
--    explains (a retirement's reason then survives a reactivation, which clears the consumer
--    row's copy); a replay request is audited when it is made, and the replay's outcome names
--    who asked for it.
ALTER TABLE {{schema}}.lifecycle_audit
    DROP CONSTRAINT lifecycle_audit_kind_check,
    ADD CONSTRAINT lifecycle_audit_kind_check CHECK (kind IN (
        'lifecycle-observation:consumer-poisoned',
        'lifecycle-observation:consumer-replayed',
        'lifecycle-observation:dead-letter-replay-requested',
        'lifecycle-observation:dead-letter-resolved',
        'lifecycle-observation:consumer-retired',
        'lifecycle-observation:consumer-reactivated',
        'lifecycle-observation:reconciled',
        'lifecycle-observation:pruned')),
    ADD COLUMN reason text;

CREATE INDEX lifecycle_audit_recorded_idx ON {{schema}}.lifecycle_audit (recorded_at);

ALTER TABLE {{schema}}.lifecycle_deliveries
    ADD COLUMN replay_requested_by text;

-- 3. When a consumer last acknowledged an event, so `status` can tell a consumer that never
--    acknowledged anything (a typo'd consumer ID, say) from one that is merely behind.
ALTER TABLE {{schema}}.lifecycle_consumer_cursors
    ADD COLUMN last_acked_at timestamptz;
