//! The two ways events reach application code: plain (acknowledged afterwards, in batches)
//! and transactional (handled inside the transaction that advances the cursor).

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::Pool;
use outbox_core::contract::{Acceptance, EventTypes};
use outbox_core::internal::observe;
use tokio_util::sync::CancellationToken;

use crate::error::ConsumerError;
use crate::event::{FailureClass, HandlerFailure, ObservedEvent};
use crate::handler::{Handler, PartialAck, TransactionalHandler};
use crate::lease::Lease;
use crate::store::{self, Statements};

/// What the runtime lends a dispatch mode for one batch.
pub struct DispatchContext<'a> {
    pub(crate) pool: &'a Pool,
    pub(crate) lease: &'a Lease,
    pub(crate) statements: &'a Statements,
    pub(crate) shutdown: &'a CancellationToken,
    pub(crate) grace: Duration,
    /// Sequence of an event with saved retry state, cleared when it is acknowledged.
    pub(crate) held_sequence: Option<i64>,
    /// The types the handler understands: events of other types pass without a call.
    pub(crate) event_types: &'a EventTypes,
    /// `outbox_events_skipped_total`: events passed without a call.
    pub(crate) skipped: &'a metrics::Counter,
}

impl DispatchContext<'_> {
    /// Whether `event` is of a type the handler did not declare (it passes without a call).
    /// A declared type in an undeclared major never gets here: the read parks it.
    fn skips(&self, event: &ObservedEvent) -> bool {
        self.event_types.accept(&event.event_type, event.type_major) == Acceptance::Skip
    }
}

/// What the runtime lends a dispatch mode for the events of its lanes.
pub struct LaneContext<'a> {
    pub(crate) pool: &'a Pool,
    pub(crate) lease: &'a Lease,
    pub(crate) statements: &'a Statements,
}

/// How far a batch got.
#[derive(Debug, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Events handled successfully, from the start of the batch.
    pub handled: usize,
    /// Whether those events are already acknowledged (transactional dispatch acknowledges
    /// each in its own transaction; plain dispatch leaves that to the runtime).
    pub acked: bool,
    /// Why event `handled` failed, if it did. With `None` and `handled` short of the batch,
    /// dispatch stopped for shutdown or an invalid lease.
    pub failure: Option<FailureClass>,
}

/// A dispatch mode: [`Plain`] or [`InTransaction`]. Sealed.
pub trait DispatchMode: private::Sealed + Send + Sync + 'static {
    /// Dispatches `events` (contiguous, in order) and acknowledges what succeeded.
    #[doc(hidden)]
    fn deliver(
        &self,
        ctx: &DispatchContext<'_>,
        events: &[ObservedEvent],
    ) -> impl Future<Output = Result<BatchOutcome, ConsumerError>> + Send;

    /// Re-dispatches one dead letter and records the outcome.
    #[doc(hidden)]
    fn replay(
        &self,
        ctx: &DispatchContext<'_>,
        event: &ObservedEvent,
    ) -> impl Future<Output = Result<Option<Result<(), HandlerFailure>>, ConsumerError>> + Send;

    /// Why this mode cannot run with more than one lane, if it cannot.
    #[doc(hidden)]
    fn refuses_lanes(&self) -> Option<&'static str>;

    /// Handles one event of a lane (the lanes acknowledge on their own). `Err` when the
    /// database failed around the handler (the lanes start over from the cursor).
    #[doc(hidden)]
    fn handle_in_lane(
        &self,
        ctx: &LaneContext<'_>,
        event: &ObservedEvent,
    ) -> impl Future<Output = Result<Result<(), HandlerFailure>, ConsumerError>> + Send;

    /// Whether each event handled in a lane leaves a receipt (the lanes skip events with one
    /// when they start over from the cursor).
    #[doc(hidden)]
    fn keeps_receipts(&self) -> bool;

    /// Before the lanes acknowledge: `handled` are the events the handler accepted since the
    /// last acknowledgement, in sequence order (see [`Handler::before_ack_prefix`]).
    #[doc(hidden)]
    fn before_lanes_ack(
        &self,
        handled: &[ObservedEvent],
    ) -> impl Future<Output = Result<(), PartialAck>> + Send;
}

