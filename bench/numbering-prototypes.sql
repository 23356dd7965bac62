-- Numbering prototypes for bench/numbering-prototypes.sh: candidate designs of numbering that
-- an old snapshot cannot slow down, in plain SQL, beside today's (schema `outbox`, migrated by
-- `outbox migrate`). Each prototype is complete enough to be correct under concurrent writers
-- (the script checks every prototype's numbers for density and for every committed event
-- being numbered exactly once); none has the rest of the product (roles, pruning, readers).
--
-- frontier (schema proto): insert-only event rows that carry their writer's transaction ID
--   (`xid8`, `pg_current_xact_id()`), numbers stored apart, one narrow row per event. Each
--   tick starts from the previous tick's snapshot (stored, insert-only, in `proto.ticks`):
--   the new work is every visible row whose transaction was not visible to that snapshot,
--   that is, with `xid >= xmax(previous)` (a range of the xid index that starts past all done
--   work) or with `xid` among the previous snapshot's in-progress transactions (one index
--   probe each). PgQ finds its batches the same way (pgq.batch_event_sql).
-- tickrows (schema proto): the same frontier; the numbers stored as one row per project and
--   tick (the first number and the tick's event IDs in order).
-- tidrows (schema proto): the same frontier and one row per project and tick, holding the
--   tick's events in order as their physical addresses (`ctid`) and arrival IDs instead of
--   their event IDs. The event rows are insert-only, so an address stays the row's until the
--   row is pruned or the table rewritten (VACUUM FULL, CLUSTER, a restore); a reader fetches a
--   batch by address, one TID scan in page order, and checks each row's arrival ID, so a
--   rewritten table is detected (a row missing from the fetch) rather than misread; the
--   readers of a real design would then find the row by its key. A reader's cost per event
--   is then a share of a heap page, as with the sequence index today, not an index probe.
-- Heads are not a row that every tick updates (under a held snapshot every update leaves a
-- version that each later lookup of the key walks past): a project's head is the last
-- number stored, read from the newest end of an insert-only index.

CREATE SCHEMA proto;

CREATE TABLE proto.events (
    id                bigint      GENERATED ALWAYS AS IDENTITY,
    project_id        text        NOT NULL,
    event_type        text        NOT NULL,
    event_id          text        NOT NULL,
    task_id           text        NOT NULL,
    deleted_at        timestamptz NOT NULL,
    writer_process_id text        NOT NULL,
    occurred_at       timestamptz NOT NULL DEFAULT now(),
    payload_version   integer     NOT NULL,
    payload           jsonb       NOT NULL,
    -- The writer's (top-level) transaction: what the frontier is expressed in.
    xid               xid8        NOT NULL DEFAULT pg_current_xact_id(),
    CONSTRAINT events_event_key UNIQUE (project_id, event_id)
);
CREATE INDEX events_xid_idx ON proto.events (xid);

-- One row per tick that numbered something: the snapshot it numbered in. Insert-only.
CREATE TABLE proto.ticks (
    tick     bigint      PRIMARY KEY,
    snap     pg_snapshot NOT NULL
);
INSERT INTO proto.ticks VALUES (0, pg_current_snapshot());

CREATE TABLE proto.numbers (
    project_id text   NOT NULL,
    sequence   bigint NOT NULL,
    event_id   text   NOT NULL,
    PRIMARY KEY (project_id, sequence)
);

CREATE TABLE proto.tick_rows (
    project_id     text   NOT NULL,
    first_sequence bigint NOT NULL,
    event_ids      text[] NOT NULL,
    PRIMARY KEY (project_id, first_sequence)
);

CREATE TABLE proto.tick_tids (
    project_id     text     NOT NULL,
    first_sequence bigint   NOT NULL,
    row_ids        tid[]    NOT NULL,
    ids            bigint[] NOT NULL,
    PRIMARY KEY (project_id, first_sequence)
);

-- The writer's statement (the Rust writer's shape).
-- INSERT INTO proto.events (project_id, event_type, event_id, task_id, deleted_at,
--     writer_process_id, payload_version, payload) VALUES (...)
-- ON CONFLICT ON CONSTRAINT events_event_key DO NOTHING RETURNING id;

-- The new work of a tick, as one view so both prototypes and the idle probe share it: rows
-- visible to the statement's snapshot whose transaction the previous tick's snapshot did not
-- see. `xid >= xmax(prev)` is a range scan of the xid index that begins past every row an
-- earlier tick numbered; the in-progress list of the previous snapshot is at most the number
-- of open transactions, each one probe of the same index.
CREATE VIEW proto.new_work AS
SELECT e.id, e.row_id, e.project_id, e.event_id, prev.tick
FROM (SELECT tick, snap FROM proto.ticks ORDER BY tick DESC LIMIT 1) AS prev
CROSS JOIN LATERAL (
    SELECT id, ctid AS row_id, project_id, event_id FROM proto.events
    WHERE xid >= pg_snapshot_xmax(prev.snap)
    UNION ALL
    SELECT id, ctid, project_id, event_id FROM proto.events
    WHERE xid = ANY (ARRAY(SELECT pg_snapshot_xip(prev.snap)))) AS e;

