//! What a running consumer tells the process hosting it, for readiness probes: whether it
//! holds its lease, under which generation, and when it last polled its stream.
//!
//! A lone consumer polls on its own timer, so its delivery loop's last completed step is its
//! last poll. A member of a consumer set waits idle without a timer: the set's shared poll
//! reads every project's head on its behalf and wakes the members whose head moved. While a
//! member waits idle after a successful round, each successful shared poll therefore counts as
//! its poll (the crate's `PollClock`); a member busy in a step (a handler that hangs, say) or
//! backing off after a failed round does not wait idle, and its poll time ages as it should.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Shared, lock-light state of one consumer run; read with [`crate::Consumer::probe`].
#[derive(Debug, Default)]
pub struct Probe {
    /// True from the claim until the run ends (released or lost).
    held: AtomicBool,
    /// The generation of the current (or last) claim; 0 before the first.
    generation: AtomicI64,
    /// When the delivery loop last finished a step without error (a poll of the stream).
    polled_at: Mutex<Option<Instant>>,
    /// True while the delivery loop waits for a wake-up after a successful round, with
    /// nothing to do.
    idle: AtomicBool,
    /// The set's shared poll, for a member of a consumer set.
    shared_poll: OnceLock<Arc<PollClock>>,
}

/// When a consumer set's shared poll last succeeded: one per set, shared with every
/// member's [`Probe`].
#[derive(Debug, Default)]
pub(crate) struct PollClock(Mutex<Option<Instant>>);

impl PollClock {
    /// The shared poll succeeded now.
    pub(crate) fn ticked(&self) {
        if let Ok(mut at) = self.0.lock() {
            *at = Some(Instant::now());
        }
    }

    fn last(&self) -> Option<Instant> {
        self.0.lock().map(|at| *at).unwrap_or(None)
    }
}

impl Probe {
    /// True while this process holds the consumer's lease.
    pub fn lease_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// The lease generation of the current (or last) claim; 0 before the first.
    pub fn generation(&self) -> i64 {
        self.generation.load(Ordering::Acquire)
    }

    /// How long ago the consumer last polled its stream successfully: its delivery loop's last
    /// step, or, for a member of a consumer set waiting idle, the set's last shared poll if
    /// that is later. `None` before the first poll.
    pub fn since_last_poll(&self) -> Option<Duration> {
        self.last_poll().map(|at| at.elapsed())
    }

    fn last_poll(&self) -> Option<Instant> {
        let own = self.polled_at.lock().map(|at| *at).unwrap_or(None);
        if !self.idle.load(Ordering::Acquire) {
            return own;
        }
        let shared = self.shared_poll.get().and_then(|clock| clock.last());
        own.max(shared)
    }

    pub(crate) fn claimed(&self, generation: i64) {
        self.generation.store(generation, Ordering::Release);
        self.held.store(true, Ordering::Release);
    }

    pub(crate) fn released(&self) {
        self.held.store(false, Ordering::Release);
        self.idle.store(false, Ordering::Release);
        if let Ok(mut at) = self.polled_at.lock() {
            *at = None;
        }
    }

    pub(crate) fn polled(&self) {
        if let Ok(mut at) = self.polled_at.lock() {
            *at = Some(Instant::now());
        }
    }

    /// The delivery loop starts (`true`) or stops (`false`) waiting idle. Leaving the idle
    /// wait keeps the shared polls it counted: a step that then hangs ages from the last of
    /// them, not from the step before the wait.
    pub(crate) fn idle(&self, idle: bool) {
        if idle {
            self.idle.store(true, Ordering::Release);
            return;
        }
        let last = self.last_poll();
        self.idle.store(false, Ordering::Release);
        if let Ok(mut at) = self.polled_at.lock() {
            *at = last;
        }
    }

    /// Makes this the probe of a member of a set whose shared poll is `clock`.
    pub(crate) fn follow_shared_poll(&self, clock: Arc<PollClock>) {
        let _ = self.shared_poll.set(clock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_member_counts_the_shared_poll_and_a_busy_one_does_not() {
        let clock = Arc::new(PollClock::default());
        let probe = Probe::default();
        probe.follow_shared_poll(clock.clone());
        probe.polled();
        let own = probe.last_poll().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        clock.ticked();
        let shared = clock.last().unwrap();
        assert!(shared > own);
        // Busy (not waiting idle): the shared poll does not count.
        assert_eq!(probe.last_poll(), Some(own));
        probe.idle(true);
        assert_eq!(probe.last_poll(), Some(shared));
        // Woken: it keeps what it counted while idle.
        probe.idle(false);
        assert_eq!(probe.last_poll(), Some(shared));
        std::thread::sleep(Duration::from_millis(5));
        clock.ticked();
        assert_eq!(probe.last_poll(), Some(shared), "busy again");
        probe.released();
        assert_eq!(probe.last_poll(), None);
    }

    #[test]
    fn a_lone_consumer_has_only_its_own_polls() {
        let probe = Probe::default();
        probe.idle(true);
        assert_eq!(probe.last_poll(), None);
        probe.polled();
        assert!(probe.last_poll().is_some());
    }
}