mod private {
    pub trait Sealed {}
    impl<H> Sealed for super::Plain<H> {}
    impl<T> Sealed for super::InTransaction<T> {}
}

/// Plain dispatch: handle each event, then acknowledge the handled prefix in one write after
/// [`Handler::before_ack`]. A crash repeats at most the unacknowledged part of one batch.
pub struct Plain<H>(pub(crate) H);

/// Transactional dispatch: each event is handled inside the transaction that advances the
/// cursor, so database effects through that transaction happen exactly once.
pub struct InTransaction<T>(pub(crate) T);

/// Runs `handling` as an observed dispatch; `None` when shutdown's grace period ran out first.
pub(crate) async fn guarded<F, T>(ctx: &DispatchContext<'_>, handling: F) -> Option<T>
where
    F: Future<Output = T>,
{
    crate::task::within_grace(ctx.shutdown, ctx.grace, observe(handling)).await
}

/// Runs a handler call inside a span that carries the writer's trace context, when it passed
/// one, so the handler's own spans continue the writer's trace (an OpenTelemetry layer links
/// them by the `traceparent` field).
pub(crate) async fn traced<F: Future>(event: &ObservedEvent, handling: F) -> F::Output {
    match &event.traceparent {
        Some(traceparent) => {
            let span = tracing::info_span!("observed_event", traceparent = %traceparent,
                event_id = %event.event_id, event_type = %event.event_type);
            tracing::Instrument::instrument(handling, span).await
        }
        None => handling.await,
    }
}

/// Sorts a handler failure: `Err` stops the consumer (the sink is broken) or, for a sink whose
/// history diverged, makes it reconcile; `Ok(None)` is an abandonment (not the event's fault,
/// not counted), `Ok(Some(class))` a failure of the event.
pub(crate) fn triage(failure: HandlerFailure) -> Result<Option<FailureClass>, ConsumerError> {
    if let Some(reason) = failure.stop_reason() {
        return Err(ConsumerError::SinkFailed {
            reason: reason.to_owned(),
        });
    }
    if let Some((position, identity)) = failure.diverged() {
        return Err(ConsumerError::SinkDiverged {
            position,
            identity: identity.to_owned(),
        });
    }
    if failure.is_abandoned() {
        return Ok(None);
    }
    Ok(Some(failure.class))
}

impl<H: Handler> DispatchMode for Plain<H> {
    async fn deliver(
        &self,
        ctx: &DispatchContext<'_>,
        events: &[ObservedEvent],
    ) -> Result<BatchOutcome, ConsumerError> {
        // One guard for the whole run of handler calls, not one per event: the grace after
        // a shutdown bounds them all the same, since no event starts after the shutdown.
        let mut handled = 0;
        let mut skipped = 0;
        let handling = async {
            for event in events {
                if !ctx.lease.is_valid() || ctx.shutdown.is_cancelled() {
                    break;
                }
                if ctx.skips(event) {
                    skipped += 1;
                } else {
                    traced(event, self.0.handle(event)).await?;
                }
                handled += 1;
            }
            Ok(())
        };
        // An abandonment is a handler cut off at shutdown, or one that gave up for it.
        let (failure, abandoned) = match guarded(ctx, handling).await {
            Some(Ok(())) => (None, false),
            Some(Err(f)) => {
                let failure = triage(f)?;
                let abandoned = failure.is_none();
                (failure, abandoned)
            }
            None => (None, true),
        };
        if let Some(event) = events.get(handled).filter(|_| abandoned) {
            tracing::warn!(sequence = event.sequence, "handler abandoned at shutdown");
        }
        ctx.skipped.increment(skipped as u64);
        if handled > 0 {
            if let Err(partial) = self.before_ack(ctx, &events[..handled], skipped).await {
                // Only the durable prefix is acknowledged; the event after it is charged with
                // the failure (unless it was the sink's or shutdown's) and everything after
                // that is delivered again. A broken sink stops the run before any of it is
                // acknowledged.
                return Ok(BatchOutcome {
                    handled: partial.durable.min(handled - 1),
                    acked: false,
                    failure: triage(partial.failure)?,
                });
            }
        }
        Ok(BatchOutcome {
            handled,
            acked: false,
            failure,
        })
    }

    async fn replay(
        &self,
        ctx: &DispatchContext<'_>,
        event: &ObservedEvent,
    ) -> Result<Option<Result<(), HandlerFailure>>, ConsumerError> {
        let Some(mut result) = guarded(ctx, traced(event, self.0.handle(event))).await else {
            return Ok(None);
        };
        if result.is_ok() {
            result = self
                .0
                .before_ack_prefix(std::slice::from_ref(event))
                .await
                .map_err(|partial| partial.failure);
        }
        if let Err(f) = &result {
            if triage(f.clone())?.is_none() {
                return Ok(None);
            }
        }
        let mut client = ctx.pool.get().await?;
        let tx = client.transaction().await?;
        store::lock_fence(&tx, ctx.statements, ctx.lease).await?;
        store::record_replay(&tx, ctx.statements, ctx.lease, event, &result).await?;
        tx.commit().await?;
        Ok(Some(result))
    }

    fn refuses_lanes(&self) -> Option<&'static str> {
        self.0.needs_total_order().then_some(
            "the handler declares that it needs the stream's total order (needs_total_order)",
        )
    }

    async fn handle_in_lane(
        &self,
        _ctx: &LaneContext<'_>,
        event: &ObservedEvent,
    ) -> Result<Result<(), HandlerFailure>, ConsumerError> {
        Ok(self.0.handle(event).await)
    }

    fn keeps_receipts(&self) -> bool {
        false
    }

    fn before_lanes_ack(
        &self,
        handled: &[ObservedEvent],
    ) -> impl Future<Output = Result<(), PartialAck>> + Send {
        self.0.before_ack_prefix(handled)
    }
}

