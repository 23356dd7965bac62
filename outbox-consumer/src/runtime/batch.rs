//! Dispatch of one batch: the events go to the dispatch mode, the handled prefix is
//! acknowledged, and a failure of the event after it is recorded, by the decision table in
//! [`decide`].

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Consumer;
use super::position::Handled;
use super::progress::Progress;
use crate::dispatch::{BatchOutcome, DispatchContext, DispatchMode};
use crate::error::ConsumerError;
use crate::event::{FailureClass, ObservedEvent};
use crate::handler::Reconciler;
use crate::lease::Lease;
use crate::store::Statements;

/// Whether to go round again at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    More,
    Idle,
}

/// What follows a dispatched batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AfterBatch {
    /// The event after the handled prefix failed and has a retry left: its failure is saved
    /// in the same statement as the prefix's acknowledgement (after `cursor`), and the rest of
    /// the batch is kept for the retry after `delay`.
    RetryLater {
        cursor: i64,
        delay: Duration,
        class: FailureClass,
    },
    /// The event after the handled prefix failed: the prefix is acknowledged, then the
    /// failure is recorded on its own (which parks the event when no retry is left).
    Record(FailureClass),
    /// Nothing failed, or the failure had no event to charge: go on as this says.
    Go(Step),
}

impl AfterBatch {
    /// Whether the handled prefix is acknowledged at once (a retry writes it with the
    /// failure instead).
    fn acks_now(&self) -> bool {
        !matches!(self, AfterBatch::RetryLater { .. })
    }
}

/// The decision table after a batch of `len` events: `retry_in` is the failed event's retry
/// delay (if one is left), `cursor` the run's once an already acknowledged prefix counts,
/// `more` whether the read said more follows at once.
pub(super) fn decide(
    outcome: &BatchOutcome,
    len: usize,
    retry_in: Option<Duration>,
    cursor: Option<i64>,
    more: bool,
) -> AfterBatch {
    match (&outcome.failure, outcome.handled < len) {
        (Some(class), true) => match (retry_in, cursor) {
            (Some(delay), Some(cursor)) => AfterBatch::RetryLater {
                cursor,
                delay,
                class: class.clone(),
            },
            _ => AfterBatch::Record(class.clone()),
        },
        (Some(_), false) => AfterBatch::Go(Step::More),
        // Stopped by shutdown or an invalid lease: the loop decides what happens next.
        (None, true) => AfterBatch::Go(Step::Idle),
        (None, false) if more => AfterBatch::Go(Step::More),
        (None, false) => AfterBatch::Go(Step::Idle),
    }
}

impl<D: DispatchMode, R: Reconciler> Consumer<D, R> {
    /// Dispatch: hands the events to the dispatch mode, acknowledges the handled prefix and
    /// records a failure of the event after it: a failure to be retried in the same statement
    /// as the acknowledgement, keeping the rest of the batch in memory for the retry. `more`:
    /// go round again at once when every event was handled.
    pub(super) async fn dispatch_batch(
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
            grace: self.config.delivery.shutdown_grace,
            held_sequence: progress.position.held_sequence(),
            event_types: &self.config.delivery.event_types,
            skipped: &progress.meters.skipped,
        };
        let outcome = self.dispatch.deliver(&ctx, &events).await?;
        let retry_in = match (&outcome.failure, events.get(outcome.handled)) {
            (Some(_), Some(event)) => self.config.delivery.retry.delay_after(event.attempt),
            _ => None,
        };
        // The cursor once the prefix is recorded: transactional dispatch has acknowledged it.
        let cursor = match (outcome.acked, outcome.handled) {
            (true, handled) if handled > 0 => Some(events[handled - 1].sequence),
            _ => progress.position.cursor(),
        };
        let next = decide(&outcome, events.len(), retry_in, cursor, more);
        let BatchOutcome { handled, acked, .. } = outcome;
        if handled > 0 {
            let prefix = Handled {
                last: events[handled - 1].sequence,
                identity: events[handled - 1].event_id.clone(),
                count: handled as u64,
            };
            if acked {
                progress.advance(prefix);
            } else {
                progress.position.handled_through(prefix);
                if next.acks_now() {
                    self.ack_handled(lease, statements, progress).await?;
                }
            }
        }
        match next {
            AfterBatch::RetryLater {
                cursor,
                delay,
                class,
            } => {
                let rest = events.split_off(handled);
                self.retry_later(lease, statements, progress, cursor, rest, class, delay)
                    .await?;
                Ok(Step::More)
            }
            AfterBatch::Record(class) => {
                self.fail(lease, statements, progress, &events[handled], class)
                    .await?;
                Ok(Step::More)
            }
            AfterBatch::Go(step) => Ok(step),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: usize = 3;
    const DELAY: Duration = Duration::from_millis(10);

    fn outcome(handled: usize, failure: Option<&str>) -> BatchOutcome {
        BatchOutcome {
            handled,
            acked: false,
            failure: failure.map(|class| FailureClass::new(class).unwrap()),
        }
    }

    fn class() -> FailureClass {
        FailureClass::new("timeout").unwrap()
    }

    #[test]
    fn a_whole_batch_goes_on_as_the_read_said() {
        let whole = outcome(LEN, None);
        assert_eq!(
            decide(&whole, LEN, None, Some(4), true),
            AfterBatch::Go(Step::More)
        );
        assert_eq!(
            decide(&whole, LEN, None, Some(4), false),
            AfterBatch::Go(Step::Idle)
        );
    }

    #[test]
    fn a_batch_stopped_short_without_a_failure_waits() {
        // Shutdown or an invalid lease stopped dispatch: the loop decides what follows.
        assert_eq!(
            decide(&outcome(1, None), LEN, None, Some(4), true),
            AfterBatch::Go(Step::Idle)
        );
    }

    #[test]
    fn a_failure_with_a_retry_left_is_retried_with_the_rest_kept() {
        assert_eq!(
            decide(
                &outcome(1, Some("timeout")),
                LEN,
                Some(DELAY),
                Some(4),
                false
            ),
            AfterBatch::RetryLater {
                cursor: 4,
                delay: DELAY,
                class: class(),
            }
        );
    }

    #[test]
    fn a_failure_without_a_retry_left_is_recorded_on_its_own() {
        assert_eq!(
            decide(&outcome(0, Some("timeout")), LEN, None, Some(4), true),
            AfterBatch::Record(class())
        );
        // Without a cursor there is nothing to write the retry after.
        assert_eq!(
            decide(&outcome(0, Some("timeout")), LEN, Some(DELAY), None, true),
            AfterBatch::Record(class())
        );
    }

    #[test]
    fn a_failure_with_no_event_to_charge_goes_round_again() {
        assert_eq!(
            decide(&outcome(LEN, Some("timeout")), LEN, None, Some(4), false),
            AfterBatch::Go(Step::More)
        );
    }

    #[test]
    fn only_a_retry_defers_the_acknowledgement_to_its_write() {
        let retry = AfterBatch::RetryLater {
            cursor: 4,
            delay: DELAY,
            class: class(),
        };
        assert!(!retry.acks_now());
        assert!(AfterBatch::Record(class()).acks_now());
        assert!(AfterBatch::Go(Step::More).acks_now());
        assert!(AfterBatch::Go(Step::Idle).acks_now());
    }
}
