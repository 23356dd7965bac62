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
    /// The event type (`task:deleted`, `task:archived`).
    pub event_type: String,
    /// The type's major version: the contract the payload follows (equal to
    /// `payload_version`, its name before types had contracts).
    pub type_major: i32,
    /// The minor version of that contract the writer wrote under.
    pub type_minor: i32,
    /// The project whose stream this is.
    pub project_id: ProjectId,
    /// The consumer receiving it.
    pub consumer_id: ConsumerId,
    /// Position in the project's stream, dense from 1.
    pub sequence: i64,
    /// Stable identity: deduplicate on `(consumer_id, event_id)`.
    pub event_id: String,
    /// The task the event is about (its subject): for `task:deleted`, the deleted task.
    pub task_id: String,
    /// For `task:deleted`, when it was deleted: the deletion identity (RFC 3339 UTC,
    /// microseconds, as in the ID). `None` for other types.
    #[serde(
        serialize_with = "rfc3339_micros_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub deleted_at: Option<DateTime<Utc>>,
    /// The process that wrote the event (the origin).
    pub writer_process_id: String,
    /// When the event was written.
    #[serde(serialize_with = "rfc3339_micros")]
    pub occurred_at: DateTime<Utc>,
    /// Payload layout version (the type's major).
    pub payload_version: i32,
    /// For `task:deleted`, the task's state before deletion (empty for other types).
    pub prior: Prior,
    /// The payload as its contract describes it (for `task:deleted`: `deleted_at` and
    /// `prior`).
    pub payload: EventPayload,
    /// The writer's W3C trace context, when it passed one: a handler continues the writer's
    /// trace from it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// True when an operator asked to replay this dead letter; it arrives outside sequence
    /// order.
    pub replay: bool,
    /// Which delivery attempt this is (1 for the first).
    pub attempt: u32,
}

fn rfc3339_micros<S: serde::Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&outbox_core::event::format_timestamp(*at))
}

fn rfc3339_micros_opt<S: serde::Serializer>(
    at: &Option<DateTime<Utc>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => rfc3339_micros(at, s),
        None => s.serialize_none(),
    }
}

/// An event's payload as JSON text, kept as read (no tree of values is built for it); it is
/// written into lines as it is, and parsed by whoever needs its fields.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct EventPayload(Box<serde_json::value::RawValue>);

impl EventPayload {
    /// Wraps JSON text; `None` when it is not JSON.
    pub fn from_json(text: String) -> Option<Self> {
        serde_json::value::RawValue::from_string(text)
            .ok()
            .map(Self)
    }

    /// An empty object.
    pub fn empty() -> Self {
        Self::from_json("{}".into()).expect("{} is JSON")
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// Parses the payload into `T` (a struct of the contract's fields).
    pub fn parse<'a, T: serde::Deserialize<'a>>(&'a self) -> serde_json::Result<T> {
        serde_json::from_str(self.0.get())
    }
}

impl PartialEq for EventPayload {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for EventPayload {}

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

    /// The event's type is one the consumer declared, in a major it did not: parked at once,
    /// since a retry cannot make it understood; replay it once the declaration names the
    /// major.
    pub fn contract_mismatch() -> Self {
        Self("contract_mismatch".into())
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
    /// The sink's history is not the database's: the consumer audits and reconciles.
    Diverged {
        /// The position the sink holds.
        position: i64,
        /// The identity of the event the sink holds there.
        identity: String,
    },
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

    /// The sink already holds this consumer's output up to `position` (the event `identity`),
    /// and the database has no such event there: the sink's history is one the database lost
    /// (a failover to a standby that lacked the tail). Not the event's fault: the consumer
    /// writes the `history-diverged` audit row and reconciles, as when its own position is
    /// not in the database's history, then goes on after the reconciliation's head.
    pub fn history_diverged(position: i64, identity: impl Into<String>) -> Self {
        Self {
            class: FailureClass("history_diverged".into()),
            kind: FailureKind::Diverged {
                position,
                identity: identity.into(),
            },
        }
    }

    /// The sink's position and identity, for a [`HandlerFailure::history_diverged`].
    pub fn diverged(&self) -> Option<(i64, &str)> {
        match &self.kind {
            FailureKind::Diverged { position, identity } => Some((*position, identity)),
            _ => None,
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
