//! `outbox consume`: run one durable consumer, or a set of them in one process, with a
//! built-in sink.

use outbox_consumer::{
    Consumer, ConsumerConfig, ConsumerError, ConsumerSet, Projects, RetrySchedule, StartFrom,
};
use outbox_core::{ConsumerId, ProjectId};
use tokio_util::sync::CancellationToken;

use crate::args::ConsumerRef;
use crate::child::ChildSink;
use crate::cli::{ConsumeArgs, ConsumerOptions, Global, StartFromArg};
use crate::db::DatabaseUrl;
use crate::failure::{ExitCode, Failure};
use crate::serve::MetricsEndpoint;
use crate::shutdown::Shutdown;
use crate::sink::StdoutSink;

pub async fn run(global: &Global, args: ConsumeArgs) -> Result<(), Failure> {
    args.targets.check_distinct().map_err(Failure::usage)?;
    let Some((project, consumer)) = args.targets.single() else {
        return run_set(global, args).await;
    };
    let shutdown = Shutdown::install()?;
    let database = global.database()?;
    let options = &args.options;
    let consumer = ConsumerRef {
        project: project.clone(),
        consumer_id: consumer.clone(),
    };
    let config = build_config(global, &consumer, options)?;
    config
        .validate()
        .map_err(|e| Failure::usage(e.to_string()))?;

    let connections = connections(&database, options.no_listen, options.pool_size).await?;
    let metrics = MetricsEndpoint::start(options.metrics_addr, &shutdown.token()).await?;

    let consumer_id = consumer.consumer_id.to_string();
    let args_live_query = options.live_query.is_some();
    let token = shutdown.token();
    let result = match options.child.clone() {
        Some(command) => {
            let sink = ChildSink::new(
                command,
                consumer_id,
                options.child_timeout,
                options.child_stop_grace,
                token.clone(),
            );
            let force = sink.clone();
            shutdown.on_force(move || force.kill_now());
            let result = run_with(connections, config, sink.clone(), token).await;
            sink.close().await;
            result
        }
        None => {
            let sink = StdoutSink::new(consumer_id);
            let out = sink.for_consumer(String::new());
            let result = run_with(connections, config, sink, token).await;
            out.close().await;
            result
        }
    };
    // The metrics endpoint stops with the run, whichever way the run ended.
    if let Some(metrics) = metrics {
        metrics.stop().await;
    }
    finish(result, "consumer", args_live_query, "outbox consume")
}

/// Several projects, every project, or several consumer IDs: one [`ConsumerSet`] on one pool
/// and one LISTEN connection, printing the same lines as a lone consumer (each names its
/// project and consumer). A pair that fails is logged and stops alone; the process ends with
/// the first such failure's exit code once it stops.
async fn run_set(global: &Global, args: ConsumeArgs) -> Result<(), Failure> {
    let options = &args.options;
    if options.child.is_some() {
        return Err(Failure::usage(
            "--child drives one consumer; with several projects, --all-projects or several \
             consumer IDs, run one `outbox consume --child` per consumer instead",
        ));
    }
    let shutdown = Shutdown::install()?;
    let database = global.database()?;
    let targets = &args.targets;
    let first_project = match targets.projects.first() {
        Some(project) => project.clone(),
        None => ProjectId::new("all-projects").expect("a valid project ID"),
    };
    let first = ConsumerRef {
        project: first_project,
        consumer_id: targets.consumer_ids[0].clone(),
    };
    let template = build_config(global, &first, options)?;
    template
        .validate()
        .map_err(|e| Failure::usage(e.to_string()))?;
    let projects = match targets.all_projects {
        true => Projects::All,
        false => Projects::Listed(targets.projects.clone()),
    };
    let connections = connections(&database, options.no_listen, options.pool_size).await?;
    let sink = std::sync::Arc::new(StdoutSink::new(String::new()));
    let out = sink.for_consumer(String::new());
    let factory = move |_: &ProjectId, consumer: &ConsumerId| {
        let sink = std::sync::Arc::new(sink.for_consumer(consumer.to_string()));
        (SharedSink(sink.clone()), SharedSink(sink))
    };
    let set = ConsumerSet::new(
        connections.pool,
        connections.listen,
        template,
        projects,
        targets.consumer_ids.clone(),
        factory,
    )
    .listen_tls(connections.tls);
    let custom_live_query = options.live_query.is_some();
    let outcomes = set.run(shutdown.token()).await;
    out.close().await;
    let outcomes = outcomes.map_err(|e| classify(e, custom_live_query, "outbox consume"))?;
    let total = outcomes.len();
    let mut failures = outcomes.into_iter().filter_map(|o| o.result.err());
    match failures.next() {
        None => {
            tracing::info!(consumers = total, "consumer set stopped");
            Ok(())
        }
        Some(first) => {
            let mut failure = classify(first, custom_live_query, "outbox consume");
            let others = failures.count();
            if others > 0 {
                failure.message = format!(
                    "{} (and {others} more of the {total} consumers failed; see the log)",
                    failure.message
                );
            }
            Err(failure)
        }
    }
}

