//! The delivery loop: round after round, each settling what comes first (a missing cursor, an
//! unacknowledged prefix, the bounds check, replay requests, a retry wait) and then
//! delivering the next batch; in between it waits for a wake-up, the poll or a retry.
//!
//! Every phase reports a transient failure as a retryable [`ConsumerError`];
//! [`Consumer::after_failure`] is the one place that decides whether the loop waits and tries
//! again or the run ends.

use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox_core::internal::Unnamed as _;
use outbox_core::sequencer::Sequencer;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::batch::Step;
use super::failures::{self, PRECISE_WAIT};
use super::membership::Joined;
use super::position::Read;
use super::progress::Progress;
use super::{Consumer, LISTENING_POLL_FACTOR};
use crate::dispatch::DispatchMode;
use crate::error::ConsumerError;
use crate::handler::{ReconcileReason, Reconciler};
use crate::lease::Lease;
use crate::outage;
use crate::signals::Signals;
use crate::store::Statements;

/// How long an idle member of a set waits with no wake-up at all: in effect forever, since
/// the set's shared poll reads every project's head on the set's behalf and wakes whoever needs it.
const NO_POLL: Duration = Duration::from_secs(24 * 60 * 60);

/// What the loop does after a failed round.
enum AfterFailure {
    /// Wait this long, then go round again.
    Wait(Duration),
    /// End the run with this error.
    Exit(ConsumerError),
}

/// What a wait ended with.
enum Woken {
    /// Time to go round again.
    Again,
    /// The run ends: `Ok` at shutdown, `Err` when the lease is lost.
    Exit(Result<(), ConsumerError>),
}

