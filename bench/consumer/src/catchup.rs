//! Catch-up: one consumer drains a sequenced backlog from sequence 1.
//!
//! The consumer runs in a child process (`outbox-bench catch-up-worker`) so that its peak RSS
//! is its own, not the benchmark driver's: the child drains the backlog, prints one JSON line
//! with its own timings, then waits for its stdin to close. Meanwhile the parent reads the
//! child's `VmHWM` and CPU time from `/proc`, and the CPU time of the child's database
//! backends (found by `application_name`), before letting it exit.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use outbox_consumer::{
    Consumer, ConsumerConfig, FailureClass, Handler, HandlerFailure, LiveSet, ObservedEvent,
    Reconciler, RetrySchedule, StartFrom,
};
use outbox_core::{ConsumerId, Prior, ProjectId, Schema};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio_util::sync::CancellationToken;

use crate::{BoxResult, db, procfs};

/// Arguments of the child process.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// URL of the database holding the backlog.
    #[arg(long)]
    pub database_url: String,
    /// The backlog's project.
    #[arg(long)]
    pub project: String,
    /// A consumer ID not used before on this backlog.
    #[arg(long)]
    pub consumer_id: String,
    /// The backlog's last sequence: the run ends once it is acknowledged.
    #[arg(long)]
    pub expect: i64,
    /// Fail the first attempt of every event whose sequence is a multiple of this.
    #[arg(long)]
    pub fail_every: Option<i64>,
    /// Events per batch (the runtime's default is 500).
    #[arg(long, default_value_t = 500)]
    pub batch_size: i64,
    /// Most events per read: reads double from `--batch-size` while they come back full (the
    /// runtime's default maximum when not given; equal to `--batch-size`: fixed batches).
    #[arg(long)]
    pub max_batch_size: Option<i64>,
    /// The retry delay with `--fail-every`, in milliseconds (0 isolates the runtime's own
    /// cost of a failure from the schedule's wait).
    #[arg(long, default_value_t = 1)]
    pub retry_delay_ms: u64,
    /// Run the consumer's sessions with `synchronous_commit = off` (diagnostic: how much of
    /// the time is the acknowledgement's WAL flush).
    #[arg(long)]
    pub async_commit: bool,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout_seconds: u64,
    /// Consume through this URL of a transaction-mode pooler (PgBouncer) in front of the
    /// database, with `Pooler::Transaction`; the backlog is still checked through
    /// `--database-url`.
    #[arg(long)]
    pub pooler_url: Option<String>,
}

/// What the child reports on its stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Seconds from `Consumer::run` to its return after the last acknowledgement (includes
    /// the lease claim, the earliest-start cursor write, the final ack and the lease release).
    pub seconds: f64,
    /// Events acknowledged in order, as the runtime counts them.
    pub delivered: u64,
    /// The cursor when the run ended.
    pub cursor: Option<i64>,
    /// Handler calls that succeeded.
    pub handled: u64,
    /// Handler calls that failed on purpose.
    pub injected_failures: u64,
    /// Successful handler calls whose sequence was not the previous one plus one.
    pub out_of_order: u64,
    /// True if the runtime reconciled instead of replaying history (the run is then invalid).
    pub reconciled: bool,
}

/// The child's state, shared by its handler and reconciler.
struct WorkerState {
    expect: i64,
    fail_every: Option<i64>,
    failure: FailureClass,
    shutdown: CancellationToken,
    last: AtomicI64,
    handled: AtomicU64,
    injected: AtomicU64,
    out_of_order: AtomicU64,
    reconciled: AtomicBool,
}

/// A no-op handler (apart from counting, the order check and the injected failures) that
/// stops the consumer once the last event of the backlog is handled.
struct WorkerHandler(Arc<WorkerState>);

impl Handler for WorkerHandler {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        let state = &self.0;
        let sequence = event.sequence;
        if event.attempt == 1 && state.fail_every.is_some_and(|k| sequence % k == 0) {
            state.injected.fetch_add(1, Ordering::Relaxed);
            return Err(HandlerFailure::new(state.failure.clone()));
        }
        if state.last.swap(sequence, Ordering::Relaxed) + 1 != sequence {
            state.out_of_order.fetch_add(1, Ordering::Relaxed);
        }
        state.handled.fetch_add(1, Ordering::Relaxed);
        if sequence == state.expect {
            // The batch ends here; the runtime acknowledges it, sees the shutdown and returns.
            state.shutdown.cancel();
        }
        Ok(())
    }
}

/// Records that the runtime fell back to reconciliation, which a catch-up run must not do.
struct WorkerReconciler(Arc<WorkerState>);

