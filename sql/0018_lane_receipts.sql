-- lifecycle-outbox schema, version 18: a transactional handler with lanes, and how far lanes
-- have handled beyond the cursor.
--
-- With lanes (`--lanes N`), events above the cursor are handled before the cursor reaches
-- them: the cursor moves only over a prefix of events all handled or parked. A transactional
-- handler's database effects must still happen exactly once, so each event it handles above
-- the cursor leaves a receipt here, inserted in the handler's own transaction: the effect and
-- the receipt commit together or not at all, and a run that starts over from the cursor skips
-- the events it finds a receipt for. The acknowledgement that moves the cursor deletes the
-- receipts it passes, so a consumer never holds more than `--max-ahead` of them.
CREATE TABLE {{schema}}.lifecycle_lane_receipts (
    project_id  text   NOT NULL,
    consumer_id text   NOT NULL,
    sequence    bigint NOT NULL,
    PRIMARY KEY (project_id, consumer_id, sequence),
    FOREIGN KEY (project_id, consumer_id)
        REFERENCES {{schema}}.lifecycle_consumers (project_id, consumer_id)
);

-- The highest sequence lanes had handled or parked when they wrote this position (NULL for
-- every position written otherwise, where nothing is handled beyond the cursor): `status`
-- shows the gap between it and the cursor.
ALTER TABLE {{schema}}.lifecycle_consumer_positions ADD COLUMN handled_through bigint;

-- The view of migration 0012, with `handled_through` appended.
CREATE OR REPLACE VIEW {{schema}}.lifecycle_consumer_cursors WITH (security_invoker = true) AS
SELECT c.project_id, c.consumer_id, p.last_acked_sequence, c.lease_owner, c.lease_generation,
       CASE WHEN c.lease_owner IS NOT NULL
            THEN COALESCE(r.lease_expires_at, c.claimed_until) END AS lease_expires_at,
       COALESCE(r.heartbeat_at, c.claimed_at) AS heartbeat_at,
       c.state, c.created_at, c.retired_at, c.retired_by, c.retired_reason, p.reconciled_at,
       p.last_acked_at, p.last_acked_event_id, p.handled_through
FROM {{schema}}.lifecycle_consumers AS c
LEFT JOIN LATERAL (
    SELECT last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at,
           handled_through
    FROM {{schema}}.lifecycle_consumer_positions AS p
    WHERE p.project_id = c.project_id AND p.consumer_id = c.consumer_id
    ORDER BY p.position_id DESC
    LIMIT 1) AS p ON true
LEFT JOIN LATERAL (
    SELECT newest.lease_expires_at, newest.heartbeat_at
    FROM (SELECT lease_generation, lease_expires_at, heartbeat_at
          FROM {{schema}}.lifecycle_lease_renewals AS r
          WHERE r.project_id = c.project_id AND r.consumer_id = c.consumer_id
          ORDER BY r.renewal_id DESC
          LIMIT 1) AS newest
    WHERE newest.lease_generation = c.lease_generation) AS r ON true;

-- Row security and grants as for the positions: the receipts carry the project binding of the
-- consumers they belong to, and are switched on with them when the schema already runs under
-- row security. The consumer role inserts and deletes its receipts and writes the new column;
-- the operator reads them and deletes them with a retired consumer.
DO $migration$
DECLARE
    s        text := trim(both '"' from '{{schema}}');
    consumer text := s || '_consumer';
    operator text := s || '_operator';
BEGIN
    EXECUTE format('CREATE POLICY project_binding ON %I.lifecycle_lane_receipts '
                   'TO %I, %I, %I '
                   'USING (%I.project_allowed(project_id, current_user)) '
                   'WITH CHECK (%I.project_allowed(project_id, current_user))',
                   s, s || '_writer', consumer, operator, s, s);
    IF (SELECT c.relrowsecurity FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = s AND c.relname = 'lifecycle_consumers') THEN
        EXECUTE format('ALTER TABLE %I.lifecycle_lane_receipts ENABLE ROW LEVEL SECURITY', s);
    END IF;

    EXECUTE format('GRANT SELECT, INSERT (project_id, consumer_id, sequence), DELETE '
                   'ON %I.lifecycle_lane_receipts TO %I', s, consumer);
    EXECUTE format('GRANT SELECT, DELETE ON %I.lifecycle_lane_receipts TO %I', s, operator);
    EXECUTE format('GRANT INSERT (handled_through) ON %I.lifecycle_consumer_positions TO %I',
                   s, consumer);
END
$migration$;
