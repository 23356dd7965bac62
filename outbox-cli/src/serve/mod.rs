//! `outbox serve`: durable consumers (one per `--project`, all under one consumer ID) whose
//! handled events are fanned out over HTTP: Server-Sent Events for ephemeral clients,
//! Prometheus metrics, Kubernetes probes and an operator dashboard.
//!
//! Each project's consumer is the ordinary runtime ([`outbox_consumer::Consumer`]), with
//! lease, retries and all; its sink (optionally after a `--child`) publishes to the
//! project's [`hub::Hub`]. SSE clients own no cursor: they resume from the hub's ring, from
//! retained history (read-only) or from a reconciliation.

mod dashboard;
mod http;
mod hub;
mod stream;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use clap::Args;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use outbox_consumer::{Consumer, History};
use outbox_core::{ConsumerId, OperatorName, ProjectId};
use tokio_util::sync::CancellationToken;

use crate::args::ConsumerRef;
use crate::child::ChildSink;
use crate::cli::{ConsumerOptions, Global, parse_duration};
use crate::consume_cmd::{build_config, classify, connections};
use crate::failure::Failure;
use crate::shutdown::Shutdown;

/// `outbox serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A project to follow; repeat to follow several (one durable consumer each, all under
    /// one consumer ID).
    #[arg(long, required = true)]
    pub project: Vec<ProjectId>,
    /// The consumers' explicit, stable ID (never generated).
    #[arg(long)]
    pub consumer_id: ConsumerId,
    /// Every other `outbox consume` option.
    #[command(flatten)]
    pub consume: ConsumerOptions,
    /// Address to serve HTTP on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Most SSE clients at once, over all projects; past it, 503 with Retry-After.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_clients: u64,
    /// Recent events kept in memory per project for clients that resume.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub ring_size: u64,
    /// Events a client may have queued; one that falls further behind receives
    /// `event: lagged` and is disconnected.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub client_queue: u64,
    /// How long a dropped (lagging) client may take to read its final `lagged` message before
    /// its connection is closed.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub lagged_grace: Duration,
    /// Interval of SSE keep-alive comments.
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    pub keep_alive: Duration,
    /// /readyz fails when a consumer has not polled successfully for this long.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub ready_max_poll_age: Duration,
    /// How often the dashboard's status, dead letters and audit trail refresh.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub dashboard_refresh: Duration,
    /// How long open connections may take to finish at shutdown.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub drain_timeout: Duration,
    /// Enables admin actions (replay, resolve, retire) for requests that carry this token in
    /// `Authorization: Bearer`. Prefer the environment variable.
    #[arg(long, env = "OUTBOX_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// The operator name admin actions are recorded under (required with a token).
    #[arg(long, env = "OUTBOX_ADMIN_OPERATOR")]
    pub admin_operator: Option<String>,
}

/// The admin credentials `args` ask for; refuses half or unsafe configurations.
fn admin_auth(args: &ServeArgs) -> Result<Option<dashboard::AdminAuth>, Failure> {
    let loopback = args.listen.ip().is_loopback();
    match (&args.admin_token, &args.admin_operator) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(Failure::usage(
            "--admin-operator needs --admin-token (or OUTBOX_ADMIN_TOKEN): admin actions are \
             never served without a token",
        )),
        (Some(token), _) if token.trim().is_empty() => Err(Failure::usage(if loopback {
            "the admin token is empty: give a non-empty --admin-token (or OUTBOX_ADMIN_TOKEN)"
                .to_owned()
        } else {
            format!(
                "refusing to serve admin actions on non-loopback address {} without a token: \
                 the admin token is empty",
                args.listen
            )
        })),
        (Some(_), None) => Err(Failure::usage(
            "--admin-token needs --admin-operator (or OUTBOX_ADMIN_OPERATOR): the name admin \
             actions are recorded under",
        )),
        (Some(token), Some(operator)) => {
            let operator = OperatorName::new(operator.clone())
                .map_err(|e| Failure::usage(format!("invalid --admin-operator: {e}")))?;
            Ok(Some(dashboard::AdminAuth::new(token.trim(), operator)))
        }
    }
}

/// Installs the process's Prometheus recorder (once), with histogram buckets for the
/// latency metric, and keeps its upkeep running.
pub fn install_metrics() -> Result<PrometheusHandle, Failure> {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("outbox_commit_to_dispatch_seconds".into()),
            &[
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0,
            ],
        )
        .and_then(|b| b.install_recorder())
        .map_err(|e| Failure::runtime(format!("cannot install the metrics recorder: {e}")))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(HANDLE.get_or_init(|| handle).clone())
}

