//! `outbox verify`: the gap-safety proof, run on the operator's own connection path (URL,
//! pooler, TLS, role). Probe transactions write into a dedicated probe project through the
//! SQL writer while a probe consumer, the same runtime `outbox consume` runs, receives them;
//! the checks then compare what committed with what arrived, and the probe cleans up after
//! itself (the consumer retired with an audit row, the probe events pruned).
//!
//! - [`probe`]: the concurrent probe transactions;
//! - [`checks`]: the named checks, pure functions of the two histories;
//! - [`topology`]: role, TLS, pooler mode and LISTEN availability;
//! - [`cleanup`]: refusing a project in real use, clearing an interrupted run's leftovers,
//!   retiring and pruning afterwards;
//! - [`sql`]: the statements.

pub mod checks;
pub mod cleanup;
pub mod probe;
pub mod sql;
pub mod topology;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_consumer::{
    Consumer, ConsumerConfig, Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler,
    StartFrom,
};
use outbox_core::{ConsumerId, ProjectId, Schema, Unnamed};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::db::DatabaseUrl;
use crate::failure::Failure;
use checks::{Check, Delivery, Ending, ProbeTx};
use topology::Topology;

/// How the probe runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The dedicated probe project.
    pub project: ProjectId,
    /// Probe transactions in all.
    pub transactions: usize,
    /// Concurrent probe writers.
    pub writers: usize,
    /// How long a late transaction stays open.
    pub late_commit: Duration,
    /// The probe consumer's fallback poll interval.
    pub poll_interval: Duration,
    /// How long to wait for every committed probe event to arrive.
    pub timeout: Duration,
    /// How long the LISTEN check waits for its notification.
    pub listen_timeout: Duration,
}

/// Everything `outbox verify` found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The probe project.
    pub project: String,
    /// The probe consumer (retired at the end).
    pub consumer: String,
    /// The connection path.
    pub topology: Topology,
    /// What the probe wrote.
    pub probe: ProbeCounts,
    /// Commit-to-delivery latency of the committed probe events.
    pub latency_ms: Latency,
    /// The named checks, cleanup last.
    pub checks: Vec<Check>,
}

impl Report {
    /// The names of the checks that failed.
    pub fn failed(&self) -> Vec<&'static str> {
        self.checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.name)
            .collect()
    }
}

/// What the probe transactions did.
#[derive(Debug, Serialize)]
pub struct ProbeCounts {
    /// Transactions run.
    pub transactions: usize,
    /// Events committed (at once or late).
    pub committed_events: usize,
    /// Transactions held open while others committed, then committed.
    pub late_transactions: usize,
    /// Events written in transactions that rolled back.
    pub rolled_back_events: usize,
    /// Deliveries the probe consumer received.
    pub delivered: usize,
}

/// Latency figures in milliseconds (`None` when nothing arrived).
#[derive(Debug, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Slowest.
    pub max: Option<f64>,
}

