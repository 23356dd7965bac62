//! Failed deliveries: the retry state that holds the cursor (or, with lanes, keys ahead of it),
//! a failed attempt saved for its retry or parked as a dead letter, and a replay's outcome.

use std::time::Duration;

use outbox_core::internal::Unnamed as _;
use outbox_core::states::AuditKind;
use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Transaction};

use super::{Statements, audit, lock_fence, rejected};
use crate::error::ConsumerError;
use crate::event::{FailureClass, HandlerFailure, ObservedEvent};
use crate::lease::Lease;

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
