//! # outbox-core
//!
//! The durable half of lifecycle-outbox: schema migrations, the transactional `task:deleted`
//! writer, and the sequencer that numbers committed events densely per project.
//!
//! ```no_run
//! use chrono::Utc;
//! use outbox_core::{Prior, ProjectId, Schema, TaskDeleted, TaskId, Writer, WriterProcessId};
//!
//! # async fn example(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let writer = Writer::new(&Schema::default(), WriterProcessId::new("api-1")?);
//! let tx = client.transaction().await?;
//! let deleted_at = Utc::now();
//! tx.execute("UPDATE tasks SET deleted_at = $1 WHERE id = $2 AND deleted_at IS NULL",
//!            &[&deleted_at, &"FN-1"]).await?;
//! let event = TaskDeleted::new(ProjectId::new("p1")?, TaskId::new("FN-1")?, deleted_at,
//!                              Prior::default())?;
//! writer.record(&tx, &event).await?;
//! tx.commit().await?; // the delete and its event commit together, or neither does
//! # Ok(()) }
//! ```
//!
//! ## Guarantees
//! - A committed delete has its event; a rolled-back one never had it.
//! - A repeated delete of the same `(task_id, deleted_at)` writes nothing
//!   ([`WriteOutcome::AlreadyRecorded`]).
//! - Sequences are dense per project (1, 2, 3, ...) and become visible in order: a reader that
//!   sees sequence n+1 also sees n, whatever order the writers committed in.
//! - Writers never serialise on a shared row and never send `NOTIFY`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin;
mod admin_sql;
mod connect;
mod error;
mod event;
mod ids;
mod migrate;
mod observed;
mod retention;
mod retention_sql;
mod row_security;
mod schema;
mod sequencer;
mod sql;
mod stmt;
mod writer;

pub use admin::{
    Admin, AdminError, AuditEntry, AuditFilter, AuditKind, ConsumerInfo, ConsumerState,
    ConsumerStatus, DeadLetter, DeadLetterDetail, DeadLetterFilter, DeliveryState, EventFields,
    EventId, Health, HealthThresholds, InputError, Listing, MAX_EVENT_ID_LEN, MAX_LIMIT,
    MAX_OPERATOR_LEN, MAX_REASON_LEN, OperatorName, ProjectStatus, Reason, ReasonError,
    ReplayRequest, ReplayTarget, Resolution, Retirement, RetryingEvent, Status, Target,
    UnknownValue, consumer_health, project_health,
};
pub use connect::{
    ConnectError, ConnectSettings, Connector, Pooler, RootCert, SslMode,
    explain as explain_connect_error,
};
pub use error::{Error, describe, is_retryable_db};
pub use event::{
    MAX_FUTURE_SKEW, MAX_PRIOR_VALUE_LEN, PAYLOAD_VERSION, Prior, TASK_DELETED, TaskDeleted,
    ValidationError, format_timestamp,
};
pub use ids::{ConsumerId, IdError, MAX_ID_LEN, ProjectId, TaskId, WriterProcessId};
pub use migrate::{
    MIGRATIONS, Migration, MigrationReport, SchemaVersion, check_schema_version, migrate,
    migrate_with, schema_version,
};
pub use observed::{in_observed_dispatch, observe};
pub use retention::{
    DEFAULT_PRUNE_ACTOR, DEFAULT_PRUNE_BATCH, DEFAULT_RETENTION, HoldBack, MAX_PRUNE_BATCH,
    MAX_RETENTION, ProjectPrune, PruneOptions, PruneOptionsError, PruneReport, Pruner, Sweep,
    SweepProgress,
};
pub use row_security::{ROW_SECURITY_TABLES, enable_row_security};
pub use schema::{DEFAULT_SCHEMA, Schema, SchemaNameError};
pub use sequencer::{DEFAULT_BATCH, DEFAULT_IDLE_TIMEOUT, Sequencer, Tick};
pub use stmt::Unnamed;
pub use writer::{WriteOutcome, Writer};
