//! Lanes: several events of one project handled at once, each key's (task's) events one at a
//! time and in sequence order ([`DeliverySettings::lanes`](crate::DeliverySettings::lanes)).
//!
//! One round reads ahead of the cursor, at most `max_ahead` events, into the [`Window`],
//! starts the first event of up to `lanes` keys, and as each ends starts the next one its key
//! or another key has. A failed event is saved for its retry on the fixed schedule and holds
//! its key (its later events wait) and the cursor, not the other keys; after its last attempt
//! it is parked where it stands. The cursor moves, in the one acknowledgement statement of
//! the single lane, to the highest sequence with every event at or before it handled or
//! parked. A round ends when nothing may start and nothing runs, so replay requests, the
//! position check and reconciliation run between rounds as they do between batches, with no
//! handler running.
//!
//! With one lane none of this runs: the loop dispatches batches as it always has.

mod ack;
mod ahead;
mod window;

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use futures_util::stream::{FuturesOrdered, FuturesUnordered};
use futures_util::{FutureExt as _, StreamExt as _};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Consumer;
use super::batch::Step;
use super::fetch;
use super::progress::Progress;
use crate::dispatch::{DispatchMode, LaneContext, triage};
use crate::error::ConsumerError;
use crate::event::{FailureClass, HandlerFailure, ObservedEvent};
use crate::handler::{ReconcileReason, Reconciler};
use crate::lease::Lease;
use crate::signals::Signals;
use crate::store::{self, Batch, Statements};
use ack::{Ack, finish_ack};
pub(super) use ahead::Ahead;
use ahead::Taken;
use window::Finished;
use window::Window;

/// How many times `max_ahead` (or `max_batch_size`, if larger) one round reads at most before
/// it lets the loop go round (to look for replay requests and check the lease) once what runs
/// has ended. A budget of one read would leave no read on its way while the lanes work.
const ROUND_READS: i64 = 4;

/// How long an event whose handler gave up without failing (not at shutdown) waits before
/// it is tried again, uncounted.
const AGAIN_AFTER: Duration = Duration::from_millis(100);

/// At most this often the lanes acknowledge a prefix shorter than a batch while some lanes
/// have nothing to do, so that events handled long ago do not wait behind a slow one, nor
/// does every event pay for a write of its own when events trickle in.
const ACK_PAUSE: Duration = Duration::from_millis(20);

/// At most this often the lanes record how far they have handled beyond a cursor that does
/// not move (a slow or failing event holds it), for `status` to show the gap.
const MARK_EVERY: Duration = Duration::from_millis(500);

/// How soon a lane loop whose lease is not known to be valid looks at it again.
const LEASE_RECHECK: Duration = Duration::from_millis(100);

/// An acknowledgement being written.
type Writing<'a> = Pin<Box<dyn Future<Output = Result<(), ConsumerError>> + Send + 'a>>;

/// A read ahead of the window, and its size.
type Reading = Pin<Box<dyn Future<Output = Result<(Batch, i64), ConsumerError>> + Send>>;

/// Reads in flight at once: the next is on its way while one is decoded and dispatched.
const READS_AHEAD: usize = 2;

