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

/// Elects one sequencer at a time (transaction-scoped); others skip their tick. Also bounds
/// how long the tick may sit idle in its transaction (`$2`, milliseconds as text): a paused
/// or stalled process would otherwise hold the lock, and stop all numbering, indefinitely.
///
/// And fixes the numbering statement's plan whatever the statistics and the table's size,
/// for the rest of the tick: the work list only through its partial index (no sequential or
/// bitmap scan, which would read the table or sort it), and no nested loops between the
/// batch's projects (quadratic in them). A plan kept on the session (see
/// [`Sequencer::with_session_plan`](crate::Sequencer::with_session_plan)) is made under the
/// same settings, so it cannot be one that was only cheap while the table was small.
pub const TRY_LOCK: &str = "
SELECT pg_try_advisory_xact_lock($1) AS locked,
       set_config('idle_in_transaction_session_timeout', $2, true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('enable_nestloop', 'off', true)";

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

/// Whether any committed event waits for a number: one cheap probe of the (tiny) work-list
/// index, so an idle tick costs one round trip and no transaction.
///
/// The first row in `id` order, not a bare `EXISTS`: statistics taken during a backlog make
/// `sequence IS NULL` look common, and the planner then answers a bare `EXISTS` with a
/// sequential scan that stops at the first match, which reads the whole table when the work
/// list is empty. Only the work-list index yields rows in `id` order without a sort.
pub const PENDING_EXISTS: &str = "
SELECT EXISTS (SELECT FROM (SELECT id FROM {{schema}}.lifecycle_outbox
                            WHERE sequence IS NULL ORDER BY id LIMIT 1) AS first) AS pending";

/// [`PENDING_EXISTS`], and whether this session already holds the prepared numbering
/// statement named `$1` (a pooled connection may have been reset in between).
pub const PENDING_EXISTS_PREPARED: &str = "
SELECT EXISTS (SELECT FROM (SELECT id FROM {{schema}}.lifecycle_outbox
                            WHERE sequence IS NULL ORDER BY id LIMIT 1) AS first) AS pending,
       EXISTS (SELECT FROM pg_prepared_statements WHERE name = $1) AS prepared";

/// Numbers up to `{{batch}}` committed, unsequenced rows in arrival (`id`) order and advances
/// each touched project's head; returns each project's new head and how many it numbered.
/// The batch size is written into the text, so the statement has no parameters and a plan
/// kept on the session is used as it is, never re-planned for a parameter value.
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
/// Runs under the sequencer lock, in a statement started after the lock was granted, so its
/// snapshot includes every earlier tick. Rows of uncommitted writers are invisible here and are
/// numbered by a later tick, after everything already numbered: a reader at `sequence > n`
/// can never miss a lower number that appears later.
pub const NUMBER_PENDING: &str = "
WITH pending AS (
    SELECT row_id, project_id,
           row_number() OVER (PARTITION BY project_id ORDER BY id) AS rank
    FROM (SELECT ctid AS row_id, id, project_id
          FROM {{schema}}.lifecycle_outbox
          WHERE sequence IS NULL
          ORDER BY id
          LIMIT {{batch}}) AS batch
),
counts AS (
    SELECT project_id, count(*) AS numbered FROM pending GROUP BY project_id
),
heads AS (
    INSERT INTO {{schema}}.lifecycle_project_heads AS h (project_id, head_sequence)
    SELECT project_id, numbered FROM counts
    ON CONFLICT (project_id)
        DO UPDATE SET head_sequence = h.head_sequence + EXCLUDED.head_sequence
    RETURNING h.project_id, h.head_sequence
),
assigned AS MATERIALIZED (
    SELECT pending.row_id, heads.head_sequence - counts.numbered + pending.rank AS sequence
    FROM pending
    JOIN counts USING (project_id)
    JOIN heads USING (project_id)
),
numbered AS (
    UPDATE {{schema}}.lifecycle_outbox AS o
    SET sequence = assigned.sequence,
        sequenced_at = now()
    FROM assigned
    WHERE o.ctid = ANY (ARRAY(SELECT row_id FROM pending))
      AND o.ctid = assigned.row_id
    RETURNING 1
)
SELECT heads.project_id, heads.head_sequence, counts.numbered
FROM heads JOIN counts USING (project_id)
ORDER BY heads.project_id";

/// One wake-up per touched project, delivered at commit.
pub const NOTIFY_PROJECTS: &str =
    "SELECT pg_notify($1, project_id) FROM unnest($2::text[]) AS project_id";
