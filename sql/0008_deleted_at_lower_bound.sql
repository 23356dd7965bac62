-- lifecycle-outbox schema, version 8: `deleted_at` bounded below as well as above.
--
-- The SQL writer refused a `deleted_at` more than 5 minutes ahead of the clock, but took any
-- time before it: '4000-01-01 BC' and 1900-01-01 were stored as deletions, and '-infinity'
-- failed late with a NOT NULL violation (23502) on the event ID it could not format. A time
-- before 2000-01-01T00:00:00Z is a default value or a writer's bug, never a real deletion: it
-- is refused with 22023 like every other invalid argument, and so are both infinities. The
-- Rust writer checks the same bound (`MIN_DELETED_AT`). The rest of the function is version
-- 7's.

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
    -- problem when it is not known to hold (NULL arguments included). Lengths are checked
    -- apart from the character class: a bounded repetition such as `{1,128}` makes the
    -- regular expression engine track every count, twenty times the cost of `+`.
    IF (project_id ~ '^[A-Za-z0-9._:@-]+$' AND char_length(project_id) <= 128
        AND task_id ~ '^[A-Za-z0-9._:@-]+$' AND char_length(task_id) <= 128
        AND writer_process_id ~ '^[A-Za-z0-9._:@-]+$'
        AND char_length(writer_process_id) <= 128) IS NOT TRUE THEN
        PERFORM {{schema}}.check_identifier('project_id', project_id, 128);
        PERFORM {{schema}}.check_identifier('task_id', task_id, 128);
        PERFORM {{schema}}.check_identifier('writer_process_id', writer_process_id, 128);
    END IF;
    IF deleted_at IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'invalid deleted_at: must not be null';
    END IF;
    IF deleted_at = '-infinity' OR deleted_at = 'infinity' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('invalid deleted_at: %s is not a finite time', deleted_at);
    END IF;
    IF deleted_at < timestamptz '2000-01-01 00:00:00+00' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('invalid deleted_at: %s is before 2000-01-01T00:00:00Z',
                to_char(deleted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
                || CASE WHEN deleted_at < timestamptz '0001-01-01 00:00:00+00' THEN ' BC'
                   ELSE '' END);
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
               AND prior ->> 'column' ~ '^[A-Za-z0-9._:@-]+$'
               AND char_length(prior ->> 'column') <= 64))
          AND (NOT prior ? 'status' OR (jsonb_typeof(prior -> 'status') = 'string'
               AND prior ->> 'status' ~ '^[A-Za-z0-9._:@-]+$'
               AND char_length(prior ->> 'status') <= 64))) IS TRUE THEN
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
