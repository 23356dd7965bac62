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
//!
//! ## Modules
//! - `ids`: the validated identifiers (project, task, writer, consumer, operator, event).
//! - [`states`]: the closed sets of stored text (delivery and consumer states, audit kinds,
//!   health codes), one enum each.
//! - `schema`: the schema name and the rendering of SQL templates for it.
//! - `migrate`: the numbered migrations in `sql/`, applied under an advisory lock.
//! - `event`, `writer`: the `task:deleted` event and its transactional writer.
//! - `sequencer`: dense numbering of committed events per project.
//! - `election`: one active sequencer among many processes (a lease row with a generation)
//!   and its adaptive tick.
//! - [`retention`]: the retention rule ([`retention::plan`]) and the sweep
//!   ([`retention::sweep`]).
//! - [`admin`]: the operator surface, one module per noun (status, consumers, dead letters,
//!   audit trail), and [`admin::AuditLog`], the one writer of audit rows.
//! - `connect`: the one connection factory (libpq settings, TLS, pool).
//! - `snapshot`: the read-only snapshot transaction of multi-statement reads.
//! - `error`, `observed`: the crate's error and the observed-dispatch marker.
//!
//! The root re-exports what a service or an operator tool uses; the details of each
//! operation's result are also reachable through its module (`outbox_core::admin::status`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
mod audit_log;
mod connect;
pub mod contract;
mod election;
mod error;
mod event;
mod ids;
pub mod libpq_env;
mod migrate;
mod observed;
pub mod owner;
mod readable;
mod redact;
pub mod retention;
mod row_security;
mod schema;
mod sequencer;
mod snapshot;
mod sql;
pub mod states;
mod stmt;
mod writer;

pub use admin::{
    Admin, AdminError, AuditEntry, AuditFilter, ConsumerInfo, DeadLetter, DeadLetterDetail,
    DeadLetterFilter, Deletion, HealthThresholds, Listing, MAX_LIMIT, Reactivation, Reason,
    ReplayRequest, ReplayTarget, Resolution, Retirement, Status,
};
pub use connect::{
    ConnectError, ConnectSettings, Connector, Pooler, RootCert, SslMode, TargetSession,
    TlsConnection, WrongServer, explain as explain_connect_error, is_outage,
};
pub use contract::{
    Acceptance, Contract, ContractFileError, ContractRef, ContractStatus, Event, EventTypeName,
    EventTypes, FieldSpec, FieldType, Payload, RefError, validate_traceparent,
};
pub use election::{
    BUSY_PAUSE_PER_EVENT, Cadence, DEFAULT_IDLE_TICK, DEFAULT_MAX_TICK_PAUSE,
    DEFAULT_SEQUENCER_LEASE_TTL, ElectedSequencer, MAX_TICK_PAUSE_LIMIT, MIN_SEQUENCER_LEASE_TTL,
};
pub use error::{Error, describe, is_retryable_db};
pub use event::{
    MAX_FUTURE_SKEW, MAX_PRIOR_VALUE_LEN, MIN_DELETED_AT, PAYLOAD_VERSION, PayloadText, Prior,
    TASK_DELETED, TaskDeleted, ValidationError, format_timestamp,
};
pub use ids::{
    ConsumerId, EventId, IdError, MAX_ID_LEN, OperatorName, PROBE_PROJECT_PREFIX, ProjectId,
    TaskId, WriterProcessId, is_probe_project,
};
pub use migrate::{
    MIGRATIONS, Migration, MigrationReport, SchemaVersion, check_schema_version, migrate,
    migrate_with, schema_version,
};
pub use observed::{in_observed_dispatch, observe};
pub use owner::{holder_is_gone, host_name, owner_token, token_host_and_pid};
pub use readable::Readable;
pub use redact::redact_connection_string;
pub use retention::{
    DEFAULT_PRUNE_BATCH, DEFAULT_RETENTION, HoldBack, MAX_PRUNE_BATCH, MAX_RETENTION, ProjectPrune,
    PruneOptions, PruneOptionsError, PruneReport, Pruner, Sweep, SweepProgress,
};
pub use row_security::{ROW_SECURITY_TABLES, enable_row_security, row_security_enabled};
pub use schema::{DEFAULT_SCHEMA, Schema, SchemaNameError};
pub use sequencer::{DEFAULT_BATCH, Sequencer, Tick};
pub use snapshot::read_only_snapshot;
pub use states::{AuditKind, ConsumerState, DeliveryState, Health};
pub use stmt::Unnamed;
pub use writer::{WriteOutcome, Writer};
