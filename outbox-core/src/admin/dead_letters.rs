//! Dead letters: listing, showing (with the event, while retained), replay requests and
//! resolution. The consumer runtime serves replay requests; these operations only change the
//! delivery row's state, under the consumer row's lock.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::{Client, Row};

use super::{
    Admin, AdminError, AuditRecord, Listing, Reason, Target, check_limit, format_time, parse_state,
};
use crate::ids::{ConsumerId, EventId, OperatorName, ProjectId};
use crate::schema::Schema;
use crate::states::{AuditKind, ConsumerState, DeliveryState};
use crate::stmt::Unnamed as _;

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

/// Which dead letters to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayTarget {
    /// One dead letter; anything but `dead` is a conflict.
    One(EventId),
    /// Every `dead` letter of the consumer (none is not an error).
    AllDead,
}

/// What a replay request changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayRequest {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// Who asked.
    pub requested_by: String,
    /// Dead letters now `replay_requested`.
    pub requested: Vec<String>,
    /// Dead letters left `dead` because retention already pruned their events (`AllDead`
    /// only): resolve them instead.
    pub skipped_pruned: Vec<String>,
}

/// A resolved dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resolution {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// The event.
    pub event_id: String,
    /// `dead` or `replay_requested`.
    pub previous_state: DeliveryState,
    /// Delivery attempts it had.
    pub attempts: i32,
    /// Who resolved it.
    pub resolved_by: String,
    /// When.
    pub resolved_at: DateTime<Utc>,
}

/// The statements of this module, rendered once for a schema.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    dead_letters: String,
    dead_letter: String,
    delivery_for_update: String,
    dead_for_update: String,
    request_replay: String,
    resolve: String,
    dead_letter_at: String,
}

