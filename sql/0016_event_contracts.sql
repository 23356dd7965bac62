-- lifecycle-outbox schema, version 16: the event contract registry.
--
-- Until this version the stream carried one event type, `task:deleted`, whose rules lived in
-- `write_task_deleted`. From here every event type is described by a contract, one row per
-- type and major version, and the stream never carries an event that no contract describes:
--
--   * `outbox contracts add FILE` registers a contract (a new type, a new major beside the old
--     one, or a new minor of an active major that only adds optional fields: the CLI checks
--     compatibility before it writes), audited `contract-added`;
--   * `outbox contracts deprecate|retire` change its status, audited as such; a retired major
--     is refused by the writer;
--   * `write_event` (below) checks a payload against its contract inside the writer's
--     transaction and records the event with one insert, as `write_task_deleted` does.
--
-- `task:deleted` major 1 is registered here with exactly the rules `write_task_deleted`
-- enforces, and its stored layout stays as it was (`deleted_at` in its column, the prior
-- state as the payload), so every existing writer, consumer and event reads as before.
--
-- Field types form a closed set: identifier, timestamp, integer, boolean, enum and objects of
-- those. There is no free-text type: payloads never carry prose, credentials or free text.
CREATE TABLE {{schema}}.lifecycle_event_contracts (
    event_type    text NOT NULL
        CHECK (event_type ~ '^[a-z][a-z0-9_]{0,31}:[a-z][a-z0-9_]{0,31}$'),
    major         integer NOT NULL CHECK (major BETWEEN 1 AND 9999),
    minor         integer NOT NULL CHECK (minor BETWEEN 0 AND 9999),
    description   text NOT NULL CHECK (char_length(description) BETWEEN 1 AND 500),
    -- The payload fields whose values, with the type and the subject, make the event ID.
    identity      text[] NOT NULL,
    -- {"name": {"type": ..., "required": bool, ...}, ...}; see docs/src/contracts.md.
    fields        jsonb NOT NULL CHECK (jsonb_typeof(fields) = 'object'),
    -- The contract as one path predicate (Contract::fast_check): when it holds, the payload is
    -- valid and write_event skips the field-by-field check, which runs only to name the
    -- field of a payload it turns away (or to accept the rare valid one it is unsure of).
    fast_check    jsonpath NOT NULL,
    status        text NOT NULL DEFAULT 'active'
        CHECK (status IN ('active', 'deprecated', 'retired')),
    registered_by text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    changed_by    text,
    changed_at    timestamptz,
    PRIMARY KEY (event_type, major)
);

INSERT INTO {{schema}}.lifecycle_event_contracts
    (event_type, major, minor, description, identity, fields, fast_check, registered_by)
VALUES ('task:deleted', 1, 0,
        'A task was soft-deleted: the first deletedAt transition, with its prior column and status.',
        ARRAY['deleted_at'],
        '{"deleted_at": {"type": "timestamp", "required": true},
          "prior": {"type": "object", "required": false, "fields": {
              "column": {"type": "identifier", "required": false, "max_length": 64},
              "status": {"type": "identifier", "required": false, "max_length": 64}}}}',
        -- Contract::fast_check of the fields above (a unit test keeps the two the same).
        '($.type() == "object" && !exists($.keyvalue() ? (!(@.key == "deleted_at" || @.key == "prior"))) && (exists($."deleted_at") && ($."deleted_at".type() == "string" && $."deleted_at" like_regex "^(200[1-9]|20[1-9][0-9]|2[1-9][0-9][0-9]|[3-9][0-9][0-9][0-9])-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]([.][0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$")) && (!exists($."prior") || $."prior".type() == "null" || ($."prior".type() == "object" && !exists($."prior".keyvalue() ? (!(@.key == "column" || @.key == "status"))) && (!exists($."prior"."column") || $."prior"."column".type() == "null" || ($."prior"."column".type() == "string" && $."prior"."column" like_regex "^[A-Za-z0-9._:@-]{1,64}$")) && (!exists($."prior"."status") || $."prior"."status".type() == "null" || ($."prior"."status".type() == "string" && $."prior"."status" like_regex "^[A-Za-z0-9._:@-]{1,64}$")))))',
        'migration-16');

