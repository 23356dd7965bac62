//! The operator surface: inspect projects, consumers, dead letters and the audit trail, and
//! repair what the runtime cannot decide on its own (replay, resolve, retire).
//!
//! ```no_run
//! use outbox_core::{Admin, ConsumerId, EventId, OperatorName, ProjectId, Reason, Schema};
//!
//! # async fn example(client: &mut tokio_postgres::Client) -> Result<(), outbox_core::AdminError> {
//! let admin = Admin::new(&Schema::default());
//! let project = ProjectId::new("p1")?;
//! let consumer = ConsumerId::new("dashboard")?;
//! let event = EventId::new("task-deleted:FN-1:2026-01-02T03:04:05.000000Z")?;
//! let done = admin
//!     .resolve(client, &project, &consumer, &event,
//!              &OperatorName::new("alice")?, &Reason::new("task restored by hand")?)
//!     .await?;
//! println!("resolved at {}", done.resolved_at);
//! # Ok(()) }
//! ```
//!
//! ## Guarantees
//! - Every operation is one transaction. A write locks its target row, checks the state it
//!   needs and changes it, or changes nothing and says why: [`AdminError::NotFound`] names the
//!   missing target, [`AdminError::Conflict`] names the target and the state it is in.
//! - Operator text (`reason`) is stored on the consumer or delivery row it explains and never
//!   in the audit trail, which holds identifiers, counts and the acting operator only.
//! - Reads of several tables ([`Admin::status`], [`Admin::dead_letter`]) come from one
//!   snapshot, and ages are measured on the database clock.

use crate::stmt::Unnamed as _;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, IsolationLevel, Row, Transaction};

use crate::admin_sql as sql;
use crate::ids::{ConsumerId, IdError, ProjectId, validate_identifier};
use crate::retention::{
    DEFAULT_RETENTION, HoldBack, MAX_RETENTION, PruneOptions, PruneOptionsError, Pruner,
};
use crate::schema::Schema;

/// Longest accepted operator name (`--by`), in characters.
pub const MAX_OPERATOR_LEN: usize = 64;
/// Longest accepted reason, in characters.
pub const MAX_REASON_LEN: usize = 200;
/// Longest accepted event ID, in characters (`task-deleted:` + a task ID of up to 128
/// characters + `:` + a 27-character timestamp fits with room to spare).
pub const MAX_EVENT_ID_LEN: usize = 256;
/// Most rows one listing returns.
pub const MAX_LIMIT: i64 = 10_000;

/// How long a write waits for a row another transaction holds (a consumer in the middle of a
/// transactional delivery, say) before giving up with [`AdminError::Busy`].
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '10s'";
/// Upper bound for any operator statement, so a command never hangs silently.
const STATEMENT_TIMEOUT: &str = "SET LOCAL statement_timeout = '60s'";

// ---------------------------------------------------------------------------------------------
// Validated input
// ---------------------------------------------------------------------------------------------

/// Who performs an operation (`--by`): the identifier rule (`A-Z a-z 0-9 . _ : @ -`), 1 to
/// [`MAX_OPERATOR_LEN`] characters. Recorded as the audit row's `actor`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct OperatorName(String);

impl OperatorName {
    /// Validates an operator name.
    pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
        let value = value.into();
        validate_identifier("operator", &value, MAX_OPERATOR_LEN)?;
        Ok(Self(value))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why an operator acted: free text of 1 to [`MAX_REASON_LEN`] characters, not blank, without
/// control characters (no newlines or tabs: one line in every table) and without invisible or
/// bidirectional formatting characters (which could make it display as something else).
/// Stored on the row it explains, never in the audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Reason(String);

/// A reason was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReasonError {
    /// The empty string.
    #[error("invalid reason: must not be empty")]
    Empty,
    /// Only whitespace.
    #[error("invalid reason: must not be blank")]
    Blank,
    /// Too long.
    #[error("invalid reason: {len} characters exceeds the limit of {max}")]
    TooLong {
        /// Its length in characters.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A control character (C0, DEL or C1), including newline and tab.
    #[error("invalid reason: control character at position {position}")]
    ControlCharacter {
        /// 1-based character position.
        position: usize,
    },
    /// An invisible or bidirectional formatting character.
    #[error(
        "invalid reason: invisible formatting character U+{code:04X} at position {position} \
         is not allowed"
    )]
    FormattingCharacter {
        /// The character's code point.
        code: u32,
        /// 1-based character position.
        position: usize,
    },
}

/// Zero-width, bidirectional-override and similar characters that change how text displays.
fn is_formatting(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
    )
}

impl Reason {
    /// Validates a reason.
    pub fn new(value: impl Into<String>) -> Result<Self, ReasonError> {
        let value = value.into();
        if value.is_empty() {
            return Err(ReasonError::Empty);
        }
        let len = value.chars().count();
        if len > MAX_REASON_LEN {
            return Err(ReasonError::TooLong {
                len,
                max: MAX_REASON_LEN,
            });
        }
        for (index, c) in value.chars().enumerate() {
            let position = index + 1;
            if c.is_control() {
                return Err(ReasonError::ControlCharacter { position });
            }
            if is_formatting(c) {
                return Err(ReasonError::FormattingCharacter {
                    code: u32::from(c),
                    position,
                });
            }
        }
        if value.trim().is_empty() {
            return Err(ReasonError::Blank);
        }
        Ok(Self(value))
    }

    /// The reason as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An event's identity as stored (`task-deleted:<task_id>:<deleted_at>`): the identifier
/// rule, 1 to [`MAX_EVENT_ID_LEN`] characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct EventId(String);

impl EventId {
    /// Validates an event ID.
    pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
        let value = value.into();
        validate_identifier("event_id", &value, MAX_EVENT_ID_LEN)?;
        Ok(Self(value))
    }

