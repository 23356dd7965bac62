//! End-to-end latency: from a writer's `COMMIT` returning to the consumer's handler being
//! called with that event.
//!
//! Writers and the consumer run in this process, so both ends read the same monotonic clock
//! (`std::time::Instant`). Writers are separate tokio tasks, each with its own connection,
//! committing one event per transaction with the Rust `Writer` on a fixed open-loop schedule:
//! event k is due at `t0 + k / rate`, whether or not earlier commits were slow, so a stall
//! shows up as latency instead of silently lowering the rate.
//!
//! To say where the time goes, both ends also read the wall clock, which PostgreSQL's
//! `now()` shares on this machine: each latency is split at the event's `sequenced_at` (the
//! start of the sequencer tick that numbered it) into "commit to numbered" and "numbered to
//! handler". The split is approximate (the wall clock may be slewed, and a tick whose
//! transaction began just before a commit numbers that event with an earlier timestamp, so
//! the first part can be slightly negative); the total is on the monotonic clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use outbox_consumer::{
    Consumer, ConsumerConfig, Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler,
    StartFrom,
};
use outbox_core::{
    ConsumerId, Prior, ProjectId, Schema, TaskDeleted, TaskId, Writer, WriterProcessId,
};
use tokio_util::sync::CancellationToken;

use crate::stats::{self, Percentiles};
use crate::{BoxResult, db};

/// Writer tasks (each with its own connection) sharing one schedule. Enough that a commit's
/// fsync never holds up the schedule at 2,000 events/s.
pub const WRITERS: usize = 8;

/// One scenario: a wake-up mode and a rate.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// LISTEN for wake-ups (true) or poll only.
    pub listen: bool,
    /// Events per second, across all writers.
    pub rate: u32,
    /// Seconds of writing.
    pub seconds: f64,
}

/// What a scenario measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The scenario.
    pub scenario: Scenario,
    /// Commit-to-handler latencies.
    pub latency: Percentiles,
    /// Events committed per second, first to last commit.
    pub achieved_rate: f64,
    /// Largest delay of a writer behind its schedule when it began a transaction.
    pub max_schedule_lag: Duration,
    /// Committed events the handler never saw.
    pub missing: usize,
    /// Events seen before their commit was timestamped (clock sanity; must be 0).
    pub negative: usize,
    /// Handler calls out of sequence order (must be 0).
    pub out_of_order: u64,
    /// Commit returned to the numbering tick's start (wall clock), ms: p50, p99.
    pub to_numbered_ms: (f64, f64),
    /// Numbering tick's start to handler (wall clock), ms: p50, p99.
    pub numbered_to_handler_ms: (f64, f64),
    /// The 1-minute load average when the scenario started.
    pub load_at_start: f64,
}

/// A moment on both clocks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    /// Monotonic: the latency itself.
    pub(crate) mono: Instant,
    /// Wall clock, comparable with `sequenced_at`: the split.
    pub(crate) wall: DateTime<Utc>,
}

impl Stamp {
    pub(crate) fn now() -> Self {
        Self {
            mono: Instant::now(),
            wall: Utc::now(),
        }
    }
}

/// Collects handler receive times.
struct Recorder {
    received: Mutex<Vec<(String, Stamp)>>,
    count: AtomicUsize,
    last: AtomicI64,
    out_of_order: AtomicU64,
}

/// Handler: timestamp first, then record.
struct RecordingHandler(Arc<Recorder>);

