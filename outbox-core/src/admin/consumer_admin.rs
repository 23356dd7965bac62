//! A retired consumer's two ways out, both the operator's and both audited: reactivation (it
//! becomes active with a missing cursor, so its next start reconciles) and deletion of its rows
//! (so retired probe consumers and mistyped IDs do not pile up). An active consumer is never
//! deleted: it holds retention back and may be running; retire it first.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Client;

use super::Reason;
use super::consumers::ConsumerRow;
use super::{Admin, AdminError, AuditRecord, Target};
use crate::ids::{ConsumerId, OperatorName, ProjectId};
use crate::schema::Schema;
use crate::states::{AuditKind, ConsumerState};
use crate::stmt::Unnamed as _;

/// A retired consumer made active again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reactivation {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// Who reactivated it.
    pub reactivated_by: String,
    /// The lease generation after the bump: a process that held the lease before the
    /// retirement is fenced off.
    pub lease_generation: i64,
}

/// A retired consumer's rows, deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Deletion {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// Who deleted it.
    pub deleted_by: String,
    /// When it had been retired.
    pub retired_at: Option<DateTime<Utc>>,
    /// Its delivery rows deleted with it (retrying, dead letters and settled ones).
    pub delivery_rows: i64,
}

/// The statements of this module, rendered once for a schema.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    reactivate: String,
    delete_deliveries: String,
    delete_positions: String,
    delete_renewals: String,
    delete_receipts: String,
    delete_consumer: String,
}

impl Statements {
    pub(super) fn new(schema: &Schema) -> Self {
        Self {
            reactivate: schema.render(REACTIVATE),
            delete_deliveries: schema.render(DELETE_DELIVERIES),
            delete_positions: schema.render(DELETE_POSITIONS),
            delete_renewals: schema.render(DELETE_RENEWALS),
            delete_receipts: schema.render(DELETE_RECEIPTS),
            delete_consumer: schema.render(DELETE_CONSUMER),
        }
    }
}

impl Admin {
    /// Makes a retired consumer active again with a missing cursor, so that it reconciles at
    /// its next start (while it was retired, retention may have pruned past its position and
    /// its dead letters). Audited `consumer-reactivated` with the operator and the reason.
    /// Refused (conflict) for an active consumer.
    pub async fn reactivate(
        &self,
        client: &mut Client,
        project: &ProjectId,
        consumer: &ConsumerId,
        by: &OperatorName,
        reason: &Reason,
    ) -> Result<Reactivation, AdminError> {
        let tx = Self::write(client).await?;
        self.lock_retired(
            &tx,
            project,
            consumer,
            "not retired, so there is nothing to reactivate",
        )
        .await?;
        let (p, c) = (project.as_str(), consumer.as_str());
        let generation: i64 = tx
            .query_one_unnamed(&self.consumer_admin.reactivate, &[&p, &c])
            .await?
            .try_get("lease_generation")?;
        self.audit
            .record(
                &tx,
                &AuditRecord::consumer_action(
                    AuditKind::ConsumerReactivated,
                    p,
                    c,
                    by.as_str(),
                    None,
                    reason.as_str(),
                ),
            )
            .await?;
        tx.commit().await?;
        tracing::info!(project = %project, consumer = %consumer, by = %by,
            "consumer reactivated; it reconciles at its next start");
        Ok(Reactivation {
            project_id: p.to_owned(),
            consumer_id: c.to_owned(),
            reactivated_by: by.to_string(),
            lease_generation: generation,
        })
    }

    /// Deletes a retired consumer's row with its positions, lease renewals and delivery rows
    /// (its dead letters, settled or not: a retired consumer's unresolved dead letters are
    /// prunable already). Retention is unchanged: a retired consumer holds nothing back. Its
    /// audit rows stay. Audited `consumer-deleted` with the operator, the reason and the
    /// number of delivery rows deleted. Refused (conflict) for an active consumer.
    pub async fn delete_consumer(
        &self,
        client: &mut Client,
        project: &ProjectId,
        consumer: &ConsumerId,
        by: &OperatorName,
        reason: &Reason,
    ) -> Result<Deletion, AdminError> {
        let tx = Self::write(client).await?;
        let row = self
            .lock_retired(
                &tx,
                project,
                consumer,
                "active: it holds retention back and may be running; retire it first \
                          (outbox consumers retire), then delete it",
            )
            .await?;
        let (p, c) = (project.as_str(), consumer.as_str());
        let statements = &self.consumer_admin;
        let delivery_rows = tx
            .execute_unnamed(&statements.delete_deliveries, &[&p, &c])
            .await?;
        tx.execute_unnamed(&statements.delete_positions, &[&p, &c])
            .await?;
        tx.execute_unnamed(&statements.delete_renewals, &[&p, &c])
            .await?;
        tx.execute_unnamed(&statements.delete_receipts, &[&p, &c])
            .await?;
        tx.execute_unnamed(&statements.delete_consumer, &[&p, &c])
            .await?;
        let delivery_rows = i64::try_from(delivery_rows).unwrap_or(i64::MAX);
        self.audit
            .record(
                &tx,
                &AuditRecord::consumer_action(
                    AuditKind::ConsumerDeleted,
                    p,
                    c,
                    by.as_str(),
                    Some(delivery_rows),
                    reason.as_str(),
                ),
            )
            .await?;
        tx.commit().await?;
        tracing::info!(project = %project, consumer = %consumer, by = %by, delivery_rows,
            "retired consumer deleted");
        Ok(Deletion {
            project_id: p.to_owned(),
            consumer_id: c.to_owned(),
            deleted_by: by.to_string(),
            retired_at: row.retired_at,
            delivery_rows,
        })
    }