    /// The ID as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! text_newtype_impls {
    ($name:ident, $err:ty) => {
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = $err;
            fn from_str(value: &str) -> Result<Self, $err> {
                Self::new(value)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

text_newtype_impls!(OperatorName, IdError);
text_newtype_impls!(Reason, ReasonError);
text_newtype_impls!(EventId, IdError);

/// Defines a closed set of stored text values with parsing, display and serialization.
macro_rules! text_enum {
    (
        $(#[$doc:meta])* $name:ident, $what:literal {
            $($(#[$vdoc:meta])* $variant:ident => $text:literal $(| $alias:literal)*),+ $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stored text.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownValue;
            fn from_str(value: &str) -> Result<Self, UnknownValue> {
                match value {
                    $($text $(| $alias)* => Ok($name::$variant),)+
                    _ => Err(UnknownValue {
                        what: $what,
                        value: value.to_owned(),
                        known: vec![$($text),+],
                    }),
                }
            }
        }
    };
}

/// A text value outside a closed set (a state or audit kind).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid {what}: {} is not one of {}",
    serde_json::Value::String(.value.clone()),
    .known.join(", ")
)]
pub struct UnknownValue {
    /// What was being parsed.
    pub what: &'static str,
    /// The refused text.
    pub value: String,
    /// The accepted values.
    pub known: Vec<&'static str>,
}

text_enum!(
    /// Where a failed event stands for one consumer (`lifecycle_deliveries.state`).
    DeliveryState, "state" {
        /// Failed, holding the cursor, waiting for its next attempt.
        Retrying => "retrying",
        /// Parked after its last attempt; the stream moved on.
        Dead => "dead",
        /// An operator asked for a replay; the consumer's lease holder will re-dispatch it.
        ReplayRequested => "replay_requested",
        /// Replayed successfully.
        Replayed => "replayed",
        /// Closed by an operator without delivery.
        Resolved => "resolved",
    }
);

impl DeliveryState {
    /// The states of dead letters (everything but `retrying`): what a listing shows unless
    /// asked for specific states.
    pub const DEAD_LETTERS: &'static [DeliveryState] = &[
        DeliveryState::Dead,
        DeliveryState::ReplayRequested,
        DeliveryState::Replayed,
        DeliveryState::Resolved,
    ];
}

text_enum!(
    /// A consumer's lifecycle (`lifecycle_consumer_cursors.state`).
    ConsumerState, "consumer state" {
        /// Receives events and holds back retention.
        Active => "active",
        /// Retired by an operator: holds nothing back and may not run unless reactivated.
        Retired => "retired",
    }
);

text_enum!(
    /// What an audit row records. Parsing also accepts the part after
    /// `lifecycle-observation:`.
    AuditKind, "audit kind" {
        /// A poison event was parked (or a replay failed and it went back to `dead`).
        ConsumerPoisoned => "lifecycle-observation:consumer-poisoned" | "consumer-poisoned",
        /// A dead letter was replayed successfully.
        ConsumerReplayed => "lifecycle-observation:consumer-replayed" | "consumer-replayed",
        /// An operator resolved a dead letter.
        DeadLetterResolved =>
            "lifecycle-observation:dead-letter-resolved" | "dead-letter-resolved",
        /// An operator retired a consumer.
        ConsumerRetired => "lifecycle-observation:consumer-retired" | "consumer-retired",
        /// A retired consumer was started again with reactivation.
        ConsumerReactivated =>
            "lifecycle-observation:consumer-reactivated" | "consumer-reactivated",
        /// A consumer ran full reconciliation.
        Reconciled => "lifecycle-observation:reconciled" | "reconciled",
        /// The retention sweep pruned events or resolved dead letters.
        Pruned => "lifecycle-observation:pruned" | "pruned",
    }
);

/// Input refused before anything was read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// A malformed identifier (project, consumer, event, operator).
    #[error(transparent)]
    Id(#[from] IdError),
    /// A malformed reason.
    #[error(transparent)]
    Reason(#[from] ReasonError),
    /// A state or kind outside its closed set.
    #[error(transparent)]
    Unknown(#[from] UnknownValue),
    /// A listing limit outside `1..=MAX_LIMIT`.
    #[error("invalid limit: {0} is outside 1..={MAX_LIMIT}")]
    Limit(i64),
    /// A status threshold out of range (retention above [`MAX_RETENTION`], a negative
    /// `max_prunable`).
    #[error("invalid threshold: {0}")]
    Threshold(String),
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// The object an operation is about, named in every error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// A project.
    Project {
        /// The project.
        project: ProjectId,
    },
    /// A consumer of a project.
    Consumer {
        /// The project.
        project: ProjectId,
        /// The consumer.
        consumer: ConsumerId,
    },
    /// One consumer's delivery state of one event.
    DeadLetter {
        /// The project.
        project: ProjectId,
        /// The consumer.
        consumer: ConsumerId,
        /// The event.
        event: EventId,
    },
}

impl Target {
    fn consumer(project: &ProjectId, consumer: &ConsumerId) -> Self {
        Target::Consumer {
            project: project.clone(),
            consumer: consumer.clone(),
        }
    }

    fn dead_letter(project: &ProjectId, consumer: &ConsumerId, event: &EventId) -> Self {
        Target::DeadLetter {
            project: project.clone(),
            consumer: consumer.clone(),
            event: event.clone(),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Project { project } => write!(f, "project {project}"),
            Target::Consumer { project, consumer } => {
                write!(f, "consumer {consumer} of project {project}")
            }
            Target::DeadLetter {
                project,
                consumer,
                event,
            } => write!(
                f,
                "dead letter {event} of consumer {consumer} in project {project}"
            ),
        }
    }
}

/// Why an operator operation did nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The input was refused before anything was read or written.
    #[error(transparent)]
    Invalid(#[from] InputError),
    /// The target does not exist.
    #[error("{target} not found")]
    NotFound {
        /// What was looked for.
        target: Target,
    },
    /// The target exists but its state refuses the operation.
    #[error("{target} is {state}, {refusal}")]
    Conflict {
        /// The target.
        target: Target,
        /// The state it is in.
        state: String,
        /// Why that refuses the operation, e.g. "not dead".
        refusal: String,
    },
    /// Another transaction held the target's row for longer than the lock timeout.
    #[error("{target} is busy: its row stayed locked by another transaction; try again")]
    Busy {
        /// The target.
        target: Target,
    },
    /// A statement failed.
    #[error("database error: {}", crate::error::describe(.0))]
    Database(#[from] tokio_postgres::Error),
}

impl From<IdError> for AdminError {
    fn from(e: IdError) -> Self {
        AdminError::Invalid(InputError::Id(e))
    }
}

impl From<ReasonError> for AdminError {
    fn from(e: ReasonError) -> Self {
        AdminError::Invalid(InputError::Reason(e))
    }
}

impl From<UnknownValue> for AdminError {
    fn from(e: UnknownValue) -> Self {
        AdminError::Invalid(InputError::Unknown(e))
    }
}

impl AdminError {
    /// The target named by a not-found, conflict or busy error.
    pub fn target(&self) -> Option<&Target> {
        match self {
            AdminError::NotFound { target }
            | AdminError::Conflict { target, .. }
            | AdminError::Busy { target } => Some(target),
            _ => None,
        }
    }

    /// True when trying again later may succeed (busy rows, transient database failures).
    pub fn is_retryable(&self) -> bool {
        match self {
            AdminError::Busy { .. } => true,
            AdminError::Database(e) => crate::error::is_retryable_db(e),
            _ => false,
        }
    }

    /// A lock timeout on `target`'s row becomes [`AdminError::Busy`].
    fn on(target: Target) -> impl FnOnce(tokio_postgres::Error) -> AdminError {
        move |e| {
            if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
                AdminError::Busy { target }
            } else {
                AdminError::Database(e)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------------------------

/// A bounded health code of a project or consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Nothing to report.
    Ok,
    /// The consumer is more than `max_lag` events behind the head.
    Lagging,
    /// An event has been failing and holding the cursor for longer than `max_retrying_age`.
    StuckRetrying,
    /// The lease is held, but its last heartbeat is older than `max_heartbeat_age` (the holder
    /// is hung, partitioned or crashed without releasing).
    StaleHeartbeat,
    /// The consumer has unresolved dead letters waiting for an operator.
    DeadLetters,
    /// Committed events have waited for a number longer than `max_unsequenced_age`: no
    /// sequencer is running.
    SequencerStalled,
    /// More than `max_prunable` events of the project are prunable now: no retention sweep
    /// is running for it (no consumer process with the sweep enabled, no scheduled `outbox
    /// prune`).
    PruningBacklog,
    /// The oldest event a sweep would keep is older than `retention + max_retention_overrun`:
    /// a consumer's cursor (lagging, or missing) or an unresolved dead letter holds the
    /// retention floor back.
    RetentionHeld,
}

impl Health {
    /// The code as text.
    pub fn as_str(&self) -> &'static str {
        match self {
            Health::Ok => "ok",
            Health::Lagging => "lagging",
            Health::StuckRetrying => "stuck_retrying",
            Health::StaleHeartbeat => "stale_heartbeat",
            Health::DeadLetters => "dead_letters",
            Health::SequencerStalled => "sequencer_stalled",
            Health::PruningBacklog => "pruning_backlog",
            Health::RetentionHeld => "retention_held",
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When `status` reports a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthThresholds {
    /// A consumer further behind than this many events is `lagging`.
    pub max_lag: i64,
    /// An event failing for longer than this is `stuck_retrying`.
    pub max_retrying_age: Duration,
    /// A held lease whose heartbeat is older than this is `stale_heartbeat` (default: twice
    /// the runtime's default heartbeat interval of 10 s).
    pub max_heartbeat_age: Duration,
    /// A committed event unsequenced for longer than this means `sequencer_stalled`.
    pub max_unsequenced_age: Duration,
    /// More prunable events than this in a project mean `pruning_backlog`. Prunable events
    /// are counted up to `max_prunable + 1` only, so the cost of `status` is bounded by it.
    pub max_prunable: i64,
    /// The retention period the prunable count and `retention_held` are judged by (that of
    /// the sweeps: `outbox prune --retention`, `outbox consume --retention`).
    pub retention: Duration,
    /// An event the sweep would keep that is older than `retention` plus this means
    /// `retention_held`.
    pub max_retention_overrun: Duration,
}

impl Default for HealthThresholds {
    /// 10 000 events, 15 min, 20 s, 60 s, 100 000 events, retention 30 days, 1 day.
    fn default() -> Self {
        Self {
            max_lag: 10_000,
            max_retrying_age: Duration::from_secs(15 * 60),
            max_heartbeat_age: Duration::from_secs(20),
            max_unsequenced_age: Duration::from_secs(60),
            max_prunable: 100_000,
            retention: DEFAULT_RETENTION,
            max_retention_overrun: Duration::from_secs(86_400),
        }
    }
}

impl Serialize for HealthThresholds {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("HealthThresholds", 7)?;
        st.serialize_field("max_lag", &self.max_lag)?;
        st.serialize_field(
            "max_retrying_age_secs",
            &self.max_retrying_age.as_secs_f64(),
        )?;
        st.serialize_field(
            "max_heartbeat_age_secs",
            &self.max_heartbeat_age.as_secs_f64(),
        )?;
        st.serialize_field(
            "max_unsequenced_age_secs",
            &self.max_unsequenced_age.as_secs_f64(),
        )?;
        st.serialize_field("max_prunable", &self.max_prunable)?;
        st.serialize_field("retention_secs", &self.retention.as_secs_f64())?;
        st.serialize_field(
            "max_retention_overrun_secs",
            &self.max_retention_overrun.as_secs_f64(),
        )?;
        st.end()
    }
}

/// One project's stream.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProjectStatus {
    /// The project.
    pub project_id: String,
    /// The last assigned sequence (0 before the first).
    pub head_sequence: i64,
    /// The retention floor: events up to here were pruned.
    pub pruned_through: i64,
    /// Committed events not numbered yet.
    pub unsequenced: i64,
    /// When the oldest of them was written.
    pub oldest_unsequenced_at: Option<DateTime<Utc>>,
    /// How long ago that was, in seconds (database clock).
    pub oldest_unsequenced_age_secs: Option<f64>,
    /// Events a retention sweep would prune now (the sweep's own rule, judged with
    /// `thresholds.retention`), counted up to `max_prunable + 1`.
    pub prunable: i64,
    /// The count stopped at `max_prunable + 1`: at least that many are prunable.
    pub prunable_capped: bool,
    /// When the oldest retained event (the lowest sequence above the floor) was written.
    pub oldest_retained_at: Option<DateTime<Utc>>,
    /// How long ago that was, in seconds.
    pub oldest_retained_age_secs: Option<f64>,
    /// What stops the floor below the head once the prunable events are gone (as `outbox
    /// prune --dry-run` names it); `None` when nothing does, or when the count was capped.
    pub held_by: Option<HoldBack>,
    /// Age in seconds of the oldest event a sweep would keep (the one `held_by` names);
    /// `None` when the sweep would reach the head, or when the count was capped.
    pub oldest_held_age_secs: Option<f64>,
    /// Health codes; `[ok]` when there is nothing to report.
    pub health: Vec<Health>,
}

/// The retrying event that holds a consumer's cursor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetryingEvent {
    /// The event.
    pub event_id: String,
    /// Its sequence (the cursor + 1).
    pub sequence: i64,
    /// Failed attempts so far.
    pub attempts: i32,
    /// When the next attempt is due.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When it first failed.
    pub first_failed_at: DateTime<Utc>,
    /// How long it has been failing, in seconds.
    pub failing_for_secs: f64,
    /// The last failure's bounded code.
    pub last_failure_class: Option<String>,
}

/// One consumer: identity, cursor, lease and failures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsumerInfo {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// Active or retired.
    pub state: ConsumerState,
    /// Last acknowledged sequence; `None` while missing (the consumer will reconcile).
    pub cursor: Option<i64>,
    /// The project's head.
    pub head_sequence: i64,
    /// `head - cursor`; `None` while the cursor is missing.
    pub lag: Option<i64>,
    /// The process run holding (or last holding, if expired) the lease.
    pub lease_owner: Option<String>,
    /// The lease generation (bumped by every claim).
    pub lease_generation: i64,
    /// When the lease expires unless renewed.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// True while a lease is held and not expired.
    pub lease_live: bool,
    /// The last claim or heartbeat.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// How long ago that was, in seconds.
    pub heartbeat_age_secs: Option<f64>,
    /// When the consumer first claimed.
    pub created_at: DateTime<Utc>,
    /// When it last reconciled.
    pub reconciled_at: Option<DateTime<Utc>>,
    /// When it was retired.
    pub retired_at: Option<DateTime<Utc>>,
    /// Who retired it.
    pub retired_by: Option<String>,
    /// Why.
    pub retired_reason: Option<String>,
    /// The failing event holding the cursor, if any.
    pub retrying: Option<RetryingEvent>,
    /// Dead letters waiting for an operator.
    pub dead_letters: i64,
    /// Dead letters waiting for the lease holder to replay them.
    pub replay_requested: i64,
}

/// A consumer as `status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsumerStatus {
    /// The consumer.
    #[serde(flatten)]
    pub consumer: ConsumerInfo,
    /// Health codes; `[ok]` when there is nothing to report.
    pub health: Vec<Health>,
}

/// What `status` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// The database clock when the snapshot was taken.
    pub as_of: DateTime<Utc>,
    /// The thresholds the health codes were judged by.
    pub thresholds: HealthThresholds,
    /// Projects, by ID.
    pub projects: Vec<ProjectStatus>,
    /// Consumers, by project and ID.
    pub consumers: Vec<ConsumerStatus>,
}

/// A listing, with whether the limit cut it short.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listing<T> {
    /// The rows.
    pub items: Vec<T>,
    /// True when more rows matched than the limit allowed.
    pub truncated: bool,
}

/// One consumer's delivery state of one failed event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// The event.
    pub event_id: String,
    /// The event's sequence.
    pub sequence: i64,
    /// Where it stands.
    pub state: DeliveryState,
    /// Delivery attempts so far (including replays).
    pub attempts: i32,
    /// The last failure's bounded code.
    pub last_failure_class: Option<String>,
    /// When it first failed.
    pub first_failed_at: DateTime<Utc>,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
    /// When it was parked.
    pub parked_at: Option<DateTime<Utc>>,
    /// When it is tried next (retrying only).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When an operator resolved it.
    pub resolved_at: Option<DateTime<Utc>>,
    /// Who resolved it.
    pub resolved_by: Option<String>,
    /// Why.
    pub resolved_reason: Option<String>,
}

/// The event behind a dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventFields {
    /// The event type.
    pub event_type: String,
    /// The deleted task.
    pub task_id: String,
    /// When it was deleted.
    pub deleted_at: DateTime<Utc>,
    /// The process that wrote it.
    pub writer_process_id: String,
    /// When it was written.
    pub occurred_at: DateTime<Utc>,
    /// Payload layout version.
    pub payload_version: i32,
    /// The payload (the task's prior column and status).
    pub payload: serde_json::Value,
    /// When it was numbered.
    pub sequenced_at: Option<DateTime<Utc>>,
}

