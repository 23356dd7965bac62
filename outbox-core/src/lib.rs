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
//! The root holds what a writer-side service needs first: [`Writer`] and [`WriteOutcome`],
//! the `task:deleted` event ([`TaskDeleted`], [`Prior`]), a registered type's [`Event`] and
//! [`Payload`], the identifiers, [`Schema`], [`Error`] and [`migrate()`](fn@migrate). The
//! rest lives in one public module per noun:
//! - [`ids`]: the validated identifiers (project, task, writer, consumer, operator, event) and
//!   their limits.
//! - [`event`]: the `task:deleted` event, its limits and its timestamp format.
//! - [`contract`]: event contracts (registered, versioned event types) and their events.
//! - [`schema`]: the schema name and the rendering of SQL templates for it.
//! - [`migrate`](mod@migrate): the numbered migrations in `sql/`, applied under an advisory
//!   lock, the schema version check, and per-project row security.
//! - [`sequencer`]: dense numbering of committed events per project, and one active sequencer
//!   among many processes (a lease row with a generation) with its adaptive tick.
//! - [`retention`]: the retention rule ([`retention::plan`]) and the sweep
//!   ([`retention::sweep`]).
//! - [`admin`]: the operator surface, one module per noun (status, consumers, dead letters,
//!   audit trail), and [`admin::AuditLog`], the one writer of audit rows.
//! - [`connect`]: the one connection factory (libpq settings and environment, TLS, pool) and
//!   the outage rule.
//! - [`states`]: the closed sets of stored text (delivery and consumer states, audit kinds,
//!   health codes), one enum each.
//! - [`error`]: the crate's error and the reading of PostgreSQL errors (retryable, described).
//!
//! The crates of this workspace also share plumbing through `internal` (the observed-dispatch
//! mark, lease owner tokens, statements a pooler survives, ...). It is hidden from the
//! documentation and not a stable API.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
mod audit_log;
pub mod connect;
pub mod contract;
mod election;
pub mod error;
pub mod event;
pub mod ids;
#[doc(hidden)]
pub mod internal;
mod libpq_env;
pub mod migrate;
mod observed;
mod owner;
mod readable;
mod redact;
pub mod retention;
mod row_security;
pub mod schema;
pub mod sequencer;
mod snapshot;
mod sql;
pub mod states;
mod stmt;
mod writer;

pub use contract::{Event, Payload};
pub use error::Error;
pub use event::{Prior, TaskDeleted};
pub use ids::{ConsumerId, EventId, OperatorName, ProjectId, TaskId, WriterProcessId};
pub use migrate::migrate;
pub use schema::Schema;
pub use writer::{WriteOutcome, Writer};
