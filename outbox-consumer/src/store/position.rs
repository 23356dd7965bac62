//! The database's side of the identity check (a failover or a restore can leave a process
//! standing on a position the database no longer has): the cursor, the identity it records,
//! the head, the floor and the event at a position; and the audit row written when the two
//! sides disagree.

use outbox_core::admin::AuditRecord;
use outbox_core::internal::Unnamed as _;
use outbox_core::states::AuditKind;
use tokio_postgres::GenericClient;

use super::Statements;
use crate::error::ConsumerError;
use crate::lease::Lease;

/// What the identity check compares: the database's side of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DatabasePosition {
    /// The consumer row's cursor (`None`: missing).
    pub cursor: Option<i64>,
    /// The identity the cursor records.
    pub cursor_identity: Option<String>,
    /// The project's head.
    pub head: i64,
    /// The project's retention floor.
    pub floor: i64,
    /// The identity of the retained event at the process's position, if there is one.
    pub event_at_position: Option<String>,
}

/// Reads the database's side of the identity check for a process standing at `position`.
pub(crate) async fn position_check(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    lease: &Lease,
    position: i64,
) -> Result<DatabasePosition, ConsumerError> {
    let row = client
        .query_opt_unnamed(
            &statements.position_check,
            &[&lease.fence.project, &lease.fence.consumer, &position],
        )
        .await?;
    let Some(row) = row else {
        // The consumer row is gone: the lease with it.
        return Err(lease.lose_after_rejection(client).await);
    };
    Ok(DatabasePosition {
        cursor: row.try_get("last_acked_sequence")?,
        cursor_identity: row.try_get("last_acked_event_id")?,
        head: row.try_get("head_sequence")?,
        floor: row.try_get("pruned_through")?,
        event_at_position: row.try_get("event_at_position")?,
    })
}

/// The identity of event `sequence` of `project`, if a retained event has that number.
pub(crate) async fn event_at(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    project: &str,
    sequence: i64,
) -> Result<Option<String>, ConsumerError> {
    let row = client
        .query_opt_unnamed(&statements.event_at, &[&project, &sequence])
        .await?;
    Ok(match row {
        Some(row) => Some(row.try_get("event_id")?),
        None => None,
    })
}

/// The project's head and retention floor.
pub(crate) async fn bounds(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    project: &str,
) -> Result<(i64, i64), ConsumerError> {
    let row = client
        .query_one_unnamed(&statements.bounds, &[&project])
        .await?;
    Ok((
        row.try_get("head_sequence")?,
        row.try_get("pruned_through")?,
    ))
}

/// Whether `consumer` of `project` ever had a position ([`sql::EVER_POSITIONED`]).
pub(crate) async fn ever_positioned(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    project: &str,
    consumer: &str,
) -> Result<bool, ConsumerError> {
    Ok(client
        .query_one_unnamed(&statements.ever_positioned, &[&project, &consumer])
        .await?
        .try_get("positioned")?)
}

/// Appends the `lifecycle-observation:history-diverged` row: the process's position (as the
/// count) and identity (as the event), with what the database has in `detail`.
pub(crate) async fn audit_divergence(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    lease: &Lease,
    position: i64,
    identity: Option<String>,
    detail: &str,
) -> Result<(), ConsumerError> {
    let record = AuditRecord {
        kind: AuditKind::HistoryDiverged,
        project_id: lease.fence.project.as_str(),
        consumer_id: Some(lease.fence.consumer.as_str()),
        event_id: identity.as_deref(),
        actor: None,
        count: Some(position),
        reason: Some(detail),
    };
    statements.audit.record(client, &record).await?;
    Ok(())
}
