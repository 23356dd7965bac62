//! Every SQL statement of `outbox-core`, as templates over `{{schema}}`.

/// Creates the schema and the migrations table (run under the migration lock).
pub const MIGRATIONS_TABLE: &str = "
CREATE SCHEMA IF NOT EXISTS {{schema}};
CREATE TABLE IF NOT EXISTS {{schema}}.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);";

/// Applied migrations in order.
pub const APPLIED_MIGRATIONS: &str =
    "SELECT version, name, checksum FROM {{schema}}.schema_migrations ORDER BY version";

/// Whether the table named by `$1` (schema-qualified, quoted as needed) exists; read without
/// a lock, so a never-migrated schema can be told apart from one that is behind.
pub const TABLE_EXISTS: &str = "SELECT to_regclass($1) IS NOT NULL AS present";

/// Records one applied migration.
pub const RECORD_MIGRATION: &str =
    "INSERT INTO {{schema}}.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)";

/// Serialises migrators (transaction-scoped).
pub const LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

/// Elects one sequencer at a time (transaction-scoped); others skip their tick. The result
/// is also kept for the rest of the transaction in `outbox.sequencer_locked`, which the
/// numbering statement checks: the tick is one message (see
/// [`Sequencer::tick`](crate::Sequencer::tick)), so the numbering statement runs whether or
/// not the lock was granted, and must then do nothing. Also bounds how long the tick's
/// transaction may sit idle (`{{idle_timeout_ms}}`, milliseconds): its statements arrive
/// together, so a tick never waits for its client between them, and the bound is a backstop
/// for a transaction left open all the same (a failed tick's, until its client ends it).
///
/// And fixes the numbering statement's plan whatever the statistics and the table's size,
/// for the rest of the tick: the work only through the frontier index (no sequential or
/// bitmap scan, which would read the table or sort it), no nested loops between the
/// batch's projects (quadratic in them), and no JIT compilation (the settings' penalties make
/// any plan look expensive enough to compile, which costs a small tick half a second). A plan
/// kept on the session (see
/// [`Sequencer::with_session_plan`](crate::Sequencer::with_session_plan)) is made under the
/// same settings, so it cannot be one that was only cheap while the table was small.
///
/// The lock key and the timeout are written into the text: the tick is sent as one
/// simple-protocol message, which takes no parameters.
pub const TRY_LOCK: &str = "
WITH attempt AS MATERIALIZED (SELECT pg_try_advisory_xact_lock({{lock_key}}) AS locked)
SELECT locked,
       set_config('outbox.sequencer_locked', locked::text, true),
       set_config('idle_in_transaction_session_timeout', '{{idle_timeout_ms}}', true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('enable_nestloop', 'off', true),
       set_config('jit', 'off', true)
FROM attempt";

/// Takes the sequencer lease when it is free or expired (a new generation), or renews it for
/// its holder (`$1` owner, `$2` generation) while it has not expired; `$3`: lease seconds.
/// Returns the generation held afterwards, or no row when another process holds the lease.
/// A follower's look at the row is this same statement: it matches nothing, writes nothing.
pub const CLAIM_SEQUENCER_LEASE: &str = "
UPDATE {{schema}}.lifecycle_sequencer_lease AS l
SET owner = $1,
    generation = CASE WHEN l.owner = $1 AND l.generation = $2 AND l.expires_at > now()
                      THEN l.generation ELSE l.generation + 1 END,
    expires_at = now() + make_interval(secs => $3),
    renewed_at = now()
WHERE l.singleton
  AND (l.owner IS NULL OR l.expires_at <= now() OR (l.owner = $1 AND l.generation = $2))
RETURNING l.generation";

/// Gives the sequencer lease up (`$1` owner, `$2` generation), so a successor need not wait.
pub const RELEASE_SEQUENCER_LEASE: &str = "
UPDATE {{schema}}.lifecycle_sequencer_lease
SET owner = NULL, expires_at = NULL
WHERE singleton AND owner = $1 AND generation = $2";

/// The Rust writer's single statement. `RETURNING` tells a new row from a repeated delete.
pub const WRITE_TASK_DELETED: &str = "
INSERT INTO {{schema}}.lifecycle_outbox
    (project_id, event_type, event_id, task_id, deleted_at, writer_process_id,
     payload_version, payload)
VALUES ($1, 'task:deleted', $2, $3, $4, $5, $6, $7)
ON CONFLICT ON CONSTRAINT lifecycle_outbox_event_key DO NOTHING
RETURNING id";

/// Whether any committed event waits for a number: the first row of each part of the
/// frontier's work (see migration 0010), so an idle tick costs one round trip, no
/// transaction, and a handful of index pages however old the oldest snapshot is.
///
/// The reads are inside a PL/pgSQL function (migration 0013), so each server session plans
/// them once and keeps the plan: sent as a statement they were planned on every call, which
/// was most of the probe's cost (340 of 394 µs under load). The function reads each part in
/// `(xid, id)` order with sequential and bitmap scans off, so the kept plan is the frontier
/// index cut at its first row whatever the statistics: statistics taken during a backlog
/// make `sequence IS NULL` look common, and a bare `EXISTS` would then be answered with a
/// sequential scan that reads the whole table when there is no work.
pub const PENDING_EXISTS: &str =
    "SELECT {{schema}}.lifecycle_outbox_unsequenced_exists() AS pending";

/// [`PENDING_EXISTS`], and whether this session already holds the prepared numbering
/// statement named `$1` (a pooled connection may have been reset in between).
pub const PENDING_EXISTS_PREPARED: &str = "
SELECT {{schema}}.lifecycle_outbox_unsequenced_exists() AS pending,
       EXISTS (SELECT FROM pg_prepared_statements WHERE name = $1) AS prepared";

/// Numbers up to `{{batch}}` committed, unsequenced rows and stores the frontier it reached;
/// returns each touched project's new head and how many it numbered. The batch size is
/// written into the text, so the statement has no parameters and a plan kept on the session
/// is used as it is, never re-planned for a parameter value.
///
/// **The work** is what the stored frontier did not see (migration 0010): the rows of the
/// transactions it saw in progress, and the range of the frontier index above where it
/// stopped. Both are read in `(xid, id)` order and cut at one more than the batch, so a tick
/// reads its batch and no more, whether a backlog waits or a snapshot hours old keeps every
/// numbered row's old version: those versions sit below the frontier, out of the range.
///
/// **The frontier** it stores: when the tick took everything it found, its own snapshot
/// (`pg_current_snapshot()` is the statement's, in which the work was read), so the next tick
/// starts past everything committed before it; when it found more than the batch, the
/// previous base stays and the range resumes after the last row numbered (never below the
/// base's `xmax`, so the range never reaches back into numbered history), with this tick's
/// snapshot as `upto`, whose open transactions are probed next time (a row they commit may
/// sort before that point). A tick that numbered nothing stores nothing. A role under row
/// security sees only its projects' rows, so its tick cannot know it took everything: it
/// numbers what it sees and leaves the frontier to a tick that sees all (the owner's, or an
/// unbound role's), reading the range from there meanwhile. Each stored tick deletes the row
/// 1,024 ticks behind it; only the newest is ever read.
///
/// **The numbers** continue each project's head, its highest number, read from the high end
/// of the sequence index (or the retention floor when every event was pruned); a project met
/// for the first time gets its row in `lifecycle_projects`.
///
/// The rows are updated by their physical address (`ctid`), found by the same statement: the
/// event table has no index on `id` to find them by (each index costs every event twice).
/// Nothing else moves an unsequenced row, so the address cannot change in between. The
/// addresses are also given as one array, so the planner fetches exactly those rows (a TID
/// scan) even when stale statistics make it expect a full batch, in which case a join on the
/// address alone is planned as a hash join over the whole table. The new numbers are worked
/// out apart (`assigned`, materialised) and joined to those rows by address alone: the TID
/// scan is estimated at a handful of rows, and with the per-project joins in the same join
/// tree the planner would pick nested loops over the touched projects, quadratic in them
/// (10,000 projects in one batch took over 10 s).
///
/// **The wake-ups**: one `NOTIFY` on `{{channel}}` (a quoted literal) per touched project,
/// delivered at commit.
///
/// Runs under the sequencer lock, in a statement started after the lock was granted, so its
/// snapshot includes every earlier tick and sees every frontier they stored; when this
/// transaction did not get the lock ([`TRY_LOCK`] says so in `outbox.sequencer_locked`), the
/// work it finds is empty and it changes nothing. Rows of
/// uncommitted writers are invisible here and are numbered by a later tick, after everything
/// already numbered: a reader at `sequence > n` can never miss a lower number that appears
/// later.
pub const NUMBER_PENDING: &str = "
WITH found AS MATERIALIZED (
    SELECT row_id, xid, id, project_id
    FROM ((SELECT row_id, xid, id, project_id
           FROM {{schema}}.lifecycle_outbox_unsequenced_open
           LIMIT {{batch}} + 1)
          UNION ALL
          (SELECT row_id, xid, id, project_id
           FROM {{schema}}.lifecycle_outbox_unsequenced_after
           LIMIT {{batch}} + 1)) AS work
    WHERE current_setting('outbox.sequencer_locked', true) = 'true'
    ORDER BY xid, id
    LIMIT {{batch}} + 1
),
pending AS (
    SELECT row_id, xid, id, project_id,
           row_number() OVER (PARTITION BY project_id ORDER BY xid, id) AS rank
    FROM (SELECT * FROM found ORDER BY xid, id LIMIT {{batch}}) AS batch
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
                    COALESCE((SELECT p.pruned_through FROM {{schema}}.lifecycle_projects AS p
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
numbered AS (
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
           (SELECT count(*) FROM found) <= {{batch}} AS complete,
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
)
SELECT starts.project_id, starts.head + starts.numbered AS head_sequence, starts.numbered,
       pg_notify({{channel}}, starts.project_id) AS notified
FROM starts
ORDER BY starts.project_id";
