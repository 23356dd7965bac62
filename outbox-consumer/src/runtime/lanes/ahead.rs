//! What the lanes read ahead of their window: [`Ahead`], kept between rounds, and how a read
//! joins it and its events enter the window.

use std::collections::VecDeque;

use tokio::time::Instant;

use super::window::Window;
use crate::dispatch::DispatchMode;
use crate::handler::Reconciler;
use crate::runtime::Consumer;
use crate::runtime::progress::Progress;
use crate::store::{Batch, Decoded};

/// What the lanes keep between rounds (`Progress::lanes`): the window, the events read
/// beyond it, and the read size, so that a round starts where the last one stopped rather
/// than with a fresh read of `batch_size` (a catch-up would pay one every round).
pub(in crate::runtime) struct Ahead {
    /// The events ahead of the cursor and where each stands.
    pub(super) window: Window,
    /// Events read beyond `max_ahead`, waiting for room in the window: with the reads on
    /// their way, up to `READS_AHEAD` reads of `max_batch_size`, so the next read is in memory
    /// when the lanes need it rather than asked for then (a fast handler would wait on every
    /// read). They follow the window without a hole and are counted as they enter it.
    pub(super) pending: VecDeque<Decoded>,
    /// The next read's size: doubled after a full read up to `max_batch_size`, back to
    /// `batch_size` after a short one.
    pub(super) read_size: i64,
}

impl Ahead {
    /// Whether nothing is ahead of the cursor in the window.
    pub(in crate::runtime) fn is_empty(&self) -> bool {
        self.window.is_empty()
    }

    /// When the earliest retry held in the window is due.
    pub(in crate::runtime) fn next_ready_at(&self) -> Option<Instant> {
        self.window.next_ready_at()
    }
}

/// What a read added.
pub(super) enum Taken {
    /// Its events (`full`: it came back full, more may follow).
    Events { full: bool },
    /// A hole: nothing after it is taken.
    Gap,
    /// Read over a connection opened since the position was checked: not used.
    Unchecked,
}

impl<D: DispatchMode, R: Reconciler> Consumer<D, R> {
    /// Adds a read to the events waiting for the window (`pending`): its events if they follow
    /// without a hole.
    pub(super) fn take_read(
        &self,
        progress: &mut Progress,
        window: &Window,
        pending: &mut VecDeque<Decoded>,
        batch: Batch,
    ) -> Taken {
        if batch.connected_at > progress.checked_at {
            // A connection opened since the position was checked may reach another server:
            // the round ends, and the check runs first.
            progress.bounds_checked = false;
            return Taken::Unchecked;
        }
        let full = batch.full;
        for (event, undecodable) in batch.events {
            if event.sequence != window.read_through() + pending.len() as i64 + 1 {
                if window.is_empty() && pending.is_empty() {
                    tracing::error!(
                        cursor = window.cursor(),
                        next = event.sequence,
                        "gap after the cursor in retained history"
                    );
                }
                return Taken::Gap;
            }
            pending.push_back((event, undecodable));
        }
        Taken::Events { full }
    }

    /// Moves up to `room` events waiting in `pending` into the window. They are counted here,
    /// not as they are read: what waits in `pending` when a round ends waits for the next.
    pub(super) fn admit(
        &self,
        progress: &mut Progress,
        window: &mut Window,
        pending: &mut VecDeque<Decoded>,
        room: i64,
    ) {
        if room <= 0 || pending.is_empty() {
            return;
        }
        let now = chrono::Utc::now();
        for _ in 0..room.min(pending.len() as i64) {
            let Some((event, undecodable)) = pending.pop_front() else {
                break;
            };
            let waited = (now - event.occurred_at).num_microseconds();
            progress
                .meters
                .commit_to_dispatch
                .record(waited.unwrap_or(0).max(0) as f64 / 1e6);
            // An undeclared major fails on its own and is parked at once; an undeclared type
            // passes without a call (counted as it is taken).
            let undecodable = undecodable.or_else(|| self.mismatch(&event));
            if undecodable.is_none() && self.skips(&event) {
                progress.meters.skipped.increment(1);
            }
            window.push(event, undecodable);
        }
    }
}
