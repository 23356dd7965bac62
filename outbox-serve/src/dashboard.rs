//! The operator dashboard: one server-rendered page (no build step, no CDN: it works
//! offline) that refreshes its status, dead-letter and audit sections from its own SSE
//! stream, and follows every served project's event stream in a live feed. Admin actions
//! (replay, resolve, retire) exist only when the server has an admin token; the token travels
//! in the `Authorization: Bearer` header, never in a cookie or a URL, and the actions are
//! attributed to the operator name configured with it.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use outbox_core::{
    Admin, AdminError, AuditEntry, AuditFilter, ConsumerId, DeadLetter, DeadLetterFilter, EventId,
    HealthThresholds, Listing, OperatorName, ProjectId, Reason, ReplayTarget, Status,
};
use serde::Deserialize;
use serde_json::json;

use crate::http::{AppState, error};

/// Admin actions' credentials: the token clients must present, and whom to credit.
pub struct AdminAuth {
    /// SHA-256 of the token; compared in constant time.
    pub token_digest: [u8; 32],
    /// Recorded as the actor of replay requests, resolutions and retirements.
    pub operator: OperatorName,
}

impl AdminAuth {
    /// Credentials for `token`, credited to `operator`.
    pub fn new(token: &str, operator: OperatorName) -> Self {
        Self {
            token_digest: digest(token),
            operator,
        }
    }

