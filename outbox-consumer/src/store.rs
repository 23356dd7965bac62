//! Fenced reads and writes of consumer state. Every write names the lease; a write that
//! changes nothing means the lease is gone, and the lease is marked lost on the spot.
//!
//! Here: the statements rendered once, the fence's lock, acknowledgements, audit rows and
//! moving the cursor; reading and decoding events in `events`, failed deliveries in
//! `failures`, the database's side of the identity check in `position`.

use outbox_core::Schema;
use outbox_core::admin::{AuditLog, AuditRecord};
use outbox_core::connect::Pooler;
use outbox_core::internal::Unnamed as _;
use outbox_core::states::AuditKind;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row, Transaction};

use crate::error::ConsumerError;
use crate::lease::Lease;
use crate::sql;

mod events;
mod failures;
mod lanes;
mod position;
pub(crate) use events::{Batch, Decoded, check_declared, decode};
pub(crate) use failures::{
    Held, ack_and_retry, load_held, load_retries, record_failure, record_replay,
};
pub(crate) use lanes::{insert_receipt, lane_ack, load_receipts, lock_fence_shared};
pub(crate) use position::{
    DatabasePosition, audit_divergence, bounds, event_at, ever_positioned, position_check,
};

/// The runtime's statements, rendered once for the schema.
#[derive(Debug)]
pub(crate) struct Statements {
    pub heartbeat: String,
    pub release: String,
    pub lock_fence: String,
    pub ack: String,
    pub move_cursor: String,
    pub has_unsequenced: String,
    pub record_reconciled: String,
    pub bounds: String,
    pub ever_positioned: String,
    pub read_batch: String,
    pub held: String,
    /// Every registered contract's type and major.
    pub contracts: String,
    pub lane_retries: String,
    pub record_retry: String,
    pub park: String,
    pub clear_passed_retries: String,
    pub replay_requested: String,
    pub mark_replayed: String,
    pub mark_replay_failed: String,
    pub ack_clearing: String,
    pub ack_and_retry: String,
    pub lock_fence_shared: String,
    pub insert_receipt: String,
    pub lane_receipts: String,
    pub lane_ack: String,
    pub position_check: String,
    pub event_at: String,
    pub cursor_under_lease: String,
    pub audit: AuditLog,
    /// Whether the hot-path statements (batch read, acknowledgement) may be prepared once per
    /// connection and cached: only on direct connections, never behind a transaction pooler.
    pub cached: bool,
}

impl Statements {
    pub fn new(schema: &Schema, pooler: Pooler) -> Self {
        Self {
            heartbeat: schema.render(sql::HEARTBEAT),
            release: schema.render(sql::RELEASE),
            lock_fence: schema.render(sql::LOCK_FENCE),
            ack: schema.render(sql::ACK),
            move_cursor: schema.render(sql::MOVE_CURSOR),
            has_unsequenced: schema.render(sql::HAS_UNSEQUENCED),
            record_reconciled: schema.render(sql::RECORD_RECONCILED),
            bounds: schema.render(sql::PROJECT_BOUNDS),
            ever_positioned: schema.render(sql::EVER_POSITIONED),
            read_batch: schema.render(sql::READ_BATCH),
            held: schema.render(sql::HELD_DELIVERY),
            contracts: schema.render(sql::CONTRACTS),
            lane_retries: schema.render(sql::LANE_RETRIES),
            record_retry: schema.render(sql::RECORD_RETRY),
            park: schema.render(sql::PARK),
            clear_passed_retries: schema.render(sql::CLEAR_PASSED_RETRIES),
            replay_requested: schema.render(sql::REPLAY_REQUESTED),
            mark_replayed: schema.render(sql::MARK_REPLAYED),
            mark_replay_failed: schema.render(sql::MARK_REPLAY_FAILED),
            ack_clearing: schema.render(sql::ACK_CLEARING),
            ack_and_retry: schema.render(sql::ACK_AND_RETRY),
            lock_fence_shared: schema.render(sql::LOCK_FENCE_SHARED),
            insert_receipt: schema.render(sql::INSERT_RECEIPT),
            lane_receipts: schema.render(sql::LANE_RECEIPTS),
            lane_ack: schema.render(sql::LANE_ACK),
            position_check: schema.render(sql::POSITION_CHECK),
            event_at: schema.render(sql::EVENT_AT),
            cursor_under_lease: schema.render(sql::CURSOR_UNDER_LEASE),
            audit: AuditLog::new(schema),
            cached: pooler == Pooler::None,
        }
    }
}

/// Locks the consumer row for the transaction if the lease is still ours.
pub(crate) async fn lock_fence(
    tx: &Transaction<'_>,
    statements: &Statements,
    lease: &Lease,
) -> Result<(), ConsumerError> {
    let [p, c, o, g] = lease.fence.params();
    let idle_limit = lease.idle_limit_ms();
    if tx
        .query_opt_unnamed(&statements.lock_fence, &[p, c, o, g, &idle_limit])
        .await?
        .is_none()
    {
        return Err(lease.lose_after_rejection(tx).await);
    }
    Ok(())
}

