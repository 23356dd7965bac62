//! How the delivery loop of one run is reached from outside: its wake-up, the replay flag and
//! whether the listener is up; and the rule that decides whether a process may LISTEN at all.

use std::sync::atomic::AtomicBool;

use tokio::sync::Notify;

/// Whether a process may LISTEN: asked to, and not behind a transaction pooler, where a
/// LISTEN would be lost with its server session (the process then polls only).
pub(crate) fn may_listen(listen: bool, pooler: outbox_core::connect::Pooler) -> bool {
    listen && pooler == outbox_core::connect::Pooler::None
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
    fn only_a_direct_connection_listens() {
        assert!(may_listen(true, outbox_core::connect::Pooler::None));
        assert!(!may_listen(false, outbox_core::connect::Pooler::None));
        assert!(!may_listen(true, outbox_core::connect::Pooler::Transaction));
    }
}
