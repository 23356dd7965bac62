//! Consumer configuration: a pair's identity, its delivery settings, the process's duties,
//! and the defaults and ceilings of each setting. The pool's floor and the poll interval's
//! factor while listening ([`MIN_POOL_SIZE`], [`LISTENING_POLL_FACTOR`]) are the runtime's,
//! re-exported here.

use std::time::Duration;

use outbox_core::{ConsumerId, ProjectId, Schema};

use crate::retry::RetrySchedule;

pub use crate::runtime::{LISTENING_POLL_FACTOR, MIN_POOL_SIZE};

/// Default live-set query: the project's tasks that are not deleted. `$1` is the project ID.
pub const DEFAULT_LIVE_QUERY: &str =
    "SELECT id::text FROM tasks WHERE project_id = $1 AND deleted_at IS NULL";

/// The query that reads a project's live task set for reconciliation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LiveQuery {
    /// [`DEFAULT_LIVE_QUERY`]: checked before the lease is claimed, as a custom query is,
    /// unless the consumer starts from the earliest event (it may never reconcile, and its
    /// database need not have a `tasks` table): then when it is first needed.
    #[default]
    Default,
    /// The application's own query: `$1` is the project ID; one text column; read-only.
    /// Checked before the lease is claimed, so a wrong one holds nothing.
    Custom(String),
}

impl LiveQuery {
    /// The query's SQL.
    pub fn sql(&self) -> &str {
        match self {
            LiveQuery::Default => DEFAULT_LIVE_QUERY,
            LiveQuery::Custom(sql) => sql,
        }
    }

    /// What is wrong with the query's text, found before any database sees it (the rest of
    /// its shape is checked when it is prepared): `None` when nothing is.
    pub fn problem(&self) -> Option<&'static str> {
        crate::live_query::text_problem(self.sql())
    }

    /// Whether the application gave its own query.
    pub fn is_custom(&self) -> bool {
        matches!(self, LiveQuery::Custom(_))
    }
}

/// Where a consumer without a cursor starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartFrom {
    /// Full reconciliation, then events after the snapshot's head (the default).
    #[default]
    Reconcile,
    /// Every retained event from sequence 1, for a brand-new consumer; falls back to
    /// reconciliation when history has already been pruned (it would be incomplete), and never
    /// applies to a reactivated consumer.
    Earliest,
}

/// Default [`DeliverySettings::batch_size`].
pub const DEFAULT_BATCH_SIZE: i64 = 500;

/// Default [`DeliverySettings::max_batch_size`]: how far a catch-up's reads grow. Chosen by
/// measurement (`bench/consumer.sh` with `BENCH_MAX_BATCH_SIZES`: maxima side by side with
/// fixed batches of 500 in one run, 1M-event backlog): growing to 2,000 made the catch-up 2.0
/// times as fast, to 4,000 2.8 times (peak RSS 24 MiB), to 8,000 2.9 times but 35 MiB, past
/// the 32 MiB the consumer is held to (the batch dispatched and the two read ahead are in
/// memory at once).
pub const DEFAULT_MAX_BATCH_SIZE: i64 = 4_000;

/// The ceiling of [`DeliverySettings::batch_size`] and [`DeliverySettings::max_batch_size`]:
/// past it a read holds more in memory than it saves in round trips (10,000 events of the
/// benchmark's payload: about 49 MiB peak).
pub const MAX_BATCH_SIZE_CEILING: i64 = 10_000;

/// The ceiling of [`DeliverySettings::lanes`]: past it the handlers' concurrency, not the
/// consumer, is the limit, and every lane holds a connection's worth of work in flight.
pub const MAX_LANES: usize = 256;

/// Default [`DeliverySettings::max_ahead`]: how far beyond the cursor lanes may run.
pub const DEFAULT_MAX_AHEAD: i64 = 1_000;

/// The ceiling of [`DeliverySettings::max_ahead`]: the events ahead are held in memory.
pub const MAX_AHEAD_CEILING: i64 = 100_000;

