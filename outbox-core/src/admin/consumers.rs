//! Consumers as the operator sees them: listing (cursor, lag, lease, failures) and retirement.
//! Reactivation belongs to the process that runs the consumer (`ConsumerConfig::reactivate` of
//! the consumer runtime), which reconciles before anything else.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::{Client, Row, Transaction};

use super::Reason;
use super::{Admin, AdminError, AuditRecord, Target, format_time, parse_state};
use crate::ids::{ConsumerId, OperatorName, ProjectId};
use crate::schema::Schema;
use crate::states::{AuditKind, ConsumerState};
use crate::stmt::Unnamed as _;

/// The retrying event that holds a consumer's cursor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetryingEvent {
    /// The event.
    pub event_id: String,
    /// Its sequence (the cursor + 1).
    pub sequence: i64,
    /// Failed attempts so far.
    pub attempts: i32,
    /// When the next attempt is due.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When it first failed.
    pub first_failed_at: DateTime<Utc>,
    /// How long it has been failing, in seconds.
    pub failing_for_secs: f64,
    /// The last failure's bounded code.
    pub last_failure_class: Option<String>,
}

/// One consumer: identity, cursor, lease and failures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsumerInfo {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// Active or retired.
    pub state: ConsumerState,
    /// Last acknowledged sequence; `None` while missing (the consumer will reconcile).
    pub cursor: Option<i64>,
    /// The project's head.
    pub head_sequence: i64,
    /// `head - cursor`; `None` while the cursor is missing.
    pub lag: Option<i64>,
    /// The highest sequence handled or parked: with lanes beyond the cursor, else the cursor
    /// (as the consumer's last acknowledgement recorded it); `None` while the cursor is
    /// missing.
    pub handled_through: Option<i64>,
    /// `handled_through - cursor`: how far lanes have handled beyond the cursor (0 with one
    /// lane); `None` while the cursor is missing.
    pub handled_ahead: Option<i64>,
    /// The process run holding (or last holding, if expired) the lease.
    pub lease_owner: Option<String>,
    /// The lease generation (bumped by every claim).
    pub lease_generation: i64,
    /// When the lease expires unless renewed.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// True while a lease is held and not expired.
    pub lease_live: bool,
    /// The last claim or heartbeat.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// How long ago that was, in seconds.
    pub heartbeat_age_secs: Option<f64>,
    /// When the consumer first claimed.
    pub created_at: DateTime<Utc>,
    /// How long ago that was, in seconds.
    pub created_age_secs: f64,
    /// When it last acknowledged an event; `None` if it never has.
    pub last_acked_at: Option<DateTime<Utc>>,
    /// When it last reconciled.
    pub reconciled_at: Option<DateTime<Utc>>,
    /// When it was retired.
    pub retired_at: Option<DateTime<Utc>>,
    /// Who retired it.
    pub retired_by: Option<String>,
    /// Why.
    pub retired_reason: Option<String>,
    /// The failing event holding the cursor, if any.
    pub retrying: Option<RetryingEvent>,
    /// Dead letters waiting for an operator.
    pub dead_letters: i64,
    /// Dead letters waiting for the lease holder to replay them.
    pub replay_requested: i64,
}

/// A consumer as `status` shows it.
/// A retired consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Retirement {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// Who retired it.
    pub retired_by: String,
    /// When.
    pub retired_at: DateTime<Utc>,
    /// The process run that held its lease, if the lease was live: it stops at its next
    /// fenced write (at the latest, its next heartbeat).
    pub stopping_lease_owner: Option<String>,
    /// That lease's generation.
    pub lease_generation: i64,
    /// Unresolved dead letters that retention may now prune.
    pub unresolved_dead_letters: i64,
}

/// The statements of this module, rendered once for a schema.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    consumers: String,
    consumer_for_share: String,
    consumer_for_update: String,
    retire: String,
    unresolved_count: String,
}

