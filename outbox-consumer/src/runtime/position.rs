//! Where a run stands in its project's stream: the cursor, the failed event holding it, the
//! handled prefix not yet acknowledged, and the rest of a batch kept across a retry wait.
//!
//! Everything here is a pure decision over that state (no database, no clock beyond what a
//! [`Held`] carries), so the rules that keep delivery in order are tested on their own.

use crate::event::{FailureClass, ObservedEvent};
use crate::store::{Decoded, Held};

/// Events handled by this run whose acknowledgement is still to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Handled {
    /// The last of them.
    pub last: i64,
    /// The last one's event ID: the cursor's identity once they are acknowledged.
    pub identity: String,
    /// How many.
    pub count: u64,
}

/// A run's place in the stream.
#[derive(Debug, Default)]
pub(super) struct Position {
    /// Last acknowledged sequence; `None` while missing.
    cursor: Option<i64>,
    /// The event ID of the event at the cursor, as this process knows it (`None` when it
    /// knows none: at 0, or at a head with no retained event).
    identity: Option<String>,
    /// The failed event holding the cursor, if any.
    held: Option<Held>,
    /// The handled prefix still to be acknowledged.
    handled: Option<Handled>,
    /// The unhandled rest of a batch behind a failed event (that event first), kept across
    /// the retry wait so the retry reads nothing again. Used only while it still starts right
    /// after the cursor; events never change once numbered, so the copy cannot be stale.
    pending: Vec<ObservedEvent>,
}

/// What a read found after the cursor, once checked for contiguity.
#[derive(Debug)]
pub(super) enum Read {
    /// Nothing new.
    Empty,
    /// The first event after the cursor is missing: history is gone.
    Gap,
    /// The first event's payload cannot be decoded; it fails with this class.
    Undecodable(Box<ObservedEvent>, FailureClass),
    /// Contiguous, decoded events from right after the cursor; `cut_short` when the read
    /// returned more that could not be delivered with them (after a gap or at an undecodable
    /// event), so the loop goes round again at once.
    Events {
        events: Vec<ObservedEvent>,
        cut_short: bool,
    },
}

impl Position {
    /// A position at `cursor` (`None`: the consumer has none yet).
    #[cfg(test)]
    pub fn at(cursor: Option<i64>) -> Self {
        Self {
            cursor,
            ..Self::default()
        }
    }

    /// A position at `cursor`, standing on the event with ID `identity`.
    pub fn on(cursor: Option<i64>, identity: Option<String>) -> Self {
        Self {
            cursor,
            identity,
            ..Self::default()
        }
    }

    /// The last acknowledged sequence.
    pub fn cursor(&self) -> Option<i64> {
        self.cursor
    }

    /// The event ID of the event at the cursor, if known.
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// Forgets everything handled, held or kept after the cursor: the database's history is
    /// not the one it came from, so nothing of it may be dispatched or acknowledged.
    pub fn forget_after_cursor(&mut self) {
        self.held = None;
        self.handled = None;
        self.pending.clear();
    }

    /// The failed event holding the cursor.
    pub fn held(&self) -> Option<&Held> {
        self.held.as_ref()
    }

    /// The sequence of the failed event holding the cursor.
    pub fn held_sequence(&self) -> Option<i64> {
        self.held.as_ref().map(|h| h.sequence)
    }

    /// The handled prefix still to be acknowledged.
    pub fn handled(&self) -> Option<&Handled> {
        self.handled.as_ref()
    }

    /// Whether nothing is held back: no failed event waiting, nothing handled unacknowledged.
    pub fn is_settled(&self) -> bool {
        self.held.is_none() && self.handled.is_none()
    }

    /// The event after the cursor failed and waits for its retry (or `None`: nothing does).
    pub fn hold(&mut self, held: Option<Held>) {
        self.held = held;
    }

    /// Remembers a handled prefix to be acknowledged.
    pub fn handled_through(&mut self, handled: Handled) {
        self.handled = Some(handled);
    }

    /// Takes the handled prefix, to be acknowledged.
    pub fn take_handled(&mut self) -> Option<Handled> {
        self.handled.take()
    }

    /// The cursor moved to `last` (event `identity`) by an acknowledgement; a failed event at
    /// or before it has been handled since.
    pub fn acknowledged(&mut self, last: i64, identity: String) {
        self.cursor = Some(last);
        self.identity = Some(identity);
        if self.held.as_ref().is_some_and(|h| h.sequence <= last) {
            self.held = None;
        }
    }

