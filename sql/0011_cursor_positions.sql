-- lifecycle-outbox schema, version 11: cursor positions that old snapshots cannot slow down.
--
-- Until now every acknowledgement updated the consumer's row. Each update leaves a dead
-- version that nothing can remove while any snapshot in the database is older (pg_dump, a long
-- report, an idle transaction, a replica's hot_standby_feedback), and every later read or
-- update of the row walks all of them: under a snapshot held for three minutes, an
-- acknowledgement read 4,423 buffers instead of 17, and the row is read by every fenced write.
--
-- Now a consumer's position is appended, never updated: each acknowledgement inserts the new
-- position and deletes the one it replaces, by its exact key, in one statement. The current
-- position is the newest row of the consumer, read from the high end of the primary key, where
-- nothing dead ever lies: the versions an old snapshot keeps are all below it. The consumer's
-- row keeps its lease and state, which change at heartbeat and operator pace, and every
-- position write still locks it (a row lock writes no new version), so a takeover waits for
-- the write as before and the lease generation fences it.
--
-- `lifecycle_consumer_cursors` becomes a view with the same columns, so every reader keeps
-- its query; writers use the two tables.

ALTER TABLE {{schema}}.lifecycle_consumer_cursors RENAME TO lifecycle_consumers;
ALTER INDEX {{schema}}.lifecycle_consumer_cursors_pkey RENAME TO lifecycle_consumers_pkey;
ALTER TABLE {{schema}}.lifecycle_consumers
    RENAME CONSTRAINT lifecycle_consumer_cursors_consumer_check TO lifecycle_consumers_consumer_check;

-- One row per position a consumer has stood on; only its newest is current. A missing cursor
-- (a new consumer, or one reactivated to reconcile) is either no row or a newest row whose
-- sequence is NULL. `last_acked_at` and `reconciled_at` are carried from each position to the
-- next, so the newest row says when the cursor last moved by an acknowledgement and when it
-- last reconciled.
CREATE TABLE {{schema}}.lifecycle_consumer_positions (
    project_id          text        NOT NULL,
    consumer_id         text        NOT NULL,
    position_id         bigint      GENERATED ALWAYS AS IDENTITY,
    last_acked_sequence bigint      CHECK (last_acked_sequence >= 0),
    last_acked_event_id text,
    last_acked_at       timestamptz,
    reconciled_at       timestamptz,
    PRIMARY KEY (project_id, consumer_id, position_id),
    FOREIGN KEY (project_id, consumer_id)
        REFERENCES {{schema}}.lifecycle_consumers (project_id, consumer_id)
);

INSERT INTO {{schema}}.lifecycle_consumer_positions
    (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
     reconciled_at)
SELECT project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
       reconciled_at
FROM {{schema}}.lifecycle_consumers
WHERE last_acked_sequence IS NOT NULL OR last_acked_at IS NOT NULL OR reconciled_at IS NOT NULL
ORDER BY project_id, consumer_id;

ALTER TABLE {{schema}}.lifecycle_consumers
    DROP COLUMN last_acked_sequence,
    DROP COLUMN last_acked_event_id,
    DROP COLUMN last_acked_at,
    DROP COLUMN reconciled_at;

-- The columns and their order are those of the table this replaces.
CREATE VIEW {{schema}}.lifecycle_consumer_cursors WITH (security_invoker = true) AS
SELECT c.project_id, c.consumer_id, p.last_acked_sequence, c.lease_owner, c.lease_generation,
       c.lease_expires_at, c.heartbeat_at, c.state, c.created_at, c.retired_at, c.retired_by,
       c.retired_reason, p.reconciled_at, p.last_acked_at, p.last_acked_event_id
FROM {{schema}}.lifecycle_consumers AS c
LEFT JOIN LATERAL (
    SELECT last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at
    FROM {{schema}}.lifecycle_consumer_positions AS p
    WHERE p.project_id = c.project_id AND p.consumer_id = c.consumer_id
    ORDER BY p.position_id DESC
    LIMIT 1) AS p ON true;

-- Row security: the positions carry the project binding of the consumers they belong to, and
-- are switched on with them when the schema already runs under row security.
DO $migration$
DECLARE
    s        text := trim(both '"' from '{{schema}}');
    consumer text := s || '_consumer';
    operator text := s || '_operator';
BEGIN
    EXECUTE format('CREATE POLICY project_binding ON %I.lifecycle_consumer_positions '
                   'TO %I, %I, %I '
                   'USING (%I.project_allowed(project_id, current_user)) '
                   'WITH CHECK (%I.project_allowed(project_id, current_user))',
                   s, s || '_writer', consumer, operator, s, s);
    IF (SELECT c.relrowsecurity FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = s AND c.relname = 'lifecycle_consumers') THEN
        EXECUTE format('ALTER TABLE %I.lifecycle_consumer_positions ENABLE ROW LEVEL SECURITY',
                       s);
    END IF;

    -- The consumer role appends and replaces its positions; both roles read them.
    EXECUTE format('GRANT SELECT, INSERT (project_id, consumer_id, last_acked_sequence, '
                   'last_acked_event_id, last_acked_at, reconciled_at), DELETE '
                   'ON %I.lifecycle_consumer_positions TO %I', s, consumer);
    EXECUTE format('GRANT SELECT ON %I.lifecycle_consumer_positions, '
                   '%I.lifecycle_consumer_cursors TO %I, %I', s, s, consumer, operator);
END
$migration$;