impl Statements {
    pub(super) fn new(schema: &Schema) -> Self {
        Self {
            dead_letters: schema.render(DEAD_LETTERS),
            dead_letter: schema.render(DEAD_LETTER),
            delivery_for_update: schema.render(DELIVERY_FOR_UPDATE),
            dead_for_update: schema.render(DEAD_FOR_UPDATE),
            request_replay: schema.render(REQUEST_REPLAY),
            resolve: schema.render(RESOLVE),
            dead_letter_at: schema.render(DEAD_LETTER_AT),
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

    /// Asks the consumer's lease holder to re-dispatch dead letters: `dead` becomes
    /// `replay_requested`. The runtime then marks each `replayed` (audited
    /// `consumer-replayed`, naming `by`) or, if it fails again, `dead` with its attempt count
    /// (audited `consumer-poisoned`). The request itself is audited
    /// (`dead-letter-replay-requested`, one row per letter). Refused for a retired consumer,
    /// for a letter that is not `dead` and for one whose event retention already pruned.
    pub async fn request_replay(
        &self,
        client: &mut Client,
        project: &ProjectId,
        consumer: &ConsumerId,
        which: &ReplayTarget,
        by: &OperatorName,
    ) -> Result<ReplayRequest, AdminError> {
        let tx = Self::write(client).await?;
        let row = self.lock_consumer(&tx, project, consumer, false).await?;
        if row.state != ConsumerState::Active {
            return Err(AdminError::Conflict {
                target: Target::consumer(project, consumer),
                state: row.state.to_string(),
                refusal: "not active: nothing would replay its dead letters; reactivate it \
                          first"
                    .into(),
            });
        }
        let (requested, skipped_pruned) = match which {
            ReplayTarget::One(event) => {
                let target = Target::dead_letter(project, consumer, event);
                let row = tx
                    .query_opt_unnamed(
                        &self.dead_letters.delivery_for_update,
                        &[&project.as_str(), &consumer.as_str(), &event.as_str()],
                    )
                    .await
                    .map_err(AdminError::on(target.clone()))?
                    .ok_or_else(|| AdminError::NotFound {
                        target: target.clone(),
                    })?;
                let state: DeliveryState = parse_state(row.try_get("state")?)?;
                if state != DeliveryState::Dead {
                    return Err(AdminError::Conflict {
                        target,
                        state: state.to_string(),
                        refusal: "not dead: only a dead letter can be replayed".into(),
                    });
                }
                if !row.try_get::<_, bool>("retained")? {
                    return Err(AdminError::Conflict {
                        target,
                        state: state.to_string(),
                        refusal: "but retention pruned its event, so it cannot be replayed; \
                                  resolve it instead"
                            .into(),
                    });
                }
                (vec![event.as_str().to_owned()], Vec::new())
            }
            ReplayTarget::AllDead => {
                let rows = tx
                    .query_unnamed(
                        &self.dead_letters.dead_for_update,
                        &[&project.as_str(), &consumer.as_str()],
                    )
                    .await
                    .map_err(AdminError::on(Target::consumer(project, consumer)))?;
                let (mut retained, mut pruned) = (Vec::new(), Vec::new());
                for row in &rows {
                    let event_id: String = row.try_get("event_id")?;
                    if row.try_get::<_, bool>("retained")? {
                        retained.push(event_id);
                    } else {
                        pruned.push(event_id);
                    }
                }
                (retained, pruned)
            }
        };
        if !requested.is_empty() {
            let rows = tx
                .query_unnamed(
                    &self.dead_letters.request_replay,
                    &[
                        &project.as_str(),
                        &consumer.as_str(),
                        &requested,
                        &by.as_str(),
                    ],
                )
                .await?;
            debug_assert_eq!(rows.len(), requested.len(), "rows were locked");
            for row in &rows {
                let event_id: String = row.try_get("event_id")?;
                let attempts: i32 = row.try_get("attempts")?;
                self.audit
                    .record(
                        &tx,
                        &AuditRecord {
                            kind: AuditKind::DeadLetterReplayRequested,
                            project_id: project.as_str(),
                            consumer_id: Some(consumer.as_str()),
                            event_id: Some(&event_id),
                            actor: Some(by.as_str()),
                            count: Some(i64::from(attempts)),
                            reason: None,
                        },
                    )
                    .await?;
            }
        }
        tx.commit().await?;
        tracing::info!(
            project = %project, consumer = %consumer, requested = requested.len(),
            skipped_pruned = skipped_pruned.len(), "replay requested"
        );
        Ok(ReplayRequest {
            project_id: project.to_string(),
            consumer_id: consumer.to_string(),
            requested_by: by.to_string(),
            requested,
            skipped_pruned,
        })
    }

    /// Closes a `dead` (or `replay_requested`) letter without delivering it, recording who
    /// and why on the delivery row and a `dead-letter-resolved` audit row (actor, attempts).
    pub async fn resolve(
        &self,
        client: &mut Client,
        project: &ProjectId,
        consumer: &ConsumerId,
        event: &EventId,
        by: &OperatorName,
        reason: &Reason,
    ) -> Result<Resolution, AdminError> {
        let tx = Self::write(client).await?;
        self.lock_consumer(&tx, project, consumer, false).await?;
        let target = Target::dead_letter(project, consumer, event);
        let params = [project.as_str(), consumer.as_str(), event.as_str()];
        let row = tx
            .query_opt_unnamed(
                &self.dead_letters.delivery_for_update,
                &[&params[0], &params[1], &params[2]],
            )
            .await
            .map_err(AdminError::on(target.clone()))?
            .ok_or_else(|| AdminError::NotFound {
                target: target.clone(),
            })?;
        let previous: DeliveryState = parse_state(row.try_get("state")?)?;
        match previous {
            DeliveryState::Dead | DeliveryState::ReplayRequested => {}
            DeliveryState::Resolved => {
                let resolved_by: Option<String> = row.try_get("resolved_by")?;
                return Err(AdminError::Conflict {
                    target,
                    state: previous.to_string(),
                    refusal: format!(
                        "not dead (resolved by {} at {})",
                        resolved_by.as_deref().unwrap_or("an unknown operator"),
                        format_time(row.try_get("resolved_at")?)
                    ),
                });
            }
            DeliveryState::Retrying | DeliveryState::Replayed => {
                return Err(AdminError::Conflict {
                    target,
                    state: previous.to_string(),
                    refusal: "not dead: only a dead letter (dead or replay_requested) can be \
                              resolved"
                        .into(),
                });
            }
        }
        let row = tx
            .query_one_unnamed(
                &self.dead_letters.resolve,
                &[
                    &params[0],
                    &params[1],
                    &params[2],
                    &by.as_str(),
                    &reason.as_str(),
                ],
            )
            .await?;
        let attempts: i32 = row.try_get("attempts")?;
        let resolved_at: DateTime<Utc> = row.try_get("resolved_at")?;
        self.audit
            .record(
                &tx,
                &AuditRecord {
                    kind: AuditKind::DeadLetterResolved,
                    project_id: params[0],
                    consumer_id: Some(params[1]),
                    event_id: Some(params[2]),
                    actor: Some(by.as_str()),
                    count: Some(i64::from(attempts)),
                    reason: Some(reason.as_str()),
                },
            )
            .await?;
        tx.commit().await?;
        tracing::info!(
            project = %project, consumer = %consumer, event = %event, by = %by,
            "dead letter resolved"
        );
        Ok(Resolution {
            project_id: project.to_string(),
            consumer_id: consumer.to_string(),
            event_id: event.to_string(),
            previous_state: previous,
            attempts,
            resolved_by: by.to_string(),
            resolved_at,
        })
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

/// One delivery, locked, with whether its event is still retained: `$1` project,
/// `$2` consumer, `$3` event.
const DELIVERY_FOR_UPDATE: &str = "
SELECT d.state, d.attempts, d.resolved_by, d.resolved_at,
       EXISTS (SELECT 1 FROM {{schema}}.lifecycle_outbox AS o
               WHERE o.project_id = d.project_id AND o.event_id = d.event_id) AS retained
FROM {{schema}}.lifecycle_deliveries AS d
WHERE d.project_id = $1 AND d.consumer_id = $2 AND d.event_id = $3
FOR UPDATE OF d";

/// Every dead letter of a consumer, locked, with whether its event is retained: `$1`
/// project, `$2` consumer.
const DEAD_FOR_UPDATE: &str = "
SELECT d.event_id,
       EXISTS (SELECT 1 FROM {{schema}}.lifecycle_outbox AS o
               WHERE o.project_id = d.project_id AND o.event_id = d.event_id) AS retained
FROM {{schema}}.lifecycle_deliveries AS d
WHERE d.project_id = $1 AND d.consumer_id = $2 AND d.state = 'dead'
ORDER BY d.sequence
FOR UPDATE OF d";

/// Marks dead letters for replay by the consumer's lease holder: `$1` project, `$2`
/// consumer, `$3` events. Only rows still `dead` change.
const REQUEST_REPLAY: &str = "
UPDATE {{schema}}.lifecycle_deliveries
SET state = 'replay_requested', replay_requested_by = $4, updated_at = now()
WHERE project_id = $1 AND consumer_id = $2 AND event_id = ANY($3::text[]) AND state = 'dead'
RETURNING event_id, attempts";

/// Resolves a dead letter without delivering it: `$1` project, `$2` consumer, `$3` event,
/// `$4` operator, `$5` reason. Returns the attempt count and the resolution time.
const RESOLVE: &str = "
UPDATE {{schema}}.lifecycle_deliveries
SET state = 'resolved', next_attempt_at = NULL, resolved_at = now(), resolved_by = $4,
    resolved_reason = $5, updated_at = now()
WHERE project_id = $1 AND consumer_id = $2 AND event_id = $3
  AND state IN ('dead', 'replay_requested')
RETURNING attempts, resolved_at";