    /// The cursor was set to `cursor` (the event `identity`, if any) without delivery
    /// (reconciliation, the start from the earliest event, a parked event): nothing is held
    /// any more.
    pub fn moved_to(&mut self, cursor: i64, identity: Option<String>) {
        self.cursor = Some(cursor);
        self.identity = identity;
        self.held = None;
    }

    /// The attempt number of `sequence`'s next delivery: one more than its saved attempts if
    /// it is the held event, else the first.
    pub fn attempt_of(&self, sequence: i64) -> u32 {
        match &self.held {
            Some(held) if held.sequence == sequence => held.attempts + 1,
            _ => 1,
        }
    }

    /// Keeps `rest` (the failed event first) for the retry.
    pub fn keep(&mut self, rest: Vec<ObservedEvent>) {
        self.pending = rest;
    }

    /// Forgets the kept rest (after a transient failure, whatever happened meanwhile is read
    /// again).
    pub fn drop_pending(&mut self) {
        self.pending.clear();
    }

    /// Whether a rest of a batch is kept.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The kept rest of a batch, if it still starts right after the cursor, with the first
    /// event's attempt number brought up to date; a kept rest that no longer fits is dropped.
    pub fn take_pending(&mut self) -> Option<Vec<ObservedEvent>> {
        let mut events = std::mem::take(&mut self.pending);
        let cursor = self.cursor?;
        let first = events.first_mut()?;
        if first.sequence != cursor + 1 {
            return None;
        }
        first.attempt = self.attempt_of(first.sequence);
        Some(events)
    }

