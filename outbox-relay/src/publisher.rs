//! The relay's handler: each observed event becomes one JetStream publish.
//!
//! **Order enforced by the stream** (`--fence`, see `fence.rs`). With the stream fence (the
//! default) every publish names the stream's last sequence before it and, inside a window, the
//! ID of the relay's message before it, so a window of publishes is in flight and each is
//! stored only right after its predecessor; a refusal or a duplicate stored elsewhere makes the
//! relay read the stream's end again and send the rest again (see `fenced.rs`). With the
//! subject fence every publish carries `Nats-Expected-Last-Subject-Sequence`, naming the
//! stream sequence of the subject's last message (see `tail.rs`); that needs the previous
//! PubAck before the next publish, so a project's publishes go one at a time. With
//! `--fence none` no expectation is sent and publishes are pipelined, trading the stream's
//! guarantee for throughput; the connection rule below is then what keeps the order, except
//! when JetStream refuses one message and accepts the next (counted in
//! `outbox_relay_out_of_order_total`).
//!
//! `handle` sends the publish and keeps its PubAck future; at most `window` are outstanding
//! (one with the subject fence), and when the window is full `handle` first waits for the
//! oldest. `before_ack_prefix` waits
//! for the rest, so the runtime acknowledges exactly the prefix JetStream confirmed, in
//! sequence order; the first unconfirmed event is a failure of that event (held cursor,
//! persisted attempt, retry schedule, dead letter).
//!
//! **Order across connections.** One NATS connection is one ordered byte stream, and the
//! server stores a stream's messages in the order it reads them, so on one connection an event
//! that was lost means every later one was lost too. The client library's automatic reconnect
//! would break that: publishes queued before the disconnect are sent on the new connection,
//! after an earlier one vanished with the old. So each client is allowed exactly one
//! connection (`max_reconnects(1)`, which counts the first), and the relay itself replaces a
//! dead client, with backoff, only after every publish of the old one has been resolved.
//! A retried event whose first publish did reach the stream is dropped by JetStream's
//! duplicate window (`Nats-Msg-Id` = event ID), so it is stored once.

