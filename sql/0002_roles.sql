-- lifecycle-outbox schema, version 2: least-privilege roles.
--
-- Three NOLOGIN roles per schema, named after it (for schema `outbox`: outbox_writer,
-- outbox_consumer, outbox_operator). Grant one to each login role a process uses:
--
--   GRANT outbox_writer   TO api_service;     -- records events, nothing else
--   GRANT outbox_consumer TO search_indexer;  -- reads events, moves its cursor and lease
--   GRANT outbox_operator TO ops_cli;         -- replays, resolves, retires, prunes, reads all
--
-- Everything runs with invoker rights (no SECURITY DEFINER): the statements the Rust runtime
-- sends are plain SQL, so the grants below are what each role may do, row security (see
-- docs/design.md, "Row security") applies to the real caller, and a mistake in a function
-- cannot lend the owner's rights to anyone. docs/design.md has the reasoning.
--
-- Roles are cluster-wide: they are created when missing (which needs CREATEROLE, or a
-- superuser), and left alone when they exist, so every database using this schema name
-- shares them. The grants are per database, on this schema's objects.
DO $migration$
DECLARE
    s        text := trim(both '"' from '{{schema}}');
    writer   text := s || '_writer';
    consumer text := s || '_consumer';
    operator text := s || '_operator';
    r        text;
BEGIN
    FOREACH r IN ARRAY ARRAY[writer, consumer, operator] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                -- Created meanwhile by a migration of another database on this cluster.
                NULL;
            END;
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', s, r);
        -- Every command first checks that the schema matches its build.
        EXECUTE format('GRANT SELECT ON %I.schema_migrations TO %I', s, r);
    END LOOP;

    -- Writer: insert events, or call write_task_deleted, which inserts with the caller's
    -- rights. The idempotent insert (ON CONFLICT on the event key) needs to read the key
    -- columns, and the Rust writer reads back the new row's id; nothing else is readable.
    EXECUTE format('GRANT INSERT ON %I.lifecycle_outbox TO %I', s, writer);
    EXECUTE format('GRANT SELECT (id, project_id, event_id) ON %I.lifecycle_outbox TO %I',
                   s, writer);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.write_task_deleted(text, text, timestamptz, '
                   'text, jsonb), %I.check_identifier(text, text, integer), '
                   '%I.check_prior(jsonb) TO %I', s, s, s, writer);

    -- Consumer: read events and heads; claim, renew and release its lease; move its cursor;
    -- keep its retry and dead-letter state; record its audit entries. It also runs the
    -- embedded sequencer, which numbers events (sequence columns only) and advances heads.
    -- It cannot delete or insert events, touch the retention floor, or retire or reactivate
    -- a consumer (the state columns are the operator's).
    EXECUTE format('GRANT SELECT ON %I.lifecycle_outbox, %I.lifecycle_project_heads, '
                   '%I.lifecycle_consumer_cursors, %I.lifecycle_deliveries TO %I',
                   s, s, s, s, consumer);
    EXECUTE format('GRANT UPDATE (sequence, sequenced_at) ON %I.lifecycle_outbox TO %I',
                   s, consumer);
    EXECUTE format('GRANT INSERT (project_id, head_sequence), UPDATE (head_sequence) '
                   'ON %I.lifecycle_project_heads TO %I', s, consumer);
    EXECUTE format('GRANT INSERT (project_id, consumer_id, lease_owner, lease_generation, '
                   'lease_expires_at, heartbeat_at), UPDATE (last_acked_sequence, lease_owner, '
                   'lease_generation, lease_expires_at, heartbeat_at, reconciled_at) '
                   'ON %I.lifecycle_consumer_cursors TO %I', s, consumer);
    EXECUTE format('GRANT INSERT, UPDATE, DELETE ON %I.lifecycle_deliveries TO %I',
                   s, consumer);
    EXECUTE format('GRANT INSERT ON %I.lifecycle_audit TO %I', s, consumer);

    -- Operator: read everything; request replays and resolve dead letters (state columns
    -- only); retire consumers (never move a cursor); prune events and settled dead letters
    -- and raise the retention floor; write the audit trail. It cannot record events.
    EXECUTE format('GRANT SELECT ON %I.lifecycle_outbox, %I.lifecycle_project_heads, '
                   '%I.lifecycle_consumer_cursors, %I.lifecycle_deliveries, '
                   '%I.lifecycle_audit TO %I', s, s, s, s, s, operator);
    EXECUTE format('GRANT DELETE ON %I.lifecycle_outbox TO %I', s, operator);
    EXECUTE format('GRANT UPDATE (pruned_through) ON %I.lifecycle_project_heads TO %I',
                   s, operator);
    EXECUTE format('GRANT UPDATE (state, retired_at, retired_by, retired_reason) '
                   'ON %I.lifecycle_consumer_cursors TO %I', s, operator);
    EXECUTE format('GRANT UPDATE (state, next_attempt_at, updated_at, resolved_at, '
                   'resolved_by, resolved_reason), DELETE '
                   'ON %I.lifecycle_deliveries TO %I', s, operator);
    EXECUTE format('GRANT INSERT, UPDATE (count) ON %I.lifecycle_audit TO %I', s, operator);
END
$migration$;

-- Per-project row security (optional; inert until `outbox migrate --row-security` enables it
-- on the tables below). A role is bound to projects by rows of lifecycle_role_projects; a
-- member of a bound role (directly or through role membership) sees and writes only rows of
-- those projects, `*` binding every project. Bound or not, the tables' owner is exempt, as
-- PostgreSQL exempts owners from row security unless forced.
CREATE TABLE {{schema}}.lifecycle_role_projects (
    role_name  text NOT NULL,
    project_id text NOT NULL,
    PRIMARY KEY (role_name, project_id)
);

-- Whether `caller` may see rows of `project`. SECURITY DEFINER so that the policies can read
-- the bindings without every role being able to read them; it reads only, and its
-- search_path is pinned so no object of the caller's can stand in for the catalog's.
CREATE FUNCTION {{schema}}.project_allowed(project text, caller name)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT EXISTS (
        SELECT 1
        FROM {{schema}}.lifecycle_role_projects b
        JOIN pg_catalog.pg_roles r ON r.rolname = b.role_name
        WHERE (b.project_id = project OR b.project_id = '*')
          AND pg_catalog.pg_has_role(caller, r.oid, 'USAGE'))
$fn$;

DO $policies$
DECLARE
    s text := trim(both '"' from '{{schema}}');
    t text;
BEGIN
    EXECUTE format('REVOKE ALL ON FUNCTION %I.project_allowed(text, name) FROM PUBLIC', s);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.project_allowed(text, name) TO %I, %I, %I',
                   s, s || '_writer', s || '_consumer', s || '_operator');
    FOREACH t IN ARRAY ARRAY['lifecycle_outbox', 'lifecycle_project_heads',
                             'lifecycle_consumer_cursors', 'lifecycle_deliveries',
                             'lifecycle_audit'] LOOP
        EXECUTE format('CREATE POLICY project_binding ON %I.%I TO %I, %I, %I '
                       'USING (%I.project_allowed(project_id, current_user)) '
                       'WITH CHECK (%I.project_allowed(project_id, current_user))',
                       s, t, s || '_writer', s || '_consumer', s || '_operator', s, s);
    END LOOP;
END
$policies$;
