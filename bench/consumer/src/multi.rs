//! `outbox-multi-bench`: one `outbox consume` process running many consumers (every consumer
//! ID of `--consumers` for each of `--projects` projects), measured from outside.
//!
//! ```text
//! outbox-multi-bench --database-url URL --outbox PATH [--projects 100] [--consumers 10]
//!                    [--idle-seconds 20] [--rate 2000] [--seconds 10]
//! ```
//!
//! 1. Start: the process is started with `--start-from earliest` on a migrated, empty schema,
//!    and the benchmark waits until every consumer has claimed its lease and set its cursor.
//! 2. Idle: statements the database executed over `--idle-seconds` (`pg_stat_statements`
//!    calls, the benchmark's own excluded; the extension must be loaded) and transactions
//!    (`pg_stat_database`); the process's connections (`pg_stat_activity` by application
//!    name) and resident memory.
//! 3. Load: writers in this process commit `--rate` events/s for `--seconds`, round-robin
//!    over the projects, on a fixed open-loop schedule. Every event reaches every consumer of
//!    its project; each delivery is one JSON line on the process's stdout, which this program
//!    reads and timestamps. Latency = line read − the writer's `COMMIT` returning, on this
//!    process's monotonic clock (so it includes the pipe, a fraction of a millisecond).
//!
//! Both windows are repeated `--reps` times on the same process; the report gives the
//! medians against the goals, then every repetition. The markdown goes to stdout; progress
//! to stderr.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use clap::Parser;
use outbox_bench::{BoxResult, db, procfs, stats};
use outbox_core::{Prior, ProjectId, Schema, TaskDeleted, TaskId, Writer, WriterProcessId};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Writer connections sharing the schedule.
const WRITERS: usize = 8;
/// Application names of the measured process's connections.
const APPLICATIONS: [&str; 2] = ["outbox-multi", "outbox-listener"];

