-- lifecycle-outbox schema, version 17: each contract's check as plain SQL, generated.
--
-- Version 16 checked a payload first with one SQL/JSON path predicate per contract, stored in
-- the registry. Measured inside `write_event`, that predicate was half of the writer's cost:
-- `jsonb_path_match` evaluates its regular expressions and key scans one path step at a time.
-- The same rules written as an ordinary SQL expression (`jsonb_typeof`, `-`, `~`,
-- `char_length`) cost a fraction of it, and a SQL function made of one such expression is
-- inlined into `write_event`'s plan, so there is no call either.
--
-- So the registry now generates that function, `payload_is_valid(event_type, major, payload)`:
-- one `CASE` branch per registered, unretired contract. It is written again by a trigger
-- whenever the registry changes, as the schema owner (the operator who registers a contract
-- may not create functions), and only from the registry's structured columns: every name is
-- checked against the field-name rule and every value is quoted, so no text an operator
-- supplies is ever run. Read it as it stands with `\sf outbox.payload_is_valid`.
--
-- The expression is conservative, never lenient, as the predicate was: when it holds, the
-- payload is valid; when it does not (or cannot be sure: a timestamp on the 29th to 31st of
-- a month, or in the year 2000), `write_event` runs the field-by-field check, which names
-- the field it turns away. A session that still has the previous version in its plan cache
-- can only be more cautious: a new minor only adds optional fields, and a new contract falls
-- to the full check until the session sees the new function.

-- The expression that holds when the JSON object at `obj` (an SQL expression of type jsonb)
-- has no key outside `fields` and every field of `fields` as its specification requires.
CREATE FUNCTION {{schema}}.payload_check_expression(obj text, fields jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    -- What a pattern alone can settle of an RFC 3339 time the full check accepts: a year
    -- from 2001 (so no offset takes it before 2000) and a day up to 28 (every month has it).
    fast_time constant text := '^(200[1-9]|20[1-9][0-9]|2[1-9][0-9][0-9]|[3-9][0-9][0-9][0-9])-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]([.][0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$';
    terms text[] := ARRAY[format('jsonb_typeof(%s) = ''object''', obj)];
    rest  text := obj;
    k     text;
    spec  jsonb;
    v     text;
    t     text;
    valid text;
BEGIN
    FOR k, spec IN SELECT key, value FROM jsonb_each(fields) ORDER BY key LOOP
        -- The rule the CLI applies to a contract file; here it keeps the generated text SQL.
        IF k !~ '^[a-z][a-z0-9_]{0,63}$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid contract: field name %s', to_jsonb(k)::text);
        END IF;
        rest := rest || ' - ' || quote_literal(k);
        v := format('(%s -> %L)', obj, k);
        t := format('(%s ->> %L)', obj, k);
        valid := CASE spec ->> 'type'
            WHEN 'identifier' THEN format(
                '(jsonb_typeof(%s) = ''string'' AND %s ~ ''^[A-Za-z0-9._:@-]+$'' AND char_length(%s) <= %s)',
                v, t, t, coalesce((spec ->> 'max_length')::integer, 128))
            WHEN 'timestamp' THEN format(
                '(jsonb_typeof(%s) = ''string'' AND %s ~ %L)', v, t, fast_time)
            WHEN 'integer' THEN format(
                '(jsonb_typeof(%s) = ''number'' AND %s::numeric = trunc(%s::numeric) AND %s::numeric BETWEEN %s AND %s)',
                v, t, t, t,
                coalesce((spec ->> 'minimum')::bigint, -9223372036854775808),
                coalesce((spec ->> 'maximum')::bigint, 9223372036854775807))
            WHEN 'boolean' THEN format('(jsonb_typeof(%s) = ''boolean'')', v)
            WHEN 'enum' THEN format(
                '(jsonb_typeof(%s) = ''string'' AND %s = ANY (%L::text[]))', v, t,
                ARRAY(SELECT jsonb_array_elements_text(spec -> 'values')))
            WHEN 'object' THEN {{schema}}.payload_check_expression(v, spec -> 'fields')
        END;
        IF valid IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid contract: field %s has the unknown type %s',
                                 to_jsonb(k)::text, to_jsonb(spec ->> 'type')::text);
        END IF;
        -- A JSON null counts as absent, as in the full check.
        terms := terms || CASE WHEN (spec ->> 'required')::boolean THEN valid
            ELSE format('(%s IS NULL OR jsonb_typeof(%s) = ''null'' OR %s)', v, v, valid) END;
    END LOOP;
    terms := terms || format('(%s) = ''{}''::jsonb', rest);
    RETURN '(' || array_to_string(terms, E'\n        AND ') || ')';
END
$fn$;

-- Writes `payload_is_valid` anew from the registry: one branch per unretired contract.
CREATE FUNCTION {{schema}}.generate_payload_check()
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    c        record;
    branches text := '';
BEGIN
    FOR c IN SELECT event_type, major, fields FROM {{schema}}.lifecycle_event_contracts
             WHERE status <> 'retired' ORDER BY event_type, major LOOP
        branches := branches || format(E'\n    WHEN event_type = %L AND major = %s THEN\n        %s',
            c.event_type, c.major,
            {{schema}}.payload_check_expression('payload', c.fields));
    END LOOP;
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION {{schema}}.payload_is_valid('
        'event_type text, major integer, payload jsonb) '
        'RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
        E'-- Generated from the contract registry by generate_payload_check(); do not edit.\n'
        || 'SELECT CASE' || branches || E'\n    ELSE false\nEND');
END
$fn$;

-- Runs as the schema owner (the function's owner), so an operator who may change the
-- registry regenerates the check without the right to create functions.
CREATE FUNCTION {{schema}}.contracts_changed()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM {{schema}}.generate_payload_check();
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION {{schema}}.contracts_changed(), {{schema}}.generate_payload_check() FROM PUBLIC;

CREATE TRIGGER lifecycle_event_contracts_changed
    AFTER INSERT OR UPDATE OR DELETE ON {{schema}}.lifecycle_event_contracts
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.contracts_changed();

SELECT {{schema}}.generate_payload_check();

-- The predicate column of version 16 has no reader any more.
ALTER TABLE {{schema}}.lifecycle_event_contracts DROP COLUMN fast_check;

-- write_event as in version 16, with the generated check in place of the predicate.
-- Records one event of any registered type inside the caller's transaction and returns its
-- ID. The type must be registered and not retired, and the payload must match the contract of
-- that major (SQLSTATE 22023, with a message naming the field, otherwise). The ID is the type
-- (`:` as `-`, and `.vN` from major 2), the subject and the identity fields' canonical values,
-- joined by `:`, so a repeated write of one occurrence records nothing new. `task:deleted` 1
-- is stored as `write_task_deleted` stores it. One insert, like `write_task_deleted`.
CREATE OR REPLACE FUNCTION {{schema}}.write_event(
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
    SELECT ec.minor, ec.identity, ec.fields, ec.status INTO c
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
    -- The common, valid case in one inlined expression; the field-by-field check names the
    -- problem (or accepts the rare valid payload the expression is unsure of).
    IF {{schema}}.payload_is_valid(write_event.event_type, write_event.major, payload)
            IS NOT TRUE THEN
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
