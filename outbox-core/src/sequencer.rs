//! The sequencer: numbers committed events densely per project, after commit.
//!
//! Writers insert with `sequence` NULL, each row carrying its transaction's ID. A tick takes a
//! transaction-level advisory lock (so one sequencer runs at a time; others skip), numbers the
//! committed rows the last stored frontier did not see (in transaction, then arrival order),
//! continuing each project's head, stores the frontier it reached and sends one `NOTIFY` per
//! touched project. The whole tick commits at once, so readers see a dense prefix 1..head and
//! never n+1 without n. Finding the work from a frontier rather than from an index of
//! unnumbered rows keeps every tick's cost to its own batch while an old snapshot anywhere in
//! the database keeps the old versions of everything numbered since (see `NUMBER_PENDING`).
//!
//! A busy leader ticks hundreds of times a second, each tick numbering what committed during
//! the last, and planning the numbering statement is a good part of such a small tick's
//! server time. On a connection that keeps session state the statement is therefore prepared
//! once per session and each tick runs the kept plan (with 8 writers, about 30 events a tick,
//! the sequencer's backend went from 39-40 to 29-33 µs of CPU per event); behind a
//! transaction pooler it is sent unnamed and planned every tick. Either way the tick's planner
//! settings (see `TRY_LOCK`) leave the plan no choice that depends on the statistics or the
//! table's size.

use crate::stmt::Unnamed as _;
use std::time::Duration;

use tokio_postgres::{Client, SimpleQueryMessage, SimpleQueryRow};

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

/// Numbers committed events. Cheap to clone; holds only rendered statements (a kept plan
/// lives on the server session, which the probe asks about each tick).
#[derive(Debug, Clone)]
pub struct Sequencer {
    /// The schema's numbering statement, without the batch size.
    template: String,
    /// Advisory lock that elects one sequencer at a time within the schema.
    lock_key: i64,
    /// Channel notified with each touched project ID.
    channel: String,
    /// The numbering statement for the schema and batch size.
    number: String,
    /// The idle probe for the schema.
    pending: String,
    /// The idle probe that also asks whether the session holds the prepared statement.
    pending_prepared: String,
    /// Name of the session's prepared numbering statement; `None`: sent unnamed every tick.
    session_plan: Option<String>,
    /// Upper bound of events per tick, so one tick stays a short transaction.
    batch: i64,
    /// The lock statement, with the lock key and the idle bound written in.
    try_lock: String,
}

impl Sequencer {
    /// A sequencer for `schema` with the default batch size, planning every tick (safe on any
    /// connection; see [`Sequencer::with_session_plan`]).
    pub fn new(schema: &Schema) -> Self {
        let channel = schema.channel();
        let template = schema
            .render(sql::NUMBER_PENDING)
            .replace("{{channel}}", &quote_literal(&channel));
        let lock_key = schema.lock_key("sequence");
        Self {
            number: render_batch(&template, DEFAULT_BATCH),
            template,
            lock_key,
            channel,
            pending: schema.render(sql::PENDING_EXISTS),
            pending_prepared: schema.render(sql::PENDING_EXISTS_PREPARED),
            session_plan: None,
            batch: DEFAULT_BATCH,
            try_lock: render_lock(lock_key, DEFAULT_IDLE_TIMEOUT),
        }
    }

    /// Sets how many events one tick numbers at most (at least 1).
    pub fn with_batch(mut self, batch: i64) -> Self {
        self.batch = batch.max(1);
        self.number = render_batch(&self.template, self.batch);
        if self.session_plan.is_some() {
            self.session_plan = Some(self.plan_name());
        }
        self
    }

    /// Keeps the numbering statement prepared on each session it runs on (`true`), so ticks
    /// skip planning it; only for connections that keep session state (a direct connection or
    /// a session-mode pooler), never behind a transaction-mode pooler.
    pub fn with_session_plan(mut self, keep: bool) -> Self {
        self.session_plan = keep.then(|| self.plan_name());
        self
    }

    /// The prepared statement's name: one per schema and batch size.
    fn plan_name(&self) -> String {
        format!("outbox_number_{:016x}_{}", self.lock_key as u64, self.batch)
    }

