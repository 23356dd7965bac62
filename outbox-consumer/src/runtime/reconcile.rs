//! Settling the cursor: the start of a consumer without a cursor, and full reconciliation
//! when history is missing or diverged (the check after every (re)start is `identity.rs`'s).

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use outbox_core::internal::Unnamed as _;
use outbox_core::sequencer::Sequencer;
use tokio_util::sync::CancellationToken;

use super::Consumer;
use super::progress::Progress;
use crate::config::StartFrom;
use crate::cursor::ShownCursor;
use crate::error::ConsumerError;
use crate::handler::{LiveSet, ReconcileReason, Reconciler};
use crate::lease::Lease;
use crate::sql;
use crate::store::{self, Statements};
use crate::task::within_grace;

/// How long a reconciliation's snapshot waits for another sequencer's tick to commit before
/// reading the head without it (a tick is a few milliseconds; a longer hold is a sequencer
/// that has stalled, and the events it holds are then delivered after the snapshot).
const SEQUENCER_PATIENCE: Duration = Duration::from_secs(1);

/// How long cancelling an abandoned live query may take (a pooled connection and one
/// statement) before the run goes on without it.
const CANCEL_PATIENCE: Duration = Duration::from_secs(2);

impl<D, R: Reconciler> Consumer<D, R> {
    /// A consumer without a cursor reconciles, or replays retained history when asked to and
    /// nothing has been pruned yet. A new consumer asked to start from the earliest event
    /// whose history was pruned reconciles for that reason (`below_retention_floor`), not for
    /// its missing cursor, which alone would have been replayed.
    pub(super) async fn start_without_cursor(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        shutdown: &CancellationToken,
    ) -> Result<(), ConsumerError> {
        let mut reason = ReconcileReason::MissingCursor;
        if self.config.delivery.start_from == StartFrom::Earliest {
            let mut client = self.pool.get().await?;
            let project = self.config.project_id.as_str();
            // New: registered by this claim, or by a process that stopped (killed, say)
            // before its first position. A reactivated consumer has had one and reconciles.
            let new = progress.new_consumer
                || !store::ever_positioned(
                    &**client,
                    statements,
                    project,
                    self.config.consumer_id.as_str(),
                )
                .await?;
            if !new {
                drop(client);
                return self
                    .reconcile(lease, statements, progress, reason, shutdown)
                    .await;
            }
            let (_, floor) = store::bounds(&**client, statements, project).await?;
            if floor == 0 {
                store::set_cursor(&mut client, statements, lease, 0, None).await?;
                tracing::info!("new consumer starts from the earliest event");
                progress.moved_to(0, None);
                progress.bounds_checked = false;
                return Ok(());
            }
            tracing::warn!(
                floor,
                "history before the retention floor is gone; reconciling instead"
            );
            reason = ReconcileReason::BelowRetentionFloor;
        }
        self.reconcile(lease, statements, progress, reason, shutdown)
            .await
    }

