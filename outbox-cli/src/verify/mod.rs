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
//! - [`watch`]: why the probe consumer ended early (an undeclared transaction pooler, a
//!   refused privilege), and progress on a terminal;
//! - [`sql`]: the statements.
//!
//! The run ends as soon as the probe consumer does, saying why, and at SIGINT or SIGTERM; in
//! every case the probe consumer is retired and its events pruned before the process exits, as
//! the next run would otherwise do.

pub mod checks;
pub mod cleanup;
pub mod probe;
pub mod sql;
pub mod topology;
pub mod watch;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_consumer::{
    Consumer, ConsumerConfig, Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler,
    StartFrom,
};
use outbox_core::connect::Pooler;
use outbox_core::internal::Unnamed;
use outbox_core::{ConsumerId, ProjectId, Schema};
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

/// Runs the whole probe. `Err` when it cannot run (exit 1), the project is in real use or a
/// transaction-mode pooler was not declared (exit 2), or `shutdown` was cancelled (exit 1,
/// after cleaning up); a failed check is in the report.
pub async fn run(
    database: &DatabaseUrl,
    schema: &Schema,
    options: &Options,
    shutdown: &CancellationToken,
) -> Result<Report, Failure> {
    let run_tag = run_tag();
    let consumer_id = ConsumerId::new(format!("verify-{run_tag}"))
        .map_err(|e| Failure::runtime(format!("probe consumer ID: {e}")))?;
    let mut client = database.connect().await?;
    cleanup::refuse_real_use(&client, schema, &options.project).await?;
    cleanup::clear_leftovers(&mut client, schema, &options.project).await?;

    let channel = format!("outbox_verify_{run_tag}");
    let topology = topology::inspect(database, &channel, options.listen_timeout).await?;
    let pooler = database.settings.pooler;
    if pooler == Pooler::None && topology.backends_per_connection > 1 {
        return Err(watch::pooler_detected(topology.backends_per_connection));
    }

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
    let mut running = {
        let (consumer, stop) = (consumer.clone(), stop.clone());
        tokio::spawn(async move { consumer.run(stop).await })
    };

    let mut progress = watch::Progress::new();
    let work = async {
        wait_until_polling(&probe_state, options.timeout, &mut progress).await?;
        let start_head = progress_of(&client, schema, &options.project).await?.0;
        let writers = database.pool(options.writers + 1)?;
        let plan = probe::Plan {
            project: options.project.clone(),
            run: run_tag.clone(),
            transactions: options.transactions,
            writers: options.writers,
            late_commit: options.late_commit,
        };
        progress.show(|| format!("verify: writing {} probe transactions", plan.transactions));
        let txs = probe::write(&writers, schema, &plan).await?;
        let end_head =
            wait_until_delivered(&client, schema, options, &received, &mut progress).await?;
        Ok::<_, Failure>((txs, start_head, end_head))
    };
    // The probe ends when its work does, when the consumer ends first (it never does on its
    // own: that is a failure, reported at once rather than after the timeout), or at a signal.
    let ended = tokio::select! {
        outcome = work => Ended::Work(outcome),
        joined = &mut running => Ended::Consumer(joined),
        () = shutdown.cancelled() => Ended::Interrupted,
    };
    progress.clear();
    stop.cancel();
    let (outcome, joined) = match ended {
        Ended::Work(outcome) => (outcome, running.await),
        Ended::Consumer(joined) => (
            Err(Failure::runtime(
                "the probe consumer stopped before the probe finished",
            )),
            joined,
        ),
        Ended::Interrupted => (
            Err(Failure::runtime("verify interrupted by a signal")),
            running.await,
        ),
    };
    let consumer_ended = match joined {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(watch::consumer_failure(&e, pooler)),
        Err(e) => Err(Failure::runtime(format!("the probe consumer failed: {e}"))),
    };
    let (txs, start_head, end_head) = match (outcome, consumer_ended) {
        (Ok(found), Ok(())) => found,
        // The consumer's own cause explains whatever else went wrong.
        (_, Err(failure)) | (Err(failure), Ok(())) => {
            return Err(clean_up_after(failure, &mut client, schema, options, &consumer_id).await);
        }
    };

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

/// How the probe's wait ended.
enum Ended<T> {
    /// The probe's own work finished (or failed).
    Work(Result<T, Failure>),
    /// The probe consumer ended first.
    Consumer(
        Result<
            Result<outbox_consumer::RunSummary, outbox_consumer::ConsumerError>,
            tokio::task::JoinError,
        >,
    ),
    /// SIGINT or SIGTERM.
    Interrupted,
}

/// Retires the probe consumer and prunes its events after a run that ended early, as the
/// next run would, and says so in `failure`'s message. The probe consumer's embedded
/// sequencer may have stopped before numbering every probe event, and only numbered events
/// are pruned: what committed is numbered first.
async fn clean_up_after(
    mut failure: Failure,
    client: &mut tokio_postgres::Client,
    schema: &Schema,
    options: &Options,
    consumer_id: &ConsumerId,
) -> Failure {
    if let Err(e) = wait_out_running_transactions(client, options.late_commit).await {
        tracing::warn!(error = %e, "could not wait out the probe transactions still running");
    }
    if let Err(e) = outbox_core::sequencer::Sequencer::new(schema)
        .drain(client)
        .await
    {
        tracing::warn!(error = %e, "could not number the probe events before pruning them");
    }
    let cleaned = cleanup::retire_and_prune(client, schema, &options.project, consumer_id).await;
    failure.message = match cleaned.ok {
        true => format!(
            "{}; the probe consumer {consumer_id} was retired and the probe events pruned",
            failure.message
        ),
        false => format!(
            "{}; {} (the next outbox verify clears what is left)",
            failure.message, cleaned.detail
        ),
    };
    failure
}

/// Waits until every transaction running now has ended, for at most `late_commit` and five
/// seconds more. The probe's writers were stopped mid-flight, and a transaction whose COMMIT
/// they had already sent ends on the server when it will: its events must be there before
/// the prune, or they outlive it. Past the bound (an unrelated long transaction, say) the
/// cleanup goes on; the next run clears what is left.
async fn wait_out_running_transactions(
    client: &tokio_postgres::Client,
    late_commit: Duration,
) -> Result<(), tokio_postgres::Error> {
    let running: Vec<String> = client
        .query_one_unnamed(sql::RUNNING_TRANSACTIONS, &[])
        .await?
        .try_get("running")?;
    let give_up_at = tokio::time::Instant::now() + late_commit + Duration::from_secs(5);
    while tokio::time::Instant::now() < give_up_at {
        let still: i64 = client
            .query_one_unnamed(sql::STILL_RUNNING, &[&running])
            .await?
            .try_get("running")?;
        if still == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
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
        outbox_consumer::config::LiveQuery::Custom("SELECT $1::text WHERE false".to_owned());
    config.duties.prune_interval = None;
    config.delivery.wait_for_lease = false;
    config
}

/// Waits for the probe consumer's first successful poll: from then on its cursor is set, and
/// every probe event comes after it.
async fn wait_until_polling(
    probe: &outbox_consumer::probe::Probe,
    timeout: Duration,
    progress: &mut watch::Progress,
) -> Result<(), Failure> {
    let deadline = Instant::now() + timeout;
    while probe.since_last_poll().is_none() {
        progress.show(|| "verify: starting the probe consumer".to_owned());
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
async fn progress_of(
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
    progress: &mut watch::Progress,
) -> Result<i64, Failure> {
    let started = Instant::now();
    let deadline = started + options.timeout;
    loop {
        let (head, unsequenced) = progress_of(client, schema, &options.project).await?;
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
        progress.show(|| {
            format!(
                "verify: waiting for the probe events: delivered up to {reached} of {head} \
                 numbered, {unsequenced} not numbered yet ({:.0} s of {:.0} s)",
                started.elapsed().as_secs_f64(),
                options.timeout.as_secs_f64()
            )
        });
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