/// What a consumer runs on: its pool, the LISTEN connection's configuration (unless
/// `--no-listen`), and the TLS connector both use.
pub(crate) struct Connections {
    pub pool: deadpool_postgres::Pool,
    pub listen: Option<tokio_postgres::Config>,
    pub tls: outbox_core::Connector,
}

/// The consumer's connections. Fails fast, naming the (redacted) URL, when the database
/// cannot be reached at all or its schema does not match this build; once running, the
/// consumer rides out outages instead.
pub(crate) async fn connections(
    database: &DatabaseUrl,
    no_listen: bool,
    pool_size: u16,
) -> Result<Connections, Failure> {
    drop(database.connect().await?);
    let pool = database.pool(usize::from(pool_size))?;
    let tls = database
        .settings
        .connector()
        .map_err(|e| database.failure(e))?;
    let mut listen = database.settings.wire_config();
    listen.application_name("outbox-listener");
    Ok(Connections {
        pool,
        listen: (!no_listen).then_some(listen),
        tls,
    })
}

/// Logs how a run of `what` (consumer, relay) ended, or turns its error into the command's
/// failure (see [`classify`]).
pub(crate) fn finish(
    result: Result<outbox_consumer::RunSummary, ConsumerError>,
    what: &str,
    custom_live_query: bool,
    command: &str,
) -> Result<(), Failure> {
    match result {
        Ok(summary) => {
            tracing::info!(
                delivered = summary.delivered,
                cursor = ?summary.cursor,
                generation = summary.generation,
                "{what} stopped"
            );
            Ok(())
        }
        Err(e) => Err(classify(e, custom_live_query, command)),
    }
}

/// Maps a consumer error to the command's failure; `custom_live_query` says whether the
/// live query came from --live-query (else it is the default, which the message then shows);
/// `command` is what a retired consumer is told to run again with --reactivate.
pub(crate) fn classify(e: ConsumerError, custom_live_query: bool, command: &str) -> Failure {
    if let Some(denied) = crate::failure::permission_denied(&e) {
        return denied;
    }
    let code = match &e {
        ConsumerError::LiveQueryInvalid(problem) if custom_live_query => {
            return Failure::usage(format!("invalid --live-query: {problem}"));
        }
        ConsumerError::LiveQueryInvalid(problem) => {
            return Failure::usage(format!(
                "the default live query ({}) does not fit this database: {problem}; give the \
                 query of your schema with --live-query",
                outbox_consumer::DEFAULT_LIVE_QUERY
            ));
        }
        ConsumerError::Config(_) => ExitCode::Usage,
        ConsumerError::Retired {
            project,
            consumer,
            by,
            reason,
        } => {
            return Failure {
                code: ExitCode::Conflict,
                message: format!(
                    "consumer {consumer} of project {project} is retired (by {by}: {reason}); to \
                     resume it (it reconciles first), run: {command} --project {project} \
                     --consumer-id {consumer} --reactivate"
                ),
            };
        }
        ConsumerError::LeaseHeld { .. } => ExitCode::Conflict,
        _ => ExitCode::Runtime,
    };
    Failure {
        code,
        message: e.to_string(),
    }
}

