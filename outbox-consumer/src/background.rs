//! The consumer's background work, beside the delivery loop: the lease heartbeat, the
//! embedded sequencer, the retention sweep of its project, the sampled gauges and the wake-up
//! listener. Each runs as a [`Task`] owned by the run that started it, so none outlives it,
//! and every loop that backs off after a failure waits by [`backoff`](crate::backoff::backoff).

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use outbox_core::retention::{PruneOptions, PruneReport, Pruner};
use outbox_core::sequencer::{ElectedSequencer, Sequencer};
use tokio_util::sync::CancellationToken;

use crate::config::{ConsumerConfig, Duties};
use crate::error::ConsumerError;
use crate::gauges;
use crate::lease::{self, Lease};
use crate::listener;
use crate::signals::Signals;
use crate::store::Statements;
use crate::task::{self, Task};

/// Starts the background tasks of one run; all stop on `stop`.
pub(crate) fn spawn(
    pool: &Pool,
    listen: Option<&listener::Target>,
    config: &ConsumerConfig,
    lease: &Arc<Lease>,
    statements: &Arc<Statements>,
    signals: &Arc<Signals>,
    stop: &CancellationToken,
) -> Vec<Task> {
    let mut tasks = Vec::new();
    {
        let (pool, lease, stop) = (pool.clone(), lease.clone(), stop.clone());
        let statement = statements.heartbeat.clone();
        let interval = config.delivery.heartbeat_interval;
        let availability = config.duties.availability.clone();
        tasks.push(task::spawn(async move {
            lease::heartbeat(pool, &lease, statement, interval, &availability, stop).await
        }));
    }
    if let Some(interval) = config.duties.sequence_interval {
        tasks.push(spawn_sequencer(pool, &config.duties, interval, stop));
    }
    if let Some(interval) = config.duties.prune_interval {
        let options = PruneOptions {
            retention: config.duties.retention,
            project: Some(config.project_id.clone()),
            actor: format!("consumer:{}", config.consumer_id),
            ..PruneOptions::default()
        };
        tasks.extend(spawn_pruner(
            pool,
            &config.duties,
            vec![options],
            interval,
            stop,
        ));
    }
    if let Some(interval) = config.duties.gauge_interval {
        let (pool, stop) = (pool.clone(), stop.clone());
        let schema = config.duties.schema.clone();
        let (project, consumer) = (config.project_id.clone(), config.consumer_id.clone());
        tasks.push(task::spawn(async move {
            gauges::sample(pool, schema, project, consumer, interval, stop).await
        }));
    }
    if let (true, Some(listen)) = (
        crate::signals::may_listen(config.duties.listen, config.duties.pooler),
        listen,
    ) {
        let listen = listen.clone();
        let channel = config.duties.schema.channel();
        let wake = Arc::new(listener::ProjectWake {
            project: config.project_id.to_string(),
            signals: signals.clone(),
        });
        let stop = stop.clone();
        let availability = config.duties.availability.clone();
        tasks.push(task::spawn(async move {
            listener::listen(listen, channel, wake, availability, stop).await
        }));
    }
    tasks
}

/// Starts this process's part in the sequencer election (see [`run_sequencer`]).
pub(crate) fn spawn_sequencer(
    pool: &Pool,
    duties: &Duties,
    interval: Duration,
    stop: &CancellationToken,
) -> Task {
    let (pool, stop) = (pool.clone(), stop.clone());
    let ttl = duties.sequencer_lease_ttl;
    let sequencer = Sequencer::new(&duties.schema);
    let elected = ElectedSequencer::new(
        sequencer,
        &duties.schema,
        outbox_core::internal::owner_token(),
        ttl,
        interval,
    )
    .with_min_tick_pause(duties.min_tick_pause);
    let availability = duties.availability.clone();
    task::spawn(async move { run_sequencer(pool, elected, interval, availability, stop).await })
}

/// Starts the retention sweep of `sweeps` (one per project, or one for every project), one
/// after another at start and every `interval`; `None` (logged) if an option is refused.
pub(crate) fn spawn_pruner(
    pool: &Pool,
    duties: &Duties,
    sweeps: Vec<PruneOptions>,
    interval: Duration,
    stop: &CancellationToken,
) -> Option<Task> {
    let pruners = sweeps
        .into_iter()
        .map(|options| Pruner::new(&duties.schema, options))
        .collect::<Result<Vec<_>, _>>();
    match pruners {
        Ok(pruners) => {
            let (pool, stop) = (pool.clone(), stop.clone());
            let availability = duties.availability.clone();
            Some(task::spawn(async move {
                run_pruner(pool, pruners, interval, availability, stop).await
            }))
        }
        Err(e) => {
            tracing::error!(error = %e, "retention sweep disabled");
            None
        }
    }
}