/// Options.
#[derive(Debug, Parser)]
#[command(name = "outbox-multi-bench")]
struct Cli {
    /// URL of the migrated database (with `pg_stat_statements` created).
    #[arg(long)]
    database_url: String,
    /// The `outbox` binary to measure.
    #[arg(long)]
    outbox: String,
    /// Projects followed.
    #[arg(long, default_value_t = 100)]
    projects: usize,
    /// Consumer IDs per project.
    #[arg(long, default_value_t = 10)]
    consumers: usize,
    /// Pool size of the measured process (`--pool-size`).
    #[arg(long, default_value_t = 8)]
    pool_size: usize,
    /// Seconds of the idle window.
    #[arg(long, default_value_t = 20)]
    idle_seconds: u64,
    /// Events per second during the load window, over all projects.
    #[arg(long, default_value_t = 2000)]
    rate: u32,
    /// Seconds of writing.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Repetitions of the idle and load windows (on the same process); medians are reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

/// Deliveries read from the process: (event ID, when read).
type Received = Arc<Mutex<Vec<(String, Instant)>>>;
/// One writer's commits: (event ID, when `COMMIT` returned).
type Commits = Vec<(String, Instant)>;

#[tokio::main]
async fn main() -> BoxResult<()> {
    let cli = Cli::parse();
    let config = db::parse(&cli.database_url)?;
    let client = db::connect(&config).await?;
    let pairs = cli.projects * cli.consumers;

    eprintln!("multi: starting one process with {pairs} consumers");
    let (mut child, received) = start(&cli)?;
    let pid = child.id().ok_or("the process exited at once")?;
    let started = Instant::now();
    wait_started(&client, pairs, &mut child).await?;
    let startup = started.elapsed();
    // Let the start-up reads, the first sweep and the first polls settle.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let mut reps = Vec::with_capacity(cli.reps);
    for rep in 1..=cli.reps {
        eprintln!("multi: rep {rep}: idle window of {} s", cli.idle_seconds);
        let idle = measure_idle(&client, cli.idle_seconds).await?;
        let idle_connections = connections(&client).await?;
        let idle_rss_kib = procfs::memory(pid)?.current_kib;
        let cpu_before = procfs::cpu_seconds(pid)?;
        eprintln!(
            "multi: rep {rep}: {} events/s for {} s",
            cli.rate, cli.seconds
        );
        let load = load(&cli, &config, &received).await?;
        let busy_connections = connections_max(&client, &load.connections).await;
        let cpu = procfs::cpu_seconds(pid)? - cpu_before;
        reps.push(Rep {
            idle,
            idle_connections,
            idle_rss_kib,
            load,
            busy_connections,
            cpu,
        });
        // Back to idle before the next window.
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let memory = procfs::memory(pid)?;
    let _ = child.start_kill();
    let _ = child.wait().await;
    report(&cli, pairs, startup, &reps, memory);
    Ok(())
}

/// One repetition: an idle window, then a load window.
struct Rep {
    idle: Idle,
    idle_connections: i64,
    idle_rss_kib: u64,
    load: Load,
    busy_connections: i64,
    /// Process CPU seconds during the load window.
    cpu: f64,
}

/// The markdown tables: medians over the repetitions against the goals, then each repetition.
fn report(cli: &Cli, pairs: usize, startup: Duration, reps: &[Rep], memory: procfs::Memory) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mib = |kib: u64| kib as f64 / 1024.0;
    let verdict = |met: bool| if met { "**met**" } else { "**not met**" };
    let median = |f: &dyn Fn(&Rep) -> f64| {
        stats::median(&reps.iter().map(f).collect::<Vec<_>>()).unwrap_or(f64::NAN)
    };
    let statements = median(&|r| r.idle.statements_per_s);
    let transactions = median(&|r| r.idle.transactions_per_s);
    let most_connections = reps
        .iter()
        .map(|r| r.idle_connections.max(r.busy_connections))
        .max()
        .unwrap_or(0);
    let p50 = median(&|r| ms(r.load.latency.p50));
    let p99 = median(&|r| ms(r.load.latency.p99));
    let max = median(&|r| ms(r.load.latency.max));
    println!(
        "Medians of {} repetitions (connections: the most seen):",
        reps.len()
    );
    println!();
    println!("| figure | value | goal | |");
    println!("|---|---:|---:|---|");
    println!(
        "| consumers in the process | {pairs} ({} projects × {} IDs) | | |",
        cli.projects, cli.consumers
    );
    println!(
        "| start-up (every lease claimed, every cursor set) | {:.1} s | | |",
        startup.as_secs_f64()
    );
    println!(
        "| idle statements/s (`pg_stat_statements` calls) | {statements:.1} | ≤ 100 | {} |",
        verdict(statements <= 100.0)
    );
    println!("| idle transactions/s (`pg_stat_database`) | {transactions:.1} | | |");
    println!(
        "| connections (pool + listener), idle and under load | {most_connections} | ≤ 10 | {} |",
        verdict(most_connections <= 10)
    );
    println!(
        "| RSS at the end / peak over the run | {:.1} / {:.1} MiB | ≤ 64 MiB | {} |",
        mib(memory.current_kib),
        mib(memory.peak_kib),
        verdict(mib(memory.peak_kib) <= 64.0)
    );
    println!(
        "| commit → handler p50 / p99 / max at {} events/s | {p50:.1} / {p99:.1} / {max:.1} ms | p99 ≤ 25 ms | {} |",
        cli.rate,
        verdict(p99 <= 25.0)
    );
    println!();
    println!("Each repetition:");
    println!();
    println!(
        "| rep | idle statements/s | idle transactions/s | connections idle / load | RSS idle | \
         deliveries | p50 ms | p99 ms | max ms | events/s written | missing | process CPU s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, r) in reps.iter().enumerate() {
        let l = &r.load;
        println!(
            "| {} | {:.1} | {:.1} | {} / {} | {:.1} MiB | {} | {:.1} | {:.1} | {:.1} | {:.0} | {} | {:.1} |",
            i + 1,
            r.idle.statements_per_s,
            r.idle.transactions_per_s,
            r.idle_connections,
            r.busy_connections,
            mib(r.idle_rss_kib),
            l.latency.count,
            ms(l.latency.p50),
            ms(l.latency.p99),
            ms(l.latency.max),
            l.achieved_rate,
            l.missing,
            r.cpu
        );
    }
    println!();
    println!("Top statements in the last idle window (calls/s):");
    println!();
    println!("| calls/s | statement |");
    println!("|---:|---|");
    for (rate, query) in reps.last().map(|r| r.idle.top.as_slice()).unwrap_or(&[]) {
        println!("| {rate:.2} | `{query}` |");
    }
}

/// Starts the measured process; a task reads its stdout and timestamps each event line.
fn start(cli: &Cli) -> BoxResult<(Child, Received)> {
    // Named, so that its connections can be counted (the listener names itself).
    let separator = if cli.database_url.contains('?') {
        '&'
    } else {
        '?'
    };
    let url = format!(
        "{}{separator}application_name={}",
        cli.database_url, APPLICATIONS[0]
    );
    let mut command = Command::new(&cli.outbox);
    command.arg("--database-url").arg(url).arg("consume").args([
        "--start-from",
        "earliest",
        "--pool-size",
        &cli.pool_size.to_string(),
    ]);
    for p in 0..cli.projects {
        command.arg("--project").arg(format!("project-{p}"));
    }
    for c in 0..cli.consumers {
        command.arg("--consumer-id").arg(format!("consumer-{c}"));
    }
    let mut child = command
        .env("OUTBOX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let received: Received = Arc::new(Mutex::new(Vec::new()));
    let sink = received.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let at = Instant::now();
            let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if let Some(id) = value["event_id"].as_str() {
                sink.lock().expect("lock").push((id.to_owned(), at));
            }
        }
    });
    Ok((child, received))
}

