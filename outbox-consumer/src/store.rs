//! Fenced reads and writes of consumer state. Every write names the lease; a write that
//! changes nothing means the lease is gone, and the lease is marked lost on the spot.

use outbox_core::Unnamed as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::{ConsumerId, Prior, ProjectId, Schema};
use tokio_postgres::{GenericClient, Row, Transaction};

use crate::error::ConsumerError;
use crate::event::{FailureClass, HandlerFailure, ObservedEvent};
use crate::lease::Lease;
use crate::sql;

/// The runtime's statements, rendered once for the schema.
#[derive(Debug)]
pub(crate) struct Statements {
    pub heartbeat: String,
    pub release: String,
    pub lock_fence: String,
    pub ack: String,
    pub record_reconciled: String,
    pub bounds: String,
    pub read_batch: String,
    pub held: String,
    pub record_retry: String,
    pub park: String,
    pub clear_passed_retries: String,
    pub replay_requested: String,
    pub mark_replayed: String,
    pub mark_replay_failed: String,
    pub audit: String,
    /// Whether the hot-path statements (batch read, acknowledgement) may be prepared once per
    /// connection and cached: only on direct connections, never behind a transaction pooler.
    pub cached: bool,
}

impl Statements {
    pub fn new(schema: &Schema) -> Self {
        Self {
            heartbeat: schema.render(sql::HEARTBEAT),
            release: schema.render(sql::RELEASE),
            lock_fence: schema.render(sql::LOCK_FENCE),
            ack: schema.render(sql::ACK),
            record_reconciled: schema.render(sql::RECORD_RECONCILED),
            bounds: schema.render(sql::PROJECT_BOUNDS),
            read_batch: schema.render(sql::READ_BATCH),
            held: schema.render(sql::HELD_DELIVERY),
            record_retry: schema.render(sql::RECORD_RETRY),
            park: schema.render(sql::PARK),
            clear_passed_retries: schema.render(sql::CLEAR_PASSED_RETRIES),
            replay_requested: schema.render(sql::REPLAY_REQUESTED),
            mark_replayed: schema.render(sql::MARK_REPLAYED),
            mark_replay_failed: schema.render(sql::MARK_REPLAY_FAILED),
            audit: schema.render(sql::AUDIT),
            cached: false,
        }
    }
}

/// Audit kinds written by the runtime.
pub(crate) const AUDIT_POISONED: &str = "lifecycle-observation:consumer-poisoned";
pub(crate) const AUDIT_REPLAYED: &str = "lifecycle-observation:consumer-replayed";
pub(crate) const AUDIT_RECONCILED: &str = "lifecycle-observation:reconciled";

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

/// Acknowledges through `sequence` in one fenced statement, or in a fenced transaction that
/// also clears saved retry state when the held event (`held`) is among them.
pub(crate) async fn ack(
    client: &mut deadpool_postgres::Client,
    statements: &Statements,
    lease: &Lease,
    held: Option<i64>,
    sequence: i64,
) -> Result<(), ConsumerError> {
    if held.is_some_and(|held| held <= sequence) {
        let tx = client.transaction().await?;
        lock_fence(&tx, statements, lease).await?;
        ack_in(&tx, statements, lease, held, sequence).await?;
        tx.commit().await?;
        return Ok(());
    }
    let [p, c, o, g] = lease.fence.params();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [p, c, o, g, &sequence];
    let acked = if statements.cached {
        let statement = client.prepare_cached(&statements.ack).await?;
        client.execute(&statement, &params).await?
    } else {
        client.execute_unnamed(&statements.ack, &params).await?
    };
    if acked != 1 {
        return Err(lease.lose_after_rejection(&***client).await);
    }
    Ok(())
}

/// Acknowledges through `sequence` inside a fenced transaction.
pub(crate) async fn ack_in(
    tx: &Transaction<'_>,
    statements: &Statements,
    lease: &Lease,
    held: Option<i64>,
    sequence: i64,
) -> Result<(), ConsumerError> {
    let [p, c, o, g] = lease.fence.params();
    if tx
        .execute_unnamed(&statements.ack, &[p, c, o, g, &sequence])
        .await?
        != 1
    {
        return Err(lease.lose_after_rejection(tx).await);
    }
    if held.is_some_and(|held| held <= sequence) {
        tx.execute_unnamed(&statements.clear_passed_retries, &[p, c, &sequence])
            .await?;
    }
    Ok(())
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
    Ok((row.get(0), row.get(1)))
}

/// An event with saved retry state, holding the cursor.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub sequence: i64,
    pub attempts: u32,
    pub ready_at: tokio::time::Instant,
}

/// Loads the retry state of the event after `cursor`, if it failed before.
pub(crate) async fn load_held(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    lease: &Lease,
    cursor: i64,
) -> Result<Option<Held>, ConsumerError> {
    let next = cursor + 1;
    let row = client
        .query_opt_unnamed(
            &statements.held,
            &[&lease.fence.project, &lease.fence.consumer, &next],
        )
        .await?;
    Ok(row.map(|row| {
        let attempts: i32 = row.get(2);
        let wait: f64 = row.get(3);
        Held {
            sequence: row.get(0),
            attempts: attempts.max(0) as u32,
            ready_at: tokio::time::Instant::now() + Duration::from_secs_f64(wait),
        }
    }))
}

