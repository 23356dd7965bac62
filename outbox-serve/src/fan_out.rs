//! The fan-out of one project: the durable consumer's sink publishes what it handled; SSE
//! clients subscribe. Publishing never waits for a client: each client has a bounded queue
//! (counted in events), and a client whose queue would overflow is dropped (it receives a
//! final `event: lagged` and its connection is closed), so a slow client can delay neither
//! the durable consumer nor any other client.
//!
//! A frame's id is a [`StreamId`] (the SSE `id:` field: a sequence and a [`Tag`] of the event
//! it names; [`MalformedId`] when a client's `Last-Event-ID` does not parse), re-exported here
//! from the crate's `sse_id` module.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use outbox_consumer::handler::PartialAck;
use outbox_consumer::{Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler};
use outbox_core::ProjectId;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use outbox_service::lines::{event_line, reconcile_line};

use crate::metric;
use crate::sse;

pub use crate::sse_id::{MalformedId, StreamId, Tag};

/// One SSE message, rendered once and shared by every client.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The `id:` field: the event's sequence and identity (or the head's, for a
    /// reconciliation).
    pub id: StreamId,
    /// The whole message, blank line included.
    pub bytes: Bytes,
}

impl Frame {
    /// An event as `outbox consume` prints it, with its sequence and identity as its id.
    pub fn event(event: &ObservedEvent) -> Self {
        let id = StreamId::at(event.sequence, Some(&event.event_id));
        let bytes = sse::message(Some(&id), &event.event_type, &event_line(event));
        Self { id, bytes }
    }

    /// A reconciliation: the live task set and the head, with the head (and the identity of
    /// the event there) as its id, so that a client can resume from it like from an event.
    pub fn reconcile(live: &LiveSet, consumer: &str) -> Self {
        let id = StreamId::at(live.head_sequence, live.head_event_id.as_deref());
        let bytes = sse::message(Some(&id), "reconcile", &reconcile_line(live, consumer));
        Self { id, bytes }
    }

    /// The sequence in the id.
    pub fn sequence(&self) -> i64 {
        self.id.sequence
    }
}

/// What one publication carries to each client's queue.
#[derive(Debug)]
pub struct Batch {
    /// Consecutive events, or one reconciliation.
    pub frames: Vec<Frame>,
    /// All frames, concatenated once, for clients that want the whole batch.
    pub bytes: Bytes,
    /// True for a reconciliation: clients take it instead of the events it replaces.
    pub reconcile: bool,
}

impl Batch {
    fn new(frames: Vec<Frame>, reconcile: bool) -> Self {
        let mut all = Vec::with_capacity(frames.iter().map(|f| f.bytes.len()).sum());
        for frame in &frames {
            all.extend_from_slice(&frame.bytes);
        }
        Self {
            frames,
            bytes: Bytes::from(all),
            reconcile,
        }
    }
}

/// A client's end of its queue.
pub struct Subscription {
    /// The fan-out, to unsubscribe on drop.
    fan_out: Arc<FanOut>,
    /// The client's key in the fan-out.
    id: u64,
    /// Batches published since subscribing.
    pub queue: mpsc::UnboundedReceiver<Arc<Batch>>,
    /// Events queued and not yet taken; the fan-out drops the client past the limit.
    pub queued: Arc<AtomicUsize>,
    /// Set when the fan-out dropped the client for falling behind.
    pub lagged: Arc<AtomicBool>,
    /// Signalled when the queue passes half its limit: a client waiting out its write
    /// interval writes at once rather than be dropped for a burst (a catch-up publishes
    /// thousands of events in one interval).
    pub filling: Arc<Notify>,
    /// Ring frames after the client's position, taken in the same critical section as the
    /// subscription, so nothing falls between them and the queue.
    pub backlog: Vec<Frame>,
    /// The oldest sequence in the ring at subscription, if any.
    pub ring_first: Option<i64>,
    /// The id of the ring's frame at the client's position, when the ring holds it: an event
    /// this process handled, whose identity a resuming client's id is checked against.
    pub at_position: Option<StreamId>,
    /// The id of the last event (or reconciliation) handled and published, when known.
    pub handled_through: Option<StreamId>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.fan_out.unsubscribe(self.id);
    }
}

/// A subscribed client as the fan-out sees it.
struct Slot {
    /// Where its batches go.
    queue: mpsc::UnboundedSender<Arc<Batch>>,
    /// Events queued; shared with the client, which counts them down.
    queued: Arc<AtomicUsize>,
    /// Shared with the client: set when it is dropped for lagging.
    lagged: Arc<AtomicBool>,
    /// Shared with the client: wakes it when its queue passes half the limit.
    filling: Arc<Notify>,
    /// Closes the client's connection.
    connection: CancellationToken,
}

/// State behind the fan-out's lock.
#[derive(Default)]
struct Inner {
    /// The most recent published events, oldest first.
    ring: VecDeque<Frame>,
    /// The id of the last message published (an event or a reconciliation).
    handled_through: Option<StreamId>,
    /// Subscribed clients.
    clients: HashMap<u64, Slot>,
    /// The next client key.
    next_id: u64,
}