impl Handler for RecordingHandler {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        let now = Stamp::now();
        let recorder = &self.0;
        if recorder.last.swap(event.sequence, Ordering::Relaxed) + 1 != event.sequence {
            recorder.out_of_order.fetch_add(1, Ordering::Relaxed);
        }
        recorder
            .received
            .lock()
            .expect("recorder lock")
            .push((event.event_id.clone(), now));
        recorder.count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The consumers here start from the earliest event of a fresh project, so this never runs.
struct NoReconcile;

impl Reconciler for NoReconcile {
    async fn reconcile(&self, _live: &LiveSet) -> Result<(), HandlerFailure> {
        Ok(())
    }
}

/// Runs one scenario against `url` with a fresh project and consumer.
pub async fn run(url: &str, scenario: Scenario) -> BoxResult<Outcome> {
    let load_at_start = crate::procfs::load_one();
    let mode = if scenario.listen { "listen" } else { "poll" };
    let project = format!("lat-{mode}-{}", scenario.rate);
    let consumer_id = format!("latency-{mode}-{}", scenario.rate);
    let mut config = db::parse(url)?;
    config.application_name("outbox-bench-latency");

    // The consumer: the runtime's defaults (elected sequencer, 2-50 ms adaptive tick, poll every 1 s, batches
    // of 500) except where the scenario says otherwise.
    let mut consumer_config =
        ConsumerConfig::new(ProjectId::new(&project)?, ConsumerId::new(&consumer_id)?);
    consumer_config.delivery.start_from = StartFrom::Earliest;
    consumer_config.duties.listen = scenario.listen;
    let recorder = Arc::new(Recorder {
        received: Mutex::new(Vec::new()),
        count: AtomicUsize::new(0),
        last: AtomicI64::new(0),
        out_of_order: AtomicU64::new(0),
    });
    let mut listen_config = config.clone();
    listen_config.application_name("outbox-bench-listener");
    let consumer = Consumer::new(
        db::pool(&config, 4)?,
        scenario.listen.then_some(listen_config),
        consumer_config,
        RecordingHandler(recorder.clone()),
        NoReconcile,
    );
    let shutdown = CancellationToken::new();
    let consumer_task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { consumer.run(shutdown).await }
    });
    wait_until_started(url, &project, &consumer_id).await?;

    // Writers connect before the clock starts.
    let total = (f64::from(scenario.rate) * scenario.seconds).round() as usize;
    let mut clients = Vec::with_capacity(WRITERS);
    for _ in 0..WRITERS {
        clients.push(db::connect(&config).await?);
    }
    let interval = Duration::from_secs_f64(1.0 / f64::from(scenario.rate));
    let t0 = Instant::now() + Duration::from_millis(100);
    let mut writers = Vec::with_capacity(WRITERS);
    for (w, client) in clients.into_iter().enumerate() {
        let project = ProjectId::new(&project)?;
        let writer = Writer::new(
            &Schema::default(),
            WriterProcessId::new(format!("bench-w{w}"))?,
        );
        writers.push(tokio::spawn(write_share(
            client, writer, project, w, total, t0, interval,
        )));
    }
    let mut commits: HashMap<String, Stamp> = HashMap::with_capacity(total);
    let mut max_schedule_lag = Duration::ZERO;
    let (mut first_commit, mut last_commit) = (None::<Instant>, None::<Instant>);
    for writer in writers {
        let share = writer.await??;
        max_schedule_lag = max_schedule_lag.max(share.max_lag);
        for (event_id, at) in share.commits {
            first_commit = Some(first_commit.map_or(at.mono, |f| f.min(at.mono)));
            last_commit = Some(last_commit.map_or(at.mono, |l| l.max(at.mono)));
            commits.insert(event_id, at);
        }
    }

    // Every committed event must arrive; poll-only needs up to a poll interval (1 s) more.
    let deadline = Instant::now() + Duration::from_secs(10);
    while recorder.count.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    consumer_task.await??;

    let received = std::mem::take(&mut *recorder.received.lock().expect("recorder lock"));
    let numbered = numbered_at(url, &project).await?;
    let mut latencies = Vec::with_capacity(received.len());
    let (mut to_numbered, mut numbered_to_handler) = (Vec::new(), Vec::new());
    let mut negative = 0;
    for (event_id, at) in &received {
        if let Some(committed) = commits.get(event_id) {
            match at.mono.checked_duration_since(committed.mono) {
                Some(latency) => latencies.push(latency),
                None => negative += 1,
            }
            if let Some(numbered) = numbered.get(event_id) {
                to_numbered.push(millis(*numbered - committed.wall));
                numbered_to_handler.push(millis(at.wall - *numbered));
            }
        }
    }
    let seen: std::collections::HashSet<&str> =
        received.iter().map(|(id, _)| id.as_str()).collect();
    let missing = commits
        .keys()
        .filter(|id| !seen.contains(id.as_str()))
        .count();
    let latency = stats::percentiles(&mut latencies).ok_or("no latency samples")?;
    let span = match (first_commit, last_commit) {
        (Some(first), Some(last)) => last.duration_since(first).as_secs_f64(),
        _ => 0.0,
    };
    Ok(Outcome {
        scenario,
        latency,
        achieved_rate: if span > 0.0 {
            (total - 1) as f64 / span
        } else {
            0.0
        },
        max_schedule_lag,
        missing,
        negative,
        out_of_order: recorder.out_of_order.load(Ordering::Relaxed),
        to_numbered_ms: p50_p99(&mut to_numbered),
        numbered_to_handler_ms: p50_p99(&mut numbered_to_handler),
        load_at_start,
    })
}

