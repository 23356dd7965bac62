//! The operator dashboard: one server-rendered page (no build step, no CDN: it works
//! offline) that refreshes its status, dead-letter and audit sections and follows every
//! served project's events in a live feed, both from its one SSE stream ([`feed`]). Admin actions
//! (replay, resolve, retire; see [`admin`]) exist only when the server has an admin token.

mod admin;
mod assets;
mod feed;
mod render;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use outbox_core::admin::{Admin, AuditFilter, DeadLetterFilter, HealthThresholds};

pub(crate) use admin::{replay, resolve, retire};
use render::Sections;

use crate::state::{AppState, event_stream, reserve};

/// Reads the status, the dead letters and the audit trail, and renders each section.
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
        status: render::status(&status),
        dead_letters: render::dead_letters(&dead, state.admin.is_some()),
        audit: render::audit(&audit),
    })
}

/// `GET /`: the page, rendered with the current state.
pub(crate) async fn page(State(state): State<Arc<AppState>>) -> Response {
    let sections = sections(&state).await.unwrap_or_else(|e| Sections {
        status: render::unreadable(&e),
        dead_letters: maud::html! {},
        audit: maud::html! {},
    });
    let projects: Vec<&String> = state.fan_outs.keys().collect();
    let html = render::page(
        state.consumer_id.as_str(),
        &projects,
        sections,
        state.admin.as_ref(),
    );
    let mut response = Html(html.into_string()).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `GET /v1/dashboard/stream`: the page's one stream ([`feed`]): its sections re-rendered
/// every `--dashboard-refresh`, and the events of every served project.
pub(crate) async fn stream(State(state): State<Arc<AppState>>) -> Response {
    if let Err(refusal) = reserve(&state) {
        return refusal;
    }
    let feed = feed::Feed::new(state);
    let stream = futures_util::stream::unfold(feed, |mut feed| async move {
        let chunk = feed.next_chunk().await?;
        Some((Ok::<_, std::convert::Infallible>(chunk), feed))
    });
    event_stream(stream)
}