/// The configuration of `consumer` running with `args`.
pub fn build_config(
    global: &Global,
    consumer: &ConsumerRef,
    args: &ConsumerOptions,
) -> Result<ConsumerConfig, Failure> {
    let mut config = ConsumerConfig::new(consumer.project.clone(), consumer.consumer_id.clone());
    config.schema = global.schema.clone();
    config.batch_size = args.batch_size;
    config.lease_ttl = args.lease_ttl;
    config.heartbeat_interval = args.heartbeat_interval;
    config.poll_interval = args.poll_interval;
    // Gauges cost a statement per sample: only for a process that exports them.
    config.gauge_interval = args.metrics_addr.map(|_| args.poll_interval);
    config.sequence_interval = (!args.no_sequencer).then_some(args.sequence_interval);
    config.sequencer_lease_ttl = args.sequencer_lease_ttl;
    config.pooler = global.pooler.into();
    // The runtime polls only behind `--pooler transaction`, whatever this says.
    config.listen = !args.no_listen;
    config.wait_for_lease = !args.no_wait;
    config.reactivate = args.reactivate;
    config.exit_when_caught_up = args.exit_when_caught_up;
    config.shutdown_grace = args.shutdown_grace;
    config.prune_interval = (!args.no_prune).then_some(args.prune_interval);
    config.retention = args.retention;
    config.start_from = match args.start_from {
        StartFromArg::Reconcile => StartFrom::Reconcile,
        StartFromArg::Earliest => StartFrom::Earliest,
    };
    if let Some(query) = &args.live_query {
        if !query.contains("$1") {
            return Err(Failure::usage(
                "invalid --live-query: it must take exactly one parameter, $1 (the project ID)",
            ));
        }
        config.live_query = outbox_consumer::LiveQuery::Custom(query.clone());
    }
    config.retry = RetrySchedule::new(args.retry_delays.clone(), args.max_attempts)
        .map_err(|e| Failure::usage(e.to_string()))?;
    Ok(config)
}

/// Runs the consumer with `sink` as both its handler and its reconciler. SIGINT or SIGTERM
/// (through `shutdown`) lets the current event finish or be abandoned within the grace
/// period, releases the lease and ends the run.
pub async fn run_with<S>(
    connections: Connections,
    config: ConsumerConfig,
    sink: S,
    shutdown: CancellationToken,
) -> Result<outbox_consumer::RunSummary, ConsumerError>
where
    S: outbox_consumer::Handler + outbox_consumer::Reconciler,
{
    let sink = std::sync::Arc::new(sink);
    Consumer::new(
        connections.pool,
        connections.listen,
        config,
        SharedSink(sink.clone()),
        SharedSink(sink),
    )
    .listen_tls(connections.tls)
    .run(shutdown)
    .await
}

/// One sink serving as both handler and reconciler.
struct SharedSink<S>(std::sync::Arc<S>);

impl<S: outbox_consumer::Handler> outbox_consumer::Handler for SharedSink<S> {
    async fn handle(
        &self,
        event: &outbox_consumer::ObservedEvent,
    ) -> Result<(), outbox_consumer::HandlerFailure> {
        self.0.handle(event).await
    }

    async fn before_ack(&self) -> Result<(), outbox_consumer::HandlerFailure> {
        self.0.before_ack().await
    }

    async fn before_ack_prefix(
        &self,
        handled: &[outbox_consumer::ObservedEvent],
    ) -> Result<(), outbox_consumer::PartialAck> {
        self.0.before_ack_prefix(handled).await
    }
}

impl<S: outbox_consumer::Reconciler> outbox_consumer::Reconciler for SharedSink<S> {
    async fn reconcile(
        &self,
        live: &outbox_consumer::LiveSet,
    ) -> Result<(), outbox_consumer::HandlerFailure> {
        self.0.reconcile(live).await
    }
}
