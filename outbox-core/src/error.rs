//! The one error type of `outbox-core`.

use tokio_postgres::error::SqlState;

use crate::event::ValidationError;
use crate::ids::IdError;

/// Anything that can go wrong in the core library.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The event was refused before anything was written.
    #[error(transparent)]
    Validation(#[from] ValidationError),
    /// The database refused or failed a statement.
    #[error("database error: {}", describe(.0))]
    Database(#[from] tokio_postgres::Error),
    /// An applied migration differs from the one this binary carries.
    #[error(
        "migration {version} ({name}) was applied with checksum {recorded}, but this build \
         carries checksum {expected}: refusing to continue on a schema that differs from the \
         code; restore the original migration file"
    )]
    ChecksumMismatch {
        /// Migration version.
        version: i32,
        /// Migration name.
        name: String,
        /// Checksum in `schema_migrations`.
        recorded: String,
        /// Checksum of the embedded file.
        expected: String,
    },
    /// The database has a migration this build does not know: a newer build migrated it.
    #[error(
        "migration {version} ({name}) is applied in the database but unknown to this build; \
         run a build that includes it"
    )]
    UnknownMigration {
        /// Migration version.
        version: i32,
        /// Migration name.
        name: String,
    },
    /// The schema holds another tool's `schema_migrations` table: the names collide.
    #[error(
        "schema {schema} already holds a schema_migrations table of another tool (it lacks the \
         version, name and checksum columns this one records): the names collide; give the \
         outbox a schema of its own with --schema (or OUTBOX_SCHEMA), such as outbox"
    )]
    ForeignMigrationsTable {
        /// The schema.
        schema: String,
    },
    /// The schema was never migrated (or `--schema` names the wrong one).
    #[error("schema `{schema}` is not migrated (run `outbox migrate`, or check `--schema`)")]
    NotMigrated {
        /// The schema.
        schema: String,
    },
    /// The schema lacks migrations this build needs.
    #[error(
        "schema {schema} is at migration {applied}, but this build needs migration(s) \
         {needed:?}: run `outbox migrate` first"
    )]
    SchemaBehind {
        /// The schema.
        schema: String,
        /// The highest applied version (0: never migrated).
        applied: i32,
        /// The versions this build carries that are not applied.
        needed: Vec<i32>,
    },
    /// The writer was called from inside an observed dispatch, which would double-fire the
    /// writer-owned delete side effects.
    #[error(
        "refusing to write a lifecycle event from inside an observed dispatch: observers must \
         not repeat writer-owned delete effects"
    )]
    WriteInsideObservedDispatch,
}

impl From<IdError> for Error {
    fn from(e: IdError) -> Self {
        Error::Validation(ValidationError::Id(e))
    }
}

impl Error {
    /// The SQLSTATE of a database error, if any.
    pub fn code(&self) -> Option<&SqlState> {
        match self {
            Error::Database(e) => e.code(),
            _ => None,
        }
    }

    /// True when retrying the same operation later may succeed: serialization failures,
    /// deadlocks, lock timeouts, administrator shutdown, and closed or broken connections.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Database(e) => is_retryable_db(e),
            _ => false,
        }
    }
}

/// See [`Error::is_retryable`].
pub fn is_retryable_db(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            [
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::LOCK_NOT_AVAILABLE,
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                // A standby not promoted yet (after a failover, `target_session_attrs` finds
                // the new primary once it is).
                SqlState::READ_ONLY_SQL_TRANSACTION,
            ]
            .contains(code)
                || code.code().starts_with("08")
        }
        // No SQLSTATE: an I/O or protocol failure on the connection.
        None => true,
    }
}

/// A database error with the server's message, not just "db error".
/// Other errors name their underlying cause (connection refused, no such socket file, a
/// timeout), not just "error connecting to server".
///
/// A missing outbox table or schema says so, with the way out.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        if let Some(schema) = unmigrated_schema(db) {
            return format!(
                "schema `{schema}` is not migrated (run `outbox migrate`, or check `--schema`) \
                 (SQLSTATE {})",
                db.code().code()
            );
        }
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let cause_text = match cause.downcast_ref::<std::io::Error>() {
            Some(io) if io.kind() == std::io::ErrorKind::NotFound => {
                format!("no such socket file ({io})")
            }
            Some(io) if io.kind() == std::io::ErrorKind::TimedOut => format!("timed out ({io})"),
            _ => cause.to_string(),
        };
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The schema named by an "undefined table/function/schema" error about one of the outbox's own
/// objects (`relation "S.lifecycle_outbox" does not exist`), if that is what `db` is.
fn unmigrated_schema(db: &tokio_postgres::error::DbError) -> Option<String> {
    use tokio_postgres::error::SqlState;
    let code = db.code();
    if code == &SqlState::INVALID_SCHEMA_NAME {
        let name = db.message().split('"').nth(1)?;
        return Some(name.to_owned());
    }
    if code != &SqlState::UNDEFINED_TABLE && code != &SqlState::UNDEFINED_FUNCTION {
        return None;
    }
    let quoted = db.message().split('"').nth(1)?;
    let (schema, object) = quoted.split_once('.')?;
    let ours = object.starts_with("lifecycle_")
        || object == "schema_migrations"
        || object.starts_with("write_task_deleted");
    ours.then(|| schema.to_owned())
}
