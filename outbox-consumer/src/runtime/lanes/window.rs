//! The lanes' window: the events read ahead of the cursor, which of them are handled, which
//! key may start its next event, and how far the cursor may move.
//!
//! Everything here is a pure decision over that state (no database, no clock beyond the
//! instants it is given), so the rules that keep each key in order and the cursor truthful
//! are tested on their own.
//!
//! A key is the event's subject (its task ID), reduced to a 64-bit hash: two subjects that
//! share a hash share a queue, which costs them concurrency, never order.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;

use tokio::time::Instant;

use crate::event::{FailureClass, ObservedEvent};
use crate::store::Held;

/// Where an event of the window stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for its key's turn (or for its retry).
    Queued,
    /// Its handler runs.
    Running,
    /// Handled: acknowledged with the prefix it ends up in.
    Handled,
    /// Parked as a dead letter: the cursor moves past it like a handled event.
    Parked,
    /// Handled by an earlier run (a transactional handler's receipt): not handled again, and
    /// passed over like a parked event.
    Earlier,
}

/// One event of the window.
#[derive(Debug)]
struct Slot {
    /// The event; out of the slot while its handler runs.
    event: Option<ObservedEvent>,
    /// Its key.
    key: u64,
    state: State,
    /// Failed attempts so far.
    attempts: u32,
    /// When its next attempt is due, after a failure.
    ready_at: Option<Instant>,
    /// Why it cannot be decoded, if it cannot: it fails with this class, without a handler.
    undecodable: Option<FailureClass>,
}

/// A key's queue: its events in sequence order, the first of them running or next. The first
/// is kept apart, so a key with one event (the common case) allocates nothing.
#[derive(Debug)]
struct Key {
    first: i64,
    rest: VecDeque<i64>,
    /// Whether its first event runs.
    busy: bool,
}

/// What became of an event that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finished {
    /// Handled.
    Handled,
    /// Failed (`attempts` so far) with a retry due at `ready_at`: it holds its key.
    Retry { attempts: u32, ready_at: Instant },
    /// Parked after its last attempt.
    Parked,
    /// Not the event's fault (shutdown, a handler that gave up): tried again at `ready_at`,
    /// uncounted.
    Again { ready_at: Instant },
}

/// What the lanes hold ahead of the cursor.
#[derive(Debug)]
pub(crate) struct Window {
    /// The cursor: the first slot is the event right after it.
    cursor: i64,
    /// The events after the cursor, contiguous, in sequence order.
    slots: VecDeque<Slot>,
    /// Keys with events in the window not yet handled.
    keys: HashMap<u64, Key>,
    /// Keys whose first event may start now.
    runnable: VecDeque<u64>,
    /// Keys whose first event waits for its retry.
    waiting: Vec<u64>,
    /// How many events run.
    running: usize,
    /// How many of the first slots are handled or parked: the prefix the cursor may move over.
    prefix: usize,
    /// How many slots are handled or parked.
    settled: usize,
    /// Deliveries found in the database ahead of the cursor, by sequence, for events not yet
    /// read: retrying (`true`) or parked.
    known: HashMap<i64, (Held, bool)>,
    /// Events ahead of the cursor a transactional handler handled in an earlier run (their
    /// receipts), not yet read.
    receipts: HashSet<i64>,
    /// The highest sequence handled or parked (the cursor when none is beyond it).
    handled_through: i64,
    /// The hasher of keys.
    hasher: std::collections::hash_map::RandomState,
}

/// The prefix taken for an acknowledgement.
#[derive(Debug)]
pub(crate) struct Prefix {
    /// The events handled (not parked), in sequence order.
    pub handled: Vec<ObservedEvent>,
    /// The last event of the prefix, handled or parked: the cursor's new place and identity.
    pub last: i64,
    pub identity: String,
    /// A handled event of the prefix that failed before: its retry state is cleared with the
    /// acknowledgement.
    pub failed_before: Option<i64>,
}

impl Window {
    /// An empty window after `cursor`; `known` are the deliveries ahead of it in the database,
    /// `receipts` the events ahead of it handled by an earlier run.
    pub fn new(cursor: i64, known: Vec<(Held, bool)>, receipts: HashSet<i64>) -> Self {
        Self {
            cursor,
            slots: VecDeque::new(),
            keys: HashMap::new(),
            runnable: VecDeque::new(),
            waiting: Vec::new(),
            running: 0,
            prefix: 0,
            settled: 0,
            known: known.into_iter().map(|k| (k.0.sequence, k)).collect(),
            receipts,
            handled_through: cursor,
            hasher: Default::default(),
        }
    }

    /// The cursor the window follows.
    pub fn cursor(&self) -> i64 {
        self.cursor
    }

