//! The consumer runtime: claim the lease, then loop over wake-ups, poll ticks and shutdown,
//! delivering events in order from the cursor.

use outbox_core::Unnamed as _;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use outbox_core::{PruneOptions, PruneReport, Pruner, Sequencer};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_postgres::{Config, IsolationLevel};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::{ConfigError, ConsumerConfig, StartFrom};
use crate::dispatch::{BatchOutcome, DispatchContext, DispatchMode, InTransaction, Plain};
use crate::error::ConsumerError;
use crate::handler::{Handler, LiveSet, ReconcileReason, Reconciler, TransactionalHandler};
use crate::lease::{self, Lease};
use crate::listener;
use crate::store::{self, Held, Statements};

/// Connections a consumer needs at once: the delivery loop, the heartbeat and the sequencer.
/// The retention sweep borrows one more for a moment per batch; it waits for a free one
/// rather than holding one. (The listener has its own, unpooled connection.)
pub const MIN_POOL_SIZE: usize = 3;

/// What a run did, returned when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// The lease generation this run held (0 if it never claimed).
    pub generation: i64,
    /// Events handled and acknowledged in order.
    pub delivered: u64,
    /// The cursor at the end.
    pub cursor: Option<i64>,
}

/// A durable consumer of one project's stream. See the crate docs.
pub struct Consumer<D, R> {
    /// Connections for claims, reads, acks and heartbeats.
    pool: Pool,
    /// The dedicated listener connection's configuration; `None` polls only.
    listen_config: Option<Config>,
    /// Identity and timing.
    config: ConsumerConfig,
    /// Plain or transactional handler.
    dispatch: D,
    /// Receives the live set when the consumer falls back to reconciliation.
    reconciler: R,
    /// TLS for the listener connection (`None`: plain, as `tokio_postgres::NoTls`).
    listen_tls: Option<outbox_core::Connector>,
}

impl<D, R> Consumer<D, R> {
    /// Opens the LISTEN connection through `connector` (built by
    /// [`outbox_core::ConnectSettings::connector`]), so that it uses the same TLS settings as
    /// the pool; without it the listener connects without TLS.
    pub fn listen_tls(mut self, connector: outbox_core::Connector) -> Self {
        self.listen_tls = Some(connector);
        self
    }
}

impl<H: Handler, R: Reconciler> Consumer<Plain<H>, R> {
    /// A consumer that acknowledges after `handler` returns (at-least-once).
    pub fn new(
        pool: Pool,
        listen_config: Option<Config>,
        config: ConsumerConfig,
        handler: H,
        reconciler: R,
    ) -> Self {
        Self {
            pool,
            listen_config,
            config,
            dispatch: Plain(handler),
            reconciler,
            listen_tls: None,
        }
    }
}

impl<T: TransactionalHandler, R: Reconciler> Consumer<InTransaction<T>, R> {
    /// A consumer whose handler runs inside the transaction that advances the cursor.
    pub fn transactional(
        pool: Pool,
        listen_config: Option<Config>,
        config: ConsumerConfig,
        handler: T,
        reconciler: R,
    ) -> Self {
        Self {
            pool,
            listen_config,
            config,
            dispatch: InTransaction(handler),
            reconciler,
            listen_tls: None,
        }
    }
}

/// Aborts a spawned task when dropped; `run` joins its tasks before returning.
struct TaskGuard(Option<tokio::task::JoinHandle<()>>);

impl TaskGuard {
    async fn join(mut self) {
        if let Some(handle) = self.0.take() {
            let _ = handle.await;
        }
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
        }
    }
}

/// Per-run delivery state.
struct Progress {
    /// Last acknowledged sequence; `None` while missing.
    cursor: Option<i64>,
    /// The failed event holding the cursor, if any.
    held: Option<Held>,
    /// Whether the cursor was checked against head and floor since the last (re)start.
    bounds_checked: bool,
    /// When to look for replay requests next.
    next_replay_check: Instant,
    /// Events delivered in order.
    delivered: u64,
    /// Whether a missing cursor may start from the earliest event: only for a consumer row
    /// this run created. A reactivated consumer, or one that crashed before its first
    /// reconciliation finished, always reconciles.
    new_consumer: bool,
    /// Last sequence (and count) handled by this run whose acknowledgement is still to be
    /// written.
    handled_through: Option<(i64, u64)>,
}

