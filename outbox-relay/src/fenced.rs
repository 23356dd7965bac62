//! The stream fence: a window of publishes in flight, each stored only right after the one
//! before it.
//!
//! The relay reads where the stream ends (its last sequence `L`) and its project's last message,
//! of whichever of its subjects (every event type's and the reconciliation notices': one read
//! of `<prefix>.<project>.>`), adopted only when it is the relay's own (see `provenance`), so a
//! stranger on the subject of a type the relay does not even declare is not published after;
//! then it sends message `i` of the
//! window with `Nats-Expected-Last-Sequence: L + i` and, from the second on,
//! `Nats-Expected-Last-Msg-Id` naming message `i - 1`. JetStream stores a message only when the
//! stream's last sequence, and its last message ID, are exactly those; so a message is stored
//! only right after its predecessor, a message refused is never overtaken by a later one (the
//! later one names the refused one as the stream's last, which it is not), and any other
//! writer's message, stored anywhere in the window, makes everything behind it refused. The
//! sequence alone would not do: after one foreign message in the window, message `i` is
//! refused but message `i + 1` names exactly the foreign message's sequence and would be
//! stored without `i`. The first message after a read names no ID: the stream's notion of its
//! last ID is the last one it *stored*, which an operator's removal of that message does not
//! change, while its last sequence is what the relay just read.
//!
//! A refusal, or a duplicate that JetStream says it stored at another position than the relay
//! expected, means the relay's picture of the stream is wrong (another holder of the lease
//! published, a foreign writer, a second relay on the stream). The relay then waits for every
//! answer still due on the window (all were sent on one connection after the refused one, so
//! none can land after what follows), reads the stream's end again, drops the events the
//! stream already holds (the project's last message names its `Outbox-Sequence`, and every
//! earlier event of the window is before it) and sends the rest again, unless an earlier event
//! of the window already failed (then nothing behind it is sent before its retry). When the
//! project's last
//! message is a stranger's, the event fails (`nats_sequence_conflict`) and follows the retry
//! schedule, as with the subject fence.
//!
//! Several relays may share a stream: the fence keeps each project's order, but each one's
//! window is refused whenever another relay writes, so one relay per stream is what pipelines.

use async_nats::jetstream::context::PublishErrorKind;
use outbox_consumer::HandlerFailure;

use crate::provenance::SubjectKind;
use crate::publisher::{InFlight, Pipeline, Publisher, class};
use crate::subjects::project_prefix;
use crate::tail::{self, TailError};

/// Consecutive reads of the stream's end, without a publish confirmed in between, after which
/// the event fails to the retry schedule instead of being sent again at once.
const MAX_RESYNCS: u32 = 16;

/// Where the relay's next message goes in the stream, as far as it knows.
#[derive(Debug, Clone)]
pub struct Chain {
    /// The kind of the project's last message read with the stream's end (events of any type,
    /// or a reconciliation notice), or of the last message of the other kind sent in this chain
    /// (`stored_through` then no longer applies).
    pub kind: SubjectKind,
    /// The stream's last sequence: the next message names it.
    pub last: u64,
    /// The ID of the relay's message at `last`, once the relay published in this chain.
    pub last_msg_id: Option<String>,
    /// The `Outbox-Sequence` of the project's last message when the end was read: events (of
    /// every type, the chain being one across the event subjects) up to it are in the stream
    /// already.
    pub stored_through: Option<i64>,
}

impl Chain {
    /// Whether the stream held the message of `sequence` when the end was read.
    pub fn holds(&self, sequence: i64) -> bool {
        self.stored_through
            .is_some_and(|through| sequence <= through)
    }

    /// After sending `msg_id`: the next message follows it.
    pub fn advance(&mut self, msg_id: &str) {
        self.last += 1;
        self.last_msg_id = Some(msg_id.to_owned());
    }
}

impl Publisher {
    /// Reads the stream's last sequence, then the last message of the project's subjects
    /// together (which must be the relay's own, whichever subject it is on), and starts a new
    /// chain there; `subject` is the one about to be sent.
    pub(crate) async fn resync(
        &self,
        state: &mut Pipeline,
        subject: &str,
    ) -> Result<(), HandlerFailure> {
        let js = Publisher::js(state);
        let own = project_prefix(&self.settings.prefix, &self.settings.project);
        let every_subject = format!("{own}.>");
        for _ in 0..3 {
            let last = match tail::stream_end(&js, &self.settings.stream, &own).await {
                Ok(end) if !end.foreign_subjects.is_empty() => {
                    tracing::error!(
                        stream = %self.settings.stream,
                        foreign_subjects = ?end.foreign_subjects,
                        "the stream holds messages of other subjects than this project's: the \
                         stream fence needs the stream to itself (another relay publishes into \
                         it); the event fails and is retried on the retry schedule, never \
                         skipped (give each project its own stream, or use --fence subject)"
                    );
                    return Err(class("nats_sequence_conflict"));
                }
                Ok(end) => end.last_sequence,
                Err(TailError::StreamMissing(detail)) => {
                    tracing::warn!(error = %detail, "the stream is missing; checking it again");
                    self.ensure_stream(&js).await?;
                    continue;
                }
                Err(TailError::Unavailable(detail)) => {
                    tracing::warn!(error = %detail, "cannot read the stream's end");
                    return Err(class("nats_unavailable"));
                }
            };
            let for_notice = SubjectKind::of(subject) == SubjectKind::Reconcile;
            let own = self.learn_tail(state, &every_subject, for_notice).await?;
            if own.tail.stream_sequence > last {
                // Stored between the two reads: read both again.
                continue;
            }
            tracing::info!(
                subject,
                stream_last_sequence = last,
                "read the stream's end; publishing after it"
            );
            let kind = match own.tail.stream_sequence {
                0 => SubjectKind::of(subject),
                _ => SubjectKind::of(&own.subject),
            };
            state.chain = Some(Chain {
                kind,
                last,
                last_msg_id: None,
                stored_through: own.tail.outbox_sequence,
            });
            return Ok(());
        }
        tracing::warn!("the stream kept growing while the relay read its end");
        Err(class("nats_sequence_conflict"))
    }

