//! The retry loops every waiting part shares: [`wait_out`], an attempt retried until it
//! succeeds through an unavailable database (the start-up phases), and [`Repeat`], "step,
//! back off after a failure, until stopped" (the sequencer, the listener, a set's poll).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::availability::Availability;
use crate::backoff::{backoff, outage_backoff};
use crate::error::ConsumerError;
use crate::outage::{MaybeOutage, is_outage};

/// Runs `attempt` until it succeeds, waiting out an unavailable database (and retrying other
/// transient failures) with [`outage_backoff`]; any other error is returned at once. `None`
/// when `shutdown` came first.
pub async fn wait_out<T, F, Fut>(
    what: &str,
    availability: &Availability,
    shutdown: &CancellationToken,
    mut attempt: F,
) -> Result<Option<T>, ConsumerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ConsumerError>>,
{
    let mut failures: u32 = 0;
    loop {
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            () = availability.given_up() => return Err(availability.gave_up_error()),
            outcome = attempt() => outcome,
        };
        match outcome {
            Ok(value) => {
                availability.reached();
                return Ok(Some(value));
            }
            Err(e) if is_outage(&e) => availability.unreachable(&e)?,
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, "{what} failed; will retry");
            }
            Err(e) => return Err(e),
        }
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            () = availability.given_up() => return Err(availability.gave_up_error()),
            _ = tokio::time::sleep(outage_backoff(failures)) => {}
        }
    }
}

/// The loop "step, wait, back off after a failure, until stopped", shared by every
/// reconnecting task: `while repeat.next().await { repeat.done(step().await) }`.
///
/// The first step runs at once; each later one after the delay the previous step returned,
/// or after a failure after [`backoff`] (or [`outage_backoff`] while the database is away), at
/// least `floor`. A failing step is logged once,
/// when it starts failing, as `"{what} failed; backing off"`, and at debug level after that.
/// A running step is not interrupted by `stop`: it ends first.
pub(crate) struct Repeat<'a> {
    stop: &'a CancellationToken,
    availability: &'a Availability,
    what: &'static str,
    floor: Duration,
    failures: u32,
    delay: Duration,
}

impl<'a> Repeat<'a> {
    /// A loop stopped by `stop`, whose failures wait at least `floor` and whose outages are
    /// said to `availability`.
    pub fn new(
        stop: &'a CancellationToken,
        availability: &'a Availability,
        what: &'static str,
        floor: Duration,
    ) -> Self {
        Self {
            stop,
            availability,
            what,
            floor,
            failures: 0,
            delay: Duration::ZERO,
        }
    }

    /// Waits until the next step is due: `false` once stopped.
    pub async fn next(&mut self) -> bool {
        if self.stop.is_cancelled() {
            return false;
        }
        tokio::select! {
            _ = self.stop.cancelled() => false,
            _ = tokio::time::sleep(self.delay) => true,
        }
    }

    /// Records a step's outcome: `Ok` with the delay before the next step, or the failure.
    /// A failure that found the database unavailable is said once for the whole process
    /// (`outage`), not here.
    pub fn done<E: MaybeOutage>(&mut self, outcome: Result<Duration, E>) {
        self.delay = match outcome {
            Ok(next) => {
                self.failures = 0;
                next
            }
            Err(e) => {
                let outage = self.availability.noted(e.is_outage(), &e);
                match self.failures {
                    0 if !outage => {
                        tracing::warn!(error = %e, "{} failed; backing off", self.what)
                    }
                    n => tracing::debug!(error = %e, failures = n, "{} failed again", self.what),
                }
                self.failures = self.failures.saturating_add(1);
                match outage {
                    true => outage_backoff(self.failures),
                    false => backoff(self.failures, rand::random()),
                }
                .max(self.floor)
            }
        };
    }
}
