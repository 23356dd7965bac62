-- lifecycle-outbox schema, version 1.
--
-- `{{schema}}` is replaced by the quoted schema name when the migration is applied; the
-- checksum recorded in schema_migrations is taken over this file as written.

-- The outbox. Writers insert with `sequence` NULL; the sequencer numbers committed rows
-- afterwards, so a sequence is never visible before every lower one of its project.
--
-- Every index and check here is paid by every delete transaction, so the insert path is kept
-- to the heap and three small indexes: arrival order, the idempotency key and the sequencer's
-- work list. Input validation lives in the writers (write_task_deleted below, and the Rust
-- writer), not in per-row CHECKs; the sequence index is partial, so the sequencer writes it,
-- not the writer.
CREATE TABLE {{schema}}.lifecycle_outbox (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id        text        NOT NULL,
    sequence          bigint,
    event_type        text        NOT NULL,
    event_id          text        NOT NULL,
    task_id           text        NOT NULL,
    deleted_at        timestamptz NOT NULL,
    writer_process_id text        NOT NULL,
    occurred_at       timestamptz NOT NULL DEFAULT now(),
    payload_version   integer     NOT NULL,
    payload           jsonb       NOT NULL,
    sequenced_at      timestamptz,
    CONSTRAINT lifecycle_outbox_event_key UNIQUE (project_id, event_id)
);

-- Readers scan `sequence > cursor` per project; also a backstop against numbering twice.
CREATE UNIQUE INDEX lifecycle_outbox_sequence_idx
    ON {{schema}}.lifecycle_outbox (project_id, sequence) WHERE sequence IS NOT NULL;

-- The sequencer's work list: only unsequenced rows, in arrival order. Stays tiny.
CREATE INDEX lifecycle_outbox_unsequenced_idx
    ON {{schema}}.lifecycle_outbox (id) WHERE sequence IS NULL;

-- Per-project numbering state and the retention floor.
CREATE TABLE {{schema}}.lifecycle_project_heads (
    project_id     text   PRIMARY KEY,
    head_sequence  bigint NOT NULL DEFAULT 0 CHECK (head_sequence >= 0),
    pruned_through bigint NOT NULL DEFAULT 0 CHECK (pruned_through >= 0),
    CONSTRAINT lifecycle_project_heads_floor_check CHECK (pruned_through <= head_sequence)
);

-- One row per durable consumer of a project: its cursor and its lease. A NULL cursor is a
-- missing one: the consumer has not yet reconciled (or chosen to replay retained history).
CREATE TABLE {{schema}}.lifecycle_consumer_cursors (
    project_id          text        NOT NULL,
    consumer_id         text        NOT NULL,
    last_acked_sequence bigint      CHECK (last_acked_sequence >= 0),
    lease_owner         text,
    lease_generation    bigint      NOT NULL DEFAULT 0,
    lease_expires_at    timestamptz,
    heartbeat_at        timestamptz,
    state               text        NOT NULL DEFAULT 'active'
                                    CHECK (state IN ('active', 'retired')),
    created_at          timestamptz NOT NULL DEFAULT now(),
    retired_at          timestamptz,
    retired_by          text,
    retired_reason      text,
    reconciled_at       timestamptz,
    PRIMARY KEY (project_id, consumer_id),
    CONSTRAINT lifecycle_consumer_cursors_consumer_check
        CHECK (consumer_id ~ '^[A-Za-z0-9._:@-]{1,128}$')
);

-- Per-consumer delivery state of events that failed at least once.
CREATE TABLE {{schema}}.lifecycle_deliveries (
    project_id         text        NOT NULL,
    consumer_id        text        NOT NULL,
    event_id           text        NOT NULL,
    sequence           bigint      NOT NULL,
    attempts           integer     NOT NULL CHECK (attempts >= 0),
    next_attempt_at    timestamptz,
    last_failure_class text        CHECK (last_failure_class ~ '^[a-z0-9_]{1,64}$'),
    state              text        NOT NULL
                                   CHECK (state IN ('retrying', 'dead', 'replay_requested',
                                                    'replayed', 'resolved')),
    first_failed_at    timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    parked_at          timestamptz,
    resolved_at        timestamptz,
    resolved_by        text,
    resolved_reason    text,
    PRIMARY KEY (project_id, consumer_id, event_id),
    FOREIGN KEY (project_id, consumer_id)
        REFERENCES {{schema}}.lifecycle_consumer_cursors (project_id, consumer_id)
);

