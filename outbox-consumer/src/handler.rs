//! The application's side: handlers that observe events and a reconciler for the fallback.
//!
//! A consumer dispatches in one of two modes ([`DispatchMode`], sealed): [`Plain`], a
//! [`Handler`] called outside any transaction, or [`InTransaction`], a
//! [`TransactionalHandler`] whose writes commit with the acknowledgement.

use std::future::Future;

use tokio_postgres::Transaction;

use crate::event::{HandlerFailure, ObservedEvent};

pub use crate::dispatch::{DispatchMode, InTransaction, Plain};

/// Receives events in sequence order, at least once.
///
/// The runtime acknowledges after `handle` returns `Ok`, possibly for several events at once;
/// [`Handler::before_ack_prefix`] (by default [`Handler::before_ack`]) runs first, so a
/// buffering or pipelining handler can make its effects durable.
pub trait Handler: Send + Sync + 'static {
    /// Handles one event. An `Err` holds the cursor and schedules a retry.
    fn handle(
        &self,
        event: &ObservedEvent,
    ) -> impl Future<Output = Result<(), HandlerFailure>> + Send;

    /// Whether this handler needs the project's total order: every event after the one
    /// before it, across keys. Such a handler refuses [`DeliverySettings::lanes`] above 1
    /// (the consumer does not start). The default is per-key order only.
    ///
    /// [`DeliverySettings::lanes`]: crate::DeliverySettings::lanes
    fn needs_total_order(&self) -> bool {
        false
    }

    /// Called before the cursor advances past events already handled (flush buffers here).
    /// An `Err` acknowledges nothing; the unacknowledged events are delivered again.
    fn before_ack(&self) -> impl Future<Output = Result<(), HandlerFailure>> + Send {
        async { Ok(()) }
    }

    /// Like [`Handler::before_ack`], for a handler whose effects complete asynchronously and
    /// can fail one event at a time (a pipelined publisher: `handle` starts the effect, this
    /// waits for the confirmations). `handled` are the events `handle` accepted since the last
    /// acknowledgement, in order. `Ok` makes all of them eligible for acknowledgement;
    /// `Err(PartialAck { durable, failure })` acknowledges only the first `durable` and charges
    /// `failure` to `handled[durable]`, which then follows the retry schedule like any failed
    /// event; nothing after it is acknowledged. A [`HandlerFailure::stop`] failure instead ends
    /// the run without acknowledging anything (the durable prefix is delivered again by the
    /// next run), and a [`HandlerFailure::abandon`] one charges no attempt.
    ///
    /// The default calls [`Handler::before_ack`] and treats its failure as a failure of the
    /// first event, so handlers that only implement `before_ack` behave as before.
    fn before_ack_prefix(
        &self,
        handled: &[ObservedEvent],
    ) -> impl Future<Output = Result<(), PartialAck>> + Send {
        let _ = handled;
        async {
            self.before_ack().await.map_err(|failure| PartialAck {
                durable: 0,
                failure,
            })
        }
    }
}

/// How far a handler's [`Handler::before_ack_prefix`] got: the first `durable` events are
/// done, the next one failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialAck {
    /// Events, from the start of the handled prefix, whose effects are complete.
    pub durable: usize,
    /// Why the event after them failed.
    pub failure: HandlerFailure,
}

/// Receives events with the transaction in which the cursor advance will commit: database
/// effects made through `tx` commit exactly once with the acknowledgement, or not at all.
pub trait TransactionalHandler: Send + Sync + 'static {
    /// Handles one event inside `tx`. An `Err` rolls `tx` back and schedules a retry.
    fn handle(
        &self,
        tx: &Transaction<'_>,
        event: &ObservedEvent,
    ) -> impl Future<Output = Result<(), HandlerFailure>> + Send;
}

/// The live task set of a project, read in one snapshot together with the head sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSet {
    /// The project.
    pub project_id: outbox_core::ProjectId,
    /// IDs of tasks that are not deleted, in the snapshot.
    pub task_ids: Vec<String>,
    /// The head sequence in the same snapshot; the cursor is recorded here afterwards.
    pub head_sequence: i64,
    /// The identity (event ID) of the event at the head in the same snapshot; `None` at head
    /// 0 or when that event was pruned. A follower that resumes at the head checks the
    /// history it resumes in with it.
    pub head_event_id: Option<String>,
    /// Why reconciliation ran.
    pub reason: ReconcileReason,
}

/// Why a consumer fell back to full reconciliation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReconcileReason {
    /// The consumer has no cursor yet (new, or reactivated after retirement).
    MissingCursor,
    /// The cursor is below the retention floor: the events it needs were pruned.
    BelowRetentionFloor,
    /// The cursor is above the project's head: it cannot be trusted. For an SSE client of
    /// `outbox serve`: it resumed with a bare sequence (no identity to check) above the head.
    AboveHead,
    /// A gap appeared in the retained history after the cursor.
    GapInHistory,
    /// The database's history is not the one the consumer's position came from: the event at
    /// the position has another identity, or the database's cursor is behind the position or
    /// beyond the head (after a failover that lost a tail, or a restore from backup). For an
    /// SSE client of `outbox serve`: its resume id names another event at its sequence, or a
    /// sequence beyond the head.
    HistoryDiverged,
}

impl ReconcileReason {
    /// Stable text for logs and output.
    pub fn as_str(&self) -> &'static str {
        match self {
            ReconcileReason::MissingCursor => "missing_cursor",
            ReconcileReason::BelowRetentionFloor => "below_retention_floor",
            ReconcileReason::AboveHead => "above_head",
            ReconcileReason::GapInHistory => "gap_in_history",
            ReconcileReason::HistoryDiverged => "history_diverged",
        }
    }
}

/// Rebuilds a consumer's view from the live task set when history cannot be replayed.
pub trait Reconciler: Send + Sync + 'static {
    /// Receives the live set; the cursor moves to `live.head_sequence` after `Ok`.
    fn reconcile(&self, live: &LiveSet) -> impl Future<Output = Result<(), HandlerFailure>> + Send;
}

/// A shared handler is a handler: one value can serve as the handler and the reconciler of a
/// consumer, or be shared by the pairs of a set, without a forwarding wrapper that could
/// forget a method.
impl<T: Handler + ?Sized> Handler for std::sync::Arc<T> {
    fn handle(
        &self,
        event: &ObservedEvent,
    ) -> impl Future<Output = Result<(), HandlerFailure>> + Send {
        T::handle(self, event)
    }

    fn needs_total_order(&self) -> bool {
        T::needs_total_order(self)
    }

    fn before_ack(&self) -> impl Future<Output = Result<(), HandlerFailure>> + Send {
        T::before_ack(self)
    }

    fn before_ack_prefix(
        &self,
        handled: &[ObservedEvent],
    ) -> impl Future<Output = Result<(), PartialAck>> + Send {
        T::before_ack_prefix(self, handled)
    }
}

/// A shared transactional handler is a transactional handler (see the [`Handler`] impl).
impl<T: TransactionalHandler + ?Sized> TransactionalHandler for std::sync::Arc<T> {
    fn handle(
        &self,
        tx: &Transaction<'_>,
        event: &ObservedEvent,
    ) -> impl Future<Output = Result<(), HandlerFailure>> + Send {
        T::handle(self, tx, event)
    }
}

/// A shared reconciler is a reconciler (see the [`Handler`] impl).
impl<T: Reconciler + ?Sized> Reconciler for std::sync::Arc<T> {
    fn reconcile(&self, live: &LiveSet) -> impl Future<Output = Result<(), HandlerFailure>> + Send {
        T::reconcile(self, live)
    }
}