    fn accepts(&self, presented: &str) -> bool {
        let presented = digest(presented);
        // Constant time: no early exit on the first differing byte.
        presented
            .iter()
            .zip(self.token_digest.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

fn digest(text: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes()).into()
}

/// HTML-escapes `text`.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn opt<T: std::fmt::Display>(value: &Option<T>) -> String {
    value
        .as_ref()
        .map_or_else(|| "–".to_owned(), |v| esc(&v.to_string()))
}

fn health_badges(codes: &[outbox_core::Health]) -> String {
    codes
        .iter()
        .map(|h| {
            let class = if h.as_str() == "ok" { "ok" } else { "bad" };
            format!("<span class=\"badge {class}\">{}</span>", esc(h.as_str()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `outbox status` view as HTML tables.
fn render_status(status: &Status) -> String {
    let mut html = String::new();
    html.push_str(
        "<table><thead><tr><th>project</th><th>head</th><th>unsequenced</th>\
         <th>floor</th><th>prunable</th><th>health</th></tr></thead><tbody>",
    );
    for p in &status.projects {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&p.project_id),
            p.head_sequence,
            p.unsequenced,
            p.pruned_through,
            p.prunable,
            health_badges(&p.health)
        );
    }
    html.push_str("</tbody></table>");
    html.push_str(
        "<table><thead><tr><th>project</th><th>consumer</th><th>state</th><th>cursor</th>\
         <th>lag</th><th>lease</th><th>retrying</th><th>dead letters</th><th>health</th>\
         </tr></thead><tbody>",
    );
    for c in &status.consumers {
        let info = &c.consumer;
        let lease = if info.lease_live {
            format!(
                "held by {} (gen {})",
                opt(&info.lease_owner),
                info.lease_generation
            )
        } else {
            format!("free (gen {})", info.lease_generation)
        };
        let retrying = info.retrying.as_ref().map_or_else(
            || "–".to_owned(),
            |r| {
                format!(
                    "{} (seq {}, {} attempts, {})",
                    esc(&r.event_id),
                    r.sequence,
                    r.attempts,
                    opt(&r.last_failure_class)
                )
            },
        );
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td></tr>",
            esc(&info.project_id),
            esc(&info.consumer_id),
            esc(info.state.as_str()),
            opt(&info.cursor),
            opt(&info.lag),
            lease,
            retrying,
            info.dead_letters,
            health_badges(&c.health)
        );
    }
    html.push_str("</tbody></table>");
    let _ = write!(
        html,
        "<p class=\"muted\">as of {}</p>",
        esc(&outbox_core::format_timestamp(status.as_of))
    );
    html
}

fn render_dead_letters(listing: &Listing<DeadLetter>, admin: bool) -> String {
    if listing.items.is_empty() {
        return "<p class=\"muted\">no dead letters</p>".to_owned();
    }
    let mut html = String::from(
        "<table><thead><tr><th>project</th><th>consumer</th><th>event</th><th>seq</th>\
         <th>state</th><th>attempts</th><th>class</th><th>parked</th>",
    );
    if admin {
        html.push_str("<th>actions</th>");
    }
    html.push_str("</tr></thead><tbody>");
    for d in &listing.items {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            esc(&d.project_id),
            esc(&d.consumer_id),
            esc(&d.event_id),
            d.sequence,
            esc(d.state.as_str()),
            d.attempts,
            opt(&d.last_failure_class),
            opt(&d.parked_at.map(outbox_core::format_timestamp)),
        );
        if admin {
            let data = format!(
                "data-project=\"{}\" data-consumer=\"{}\" data-event=\"{}\"",
                esc(&d.project_id),
                esc(&d.consumer_id),
                esc(&d.event_id)
            );
            let _ = write!(
                html,
                "<td><button class=\"act\" data-action=\"replay\" {data}>replay</button> \
                 <button class=\"act\" data-action=\"resolve\" {data}>resolve</button></td>"
            );
        }
        html.push_str("</tr>");
    }
    html.push_str("</tbody></table>");
    if listing.truncated {
        html.push_str("<p class=\"muted\">more dead letters than shown</p>");
    }
    html
}

fn render_audit(listing: &Listing<AuditEntry>) -> String {
    if listing.items.is_empty() {
        return "<p class=\"muted\">no audit entries</p>".to_owned();
    }
    let mut html = String::from(
        "<table><thead><tr><th>when</th><th>kind</th><th>project</th><th>consumer</th>\
         <th>event</th><th>actor</th><th>count</th><th>reason</th></tr></thead><tbody>",
    );
    for a in &listing.items {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td></tr>",
            esc(&outbox_core::format_timestamp(a.recorded_at)),
            esc(a.kind.as_str()),
            opt(&a.project_id),
            opt(&a.consumer_id),
            opt(&a.event_id),
            opt(&a.actor),
            opt(&a.count),
            opt(&a.reason)
        );
    }
    html.push_str("</tbody></table>");
    html
}

/// The three rendered sections.
struct Sections {
    status: String,
    dead_letters: String,
    audit: String,
}

async fn sections(state: &AppState) -> Result<Sections, String> {
    let mut client = state
        .read_pool
        .get()
        .await
        .map_err(|e| format!("no database connection: {e}"))?;
    let admin = Admin::new(&state.schema);
    let status = admin
        .status(&mut client, None, &HealthThresholds::default())
        .await
        .map_err(|e| e.to_string())?;
    let dead = admin
        .dead_letters(
            &mut client,
            &DeadLetterFilter {
                limit: 100,
                ..DeadLetterFilter::default()
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    let audit = admin
        .audit_trail(&mut client, &AuditFilter::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(Sections {
        status: render_status(&status),
        dead_letters: render_dead_letters(&dead, state.admin.is_some()),
        audit: render_audit(&audit),
    })
}

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse;margin:.5em 0;background:#fff}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;font-size:13px}
th{background:#f0f0f0}.muted{color:#777}
.badge{border-radius:3px;padding:1px 6px;color:#fff;font-size:12px}
.ok{background:#2e7d32}.bad{background:#c62828}
#feed{list-style:none;padding:0;max-height:24em;overflow:auto;font-family:monospace;font-size:12px}
#feed li{border-bottom:1px solid #eee;padding:2px 0}
#conn{font-size:12px}.live{color:#2e7d32}.down{color:#c62828}
#admin input{margin-right:.5em}
";

const SCRIPT: &str = r#"
(function () {
  'use strict';
  var projects = JSON.parse(document.getElementById('projects').textContent);
  var feed = document.getElementById('feed');
  var conn = document.getElementById('conn');
  function setConn(text, ok) { conn.textContent = text; conn.className = ok ? 'live' : 'down'; }
  var dash = new EventSource('/v1/dashboard/stream');
  dash.addEventListener('snapshot', function (e) {
    var s = JSON.parse(e.data);
    document.getElementById('status').innerHTML = s.status;
    document.getElementById('dead-letters').innerHTML = s.dead_letters;
    document.getElementById('audit').innerHTML = s.audit;
    setConn('live', true);
  });
  dash.addEventListener('snapshot-error', function (e) { setConn('database: ' + JSON.parse(e.data).error, false); });
  dash.onerror = function () { setConn('reconnecting…', false); };
  function add(text) {
    var li = document.createElement('li');
    li.textContent = text;
    feed.insertBefore(li, feed.firstChild);
    while (feed.children.length > 200) { feed.removeChild(feed.lastChild); }
  }
  projects.forEach(function (p) {
    var es = new EventSource('/v1/projects/' + encodeURIComponent(p) + '/events');
    es.addEventListener('task:deleted', function (e) {
      var ev = JSON.parse(e.data);
      add('#' + ev.sequence + ' ' + ev.project_id + ' task ' + ev.task_id + ' deleted at ' +
          ev.deleted_at + ' by ' + ev.writer_process_id);
    });
    es.addEventListener('reconcile', function (e) {
      var r = JSON.parse(e.data);
      add('reconcile ' + r.project_id + ' at head ' + r.head_sequence + ': ' +
          r.live_task_ids.length + ' live tasks');
    });
    es.addEventListener('lagged', function () { add('feed of ' + p + ' fell behind; reconnecting'); });
  });
  var admin = document.getElementById('admin');
  if (!admin) { return; }
  var result = document.getElementById('admin-result');
  function token() { return document.getElementById('token').value; }
  function act(action, body) {
    fetch('/v1/admin/' + action, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Authorization': 'Bearer ' + token() },
      body: JSON.stringify(body)
    }).then(function (r) {
      return r.text().then(function (t) { result.textContent = r.status + ' ' + t; });
    }).catch(function (e) { result.textContent = String(e); });
  }
  document.addEventListener('click', function (e) {
    var b = e.target;
    if (!b.classList || !b.classList.contains('act')) { return; }
    var body = { project: b.dataset.project, consumer_id: b.dataset.consumer, event_id: b.dataset.event };
    if (b.dataset.action === 'resolve') {
      var reason = window.prompt('Reason for resolving ' + body.event_id + ':');
      if (!reason) { return; }
      body.reason = reason;
    }
    act(b.dataset.action, body);
  });
  document.getElementById('retire').addEventListener('submit', function (e) {
    e.preventDefault();
    var f = e.target;
    act('retire', { project: f.project.value, consumer_id: f.consumer.value, reason: f.reason.value });
  });
})();
"#;

/// `GET /`: the page, rendered with the current state.
pub async fn page(State(state): State<Arc<AppState>>) -> Response {
    let sections = sections(&state).await.unwrap_or_else(|e| {
        let message = format!(
            "<p class=\"down\">cannot read the database: {}</p>",
            esc(&e)
        );
        Sections {
            status: message.clone(),
            dead_letters: String::new(),
            audit: String::new(),
        }
    });
    let projects: Vec<&String> = state.fan_outs.keys().collect();
    // JSON inside <script>: escape '<' so no "</script>" can end the element early.
    let projects_json = serde_json::to_string(&projects)
        .unwrap_or_else(|_| "[]".into())
        .replace('<', "\\u003c");
    let admin = match &state.admin {
        Some(auth) => format!(
            "<section id=\"admin\"><h2>Admin</h2>\
             <p>Actions are recorded as operator <b>{}</b>. The token is sent in the \
             Authorization header and kept only in this page.</p>\
             <label>Admin token <input id=\"token\" type=\"password\" autocomplete=\"off\"></label>\
             <form id=\"retire\"><b>Retire a consumer:</b> \
             <input name=\"project\" placeholder=\"project\" required>\
             <input name=\"consumer\" placeholder=\"consumer ID\" required>\
             <input name=\"reason\" placeholder=\"reason\" required>\
             <button>retire</button></form>\
             <pre id=\"admin-result\"></pre></section>",
            esc(auth.operator.as_str())
        ),
        None => "<p class=\"muted\">Read-only: start outbox serve with --admin-token to \
                 replay, resolve and retire from here.</p>"
            .to_owned(),
    };
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>outbox: {consumer}</title><style>{STYLE}</style></head><body>\
         <h1>lifecycle-outbox <span class=\"muted\">consumer {consumer}</span> \
         <span id=\"conn\" class=\"down\">connecting…</span></h1>\
         <h2>Status</h2><div id=\"status\">{status}</div>\
         <h2>Live events</h2><ul id=\"feed\"></ul>\
         <h2>Dead letters</h2><div id=\"dead-letters\">{dead}</div>\
         <h2>Audit trail</h2><div id=\"audit\">{audit}</div>\
         {admin}\
         <script type=\"application/json\" id=\"projects\">{projects_json}</script>\
         <script>{SCRIPT}</script></body></html>",
        consumer = esc(state.consumer_id.as_str()),
        status = sections.status,
        dead = sections.dead_letters,
        audit = sections.audit,
    );
    let mut response = Html(html).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `GET /v1/dashboard/stream`: the page's sections, re-rendered every `--dashboard-refresh`.
pub async fn stream(State(state): State<Arc<AppState>>) -> Response {
    if let Err(refusal) = crate::stream::reserve(&state) {
        return refusal;
    }
    let slot = Slot(state.clone());
    let stream = futures_util::stream::unfold((slot, true), |(slot, first)| async move {
        let state = &slot.0;
        if !first {
            tokio::select! {
                _ = state.shutdown.cancelled() => return None,
                _ = tokio::time::sleep(state.dashboard_refresh) => {}
            }
        }
        let chunk = match sections(state).await {
            Ok(s) => {
                let data = json!({
                    "status": s.status,
                    "dead_letters": s.dead_letters,
                    "audit": s.audit,
                });
                format!("event: snapshot\ndata: {data}\n\n")
            }
            Err(e) => format!("event: snapshot-error\ndata: {}\n\n", json!({ "error": e })),
        };
        Some((
            Ok::<_, std::convert::Infallible>(Bytes::from(chunk)),
            (slot, false),
        ))
    });
    let mut response = Response::new(Body::from_stream(stream));
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// A dashboard stream's `--max-clients` slot, given back when the stream is dropped.
struct Slot(Arc<AppState>);

impl Drop for Slot {
    fn drop(&mut self) {
        crate::stream::release(&self.0);
    }
}

/// The operator to credit, or the response refusing the request.
#[allow(clippy::result_large_err)]
fn authorize<'a>(state: &'a AppState, headers: &HeaderMap) -> Result<&'a OperatorName, Response> {
    let Some(auth) = &state.admin else {
        return Err(error(
            StatusCode::FORBIDDEN,
            "admin actions are disabled: start outbox serve with --admin-token".into(),
            json!({}),
        ));
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(token) if auth.accepts(token.trim()) => Ok(&auth.operator),
        _ => {
            let mut response = error(
                StatusCode::UNAUTHORIZED,
                "admin actions need the admin token in the Authorization header (Bearer)".into(),
                json!({}),
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            Err(response)
        }
    }
}

fn bad_request(message: String) -> Response {
    error(StatusCode::BAD_REQUEST, message, json!({}))
}

fn admin_failure(e: AdminError) -> Response {
    let status = match &e {
        AdminError::Invalid(_) => StatusCode::BAD_REQUEST,
        AdminError::NotFound { .. } => StatusCode::NOT_FOUND,
        AdminError::Conflict { .. } => StatusCode::CONFLICT,
        AdminError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.to_string(), json!({}))
}

/// Body of `POST /v1/admin/replay`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    project: String,
    consumer_id: String,
    event_id: Option<String>,
    #[serde(default)]
    all: bool,
}

/// Body of `POST /v1/admin/resolve`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    project: String,
    consumer_id: String,
    event_id: String,
    reason: String,
}

/// Body of `POST /v1/admin/retire`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetireBody {
    project: String,
    consumer_id: String,
    reason: String,
}

#[allow(clippy::result_large_err)]
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("invalid request body: {e}")))
}

