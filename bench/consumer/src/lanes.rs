//! Lanes (`DeliverySettings::lanes`): what they buy a slow handler, what they cost a fast one,
//! and the commit-to-handler latency under load (`outbox-bench lanes`, run by bench/lanes.sh).
//!
//! 1. A handler that sleeps 10 ms per event, one project, every event its own task: events/s
//!    with 1, 8 and 64 lanes, from the first handler call to the last one's end. Goal:
//!    at least 0.9 x lanes x 100 events/s.
//! 2. A no-op handler catching up a backlog with 16 lanes and with 1. Goal: 16 lanes at least
//!    0.9 x as fast as 1.
//! 3. Commit to handler at 2,000 events/s with 8 lanes and a handler that sleeps 2 ms (the
//!    latency benchmark's writers, LISTEN on). Goal: p99 at most 10 ms.
//!
//! Every run drains a fresh database (`outbox_bench_lanes`) with one consumer in this process,
//! the runtime's defaults otherwise. Medians of the repetitions are reported.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_consumer::{
    Consumer, ConsumerConfig, Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler,
    StartFrom,
};
use outbox_core::{ConsumerId, ProjectId, Schema, Writer, WriterProcessId};
use tokio_util::sync::CancellationToken;

use crate::latency::{self, Stamp, WRITERS};
use crate::{BoxResult, db, stats};

/// Options of `outbox-bench lanes`.
#[derive(Debug, Clone, clap::Args)]
pub struct LanesArgs {
    /// URL of a disposable cluster (its `postgres` database).
    #[arg(long)]
    pub database_url: String,
    /// Repetitions of each run (default 3; 1 with BENCH_QUICK=1).
    #[arg(long, env = "BENCH_REPS")]
    pub reps: Option<usize>,
    /// Events of the no-op catch-up (default 300,000; 100,000 with BENCH_QUICK=1).
    #[arg(long)]
    pub catch_up_events: Option<i64>,
    /// Seconds of the latency run, and about how long each sleeping run lasts (default 5; 2
    /// with BENCH_QUICK=1).
    #[arg(long, env = "BENCH_LATENCY_SECONDS")]
    pub seconds: Option<f64>,
    /// Where the markdown report is written (besides stdout).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../RESULTS-lanes.md"))]
    pub results: PathBuf,
    /// Runs only these parts (default: all three, in this order).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Part>,
}

/// The three parts of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// A handler sleeping 10 ms with 1, 8 and 64 lanes.
    Sleeping,
    /// A no-op catch-up with 16 lanes beside 1.
    CatchUp,
    /// Commit to handler at 2,000 events/s with 8 lanes.
    Latency,
}

/// Counts handler calls: when the first began and when the last ended; sleeps if asked.
struct Timed {
    sleep: Duration,
    events: usize,
    done: AtomicUsize,
    /// Nanoseconds spent in handler calls that sleep.
    busy: AtomicU64,
    first: Mutex<Option<Instant>>,
    last: Mutex<Option<Instant>>,
    /// Handler start per event ID (the latency run).
    started: Option<Mutex<Vec<(String, Stamp)>>>,
}

