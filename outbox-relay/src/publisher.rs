//! The relay's handler: each observed event becomes one JetStream publish.
//!
//! **Order enforced by the stream.** Every publish carries `Nats-Expected-Last-Subject-Sequence`,
//! naming the stream sequence of the subject's last message (see `tail.rs`), so JetStream
//! stores it only right after the message the relay published before it. That needs the
//! previous PubAck before the next publish, so a project's publishes go one at a time. With
//! `--no-expected-sequence` the header is left out and publishes are pipelined instead (up to
//! `window` outstanding), trading the stream's guarantee for throughput; the connection rule
//! below is then what keeps the order, except when JetStream refuses one message and accepts
//! the next (counted in `outbox_relay_out_of_order_total`).
//!
//! `handle` sends the publish and keeps its PubAck future; at most `window` are outstanding
//! (one with the expectation), and when the window is full `handle` first waits for the
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

use async_nats::HeaderMap;
use async_nats::client::Client;
use async_nats::connection::State;
use async_nats::jetstream::Context;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use bytes::Bytes;
use outbox_consumer::{
    FailureClass, Handler, HandlerFailure, LiveSet, ObservedEvent, PartialAck, Reconciler,
};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio::time::error::Elapsed;

use crate::diagnose::{PermissionWatch, describe_connect_error};
use crate::provenance::{self, Ledger, Provenance, SubjectKind};
use crate::security::Security;
use crate::settings::{NatsServer, event_subject, reconcile_subject};
use crate::stream::{self, Ensured, StreamSpec};
use crate::tail::{self, Tail, TailError};
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
    /// Whether every publish carries `Nats-Expected-Last-Subject-Sequence` (one publish at a
    /// time) or none does (pipelined up to `window`).
    pub expect_sequence: bool,
    /// The project relayed.
    pub project: String,
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
type AckFuture = Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>;

/// A publish awaiting its PubAck.
struct InFlight {
    /// The event's sequence.
    sequence: i64,
    /// The subject published to.
    subject: String,
    /// The PubAck.
    ack: AckFuture,
    /// When the relay stops waiting (sent + publish timeout).
    deadline: Instant,
}

/// One client and its JetStream context; never reconnected (see the module docs).
struct Link {
    client: Client,
    js: Context,
    /// Permissions violations the server reported on this client.
    permissions: PermissionWatch,
}

/// Mutable state; the runtime calls the handler for one event at a time.
struct Pipeline {
    /// The current client, if any.
    link: Option<Link>,
    /// Publishes awaiting their PubAck, in sequence order.
    in_flight: VecDeque<InFlight>,
    /// Each subject's last message as far as the relay knows, for the expectation header;
    /// emptied with every new client and every publish of unknown outcome, so it is learned
    /// again from the stream.
    tails: HashMap<String, Tail>,
    /// The first event whose publish failed since the last acknowledgement.
    failed: Option<(i64, HandlerFailure)>,
    /// Index of the next server to try.
    next_server: usize,
    /// Consecutive failed connection attempts, for the backoff.
    connect_failures: u32,
    /// No connection attempt before this.
    retry_connect_at: Option<Instant>,
}

/// The relay's handler and reconciler.
pub struct Publisher {
    settings: PublisherSettings,
    /// The stream as the relay checks it at start, checked (or created) again when
    /// JetStream says it is missing.
    stream: StreamSpec,
    subject: String,
    /// The database, to recognise the relay's own messages in the stream (see
    /// `provenance`); without it only their headers are checked.
    ledger: Option<Ledger>,
    state: Mutex<Pipeline>,
}

