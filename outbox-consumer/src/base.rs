//! Plumbing shared by every part of the consumer: a run's wake-up signals, owned tasks, the
//! reconnect backoff, and the rule that decides whether a process may LISTEN at all.
//!
//! This module is the base layer: it uses nothing else of the crate, so the outage record,
//! the listener, the background tasks, the runtime and the consumer set can all build on it.

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