use std::collections::{HashMap, VecDeque};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::{HeaderMap, HeaderName};
use bytes::Bytes;
use outbox_consumer::handler::PartialAck;
use outbox_consumer::{FailureClass, Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio::time::error::Elapsed;

use crate::fence::Fence;
use crate::fenced::Chain;
use crate::link::Link;
use crate::provenance::{self, Ledger, SubjectKind};
use crate::security::Security;
use crate::settings::NatsServer;
use crate::stream::{self, Ensured, StreamSpec};
use crate::subjects::{EventSubjects, reconcile_subject};
use crate::tail::Tail;
use outbox_service::lines::{event_line, reconcile_line};

/// How the publisher reaches NATS.
#[derive(Debug, Clone)]
pub struct PublisherSettings {
    /// Servers, tried in turn.
    pub servers: Vec<NatsServer>,
    /// Credentials and TLS.
    pub security: Security,
    /// Subject prefix.
    pub prefix: String,
    /// The stream, read for the subjects' tails.
    pub stream: String,
    /// How JetStream enforces the order (see `fence.rs`).
    pub fence: Fence,
    /// The project relayed.
    pub project: String,
    /// The event types the consumer declares (`DeliverySettings::event_types`): each is
    /// published to a subject of its own, `<prefix>.<project>.<type token>`, and each of
    /// those subjects is probed at start.
    pub event_types: outbox_core::contract::EventTypes,
    /// The consumer ID, named in reconciliation notices.
    pub consumer: String,
    /// Most publishes awaiting their PubAck.
    pub window: usize,
    /// How long one PubAck may take.
    pub publish_timeout: Duration,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// Client ping interval: how soon a silently dead connection is noticed.
    pub ping_interval: Duration,
}

/// A PubAck not yet received.
pub(crate) type AckFuture = Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>;

/// One message, kept until its PubAck so that it can be sent again.
pub(crate) struct Outgoing {
    /// The event's sequence (a reconciliation notice's: the head it names).
    pub(crate) sequence: i64,
    /// The subject published to.
    pub(crate) subject: String,
    /// `Nats-Msg-Id`.
    pub(crate) msg_id: String,
    /// The headers `Publisher::headers` built.
    pub(crate) headers: HeaderMap,
    /// The body.
    pub(crate) body: Bytes,
}

/// A publish awaiting its PubAck.
pub(crate) struct InFlight {
    /// The message.
    pub(crate) out: Outgoing,
    /// With the stream fence: the stream's last sequence the message named.
    pub(crate) expected: u64,
    /// The PubAck; `None` when the stream already held the message and nothing was sent.
    pub(crate) ack: Option<AckFuture>,
    /// When the relay stops waiting (sent + publish timeout).
    pub(crate) deadline: Instant,
}

/// Mutable state; the runtime calls the handler for one event at a time.
pub(crate) struct Pipeline {
    /// The current client, if any.
    pub(crate) link: Option<Link>,
    /// Publishes awaiting their PubAck, in sequence order.
    pub(crate) in_flight: VecDeque<InFlight>,
    /// With the stream fence: where the relay's next message goes; `None` until the stream's
    /// end is read (at start, after a new client, a refusal or a publish of unknown outcome).
    pub(crate) chain: Option<Chain>,
    /// Consecutive reads of the stream's end without a confirmed publish in between.
    pub(crate) resyncs: u32,
    /// Each subject's last message as far as the relay knows, for the expectation header;
    /// emptied with every new client and every publish of unknown outcome, so it is learned
    /// again from the stream.
    pub(crate) tails: HashMap<String, Tail>,
    /// The first event whose publish failed since the last acknowledgement.
    pub(crate) failed: Option<(i64, HandlerFailure)>,
    /// Index of the next server to try.
    pub(crate) next_server: usize,
    /// Consecutive failed connection attempts, for the backoff.
    pub(crate) connect_failures: u32,
    /// No connection attempt before this.
    pub(crate) retry_connect_at: Option<Instant>,
}

/// The relay's handler and reconciler.
pub struct Publisher {
    pub(crate) settings: PublisherSettings,
    /// The stream as the relay checks it at start, checked (or created) again when
    /// JetStream says it is missing.
    pub(crate) stream: StreamSpec,
    /// Each declared type's subject.
    subjects: EventSubjects,
    /// The CloudEvents source of the project's events (`ce-source`).
    event_source: String,
    /// The database, to recognise the relay's own messages in the stream (see
    /// `provenance`); without it only their headers are checked.
    pub(crate) ledger: Option<Ledger>,
    pub(crate) state: Mutex<Pipeline>,
}

pub(crate) fn class(code: &str) -> HandlerFailure {
    HandlerFailure::new(FailureClass::new(code).expect("built-in classes are valid"))
}

/// A bounded failure class for a publish error.
fn publish_failure(error: &PublishError) -> HandlerFailure {
    class(match error.kind() {
        PublishErrorKind::TimedOut => "nats_ack_timeout",
        PublishErrorKind::StreamNotFound => "nats_no_stream",
        PublishErrorKind::BrokenPipe => "nats_disconnected",
        PublishErrorKind::MaxAckPending => "nats_backpressure",
        PublishErrorKind::WrongLastSequence => "nats_sequence_conflict",
        PublishErrorKind::WrongLastMessageId | PublishErrorKind::Other => "nats_refused",
    })
}

impl Publisher {
    /// A publisher with no connection yet; `connect_now` or the first event makes one.
    pub fn new(settings: PublisherSettings, stream: StreamSpec) -> Self {
        let subjects =
            EventSubjects::new(&settings.prefix, &settings.project, &settings.event_types);
        Self {
            event_source: provenance::event_source(&settings.project),
            settings,
            stream,
            subjects,
            ledger: None,
            state: Mutex::new(Pipeline {
                link: None,
                in_flight: VecDeque::new(),
                chain: None,
                resyncs: 0,
                tails: HashMap::new(),
                failed: None,
                next_server: 0,
                connect_failures: 0,
                retry_connect_at: None,
            }),
        }
    }

    /// Recognise the relay's own messages in the stream by the events of `ledger`.
    pub(crate) fn set_ledger(&mut self, ledger: Ledger) {
        self.ledger = Some(ledger);
    }

    /// Waits for the oldest outstanding PubAck; a failure is remembered as the failure of
    /// that event (the first one only: later ones are retried after it anyway).
    ///
    /// Cancellation-safe: the publish leaves the window only once its outcome is known, so a
    /// handler abandoned at shutdown while waiting here leaves it for `before_ack_prefix`.
    async fn settle_oldest(&self, state: &mut Pipeline) {
        if self.settings.fence == Fence::Stream {
            return self.settle_fenced(state).await;
        }
        let Some(oldest) = state.in_flight.front_mut() else {
            return;
        };
        let (sequence, deadline) = (oldest.out.sequence, oldest.deadline);
        let Some(ack) = oldest.ack.as_mut() else {
            state.in_flight.pop_front();
            return;
        };
        let outcome = tokio::time::timeout_at(deadline, ack).await;
        let settled = state.in_flight.pop_front().expect("the oldest is there");
        let result = Self::outcome(state, &settled.out.subject, sequence, outcome);
        match (result, &state.failed) {
            (Err(failure), None) => state.failed = Some((sequence, failure)),
            (Ok(ack), Some((failed_at, _))) if !ack.duplicate => {
                // Stored after an earlier event that was not: possible only when JetStream
                // refused one message and accepted the next on the same connection.
                tracing::error!(
                    sequence,
                    failed_at,
                    "JetStream stored an event after an earlier one it did not: the stream \
                     holds this project out of order until the earlier event is retried"
                );
                metrics::counter!(crate::metric::OUT_OF_ORDER.name).increment(1);
            }
            _ => {}
        }
    }

    /// The event's result from its PubAck (or the lack of one), keeping the subject's tail: a
    /// confirmed publish moves it; a refused expectation is a definite answer and leaves it (so
    /// a foreign message keeps being refused until it is gone or the relay reconnects); any
    /// other failure leaves the stream's state unknown, so the tails are learned again.
    pub(crate) fn outcome(
        state: &mut Pipeline,
        subject: &str,
        sequence: i64,
        outcome: Result<Result<PublishAck, PublishError>, Elapsed>,
    ) -> Result<PublishAck, HandlerFailure> {
        match outcome {
            Ok(Ok(ack)) => {
                if ack.duplicate {
                    crate::fenced::duplicate(sequence, ack.sequence);
                }
                if let Some(tail) = state.tails.get_mut(subject) {
                    *tail = tail.after_ack(ack.sequence, ack.duplicate, sequence);
                }
                Ok(ack)
            }
            Ok(Err(e)) if matches!(e.kind(), PublishErrorKind::WrongLastSequence) => {
                tracing::error!(
                    sequence,
                    subject,
                    error = %e,
                    "JetStream refused the publish: the subject's last message is not the one \
                     this relay stored last (another writer published to the subject, or a \
                     message was lost); the event fails and is retried on the retry schedule, \
                     never skipped"
                );
                Err(publish_failure(&e))
            }
            unknown => {
                state.tails.clear();
                state.chain = None;
                // NATS drops a publish the user may not make and says so only asynchronously.
                let violation = state.link.as_ref().and_then(|l| l.permissions.take());
                if let Some(violation) = violation {
                    tracing::error!(
                        sequence,
                        subject,
                        error = %violation,
                        "authorization violation on publish: the NATS user may not publish to \
                         the subject"
                    );
                    return Err(class("nats_not_authorized"));
                }
                match unknown {
                    Ok(Err(e)) => {
                        tracing::warn!(sequence, error = %e, "JetStream did not confirm a publish");
                        Err(publish_failure(&e))
                    }
                    _ => {
                        tracing::warn!(sequence, "JetStream did not confirm a publish in time");
                        Err(class("nats_ack_timeout"))
                    }
                }
            }
        }
    }

    /// The subjects events are published to, one per declared type.
    pub fn subjects(&self) -> impl Iterator<Item = &str> {
        self.subjects.iter()
    }

    /// The subject's tail, learned from the stream when the relay does not know it, and
    /// adopted only when the last message is the relay's own (see `provenance`): a stranger
    /// fails the event as a refused expectation would.
    async fn tail(&self, state: &mut Pipeline, subject: &str) -> Result<Tail, HandlerFailure> {
        if let Some(tail) = state.tails.get(subject) {
            return Ok(*tail);
        }
        let for_notice = SubjectKind::of(subject) == SubjectKind::Reconcile;
        let tail = self.learn_tail(state, subject, for_notice).await?.tail;
        state.tails.insert(subject.to_owned(), tail);
        Ok(tail)
    }

    /// The client's JetStream context (the link is ensured).
    pub(crate) fn js(state: &Pipeline) -> Context {
        state.link.as_ref().expect("ensured").js.clone()
    }

    /// Checks the stream again as at start (creating it when missing), after JetStream said
    /// it is gone (an operator deleted it, or the cluster lost it).
    pub(crate) async fn ensure_stream(&self, js: &Context) -> Result<(), HandlerFailure> {
        match stream::ensure(js, &self.stream).await {
            Ok(Ensured::Created) => {
                tracing::warn!(stream = %self.stream.name, "created the stream again");
                Ok(())
            }
            Ok(Ensured::Verified) => {
                tracing::info!(stream = %self.stream.name, "stream matches");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot check the stream");
                Err(class("nats_unavailable"))
            }
        }
    }

    /// The most publishes outstanding at once: one when each names its subject's last.
    fn window(&self) -> usize {
        match self.settings.fence {
            Fence::Subject => 1,
            Fence::Stream | Fence::None => self.settings.window.max(1),
        }
    }

    /// The headers of a message besides those JetStream reads (`Nats-Msg-Id` and the
    /// expectations, which `send` adds): the one place a message's own headers are built.
    fn headers(&self, sequence: i64) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("Outbox-Sequence"),
            sequence.to_string(),
        );
        headers.insert(
            HeaderName::from_static("Outbox-Project"),
            self.settings.project.as_str(),
        );
        headers
    }

    /// An event's headers: [`Publisher::headers`] and the CloudEvents binary-mode attributes
    /// (the sequence zero-padded to 20 digits, so that it orders as a string), with the
    /// writer's trace context when it passed one. Names are static and values moved in where
    /// they are made: a relay builds these for every event.
    fn event_headers(&self, event: &ObservedEvent) -> HeaderMap {
        let mut headers = self.headers(event.sequence);
        let name = HeaderName::from_static;
        headers.insert(name("ce-specversion"), "1.0");
        headers.insert(name("ce-id"), event.event_id.as_str());
        headers.insert(name("ce-source"), self.event_source.as_str());
        headers.insert(name("ce-type"), event.event_type.as_str());
        headers.insert(
            name("ce-time"),
            outbox_core::event::format_timestamp(event.occurred_at),
        );
        headers.insert(name("ce-subject"), event.task_id.as_str());
        headers.insert(name("ce-sequence"), format!("{:020}", event.sequence));
        headers.insert(
            name("ce-dataschema"),
            outbox_core::contract::schema_urn(&event.event_type, event.type_major.into()),
        );
        if let Some(traceparent) = &event.traceparent {
            headers.insert(name("traceparent"), traceparent.as_str());
        }
        headers
    }

    /// Sends one message with the fence's expectations and returns it awaiting its PubAck
    /// (or, with the stream fence, already settled when the stream holds it).
    pub(crate) async fn send(
        &self,
        state: &mut Pipeline,
        out: Outgoing,
    ) -> Result<InFlight, HandlerFailure> {
        self.ensure_link(state).await?;
        let link = state.link.as_ref().expect("ensured");
        let max_payload = link.client.server_info().max_payload;
        if max_payload > 0 && out.body.len() + 256 > max_payload {
            return Err(class("nats_payload_too_large"));
        }
        let mut message = PublishMessage::build()
            .payload(out.body.clone())
            .headers(out.headers.clone())
            .message_id(&out.msg_id);
        let mut expected = 0;
        match self.settings.fence {
            Fence::Subject => {
                let tail = self.tail(state, &out.subject).await?;
                message = message.expected_last_subject_sequence(tail.stream_sequence);
            }
            Fence::Stream => {
                // The chain is the stream's (the project's own): a message of another subject
                // (another event type, a reconciliation notice) follows in it without a new
                // read.
                if state.chain.is_none() {
                    self.resync(state, &out.subject).await?;
                }
                let kind = SubjectKind::of(&out.subject);
                let chain = state.chain.as_mut().expect("just read");
                if chain.kind == kind && chain.holds(out.sequence) {
                    // Stored already (by an earlier attempt, or by another holder of the
                    // lease): sending it again would be dropped as a duplicate at best.
                    return Ok(InFlight {
                        out,
                        expected: 0,
                        ack: None,
                        deadline: Instant::now(),
                    });
                }
                expected = chain.last;
                message = message.expected_last_sequence(expected);
                if let Some(previous) = &chain.last_msg_id {
                    message = message.expected_last_message_id(previous);
                }
                chain.advance(&out.msg_id);
                if chain.kind != kind {
                    // What the end's read said was stored belongs to the history before this
                    // notice; the events after a reconciliation are new, whatever their numbers
                    // (after a failover the same sequence names another event).
                    chain.kind = kind;
                    chain.stored_through = None;
                }
            }
            Fence::None => {}
        }
        crate::gate::pass(out.sequence).await;
        let link = state.link.as_ref().expect("ensured");
        match link.js.send_publish(out.subject.clone(), message).await {
            Ok(ack) => Ok(InFlight {
                out,
                expected,
                ack: Some(Box::pin(ack.into_future())),
                deadline: Instant::now() + self.settings.publish_timeout,
            }),
            Err(e) => {
                tracing::warn!(sequence = out.sequence, error = %e, "could not send a publish to NATS");
                state.chain = None;
                Err(publish_failure(&e))
            }
        }
    }
}