impl<D: DispatchMode, R: Reconciler> Consumer<D, R> {
    /// One round of the lanes after `cursor` (see the module docs).
    pub(super) async fn lanes_round(
        &self,
        lease: &Lease,
        statements: &Statements,
        signals: &Signals,
        shutdown: &CancellationToken,
        progress: &mut Progress,
        cursor: i64,
    ) -> Result<Step, ConsumerError> {
        let max_ahead = self.config.delivery.max_ahead;
        let mut ahead = match progress.lanes.take() {
            Some(ahead) if ahead.window.cursor() == cursor => ahead,
            _ => {
                // Starting over from the cursor: what failed or was parked ahead of it is
                // in the database.
                let client = self.pool.get().await?;
                let known =
                    store::load_retries(&**client, statements, lease, cursor, cursor + max_ahead)
                        .await?;
                let receipts = match self.dispatch.keeps_receipts() {
                    true => store::load_receipts(&**client, statements, lease, cursor).await?,
                    false => Default::default(),
                };
                Ahead {
                    window: Window::new(cursor, known, receipts),
                    pending: VecDeque::new(),
                    read_size: self.config.delivery.batch_size,
                }
            }
        };
        // On an error the window is dropped with whatever ran: the next round starts over
        // from the cursor (a plain handler is at least once).
        let outcome = self
            .drive(lease, statements, signals, shutdown, progress, &mut ahead)
            .await?;
        progress.meters.lanes_busy(0);
        progress.meters.ahead_of_cursor(ahead.window.settled());
        match outcome {
            Ended::Gap => {
                drop(ahead);
                self.reconcile(
                    lease,
                    statements,
                    progress,
                    ReconcileReason::GapInHistory,
                    shutdown,
                )
                .await?;
                Ok(Step::More)
            }
            Ended::StartOver => Ok(Step::More),
            Ended::Round(step) => {
                progress.lanes = Some(ahead);
                Ok(step)
            }
        }
    }