impl Reconciler for WorkerReconciler {
    async fn reconcile(&self, _live: &LiveSet) -> Result<(), HandlerFailure> {
        self.0.reconciled.store(true, Ordering::Relaxed);
        self.0.shutdown.cancel();
        Ok(())
    }
}

/// The `application_name` of a worker's connections, so the parent can find its backends.
fn application_name(consumer_id: &str) -> String {
    format!("outbox-bench:{consumer_id}")
}

/// The child process: drain, report, then wait for stdin to close so the parent can read
/// `/proc/<pid>` of a process that is still alive.
pub async fn worker(args: WorkerArgs) -> BoxResult<()> {
    let mut config = db::parse(&args.database_url)?;
    config.application_name(application_name(&args.consumer_id));
    if args.async_commit {
        config.options("-c synchronous_commit=off");
    }
    // Like `outbox consume`: a pool of 4.
    let pool = match &args.pooler_url {
        Some(url) => outbox_core::connect::ConnectSettings::parse(url)?
            .with_pooler(outbox_core::connect::Pooler::Transaction)
            .pool(4)?,
        None => db::pool(&config, 4)?,
    };

    let mut consumer_config = ConsumerConfig::new(
        ProjectId::new(&args.project)?,
        ConsumerId::new(&args.consumer_id)?,
    );
    consumer_config.duties.listen = false;
    if args.pooler_url.is_some() {
        consumer_config.duties.pooler = outbox_core::connect::Pooler::Transaction;
    }
    consumer_config.delivery.start_from = StartFrom::Earliest;
    consumer_config.delivery.batch_size = args.batch_size;
    consumer_config.delivery.max_batch_size = args
        .max_batch_size
        .unwrap_or(outbox_consumer::config::DEFAULT_MAX_BATCH_SIZE.max(args.batch_size));
    if args.fail_every.is_some() {
        consumer_config.delivery.retry =
            RetrySchedule::new(vec![Duration::from_millis(args.retry_delay_ms)], 10)?;
    }

    let shutdown = CancellationToken::new();
    let state = Arc::new(WorkerState {
        expect: args.expect,
        fail_every: args.fail_every,
        failure: FailureClass::new("bench_injected")?,
        shutdown: shutdown.clone(),
        last: AtomicI64::new(0),
        handled: AtomicU64::new(0),
        injected: AtomicU64::new(0),
        out_of_order: AtomicU64::new(0),
        reconciled: AtomicBool::new(false),
    });
    let consumer = Consumer::new(
        pool.clone(),
        None,
        consumer_config,
        WorkerHandler(state.clone()),
        WorkerReconciler(state.clone()),
    );

    let started = Instant::now();
    let run = consumer.run(shutdown.clone());
    let summary = match tokio::time::timeout(Duration::from_secs(args.timeout_seconds), run).await {
        Ok(result) => result?,
        Err(_) => return Err(format!("not drained after {} s", args.timeout_seconds).into()),
    };
    let seconds = started.elapsed().as_secs_f64();

    let report = WorkerReport {
        seconds,
        delivered: summary.delivered,
        cursor: summary.cursor,
        handled: state.handled.load(Ordering::Relaxed),
        injected_failures: state.injected.load(Ordering::Relaxed),
        out_of_order: state.out_of_order.load(Ordering::Relaxed),
        reconciled: state.reconciled.load(Ordering::Relaxed),
    };
    println!("{}", serde_json::to_string(&report)?);

    // Keep the pool (and so the backends) alive until the parent has measured them.
    let mut rest = Vec::new();
    tokio::io::stdin().read_to_end(&mut rest).await?;
    drop(pool);
    Ok(())
}

/// One measured catch-up run.
#[derive(Debug, Clone)]
pub struct Run {
    /// The consumer ID used.
    pub consumer_id: String,
    /// Events in the backlog.
    pub events: i64,
    /// The child's own report.
    pub report: WorkerReport,
    /// Events per second over the child's run time.
    pub rate: f64,
    /// Peak RSS of the child process, KiB.
    pub peak_rss_kib: u64,
    /// CPU seconds of the child process (whole life: start, connect, drain).
    pub consumer_cpu: f64,
    /// CPU seconds of the child's database backends (whole life of its connections).
    pub backend_cpu: Option<f64>,
    /// WAL flushes (`pg_stat_wal.wal_sync`) of the whole cluster while the child lived: on
    /// this private cluster, the child's commits (its acknowledgements) plus the WAL writer.
    pub wal_syncs: Option<i64>,
    /// The 1-minute load average when the run started: other work on the machine.
    pub load_at_start: f64,
}