impl Handler for Publisher {
    /// A NATS subject is a project: its order is the stream's, so the relay keeps one lane.
    fn needs_total_order(&self) -> bool {
        true
    }

    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        let mut state = self.state.lock().await;
        if let Some((_, failure)) = &state.failed {
            // An earlier event failed: stop here; before_ack_prefix charges that event.
            return Err(failure.clone());
        }
        while state.in_flight.len() >= self.window() {
            self.settle_oldest(&mut state).await;
            if let Some((_, failure)) = &state.failed {
                return Err(failure.clone());
            }
        }
        let out = Outgoing {
            sequence: event.sequence,
            subject: self.subjects.of(&event.event_type),
            msg_id: event.event_id.clone(),
            headers: self.event_headers(event),
            body: Bytes::from(event_line(event)),
        };
        let sent = self.send(&mut state, out).await?;
        state.in_flight.push_back(sent);
        Ok(())
    }

    async fn before_ack_prefix(&self, handled: &[ObservedEvent]) -> Result<(), PartialAck> {
        let mut state = self.state.lock().await;
        while !state.in_flight.is_empty() {
            self.settle_oldest(&mut state).await;
        }
        let Some((failed_at, failure)) = state.failed.take() else {
            return Ok(());
        };
        let durable = handled
            .iter()
            .position(|e| e.sequence == failed_at)
            .unwrap_or(0);
        Err(PartialAck { durable, failure })
    }
}

impl Reconciler for Publisher {
    /// Publishes the reconciliation notice to `<prefix>.<project>.reconcile` (the same JSON
    /// line `consume` prints), so downstream services learn that history was skipped and
    /// which tasks are live, and waits for its PubAck.
    async fn reconcile(&self, live: &LiveSet) -> Result<(), HandlerFailure> {
        let mut state = self.state.lock().await;
        while !state.in_flight.is_empty() {
            self.settle_oldest(&mut state).await;
        }
        state.failed = None;
        let subject = reconcile_subject(&self.settings.prefix, &self.settings.project);
        let msg_id = format!(
            "reconcile:{}:{}:{}",
            self.settings.project, self.settings.consumer, live.head_sequence
        );
        let out = Outgoing {
            sequence: live.head_sequence,
            subject,
            msg_id,
            headers: self.headers(live.head_sequence),
            body: Bytes::from(reconcile_line(live, &self.settings.consumer)),
        };
        let sent = self.send(&mut state, out).await?;
        state.in_flight.push_back(sent);
        while !state.in_flight.is_empty() {
            self.settle_oldest(&mut state).await;
        }
        match state.failed.take() {
            Some((_, failure)) => Err(failure),
            None => Ok(()),
        }
    }
}