fn class(code: &str) -> HandlerFailure {
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
        let subject = event_subject(&settings.prefix, &settings.project);
        Self {
            settings,
            stream,
            subject,
            ledger: None,
            state: Mutex::new(Pipeline {
                link: None,
                in_flight: VecDeque::new(),
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

    /// Connects once, to any server, for the start-up checks; the error names each server.
    pub async fn connect_now(&self) -> Result<(Context, PermissionWatch), String> {
        let mut errors = Vec::new();
        let mut state = self.state.lock().await;
        for _ in 0..self.settings.servers.len() {
            match self.open(&mut state).await {
                Ok(()) => {
                    let link = state.link.as_ref().expect("just opened");
                    return Ok((link.js.clone(), link.permissions.clone()));
                }
                Err(e) => errors.push(e),
            }
        }
        Err(errors.join("; "))
    }

    /// Opens a new client to the next server in turn.
    async fn open(&self, state: &mut Pipeline) -> Result<(), String> {
        let server = &self.settings.servers[state.next_server % self.settings.servers.len()];
        state.next_server = state.next_server.wrapping_add(1);
        let permissions = PermissionWatch::default();
        let options = permissions
            .watch(
                self.settings
                    .security
                    .apply(async_nats::ConnectOptions::new()),
            )
            .name(format!(
                "outbox-relay {}/{}",
                self.settings.project, self.settings.consumer
            ))
            .max_reconnects(1)
            .ignore_discovered_servers()
            .connection_timeout(self.settings.connect_timeout)
            .ping_interval(self.settings.ping_interval);
        let client = options
            .connect(server.address.as_str())
            .await
            .map_err(|e| describe_connect_error(&e, &server.address, &self.settings.security))?;
        let js = async_nats::jetstream::ContextBuilder::new()
            .timeout(self.settings.publish_timeout)
            .max_ack_inflight(self.settings.window.max(1) + 1)
            .backpressure_on_inflight(true)
            .build(client.clone());
        tracing::info!(server = %server.address, "connected to NATS");
        state.link = Some(Link {
            client,
            js,
            permissions,
        });
        state.tails.clear();
        Ok(())
    }

    /// Whether the current client can still take publishes: connected, and on the
    /// connection it started with.
    fn link_usable(link: &Link) -> bool {
        link.client.connection_state() == State::Connected
            && link
                .client
                .statistics()
                .connects
                .load(std::sync::atomic::Ordering::Relaxed)
                <= 1
    }

    /// A usable client, replacing a dead one (with backoff) once nothing of the old one is
    /// still outstanding.
    async fn ensure_link(&self, state: &mut Pipeline) -> Result<(), HandlerFailure> {
        if state.link.as_ref().is_some_and(Self::link_usable) {
            return Ok(());
        }
        if !state.in_flight.is_empty() {
            // The old connection's publishes must be resolved first: they fail once it is
            // gone, and a new connection must not overtake them.
            return Err(class("nats_disconnected"));
        }
        if let Some(old) = state.link.take() {
            tracing::warn!("NATS connection lost; opening a new one");
            drop(old);
        }
        if let Some(at) = state.retry_connect_at {
            tokio::time::sleep_until(at).await;
        }
        match self.open(state).await {
            Ok(()) => {
                state.connect_failures = 0;
                state.retry_connect_at = None;
                Ok(())
            }
            Err(e) => {
                state.connect_failures = state.connect_failures.saturating_add(1);
                // The consumers' one backoff: doubling, capped, with jitter so that restarted
                // relays do not reconnect in lock-step.
                let delay = outbox_consumer::backoff(state.connect_failures - 1, rand::random());
                tracing::warn!(
                    error = %e,
                    retry_in = %outbox_core::Readable(delay),
                    "NATS unavailable"
                );
                state.retry_connect_at = Some(Instant::now() + delay);
                Err(class("nats_unavailable"))
            }
        }
    }

    /// Waits for the oldest outstanding PubAck; a failure is remembered as the failure of
    /// that event (the first one only: later ones are retried after it anyway).
    ///
    /// Cancellation-safe: the publish leaves the window only once its outcome is known, so a
    /// handler abandoned at shutdown while waiting here leaves it for `before_ack_prefix`.
    async fn settle_oldest(&self, state: &mut Pipeline) {
        let Some(oldest) = state.in_flight.front_mut() else {
            return;
        };
        let (sequence, deadline) = (oldest.sequence, oldest.deadline);
        let outcome = tokio::time::timeout_at(deadline, &mut oldest.ack).await;
        let settled = state.in_flight.pop_front().expect("the oldest is there");
        let result = Self::outcome(state, &settled.subject, sequence, outcome);
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
                metrics::counter!("outbox_relay_out_of_order_total").increment(1);
            }
            _ => {}
        }
    }

    /// The event's result from its PubAck (or the lack of one), keeping the subject's tail: a
    /// confirmed publish moves it; a refused expectation is a definite answer and leaves it (so
    /// a foreign message keeps being refused until it is gone or the relay reconnects); any
    /// other failure leaves the stream's state unknown, so the tails are learned again.
    fn outcome(
        state: &mut Pipeline,
        subject: &str,
        sequence: i64,
        outcome: Result<Result<PublishAck, PublishError>, Elapsed>,
    ) -> Result<PublishAck, HandlerFailure> {
        match outcome {
            Ok(Ok(ack)) => {
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

    /// The subject events are published to.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The subject's tail, learned from the stream when the relay does not know it, and
    /// adopted only when the last message is the relay's own (see `provenance`): a stranger
    /// fails the event as a refused expectation would.
    async fn tail(&self, state: &mut Pipeline, subject: &str) -> Result<Tail, HandlerFailure> {
        if let Some(tail) = state.tails.get(subject) {
            return Ok(*tail);
        }
        let js = state.link.as_ref().expect("ensured").js.clone();
        let mut learned = tail::learn(&js, &self.settings.stream, subject).await;
        if let Err(TailError::StreamMissing(detail)) = &learned {
            // The stream is gone (an operator deleted it, or the cluster lost it): the relay
            // checks it again as at start, which creates it when missing, and reads again.
            tracing::warn!(error = %detail, "the stream is missing; checking it again");
            match stream::ensure(&js, &self.stream).await {
                Ok(Ensured::Created) => {
                    tracing::warn!(stream = %self.stream.name, "created the stream again")
                }
                Ok(Ensured::Verified) => {
                    tracing::info!(stream = %self.stream.name, "stream matches")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot check the stream");
                    return Err(class("nats_unavailable"));
                }
            }
            learned = tail::learn(&js, &self.settings.stream, subject).await;
        }
        match learned {
            Ok(last) => {
                let kind = match subject == self.subject {
                    true => SubjectKind::Events,
                    false => SubjectKind::Reconcile,
                };
                let project = &self.settings.project;
                match provenance::check(self.ledger.as_ref(), &last, project, kind).await {
                    Ok(Provenance::Own) => {}
                    Ok(Provenance::Stranger(why)) => {
                        tracing::error!(
                            subject,
                            stream_sequence = last.tail.stream_sequence,
                            "the subject's last message in the stream is not one this relay \
                             stored ({why}); not publishing after it: the event fails and is \
                             retried on the retry schedule, never skipped (remove the message \
                             from the stream, then replay what was parked)"
                        );
                        return Err(class("nats_sequence_conflict"));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot check the stream's last message");
                        return Err(class("database_unavailable"));
                    }
                }
                let tail = last.tail;
                tracing::info!(
                    subject,
                    stream_sequence = tail.stream_sequence,
                    outbox_sequence = tail
                        .outbox_sequence
                        .map_or_else(|| "none".to_owned(), |s| s.to_string()),
                    "read the subject's last message in the stream"
                );
                state.tails.insert(subject.to_owned(), tail);
                Ok(tail)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the stream's last message");
                Err(class("nats_unavailable"))
            }
        }
    }

    /// The most publishes outstanding at once: one when each names the one before it.
    fn window(&self) -> usize {
        if self.settings.expect_sequence {
            1
        } else {
            self.settings.window.max(1)
        }
    }

    /// Sends one message and returns its PubAck future.
    async fn send(
        &self,
        state: &mut Pipeline,
        subject: String,
        msg_id: &str,
        sequence: i64,
        body: String,
    ) -> Result<AckFuture, HandlerFailure> {
        self.ensure_link(state).await?;
        let expected = if self.settings.expect_sequence {
            Some(self.tail(state, &subject).await?.stream_sequence)
        } else {
            None
        };
        let link = state.link.as_ref().expect("ensured");
        let max_payload = link.client.server_info().max_payload;
        if max_payload > 0 && body.len() + 256 > max_payload {
            return Err(class("nats_payload_too_large"));
        }
        let mut headers = HeaderMap::new();
        headers.insert("Outbox-Sequence", sequence.to_string().as_str());
        headers.insert("Outbox-Project", self.settings.project.as_str());
        let mut message = PublishMessage::build()
            .payload(Bytes::from(body))
            .headers(headers)
            .message_id(msg_id);
        if let Some(expected) = expected {
            message = message.expected_last_subject_sequence(expected);
        }
        match link.js.send_publish(subject, message).await {
            Ok(ack) => Ok(Box::pin(ack.into_future())),
            Err(e) => {
                tracing::warn!(sequence, error = %e, "could not send a publish to NATS");
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
        let ack = self
            .send(
                &mut state,
                self.subject.clone(),
                &event.event_id,
                event.sequence,
                event_line(event),
            )
            .await?;
        state.in_flight.push_back(InFlight {
            sequence: event.sequence,
            subject: self.subject.clone(),
            ack,
            deadline: Instant::now() + self.settings.publish_timeout,
        });
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
        let ack = self
            .send(
                &mut state,
                subject.clone(),
                &msg_id,
                live.head_sequence,
                reconcile_line(live, &self.settings.consumer),
            )
            .await?;
        let outcome = tokio::time::timeout(self.settings.publish_timeout, ack).await;
        Self::outcome(&mut state, &subject, live.head_sequence, outcome).map(drop)
    }
}