    /// Full reconciliation: the live set and the head in one snapshot, handed to the
    /// reconciler, then the cursor recorded at that head. Shutdown's grace bounds it as it
    /// bounds a handler: past the grace the snapshot or the reconciler is abandoned, the cursor
    /// stays where it was, and the next start reconciles again.
    pub(super) async fn reconcile(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        reason: ReconcileReason,
        shutdown: &CancellationToken,
    ) -> Result<(), ConsumerError> {
        let cursor = ShownCursor(progress.position.cursor());
        tracing::info!(reason = reason.as_str(), cursor = %cursor, "reconciling");
        let grace = self.config.delivery.shutdown_grace;
        let mut client = self.pool.get().await?;
        let backend = AtomicI32::new(0);
        let snapshot = self.snapshot(&mut client, statements, &backend);
        let abandoned = tokio::select! {
            snapshot = within_grace(shutdown, grace, snapshot) => match snapshot {
                Some(snapshot) => Ok(snapshot),
                None => Err("shutdown grace ran out while reading the live set; abandoned"),
            },
            () = lease.lost() => Err("the lease was lost while reading the live set; abandoned"),
        };
        let snapshot = match abandoned {
            Ok(snapshot) => snapshot,
            Err(why) => {
                // Its live query may still be running on the server: cancel it there, and
                // close the connection rather than hand it back to the pool, where the lease's
                // release would wait for it.
                self.cancel_statement(backend.load(Ordering::SeqCst)).await;
                drop(deadpool_postgres::Object::take(client));
                tracing::warn!("{why}");
                if lease.is_lost() {
                    return Err(lease.lost_error());
                }
                return Ok(());
            }
        };
        let (head, identity, task_ids) = snapshot?;
        drop(client);
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let live = LiveSet {
            project_id: self.config.project_id.clone(),
            task_ids,
            head_sequence: head,
            head_event_id: identity.clone(),
            reason,
        };
        let reconciled = outbox_core::internal::observe(self.reconciler.reconcile(&live));
        let Some(reconciled) = within_grace(shutdown, grace, reconciled).await else {
            tracing::warn!("shutdown grace ran out while the reconciler ran; abandoned");
            return Ok(());
        };
        if let Err(failure) = reconciled {
            if let Some(reason) = failure.stop_reason() {
                return Err(ConsumerError::SinkFailed {
                    reason: reason.to_owned(),
                });
            }
            tracing::error!(class = %failure.class, "reconciler failed; will try again");
            return Err(ConsumerError::ReconcilerFailed {
                class: failure.class,
            });
        }
        let mut client = self.pool.get().await?;
        let live_count = live.task_ids.len() as i64;
        store::set_cursor(&mut client, statements, lease, head, Some(live_count)).await?;
        tracing::info!(
            head,
            live = live_count,
            reason = reason.as_str(),
            "reconciled"
        );
        progress.moved_to(head, identity);
        progress.must_reconcile = None;
        progress.bounds_checked = false;
        Ok(())
    }

    /// Cancels what server process `backend` runs (nothing when 0: the snapshot had not
    /// started), from another pooled connection, waiting at most [`CANCEL_PATIENCE`]: an
    /// abandoned live query would otherwise run on to its end, holding its snapshot.
    async fn cancel_statement(&self, backend: i32) {
        if backend == 0 {
            return;
        }
        let cancel = async {
            let client = self.pool.get().await?;
            client
                .query_one_unnamed(sql::CANCEL_BACKEND, &[&backend])
                .await?;
            Ok::<_, ConsumerError>(())
        };
        match tokio::time::timeout(CANCEL_PATIENCE, cancel).await {
            Ok(Ok(())) => tracing::info!(backend, "cancelled the abandoned live query"),
            Ok(Err(e)) => {
                tracing::warn!(backend, error = %e, "could not cancel the abandoned live query")
            }
            Err(_) => tracing::warn!(backend, "could not cancel the abandoned live query in time"),
        }
    }

    /// The head, the identity of the event there and the live task set, read in one snapshot
    /// after numbering what has committed; `backend` is set to the snapshot's server process.
    async fn snapshot(
        &self,
        client: &mut deadpool_postgres::Client,
        statements: &Statements,
        backend: &AtomicI32,
    ) -> Result<(i64, Option<String>, Vec<String>), ConsumerError> {
        let project = self.config.project_id.as_str();
        // The run then ends with the error, releasing its lease.
        crate::live_query::check(client, self.config.delivery.live_query.sql()).await?;
        if self.config.duties.sequence_interval.is_some() {
            // Number what has committed, so fewer deletions arrive again after the snapshot:
            // waiting out a tick of this process's own elected sequencer (or another's),
            // which may hold exactly those events uncommitted.
            Sequencer::new(&self.config.duties.schema)
                .drain_through(client, SEQUENCER_PATIENCE)
                .await?;
        }
        let tx = outbox_core::internal::read_only_snapshot(client).await?;
        let pid: i32 = tx
            .query_one_unnamed(sql::BACKEND_PID, &[])
            .await?
            .try_get("pid")?;
        backend.store(pid, Ordering::SeqCst);
        let (head, _) = store::bounds(&tx, statements, project).await?;
        let identity = store::event_at(&tx, statements, project, head).await?;
        let live_query = self.config.delivery.live_query.sql();
        let task_ids = crate::live_query::task_ids(&tx, live_query, project).await?;
        tx.commit().await?;
        Ok((head, identity, task_ids))
    }
}
