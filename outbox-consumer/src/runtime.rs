//! The consumer runtime: claim the lease, then loop over wake-ups, poll ticks and shutdown,
//! delivering events in order from the cursor.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use outbox_core::{Sequencer, Unnamed as _};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_postgres::{Config, IsolationLevel};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::background;
use crate::config::{ConfigError, ConsumerConfig, StartFrom};
use crate::dispatch::{BatchOutcome, DispatchContext, DispatchMode, InTransaction, Plain};
use crate::error::ConsumerError;
use crate::event::{FailureClass, ObservedEvent};
use crate::handler::{Handler, LiveSet, ReconcileReason, Reconciler, TransactionalHandler};
use crate::lease::{self, Lease};
use crate::listener;
use crate::probe::Probe;
use crate::set::{Batch, Hub};
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
    /// The consumer set this consumer runs in, if any: its hub renews the lease, polls, wakes
    /// the loop, shares reads of the project and groups acknowledgements.
    hub: Option<Arc<Hub>>,
    /// Lease and liveness, for the hosting process's readiness probe.
    probe: Arc<Probe>,
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

    /// How long a lone consumer waits for a wake-up before it polls: the poll interval, or
    /// [`LISTENING_POLL_FACTOR`] times that while its listener is connected (the notifications
    /// then carry the news; a dead listener connection is found by its ping within seconds,
    /// and the reconnect wakes the loop).
    fn fallback_poll(&self, signals: &Signals) -> Duration {
        match signals.listening.load(Ordering::Relaxed) {
            true => self.config.poll_interval * LISTENING_POLL_FACTOR,
            false => self.config.poll_interval,
        }
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
            hub: None,
            probe: Arc::default(),
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
            hub: None,
            probe: Arc::default(),
            listen_tls: None,
        }
    }
}

/// How the delivery loop of one run is reached from outside.
#[derive(Default)]
pub(crate) struct Signals {
    /// Woken by the listener (and, in a set, by the shared fallback poll) when the project's
    /// head may have moved.
    pub wake: Notify,
    /// Set when dead letters may be waiting for replay: by the loop's own timer, or in a set
    /// by the shared poll, which has seen a request.
    pub replay_due: AtomicBool,
    /// Whether the listener's connection is up (LISTEN done); a lone consumer's fallback poll
    /// is then slower.
    pub listening: AtomicBool,
}

/// What a run shares with other runs: nothing (its own background tasks, its own fallback
/// poll), or a consumer set's [`Hub`].
struct Wiring {
    /// The run's wake-ups.
    signals: Arc<Signals>,
    /// Whether the loop polls on its own timer; in a set the hub polls for every consumer.
    polls_itself: bool,
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
    /// The next batch, being read while this one is dispatched (lone consumers, after a full
    /// batch); used only if the cursor reaches the point it was read after.
    prefetched: Option<Prefetch>,
    /// The unhandled rest of a batch behind a failed event (that event first), kept across
    /// the retry wait so the retry reads nothing again. Used only while it still starts right
    /// after the cursor; events never change once numbered, so the copy cannot be stale.
    pending: Vec<ObservedEvent>,
    /// The run's metrics.
    meters: Meters,
}

impl Progress {
    /// Records an acknowledged prefix in memory and metrics.
    fn advance(&mut self, last: i64, count: u64) {
        self.cursor = Some(last);
        self.delivered += count;
        if self.held.as_ref().is_some_and(|h| h.sequence <= last) {
            self.held = None;
        }
        self.meters.delivered.increment(count);
        self.meters.cursor.set(last as f64);
    }
}