impl Statements {
    pub(super) fn new(schema: &Schema) -> Self {
        Self {
            consumers: schema.render(CONSUMERS),
            consumer_for_share: schema.render(CONSUMER_FOR_SHARE),
            consumer_for_update: schema.render(CONSUMER_FOR_UPDATE),
            retire: schema.render(RETIRE),
            unresolved_count: schema.render(UNRESOLVED_COUNT),
        }
    }
}

/// The consumer row as a write sees it.
pub(super) struct ConsumerRow {
    pub(super) state: ConsumerState,
    retired_by: Option<String>,
    pub(super) retired_at: Option<DateTime<Utc>>,
}

impl Admin {
    /// Every consumer (of `project`, if given), by project and ID.
    pub async fn consumers(
        &self,
        client: &mut Client,
        project: Option<&ProjectId>,
    ) -> Result<Vec<ConsumerInfo>, AdminError> {
        let tx = Self::snapshot(client).await?;
        let rows = self
            .consumer_rows(&tx, project.map(ProjectId::as_str), None)
            .await?;
        tx.commit().await?;
        Ok(rows)
    }

    pub(super) async fn consumer_rows(
        &self,
        tx: &Transaction<'_>,
        project: Option<&str>,
        consumer: Option<&str>,
    ) -> Result<Vec<ConsumerInfo>, AdminError> {
        tx.query_unnamed(&self.consumers.consumers, &[&project, &consumer])
            .await?
            .iter()
            .map(decode_consumer)
            .collect()
    }

    pub(super) async fn consumer_exists(
        &self,
        tx: &Transaction<'_>,
        project: &ProjectId,
        consumer: &ConsumerId,
    ) -> Result<bool, AdminError> {
        let rows = self
            .consumer_rows(tx, Some(project.as_str()), Some(consumer.as_str()))
            .await?;
        Ok(!rows.is_empty())
    }

    /// Locks the consumer row (`FOR KEY SHARE`, or `FOR UPDATE` when `exclusive`).
    pub(super) async fn lock_consumer(
        &self,
        tx: &Transaction<'_>,
        project: &ProjectId,
        consumer: &ConsumerId,
        exclusive: bool,
    ) -> Result<ConsumerRow, AdminError> {
        let statement = if exclusive {
            &self.consumers.consumer_for_update
        } else {
            &self.consumers.consumer_for_share
        };
        let target = || Target::consumer(project, consumer);
        let row = tx
            .query_opt_unnamed(statement, &[&project.as_str(), &consumer.as_str()])
            .await
            .map_err(AdminError::on(target()))?
            .ok_or_else(|| AdminError::NotFound { target: target() })?;
        Ok(ConsumerRow {
            state: parse_state(row.try_get("state")?)?,
            retired_by: row.try_get("retired_by")?,
            retired_at: row.try_get("retired_at")?,
        })
    }