/// Whether to go round again at once.
enum Step {
    More,
    Idle,
}

impl<D: DispatchMode, R: Reconciler> Consumer<D, R> {
    /// Runs until `shutdown` is cancelled (then finishes or abandons the current event within
    /// the grace period, acknowledges what was handled and releases the lease), or until the
    /// lease is lost or a non-transient error occurs.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<RunSummary, ConsumerError> {
        self.config.validate()?;
        let pool_size = self.pool.status().max_size;
        if pool_size < MIN_POOL_SIZE {
            return Err(ConfigError(format!(
                "the pool allows {pool_size} connection(s); a consumer needs at least \
                 {MIN_POOL_SIZE} (delivery, heartbeat, sequencer)"
            ))
            .into());
        }
        let statements = Arc::new(Statements {
            // Direct connections keep the hot path's statements prepared per connection.
            cached: self.config.pooler == outbox_core::Pooler::None,
            ..Statements::new(&self.config.schema)
        });
        let owner = owner_token();
        let Some(claimed) = lease::claim(&self.pool, &self.config, &owner, &shutdown).await? else {
            return Ok(RunSummary::default());
        };
        let lease = Arc::new(claimed.lease);
        let stop = CancellationToken::new();
        let wake = Arc::new(Notify::new());
        let tasks = self.spawn_background(&lease, &statements, &wake, &stop);

        let mut progress = Progress {
            cursor: claimed.cursor,
            held: None,
            bounds_checked: false,
            next_replay_check: Instant::now(),
            delivered: 0,
            new_consumer: claimed.created,
            handled_through: None,
        };
        let span = tracing::info_span!(
            "consumer",
            project = %self.config.project_id,
            consumer = %self.config.consumer_id,
            generation = lease.fence.generation,
        );
        let mut result = self
            .deliver_loop(&lease, &statements, &wake, &shutdown, &mut progress)
            .instrument(span)
            .await;
        if result.is_ok() && progress.handled_through.is_some() {
            // One last try, so a clean stop does not leave handled events to be repeated.
            result = self.ack_handled(&lease, &statements, &mut progress).await;
        }

