//! Replay requests: dead letters an operator asked to deliver again, dispatched outside the
//! stream's order and recorded as replayed or still parked.

use tokio_util::sync::CancellationToken;

use outbox_core::internal::Unnamed as _;

use super::Consumer;
use crate::dispatch::{DispatchContext, DispatchMode};
use crate::error::ConsumerError;
use crate::event::FailureClass;
use crate::handler::Reconciler;
use crate::lease::Lease;
use crate::store::{self, Statements};
use outbox_core::contract::Acceptance;

impl<D: DispatchMode, R: Reconciler> Consumer<D, R> {
    /// Re-dispatches dead letters an operator asked to replay.
    pub(super) async fn replay_requested(
        &self,
        lease: &Lease,
        statements: &Statements,
        shutdown: &CancellationToken,
    ) -> Result<(), ConsumerError> {
        let project = &self.config.project_id;
        let consumer = &self.config.consumer_id;
        let rows = {
            let client = self.pool.get().await?;
            client
                .query_unnamed(
                    &statements.replay_requested,
                    &[&project.as_str(), &consumer.as_str()],
                )
                .await?
        };
        // Replays never reach the skip (one event at a time, decided below), but the context
        // carries the counter all the same.
        let skipped = metrics::counter!(crate::metric::EVENTS_SKIPPED.name,
            "project" => project.to_string(), "consumer" => consumer.to_string());
        let ctx = DispatchContext {
            pool: &self.pool,
            lease,
            statements,
            shutdown,
            grace: self.config.delivery.shutdown_grace,
            held_sequence: None,
            event_types: &self.config.delivery.event_types,
            skipped: &skipped,
        };
        for row in rows {
            if !lease.is_valid() || shutdown.is_cancelled() {
                break;
            }
            let attempts: i32 = row.try_get("attempts")?;
            let attempt = attempts.max(0) as u32 + 1;
            let (event, undecodable) = store::decode(&row, project, consumer, true, attempt)?;
            let acceptance = self
                .config
                .delivery
                .event_types
                .accept(&event.event_type, event.type_major);
            let class = match acceptance {
                Acceptance::Mismatch => Some(FailureClass::contract_mismatch()),
                _ => None,
            };
            if acceptance == Acceptance::Skip && undecodable.is_none() {
                // A dead letter of a type this consumer no longer declares: it would pass the
                // stream without a call, so the replay does too.
                let mut client = self.pool.get().await?;
                let tx = client.transaction().await?;
                store::lock_fence(&tx, statements, lease).await?;
                store::record_replay(&tx, statements, lease, &event, &Ok(())).await?;
                tx.commit().await?;
                tracing::info!(event_id = %event.event_id, event_type = %event.event_type,
                    "dead letter of an undeclared type marked replayed without a handler call");
                continue;
            }
            if let Some(class) = undecodable.or(class) {
                let mut client = self.pool.get().await?;
                let tx = client.transaction().await?;
                store::lock_fence(&tx, statements, lease).await?;
                store::record_replay(&tx, statements, lease, &event, &Err(class.into())).await?;
                tx.commit().await?;
                continue;
            }
            match self.dispatch.replay(&ctx, &event).await? {
                Some(Ok(())) => tracing::info!(event_id = %event.event_id, "dead letter replayed"),
                Some(Err(f)) => tracing::warn!(
                    event_id = %event.event_id, class = %f.class,
                    "replay failed; the dead letter stays parked"
                ),
                None => break,
            }
        }
        Ok(())
    }
}