/// How a catch-up child runs.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    /// Fail the first attempt of every event whose sequence is a multiple of this.
    pub fail_every: Option<i64>,
    /// Events per batch (the first read of a catch-up, and every read once caught up).
    pub batch_size: i64,
    /// Most events per read: reads grow to this while they come back full. Equal to
    /// `batch_size`: fixed batches, as before the adaptive read batch.
    pub max_batch_size: i64,
    /// `synchronous_commit = off` for the consumer's sessions.
    pub async_commit: bool,
}

impl Variant {
    /// The runtime's defaults and a handler that never fails.
    pub const DEFAULT: Variant = Variant {
        fail_every: None,
        batch_size: 500,
        max_batch_size: outbox_consumer::config::DEFAULT_MAX_BATCH_SIZE,
        async_commit: false,
    };

    /// Fixed batches of `batch_size` (every read the same size).
    pub const fn fixed(batch_size: i64) -> Variant {
        Variant {
            batch_size,
            max_batch_size: batch_size,
            ..Variant::DEFAULT
        }
    }

    /// The read sizes: `500` for fixed batches, `500-2000` for reads growing to 2,000.
    pub fn batches(&self) -> String {
        if self.max_batch_size == self.batch_size {
            self.batch_size.to_string()
        } else {
            format!("{}-{}", self.batch_size, self.max_batch_size)
        }
    }

    /// A short name for consumer IDs: `batch-2000`, `async-commit-failures`, ...
    pub fn label(&self) -> String {
        let mut parts = Vec::new();
        if self.batch_size != Self::DEFAULT.batch_size
            || self.max_batch_size != Self::DEFAULT.max_batch_size
        {
            parts.push(format!("batch-{}", self.batches()));
        }
        if self.async_commit {
            parts.push("async-commit".to_owned());
        }
        if self.fail_every.is_some() {
            parts.push("failures".to_owned());
        }
        if parts.is_empty() {
            parts.push("default".to_owned());
        }
        parts.join("-")
    }
}

/// Runs one child to completion and checks the database state it left.
pub async fn run_worker(
    url: &str,
    project: &str,
    consumer_id: &str,
    events: i64,
    variant: Variant,
) -> BoxResult<Run> {
    run_worker_via(url, None, project, consumer_id, events, variant).await
}

/// Like [`run_worker`], the child consuming through `pooler_url` when given (its backends
/// are then the pooler's, shared and long-lived: their CPU and WAL figures are not taken).
pub async fn run_worker_via(
    url: &str,
    pooler_url: Option<&str>,
    project: &str,
    consumer_id: &str,
    events: i64,
    variant: Variant,
) -> BoxResult<Run> {
    let Variant {
        fail_every,
        batch_size,
        max_batch_size,
        async_commit,
    } = variant;
    let load_at_start = procfs::load_one();
    let wal_before = wal_syncs(url).await.ok();
    let exe = std::env::current_exe()?;
    let mut command = tokio::process::Command::new(exe);
    command
        .arg("catch-up-worker")
        .args(["--database-url", url, "--project", project])
        .args(["--consumer-id", consumer_id])
        .args(["--expect", &events.to_string()])
        .args(["--batch-size", &batch_size.to_string()])
        .args(["--max-batch-size", &max_batch_size.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if let Some(k) = fail_every {
        command.args(["--fail-every", &k.to_string()]);
    }
    if async_commit {
        command.arg("--async-commit");
    }
    if let Some(pooler_url) = pooler_url {
        command.args(["--pooler-url", pooler_url]);
    }
    let mut child = command.spawn()?;
    let pid = child.id().ok_or("the worker exited at once")?;
    let stdout = child.stdout.take().ok_or("no worker stdout")?;
    let line = BufReader::new(stdout)
        .lines()
        .next_line()
        .await?
        .ok_or("the worker ended without a report (see its stderr above)")?;
    let report: WorkerReport = serde_json::from_str(&line)?;

    // The child is alive and idle: its peak and its CPU are final.
    let memory = procfs::memory(pid)?;
    let consumer_cpu = procfs::cpu_seconds(pid)?;
    let direct = pooler_url.is_none();
    let backend_cpu = match direct {
        true => backend_cpu(url, &application_name(consumer_id)).await.ok(),
        false => None,
    };

    drop(child.stdin.take());
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await??;
    if !status.success() {
        return Err(format!("the worker exited with {status}").into());
    }
    // A backend reports its WAL statistics when it exits.
    let wal_after = match direct {
        true => match backends_gone(url, &application_name(consumer_id)).await {
            Ok(()) => wal_syncs(url).await.ok(),
            Err(_) => None,
        },
        false => None,
    };
    verify(url, project, consumer_id, events, fail_every, &report).await?;
    Ok(Run {
        consumer_id: consumer_id.to_owned(),
        events,
        rate: events as f64 / report.seconds,
        report,
        peak_rss_kib: memory.peak_kib,
        consumer_cpu,
        backend_cpu,
        wal_syncs: wal_before
            .zip(wal_after)
            .map(|(before, after)| after - before),
        load_at_start,
    })
}

/// The cluster's WAL flush count so far.
async fn wal_syncs(url: &str) -> BoxResult<i64> {
    let client = db::connect(&db::parse(url)?).await?;
    Ok(client
        .query_one("SELECT wal_sync FROM pg_stat_wal", &[])
        .await?
        .get(0))
}

/// Waits (at most 5 s) until no backend named `name` is left.
async fn backends_gone(url: &str, name: &str) -> BoxResult<()> {
    let client = db::connect(&db::parse(url)?).await?;
    for _ in 0..250 {
        let left: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&name],
            )
            .await?
            .get(0);
        if left == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("backends of {name} did not exit").into())
}

