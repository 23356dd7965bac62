//! Plumbing shared by every part of the consumer: a run's wake-up signals, owned tasks, the
//! reconnect backoff, the "step, back off on failure, until stopped" loop, and the rule that
//! decides whether a process may LISTEN at all.
//!
//! This module is the base layer: it uses nothing else of the crate but the outage record
//! (`outage`), so the listener, the background tasks, the runtime and the consumer set can
//! all build on it.

use std::fmt::Display;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

pub use outbox_core::owner_token;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// A cursor as logs show it: its sequence number, or `none` before the consumer has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShownCursor(pub Option<i64>);

impl Display for ShownCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(sequence) => write!(f, "{sequence}"),
            None => f.write_str("none"),
        }
    }
}

/// Runs `work` to its end, or until `grace` has passed since `shutdown`, whichever comes
/// first: `None` when the grace ran out (and `work` was dropped), so no phase holds a
/// shutdown longer than the grace.
pub(crate) async fn within_grace<T>(
    shutdown: &CancellationToken,
    grace: Duration,
    work: impl Future<Output = T>,
) -> Option<T> {
    let grace_over = async {
        shutdown.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        result = work => Some(result),
        () = grace_over => None,
    }
}

/// First and largest reconnect delay.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// The delay after `failures` consecutive failures: doubling from 100 ms, capped at 10 s, with
/// "equal jitter" (half fixed, half random; `random_unit` in `0.0..=1.0`) so restarted fleets
/// do not reconnect in lock-step.
pub fn backoff(failures: u32, random_unit: f64) -> Duration {
    let exp = BACKOFF_MIN.saturating_mul(1u32 << failures.min(16));
    let capped = exp.min(BACKOFF_MAX);
    capped / 2 + capped.mul_f64(random_unit.clamp(0.0, 1.0) / 2.0)
}

/// A spawned task that is aborted when dropped, so no task outlives its owner; awaiting it
/// waits for it to end instead.
pub(crate) type Task = AbortOnDropHandle<()>;

/// Spawns `task`, owned by the returned handle.
pub(crate) fn spawn(task: impl Future<Output = ()> + Send + 'static) -> Task {
    AbortOnDropHandle::new(tokio::spawn(task))
}

/// Waits for every task to end (their stop signal having been given).
pub(crate) async fn join_all(tasks: Vec<Task>) {
    for task in tasks {
        let _ = task.await;
    }
}

/// The loop "step, wait, back off after a failure, until stopped", shared by every
/// reconnecting task: `while repeat.next().await { repeat.done(step().await) }`.
///
/// The first step runs at once; each later one after the delay the previous step returned,
/// or after a failure after [`backoff`] (at least `floor`). A failing step is logged once,
/// when it starts failing, as `"{what} failed; backing off"`, and at debug level after that.
/// A running step is not interrupted by `stop`: it ends first.
pub(crate) struct Repeat<'a> {
    stop: &'a CancellationToken,
    what: &'static str,
    floor: Duration,
    failures: u32,
    delay: Duration,
}

impl<'a> Repeat<'a> {
    /// A loop stopped by `stop`, whose failures wait at least `floor`.
    pub fn new(stop: &'a CancellationToken, what: &'static str, floor: Duration) -> Self {
        Self {
            stop,
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
    pub fn done<E: crate::outage::MaybeOutage>(&mut self, outcome: Result<Duration, E>) {
        self.delay = match outcome {
            Ok(next) => {
                self.failures = 0;
                next
            }
            Err(e) => {
                let outage = crate::outage::noted(e.is_outage(), &e);
                match self.failures {
                    0 if !outage => {
                        tracing::warn!(error = %e, "{} failed; backing off", self.what)
                    }
                    n => tracing::debug!(error = %e, failures = n, "{} failed again", self.what),
                }
                self.failures = self.failures.saturating_add(1);
                match outage {
                    true => crate::outage::outage_backoff(self.failures),
                    false => backoff(self.failures, rand::random()),
                }
                .max(self.floor)
            }
        };
    }
}

/// Whether a process may LISTEN: asked to, and not behind a transaction pooler, where a
/// LISTEN would be lost with its server session (the process then polls only).
pub(crate) fn may_listen(listen: bool, pooler: outbox_core::Pooler) -> bool {
    listen && pooler == outbox_core::Pooler::None
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_shows_as_its_number_or_none() {
        assert_eq!(ShownCursor(Some(8)).to_string(), "8");
        assert_eq!(ShownCursor(None).to_string(), "none");
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        assert_eq!(backoff(0, 0.0), Duration::from_millis(50));
        assert_eq!(backoff(0, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(1, 0.0), Duration::from_millis(100));
        assert_eq!(backoff(3, 1.0), Duration::from_millis(800));
        assert_eq!(backoff(30, 0.0), Duration::from_secs(5));
        assert_eq!(backoff(30, 1.0), Duration::from_secs(10));
        for f in 0..40 {
            assert!(backoff(f, 0.5) <= BACKOFF_MAX);
        }
    }

    #[test]
    fn only_a_direct_connection_listens() {
        assert!(may_listen(true, outbox_core::Pooler::None));
        assert!(!may_listen(false, outbox_core::Pooler::None));
        assert!(!may_listen(true, outbox_core::Pooler::Transaction));
    }
}