    /// Sets how long a tick may sit idle inside its transaction before the server ends the
    /// session and so releases the sequencer lock (at least 100 ms).
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.try_lock = render_lock(self.lock_key, timeout);
        self
    }

    /// The NOTIFY channel; each payload is a project ID.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Numbers up to one batch of committed events.
    ///
    /// An idle tick is the probe alone. A tick with work is one more message: `BEGIN`, the
    /// lock, the numbering statement and `COMMIT` sent together in the simple protocol, so the
    /// server runs the whole tick without waiting for this process between its statements
    /// (each statement still takes its own snapshot, the numbering statement's after the
    /// lock was granted). That is two round trips a tick instead of six, and a process paused
    /// while its tick runs no longer holds the lock: the server finishes the tick alone (its
    /// answer, a row per touched project, fits the socket's buffer unless a tick touches
    /// thousands of projects).
    pub async fn tick(&self, client: &mut Client) -> Result<Tick, Error> {
        let (pending, prepared): (bool, bool) = match &self.session_plan {
            None => {
                let probe = client.query_one_unnamed(&self.pending, &[]).await?;
                (probe.try_get("pending")?, false)
            }
            Some(name) => {
                let probe = client
                    .query_one_unnamed(&self.pending_prepared, &[name])
                    .await?;
                (probe.try_get("pending")?, probe.try_get("prepared")?)
            }
        };
        if !pending {
            return Ok(Tick {
                ran: true,
                ..Tick::default()
            });
        }
        if let (Some(name), false) = (&self.session_plan, prepared) {
            // Planned at its first execution, inside a tick, under the tick's settings.
            client
                .batch_execute(&format!("PREPARE {name} AS {}", self.number))
                .await?;
        }
        let messages = match client.simple_query(&self.tick_message()).await {
            Ok(messages) => messages,
            Err(error) => {
                // A statement failed: the rest of the message was skipped and the session
                // sits in the failed transaction until it is ended.
                if !client.is_closed() {
                    let _ = client.batch_execute("ROLLBACK").await;
                }
                return Err(error.into());
            }
        };
        let tick = read_tick(&messages)?;
        if tick.numbered > 0 {
            tracing::debug!(
                numbered = tick.numbered,
                projects = tick.heads.len(),
                "sequenced"
            );
        }
        Ok(tick)
    }

    /// The tick's statements as one simple-protocol message.
    fn tick_message(&self) -> String {
        let number = match &self.session_plan {
            Some(name) => format!("EXECUTE {name}"),
            None => self.number.clone(),
        };
        format!("BEGIN;\n{};\n{number};\nCOMMIT", self.try_lock)
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

/// The numbering statement with its batch size written in.
fn render_batch(template: &str, batch: i64) -> String {
    template.replace("{{batch}}", &batch.to_string())
}

/// The lock statement with the lock key and the idle bound written in.
fn render_lock(lock_key: i64, idle_timeout: Duration) -> String {
    sql::TRY_LOCK
        .replace("{{lock_key}}", &lock_key.to_string())
        .replace(
            "{{idle_timeout_ms}}",
            &idle_timeout.as_millis().max(100).to_string(),
        )
}

/// A string as an SQL literal.
fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// What a tick's message returned: the lock statement's row (`locked`), then one row per
/// touched project from the numbering statement.
fn read_tick(messages: &[SimpleQueryMessage]) -> Result<Tick, Error> {
    let mut tick = Tick::default();
    for message in messages {
        let SimpleQueryMessage::Row(row) = message else {
            continue;
        };
        if let Some(locked) = row.try_get("locked").ok().flatten() {
            tick.ran = locked == "t";
            continue;
        }
        let project = text_column(row, "project_id")?;
        let head = int_column(row, "head_sequence")?;
        let numbered = int_column(row, "numbered")?;
        tick.numbered += numbered as u64;
        tick.heads.push((project.to_owned(), head));
    }
    Ok(tick)
}

fn text_column<'a>(row: &'a SimpleQueryRow, name: &str) -> Result<&'a str, Error> {
    row.try_get(name)?
        .ok_or_else(|| Error::UnexpectedAnswer(format!("the tick returned no {name}")))
}

fn int_column(row: &SimpleQueryRow, name: &str) -> Result<i64, Error> {
    let text = text_column(row, name)?;
    text.parse()
        .map_err(|_| Error::UnexpectedAnswer(format!("the tick returned {name} {text:?}")))
}