/// How one pair (project and consumer) delivers: batching, its lease, polling, retries, where
/// it starts and when it stops. A [`ConsumerSet`](crate::ConsumerSet) runs every pair with one
/// template of these. Built with [`DeliverySettings::default`], then adjusted field by field.
#[derive(Debug, Clone)]
pub struct DeliverySettings {
    /// Events read and dispatched per batch when caught up, and the first read of a catch-up.
    pub batch_size: i64,
    /// The most events one read asks for. While reads come back full (a backlog), a lone
    /// consumer doubles its read from `batch_size` up to this; the first read that comes back
    /// short (caught up) returns it to `batch_size`. A crash repeats at most one read batch,
    /// so at most this many events. Equal to `batch_size`: every read is `batch_size`. At
    /// least `batch_size`, at most [`MAX_BATCH_SIZE_CEILING`]. Members of a
    /// [`ConsumerSet`](crate::ConsumerSet) grouped for shared reads read `batch_size` always.
    pub max_batch_size: i64,
    /// How long a lease lasts without a heartbeat.
    pub lease_ttl: Duration,
    /// How often the lease is renewed, on its own timer.
    pub heartbeat_interval: Duration,
    /// Fallback poll when no wake-up arrives (lost notifications, `listen = false`). While the
    /// LISTEN connection is up, notifications carry the news and the poll is only a safety net
    /// (and how replay requests are found): a lone consumer then polls
    /// [`LISTENING_POLL_FACTOR`] times less often.
    pub poll_interval: Duration,
    /// Retry schedule for failed events.
    pub retry: RetrySchedule,
    /// Where a consumer without a cursor starts.
    pub start_from: StartFrom,
    /// The live-set query for reconciliation.
    pub live_query: LiveQuery,
    /// Wait for a held lease to expire (true) or fail at once (false).
    pub wait_for_lease: bool,
    /// Reactivate a retired consumer (it then reconciles) instead of refusing to start.
    pub reactivate: bool,
    /// Refuse to register a consumer that does not exist yet
    /// ([`ConsumerError::UnknownConsumer`](crate::ConsumerError::UnknownConsumer)): for
    /// production units, where a new consumer ID is a typo that would hold retention back.
    /// Decided by the claim itself, under the consumer row's lock.
    pub existing_only: bool,
    /// Stop (returning `Ok`) once every committed event is numbered and handled and no failed
    /// event is waiting for a retry: for scripts and batch jobs.
    pub exit_when_caught_up: bool,
    /// How long shutdown waits for a running handler before abandoning its event.
    pub shutdown_grace: Duration,
    /// The event types and majors the handler understands (default `task:deleted@1`): an
    /// event of another type moves the cursor without a handler call (counted in
    /// `outbox_events_skipped_total`); an event of a declared type in another major is parked
    /// at once as a `contract_mismatch` dead letter, replayable once the declaration names
    /// it. Each must be registered: the consumer refuses to start otherwise.
    pub event_types: outbox_core::contract::EventTypes,
    /// How many events of the project are handled at once, each of a different key (the
    /// event's subject, its task ID): a key's events are never handled concurrently nor out
    /// of sequence order. 1 (the default) handles the stream one event at a time, in order.
    /// At most [`MAX_LANES`]. More than 1 is refused for a handler that declares it needs
    /// the stream's total order ([`Handler::needs_total_order`](crate::Handler::needs_total_order))
    /// and for a transactional handler.
    pub lanes: usize,
    /// With more than one lane: how far beyond the cursor lanes may run, in events. The
    /// cursor moves only over events all handled (acknowledged or parked); a crash repeats at
    /// most this many events, and at most this many are held in memory. At least
    /// `batch_size`, at most [`MAX_AHEAD_CEILING`]; unused with one lane.
    pub max_ahead: i64,
}

