//! What the stream already holds at the end of one subject: the stream sequence of its last
//! message, which the relay's next publish to that subject names in
//! `Nats-Expected-Last-Subject-Sequence`, and that message's `Outbox-Sequence`.
//!
//! JetStream stores a publish carrying the header only when the subject's last message has
//! exactly that stream sequence; otherwise it refuses it and stores nothing. Since every
//! publish names the message before it, a message refused (or lost) can never be overtaken
//! by the next one: per-project order is enforced by the stream, not inferred from the
//! connection. The relay learns the tail from the stream on every new connection and after
//! every publish whose outcome it does not know, and otherwise follows it from its own
//! PubAcks.

use async_nats::jetstream::Context;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::stream::LastRawMessageErrorKind;

/// The end of one subject in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    /// Stream sequence of the subject's last message; 0 when the subject holds none.
    pub stream_sequence: u64,
    /// That message's `Outbox-Sequence` header, when it has a numeric one (a message the
    /// relay did not write may have none).
    pub outbox_sequence: Option<i64>,
}

impl Tail {
    /// The tail after a PubAck: a new message is the subject's last; a duplicate (a repeat
    /// JetStream dropped) points at the copy stored earlier, which is the last only if
    /// nothing followed it, so the tail never moves back.
    pub fn after_ack(self, stream_sequence: u64, duplicate: bool, outbox_sequence: i64) -> Self {
        if duplicate && stream_sequence < self.stream_sequence {
            return self;
        }
        Self {
            stream_sequence,
            outbox_sequence: Some(outbox_sequence),
        }
    }
}

/// A subject's last message as read from the stream: its [`Tail`] and the headers that tell
/// whose it is (see `provenance`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastMessage {
    /// The message's subject (the one asked for when it holds none): one subject, or with a
    /// wildcard (`<prefix>.<project>.>`) the one of the last message of them all.
    pub subject: String,
    /// Where the subject ends.
    pub tail: Tail,
    /// The `Outbox-Project` header.
    pub project: Option<String>,
    /// The `Nats-Msg-Id` header.
    pub msg_id: Option<String>,
    /// The `ce-id` and `ce-source` headers: the relay's event lines carry the event ID and the
    /// project's URN there (see `provenance`, which tells a lost history by them).
    pub ce_id: Option<String>,
    /// The `ce-source` header.
    pub ce_source: Option<String>,
}

/// Why the tail could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TailError {
    /// JetStream says the stream does not exist (deleted, or lost by the cluster).
    #[error("{0}")]
    StreamMissing(String),
    /// Anything else: the server did not answer, or answered with another error.
    #[error("{0}")]
    Unavailable(String),
}

/// Where the stream ends, and whose subjects it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEnd {
    /// The stream's last sequence: what the next message of the stream fence names (it stays
    /// after the last message is removed; sequences are never reused).
    pub last_sequence: u64,
    /// Subjects holding messages that are not under the relay's own prefix (at most a few).
    pub foreign_subjects: Vec<String>,
}

/// Reads the stream's last sequence and the subjects it holds messages on, in one request (and
/// more pages only for a stream with very many subjects), naming those not under `own`
/// (`<prefix>.<project>`): the stream fence needs the stream to itself.
pub async fn stream_end(js: &Context, stream: &str, own: &str) -> Result<StreamEnd, TailError> {
    use futures_util::StreamExt;

    let handle = js
        .get_stream_no_info(stream)
        .await
        .map_err(|e| TailError::Unavailable(format!("cannot look up stream {stream}: {e}")))?;
    let failed = |e: async_nats::jetstream::context::RequestError| {
        let detail = format!("cannot read the state of stream {stream}: {e}");
        let missing = std::error::Error::source(&e)
            .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
            .is_some_and(|js_err| js_err.error_code() == ErrorCode::STREAM_NOT_FOUND);
        if missing {
            TailError::StreamMissing(detail)
        } else {
            TailError::Unavailable(detail)
        }
    };
    let mut info = handle.info_with_subjects(">").await.map_err(failed)?;
    let last_sequence = info.info.state.last_sequence;
    let mut foreign_subjects = Vec::new();
    let own_tokens = format!("{own}.");
    while let Some(entry) = info.next().await {
        let (subject, _) = entry.map_err(failed)?;
        if !subject.starts_with(&own_tokens) {
            foreign_subjects.push(subject);
            if foreign_subjects.len() >= 3 {
                break;
            }
        }
    }
    Ok(StreamEnd {
        last_sequence,
        foreign_subjects,
    })
}

/// Reads the last message of `subject` in `stream`; `subject` may be a wildcard, and the
/// last message of every subject it matches is read (JetStream's `last_by_subj`).
pub async fn learn(js: &Context, stream: &str, subject: &str) -> Result<LastMessage, TailError> {
    let handle = js
        .get_stream_no_info(stream)
        .await
        .map_err(|e| TailError::Unavailable(format!("cannot look up stream {stream}: {e}")))?;
    match handle.get_last_raw_message_by_subject(subject).await {
        Ok(message) => {
            // A standard name (`Nats-Msg-Id`) is parsed into the client's own variant, which
            // a lookup by text does not find: look it up by its parsed name first.
            let header = |name: &str| {
                name.parse::<async_nats::header::HeaderName>()
                    .ok()
                    .and_then(|parsed| message.headers.get(parsed))
                    .or_else(|| message.headers.get(name))
                    .map(|v| v.as_str().to_owned())
            };
            Ok(LastMessage {
                subject: message.subject.to_string(),
                tail: Tail {
                    stream_sequence: message.sequence,
                    outbox_sequence: header("Outbox-Sequence").and_then(|v| v.parse().ok()),
                },
                project: header("Outbox-Project"),
                msg_id: header("Nats-Msg-Id"),
                ce_id: header("ce-id"),
                ce_source: header("ce-source"),
            })
        }
        Err(e) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => Ok(LastMessage {
            subject: subject.to_owned(),
            tail: Tail {
                stream_sequence: 0,
                outbox_sequence: None,
            },
            project: None,
            msg_id: None,
            ce_id: None,
            ce_source: None,
        }),
        Err(e) => {
            let detail =
                format!("cannot read the last message of {subject} in stream {stream}: {e}");
            let missing = matches!(
                e.kind(),
                LastRawMessageErrorKind::JetStream(js_err)
                    if js_err.error_code() == ErrorCode::STREAM_NOT_FOUND
            );
            Err(if missing {
                TailError::StreamMissing(detail)
            } else {
                TailError::Unavailable(detail)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_message_moves_the_tail() {
        let tail = Tail {
            stream_sequence: 10,
            outbox_sequence: Some(4),
        };
        assert_eq!(
            tail.after_ack(12, false, 5),
            Tail {
                stream_sequence: 12,
                outbox_sequence: Some(5)
            }
        );
    }

    #[test]
    fn a_duplicate_of_an_older_message_leaves_it() {
        let tail = Tail {
            stream_sequence: 10,
            outbox_sequence: Some(4),
        };
        assert_eq!(tail.after_ack(7, true, 3), tail);
        assert_eq!(
            tail.after_ack(10, true, 4),
            tail,
            "the duplicate of the last message"
        );
    }
}
