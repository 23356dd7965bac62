//! The consumer's background work, beside the delivery loop: the lease heartbeat, the
//! embedded sequencer, the retention sweep of its project, the sampled gauges and the wake-up
//! listener. Each runs as a task guarded by a [`TaskGuard`], so none outlives the run that
//! started it, and every reconnecting loop here and in the delivery loop waits by the one
//! [`backoff`] schedule.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use outbox_core::{ElectedSequencer, PruneOptions, PruneReport, Pruner, Sequencer, owner_token};
use tokio_util::sync::CancellationToken;

use crate::config::ConsumerConfig;
use crate::error::ConsumerError;
use crate::gauges;
use crate::lease::{self, Lease};
use crate::listener;
use crate::runtime::Signals;
use crate::store::Statements;

/// First and largest reconnect delay.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// The delay after `failures` consecutive failures: doubling from 100 ms, capped at 10 s, with
/// "equal jitter" (half fixed, half random) so restarted fleets do not reconnect in lock-step.
pub(crate) fn backoff(failures: u32, random_unit: f64) -> Duration {
    let exp = BACKOFF_MIN.saturating_mul(1u32 << failures.min(16));
    let capped = exp.min(BACKOFF_MAX);
    capped / 2 + capped.mul_f64(random_unit.clamp(0.0, 1.0) / 2.0)
}

/// A spawned task that is aborted when dropped, so no task outlives its owner; [`join`]
/// waits for it instead.
///
/// [`join`]: TaskGuard::join
pub(crate) struct TaskGuard(Option<tokio::task::JoinHandle<()>>);

impl TaskGuard {
    /// Spawns `task` under a guard.
    pub(crate) fn spawn(task: impl Future<Output = ()> + Send + 'static) -> Self {
        Self(Some(tokio::spawn(task)))
    }

    /// Waits for the task to end (its own stop signal having been given).
    pub(crate) async fn join(mut self) {
        if let Some(handle) = self.0.take() {
            let _ = handle.await;
        }
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
        }
    }
}

/// Starts the background tasks of one run; all stop on `stop`.
pub(crate) fn spawn(
    pool: &Pool,
    listen: Option<&listener::Target>,
    config: &ConsumerConfig,
    lease: &Arc<Lease>,
    statements: &Arc<Statements>,
    signals: &Arc<Signals>,
    stop: &CancellationToken,
) -> Vec<TaskGuard> {
    let mut tasks = Vec::new();
    {
        let (pool, lease, stop) = (pool.clone(), lease.clone(), stop.clone());
        let statement = statements.heartbeat.clone();
        let interval = config.heartbeat_interval;
        tasks.push(TaskGuard::spawn(async move {
            lease::heartbeat(pool, &lease, statement, interval, stop).await
        }));
    }
    if let Some(interval) = config.sequence_interval {
        tasks.push(spawn_sequencer(pool, config, interval, stop));
    }
    if let Some(interval) = config.prune_interval {
        let options = PruneOptions {
            retention: config.retention,
            project: Some(config.project_id.clone()),
            actor: format!("consumer:{}", config.consumer_id),
            ..PruneOptions::default()
        };
        tasks.extend(spawn_pruner(
            pool,
            &config.schema,
            vec![options],
            interval,
            stop,
        ));
    }
    if let Some(interval) = config.gauge_interval {
        let (pool, stop) = (pool.clone(), stop.clone());
        let schema = config.schema.clone();
        let (project, consumer) = (config.project_id.clone(), config.consumer_id.clone());
        tasks.push(TaskGuard::spawn(async move {
            gauges::sample(pool, schema, project, consumer, interval, stop).await
        }));
    }
    // Behind a transaction pooler a LISTEN would be lost with its server session: poll only.
    let listens = config.listen && config.pooler == outbox_core::Pooler::None;
    if let (true, Some(listen)) = (listens, listen) {
        let listen = listen.clone();
        let channel = config.schema.channel();
        let wake = Arc::new(listener::ProjectWake {
            project: config.project_id.to_string(),
            signals: signals.clone(),
        });
        let stop = stop.clone();
        tasks.push(TaskGuard::spawn(async move {
            listener::listen(listen, channel, wake, stop).await
        }));
    }
    tasks
}