CREATE INDEX lifecycle_deliveries_state_idx
    ON {{schema}}.lifecycle_deliveries (project_id, consumer_id, state);

-- Operator-visible trail of parking, replay, resolution, retirement, reconciliation, pruning.
-- Identifiers and counts only: never payloads, error text or credentials.
CREATE TABLE {{schema}}.lifecycle_audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text        NOT NULL CHECK (kind IN (
                    'lifecycle-observation:consumer-poisoned',
                    'lifecycle-observation:consumer-replayed',
                    'lifecycle-observation:dead-letter-resolved',
                    'lifecycle-observation:consumer-retired',
                    'lifecycle-observation:consumer-reactivated',
                    'lifecycle-observation:reconciled',
                    'lifecycle-observation:pruned')),
    project_id  text,
    consumer_id text,
    event_id    text,
    actor       text,
    count       bigint,
    recorded_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX lifecycle_audit_project_idx ON {{schema}}.lifecycle_audit (project_id, id);

-- Validates one identifier argument of write_task_deleted; raises the same messages as the
-- Rust writer's validation (outbox-core `ids.rs`).
CREATE FUNCTION {{schema}}.check_identifier(field text, value text, max_len integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    pos integer := 0;
    ch  text;
BEGIN
    IF value IS NULL OR value = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('invalid %s: must not be empty', field);
    END IF;
    IF value ~ ('^[A-Za-z0-9._:@-]{1,' || max_len || '}$') THEN
        RETURN;
    END IF;
    IF char_length(value) > max_len THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('invalid %s: %s characters exceeds the limit of %s',
                             field, char_length(value), max_len);
    END IF;
    FOREACH ch IN ARRAY regexp_split_to_array(value, '') LOOP
        pos := pos + 1;
        IF ascii(ch) < 32 OR ascii(ch) = 127 OR ascii(ch) BETWEEN 128 AND 159 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid %s: control character at position %s', field, pos);
        END IF;
        IF ch !~ '^[A-Za-z0-9._:@-]$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid %s: character %s at position %s is not allowed '
                                 '(allowed: A-Z a-z 0-9 . _ : @ -)', field, to_jsonb(ch)::text, pos);
        END IF;
    END LOOP;
END
$fn$;

-- Validates `prior` (the minimum observer data) and returns the payload object to store.
CREATE FUNCTION {{schema}}.check_prior(prior jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
AS $fn$
DECLARE
    k text;
BEGIN
    IF prior IS NULL OR prior = 'null'::jsonb THEN
        RETURN '{}'::jsonb;
    END IF;
    IF jsonb_typeof(prior) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'invalid prior: must be a JSON object';
    END IF;
    FOR k IN SELECT jsonb_object_keys(prior) ORDER BY 1 LOOP
        IF k NOT IN ('column', 'status') THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid prior: unknown key %s (known keys: column, status)',
                                 to_jsonb(k)::text);
        END IF;
        IF jsonb_typeof(prior -> k) <> 'string' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('invalid prior.%s: must be a string', k);
        END IF;
        PERFORM {{schema}}.check_identifier('prior.' || k, prior ->> k, 64);
    END LOOP;
    RETURN prior;
END
$fn$;

-- The writer, for services in any language. Call it inside the transaction that soft-deletes
-- the task: one insert, no counter row, no NOTIFY. Returns the event ID; a repeated delete of
-- the same (task_id, deleted_at) writes nothing and returns the same ID.
CREATE FUNCTION {{schema}}.write_task_deleted(
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
    -- problem when it fails.
    IF NOT (project_id ~ '^[A-Za-z0-9._:@-]{1,128}$'
            AND task_id ~ '^[A-Za-z0-9._:@-]{1,128}$'
            AND writer_process_id ~ '^[A-Za-z0-9._:@-]{1,128}$') THEN
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
    ELSIF jsonb_typeof(prior) = 'object'
          AND prior - 'column' - 'status' = '{}'::jsonb
          AND (NOT prior ? 'column' OR (jsonb_typeof(prior -> 'column') = 'string'
               AND prior ->> 'column' ~ '^[A-Za-z0-9._:@-]{1,64}$'))
          AND (NOT prior ? 'status' OR (jsonb_typeof(prior -> 'status') = 'string'
               AND prior ->> 'status' ~ '^[A-Za-z0-9._:@-]{1,64}$')) THEN
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
