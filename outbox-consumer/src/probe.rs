//! What a running consumer tells the process hosting it, for readiness probes: whether it
//! holds its lease, under which generation, and when its delivery loop last completed a step.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
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

    /// How long ago the delivery loop last polled the stream successfully; `None` before the
    /// first poll.
    pub fn since_last_poll(&self) -> Option<Duration> {
        self.polled_at
            .lock()
            .map(|at| at.map(|at| at.elapsed()))
            .unwrap_or(None)
    }

    pub(crate) fn claimed(&self, generation: i64) {
        self.generation.store(generation, Ordering::Release);
        self.held.store(true, Ordering::Release);
    }

    pub(crate) fn released(&self) {
        self.held.store(false, Ordering::Release);
        if let Ok(mut at) = self.polled_at.lock() {
            *at = None;
        }
    }

    pub(crate) fn polled(&self) {
        if let Ok(mut at) = self.polled_at.lock() {
            *at = Some(Instant::now());
        }
    }
}
