//! Riding out an unavailable database: which failures count as an outage, the process's one
//! view of whether its database is up (one log line when it goes, one when it is back; the
//! `outbox_database_up` gauge; readiness), the backoff between attempts, and the optional
//! limit after which a process gives up.
//!
//! Every long-running part of a process reports here: the start-up checks, the lease claim,
//! the delivery loop, the heartbeat, the listener, the sequencer and a set's poll. Many of
//! them fail at once when the database goes away; the log says so once, not once per part
//! and attempt.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::error::ConsumerError;

/// Doublings of [`crate::backoff`] while the database is unavailable: from 100 ms up to
/// 3.2 s (1.6 to 3.2 s with jitter), so a process is back within a few seconds of the
/// database.
const MAX_DOUBLINGS: u32 = 5;

/// The wait after `failures` consecutive attempts that found the database unavailable:
/// [`crate::backoff`], capped at a few seconds.
pub fn outage_backoff(failures: u32) -> Duration {
    crate::backoff(failures.min(MAX_DOUBLINGS), rand::random())
}

/// Whether `e` means the database is unavailable for now (see
/// [`outbox_core::is_outage`]), including a pool that could not make a connection.
pub fn is_outage(e: &ConsumerError) -> bool {
    use deadpool_postgres::{HookError, PoolError, TimeoutType};
    match e {
        ConsumerError::Database(e) => outbox_core::is_outage(e),
        ConsumerError::Core(e) => e.is_outage(),
        ConsumerError::Pool(PoolError::Backend(e))
        | ConsumerError::Pool(PoolError::PostCreateHook(HookError::Backend(e))) => {
            outbox_core::is_outage(e)
        }
        ConsumerError::Pool(PoolError::Timeout(TimeoutType::Create | TimeoutType::Recycle)) => true,
        _ => false,
    }
}

/// The process's view of its database. One per process ([`availability`]): a process runs
/// against one database, and its log, gauge and readiness speak for the process.
pub struct Availability {
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

/// The process's [`Availability`].
pub fn availability() -> &'static Availability {
    static AVAILABILITY: std::sync::OnceLock<Availability> = std::sync::OnceLock::new();
    AVAILABILITY.get_or_init(|| Availability {
        up: AtomicBool::new(true),
        down: Mutex::new(None),
        give_up_after: Mutex::new(None),
        gave_up: CancellationToken::new(),
    })
}

impl Availability {
    /// Gives up once an outage has lasted longer than `limit` (`None`, the default: never).
    pub fn set_give_up_after(&self, limit: Option<Duration>) {
        *self.give_up_after.lock().expect("availability lock") = limit;
    }

    /// Whether the database answered the last attempt to reach it.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Sets `outbox_database_up` to the current state (once a recorder is installed: a gauge
    /// set before that is lost).
    pub fn publish(&self) {
        metrics::gauge!("outbox_database_up").set(if self.is_up() { 1.0 } else { 0.0 });
    }

    /// Records that the database answered: logs the end of an outage once.
    pub fn reached(&self) {
        if self.up.load(Ordering::Relaxed) {
            return;
        }
        let mut down = self.down.lock().expect("availability lock");
        if let Some((since, _)) = down.take() {
            self.up.store(true, Ordering::Relaxed);
            tracing::info!(
                unavailable_for = %outbox_core::Readable(since.elapsed()),
                "the database is available again; resuming"
            );
            self.publish();
        }
    }

    /// Records that `error` found the database unavailable: logs the start of an outage
    /// once, and returns [`ConsumerError::GaveUp`] when it has lasted longer than the limit.
    pub fn unreachable(&self, error: &dyn std::fmt::Display) -> Result<(), ConsumerError> {
        let mut down = self.down.lock().expect("availability lock");
        let since = match &*down {
            Some((since, _)) => *since,
            None => {
                let since = Instant::now();
                tracing::warn!(
                    error = %error,
                    "the database is unavailable; waiting for it (with backoff)"
                );
                *down = Some((since, error.to_string()));
                self.up.store(false, Ordering::Relaxed);
                self.publish();
                since
            }
        };
        tracing::debug!(error = %error, "the database is still unavailable");
        let limit = *self.give_up_after.lock().expect("availability lock");
        match limit {
            Some(limit) if since.elapsed() > limit => {
                self.gave_up.cancel();
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
        self.gave_up.cancelled().await
    }

    /// The error a part that waited returns once the process has given up.
    pub fn gave_up_error(&self) -> ConsumerError {
        let limit = self
            .give_up_after
            .lock()
            .expect("availability lock")
            .unwrap_or_default();
        let error = match &*self.down.lock().expect("availability lock") {
            Some((_, error)) => error.clone(),
            None => "the database was unavailable".to_owned(),
        };
        ConsumerError::GaveUp { limit, error }
    }
}

/// For a failure of a part that retries on its own (heartbeat, sweep, poll, sequencer,
/// listener): records an outage and returns `true` (the outage's one line speaks for it), or
/// returns `false` and the caller logs the failure itself.
pub(crate) fn noted(outage: bool, error: &dyn std::fmt::Display) -> bool {
    if outage {
        // Giving up is acted on by the parts that wait (`given_up`), not by this one.
        let _ = availability().unreachable(error);
    }
    outage
}

/// A failure that may be an outage, for [`Repeat`].
pub(crate) trait MaybeOutage: std::fmt::Display {
    /// Whether it found the database unavailable.
    fn is_outage(&self) -> bool;
}

impl MaybeOutage for ConsumerError {
    fn is_outage(&self) -> bool {
        is_outage(self)
    }
}

/// Runs `attempt` until it succeeds, waiting out an unavailable database (and retrying other
/// transient failures) with [`outage_backoff`]; any other error is returned at once. `None`
/// when `shutdown` came first.
pub async fn wait_out<T, F, Fut>(
    what: &str,
    shutdown: &CancellationToken,
    mut attempt: F,
) -> Result<Option<T>, ConsumerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ConsumerError>>,
{
    let availability = availability();
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
/// or after a failure after [`crate::backoff`] (or [`outage_backoff`] while the database is away) (at least `floor`). A failing step is logged once,
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
    pub fn done<E: MaybeOutage>(&mut self, outcome: Result<Duration, E>) {
        self.delay = match outcome {
            Ok(next) => {
                self.failures = 0;
                next
            }
            Err(e) => {
                let outage = noted(e.is_outage(), &e);
                match self.failures {
                    0 if !outage => {
                        tracing::warn!(error = %e, "{} failed; backing off", self.what)
                    }
                    n => tracing::debug!(error = %e, failures = n, "{} failed again", self.what),
                }
                self.failures = self.failures.saturating_add(1);
                match outage {
                    true => outage_backoff(self.failures),
                    false => crate::backoff(self.failures, rand::random()),
                }
                .max(self.floor)
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outage_backoff_is_capped_at_a_few_seconds() {
        for failures in 0..40 {
            assert!(outage_backoff(failures) <= Duration::from_millis(3200));
        }
        assert!(outage_backoff(30) >= Duration::from_millis(1600));
    }

    #[test]
    fn a_configuration_error_is_no_outage() {
        let e = ConsumerError::Config(crate::config::ConfigError("x".into()));
        assert!(!is_outage(&e));
    }
}