    /// Runs the window until nothing may start and nothing runs (or shutdown's grace ends).
    async fn drive(
        &self,
        lease: &Lease,
        statements: &Statements,
        signals: &Signals,
        shutdown: &CancellationToken,
        progress: &mut Progress,
        ahead: &mut Ahead,
    ) -> Result<Ended, ConsumerError> {
        let Ahead {
            window,
            pending,
            read_size,
        } = ahead;
        let settings = &self.config.delivery;
        let (lanes, max_ahead) = (settings.lanes, settings.max_ahead);
        let ack_every = (settings.batch_size as usize)
            .min(max_ahead as usize / 2)
            .max(1);
        let lane = LaneContext {
            pool: &self.pool,
            lease,
            statements,
        };
        let mut running = FuturesUnordered::new();
        // Handlers that ended while the loop waited on something else, to settle.
        let mut ended = Vec::new();
        // Reads in flight, in order, each with its size: up to `READS_AHEAD`, so the next one
        // is on its way while one is decoded.
        let mut reading: FuturesOrdered<Reading> = FuturesOrdered::new();
        let mut requested: i64 = 0;
        // Events read but not yet in the window, with those asked for: up to `READS_AHEAD`
        // reads of the largest size, as one lane holds.
        let read_ahead = READS_AHEAD as i64 * settings.max_batch_size;
        let mut more_to_read = true;
        let mut read_budget = ROUND_READS * max_ahead.max(settings.max_batch_size);
        let mut gap = false;
        let mut unchecked = false;
        let mut grace_ends: Option<Instant> = None;
        let mut last_ack = Instant::now();
        // The acknowledgement being written while the lanes go on, and the events it covers.
        let mut acking: Option<Writing<'_>> = None;
        let mut acking_count: usize = 0;
        // Set when the handler's `before_ack_prefix` failed: nothing more starts, and once the
        // handlers running have ended the lanes start over from the cursor.
        let mut starting_over = false;
        // How far beyond the cursor the database knows the lanes have handled.
        let mut recorded_through = window.cursor();
        loop {
            if starting_over && running.is_empty() && acking.is_none() {
                return Ok(Ended::StartOver);
            }
            let stopping = shutdown.is_cancelled() || !lease.is_valid() || starting_over;
            if stopping {
                reading.clear();
                requested = 0;
                if shutdown.is_cancelled() && grace_ends.is_none() {
                    grace_ends = Some(Instant::now() + settings.shutdown_grace);
                }
            } else {
                if unchecked && acking.is_none() {
                    // A read came over a connection opened since the position was checked:
                    // the check runs now, not once the handlers running have ended (a slow
                    // one would hold every other task meanwhile).
                    let cursor = progress.position.cursor().unwrap_or(window.cursor());
                    let check = self.check_position(lease, statements, progress, cursor);
                    if let Some(reason) = alongside(&mut running, &mut ended, check).await? {
                        progress.must_reconcile = Some(reason);
                        return Ok(Ended::StartOver);
                    }
                    if progress.position.cursor() != Some(window.cursor()) {
                        return Ok(Ended::StartOver);
                    }
                    unchecked = false;
                    more_to_read = true;
                }
                while let Some((event, result)) = ended.pop() {
                    if let Some(saving) =
                        self.settle(lease, statements, progress, window, event, result?)
                    {
                        alongside(&mut running, &mut ended, saving).await?;
                    }
                }
                if read_budget > 0 || !reading.is_empty() {
                    // Once the round has read its share, what was read waits for the next
                    // round, which starts with it while its first read is on its way.
                    let room = window.room(max_ahead - acking_count as i64);
                    self.admit(progress, window, pending, room);
                }
                window.release_due(Instant::now());
                while running.len() < lanes {
                    let Some((event, undecodable)) = window.start() else {
                        break;
                    };
                    let mut handling = Box::pin(self.run_one(&lane, event, undecodable));
                    // A handler that finishes at once (a fast one) is settled here, without
                    // a trip through the set of running ones.
                    match (&mut handling).now_or_never() {
                        Some((event, result)) => {
                            if let Some(saving) =
                                self.settle(lease, statements, progress, window, event, result?)
                            {
                                alongside(&mut running, &mut ended, saving).await?;
                            }
                        }
                        None => running.push(handling),
                    }
                }
                progress.meters.lanes_busy(running.len());
                let room = window.room(max_ahead - acking_count as i64) + read_ahead
                    - pending.len() as i64
                    - requested;
                // A read of the full size or none: a read costs about as much to ask for as to
                // receive a thousand events.
                if reading.len() < READS_AHEAD
                    && more_to_read
                    && room >= *read_size
                    && read_budget > 0
                {
                    let limit = *read_size;
                    let after = window.read_through() + pending.len() as i64 + requested;
                    requested += limit;
                    let read = fetch::after(
                        &self.pool,
                        statements,
                        &self.config.project_id,
                        &self.config.consumer_id,
                        after,
                        limit,
                    );
                    // On a task of its own: the rows are decoded beside the lanes, not between
                    // them. Dropped (a read not used), the task is aborted.
                    let read = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(read));
                    reading.push_back(Box::pin(async move {
                        match read.await {
                            Ok(batch) => batch.map(|batch| (batch, limit)),
                            Err(e) => std::panic::resume_unwind(e.into_panic()),
                        }
                    }));
                }
                // Acknowledged every `ack_every` events, and, at most every `ACK_PAUSE`, when
                // lanes have nothing to do (a slow or failing event ahead of the rest would
                // otherwise hold the cursor back over events long handled).
                let prefix = window.prefix();
                if acking.is_none()
                    && (prefix >= ack_every
                        || (prefix > 0 && running.len() < lanes && last_ack.elapsed() >= ACK_PAUSE))
                {
                    let begin = self.begin_ack(lease, statements, progress, window);
                    let Some(ack) = alongside(&mut running, &mut ended, begin).await? else {
                        starting_over = true;
                        continue;
                    };
                    if let Some(ack) = ack {
                        acking_count = ack.count;
                        recorded_through = ack.handled_through;
                        acking = Some(Box::pin(self.write_lane_ack(lease, statements, ack)));
                    }
                    last_ack = Instant::now();
                    continue;
                }
                // The cursor does not move, the lanes do: the position records how far.
                if acking.is_none()
                    && window.handled_through() > recorded_through
                    && last_ack.elapsed() >= MARK_EVERY
                {
                    let at = progress.position.cursor().unwrap_or(window.cursor());
                    recorded_through = window.handled_through();
                    let mark = Ack {
                        left_at: at,
                        last: at,
                        held: None,
                        count: 0,
                        handled_through: recorded_through,
                    };
                    acking = Some(Box::pin(self.write_lane_ack(lease, statements, mark)));
                    last_ack = Instant::now();
                    continue;
                }
            }
            if running.is_empty() && reading.is_empty() && acking.is_none() {
                break;
            }
            let retry_due = window.next_ready_at().filter(|_| !stopping);
            // A lease not known to be valid (its renewal is late) starts nothing; it is looked
            // at again soon, as the idle loop does, so that a slow handler still running does
            // not hold the other lanes once the renewal succeeds.
            let lease_check =
                (stopping && !shutdown.is_cancelled()).then(|| Instant::now() + LEASE_RECHECK);
            let ack_due =
                (!stopping && acking.is_none() && window.prefix() > 0 && running.len() < lanes)
                    .then_some(last_ack + ACK_PAUSE);
            let mark_due =
                (!stopping && acking.is_none() && window.handled_through() > recorded_through)
                    .then_some(last_ack + MARK_EVERY);
            // Caught up while handlers run: news of more events starts another read.
            let listening = !stopping && !more_to_read && reading.is_empty() && read_budget > 0;
            tokio::select! {
                Some(done) = running.next(), if !running.is_empty() => {
                    ended.push(done);
                    // And every other one that has ended meanwhile.
                    while let Some(Some(done)) = running.next().now_or_never() {
                        ended.push(done);
                    }
                    while let Some((event, result)) = ended.pop() {
                        if let Some(saving) = self.settle(lease, statements, progress, window, event, result?) {
                            alongside(&mut running, &mut ended, saving).await?;
                        }
                    }
                    progress.meters.ahead_of_cursor(window.settled());
                }
                Some(read) = reading.next(), if !reading.is_empty() => {
                    let (batch, limit) = read?;
                    requested -= limit;
                    // A round is bounded by the events it reads, not by what it asks for (a
                    // live stream answers many small reads).
                    read_budget -= batch.events.len() as i64;
                    self.config.duties.availability.reached();
                    let taken = self.take_read(progress, window, pending, batch);
                    if !matches!(taken, Taken::Events { full: true }) {
                        // The reads after this one start past where it ended: not used.
                        reading.clear();
                        requested = 0;
                    }
                    match taken {
                        Taken::Events { full } => {
                            more_to_read = full;
                            *read_size = match full {
                                true => read_size.saturating_mul(2).min(settings.max_batch_size),
                                false => settings.batch_size,
                            };
                        }
                        Taken::Gap => {
                            more_to_read = false;
                            gap = window.is_empty() && pending.is_empty();
                        }
                        Taken::Unchecked => {
                            more_to_read = false;
                            unchecked = true;
                        }
                    }
                }
                written = async { acking.as_mut().expect("guarded").await }, if acking.is_some() => {
                    acking = None;
                    acking_count = 0;
                    written?;
                    finish_ack(progress, window);
                }
                () = sleep_until_some(retry_due) => {}
                () = sleep_until_some(lease_check) => {}
                () = sleep_until_some(ack_due) => {}
                () = sleep_until_some(mark_due) => {}
                () = signals.wake.notified(), if listening => more_to_read = true,
                () = sleep_until_some(grace_ends) => {
                    tracing::warn!(running = running.len(), "handlers abandoned at shutdown");
                    return Ok(Ended::StartOver);
                }
                () = shutdown.cancelled(), if grace_ends.is_none() => {}
            }
        }
        if window.prefix() > 0 && !self.ack_prefix(lease, statements, progress, window).await? {
            return Ok(Ended::StartOver);
        }
        if gap {
            return Ok(Ended::Gap);
        }
        let room = window.room(max_ahead) > 0;
        let more =
            unchecked || (room && (!pending.is_empty() || (more_to_read && read_budget <= 0)));
        Ok(Ended::Round(match more {
            true => Step::More,
            false => Step::Idle,
        }))
    }

    /// The handler's run of one event, with the event handed back; `Err` when the database
    /// failed around a transactional handler.
    async fn run_one(
        &self,
        lane: &LaneContext<'_>,
        event: ObservedEvent,
        undecodable: Option<FailureClass>,
    ) -> (
        ObservedEvent,
        Result<Result<(), HandlerFailure>, ConsumerError>,
    ) {
        if let Some(class) = undecodable {
            return (event, Ok(Err(HandlerFailure::new(class))));
        }
        if self.skips(&event) {
            return (event, Ok(Ok(())));
        }
        let result =
            outbox_core::internal::observe(self.dispatch.handle_in_lane(lane, &event)).await;
        (event, result)
    }

    /// Settles an event that ran. One handled is finished in the window at once (no future,
    /// no copy of the event into one: a fast handler's catch-up settles hundreds of thousands
    /// a second); for a failure it returns the work that saves it, to run beside the handlers
    /// still running.
    fn settle<'a>(
        &'a self,
        lease: &'a Lease,
        statements: &'a Statements,
        progress: &'a mut Progress,
        window: &'a mut Window,
        event: ObservedEvent,
        result: Result<(), HandlerFailure>,
    ) -> Option<impl Future<Output = Result<(), ConsumerError>> + 'a> {
        match result {
            Ok(()) => {
                window.finish(event, Finished::Handled);
                None
            }
            Err(failure) => {
                Some(self.settle_failure(lease, statements, progress, window, event, failure))
            }
        }
    }

    /// Records a failure of an event that ran: saved for its retry or parked.
    async fn settle_failure(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        window: &mut Window,
        event: ObservedEvent,
        failure: HandlerFailure,
    ) -> Result<(), ConsumerError> {
        let Some(class) = triage(failure)? else {
            let ready_at = Instant::now() + AGAIN_AFTER;
            window.finish(event, Finished::Again { ready_at });
            return Ok(());
        };
        let finished = self
            .record_lane_failure(lease, statements, progress, &event, class)
            .await?;
        window.finish(event, finished);
        Ok(())
    }

    /// Saves a failed attempt of `event`, ahead of the cursor or right after it: for its retry,
    /// or parked (without moving the cursor, which the acknowledgement moves past it).
    async fn record_lane_failure(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        event: &ObservedEvent,
        class: FailureClass,
    ) -> Result<Finished, ConsumerError> {
        let attempts = event.attempt;
        let delay = self.retry_delay(&class, attempts);
        let failed_at = Instant::now();
        let mut client = self.pool.get().await?;
        store::record_failure(
            &mut client,
            statements,
            lease,
            event,
            attempts,
            &class,
            delay,
            false,
        )
        .await?;
        progress.meters.failure(&class).increment(1);
        Ok(match delay {
            Some(delay) => {
                tracing::warn!(
                    sequence = event.sequence, event_id = %event.event_id, attempts,
                    class = %class, retry_in = %outbox_core::internal::Readable(delay),
                    "event failed; will retry (its task's later events wait)"
                );
                Finished::Retry {
                    attempts,
                    ready_at: failed_at + delay,
                }
            }
            None => {
                tracing::error!(
                    sequence = event.sequence, event_id = %event.event_id, attempts,
                    class = %class, "event parked as a dead letter; the stream moves on"
                );
                progress.meters.dead_letters.increment(1);
                Finished::Parked
            }
        })
    }
}

/// How a round's run of the window ended.
enum Ended {
    /// Nothing may start and nothing runs: go on as this says.
    Round(Step),
    /// The first event after the cursor is missing: history is gone.
    Gap,
    /// The window is not the database's view any more (shutdown's grace period cut handlers
    /// off, a handler's `before_ack_prefix` failed): the next round starts over from the
    /// cursor.
    StartOver,
}

/// Runs `work` while the handlers running go on: a transactional handler holds a pooled
/// connection and a transaction while it runs, and must not sit idle until the loop next
/// looks at it (`work` may itself wait for a connection). Those that end meanwhile are kept
/// in `ended`, for the loop to settle.
async fn alongside<T: Future, F: Future>(
    running: &mut FuturesUnordered<T>,
    ended: &mut Vec<T::Output>,
    work: F,
) -> F::Output {
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            biased;
            output = &mut work => return output,
            Some(done) = running.next(), if !running.is_empty() => ended.push(done),
        }
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