    /// Retires an active consumer: it stops holding back retention, its unresolved dead
    /// letters become prunable, a runtime holding its lease stops at its next fenced write,
    /// and it may not start again unless reactivated. Audited `consumer-retired` (actor and
    /// the number of unresolved dead letters); the reason stays on the consumer row.
    pub async fn retire(
        &self,
        client: &mut Client,
        project: &ProjectId,
        consumer: &ConsumerId,
        by: &OperatorName,
        reason: &Reason,
    ) -> Result<Retirement, AdminError> {
        let tx = Self::write(client).await?;
        let row = self.lock_consumer(&tx, project, consumer, true).await?;
        if row.state == ConsumerState::Retired {
            return Err(AdminError::Conflict {
                target: Target::consumer(project, consumer),
                state: row.state.to_string(),
                refusal: format!(
                    "not active (retired by {} at {})",
                    row.retired_by.as_deref().unwrap_or("an unknown operator"),
                    format_time(row.retired_at)
                ),
            });
        }
        let (p, c) = (project.as_str(), consumer.as_str());
        let retired = tx
            .query_one_unnamed(
                &self.consumers.retire,
                &[&p, &c, &by.as_str(), &reason.as_str()],
            )
            .await?;
        let unresolved: i64 = tx
            .query_one_unnamed(&self.consumers.unresolved_count, &[&p, &c])
            .await?
            .try_get("unresolved")?;
        self.audit
            .record(
                &tx,
                &AuditRecord::consumer_action(
                    AuditKind::ConsumerRetired,
                    p,
                    c,
                    by.as_str(),
                    Some(unresolved),
                    reason.as_str(),
                ),
            )
            .await?;
        tx.commit().await?;
        let lease_live: bool = retired.try_get("lease_live")?;
        let retirement = Retirement {
            project_id: p.to_owned(),
            consumer_id: c.to_owned(),
            retired_by: by.to_string(),
            retired_at: retired.try_get("retired_at")?,
            stopping_lease_owner: if lease_live {
                retired.try_get("lease_owner")?
            } else {
                None
            },
            lease_generation: retired.try_get("lease_generation")?,
            unresolved_dead_letters: unresolved,
        };
        tracing::info!(project = %project, consumer = %consumer, by = %by, "consumer retired");
        Ok(retirement)
    }
}

/// Decodes a row of [`CONSUMERS`].
fn decode_consumer(row: &Row) -> Result<ConsumerInfo, AdminError> {
    let cursor: Option<i64> = row.try_get("last_acked_sequence")?;
    let head: i64 = row.try_get("head_sequence")?;
    let handled: Option<i64> = row.try_get("handled_through")?;
    let handled_through = cursor.map(|cursor| handled.map_or(cursor, |h| h.max(cursor)));
    let retrying = match row.try_get::<_, Option<String>>("retrying_event_id")? {
        None => None,
        Some(event_id) => Some(RetryingEvent {
            event_id,
            sequence: row.try_get("retrying_sequence")?,
            attempts: row.try_get("retrying_attempts")?,
            next_attempt_at: row.try_get("retrying_next_attempt_at")?,
            first_failed_at: row.try_get("retrying_first_failed_at")?,
            failing_for_secs: row.try_get("retrying_age")?,
            last_failure_class: row.try_get("retrying_failure_class")?,
        }),
    };
    Ok(ConsumerInfo {
        project_id: row.try_get("project_id")?,
        consumer_id: row.try_get("consumer_id")?,
        state: parse_state(row.try_get("state")?)?,
        cursor,
        head_sequence: head,
        lag: cursor.map(|cursor| head - cursor),
        handled_through,
        handled_ahead: cursor.zip(handled_through).map(|(c, h)| h - c),
        lease_owner: row.try_get("lease_owner")?,
        lease_generation: row.try_get("lease_generation")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        lease_live: row.try_get("lease_live")?,
        heartbeat_at: row.try_get("heartbeat_at")?,
        heartbeat_age_secs: row.try_get("heartbeat_age")?,
        created_at: row.try_get("created_at")?,
        created_age_secs: row.try_get("created_age")?,
        last_acked_at: row.try_get("last_acked_at")?,
        reconciled_at: row.try_get("reconciled_at")?,
        retired_at: row.try_get("retired_at")?,
        retired_by: row.try_get("retired_by")?,
        retired_reason: row.try_get("retired_reason")?,
        retrying,
        dead_letters: row.try_get("dead")?,
        replay_requested: row.try_get("replay_requested")?,
    })
}
/// Consumers with cursor, head, lease, the retrying delivery holding the cursor and their
/// dead-letter counts; `$1` project or NULL, `$2` consumer or NULL.
const CONSUMERS: &str = "
SELECT c.project_id, c.consumer_id, c.state, c.last_acked_sequence, c.handled_through,
       COALESCE(h.head_sequence, 0) AS head_sequence,
       c.lease_owner, c.lease_generation, c.lease_expires_at,
       (c.lease_owner IS NOT NULL AND c.lease_expires_at > now()) AS lease_live,
       c.heartbeat_at,
       extract(epoch FROM now() - c.heartbeat_at)::float8 AS heartbeat_age,
       c.created_at, extract(epoch FROM now() - c.created_at)::float8 AS created_age,
       c.last_acked_at, c.reconciled_at, c.retired_at, c.retired_by, c.retired_reason,
       r.event_id AS retrying_event_id, r.sequence AS retrying_sequence,
       r.attempts AS retrying_attempts, r.next_attempt_at AS retrying_next_attempt_at,
       r.first_failed_at AS retrying_first_failed_at,
       extract(epoch FROM now() - r.first_failed_at)::float8 AS retrying_age,
       r.last_failure_class AS retrying_failure_class,
       COALESCE(d.dead, 0) AS dead,
       COALESCE(d.replay_requested, 0) AS replay_requested