#[allow(clippy::result_large_err)]
fn ids(project: &str, consumer: &str) -> Result<(ProjectId, ConsumerId), Response> {
    let project = ProjectId::new(project).map_err(|e| bad_request(e.to_string()))?;
    let consumer = ConsumerId::new(consumer).map_err(|e| bad_request(e.to_string()))?;
    Ok((project, consumer))
}

async fn connection(state: &AppState) -> Result<deadpool_postgres::Object, Response> {
    state.read_pool.get().await.map_err(|e| {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no database connection: {e}"),
            json!({}),
        )
    })
}

/// Asks the lease holder to re-dispatch one dead letter, or all of a consumer's, credited to
/// the configured operator (as `outbox dead-letters replay --by`).
pub async fn replay(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let run = async {
        let by = authorize(&state, &headers)?;
        let body: ReplayBody = parse(&body)?;
        let (project, consumer) = ids(&body.project, &body.consumer_id)?;
        let target = match (body.event_id, body.all) {
            (Some(id), false) => {
                ReplayTarget::One(EventId::new(id).map_err(|e| bad_request(e.to_string()))?)
            }
            (None, true) => ReplayTarget::AllDead,
            _ => return Err(bad_request("give either event_id or \"all\": true".into())),
        };
        let mut client = connection(&state).await?;
        let done = Admin::new(&state.schema)
            .request_replay(&mut client, &project, &consumer, &target, by)
            .await
            .map_err(admin_failure)?;
        Ok(axum::Json(done).into_response())
    };
    run.await.unwrap_or_else(|r| r)
}