/// `--metrics-addr` of `consume`, `relay nats` and `serve`: `/metrics` (and `/healthz`) on an
/// address of its own, beside whatever else the command serves.
pub struct MetricsEndpoint {
    /// Stops the endpoint; a child of the command's shutdown token.
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsEndpoint {
    /// Serves on `addr`, when given, until [`MetricsEndpoint::stop`] or `shutdown`. Binding
    /// happens before this returns, so a used address fails the command.
    pub async fn start(
        addr: Option<SocketAddr>,
        shutdown: &CancellationToken,
    ) -> Result<Option<Self>, Failure> {
        let Some(addr) = addr else {
            return Ok(None);
        };
        let stop = shutdown.child_token();
        let task = metrics_only(addr, stop.clone()).await?;
        Ok(Some(Self { stop, task }))
    }

    /// Stops serving and waits for open requests to finish.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Serves `/metrics` (and `/healthz`) on `addr` until `shutdown`.
async fn metrics_only(
    addr: SocketAddr,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, Failure> {
    let listener = http::bind(addr, "--metrics-addr").await?;
    let handle = install_metrics()?;
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let handle = handle.clone();
                async move { http::render_metrics(&handle) }
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    tracing::info!(%addr, "serving /metrics");
    Ok(tokio::spawn(http::serve(
        listener,
        app,
        shutdown,
        Duration::from_secs(1),
    )))
}

/// Runs `outbox serve`.
pub async fn run(global: &Global, args: ServeArgs) -> Result<(), Failure> {
    let signals = Shutdown::install()?;
    let database = global.database()?;
    let admin = admin_auth(&args)?;
    let consume = &args.consume;
    let mut projects = args.project.clone();
    projects.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    projects.dedup();
    let mut configs = Vec::with_capacity(projects.len());
    for project in &projects {
        let consumer = ConsumerRef {
            project: project.clone(),
            consumer_id: args.consumer_id.clone(),
        };
        let mut config = build_config(global, &consumer, consume)?;
        config.gauge_interval = Some(config.poll_interval);
        config
            .validate()
            .map_err(|e| Failure::usage(e.to_string()))?;
        configs.push(config);
    }
    let live_query = configs[0].live_query.sql().to_owned();
    if (args.client_queue as i64) < consume.batch_size {
        return Err(Failure::usage(format!(
            "--client-queue {} is smaller than --batch-size {}: every client would be dropped \
             by the first full batch",
            args.client_queue, consume.batch_size
        )));
    }

    // Bind first: a used address is a usage error, reported before anything else happens.
    let listener = http::bind(args.listen, "--listen").await?;
    // Each served project runs its own consumer: at least MIN_POOL_SIZE connections each.
    let needed = outbox_consumer::MIN_POOL_SIZE * projects.len() + 1;
    let pool_size = u16::try_from(needed)
        .unwrap_or(u16::MAX)
        .max(consume.pool_size);
    let connections = connections(&database, consume.no_listen, pool_size).await?;
    let metrics = install_metrics()?;

    // Cancelled by the first signal, or when any consumer stops.
    let shutdown = signals.token().child_token();
    let extra_metrics = MetricsEndpoint::start(consume.metrics_addr, &shutdown).await?;
    let read_pool = database.pool(4)?;

    let mut hubs = BTreeMap::new();
    let mut probes = Vec::new();
    let mut consumers = tokio::task::JoinSet::new();
    let mut children = Vec::new();
    for config in configs {
        let project = config.project_id.clone();
        let hub = Arc::new(hub::Hub::new(
            project.clone(),
            args.consumer_id.to_string(),
            args.ring_size as usize,
            args.client_queue as usize,
            args.lagged_grace,
        ));
        let child = consume.child.clone().map(|command| {
            ChildSink::new(
                command,
                args.consumer_id.to_string(),
                consume.child_timeout,
                consume.child_stop_grace,
                shutdown.clone(),
            )
        });
        if let Some(child) = &child {
            let force = child.clone();
            signals.on_force(move || force.kill_now());
            children.push(child.clone());
        }
        let sink = Arc::new(hub::HubSink {
            hub: hub.clone(),
            child,
        });
        let consumer = Consumer::new(
            connections.pool.clone(),
            connections.listen.clone(),
            config,
            hub::SharedHubSink(sink.clone()),
            hub::SharedHubSink(sink),
        )
        .listen_tls(connections.tls.clone());
        probes.push((project.clone(), consumer.probe()));
        hubs.insert(project.to_string(), hub);
        let stop = shutdown.clone();
        consumers.spawn(async move { (project, consumer.run(stop).await) });
    }

    let state = Arc::new(http::AppState {
        hubs,
        probes,
        consumer_id: args.consumer_id.clone(),
        schema: global.schema.clone(),
        read_pool,
        history: History::new(&global.schema),
        live_query,
        metrics,
        clients: AtomicUsize::new(0),
        max_clients: args.max_clients as usize,
        retry_after: Duration::from_secs(5),
        keep_alive: args.keep_alive,
        ready_max_poll_age: args.ready_max_poll_age,
        dashboard_refresh: args.dashboard_refresh,
        admin,
        shutdown: shutdown.clone(),
    });
    let addr = listener.local_addr().unwrap_or(args.listen);
    tracing::info!(%addr, projects = projects.len(), "serving");
    let server = tokio::spawn(http::serve(
        listener,
        http::router(state),
        shutdown.clone(),
        args.drain_timeout,
    ));

    // The first consumer to stop for a reason other than shutdown stops the whole server.
    let mut failure = None;
    while let Some(joined) = consumers.join_next().await {
        match joined {
            Ok((project, Ok(summary))) => tracing::info!(
                %project, delivered = summary.delivered, cursor = ?summary.cursor,
                generation = summary.generation, "consumer stopped"
            ),
            Ok((project, Err(e))) => {
                tracing::error!(%project, error = %e, "consumer failed; stopping the server");
                if failure.is_none() {
                    failure = Some(classify(e, consume.live_query.is_some(), "outbox serve"));
                }
            }
            Err(e) => {
                if failure.is_none() {
                    failure = Some(Failure::runtime(format!("a consumer task failed: {e}")));
                }
            }
        }
        shutdown.cancel();
    }
    for child in &children {
        child.close().await;
    }
    let _ = server.await;
    if let Some(extra) = extra_metrics {
        extra.stop().await;
    }
    match failure {
        Some(failure) => Err(failure),
        None => Ok(()),
    }
}
