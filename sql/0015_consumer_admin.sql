-- lifecycle-outbox schema, version 15: consumers an operator reactivates and deletes.
--
-- `outbox consumers reactivate` makes a retired consumer active again from the operator's
-- side, as `consume --reactivate` does from the runtime's: the state changes, the lease
-- generation is bumped (a runtime that held the lease before retirement never finds its fence
-- valid again) and the cursor becomes missing, so the consumer reconciles at its next start.
-- `outbox consumers delete` removes a retired consumer's rows (its positions, lease renewals
-- and delivery rows with it), so probe runs and mistyped IDs do not pile up; it is audited
-- under the new kind `lifecycle-observation:consumer-deleted`. An active consumer is never
-- deleted: it holds retention and may be running.
ALTER TABLE {{schema}}.lifecycle_audit
    DROP CONSTRAINT lifecycle_audit_kind_check,
    ADD CONSTRAINT lifecycle_audit_kind_check CHECK (kind IN (
        'lifecycle-observation:consumer-poisoned',
        'lifecycle-observation:consumer-replayed',
        'lifecycle-observation:dead-letter-replay-requested',
        'lifecycle-observation:dead-letter-resolved',
        'lifecycle-observation:consumer-retired',
        'lifecycle-observation:consumer-reactivated',
        'lifecycle-observation:consumer-deleted',
        'lifecycle-observation:reconciled',
        'lifecycle-observation:pruned',
        'lifecycle-observation:history-diverged'));

-- The operator's grants for both (column by column where the runtime's columns are
-- concerned): reactivation bumps the lease generation and keeps an unexpired lease's expiry,
-- and replaces the current position by a missing one; deletion removes the consumer's rows.
-- The operator still never moves a cursor: it may insert a position only without a sequence
-- or an event (a missing cursor), carrying when the consumer last acknowledged and reconciled.
DO $migration$
DECLARE
    s        text := trim(both '"' from '{{schema}}');
    operator text := s || '_operator';
BEGIN
    EXECUTE format('GRANT UPDATE (lease_generation, claimed_until, claimed_at), DELETE '
                   'ON %I.lifecycle_consumers TO %I', s, operator);
    EXECUTE format('GRANT INSERT (project_id, consumer_id, last_acked_at, reconciled_at), '
                   'DELETE ON %I.lifecycle_consumer_positions TO %I', s, operator);
    EXECUTE format('GRANT DELETE ON %I.lifecycle_lease_renewals TO %I', s, operator);
END
$migration$;
