//! Fenced reads and writes of consumer state. Every write names the lease; a write that
//! changes nothing means the lease is gone, and the lease is marked lost on the spot.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::admin::{AuditLog, AuditRecord};
use outbox_core::{
    AuditKind, ConsumerId, PayloadText, Pooler, Prior, ProjectId, Schema, Unnamed as _,
};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row, Transaction};

use crate::error::ConsumerError;
use crate::event::{EventPayload, FailureClass, HandlerFailure, ObservedEvent};
use crate::lease::Lease;
use crate::sql;

mod lanes;
mod position;
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

/// A decoded event and, if its payload is undecodable, the failure class it fails with.
pub(crate) type Decoded = (ObservedEvent, Option<FailureClass>);

/// What a read found after the cursor.
pub(crate) struct Batch {
    /// Events after the cursor in sequence order (contiguity is the caller's check).
    pub events: Vec<Decoded>,
    /// Whether more may follow at once (a full batch), so the caller reads again without
    /// waiting for a wake-up.
    pub full: bool,
    /// When the connection it was read on was opened: one opened after the last identity
    /// check may reach another server (a promoted standby), so the check runs again first.
    pub connected_at: std::time::Instant,
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
    let Some(row) = row else {
        return Ok(None);
    };
    let attempts: i32 = row.try_get("attempts")?;
    let wait: f64 = row.try_get("wait")?;
    Ok(Some(Held {
        sequence: row.try_get("sequence")?,
        attempts: attempts.max(0) as u32,
        ready_at: tokio::time::Instant::now() + Duration::from_secs_f64(wait.max(0.0)),
    }))
}

/// Refuses a declaration of event types that names one the registry does not hold (the
/// default, `task:deleted@1`, is registered by the schema itself and not looked up).
pub(crate) async fn check_declared(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    types: &outbox_core::EventTypes,
) -> Result<(), ConsumerError> {
    if types.is_default() {
        return Ok(());
    }
    let rows = client.query_unnamed(&statements.contracts, &[]).await?;
    let registered: Vec<(String, i32)> = rows
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()?;
    for r in types.refs() {
        let known = registered.iter().any(|(t, major)| {
            t == r.event_type.as_str() && i64::from(*major) == i64::from(r.major)
        });
        if !known {
            return Err(crate::config::ConfigError(format!(
                "event type {r} is not registered (see outbox contracts list; register it \
                 with outbox contracts add)"
            ))
            .into());
        }
    }
    Ok(())
}

/// Loads the deliveries in `(cursor, through]`: each with its failed attempts so far and when
/// the next is due, and whether it is retrying (`false`: parked ahead of the cursor).
pub(crate) async fn load_retries(
    client: &(impl GenericClient + Sync),
    statements: &Statements,
    lease: &Lease,
    cursor: i64,
    through: i64,
) -> Result<Vec<(Held, bool)>, ConsumerError> {
    let rows = client
        .query_unnamed(
            &statements.lane_retries,
            &[
                &lease.fence.project,
                &lease.fence.consumer,
                &cursor,
                &through,
            ],
        )
        .await?;
    let now = tokio::time::Instant::now();
    rows.iter()
        .map(|row| {
            let attempts: i32 = row.try_get("attempts")?;
            let wait: f64 = row.try_get("wait")?;
            let held = Held {
                sequence: row.try_get("sequence")?,
                attempts: attempts.max(0) as u32,
                ready_at: now + Duration::from_secs_f64(wait.max(0.0)),
            };
            Ok((held, row.try_get("retrying")?))
        })
        .collect()
}

