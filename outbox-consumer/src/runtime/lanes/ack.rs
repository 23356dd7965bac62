//! The lanes' acknowledgement: the prefix of the window every event of which is handled or
//! parked, the handler's `before_ack_prefix` over the events it handled, and the write that
//! moves the cursor, records how far the lanes have handled beyond it and deletes the
//! receipts it passes.

use super::window::{Prefix, Window};
use crate::dispatch::{DispatchMode, triage};
use crate::error::ConsumerError;
use crate::event::ObservedEvent;
use crate::handler::Reconciler;
use crate::lease::Lease;
use crate::runtime::Consumer;
use crate::runtime::position::Handled;
use crate::runtime::progress::Progress;
use crate::store::{self, Held, Statements};
use tokio::time::Instant;

impl<D: DispatchMode, R: Reconciler> Consumer<D, R> {
    /// Acknowledges the window's prefix: the handler's `before_ack_prefix` first, then the
    /// cursor moves to the prefix's last event in the single lane's acknowledgement. `false`
    /// when `before_ack_prefix` failed: the window must start over from the cursor.
    pub(super) async fn ack_prefix(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        window: &mut Window,
    ) -> Result<bool, ConsumerError> {
        let Some(ack) = self.begin_ack(lease, statements, progress, window).await? else {
            return Ok(false);
        };
        if let Some(ack) = ack {
            self.write_lane_ack(lease, statements, ack).await?;
            finish_ack(progress, window);
        }
        Ok(true)
    }

    /// The acknowledgement's write: the cursor to the prefix's last event, with how far the
    /// lanes have handled beyond it, and the receipts it passes deleted.
    pub(super) async fn write_lane_ack(
        &self,
        lease: &Lease,
        statements: &Statements,
        ack: Ack,
    ) -> Result<(), ConsumerError> {
        let client = self.pool.get().await?;
        let clears_retry = ack.held.is_some_and(|held| held <= ack.last);
        store::lane_ack(
            &client,
            statements,
            lease,
            ack.left_at,
            ack.last,
            ack.handled_through.max(ack.last),
            clears_retry,
        )
        .await
    }

    /// The first half of an acknowledgement: the prefix taken from the window, the handler's
    /// `before_ack_prefix`, the prefix recorded as handled in the position. `None` when
    /// `before_ack_prefix` failed (the window must start over); `Some(None)` with no prefix.
    pub(super) async fn begin_ack(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        window: &mut Window,
    ) -> Result<Option<Option<Ack>>, ConsumerError> {
        let count = window.prefix();
        let Some(Prefix {
            handled,
            last,
            identity,
            failed_before,
        }) = window.take_prefix(count)
        else {
            return Ok(Some(None));
        };
        // The handler sees the events it handled, as with one lane: those of undeclared
        // types, which passed without a call, are left out.
        let seen: Option<Vec<ObservedEvent>> =
            handled.iter().any(|event| self.skips(event)).then(|| {
                handled
                    .iter()
                    .filter(|event| !self.skips(event))
                    .cloned()
                    .collect()
            });
        let seen = seen.as_deref().unwrap_or(&handled);
        if !seen.is_empty() {
            if let Err(partial) = self.dispatch.before_lanes_ack(seen).await {
                self.partial_ack(lease, statements, progress, window, seen, partial)
                    .await?;
                return Ok(None);
            }
        }
        if let Some(sequence) = failed_before {
            // The acknowledgement clears the saved retry state it passes (as when the held
            // event of the single lane is acknowledged).
            progress.position.hold(Some(Held {
                sequence,
                attempts: 0,
                ready_at: Instant::now(),
            }));
        }
        progress.position.handled_through(Handled {
            last,
            identity,
            count: handled.len() as u64,
        });
        Ok(Some(Some(Ack {
            left_at: progress.position.cursor().unwrap_or(window.cursor()),
            last,
            held: progress.position.held_sequence(),
            count,
            handled_through: window.handled_through(),
        })))
    }

    /// The handler's `before_ack_prefix` made only the first `durable` events of `seen` (the
    /// prefix's events it handled) durable: as with one lane, the cursor moves up to the
    /// failed one (every event before it in the prefix is handled, parked or passed, and the
    /// handled ones are durable), the failure is charged to it, and the lanes start over from
    /// the cursor (what follows it is delivered again: at least once).
    async fn partial_ack(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        window: &Window,
        seen: &[ObservedEvent],
        partial: crate::handler::PartialAck,
    ) -> Result<(), ConsumerError> {
        let failed = &seen[partial.durable.min(seen.len() - 1)];
        let class = triage(partial.failure)?;
        let cursor = progress.position.cursor().unwrap_or(0);
        let before = failed.sequence - 1;
        if before > cursor {
            // The event right before the failed one is in the prefix: handled (its identity is
            // in `seen`), or parked or passed (read from the database, a rare path).
            let identity = match seen.iter().find(|e| e.sequence == before) {
                Some(event) => Some(event.event_id.clone()),
                None => {
                    let client = self.pool.get().await?;
                    store::event_at(
                        &**client,
                        statements,
                        self.config.project_id.as_str(),
                        before,
                    )
                    .await?
                }
            };
            if let Some(identity) = identity {
                progress.position.handled_through(Handled {
                    last: before,
                    identity,
                    count: partial.durable as u64,
                });
                let client = self.pool.get().await?;
                let held = progress.position.held_sequence();
                store::lane_ack(
                    &client,
                    statements,
                    lease,
                    cursor,
                    before,
                    window.handled_through().max(before),
                    held.is_some_and(|held| held <= before),
                )
                .await?;
                if let Some(handled) = progress.position.take_handled() {
                    progress.advance(handled);
                }
            }
        }
        if let Some(class) = class {
            self.record_lane_failure(lease, statements, progress, failed, class)
                .await?;
        }
        Ok(())
    }
}

/// An acknowledgement begun: its write's arguments, and how many events it covers (they still
/// count against `max_ahead` until it is written).
pub(super) struct Ack {
    pub(super) left_at: i64,
    pub(super) last: i64,
    pub(super) held: Option<i64>,
    pub(super) count: usize,
    /// The highest sequence handled or parked beyond the cursor, recorded with it.
    pub(super) handled_through: i64,
}

/// The second half of an acknowledgement, once written: the position and the metrics.
pub(super) fn finish_ack(progress: &mut Progress, window: &Window) {
    if let Some(handled) = progress.position.take_handled() {
        progress.advance(handled);
    }
    progress.meters.ahead_of_cursor(window.settled());
}
