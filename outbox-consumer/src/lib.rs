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
//!   ([`outbox_core::retention::Pruner`]) at start and every [`Duties::prune_interval`]; a failed
//!   sweep is logged and retried at the next interval.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod availability;
mod background;
mod backoff;
mod config;
mod cursor;
mod dispatch;
mod error;
mod event;
mod gauges;
mod handler;
mod history;
mod lease;
mod listener;
mod live_query;
pub mod metric;
mod outage;
mod probe;
mod repeat;
mod retry;
mod runtime;
mod set;
mod signals;
mod sql;
mod store;
mod task;

pub use availability::Availability;
pub use backoff::{backoff, outage_backoff};
pub use config::{
    ConfigError, ConsumerConfig, DEFAULT_BATCH_SIZE, DEFAULT_LIVE_QUERY, DEFAULT_MAX_AHEAD,
    DEFAULT_MAX_BATCH_SIZE, DeliverySettings, Duties, LiveQuery, MAX_AHEAD_CEILING,
    MAX_BATCH_SIZE_CEILING, MAX_LANES, StartFrom,
};
pub use cursor::ShownCursor;
pub use dispatch::{DispatchMode, InTransaction, Plain};
pub use error::ConsumerError;
pub use event::{EventPayload, FailureClass, FailureClassError, HandlerFailure, ObservedEvent};
pub use handler::{
    Handler, LiveSet, PartialAck, ReconcileReason, Reconciler, TransactionalHandler,
};
pub use history::{History, ResumePoint};
pub use outage::is_outage;
pub use probe::Probe;
pub use repeat::wait_out;
pub use retry::{MAX_ATTEMPTS_CEILING, RetrySchedule, ScheduleError};
pub use runtime::{Consumer, LISTENING_POLL_FACTOR, MIN_POOL_SIZE, RunSummary};
pub use set::{ConsumerSet, PairFactory, PairOutcome, PairProbes, Projects};
/// The acknowledgement statement (a template over `{{schema}}`; `$1` project, `$2` consumer,
/// `$3` lease owner, `$4` generation, `$5` new cursor, `$6` the cursor it replaces): the
/// position write of every delivered batch, whose plan the tests check under a held snapshot.
pub use sql::ACK as ACK_STATEMENT;
/// A consumer set's grouped acknowledgement (a template over `{{schema}}`; `$1` projects, `$2`
/// consumers, `$3` generations, `$4` new cursors, `$5` the set's lease owner, `$6` the cursors
/// they replace), checked by the same tests.
pub use sql::ACK_SET as ACK_SET_STATEMENT;
/// A consumer's lease renewal (a template over `{{schema}}`; `$1` project, `$2` consumer, `$3`
/// lease owner, `$4` generation, `$5` lease seconds), checked by the same tests.
pub use sql::HEARTBEAT as HEARTBEAT_STATEMENT;
/// A consumer set's renewal of every lease it holds (a template over `{{schema}}`; `$1`
/// projects, `$2` consumers, `$3` generations, `$4` the set's lease owner, `$5` lease
/// seconds), checked by the same tests.
pub use sql::HEARTBEAT_SET as HEARTBEAT_SET_STATEMENT;
