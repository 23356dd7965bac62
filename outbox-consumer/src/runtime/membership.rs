//! Whether a consumer runs alone or as a member of a consumer set: the one place where the
//! two differ. Alone, a run starts its own background tasks, polls on its own timer, reads
//! ahead and acknowledges with its own statements; in a set, the set's shared side does the
//! first three for every member and groups acknowledgements.

use std::sync::Arc;

use deadpool_postgres::Pool;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use outbox_core::ProjectId;
use tokio_util::sync::CancellationToken;

use super::fetch::{self, Fetched, Prefetch, ReadAfter};
use crate::background;
use crate::config::ConsumerConfig;
use crate::error::ConsumerError;
use crate::lease::{Fence, Lease};
use crate::listener;
use crate::signals::Signals;
use crate::store::Statements;
use crate::task::Task;

/// What a run lends its membership when it joins.
pub(crate) struct RunContext<'a> {
    /// The consumer's pool.
    pub pool: &'a Pool,
    /// A lone consumer's listener connection, if it listens.
    pub listen: Option<&'a listener::Target>,
    /// The consumer's configuration.
    pub config: &'a ConsumerConfig,
    /// The run's statements.
    pub statements: &'a Arc<Statements>,
    /// Stops whatever the membership started for the run.
    pub stop: &'a CancellationToken,
}

/// What joining gave the run.
pub(crate) struct Joined {
    /// The run's wake-ups.
    pub signals: Arc<Signals>,
    /// Tasks the run owns (stopped by the run's stop token, awaited at its end).
    pub tasks: Vec<Task>,
    /// Whether the loop polls on its own timer; in a set the shared poll wakes every member.
    pub polls_itself: bool,
}

/// How a grouped acknowledgement went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupedAck {
    /// Written with others in one statement.
    Acknowledged,
    /// Refused: the lease is gone.
    Refused,
    /// Not grouped (alone, the group's statement failed, or the set is stopping): the run
    /// acknowledges with its own statement, which reports any error properly.
    NotGrouped,
}

/// Alone or in a set. See the module docs.
pub(crate) trait Membership: Send + Sync + 'static {
    /// The lease owner a run claims with.
    fn owner(&self) -> String;

    /// The runtime's statements for `config`.
    fn statements(&self, config: &ConsumerConfig) -> Arc<Statements>;

    /// Whether a run checks an explicitly given live query itself before claiming its lease
    /// (a set checks it once for all its members).
    fn checks_live_query(&self) -> bool;

    /// Starts what the run needs once its lease is claimed.
    fn join(&self, run: &RunContext<'_>, lease: &Arc<Lease>) -> Joined;

    /// Ends the run's membership, before its lease is released.
    fn leave(&self, lease: &Arc<Lease>);

    /// Reads the batch after `read.cursor`; `ahead` is the run's read ahead, if the membership
    /// reads ahead.
    fn read<'a>(
        &'a self,
        read: ReadAfter<'a>,
        ahead: &'a mut Option<Prefetch>,
    ) -> BoxFuture<'a, Result<Fetched, ConsumerError>>;

    /// Acknowledges through `through` together with others, if the membership groups; the
    /// acknowledgement is conditional on the cursor still standing at `left_at`.
    fn ack<'a>(&'a self, fence: &'a Fence, left_at: i64, through: i64)
    -> BoxFuture<'a, GroupedAck>;

    /// The run numbered `project`'s committed events itself: shared copies read before are
    /// stale.
    fn numbered(&self, project: &ProjectId);
}

/// A consumer on its own.
pub(crate) struct Lone;

impl Membership for Lone {
    fn owner(&self) -> String {
        outbox_core::internal::owner_token()
    }

    fn statements(&self, config: &ConsumerConfig) -> Arc<Statements> {
        Arc::new(Statements::new(&config.duties.schema, config.duties.pooler))
    }

    fn checks_live_query(&self) -> bool {
        true
    }

    fn join(&self, run: &RunContext<'_>, lease: &Arc<Lease>) -> Joined {
        let signals = Arc::new(Signals::default());
        let tasks = background::spawn(
            run.pool,
            run.listen,
            run.config,
            lease,
            run.statements,
            &signals,
            run.stop,
        );
        Joined {
            signals,
            tasks,
            polls_itself: true,
        }
    }

    fn leave(&self, _: &Arc<Lease>) {}

    fn read<'a>(
        &'a self,
        read: ReadAfter<'a>,
        ahead: &'a mut Option<Prefetch>,
    ) -> BoxFuture<'a, Result<Fetched, ConsumerError>> {
        fetch::alone(read, ahead).boxed()
    }

    fn ack<'a>(&'a self, _: &'a Fence, _: i64, _: i64) -> BoxFuture<'a, GroupedAck> {
        std::future::ready(GroupedAck::NotGrouped).boxed()
    }

    fn numbered(&self, _: &ProjectId) {}
}