/// A dead letter with its event; `event` is `None` once retention pruned the event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterDetail {
    /// The delivery state.
    #[serde(flatten)]
    pub dead_letter: DeadLetter,
    /// The event, while retained.
    pub event: Option<EventFields>,
}

/// Which dead letters a listing shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Only this project.
    pub project: Option<ProjectId>,
    /// Only this consumer.
    pub consumer: Option<ConsumerId>,
    /// Only these states; empty means [`DeliveryState::DEAD_LETTERS`].
    pub states: Vec<DeliveryState>,
    /// At most this many rows (`1..=MAX_LIMIT`).
    pub limit: i64,
}

impl Default for DeadLetterFilter {
    fn default() -> Self {
        Self {
            project: None,
            consumer: None,
            states: Vec::new(),
            limit: 1000,
        }
    }
}

/// Which dead letters to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayTarget {
    /// One dead letter; anything but `dead` is a conflict.
    One(EventId),
    /// Every `dead` letter of the consumer (none is not an error).
    AllDead,
}

/// What a replay request changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayRequest {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// Dead letters now `replay_requested`.
    pub requested: Vec<String>,
    /// Dead letters left `dead` because retention already pruned their events (`AllDead`
    /// only): resolve them instead.
    pub skipped_pruned: Vec<String>,
}

