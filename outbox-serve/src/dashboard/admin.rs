//! The admin actions of the dashboard: `POST /v1/admin/replay`, `/resolve` and `/retire`,
//! each authorized by the admin token (see [`crate::auth`]) and credited to its operator.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use outbox_core::admin::{Admin, AdminError, Reason, ReplayTarget};
use outbox_core::{ConsumerId, EventId, OperatorName, ProjectId};
use serde::Deserialize;
use serde_json::json;

use crate::state::{AppState, error};

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
        .and_then(bearer_token);
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

/// The token of an `Authorization: Bearer TOKEN` value; the scheme is case-insensitive
/// (RFC 9110, section 11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
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

/// The body as `T`, from a JSON object only: serde would also fill a struct from an array,
/// by position (`["p1", "c", "why"]`), which is no documented form and easily a mistake.
/// Unknown keys and wrong types are refused by `T`'s own decoding.
#[allow(clippy::result_large_err)]
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Response> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| bad_request(format!("invalid request body: {e}")))?;
    let kind = match &value {
        serde_json::Value::Object(_) => {
            return serde_json::from_value(value)
                .map_err(|e| bad_request(format!("invalid request body: {e}")));
        }
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Null => "null",
    };
    Err(bad_request(format!(
        "invalid request body: expected a JSON object with named keys, got {kind}"
    )))
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
pub(crate) async fn replay(
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
pub(crate) async fn resolve(
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
pub(crate) async fn retire(
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
    use super::{RetireBody, bearer_token, parse};
    use axum::body::Bytes;

    #[test]
    fn a_body_is_an_object_with_known_keys_of_the_right_types() {
        let refused = |body: &str| {
            parse::<RetireBody>(&Bytes::from(body.to_owned()))
                .map(|b| format!("{b:?}"))
                .expect_err(body)
        };
        for body in [
            r#"["p1","@:","reason"]"#,
            r#""p1""#,
            "null",
            r#"{"project":"p1","consumer_id":"c","reason":"r","extra":1}"#,
            r#"{"project":"p1","consumer_id":7,"reason":"r"}"#,
            r#"{"project":"p1","reason":"r"}"#,
        ] {
            assert_eq!(refused(body).status(), 400, "{body}");
        }
        let body = r#"{"project":"p1","consumer_id":"c","reason":"r"}"#;
        assert!(parse::<RetireBody>(&Bytes::from(body)).is_ok());
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in ["Bearer t0k", "bearer t0k", "BEARER t0k", "  bEaReR t0k"] {
            assert_eq!(bearer_token(value), Some("t0k"), "{value:?}");
        }
        for value in ["Basic t0k", "Bearert0k", "t0k", ""] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
    }
}
