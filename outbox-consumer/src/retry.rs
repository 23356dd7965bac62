//! The retry schedule: a pure function of the attempt number.
//!
//! Default: 1 s, 5 s, 30 s, 5 min, then 15 min for every later attempt, at most 10 attempts.
//! Attempt n has failed; the delay before attempt n+1 is `delay_after(n)`. After the 10th
//! failure there is no next attempt: the event is parked as a dead letter.

use std::time::Duration;

/// The most attempts a schedule may allow.
pub const MAX_ATTEMPTS_CEILING: u32 = 1000;

/// When to try a failed event again, and when to give up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule {
    /// Delay after the 1st, 2nd, ... failure; the last entry repeats.
    delays: Vec<Duration>,
    /// Attempts before parking (the first delivery counts as attempt 1).
    max_attempts: u32,
}

/// A schedule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid retry schedule: {0}")]
pub struct ScheduleError(&'static str);

impl Default for RetrySchedule {
    fn default() -> Self {
        Self {
            delays: vec![
                Duration::from_secs(1),
                Duration::from_secs(5),
                Duration::from_secs(30),
                Duration::from_secs(5 * 60),
                Duration::from_secs(15 * 60),
            ],
            max_attempts: 10,
        }
    }
}

impl RetrySchedule {
    /// A custom schedule (tests compress time with it). `delays` must not be empty and
    /// `max_attempts` must be between 1 and 1000.
    pub fn new(delays: Vec<Duration>, max_attempts: u32) -> Result<Self, ScheduleError> {
        if delays.is_empty() {
            return Err(ScheduleError("at least one delay is required"));
        }
        if !(1..=MAX_ATTEMPTS_CEILING).contains(&max_attempts) {
            return Err(ScheduleError("max attempts must be between 1 and 1000"));
        }
        Ok(Self {
            delays,
            max_attempts,
        })
    }

    /// Attempts before an event is parked.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The delay after failed attempt `attempt` (1-based), or `None` when that was the last
    /// attempt and the event must be parked.
    pub fn delay_after(&self, attempt: u32) -> Option<Duration> {
        if attempt >= self.max_attempts {
            return None;
        }
        let index = (attempt.max(1) - 1) as usize;
        Some(self.delays[index.min(self.delays.len() - 1)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn default_schedule_is_exact() {
        let s = RetrySchedule::default();
        let secs: Vec<Option<u64>> = (1..=11)
            .map(|a| s.delay_after(a).map(|d| d.as_secs()))
            .collect();
        assert_eq!(
            secs,
            vec![
                Some(1),
                Some(5),
                Some(30),
                Some(300),
                Some(900),
                Some(900),
                Some(900),
                Some(900),
                Some(900),
                None,
                None
            ]
        );
        assert_eq!(s.max_attempts(), 10);
        // Total patience before parking: 1+5+30+300+5*900 seconds.
        let total: u64 = (1..10).map(|a| s.delay_after(a).unwrap().as_secs()).sum();
        assert_eq!(total, 4836);
    }

    #[test]
    fn refuses_bad_schedules() {
        assert!(RetrySchedule::new(vec![], 3).is_err());
        assert!(RetrySchedule::new(vec![Duration::from_millis(1)], 0).is_err());
    }

    proptest! {
        #[test]
        fn parks_exactly_after_max_attempts(max in 1u32..50, attempt in 1u32..60) {
            let s = RetrySchedule::new(vec![Duration::from_millis(1), Duration::from_millis(2)], max).unwrap();
            prop_assert_eq!(s.delay_after(attempt).is_none(), attempt >= max);
        }
    }
}
