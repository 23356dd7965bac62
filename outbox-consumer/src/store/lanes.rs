//! The statements only lanes run: their acknowledgement, which records how far they handled
//! beyond the cursor, and the receipts of a transactional handler with lanes (migration 0018).

use std::collections::HashSet;

use outbox_core::internal::Unnamed as _;
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Transaction};

use super::{Statements, rejected};
use crate::error::ConsumerError;
use crate::lease::Lease;

/// Moves the cursor from `left_at` to `last` (or leaves it, `last` = `left_at`) and records
/// `handled_through`, the highest sequence handled or parked beyond it; clears retry state it
/// passes when `clears_retry`, and the receipts it passes always. Conditional on the
/// database's cursor standing at `left_at`, as every acknowledgement.
pub(crate) async fn lane_ack(
    client: &deadpool_postgres::Client,
    statements: &Statements,
    lease: &Lease,
    left_at: i64,
    last: i64,
    handled_through: i64,
    clears_retry: bool,
) -> Result<(), ConsumerError> {
    let [p, c, o, g] = lease.fence.params();
    let acked: i64 = client
        .query_typed_one(
            &statements.lane_ack,
            &[
                (p, Type::TEXT),
                (c, Type::TEXT),
                (o, Type::TEXT),
                (g, Type::INT8),
                (&last, Type::INT8),
                (&left_at, Type::INT8),
                (&handled_through, Type::INT8),
                (&clears_retry, Type::BOOL),
            ],
        )
        .await?
        .try_get("acked")?;
    if acked != 1 {
        return rejected(&***client, statements, lease, left_at, last).await;
    }
    Ok(())
}

/// Locks the consumer row in share mode for a lane's handler transaction, if the lease is
/// still ours: the lanes' transactions do not wait for each other, a takeover waits for them.
pub(crate) async fn lock_fence_shared(
    tx: &Transaction<'_>,
    statements: &Statements,
    lease: &Lease,
) -> Result<(), ConsumerError> {
    let [p, c, o, g] = lease.fence.params();
    let idle_limit = lease.idle_limit_ms();
    if tx
        .query_opt_unnamed(&statements.lock_fence_shared, &[p, c, o, g, &idle_limit])
        .await?
        .is_none()
    {
        return Err(lease.lose_after_rejection(tx).await);
    }
    Ok(())
}

/// Records in `tx` that event `sequence` was handled above the cursor.
pub(crate) async fn insert_receipt(
    tx: &Transaction<'_>,
    statements: &Statements,
    lease: &Lease,
    sequence: i64,
) -> Result<(), ConsumerError> {
    tx.execute_unnamed(
        &statements.insert_receipt,
        &[&lease.fence.project, &lease.fence.consumer, &sequence],
    )
    .await?;
    Ok(())
}

/// The events above `cursor` with a receipt: handled by an earlier run.
pub(crate) async fn load_receipts(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    lease: &Lease,
    cursor: i64,
) -> Result<HashSet<i64>, ConsumerError> {
    let rows = client
        .query_unnamed(
            &statements.lane_receipts,
            &[&lease.fence.project, &lease.fence.consumer, &cursor],
        )
        .await?;
    rows.iter()
        .map(|row| Ok(row.try_get("sequence")?))
        .collect()
}