/// Decodes an outbox row (columns as in `READ_BATCH`).
pub(crate) fn decode(
    row: &Row,
    project: &ProjectId,
    consumer: &ConsumerId,
    replay: bool,
    attempt: u32,
) -> Result<ObservedEvent, FailureClass> {
    let payload: serde_json::Value = row.get(8);
    let prior: Prior = serde_json::from_value(payload)
        .map_err(|_| FailureClass::new("undecodable_payload").expect("valid class"))?;
    Ok(ObservedEvent {
        observed: true,
        event_type: row.get(1),
        project_id: project.clone(),
        consumer_id: consumer.clone(),
        sequence: row.get(0),
        event_id: row.get(2),
        task_id: row.get(3),
        deleted_at: row.get::<_, DateTime<Utc>>(4),
        origin_writer: row.get(5),
        occurred_at: row.get::<_, DateTime<Utc>>(6),
        payload_version: row.get(7),
        prior,
        replay,
        attempt,
    })
}

/// Saves a failed attempt: a retry at `now + delay`, or, with no delay left, parks the event
/// as a dead letter, audits it and moves the cursor past it, all in one transaction.
pub(crate) async fn record_failure(
    client: &mut deadpool_postgres::Client,
    statements: &Statements,
    lease: &Lease,
    event: &ObservedEvent,
    attempts: u32,
    class: &FailureClass,
    delay: Option<Duration>,
) -> Result<(), ConsumerError> {
    let tx = client.transaction().await?;
    lock_fence(&tx, statements, lease).await?;
    let [p, c, o, g] = lease.fence.params();
    let attempts_i32 = attempts as i32;
    match delay {
        Some(delay) => {
            tx.execute_unnamed(
                &statements.record_retry,
                &[
                    p,
                    c,
                    &event.event_id,
                    &event.sequence,
                    &attempts_i32,
                    &delay.as_secs_f64(),
                    &class.as_str(),
                ],
            )
            .await?;
        }
        None => {
            tx.execute_unnamed(
                &statements.park,
                &[
                    p,
                    c,
                    &event.event_id,
                    &event.sequence,
                    &attempts_i32,
                    &class.as_str(),
                ],
            )
            .await?;
            audit(
                &*tx,
                statements,
                AUDIT_POISONED,
                lease,
                Some(&event.event_id),
                Some(i64::from(attempts)),
            )
            .await?;
            if tx
                .execute_unnamed(&statements.ack, &[p, c, o, g, &event.sequence])
                .await?
                != 1
            {
                return Err(lease.lose_after_rejection(&*tx).await);
            }
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Records a replay's outcome inside a fenced transaction.
pub(crate) async fn record_replay(
    tx: &Transaction<'_>,
    statements: &Statements,
    lease: &Lease,
    event: &ObservedEvent,
    result: &Result<(), HandlerFailure>,
) -> Result<(), ConsumerError> {
    let [p, c, _, _] = lease.fence.params();
    // The operator may have resolved the letter meanwhile: then nothing is recorded.
    let attempts: Option<i32> = match result {
        Ok(()) => tx
            .query_opt_unnamed(&statements.mark_replayed, &[p, c, &event.event_id])
            .await?
            .map(|row| row.get(0)),
        Err(failure) => tx
            .query_opt_unnamed(
                &statements.mark_replay_failed,
                &[p, c, &event.event_id, &failure.class.as_str()],
            )
            .await?
            .map(|row| row.get(0)),
    };
    let Some(attempts) = attempts else {
        tracing::warn!(
            event_id = %event.event_id,
            "dead letter left the replay_requested state during its replay; outcome not recorded"
        );
        return Ok(());
    };
    let kind = if result.is_ok() {
        AUDIT_REPLAYED
    } else {
        AUDIT_POISONED
    };
    audit(
        tx,
        statements,
        kind,
        lease,
        Some(&event.event_id),
        Some(i64::from(attempts)),
    )
    .await
}

/// Appends an audit row for this consumer.
pub(crate) async fn audit(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    kind: &str,
    lease: &Lease,
    event_id: Option<&str>,
    count: Option<i64>,
) -> Result<(), ConsumerError> {
    client
        .execute_unnamed(
            &statements.audit,
            &[
                &kind,
                &lease.fence.project,
                &lease.fence.consumer,
                &event_id,
                &None::<String>,
                &count,
            ],
        )
        .await?;
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
        &statements.ack
    };
    tx.execute_unnamed(statement, &[p, c, o, g, &cursor])
        .await?;
    tx.execute_unnamed(&statements.clear_passed_retries, &[p, c, &cursor])
        .await?;
    if let Some(live) = reconciled {
        audit(&*tx, statements, AUDIT_RECONCILED, lease, None, Some(live)).await?;
    }
    tx.commit().await?;
    Ok(())
}