    /// Waits for the oldest PubAck of a stream-fenced window (see the module docs).
    pub(crate) async fn settle_fenced(&self, state: &mut Pipeline) {
        let Some(oldest) = state.in_flight.front_mut() else {
            return;
        };
        let (sequence, expected, deadline) =
            (oldest.out.sequence, oldest.expected, oldest.deadline);
        let Some(ack) = oldest.ack.as_mut() else {
            state.in_flight.pop_front();
            return;
        };
        let outcome = tokio::time::timeout_at(deadline, ack).await;
        match outcome {
            Ok(Ok(ack)) if ack.sequence == expected + 1 => {
                if ack.duplicate {
                    duplicate(sequence, ack.sequence);
                }
                state.in_flight.pop_front();
                state.resyncs = 0;
            }
            Ok(Ok(ack)) => {
                tracing::info!(
                    sequence,
                    stream_sequence = ack.sequence,
                    expected = expected + 1,
                    duplicate = ack.duplicate,
                    "the stream holds this event elsewhere than the relay expected (another \
                     holder of the lease published it); reading the stream's end again"
                );
                self.recover(state).await;
            }
            Ok(Err(e))
                if matches!(
                    e.kind(),
                    PublishErrorKind::WrongLastSequence | PublishErrorKind::WrongLastMessageId
                ) =>
            {
                tracing::info!(
                    sequence,
                    error = %e,
                    "JetStream refused the publish: the stream does not end where the relay \
                     expected (another writer published); reading the stream's end again"
                );
                metrics::counter!(crate::metric::FENCE_REFUSALS.name).increment(1);
                self.recover(state).await;
            }
            unknown => {
                let settled = state.in_flight.pop_front().expect("the oldest is there");
                state.chain = None;
                if let Err(failure) =
                    Publisher::outcome(state, &settled.out.subject, sequence, unknown)
                {
                    if state.failed.is_none() {
                        state.failed = Some((sequence, failure));
                    }
                }
            }
        }
    }

    /// After a refusal at the front of the window: every answer still due is awaited, the
    /// stream's end read again, and what the stream does not hold yet sent again.
    async fn recover(&self, state: &mut Pipeline) {
        let mut pending: Vec<InFlight> = state.in_flight.drain(..).collect();
        for entry in pending.iter_mut().skip(1) {
            if let Some(ack) = entry.ack.as_mut() {
                // Any answer will do: whatever was stored was stored in order.
                let _ = tokio::time::timeout_at(entry.deadline, ack).await;
            }
        }
        state.chain = None;
        if state.failed.is_some() {
            // An earlier event of the window failed: nothing after it may be stored before it
            // is (a resent later event would be stored without it, and the stream's last
            // message would then claim it stored). The runtime retries from that event.
            return;
        }
        state.resyncs += 1;
        if state.resyncs > MAX_RESYNCS {
            tracing::warn!(
                resyncs = state.resyncs,
                "the stream's end keeps moving under the relay (another writer on the stream); \
                 the event fails and is retried on the retry schedule"
            );
            state.resyncs = 0;
            let sequence = pending[0].out.sequence;
            state
                .failed
                .get_or_insert((sequence, class("nats_sequence_conflict")));
            return;
        }
        for entry in pending {
            let sequence = entry.out.sequence;
            match self.send(state, entry.out).await {
                Ok(sent) => state.in_flight.push_back(sent),
                Err(failure) => {
                    state.failed.get_or_insert((sequence, failure));
                    return;
                }
            }
        }
    }
}

/// A PubAck saying the stream held the event already, where the relay expected it: another
/// publish of it (a retry, or another holder of the lease) was stored first.
pub(crate) fn duplicate(sequence: i64, stream_sequence: u64) {
    tracing::info!(
        sequence,
        stream_sequence,
        "JetStream already held this event (a duplicate): another publish of it was stored first"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_names_the_message_before_each() {
        let mut chain = Chain {
            kind: SubjectKind::Events,
            last: 41,
            last_msg_id: None,
            stored_through: Some(7),
        };
        assert!(chain.holds(7) && chain.holds(3) && !chain.holds(8));
        chain.advance("e8");
        assert_eq!((chain.last, chain.last_msg_id.as_deref()), (42, Some("e8")));
        let empty = Chain {
            stored_through: None,
            ..chain
        };
        assert!(!empty.holds(1));
    }
}
