//! The process's Prometheus metrics: the recorder (installed once, with the latency
//! histogram's buckets), `/metrics` in the text format, and the endpoint `--metrics-addr`
//! serves beside whatever else a command serves.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use outbox_consumer::outage::Availability;
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

/// The process's Prometheus recorder, as long as something uses it: the handle that renders
/// `/metrics`, and a share of the upkeep task that compacts its histograms. The recorder stays
/// installed for the process (a recorder cannot be uninstalled); the upkeep stops once the
/// last [`Recorder`] is dropped (the endpoint stopped, the server ended) and starts again
/// with the next [`install`].
#[derive(Clone)]
pub struct Recorder {
    handle: PrometheusHandle,
    _upkeep: Arc<Upkeep>,
}

impl Recorder {
    /// Renders `/metrics`.
    pub fn handle(&self) -> &PrometheusHandle {
        &self.handle
    }
}

/// The upkeep task, aborted when the last [`Recorder`] sharing it is dropped.
struct Upkeep(tokio::task::JoinHandle<()>);

impl Drop for Upkeep {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The installed recorder's handle and the upkeep shared by the live [`Recorder`]s, if any.
static INSTALLED: Mutex<Option<(PrometheusHandle, Weak<Upkeep>)>> = Mutex::new(None);

/// Installs the process's Prometheus recorder (once; later calls share it) with the help text
/// of the consumers' metrics ([`outbox_consumer::metric::describe`]; a crate that records
/// metrics of its own describes them itself), and runs its upkeep while the returned
/// [`Recorder`] or a clone of it lives. Called inside a tokio runtime.
pub fn install() -> Result<Recorder, MetricsError> {
    let mut installed = INSTALLED.lock().expect("recorder lock");
    let (handle, upkeep) = match &*installed {
        Some((handle, upkeep)) => (handle.clone(), upkeep.upgrade()),
        None => {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(outbox_consumer::metric::COMMIT_TO_DISPATCH.name.into()),
                    LATENCY_BUCKETS,
                )
                .and_then(|b| b.install_recorder())
                .map_err(|e| MetricsError::Recorder(e.to_string()))?;
            outbox_consumer::metric::describe();
            (handle, None)
        }
    };
    let upkeep = upkeep.unwrap_or_else(|| {
        let compacted = handle.clone();
        Arc::new(Upkeep(tokio::spawn(async move {
            loop {
                tokio::time::sleep(UPKEEP_INTERVAL).await;
                compacted.run_upkeep();
            }
        })))
    });
    *installed = Some((handle.clone(), Arc::downgrade(&upkeep)));
    Ok(Recorder {
        handle,
        _upkeep: upkeep,
    })
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
fn readyz(availability: &Availability) -> Response {
    match availability.is_up() {
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
    /// Serves on `addr`, when given, until [`MetricsEndpoint::stop`] or `shutdown`, with
    /// `/readyz` and `outbox_database_up` from `availability` (the one the consumers' duties
    /// carry). Binding happens before this returns, so a used address fails the command.
    pub async fn start(
        addr: Option<SocketAddr>,
        availability: &Availability,
        shutdown: &CancellationToken,
    ) -> Result<Self, MetricsError> {
        let Some(addr) = addr else {
            return Ok(Self { running: None });
        };
        let listener = bind(addr, "--metrics-addr").await?;
        let recorder = install()?;
        // Gauges set before the recorder existed are lost: this one is known from the start.
        availability.publish();
        let availability = availability.clone();
        let app = axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let recorder = recorder.clone();
                    async move { render(recorder.handle()) }
                }),
            )
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .route(
                "/readyz",
                axum::routing::get(move || {
                    let availability = availability.clone();
                    async move { readyz(&availability) }
                }),
            );
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the upkeep task of the installed recorder runs.
    fn upkeep_running() -> bool {
        let installed = INSTALLED.lock().expect("recorder lock");
        let upkeep = installed.as_ref().and_then(|(_, upkeep)| upkeep.upgrade());
        upkeep.is_some_and(|upkeep| !upkeep.0.is_finished())
    }

    #[tokio::test]
    async fn the_upkeep_stops_with_its_last_user_and_starts_again_with_the_next() {
        let first = install().unwrap();
        let second = install().unwrap();
        let task = first._upkeep.0.abort_handle();
        assert!(upkeep_running());
        drop(first);
        assert!(upkeep_running(), "a user is left");
        drop(second);
        assert!(!upkeep_running());
        // The task itself ends once the runtime sees the abort.
        while !task.is_finished() {
            tokio::task::yield_now().await;
        }
        let again = install().unwrap();
        assert!(upkeep_running());
        drop(again);
    }
}
