//! Whether the database is up, as a process sees it: one log line when it goes, one when it
//! is back; the `outbox_database_up` gauge; readiness; and the optional limit after which a
//! process gives up.
//!
//! Every long-running part of a process reports to the one [`Availability`] carried in its
//! [`Duties`](crate::Duties): the start-up checks, the lease claim, the delivery loop, the
//! heartbeat, the listener, the sequencer and a set's poll. Many of them fail at once when the
//! database goes away; the log says so once, not once per part and attempt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::error::ConsumerError;

/// A view of one database's availability, shared by every part that reaches it: a handle
/// (clones share the same state). A process makes one, gives it to its consumers in
/// [`Duties::availability`](crate::Duties::availability), and reads it for its readiness and
/// its `outbox_database_up` gauge.
#[derive(Clone, Default)]
pub struct Availability {
    inner: Arc<Inner>,
}

struct Inner {
    /// False from the first failure that found the database unavailable until the next
    /// success.
    up: AtomicBool,
    /// When the current outage began, and its first error.
    down: Mutex<Option<(Instant, String)>>,
    /// How long an outage may last before the process gives up; `None`: never.
    give_up_after: Mutex<Option<Duration>>,
    /// Cancelled once an outage has lasted longer than `give_up_after`.
    gave_up: CancellationToken,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            up: AtomicBool::new(true),
            down: Mutex::new(None),
            give_up_after: Mutex::new(None),
            gave_up: CancellationToken::new(),
        }
    }
}

impl std::fmt::Debug for Availability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Availability")
            .field("up", &self.is_up())
            .field("give_up_after", &self.give_up_after())
            .finish()
    }
}

impl Availability {
    /// A database taken to be up, never given up on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives up once an outage has lasted longer than `limit` (`None`, the default: never).
    pub fn set_give_up_after(&self, limit: Option<Duration>) {
        *self.inner.give_up_after.lock().expect("availability lock") = limit;
    }

    /// The limit set by [`Availability::set_give_up_after`].
    pub fn give_up_after(&self) -> Option<Duration> {
        *self.inner.give_up_after.lock().expect("availability lock")
    }

    /// Whether the database answered the last attempt to reach it.
    pub fn is_up(&self) -> bool {
        self.inner.up.load(Ordering::Relaxed)
    }

    /// Sets `outbox_database_up` to the current state (once a recorder is installed: a gauge
    /// set before that is lost).
    pub fn publish(&self) {
        metrics::gauge!(crate::metric::DATABASE_UP.name).set(if self.is_up() { 1.0 } else { 0.0 });
    }

    /// Records that the database answered: logs the end of an outage once.
    pub fn reached(&self) {
        if self.inner.up.load(Ordering::Relaxed) {
            return;
        }
        let mut down = self.inner.down.lock().expect("availability lock");
        if let Some((since, _)) = down.take() {
            self.inner.up.store(true, Ordering::Relaxed);
            tracing::info!(
                unavailable_for = %outbox_core::internal::Readable(since.elapsed()),
                "the database is available again; resuming"
            );
            self.publish();
        }
    }

    /// Records that `error` found the database unavailable: logs the start of an outage
    /// once, and returns [`ConsumerError::GaveUp`] when it has lasted longer than the limit.
    pub fn unreachable(&self, error: &dyn std::fmt::Display) -> Result<(), ConsumerError> {
        let mut down = self.inner.down.lock().expect("availability lock");
        let since = match &*down {
            Some((since, _)) => *since,
            None => {
                let since = Instant::now();
                tracing::warn!(
                    error = %error,
                    "the database is unavailable; waiting for it (with backoff)"
                );
                *down = Some((since, error.to_string()));
                self.inner.up.store(false, Ordering::Relaxed);
                self.publish();
                since
            }
        };
        tracing::debug!(error = %error, "the database is still unavailable");
        match self.give_up_after() {
            Some(limit) if since.elapsed() > limit => {
                self.inner.gave_up.cancel();
                Err(ConsumerError::GaveUp {
                    limit,
                    error: error.to_string(),
                })
            }
            _ => Ok(()),
        }
    }

    /// Resolves once the process has given up (never without a limit).
    pub async fn given_up(&self) {
        self.inner.gave_up.cancelled().await
    }

    /// The error a part that waited returns once the process has given up.
    pub fn gave_up_error(&self) -> ConsumerError {
        let limit = self.give_up_after().unwrap_or_default();
        let error = match &*self.inner.down.lock().expect("availability lock") {
            Some((_, error)) => error.clone(),
            None => "the database was unavailable".to_owned(),
        };
        ConsumerError::GaveUp { limit, error }
    }

    /// For a failure of a part that retries on its own (heartbeat, sweep, poll, sequencer,
    /// listener): records an outage and returns `true` (the outage's one line speaks for
    /// it), or returns `false` and the caller logs the failure itself.
    pub(crate) fn noted(&self, outage: bool, error: &dyn std::fmt::Display) -> bool {
        if outage {
            // Giving up is acted on by the parts that wait (`given_up`), not by this one.
            let _ = self.unreachable(error);
        }
        outage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_view_and_separate_handles_do_not() {
        let one = Availability::new();
        let clone = one.clone();
        let other = Availability::new();
        one.unreachable(&"down").unwrap();
        assert!(!clone.is_up());
        assert!(other.is_up());
        clone.reached();
        assert!(one.is_up());
    }
}
