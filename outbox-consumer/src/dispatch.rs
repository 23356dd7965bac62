//! The two ways events reach application code: plain (acknowledged afterwards, in batches)
//! and transactional (handled inside the transaction that advances the cursor).

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::Pool;
use outbox_core::observe;
use tokio_util::sync::CancellationToken;

use crate::error::ConsumerError;
use crate::event::{FailureClass, HandlerFailure, ObservedEvent};
use crate::handler::{Handler, TransactionalHandler};
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
}

/// How far a batch got.
#[derive(Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    /// The first `acked` events were handled and acknowledged; then one failed (or the batch
    /// ended, when `failure` is `None` and `acked` is the batch length), or dispatch stopped
    /// (shutdown, lease no longer valid) when `failure` is `None` and `acked` is shorter.
    Progress {
        /// Events handled and acknowledged.
        acked: usize,
        /// The failure of event `acked`, if that is why the batch stopped.
        failure: Option<FailureClass>,
    },
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
    let grace_over = async {
        ctx.shutdown.cancelled().await;
        tokio::time::sleep(ctx.grace).await;
    };
    tokio::select! {
        result = observe(handling) => Some(result),
        _ = grace_over => None,
    }
}

impl<H: Handler> DispatchMode for Plain<H> {
    async fn deliver(
        &self,
        ctx: &DispatchContext<'_>,
        events: &[ObservedEvent],
    ) -> Result<BatchOutcome, ConsumerError> {
        let mut handled = 0;
        let mut failure = None;
        for event in events {
            if !ctx.lease.is_valid() || (ctx.shutdown.is_cancelled() && handled > 0) {
                break;
            }
            match guarded(ctx, self.0.handle(event)).await {
                Some(Ok(())) => handled += 1,
                Some(Err(f)) => {
                    failure = Some(f.class);
                    break;
                }
                None => {
                    tracing::warn!(sequence = event.sequence, "handler abandoned at shutdown");
                    break;
                }
            }
        }
        if handled > 0 {
            if let Err(f) = self.0.before_ack().await {
                // Nothing handled is durable: deliver it all again, charging the first event.
                return Ok(BatchOutcome::Progress {
                    acked: 0,
                    failure: Some(f.class),
                });
            }
            let last = events[handled - 1].sequence;
            let mut client = ctx.pool.get().await?;
            store::ack(&mut client, ctx, last).await?;
        }
        Ok(BatchOutcome::Progress {
            acked: handled,
            failure,
        })
    }

    async fn replay(
        &self,
        ctx: &DispatchContext<'_>,
        event: &ObservedEvent,
    ) -> Result<Option<Result<(), HandlerFailure>>, ConsumerError> {
        let Some(mut result) = guarded(ctx, self.0.handle(event)).await else {
            return Ok(None);
        };
        if result.is_ok() {
            result = self.0.before_ack().await;
        }
        let mut client = ctx.pool.get().await?;
        let tx = client.transaction().await?;
        store::lock_fence(&tx, ctx.statements, ctx.lease).await?;
        store::record_replay(&tx, ctx.statements, ctx.lease, event, &result).await?;
        tx.commit().await?;
        Ok(Some(result))
    }
}

impl<T: TransactionalHandler> DispatchMode for InTransaction<T> {
    async fn deliver(
        &self,
        ctx: &DispatchContext<'_>,
        events: &[ObservedEvent],
    ) -> Result<BatchOutcome, ConsumerError> {
        let mut client = ctx.pool.get().await?;
        for (index, event) in events.iter().enumerate() {
            if !ctx.lease.is_valid() || ctx.shutdown.is_cancelled() {
                return Ok(BatchOutcome::Progress {
                    acked: index,
                    failure: None,
                });
            }
            let tx = client.transaction().await?;
            store::lock_fence(&tx, ctx.statements, ctx.lease).await?;
            match guarded(ctx, self.0.handle(&tx, event)).await {
                Some(Ok(())) => {
                    store::ack_in(&tx, ctx, event.sequence).await?;
                    tx.commit().await?;
                }
                Some(Err(f)) => {
                    tx.rollback().await?;
                    return Ok(BatchOutcome::Progress {
                        acked: index,
                        failure: Some(f.class),
                    });
                }
                None => {
                    tx.rollback().await?;
                    return Ok(BatchOutcome::Progress {
                        acked: index,
                        failure: None,
                    });
                }
            }
        }
        Ok(BatchOutcome::Progress {
            acked: events.len(),
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
        let Some(result) = guarded(ctx, self.0.handle(&tx, event)).await else {
            tx.rollback().await?;
            return Ok(None);
        };
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
}
