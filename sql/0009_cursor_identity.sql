-- lifecycle-outbox schema, version 9: the cursor records which event it stands on.
--
-- After a failover to a standby that lacked the tail, or a restore from backup, a sequence
-- number can name a different event, or none at all, in the history the database now has. A
-- consumer that kept its position from the lost history would otherwise wait for a number the
-- new history already used and skip what lies between. The event ID of the last acknowledged
-- event (NULL while the cursor is missing, at 0, or moved to a head with no event) lets a
-- consumer check that the event at its position is still the one it acknowledged, and the
-- audit kind `lifecycle-observation:history-diverged` records when it is not.
ALTER TABLE {{schema}}.lifecycle_consumer_cursors
    ADD COLUMN last_acked_event_id text;

ALTER TABLE {{schema}}.lifecycle_audit
    DROP CONSTRAINT lifecycle_audit_kind_check,
    ADD CONSTRAINT lifecycle_audit_kind_check CHECK (kind IN (
        'lifecycle-observation:consumer-poisoned',
        'lifecycle-observation:consumer-replayed',
        'lifecycle-observation:dead-letter-replay-requested',
        'lifecycle-observation:dead-letter-resolved',
        'lifecycle-observation:consumer-retired',
        'lifecycle-observation:consumer-reactivated',
        'lifecycle-observation:reconciled',
        'lifecycle-observation:pruned',
        'lifecycle-observation:history-diverged'));

-- The consumer role writes the identity with every cursor move (its grants are column by
-- column, so a new column is nobody's until granted).
DO $migration$
DECLARE
    s        text := trim(both '"' from '{{schema}}');
    consumer text := s || '_consumer';
BEGIN
    EXECUTE format('GRANT UPDATE (last_acked_event_id) ON %I.lifecycle_consumer_cursors '
                   'TO %I', s, consumer);
END
$migration$;