    /// The last sequence read into the window.
    pub fn read_through(&self) -> i64 {
        self.cursor + self.slots.len() as i64
    }

    /// How many more events fit within `max_ahead` of the cursor.
    pub fn room(&self, max_ahead: i64) -> i64 {
        (max_ahead - self.slots.len() as i64).max(0)
    }

    /// Whether nothing is ahead of the cursor.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// How many events run.
    #[cfg(test)]
    pub fn running(&self) -> usize {
        self.running
    }

    /// Events handled or parked ahead of the cursor.
    pub fn settled(&self) -> usize {
        self.settled
    }

    /// The highest sequence handled or parked: the cursor, or beyond it.
    pub fn handled_through(&self) -> i64 {
        self.handled_through.max(self.cursor)
    }

    /// How many events the cursor may move over now.
    pub fn prefix(&self) -> usize {
        self.prefix
    }

    fn key_of(&self, subject: &str) -> u64 {
        self.hasher.hash_one(subject)
    }

    fn slot(&self, sequence: i64) -> &Slot {
        &self.slots[(sequence - self.cursor - 1) as usize]
    }

    fn slot_mut(&mut self, sequence: i64) -> &mut Slot {
        &mut self.slots[(sequence - self.cursor - 1) as usize]
    }

    /// Adds the next event (right after [`Window::read_through`]); `undecodable` when its
    /// payload cannot be decoded.
    pub fn push(&mut self, event: ObservedEvent, undecodable: Option<FailureClass>) {
        debug_assert_eq!(event.sequence, self.read_through() + 1);
        let sequence = event.sequence;
        let key = self.key_of(&event.task_id);
        let mut slot = Slot {
            event: Some(event),
            key,
            state: State::Queued,
            attempts: 0,
            ready_at: None,
            undecodable,
        };
        if !self.receipts.is_empty() && self.receipts.remove(&sequence) {
            // Handled in an earlier run's transaction, with its effect: passed over.
            slot.state = State::Earlier;
            self.known.remove(&sequence);
            self.slots.push_back(slot);
            self.settled += 1;
            self.handled_through = sequence;
            self.advance_prefix();
            return;
        }
        match self.known.remove(&sequence) {
            Some((held, true)) => {
                slot.attempts = held.attempts;
                slot.ready_at = Some(held.ready_at);
            }
            Some((_, false)) => {
                // Parked before the cursor reached it: not delivered again.
                slot.state = State::Parked;
                self.slots.push_back(slot);
                self.settled += 1;
                self.handled_through = sequence;
                self.advance_prefix();
                return;
            }
            None => {}
        }
        self.slots.push_back(slot);
        match self.keys.entry(key) {
            Entry::Occupied(mut queued) => queued.get_mut().rest.push_back(sequence),
            Entry::Vacant(vacant) => {
                vacant.insert(Key {
                    first: sequence,
                    rest: VecDeque::new(),
                    busy: false,
                });
                self.ready_or_waiting(key);
            }
        }
    }

    /// Puts an idle key with events in the runnable queue, or the waiting list while its
    /// first event waits for a retry.
    fn ready_or_waiting(&mut self, key: u64) {
        let Some(&first) = self.keys.get(&key).map(|k| &k.first) else {
            return;
        };
        match self.slot(first).ready_at {
            Some(_) => self.waiting.push(key),
            None => self.runnable.push_back(key),
        }
    }

    /// Moves the keys whose retry is due at `now` to the runnable queue.
    pub fn release_due(&mut self, now: Instant) {
        let mut index = 0;
        while index < self.waiting.len() {
            let key = self.waiting[index];
            let first = self.keys.get(&key).map(|k| &k.first).copied();
            let due =
                first.is_none_or(|first| self.slot(first).ready_at.is_none_or(|at| at <= now));
            if due {
                self.waiting.swap_remove(index);
                if let Some(first) = first {
                    self.slot_mut(first).ready_at = None;
                    self.runnable.push_back(key);
                }
            } else {
                index += 1;
            }
        }
    }

    /// When the first waiting retry is due.
    pub fn next_ready_at(&self) -> Option<Instant> {
        self.waiting
            .iter()
            .filter_map(|key| self.keys.get(key).map(|k| &k.first))
            .filter_map(|&first| self.slot(first).ready_at)
            .min()
    }

    /// The next event to start, out of its slot, with its attempt number; `None` when no key
    /// may start one. An undecodable event comes with its failure class.
    pub fn start(&mut self) -> Option<(ObservedEvent, Option<FailureClass>)> {
        let key = self.runnable.pop_front()?;
        let first = self.keys.get(&key)?.first;
        if let Some(k) = self.keys.get_mut(&key) {
            k.busy = true;
        }
        self.running += 1;
        let slot = self.slot_mut(first);
        slot.state = State::Running;
        let mut event = slot.event.take()?;
        event.attempt = slot.attempts + 1;
        Some((event, slot.undecodable.clone()))
    }