    /// Locks the consumer row and returns it, refusing (conflict, with `refusal`) unless it
    /// is retired.
    async fn lock_retired(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        project: &ProjectId,
        consumer: &ConsumerId,
        refusal: &str,
    ) -> Result<ConsumerRow, AdminError> {
        let row = self.lock_consumer(tx, project, consumer, true).await?;
        if row.state != ConsumerState::Retired {
            return Err(AdminError::Conflict {
                target: Target::consumer(project, consumer),
                state: row.state.to_string(),
                refusal: refusal.into(),
            });
        }
        Ok(row)
    }
}

/// Makes retired consumer `$1`/`$2` active again with a missing cursor (the same change as
/// the runtime's reactivation at its claim). The generation is bumped so that a runtime that
/// held the lease before the retirement never finds its fence valid again; an unexpired lease
/// keeps its expiry (its newest renewal of the current generation carried into the row, as
/// the bump leaves the renewals behind), so the next claim waits for it to run out rather than
/// overlap with a holder that has not noticed yet. The current position is replaced by a
/// missing one (no sequence, no event: the operator's grant has neither column, so it can
/// make a cursor missing but never move one) that carries when the consumer last
/// acknowledged and reconciled.
const REACTIVATE: &str = "
WITH renewal AS (
    SELECT newest.lease_expires_at, newest.heartbeat_at
    FROM (SELECT r.lease_generation, r.lease_expires_at, r.heartbeat_at
          FROM {{schema}}.lifecycle_lease_renewals AS r
          WHERE r.project_id = $1 AND r.consumer_id = $2
          ORDER BY r.renewal_id DESC
          LIMIT 1) AS newest
    JOIN {{schema}}.lifecycle_consumers AS c
      ON c.project_id = $1 AND c.consumer_id = $2
     AND c.lease_generation = newest.lease_generation
),
reactivated AS (
    UPDATE {{schema}}.lifecycle_consumers AS c
    SET state = 'active', retired_at = NULL, retired_by = NULL, retired_reason = NULL,
        lease_generation = c.lease_generation + 1,
        claimed_until = COALESCE((SELECT lease_expires_at FROM renewal), c.claimed_until),
        claimed_at = COALESCE((SELECT heartbeat_at FROM renewal), c.claimed_at)
    WHERE c.project_id = $1 AND c.consumer_id = $2 AND c.state = 'retired'
    RETURNING c.lease_generation
),
was AS (
    SELECT position_id, last_acked_at, reconciled_at
    FROM {{schema}}.lifecycle_consumer_positions
    WHERE project_id = $1 AND consumer_id = $2
    ORDER BY position_id DESC
    LIMIT 1
),
replaced AS (
    DELETE FROM {{schema}}.lifecycle_consumer_positions AS p
    WHERE p.project_id = $1 AND p.consumer_id = $2
      AND p.position_id = (SELECT was.position_id FROM reactivated, was)
),
missing AS (
    INSERT INTO {{schema}}.lifecycle_consumer_positions
        (project_id, consumer_id, last_acked_at, reconciled_at)
    SELECT $1, $2, was.last_acked_at, was.reconciled_at
    FROM reactivated LEFT JOIN was ON true
)
SELECT lease_generation FROM reactivated";

/// Every delivery row of consumer `$1`/`$2`.
const DELETE_DELIVERIES: &str = "
DELETE FROM {{schema}}.lifecycle_deliveries WHERE project_id = $1 AND consumer_id = $2";

/// Every position row of consumer `$1`/`$2`.
const DELETE_POSITIONS: &str = "
DELETE FROM {{schema}}.lifecycle_consumer_positions WHERE project_id = $1 AND consumer_id = $2";

/// Every lease renewal of consumer `$1`/`$2`.
const DELETE_RENEWALS: &str = "
DELETE FROM {{schema}}.lifecycle_lease_renewals WHERE project_id = $1 AND consumer_id = $2";

/// Every lane receipt of consumer `$1`/`$2` (migration 0018): a consumer created again under
/// the same name must not skip events its predecessor handled.
const DELETE_RECEIPTS: &str = "
DELETE FROM {{schema}}.lifecycle_lane_receipts WHERE project_id = $1 AND consumer_id = $2";

/// The consumer row itself, retired (the caller checked it under its lock).
const DELETE_CONSUMER: &str = "
DELETE FROM {{schema}}.lifecycle_consumers
WHERE project_id = $1 AND consumer_id = $2 AND state = 'retired'";
