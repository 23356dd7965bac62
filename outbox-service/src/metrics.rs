//! The process's Prometheus metrics: the recorder (installed once, with the latency
//! histogram's buckets), `/metrics` in the text format, and the endpoint `--metrics-addr`
//! serves beside whatever else a command serves.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::http::{BindError, bind, serve};

/// Buckets of `outbox_commit_to_dispatch_seconds`, in seconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// How often the recorder's histograms are compacted.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// How long a `/metrics` request may take to finish when the endpoint stops.
const METRICS_DRAIN: Duration = Duration::from_secs(1);

/// How long a scraper may take to send a request's headers.
const METRICS_HEADER_READ: Duration = Duration::from_secs(10);

/// Why the metrics could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address cannot be listened on (bad input).
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The process's recorder cannot be installed.
    #[error("cannot install the metrics recorder: {0}")]
    Recorder(String),
}

/// Installs the process's Prometheus recorder (once; later calls return the same handle) and
/// keeps its upkeep running.
pub fn install() -> Result<PrometheusHandle, MetricsError> {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("outbox_commit_to_dispatch_seconds".into()),
            LATENCY_BUCKETS,
        )
        .and_then(|b| b.install_recorder())
        .map_err(|e| MetricsError::Recorder(e.to_string()))?;
    outbox_consumer::describe_metrics();
    // Gauges set before the recorder existed are lost: this one is known from the start.
    outbox_consumer::availability().publish();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP_INTERVAL).await;
            upkeep.run_upkeep();
        }
    });
    Ok(HANDLE.get_or_init(|| handle).clone())
}

/// `/metrics` of `handle`, with the Prometheus text format's content type.
pub fn render(handle: &PrometheusHandle) -> Response {
    let mut response = handle.render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// `/readyz` of the metrics endpoint: 200 while the database answers, 503 with the reason
/// `database_unavailable` while it does not (the process waits for it).
fn readyz() -> Response {
    match outbox_consumer::availability().is_up() {
        true => axum::Json(serde_json::json!({ "ready": true })).into_response(),
        false => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
            axum::Json(serde_json::json!({
                "ready": false,
                "reasons": [DATABASE_UNAVAILABLE],
            })),
        )
            .into_response(),
    }
}

/// The readiness reason while the database is unavailable.
pub const DATABASE_UNAVAILABLE: &str = "database_unavailable";

/// `--metrics-addr` of `consume`, `relay nats` and `serve`: `/metrics`, `/healthz` and
/// `/readyz` on an address of its own, or nothing when no address is given.
pub struct MetricsEndpoint {
    /// Stops the endpoint (a child of the command's shutdown token), and the serving task.
    running: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl MetricsEndpoint {
    /// Serves on `addr`, when given, until [`MetricsEndpoint::stop`] or `shutdown`. Binding
    /// happens before this returns, so a used address fails the command.
    pub async fn start(
        addr: Option<SocketAddr>,
        shutdown: &CancellationToken,
    ) -> Result<Self, MetricsError> {
        let Some(addr) = addr else {
            return Ok(Self { running: None });
        };
        let listener = bind(addr, "--metrics-addr").await?;
        let handle = install()?;
        let app = axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let handle = handle.clone();
                    async move { render(&handle) }
                }),
            )
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .route("/readyz", axum::routing::get(|| async { readyz() }));
        tracing::info!(%addr, "serving /metrics");
        let stop = shutdown.child_token();
        let task = tokio::spawn(serve(
            listener,
            app,
            stop.clone(),
            METRICS_DRAIN,
            METRICS_HEADER_READ,
        ));
        Ok(Self {
            running: Some((stop, task)),
        })
    }

    /// Stops serving and waits for open requests to finish.
    pub async fn stop(self) {
        if let Some((stop, task)) = self.running {
            stop.cancel();
            let _ = task.await;
        }
    }
}