impl Handler for Timed {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        let now = Stamp::now();
        if let Some(started) = &self.started {
            started
                .lock()
                .expect("lock")
                .push((event.event_id.clone(), now));
        }
        self.first.lock().expect("lock").get_or_insert(now.mono);
        if !self.sleep.is_zero() {
            // The call a handler waits for, taking `sleep`: on a thread of the blocking pool,
            // because a tokio timer rounds every wait up to its next millisecond tick (a 10 ms
            // sleep took 11.2 ms here), which would charge the handler's clock to the lanes.
            let sleep = self.sleep;
            tokio::task::spawn_blocking(move || std::thread::sleep(sleep))
                .await
                .expect("sleep");
            self.busy
                .fetch_add(now.mono.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        if self.done.fetch_add(1, Ordering::Relaxed) + 1 == self.events {
            *self.last.lock().expect("lock") = Some(Instant::now());
        }
        Ok(())
    }
}

/// The consumers start from the earliest event of a fresh project: never called.
struct NoReconcile;

impl Reconciler for NoReconcile {
    async fn reconcile(&self, _: &LiveSet) -> Result<(), HandlerFailure> {
        Ok(())
    }
}

fn timed(sleep: Duration, events: usize, record: bool) -> Arc<Timed> {
    Arc::new(Timed {
        sleep,
        events,
        done: AtomicUsize::new(0),
        busy: AtomicU64::new(0),
        first: Mutex::new(None),
        last: Mutex::new(None),
        started: record.then(|| Mutex::new(Vec::with_capacity(events))),
    })
}

fn config(project: &str, lanes: usize, max_ahead: i64) -> BoxResult<ConsumerConfig> {
    let mut config = ConsumerConfig::new(ProjectId::new(project)?, ConsumerId::new("lanes")?);
    config.delivery.start_from = StartFrom::Earliest;
    config.delivery.lanes = lanes;
    config.delivery.max_ahead = max_ahead;
    Ok(config)
}

/// Drains a backlog of `events` (each its own task) with `lanes` and a handler sleeping
/// `sleep`: events/s from the first handler call to the last one's end, and the handler
/// call's mean time in milliseconds.
async fn drain(
    admin_url: &str,
    lanes: usize,
    max_ahead: i64,
    events: i64,
    sleep: Duration,
) -> BoxResult<(f64, f64)> {
    let url = db::fresh_database(admin_url, "outbox_bench_lanes").await?;
    db::write_backlog(&url, "p", events).await?;
    let mut config = config("p", lanes, max_ahead)?;
    config.delivery.exit_when_caught_up = true;
    config.duties.listen = false;
    let handler = timed(sleep, events as usize, false);
    let consumer = Consumer::new(
        db::pool(&db::parse(&url)?, 4)?,
        None,
        config,
        handler.clone(),
        NoReconcile,
    );
    consumer.run(CancellationToken::new()).await?;
    let first = handler
        .first
        .lock()
        .expect("lock")
        .ok_or("nothing handled")?;
    let last = handler
        .last
        .lock()
        .expect("lock")
        .ok_or("not every event handled")?;
    let rate = events as f64 / last.duration_since(first).as_secs_f64();
    let busy = handler.busy.load(Ordering::Relaxed) as f64 / 1e6;
    Ok((rate, busy / events as f64))
}

/// Commit to handler start at `rate` events/s for `seconds`, with `lanes` and a handler
/// sleeping `sleep`.
async fn latency_run(
    admin_url: &str,
    lanes: usize,
    rate: u32,
    seconds: f64,
    sleep: Duration,
) -> BoxResult<Latency> {
    let url = db::fresh_database(admin_url, "outbox_bench_lanes").await?;
    let pg = db::parse(&url)?;
    let total = (f64::from(rate) * seconds).round() as usize;
    let handler = timed(sleep, total, true);
    let consumer = Consumer::new(
        db::pool(&pg, 4)?,
        Some(pg.clone()),
        config("lat", lanes, outbox_consumer::config::DEFAULT_MAX_AHEAD)?,
        handler.clone(),
        NoReconcile,
    );
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { consumer.run(shutdown).await }
    });
    latency::wait_until_started(&url, "lat", "lanes").await?;
    let mut clients = Vec::with_capacity(WRITERS);
    for _ in 0..WRITERS {
        clients.push(db::connect(&pg).await?);
    }
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let t0 = Instant::now() + Duration::from_millis(100);
    let mut writers = Vec::with_capacity(WRITERS);
    for (w, client) in clients.into_iter().enumerate() {
        let writer = Writer::new(
            &Schema::default(),
            WriterProcessId::new(format!("bench-w{w}"))?,
        );
        writers.push(tokio::spawn(latency::write_share(
            client,
            writer,
            ProjectId::new("lat")?,
            w,
            total,
            t0,
            interval,
        )));
    }
    let mut commits: HashMap<String, Stamp> = HashMap::with_capacity(total);
    for writer in writers {
        for (event_id, at) in writer.await??.commits {
            commits.insert(event_id, at);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while handler.done.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    run.await??;
    let started = std::mem::take(
        &mut *handler
            .started
            .as_ref()
            .ok_or("no record")?
            .lock()
            .expect("lock"),
    );
    // A handler may start before its writer's COMMIT has returned to the writer (the event
    // is visible once the server committed it): that counts as no latency at all.
    let mut latencies: Vec<Duration> = started
        .iter()
        .filter_map(|(id, at)| Some(at.mono.saturating_duration_since(commits.get(id)?.mono)))
        .collect();
    if latencies.len() < total {
        return Err(format!("{} of {total} events handled", latencies.len()).into());
    }
    let numbered = latency::numbered_at(&url, "lat").await?;
    let (mut to_numbered, mut numbered_to_handler) = (Vec::new(), Vec::new());
    for (id, at) in &started {
        if let (Some(committed), Some(numbered)) = (commits.get(id), numbered.get(id)) {
            to_numbered.push(latency::millis(*numbered - committed.wall));
            numbered_to_handler.push(latency::millis(at.wall - *numbered));
        }
    }
    Ok(Latency {
        commit_to_handler: stats::percentiles(&mut latencies).ok_or("no samples")?,
        to_numbered: latency::p50_p99(&mut to_numbered),
        numbered_to_handler: latency::p50_p99(&mut numbered_to_handler),
    })
}

/// One latency run: commit to handler start, and the same split at the numbering tick's
/// start (wall clock, p50 and p99 in ms; approximate, as in the latency benchmark).
struct Latency {
    commit_to_handler: stats::Percentiles,
    to_numbered: (f64, f64),
    numbered_to_handler: (f64, f64),
}

/// The whole lanes benchmark and its report.
pub async fn run(args: LanesArgs) -> BoxResult<String> {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let reps = args.reps.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let seconds = args.seconds.unwrap_or(if quick { 2.0 } else { 5.0 });
    let catch_up = args
        .catch_up_events
        .unwrap_or(if quick { 100_000 } else { 300_000 });
    let url = &args.database_url;
    let mut report = String::new();
    writeln!(report, "# Lanes benchmark\n")?;
    writeln!(
        report,
        "Revision {}; {}; load average at start {:.2}; medians of {reps} run(s){}.\n",
        std::env::var("BENCH_REVISION").unwrap_or_else(|_| "unknown".into()),
        db::server_description(url).await?,
        crate::procfs::load_one(),
        if quick { " (BENCH_QUICK)" } else { "" },
    )?;

    let wanted = |part: Part| args.only.is_empty() || args.only.contains(&part);
    if wanted(Part::Sleeping) {
        writeln!(
            report,
            "## A handler sleeping 10 ms, every event its own task\n\n\
         | lanes | events | handler call, mean ms | events/s | goal (0.9 x lanes x 100) | met |\n\
         |---|---|---|---|---|---|"
        )?;
        for lanes in [1_usize, 8, 64] {
            let events = ((lanes * 100) as f64 * seconds).round() as i64;
            let (mut rates, mut calls) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
            for rep in 0..reps {
                eprintln!(
                    "outbox-bench lanes: {lanes} lane(s), 10 ms handler, run {}",
                    rep + 1
                );
                let (rate, call) = drain(
                    url,
                    lanes,
                    outbox_consumer::config::DEFAULT_MAX_AHEAD,
                    events,
                    Duration::from_millis(10),
                )
                .await?;
                rates.push(rate);
                calls.push(call);
            }
            let rate = stats::median(&rates).ok_or("no runs")?;
            let call = stats::median(&calls).ok_or("no runs")?;
            let goal = 0.9 * lanes as f64 * 100.0;
            writeln!(
                report,
                "| {lanes} | {events} | {call:.2} | {rate:.0} | {goal:.0} | {} |",
                if rate >= goal { "yes" } else { "no" }
            )?;
        }
    }
    if wanted(Part::CatchUp) {
        writeln!(
            report,
            "\n## A no-op handler catching up {catch_up} events\n\n\
         | lanes | --max-ahead | events/s | of 1 lane |\n|---|---|---|---|"
        )?;
        // One lane holds up to three reads of 4,000 events (one dispatched, two read ahead):
        // lanes given as much room ahead as that are measured too.
        let mut one_lane = f64::NAN;
        for (lanes, max_ahead) in [
            (1_usize, outbox_consumer::config::DEFAULT_MAX_AHEAD),
            (16, outbox_consumer::config::DEFAULT_MAX_AHEAD),
            (16, 12_000),
        ] {
            let mut rates = Vec::with_capacity(reps);
            for rep in 0..reps {
                eprintln!(
                    "outbox-bench lanes: {lanes} lane(s), --max-ahead {max_ahead}, no-op catch-up, run {}",
                    rep + 1
                );
                rates.push(
                    drain(url, lanes, max_ahead, catch_up, Duration::ZERO)
                        .await?
                        .0,
                );
            }
            let rate = stats::median(&rates).ok_or("no runs")?;
            if lanes == 1 {
                one_lane = rate;
            }
            let shown = match lanes {
                1 => "(unused)".to_owned(),
                _ => max_ahead.to_string(),
            };
            writeln!(
                report,
                "| {lanes} | {shown} | {rate:.0} | {:.2} |",
                rate / one_lane
            )?;
        }
        writeln!(report, "\nGoal: 16 lanes at least 0.90 of 1 lane.")?;
    }

    if wanted(Part::Latency) {
        eprintln!(
            "outbox-bench lanes: latency at 2,000 events/s, 1 lane, no-op handler (baseline)"
        );
        let baseline = latency_run(url, 1, 2_000, seconds, Duration::ZERO).await?;
        let mut runs = Vec::with_capacity(reps);
        for rep in 0..reps {
            eprintln!(
                "outbox-bench lanes: latency at 2,000 events/s, 8 lanes, 2 ms handler, run {}",
                rep + 1
            );
            runs.push(latency_run(url, 8, 2_000, seconds, Duration::from_millis(2)).await?);
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let p99 = stats::median(
            &runs
                .iter()
                .map(|run| ms(run.commit_to_handler.p99))
                .collect::<Vec<_>>(),
        )
        .ok_or("no runs")?;
        writeln!(
            report,
            "\n## Commit to handler at 2,000 events/s ({seconds} s, LISTEN)\n\n\
             Split at the numbering tick's start (wall clock, approximate): commit to numbered, \
             and numbered to handler.\n\n\
             | consumer | p50 ms | p99 ms | max ms | to numbered p50 / p99 ms | \
             numbered to handler p50 / p99 ms |\n|---|---|---|---|---|---|"
        )?;
        let mut row = |name: String, run: &Latency| {
            writeln!(
                report,
                "| {name} | {:.2} | {:.2} | {:.2} | {:.1} / {:.1} | {:.1} / {:.1} |",
                ms(run.commit_to_handler.p50),
                ms(run.commit_to_handler.p99),
                ms(run.commit_to_handler.max),
                run.to_numbered.0,
                run.to_numbered.1,
                run.numbered_to_handler.0,
                run.numbered_to_handler.1,
            )
        };
        for (i, run) in runs.iter().enumerate() {
            row(format!("8 lanes, a 2 ms handler, run {}", i + 1), run)?;
        }
        row("baseline: 1 lane, a no-op handler".into(), &baseline)?;
        writeln!(
            report,
            "\nGoal: p99 at most 10 ms with 8 lanes (median of the runs: {p99:.2} ms): {}.",
            if p99 <= 10.0 { "met" } else { "not met" }
        )?;
    }
    std::fs::write(&args.results, &report)?;
    Ok(report)
}
