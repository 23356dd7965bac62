//! Many consumers in one process: a [`ConsumerSet`] runs every (project, consumer) pair of a
//! list of projects, or of every project including those that appear later, on one pool, one
//! LISTEN connection and one place in the sequencer election.
//!
//! Each pair is an ordinary [`Consumer`] run with its own lease, cursor, fencing, retries and
//! dead letters, so a poison event or a lost lease stops or delays only its pair. What the
//! pairs share lives in their `Shared` side: the lease heartbeat and the fallback poll are one
//! statement each for the whole set, which keeps an idle set of a thousand consumers at a few
//! statements a second.

mod acks;
mod pairs;
mod reads;
mod shared;

use std::sync::Arc;

use deadpool_postgres::Pool;
use outbox_core::retention::PruneOptions;
use outbox_core::{ConsumerId, ProjectId};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_postgres::Config;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use pairs::PairProbes;
use shared::Shared;

use crate::background;
use crate::config::{ConfigError, ConsumerConfig, DeliverySettings, Duties, StartFrom};
use crate::error::ConsumerError;
use crate::handler::{Handler, Reconciler};
use crate::listener;
use crate::runtime::{Consumer, MIN_POOL_SIZE, RunSummary};
use crate::task::{self, Task};

/// Which projects a set follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Projects {
    /// These projects.
    Listed(Vec<ProjectId>),
    /// Every project with a numbered event, including projects that appear while the set
    /// runs: found by the set's fallback poll (every
    /// [`poll_interval`](DeliverySettings::poll_interval), which reads every project's head)
    /// and, sooner, by the first notification naming a project not followed yet. A project that
    /// appears while the set runs is delivered from its first event, as [`StartFrom::Earliest`]
    /// does: its whole history is retained, so its first deletions arrive as events rather than
    /// folded into a reconciliation. Probe projects
    /// ([`outbox_core::ids::PROBE_PROJECT_PREFIX`], `outbox verify`'s) are not followed.
    All,
}

/// When a followed project was found: at the set's start (its pairs start as the template
/// says) or while the set runs (born then: its pairs start from its first event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Born {
    BeforeStart,
    WhileRunning,
}

/// How one pair's run ended.
#[derive(Debug)]
pub struct PairOutcome {
    /// The pair's project.
    pub project_id: ProjectId,
    /// The pair's consumer.
    pub consumer_id: ConsumerId,
    /// What [`Consumer::run`] returned for it.
    pub result: Result<RunSummary, ConsumerError>,
}

/// Makes the handler and reconciler of one pair.
pub trait PairFactory: Send + Sync + 'static {
    /// The pair's handler.
    type Handler: Handler;
    /// The pair's reconciler.
    type Reconciler: Reconciler;
    /// Called once for each pair the set starts.
    fn make(&self, project: &ProjectId, consumer: &ConsumerId)
    -> (Self::Handler, Self::Reconciler);
}

impl<F, H, R> PairFactory for F
where
    F: Fn(&ProjectId, &ConsumerId) -> (H, R) + Send + Sync + 'static,
    H: Handler,
    R: Reconciler,
{
    type Handler = H;
    type Reconciler = R;
    fn make(&self, project: &ProjectId, consumer: &ConsumerId) -> (H, R) {
        self(project, consumer)
    }
}

/// Runs every pair of `projects` × `consumer_ids` in this process. See the module docs.
pub struct ConsumerSet<F> {
    /// Shared by every pair and by the set's shared tasks; the listener is the one connection more.
    pool: Pool,
    /// The one LISTEN connection's configuration; `None` polls only.
    listen_config: Option<Config>,
    /// How every pair delivers.
    template: DeliverySettings,
    /// What the set does once for all its pairs: LISTEN, sequencer, sweep, gauges.
    duties: Duties,
    /// The projects followed.
    projects: Projects,
    /// The consumer IDs run for every project.
    consumer_ids: Vec<ConsumerId>,
    /// Makes each pair's handler and reconciler.
    factory: Arc<F>,
    /// TLS for the listener connection (`None`: plain, as `tokio_postgres::NoTls`).
    listen_tls: Option<outbox_core::connect::Connector>,
    /// Every started pair's probe.
    probes: PairProbes,
    /// Whether the first pair to end with an error stops every other pair.
    stop_on_failure: bool,
}