/// Waits until every consumer has a lease and a cursor.
async fn wait_started(
    client: &tokio_postgres::Client,
    pairs: usize,
    child: &mut Child,
) -> BoxResult<()> {
    let query = Schema::default().render(
        "SELECT count(*) FROM {{schema}}.lifecycle_consumer_cursors
         WHERE lease_owner IS NOT NULL AND last_acked_sequence IS NOT NULL",
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready: i64 = client.query_one(&query, &[]).await?.get(0);
        if ready as usize >= pairs {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            return Err(format!("the process exited ({status})").into());
        }
        if Instant::now() > deadline {
            return Err(format!("only {ready} of {pairs} consumers started").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the idle window measured.
struct Idle {
    statements_per_s: f64,
    transactions_per_s: f64,
    top: Vec<(f64, String)>,
}

/// Statements and transactions per second over `seconds` with nothing written.
async fn measure_idle(client: &tokio_postgres::Client, seconds: u64) -> BoxResult<Idle> {
    const OTHERS: &str = "query NOT LIKE '%pg_stat_%' \
         AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())";
    let xacts = "SELECT xact_commit + xact_rollback FROM pg_stat_database \
                 WHERE datname = current_database()";
    client
        .execute("SELECT pg_stat_statements_reset()", &[])
        .await?;
    let x0: i64 = client.query_one(xacts, &[]).await?.get(0);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let calls: i64 = client
        .query_one(
            &format!(
                "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements WHERE {OTHERS}"
            ),
            &[],
        )
        .await?
        .get(0);
    let top = client
        .query(
            &format!(
                "SELECT calls::float8, regexp_replace(left(query, 90), '\\s+', ' ', 'g')
                 FROM pg_stat_statements WHERE {OTHERS} ORDER BY calls DESC LIMIT 6"
            ),
            &[],
        )
        .await?
        .iter()
        .map(|row| {
            (
                row.get::<_, f64>(0) / seconds as f64,
                row.get::<_, String>(1).replace('|', "\\|"),
            )
        })
        .collect();
    // Idle backends report their transaction counters up to 10 s late.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let x1: i64 = client.query_one(xacts, &[]).await?.get(0);
    Ok(Idle {
        statements_per_s: calls as f64 / seconds as f64,
        transactions_per_s: (x1 - x0) as f64 / (seconds + 11) as f64,
        top,
    })
}

/// Connections of the measured process (its pool and its listener).
async fn connections(client: &tokio_postgres::Client) -> BoxResult<i64> {
    Ok(client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY($1)",
            &[&APPLICATIONS.as_slice()],
        )
        .await?
        .get(0))
}

/// The most connections sampled during the load window.
async fn connections_max(client: &tokio_postgres::Client, samples: &Mutex<Vec<i64>>) -> i64 {
    let now = connections(client).await.unwrap_or(0);
    samples
        .lock()
        .expect("lock")
        .iter()
        .copied()
        .fold(now, i64::max)
}

/// What the load window measured.
struct Load {
    latency: stats::Percentiles,
    achieved_rate: f64,
    missing: usize,
    connections: Mutex<Vec<i64>>,
}

/// Writes `rate` events/s for `seconds` over the projects, then matches deliveries to commits.
async fn load(cli: &Cli, config: &tokio_postgres::Config, received: &Received) -> BoxResult<Load> {
    let total = (f64::from(cli.rate) * cli.seconds).round() as usize;
    let interval = Duration::from_secs_f64(1.0 / f64::from(cli.rate));
    let mut clients = Vec::new();
    for _ in 0..WRITERS {
        clients.push(db::connect(config).await?);
    }
    let sampler = db::connect(config).await?;
    received.lock().expect("lock").clear();
    let t0 = Instant::now() + Duration::from_millis(100);
    let mut writers = Vec::new();
    for (w, client) in clients.into_iter().enumerate() {
        let projects = cli.projects;
        writers.push(tokio::spawn(async move {
            write_share(client, w, total, projects, t0, interval).await
        }));
    }
    let samples = Mutex::new(Vec::new());
    let mut commits: HashMap<String, Instant> = HashMap::with_capacity(total);
    let sampling = async {
        while Instant::now() < t0 + Duration::from_secs_f64(cli.seconds) {
            if let Ok(n) = connections(&sampler).await {
                samples.lock().expect("lock").push(n);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let ((), shares) = tokio::join!(sampling, join_writers(writers));
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    for share in shares? {
        for (id, at) in share {
            first = Some(first.map_or(at, |f: Instant| f.min(at)));
            last = Some(last.map_or(at, |l: Instant| l.max(at)));
            commits.insert(id, at);
        }
    }
    let expected = commits.len() * cli.consumers;
    let deadline = Instant::now() + Duration::from_secs(15);
    while received.lock().expect("lock").len() < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let received = std::mem::take(&mut *received.lock().expect("lock"));
    let mut latencies: Vec<Duration> = received
        .iter()
        .filter_map(|(id, at)| commits.get(id).map(|c| at.saturating_duration_since(*c)))
        .collect();
    let latency = stats::percentiles(&mut latencies).ok_or("no deliveries")?;
    let span = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    Ok(Load {
        latency,
        achieved_rate: if span > 0.0 {
            (total - 1) as f64 / span
        } else {
            0.0
        },
        missing: expected.saturating_sub(latencies.len()),
        connections: samples,
    })
}

/// Awaits every writer.
async fn join_writers(
    writers: Vec<tokio::task::JoinHandle<BoxResult<Commits>>>,
) -> BoxResult<Vec<Commits>> {
    let mut shares = Vec::new();
    for writer in writers {
        shares.push(writer.await??);
    }
    Ok(shares)
}

/// Writes events `w, w + WRITERS, ...` below `total`, event k to project `k % projects`, each
/// in its own transaction at its due time; returns when each `COMMIT` returned.
async fn write_share(
    mut client: tokio_postgres::Client,
    w: usize,
    total: usize,
    projects: usize,
    t0: Instant,
    interval: Duration,
) -> BoxResult<Commits> {
    let writer = Writer::new(
        &Schema::default(),
        WriterProcessId::new(format!("multi-w{w}"))?,
    );
    let mut commits = Vec::with_capacity(total / WRITERS + 1);
    for k in (w..total).step_by(WRITERS) {
        tokio::time::sleep_until((t0 + interval * k as u32).into()).await;
        let event = TaskDeleted::new(
            ProjectId::new(format!("project-{}", k % projects))?,
            TaskId::new(format!("t{k}"))?,
            Utc::now(),
            Prior::default(),
        )?;
        let tx = client.transaction().await?;
        let outcome = writer.record(&tx, &event).await?;
        tx.commit().await?;
        commits.push((outcome.event_id().to_owned(), Instant::now()));
    }
    Ok(commits)
}