/// What the process shares and does beside delivering, once however many pairs it runs: the
/// outbox's schema, the pooler in front of PostgreSQL, LISTEN, the embedded sequencer, the
/// retention sweep and the gauges. Built with [`Duties::default`], then adjusted field by
/// field.
#[derive(Debug, Clone)]
pub struct Duties {
    /// Schema of the outbox tables.
    pub schema: Schema,
    /// LISTEN for wake-ups on a dedicated connection (off for transaction-mode poolers).
    pub listen: bool,
    /// Whether a transaction-mode pooler sits in front of PostgreSQL (see
    /// [`outbox_core::connect::Pooler`]). `Transaction` implies no LISTEN whatever `listen` says: the
    /// consumers poll every [`DeliverySettings::poll_interval`], which then bounds their
    /// latency.
    pub pooler: outbox_core::connect::Pooler,
    /// How often the gauges (`outbox_consumer_lag_events`, `outbox_dead_letters`, the
    /// unsequenced backlog) are sampled, one statement each time; `None` samples nothing, for
    /// a process that exports no metrics. `outbox consume --metrics-addr` and `outbox serve`
    /// sample at the poll interval.
    pub gauge_interval: Option<Duration>,
    /// Whether this process takes part in the sequencer election, and the slowest tick of its
    /// sequencer while it leads and nothing arrives (after a tick that numbered something it
    /// ticks again soon, [`outbox_core::sequencer::Cadence`]); `None` leaves sequencing to other
    /// processes.
    pub sequence_interval: Option<Duration>,
    /// Length of the sequencer lease: a dead leader is replaced within 1.25 times this.
    pub sequencer_lease_ttl: Duration,
    /// The shortest pause of this process's sequencer after a tick that numbered something,
    /// at most [`outbox_core::sequencer::MAX_TICK_PAUSE_LIMIT`]; zero (the default) pauses as
    /// the batch asks ([`outbox_core::sequencer::Cadence`]). Fewer, larger ticks, reads and
    /// acknowledgements at moderate rates, for up to this much more latency.
    pub min_tick_pause: Duration,
    /// How often this process runs the retention sweep of its projects (also once at start);
    /// `None` leaves pruning to other processes or `outbox prune`.
    pub prune_interval: Option<Duration>,
    /// Retention period of the sweep: events older than this that every non-retired consumer
    /// acknowledged are pruned, settled dead letters this long after they were settled.
    pub retention: Duration,
    /// Whether the database is up, as every part of the process sees it (one log line when
    /// it goes, one when it is back; `outbox_database_up`; readiness), and how long an outage
    /// may last before the process gives up. A handle: clones share one view, so give the
    /// same one to everything that serves the process's readiness.
    pub availability: crate::outage::Availability,
}

/// How a lone consumer runs: the pair it is, how it delivers, and the process's duties.
/// Built with [`ConsumerConfig::new`], then adjusted field by field.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The project whose stream is consumed.
    pub project_id: ProjectId,
    /// The explicit, stable consumer identity (never generated).
    pub consumer_id: ConsumerId,
    /// How the pair delivers.
    pub delivery: DeliverySettings,
    /// What the process does beside delivering.
    pub duties: Duties,
}

/// A configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid consumer configuration: {0}")]
pub struct ConfigError(pub String);

impl Default for DeliverySettings {
    /// Batches of 500 growing to [`DEFAULT_MAX_BATCH_SIZE`] in a catch-up, a 60 s lease renewed every 10 s, a 1 s fallback poll, the standard retry
    /// schedule, reconcile when the cursor is missing, wait for a held lease, 10 s shutdown
    /// grace.
    fn default() -> Self {
        Self {
            batch_size: DEFAULT_BATCH_SIZE,
            max_batch_size: DEFAULT_MAX_BATCH_SIZE,
            lease_ttl: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            retry: RetrySchedule::default(),
            start_from: StartFrom::Reconcile,
            live_query: LiveQuery::Default,
            wait_for_lease: true,
            reactivate: false,
            existing_only: false,
            exit_when_caught_up: false,
            shutdown_grace: Duration::from_secs(10),
            event_types: outbox_core::contract::EventTypes::default(),
            lanes: 1,
            max_ahead: DEFAULT_MAX_AHEAD,
        }
    }
}

impl DeliverySettings {
    /// Whether the live query is checked before anything is claimed (a wrong one then
    /// registers no consumer): always, except the default query of a consumer that starts
    /// from the earliest event (see [`LiveQuery::Default`]).
    pub fn checks_live_query_first(&self) -> bool {
        self.live_query.is_custom() || self.start_from != StartFrom::Earliest
    }