/// CPU seconds of the backends whose `application_name` is `name` (read from `/proc`, so
/// only for a server on this machine).
async fn backend_cpu(url: &str, name: &str) -> BoxResult<f64> {
    let client = db::connect(&db::parse(url)?).await?;
    let rows = client
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await?;
    if rows.is_empty() {
        return Err("no backends found".into());
    }
    let mut total = 0.0;
    for row in rows {
        let pid: i32 = row.get(0);
        total += procfs::cpu_seconds(pid as u32)?;
    }
    Ok(total)
}

/// The run must have delivered every event once, in order, and left clean state behind:
/// the cursor at the end, the lease released, no retry state or dead letters.
async fn verify(
    url: &str,
    project: &str,
    consumer_id: &str,
    events: i64,
    fail_every: Option<i64>,
    report: &WorkerReport,
) -> BoxResult<()> {
    let expected_failures = fail_every.map_or(0, |k| (events / k) as u64);
    let mut problems = Vec::new();
    if report.reconciled {
        problems.push("the consumer reconciled instead of replaying history".to_owned());
    }
    if report.cursor != Some(events) || report.delivered != events as u64 {
        problems.push(format!(
            "cursor {:?}, {} delivered (expected {events})",
            report.cursor, report.delivered
        ));
    }
    if report.handled != events as u64 || report.out_of_order != 0 {
        problems.push(format!(
            "{} handled, {} out of order",
            report.handled, report.out_of_order
        ));
    }
    if report.injected_failures != expected_failures {
        problems.push(format!(
            "{} injected failures (expected {expected_failures})",
            report.injected_failures
        ));
    }
    let client = db::connect(&db::parse(url)?).await?;
    let schema = Schema::default();
    let row = client
        .query_one(
            &schema.render(
                "SELECT c.last_acked_sequence, c.lease_owner IS NULL,
                        (SELECT count(*) FROM {{schema}}.lifecycle_deliveries d
                         WHERE d.project_id = c.project_id AND d.consumer_id = c.consumer_id),
                        (SELECT count(*) FROM {{schema}}.lifecycle_audit a
                         WHERE a.project_id = c.project_id AND a.consumer_id = c.consumer_id)
                 FROM {{schema}}.lifecycle_consumer_cursors c
                 WHERE c.project_id = $1 AND c.consumer_id = $2",
            ),
            &[&project, &consumer_id],
        )
        .await?;
    let (cursor, released, deliveries, audits): (Option<i64>, bool, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    if cursor != Some(events) || !released || deliveries != 0 || audits != 0 {
        problems.push(format!(
            "stored cursor {cursor:?}, lease released {released}, {deliveries} delivery rows, \
             {audits} audit rows"
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("catch-up run {consumer_id} failed: {}", problems.join("; ")).into())
    }
}

/// Where a bare loop's time went, in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct BareLoop {
    /// Whole loop.
    pub seconds: f64,
    /// Waiting for `READ_BATCH` results (round trip, server execution, row transfer).
    pub read: f64,
    /// Decoding rows into Rust values, payload included.
    pub decode: f64,
    /// Waiting for the `ACK` update (round trip, execution, commit and its WAL flush).
    pub ack: f64,
    /// Batches.
    pub batches: u64,
}

/// The floor under the runtime: the runtime's own read and ack statements (copied from
/// `outbox-consumer`'s `READ_BATCH` and `ACK`) in a bare loop on one connection, decoding
/// each row's payload as the runtime does, with no lease, handler or pool, and timing each
/// phase. It runs in the driver process: only its speed matters.
///
/// With `reprepare` each statement is passed as text, which makes tokio-postgres prepare it
/// again on every call (an extra round trip and a parse and plan on the server), as the
/// runtime's `client.query(&statements.read_batch, ..)` calls do; without it, both are
/// prepared once.
pub async fn bare_loop(
    url: &str,
    project: &str,
    consumer_id: &str,
    events: i64,
    reprepare: bool,
) -> BoxResult<BareLoop> {
    let schema = Schema::default();
    let client = db::connect(&db::parse(url)?).await?;
    let (owner, generation) = ("bare-loop", 1_i64);
    client
        .execute(
            &schema.render(
                "WITH consumer AS (
                     INSERT INTO {{schema}}.lifecycle_consumers
                         (project_id, consumer_id, lease_owner, lease_generation,
                          claimed_until, claimed_at)
                     VALUES ($1, $2, $3, $4, now() + interval '1 hour', now())
                     RETURNING project_id, consumer_id)
                 INSERT INTO {{schema}}.lifecycle_consumer_positions
                     (project_id, consumer_id, last_acked_sequence)
                 SELECT project_id, consumer_id, 0 FROM consumer",
            ),
            &[&project, &consumer_id, &owner, &generation],
        )
        .await?;
    let read_sql = schema.render(
        "SELECT sequence, event_type, event_id, task_id, deleted_at, writer_process_id,
                occurred_at, payload_version, payload
         FROM {{schema}}.lifecycle_outbox
         WHERE project_id = $1 AND sequence > $2
         ORDER BY sequence
         LIMIT $3",
    );
    let ack_sql = schema.render(
        "WITH fence AS (
             SELECT 1 FROM {{schema}}.lifecycle_consumers
             WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3
               AND lease_generation = $4 AND state = 'active'
             FOR NO KEY UPDATE),
         was AS (
             SELECT position_id FROM {{schema}}.lifecycle_consumer_positions
             WHERE (project_id, consumer_id, position_id) <= ($1, $2, 9223372036854775807)
             ORDER BY project_id DESC, consumer_id DESC, position_id DESC LIMIT 1),
         replaced AS (
             DELETE FROM {{schema}}.lifecycle_consumer_positions AS p
             WHERE p.project_id = $1 AND p.consumer_id = $2
               AND p.position_id = (SELECT was.position_id FROM fence, was))
         INSERT INTO {{schema}}.lifecycle_consumer_positions
             (project_id, consumer_id, last_acked_sequence)
         SELECT $1, $2, $5 FROM fence",
    );
    let read = client.prepare(&read_sql).await?;
    let ack = client.prepare(&ack_sql).await?;
    let mut timing = BareLoop::default();
    let started = Instant::now();
    let mut cursor = 0_i64;
    let mut decoded = 0_u64;
    while cursor < events {
        let phase = Instant::now();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&project, &cursor, &500_i64];
        let rows = if reprepare {
            client.query(read_sql.as_str(), &params).await?
        } else {
            client.query(&read, &params).await?
        };
        timing.read += phase.elapsed().as_secs_f64();
        let Some(last) = rows.last() else {
            return Err(format!("bare loop: nothing after {cursor}").into());
        };
        let phase = Instant::now();
        for row in &rows {
            let _event_type: String = row.get(1);
            let _event_id: String = row.get(2);
            let _task_id: String = row.get(3);
            let _deleted_at: chrono::DateTime<chrono::Utc> = row.get(4);
            let _writer: String = row.get(5);
            let _occurred_at: chrono::DateTime<chrono::Utc> = row.get(6);
            let _version: i32 = row.get(7);
            let outbox_core::event::PayloadText(payload) = row.get(8);
            let _prior: Prior = serde_json::from_slice(payload)?;
            decoded += 1;
        }
        cursor = last.get(0);
        timing.decode += phase.elapsed().as_secs_f64();
        let phase = Instant::now();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&project, &consumer_id, &owner, &generation, &cursor];
        if reprepare {
            client.execute(ack_sql.as_str(), &params).await?;
        } else {
            client.execute(&ack, &params).await?;
        }
        timing.ack += phase.elapsed().as_secs_f64();
        timing.batches += 1;
    }
    timing.seconds = started.elapsed().as_secs_f64();
    if decoded != events as u64 {
        return Err(format!("bare loop decoded {decoded} of {events} events").into());
    }
    Ok(timing)
}
