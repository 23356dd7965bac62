//! The consumer runtime: claim the lease, then loop over wake-ups, poll ticks and shutdown,
//! delivering events in order from the cursor.
//!
//! A run goes through phases, one file each: [`run`] sets up and tears down, [`deliver`] is
//! the loop and the one place that decides between waiting and exiting, [`read`] reads the
//! next batch (a lone consumer [`fetch`]es it, and the one after ahead), [`batch`] dispatches it and decides what follows,
//! [`ack`] acknowledges, [`failures`] records failed attempts, retry waits and parking,
//! [`reconcile`] settles a missing or out-of-bounds cursor and [`replay`] serves replay
//! requests; with more than one lane, [`lanes`] runs several keys' events at once instead of
//! batches. Where the run stands in the stream is its [`position`]; whether it runs alone or
//! in a consumer set is its [`membership`]. Every phase reports a transient failure the same
//! way, as a retryable [`ConsumerError`], and leaves the decision to the loop.

mod ack;
mod batch;
mod deliver;
mod failures;
mod fetch;
mod identity;
mod lanes;
mod membership;
mod position;
mod progress;
mod read;
mod reconcile;
mod replay;
mod run;

use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio_postgres::Config;

pub(crate) use fetch::{Fetched, Prefetch, ReadAfter};
pub(crate) use membership::{GroupedAck, Joined, Membership, RunContext};

use crate::config::ConsumerConfig;
use crate::dispatch::{InTransaction, Plain};
use crate::handler::{Handler, Reconciler, TransactionalHandler};
use crate::listener;
use crate::probe::Probe;

/// Connections a consumer needs at once: the delivery loop, the heartbeat and the sequencer.
/// The retention sweep borrows one more for a moment per batch; it waits for a free one
/// rather than holding one. (The listener has its own, unpooled connection.)
pub const MIN_POOL_SIZE: usize = 3;

/// How many times slower a lone consumer's fallback poll is while its LISTEN connection is up:
/// idle, it is most of what a consumer process sends the database.
pub const LISTENING_POLL_FACTOR: u32 = 5;

/// What a run did, returned when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// The lease generation this run held (0 if it never claimed).
    pub generation: i64,
    /// Events handled and acknowledged in order.
    pub delivered: u64,
    /// The cursor at the end.
    pub cursor: Option<i64>,
}

/// A durable consumer of one project's stream. See the crate docs.
pub struct Consumer<D, R> {
    /// Connections for claims, reads, acks and heartbeats.
    pool: Pool,
    /// The dedicated listener connection of a lone consumer; `None` polls only.
    listen: Option<listener::Target>,
    /// Identity and timing.
    config: ConsumerConfig,
    /// Plain or transactional handler.
    dispatch: D,
    /// Receives the live set when the consumer falls back to reconciliation.
    reconciler: R,
    /// Alone, or a member of a consumer set (whose shared side then renews the lease, polls, wakes the
    /// loop, shares reads of the project and groups acknowledgements).
    membership: Arc<dyn Membership>,
    /// Lease and liveness, for the hosting process's readiness probe.
    probe: Arc<Probe>,
}

impl<D, R> Consumer<D, R> {
    fn with(
        pool: Pool,
        listen_config: Option<Config>,
        config: ConsumerConfig,
        dispatch: D,
        reconciler: R,
    ) -> Self {
        Self {
            pool,
            listen: listen_config.map(|config| listener::Target { config, tls: None }),
            config,
            dispatch,
            reconciler,
            membership: Arc::new(membership::Lone),
            probe: Arc::default(),
        }
    }

    /// Opens the LISTEN connection through `connector` (built by
    /// [`outbox_core::connect::ConnectSettings::connector`]), so that it uses the same TLS settings as
    /// the pool; without it the listener connects without TLS.
    pub fn listen_tls(mut self, connector: outbox_core::connect::Connector) -> Self {
        if let Some(listen) = &mut self.listen {
            listen.tls = Some(connector);
        }
        self
    }

    /// Makes this consumer a member of a consumer set.
    pub(crate) fn in_set(mut self, membership: Arc<dyn Membership>) -> Self {
        self.membership = membership;
        self
    }

    /// Whether this consumer holds its lease and when it last polled; shared with the run.
    pub fn probe(&self) -> Arc<Probe> {
        self.probe.clone()
    }
}

impl<H: Handler, R: Reconciler> Consumer<Plain<H>, R> {
    /// A consumer that acknowledges after `handler` returns (at-least-once).
    pub fn new(
        pool: Pool,
        listen_config: Option<Config>,
        config: ConsumerConfig,
        handler: H,
        reconciler: R,
    ) -> Self {
        Self::with(pool, listen_config, config, Plain(handler), reconciler)
    }
}

impl<T: TransactionalHandler, R: Reconciler> Consumer<InTransaction<T>, R> {
    /// A consumer whose handler runs inside the transaction that advances the cursor.
    pub fn transactional(
        pool: Pool,
        listen_config: Option<Config>,
        config: ConsumerConfig,
        handler: T,
        reconciler: R,
    ) -> Self {
        Self::with(
            pool,
            listen_config,
            config,
            InTransaction(handler),
            reconciler,
        )
    }
}