-- Events of other types have no deletion time; the payload holds what their contract names.
-- Both new columns are added without rewriting the table (a constant default, a NULL one).
ALTER TABLE {{schema}}.lifecycle_outbox
    ALTER COLUMN deleted_at DROP NOT NULL,
    ADD COLUMN type_minor integer NOT NULL DEFAULT 0,
    ADD COLUMN traceparent text,
    ADD CONSTRAINT lifecycle_outbox_deleted_at_check
        CHECK ((event_type = 'task:deleted') = (deleted_at IS NOT NULL)) NOT VALID,
    ADD CONSTRAINT lifecycle_outbox_traceparent_check
        CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;

-- Who registered, deprecated or retired which contract (`task:archived@1`).
ALTER TABLE {{schema}}.lifecycle_audit
    ADD COLUMN contract text,
    DROP CONSTRAINT lifecycle_audit_kind_check,
    ADD CONSTRAINT lifecycle_audit_kind_check CHECK (kind IN (
        'lifecycle-observation:consumer-poisoned',
        'lifecycle-observation:consumer-replayed',
        'lifecycle-observation:dead-letter-replay-requested',
        'lifecycle-observation:dead-letter-resolved',
        'lifecycle-observation:consumer-retired',
        'lifecycle-observation:consumer-reactivated',
        'lifecycle-observation:consumer-deleted',
        'lifecycle-observation:reconciled',
        'lifecycle-observation:pruned',
        'lifecycle-observation:history-diverged',
        'lifecycle-observation:contract-added',
        'lifecycle-observation:contract-deprecated',
        'lifecycle-observation:contract-retired'));

-- A W3C trace context header, version 00: checked by every writer before it is stored.
CREATE FUNCTION {{schema}}.check_traceparent(traceparent text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $fn$
BEGIN
    IF traceparent IS NULL THEN
        RETURN;
    END IF;
    IF char_length(traceparent) <> 55 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('invalid traceparent: %s characters, a version 00 header has 55',
                             char_length(traceparent));
    END IF;
    IF traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'invalid traceparent: expected 00-<32 hex trace ID>-<16 hex parent ID>-<2 hex flags>, lower case';
    END IF;
    IF substr(traceparent, 4, 32) = repeat('0', 32) OR substr(traceparent, 37, 16) = repeat('0', 16) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'invalid traceparent: an all-zero trace ID or parent ID is not allowed';
    END IF;
END
$fn$;

-- `write_task_deleted` as it was, with an optional trace context (a new last parameter, so
-- every existing call keeps its meaning). Dropped and created again because a parameter
-- cannot be added in place; the writer's grant follows below.
DROP FUNCTION {{schema}}.write_task_deleted(text, text, timestamptz, text, jsonb);
CREATE FUNCTION {{schema}}.write_task_deleted(
    project_id text, task_id text, deleted_at timestamptz, writer_process_id text,
    prior jsonb DEFAULT NULL, traceparent text DEFAULT NULL)
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
    IF traceparent IS NOT NULL THEN
        PERFORM {{schema}}.check_traceparent(traceparent);
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
         payload_version, payload, traceparent)
    VALUES
        (write_task_deleted.project_id, 'task:deleted', v_event_id, write_task_deleted.task_id,
         write_task_deleted.deleted_at, write_task_deleted.writer_process_id, 1, v_payload,
         write_task_deleted.traceparent)
    ON CONFLICT ON CONSTRAINT lifecycle_outbox_event_key DO NOTHING;
    RETURN v_event_id;
END
$fn$;

-- One field value against its specification; `label` is `task:archived@1`, `path` the
-- field's dotted name. Returns the value's canonical text, which identity fields contribute
-- to the event ID (a timestamp as UTC with microseconds, so two spellings of one instant make
-- one ID).
CREATE FUNCTION {{schema}}.check_field(label text, path text, spec jsonb, value jsonb)
RETURNS text
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    kind   text := spec ->> 'type';
    vtype  text := jsonb_typeof(value);
    text_v text;
    at     timestamptz;
    num    numeric;
    max_len integer;