impl<F: PairFactory> ConsumerSet<F> {
    /// A set running, for each project of `projects`, one consumer per ID of `consumer_ids`,
    /// each delivering as `template`, with handlers from `factory`; the set carries out
    /// `duties` once for all of them.
    pub fn new(
        pool: Pool,
        listen_config: Option<Config>,
        template: DeliverySettings,
        duties: Duties,
        projects: Projects,
        consumer_ids: Vec<ConsumerId>,
        factory: F,
    ) -> Self {
        Self {
            pool,
            listen_config,
            template,
            duties,
            projects,
            consumer_ids,
            factory: Arc::new(factory),
            listen_tls: None,
            probes: PairProbes::default(),
            stop_on_failure: false,
        }
    }

    /// Stops every pair (as a shutdown does) once one pair ends with an error, for a process
    /// that serves all its pairs as one whole; by default the others go on. A pair that an
    /// operator retired is not a failure: it stops alone.
    pub fn stop_on_failure(mut self) -> Self {
        self.stop_on_failure = true;
        self
    }

    /// The pairs' probes (lease and liveness), for readiness checks; filled as pairs start.
    pub fn probes(&self) -> PairProbes {
        self.probes.clone()
    }

    /// Opens the LISTEN connection through `connector`, as [`Consumer::listen_tls`] does.
    ///
    /// [`Consumer::listen_tls`]: crate::Consumer::listen_tls
    pub fn listen_tls(mut self, connector: outbox_core::connect::Connector) -> Self {
        self.listen_tls = Some(connector);
        self
    }

    /// Runs until `shutdown` (every pair then stops as a lone consumer does), or until every
    /// pair has ended on its own (`exit_when_caught_up`, or errors) when no more can appear
    /// (with `exit_when_caught_up` and no project at all, at once). A pair that ends with an
    /// error is logged and reported; the others go on, except under
    /// [`stop_on_failure`](Self::stop_on_failure) and for a lease found held without
    /// [`wait_for_lease`](DeliverySettings::wait_for_lease), which stop them all.
    pub async fn run(
        &self,
        shutdown: CancellationToken,
    ) -> Result<Vec<PairOutcome>, ConsumerError> {
        self.template.validate()?;
        self.duties.validate()?;
        if self.consumer_ids.is_empty() {
            return Err(ConfigError("a consumer set needs at least one consumer ID".into()).into());
        }
        let pool_size = self.pool.status().max_size;
        if pool_size < MIN_POOL_SIZE {
            return Err(ConfigError(format!(
                "the pool allows {pool_size} connection(s); a consumer set needs at least \
                 {MIN_POOL_SIZE} (delivery, heartbeat, sequencer)"
            ))
            .into());
        }
        // The checks before the pairs start wait out an unavailable database, as the pairs do.
        if self.template.checks_live_query_first() {
            let checked = crate::repeat::wait_out(
                "the live query's check",
                &self.duties.availability,
                &shutdown,
                || async {
                    let mut client = self.pool.get().await?;
                    crate::live_query::check(&mut client, self.template.live_query.sql()).await
                },
            )
            .await?;
            if checked.is_none() {
                return Ok(Vec::new());
            }
        }
        let (discovered_tx, mut discovered) = mpsc::unbounded_channel();
        let (listed, discovering) = match &self.projects {
            Projects::Listed(list) => (Some(list.iter().map(|p| p.to_string()).collect()), None),
            Projects::All => (None, Some(discovered_tx)),
        };
        let consumer_ids = self.consumer_ids.iter().map(|c| c.to_string()).collect();
        let shared = Arc::new(Shared::new(
            &self.duties.schema,
            self.duties.pooler,
            self.duties.availability.clone(),
            listed,
            consumer_ids,
            discovering,
        ));
        let mut pairs = JoinSet::new();
        // Cancelled by `shutdown`, or by a failed pair under `stop_on_failure`.
        let shutdown = shutdown.child_token();
        match &self.projects {
            Projects::Listed(list) => {
                for project in list {
                    self.start_project(&mut pairs, &shared, project, &self.template, &shutdown);
                }
            }
            // The projects there are now, before anything else; later ones arrive below.
            Projects::All => {
                let polled = crate::repeat::wait_out(
                    "the set's first poll",
                    &self.duties.availability,
                    &shutdown,
                    || shared.poll_once(&self.pool),
                );
                if polled.await?.is_none() {
                    return Ok(Vec::new());
                }
                while let Ok(project) = discovered.try_recv() {
                    self.follow(&mut pairs, &shared, &project, Born::BeforeStart, &shutdown);
                }
            }
        }
        let stop = CancellationToken::new();
        let tasks = self.spawn_shared(&shared, &stop);
        let mut outcomes = Vec::new();
        // Followed projects that appear later keep the set running, unless it stops once
        // caught up: then it ends with the pairs it has, and with none at once.
        let more_may_come =
            matches!(self.projects, Projects::All) && !self.template.exit_when_caught_up;
        let mut gave_up = false;
        loop {
            if pairs.is_empty() && !more_may_come {
                break;
            }
            tokio::select! {
                Some(project) = discovered.recv() => {
                    self.follow(&mut pairs, &shared, &project, Born::WhileRunning, &shutdown);
                }
                Some(joined) = pairs.join_next() => {
                    let outcome = ended(joined);
                    // A retired pair stopped by an operator's decision, not by a failure:
                    // under `stop_on_failure` the other pairs go on.
                    let retired = matches!(outcome.result, Err(ConsumerError::Retired { .. }));
                    if retired {
                        self.probes.mark_retired(&outcome.project_id, &outcome.consumer_id);
                    }
                    let stops_all = !retired && self.stops_all(&outcome);
                    outcomes.push(outcome);
                    if stops_all {
                        shutdown.cancel();
                        break;
                    }
                }
                _ = shutdown.cancelled() => break,
                // Also with no pair at all (every project, none yet).
                () = self.duties.availability.given_up() => {
                    shutdown.cancel();
                    gave_up = true;
                    break;
                }
            }
        }
        while let Some(joined) = pairs.join_next().await {
            outcomes.push(ended(joined));
        }
        stop.cancel();
        task::join_all(tasks).await;
        match gave_up && outcomes.iter().all(|o| o.result.is_ok()) {
            true => Err(self.duties.availability.gave_up_error()),
            false => Ok(outcomes),
        }
    }