/// The fan-out of one project's stream.
pub struct FanOut {
    /// The project.
    pub project: ProjectId,
    /// The durable consumer feeding it, named in the lines it publishes.
    pub consumer: String,
    /// Ring length, in events.
    ring_size: usize,
    /// Per-client queue bound, in events.
    queue_limit: usize,
    /// How long a dropped client's connection may take to write its `lagged` message before
    /// the server closes the socket: a client that reads nothing at all never receives it.
    lagged_grace: Duration,
    /// Events handled in the current batch, published at `before_ack`.
    pending: Mutex<Vec<Frame>>,
    /// Ring and clients.
    inner: Mutex<Inner>,
}

impl FanOut {
    /// An empty fan-out.
    pub fn new(
        project: ProjectId,
        consumer: String,
        ring_size: usize,
        queue_limit: usize,
        lagged_grace: Duration,
    ) -> Self {
        let labels = [("project", project.to_string())];
        metrics::gauge!(metric::SSE_CLIENTS.name, &labels).set(0.0);
        metrics::counter!(metric::SSE_DROPPED.name, &labels).increment(0);
        Self {
            project,
            consumer,
            ring_size: ring_size.max(1),
            queue_limit: queue_limit.max(1),
            lagged_grace,
            pending: Mutex::new(Vec::new()),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_gauge(&self, clients: usize) {
        metrics::gauge!(metric::SSE_CLIENTS.name, "project" => self.project.to_string())
            .set(clients as f64);
    }

    /// Subscribes a client positioned after `after` (`None`: from the next event on).
    pub fn subscribe(
        self: &Arc<Self>,
        after: Option<i64>,
        connection: CancellationToken,
    ) -> Subscription {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let lagged = Arc::new(AtomicBool::new(false));
        let filling = Arc::new(Notify::new());
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.clients.insert(
            id,
            Slot {
                queue: tx,
                queued: queued.clone(),
                lagged: lagged.clone(),
                filling: filling.clone(),
                connection,
            },
        );
        let backlog = match after {
            Some(after) => inner
                .ring
                .iter()
                .filter(|f| f.sequence() > after)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        // Not by index: the ring has no frames for dead letters, so its numbers have gaps.
        let at_position = after.and_then(|after| {
            inner
                .ring
                .iter()
                .rfind(|f| f.sequence() == after)
                .map(|f| f.id)
        });
        let subscription = Subscription {
            fan_out: self.clone(),
            id,
            queue: rx,
            queued,
            lagged,
            filling,
            backlog,
            ring_first: inner.ring.front().map(Frame::sequence),
            at_position,
            handled_through: inner.handled_through,
        };
        let clients = inner.clients.len();
        drop(inner);
        self.set_gauge(clients);
        subscription
    }

    fn unsubscribe(&self, id: u64) {
        let mut inner = self.lock();
        if inner.clients.remove(&id).is_some() {
            let clients = inner.clients.len();
            drop(inner);
            self.set_gauge(clients);
        }
    }

    /// Publishes a batch to the ring and every client; drops clients that cannot take it.
    fn publish(&self, batch: Batch) {
        let batch = Arc::new(batch);
        let count = batch.frames.len();
        let mut dropped = Vec::new();
        let mut inner = self.lock();
        if batch.reconcile {
            // History between the old position and the head was never handled here.
            inner.ring.clear();
        } else {
            for frame in &batch.frames {
                inner.ring.push_back(frame.clone());
            }
            while inner.ring.len() > self.ring_size {
                inner.ring.pop_front();
            }
        }
        inner.handled_through = batch.frames.last().map(|f| f.id).or(inner.handled_through);
        inner.clients.retain(|_, slot| {
            let queued = slot.queued.load(Ordering::Acquire);
            if queued + count > self.queue_limit {
                slot.lagged.store(true, Ordering::Release);
                dropped.push(slot.connection.clone());
                return false;
            }
            if (queued + count) * 2 > self.queue_limit {
                slot.filling.notify_one();
            }
            slot.queued.fetch_add(count, Ordering::AcqRel);
            slot.queue.send(batch.clone()).is_ok()
        });
        let clients = inner.clients.len();
        drop(inner);
        self.set_gauge(clients);
        if !dropped.is_empty() {
            metrics::counter!(metric::SSE_DROPPED.name, "project" => self.project.to_string())
                .increment(dropped.len() as u64);
            tracing::warn!(
                project = %self.project, clients = dropped.len(),
                "SSE client queue full; client dropped"
            );
            for connection in dropped {
                let grace = self.lagged_grace;
                tokio::spawn(async move {
                    tokio::select! {
                        _ = connection.cancelled() => {}
                        _ = tokio::time::sleep(grace) => connection.cancel(),
                    }
                });
            }
        }
    }
}

/// A served project's handler and reconciler: an optional handler first (the command's
/// `--child`, say), then the fan-out. Events are published at `before_ack`, once the whole handled prefix
/// of a batch is known, so clients only ever see events the durable consumer has handled.
pub struct FanOutSink<C> {
    /// The project's fan-out.
    pub fan_out: Arc<FanOut>,
    /// Handles each event (and reconciliation) before it is fanned out, when given; an event
    /// it fails is not fanned out.
    pub first: Option<C>,
}

impl<C: Handler> Handler for FanOutSink<C> {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        if let Some(first) = &self.first {
            first.handle(event).await?;
        }
        if !event.replay {
            // A replayed dead letter arrives outside sequence order; clients, which resume
            // by sequence, are not sent it.
            let frame = Frame::event(event);
            self.fan_out
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(frame);
        }
        Ok(())
    }

    fn needs_total_order(&self) -> bool {
        self.first.as_ref().is_some_and(Handler::needs_total_order)
    }

    async fn before_ack(&self) -> Result<(), HandlerFailure> {
        self.publish_through(i64::MAX).await
    }

    /// Publishes the frames of the handled prefix only, in sequence order: with lanes, events
    /// beyond it may be handled already, and are published when the cursor reaches them.
    async fn before_ack_prefix(&self, handled: &[ObservedEvent]) -> Result<(), PartialAck> {
        let through = handled.last().map_or(i64::MAX, |e| e.sequence);
        self.publish_through(through)
            .await
            .map_err(|failure| PartialAck {
                durable: 0,
                failure,
            })
    }
}

impl<C: Handler> FanOutSink<C> {
    /// The first handler's `before_ack`, then the pending frames through `through`, in
    /// sequence order.
    async fn publish_through(&self, through: i64) -> Result<(), HandlerFailure> {
        if let Some(first) = &self.first {
            if let Err(failure) = first.before_ack().await {
                self.fan_out
                    .pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clear();
                return Err(failure);
            }
        }
        let mut frames = {
            let mut pending = self
                .fan_out
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match pending.iter().all(|f| f.id.sequence <= through) {
                true => std::mem::take(&mut *pending),
                false => {
                    let (now, later) = std::mem::take(&mut *pending)
                        .into_iter()
                        .partition(|f| f.id.sequence <= through);
                    *pending = later;
                    now
                }
            }
        };
        if !frames.is_sorted_by_key(|f| f.id.sequence) {
            frames.sort_by_key(|f| f.id.sequence);
        }
        if !frames.is_empty() {
            self.fan_out.publish(Batch::new(frames, false));
        }
        Ok(())
    }
}

impl<C: Reconciler> Reconciler for FanOutSink<C> {
    async fn reconcile(&self, live: &LiveSet) -> Result<(), HandlerFailure> {
        if let Some(first) = &self.first {
            first.reconcile(live).await?;
        }
        self.fan_out
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let frame = Frame::reconcile(live, &self.fan_out.consumer);
        self.fan_out.publish(Batch::new(vec![frame], true));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(sequence: i64) -> Frame {
        let id = StreamId::at(sequence, Some(&format!("e{sequence}")));
        Frame {
            id,
            bytes: Bytes::from(format!("id: {id}\n\n")),
        }
    }

    fn fan_out(ring: usize) -> Arc<FanOut> {
        let project = ProjectId::new("p").unwrap();
        Arc::new(FanOut::new(project, "c".into(), ring, 100, Duration::ZERO))
    }

    #[test]
    fn the_ring_names_the_event_at_a_resume_position_despite_gaps() {
        let fan_out = fan_out(3);
        // 3 was parked as a dead letter: never published, a gap in the ring.
        fan_out.publish(Batch::new(vec![frame(1), frame(2), frame(4)], false));
        fan_out.publish(Batch::new(vec![frame(5)], false));
        let at = |after| fan_out.subscribe(Some(after), CancellationToken::new());
        assert_eq!(at(4).at_position, Some(frame(4).id));
        assert_eq!(at(2).at_position, Some(frame(2).id));
        assert_eq!(at(3).at_position, None, "a dead letter is not in the ring");
        assert_eq!(at(1).at_position, None, "pushed out of a ring of 3");
        let resumed = at(2);
        let backlog: Vec<i64> = resumed.backlog.iter().map(Frame::sequence).collect();
        assert_eq!(backlog, vec![4, 5]);
        assert_eq!(resumed.handled_through, Some(frame(5).id));
    }

    #[test]
    fn a_reconciliation_clears_the_ring_and_is_the_last_handled() {
        let fan_out = fan_out(10);
        fan_out.publish(Batch::new(vec![frame(1), frame(2)], false));
        let head = StreamId::at(2, Some("another history's 2"));
        let reconcile = Frame {
            id: head,
            bytes: Bytes::from_static(b"event: reconcile\n\n"),
        };
        fan_out.publish(Batch::new(vec![reconcile], true));
        let resumed = fan_out.subscribe(Some(2), CancellationToken::new());
        assert_eq!(resumed.at_position, None);
        assert!(resumed.backlog.is_empty());
        assert_eq!(resumed.handled_through, Some(head));
    }
}
