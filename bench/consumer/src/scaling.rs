//! The scaling benchmark's consumer side (`bench/scaling.sh`): K consumers of one project,
//! in this process (each with its own pool of the runtime's minimum size, 3, and, for latency, its own LISTEN connection
//! and embedded sequencer candidate, i.e. what K `outbox consume` processes would hold).
//!
//! - `scale-catch-up`: K consumers (fresh consumer IDs) drain the project's sequenced backlog
//!   from sequence 1 at the same time with a no-op handler; one JSON line on stdout.
//! - `scale-latency`: 8 writer tasks commit events at a fixed total rate with the Rust
//!   `Writer`, every second event into the observed project `p0` and the others round-robin
//!   over `p1 .. p(P-1)` (all into `p0` when P = 1); K consumers of `p0` (LISTEN, the
//!   runtime's defaults otherwise) time every event from its writer's `COMMIT` returning to
//!   their handler. One JSON line on stdout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use outbox_consumer::handler::Plain;
use outbox_consumer::{
    Consumer, ConsumerConfig, Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler,
    StartFrom,
};
use outbox_core::{
    ConsumerId, Prior, ProjectId, Schema, TaskDeleted, TaskId, Writer, WriterProcessId,
};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::{BoxResult, db, stats};

/// Connections per consumer's pool: the runtime's minimum (delivery, heartbeat, sequencer).
const POOL: usize = outbox_consumer::config::MIN_POOL_SIZE;
/// Writer tasks (each with its own connection) in `scale-latency`.
const WRITERS: usize = 8;

/// Arguments of `scale-catch-up`.
#[derive(Debug, Clone, clap::Args)]
pub struct CatchUpArgs {
    /// URL of the database holding the backlog.
    #[arg(long)]
    pub database_url: String,
    /// The backlog's project.
    #[arg(long)]
    pub project: String,
    /// Consumers of the project, draining side by side.
    #[arg(long)]
    pub consumers: usize,
    /// Prefix of the consumer IDs (fresh ones per run).
    #[arg(long)]
    pub prefix: String,
    /// The project's last sequence.
    #[arg(long)]
    pub expect: i64,
}

/// Arguments of `scale-latency`.
#[derive(Debug, Clone, clap::Args)]
pub struct LatencyArgs {
    /// URL of a migrated database (fresh projects `p0 ..` are used).
    #[arg(long)]
    pub database_url: String,
    /// Projects the writers spread over.
    #[arg(long)]
    pub projects: usize,
    /// Consumers of `p0`.
    #[arg(long)]
    pub consumers: usize,
    /// Events per second in all.
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// Seconds of writing.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// A tag that makes project names unique per run.
    #[arg(long)]
    pub tag: String,
}

/// Counts, checks order, stops its consumer at `expect` (catch-up) and stamps (latency).
struct Recorder {
    expect: i64,
    stop: CancellationToken,
    last: AtomicI64,
    handled: AtomicU64,
    out_of_order: AtomicU64,
    stamps: Option<Mutex<Vec<(String, Instant)>>>,
}

struct RecordingHandler(Arc<Recorder>);

impl Handler for RecordingHandler {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        let now = Instant::now();
        let r = &self.0;
        if let Some(stamps) = &r.stamps {
            stamps
                .lock()
                .expect("stamps lock")
                .push((event.event_id.clone(), now));
        }
        if r.last.swap(event.sequence, Ordering::Relaxed) + 1 != event.sequence {
            r.out_of_order.fetch_add(1, Ordering::Relaxed);
        }
        r.handled.fetch_add(1, Ordering::Relaxed);
        if event.sequence == r.expect {
            r.stop.cancel();
        }
        Ok(())
    }
}

/// These consumers start from the earliest event of their project; reconciling is a failure.
struct NoReconcile(Arc<AtomicU64>);

