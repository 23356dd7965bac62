//! The delays between attempts: the one reconnect backoff (doubling, capped, jittered), and
//! the shorter cap while the database is unavailable.

use std::time::Duration;

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

/// Doublings of [`backoff`] while the database is unavailable: from 100 ms up to
/// 3.2 s (1.6 to 3.2 s with jitter), so a process is back within a few seconds of the
/// database.
const MAX_DOUBLINGS: u32 = 5;

/// The wait after `failures` consecutive attempts that found the database unavailable:
/// [`backoff`], capped at a few seconds.
pub fn outage_backoff(failures: u32) -> Duration {
    backoff(failures.min(MAX_DOUBLINGS), rand::random())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_outage_backoff_is_capped_at_a_few_seconds() {
        for failures in 0..40 {
            assert!(outage_backoff(failures) <= Duration::from_millis(3200));
        }
        assert!(outage_backoff(30) >= Duration::from_millis(1600));
    }
}