BEGIN
    CASE kind
    WHEN 'identifier' THEN
        max_len := coalesce((spec ->> 'max_length')::integer, 128);
        IF vtype <> 'string' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": must be an identifier (a string), not %s',
                                 label, path, vtype);
        END IF;
        text_v := value #>> '{}';
        IF text_v ~ '^[A-Za-z0-9._:@-]+$' AND char_length(text_v) <= max_len THEN
            RETURN text_v;
        END IF;
        IF text_v = '' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": must not be empty', label, path);
        END IF;
        IF char_length(text_v) > max_len THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": %s characters exceeds the limit of %s',
                                 label, path, char_length(text_v), max_len);
        END IF;
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('invalid payload for %s: field "%s": only A-Z a-z 0-9 . _ : @ - are allowed in an identifier',
                             label, path);
    WHEN 'timestamp' THEN
        text_v := value #>> '{}';
        IF vtype <> 'string' OR text_v !~
            '^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": must be an RFC 3339 timestamp with an offset (2026-01-31T12:00:00Z)',
                                 label, path);
        END IF;
        IF substr(text_v, 9, 2)::integer > 28 THEN
            -- The only calendar check the pattern cannot make (30 February); rare enough
            -- that the subtransaction of an exception block is paid only here.
            BEGIN
                at := text_v::timestamptz;
            EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = format('invalid payload for %s: field "%s": %s is not a date',
                                     label, path, to_jsonb(text_v)::text);
            END;
        ELSE
            at := text_v::timestamptz;
        END IF;
        IF at < timestamptz '2000-01-01 00:00:00+00' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": %s is before 2000-01-01T00:00:00Z',
                                 label, path, text_v);
        END IF;
        RETURN to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
    WHEN 'integer' THEN
        IF vtype <> 'number' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": must be an integer, not %s',
                                 label, path, vtype);
        END IF;
        num := value::text::numeric;
        IF num <> trunc(num) OR num < -9223372036854775808 OR num > 9223372036854775807 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": %s is not a 64-bit integer',
                                 label, path, value::text);
        END IF;
        IF spec ? 'minimum' AND num < (spec ->> 'minimum')::numeric THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": %s is below the minimum %s',
                                 label, path, value::text, spec ->> 'minimum');
        END IF;
        IF spec ? 'maximum' AND num > (spec ->> 'maximum')::numeric THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": %s is above the maximum %s',
                                 label, path, value::text, spec ->> 'maximum');
        END IF;
        RETURN trunc(num)::text;
    WHEN 'boolean' THEN
        IF vtype <> 'boolean' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": must be true or false, not %s',
                                 label, path, vtype);
        END IF;
        RETURN value::text;
    WHEN 'enum' THEN
        IF vtype <> 'string' OR NOT (spec -> 'values') @> jsonb_build_array(value) THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": must be one of %s',
                                 label, path, spec -> 'values');
        END IF;
        RETURN value #>> '{}';
    WHEN 'object' THEN
        IF vtype <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": must be an object, not %s',
                                 label, path, vtype);
        END IF;
        PERFORM {{schema}}.check_fields(label, path || '.', spec -> 'fields', value);
        RETURN NULL;
    ELSE
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('invalid contract %s: field "%s" has the unknown type %s',
                             label, path, to_jsonb(kind)::text);
    END CASE;
END
$fn$;

-- An object against the fields of its contract: no field the contract does not name, every
-- required field present (a JSON null counts as absent), each value of its type.
CREATE FUNCTION {{schema}}.check_fields(label text, prefix text, fields jsonb, payload jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    k    text;
    spec jsonb;
BEGIN
    FOR k IN SELECT jsonb_object_keys(payload) ORDER BY 1 LOOP
        IF NOT fields ? k THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s: field "%s": not in the contract',
                                 label, prefix || k);
        END IF;
    END LOOP;
    FOR k, spec IN SELECT key, value FROM jsonb_each(fields) ORDER BY key LOOP
        IF payload -> k IS NULL OR payload -> k = 'null'::jsonb THEN
            IF (spec ->> 'required')::boolean THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = format('invalid payload for %s: field "%s": is required',
                                     label, prefix || k);
            END IF;
        ELSE
            PERFORM {{schema}}.check_field(label, prefix || k, spec, payload -> k);
        END IF;
    END LOOP;
END
$fn$;

