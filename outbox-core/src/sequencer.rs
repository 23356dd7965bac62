//! The sequencer: numbers committed events densely per project, after commit.
//!
//! Writers insert with `sequence` NULL, each row carrying its transaction's ID. A tick takes a
//! transaction-level advisory lock (so one sequencer runs at a time; others skip), numbers the
//! committed rows the last stored frontier did not see (in transaction, then arrival order),
//! continuing each project's head, stores the frontier it reached and sends one `NOTIFY` per
//! touched project. The whole tick commits at once, so readers see a dense prefix 1..head and
//! never n+1 without n. Finding the work from a frontier rather than from an index of
//! unnumbered rows keeps every tick's cost to its own batch while an old snapshot anywhere in
//! the database keeps the old versions of everything numbered since (see migration 0014).
//!
//! A busy leader ticks hundreds of times a second, each tick numbering what committed during
//! the last, so a tick's fixed cost weighs on every event. A tick is therefore one statement,
//! a call of `lifecycle_outbox_tick` (migration 0014), in a transaction of its own: one round
//! trip whether it finds work or not, and its statements' plans kept by each server session,
//! behind a transaction pooler as well as on a direct connection. The function's planner
//! settings leave those plans no choice that depends on the statistics or the table's size.
//!
//! Which process ticks, and how often, is the election's ([`ElectedSequencer`], [`Cadence`] and
//! the cadence's constants, re-exported here from the crate's `election` module, which keeps
//! its own log target): one sequencer is one noun, whether it is ticked by hand or elected
//! among many processes.

use std::time::Duration;

use crate::stmt::Unnamed as _;

use tokio_postgres::Client;

use crate::error::Error;
use crate::schema::Schema;
use crate::sql;

pub use crate::election::{
    BUSY_PAUSE_PER_EVENT, Cadence, DEFAULT_IDLE_TICK, DEFAULT_MAX_TICK_PAUSE,
    DEFAULT_SEQUENCER_LEASE_TTL, ElectedSequencer, MAX_TICK_PAUSE_LIMIT, MIN_SEQUENCER_LEASE_TTL,
};

/// Default number of events one tick numbers.
pub const DEFAULT_BATCH: i64 = 10_000;

/// What one tick did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tick {
    /// False when another sequencer held the lock and this tick did nothing.
    pub ran: bool,
    /// Events numbered.
    pub numbered: u64,
    /// Each touched project with its new head sequence.
    pub heads: Vec<(String, i64)>,
}

/// Numbers committed events. Cheap to clone; holds only the rendered statement.
#[derive(Debug, Clone)]
pub struct Sequencer {
    /// The tick statement (a call of the tick function) for the schema.
    statement: String,
    /// Advisory lock that elects one sequencer at a time within the schema.
    lock_key: i64,
    /// Channel notified with each touched project ID.
    channel: String,
    /// Upper bound of events per tick, so one tick stays a short transaction.
    batch: i64,
}

impl Sequencer {
    /// A sequencer for `schema` with the default batch size; safe on any connection, a
    /// transaction pooler's included.
    pub fn new(schema: &Schema) -> Self {
        Self {
            statement: schema.render(sql::TICK),
            lock_key: schema.lock_key("sequence"),
            channel: schema.channel(),
            batch: DEFAULT_BATCH,
        }
    }

    /// Sets how many events one tick numbers at most (at least 1).
    pub fn with_batch(mut self, batch: i64) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// The NOTIFY channel; each payload is a project ID.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Numbers up to one batch of committed events, in one statement: the idle probe, the
    /// lock and the numbering run in the server without waiting for this process between
    /// them, so a process paused while its tick runs does not hold the lock (the server
    /// finishes the tick alone; its answer, a row per touched project, fits the socket's
    /// buffer unless a tick touches thousands of projects). A failed tick rolls back whole.
    pub async fn tick(&self, client: &mut Client) -> Result<Tick, Error> {
        let rows = client
            .query_unnamed(
                &self.statement,
                &[&self.lock_key, &self.batch, &self.channel],
            )
            .await?;
        let mut tick = Tick {
            ran: true,
            ..Tick::default()
        };
        for row in rows {
            if !row.try_get::<_, bool>("locked")? {
                tick.ran = false;
                continue;
            }
            let numbered: i64 = row.try_get("numbered")?;
            tick.numbered += numbered as u64;
            tick.heads
                .push((row.try_get("project_id")?, row.try_get("head_sequence")?));
        }
        if tick.numbered > 0 {
            tracing::debug!(
                numbered = tick.numbered,
                projects = tick.heads.len(),
                "sequenced"
            );
        }
        Ok(tick)
    }

    /// Ticks until no committed event is left unsequenced (or another sequencer holds the
    /// lock); returns how many events this call numbered.
    pub async fn drain(&self, client: &mut Client) -> Result<u64, Error> {
        self.drain_through(client, Duration::ZERO).await
    }

    /// Ticks until everything committed before the call is numbered, for a caller about to
    /// read a snapshot that should include it (a reconciliation's head). Where [`drain`]
    /// stops at another sequencer's lock, this waits it out: the lock lasts one tick's
    /// transaction, and that tick may be numbering exactly the events the caller means to
    /// read, still uncommitted. A tick that gets the lock runs after the holder's commit, so
    /// when this returns having ticked, every earlier tick's numbers are visible. Past
    /// `patience` it stops waiting and returns what it numbered, leaving the rest to the
    /// holder: the caller then reads a head a little behind, never a wrong one.
    ///
    /// [`drain`]: Self::drain
    pub async fn drain_through(
        &self,
        client: &mut Client,
        patience: Duration,
    ) -> Result<u64, Error> {
        self.ticks(client, patience, None).await
    }

    /// Like [`drain`], but returns once `deadline` has passed even while full batches keep
    /// coming: an elected sequencer must get back to renewing its lease, and must stop
    /// numbering when its lease may have run out, however fast writers commit.
    ///
    /// [`drain`]: Self::drain
    pub async fn drain_until(
        &self,
        client: &mut Client,
        deadline: tokio::time::Instant,
    ) -> Result<u64, Error> {
        self.ticks(client, Duration::ZERO, Some(deadline)).await
    }

    /// The loop of [`drain_through`](Self::drain_through) and
    /// [`drain_until`](Self::drain_until).
    async fn ticks(
        &self,
        client: &mut Client,
        patience: Duration,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<u64, Error> {
        let give_up_at = tokio::time::Instant::now() + patience;
        let mut total = 0;
        loop {
            let tick = self.tick(client).await?;
            total += tick.numbered;
            if tick.ran && tick.numbered < self.batch as u64 {
                return Ok(total);
            }
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                return Ok(total);
            }
            if !tick.ran {
                if tokio::time::Instant::now() >= give_up_at {
                    tracing::debug!(numbered = total, "another sequencer kept the lock");
                    return Ok(total);
                }
                tokio::time::sleep(LOCK_RETRY).await;
            }
        }
    }
}

/// How long [`Sequencer::drain_through`] waits before asking for the lock again: about the
/// length of a small tick.
const LOCK_RETRY: Duration = Duration::from_millis(1);
