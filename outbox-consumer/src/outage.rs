//! Riding out an unavailable database: which failures count as an outage. Whether the
//! database is up is the [`Availability`]'s (re-exported here; one per process, carried in
//! [`Duties::availability`](crate::Duties::availability)); the waits between attempts are
//! [`outage_backoff`](crate::backoff::outage_backoff)'s; the loops that retry are the crate's
//! `repeat` module's.
//!
//! Every long-running part of a process reports here: the start-up checks, the lease claim,
//! the delivery loop, the heartbeat, the listener, the sequencer and a set's poll. Many of
//! them fail at once when the database goes away; the log says so once, not once per part
//! and attempt.

use crate::error::ConsumerError;

pub use crate::availability::Availability;

/// Whether `e` means the database is unavailable for now (see
/// [`outbox_core::connect::is_outage`]), including a pool that could not make a connection.
pub fn is_outage(e: &ConsumerError) -> bool {
    use deadpool_postgres::{HookError, PoolError, TimeoutType};
    match e {
        ConsumerError::Database(e) => outbox_core::connect::is_outage(e),
        ConsumerError::Core(e) => e.is_outage(),
        ConsumerError::Pool(PoolError::Backend(e))
        | ConsumerError::Pool(PoolError::PostCreateHook(HookError::Backend(e))) => {
            outbox_core::connect::is_outage(e)
        }
        ConsumerError::Pool(PoolError::Timeout(TimeoutType::Create | TimeoutType::Recycle)) => true,
        _ => false,
    }
}

/// A failure that may be an outage, for [`Repeat`](crate::repeat::Repeat).
pub(crate) trait MaybeOutage: std::fmt::Display {
    /// Whether it found the database unavailable.
    fn is_outage(&self) -> bool;
}

impl MaybeOutage for ConsumerError {
    fn is_outage(&self) -> bool {
        is_outage(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_error_is_no_outage() {
        let e = ConsumerError::Config(crate::config::ConfigError("x".into()));
        assert!(!is_outage(&e));
    }
}