/// A signed wall-clock difference in milliseconds.
pub(crate) fn millis(delta: chrono::TimeDelta) -> f64 {
    delta
        .num_microseconds()
        .map_or(f64::NAN, |us| us as f64 / 1000.0)
}

/// Nearest-rank p50 and p99 of signed values (NaN when empty).
pub(crate) fn p50_p99(values: &mut [f64]) -> (f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    let rank =
        |p: f64| values[((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1];
    (rank(0.50), rank(0.99))
}

/// Waits until the consumer has claimed its lease and recorded its earliest-start cursor,
/// then a little longer so the listener connection is up too.
pub(crate) async fn wait_until_started(
    url: &str,
    project: &str,
    consumer_id: &str,
) -> BoxResult<()> {
    let client = db::connect(&db::parse(url)?).await?;
    let query = Schema::default().render(
        "SELECT last_acked_sequence IS NOT NULL FROM {{schema}}.lifecycle_consumer_cursors
         WHERE project_id = $1 AND consumer_id = $2",
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let started = client
            .query_opt(&query, &[&project, &consumer_id])
            .await?
            .is_some_and(|row| row.get(0));
        if started {
            tokio::time::sleep(Duration::from_millis(500)).await;
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("consumer {consumer_id} did not start").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One writer's commits and how far it fell behind its schedule.
pub(crate) struct Share {
    pub(crate) commits: Vec<(String, Stamp)>,
    pub(crate) max_lag: Duration,
}

/// Writes events `w, w + WRITERS, ...` below `total`, each in its own transaction at its due
/// time, recording when `COMMIT` returned.
pub(crate) async fn write_share(
    mut client: tokio_postgres::Client,
    writer: Writer,
    project: ProjectId,
    w: usize,
    total: usize,
    t0: Instant,
    interval: Duration,
) -> BoxResult<Share> {
    let prior = Prior {
        column: Some("todo".into()),
        status: Some("open".into()),
    };
    let mut share = Share {
        commits: Vec::with_capacity(total / WRITERS + 1),
        max_lag: Duration::ZERO,
    };
    for k in (w..total).step_by(WRITERS) {
        let due = t0 + interval * k as u32;
        tokio::time::sleep_until(due.into()).await;
        share.max_lag = share
            .max_lag
            .max(Instant::now().saturating_duration_since(due));
        let event = TaskDeleted::new(
            project.clone(),
            TaskId::new(format!("t{k}"))?,
            Utc::now(),
            prior.clone(),
        )?;
        let tx = client.transaction().await?;
        let outcome = writer.record(&tx, &event).await?;
        tx.commit().await?;
        share
            .commits
            .push((outcome.event_id().to_owned(), Stamp::now()));
    }
    Ok(share)
}

/// When each of the project's events was numbered (`sequenced_at`: the numbering tick's
/// transaction start), by event ID.
pub(crate) async fn numbered_at(
    url: &str,
    project: &str,
) -> BoxResult<HashMap<String, DateTime<Utc>>> {
    let client = db::connect(&db::parse(url)?).await?;
    let rows = client
        .query(
            &Schema::default().render(
                "SELECT event_id, sequenced_at FROM {{schema}}.lifecycle_outbox
                 WHERE project_id = $1 AND sequenced_at IS NOT NULL",
            ),
            &[&project],
        )
        .await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}
