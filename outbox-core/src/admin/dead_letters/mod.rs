//! Dead letters: listing, showing (with the event, while retained), replay requests and
//! resolution. The consumer runtime serves replay requests; these operations only change the
//! delivery row's state, under the consumer row's lock.
//!
//! Listing and showing live here; replay requests and resolution in `repair`.

mod repair;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::{Client, Row};

use super::{Admin, AdminError, Listing, Target, check_limit, parse_state};
use crate::ids::{ConsumerId, EventId, ProjectId};
use crate::schema::Schema;
use crate::states::DeliveryState;
use crate::stmt::Unnamed as _;

pub use repair::{ReplayRequest, ReplayTarget, Resolution};

/// One consumer's delivery state of one failed event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// The event.
    pub event_id: String,
    /// The event's sequence.
    pub sequence: i64,
    /// Where it stands.
    pub state: DeliveryState,
    /// Delivery attempts so far (including replays).
    pub attempts: i32,
    /// The last failure's bounded code.
    pub last_failure_class: Option<String>,
    /// When it first failed.
    pub first_failed_at: DateTime<Utc>,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
    /// When it was parked.
    pub parked_at: Option<DateTime<Utc>>,
    /// When it is tried next (retrying only).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When an operator resolved it.
    pub resolved_at: Option<DateTime<Utc>>,
    /// Who resolved it.
    pub resolved_by: Option<String>,
    /// Why.
    pub resolved_reason: Option<String>,
}

/// The event behind a dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventFields {
    /// The event type.
    pub event_type: String,
    /// The deleted task.
    pub task_id: String,
    /// When it was deleted.
    pub deleted_at: DateTime<Utc>,
    /// The process that wrote it.
    pub writer_process_id: String,
    /// When it was written.
    pub occurred_at: DateTime<Utc>,
    /// Payload layout version.
    pub payload_version: i32,
    /// The task's state before deletion (its column and status), as `consume` prints it.
    pub prior: serde_json::Value,
    /// When it was numbered.
    pub sequenced_at: Option<DateTime<Utc>>,
}

/// A dead letter with its event; `event` is `None` once retention pruned the event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterDetail {
    /// The delivery state.
    #[serde(flatten)]
    pub dead_letter: DeadLetter,
    /// The event, while retained.
    pub event: Option<EventFields>,
}

/// Which dead letters a listing shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Only this project.
    pub project: Option<ProjectId>,
    /// Only this consumer.
    pub consumer: Option<ConsumerId>,
    /// Only these states; empty means [`DeliveryState::DEAD_LETTERS`].
    pub states: Vec<DeliveryState>,
    /// At most this many rows (`1..=MAX_LIMIT`).
    pub limit: i64,
}

impl Default for DeadLetterFilter {
    fn default() -> Self {
        Self {
            project: None,
            consumer: None,
            states: Vec::new(),
            limit: 1000,
        }
    }
}

/// The statements of this module, rendered once for a schema.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    dead_letters: String,
    dead_letter: String,
    dead_letter_at: String,
    /// Those of the repairs.
    repair: repair::Statements,
}

impl Statements {
    pub(super) fn new(schema: &Schema) -> Self {
        Self {
            dead_letters: schema.render(DEAD_LETTERS),
            dead_letter: schema.render(DEAD_LETTER),
            dead_letter_at: schema.render(DEAD_LETTER_AT),
            repair: repair::Statements::new(schema),
        }
    }
}

