//! Repairs of dead letters: replay requests (served by the consumer runtime) and resolution,
//! each under the consumer row's lock, with their audit rows.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Client;

use crate::admin::{Admin, AdminError, AuditRecord, Reason, Target, format_time, parse_state};
use crate::ids::{ConsumerId, EventId, OperatorName, ProjectId};
use crate::schema::Schema;
use crate::states::{AuditKind, ConsumerState, DeliveryState};
use crate::stmt::Unnamed as _;

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
    delivery_for_update: String,
    dead_for_update: String,
    request_replay: String,
    resolve: String,
}

impl Statements {
    pub(super) fn new(schema: &Schema) -> Self {
        Self {
            delivery_for_update: schema.render(DELIVERY_FOR_UPDATE),
            dead_for_update: schema.render(DEAD_FOR_UPDATE),
            request_replay: schema.render(REQUEST_REPLAY),
            resolve: schema.render(RESOLVE),
        }
    }
}

impl Admin {
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
                        &self.dead_letters.repair.delivery_for_update,
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
                        &self.dead_letters.repair.dead_for_update,
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
                    &self.dead_letters.repair.request_replay,
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
                &self.dead_letters.repair.delivery_for_update,
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
                &self.dead_letters.repair.resolve,
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
