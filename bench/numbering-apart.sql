-- A prototype for bench/peers.sh (variant rust+apart): numbering that leaves the event row
-- alone and stores the numbers apart, one narrow row per event holding the event's physical
-- address (`ctid`) and arrival ID, in a schema migrated as usual (`{{schema}}` is replaced by
-- its name). Everything else is today's design: the writer's statement, the frontier, the
-- elected sequencer (`outbox sequence --every`) and its one-statement tick. The tick below is
-- migration 14's with two changes: a project's head is the last number stored apart, and the
-- numbers are inserted there instead of written into the event rows.
--
-- What it measures, beside the full path as built (rust+seq): the WAL and CPU that numbering
-- costs when the event row is never rewritten (no second version of the row, no new entries
-- in its key and sequence indexes; one heap row and one b-tree entry per event instead), and
-- what a consumer's read of a batch costs when it must join the numbers to the events by
-- address (one TID lookup per event) instead of reading the sequence index of the event
-- table.
--
-- What it is not: a design ready to build. An event row never updated keeps its `sequence`
-- NULL, so the frontier index keeps every row and the frontier views cannot tell numbered
-- rows from new ones; the frontier alone decides, which is exact only when every tick takes
-- all it finds (the batch here is 10,000, never reached in these runs; a tick that stops at
-- its batch, or a tick under row security, would number rows twice). A table rewrite
-- (VACUUM FULL, CLUSTER, a restore) moves every row, so every stored address would be wrong:
-- a reader must check each row's arrival ID and a repair must find the rows again. The script
-- checks after every run that each event was numbered exactly once, densely per project.

CREATE TABLE {{schema}}.lifecycle_event_numbers (
    project_id   text        NOT NULL,
    sequence     bigint      NOT NULL,
    row_id       tid         NOT NULL,
    arrival      bigint      NOT NULL,
    sequenced_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, sequence)
);

CREATE OR REPLACE FUNCTION {{schema}}.lifecycle_outbox_tick(lock_key bigint, batch_size bigint, channel text)
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
    -- Migration 14's numbering statement, with the two changes above marked "apart".
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
               GREATEST(COALESCE((SELECT n.sequence FROM {{schema}}.lifecycle_event_numbers AS n  -- apart
                                  WHERE n.project_id = c.project_id
                                  ORDER BY n.sequence DESC
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
    renumbered AS (  -- apart
        INSERT INTO {{schema}}.lifecycle_event_numbers (project_id, sequence, row_id, arrival)
        SELECT pending.project_id, starts.head + pending.rank, pending.row_id, pending.id
        FROM pending
        JOIN starts USING (project_id)
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