impl Admin {
    /// Dead letters by filter, by project, consumer and sequence.
    pub async fn dead_letters(
        &self,
        client: &mut Client,
        filter: &DeadLetterFilter,
    ) -> Result<Listing<DeadLetter>, AdminError> {
        check_limit(filter.limit)?;
        let states: Vec<&str> = if filter.states.is_empty() {
            DeliveryState::DEAD_LETTERS
        } else {
            &filter.states
        }
        .iter()
        .map(DeliveryState::as_str)
        .collect();
        let tx = Self::snapshot(client).await?;
        let rows = tx
            .query_unnamed(
                &self.dead_letters.dead_letters,
                &[
                    &filter.project.as_ref().map(ProjectId::as_str),
                    &filter.consumer.as_ref().map(ConsumerId::as_str),
                    &states,
                    &(filter.limit + 1),
                ],
            )
            .await?;
        tx.commit().await?;
        let items = rows
            .iter()
            .map(decode_dead_letter)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Listing::cut(items, filter.limit))
    }

    /// One dead letter (or retrying delivery) with its event.
    pub async fn dead_letter(
        &self,
        client: &mut Client,
        project: &ProjectId,
        consumer: &ConsumerId,
        event: &EventId,
    ) -> Result<DeadLetterDetail, AdminError> {
        let tx = Self::snapshot(client).await?;
        let row = tx
            .query_opt_unnamed(
                &self.dead_letters.dead_letter,
                &[&project.as_str(), &consumer.as_str(), &event.as_str()],
            )
            .await?;
        let Some(row) = row else {
            let target = match self.consumer_exists(&tx, project, consumer).await? {
                true => Target::dead_letter(project, consumer, event),
                false => Target::consumer(project, consumer),
            };
            return Err(AdminError::NotFound { target });
        };
        tx.commit().await?;
        let event = match row.try_get::<_, Option<String>>("event_type")? {
            None => None,
            Some(event_type) => Some(EventFields {
                event_type,
                task_id: row.try_get("task_id")?,
                deleted_at: row.try_get("deleted_at")?,
                writer_process_id: row.try_get("writer_process_id")?,
                occurred_at: row.try_get("occurred_at")?,
                payload_version: row.try_get("payload_version")?,
                prior: row.try_get("payload")?,
                sequenced_at: row.try_get("sequenced_at")?,
            }),
        };
        Ok(DeadLetterDetail {
            dead_letter: decode_dead_letter(&row)?,
            event,
        })
    }

    /// The event ID of the consumer's dead letter (or retrying delivery) at `sequence`, so
    /// operators can name a letter by the sequence `list` shows.
    pub async fn dead_letter_at(
        &self,
        client: &mut Client,
        project: &ProjectId,
        consumer: &ConsumerId,
        sequence: i64,
    ) -> Result<EventId, AdminError> {
        let tx = Self::snapshot(client).await?;
        let row = tx
            .query_opt_unnamed(
                &self.dead_letters.dead_letter_at,
                &[&project.as_str(), &consumer.as_str(), &sequence],
            )
            .await?;
        let Some(row) = row else {
            let target = match self.consumer_exists(&tx, project, consumer).await? {
                true => Target::DeadLetterAt {
                    project: project.clone(),
                    consumer: consumer.clone(),
                    sequence,
                },
                false => Target::consumer(project, consumer),
            };
            return Err(AdminError::NotFound { target });
        };
        tx.commit().await?;
        Ok(EventId::new(row.try_get::<_, String>("event_id")?)?)
    }
}

/// Decodes the delivery columns of [`DEAD_LETTERS`] and [`DEAD_LETTER`].
fn decode_dead_letter(row: &Row) -> Result<DeadLetter, AdminError> {
    Ok(DeadLetter {
        project_id: row.try_get("project_id")?,
        consumer_id: row.try_get("consumer_id")?,
        event_id: row.try_get("event_id")?,
        sequence: row.try_get("sequence")?,
        state: parse_state(row.try_get("state")?)?,
        attempts: row.try_get("attempts")?,
        last_failure_class: row.try_get("last_failure_class")?,
        first_failed_at: row.try_get("first_failed_at")?,
        updated_at: row.try_get("updated_at")?,
        parked_at: row.try_get("parked_at")?,
        next_attempt_at: row.try_get("next_attempt_at")?,
        resolved_at: row.try_get("resolved_at")?,
        resolved_by: row.try_get("resolved_by")?,
        resolved_reason: row.try_get("resolved_reason")?,
    })
}
/// Deliveries (dead letters and retrying events) by filter: `$1` project or NULL, `$2`
/// consumer or NULL, `$3` states, `$4` row limit.
const DEAD_LETTERS: &str = "
SELECT project_id, consumer_id, event_id, sequence, state, attempts, last_failure_class,
       first_failed_at, updated_at, parked_at, next_attempt_at, resolved_at, resolved_by,
       resolved_reason
FROM {{schema}}.lifecycle_deliveries
WHERE ($1::text IS NULL OR project_id = $1)
  AND ($2::text IS NULL OR consumer_id = $2)
  AND state = ANY($3::text[])
ORDER BY project_id, consumer_id, sequence
LIMIT $4";

/// One delivery with its event, if the event is still retained: `$1` project, `$2` consumer,
/// `$3` event. The delivery columns of [`DEAD_LETTERS`], then the event's (NULL once pruned).
const DEAD_LETTER: &str = "
SELECT d.project_id, d.consumer_id, d.event_id, d.sequence, d.state, d.attempts,
       d.last_failure_class, d.first_failed_at, d.updated_at, d.parked_at, d.next_attempt_at,
       d.resolved_at, d.resolved_by, d.resolved_reason,
       o.event_type, o.task_id, o.deleted_at, o.writer_process_id, o.occurred_at,
       o.payload_version, o.payload, o.sequenced_at
FROM {{schema}}.lifecycle_deliveries AS d
LEFT JOIN {{schema}}.lifecycle_outbox AS o
  ON o.project_id = d.project_id AND o.event_id = d.event_id
WHERE d.project_id = $1 AND d.consumer_id = $2 AND d.event_id = $3";

/// The event ID of a consumer's delivery at a sequence: `$1` project, `$2` consumer, `$3`
/// sequence.
const DEAD_LETTER_AT: &str = "
SELECT event_id
FROM {{schema}}.lifecycle_deliveries
WHERE project_id = $1 AND consumer_id = $2 AND sequence = $3";