impl<D: DispatchMode, R: Reconciler> Consumer<D, R> {
    pub(super) async fn deliver_loop(
        &self,
        lease: &Lease,
        statements: &Statements,
        joined: &Joined,
        shutdown: &CancellationToken,
        progress: &mut Progress,
    ) -> Result<(), ConsumerError> {
        let mut failures: u32 = 0;
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            // Whether this round succeeded: the wait below is then an idle one, which the
            // readiness probe of a set's member counts the set's shared polls for.
            let mut settled = false;
            if lease.is_valid() {
                let round = match self
                    .step(lease, statements, joined, shutdown, progress)
                    .await
                {
                    Ok(step) => {
                        self.probe.polled();
                        failures = 0;
                        if step == Step::More {
                            continue;
                        }
                        // A failed caught-up check is a failed round like any other.
                        match self.config.delivery.exit_when_caught_up {
                            false => Ok(()),
                            true => match self
                                .caught_up(lease, statements, joined, shutdown, progress)
                                .await
                            {
                                Ok(false) => Ok(()),
                                Ok(true) => {
                                    let cursor =
                                        crate::cursor::ShownCursor(progress.position.cursor());
                                    tracing::info!(cursor = %cursor, "caught up; stopping");
                                    return Ok(());
                                }
                                Err(e) => Err(e),
                            },
                        }
                    }
                    Err(e) => Err(e),
                };
                if let Err(e) = round {
                    let e = match e {
                        ConsumerError::SinkDiverged { position, identity } => match self
                            .sink_diverged(lease, statements, progress, position, identity)
                            .await
                        {
                            Ok(()) => continue,
                            Err(e) => e,
                        },
                        e => e,
                    };
                    failures = failures.saturating_add(1);
                    let delay = match self.after_failure(e, failures, progress) {
                        AfterFailure::Exit(e) => return Err(e),
                        AfterFailure::Wait(delay) => delay,
                    };
                    let availability = &self.config.duties.availability;
                    match wait(lease, shutdown, availability, None, Instant::now() + delay).await {
                        Woken::Again => continue,
                        Woken::Exit(result) => return result,
                    }
                }
                settled = true;
            }
            self.probe.idle(settled);
            let woken = wait(
                lease,
                shutdown,
                &self.config.duties.availability,
                Some(&joined.signals),
                self.idle_until(joined, progress, lease),
            )
            .await;
            self.probe.idle(false);
            match woken {
                Woken::Again => {}
                Woken::Exit(result) => return result,
            }
        }
    }

    /// The one decision after a failed round: a lost lease or a non-transient error ends the
    /// run; a transient one (database unreachable, a statement cut off, a reconciler that
    /// failed) waits by the crate's backoff and checks the cursor's bounds again.
    fn after_failure(
        &self,
        e: ConsumerError,
        failures: u32,
        progress: &mut Progress,
    ) -> AfterFailure {
        if let ConsumerError::CursorMoved { .. } = e {
            // A conditional acknowledgement found the cursor moved: nothing handled since is
            // acknowledged; the position check that follows finds the divergence.
            tracing::warn!(error = %e, "acknowledgement refused; checking the position");
            progress.bounds_checked = false;
            progress.forget_after_cursor();
            progress.prefetched = None;
            return AfterFailure::Wait(Duration::ZERO);
        }
        if matches!(e, ConsumerError::LeaseLost { .. }) || !e.is_retryable() {
            return AfterFailure::Exit(e);
        }
        progress.bounds_checked = false;
        progress.position.drop_pending();
        progress.lanes = None;
        if outage::is_outage(&e) {
            // Said once for the whole process (`outage`), not once per round.
            if let Err(gave_up) = self.config.duties.availability.unreachable(&e) {
                return AfterFailure::Exit(gave_up);
            }
            return AfterFailure::Wait(crate::backoff::outage_backoff(failures));
        }
        let delay = crate::backoff::backoff(failures, rand::random());
        tracing::warn!(error = %e, retry_in = %outbox_core::internal::Readable(delay), "transient failure; will retry");
        AfterFailure::Wait(delay)
    }

    /// When an idle loop goes round again without a wake-up: at the fallback poll (a lone
    /// consumer; a set's shared poll wakes its members), the held event's retry, or soon while
    /// the lease is not known to be valid.
    fn idle_until(&self, joined: &Joined, progress: &Progress, lease: &Lease) -> Instant {
        let poll = match joined.polls_itself {
            true => self.fallback_poll(&joined.signals),
            false => NO_POLL,
        };
        let mut deadline = Instant::now() + poll;
        if let Some(held) = progress.position.held() {
            deadline = deadline.min(held.ready_at);
        }
        if let Some(retry) = progress.lanes.as_ref().and_then(|w| w.next_ready_at()) {
            deadline = deadline.min(retry);
        }
        if !lease.is_valid() {
            // Renewals are failing (database unreachable?): wait for one to succeed or for
            // the loss to be confirmed, dispatching nothing meanwhile.
            deadline = deadline.min(Instant::now() + Duration::from_millis(100));
        }
        deadline
    }

    /// How long a lone consumer waits for a wake-up before it polls: the poll interval, or
    /// [`LISTENING_POLL_FACTOR`] times that while its listener is connected (the notifications
    /// then carry the news; a dead listener connection is found by its ping within seconds,
    /// and the reconnect wakes the loop).
    fn fallback_poll(&self, signals: &Signals) -> Duration {
        match signals.listening.load(Ordering::Relaxed) {
            true => self.config.delivery.poll_interval * LISTENING_POLL_FACTOR,
            false => self.config.delivery.poll_interval,
        }
    }

    /// One round: settle a missing cursor or an unacknowledged prefix first, then check the
    /// cursor's bounds (once per (re)start), serve replay requests, and deliver the next batch.
    async fn step(
        &self,
        lease: &Lease,
        statements: &Statements,
        joined: &Joined,
        shutdown: &CancellationToken,
        progress: &mut Progress,
    ) -> Result<Step, ConsumerError> {
        let Some(cursor) = progress.position.cursor() else {
            self.start_without_cursor(lease, statements, progress, shutdown)
                .await?;
            return Ok(Step::More);
        };
        if self.heal(lease, statements, progress, shutdown).await? {
            return Ok(Step::More);
        }
        if progress.position.handled().is_some() {
            self.ack_handled(lease, statements, progress).await?;
            return Ok(Step::More);
        }
        if !progress.bounds_checked {
            if let Some(reason) = self
                .check_position(lease, statements, progress, cursor)
                .await?
            {
                self.reconcile(lease, statements, progress, reason, shutdown)
                    .await?;
                return Ok(Step::More);
            }
        }
        if joined.polls_itself && Instant::now() >= progress.next_replay_check {
            progress.next_replay_check = Instant::now() + self.fallback_poll(&joined.signals);
            joined.signals.replay_due.store(true, Ordering::Relaxed);
        }
        if joined.signals.replay_due.swap(false, Ordering::Relaxed) {
            self.replay_requested(lease, statements, shutdown).await?;
        }
        if self.config.delivery.lanes > 1 {
            return self
                .lanes_round(
                    lease,
                    statements,
                    &joined.signals,
                    shutdown,
                    progress,
                    cursor,
                )
                .await;
        }
        if let Some(held) = progress.position.held() {
            let wait = held.ready_at.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                if !progress.position.has_pending() || wait > PRECISE_WAIT {
                    return Ok(Step::Idle);
                }
                failures::precise_wait(held.ready_at).await;
            }
        }
        if let Some(events) = progress.position.take_pending() {
            return self
                .dispatch_batch(lease, statements, shutdown, progress, events, true)
                .await;
        }
        let Some(read) = self.read_batch(statements, progress, cursor).await? else {
            return Ok(Step::More);
        };
        match read {
            (Read::Empty, _) => Ok(Step::Idle),
            (Read::Gap, _) => {
                let reason = ReconcileReason::GapInHistory;
                self.reconcile(lease, statements, progress, reason, shutdown)
                    .await?;
                Ok(Step::More)
            }
            (Read::Undecodable(event, class), _) => {
                self.fail(lease, statements, progress, &event, class)
                    .await?;
                Ok(Step::More)
            }
            (Read::Events { events, .. }, more) => {
                self.dispatch_batch(lease, statements, shutdown, progress, events, more)
                    .await
            }
        }
    }

    /// Whether everything committed so far is handled: numbers what has committed (another
    /// process may be doing that at the same moment: then nothing of the project may still be
    /// waiting for a number), then finds nothing more to read and no failed event waiting for
    /// its retry.
    async fn caught_up(
        &self,
        lease: &Lease,
        statements: &Statements,
        joined: &Joined,
        shutdown: &CancellationToken,
        progress: &mut Progress,
    ) -> Result<bool, ConsumerError> {
        if !progress.is_settled() {
            return Ok(false);
        }
        {
            let mut client = self.pool.get().await?;
            if self.config.duties.sequence_interval.is_some() {
                Sequencer::new(&self.config.duties.schema)
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
        // What the drain just numbered is announced later; the read below must not trust a
        // shared copy from before it.
        self.membership.numbered(&self.config.project_id);
        Ok(self
            .step(lease, statements, joined, shutdown, progress)
            .await?
            == Step::Idle
            && progress.is_settled())
    }
}

/// The loop's one wait: until `deadline`, a wake-up (when `signals` are given), shutdown
/// (the run ends cleanly), the loss of the lease, or the process giving up on an
/// unavailable database.
async fn wait(
    lease: &Lease,
    shutdown: &CancellationToken,
    availability: &crate::outage::Availability,
    signals: Option<&Signals>,
    deadline: Instant,
) -> Woken {
    let woken = async {
        match signals {
            Some(signals) => signals.wake.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => Woken::Exit(Ok(())),
        _ = lease.lost() => Woken::Exit(Err(lease.lost_error())),
        () = availability.given_up() => {
            Woken::Exit(Err(availability.gave_up_error()))
        }
        _ = woken => Woken::Again,
        _ = tokio::time::sleep_until(deadline) => Woken::Again,
    }
}