    /// `event` ran and came to `finished`: its slot gets it back, and its key goes on.
    pub fn finish(&mut self, event: ObservedEvent, finished: Finished) {
        let sequence = event.sequence;
        let slot = self.slot_mut(sequence);
        slot.event = Some(event);
        let key = slot.key;
        match finished {
            Finished::Handled | Finished::Parked => {
                slot.state = match finished {
                    Finished::Handled => State::Handled,
                    _ => State::Parked,
                };
                slot.ready_at = None;
                self.settled += 1;
                self.handled_through = self.handled_through.max(sequence);
                if let Entry::Occupied(mut k) = self.keys.entry(key) {
                    let key = k.get_mut();
                    key.busy = false;
                    match key.rest.pop_front() {
                        Some(next) => key.first = next,
                        None => {
                            k.remove();
                        }
                    }
                }
                self.ready_or_waiting(key);
                self.advance_prefix();
            }
            Finished::Retry { attempts, ready_at } => {
                slot.state = State::Queued;
                slot.attempts = attempts;
                slot.ready_at = Some(ready_at);
                if let Some(k) = self.keys.get_mut(&key) {
                    k.busy = false;
                }
                self.waiting.push(key);
            }
            Finished::Again { ready_at } => {
                slot.state = State::Queued;
                slot.ready_at = Some(ready_at);
                if let Some(k) = self.keys.get_mut(&key) {
                    k.busy = false;
                }
                self.waiting.push(key);
            }
        }
        self.running -= 1;
    }

    fn advance_prefix(&mut self) {
        while self
            .slots
            .get(self.prefix)
            .is_some_and(|s| matches!(s.state, State::Handled | State::Parked | State::Earlier))
        {
            self.prefix += 1;
        }
    }