/// A resolved dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resolution {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// The event.
    pub event_id: String,
    /// `dead` or `replay_requested`.
    pub previous_state: DeliveryState,
    /// Delivery attempts it had.
    pub attempts: i32,
    /// Who resolved it.
    pub resolved_by: String,
    /// When.
    pub resolved_at: DateTime<Utc>,
}

/// A retired consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Retirement {
    /// The project.
    pub project_id: String,
    /// The consumer.
    pub consumer_id: String,
    /// Who retired it.
    pub retired_by: String,
    /// When.
    pub retired_at: DateTime<Utc>,
    /// The process run that held its lease, if the lease was live: it stops at its next
    /// fenced write (at the latest, its next heartbeat).
    pub stopping_lease_owner: Option<String>,
    /// That lease's generation.
    pub lease_generation: i64,
    /// Unresolved dead letters that retention may now prune.
    pub unresolved_dead_letters: i64,
}

/// One audit row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    /// Its position in the trail.
    pub id: i64,
    /// When it was recorded.
    pub recorded_at: DateTime<Utc>,
    /// What happened.
    pub kind: String,
    /// The project.
    pub project_id: Option<String>,
    /// The consumer.
    pub consumer_id: Option<String>,
    /// The event.
    pub event_id: Option<String>,
    /// The operator, for operator actions.
    pub actor: Option<String>,
    /// Attempts, events or tasks, depending on the kind.
    pub count: Option<i64>,
}

/// Which audit rows a listing shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only this project.
    pub project: Option<ProjectId>,
    /// Only this consumer.
    pub consumer: Option<ConsumerId>,
    /// Only these kinds; empty means all.
    pub kinds: Vec<AuditKind>,
    /// Only this event.
    pub event: Option<EventId>,
    /// At most this many rows, newest first (`1..=MAX_LIMIT`).
    pub limit: i64,
}

impl Default for AuditFilter {
    fn default() -> Self {
        Self {
            project: None,
            consumer: None,
            kinds: Vec::new(),
            event: None,
            limit: 50,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Health: pure functions
// ---------------------------------------------------------------------------------------------

/// `[ok]` for no problems, else the problems in a fixed order.
fn codes(mut problems: Vec<Health>) -> Vec<Health> {
    if problems.is_empty() {
        return vec![Health::Ok];
    }
    problems.sort();
    problems.dedup();
    problems
}

/// Judges a project: `sequencer_stalled` when its oldest unsequenced event is too old,
/// `pruning_backlog` when more than `max_prunable` events are prunable, `retention_held` when
/// the oldest event a sweep would keep is older than retention plus `max_retention_overrun`.
pub fn project_health(project: &ProjectStatus, thresholds: &HealthThresholds) -> Vec<Health> {
    let mut problems = Vec::new();
    if project
        .oldest_unsequenced_age_secs
        .is_some_and(|age| age > thresholds.max_unsequenced_age.as_secs_f64())
    {
        problems.push(Health::SequencerStalled);
    }
    if project.prunable > thresholds.max_prunable {
        problems.push(Health::PruningBacklog);
    }
    let held_past = thresholds
        .retention
        .saturating_add(thresholds.max_retention_overrun)
        .as_secs_f64();
    if project
        .oldest_held_age_secs
        .is_some_and(|age| age > held_past)
    {
        problems.push(Health::RetentionHeld);
    }
    codes(problems)
}

/// Judges a consumer. A retired consumer holds nothing back and is always `ok`.
pub fn consumer_health(consumer: &ConsumerInfo, thresholds: &HealthThresholds) -> Vec<Health> {
    if consumer.state == ConsumerState::Retired {
        return codes(Vec::new());
    }
    let mut problems = Vec::new();
    if consumer.lag.is_some_and(|lag| lag > thresholds.max_lag) {
        problems.push(Health::Lagging);
    }
    if consumer
        .retrying
        .as_ref()
        .is_some_and(|r| r.failing_for_secs > thresholds.max_retrying_age.as_secs_f64())
    {
        problems.push(Health::StuckRetrying);
    }
    if consumer.lease_owner.is_some()
        && consumer
            .heartbeat_age_secs
            .is_none_or(|age| age > thresholds.max_heartbeat_age.as_secs_f64())
    {
        problems.push(Health::StaleHeartbeat);
    }
    if consumer.dead_letters > 0 {
        problems.push(Health::DeadLetters);
    }
    codes(problems)
}

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

/// The statements, rendered once for a schema.
#[derive(Debug, Clone)]
struct Statements {
    projects: String,
    consumers: String,
    dead_letters: String,
    dead_letter: String,
    consumer_for_share: String,
    consumer_for_update: String,
    delivery_for_update: String,
    dead_for_update: String,
    request_replay: String,
    resolve: String,
    retire: String,
    unresolved_count: String,
    audit: String,
    audit_trail: String,
    retained_after: String,
}

/// Operator operations on one schema. Cheap to clone; holds only rendered statements.
#[derive(Debug, Clone)]
pub struct Admin {
    /// The statements for the schema.
    sql: Statements,
    /// The schema, for the retention rule's statements (`status`).
    schema: Schema,
}

/// The consumer row as a write sees it.
struct ConsumerRow {
    state: ConsumerState,
    retired_by: Option<String>,
    retired_at: Option<DateTime<Utc>>,
}

fn parse_state<T: std::str::FromStr<Err = UnknownValue>>(text: &str) -> Result<T, AdminError> {
    text.parse::<T>().map_err(AdminError::from)
}

fn check_limit(limit: i64) -> Result<(), InputError> {
    if (1..=MAX_LIMIT).contains(&limit) {
        Ok(())
    } else {
        Err(InputError::Limit(limit))
    }
}

fn format_time(at: Option<DateTime<Utc>>) -> String {
    at.map(|at| at.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| "an unknown time".into())
}

impl Admin {
    /// Operations on the tables in `schema`.
    pub fn new(schema: &Schema) -> Self {
        Self {
            sql: Statements {
                projects: schema.render(sql::PROJECTS),
                consumers: schema.render(sql::CONSUMERS),
                dead_letters: schema.render(sql::DEAD_LETTERS),
                dead_letter: schema.render(sql::DEAD_LETTER),
                consumer_for_share: schema.render(sql::CONSUMER_FOR_SHARE),
                consumer_for_update: schema.render(sql::CONSUMER_FOR_UPDATE),
                delivery_for_update: schema.render(sql::DELIVERY_FOR_UPDATE),
                dead_for_update: schema.render(sql::DEAD_FOR_UPDATE),
                request_replay: schema.render(sql::REQUEST_REPLAY),
                resolve: schema.render(sql::RESOLVE),
                retire: schema.render(sql::RETIRE),
                unresolved_count: schema.render(sql::UNRESOLVED_COUNT),
                audit: schema.render(sql::AUDIT),
                audit_trail: schema.render(sql::AUDIT_TRAIL),
                retained_after: schema.render(sql::RETAINED_AFTER),
            },
            schema: schema.clone(),
        }
    }

    /// A read-only transaction on one snapshot.
    async fn snapshot(client: &mut Client) -> Result<Transaction<'_>, AdminError> {
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        tx.batch_execute(STATEMENT_TIMEOUT).await?;
        Ok(tx)
    }

    /// A read-write transaction whose row locks give up after the lock timeout.
    async fn write(client: &mut Client) -> Result<Transaction<'_>, AdminError> {
        let tx = client.transaction().await?;
        tx.batch_execute(&format!("{STATEMENT_TIMEOUT}; {LOCK_TIMEOUT}"))
            .await?;
        Ok(tx)
    }

    /// Per project: head, unsequenced backlog, retention floor and pruning backlog; per
    /// consumer: cursor, lag, lease, the retrying event holding it and dead-letter counts;
    /// each with health codes. With `project`, only that project, which must exist.
    ///
    /// The prunable count applies the retention sweep's own rule ([`Pruner`]) with
    /// `thresholds.retention`, looking at most `max_prunable + 1` events past each floor, so
    /// a large backlog costs no more than that many index entries per project.
    pub async fn status(
        &self,
        client: &mut Client,
        project: Option<&ProjectId>,
        thresholds: &HealthThresholds,
    ) -> Result<Status, AdminError> {
        let filter = project.map(ProjectId::as_str);
        let pruner = self.status_pruner(thresholds)?;
        let limit = thresholds.max_prunable.saturating_add(1);
        let tx = Self::snapshot(client).await?;
        let as_of: DateTime<Utc> = tx.query_one_unnamed("SELECT now()", &[]).await?.get(0);
        let rows = tx.query_unnamed(&self.sql.projects, &[&filter]).await?;
        let mut projects = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut status = ProjectStatus {
                project_id: row.get(0),
                head_sequence: row.get(1),
                pruned_through: row.get(2),
                unsequenced: row.get(3),
                oldest_unsequenced_at: row.get(4),
                oldest_unsequenced_age_secs: row.get(5),
                prunable: 0,
                prunable_capped: false,
                oldest_retained_at: None,
                oldest_retained_age_secs: None,
                held_by: None,
                oldest_held_age_secs: None,
                health: Vec::new(),
            };
            self.retention_status(&tx, &pruner, limit, &mut status)
                .await?;
            status.health = project_health(&status, thresholds);
            projects.push(status);
        }
        let consumers = self
            .consumer_rows(&tx, filter, None)
            .await?
            .into_iter()
            .map(|consumer| ConsumerStatus {
                health: consumer_health(&consumer, thresholds),
                consumer,
            })
            .collect();
        tx.commit().await?;
        if let (Some(project), true) = (project, projects.is_empty()) {
            return Err(AdminError::NotFound {
                target: Target::Project {
                    project: project.clone(),
                },
            });
        }
        Ok(Status {
            as_of,
            thresholds: thresholds.clone(),
            projects,
            consumers,
        })
    }

