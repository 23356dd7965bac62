-- lifecycle-outbox schema, version 10: numbering that old snapshots cannot slow down.
--
-- Until now the sequencer found its work through a partial index of unsequenced rows and kept
-- every project's head in a row it updated on every tick. Both leave a dead version behind
-- with every tick, which nothing can remove while any snapshot in the database is older
-- (pg_dump, a long report, an idle transaction, a replica's hot_standby_feedback), and every
-- tick read all of them: the cost grew with the history written since the oldest snapshot.
--
-- Now a tick finds its work from a frontier, as PgQ finds its batches: each event row carries
-- its writer's transaction ID, each tick that numbers something stores the snapshot it
-- numbered in, and the next tick's work is what that snapshot did not see, read from a range
-- of an index on the transaction ID that starts past everything already numbered, plus one
-- probe per transaction that was still open. A project's head is its highest number, read
-- from the high end of the sequence index, which a tick only ever adds to.

-- The writer's (top-level) transaction ID. Added without a default first: a volatile default
-- would rewrite the table and give every existing row this migration's ID.
ALTER TABLE {{schema}}.lifecycle_outbox ADD COLUMN xid xid8;
ALTER TABLE {{schema}}.lifecycle_outbox ALTER COLUMN xid SET DEFAULT pg_current_xact_id();

-- Rows committed before this migration took its lock and still unnumbered are numbered here,
-- the way earlier versions numbered them (arrival order). The ALTER TABLE above holds the
-- table's exclusive lock until this migration commits, so no sequencer ticks meanwhile and no
-- writer commits a row without a transaction ID.
WITH pending AS (
    SELECT ctid AS row_id, project_id,
           row_number() OVER (PARTITION BY project_id ORDER BY id) AS rank
    FROM {{schema}}.lifecycle_outbox
    WHERE sequence IS NULL
),
counts AS (
    SELECT project_id, count(*) AS numbered FROM pending GROUP BY project_id
),
heads AS (
    INSERT INTO {{schema}}.lifecycle_project_heads AS h (project_id, head_sequence)
    SELECT project_id, numbered FROM counts
    ON CONFLICT (project_id)
        DO UPDATE SET head_sequence = h.head_sequence + EXCLUDED.head_sequence
    RETURNING h.project_id, h.head_sequence
)
UPDATE {{schema}}.lifecycle_outbox AS o
SET sequence = heads.head_sequence - counts.numbered + pending.rank,
    sequenced_at = now()
FROM pending
JOIN counts USING (project_id)
JOIN heads USING (project_id)
WHERE o.ctid = pending.row_id;

-- The work list, replaced: unsequenced rows by transaction ID, then arrival. A tick reads a
-- range of it above the frontier, so the entries that numbered rows leave behind (below the
-- frontier) are never read again, however long a snapshot keeps them.
DROP INDEX {{schema}}.lifecycle_outbox_unsequenced_idx;
CREATE INDEX lifecycle_outbox_frontier_idx
    ON {{schema}}.lifecycle_outbox (xid, id) WHERE sequence IS NULL;

-- One row per tick that numbered something, insert-only; only the newest is read (from the
-- high end of the key), and the tick deletes the row 1,024 ticks behind it. `base` is the
-- snapshot of the last tick that numbered everything it found; `upto` the snapshot of the
-- last tick; `(after_xid, after_id)` where the range of work above `base` resumes (a tick
-- that found more than its batch numbers the first part in `(xid, id)` order).
CREATE TABLE {{schema}}.lifecycle_sequencer_frontier (
    tick      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    base      pg_snapshot NOT NULL,
    upto      pg_snapshot NOT NULL,
    after_xid xid8        NOT NULL,
    after_id  bigint      NOT NULL
);

-- The newest frontier; before the first tick, one that sees nothing (every row is work). A
-- frontier ahead of this cluster's transaction IDs (restored from a logical dump of another
-- cluster, whose IDs do not mean the same) is ignored the same way, so a restore never makes
-- the new cluster's writers look numbered already.
CREATE VIEW {{schema}}.lifecycle_sequencer_frontier_latest WITH (security_invoker = true) AS
SELECT base, upto, after_xid, after_id
FROM ((SELECT 1 AS rank, base, upto, after_xid, after_id
       FROM (SELECT base, upto, after_xid, after_id
             FROM {{schema}}.lifecycle_sequencer_frontier
             ORDER BY tick DESC
             LIMIT 1) AS newest
       WHERE pg_snapshot_xmax(upto) <= pg_snapshot_xmax(pg_current_snapshot()))
      UNION ALL
      SELECT 2, '1:1:'::pg_snapshot, '1:1:'::pg_snapshot, '1'::xid8, 0) AS f