/// Starts this process's part in the sequencer election (see [`run_sequencer`]).
pub(crate) fn spawn_sequencer(
    pool: &Pool,
    config: &ConsumerConfig,
    interval: Duration,
    stop: &CancellationToken,
) -> TaskGuard {
    let (pool, stop) = (pool.clone(), stop.clone());
    let ttl = config.sequencer_lease_ttl;
    // A paused leader inside its tick is cut off by the server within the lease TTL, so
    // its transaction lock never outlasts its lease.
    let sequencer = Sequencer::new(&config.schema)
        .with_idle_timeout(ttl.min(outbox_core::DEFAULT_IDLE_TIMEOUT))
        .with_session_plan(config.pooler == outbox_core::Pooler::None);
    let elected = ElectedSequencer::new(sequencer, &config.schema, owner_token(), ttl, interval);
    TaskGuard::spawn(async move { run_sequencer(pool, elected, interval, stop).await })
}

/// Starts the retention sweep of `sweeps` (one per project, or one for every project), one
/// after another at start and every `interval`; `None` (logged) if an option is refused.
pub(crate) fn spawn_pruner(
    pool: &Pool,
    schema: &outbox_core::Schema,
    sweeps: Vec<PruneOptions>,
    interval: Duration,
    stop: &CancellationToken,
) -> Option<TaskGuard> {
    let pruners = sweeps
        .into_iter()
        .map(|options| Pruner::new(schema, options))
        .collect::<Result<Vec<_>, _>>();
    match pruners {
        Ok(pruners) => {
            let (pool, stop) = (pool.clone(), stop.clone());
            Some(TaskGuard::spawn(async move {
                run_pruner(pool, pruners, interval, stop).await
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
    stop: CancellationToken,
) {
    let mut failures: u32 = 0;
    let mut delay = Duration::ZERO;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
        let result = async {
            let mut client = pool.get().await?;
            Ok::<_, ConsumerError>(elected.step(&mut client).await?)
        }
        .await;
        match result {
            Ok(next) => {
                failures = 0;
                delay = next;
            }
            Err(e) => {
                if failures == 0 {
                    tracing::warn!(error = %e, "sequencer step failed; backing off");
                }
                failures = failures.saturating_add(1);
                delay = backoff(failures, rand::random()).max(interval);
            }
        }
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
async fn run_pruner(pool: Pool, pruners: Vec<Pruner>, interval: Duration, stop: CancellationToken) {
    loop {
        for pruner in &pruners {
            if stop.is_cancelled() {
                return;
            }
            sweep_and_report(&pool, pruner, interval, &stop).await;
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
    stop: &CancellationToken,
) {
    match sweep_once(pool, pruner, stop).await {
        Ok(report) => {
            for project in &report.projects {
                let labels = [("project", project.project_id.clone())];
                metrics::counter!("outbox_pruned_events_total", &labels)
                    .increment(project.events_pruned);
                metrics::counter!("outbox_pruned_dead_letters_total", &labels)
                    .increment(project.dead_letters_pruned);
                metrics::gauge!("outbox_retention_floor", &labels).set(project.floor as f64);
            }
        }
        Err(e) => tracing::warn!(
            error = %e, retry_in = ?interval,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        assert_eq!(backoff(0, 0.0), Duration::from_millis(50));
        assert_eq!(backoff(0, 1.0), Duration::from_millis(100));
        assert_eq!(backoff(1, 0.0), Duration::from_millis(100));
        assert_eq!(backoff(3, 1.0), Duration::from_millis(800));
        assert_eq!(backoff(30, 0.0), Duration::from_secs(5));
        assert_eq!(backoff(30, 1.0), Duration::from_secs(10));
        for f in 0..40 {
            assert!(backoff(f, 0.5) <= BACKOFF_MAX);
        }
    }
}