    /// The retention rule as `status` applies it: a dry-run pruner with the thresholds'
    /// retention period.
    fn status_pruner(&self, thresholds: &HealthThresholds) -> Result<Pruner, AdminError> {
        if thresholds.max_prunable < 0 {
            return Err(InputError::Threshold(format!(
                "max_prunable {} is negative",
                thresholds.max_prunable
            ))
            .into());
        }
        let options = PruneOptions {
            retention: thresholds.retention,
            dry_run: true,
            ..PruneOptions::default()
        };
        Pruner::new(&self.schema, options).map_err(|e| match e {
            PruneOptionsError::Retention(_) => InputError::Threshold(format!(
                "retention {:?} is longer than {} days",
                thresholds.retention,
                MAX_RETENTION.as_secs() / 86_400
            ))
            .into(),
            other => InputError::Threshold(other.to_string()).into(),
        })
    }

    /// Fills a project's retention fields: what a sweep would prune now (bounded by `limit`),
    /// the oldest retained event, and the oldest one a sweep would keep.
    async fn retention_status(
        &self,
        tx: &Transaction<'_>,
        pruner: &Pruner,
        limit: i64,
        status: &mut ProjectStatus,
    ) -> Result<(), AdminError> {
        let project = status.project_id.as_str();
        let Some(prunable) = pruner.prunable(tx, project, limit).await? else {
            return Ok(());
        };
        let retained_after = |sequence: i64| async move {
            tx.query_opt_unnamed(&self.sql.retained_after, &[&project, &sequence])
                .await
                .map(|row| row.map(|row| (row.get(0), row.get(1))))
        };
        if prunable.floor < prunable.head {
            if let Some((at, age)) = retained_after(prunable.floor).await? {
                status.oldest_retained_at = Some(at);
                status.oldest_retained_age_secs = Some(age);
            }
        }
        status.prunable = prunable.events;
        status.prunable_capped = prunable.capped;
        if !prunable.capped && prunable.target < prunable.head {
            status.held_by = prunable.hold;
            status.oldest_held_age_secs = if prunable.target == prunable.floor {
                status.oldest_retained_age_secs
            } else {
                retained_after(prunable.target).await?.map(|(_, age)| age)
            };
        }
        Ok(())
    }

