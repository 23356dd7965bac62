//! The statements of `outbox verify`, with `{{schema}}` for the outbox schema. All are sent
//! unnamed, so they pass a transaction pooler.

/// One probe event through the SQL writer, the face most services write through.
pub const WRITE_PROBE: &str =
    "SELECT {{schema}}.write_task_deleted($1, $2, $3, $4, NULL) AS event_id";

/// What the probe project holds that a probe did not write, and how many probe events it holds.
pub const PROJECT_CONTENTS: &str = "\
SELECT count(*) FILTER (WHERE writer_process_id <> $2 OR task_id NOT LIKE 'verify-%') AS foreign,
       min(event_id) FILTER (WHERE writer_process_id <> $2 OR task_id NOT LIKE 'verify-%') AS example,
       count(*) AS events
FROM {{schema}}.lifecycle_outbox WHERE project_id = $1";

/// The probe project's consumers: a probe's (`verify-...`) or another's.
pub const PROJECT_CONSUMERS: &str = "\
SELECT consumer_id, state::text AS state,
       lease_owner IS NOT NULL AND lease_expires_at > now() AS leased
FROM {{schema}}.lifecycle_consumer_cursors WHERE project_id = $1 ORDER BY consumer_id";

/// The project's head (0 before its first numbered event) and its unsequenced rows.
pub const PROGRESS: &str = "\
SELECT coalesce((SELECT head_sequence FROM {{schema}}.lifecycle_project_heads
                 WHERE project_id = $1), 0) AS head,
       (SELECT count(*) FROM (SELECT project_id FROM {{schema}}.lifecycle_outbox_unsequenced
                              OFFSET 0) AS work
        WHERE project_id = $1) AS unsequenced";

/// Whether the probe consumer's lease is held and whether its retirement was audited.
pub const PROBE_CONSUMER_STATE: &str = "\
SELECT c.state::text AS state,
       c.lease_owner IS NOT NULL AND c.lease_expires_at > now() AS leased,
       EXISTS (SELECT 1 FROM {{schema}}.lifecycle_audit a
               WHERE a.project_id = c.project_id AND a.consumer_id = c.consumer_id
                 AND a.kind = 'lifecycle-observation:consumer-retired') AS retirement_audited
FROM {{schema}}.lifecycle_consumer_cursors c
WHERE c.project_id = $1 AND c.consumer_id = $2";

/// Who this session is and what it runs on. `pg_stat_ssl` describes the server's side of this
/// backend's connection (behind a pooler: the pooler's connection to the server).
pub const SESSION: &str = "\
SELECT current_user::text AS role, current_setting('server_version') AS server_version,
       coalesce((SELECT CASE WHEN ssl THEN 'on (' || version || ')' ELSE 'off' END
                 FROM pg_stat_ssl WHERE pid = pg_backend_pid()), 'unknown') AS tls";

/// The backend serving this transaction (several per connection mean a transaction pooler).
pub const BACKEND: &str = "SELECT pg_backend_pid() AS pid";

/// A notification on the probe's own channel.
pub const NOTIFY: &str = "SELECT pg_notify($1, 'probe')";

/// The IDs of the transactions running now (other than the caller's), as text.
pub const RUNNING_TRANSACTIONS: &str = "\
SELECT coalesce(array_agg(x::text), '{}') AS running
FROM unnest(pg_snapshot_xip(pg_current_snapshot())) AS x";

/// How many of the transactions `$1` (IDs as text) are still in progress.
pub const STILL_RUNNING: &str = "\
SELECT count(*) AS running FROM unnest($1::text[]) AS x
WHERE pg_xact_status(x::xid8) = 'in progress'";
