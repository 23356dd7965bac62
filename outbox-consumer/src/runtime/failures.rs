//! Failed attempts: saved for a retry (with the rest of the batch kept in memory), or, after
//! the last attempt, parked as a dead letter so the stream moves on; and the precise wait
//! for a retry due within a tick.

use std::time::Duration;

use tokio::time::Instant;

use super::Consumer;
use super::progress::Progress;
use crate::error::ConsumerError;
use crate::event::{FailureClass, ObservedEvent};
use crate::lease::Lease;
use crate::store::{self, Held, Statements};

/// Retry waits at most this long are slept precisely (and without going back round the
/// loop) when the rest of the batch is in memory: tokio's timers fire on whole milliseconds,
/// which would nearly double a 1 ms retry delay.
pub(super) const PRECISE_WAIT: Duration = Duration::from_millis(2);

/// The last stretch of a precise wait, spent yielding rather than asleep: the OS wakes a
/// sleeping thread some tens of microseconds late (its timer slack), which at a 1 ms delay
/// is several per cent of the wait.
const SPIN: Duration = Duration::from_micros(100);

impl<D, R> Consumer<D, R> {
    /// Saves a failed attempt to be retried after `delay` in the same statement as the
    /// acknowledgement of what was handled before it, and keeps `rest` (the failed event
    /// first) for the retry. The delay counts from the failure, so the write overlaps it.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn retry_later(
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
        let through = progress.position.handled().map_or(cursor, |h| h.last);
        let left_at = progress.position.cursor().unwrap_or(cursor);
        let attempts = event.attempt;
        {
            let client = self.pool.get().await?;
            store::ack_and_retry(
                &client, statements, lease, left_at, through, event, attempts, &class, delay,
            )
            .await?;
        }
        if let Some(handled) = progress.position.take_handled() {
            progress.advance(handled);
        }
        progress.meters.failure(&class).increment(1);
        tracing::warn!(
            sequence = event.sequence, event_id = %event.event_id, attempts,
            class = %class, retry_in = %outbox_core::internal::Readable(delay), "event failed; will retry"
        );
        progress.position.hold(Some(Held {
            sequence: event.sequence,
            attempts,
            ready_at: failed_at + delay,
        }));
        progress.position.keep(rest);
        Ok(())
    }

    /// When a failed event is tried again: after the schedule's delay for its `attempts`, or
    /// never (`None`: it is parked) once the schedule is spent, or at once for a contract
    /// mismatch, which no retry can make understood.
    pub(super) fn retry_delay(&self, class: &FailureClass, attempts: u32) -> Option<Duration> {
        if *class == FailureClass::contract_mismatch() {
            return None;
        }
        self.config.delivery.retry.delay_after(attempts)
    }

    /// Saves a failed attempt of `event` (the one after the cursor): held for its retry, or
    /// parked when it had its last attempt.
    pub(super) async fn fail(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        event: &ObservedEvent,
        class: FailureClass,
    ) -> Result<(), ConsumerError> {
        let attempts = event.attempt;
        let delay = self.retry_delay(&class, attempts);
        let mut client = self.pool.get().await?;
        store::record_failure(
            &mut client,
            statements,
            lease,
            event,
            attempts,
            &class,
            delay,
            true,
        )
        .await?;
        progress.meters.failure(&class).increment(1);
        match delay {
            Some(delay) => {
                tracing::warn!(
                    sequence = event.sequence, event_id = %event.event_id, attempts,
                    class = %class, retry_in = %outbox_core::internal::Readable(delay), "event failed; will retry"
                );
                progress.position.hold(Some(Held {
                    sequence: event.sequence,
                    attempts,
                    ready_at: Instant::now() + delay,
                }));
            }
            None => {
                tracing::error!(
                    sequence = event.sequence, event_id = %event.event_id, attempts,
                    class = %class, "event parked as a dead letter; the stream moves on"
                );
                progress.meters.dead_letters.increment(1);
                progress
                    .position
                    .moved_to(event.sequence, Some(event.event_id.clone()));
            }
        }
        Ok(())
    }
}

/// Waits until `until` (at most [`PRECISE_WAIT`] away) on a blocking thread, to within a few
/// microseconds rather than to the next millisecond tick.
pub(super) async fn precise_wait(until: Instant) {
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