FROM {{schema}}.lifecycle_consumer_cursors AS c
LEFT JOIN {{schema}}.lifecycle_project_heads AS h USING (project_id)
LEFT JOIN LATERAL (
    SELECT event_id, sequence, attempts, next_attempt_at, first_failed_at, last_failure_class
    FROM {{schema}}.lifecycle_deliveries
    WHERE project_id = c.project_id AND consumer_id = c.consumer_id AND state = 'retrying'
    ORDER BY sequence
    LIMIT 1
) AS r ON true
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE state = 'dead') AS dead,
           count(*) FILTER (WHERE state = 'replay_requested') AS replay_requested
    FROM {{schema}}.lifecycle_deliveries
    WHERE project_id = c.project_id AND consumer_id = c.consumer_id
      AND state IN ('dead', 'replay_requested')
) AS d ON true
WHERE ($1::text IS NULL OR c.project_id = $1)
  AND ($2::text IS NULL OR c.consumer_id = $2)
ORDER BY c.project_id, c.consumer_id";

/// The consumer row's state, locked against retirement (and reactivation) for the rest of
/// the transaction but not against the runtime's cursor and lease writes (`FOR KEY SHARE`
/// does not conflict with `FOR NO KEY UPDATE`): `$1` project, `$2` consumer.
const CONSUMER_FOR_SHARE: &str = "
SELECT state, retired_by, retired_at
FROM {{schema}}.lifecycle_consumers
WHERE project_id = $1 AND consumer_id = $2
FOR KEY SHARE";

/// The consumer row, locked for a state change: `$1` project, `$2` consumer.
const CONSUMER_FOR_UPDATE: &str = "
SELECT state, retired_by, retired_at
FROM {{schema}}.lifecycle_consumers
WHERE project_id = $1 AND consumer_id = $2
FOR UPDATE";

/// Retires an active consumer: `$1` project, `$2` consumer, `$3` operator, `$4` reason.
/// The lease columns stay as they are: the holder finds out at its next fenced write (every
/// one requires `state = 'active'`) and the operator can see whom that concerns. Whether the
/// lease is live is read from the cursors view, which adds the lease's renewals to the row
/// (migration 0012).
const RETIRE: &str = "
UPDATE {{schema}}.lifecycle_consumers AS c
SET state = 'retired', retired_at = now(), retired_by = $3, retired_reason = $4
WHERE c.project_id = $1 AND c.consumer_id = $2 AND c.state = 'active'
RETURNING c.retired_at, c.lease_owner, c.lease_generation,
          COALESCE((SELECT v.lease_owner IS NOT NULL AND v.lease_expires_at > now()
                    FROM {{schema}}.lifecycle_consumer_cursors AS v
                    WHERE v.project_id = $1 AND v.consumer_id = $2), false) AS lease_live";

/// Unresolved dead letters of a consumer (dead or awaiting replay): `$1` project,
/// `$2` consumer.
const UNRESOLVED_COUNT: &str = "
SELECT count(*) AS unresolved
FROM {{schema}}.lifecycle_deliveries
WHERE project_id = $1 AND consumer_id = $2 AND state IN ('dead', 'replay_requested')";
