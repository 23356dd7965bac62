//! The read phase: the batch after the cursor, fetched alone or through the consumer set,
//! then checked for contiguity.

use super::Consumer;
use super::fetch::{Fetched, ReadAfter};
use super::position::Read;
use super::progress::Progress;
use crate::error::ConsumerError;
use crate::event::{FailureClass, ObservedEvent};
use crate::store::Statements;
use outbox_core::contract::Acceptance;

impl<D, R> Consumer<D, R> {
    /// `contract_mismatch` for an event of a declared type in a major the consumer did not
    /// declare.
    pub(super) fn mismatch(&self, event: &ObservedEvent) -> Option<FailureClass> {
        let types = &self.config.delivery.event_types;
        (types.accept(&event.event_type, event.type_major) == Acceptance::Mismatch)
            .then(FailureClass::contract_mismatch)
    }

    /// Whether `event` is of a type the consumer did not declare: it passes without a call.
    pub(super) fn skips(&self, event: &ObservedEvent) -> bool {
        let types = &self.config.delivery.event_types;
        types.accept(&event.event_type, event.type_major) == Acceptance::Skip
    }

    /// Read and decode: the contiguous run of events after `cursor`, up to the first
    /// undecodable one; `more` when the loop should go round again at once (after a full
    /// batch, one cut short, or one read ahead, which may predate events numbered since).
    /// `None` when the read came over a connection opened since the position was last
    /// checked: it may reach another server, so nothing of it is dispatched before the
    /// check runs again.
    pub(super) async fn read_batch(
        &self,
        statements: &Statements,
        progress: &mut Progress,
        cursor: i64,
    ) -> Result<Option<(Read, bool)>, ConsumerError> {
        let request = ReadAfter {
            pool: &self.pool,
            statements,
            config: &self.config,
            cursor,
        };
        let Fetched { batch, read_ahead } = self
            .membership
            .read(request, &mut progress.prefetched)
            .await?;
        // The database answered (this read, or the shared one it came from).
        self.config.duties.availability.reached();
        if batch.connected_at > progress.checked_at {
            progress.bounds_checked = false;
            return Ok(None);
        }
        let mut decoded = batch.events;
        // An event of a declared type in an undeclared major fails on its own, like an
        // undecodable one, and is parked at once.
        for (event, class) in decoded.iter_mut().filter(|(_, class)| class.is_none()) {
            *class = self.mismatch(event);
        }
        let read = progress.position.contiguous(cursor, decoded);
        let Read::Events { events, cut_short } = &read else {
            return Ok(Some((read, false)));
        };
        // Writer's transaction start to dispatch (which follows this read), on this host's
        // clock, read once for the batch. Retries and events kept across a retry wait are not
        // counted again.
        let now = chrono::Utc::now();
        for event in events.iter().filter(|e| e.attempt == 1) {
            let waited = (now - event.occurred_at).num_microseconds();
            progress
                .meters
                .commit_to_dispatch
                .record(waited.unwrap_or(0).max(0) as f64 / 1e6);
        }
        let more = batch.full || *cut_short || read_ahead;
        Ok(Some((read, more)))
    }
}
