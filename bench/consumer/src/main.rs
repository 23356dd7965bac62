//! `outbox-bench`: consumer benchmarks of lifecycle-outbox.
//!
//! ```text
//! outbox-bench --database-url URL [--events N] [--reps N] [--latency-seconds S]
//! ```
//!
//! 1. Catch-up: one consumer (in a child process, so its peak RSS is its own) drains a
//!    backlog of sequenced events from sequence 1 with a no-op handler.
//! 2. Catch-up with failures: the same, with the handler failing the first attempt of every
//!    100th event and a 1 ms retry delay.
//! 3. Latency from writer commit to handler at fixed rates, with LISTEN and poll-only.
//!
//! Each benchmark drops and re-creates its own database on the cluster of `--database-url`
//! (`outbox_bench_catchup`, `outbox_bench_latency`), so point it at a disposable cluster
//! (`bench/consumer.sh` starts one). The markdown report goes to stdout and to
//! `bench/RESULTS-consumer.md`; progress goes to stderr.

#![forbid(unsafe_code)]

mod adaptive;
mod catchup;
mod lanes;
mod latency;
mod pgq;
mod pooler;
mod report;
mod scaling;
mod stamp;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use outbox_bench::{BoxResult, db, procfs, stats};

/// Consumer benchmarks: catch-up throughput and peak RSS, and commit-to-handler latency.
#[derive(Debug, Parser)]
#[command(name = "outbox-bench", args_conflicts_with_subcommands = true)]
#[command(subcommand_negates_reqs = true)]
struct Cli {
    /// Internal: the child process of a catch-up run.
    #[command(subcommand)]
    worker: Option<Internal>,
    /// The benchmark run.
    #[command(flatten)]
    bench: BenchArgs,
}

/// Subcommands the driver runs itself.
#[derive(Debug, Subcommand)]
enum Internal {
    /// Drain a backlog as one consumer, report on stdout, exit when stdin closes.
    #[command(hide = true)]
    CatchUpWorker(catchup::WorkerArgs),
    /// Drain a PgQ queue with its batch API (bench/peers.sh), report one JSON line.
    #[command(hide = true)]
    PgqDrain(pgq::DrainArgs),
    /// K consumers of one project drain its backlog side by side (bench/scaling.sh).
    #[command(hide = true)]
    ScaleCatchUp(scaling::CatchUpArgs),
    /// Commit-to-handler latency with P projects and K consumers (bench/scaling.sh).
    #[command(hide = true)]
    ScaleLatency(scaling::LatencyArgs),
    /// Catch-up through a transaction-mode pooler beside a direct connection (bench/pooler.sh);
    /// the markdown report goes to stdout.
    PoolerCompare(pooler::PoolerArgs),
    /// Lanes: a sleeping handler with 1, 8 and 64 lanes, a no-op catch-up with 16 and 1, and
    /// commit-to-handler latency with 8 (bench/lanes.sh); the markdown report goes to stdout.
    Lanes(lanes::LanesArgs),
    /// Timestamp `outbox consume` event lines read from stdin (bench/old-snapshot.sh).
    #[command(hide = true)]
    StampLines(stamp::StampArgs),
}