-- Records one event of any registered type inside the caller's transaction and returns its
-- ID. The type must be registered and not retired, and the payload must match the contract of
-- that major (SQLSTATE 22023, with a message naming the field, otherwise). The ID is the type
-- (`:` as `-`, and `.vN` from major 2), the subject and the identity fields' canonical values,
-- joined by `:`, so a repeated write of one occurrence records nothing new. `task:deleted` 1
-- is stored as `write_task_deleted` stores it. One insert, like `write_task_deleted`.
CREATE FUNCTION {{schema}}.write_event(
    project_id text, event_type text, major integer, subject_id text, payload jsonb,
    writer_process_id text, traceparent text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
AS $fn$
DECLARE
    c    record;
    v_id text;
    k    text;
BEGIN
    IF (project_id ~ '^[A-Za-z0-9._:@-]+$' AND char_length(project_id) <= 128
        AND subject_id ~ '^[A-Za-z0-9._:@-]+$' AND char_length(subject_id) <= 128
        AND writer_process_id ~ '^[A-Za-z0-9._:@-]+$'
        AND char_length(writer_process_id) <= 128) IS NOT TRUE THEN
        PERFORM {{schema}}.check_identifier('project_id', project_id, 128);
        PERFORM {{schema}}.check_identifier('subject_id', subject_id, 128);
        PERFORM {{schema}}.check_identifier('writer_process_id', writer_process_id, 128);
    END IF;
    SELECT ec.minor, ec.identity, ec.fields, ec.status, ec.fast_check INTO c
    FROM {{schema}}.lifecycle_event_contracts ec
    WHERE ec.event_type = write_event.event_type AND ec.major = write_event.major;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('unknown event type %s@%s: no contract is registered '
                             '(see outbox contracts list)', event_type, major);
    END IF;
    IF c.status = 'retired' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('event type %s@%s is retired: its contract accepts no new events',
                             event_type, major);
    END IF;
    IF traceparent IS NOT NULL THEN
        PERFORM {{schema}}.check_traceparent(traceparent);
    END IF;
    -- The common, valid case in one predicate; the field-by-field check names the problem.
    IF jsonb_path_match(payload, c.fast_check) IS NOT TRUE THEN
        IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid payload for %s@%s: must be a JSON object',
                                 event_type, major);
        END IF;
        PERFORM {{schema}}.check_fields(event_type || '@' || major, '', c.fields, payload);
    END IF;
    IF write_event.event_type = 'task:deleted' AND write_event.major = 1 THEN
        -- The original layout, and the original writer's own checks of the deletion time.
        RETURN {{schema}}.write_task_deleted(project_id, subject_id,
            (payload ->> 'deleted_at')::timestamptz, writer_process_id, payload -> 'prior',
            traceparent);
    END IF;
    -- The ID: the type (`.vN` from major 2), the subject, each identity field's canonical
    -- text (a timestamp in UTC with microseconds, an integer without a fraction).
    v_id := replace(write_event.event_type, ':', '-')
        || CASE WHEN write_event.major > 1 THEN '.v' || write_event.major ELSE '' END
        || ':' || subject_id;
    FOREACH k IN ARRAY c.identity LOOP
        v_id := v_id || ':' || CASE c.fields -> k ->> 'type'
            WHEN 'timestamp' THEN to_char((payload ->> k)::timestamptz AT TIME ZONE 'UTC',
                                          'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
            WHEN 'integer' THEN ((payload ->> k)::numeric)::bigint::text
            ELSE payload ->> k
        END;
    END LOOP;
    INSERT INTO {{schema}}.lifecycle_outbox AS o
        (project_id, event_type, event_id, task_id, deleted_at, writer_process_id,
         payload_version, type_minor, payload, traceparent)
    VALUES
        (write_event.project_id, write_event.event_type, v_id, subject_id, NULL,
         write_event.writer_process_id, write_event.major, c.minor, payload,
         write_event.traceparent)
    ON CONFLICT ON CONSTRAINT lifecycle_outbox_event_key DO NOTHING;
    RETURN v_id;
END
$fn$;

-- Who may do what with contracts: every role reads them (writers check their payloads,
-- consumers their declared types); the operator registers and changes them.
DO $migration$
DECLARE
    s        text := trim(both '"' from '{{schema}}');
    writer   text := s || '_writer';
    consumer text := s || '_consumer';
    operator text := s || '_operator';
BEGIN
    EXECUTE format('GRANT SELECT ON %I.lifecycle_event_contracts TO %I, %I, %I',
                   s, writer, consumer, operator);
    EXECUTE format('GRANT INSERT, UPDATE ON %I.lifecycle_event_contracts TO %I', s, operator);
    -- The Rust writer tells a new event from one recorded before by whether its row belongs
    -- to the caller's transaction.
    EXECUTE format('GRANT SELECT (xid) ON %I.lifecycle_outbox TO %I', s, writer);
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   '%I.write_task_deleted(text, text, timestamptz, text, jsonb, text), '
                   '%I.write_event(text, text, integer, text, jsonb, text, text), '
                   '%I.check_traceparent(text), %I.check_field(text, text, jsonb, jsonb), '
                   '%I.check_fields(text, text, jsonb, jsonb) TO %I',
                   s, s, s, s, s, writer);
END
$migration$;
