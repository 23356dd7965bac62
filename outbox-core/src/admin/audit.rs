//! The audit trail: who parked, replayed, resolved, retired, reactivated, reconciled or pruned
//! what. [`Admin::audit_trail`] reads it; [`AuditLog`](crate::admin::AuditLog) (in `audit_log.rs`,
//! below both the operator surface and the retention sweep) appends to it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::{Client, Row};

use super::{Admin, AdminError, Listing, check_limit, parse_state};
use crate::ids::{ConsumerId, EventId, ProjectId};
use crate::states::AuditKind;
use crate::stmt::Unnamed as _;

/// One audit row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    /// Its position in the trail.
    pub id: i64,
    /// When it was recorded.
    pub recorded_at: DateTime<Utc>,
    /// What happened.
    pub kind: AuditKind,
    /// The project.
    pub project_id: Option<String>,
    /// The consumer.
    pub consumer_id: Option<String>,
    /// The event.
    pub event_id: Option<String>,
    /// The operator, for operator actions.
    pub actor: Option<String>,
    /// Depends on the kind: attempts (`consumer-poisoned`, `consumer-replayed`,
    /// `dead-letter-resolved`, `dead-letter-replay-requested`), unresolved dead letters
    /// (`consumer-retired`), live tasks (`reconciled`), events pruned (`pruned`); none for
    /// `consumer-reactivated`.
    pub count: Option<i64>,
    /// The operator's reason (`consumer-retired`, `dead-letter-resolved`).
    pub reason: Option<String>,
    /// The contract (`task:archived@1`), for the `contract-*` kinds.
    pub contract: Option<String>,
}

impl AuditEntry {
    /// Decodes a row of [`AUDIT_TRAIL`].
    fn decode(row: &Row) -> Result<Self, AdminError> {
        Ok(Self {
            id: row.try_get("id")?,
            recorded_at: row.try_get("recorded_at")?,
            kind: parse_state(row.try_get("kind")?)?,
            project_id: row.try_get("project_id")?,
            consumer_id: row.try_get("consumer_id")?,
            event_id: row.try_get("event_id")?,
            actor: row.try_get("actor")?,
            count: row.try_get("count")?,
            reason: row.try_get("reason")?,
            contract: row.try_get("contract")?,
        })
    }
}

/// Which audit rows a listing shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only this project.
    pub project: Option<ProjectId>,
    /// Only this consumer.
    pub consumer: Option<ConsumerId>,
    /// Only these kinds; empty means all.
    pub kinds: Vec<AuditKind>,
    /// Only this event.
    pub event: Option<EventId>,
    /// Only rows recorded at or after this moment.
    pub since: Option<DateTime<Utc>>,
    /// Only rows after this one (by [`AuditEntry::id`]), for following the trail.
    pub after_id: Option<i64>,
    /// At most this many rows, newest first (`1..=MAX_LIMIT`).
    pub limit: i64,
}

impl Default for AuditFilter {
    fn default() -> Self {
        Self {
            project: None,
            consumer: None,
            kinds: Vec::new(),
            event: None,
            since: None,
            after_id: None,
            limit: 50,
        }
    }
}

impl Admin {
    /// The audit trail by filter, newest first.
    pub async fn audit_trail(
        &self,
        client: &mut Client,
        filter: &AuditFilter,
    ) -> Result<Listing<AuditEntry>, AdminError> {
        check_limit(filter.limit)?;
        let kinds: Vec<&str> = if filter.kinds.is_empty() {
            AuditKind::ALL
        } else {
            &filter.kinds
        }
        .iter()
        .map(AuditKind::as_str)
        .collect();
        let tx = Self::snapshot(client).await?;
        let rows = tx
            .query_unnamed(
                &self.audit_trail,
                &[
                    &filter.project.as_ref().map(ProjectId::as_str),
                    &filter.consumer.as_ref().map(ConsumerId::as_str),
                    &kinds,
                    &filter.event.as_ref().map(EventId::as_str),
                    &filter.since,
                    &filter.after_id,
                    &(filter.limit + 1),
                ],
            )
            .await?;
        tx.commit().await?;
        let items = rows
            .iter()
            .map(AuditEntry::decode)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Listing::cut(items, filter.limit))
    }
}

/// The audit trail, newest first: `$1` project or NULL, `$2` consumer or NULL, `$3` kinds,
/// `$4` event or NULL, `$5` earliest time or NULL, `$6` last ID already seen or NULL, `$7` row
/// limit.
pub(super) const AUDIT_TRAIL: &str = "
SELECT id, recorded_at, kind, project_id, consumer_id, event_id, actor, count, reason, contract
FROM {{schema}}.lifecycle_audit
WHERE ($1::text IS NULL OR project_id = $1)
  AND ($2::text IS NULL OR consumer_id = $2)
  AND kind = ANY($3::text[])
  AND ($4::text IS NULL OR event_id = $4)
  AND ($5::timestamptz IS NULL OR recorded_at >= $5)
  AND ($6::bigint IS NULL OR id > $6)
ORDER BY id DESC
LIMIT $7";