impl<H: Handler> Plain<H> {
    /// [`Handler::before_ack_prefix`] over the events the handler saw: the skipped ones are
    /// left out, and a partial acknowledgement's count is mapped back onto `handled`.
    async fn before_ack(
        &self,
        ctx: &DispatchContext<'_>,
        handled: &[ObservedEvent],
        skipped: usize,
    ) -> Result<(), PartialAck> {
        if skipped == 0 {
            return self.0.before_ack_prefix(handled).await;
        }
        let seen: Vec<usize> = (0..handled.len())
            .filter(|&index| !ctx.skips(&handled[index]))
            .collect();
        if seen.is_empty() {
            return Ok(());
        }
        let events: Vec<ObservedEvent> = seen.iter().map(|&i| handled[i].clone()).collect();
        self.0
            .before_ack_prefix(&events)
            .await
            .map_err(|partial| PartialAck {
                durable: seen.get(partial.durable).copied().unwrap_or(handled.len()),
                failure: partial.failure,
            })
    }
}

/// Acknowledges skipped events that no handled event's transaction covered (they trail the
/// batch, or precede the event that failed).
async fn ack_skipped(
    ctx: &DispatchContext<'_>,
    client: &mut deadpool_postgres::Client,
    left_at: i64,
    through: Option<i64>,
) -> Result<(), ConsumerError> {
    let Some(sequence) = through else {
        return Ok(());
    };
    let tx = client.transaction().await?;
    store::lock_fence(&tx, ctx.statements, ctx.lease).await?;
    store::ack_in(
        &tx,
        ctx.statements,
        ctx.lease,
        ctx.held_sequence,
        left_at,
        sequence,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

impl<T: TransactionalHandler> DispatchMode for InTransaction<T> {
    async fn deliver(
        &self,
        ctx: &DispatchContext<'_>,
        events: &[ObservedEvent],
    ) -> Result<BatchOutcome, ConsumerError> {
        let mut client = ctx.pool.get().await?;
        // Skipped events are acknowledged by the next handled event's transaction, or on
        // their own when none follows.
        let mut skipped_through = None;
        // Where the cursor stands in the database: each acknowledgement moves it from here.
        let mut acked_through = events.first().map_or(0, |e| e.sequence - 1);
        for (index, event) in events.iter().enumerate() {
            if !ctx.lease.is_valid() || ctx.shutdown.is_cancelled() {
                ack_skipped(ctx, &mut client, acked_through, skipped_through).await?;
                return Ok(BatchOutcome {
                    handled: index,
                    acked: true,
                    failure: None,
                });
            }
            if ctx.skips(event) {
                ctx.skipped.increment(1);
                skipped_through = Some(event.sequence);
                continue;
            }
            let tx = client.transaction().await?;
            store::lock_fence(&tx, ctx.statements, ctx.lease).await?;
            match guarded(ctx, traced(event, self.0.handle(&tx, event))).await {
                Some(Ok(())) => {
                    store::ack_in(
                        &tx,
                        ctx.statements,
                        ctx.lease,
                        ctx.held_sequence,
                        acked_through,
                        event.sequence,
                    )
                    .await?;
                    tx.commit().await?;
                    acked_through = event.sequence;
                    skipped_through = None;
                }
                Some(Err(f)) => {
                    tx.rollback().await?;
                    ack_skipped(ctx, &mut client, acked_through, skipped_through).await?;
                    return Ok(BatchOutcome {
                        handled: index,
                        acked: true,
                        failure: triage(f)?,
                    });
                }
                None => {
                    tx.rollback().await?;
                    ack_skipped(ctx, &mut client, acked_through, skipped_through).await?;
                    return Ok(BatchOutcome {
                        handled: index,
                        acked: true,
                        failure: None,
                    });
                }
            }
        }
        ack_skipped(ctx, &mut client, acked_through, skipped_through).await?;
        Ok(BatchOutcome {
            handled: events.len(),
            acked: true,
            failure: None,
        })
    }

    async fn replay(
        &self,
        ctx: &DispatchContext<'_>,
        event: &ObservedEvent,
    ) -> Result<Option<Result<(), HandlerFailure>>, ConsumerError> {
        let mut client = ctx.pool.get().await?;
        let tx = client.transaction().await?;
        store::lock_fence(&tx, ctx.statements, ctx.lease).await?;
        let Some(result) = guarded(ctx, traced(event, self.0.handle(&tx, event))).await else {
            tx.rollback().await?;
            return Ok(None);
        };
        if let Err(f) = &result {
            if triage(f.clone())?.is_none() {
                tx.rollback().await?;
                return Ok(None);
            }
        }
        if result.is_ok() {
            store::record_replay(&tx, ctx.statements, ctx.lease, event, &result).await?;
            tx.commit().await?;
        } else {
            tx.rollback().await?;
            let tx = client.transaction().await?;
            store::lock_fence(&tx, ctx.statements, ctx.lease).await?;
            store::record_replay(&tx, ctx.statements, ctx.lease, event, &result).await?;
            tx.commit().await?;
        }
        Ok(Some(result))
    }

    fn refuses_lanes(&self) -> Option<&'static str> {
        None
    }

    /// The event is handled in its own transaction, which also inserts its receipt: the
    /// effect and the receipt commit together or not at all, so the event is skipped, not
    /// handled again, when the lanes start over from a cursor still below it. The fence is
    /// taken in share mode: the lanes' transactions run side by side, a takeover waits for
    /// them. The receipt goes in first, so that a receipt already there fails the transaction
    /// before the handler runs.
    async fn handle_in_lane(
        &self,
        ctx: &LaneContext<'_>,
        event: &ObservedEvent,
    ) -> Result<Result<(), HandlerFailure>, ConsumerError> {
        let mut client = ctx.pool.get().await?;
        let tx = client.transaction().await?;
        store::lock_fence_shared(&tx, ctx.statements, ctx.lease).await?;
        store::insert_receipt(&tx, ctx.statements, ctx.lease, event.sequence).await?;
        match traced(event, self.0.handle(&tx, event)).await {
            Ok(()) => {
                tx.commit().await?;
                Ok(Ok(()))
            }
            Err(failure) => {
                tx.rollback().await?;
                Ok(Err(failure))
            }
        }
    }

    fn keeps_receipts(&self) -> bool {
        true
    }

    async fn before_lanes_ack(&self, _handled: &[ObservedEvent]) -> Result<(), PartialAck> {
        Ok(())
    }
}
