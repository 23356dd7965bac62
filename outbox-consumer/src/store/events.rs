//! Reading events: what a read of a batch found, the decoder of event rows, and the check of
//! a consumer's declared event types against the registry.

use chrono::{DateTime, Utc};
use outbox_core::event::PayloadText;
use outbox_core::internal::Unnamed as _;
use outbox_core::{ConsumerId, Prior, ProjectId};
use tokio_postgres::{GenericClient, Row};

use super::Statements;
use crate::error::ConsumerError;
use crate::event::{EventPayload, FailureClass, ObservedEvent};

/// A decoded event and, if its payload is undecodable, the failure class it fails with.
pub(crate) type Decoded = (ObservedEvent, Option<FailureClass>);

/// What a read found after the cursor.
pub(crate) struct Batch {
    /// Events after the cursor in sequence order (contiguity is the caller's check).
    pub events: Vec<Decoded>,
    /// Whether more may follow at once (a full batch), so the caller reads again without
    /// waiting for a wake-up.
    pub full: bool,
    /// When the connection it was read on was opened: one opened after the last identity
    /// check may reach another server (a promoted standby), so the check runs again first.
    pub connected_at: std::time::Instant,
}

/// Refuses a declaration of event types that names one the registry does not hold (the
/// default, `task:deleted@1`, is registered by the schema itself and not looked up).
pub(crate) async fn check_declared(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    types: &outbox_core::contract::EventTypes,
) -> Result<(), ConsumerError> {
    if types.is_default() {
        return Ok(());
    }
    let rows = client.query_unnamed(&statements.contracts, &[]).await?;
    let registered: Vec<(String, i32)> = rows
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;
    for r in types.refs() {
        let known = registered.iter().any(|(t, major)| {
            t == r.event_type.as_str() && i64::from(*major) == i64::from(r.major)
        });
        if !known {
            return Err(crate::config::ConfigError(format!(
                "event type {r} is not registered (see outbox contracts list; register it \
                 with outbox contracts add)"
            ))
            .into());
        }
    }
    Ok(())
}

/// Decodes an event row: one that starts with `sql::event_columns!()`, read by position in
/// that order (`REPLAY_REQUESTED` adds `attempts` after them). The payload is parsed from its
/// text straight into [`Prior`]. The event comes back whole even when its payload cannot be
/// decoded: then with an empty prior and the failure class `undecodable_payload`, carried far
/// enough to be failed and parked like any other failure. A missing or mistyped column is an
/// error.
pub(crate) fn decode(
    row: &Row,
    project: &ProjectId,
    consumer: &ConsumerId,
    replay: bool,
    attempt: u32,
) -> Result<(ObservedEvent, Option<FailureClass>), ConsumerError> {
    let PayloadText(stored) = row.try_get(8)?;
    let event_type: String = row.try_get(1)?;
    let deleted_at = row.try_get::<_, Option<DateTime<Utc>>>(4)?;
    let (prior, payload) = match (event_type.as_str(), deleted_at) {
        // `task:deleted` keeps its original layout (the prior state as the stored payload);
        // its contract's payload is built around it.
        (outbox_core::event::TASK_DELETED, Some(at)) => {
            match serde_json::from_slice::<Prior>(stored) {
                Ok(prior) => {
                    let text = format!(
                        r#"{{"deleted_at":"{}","prior":{}}}"#,
                        outbox_core::event::format_timestamp(at),
                        String::from_utf8_lossy(stored)
                    );
                    (Some(prior), EventPayload::from_json(text))
                }
                Err(_) => (None, None),
            }
        }
        _ => (
            Some(Prior::default()),
            std::str::from_utf8(stored)
                .ok()
                .and_then(|text| EventPayload::from_json(text.to_owned())),
        ),
    };
    let undecodable = match (&prior, &payload) {
        (Some(_), Some(_)) => None,
        _ => Some(FailureClass::undecodable_payload()),
    };
    let event = ObservedEvent {
        observed: true,
        sequence: row.try_get(0)?,
        type_major: row.try_get(7)?,
        type_minor: row.try_get(9)?,
        event_type,
        event_id: row.try_get(2)?,
        task_id: row.try_get(3)?,
        deleted_at,
        writer_process_id: row.try_get(5)?,
        occurred_at: row.try_get::<_, DateTime<Utc>>(6)?,
        payload_version: row.try_get(7)?,
        project_id: project.clone(),
        consumer_id: consumer.clone(),
        prior: prior.unwrap_or_default(),
        payload: payload.unwrap_or_else(EventPayload::empty),
        traceparent: row.try_get(10)?,
        replay,
        attempt,
    };
    Ok((event, undecodable))
}