/// Decodes an event row: one that starts with `sql::event_columns!()`, read by position in
/// that order (`REPLAY_REQUESTED` adds `attempts` after them). The payload is parsed from its
/// text straight into [`Prior`]. The event comes back whole even when its payload cannot be
/// decoded: then with an empty prior and the failure class `undecodable_payload`, carried far
/// enough to be failed and parked like any other failure. A missing or mistyped column is an
/// error.
pub(crate) fn decode(
    row: &Row,
    project: &ProjectId,
    consumer: &ConsumerId,
    replay: bool,
    attempt: u32,
) -> Result<(ObservedEvent, Option<FailureClass>), ConsumerError> {
    let PayloadText(stored) = row.try_get(8)?;
    let event_type: String = row.try_get(1)?;
    let deleted_at = row.try_get::<_, Option<DateTime<Utc>>>(4)?;
    let (prior, payload) = match (event_type.as_str(), deleted_at) {
        // `task:deleted` keeps its original layout (the prior state as the stored payload);
        // its contract's payload is built around it.
        (outbox_core::TASK_DELETED, Some(at)) => match serde_json::from_slice::<Prior>(stored) {
            Ok(prior) => {
                let text = format!(
                    r#"{{"deleted_at":"{}","prior":{}}}"#,
                    outbox_core::format_timestamp(at),
                    String::from_utf8_lossy(stored)
                );
                (Some(prior), EventPayload::from_json(text))
            }
            Err(_) => (None, None),
        },
        _ => (
            Some(Prior::default()),
            std::str::from_utf8(stored)
                .ok()
                .and_then(|text| EventPayload::from_json(text.to_owned())),
        ),
    };
    let undecodable = match (&prior, &payload) {
        (Some(_), Some(_)) => None,
        _ => Some(FailureClass::undecodable_payload()),
    };
    let event = ObservedEvent {
        observed: true,
        sequence: row.try_get(0)?,
        type_major: row.try_get(7)?,
        type_minor: row.try_get(9)?,
        event_type,
        event_id: row.try_get(2)?,
        task_id: row.try_get(3)?,
        deleted_at,
        writer_process_id: row.try_get(5)?,
        occurred_at: row.try_get::<_, DateTime<Utc>>(6)?,
        payload_version: row.try_get(7)?,
        project_id: project.clone(),
        consumer_id: consumer.clone(),
        prior: prior.unwrap_or_default(),
        payload: payload.unwrap_or_else(EventPayload::empty),
        traceparent: row.try_get(10)?,
        replay,
        attempt,
    };
    Ok((event, undecodable))
}

/// Saves a failed attempt: a retry at `now + delay`, or, with no delay left, parks the event
/// as a dead letter, audits it and (with `moves_cursor`: the event right after the cursor)
/// moves the cursor past it, all in one transaction. Lanes park events ahead of the cursor,
/// which then moves past them with the acknowledgement of everything before them.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn record_failure(
    client: &mut deadpool_postgres::Client,
    statements: &Statements,
    lease: &Lease,
    event: &ObservedEvent,
    attempts: u32,
    class: &FailureClass,
    delay: Option<Duration>,
    moves_cursor: bool,
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
                AuditKind::ConsumerPoisoned,
                lease,
                Some(&event.event_id),
                Some(i64::from(attempts)),
                None,
            )
            .await?;
            if moves_cursor
                && tx
                    .execute_unnamed(&statements.move_cursor, &[p, c, o, g, &event.sequence])
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

/// Saves a failed attempt that will be retried after `delay`, together with the
/// acknowledgement of the events handled before it (`through`: the new cursor, the old one
/// when none were), in one fenced statement: one round trip per failure.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn ack_and_retry(
    client: &deadpool_postgres::Client,
    statements: &Statements,
    lease: &Lease,
    left_at: i64,
    through: i64,
    event: &ObservedEvent,
    attempts: u32,
    class: &FailureClass,
    delay: Duration,
) -> Result<(), ConsumerError> {
    let [p, c, o, g] = lease.fence.params();
    let attempts = attempts as i32;
    // Typed parameters: no separate prepare, so a failure costs one round trip (and no
    // named statement, which a transaction-mode pooler could not keep).
    let delay = delay.as_secs_f64();
    let acked: i64 = client
        .query_typed_one(
            &statements.ack_and_retry,
            &[
                (p, Type::TEXT),
                (c, Type::TEXT),
                (o, Type::TEXT),
                (g, Type::INT8),
                (&through, Type::INT8),
                (&event.event_id, Type::TEXT),
                (&event.sequence, Type::INT8),
                (&attempts, Type::INT4),
                (&delay, Type::FLOAT8),
                (&class.as_str(), Type::TEXT),
                (&left_at, Type::INT8),
            ],
        )
        .await?
        .try_get("acked")?;
    if acked != 1 {
        return rejected(&***client, statements, lease, left_at, through).await;
    }
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
    let row = match result {
        Ok(()) => {
            tx.query_opt_unnamed(&statements.mark_replayed, &[p, c, &event.event_id])
                .await?
        }
        Err(failure) => {
            tx.query_opt_unnamed(
                &statements.mark_replay_failed,
                &[p, c, &event.event_id, &failure.class.as_str()],
            )
            .await?
        }
    };
    let Some(row) = row else {
        tracing::warn!(
            event_id = %event.event_id,
            "dead letter left the replay_requested state during its replay; outcome not recorded"
        );
        return Ok(());
    };
    let attempts: i32 = row.try_get("attempts")?;
    let requested_by: Option<String> = row.try_get("replay_requested_by")?;
    let kind = if result.is_ok() {
        AuditKind::ConsumerReplayed
    } else {
        AuditKind::ConsumerPoisoned
    };
    audit(
        tx,
        statements,
        kind,
        lease,
        Some(&event.event_id),
        Some(i64::from(attempts)),
        requested_by.as_deref(),
    )
    .await
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
