-- lifecycle-outbox schema, version 5: the grants of the least-privilege roles (version 2) on
-- what versions 3 and 4 added. The roles' grants are column by column, so a new column or
-- table is nobody's until granted here.
--
-- Migrations apply by version, each once, so this runs after version 2 whatever order the
-- others were applied in (a schema migrated to 1, 3 and 4 before the roles existed gets 2
-- and then 5).
DO $migration$
DECLARE
    s        text := trim(both '"' from '{{schema}}');
    consumer text := s || '_consumer';
    operator text := s || '_operator';
BEGIN
    -- Version 3: the consumer stamps each acknowledgement; the operator names who asked for a
    -- replay.
    EXECUTE format('GRANT UPDATE (last_acked_at) ON %I.lifecycle_consumer_cursors TO %I',
                   s, consumer);
    EXECUTE format('GRANT UPDATE (replay_requested_by) ON %I.lifecycle_deliveries TO %I',
                   s, operator);

    -- Version 4: the embedded sequencer (the consumer's, or `outbox sequence --every` run as
    -- the consumer role) competes for the sequencer lease; the operator may look at it.
    EXECUTE format('GRANT SELECT, UPDATE (owner, generation, expires_at, renewed_at) '
                   'ON %I.lifecycle_sequencer_lease TO %I', s, consumer);
    EXECUTE format('GRANT SELECT ON %I.lifecycle_sequencer_lease TO %I', s, operator);
END
$migration$;
