-- lifecycle-outbox schema, version 14: a sequencer tick is one statement.
--
-- A tick used to be two round trips: the idle probe, then (when it found work) one message
-- with `BEGIN`, the lock statement, the numbering statement and `COMMIT`. The lock statement
-- was planned on every tick, and behind a transaction pooler so was the numbering statement
-- (a plan kept with `PREPARE` lives on one server session, and a pooler hands each
-- transaction any of them). A busy leader ticks hundreds of times a second, so each tick's
-- fixed cost weighs on every event, and the commit-to-tick wait on every event's latency is
-- a tick's length.
--
-- The whole tick is now this function, called as one statement in a transaction of its own:
-- the probe, the lock and the numbering. Each server session keeps the plans of its
-- statements at their first call, behind a pooler as well as on a direct connection, and a
-- tick is one round trip whether it finds work or not. An idle tick takes no lock and writes
-- nothing, so it commits without a transaction ID or a WAL flush, as the probe alone did.
--
-- Snapshots: the function is volatile, so each of its statements takes a snapshot of its own
-- (read committed): the numbering statement's is taken after the lock was granted, and so
-- sees every frontier that earlier ticks stored, as when it was a statement of its own.
--
-- Plans: the settings below hold for the call, so the kept plans cannot depend on the
-- statistics of the moment they were made: the work only through the frontier index (no
-- sequential or bitmap scan, which would read the table or sort it), no nested loops between
-- the batch's projects (quadratic in them), no JIT compilation (the settings' penalties make
-- any plan look expensive enough to compile, which costs a small tick half a second), and
-- one generic plan for every batch size (the batch is a parameter).
--
-- Returns one row per touched project (`locked` true), no row when there was no work, and
-- one row with `locked` false and no project when another sequencer held the lock.
CREATE FUNCTION {{schema}}.lifecycle_outbox_tick(lock_key bigint, batch_size bigint, channel text)
RETURNS TABLE (locked boolean, project_id text, head_sequence bigint, numbered bigint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_nestloop = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
BEGIN
    IF NOT {{schema}}.lifecycle_outbox_unsequenced_exists() THEN
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock(lock_key) THEN
        RETURN QUERY SELECT false, NULL::text, NULL::bigint, 0::bigint;
        RETURN;
    END IF;
    -- The work is what the stored frontier did not see (migration 0010): the rows of the
    -- transactions it saw in progress, and the range of the frontier index above where it
    -- stopped. Both are read in `(xid, id)` order and cut at one more than the batch, so a
    -- tick reads its batch and no more, whether a backlog waits or a snapshot hours old keeps
    -- every numbered row's old version: those versions sit below the frontier, out of the
    -- range.
    --
    -- The frontier it stores: when the tick took everything it found, its own snapshot (the
    -- statement's, in which the work was read), so the next tick starts past everything
    -- committed before it; when it found more than the batch, the previous base stays and
    -- the range resumes after the last row numbered (never below the base's `xmax`, so the
    -- range never reaches back into numbered history), with this tick's snapshot as `upto`,
    -- whose open transactions are probed next time (a row they commit may sort before that
    -- point). A tick that numbered nothing stores nothing. A role under row security sees
    -- only its projects' rows, so its tick cannot know it took everything: it numbers what it
    -- sees and leaves the frontier to a tick that sees all (the owner's, or an unbound
    -- role's), reading the range from there meanwhile. Each stored tick deletes the row
    -- 1,024 ticks behind it; only the newest is ever read.
    --
    -- The numbers continue each project's head, its highest number, read from the high end
    -- of the sequence index (or the retention floor when every event was pruned); a project
    -- met for the first time gets its row in `lifecycle_projects`.
    --
    -- The rows are updated by their physical address (`ctid`), found by the same statement:
    -- the event table has no index on `id` to find them by. Nothing else moves an unsequenced
    -- row, so the address cannot change in between. The addresses are also given as one
    -- array, so the planner fetches exactly those rows (a TID scan) whatever it expects of
    -- the batch; the new numbers are worked out apart (`assigned`, materialised) and joined
    -- to those rows by address alone, so no join between the batch's projects can turn
    -- quadratic in them (10,000 projects in one batch once took over 10 s).
    --
    -- One `NOTIFY` on `channel` per touched project, delivered at commit.
    --
    -- Rows of uncommitted writers are invisible here and are numbered by a later tick, after
    -- everything already numbered: a reader at `sequence > n` can never miss a lower number
    -- that appears later.
    RETURN QUERY
    WITH found AS MATERIALIZED (
        SELECT row_id, xid, id, project_id
        FROM ((SELECT row_id, xid, id, project_id
               FROM {{schema}}.lifecycle_outbox_unsequenced_open
               LIMIT batch_size + 1)
              UNION ALL
              (SELECT row_id, xid, id, project_id
               FROM {{schema}}.lifecycle_outbox_unsequenced_after
               LIMIT batch_size + 1)) AS work
        ORDER BY xid, id
        LIMIT batch_size + 1
    ),
    pending AS (
        SELECT row_id, xid, id, project_id,
               row_number() OVER (PARTITION BY project_id ORDER BY xid, id) AS rank
        FROM (SELECT * FROM found ORDER BY xid, id LIMIT batch_size) AS taken
    ),
    counts AS (
        SELECT project_id, count(*) AS numbered FROM pending GROUP BY project_id
    ),
    starts AS MATERIALIZED (
        SELECT c.project_id, c.numbered,
               GREATEST(COALESCE((SELECT o.sequence FROM {{schema}}.lifecycle_outbox AS o
                                  WHERE o.project_id = c.project_id AND o.sequence IS NOT NULL
                                  ORDER BY o.sequence DESC
                                  LIMIT 1), 0),
                        COALESCE((SELECT p.pruned_through
                                  FROM {{schema}}.lifecycle_projects AS p
                                  WHERE p.project_id = c.project_id), 0)) AS head
        FROM counts AS c
    ),
    registered AS (
        INSERT INTO {{schema}}.lifecycle_projects (project_id)
        SELECT project_id FROM counts
        ON CONFLICT (project_id) DO NOTHING
    ),
    assigned AS MATERIALIZED (
        SELECT pending.row_id, starts.head + pending.rank AS sequence
        FROM pending
        JOIN starts USING (project_id)
    ),
    renumbered AS (
        UPDATE {{schema}}.lifecycle_outbox AS o
        SET sequence = assigned.sequence,
            sequenced_at = now()
        FROM assigned
        WHERE o.ctid = ANY (ARRAY(SELECT row_id FROM pending))
          AND o.ctid = assigned.row_id
        RETURNING 1
    ),
    reached AS (
        SELECT pg_current_snapshot() AS now,
               (SELECT count(*) FROM found) <= batch_size AS complete,
               last.xid AS last_xid, last.id AS last_id,
               (SELECT base FROM {{schema}}.lifecycle_sequencer_frontier_latest) AS base
        FROM (SELECT xid, id FROM pending ORDER BY xid DESC, id DESC LIMIT 1) AS last
    ),
    advanced AS (
        INSERT INTO {{schema}}.lifecycle_sequencer_frontier (base, upto, after_xid, after_id)
        SELECT CASE WHEN complete THEN now ELSE base END,
               now,
               CASE WHEN complete THEN pg_snapshot_xmax(now)
                    WHEN last_xid >= pg_snapshot_xmax(base) THEN last_xid
                    ELSE pg_snapshot_xmax(base) END,
               CASE WHEN complete THEN 0
                    WHEN last_xid >= pg_snapshot_xmax(base) THEN last_id
                    ELSE 0 END
        FROM reached
        WHERE NOT row_security_active('{{schema}}.lifecycle_outbox')
        RETURNING tick
    ),
    trimmed AS (
        DELETE FROM {{schema}}.lifecycle_sequencer_frontier
        WHERE tick = (SELECT tick - 1024 FROM advanced)
    ),
    notified AS MATERIALIZED (
        SELECT starts.project_id, pg_notify(channel, starts.project_id) FROM starts
    )
    SELECT true, starts.project_id, starts.head + starts.numbered, starts.numbered
    FROM starts
    JOIN notified ON notified.project_id = starts.project_id
    ORDER BY starts.project_id;
END
$fn$;

-- The roles that ran the tick's statements may call it (the consumer role runs the embedded
-- sequencer; the operator runs `outbox sequence`).
DO $migration$
DECLARE
    s text := trim(both '"' from '{{schema}}');
BEGIN
    EXECUTE format('REVOKE ALL ON FUNCTION %I.lifecycle_outbox_tick(bigint, bigint, text) FROM PUBLIC', s);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.lifecycle_outbox_tick(bigint, bigint, text) TO %I, %I',
                   s, s || '_consumer', s || '_operator');
END
$migration$;
