//! The HTTP side of `outbox serve`: shared state, routes, probes, and an accept loop that can
//! close any one connection (a lagging SSE client) or drain them all at shutdown.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use outbox_consumer::{History, Probe};
use outbox_core::{ConsumerId, ProjectId, Schema};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::fan_out::FanOut;

/// Everything the handlers share.
pub struct AppState {
    /// Hubs by project ID.
    pub fan_outs: BTreeMap<String, Arc<FanOut>>,
    /// Each durable consumer's probe, by project.
    pub probes: Vec<(ProjectId, Arc<Probe>)>,
    /// The consumer ID every project is followed under.
    pub consumer_id: ConsumerId,
    /// The schema, for admin operations.
    pub schema: Schema,
    /// For history reads, the dashboard and admin actions; separate from the consumers' pool
    /// so that many resuming clients never starve a durable consumer.
    pub read_pool: deadpool_postgres::Pool,
    /// Read-only history statements.
    pub history: History,
    /// The reconciliation query, for clients below the retention floor.
    pub live_query: String,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// SSE clients connected now, over all projects.
    pub clients: AtomicUsize,
    /// `--max-clients`.
    pub max_clients: usize,
    /// What a 503 asks clients to wait.
    pub retry_after: Duration,
    /// Interval of SSE keep-alive comments.
    pub keep_alive: Duration,
    /// `/readyz` needs a successful poll within this long.
    pub ready_max_poll_age: Duration,
    /// How often the dashboard's own stream refreshes.
    pub dashboard_refresh: Duration,
    /// Admin actions, when enabled.
    pub admin: Option<crate::dashboard::AdminAuth>,
    /// Cancelled at SIGTERM: streams end with a final comment.
    pub shutdown: CancellationToken,
}

/// Closes the connection a request arrived on; inserted into every request's extensions.
#[derive(Clone)]
pub struct ConnectionToken(pub Arc<CancellationToken>);

/// A JSON error body: `{"error": message, ...extra}`.
pub fn error(status: StatusCode, message: String, extra: serde_json::Value) -> Response {
    let mut body = json!({ "error": message });
    if let (Some(body), serde_json::Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    (status, axum::Json(body)).into_response()
}

/// The routes of `outbox serve`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(crate::dashboard::page))
        .route("/v1/projects/{project}/events", get(crate::stream::events))
        .route("/v1/dashboard/stream", get(crate::dashboard::stream))
        .route("/v1/admin/replay", post(crate::dashboard::replay))
        .route("/v1/admin/resolve", post(crate::dashboard::resolve))
        .route("/v1/admin/retire", post(crate::dashboard::retire))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("no such path {}", uri.path()),
        json!({}),
    )
}

/// `/metrics` in the Prometheus text format.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    render_metrics(&state.metrics)
}

/// `/metrics` of `handle`, with the Prometheus text format's content type.
pub fn render_metrics(handle: &PrometheusHandle) -> Response {
    let mut response = handle.render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// Alive while the process answers.
async fn healthz() -> Response {
    axum::Json(json!({ "status": "ok" })).into_response()
}

/// Ready while every served project's consumer holds its lease and polled recently.
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let mut reasons = Vec::new();
    if state.shutdown.is_cancelled() {
        reasons.push("shutting down".to_owned());
    }
    for (project, probe) in &state.probes {
        if !probe.lease_held() {
            reasons.push(format!(
                "project {project}: this process does not hold the lease of consumer {} \
                 (another process holds it, or the claim is pending)",
                state.consumer_id
            ));
            continue;
        }
        match probe.since_last_poll() {
            Some(age) if age <= state.ready_max_poll_age => {}
            Some(age) => reasons.push(format!(
                "project {project}: no successful poll for {:.1}s (limit {:?})",
                age.as_secs_f64(),
                state.ready_max_poll_age
            )),
            None => reasons.push(format!("project {project}: no successful poll yet")),
        }
    }
    if reasons.is_empty() {
        axum::Json(json!({ "ready": true })).into_response()
    } else {
        let mut response = error(
            StatusCode::SERVICE_UNAVAILABLE,
            reasons.join("; "),
            json!({ "ready": false, "reasons": reasons }),
        );
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

/// An address that cannot be listened on: bad input, named with the option it came from.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({what}): {reason}")]
pub struct BindError {
    /// The address.
    pub addr: SocketAddr,
    /// Where it came from (`--listen`, `--metrics-addr`).
    pub what: String,
    /// Why, in words.
    pub reason: String,
}

/// Binds `addr`; an address in use is named as such.
pub async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr).await.map_err(|e| {
        let reason = if e.kind() == std::io::ErrorKind::AddrInUse {
            "the address is already in use".to_owned()
        } else {
            e.to_string()
        };
        BindError {
            addr,
            what: what.to_owned(),
            reason,
        }
    })
}

/// Serves `app` on `listener` until `stop`; then lets open connections finish for up to
/// `drain`, and closes what remains.
pub async fn serve(listener: TcpListener, app: Router, stop: CancellationToken, drain: Duration) {
    let graceful = CancellationToken::new();
    let kill = CancellationToken::new();
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        while connections.try_join_next().is_some() {}
        let (stream, _) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: wait a moment rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let token = Arc::new(kill.child_token());
        let app = app.clone();
        let this = token.clone();
        let service = hyper::service::service_fn(
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(ConnectionToken(this.clone()));
                app.clone().oneshot(request)
            },
        );
        let graceful = graceful.clone();
        connections.spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = token.cancelled() => return,
                _ = graceful.cancelled() => {}
            }
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = token.cancelled() => {}
            }
        });
    }
    drop(listener);
    graceful.cancel();
    let drained = tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            remaining = connections.len(),
            "closing connections that did not finish in time"
        );
        kill.cancel();
        while connections.join_next().await.is_some() {}
    }
}
