//! What a handler receives, and how it reports failure.

use chrono::{DateTime, Utc};
use outbox_core::{ConsumerId, Prior, ProjectId};
use serde::Serialize;

/// A committed event as an observer sees it: written by another process (or this one), and
/// delivered to this consumer. Handlers must be idempotent: an event can arrive again after a
/// crash between handling and acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObservedEvent {
    /// Always true: this is an observation, never the writer's own emission. Observers must
    /// not repeat writer-owned delete side effects.
    pub observed: bool,
    /// The event type (`task:deleted`).
    pub event_type: String,
    /// The project whose stream this is.
    pub project_id: ProjectId,
    /// The consumer receiving it.
    pub consumer_id: ConsumerId,
    /// Position in the project's stream, dense from 1.
    pub sequence: i64,
    /// Stable identity: deduplicate on `(consumer_id, event_id)`.
    pub event_id: String,
    /// The deleted task.
    pub task_id: String,
    /// When it was deleted: the deletion identity (RFC 3339 UTC, microseconds, as in the ID).
    #[serde(serialize_with = "rfc3339_micros")]
    pub deleted_at: DateTime<Utc>,
    /// The process that wrote the event (the origin).
    pub writer_process_id: String,
    /// When the event was written.
    #[serde(serialize_with = "rfc3339_micros")]
    pub occurred_at: DateTime<Utc>,
    /// Payload layout version.
    pub payload_version: i32,
    /// The task's state before deletion.
    pub prior: Prior,
    /// True when an operator asked to replay this dead letter; it arrives outside sequence
    /// order.
    pub replay: bool,
    /// Which delivery attempt this is (1 for the first).
    pub attempt: u32,
}

fn rfc3339_micros<S: serde::Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&outbox_core::format_timestamp(*at))
}

/// A bounded failure code, `[a-z0-9_]{1,64}`: it is stored and shown to operators, so it never
/// carries error text, payloads or secrets.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct FailureClass(String);

/// A failure class was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid failure class {0:?}: use 1 to 64 characters from a-z, 0-9 and _")]
pub struct FailureClassError(pub String);

impl FailureClass {
    /// Validates a failure code.
    pub fn new(code: impl Into<String>) -> Result<Self, FailureClassError> {
        let code = code.into();
        let ok = (1..=64).contains(&code.len())
            && code
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if ok {
            Ok(Self(code))
        } else {
            Err(FailureClassError(code))
        }
    }

    /// The code.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A stored payload could not be decoded (the runtime fails and parks such an event).
    pub fn undecodable_payload() -> Self {
        Self("undecodable_payload".into())
    }

    /// A handler failed without saying why.
    pub fn handler_error() -> Self {
        Self("handler_error".into())
    }

    /// The handler did not finish before shutdown's grace period ended.
    pub fn abandoned() -> Self {
        Self("abandoned_at_shutdown".into())
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A handler's failure. Usually a failure of the event ([`HandlerFailure::new`]): it is
/// retried on the schedule, then parked. Two failures are not the event's fault and are never
/// charged to it: the sink itself is broken ([`HandlerFailure::stop`]), or shutdown interrupted
/// the handler ([`HandlerFailure::abandon`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerFailure {
    /// Bounded code recorded in `lifecycle_deliveries.last_failure_class`.
    pub class: FailureClass,
    /// Whose failure this is.
    kind: FailureKind,
}

/// Whose failure a [`HandlerFailure`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FailureKind {
    /// The event's: retry on the schedule, then park.
    Event,
    /// The sink's (stdout closed, a child command that cannot run): stop the consumer.
    Stop(String),
    /// Shutdown's: deliver again on the next run, uncounted.
    Abandon,
}

impl HandlerFailure {
    /// A failure of the event, of the given class.
    pub fn new(class: FailureClass) -> Self {
        Self {
            class,
            kind: FailureKind::Event,
        }
    }

    /// The sink itself cannot work (its output is closed, its command cannot be run), so no
    /// event can succeed. The consumer stops with [`crate::ConsumerError::SinkFailed`]
    /// carrying `reason`, without acknowledging the batch or recording a failure: the next
    /// run delivers the same events again.
    pub fn stop(reason: impl Into<String>) -> Self {
        Self {
            class: FailureClass("sink_failed".into()),
            kind: FailureKind::Stop(reason.into()),
        }
    }

    /// Shutdown interrupted the handler before it could deliver the event (it would not start
    /// new work, say). Not counted as a failure; the event is delivered again on the next run.
    pub fn abandon() -> Self {
        Self {
            class: FailureClass::abandoned(),
            kind: FailureKind::Abandon,
        }
    }

    /// Why the sink stopped, for a [`HandlerFailure::stop`].
    pub fn stop_reason(&self) -> Option<&str> {
        match &self.kind {
            FailureKind::Stop(reason) => Some(reason),
            _ => None,
        }
    }

    /// True for a [`HandlerFailure::abandon`].
    pub fn is_abandoned(&self) -> bool {
        self.kind == FailureKind::Abandon
    }
}

impl From<FailureClass> for HandlerFailure {
    fn from(class: FailureClass) -> Self {
        Self::new(class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_classes_are_bounded_codes() {
        assert!(FailureClass::new("timeout").is_ok());
        assert!(FailureClass::new("http_503").is_ok());
        for bad in [
            "",
            "Timeout",
            "has space",
            "x\n",
            &"a".repeat(65),
            "connection refused: 10.0.0.1",
        ] {
            assert!(FailureClass::new(bad).is_err(), "{bad:?}");
        }
    }
}
