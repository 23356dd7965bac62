//! The routes of the server and its probes: `/healthz` (alive while the process answers),
//! `/readyz` (every served project's consumer holds its lease and polled recently; a project
//! whose consumer an operator retired no longer counts) and
//! `/metrics`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::host::{AllowedHosts, check_host};
use crate::state::{AppState, error, quoted};
use crate::{dashboard, stream};

/// The routes of the server, each behind the `Host` check ([`crate::host`]).
pub(crate) fn router(state: Arc<AppState>, hosts: AllowedHosts) -> Router {
    Router::new()
        .route("/", get(dashboard::page))
        .route("/v1/projects/{project}/events", get(stream::events))
        .route("/v1/dashboard/stream", get(dashboard::stream))
        .route("/v1/admin/replay", post(dashboard::replay))
        .route("/v1/admin/resolve", post(dashboard::resolve))
        .route("/v1/admin/retire", post(dashboard::retire))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(state)
        .layer(middleware::from_fn_with_state(Arc::new(hosts), check_host))
}

/// The probes alone, answered while the server waits for its database before it starts:
/// `/healthz` (200, alive, with the status `starting`) and `/readyz` (503,
/// `database_unavailable`, while the database does not answer; `starting` once it does).
/// Every other path is a 503. Requests naming another `Host` are refused as the server's
/// own are ([`AllowedHosts`]).
pub fn waiting_router(
    hosts: AllowedHosts,
    availability: outbox_consumer::outage::Availability,
) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({ "status": "starting" })).into_response() }),
        )
        .route(
            "/readyz",
            get(move || {
                let availability = availability.clone();
                async move { waiting_readyz(&availability) }
            }),
        )
        .fallback(starting)
        .layer(middleware::from_fn_with_state(Arc::new(hosts), check_host))
}

/// `/readyz` before the server has started.
fn waiting_readyz(availability: &outbox_consumer::outage::Availability) -> Response {
    let reason = match availability.is_up() {
        true => "starting",
        false => outbox_service::metrics::DATABASE_UNAVAILABLE,
    };
    let mut response = error(
        StatusCode::SERVICE_UNAVAILABLE,
        reason.to_owned(),
        json!({ "ready": false, "reasons": [reason] }),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Any other path before the server has started.
async fn starting() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server is starting: it waits for its database".to_owned(),
        json!({}),
    )
}

async fn not_found(uri: axum::http::Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("no such path {}", quoted(uri.path())),
        json!({}),
    )
}

/// `/metrics` in the Prometheus text format.
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    outbox_service::metrics::render(state.metrics.handle())
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
    if !state.availability.is_up() {
        reasons.push(outbox_service::metrics::DATABASE_UNAVAILABLE.to_owned());
    }
    for project in &state.projects {
        if state.probes.retired(project, &state.consumer_id) {
            // Retired by an operator: the project is no longer served, by decision.
            continue;
        }
        let probe = state.probes.get(project, &state.consumer_id);
        let Some(probe) = probe.filter(|p| p.lease_held()) else {
            reasons.push(format!(
                "project {project}: this process does not hold the lease of consumer {} \
                 (another process holds it, or the claim is pending)",
                state.consumer_id
            ));
            continue;
        };
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
