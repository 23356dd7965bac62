//! `outbox-relay-bench`: benchmarks of `outbox relay nats`.
//!
//! ```text
//! outbox-relay-bench --database-url URL --nats-url nats://127.0.0.1:PORT \
//!     [--cluster-url nats://127.0.0.1:P1,nats://127.0.0.1:P2,nats://127.0.0.1:P3] --outbox PATH
//! ```
//!
//! For each server (`--nats-url`/`--cluster-url`, and `--current-nats-url`/
//! `--current-cluster-url` for a second nats-server version), one node and the three-node
//! cluster with streams of three replicas (R3):
//!
//! 1. Floor: this process publishes N messages of the relay's size and headers straight to
//!    JetStream, 256 in flight: what NATS itself takes on this machine.
//! 2. Throughput: the real `outbox relay nats` process drains a backlog of N sequenced events
//!    into a fresh stream with each `--fence`: `stream` (the default, pipelined, `--window`
//!    256), `subject` (one publish per round trip) and `none` (pipelined, no expectation).
//!    Timed from the process's start to the cursor reaching N (so start-up counts); the stream
//!    is then checked to hold exactly N messages.
//! 3. Latency: writers commit at a fixed rate; a JetStream pull consumer in this process
//!    receives the relayed messages (the default fence); commit-to-receipt percentiles.
//!
//! The markdown report goes to stdout and to `bench/RESULTS-relay.md`; progress to stderr.

#![forbid(unsafe_code)]

mod db;
mod latency;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use clap::Parser;

pub use outbox_bench::BoxResult;
pub use outbox_bench::stats::{Percentiles, percentiles};

/// Prints progress on stderr.
#[macro_export]
macro_rules! progress {
    ($($arg:tt)*) => { eprintln!("outbox-relay-bench: {}", format!($($arg)*)) };
}

/// Relay benchmarks.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay-bench")]
struct Settings {
    /// URL of a disposable cluster (its `postgres` database); the benchmark creates and drops
    /// its own databases there.
    #[arg(long)]
    database_url: String,
    /// A NATS server with JetStream, used only by this benchmark.
    #[arg(long)]
    nats_url: String,
    /// The three nodes of a NATS cluster, comma-separated, used only by this benchmark.
    #[arg(long)]
    cluster_url: Option<String>,
    /// A second server (another nats-server version), used only by this benchmark.
    #[arg(long)]
    current_nats_url: Option<String>,
    /// The three nodes of a cluster of the second version.
    #[arg(long)]
    current_cluster_url: Option<String>,
    /// The `outbox` binary to benchmark (a release build).
    #[arg(long)]
    outbox: PathBuf,
    /// Events in the backlog.
    #[arg(long, env = "BENCH_EVENTS")]
    events: Option<i64>,
    /// Repetitions of the default-window throughput run (default 3; 1 with BENCH_QUICK=1).
    #[arg(long, env = "BENCH_REPS")]
    reps: Option<usize>,
    /// Seconds of writing in the latency run (default 10; 3 with BENCH_QUICK=1).
    #[arg(long, env = "BENCH_LATENCY_SECONDS")]
    latency_seconds: Option<f64>,
    /// Where the markdown report is written (besides stdout).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../RESULTS-relay.md"))]
    results: PathBuf,
}

/// Where the relay publishes: one node, or the cluster with replicated streams.
#[derive(Debug, Clone)]
pub struct Target {
    /// For the report: server version and topology.
    pub name: String,
    /// `--nats-url`.
    pub urls: String,
    /// `--stream-replicas`.
    pub replicas: u8,
}

/// A client of any of `urls` (comma-separated).
pub async fn connect(urls: &str) -> BoxResult<async_nats::Client> {
    let servers = urls
        .split(',')
        .map(str::parse)
        .collect::<Result<Vec<async_nats::ServerAddr>, _>>()?;
    Ok(async_nats::connect(servers).await?)
}