    /// Whether `outcome` stops every other pair: any failure under `stop_on_failure`, and a
    /// lease found held when the set does not wait for held leases (it was asked to run all
    /// its pairs now or not at all, as a lone consumer that does not wait exits at once).
    fn stops_all(&self, outcome: &PairOutcome) -> bool {
        match &outcome.result {
            Ok(_) => false,
            Err(ConsumerError::LeaseHeld { .. }) if !self.template.wait_for_lease => true,
            // The process gave up on an unavailable database: every pair has, or will.
            Err(ConsumerError::GaveUp { .. }) => true,
            Err(_) => self.stop_on_failure,
        }
    }

    /// Starts the pairs of `project`, found by discovery (at the set's first poll, or later).
    fn follow(
        &self,
        pairs: &mut JoinSet<PairOutcome>,
        shared: &Arc<Shared>,
        project: &str,
        born: Born,
        shutdown: &CancellationToken,
    ) {
        match ProjectId::new(project) {
            Ok(project) => {
                tracing::info!(project = %project, "following a new project");
                let mut template = self.template.clone();
                if born == Born::WhileRunning {
                    // Its whole history is retained (unless a sweep pruned it already, which
                    // `Earliest` checks), so a new consumer starts at its first event.
                    template.start_from = StartFrom::Earliest;
                }
                self.start_project(pairs, shared, &project, &template, shutdown);
            }
            Err(e) => {
                tracing::warn!(project, error = %e, "not following a project with an invalid ID")
            }
        }
    }