/// Options of a benchmark run.
#[derive(Debug, Args)]
struct BenchArgs {
    /// URL of a disposable cluster (its `postgres` database); the benchmark creates and drops
    /// its own databases there.
    #[arg(long, required = true)]
    database_url: Option<String>,
    /// Events in the catch-up backlog.
    #[arg(long, env = "BENCH_EVENTS", default_value_t = 1_000_000)]
    events: i64,
    /// Repetitions of each catch-up run (default 3; 1 with BENCH_QUICK=1).
    #[arg(long, env = "BENCH_REPS")]
    reps: Option<usize>,
    /// Seconds of writing per latency scenario (default 10; 3 with BENCH_QUICK=1).
    #[arg(long, env = "BENCH_LATENCY_SECONDS")]
    latency_seconds: Option<f64>,
    /// Skip the catch-up benchmarks.
    #[arg(long)]
    skip_catch_up: bool,
    /// Skip the latency benchmark.
    #[arg(long)]
    skip_latency: bool,
    /// Skip the diagnostic catch-up runs (other batch sizes, asynchronous commit; one run
    /// each, not part of the goals; always skipped with BENCH_QUICK=1).
    #[arg(long)]
    skip_diagnostics: bool,
    /// Other maxima of the adaptive read batch to measure beside the default one, in every
    /// repetition (e.g. 4000,8000): how the default was chosen.
    #[arg(long, env = "BENCH_MAX_BATCH_SIZES", value_delimiter = ',')]
    max_batch_sizes: Vec<i64>,
    /// Where the markdown report is written (besides stdout).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../RESULTS-consumer.md"))]
    results: PathBuf,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OUTBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    // The runtime `outbox consume` uses: two worker threads.
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
    let result = runtime.block_on(async move {
        match cli.worker {
            Some(Internal::CatchUpWorker(args)) => catchup::worker(args).await,
            Some(Internal::PgqDrain(args)) => pgq::drain(args).await,
            Some(Internal::ScaleCatchUp(args)) => scaling::catch_up(args).await,
            Some(Internal::ScaleLatency(args)) => scaling::latency(args).await,
            Some(Internal::StampLines(args)) => stamp::stamp(args),
            Some(Internal::PoolerCompare(args)) => pooler::compare(args).await.map(|report| {
                println!("{report}");
            }),
            Some(Internal::Lanes(args)) => lanes::run(args).await.map(|report| {
                println!("{report}");
            }),
            None => run(cli.bench).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // tokio-postgres says only "db error" at the top; the server's message is below.
            let mut message = e.to_string();
            let mut source = e.source();
            while let Some(cause) = source {
                message.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            eprintln!("error: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Prints progress on stderr.
macro_rules! progress {
    ($($arg:tt)*) => { eprintln!("outbox-bench: {}", format!($($arg)*)) };
}

/// The whole benchmark: catch-up, catch-up with failures, latency, report.
async fn run(args: BenchArgs) -> BoxResult<()> {
    let admin_url = args
        .database_url
        .clone()
        .ok_or("--database-url is required")?;
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let reps = args.reps.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let latency_seconds = args
        .latency_seconds
        .unwrap_or(if quick { 3.0 } else { 10.0 });
    let mut results = report::Results {
        quick,
        events: args.events,
        reps,
        server: db::server_description(&admin_url).await?,
        load_before: report::load_average(),
        ..report::Results::default()
    };

    if !args.skip_catch_up {
        let diagnostics = !quick && !args.skip_diagnostics;
        catch_up(&admin_url, &args, reps, diagnostics, &mut results).await?;
    }
    if !args.skip_latency {
        let url = db::fresh_database(&admin_url, "outbox_bench_latency").await?;
        for listen in [true, false] {
            for rate in [500, 2000, 5000] {
                if !listen && rate == 5000 {
                    // Poll-only latency is the poll interval at any rate.
                    continue;
                }
                let scenario = latency::Scenario {
                    listen,
                    rate,
                    seconds: latency_seconds,
                };
                progress!(
                    "latency: {} at {rate} events/s for {latency_seconds} s",
                    if listen { "LISTEN" } else { "poll-only" }
                );
                let outcome = latency::run(&url, scenario).await?;
                progress!(
                    "  p50 {:?}  p99 {:?}  max {:?}  ({} events, {} missing)",
                    outcome.latency.p50,
                    outcome.latency.p99,
                    outcome.latency.max,
                    outcome.latency.count,
                    outcome.missing
                );
                results.latency.push(outcome);
            }
        }
    }

    results.load_after = report::load_average();
    let text = report::render(&results);
    print!("{text}");
    std::fs::write(&args.results, &text)
        .map_err(|e| format!("cannot write {}: {e}", args.results.display()))?;
    progress!("report written to {}", args.results.display());
    let failed_checks: Vec<&str> = results
        .latency
        .iter()
        // An event handled before its writer's COMMIT call returned is not an error: the commit
        // is visible to others before the writer has read the server's reply. It is counted in
        // the report and left out of the latencies.
        .filter(|o| o.missing > 0 || o.out_of_order > 0)
        .map(|_| "latency")
        .collect();
    if failed_checks.is_empty() {
        Ok(())
    } else {
        Err("a latency scenario lost or reordered events (see the report)".into())
    }
}

/// The catch-up benchmarks on one backlog. Each repetition runs the bare loop, the runtime
/// without failures, the runtime with failures and (unless skipped) every diagnostic variant,
/// one after another, so that a burst of other work on the machine hits one repetition of
/// everything rather than every repetition of one thing; the report takes medians.
async fn catch_up(
    admin_url: &str,
    args: &BenchArgs,
    reps: usize,
    diagnostics: bool,
    results: &mut report::Results,
) -> BoxResult<()> {
    use catchup::Variant;
    let project = "bench";
    let events = args.events;
    let url = db::fresh_database(admin_url, "outbox_bench_catchup").await?;
    progress!("writing a backlog of {events} sequenced events");
    results.backlog_seconds = db::write_backlog(&url, project, events).await?;
    progress!("backlog written in {:.1} s", results.backlog_seconds);

    let failing = Variant {
        fail_every: Some(report::FAIL_EVERY),
        ..Variant::DEFAULT
    };
    let async_commit = Variant {
        async_commit: true,
        ..Variant::DEFAULT
    };
    let variants = if diagnostics {
        vec![
            Variant::fixed(100),
            Variant::fixed(2000),
            Variant::fixed(10_000),
            async_commit,
            Variant {
                fail_every: Some(report::FAIL_EVERY),
                ..async_commit
            },
        ]
    } else {
        Vec::new()
    };
    results.diagnostics = variants.iter().map(|&v| (v, Vec::new())).collect();
    results.other_maxima = args
        .max_batch_sizes
        .iter()
        .map(|&max| {
            let variant = Variant {
                max_batch_size: max,
                ..Variant::DEFAULT
            };
            (variant, Vec::new())
        })
        .collect();

    for rep in 1..=reps {
        let bare = catchup::bare_loop(&url, project, &format!("bare-{rep}"), events, false).await?;
        progress!(
            "rep {rep}: bare read+ack loop {:.2} s ({:.0} events/s)",
            bare.seconds,
            events as f64 / bare.seconds
        );
        results.bare.push(bare);

        // Today's fixed batches and the adaptive read batch back to back, so that both meet
        // the same load on the machine.
        let id = format!("fixed-{rep}");
        let fixed = catchup::run_worker(&url, project, &id, events, Variant::fixed(500)).await?;
        progress!(
            "rep {rep}: catch-up, fixed batches of 500 {}",
            describe(&fixed)
        );
        results.fixed.push(fixed);

        let id = format!("catchup-{rep}");
        let clean = catchup::run_worker(&url, project, &id, events, Variant::DEFAULT).await?;
        progress!("rep {rep}: catch-up {}", describe(&clean));
        results.clean.push(clean);

        for (variant, runs) in &mut results.other_maxima {
            let id = format!("{}-{rep}", variant.label());
            let run = catchup::run_worker(&url, project, &id, events, *variant).await?;
            progress!(
                "rep {rep}: catch-up, reads {}: {}",
                variant.batches(),
                describe(&run)
            );
            runs.push(run);
        }

        let id = format!("failures-{rep}");
        let run = catchup::run_worker(&url, project, &id, events, failing).await?;
        progress!("rep {rep}: catch-up with failures {}", describe(&run));
        results.failing.push(run);

        if !diagnostics {
            continue;
        }
        let id = format!("bare-reprepared-{rep}");
        let bare = catchup::bare_loop(&url, project, &id, events, true).await?;
        progress!(
            "rep {rep}: diagnostic bare loop re-preparing its statements {:.2} s ({:.0} events/s)",
            bare.seconds,
            events as f64 / bare.seconds
        );
        results.bare_reprepared.push(bare);
        for (variant, runs) in &mut results.diagnostics {
            let id = format!("{}-{rep}", variant.label());
            let run = catchup::run_worker(&url, project, &id, events, *variant).await?;
            progress!("rep {rep}: diagnostic {id}: {}", describe(&run));
            runs.push(run);
        }
    }
    Ok(())
}

/// One line of progress about a catch-up run.
fn describe(run: &catchup::Run) -> String {
    format!(
        "{:.2} s ({:.0} events/s), peak RSS {} KiB",
        run.report.seconds, run.rate, run.peak_rss_kib
    )
}