/// Takes part in the sequencer election until `stop`: numbers committed events while this
/// process leads (fast after activity, every `interval` at most when idle), looks at the
/// lease now and then otherwise, and releases the lease at the end.
async fn run_sequencer(
    pool: Pool,
    mut elected: ElectedSequencer,
    interval: Duration,
    availability: crate::outage::Availability,
    stop: CancellationToken,
) {
    let mut repeat = crate::repeat::Repeat::new(&stop, &availability, "sequencer step", interval);
    while repeat.next().await {
        let step = async {
            let mut client = pool.get().await?;
            Ok::<_, ConsumerError>(elected.step(&mut client).await?)
        };
        repeat.done(step.await);
    }
    if elected.generation().is_some() {
        if let Ok(client) = pool.get().await {
            elected.release(&client).await;
        }
    }
}

/// Runs the retention sweeps at once and then every `interval` until `stop`. A failed sweep
/// is logged and tried again at the next interval, never fatal. Each batch takes a pooled
/// connection of its own, so a long sweep never starves the heartbeat.
async fn run_pruner(
    pool: Pool,
    pruners: Vec<Pruner>,
    interval: Duration,
    availability: crate::outage::Availability,
    stop: CancellationToken,
) {
    // The projects named up front have their series from the start, at 0, rather than after
    // their first change (a sweep over a project without numbered events reports nothing).
    let named: Vec<String> = pruners
        .iter()
        .filter_map(|p| p.options().project.as_ref().map(|p| p.to_string()))
        .collect();
    for project in &named {
        let labels = [("project", project.clone())];
        metrics::counter!(crate::metric::PRUNED_EVENTS.name, &labels).increment(0);
        metrics::counter!(crate::metric::PRUNED_DEAD_LETTERS.name, &labels).increment(0);
    }
    loop {
        for pruner in &pruners {
            if stop.is_cancelled() {
                return;
            }
            sweep_and_report(&pool, pruner, interval, &availability, &stop).await;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// One sweep, its figures recorded as metrics or its failure logged.
async fn sweep_and_report(
    pool: &Pool,
    pruner: &Pruner,
    interval: Duration,
    availability: &crate::outage::Availability,
    stop: &CancellationToken,
) {
    match sweep_once(pool, pruner, stop).await {
        Ok(report) => {
            // A named project a complete sweep did not find has no numbered event: its floor
            // is 0, exported as such rather than missing until its first event is pruned.
            if let Some(project) = &pruner.options().project {
                let found = report
                    .projects
                    .iter()
                    .any(|p| p.project_id == project.as_str());
                if report.complete && !found {
                    let labels = [("project", project.to_string())];
                    metrics::gauge!(crate::metric::RETENTION_FLOOR.name, &labels).set(0.0);
                }
            }
            for project in &report.projects {
                let labels = [("project", project.project_id.clone())];
                metrics::counter!(crate::metric::PRUNED_EVENTS.name, &labels)
                    .increment(project.events_pruned);
                metrics::counter!(crate::metric::PRUNED_DEAD_LETTERS.name, &labels)
                    .increment(project.dead_letters_pruned);
                metrics::gauge!(crate::metric::RETENTION_FLOOR.name, &labels)
                    .set(project.floor as f64);
            }
        }
        Err(e) if availability.noted(crate::outage::is_outage(&e), &e) => {}
        Err(e) => tracing::warn!(
            error = %e, retry_in = %outbox_core::internal::Readable(interval),
            "retention sweep failed; will try again at the next interval"
        ),
    }
}

/// One sweep, batch by batch; stops between (or abandons a running) batch on `stop`. An
/// abandoned batch's transaction rolls back.
async fn sweep_once(
    pool: &Pool,
    pruner: &Pruner,
    stop: &CancellationToken,
) -> Result<PruneReport, ConsumerError> {
    let mut sweep = pruner.sweep();
    loop {
        let mut client = tokio::select! {
            _ = stop.cancelled() => break,
            client = pool.get() => client?,
        };
        let more = tokio::select! {
            _ = stop.cancelled() => break,
            more = sweep.step(&mut client) => more?,
        };
        if !more {
            break;
        }
    }
    Ok(sweep.into_report())
}