impl Latency {
    fn of(sorted_seconds: &[f64]) -> Self {
        let at = |q: f64| -> Option<f64> {
            let last = sorted_seconds.len().checked_sub(1)?;
            let index = ((last as f64) * q).round() as usize;
            Some(sorted_seconds[index] * 1000.0)
        };
        Self {
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

/// Runs the whole probe. `Err` when it cannot run (exit 1) or the project is in real use
/// (exit 2); a failed check is in the report.
pub async fn run(
    database: &DatabaseUrl,
    schema: &Schema,
    options: &Options,
) -> Result<Report, Failure> {
    let run_tag = run_tag();
    let consumer_id = ConsumerId::new(format!("verify-{run_tag}"))
        .map_err(|e| Failure::runtime(format!("probe consumer ID: {e}")))?;
    let mut client = database.connect().await?;
    cleanup::refuse_real_use(&client, schema, &options.project).await?;
    cleanup::clear_leftovers(&mut client, schema, &options.project).await?;

    let channel = format!("outbox_verify_{run_tag}");
    let topology = topology::inspect(database, &channel, options.listen_timeout).await?;

    let received = Arc::new(Mutex::new(Vec::new()));
    let config = consumer_config(database, schema, options, &consumer_id, &topology);
    let connections =
        outbox_service::Connections::new(&database.settings, 4, topology.listen.works())
            .map_err(|e| database.failure(e))?;
    let consumer = Arc::new(
        Consumer::new(
            connections.pool,
            connections.listen,
            config,
            Recorder(received.clone()),
            EmptyLiveSet,
        )
        .listen_tls(connections.tls),
    );
    let probe_state = consumer.probe();
    let stop = CancellationToken::new();
    let running = {
        let (consumer, stop) = (consumer.clone(), stop.clone());
        tokio::spawn(async move { consumer.run(stop).await })
    };

    let outcome = async {
        wait_until_polling(&probe_state, &running, options.timeout).await?;
        let start_head = progress(&client, schema, &options.project).await?.0;
        let writers = database.pool(options.writers + 1)?;
        let plan = probe::Plan {
            project: options.project.clone(),
            run: run_tag.clone(),
            transactions: options.transactions,
            writers: options.writers,
            late_commit: options.late_commit,
        };
        let txs = probe::write(&writers, schema, &plan).await?;
        let end_head = wait_until_delivered(&client, schema, options, &received).await?;
        Ok::<_, Failure>((txs, start_head, end_head))
    }
    .await;
    stop.cancel();
    let finished = running
        .await
        .map_err(|e| Failure::runtime(format!("the probe consumer failed: {e}")))?;
    let (txs, start_head, end_head) = outcome?;
    finished.map_err(|e| Failure::runtime(format!("the probe consumer failed: {e}")))?;

    let deliveries = received.lock().unwrap().clone();
    let mut checks = checks::run_all(&txs, &deliveries, start_head, end_head);
    checks
        .push(cleanup::retire_and_prune(&mut client, schema, &options.project, &consumer_id).await);
    Ok(Report {
        project: options.project.to_string(),
        consumer: consumer_id.to_string(),
        topology,
        probe: counts(&txs, deliveries.len()),
        latency_ms: Latency::of(&checks::latencies(&txs, &deliveries)),
        checks,
    })
}

/// A tag for this run's consumer, task IDs and channel: the process ID and the clock.
fn run_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{:x}{:08x}", std::process::id(), nanos)
}

/// The probe consumer: a new ID, started at the project's (cleared) head, polling
/// or listening as the topology allows, without a retention sweep of its own.
fn consumer_config(
    database: &DatabaseUrl,
    schema: &Schema,
    options: &Options,
    consumer_id: &ConsumerId,
    topology: &Topology,
) -> ConsumerConfig {
    let mut config = ConsumerConfig::new(options.project.clone(), consumer_id.clone());
    config.duties.schema = schema.clone();
    config.duties.pooler = database.settings.pooler;
    config.duties.listen = topology.listen.works();
    config.delivery.poll_interval = options.poll_interval;
    config.delivery.heartbeat_interval = Duration::from_secs(2);
    config.delivery.lease_ttl = Duration::from_secs(10);
    config.delivery.shutdown_grace = Duration::from_secs(2);
    // A new consumer reconciles at the head first; the probe project keeps no tasks table,
    // so the live set is empty.
    config.delivery.start_from = StartFrom::Reconcile;
    config.delivery.live_query =
        outbox_consumer::LiveQuery::Custom("SELECT $1::text WHERE false".to_owned());
    config.duties.prune_interval = None;
    config.delivery.wait_for_lease = false;
    config
}

/// Waits for the probe consumer's first successful poll: from then on its cursor is set, and
/// every probe event comes after it.
async fn wait_until_polling(
    probe: &outbox_consumer::Probe,
    running: &tokio::task::JoinHandle<
        Result<outbox_consumer::RunSummary, outbox_consumer::ConsumerError>,
    >,
    timeout: Duration,
) -> Result<(), Failure> {
    let deadline = Instant::now() + timeout;
    while probe.since_last_poll().is_none() {
        if running.is_finished() {
            return Err(Failure::runtime(
                "the probe consumer stopped before its first poll",
            ));
        }
        if Instant::now() > deadline {
            return Err(Failure::runtime(format!(
                "the probe consumer did not poll within {timeout:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The project's head and unsequenced count.
async fn progress(
    client: &tokio_postgres::Client,
    schema: &Schema,
    project: &ProjectId,
) -> Result<(i64, i64), Failure> {
    let row = client
        .query_one_unnamed(&schema.render(sql::PROGRESS), &[&project.as_str()])
        .await?;
    Ok((row.get("head"), row.get("unsequenced")))
}

/// Waits until nothing in the project is unsequenced and the consumer has received up to the
/// head (or `timeout` passes: the checks then say what is missing); returns the head.
async fn wait_until_delivered(
    client: &tokio_postgres::Client,
    schema: &Schema,
    options: &Options,
    received: &Mutex<Vec<Delivery>>,
) -> Result<i64, Failure> {
    let deadline = Instant::now() + options.timeout;
    loop {
        let (head, unsequenced) = progress(client, schema, &options.project).await?;
        let reached = received
            .lock()
            .unwrap()
            .iter()
            .map(|d| d.sequence)
            .max()
            .unwrap_or(0);
        if (unsequenced == 0 && reached >= head) || Instant::now() > deadline {
            return Ok(head);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn counts(txs: &[ProbeTx], delivered: usize) -> ProbeCounts {
    let events = |pick: &dyn Fn(Ending) -> bool| -> usize {
        txs.iter()
            .filter(|tx| pick(tx.ending))
            .map(|tx| tx.event_ids.len())
            .sum()
    };
    ProbeCounts {
        transactions: txs.len(),
        committed_events: events(&|e| e != Ending::RolledBack),
        late_transactions: txs
            .iter()
            .filter(|tx| tx.ending == Ending::CommittedLate)
            .count(),
        rolled_back_events: events(&|e| e == Ending::RolledBack),
        delivered,
    }
}

/// The probe consumer's handler: notes each event and when it arrived.
struct Recorder(Arc<Mutex<Vec<Delivery>>>);

impl Handler for Recorder {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        self.0.lock().unwrap().push(Delivery {
            sequence: event.sequence,
            event_id: event.event_id.clone(),
            at: Instant::now(),
        });
        Ok(())
    }
}

/// The probe project keeps no live tasks: a reconciliation has nothing to hand over.
struct EmptyLiveSet;

impl Reconciler for EmptyLiveSet {
    async fn reconcile(&self, _live: &LiveSet) -> Result<(), HandlerFailure> {
        Ok(())
    }
}