    /// Checks the relations between settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_BATCH_SIZE_CEILING).contains(&self.batch_size) {
            return Err(ConfigError(format!(
                "batch size {} is outside 1..={MAX_BATCH_SIZE_CEILING}",
                self.batch_size
            )));
        }
        if !(self.batch_size..=MAX_BATCH_SIZE_CEILING).contains(&self.max_batch_size) {
            return Err(ConfigError(format!(
                "max batch size {} is outside {}..={MAX_BATCH_SIZE_CEILING} (it must be at least \
                 the batch size, {})",
                self.max_batch_size, self.batch_size, self.batch_size
            )));
        }
        if self.lease_ttl < Duration::from_secs(1) {
            return Err(ConfigError("lease TTL must be at least 1s".into()));
        }
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval * 2 > self.lease_ttl {
            return Err(ConfigError(format!(
                "heartbeat interval {:?} must be positive and at most half the lease TTL {:?}",
                self.heartbeat_interval, self.lease_ttl
            )));
        }
        if self.poll_interval.is_zero() {
            return Err(ConfigError("poll interval must be positive".into()));
        }
        if !(1..=MAX_LANES).contains(&self.lanes) {
            return Err(ConfigError(format!(
                "lanes {} is outside 1..={MAX_LANES}",
                self.lanes
            )));
        }
        if self.lanes > 1 && !(self.batch_size..=MAX_AHEAD_CEILING).contains(&self.max_ahead) {
            return Err(ConfigError(format!(
                "max ahead {} is outside {}..={MAX_AHEAD_CEILING} (it must be at least the \
                 batch size, {})",
                self.max_ahead, self.batch_size, self.batch_size
            )));
        }
        if let Some(problem) = self.live_query.problem() {
            return Err(ConfigError(format!("the live-set query: {problem}")));
        }
        Ok(())
    }
}

impl Default for Duties {
    /// The default schema, no pooler, LISTEN on, no gauges, an elected sequencer (10 s lease)
    /// ticking back to back while events arrive and every 50 ms when idle, a retention sweep at
    /// start and hourly with 30 days' retention, a new
    /// [`Availability`](crate::outage::Availability) that never gives up.
    fn default() -> Self {
        Self {
            schema: Schema::default(),
            listen: true,
            pooler: outbox_core::connect::Pooler::None,
            gauge_interval: None,
            sequence_interval: Some(outbox_core::sequencer::DEFAULT_IDLE_TICK),
            sequencer_lease_ttl: outbox_core::sequencer::DEFAULT_SEQUENCER_LEASE_TTL,
            min_tick_pause: Duration::ZERO,
            prune_interval: Some(Duration::from_secs(3600)),
            retention: outbox_core::retention::DEFAULT_RETENTION,
            availability: crate::outage::Availability::new(),
        }
    }
}

impl Duties {
    /// Checks the relations between settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.sequence_interval.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError("sequence interval must be positive".into()));
        }
        if self.sequencer_lease_ttl < outbox_core::sequencer::MIN_SEQUENCER_LEASE_TTL {
            return Err(ConfigError(format!(
                "sequencer lease TTL {:?} is below the minimum of {:?}",
                self.sequencer_lease_ttl,
                outbox_core::sequencer::MIN_SEQUENCER_LEASE_TTL
            )));
        }
        if self.min_tick_pause > outbox_core::sequencer::MAX_TICK_PAUSE_LIMIT {
            return Err(ConfigError(format!(
                "minimum tick pause {} is above the limit of {}",
                outbox_core::internal::Readable(self.min_tick_pause),
                outbox_core::internal::Readable(outbox_core::sequencer::MAX_TICK_PAUSE_LIMIT)
            )));
        }
        if let Some(idle) = self
            .sequence_interval
            .filter(|idle| self.min_tick_pause > *idle)
        {
            return Err(ConfigError(format!(
                "minimum tick pause {} is above the sequence interval {} (the slowest tick while \
                 idle)",
                outbox_core::internal::Readable(self.min_tick_pause),
                outbox_core::internal::Readable(idle)
            )));
        }
        if self.prune_interval.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError("prune interval must be positive".into()));
        }
        if self.retention > outbox_core::retention::MAX_RETENTION {
            return Err(ConfigError(format!(
                "retention {:?} exceeds the limit of 36500 days",
                self.retention
            )));
        }
        Ok(())
    }
}

