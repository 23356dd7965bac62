-- lifecycle-outbox schema, version 13: the sequencer's idle probe keeps its plan.
--
-- Every tick begins with a probe: is there a committed row the last stored frontier did not
-- see? Sent as a statement, the probe is planned on every call, through the frontier views,
-- and the planning was most of its cost: 340 of 394 µs a call under load, close to a third of
-- the sequencer's server time, and nearly all of an idle leader's. Inside a PL/pgSQL
-- function the statement's plan is kept by each server session at its first call and made
-- again only when something it depends on changes (an ANALYZE, a schema change), behind a
-- transaction pooler as well as on a direct connection.
--
-- The function turns off sequential and bitmap scans (and JIT) for its call, as a tick does
-- for its own statements, so the plan it keeps cannot depend on the statistics of the moment
-- it was made: each part is read through the frontier index in `(xid, id)` order, cut at its
-- first row, whatever the table's size.
--
-- Invoker rights, as everywhere: the function reads the views as its caller, so row security
-- and grants apply exactly as to the statement it replaces.
CREATE FUNCTION {{schema}}.lifecycle_outbox_unsequenced_exists()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $fn$
BEGIN
    RETURN EXISTS (SELECT FROM (SELECT id FROM {{schema}}.lifecycle_outbox_unsequenced_open
                                LIMIT 1) AS first)
        OR EXISTS (SELECT FROM (SELECT id FROM {{schema}}.lifecycle_outbox_unsequenced_after
                                LIMIT 1) AS first);
END
$fn$;

-- The roles that read the frontier views may call it (the consumer role runs the embedded
-- sequencer; the operator reads the same views).
DO $migration$
DECLARE
    s text := trim(both '"' from '{{schema}}');
BEGIN
    EXECUTE format('REVOKE ALL ON FUNCTION %I.lifecycle_outbox_unsequenced_exists() FROM PUBLIC', s);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.lifecycle_outbox_unsequenced_exists() TO %I, %I',
                   s, s || '_consumer', s || '_operator');
END
$migration$;
