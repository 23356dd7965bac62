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

/// Whether the `schema_migrations` table named by `$1` (schema-qualified, quoted as needed) has
/// the columns this crate records migrations in: another tool's table of that name (Rails',
/// golang-migrate's, ...) in the same schema does not, and reading it would fail with a bare
/// "column does not exist".
pub const MIGRATIONS_TABLE_IS_OURS: &str = "
SELECT count(*) = 3 AS ours
FROM pg_catalog.pg_attribute
WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped
  AND attname IN ('version', 'name', 'checksum')";

/// Records one applied migration.
pub const RECORD_MIGRATION: &str =
    "INSERT INTO {{schema}}.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)";

/// Serialises migrators (transaction-scoped).
pub const LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

/// Takes the sequencer lease when it is free or expired (a new generation), or renews it for
/// its holder (`$1` owner, `$2` generation) while it has not expired; `$3`: lease seconds.
/// Always one row: `claimed`, the generation held afterwards, NULL when another process holds
/// the lease; and the row as it was before (`holder`, `holder_generation`), so a follower can
/// tell a holder that is gone (see `TAKE_OVER_SEQUENCER_LEASE`) without a second look.
/// A follower's look at the row is this same statement: its update matches nothing, writes
/// nothing.
pub const CLAIM_SEQUENCER_LEASE: &str = "
WITH claimed AS (
    UPDATE {{schema}}.lifecycle_sequencer_lease AS l
    SET owner = $1,
        generation = CASE WHEN l.owner = $1 AND l.generation = $2 AND l.expires_at > now()
                          THEN l.generation ELSE l.generation + 1 END,
        expires_at = now() + make_interval(secs => $3),
        renewed_at = now()
    WHERE l.singleton
      AND (l.owner IS NULL OR l.expires_at <= now() OR (l.owner = $1 AND l.generation = $2))
    RETURNING l.generation
)
SELECT (SELECT generation FROM claimed) AS claimed,
       l.owner AS holder,
       l.generation AS holder_generation
FROM {{schema}}.lifecycle_sequencer_lease AS l
WHERE l.singleton";

/// Takes the sequencer lease over from a holder known to be gone before its lease expires
/// (`$1` the new owner, `$2` lease seconds, `$3` the holder, `$4` its generation, both as
/// read): a new generation, only if the row has not moved on since it was read. Returns the
/// new generation, or no row.
pub const TAKE_OVER_SEQUENCER_LEASE: &str = "
UPDATE {{schema}}.lifecycle_sequencer_lease AS l
SET owner = $1,
    generation = l.generation + 1,
    expires_at = now() + make_interval(secs => $2),
    renewed_at = now()
WHERE l.singleton AND l.owner = $3 AND l.generation = $4
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

/// Records an event of any registered type through the SQL writer (migration 0016), which
/// checks the payload against the type's contract and inserts once: `$1` project, `$2` type,
/// `$3` major, `$4` subject, `$5` payload, `$6` writer process, `$7` traceparent (or NULL).
pub const WRITE_EVENT: &str = "
SELECT {{schema}}.write_event($1, $2, $3, $4, $5, $6, $7) AS event_id";

/// Whether event `$2` of project `$1` was recorded by the caller's transaction (rather than
/// before it): the generic writer's function returns only the ID, and a statement cannot see
/// the rows a function it calls inserts.
pub const RECORDED_HERE: &str = "
SELECT coalesce(xid = pg_current_xact_id_if_assigned(), false) AS inserted
FROM {{schema}}.lifecycle_outbox
WHERE project_id = $1 AND event_id = $2";

/// One sequencer tick (migration 0014): the idle probe, the sequencer lock and the numbering
/// of up to `$2` committed events, in one statement and so one transaction of its own; `$1`
/// is the schema's lock key, `$3` the channel notified with each touched project. Returns a
/// row per touched project (`locked` true, its new head and how many it numbered), no row
/// when there was no work, one row with `locked` false when another sequencer held the lock.
/// The function's statements keep their plans on each server session, behind a transaction
/// pooler too; see the migration for how the tick finds its work and stores its frontier.
pub const TICK: &str = "
SELECT locked, project_id, head_sequence, numbered
FROM {{schema}}.lifecycle_outbox_tick($1, $2, $3)";