    /// Takes the first `count` events of the prefix (at most [`Window::prefix`]) for an
    /// acknowledgement; the window then follows the cursor at the last of them.
    pub fn take_prefix(&mut self, count: usize) -> Option<Prefix> {
        let count = count.min(self.prefix);
        if count == 0 {
            return None;
        }
        let mut handled = Vec::with_capacity(count);
        let mut failed_before = None;
        let mut last = None;
        for (index, mut slot) in self.slots.drain(..count).enumerate() {
            let event = slot.event.take()?;
            if index + 1 == count {
                // The identity of the last one only: one string copy an acknowledgement.
                last = Some((event.sequence, event.event_id.clone()));
            }
            if slot.state == State::Handled {
                if slot.attempts > 0 && failed_before.is_none() {
                    failed_before = Some(event.sequence);
                }
                handled.push(event);
            }
        }
        self.prefix -= count;
        self.settled -= count;
        let (last, identity) = last?;
        self.cursor = last;
        Some(Prefix {
            handled,
            last,
            identity,
            failed_before,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;
    use outbox_core::{ConsumerId, Prior, ProjectId};

    use super::*;

    fn event(sequence: i64, task: &str) -> ObservedEvent {
        ObservedEvent {
            observed: true,
            event_type: "task.deleted".into(),
            project_id: ProjectId::new("p").unwrap(),
            consumer_id: ConsumerId::new("c").unwrap(),
            sequence,
            event_id: format!("e{sequence}"),
            task_id: task.into(),
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

    /// A window after 0 with events 1.. of the given tasks.
    fn window(tasks: &[&str]) -> Window {
        let mut window = Window::new(0, Vec::new(), HashSet::new());
        for (index, task) in tasks.iter().enumerate() {
            window.push(event(index as i64 + 1, task), None);
        }
        window
    }

    fn start_all(window: &mut Window) -> Vec<ObservedEvent> {
        std::iter::from_fn(|| window.start().map(|(e, _)| e)).collect()
    }

    fn sequences(events: &[ObservedEvent]) -> Vec<i64> {
        events.iter().map(|e| e.sequence).collect()
    }

    #[test]
    fn one_event_per_key_runs_at_once_in_sequence_order() {
        let mut window = window(&["a", "b", "a", "c", "b"]);
        let first = start_all(&mut window);
        assert_eq!(sequences(&first), [1, 2, 4], "the first of each key");
        assert_eq!(window.running(), 3);
        let mut first = first.into_iter();
        let one = first.next().unwrap();
        window.finish(one, Finished::Handled);
        let next = start_all(&mut window);
        assert_eq!(sequences(&next), [3], "a's next one, after a's first");
        assert_eq!(window.prefix(), 1);
    }

    #[test]
    fn the_prefix_stops_at_the_first_event_not_handled() {
        let mut window = window(&["a", "b", "c"]);
        let started = start_all(&mut window);
        let mut started = started.into_iter();
        let (one, two, three) = (
            started.next().unwrap(),
            started.next().unwrap(),
            started.next().unwrap(),
        );
        window.finish(three, Finished::Handled);
        window.finish(two, Finished::Parked);
        assert_eq!(window.prefix(), 0, "event 1 still runs");
        assert_eq!(window.settled(), 2);
        window.finish(one, Finished::Handled);
        assert_eq!(window.prefix(), 3);
        let prefix = window.take_prefix(3).unwrap();
        assert_eq!(
            sequences(&prefix.handled),
            [1, 3],
            "the parked one is not handled"
        );
        assert_eq!((prefix.last, prefix.identity.as_str()), (3, "e3"));
        assert_eq!(window.cursor(), 3);
        assert!(window.is_empty());
        assert_eq!(window.settled(), 0);
    }

    #[test]
    fn a_failed_event_holds_its_key_and_not_the_others() {
        let mut window = window(&["a", "a", "b"]);
        let started = start_all(&mut window);
        assert_eq!(sequences(&started), [1, 3]);
        let mut started = started.into_iter();
        let (one, three) = (started.next().unwrap(), started.next().unwrap());
        let now = Instant::now();
        let ready_at = now + Duration::from_secs(1);
        window.finish(
            one,
            Finished::Retry {
                attempts: 1,
                ready_at,
            },
        );
        window.finish(three, Finished::Handled);
        assert!(window.start().is_none(), "a's events wait for the retry");
        assert_eq!(window.next_ready_at(), Some(ready_at));
        assert_eq!(
            window.prefix(),
            0,
            "the cursor stays before the failed event"
        );
        window.release_due(now);
        assert!(window.start().is_none(), "not due yet");
        window.release_due(ready_at);
        let (retry, _) = window.start().unwrap();
        assert_eq!((retry.sequence, retry.attempt), (1, 2));
        window.finish(retry, Finished::Handled);
        let (two, _) = window.start().unwrap();
        assert_eq!(two.sequence, 2);
        window.finish(two, Finished::Handled);
        let prefix = window.take_prefix(usize::MAX).unwrap();
        assert_eq!(prefix.last, 3);
        assert_eq!(prefix.failed_before, Some(1));
    }

    #[test]
    fn deliveries_known_ahead_are_resumed_or_skipped() {
        let held = |sequence, attempts| Held {
            sequence,
            attempts,
            ready_at: Instant::now(),
        };
        let mut window = Window::new(
            0,
            vec![(held(1, 3), true), (held(2, 10), false)],
            HashSet::new(),
        );
        window.push(event(1, "a"), None);
        window.push(event(2, "b"), None);
        assert_eq!(window.settled(), 1, "the parked one");
        assert!(window.start().is_none(), "the retry waits for its time");
        window.release_due(Instant::now() + Duration::from_millis(1));
        let (one, _) = window.start().unwrap();
        assert_eq!(one.attempt, 4);
        window.finish(one, Finished::Handled);
        let prefix = window.take_prefix(usize::MAX).unwrap();
        assert_eq!(sequences(&prefix.handled), [1]);
        assert_eq!(prefix.last, 2);
    }

    #[test]
    fn events_with_a_receipt_are_passed_over_and_counted_as_handled_through() {
        let mut window = Window::new(0, Vec::new(), HashSet::from([2, 3]));
        window.push(event(1, "a"), None);
        window.push(event(2, "c"), None);
        window.push(event(3, "b"), None);
        window.push(event(4, "a"), None);
        assert_eq!(window.handled_through(), 3, "the receipts are handled");
        let started = start_all(&mut window);
        assert_eq!(sequences(&started), [1], "2 and 3 are not handled again");
        window.finish(started.into_iter().next().unwrap(), Finished::Handled);
        let (four, _) = window.start().unwrap();
        assert_eq!(four.sequence, 4);
        window.finish(four, Finished::Handled);
        assert_eq!(window.handled_through(), 4);
        let prefix = window.take_prefix(usize::MAX).unwrap();
        assert_eq!(sequences(&prefix.handled), [1, 4], "handled by this run");
        assert_eq!(prefix.last, 4);
    }

    #[test]
    fn the_room_is_counted_from_the_cursor() {
        let mut window = window(&["a", "b"]);
        assert_eq!(window.room(3), 1);
        assert_eq!(window.read_through(), 2);
        for event in start_all(&mut window) {
            window.finish(event, Finished::Handled);
        }
        assert_eq!(window.room(3), 1, "handled, not yet acknowledged");
        window.take_prefix(1).unwrap();
        assert_eq!(window.room(3), 2);
        assert_eq!(window.read_through(), 2);
    }
}