/// Acknowledges through `sequence` in one fenced statement, which also clears saved retry
/// state when the held event (`held`) is among them. Conditional on the database's cursor
/// still standing at `left_at`, where this process left it.
pub(crate) async fn ack(
    client: &mut deadpool_postgres::Client,
    statements: &Statements,
    lease: &Lease,
    held: Option<i64>,
    left_at: i64,
    sequence: i64,
) -> Result<(), ConsumerError> {
    let [p, c, o, g] = lease.fence.params();
    if held.is_some_and(|held| held <= sequence) {
        let acked: i64 = client
            .query_typed_one(
                &statements.ack_clearing,
                &[
                    (p, Type::TEXT),
                    (c, Type::TEXT),
                    (o, Type::TEXT),
                    (g, Type::INT8),
                    (&sequence, Type::INT8),
                    (&left_at, Type::INT8),
                ],
            )
            .await?
            .try_get("acked")?;
        if acked != 1 {
            return rejected(&***client, statements, lease, left_at, sequence).await;
        }
        return Ok(());
    }
    let params: [&(dyn ToSql + Sync); 6] = [p, c, o, g, &sequence, &left_at];
    let acked = if statements.cached {
        let statement = client.prepare_cached(&statements.ack).await?;
        client.execute(&statement, &params).await?
    } else {
        client.execute_unnamed(&statements.ack, &params).await?
    };
    if acked != 1 {
        return rejected(&***client, statements, lease, left_at, sequence).await;
    }
    Ok(())
}

/// Why a conditional acknowledgement from `left_at` through `through` changed nothing. The
/// cursor already at `through` under a lease that is still ours is this process's own
/// acknowledgement, sent before and committed although its answer was lost (the connection
/// died with it): `Ok`. Elsewhere, the cursor moved ([`ConsumerError::CursorMoved`], which
/// the position check then examines); without the lease, the lease is lost.
pub(crate) async fn rejected(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    lease: &Lease,
    left_at: i64,
    through: i64,
) -> Result<(), ConsumerError> {
    let [p, c, o, g] = lease.fence.params();
    let row = client
        .query_opt_unnamed(&statements.cursor_under_lease, &[p, c, o, g])
        .await?;
    let Some(row) = row else {
        return Err(lease.lose_after_rejection(client).await);
    };
    let found: Option<i64> = row.try_get("last_acked_sequence")?;
    if found == Some(through) {
        return Ok(());
    }
    Err(ConsumerError::CursorMoved { left_at, found })
}

/// Runs one of the hot path's queries (batch reads, grouped acknowledgements): prepared once
/// per pooled connection when `cached` (direct connections), sent unnamed otherwise (behind a
/// transaction pooler a prepared statement does not survive).
pub(crate) async fn query_hot(
    client: &deadpool_postgres::Client,
    cached: bool,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    if cached {
        let statement = client.prepare_cached(sql).await?;
        client.query(&statement, params).await
    } else {
        client.query_unnamed(sql, params).await
    }
}

/// Acknowledges through event `sequence` inside a fenced transaction, conditional on the
/// cursor standing at `left_at`: right before it, or before the events of undeclared types
/// that passed since (events are dispatched contiguously after the cursor).
pub(crate) async fn ack_in(
    tx: &Transaction<'_>,
    statements: &Statements,
    lease: &Lease,
    held: Option<i64>,
    left_at: i64,
    sequence: i64,
) -> Result<(), ConsumerError> {
    let [p, c, o, g] = lease.fence.params();
    if tx
        .execute_unnamed(&statements.ack, &[p, c, o, g, &sequence, &left_at])
        .await?
        != 1
    {
        return Err(
            match rejected(tx, statements, lease, left_at, sequence).await {
                // Inside this transaction the cursor already at `sequence` is an earlier
                // transaction's: this one's effects are rolled back, and the check that follows
                // takes the database's cursor.
                Ok(()) => ConsumerError::CursorMoved {
                    left_at,
                    found: Some(sequence),
                },
                Err(e) => e,
            },
        );
    }
    if held.is_some_and(|held| held <= sequence) {
        tx.execute_unnamed(&statements.clear_passed_retries, &[p, c, &sequence])
            .await?;
    }
    Ok(())
}

/// Appends an audit row for this consumer. The runtime acts as no operator; `actor` names
/// the operator its action answers (who asked for a replay), if any.
pub(crate) async fn audit(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    kind: AuditKind,
    lease: &Lease,
    event_id: Option<&str>,
    count: Option<i64>,
    actor: Option<&str>,
) -> Result<(), ConsumerError> {
    let record = AuditRecord {
        kind,
        project_id: lease.fence.project.as_str(),
        consumer_id: Some(lease.fence.consumer.as_str()),
        event_id,
        actor,
        count,
        reason: None,
    };
    statements.audit.record(client, &record).await?;
    Ok(())
}

/// Moves the cursor to `head` after a reconciliation (or to the floor for an earliest start,
/// with `reconciled` false), clearing retry state the cursor passed.
pub(crate) async fn set_cursor(
    client: &mut deadpool_postgres::Client,
    statements: &Statements,
    lease: &Lease,
    cursor: i64,
    reconciled: Option<i64>,
) -> Result<(), ConsumerError> {
    let tx = client.transaction().await?;
    lock_fence(&tx, statements, lease).await?;
    let [p, c, o, g] = lease.fence.params();
    let statement = if reconciled.is_some() {
        &statements.record_reconciled
    } else {
        &statements.move_cursor
    };
    tx.execute_unnamed(statement, &[p, c, o, g, &cursor])
        .await?;
    tx.execute_unnamed(&statements.clear_passed_retries, &[p, c, &cursor])
        .await?;
    if let Some(live) = reconciled {
        audit(
            &*tx,
            statements,
            AuditKind::Reconciled,
            lease,
            None,
            Some(live),
            None,
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