/// The consumer's metrics, labelled once per run with its project and ID (names as the
/// README's metric table lists them).
struct Meters {
    /// The `project` and `consumer` labels, for the per-class failure counters.
    labels: [(&'static str, String); 2],
    /// `outbox_events_delivered_total`: events acknowledged in order.
    delivered: metrics::Counter,
    /// `outbox_consumer_cursor`: the last acknowledged sequence.
    cursor: metrics::Gauge,
    /// `outbox_dead_letters_parked_total`: events parked.
    dead_letters: metrics::Counter,
    /// `outbox_commit_to_dispatch_seconds`: writer's transaction start to first dispatch.
    commit_to_dispatch: metrics::Histogram,
}

impl Meters {
    fn new(config: &ConsumerConfig) -> Self {
        let labels = [
            ("project", config.project_id.to_string()),
            ("consumer", config.consumer_id.to_string()),
        ];
        Self {
            delivered: metrics::counter!("outbox_events_delivered_total", &labels),
            cursor: metrics::gauge!("outbox_consumer_cursor", &labels),
            dead_letters: metrics::counter!("outbox_dead_letters_parked_total", &labels),
            commit_to_dispatch: metrics::histogram!("outbox_commit_to_dispatch_seconds"),
            labels,
        }
    }

    /// `outbox_delivery_failures_total`: failed attempts, by failure class.
    fn failure(&self, class: &FailureClass) -> metrics::Counter {
        let [project, consumer] = &self.labels;
        let labels = [
            project.clone(),
            consumer.clone(),
            ("class", class.to_string()),
        ];
        metrics::counter!("outbox_delivery_failures_total", &labels)
    }
}

/// What the read phase found after the cursor.
enum Read {
    /// Nothing new.
    Empty,
    /// The first event after the cursor is missing: history is gone.
    Gap,
    /// The first event's payload cannot be decoded; it fails with this class.
    Undecodable(Box<ObservedEvent>, FailureClass),
    /// Contiguous, decoded events, and whether more may follow at once.
    Events {
        events: Vec<ObservedEvent>,
        more: bool,
    },
}

/// A batch read ahead, on a task of its own; dropping it aborts the read.
struct Prefetch {
    /// The cursor it reads after.
    after: i64,
    handle: tokio::task::JoinHandle<Result<Batch, ConsumerError>>,
}

impl Prefetch {
    fn spawn(
        after: i64,
        read: impl Future<Output = Result<Batch, ConsumerError>> + Send + 'static,
    ) -> Self {
        Self {
            after,
            handle: tokio::spawn(read),
        }
    }

    /// The batch, or the read's error. The task is aborted only by dropping this, so a join
    /// error is a panic in the read, passed on as one.
    async fn result(mut self) -> Result<Batch, ConsumerError> {
        match (&mut self.handle).await {
            Ok(read) => read,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Whether to go round again at once.
enum Step {
    More,
    Idle,
}

impl<D: DispatchMode, R: Reconciler> Consumer<D, R> {
    /// Makes this consumer a member of the set whose hub this is.
    pub(crate) fn in_set(mut self, hub: Arc<Hub>) -> Self {
        self.hub = Some(hub);
        self
    }

    /// Whether this consumer holds its lease and when it last polled; shared with the run.
    pub fn probe(&self) -> Arc<Probe> {
        self.probe.clone()
    }

    /// Runs until `shutdown` is cancelled (then finishes or abandons the current event within
    /// the grace period, acknowledges what was handled and releases the lease), or until the
    /// lease is lost or a non-transient error occurs.
    ///
    /// On its own a consumer starts its own heartbeat, sequencer, sweep and listener; as a
    /// member of a consumer set, the set's hub renews its lease, polls and wakes it, and runs
    /// the rest once for all members.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<RunSummary, ConsumerError> {
        let hub = self.hub.as_ref();
        self.config.validate()?;
        let pool_size = self.pool.status().max_size;
        if pool_size < MIN_POOL_SIZE {
            return Err(ConfigError(format!(
                "the pool allows {pool_size} connection(s); a consumer needs at least \
                 {MIN_POOL_SIZE} (delivery, heartbeat, sequencer)"
            ))
            .into());
        }
        let statements = match hub {
            Some(hub) => hub.statements.clone(),
            None => Arc::new(Statements::new(&self.config.schema, self.config.pooler)),
        };
        // A live query given explicitly is checked before the lease is claimed, so a wrong one
        // holds nothing; the default is checked when it is first needed (a consumer that
        // replays history from the earliest event may never reconcile, and its database need
        // not have a `tasks` table). A consumer set checks it once for all its members.
        if hub.is_none() && self.config.live_query != crate::config::DEFAULT_LIVE_QUERY {
            let mut client = self.pool.get().await?;
            crate::live_query::check(&mut client, &self.config.live_query).await?;
        }
        let owner = hub.map_or_else(owner_token, |hub| hub.owner.clone());
        let Some(claimed) = lease::claim(&self.pool, &self.config, &owner, &shutdown).await? else {
            return Ok(RunSummary::default());
        };
        if claimed.created {
            tracing::info!(
                "registering new consumer {} of project {}; it holds retention until retired",
                self.config.consumer_id,
                self.config.project_id
            );
        }
        let lease = Arc::new(claimed.lease);
        let lease_labels = [
            ("project", self.config.project_id.to_string()),
            ("consumer", self.config.consumer_id.to_string()),
        ];
        self.probe.claimed(lease.fence.generation);
        metrics::gauge!("outbox_lease_held", &lease_labels).set(1.0);
        metrics::gauge!("outbox_lease_generation", &lease_labels)
            .set(lease.fence.generation as f64);
        let stop = CancellationToken::new();
        let (wiring, tasks) = match hub {
            Some(hub) => {
                let wiring = Wiring {
                    signals: hub.register(&lease),
                    polls_itself: false,
                };
                (wiring, Vec::new())
            }
            None => {
                let signals = Arc::new(Signals::default());
                let listen = self.listen_config.clone().map(|config| listener::Target {
                    config,
                    tls: self.listen_tls.clone(),
                });
                let tasks = background::spawn(
                    &self.pool,
                    listen.as_ref(),
                    &self.config,
                    &lease,
                    &statements,
                    &signals,
                    &stop,
                );
                let wiring = Wiring {
                    signals,
                    polls_itself: true,
                };
                (wiring, tasks)
            }
        };

        let mut progress = Progress {
            cursor: claimed.cursor,
            held: None,
            bounds_checked: false,
            next_replay_check: Instant::now(),
            delivered: 0,
            new_consumer: claimed.created,
            handled_through: None,
            pending: Vec::new(),
            prefetched: None,
            meters: Meters::new(&self.config),
        };
        let span = tracing::info_span!(
            "consumer",
            project = %self.config.project_id,
            consumer = %self.config.consumer_id,
            generation = lease.fence.generation,
        );
        let mut result = self
            .deliver_loop(&lease, &statements, &wiring, &shutdown, &mut progress)
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
        if let Some(hub) = hub {
            hub.unregister(&lease);
        }
        if !matches!(result, Err(ConsumerError::LeaseLost { .. })) {
            lease::release(&self.pool, &lease, &statements.release).await;
        }
        self.probe.released();
        metrics::gauge!("outbox_lease_held", &lease_labels).set(0.0);
        result.map(|()| RunSummary {
            generation: lease.fence.generation,
            delivered: progress.delivered,
            cursor: progress.cursor,
        })
    }

    async fn deliver_loop(
        &self,
        lease: &Lease,
        statements: &Statements,
        wiring: &Wiring,
        shutdown: &CancellationToken,
        progress: &mut Progress,
    ) -> Result<(), ConsumerError> {
        let mut failures: u32 = 0;
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            if lease.is_valid() {
                match self
                    .step(lease, statements, wiring, shutdown, progress)
                    .await
                {
                    Ok(Step::More) => {
                        self.probe.polled();
                        failures = 0;
                        continue;
                    }
                    Ok(Step::Idle) => {
                        self.probe.polled();
                        failures = 0;
                        if self.config.exit_when_caught_up
                            && self
                                .caught_up(lease, statements, wiring, shutdown, progress)
                                .await?
                        {
                            tracing::info!(cursor = ?progress.cursor, "caught up; stopping");
                            return Ok(());
                        }
                    }
                    Err(e @ ConsumerError::LeaseLost { .. }) => return Err(e),
                    Err(e) if e.is_retryable() => {
                        failures = failures.saturating_add(1);
                        progress.bounds_checked = false;
                        progress.pending.clear();
                        let delay = background::backoff(failures, rand::random());
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
            // In a set nothing needs a timer of its own while idle: the hub's poll wakes it.
            let poll = match wiring.polls_itself {
                true => self.fallback_poll(&wiring.signals),
                false => NO_POLL,
            };
            let mut deadline = Instant::now() + poll;
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
                _ = wiring.signals.wake.notified() => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// One round: settle a missing cursor or an unacknowledged prefix first, then check the
    /// cursor's bounds (once per (re)start), serve replay requests, and deliver the next batch.
    async fn step(
        &self,
        lease: &Lease,
        statements: &Statements,
        wiring: &Wiring,
        shutdown: &CancellationToken,
        progress: &mut Progress,
    ) -> Result<Step, ConsumerError> {
        let Some(cursor) = progress.cursor else {
            self.start_without_cursor(lease, statements, progress)
                .await?;
            return Ok(Step::More);
        };
        if progress.handled_through.is_some() {
            self.ack_handled(lease, statements, progress).await?;
            return Ok(Step::More);
        }
        if !progress.bounds_checked {
            if let Some(reason) = self
                .check_bounds(lease, statements, progress, cursor)
                .await?
            {
                self.reconcile(lease, statements, progress, reason).await?;
                return Ok(Step::More);
            }
        }
        if wiring.polls_itself && Instant::now() >= progress.next_replay_check {
            progress.next_replay_check = Instant::now() + self.fallback_poll(&wiring.signals);
            wiring.signals.replay_due.store(true, Ordering::Relaxed);
        }
        if wiring.signals.replay_due.swap(false, Ordering::Relaxed) {
            self.replay_requested(lease, statements, shutdown).await?;
        }
        if let Some(held) = &progress.held {
            let wait = held.ready_at.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                if progress.pending.is_empty() || wait > PRECISE_WAIT {
                    return Ok(Step::Idle);
                }
                precise_wait(held.ready_at).await;
            }
        }
        if let Some(events) = take_pending(progress, cursor) {
            return self
                .dispatch_batch(lease, statements, shutdown, progress, events, true)
                .await;
        }
        match self.read_batch(statements, progress, cursor).await? {
            Read::Empty => Ok(Step::Idle),
            Read::Gap => {
                self.reconcile(lease, statements, progress, ReconcileReason::GapInHistory)
                    .await?;
                Ok(Step::More)
            }
            Read::Undecodable(event, class) => {
                self.fail(lease, statements, progress, &event, class)
                    .await?;
                Ok(Step::More)
            }
            Read::Events { events, more } => {
                self.dispatch_batch(lease, statements, shutdown, progress, events, more)
                    .await
            }
        }
    }

    /// Bounds check: a cursor below the retention floor or above the head means history is
    /// missing (reconcile); otherwise loads the saved retry state of the next event.
    async fn check_bounds(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        cursor: i64,
    ) -> Result<Option<ReconcileReason>, ConsumerError> {
        let client = self.pool.get().await?;
        let project = self.config.project_id.as_str();
        let (head, floor) = store::bounds(&**client, statements, project).await?;
        if cursor < floor {
            return Ok(Some(ReconcileReason::BelowRetentionFloor));
        }
        if cursor > head {
            return Ok(Some(ReconcileReason::AboveHead));
        }
        progress.held = store::load_held(&**client, statements, lease, cursor).await?;
        progress.bounds_checked = true;
        Ok(None)
    }

    /// Read and decode: the contiguous run of events after `cursor`, up to the first
    /// undecodable one (which is delivered on its own, as a failure, when it comes first).
    async fn read_batch(
        &self,
        statements: &Statements,
        progress: &mut Progress,
        cursor: i64,
    ) -> Result<Read, ConsumerError> {
        let project = &self.config.project_id;
        let consumer = &self.config.consumer_id;
        let limit = self.config.batch_size;
        // A batch read ahead may predate events numbered since: read again at once after it.
        let mut read_ahead = false;
        let Batch {
            events: decoded,
            full,
        } = match &self.hub {
            Some(hub) => {
                hub.reads
                    .read(&self.pool, statements, project, consumer, cursor, limit)
                    .await?
            }
            None => {
                let read = match progress.prefetched.take() {
                    Some(prefetch) if prefetch.after == cursor => {
                        let ahead = prefetch.result().await?;
                        if ahead.events.is_empty() {
                            // Nothing was there then; something may be now.
                            self.read_alone(statements, cursor).await?
                        } else {
                            read_ahead = true;
                            ahead
                        }
                    }
                    // Read after another cursor (a failure or a reconciliation came between):
                    // dropped, which aborts it.
                    _ => self.read_alone(statements, cursor).await?,
                };
                // A full batch: read the next one while this one is dispatched and
                // acknowledged. Events never change once numbered, and the retention floor
                // never passes this consumer's cursor, so the copy cannot go stale.
                if read.full {
                    if let Some((last, _)) = read.events.last() {
                        let next = self.read_alone(statements, last.sequence);
                        progress.prefetched = Some(Prefetch::spawn(last.sequence, next));
                    }
                }
                read
            }
        };
        if decoded.is_empty() {
            return Ok(Read::Empty);
        }
        let read = decoded.len();
        let mut events = Vec::with_capacity(read);
        for (index, (mut event, undecodable)) in decoded.into_iter().enumerate() {
            let sequence = event.sequence;
            if sequence != cursor + 1 + index as i64 {
                if index == 0 {
                    tracing::error!(
                        cursor,
                        next = sequence,
                        "gap after the cursor in retained history"
                    );
                    return Ok(Read::Gap);
                }
                break;
            }
            event.attempt = match &progress.held {
                Some(held) if held.sequence == sequence => held.attempts + 1,
                _ => 1,
            };
            if let Some(class) = undecodable {
                // Deliver what precedes it; the undecodable event then fails on its own.
                if events.is_empty() {
                    return Ok(Read::Undecodable(Box::new(event), class));
                }
                break;
            }
            events.push(event);
        }
        for event in events.iter().filter(|e| e.attempt == 1) {
            // Writer's transaction start to dispatch (which follows this read), on this
            // host's clock. Retries and events kept across a retry wait are not counted again.
            let waited = (chrono::Utc::now() - event.occurred_at).num_microseconds();
            progress
                .meters
                .commit_to_dispatch
                .record(waited.unwrap_or(0).max(0) as f64 / 1e6);
        }
        // Go round again at once after a full batch, one cut short by an undecodable event, or
        // one read ahead.
        let more = full || events.len() < read || read_ahead;
        Ok(Read::Events { events, more })
    }

    /// One batch after `cursor` for a lone consumer (a set's members read through its hub), as
    /// a future that owns what it needs, so that it can also run ahead as a [`Prefetch`].
    fn read_alone(
        &self,
        statements: &Statements,
        cursor: i64,
    ) -> impl Future<Output = Result<Batch, ConsumerError>> + Send + 'static {
        let (read_batch, cached) = (statements.read_batch.clone(), statements.cached);
        let pool = self.pool.clone();
        let (project, consumer) = (
            self.config.project_id.clone(),
            self.config.consumer_id.clone(),
        );
        let limit = self.config.batch_size;
        async move {
            let client = pool.get().await?;
            let rows = store::query_hot(
                &client,
                cached,
                &read_batch,
                &[&project.as_str(), &cursor, &limit],
            )
            .await?;
            drop(client);
            let events = rows
                .iter()
                .map(|row| store::decode(row, &project, &consumer, false, 1))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Batch {
                full: events.len() as i64 == limit,
                events,
            })
        }
    }

    /// Dispatch: hands the events to the dispatch mode, acknowledges the handled prefix and
    /// records a failure of the event after it: a failure to be retried in the same statement
    /// as the acknowledgement, keeping the rest of the batch in memory for the retry. `more`:
    /// go round again at once when every event was handled.
    async fn dispatch_batch(
        &self,
        lease: &Lease,
        statements: &Statements,
        shutdown: &CancellationToken,
        progress: &mut Progress,
        mut events: Vec<ObservedEvent>,
        more: bool,
    ) -> Result<Step, ConsumerError> {
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
        let retry_in = match (&failure, events.get(handled)) {
            (Some(_), Some(event)) => self.config.retry.delay_after(event.attempt),
            _ => None,
        };
        if handled > 0 {
            let last = events[handled - 1].sequence;
            if acked {
                progress.advance(last, handled as u64);
            } else {
                progress.handled_through = Some((last, handled as u64));
                if retry_in.is_none() {
                    self.ack_handled(lease, statements, progress).await?;
                }
            }
        }
        if let Some(class) = failure {
            let rest = events.split_off(handled.min(events.len()));
            match (retry_in, progress.cursor, rest.first()) {
                (Some(delay), Some(cursor), Some(_)) => {
                    self.retry_later(lease, statements, progress, cursor, rest, class, delay)
                        .await?
                }
                (_, _, Some(event)) => {
                    self.ack_handled(lease, statements, progress).await?;
                    self.fail(lease, statements, progress, event, class).await?
                }
                (_, _, None) => {}
            }
            return Ok(Step::More);
        }
        if handled < events.len() {
            // Stopped by shutdown or an invalid lease: the loop decides what happens next.
            return Ok(Step::Idle);
        }
        Ok(if more { Step::More } else { Step::Idle })
    }

    /// Saves a failed attempt to be retried after `delay` in the same statement as the
    /// acknowledgement of what was handled before it, and keeps `rest` (the failed event
    /// first) for the retry. The delay counts from the failure, so the write overlaps it.
    #[allow(clippy::too_many_arguments)]
    async fn retry_later(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        cursor: i64,
        rest: Vec<ObservedEvent>,
        class: FailureClass,
        delay: Duration,
    ) -> Result<(), ConsumerError> {
        let failed_at = Instant::now();
        let Some(event) = rest.first() else {
            return Ok(());
        };
        let through = progress.handled_through.map_or(cursor, |(last, _)| last);
        let attempts = event.attempt;
        {
            let client = self.pool.get().await?;
            store::ack_and_retry(
                &client, statements, lease, through, event, attempts, &class, delay,
            )
            .await?;
        }
        if let Some((last, count)) = progress.handled_through.take() {
            progress.advance(last, count);
        }
        progress.meters.failure(&class).increment(1);
        tracing::warn!(
            sequence = event.sequence, event_id = %event.event_id, attempts,
            class = %class, retry_in = ?delay, "event failed; will retry"
        );
        progress.held = Some(Held {
            sequence: event.sequence,
            attempts,
            ready_at: failed_at + delay,
        });
        progress.pending = rest;
        Ok(())
    }

    /// Whether everything committed so far is handled: numbers what has committed (another
    /// process may be doing that at the same moment: then nothing of the project may still be
    /// waiting for a number), then finds nothing more to read and no failed event waiting for
    /// its retry.
    async fn caught_up(
        &self,
        lease: &Lease,
        statements: &Statements,
        wiring: &Wiring,
        shutdown: &CancellationToken,
        progress: &mut Progress,
    ) -> Result<bool, ConsumerError> {
        if progress.held.is_some() || progress.handled_through.is_some() {
            return Ok(false);
        }
        {
            let mut client = self.pool.get().await?;
            if self.config.sequence_interval.is_some() {
                Sequencer::new(&self.config.schema)
                    .drain(&mut client)
                    .await?;
            }
            let waiting: bool = client
                .query_one_unnamed(
                    &statements.has_unsequenced,
                    &[&self.config.project_id.as_str()],
                )
                .await?
                .try_get("waiting")?;
            if waiting {
                return Ok(false);
            }
        }
        if let Some(hub) = &self.hub {
            // What the drain just numbered is announced later; the read below must not trust
            // a shared copy from before it.
            hub.reads.signal(self.config.project_id.as_str());
        }
        Ok(matches!(
            self.step(lease, statements, wiring, shutdown, progress)
                .await?,
            Step::Idle
        ) && progress.held.is_none()
            && progress.handled_through.is_none())
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
        let clears_retry = held.is_some_and(|held| held <= through);
        let grouped = match &self.hub {
            Some(hub) if !clears_retry => hub.acks.ack(&lease.fence, through).await,
            _ => None,
        };
        match grouped {
            Some(true) => {}
            Some(false) => {
                let client = self.pool.get().await?;
                return Err(lease.lose_after_rejection(&**client).await);
            }
            None => {
                let mut client = self.pool.get().await?;
                store::ack(&mut client, statements, lease, held, through).await?;
            }
        }
        progress.handled_through = None;
        progress.advance(through, count);
        Ok(())
    }

    /// Saves a failed attempt of `event` (the one after the cursor).
    async fn fail(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        event: &ObservedEvent,
        class: FailureClass,
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
        progress.meters.failure(&class).increment(1);
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
                progress.meters.dead_letters.increment(1);
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
        // The run then ends with the error, releasing its lease.
        crate::live_query::check(&mut client, &self.config.live_query).await?;
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
        let task_ids = crate::live_query::task_ids(&*tx, &self.config.live_query, project).await?;
        tx.commit().await?;
        drop(client);
        let live = LiveSet {
            project_id: project.to_owned(),
            task_ids,
            head_sequence: head,
            reason,
        };
        if let Err(failure) = outbox_core::observe(self.reconciler.reconcile(&live)).await {
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
            let attempts: i32 = row.try_get("attempts")?;
            let attempt = attempts.max(0) as u32 + 1;
            let (event, undecodable) = store::decode(&row, project, consumer, true, attempt)?;
            if let Some(class) = undecodable {
                let mut client = self.pool.get().await?;
                let tx = client.transaction().await?;
                store::lock_fence(&tx, statements, lease).await?;
                store::record_replay(&tx, statements, lease, &event, &Err(class.into())).await?;
                tx.commit().await?;
                continue;
            }
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

/// How many times slower a lone consumer's fallback poll is while its LISTEN connection is up:
/// idle, it is most of what a consumer process sends the database.
pub const LISTENING_POLL_FACTOR: u32 = 5;

/// How long an idle member of a set waits with no wake-up at all: in effect forever, since
/// the set's hub polls every project's head on the set's behalf and wakes whoever needs it.
const NO_POLL: Duration = Duration::from_secs(24 * 60 * 60);

/// Retry waits at most this long are slept precisely (and without going back round the
/// loop) when the rest of the batch is in memory: tokio's timers fire on whole milliseconds,
/// which would nearly double a 1 ms retry delay.
const PRECISE_WAIT: Duration = Duration::from_millis(2);

/// The last stretch of a precise wait, spent yielding rather than asleep: the OS wakes a
/// sleeping thread some tens of microseconds late (its timer slack), which at a 1 ms delay
/// is several per cent of the wait.
const SPIN: Duration = Duration::from_micros(100);

/// Waits until `until` (at most [`PRECISE_WAIT`] away) on a blocking thread, to within a few
/// microseconds rather than to the next millisecond tick.
async fn precise_wait(until: Instant) {
    let deadline = until.into_std();
    let waited = tokio::task::spawn_blocking(move || {
        let now = std::time::Instant::now();
        let left = deadline.saturating_duration_since(now).min(PRECISE_WAIT);
        if let Some(asleep) = left.checked_sub(SPIN) {
            std::thread::sleep(asleep);
        }
        let deadline = now + left;
        while std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
    })
    .await;
    if waited.is_err() {
        tokio::time::sleep_until(until).await;
    }
}

/// The kept rest of a batch, if it still starts right after `cursor`, with the first event's
/// attempt number brought up to date; a kept rest that no longer fits is dropped.
fn take_pending(progress: &mut Progress, cursor: i64) -> Option<Vec<ObservedEvent>> {
    let mut events = std::mem::take(&mut progress.pending);
    let first = events.first_mut()?;
    if first.sequence != cursor + 1 {
        return None;
    }
    first.attempt = match &progress.held {
        Some(held) if held.sequence == first.sequence => held.attempts + 1,
        _ => 1,
    };
    Some(events)
}

/// Names this process run in `lease_owner`: host, PID and a random suffix. It identifies a
/// lease holder, never the consumer (whose ID is explicit and stable).
pub(crate) fn owner_token() -> String {
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