ORDER BY rank
LIMIT 1;

-- The committed events waiting for a number, as the frontier finds them, in two parts: the
-- rows of every transaction either stored snapshot saw in progress (one index probe each), and
-- the range above `(after_xid, after_id)` without those transactions (so no row is listed
-- twice). Each part is in `(xid, id)` order, which only the index yields without a sort: the
-- tick takes the first batch of each without reading a backlog whole, and no reader is
-- planned as a scan of the table, however common statistics taken during a backlog make
-- unsequenced rows look. Every reader of the backlog (the tick, the
-- idle probe, caught-up checks, gauges, status) asks these views.
CREATE VIEW {{schema}}.lifecycle_outbox_unsequenced_open WITH (security_invoker = true) AS
WITH f AS MATERIALIZED (SELECT * FROM {{schema}}.lifecycle_sequencer_frontier_latest)
SELECT o.ctid AS row_id, o.xid, o.id, o.project_id, o.occurred_at
FROM {{schema}}.lifecycle_outbox AS o
WHERE o.sequence IS NULL
  AND o.xid = ANY (ARRAY(SELECT pg_snapshot_xip(base) FROM f
                         UNION SELECT pg_snapshot_xip(upto) FROM f))
ORDER BY o.xid, o.id;

CREATE VIEW {{schema}}.lifecycle_outbox_unsequenced_after WITH (security_invoker = true) AS
WITH f AS MATERIALIZED (SELECT * FROM {{schema}}.lifecycle_sequencer_frontier_latest)
SELECT o.ctid AS row_id, o.xid, o.id, o.project_id, o.occurred_at
FROM {{schema}}.lifecycle_outbox AS o
WHERE o.sequence IS NULL
  AND (o.xid, o.id) > ((SELECT after_xid FROM f), (SELECT after_id FROM f))
  AND o.xid <> ALL (ARRAY(SELECT pg_snapshot_xip(upto) FROM f))
ORDER BY o.xid, o.id;

CREATE VIEW {{schema}}.lifecycle_outbox_unsequenced WITH (security_invoker = true) AS
SELECT * FROM {{schema}}.lifecycle_outbox_unsequenced_open
UNION ALL
SELECT * FROM {{schema}}.lifecycle_outbox_unsequenced_after;

-- Heads are no longer stored: the per-project row keeps the retention floor (and makes the
-- project known), and `lifecycle_project_heads` becomes a view that reads each head from the
-- sequence index, so every reader keeps its query.
ALTER TABLE {{schema}}.lifecycle_project_heads RENAME TO lifecycle_projects;
ALTER TABLE {{schema}}.lifecycle_projects DROP COLUMN head_sequence;
ALTER INDEX {{schema}}.lifecycle_project_heads_pkey RENAME TO lifecycle_projects_pkey;

CREATE VIEW {{schema}}.lifecycle_project_heads WITH (security_invoker = true) AS
SELECT p.project_id,
       GREATEST(p.pruned_through,
                COALESCE((SELECT o.sequence FROM {{schema}}.lifecycle_outbox AS o
                          WHERE o.project_id = p.project_id AND o.sequence IS NOT NULL
                          ORDER BY o.sequence DESC
                          LIMIT 1), 0)) AS head_sequence,
       p.pruned_through
FROM {{schema}}.lifecycle_projects AS p;

-- Grants: the consumer role runs the embedded sequencer (it registers projects, stores
-- frontiers and trims them); the operator reads everything and moves the floor (its grant on
-- the renamed table stays).
DO $migration$
DECLARE
    s        text := trim(both '"' from '{{schema}}');
    consumer text := s || '_consumer';
    operator text := s || '_operator';
BEGIN
    EXECUTE format('GRANT INSERT (project_id) ON %I.lifecycle_projects TO %I', s, consumer);
    EXECUTE format('GRANT SELECT, INSERT (base, upto, after_xid, after_id), DELETE '
                   'ON %I.lifecycle_sequencer_frontier TO %I', s, consumer);
    EXECUTE format('GRANT SELECT ON %I.lifecycle_sequencer_frontier, '
                   '%I.lifecycle_sequencer_frontier_latest, %I.lifecycle_outbox_unsequenced_open, '
                   '%I.lifecycle_outbox_unsequenced_after, %I.lifecycle_outbox_unsequenced, '
                   '%I.lifecycle_project_heads TO %I, %I',
                   s, s, s, s, s, s, consumer, operator);
END
$migration$;