    /// Every consumer (of `project`, if given), by project and ID.
    pub async fn consumers(
        &self,
        client: &mut Client,
        project: Option<&ProjectId>,
    ) -> Result<Vec<ConsumerInfo>, AdminError> {
        let tx = Self::snapshot(client).await?;
        let rows = self
            .consumer_rows(&tx, project.map(ProjectId::as_str), None)
            .await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn consumer_rows(
        &self,
        tx: &Transaction<'_>,
        project: Option<&str>,
        consumer: Option<&str>,
    ) -> Result<Vec<ConsumerInfo>, AdminError> {
        tx.query_unnamed(&self.sql.consumers, &[&project, &consumer])
            .await?
            .iter()
            .map(decode_consumer)
            .collect()
    }

    /// Dead letters by filter, by project, consumer and sequence.
    pub async fn dead_letters(
        &self,
        client: &mut Client,
        filter: &DeadLetterFilter,
    ) -> Result<Listing<DeadLetter>, AdminError> {
        check_limit(filter.limit)?;
        let states: Vec<&str> = if filter.states.is_empty() {
            DeliveryState::DEAD_LETTERS
        } else {
            &filter.states
        }
        .iter()
        .map(DeliveryState::as_str)
        .collect();
        let tx = Self::snapshot(client).await?;
        let rows = tx
            .query_unnamed(
                &self.sql.dead_letters,
                &[
                    &filter.project.as_ref().map(ProjectId::as_str),
                    &filter.consumer.as_ref().map(ConsumerId::as_str),
                    &states,
                    &(filter.limit + 1),
                ],
            )
            .await?;
        tx.commit().await?;
        let mut items = rows
            .iter()
            .map(decode_dead_letter)
            .collect::<Result<Vec<_>, _>>()?;
        let truncated = items.len() as i64 > filter.limit;
        items.truncate(filter.limit as usize);
        Ok(Listing { items, truncated })
    }

    /// One dead letter (or retrying delivery) with its event.
    pub async fn dead_letter(
        &self,
        client: &mut Client,
        project: &ProjectId,
        consumer: &ConsumerId,
        event: &EventId,
    ) -> Result<DeadLetterDetail, AdminError> {
        let tx = Self::snapshot(client).await?;
        let row = tx
            .query_opt_unnamed(
                &self.sql.dead_letter,
                &[&project.as_str(), &consumer.as_str(), &event.as_str()],
            )
            .await?;
        let Some(row) = row else {
            let target = match self.consumer_exists(&tx, project, consumer).await? {
                true => Target::dead_letter(project, consumer, event),
                false => Target::consumer(project, consumer),
            };
            return Err(AdminError::NotFound { target });
        };
        tx.commit().await?;
        let event = row
            .get::<_, Option<String>>(14)
            .map(|event_type| EventFields {
                event_type,
                task_id: row.get(15),
                deleted_at: row.get(16),
                writer_process_id: row.get(17),
                occurred_at: row.get(18),
                payload_version: row.get(19),
                payload: row.get(20),
                sequenced_at: row.get(21),
            });
        Ok(DeadLetterDetail {
            dead_letter: decode_dead_letter(&row)?,
            event,
        })
    }

    async fn consumer_exists(
        &self,
        tx: &Transaction<'_>,
        project: &ProjectId,
        consumer: &ConsumerId,
    ) -> Result<bool, AdminError> {
        let rows = self
            .consumer_rows(tx, Some(project.as_str()), Some(consumer.as_str()))
            .await?;
        Ok(!rows.is_empty())
    }

    /// Locks the consumer row (`FOR KEY SHARE`, or `FOR UPDATE` when `exclusive`).
    async fn lock_consumer(
        &self,
        tx: &Transaction<'_>,
        project: &ProjectId,
        consumer: &ConsumerId,
        exclusive: bool,
    ) -> Result<ConsumerRow, AdminError> {
        let statement = if exclusive {
            &self.sql.consumer_for_update
        } else {
            &self.sql.consumer_for_share
        };
        let target = || Target::consumer(project, consumer);
        let row = tx
            .query_opt_unnamed(statement, &[&project.as_str(), &consumer.as_str()])
            .await
            .map_err(AdminError::on(target()))?
            .ok_or_else(|| AdminError::NotFound { target: target() })?;
        Ok(ConsumerRow {
            state: parse_state(row.get(0))?,
            retired_by: row.get(1),
            retired_at: row.get(2),
        })
    }

    /// Asks the consumer's lease holder to re-dispatch dead letters: `dead` becomes
    /// `replay_requested`. The runtime then marks each `replayed` (audited
    /// `consumer-replayed`) or, if it fails again, `dead` with its attempt count (audited
    /// `consumer-poisoned`). Refused for a retired consumer, for a letter that is not `dead`
    /// and for one whose event retention already pruned.
    pub async fn request_replay(
        &self,
        client: &mut Client,
        project: &ProjectId,
        consumer: &ConsumerId,
        which: &ReplayTarget,
    ) -> Result<ReplayRequest, AdminError> {
        let tx = Self::write(client).await?;
        let row = self.lock_consumer(&tx, project, consumer, false).await?;
        if row.state != ConsumerState::Active {
            return Err(AdminError::Conflict {
                target: Target::consumer(project, consumer),
                state: row.state.to_string(),
                refusal: "not active: nothing would replay its dead letters; reactivate it \
                          first"
                    .into(),
            });
        }
        let (requested, skipped_pruned) = match which {
            ReplayTarget::One(event) => {
                let target = Target::dead_letter(project, consumer, event);
                let row = tx
                    .query_opt_unnamed(
                        &self.sql.delivery_for_update,
                        &[&project.as_str(), &consumer.as_str(), &event.as_str()],
                    )
                    .await
                    .map_err(AdminError::on(target.clone()))?
                    .ok_or_else(|| AdminError::NotFound {
                        target: target.clone(),
                    })?;
                let state: DeliveryState = parse_state(row.get(0))?;
                if state != DeliveryState::Dead {
                    return Err(AdminError::Conflict {
                        target,
                        state: state.to_string(),
                        refusal: "not dead: only a dead letter can be replayed".into(),
                    });
                }
                if !row.get::<_, bool>(4) {
                    return Err(AdminError::Conflict {
                        target,
                        state: state.to_string(),
                        refusal: "but retention pruned its event, so it cannot be replayed; \
                                  resolve it instead"
                            .into(),
                    });
                }
                (vec![event.as_str().to_owned()], Vec::new())
            }
            ReplayTarget::AllDead => {
                let rows = tx
                    .query_unnamed(
                        &self.sql.dead_for_update,
                        &[&project.as_str(), &consumer.as_str()],
                    )
                    .await
                    .map_err(AdminError::on(Target::consumer(project, consumer)))?;
                let (retained, pruned): (Vec<&Row>, Vec<&Row>) =
                    rows.iter().partition(|row| row.get::<_, bool>(1));
                let ids = |rows: Vec<&Row>| -> Vec<String> {
                    rows.iter().map(|row| row.get(0)).collect()
                };
                (ids(retained), ids(pruned))
            }
        };
        if !requested.is_empty() {
            let changed = tx
                .execute_unnamed(
                    &self.sql.request_replay,
                    &[&project.as_str(), &consumer.as_str(), &requested],
                )
                .await?;
            debug_assert_eq!(changed as usize, requested.len(), "rows were locked");
        }
        tx.commit().await?;
        tracing::info!(
            project = %project, consumer = %consumer, requested = requested.len(),
            skipped_pruned = skipped_pruned.len(), "replay requested"
        );
        Ok(ReplayRequest {
            project_id: project.to_string(),
            consumer_id: consumer.to_string(),
            requested,
            skipped_pruned,
        })
    }

    /// Closes a `dead` (or `replay_requested`) letter without delivering it, recording who
    /// and why on the delivery row and a `dead-letter-resolved` audit row (actor, attempts).
    pub async fn resolve(
        &self,
        client: &mut Client,
        project: &ProjectId,
        consumer: &ConsumerId,
        event: &EventId,
        by: &OperatorName,
        reason: &Reason,
    ) -> Result<Resolution, AdminError> {
        let tx = Self::write(client).await?;
        self.lock_consumer(&tx, project, consumer, false).await?;
        let target = Target::dead_letter(project, consumer, event);
        let params = [project.as_str(), consumer.as_str(), event.as_str()];
        let row = tx
            .query_opt_unnamed(
                &self.sql.delivery_for_update,
                &[&params[0], &params[1], &params[2]],
            )
            .await
            .map_err(AdminError::on(target.clone()))?
            .ok_or_else(|| AdminError::NotFound {
                target: target.clone(),
            })?;
        let previous: DeliveryState = parse_state(row.get(0))?;
        match previous {
            DeliveryState::Dead | DeliveryState::ReplayRequested => {}
            DeliveryState::Resolved => {
                let resolved_by: Option<String> = row.get(2);
                return Err(AdminError::Conflict {
                    target,
                    state: previous.to_string(),
                    refusal: format!(
                        "not dead (resolved by {} at {})",
                        resolved_by.as_deref().unwrap_or("an unknown operator"),
                        format_time(row.get(3))
                    ),
                });
            }
            DeliveryState::Retrying | DeliveryState::Replayed => {
                return Err(AdminError::Conflict {
                    target,
                    state: previous.to_string(),
                    refusal: "not dead: only a dead letter (dead or replay_requested) can be \
                              resolved"
                        .into(),
                });
            }
        }
        let row = tx
            .query_one_unnamed(
                &self.sql.resolve,
                &[
                    &params[0],
                    &params[1],
                    &params[2],
                    &by.as_str(),
                    &reason.as_str(),
                ],
            )
            .await?;
        let attempts: i32 = row.get(0);
        let resolved_at: DateTime<Utc> = row.get(1);
        tx.execute_unnamed(
            &self.sql.audit,
            &[
                &AuditKind::DeadLetterResolved.as_str(),
                &params[0],
                &params[1],
                &Some(params[2]),
                &by.as_str(),
                &Some(i64::from(attempts)),
            ],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(
            project = %project, consumer = %consumer, event = %event, by = %by,
            "dead letter resolved"
        );
        Ok(Resolution {
            project_id: project.to_string(),
            consumer_id: consumer.to_string(),
            event_id: event.to_string(),
            previous_state: previous,
            attempts,
            resolved_by: by.to_string(),
            resolved_at,
        })
    }

    /// Retires an active consumer: it stops holding back retention, its unresolved dead
    /// letters become prunable, a runtime holding its lease stops at its next fenced write,
    /// and it may not start again unless reactivated. Audited `consumer-retired` (actor and
    /// the number of unresolved dead letters); the reason stays on the consumer row.
    pub async fn retire(
        &self,
        client: &mut Client,
        project: &ProjectId,
        consumer: &ConsumerId,
        by: &OperatorName,
        reason: &Reason,
    ) -> Result<Retirement, AdminError> {
        let tx = Self::write(client).await?;
        let row = self.lock_consumer(&tx, project, consumer, true).await?;
        if row.state == ConsumerState::Retired {
            return Err(AdminError::Conflict {
                target: Target::consumer(project, consumer),
                state: row.state.to_string(),
                refusal: format!(
                    "not active (retired by {} at {})",
                    row.retired_by.as_deref().unwrap_or("an unknown operator"),
                    format_time(row.retired_at)
                ),
            });
        }
        let (p, c) = (project.as_str(), consumer.as_str());
        let retired = tx
            .query_one_unnamed(&self.sql.retire, &[&p, &c, &by.as_str(), &reason.as_str()])
            .await?;
        let unresolved: i64 = tx
            .query_one_unnamed(&self.sql.unresolved_count, &[&p, &c])
            .await?
            .get(0);
        tx.execute_unnamed(
            &self.sql.audit,
            &[
                &AuditKind::ConsumerRetired.as_str(),
                &p,
                &c,
                &None::<&str>,
                &by.as_str(),
                &Some(unresolved),
            ],
        )
        .await?;
        tx.commit().await?;
        let lease_live: bool = retired.get(3);
        let retirement = Retirement {
            project_id: p.to_owned(),
            consumer_id: c.to_owned(),
            retired_by: by.to_string(),
            retired_at: retired.get(0),
            stopping_lease_owner: if lease_live { retired.get(1) } else { None },
            lease_generation: retired.get(2),
            unresolved_dead_letters: unresolved,
        };
        tracing::info!(project = %project, consumer = %consumer, by = %by, "consumer retired");
        Ok(retirement)
    }

    /// The audit trail by filter, newest first.
    pub async fn audit_trail(
        &self,
        client: &mut Client,
        filter: &AuditFilter,
    ) -> Result<Listing<AuditEntry>, AdminError> {
        check_limit(filter.limit)?;
        let kinds: Vec<&str> = if filter.kinds.is_empty() {
            AuditKind::ALL
        } else {
            &filter.kinds
        }
        .iter()
        .map(AuditKind::as_str)
        .collect();
        let tx = Self::snapshot(client).await?;
        let rows = tx
            .query_unnamed(
                &self.sql.audit_trail,
                &[
                    &filter.project.as_ref().map(ProjectId::as_str),
                    &filter.consumer.as_ref().map(ConsumerId::as_str),
                    &kinds,
                    &filter.event.as_ref().map(EventId::as_str),
                    &(filter.limit + 1),
                ],
            )
            .await?;
        tx.commit().await?;
        let mut items: Vec<AuditEntry> = rows
            .iter()
            .map(|row| AuditEntry {
                id: row.get(0),
                recorded_at: row.get(1),
                kind: row.get(2),
                project_id: row.get(3),
                consumer_id: row.get(4),
                event_id: row.get(5),
                actor: row.get(6),
                count: row.get(7),
            })
            .collect();
        let truncated = items.len() as i64 > filter.limit;
        items.truncate(filter.limit as usize);
        Ok(Listing { items, truncated })
    }
}

fn decode_consumer(row: &Row) -> Result<ConsumerInfo, AdminError> {
    let cursor: Option<i64> = row.get(3);
    let head: i64 = row.get(4);
    let retrying = row
        .get::<_, Option<String>>(16)
        .map(|event_id| RetryingEvent {
            event_id,
            sequence: row.get(17),
            attempts: row.get(18),
            next_attempt_at: row.get(19),
            first_failed_at: row.get(20),
            failing_for_secs: row.get(21),
            last_failure_class: row.get(22),
        });
    Ok(ConsumerInfo {
        project_id: row.get(0),
        consumer_id: row.get(1),
        state: parse_state(row.get(2))?,
        cursor,
        head_sequence: head,
        lag: cursor.map(|cursor| head - cursor),
        lease_owner: row.get(5),
        lease_generation: row.get(6),
        lease_expires_at: row.get(7),
        lease_live: row.get(8),
        heartbeat_at: row.get(9),
        heartbeat_age_secs: row.get(10),
        created_at: row.get(11),
        reconciled_at: row.get(12),
        retired_at: row.get(13),
        retired_by: row.get(14),
        retired_reason: row.get(15),
        retrying,
        dead_letters: row.get(23),
        replay_requested: row.get(24),
    })
}

fn decode_dead_letter(row: &Row) -> Result<DeadLetter, AdminError> {
    Ok(DeadLetter {
        project_id: row.get(0),
        consumer_id: row.get(1),
        event_id: row.get(2),
        sequence: row.get(3),
        state: parse_state(row.get(4))?,
        attempts: row.get(5),
        last_failure_class: row.get(6),
        first_failed_at: row.get(7),
        updated_at: row.get(8),
        parked_at: row.get(9),
        next_attempt_at: row.get(10),
        resolved_at: row.get(11),
        resolved_by: row.get(12),
        resolved_reason: row.get(13),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reasons_are_one_printable_line() {
        assert_eq!(
            Reason::new("duplicate of FN-2").unwrap().as_str(),
            "duplicate of FN-2"
        );
        Reason::new("x".repeat(MAX_REASON_LEN)).unwrap();
        Reason::new("réparé à la main ✓").unwrap();
        assert_eq!(
            Reason::new("").unwrap_err().to_string(),
            "invalid reason: must not be empty"
        );
        assert_eq!(
            Reason::new("   ").unwrap_err().to_string(),
            "invalid reason: must not be blank"
        );
        assert_eq!(
            Reason::new("x".repeat(201)).unwrap_err().to_string(),
            "invalid reason: 201 characters exceeds the limit of 200"
        );
        assert_eq!(
            Reason::new("two\nlines").unwrap_err().to_string(),
            "invalid reason: control character at position 4"
        );
        assert_eq!(
            Reason::new("tab\there").unwrap_err(),
            ReasonError::ControlCharacter { position: 4 }
        );
        assert_eq!(
            Reason::new("ab\u{202E}cd").unwrap_err().to_string(),
            "invalid reason: invisible formatting character U+202E at position 3 is not allowed"
        );
        assert!(Reason::new("zero\u{200B}width").is_err());
        assert!(Reason::new("esc\u{1b}[31m").is_err());
    }

    #[test]
    fn operators_and_event_ids_follow_the_identifier_rule() {
        OperatorName::new("alice@ops").unwrap();
        assert_eq!(
            OperatorName::new("alice smith").unwrap_err().to_string(),
            "invalid operator: character \" \" at position 6 is not allowed \
             (allowed: A-Z a-z 0-9 . _ : @ -)"
        );
        assert_eq!(
            OperatorName::new("").unwrap_err().to_string(),
            "invalid operator: must not be empty"
        );
        assert!(OperatorName::new("a".repeat(MAX_OPERATOR_LEN + 1)).is_err());
        EventId::new("task-deleted:FN-1:2026-01-02T03:04:05.001234Z").unwrap();
        EventId::new(format!(
            "task-deleted:{}:2026-01-02T03:04:05.001234Z",
            "t".repeat(128)
        ))
        .unwrap();
        assert_eq!(
            EventId::new("task deleted").unwrap_err().to_string(),
            "invalid event_id: character \" \" at position 5 is not allowed \
             (allowed: A-Z a-z 0-9 . _ : @ -)"
        );
    }

    #[test]
    fn closed_sets_parse_and_name_the_alternatives() {
        assert_eq!(
            "replay_requested".parse(),
            Ok(DeliveryState::ReplayRequested)
        );
        assert_eq!(
            "gone".parse::<DeliveryState>().unwrap_err().to_string(),
            "invalid state: \"gone\" is not one of retrying, dead, replay_requested, \
             replayed, resolved"
        );
        assert_eq!("consumer-retired".parse(), Ok(AuditKind::ConsumerRetired));
        assert_eq!(
            "lifecycle-observation:pruned".parse(),
            Ok(AuditKind::Pruned)
        );
        assert!("retired".parse::<AuditKind>().is_err());
        assert_eq!(AuditKind::ALL.len(), 7);
        for state in DeliveryState::ALL {
            assert_eq!(state.as_str().parse::<DeliveryState>(), Ok(*state));
        }
    }

    #[test]
    fn targets_and_errors_name_what_and_where() {
        let project = ProjectId::new("p").unwrap();
        let consumer = ConsumerId::new("c").unwrap();
        let event = EventId::new("task-deleted:T:2026-01-01T00:00:00.000000Z").unwrap();
        let conflict = AdminError::Conflict {
            target: Target::dead_letter(&project, &consumer, &event),
            state: "resolved".into(),
            refusal: "not dead".into(),
        };
        assert_eq!(
            conflict.to_string(),
            "dead letter task-deleted:T:2026-01-01T00:00:00.000000Z of consumer c in project p \
             is resolved, not dead"
        );
        assert_eq!(
            AdminError::NotFound {
                target: Target::consumer(&project, &consumer)
            }
            .to_string(),
            "consumer c of project p not found"
        );
        assert!(
            AdminError::Busy {
                target: Target::Project { project }
            }
            .is_retryable()
        );
        assert!(!conflict.is_retryable());
    }

    fn consumer(state: ConsumerState) -> ConsumerInfo {
        ConsumerInfo {
            project_id: "p".into(),
            consumer_id: "c".into(),
            state,
            cursor: Some(5),
            head_sequence: 5,
            lag: Some(0),
            lease_owner: Some("host:1:ab".into()),
            lease_generation: 1,
            lease_expires_at: None,
            lease_live: true,
            heartbeat_at: None,
            heartbeat_age_secs: Some(1.0),
            created_at: Utc::now(),
            reconciled_at: None,
            retired_at: None,
            retired_by: None,
            retired_reason: None,
            retrying: None,
            dead_letters: 0,
            replay_requested: 0,
        }
    }

    #[test]
    fn health_of_a_consumer() {
        let t = HealthThresholds::default();
        let healthy = consumer(ConsumerState::Active);
        assert_eq!(consumer_health(&healthy, &t), vec![Health::Ok]);

        let mut sick = healthy.clone();
        sick.lag = Some(10_001);
        sick.heartbeat_age_secs = Some(20.5);
        sick.dead_letters = 2;
        sick.retrying = Some(RetryingEvent {
            event_id: "e".into(),
            sequence: 6,
            attempts: 7,
            next_attempt_at: None,
            first_failed_at: Utc::now(),
            failing_for_secs: 15.0 * 60.0 + 1.0,
            last_failure_class: None,
        });
        assert_eq!(
            consumer_health(&sick, &t),
            vec![
                Health::Lagging,
                Health::StuckRetrying,
                Health::StaleHeartbeat,
                Health::DeadLetters
            ]
        );

        // At the thresholds exactly: still fine.
        let mut edge = healthy.clone();
        edge.lag = Some(10_000);
        edge.heartbeat_age_secs = Some(20.0);
        assert_eq!(consumer_health(&edge, &t), vec![Health::Ok]);

        // A released lease has no heartbeat to be stale; a missing cursor has no lag.
        let mut released = healthy.clone();
        released.lease_owner = None;
        released.heartbeat_age_secs = Some(3600.0);
        released.lag = None;
        assert_eq!(consumer_health(&released, &t), vec![Health::Ok]);

        // Retired consumers hold nothing back.
        let mut retired = sick.clone();
        retired.state = ConsumerState::Retired;
        assert_eq!(consumer_health(&retired, &t), vec![Health::Ok]);
    }

    #[test]
    fn health_of_a_project() {
        let t = HealthThresholds::default();
        let mut project = ProjectStatus {
            project_id: "p".into(),
            head_sequence: 3,
            pruned_through: 0,
            unsequenced: 0,
            oldest_unsequenced_at: None,
            oldest_unsequenced_age_secs: None,
            prunable: 0,
            prunable_capped: false,
            oldest_retained_at: None,
            oldest_retained_age_secs: None,
            held_by: None,
            oldest_held_age_secs: None,
            health: Vec::new(),
        };
        assert_eq!(project_health(&project, &t), vec![Health::Ok]);
        project.unsequenced = 4;
        project.oldest_unsequenced_age_secs = Some(59.0);
        assert_eq!(project_health(&project, &t), vec![Health::Ok]);
        project.oldest_unsequenced_age_secs = Some(61.0);
        assert_eq!(project_health(&project, &t), vec![Health::SequencerStalled]);

        // A backlog is judged by count; an old retained event alone is not `retention_held`
        // (it may just be prunable): only the oldest event a sweep would keep counts.
        let day = 86_400.0;
        project.oldest_unsequenced_age_secs = None;
        project.prunable = 100_000;
        project.oldest_retained_age_secs = Some(90.0 * day);
        assert_eq!(project_health(&project, &t), vec![Health::Ok]);
        project.prunable = 100_001;
        project.prunable_capped = true;
        assert_eq!(project_health(&project, &t), vec![Health::PruningBacklog]);
        project.oldest_held_age_secs = Some(31.0 * day);
        assert_eq!(project_health(&project, &t), vec![Health::PruningBacklog]);
        project.oldest_held_age_secs = Some(31.0 * day + 1.0);
        assert_eq!(
            project_health(&project, &t),
            vec![Health::PruningBacklog, Health::RetentionHeld]
        );
        let tight = HealthThresholds {
            max_retention_overrun: Duration::ZERO,
            retention: Duration::from_secs(86_400),
            ..HealthThresholds::default()
        };
        project.prunable = 0;
        project.oldest_held_age_secs = Some(day + 1.0);
        assert_eq!(
            project_health(&project, &tight),
            vec![Health::RetentionHeld]
        );
        assert_eq!(Health::RetentionHeld.as_str(), "retention_held");
        let admin = Admin::new(&Schema::default());
        admin.status_pruner(&t).unwrap();
        let too_long = HealthThresholds {
            retention: MAX_RETENTION + Duration::from_secs(1),
            ..HealthThresholds::default()
        };
        assert!(matches!(
            admin.status_pruner(&too_long),
            Err(AdminError::Invalid(InputError::Threshold(_)))
        ));
        let negative = HealthThresholds {
            max_prunable: -1,
            ..HealthThresholds::default()
        };
        assert!(admin.status_pruner(&negative).is_err());
        assert_eq!(
            serde_json::to_value(Health::PruningBacklog).unwrap(),
            "pruning_backlog"
        );
    }

    proptest! {
        #[test]
        fn reason_accepted_iff_printable_nonblank_and_short(s in "\\PC{0,210}|[ -~\\n\\t]{0,20}") {
            let expected = !s.trim().is_empty()
                && s.chars().count() <= MAX_REASON_LEN
                && !s.chars().any(|c| c.is_control() || is_formatting(c));
            prop_assert_eq!(Reason::new(s.clone()).is_ok(), expected);
        }
    }
}
