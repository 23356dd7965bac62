//! The sequencer: numbers committed events densely per project, after commit.
//!
//! Writers insert with `sequence` NULL. A tick takes a transaction-level advisory lock (so one
//! sequencer runs at a time; others skip), numbers the visible (committed) unsequenced rows in
//! arrival order, advances each project's head and sends one `NOTIFY` per touched project. The
//! whole tick commits at once, so readers see a dense prefix 1..head and never n+1 without n.

use crate::stmt::Unnamed as _;
use std::time::Duration;

use tokio_postgres::Client;

use crate::error::Error;
use crate::schema::Schema;
use crate::sql;

/// Default bound on a tick's idle time inside its transaction.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Numbers committed events. Cheap to clone; holds only rendered statements.
#[derive(Debug, Clone)]
pub struct Sequencer {
    /// Advisory lock that elects one sequencer at a time within the schema.
    lock_key: i64,
    /// Channel notified with each touched project ID.
    channel: String,
    /// The numbering statement for the schema.
    number: String,
    /// The idle probe for the schema.
    pending: String,
    /// Upper bound of events per tick, so one tick stays a short transaction.
    batch: i64,
    /// The server ends a tick idle in its transaction for longer (releasing the lock).
    idle_timeout_ms: String,
}

impl Sequencer {
    /// A sequencer for `schema` with the default batch size.
    pub fn new(schema: &Schema) -> Self {
        Self {
            lock_key: schema.lock_key("sequence"),
            channel: schema.channel(),
            number: schema.render(sql::NUMBER_PENDING),
            pending: schema.render(sql::PENDING_EXISTS),
            batch: DEFAULT_BATCH,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT.as_millis().to_string(),
        }
    }

    /// Sets how many events one tick numbers at most (at least 1).
    pub fn with_batch(mut self, batch: i64) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// Sets how long a tick may sit idle inside its transaction before the server ends the
    /// session and so releases the sequencer lock (at least 100 ms).
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout_ms = timeout.as_millis().max(100).to_string();
        self
    }

    /// The NOTIFY channel; each payload is a project ID.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Numbers up to one batch of committed events.
    pub async fn tick(&self, client: &mut Client) -> Result<Tick, Error> {
        let pending: bool = client
            .query_one_unnamed(&self.pending, &[])
            .await?
            .try_get("pending")?;
        if !pending {
            return Ok(Tick {
                ran: true,
                ..Tick::default()
            });
        }
        let tx = client.transaction().await?;
        let locked: bool = tx
            .query_one_unnamed(sql::TRY_LOCK, &[&self.lock_key, &self.idle_timeout_ms])
            .await?
            .try_get("locked")?;
        if !locked {
            return Ok(Tick::default());
        }
        // A new statement, so its snapshot is taken after the lock was granted.
        let rows = tx.query_unnamed(&self.number, &[&self.batch]).await?;
        let mut tick = Tick {
            ran: true,
            ..Tick::default()
        };
        let mut projects = Vec::with_capacity(rows.len());
        for row in rows {
            let project: String = row.try_get("project_id")?;
            let head: i64 = row.try_get("head_sequence")?;
            let numbered: i64 = row.try_get("numbered")?;
            tick.numbered += numbered as u64;
            projects.push(project.clone());
            tick.heads.push((project, head));
        }
        if !projects.is_empty() {
            tx.execute_unnamed(sql::NOTIFY_PROJECTS, &[&self.channel, &projects])
                .await?;
        }
        tx.commit().await?;
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
        let mut total = 0;
        loop {
            let tick = self.tick(client).await?;
            total += tick.numbered;
            if !tick.ran || tick.numbered < self.batch as u64 {
                return Ok(total);
            }
        }
    }
}