impl ConsumerConfig {
    /// Consumer `consumer_id` of `project_id`, with the default [`DeliverySettings`] and
    /// [`Duties`].
    pub fn new(project_id: ProjectId, consumer_id: ConsumerId) -> Self {
        Self {
            project_id,
            consumer_id,
            delivery: DeliverySettings::default(),
            duties: Duties::default(),
        }
    }

    /// Checks the delivery settings and the duties.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.delivery.validate()?;
        self.duties.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ConsumerConfig {
        ConsumerConfig::new(ProjectId::new("p").unwrap(), ConsumerId::new("c").unwrap())
    }

    #[test]
    fn defaults_are_valid() {
        config().validate().unwrap();
        assert_eq!(config().delivery.lease_ttl, Duration::from_secs(60));
        assert_eq!(
            config().delivery.heartbeat_interval,
            Duration::from_secs(10)
        );
        assert_eq!(config().delivery.batch_size, 500);
    }

    #[test]
    fn refuses_a_minimum_tick_pause_above_the_limit_or_the_idle_tick() {
        let mut duties = Duties {
            min_tick_pause: Duration::from_millis(50),
            ..Duties::default()
        };
        duties.validate().unwrap();
        duties.min_tick_pause = Duration::from_millis(51);
        let refused = duties.validate().unwrap_err().0;
        assert!(
            refused.contains("above the sequence interval 50ms"),
            "{refused}"
        );
        duties.sequence_interval = Some(Duration::from_secs(1));
        duties.min_tick_pause = Duration::from_millis(101);
        let refused = duties.validate().unwrap_err().0;
        assert!(refused.contains("above the limit of 100ms"), "{refused}");
    }

    #[test]
    fn refuses_inconsistent_timing() {
        let mut c = config();
        c.delivery.heartbeat_interval = Duration::from_secs(40);
        assert!(c.validate().unwrap_err().0.contains("half the lease"));
        let mut c = config();
        c.delivery.batch_size = 0;
        assert!(c.validate().is_err());
        let mut c = config();
        c.delivery.max_batch_size = c.delivery.batch_size - 1;
        assert!(
            c.validate()
                .unwrap_err()
                .0
                .contains("at least the batch size")
        );
        c.delivery.max_batch_size = MAX_BATCH_SIZE_CEILING + 1;
        assert!(c.validate().unwrap_err().0.contains("max batch size"));
        c.delivery.max_batch_size = c.delivery.batch_size;
        c.validate().unwrap();
        let mut c = config();
        c.delivery.live_query = LiveQuery::Custom("SELECT id FROM tasks".into());
        assert!(c.validate().is_err());
        let mut c = config();
        c.delivery.lanes = 0;
        assert!(c.validate().unwrap_err().0.contains("lanes 0 is outside"));
        c.delivery.lanes = MAX_LANES + 1;
        assert!(
            c.validate()
                .unwrap_err()
                .0
                .contains("lanes 257 is outside 1..=256")
        );
        c.delivery.lanes = 16;
        c.validate().unwrap();
        c.delivery.max_ahead = c.delivery.batch_size - 1;
        assert!(
            c.validate()
                .unwrap_err()
                .0
                .contains("max ahead 499 is outside 500..")
        );
        c.delivery.lanes = 1;
        c.validate().unwrap();
        let mut c = config();
        c.duties.prune_interval = Some(Duration::ZERO);
        assert!(c.validate().unwrap_err().0.contains("prune interval"));
        let mut c = config();
        c.duties.sequencer_lease_ttl = Duration::from_millis(100);
        assert!(c.validate().unwrap_err().0.contains("sequencer lease"));
        let mut c = config();
        c.duties.retention = outbox_core::retention::MAX_RETENTION + Duration::from_secs(1);
        assert!(c.validate().unwrap_err().0.contains("retention"));
    }
}
