//! `outbox consume`: run one durable consumer with a built-in sink.

use outbox_consumer::{Consumer, ConsumerConfig, ConsumerError, RetrySchedule, StartFrom};
use tokio_util::sync::CancellationToken;

use crate::cli::{ConsumeArgs, Global, StartFromArg};
use crate::failure::{ExitCode, Failure};
use crate::sink::{ChildSink, StdoutSink};

pub async fn run(global: &Global, args: ConsumeArgs) -> Result<(), Failure> {
    let database = global.database()?;
    let config = build_config(global, &args)?;
    config
        .validate()
        .map_err(|e| Failure::usage(e.to_string()))?;

    // Fail fast, naming the (redacted) URL, when the database cannot be reached at all;
    // once running, the consumer rides out outages instead.
    // The same connection checks that the schema matches this build.
    drop(database.connect().await?);
    let pool = database.pool(4)?;
    let connector = database
        .settings
        .connector()
        .map_err(|e| database.failure(e))?;
    let mut listen = database.settings.wire_config();
    listen.application_name("outbox-listener");
    let listen = config.listen.then_some(listen);

    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(forward_signals(shutdown.clone()));
    let consumer_id = args.consumer_id.to_string();
    let result = match args.child {
        Some(command) => {
            let sink = ChildSink::new(command, consumer_id, args.child_timeout);
            run_with(pool, listen, connector, config, sink, shutdown).await
        }
        None => {
            let sink = StdoutSink::new(consumer_id);
            run_with(pool, listen, connector, config, sink, shutdown).await
        }
    };
    signals.abort();
    match result {
        Ok(summary) => {
            tracing::info!(
                delivered = summary.delivered,
                cursor = ?summary.cursor,
                generation = summary.generation,
                "consumer stopped"
            );
            Ok(())
        }
        Err(e) => Err(classify(e)),
    }
}

fn classify(e: ConsumerError) -> Failure {
    if let Some(denied) = crate::failure::permission_denied(&e) {
        return denied;
    }
    let code = match &e {
        ConsumerError::Config(_) => ExitCode::Usage,
        ConsumerError::LeaseHeld { .. } | ConsumerError::Retired { .. } => ExitCode::Conflict,
        _ => ExitCode::Runtime,
    };
    Failure {
        code,
        message: e.to_string(),
    }
}

fn build_config(global: &Global, args: &ConsumeArgs) -> Result<ConsumerConfig, Failure> {
    let mut config = ConsumerConfig::new(args.project.clone(), args.consumer_id.clone());
    config.schema = global.schema.clone();
    config.batch_size = args.batch_size;
    config.lease_ttl = args.lease_ttl;
    config.heartbeat_interval = args.heartbeat_interval;
    config.poll_interval = args.poll_interval;
    config.sequence_interval = (!args.no_sequencer).then_some(args.sequence_interval);
    config.pooler = global.pooler.into();
    // `--pooler transaction` implies polling only.
    config.listen = !args.no_listen && config.pooler == outbox_core::Pooler::None;
    config.wait_for_lease = !args.no_wait;
    config.reactivate = args.reactivate;
    config.shutdown_grace = args.shutdown_grace;
    config.prune_interval = (!args.no_prune).then_some(args.prune_interval);
    config.retention = args.retention;
    config.start_from = match args.start_from {
        StartFromArg::Reconcile => StartFrom::Reconcile,
        StartFromArg::Earliest => StartFrom::Earliest,
    };
    if let Some(query) = &args.live_query {
        config.live_query = query.clone();
    }
    config.retry = RetrySchedule::new(args.retry_delays.clone(), args.max_attempts)
        .map_err(|e| Failure::usage(e.to_string()))?;
    Ok(config)
}

/// SIGINT or SIGTERM cancels `shutdown`: the consumer finishes or abandons its current event
/// within the grace period, releases its lease and exits 0.
async fn forward_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutdown requested");
    shutdown.cancel();
}

/// Runs the consumer with `sink` as both its handler and its reconciler.
async fn run_with<S>(
    pool: deadpool_postgres::Pool,
    listen: Option<tokio_postgres::Config>,
    connector: outbox_core::Connector,
    config: ConsumerConfig,
    sink: S,
    shutdown: CancellationToken,
) -> Result<outbox_consumer::RunSummary, ConsumerError>
where
    S: outbox_consumer::Handler + outbox_consumer::Reconciler,
{
    let sink = std::sync::Arc::new(sink);
    Consumer::new(
        pool,
        listen,
        config,
        SharedSink(sink.clone()),
        SharedSink(sink),
    )
    .listen_tls(connector)
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
}

impl<S: outbox_consumer::Reconciler> outbox_consumer::Reconciler for SharedSink<S> {
    async fn reconcile(
        &self,
        live: &outbox_consumer::LiveSet,
    ) -> Result<(), outbox_consumer::HandlerFailure> {
        self.0.reconcile(live).await
    }
}
