//! # outbox-consumer
//!
//! The consumer runtime of lifecycle-outbox: a durable consumer with an explicit, stable ID
//! receives every committed event of its project at least once, in sequence order, through
//! crashes, restarts, dropped connections and lost wake-ups.
//!
//! ```no_run
//! use outbox_consumer::{Consumer, ConsumerConfig, Handler, HandlerFailure, LiveSet,
//!                       ObservedEvent, Reconciler};
//! use outbox_core::{ConsumerId, ProjectId};
//!
//! struct Cache;
//! impl Handler for Cache {
//!     async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
//!         println!("task {} deleted (seq {})", event.task_id, event.sequence);
//!         Ok(())
//!     }
//! }
//! impl Reconciler for Cache {
//!     async fn reconcile(&self, live: &LiveSet) -> Result<(), HandlerFailure> {
//!         println!("{} live tasks at head {}", live.task_ids.len(), live.head_sequence);
//!         Ok(())
//!     }
//! }
//!
//! # async fn example(pool: deadpool_postgres::Pool, listen: tokio_postgres::Config)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! let config = ConsumerConfig::new(ProjectId::new("p1")?, ConsumerId::new("dashboard")?);
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! Consumer::new(pool, Some(listen), config, Cache, Cache).run(shutdown).await?;
//! # Ok(()) }
//! ```
//!
//! ## How it works
//! - **Lease.** The consumer row is claimed (generation + 1) when free or expired, renewed by
//!   a heartbeat on its own timer, released at shutdown. Every cursor, delivery and dead-letter
//!   write names owner and generation; a rejected write stops dispatch at once.
//! - **Loop.** Shutdown, wake-ups (LISTEN on a dedicated connection) and a fallback poll
//!   tick drive reads of `sequence > cursor` in batches. Wake-ups are hints; the scan is the
//!   authority, and it runs after every reconnect.
//! - **Failures.** A failed event holds the cursor and is retried on [`RetrySchedule`]; after
//!   the last attempt it is parked as a dead letter, audited, and the cursor moves on.
//! - **Reconciliation.** A consumer whose cursor is missing, below the retention floor or
//!   above the head hands the live task set to its [`Reconciler`] and resumes from that
//!   snapshot's head.
//! - **Sequencer.** The runtime also runs the sequencer, so a deployment needs no other
//!   process.
//! - **Many consumers, one process.** A [`ConsumerSet`] runs many (project, consumer) pairs,
//!   each a consumer as above with its own lease and cursor, on one pool and one LISTEN
//!   connection, with one statement renewing every lease and one polling every project's
//!   head; with [`Projects::All`] it follows projects that appear later.
//! - **Retention.** The runtime also runs the retention sweep of its project
//!   ([`outbox_core::retention::Pruner`]) at start and every [`Duties::prune_interval`]; a
//!   failed sweep is logged and retried at the next interval.
//!
//! ## Modules
//! The root holds what a service that consumes needs first: [`Consumer`] and [`ConsumerSet`],
//! their configuration, the handler traits, the event and its failures. The rest, one public
//! module per noun:
//! - [`config`]: [`ConsumerConfig`], [`DeliverySettings`], [`Duties`], [`StartFrom`], the live
//!   query, and the defaults and ceilings of every setting.
//! - [`handler`]: the handler traits, what they are given ([`LiveSet`], the reconciliation's
//!   reason), a partial acknowledgement, and the dispatch modes (plain or in a transaction).
//! - [`event`]: [`ObservedEvent`], its payload, and [`HandlerFailure`] with its
//!   [`FailureClass`].
//! - [`retry`]: [`RetrySchedule`] and its ceiling.
//! - [`set`]: many (project, consumer) pairs in one process ([`ConsumerSet`], [`Projects`],
//!   the pair factory, outcomes and probes).
//! - [`probe`]: what a running consumer tells its process for readiness.
//! - [`history`]: read-only retained history, for followers that own no cursor.
//! - [`outage`]: riding out an unavailable database (which failures are an outage, the
//!   process's availability); [`backoff`]: the delays between attempts.
//! - [`metric`]: the names and help text of what the runtime records.
//!
//! The workspace's own crates and tests also reach a few items through `internal` (the
//! statements whose plans the tests check, the cursor as logs show it). It is hidden from the
//! documentation and not a stable API.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod availability;
mod background;
pub mod backoff;
pub mod config;
mod cursor;
mod dispatch;
mod error;
pub mod event;
mod gauges;
pub mod handler;
pub mod history;
#[doc(hidden)]
pub mod internal;
mod lease;
mod listener;
mod live_query;
pub mod metric;
pub mod outage;
pub mod probe;
mod repeat;
pub mod retry;
mod runtime;
pub mod set;
mod signals;
mod sql;
mod store;
mod task;

pub use config::{ConsumerConfig, DeliverySettings, Duties, StartFrom};
pub use error::ConsumerError;
pub use event::{FailureClass, HandlerFailure, ObservedEvent};
pub use handler::{Handler, LiveSet, Reconciler, TransactionalHandler};
pub use retry::RetrySchedule;
pub use runtime::{Consumer, RunSummary};
pub use set::{ConsumerSet, Projects};
