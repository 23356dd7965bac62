//! What every handler of the server shares: the state, the JSON error body, and the
//! `--max-clients` admission of SSE streams (event streams and dashboard streams alike).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use outbox_consumer::history::History;
use outbox_consumer::set::PairProbes;
use outbox_core::{ConsumerId, ProjectId, Schema};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::auth::AdminAuth;
use crate::fan_out::FanOut;

/// Everything the handlers share.
pub struct AppState {
    /// Fan-outs by project ID.
    pub fan_outs: BTreeMap<String, Arc<FanOut>>,
    /// The served projects, in order.
    pub projects: Vec<ProjectId>,
    /// Each durable consumer's probe, from the consumer set.
    pub probes: PairProbes,
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
    /// Renders `/metrics` (and keeps the recorder's upkeep running while the server does).
    pub metrics: outbox_service::metrics::Recorder,
    /// Whether the database is up, for `/readyz` (the consumers' duties carry the same).
    pub availability: outbox_consumer::outage::Availability,
    /// SSE clients connected now, over all projects.
    pub clients: AtomicUsize,
    /// `--max-clients`.
    pub max_clients: usize,
    /// What a 503 asks clients to wait.
    pub retry_after: Duration,
    /// Interval of SSE keep-alive comments.
    pub keep_alive: Duration,
    /// Shortest time between two writes to one SSE client.
    pub client_write_interval: Duration,
    /// `/readyz` needs a successful poll within this long.
    pub ready_max_poll_age: Duration,
    /// How often the dashboard's own stream refreshes.
    pub dashboard_refresh: Duration,
    /// Admin actions, when enabled.
    pub admin: Option<AdminAuth>,
    /// Cancelled at SIGTERM: streams end with a final comment.
    pub shutdown: CancellationToken,
}

/// A JSON error body: `{"error": message, ...extra}`.
pub fn error(status: StatusCode, message: String, extra: serde_json::Value) -> Response {
    let mut body = json!({ "error": message });
    if let (Some(body), serde_json::Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    (status, axum::Json(body)).into_response()
}

/// "1 SSE client", "2 SSE clients".
pub(crate) fn clients(count: usize) -> String {
    match count {
        1 => "1 SSE client".to_owned(),
        n => format!("{n} SSE clients"),
    }
}

/// Longest piece of a request (a path, an ID) quoted back in an error: a long one is cut,
/// so that an error never grows with what the client sent.
const QUOTED_MAX: usize = 64;

/// `text` as it may be quoted back in an error: cut to [`QUOTED_MAX`] characters with its
/// full length named.
pub(crate) fn quoted(text: &str) -> String {
    let length = text.chars().count();
    if length <= QUOTED_MAX {
        return format!("{text:?}");
    }
    let head: String = text.chars().take(QUOTED_MAX).collect();
    format!("{head:?}... ({length} characters)")
}

/// A 503 asking the client to come back after `retry_after`.
pub(crate) fn busy(state: &AppState, message: &str) -> Response {
    let mut response = error(
        StatusCode::SERVICE_UNAVAILABLE,
        message.to_owned(),
        json!({ "retry_after_secs": state.retry_after.as_secs() }),
    );
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(state.retry_after.as_secs().max(1)),
    );
    response.into_response()
}

/// Takes one of the `--max-clients` SSE slots (event streams and dashboard streams alike),
/// or answers 503; the caller gives the slot back with [`release`].
#[allow(clippy::result_large_err)]
pub(crate) fn reserve(state: &AppState) -> Result<(), Response> {
    let taken = state.clients.fetch_add(1, Ordering::AcqRel);
    if taken >= state.max_clients {
        state.clients.fetch_sub(1, Ordering::AcqRel);
        return Err(busy(
            state,
            &format!(
                "this server already has {} (--max-clients)",
                clients(state.max_clients)
            ),
        ));
    }
    Ok(())
}

/// Gives back a slot taken with [`reserve`].
pub(crate) fn release(state: &AppState) {
    state.clients.fetch_sub(1, Ordering::AcqRel);
}

/// A `text/event-stream` response streaming `chunks`, never cached.
pub fn event_stream<S>(chunks: S) -> Response
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, std::convert::Infallible>> + Send + 'static,
{
    let mut response = Response::new(axum::body::Body::from_stream(chunks));
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::{clients, quoted};

    #[test]
    fn counts_and_quotes() {
        assert_eq!(clients(1), "1 SSE client");
        assert_eq!(clients(2), "2 SSE clients");
        assert_eq!(quoted("p1"), "\"p1\"");
        let long = quoted(&"x".repeat(5000));
        assert!(long.len() < 100, "{long}");
        assert!(long.ends_with("... (5000 characters)"), "{long}");
    }
}
