//! Read-only access to a project's retained history, for followers that own no cursor (the
//! SSE clients of `outbox serve`): they resume after a sequence of their choosing and must
//! never move a durable consumer's cursor or take its lease.

use outbox_core::{ConsumerId, ProjectId, Schema};
use tokio_postgres::{Client, GenericClient};

use crate::error::ConsumerError;
use crate::event::ObservedEvent;
use crate::handler::{LiveSet, ReconcileReason};
use crate::sql;
use crate::store;

/// Reads retained events and live snapshots without writing anything.
#[derive(Debug, Clone)]
pub struct History {
    /// The types a read returns.
    event_types: outbox_core::contract::EventTypes,
    /// [`sql::READ_RANGE`], rendered.
    read_range: String,
    /// [`sql::PROJECT_BOUNDS`], rendered.
    bounds: String,
    /// [`sql::CURSOR`], rendered.
    cursor: String,
    /// [`sql::RESUME_POINT`], rendered.
    resume_point: String,
    /// [`sql::EVENT_AT`], rendered.
    event_at: String,
}

/// Where a follower may resume: what [`History::resume_point`] reads in one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// The project's head.
    pub head: i64,
    /// The project's retention floor: every event at or below it is gone.
    pub floor: i64,
    /// The identity (event ID) of the retained event at the follower's position, if any.
    pub event_id: Option<String>,
}

impl History {
    /// Statements for `schema`.
    pub fn new(schema: &Schema) -> Self {
        Self::for_types(schema, outbox_core::contract::EventTypes::default())
    }

    /// History statements whose reads return only events of `event_types` (the types the
    /// consumer being served declared: it passed the others without a call).
    pub fn for_types(schema: &Schema, event_types: outbox_core::contract::EventTypes) -> Self {
        Self {
            event_types,
            read_range: schema.render(sql::READ_RANGE),
            bounds: schema.render(sql::PROJECT_BOUNDS),
            cursor: schema.render(sql::CURSOR),
            resume_point: schema.render(sql::RESUME_POINT),
            event_at: schema.render(sql::EVENT_AT),
        }
    }

    /// `consumer`'s acknowledged cursor; `None` while missing or for an unknown consumer.
    pub async fn cursor(
        &self,
        client: &impl GenericClient,
        project: &ProjectId,
        consumer: &ConsumerId,
    ) -> Result<Option<i64>, ConsumerError> {
        let row = client
            .query_opt(&self.cursor, &[&project.as_str(), &consumer.as_str()])
            .await?;
        Ok(match row {
            Some(row) => row.try_get("last_acked_sequence")?,
            None => None,
        })
    }

    /// The project's head and retention floor (everything at or below the floor is gone).
    pub async fn bounds(
        &self,
        client: &impl GenericClient,
        project: &ProjectId,
    ) -> Result<(i64, i64), ConsumerError> {
        let row = client.query_one(&self.bounds, &[&project.as_str()]).await?;
        Ok((
            row.try_get("head_sequence")?,
            row.try_get("pruned_through")?,
        ))
    }

    /// The head, the floor and the identity of the retained event at `position`, in one
    /// snapshot: a follower resuming after `position` with the identity it last saw there can
    /// tell whether this is still the history it came from (after a failover that lost a tail,
    /// the database may have reached `position` again with another event).
    pub async fn resume_point(
        &self,
        client: &impl GenericClient,
        project: &ProjectId,
        position: i64,
    ) -> Result<ResumePoint, ConsumerError> {
        let row = client
            .query_one(&self.resume_point, &[&project.as_str(), &position])
            .await?;
        Ok(ResumePoint {
            head: row.try_get("head_sequence")?,
            floor: row.try_get("pruned_through")?,
            event_id: row.try_get("event_at_position")?,
        })
    }

    /// Up to `limit` retained events with `after < sequence <= through`, in order, as
    /// `consumer` observed them. Events `consumer` parked as dead letters are left out, and
    /// so is an event whose payload cannot be decoded (the consumer parks such an event), and
    /// one of a type or major the consumer did not declare (passed, or parked).
    pub async fn read(
        &self,
        client: &impl GenericClient,
        project: &ProjectId,
        consumer: &ConsumerId,
        after: i64,
        through: i64,
        limit: i64,
    ) -> Result<Vec<ObservedEvent>, ConsumerError> {
        let rows = client
            .query(
                &self.read_range,
                &[
                    &project.as_str(),
                    &after,
                    &through,
                    &limit,
                    &consumer.as_str(),
                ],
            )
            .await?;
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            match store::decode(row, project, consumer, false, 1)? {
                (event, None)
                    if self.event_types.accept(&event.event_type, event.type_major)
                        == outbox_core::contract::Acceptance::Deliver =>
                {
                    events.push(event)
                }
                _ => {}
            }
        }
        Ok(events)
    }

    /// The live task set, the head and the identity of the event there in one repeatable-read,
    /// read-only snapshot, taken with `live_query` (`$1` = project), as the durable consumer's
    /// own reconciliation takes it.
    pub async fn live_set(
        &self,
        client: &mut Client,
        project: &ProjectId,
        live_query: &str,
        reason: ReconcileReason,
    ) -> Result<LiveSet, ConsumerError> {
        let tx = outbox_core::internal::read_only_snapshot(client).await?;
        let (head, _) = self.bounds(&tx, project).await?;
        let head_event_id = match tx
            .query_opt(&self.event_at, &[&project.as_str(), &head])
            .await?
        {
            Some(row) => Some(row.try_get("event_id")?),
            None => None,
        };
        // Read as the consumer's own reconciliation reads it: a write the query attempts is
        // named as the query's failure.
        let task_ids = crate::live_query::task_ids(&tx, live_query, project.as_str()).await?;
        tx.commit().await?;
        Ok(LiveSet {
            project_id: project.clone(),
            task_ids,
            head_sequence: head,
            head_event_id,
            reason,
        })
    }
}