    /// Starts one pair per consumer ID for `project`, each delivering as `template`.
    fn start_project(
        &self,
        pairs: &mut JoinSet<PairOutcome>,
        shared: &Arc<Shared>,
        project: &ProjectId,
        template: &DeliverySettings,
        shutdown: &CancellationToken,
    ) {
        for consumer_id in &self.consumer_ids {
            let config = ConsumerConfig {
                project_id: project.clone(),
                consumer_id: consumer_id.clone(),
                delivery: template.clone(),
                duties: self.duties.clone(),
            };
            let (handler, reconciler) = self.factory.make(project, consumer_id);
            let consumer = Consumer::new(self.pool.clone(), None, config, handler, reconciler)
                .in_set(shared.clone());
            let probe = consumer.probe();
            probe.follow_shared_poll(shared.poll_clock.clone());
            self.probes.insert(project, consumer_id, probe.clone());
            let gauges = self.duties.gauge_interval.map(|interval| {
                pairs::gauges_while_held(
                    self.pool.clone(),
                    self.duties.schema.clone(),
                    project.clone(),
                    consumer_id.clone(),
                    interval,
                    probe,
                )
            });
            // A child token per pair: every loop round of every pair checks its token, and a
            // thousand pairs checking one shared token contend for its one lock.
            let shutdown = shutdown.child_token();
            let (project_id, consumer_id) = (project.clone(), consumer_id.clone());
            pairs.spawn(async move {
                let run = consumer.run(shutdown);
                let result = match gauges {
                    None => run.await,
                    Some(gauges) => tokio::select! {
                        result = run => result,
                        () = gauges => unreachable!("sampling gauges never ends on its own"),
                    },
                };
                PairOutcome {
                    project_id,
                    consumer_id,
                    result,
                }
            });
        }
    }

    /// The set's shared tasks: heartbeat, poll, listener, sequencer and retention sweep.
    fn spawn_shared(&self, shared: &Arc<Shared>, stop: &CancellationToken) -> Vec<Task> {
        let (delivery, duties) = (&self.template, &self.duties);
        let mut tasks = Vec::new();
        {
            let (shared, pool, stop) = (shared.clone(), self.pool.clone(), stop.clone());
            let (ttl, interval) = (delivery.lease_ttl, delivery.heartbeat_interval);
            tasks.push(task::spawn(
                async move { shared.heartbeat(pool, ttl, interval, stop).await }
                    .instrument(tracing::info_span!("set-heartbeat")),
            ));
        }
        if let Some(task) = shared.ack_task(self.pool.clone(), stop.clone()) {
            tasks.push(task::spawn(task));
        }
        {
            let (shared, pool, stop) = (shared.clone(), self.pool.clone(), stop.clone());
            let interval = delivery.poll_interval;
            tasks.push(task::spawn(async move {
                shared.poll(pool, interval, stop).await
            }));
        }
        let listens = crate::signals::may_listen(duties.listen, duties.pooler);
        if let (true, Some(config_of_listener)) = (listens, &self.listen_config) {
            let listen = listener::Target {
                config: config_of_listener.clone(),
                tls: self.listen_tls.clone(),
            };
            let channel = duties.schema.channel();
            let (wake, stop) = (shared.clone() as Arc<dyn listener::Wake>, stop.clone());
            let availability = duties.availability.clone();
            tasks.push(task::spawn(async move {
                listener::listen(listen, channel, wake, availability, stop).await
            }));
        }
        if let Some(interval) = duties.sequence_interval {
            tasks.push(background::spawn_sequencer(
                &self.pool, duties, interval, stop,
            ));
        }
        if let Some(interval) = duties.prune_interval {
            let base = PruneOptions {
                retention: duties.retention,
                actor: "consumer-set".to_owned(),
                ..PruneOptions::default()
            };
            let sweeps = match &self.projects {
                Projects::All => vec![base],
                Projects::Listed(list) => list
                    .iter()
                    .map(|project| PruneOptions {
                        project: Some(project.clone()),
                        ..base.clone()
                    })
                    .collect(),
            };
            tasks.extend(background::spawn_pruner(
                &self.pool, duties, sweeps, interval, stop,
            ));
        }
        tasks
    }
}

/// A pair's outcome, logged.
fn ended(joined: Result<PairOutcome, tokio::task::JoinError>) -> PairOutcome {
    let outcome = joined.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let (project, consumer) = (&outcome.project_id, &outcome.consumer_id);
    match &outcome.result {
        Ok(summary) => tracing::info!(
            %project, %consumer, delivered = summary.delivered, cursor = %crate::cursor::ShownCursor(summary.cursor),
            "consumer stopped"
        ),
        Err(e) => tracing::error!(
            %project, %consumer, error = %e,
            "consumer stopped; the other consumers of this process go on"
        ),
    }
    outcome
}