impl Reconciler for NoReconcile {
    async fn reconcile(&self, _live: &LiveSet) -> Result<(), HandlerFailure> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// One consumer of `project` with its own pool (and listener when `listen`).
fn consumer(
    url: &str,
    project: &str,
    consumer_id: &str,
    listen: bool,
    recorder: Arc<Recorder>,
    reconciled: Arc<AtomicU64>,
) -> BoxResult<Consumer<Plain<RecordingHandler>, NoReconcile>> {
    let mut config = db::parse(url)?;
    config.application_name(format!("outbox-bench-scale:{consumer_id}"));
    let mut consumer_config =
        ConsumerConfig::new(ProjectId::new(project)?, ConsumerId::new(consumer_id)?);
    consumer_config.delivery.start_from = StartFrom::Earliest;
    consumer_config.duties.listen = listen;
    Ok(Consumer::new(
        db::pool(&config, POOL)?,
        listen.then(|| config.clone()),
        consumer_config,
        RecordingHandler(recorder),
        NoReconcile(reconciled),
    ))
}

#[derive(Debug, Serialize)]
struct CatchUpReport {
    consumers: usize,
    events_each: i64,
    /// From starting the first consumer to the last one returning.
    seconds: f64,
    /// Events delivered per second, all consumers together.
    aggregate_rate: f64,
    /// Median of each consumer's own events / its own run time.
    median_rate_each: f64,
}

/// `scale-catch-up`.
pub async fn catch_up(args: CatchUpArgs) -> BoxResult<()> {
    let reconciled = Arc::new(AtomicU64::new(0));
    let mut recorders = Vec::new();
    let mut consumers = Vec::new();
    for k in 0..args.consumers {
        let recorder = Arc::new(Recorder {
            expect: args.expect,
            stop: CancellationToken::new(),
            last: AtomicI64::new(0),
            handled: AtomicU64::new(0),
            out_of_order: AtomicU64::new(0),
            stamps: None,
        });
        let id = format!("{}-{k}", args.prefix);
        consumers.push((
            consumer(
                &args.database_url,
                &args.project,
                &id,
                false,
                recorder.clone(),
                reconciled.clone(),
            )?,
            recorder.stop.clone(),
        ));
        recorders.push(recorder);
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (consumer, stop) in consumers {
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let summary = consumer.run(stop).await?;
            Ok::<_, outbox_consumer::ConsumerError>((summary, t.elapsed().as_secs_f64()))
        }));
    }
    let mut rates = Vec::new();
    for task in tasks {
        let (summary, seconds) = tokio::time::timeout(Duration::from_secs(900), task).await???;
        if summary.cursor != Some(args.expect) {
            return Err(format!(
                "a consumer ended at {:?}, not {}",
                summary.cursor, args.expect
            )
            .into());
        }
        rates.push(args.expect as f64 / seconds);
    }
    let seconds = started.elapsed().as_secs_f64();
    for r in &recorders {
        if r.handled.load(Ordering::Relaxed) != args.expect as u64
            || r.out_of_order.load(Ordering::Relaxed) != 0
        {
            return Err("a consumer missed or reordered events".into());
        }
    }
    if reconciled.load(Ordering::Relaxed) > 0 {
        return Err("a consumer reconciled instead of replaying".into());
    }
    let report = CatchUpReport {
        consumers: args.consumers,
        events_each: args.expect,
        seconds,
        aggregate_rate: (args.expect as f64 * args.consumers as f64) / seconds,
        median_rate_each: stats::median(&rates).unwrap_or(f64::NAN),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

#[derive(Debug, Serialize)]
struct LatencyReport {
    projects: usize,
    consumers: usize,
    rate: u32,
    observed_events: usize,
    samples: usize,
    missing: usize,
    out_of_order: u64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    achieved_rate: f64,
    max_schedule_lag_ms: f64,
}

/// `scale-latency`.
pub async fn latency(args: LatencyArgs) -> BoxResult<()> {
    let projects: Vec<String> = (0..args.projects.max(1))
        .map(|p| format!("s{}-p{p}", args.tag))
        .collect();
    let observed = projects[0].clone();
    let total = (f64::from(args.rate) * args.seconds).round() as usize;
    // Event k's project.
    let project_of = {
        let projects = projects.clone();
        move |k: usize| -> String {
            if projects.len() == 1 || k % 2 == 0 {
                projects[0].clone()
            } else {
                projects[1 + (k / 2) % (projects.len() - 1)].clone()
            }
        }
    };
    let observed_events = (0..total).filter(|&k| project_of(k) == observed).count();

    let reconciled = Arc::new(AtomicU64::new(0));
    let mut recorders = Vec::new();
    let mut tasks = Vec::new();
    let shutdown = CancellationToken::new();
    for k in 0..args.consumers {
        let recorder = Arc::new(Recorder {
            expect: i64::MAX,
            stop: shutdown.clone(),
            last: AtomicI64::new(0),
            handled: AtomicU64::new(0),
            out_of_order: AtomicU64::new(0),
            stamps: Some(Mutex::new(Vec::with_capacity(observed_events))),
        });
        let id = format!("lat-{k}");
        let c = consumer(
            &args.database_url,
            &observed,
            &id,
            true,
            recorder.clone(),
            reconciled.clone(),
        )?;
        let stop = shutdown.clone();
        tasks.push(tokio::spawn(async move { c.run(stop).await }));
        recorders.push(recorder);
    }
    wait_until_started(&args.database_url, &observed, args.consumers).await?;

    let config = db::parse(&args.database_url)?;
    let mut clients = Vec::with_capacity(WRITERS);
    for _ in 0..WRITERS {
        clients.push(db::connect(&config).await?);
    }
    let interval = Duration::from_secs_f64(1.0 / f64::from(args.rate));
    let t0 = Instant::now() + Duration::from_millis(100);
    let mut writers = Vec::new();
    for (w, mut client) in clients.into_iter().enumerate() {
        let writer = Writer::new(
            &Schema::default(),
            WriterProcessId::new(format!("scale-w{w}"))?,
        );
        let project_of = project_of.clone();
        writers.push(tokio::spawn(async move {
            let prior = Prior {
                column: Some("todo".into()),
                status: Some("open".into()),
            };
            let mut commits = Vec::new();
            let mut max_lag = Duration::ZERO;
            for k in (w..total).step_by(WRITERS) {
                let due = t0 + interval * k as u32;
                tokio::time::sleep_until(due.into()).await;
                max_lag = max_lag.max(Instant::now().saturating_duration_since(due));
                let project = project_of(k);
                let event = TaskDeleted::new(
                    ProjectId::new(&project)?,
                    TaskId::new(format!("t{k}"))?,
                    Utc::now(),
                    prior.clone(),
                )?;
                let tx = client.transaction().await?;
                let outcome = writer.record(&tx, &event).await?;
                tx.commit().await?;
                let at = Instant::now();
                if project == project_of(0) {
                    commits.push((outcome.event_id().to_owned(), at));
                }
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((commits, max_lag))
        }));
    }
    let mut commits: HashMap<String, Instant> = HashMap::with_capacity(observed_events);
    let mut max_lag = Duration::ZERO;
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    for w in writers {
        let (share, lag) = w.await??;
        max_lag = max_lag.max(lag);
        for (id, at) in share {
            first = Some(first.map_or(at, |f: Instant| f.min(at)));
            last = Some(last.map_or(at, |l: Instant| l.max(at)));
            commits.insert(id, at);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while recorders
        .iter()
        .any(|r| r.handled.load(Ordering::Relaxed) < observed_events as u64)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    for t in tasks {
        t.await??;
    }
    let mut latencies = Vec::new();
    let mut missing = 0;
    let mut out_of_order = 0;
    for r in &recorders {
        out_of_order += r.out_of_order.load(Ordering::Relaxed);
        let stamps = std::mem::take(&mut *r.stamps.as_ref().expect("stamps").lock().expect("lock"));
        let seen: std::collections::HashSet<&str> =
            stamps.iter().map(|(id, _)| id.as_str()).collect();
        missing += commits
            .keys()
            .filter(|id| !seen.contains(id.as_str()))
            .count();
        for (id, at) in &stamps {
            if let Some(c) = commits.get(id) {
                latencies.push(at.saturating_duration_since(*c));
            }
        }
    }
    let p = stats::percentiles(&mut latencies).ok_or("no latency samples")?;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let span = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    let report = LatencyReport {
        projects: args.projects,
        consumers: args.consumers,
        rate: args.rate,
        observed_events,
        samples: p.count,
        missing,
        out_of_order,
        p50_ms: ms(p.p50),
        p99_ms: ms(p.p99),
        max_ms: ms(p.max),
        // Observed-project commits per second, times the share of all events they are.
        achieved_rate: if span > 0.0 {
            (commits.len() as f64 - 1.0) / span * total as f64 / observed_events as f64
        } else {
            0.0
        },
        max_schedule_lag_ms: ms(max_lag),
    };
    println!("{}", serde_json::to_string(&report)?);
    if missing > 0 || out_of_order > 0 || reconciled.load(Ordering::Relaxed) > 0 {
        return Err("events missing, out of order, or a consumer reconciled".into());
    }
    Ok(())
}

/// Waits until all `consumers` of `project` hold their earliest-start cursor, then 500 ms more
/// so their listeners are up.
async fn wait_until_started(url: &str, project: &str, consumers: usize) -> BoxResult<()> {
    let client = db::connect(&db::parse(url)?).await?;
    let query = Schema::default().render(
        "SELECT count(*) FROM {{schema}}.lifecycle_consumer_cursors
         WHERE project_id = $1 AND last_acked_sequence IS NOT NULL",
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = client.query_one(&query, &[&project]).await?.get(0);
        if n as usize >= consumers {
            tokio::time::sleep(Duration::from_millis(500)).await;
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("only {n} of {consumers} consumers started").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