/// Resolves a dead letter, credited to the configured operator.
pub async fn resolve(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let run = async {
        let by = authorize(&state, &headers)?;
        let body: ResolveBody = parse(&body)?;
        let (project, consumer) = ids(&body.project, &body.consumer_id)?;
        let event = EventId::new(body.event_id).map_err(|e| bad_request(e.to_string()))?;
        let reason = Reason::new(body.reason).map_err(|e| bad_request(e.to_string()))?;
        let mut client = connection(&state).await?;
        let done = Admin::new(&state.schema)
            .resolve(&mut client, &project, &consumer, &event, by, &reason)
            .await
            .map_err(admin_failure)?;
        Ok(axum::Json(done).into_response())
    };
    run.await.unwrap_or_else(|r| r)
}

/// Retires a consumer, credited to the configured operator.
pub async fn retire(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let run = async {
        let by = authorize(&state, &headers)?;
        let body: RetireBody = parse(&body)?;
        let (project, consumer) = ids(&body.project, &body.consumer_id)?;
        let reason = Reason::new(body.reason).map_err(|e| bad_request(e.to_string()))?;
        let mut client = connection(&state).await?;
        let done = Admin::new(&state.schema)
            .retire(&mut client, &project, &consumer, by, &reason)
            .await
            .map_err(admin_failure)?;
        Ok(axum::Json(done).into_response())
    };
    run.await.unwrap_or_else(|r| r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn token_comparison() {
        let auth = AdminAuth::new("s3cret", OperatorName::new("alice").unwrap());
        assert!(auth.accepts("s3cret"));
        assert!(!auth.accepts("s3cret "));
        assert!(!auth.accepts(""));
    }
}