/// A running relay process; stderr goes to a file shown when it fails.
pub struct RelayProcess {
    child: tokio::process::Child,
    log: PathBuf,
}

impl RelayProcess {
    /// Starts `outbox relay nats` on `target` with `args` after the connection options.
    fn spawn(settings: &Settings, target: &Target, url: &str, args: &[&str]) -> BoxResult<Self> {
        let log = std::env::temp_dir().join(format!(
            "outbox-relay-bench-{}-{}.log",
            std::process::id(),
            Instant::now().elapsed().as_nanos()
        ));
        let child = tokio::process::Command::new(&settings.outbox)
            .args(["--database-url", url, "relay", "nats", "--nats-url"])
            .arg(&target.urls)
            .arg("--stream-replicas")
            .arg(target.replicas.to_string())
            .args(args)
            .env("OUTBOX_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", settings.outbox.display()))?;
        Ok(Self { child, log })
    }

    /// An error with the relay's log if it has exited.
    fn check_alive(&mut self) -> BoxResult<()> {
        if let Some(status) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            return Err(format!("the relay exited ({status}):\n{log}").into());
        }
        Ok(())
    }

    /// SIGTERM and wait; an error if it did not exit 0.
    async fn terminate(mut self) -> BoxResult<()> {
        if let Some(pid) = self.child.id() {
            std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()?;
        }
        let status = self.child.wait().await?;
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let _ = std::fs::remove_file(&self.log);
        if !status.success() {
            return Err(format!("the relay exited ({status}):\n{log}").into());
        }
        Ok(())
    }
}

/// One throughput run.
#[derive(Debug, Clone)]
struct Throughput {
    /// Which target.
    target: String,
    /// `--fence`.
    fence: &'static str,
    /// `--window`.
    window: u32,
    /// Events relayed.
    events: i64,
    /// From process start to the cursor at `events`.
    seconds: f64,
    /// Messages the stream held afterwards.
    stored: u64,
}