    /// The contiguity check of a read after `cursor`: the run of events that follows the
    /// cursor without a hole, up to the first undecodable one (which is delivered on its own,
    /// as a failure, when it comes first), each with its attempt number.
    pub fn contiguous(&self, cursor: i64, decoded: Vec<Decoded>) -> Read {
        if decoded.is_empty() {
            return Read::Empty;
        }
        let read = decoded.len();
        let mut events = Vec::with_capacity(read);
        for (index, (mut event, undecodable)) in decoded.into_iter().enumerate() {
            let sequence = event.sequence;
            if sequence != cursor + 1 + index as i64 {
                if index == 0 {
                    tracing::error!(
                        cursor,
                        next = sequence,
                        "gap after the cursor in retained history"
                    );
                    return Read::Gap;
                }
                break;
            }
            event.attempt = self.attempt_of(sequence);
            if let Some(class) = undecodable {
                // Deliver what precedes it; the undecodable event then fails on its own.
                if events.is_empty() {
                    return Read::Undecodable(Box::new(event), class);
                }
                break;
            }
            events.push(event);
        }
        let cut_short = events.len() < read;
        Read::Events { events, cut_short }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;
    use outbox_core::{ConsumerId, Prior, ProjectId};

    use super::*;

    /// An event of project `p` for consumer `c` at `sequence`, on its first attempt.
    fn event(sequence: i64) -> ObservedEvent {
        ObservedEvent {
            observed: true,
            event_type: "task.deleted".into(),
            project_id: ProjectId::new("p").unwrap(),
            consumer_id: ConsumerId::new("c").unwrap(),
            sequence,
            event_id: format!("e{sequence}"),
            task_id: format!("t{sequence}"),
            deleted_at: Some(Utc::now()),
            writer_process_id: "w".into(),
            occurred_at: Utc::now(),
            payload_version: 1,
            type_major: 1,
            type_minor: 0,
            prior: Prior::default(),
            payload: crate::event::EventPayload::empty(),
            traceparent: None,
            replay: false,
            attempt: 1,
        }
    }

    fn decoded(sequences: &[i64]) -> Vec<Decoded> {
        sequences.iter().map(|&s| (event(s), None)).collect()
    }

    fn held(sequence: i64, attempts: u32) -> Held {
        Held {
            sequence,
            attempts,
            ready_at: tokio::time::Instant::now() + Duration::from_secs(1),
        }
    }

    fn sequences(read: &Read) -> Vec<i64> {
        match read {
            Read::Events { events, .. } => events.iter().map(|e| e.sequence).collect(),
            other => panic!("expected events, got {other:?}"),
        }
    }

    fn undecodable() -> FailureClass {
        FailureClass::new("undecodable_payload").unwrap()
    }

    #[test]
    fn an_empty_read_is_empty() {
        let position = Position::at(Some(4));
        assert!(matches!(position.contiguous(4, Vec::new()), Read::Empty));
    }

    #[test]
    fn a_contiguous_read_is_delivered_whole() {
        let read = Position::at(Some(4)).contiguous(4, decoded(&[5, 6, 7]));
        assert_eq!(sequences(&read), [5, 6, 7]);
        assert!(matches!(
            read,
            Read::Events {
                cut_short: false,
                ..
            }
        ));
    }

    #[test]
    fn a_hole_right_after_the_cursor_is_a_gap() {
        let read = Position::at(Some(4)).contiguous(4, decoded(&[6, 7]));
        assert!(matches!(read, Read::Gap));
    }

    #[test]
    fn a_later_hole_cuts_the_batch_short() {
        let read = Position::at(Some(4)).contiguous(4, decoded(&[5, 6, 8, 9]));
        assert_eq!(sequences(&read), [5, 6]);
        assert!(matches!(
            read,
            Read::Events {
                cut_short: true,
                ..
            }
        ));
    }

    #[test]
    fn an_undecodable_first_event_fails_alone() {
        let mut batch = decoded(&[5, 6]);
        batch[0].1 = Some(undecodable());
        let read = Position::at(Some(4)).contiguous(4, batch);
        match read {
            Read::Undecodable(event, class) => {
                assert_eq!(event.sequence, 5);
                assert_eq!(class, undecodable());
            }
            other => panic!("expected the undecodable event, got {other:?}"),
        }
    }

    #[test]
    fn an_undecodable_later_event_cuts_the_batch_before_it() {
        let mut batch = decoded(&[5, 6, 7]);
        batch[1].1 = Some(undecodable());
        let read = Position::at(Some(4)).contiguous(4, batch);
        assert_eq!(sequences(&read), [5]);
        assert!(matches!(
            read,
            Read::Events {
                cut_short: true,
                ..
            }
        ));
    }

    #[test]
    fn the_held_event_is_read_as_its_next_attempt() {
        let mut position = Position::at(Some(4));
        position.hold(Some(held(5, 2)));
        let Read::Events { events, .. } = position.contiguous(4, decoded(&[5, 6])) else {
            panic!("expected events");
        };
        let attempts: Vec<u32> = events.iter().map(|e| e.attempt).collect();
        assert_eq!(attempts, [3, 1]);
    }

    #[test]
    fn kept_events_are_taken_while_they_follow_the_cursor() {
        let mut position = Position::at(Some(4));
        position.hold(Some(held(5, 1)));
        position.keep(vec![event(5), event(6)]);
        let events = position
            .take_pending()
            .expect("the kept rest follows the cursor");
        assert_eq!(
            events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            [5, 6]
        );
        assert_eq!(events[0].attempt, 2, "the held event's next attempt");
        assert!(!position.has_pending(), "taken, not copied");
    }

    #[test]
    fn kept_events_that_no_longer_follow_the_cursor_are_dropped() {
        let mut position = Position::at(Some(4));
        position.keep(vec![event(5), event(6)]);
        // The event was parked meanwhile: the cursor moved past the kept rest's start.
        position.moved_to(5, None);
        assert!(position.take_pending().is_none());
        assert!(!position.has_pending(), "dropped");
    }

    #[test]
    fn nothing_is_taken_without_a_cursor_or_kept_events() {
        let mut position = Position::at(None);
        position.keep(vec![event(1)]);
        assert!(position.take_pending().is_none());
        assert!(Position::at(Some(0)).take_pending().is_none());
    }

    #[test]
    fn an_acknowledgement_through_the_held_event_releases_it() {
        let mut position = Position::at(Some(4));
        position.hold(Some(held(6, 1)));
        position.acknowledged(5, "e5".into());
        assert_eq!(position.held_sequence(), Some(6), "not yet handled");
        position.acknowledged(6, "e6".into());
        assert_eq!(position.held_sequence(), None);
        assert_eq!(position.cursor(), Some(6));
    }

    #[test]
    fn a_position_is_settled_with_nothing_held_or_handled() {
        let mut position = Position::at(Some(4));
        assert!(position.is_settled());
        let handled = Handled {
            last: 5,
            identity: "e5".into(),
            count: 1,
        };
        position.handled_through(handled.clone());
        assert!(!position.is_settled());
        assert_eq!(position.take_handled(), Some(handled));
        position.hold(Some(held(5, 1)));
        assert!(!position.is_settled());
        position.moved_to(5, None);
        assert!(position.is_settled());
    }
}