        stop.cancel();
        for task in tasks {
            task.join().await;
        }
        if !matches!(result, Err(ConsumerError::LeaseLost { .. })) {
            lease::release(&self.pool, &lease, &statements.release).await;
        }
        result.map(|()| RunSummary {
            generation: lease.fence.generation,
            delivered: progress.delivered,
            cursor: progress.cursor,
        })
    }

    fn spawn_background(
        &self,
        lease: &Arc<Lease>,
        statements: &Arc<Statements>,
        wake: &Arc<Notify>,
        stop: &CancellationToken,
    ) -> Vec<TaskGuard> {
        let mut tasks = Vec::new();
        {
            let (pool, lease, stop) = (self.pool.clone(), lease.clone(), stop.clone());
            let statement = statements.heartbeat.clone();
            let interval = self.config.heartbeat_interval;
            tasks.push(TaskGuard(Some(tokio::spawn(async move {
                lease::heartbeat(pool, &lease, statement, interval, stop).await
            }))));
        }
        if let Some(interval) = self.config.sequence_interval {
            let (pool, stop) = (self.pool.clone(), stop.clone());
            let sequencer = Sequencer::new(&self.config.schema)
                .with_idle_timeout(self.config.lease_ttl.min(outbox_core::DEFAULT_IDLE_TIMEOUT));
            tasks.push(TaskGuard(Some(tokio::spawn(async move {
                run_sequencer(pool, sequencer, interval, stop).await
            }))));
        }
        if let Some(interval) = self.config.prune_interval {
            let options = PruneOptions {
                retention: self.config.retention,
                project: Some(self.config.project_id.clone()),
                actor: format!("consumer:{}", self.config.consumer_id),
                ..PruneOptions::default()
            };
            match Pruner::new(&self.config.schema, options) {
                Ok(pruner) => {
                    let (pool, stop) = (self.pool.clone(), stop.clone());
                    tasks.push(TaskGuard(Some(tokio::spawn(async move {
                        run_pruner(pool, pruner, interval, stop).await
                    }))));
                }
                Err(e) => tracing::error!(error = %e, "retention sweep disabled"),
            }
        }
        // Behind a transaction pooler a LISTEN would be lost with its server session.
        let listen = self.config.listen && self.config.pooler == outbox_core::Pooler::None;
        if let (true, Some(config)) = (listen, self.listen_config.clone()) {
            let channel = self.config.schema.channel();
            let project = self.config.project_id.to_string();
            let (wake, stop) = (wake.clone(), stop.clone());
            let tls = self.listen_tls.clone();
            tasks.push(TaskGuard(Some(tokio::spawn(async move {
                listener::listen(config, tls, channel, project, wake, stop).await
            }))));
        }
        tasks
    }

    async fn deliver_loop(
        &self,
        lease: &Lease,
        statements: &Statements,
        wake: &Notify,
        shutdown: &CancellationToken,
        progress: &mut Progress,
    ) -> Result<(), ConsumerError> {
        let mut failures: u32 = 0;
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            if lease.is_valid() {
                match self.step(lease, statements, shutdown, progress).await {
                    Ok(Step::More) => {
                        failures = 0;
                        continue;
                    }
                    Ok(Step::Idle) => failures = 0,
                    Err(e @ ConsumerError::LeaseLost { .. }) => return Err(e),
                    Err(e) if e.is_retryable() => {
                        failures = failures.saturating_add(1);
                        progress.bounds_checked = false;
                        let delay = listener::backoff(failures, rand::random());
                        tracing::warn!(error = %e, retry_in = ?delay, "transient failure; will retry");
                        tokio::select! {
                            _ = shutdown.cancelled() => return Ok(()),
                            _ = lease.lost() => return Err(lease.lost_error()),
                            _ = tokio::time::sleep(delay) => {}
                        }
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            let mut deadline = Instant::now() + self.config.poll_interval;
            if let Some(held) = &progress.held {
                deadline = deadline.min(held.ready_at);
            }
            if !lease.is_valid() {
                // Renewals are failing (database unreachable?): wait for one to succeed or for
                // the loss to be confirmed, dispatching nothing meanwhile.
                deadline = deadline.min(Instant::now() + Duration::from_millis(100));
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                _ = lease.lost() => return Err(lease.lost_error()),
                _ = wake.notified() => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    async fn step(
        &self,
        lease: &Lease,
        statements: &Statements,
        shutdown: &CancellationToken,
        progress: &mut Progress,
    ) -> Result<Step, ConsumerError> {
        let project = &self.config.project_id;
        let consumer = &self.config.consumer_id;
        let mut client = self.pool.get().await?;

        let Some(cursor) = progress.cursor else {
            drop(client);
            self.start_without_cursor(lease, statements, progress)
                .await?;
            return Ok(Step::More);
        };
        if progress.handled_through.is_some() {
            drop(client);
            self.ack_handled(lease, statements, progress).await?;
            return Ok(Step::More);
        }
        if !progress.bounds_checked {
            let (head, floor) = store::bounds(&**client, statements, project.as_str()).await?;
            let reason = if cursor < floor {
                Some(ReconcileReason::BelowRetentionFloor)
            } else if cursor > head {
                Some(ReconcileReason::AboveHead)
            } else {
                None
            };
            if let Some(reason) = reason {
                drop(client);
                self.reconcile(lease, statements, progress, reason).await?;
                return Ok(Step::More);
            }
            progress.held = store::load_held(&**client, statements, lease, cursor).await?;
            progress.bounds_checked = true;
        }

        if Instant::now() >= progress.next_replay_check {
            progress.next_replay_check = Instant::now() + self.config.poll_interval;
            drop(client);
            self.replay_requested(lease, statements, shutdown).await?;
            client = self.pool.get().await?;
        }

        if progress
            .held
            .as_ref()
            .is_some_and(|held| Instant::now() < held.ready_at)
        {
            return Ok(Step::Idle);
        }

        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&project.as_str(), &cursor, &self.config.batch_size];
        let rows = if statements.cached {
            let statement = client.prepare_cached(&statements.read_batch).await?;
            client.query(&statement, &params).await?
        } else {
            client
                .query_unnamed(&statements.read_batch, &params)
                .await?
        };
        drop(client);
        if rows.is_empty() {
            return Ok(Step::Idle);
        }
        let mut events = Vec::with_capacity(rows.len());
        for (index, row) in rows.iter().enumerate() {
            let sequence: i64 = row.get(0);
            if sequence != cursor + 1 + index as i64 {
                if index == 0 {
                    tracing::error!(
                        cursor,
                        next = sequence,
                        "gap after the cursor in retained history"
                    );
                    self.reconcile(lease, statements, progress, ReconcileReason::GapInHistory)
                        .await?;
                    return Ok(Step::More);
                }
                break;
            }
            let attempt = match &progress.held {
                Some(held) if held.sequence == sequence => held.attempts + 1,
                _ => 1,
            };
            match store::decode(row, project, consumer, false, attempt) {
                Ok(event) => events.push(event),
                Err(class) => {
                    // Deliver what precedes it; the undecodable event then fails on its own.
                    if events.is_empty() {
                        let event = placeholder_event(row, project, consumer, attempt);
                        self.fail(lease, statements, progress, &event, class)
                            .await?;
                        return Ok(Step::More);
                    }
                    break;
                }
            }
        }

        let full_batch = rows.len() as i64 == self.config.batch_size;
        let ctx = DispatchContext {
            pool: &self.pool,
            lease,
            statements,
            shutdown,
            grace: self.config.shutdown_grace,
            held_sequence: progress.held.as_ref().map(|h| h.sequence),
        };
        let BatchOutcome {
            handled,
            acked,
            failure,
        } = self.dispatch.deliver(&ctx, &events).await?;
        if handled > 0 {
            let last = events[handled - 1].sequence;
            if acked {
                self.advance(progress, last, handled as u64);
            } else {
                progress.handled_through = Some((last, handled as u64));
                self.ack_handled(lease, statements, progress).await?;
            }
        }
        if let Some(class) = failure {
            let event = &events[handled];
            self.fail(lease, statements, progress, event, class).await?;
            return Ok(Step::More);
        }
        if handled < events.len() {
            // Stopped by shutdown or an invalid lease: the loop decides what happens next.
            return Ok(Step::Idle);
        }
        Ok(if full_batch || events.len() < rows.len() {
            Step::More
        } else {
            Step::Idle
        })
    }

    /// Acknowledges events this run handled but could not yet acknowledge (the write failed,
    /// say, because the database restarted). They are not dispatched again by this process.
    async fn ack_handled(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
    ) -> Result<(), ConsumerError> {
        let Some((through, count)) = progress.handled_through else {
            return Ok(());
        };
        let held = progress.held.as_ref().map(|h| h.sequence);
        let mut client = self.pool.get().await?;
        store::ack(&mut client, statements, lease, held, through).await?;
        progress.handled_through = None;
        self.advance(progress, through, count);
        Ok(())
    }

    /// Records an acknowledged prefix in memory and metrics.
    fn advance(&self, progress: &mut Progress, last: i64, count: u64) {
        progress.cursor = Some(last);
        progress.delivered += count;
        if progress.held.as_ref().is_some_and(|h| h.sequence <= last) {
            progress.held = None;
        }
        let labels = [
            ("project", self.config.project_id.to_string()),
            ("consumer", self.config.consumer_id.to_string()),
        ];
        metrics::counter!("outbox_consumer_delivered_total", &labels).increment(count);
        metrics::gauge!("outbox_consumer_cursor", &labels).set(last as f64);
    }

    /// Saves a failed attempt of `event` (the one after the cursor).
    async fn fail(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        event: &crate::event::ObservedEvent,
        class: crate::event::FailureClass,
    ) -> Result<(), ConsumerError> {
        let attempts = event.attempt;
        let delay = self.config.retry.delay_after(attempts);
        let mut client = self.pool.get().await?;
        store::record_failure(
            &mut client,
            statements,
            lease,
            event,
            attempts,
            &class,
            delay,
        )
        .await?;
        let labels = [
            ("project", self.config.project_id.to_string()),
            ("consumer", self.config.consumer_id.to_string()),
        ];
        metrics::counter!("outbox_consumer_failures_total", &labels).increment(1);
        match delay {
            Some(delay) => {
                tracing::warn!(
                    sequence = event.sequence, event_id = %event.event_id, attempts,
                    class = %class, retry_in = ?delay, "event failed; will retry"
                );
                progress.held = Some(Held {
                    sequence: event.sequence,
                    attempts,
                    ready_at: Instant::now() + delay,
                });
            }
            None => {
                tracing::error!(
                    sequence = event.sequence, event_id = %event.event_id, attempts,
                    class = %class, "event parked as a dead letter; the stream moves on"
                );
                metrics::counter!("outbox_consumer_dead_letters_total", &labels).increment(1);
                progress.held = None;
                progress.cursor = Some(event.sequence);
            }
        }
        Ok(())
    }

    /// A consumer without a cursor reconciles, or replays retained history when asked to and
    /// nothing has been pruned yet.
    async fn start_without_cursor(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
    ) -> Result<(), ConsumerError> {
        if self.config.start_from == StartFrom::Earliest && progress.new_consumer {
            let mut client = self.pool.get().await?;
            let (_, floor) =
                store::bounds(&**client, statements, self.config.project_id.as_str()).await?;
            if floor == 0 {
                store::set_cursor(&mut client, statements, lease, 0, None).await?;
                tracing::info!("new consumer starts from the earliest event");
                progress.cursor = Some(0);
                progress.bounds_checked = false;
                return Ok(());
            }
            tracing::warn!(
                floor,
                "history before the retention floor is gone; reconciling instead"
            );
        }
        self.reconcile(lease, statements, progress, ReconcileReason::MissingCursor)
            .await
    }

    /// Full reconciliation: the live set and the head in one snapshot, handed to the
    /// reconciler, then the cursor recorded at that head.
    async fn reconcile(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        reason: ReconcileReason,
    ) -> Result<(), ConsumerError> {
        let project = self.config.project_id.as_str();
        tracing::info!(reason = reason.as_str(), cursor = ?progress.cursor, "reconciling");
        let mut client = self.pool.get().await?;
        if self.config.sequence_interval.is_some() {
            // Number what has committed, so fewer deletions arrive again after the snapshot.
            Sequencer::new(&self.config.schema)
                .drain(&mut client)
                .await?;
        }
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let (head, _) = store::bounds(&*tx, statements, project).await?;
        let task_ids: Vec<String> = tx
            .query_unnamed(&self.config.live_query, &[&project])
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        tx.commit().await?;
        drop(client);
        let live = LiveSet {
            project_id: project.to_owned(),
            task_ids,
            head_sequence: head,
            reason,
        };
        if let Err(failure) = outbox_core::observe(self.reconciler.reconcile(&live)).await {
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
        progress.cursor = Some(head);
        progress.held = None;
        progress.bounds_checked = false;
        Ok(())
    }

    /// Re-dispatches dead letters an operator asked to replay.
    async fn replay_requested(
        &self,
        lease: &Lease,
        statements: &Statements,
        shutdown: &CancellationToken,
    ) -> Result<(), ConsumerError> {
        let project = &self.config.project_id;
        let consumer = &self.config.consumer_id;
        let rows = {
            let client = self.pool.get().await?;
            client
                .query_unnamed(
                    &statements.replay_requested,
                    &[&project.as_str(), &consumer.as_str()],
                )
                .await?
        };
        let ctx = DispatchContext {
            pool: &self.pool,
            lease,
            statements,
            shutdown,
            grace: self.config.shutdown_grace,
            held_sequence: None,
        };
        for row in rows {
            if !lease.is_valid() || shutdown.is_cancelled() {
                break;
            }
            let attempts: i32 = row.get(9);
            let attempt = attempts.max(0) as u32 + 1;
            let event = match store::decode(&row, project, consumer, true, attempt) {
                Ok(event) => event,
                Err(class) => {
                    let event = placeholder_event(&row, project, consumer, attempt);
                    let mut client = self.pool.get().await?;
                    let tx = client.transaction().await?;
                    store::lock_fence(&tx, statements, lease).await?;
                    store::record_replay(&tx, statements, lease, &event, &Err(class.into()))
                        .await?;
                    tx.commit().await?;
                    continue;
                }
            };
            match self.dispatch.replay(&ctx, &event).await? {
                Some(Ok(())) => tracing::info!(event_id = %event.event_id, "dead letter replayed"),
                Some(Err(f)) => tracing::warn!(
                    event_id = %event.event_id, class = %f.class,
                    "replay failed; the dead letter stays parked"
                ),
                None => break,
            }
        }
        Ok(())
    }
}

/// An event whose payload could not be decoded, carried far enough to be failed and parked.
fn placeholder_event(
    row: &tokio_postgres::Row,
    project: &outbox_core::ProjectId,
    consumer: &outbox_core::ConsumerId,
    attempt: u32,
) -> crate::event::ObservedEvent {
    crate::event::ObservedEvent {
        observed: true,
        event_type: row.get(1),
        project_id: project.clone(),
        consumer_id: consumer.clone(),
        sequence: row.get(0),
        event_id: row.get(2),
        task_id: row.get(3),
        deleted_at: row.get(4),
        origin_writer: row.get(5),
        occurred_at: row.get(6),
        payload_version: row.get(7),
        prior: outbox_core::Prior::default(),
        replay: false,
        attempt,
    }
}

/// Numbers committed events every `interval` until `stop`.
async fn run_sequencer(
    pool: Pool,
    sequencer: Sequencer,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut failures: u32 = 0;
    loop {
        let delay = if failures == 0 {
            interval
        } else {
            listener::backoff(failures, rand::random()).max(interval)
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        let result = async {
            let mut client = pool.get().await?;
            sequencer.drain(&mut client).await?;
            Ok::<_, ConsumerError>(())
        }
        .await;
        match result {
            Ok(()) => failures = 0,
            Err(e) => {
                if failures == 0 {
                    tracing::warn!(error = %e, "sequencer tick failed; backing off");
                }
                failures = failures.saturating_add(1);
            }
        }
    }
}

/// Runs the retention sweep of the consumer's project at once and then every `interval` until
/// `stop`. A failed sweep is logged and tried again at the next interval, never fatal. Each
/// batch takes a pooled connection of its own, so a long sweep never starves the heartbeat.
async fn run_pruner(pool: Pool, pruner: Pruner, interval: Duration, stop: CancellationToken) {
    loop {
        match sweep_once(&pool, &pruner, &stop).await {
            Ok(report) => {
                for project in &report.projects {
                    let labels = [("project", project.project_id.clone())];
                    metrics::counter!("outbox_pruned_events_total", &labels)
                        .increment(project.events_pruned);
                    metrics::counter!("outbox_pruned_dead_letters_total", &labels)
                        .increment(project.dead_letters_pruned);
                    metrics::gauge!("outbox_retention_floor", &labels).set(project.floor as f64);
                }
            }
            Err(e) => tracing::warn!(
                error = %e, retry_in = ?interval,
                "retention sweep failed; will try again at the next interval"
            ),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// One sweep, batch by batch; stops between (or abandons a running) batch on `stop`. An
/// abandoned batch's transaction rolls back.
async fn sweep_once(
    pool: &Pool,
    pruner: &Pruner,
    stop: &CancellationToken,
) -> Result<PruneReport, ConsumerError> {
    let mut sweep = pruner.sweep();
    loop {
        let mut client = tokio::select! {
            _ = stop.cancelled() => break,
            client = pool.get() => client?,
        };
        let more = tokio::select! {
            _ = stop.cancelled() => break,
            more = sweep.step(&mut client) => more?,
        };
        if !more {
            break;
        }
    }
    Ok(sweep.into_report())
}

/// Names this process run in `lease_owner`: host, PID and a random suffix. It identifies a
/// lease holder, never the consumer (whose ID is explicit and stable).
fn owner_token() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    format!(
        "{host}:{}:{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}