-- The idle probe. The probe and the ticks are PL/pgSQL, which keeps each statement's plan for
-- the session, as the real sequencer keeps its prepared statements (a SQL function's body is
-- planned again at every call, which under a tick every millisecond costs more than the tick).
CREATE FUNCTION proto.pending() RETURNS boolean LANGUAGE plpgsql STABLE
AS $$ BEGIN RETURN EXISTS (SELECT FROM proto.new_work); END $$;

-- One tick, narrow numbers: returns the events numbered. Run under the sequencer's
-- transaction-level advisory lock, in a statement that starts after the lock was granted (as
-- today's tick), so its snapshot includes the previous tick's row.
CREATE FUNCTION proto.tick_narrow() RETURNS bigint LANGUAGE plpgsql
AS $$
DECLARE
    numbered bigint;
BEGIN
    WITH pending AS (
        SELECT project_id, event_id, tick,
               row_number() OVER (PARTITION BY project_id ORDER BY id) AS rank
        FROM proto.new_work
    ),
    counts AS (SELECT project_id, count(*) AS n FROM pending GROUP BY project_id),
    heads AS (
        SELECT c.project_id, coalesce(h.sequence, 0) AS head
        FROM counts c
        LEFT JOIN LATERAL (SELECT sequence FROM proto.numbers n
                           WHERE n.project_id = c.project_id
                           ORDER BY sequence DESC LIMIT 1) AS h ON true
    ),
    stored AS (
        INSERT INTO proto.numbers (project_id, sequence, event_id)
        SELECT p.project_id, heads.head + p.rank, p.event_id
        FROM pending p JOIN heads USING (project_id)
        RETURNING 1
    ),
    ticked AS (
        INSERT INTO proto.ticks (tick, snap)
        SELECT max(tick) + 1, pg_current_snapshot() FROM pending HAVING count(*) > 0
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM stored) + 0 * (SELECT count(*) FROM ticked) INTO numbered;
    RETURN numbered;
END $$;

-- One tick, numbers as one row per project and tick.
CREATE FUNCTION proto.tick_rows() RETURNS bigint LANGUAGE plpgsql
AS $$
DECLARE
    numbered bigint;
BEGIN
    WITH pending AS (SELECT project_id, event_id, id, tick FROM proto.new_work),
    counts AS (
        SELECT project_id, count(*) AS n, array_agg(event_id ORDER BY id) AS event_ids
        FROM pending GROUP BY project_id
    ),
    heads AS (
        SELECT c.project_id, c.event_ids,
               coalesce(h.first_sequence + cardinality(h.event_ids) - 1, 0) AS head
        FROM counts c
        LEFT JOIN LATERAL (SELECT first_sequence, event_ids FROM proto.tick_rows t
                           WHERE t.project_id = c.project_id
                           ORDER BY first_sequence DESC LIMIT 1) AS h ON true
    ),
    stored AS (
        INSERT INTO proto.tick_rows (project_id, first_sequence, event_ids)
        SELECT project_id, head + 1, event_ids FROM heads
        RETURNING cardinality(event_ids) AS n
    ),
    ticked AS (
        INSERT INTO proto.ticks (tick, snap)
        SELECT max(tick) + 1, pg_current_snapshot() FROM pending HAVING count(*) > 0
        RETURNING 1
    )
    SELECT coalesce((SELECT sum(n) FROM stored), 0)::bigint + 0 * (SELECT count(*) FROM ticked)
    INTO numbered;
    RETURN numbered;
END $$;

-- One tick, numbers as one row per project and tick holding the events' addresses and
-- arrival IDs.
CREATE FUNCTION proto.tick_tids() RETURNS bigint LANGUAGE plpgsql
AS $$
DECLARE
    numbered bigint;
BEGIN
    WITH pending AS (SELECT project_id, row_id, id, tick FROM proto.new_work),
    counts AS (
        SELECT project_id, array_agg(row_id ORDER BY id) AS row_ids,
               array_agg(id ORDER BY id) AS ids
        FROM pending GROUP BY project_id
    ),
    heads AS (
        SELECT c.project_id, c.row_ids, c.ids,
               coalesce(h.first_sequence + cardinality(h.ids) - 1, 0) AS head
        FROM counts c
        LEFT JOIN LATERAL (SELECT first_sequence, ids FROM proto.tick_tids t
                           WHERE t.project_id = c.project_id
                           ORDER BY first_sequence DESC LIMIT 1) AS h ON true
    ),
    stored AS (
        INSERT INTO proto.tick_tids (project_id, first_sequence, row_ids, ids)
        SELECT project_id, head + 1, row_ids, ids FROM heads
        RETURNING cardinality(ids) AS n
    ),
    ticked AS (
        INSERT INTO proto.ticks (tick, snap)
        SELECT max(tick) + 1, pg_current_snapshot() FROM pending HAVING count(*) > 0
        RETURNING 1
    )
    SELECT coalesce((SELECT sum(n) FROM stored), 0)::bigint + 0 * (SELECT count(*) FROM ticked)
    INTO numbered;
    RETURN numbered;
END $$;
