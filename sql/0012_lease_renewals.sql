-- lifecycle-outbox schema, version 12: lease renewals that old snapshots cannot slow down.
--
-- Until now every heartbeat updated the consumer's row, every 10 seconds for every consumer.
-- Each update leaves a version that nothing can remove while any snapshot in the database is
-- older, and the row is read by every fenced write (its lock is the fence) and by every read
-- of the lease: under a snapshot held for 30 minutes, a position write read 167 buffers
-- instead of 51, growing by about 4 a minute, and 3,000 renewals took the fence from 3 to 37.
--
-- Now a renewal is appended, never updated, as cursor positions are (migration 0011): each
-- renewal inserts the new expiry and deletes the renewal it replaces, by its exact key, in one
-- statement, under the fence. The consumer row changes only with a claim, a takeover, a
-- release, a retirement or a reactivation. Its expiry and heartbeat become `claimed_until`
-- and `claimed_at`: what the lease was given when claimed (or carried over when
-- reactivated). The lease's expiry is that of the newest renewal when it belongs to the
-- current lease generation, otherwise `claimed_until`. A renewal of an earlier generation
-- (one that committed just before a takeover) is never read as the current lease's, and the
-- next renewal replaces it.
--
-- The columns are renamed, not kept, so that a process of an earlier build still running
-- when this migration lands fails its next claim or heartbeat loudly instead of judging a
-- lease by an expiry that renewals no longer move (it would take a lease that is being
-- renewed). Nothing is copied: a lease held across the upgrade keeps the expiry its row
-- records until its holder's next renewal.

ALTER TABLE {{schema}}.lifecycle_consumers RENAME COLUMN lease_expires_at TO claimed_until;
ALTER TABLE {{schema}}.lifecycle_consumers RENAME COLUMN heartbeat_at TO claimed_at;

CREATE TABLE {{schema}}.lifecycle_lease_renewals (
    project_id       text        NOT NULL,
    consumer_id      text        NOT NULL,
    renewal_id       bigint      GENERATED ALWAYS AS IDENTITY,
    lease_generation bigint      NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    heartbeat_at     timestamptz NOT NULL,
    PRIMARY KEY (project_id, consumer_id, renewal_id),
    FOREIGN KEY (project_id, consumer_id)
        REFERENCES {{schema}}.lifecycle_consumers (project_id, consumer_id)
);

-- The same columns in the same order: only where the lease's expiry and heartbeat come from
-- changes. A released lease (no owner) shows no expiry, as before.
CREATE OR REPLACE VIEW {{schema}}.lifecycle_consumer_cursors WITH (security_invoker = true) AS
SELECT c.project_id, c.consumer_id, p.last_acked_sequence, c.lease_owner, c.lease_generation,
       CASE WHEN c.lease_owner IS NOT NULL
            THEN COALESCE(r.lease_expires_at, c.claimed_until) END AS lease_expires_at,
       COALESCE(r.heartbeat_at, c.claimed_at) AS heartbeat_at,
       c.state, c.created_at, c.retired_at, c.retired_by, c.retired_reason, p.reconciled_at,
       p.last_acked_at, p.last_acked_event_id
FROM {{schema}}.lifecycle_consumers AS c
LEFT JOIN LATERAL (
    SELECT last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at
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

-- Row security and grants as for the positions: the renewals carry the project binding of the
-- consumers they belong to, and are switched on with them when the schema already runs under
-- row security.
DO $migration$
DECLARE
    s        text := trim(both '"' from '{{schema}}');
    consumer text := s || '_consumer';
    operator text := s || '_operator';
BEGIN
    EXECUTE format('CREATE POLICY project_binding ON %I.lifecycle_lease_renewals '
                   'TO %I, %I, %I '
                   'USING (%I.project_allowed(project_id, current_user)) '
                   'WITH CHECK (%I.project_allowed(project_id, current_user))',
                   s, s || '_writer', consumer, operator, s, s);
    IF (SELECT c.relrowsecurity FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = s AND c.relname = 'lifecycle_consumers') THEN
        EXECUTE format('ALTER TABLE %I.lifecycle_lease_renewals ENABLE ROW LEVEL SECURITY', s);
    END IF;

    -- The consumer role appends and replaces its renewals; both roles read them (the view
    -- reads them as its caller).
    EXECUTE format('GRANT SELECT, INSERT (project_id, consumer_id, lease_generation, '
                   'lease_expires_at, heartbeat_at), DELETE '
                   'ON %I.lifecycle_lease_renewals TO %I', s, consumer);
    EXECUTE format('GRANT SELECT ON %I.lifecycle_lease_renewals TO %I', s, operator);
END
$migration$;