fn main() -> std::process::ExitCode {
    let settings = Settings::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(settings)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> BoxResult<()> {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let events = settings
        .events
        .unwrap_or(if quick { 100_000 } else { 1_000_000 });
    let reps = settings.reps.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let latency_seconds = settings
        .latency_seconds
        .unwrap_or(if quick { 3.0 } else { 10.0 });
    let load_before = load_average();

    let mut targets = Vec::new();
    let mut nats_versions = Vec::new();
    for (single, cluster) in [
        (Some(&settings.nats_url), settings.cluster_url.as_ref()),
        (
            settings.current_nats_url.as_ref(),
            settings.current_cluster_url.as_ref(),
        ),
    ] {
        let Some(single) = single else { continue };
        let client = connect(single).await?;
        let version = client.server_info().version.clone();
        drop(client);
        targets.push(Target {
            name: format!("{version}, one node"),
            urls: single.clone(),
            replicas: 1,
        });
        if let Some(urls) = cluster {
            targets.push(Target {
                name: format!("{version}, 3 nodes, R3"),
                urls: urls.clone(),
                replicas: 3,
            });
        }
        nats_versions.push(version);
    }
    let nats_version = nats_versions.join(" and ");

    let url = db::fresh_database(&settings.database_url, "outbox_bench_relay").await?;
    progress!("writing a backlog of {events} sequenced events");
    let backlog_seconds = db::write_backlog(&url, "bench", events).await?;
    progress!("backlog written in {backlog_seconds:.1} s");

    let mut floors = Vec::new();
    let mut runs = Vec::new();
    let mut latencies = Vec::new();
    for (t, target) in targets.iter().enumerate() {
        let js = jetstream::new(connect(&target.urls).await?);
        progress!(
            "{}: floor: {events} direct publishes, 256 in flight",
            target.name
        );
        let floor = publish_floor(&js, target.replicas, events).await?;
        progress!("  {:.0} messages/s", events as f64 / floor);
        floors.push((target.name.clone(), floor));
        // The default fence and window, repeated; the default fence with a smaller and a
        // larger window (what the default is chosen by); then each other fence once.
        let plan = (0..reps).map(|_| ("stream", 256)).chain([
            ("stream", 32),
            ("stream", 1024),
            ("subject", 256),
            ("none", 256),
        ]);
        for (i, (fence, window)) in plan.enumerate() {
            progress!(
                "{}: throughput, --fence {fence} --window {window}, {events} events",
                target.name
            );
            let run = relay_throughput(
                &settings,
                target,
                &url,
                &js,
                t * 100 + i,
                (fence, window),
                events,
            )
            .await?;
            progress!(
                "  {:.1} s, {:.0} events/s, {} stored",
                run.seconds,
                run.events as f64 / run.seconds,
                run.stored
            );
            if run.stored != run.events as u64 {
                return Err(format!(
                    "the stream holds {} messages for {} relayed events",
                    run.stored, run.events
                )
                .into());
            }
            runs.push(run);
        }
        let latency_url = db::fresh_database(
            &settings.database_url,
            &format!("outbox_bench_relay_lat{t}"),
        )
        .await?;
        let latency = latency::run(&settings, target, &latency_url, 2000, latency_seconds).await?;
        progress!(
            "{}: latency: p50 {:?} p99 {:?} max {:?} ({} events, {} missing, {} duplicates, {} out of order)",
            target.name,
            latency.latency.p50,
            latency.latency.p99,
            latency.latency.max,
            latency.latency.count,
            latency.missing,
            latency.duplicates,
            latency.out_of_order
        );
        latencies.push((target.name.clone(), latency));
    }

    let report = render(&Report {
        quick,
        events,
        reps,
        backlog_seconds,
        floors,
        runs,
        latencies,
        server: db::server_description(&settings.database_url).await?,
        nats_version,
        load_before,
        load_after: load_average(),
    });
    print!("{report}");
    std::fs::write(&settings.results, &report)
        .map_err(|e| format!("cannot write {}: {e}", settings.results.display()))?;
    progress!("report written to {}", settings.results.display());
    Ok(())
}

/// A payload the size of the relay's: one `consume` event line.
fn sample_body(n: i64) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "type": "event", "project_id": "floor", "consumer_id": "relay-bench",
            "sequence": n, "event_id": format!("task-deleted:b{n}:2026-01-01T00:00:00.000000Z"),
            "event_type": "task:deleted", "task_id": format!("b{n}"),
            "deleted_at": "2026-01-01T00:00:00.000000Z", "writer_process_id": "bench-backlog",
            "occurred_at": "2026-01-01T00:00:00.000000Z", "payload_version": 1,
            "prior": {"column": "todo", "status": "open"}, "attempt": 1, "replay": false
        })
        .to_string(),
    )
}

/// Publishes `events` messages straight to a fresh stream, 256 awaiting their PubAck, and
/// returns the seconds taken.
async fn publish_floor(js: &jetstream::Context, replicas: u8, events: i64) -> BoxResult<f64> {
    let _ = js.delete_stream("BENCH_FLOOR").await;
    js.create_stream(jetstream::stream::Config {
        name: "BENCH_FLOOR".into(),
        subjects: vec!["floor.>".into()],
        duplicate_window: Duration::from_secs(600),
        num_replicas: usize::from(replicas),
        ..Default::default()
    })
    .await?;
    let started = Instant::now();
    let mut in_flight = std::collections::VecDeque::new();
    for n in 1..=events {
        if in_flight.len() >= 256 {
            let ack: jetstream::context::PublishAckFuture =
                in_flight.pop_front().expect("non-empty");
            ack.await?;
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Outbox-Sequence", n.to_string().as_str());
        headers.insert("Outbox-Project", "floor");
        let message = jetstream::message::PublishMessage::build()
            .payload(sample_body(n))
            .headers(headers)
            .message_id(format!("task-deleted:b{n}:2026-01-01T00:00:00.000000Z"));
        in_flight.push_back(js.send_publish("floor.p.task_deleted", message).await?);
    }
    for ack in in_flight {
        ack.await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    js.delete_stream("BENCH_FLOOR").await?;
    Ok(seconds)
}

/// Runs the relay over the backlog into a fresh stream until its cursor reaches `target`.
async fn relay_throughput(
    settings: &Settings,
    on: &Target,
    url: &str,
    js: &jetstream::Context,
    run: usize,
    (fence, window): (&'static str, u32),
    target: i64,
) -> BoxResult<Throughput> {
    let stream = format!("BENCH_T{run}");
    let consumer = format!("relay-t{run}");
    let probe = db::connect(&db::parse(url)?).await?;
    let started = Instant::now();
    let window_arg = window.to_string();
    let knob: &[&str] = &["--fence", fence, "--window", &window_arg];
    let mut relay = RelayProcess::spawn(
        settings,
        on,
        url,
        &[
            "--project",
            "bench",
            "--consumer-id",
            &consumer,
            "--stream",
            &stream,
            "--subject-prefix",
            &format!("bench{run}"),
            "--start-from",
            "earliest",
            "--no-prune",
        ]
        .iter()
        .chain(knob)
        .copied()
        .collect::<Vec<_>>(),
    )?;
    loop {
        if db::cursor(&probe, "bench", &consumer).await? >= target {
            break;
        }
        relay.check_alive()?;
        if started.elapsed() > Duration::from_secs(900) {
            return Err("the relay did not finish within 15 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    relay.terminate().await?;
    let acked = db::cursor(&probe, "bench", &consumer).await?;
    let mut handle = js.get_stream(&stream).await?;
    let stored = handle.info().await?.state.messages;
    js.delete_stream(&stream).await?;
    Ok(Throughput {
        target: on.name.clone(),
        fence,
        window,
        // Everything acknowledged by the time the relay stopped.
        events: acked,
        seconds: seconds * acked as f64 / target as f64,
        stored,
    })
}

/// The 1-, 5- and 15-minute load averages.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Everything the report shows.
struct Report {
    quick: bool,
    events: i64,
    reps: usize,
    backlog_seconds: f64,
    floors: Vec<(String, f64)>,
    runs: Vec<Throughput>,
    latencies: Vec<(String, latency::Outcome)>,
    server: String,
    nats_version: String,
    load_before: String,
    load_after: String,
}

fn render(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let revision = std::env::var("BENCH_REVISION").unwrap_or_else(|_| "unknown".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let _ = writeln!(out, "# Relay benchmark: `outbox relay nats`\n");
    if r.quick {
        let _ = writeln!(
            out,
            "**Smoke run (BENCH_QUICK=1): small backlog, one repetition; not a measurement.**\n"
        );
    }
    let _ = writeln!(
        out,
        "Revision `{revision}`; {cpus} CPUs shared by PostgreSQL, the nats-servers, the relay \
         and this driver; {}; nats-server {} (JetStream, file storage): one node, and a \
         three-node cluster on the same host with streams of three replicas (R3). Load average \
         before {}, after {}.\n",
        r.server, r.nats_version, r.load_before, r.load_after
    );
    let _ = writeln!(out, "## Throughput over a backlog\n");
    let _ = writeln!(
        out,
        "A backlog of {} sequenced events (written in {:.1} s). Each run starts the release \
         `outbox relay nats` process as a new consumer (`--start-from earliest`) into a fresh \
         stream and is timed from the process's start (connect, stream creation, lease) until \
         its cursor reaches the target; the stream is then checked to hold exactly as many \
         messages as were acknowledged. \"stream\" (the default): `--fence stream`, every \
         publish names the stream's last sequence before it, 256 in flight; \"subject\": \
         `--fence subject`, `Nats-Expected-Last-Subject-Sequence`, one publish per round trip; \
         \"none\": `--fence none`, no expectation, 256 in flight. The floor is this driver \
         publishing messages of the same size and headers straight to JetStream, 256 awaiting \
         their PubAck: no database, no relay.\n",
        r.events, r.backlog_seconds
    );
    let _ = writeln!(out, "| target | run | events | seconds | events/s |");
    let _ = writeln!(out, "|---|---|---:|---:|---:|");
    for (name, floor) in &r.floors {
        let _ = writeln!(
            out,
            "| {name} | floor: direct publish, 256 in flight | {} | {floor:.1} | {:.0} |",
            r.events,
            r.events as f64 / floor
        );
        for run in r.runs.iter().filter(|run| run.target == *name) {
            let _ = writeln!(
                out,
                "| {name} | relay, --fence {} --window {} | {} | {:.1} | {:.0} |",
                run.fence,
                run.window,
                run.events,
                run.seconds,
                run.events as f64 / run.seconds
            );
        }
    }
    let _ = writeln!(out);
    for (name, floor) in &r.floors {
        let rate = |fence: &str| {
            let rates: Vec<f64> = r
                .runs
                .iter()
                .filter(|run| run.target == *name && run.fence == fence && run.window == 256)
                .map(|run| run.events as f64 / run.seconds)
                .collect();
            outbox_bench::stats::median(&rates).unwrap_or(f64::NAN)
        };
        let floor_rate = r.events as f64 / floor;
        let (stream, subject, none) = (rate("stream"), rate("subject"), rate("none"));
        let goal = if name.ends_with("R3") { 0.6 } else { 0.8 };
        let _ = writeln!(
            out,
            "- **{name}: {stream:.0} events/s with the default fence** (median of {} run(s)), \
             {:.2} x the floor (goal ≥ {goal} x: {}); --fence subject {subject:.0} ({:.2} x), \
             --fence none {none:.0} ({:.2} x).",
            r.reps,
            stream / floor_rate,
            if stream / floor_rate >= goal {
                "met"
            } else {
                "not met"
            },
            subject / floor_rate,
            none / floor_rate,
        );
    }
    let _ = writeln!(out, "\n## Commit to JetStream consumer\n");
    if let Some((_, l)) = r.latencies.first() {
        let _ = writeln!(
            out,
            "8 writer connections commit one event per transaction on an open-loop schedule at \
             {} events/s for {} s; the relay runs with its defaults (LISTEN, sequencer every \
             10 ms, `--fence stream`); a JetStream pull consumer in the driver \
             (`messages()`, no acks) receives them. Latency is from `COMMIT` returning to the \
             message's arrival, on one monotonic clock.\n",
            l.rate, l.seconds
        );
    }
    let _ = writeln!(
        out,
        "| target | achieved/s | events | p50 | p99 | max | missing | duplicates | out of order |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, l) in &r.latencies {
        let _ = writeln!(
            out,
            "| {name} | {:.0} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {} | {} | {} |",
            l.achieved_rate,
            l.latency.count,
            l.latency.p50.as_secs_f64() * 1000.0,
            l.latency.p99.as_secs_f64() * 1000.0,
            l.latency.max.as_secs_f64() * 1000.0,
            l.missing,
            l.duplicates,
            l.out_of_order
        );
    }
    let _ = writeln!(out);
    for (name, l) in &r.latencies {
        let goal = if name.ends_with("R3") { 50 } else { 25 };
        let _ = writeln!(
            out,
            "- **{name}: p99 {:.1} ms** (goal ≤ {goal} ms at 2,000 events/s: {}).",
            l.latency.p99.as_secs_f64() * 1000.0,
            if l.latency.p99 <= Duration::from_millis(goal) {
                "met"
            } else {
                "not met"
            }
        );
    }
    out
}
