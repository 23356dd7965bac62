//! The closed sets of stored text: delivery and consumer states, audit kinds and health
//! codes. Each is an enum with `as_str` (the stored text), `FromStr` (which names the accepted
//! values on a refusal) and serialization as that text; every crate reads and writes these
//! values through them, never through literals of its own.
//!
//! The SQL statements compare with the same literals (`state = 'dead'`); the tests of this
//! module check every such literal in the statements against these enums.

use std::fmt;

use serde::Serialize;

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
        /// A dead letter was replayed successfully (actor: who asked for the replay).
        ConsumerReplayed => "lifecycle-observation:consumer-replayed" | "consumer-replayed",
        /// An operator asked for a dead letter to be replayed.
        DeadLetterReplayRequested =>
            "lifecycle-observation:dead-letter-replay-requested" | "dead-letter-replay-requested",
        /// An operator resolved a dead letter.
        DeadLetterResolved =>
            "lifecycle-observation:dead-letter-resolved" | "dead-letter-resolved",
        /// An operator retired a consumer.
        ConsumerRetired => "lifecycle-observation:consumer-retired" | "consumer-retired",
        /// A retired consumer was made active again: started with reactivation, or by
        /// `outbox consumers reactivate` (actor: the operator).
        ConsumerReactivated =>
            "lifecycle-observation:consumer-reactivated" | "consumer-reactivated",
        /// An operator deleted a retired consumer's rows (count: its delivery rows deleted
        /// with it).
        ConsumerDeleted => "lifecycle-observation:consumer-deleted" | "consumer-deleted",
        /// A consumer ran full reconciliation.
        Reconciled => "lifecycle-observation:reconciled" | "reconciled",
        /// The retention sweep pruned events or resolved dead letters.
        Pruned => "lifecycle-observation:pruned" | "pruned",
        /// A consumer found that the event at its position is not the one it acknowledged
        /// (a failover lost a tail, or a backup was restored) and reconciled.
        HistoryDiverged => "lifecycle-observation:history-diverged" | "history-diverged",
        /// An operator registered a contract: a new type, major or minor (the reason says
        /// which minor).
        ContractAdded => "lifecycle-observation:contract-added" | "contract-added",
        /// An operator deprecated a contract's major.
        ContractDeprecated =>
            "lifecycle-observation:contract-deprecated" | "contract-deprecated",
        /// An operator retired a contract's major.
        ContractRetired => "lifecycle-observation:contract-retired" | "contract-retired",
    }
);

/// The namespace every stored audit kind carries.
pub const AUDIT_KIND_PREFIX: &str = "lifecycle-observation:";

impl AuditKind {
    /// The kind without [`AUDIT_KIND_PREFIX`] (`consumer-retired`), as tables show it and as
    /// `outbox audit --kind` also accepts it.
    pub fn short_name(&self) -> &'static str {
        let text = self.as_str();
        text.strip_prefix(AUDIT_KIND_PREFIX).unwrap_or(text)
    }
}

text_enum!(
    /// A bounded health code of a project or consumer (`outbox status`).
    Health, "health code" {
        /// Nothing to report.
        Ok => "ok",
        /// The consumer is more than `max_lag` events behind the head.
        Lagging => "lagging",
        /// An event has been failing and holding the cursor for longer than
        /// `max_retrying_age`.
        StuckRetrying => "stuck_retrying",
        /// The lease is held and not yet expired, but its last heartbeat is older than
        /// `max_heartbeat_age` (the holder is hung or partitioned). Once the lease expires
        /// this becomes `not_running`.
        StaleHeartbeat => "stale_heartbeat",
        /// No process holds the lease and the last heartbeat is older than
        /// `max_heartbeat_age`, while events wait for this consumer.
        NotRunning => "not_running",
        /// The consumer has no cursor or has never acknowledged an event, no process runs it,
        /// and events wait: it holds retention back for nothing (a mistyped `--consumer-id`
        /// creates exactly this; retire it).
        NeverAcknowledged => "never_acknowledged",
        /// The consumer has unresolved dead letters waiting for an operator.
        DeadLetters => "dead_letters",
        /// An operator asked for dead letters to be replayed, but no process holds the lease
        /// and the last heartbeat is older than `max_heartbeat_age`: only the lease holder
        /// replays, so the request waits until the consumer is started.
        ReplayUnserved => "replay_unserved",
        /// Committed events have waited for a number longer than `max_unsequenced_age`: no
        /// sequencer is running.
        SequencerStalled => "sequencer_stalled",
        /// More than `max_prunable` events of the project are prunable now: no retention sweep
        /// is running for it (no consumer process with the sweep enabled, no scheduled
        /// `outbox prune`).
        PruningBacklog => "pruning_backlog",
        /// The oldest event a sweep would keep is older than `retention +
        /// max_retention_overrun`: a consumer's cursor (lagging, or missing) or an unresolved
        /// dead letter holds the retention floor back.
        RetentionHeld => "retention_held",
    }
);

/// The quoted literals of every line of `source` that compares or sets a `state` column, and
/// every quoted audit kind: what the statements of `source` write or match as text. Comment
/// lines are passed over, and only lower-case words count as literals.
#[doc(hidden)]
pub fn stored_literals(source: &str) -> (Vec<String>, Vec<String>) {
    let quoted = |line: &str| -> Vec<String> {
        line.split('\'')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    let (mut states, mut kinds) = (Vec::new(), Vec::new());
    let word = |text: &str| {
        !text.is_empty()
            && text
                .chars()
                .all(|c| c.is_ascii_lowercase() || matches!(c, '_' | '-' | ':'))
    };
    for line in source.lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mentions_state = line
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|word| word == "state");
        for literal in quoted(line).into_iter().filter(|l| word(l)) {
            if literal.starts_with(AUDIT_KIND_PREFIX) {
                kinds.push(literal);
            } else if mentions_state {
                states.push(literal);
            }
        }
    }
    (states, kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(AuditKind::ALL.len(), 13);
        assert_eq!(AuditKind::ConsumerRetired.short_name(), "consumer-retired");
        for state in DeliveryState::ALL {
            assert_eq!(state.as_str().parse::<DeliveryState>(), Ok(*state));
        }
        for health in Health::ALL {
            assert_eq!(health.as_str().parse::<Health>(), Ok(*health));
        }
        assert_eq!(Health::RetentionHeld.as_str(), "retention_held");
    }

    /// The statements' state and kind literals are values of these enums, so a renamed state
    /// cannot leave a statement matching a value nothing writes any more.
    #[test]
    fn every_literal_in_the_statements_is_a_known_value() {
        let sources = [
            include_str!("admin/status/mod.rs"),
            include_str!("admin/consumers.rs"),
            include_str!("admin/consumer_admin.rs"),
            include_str!("admin/dead_letters/mod.rs"),
            include_str!("admin/dead_letters/repair.rs"),
            include_str!("admin/audit.rs"),
            include_str!("retention/sql.rs"),
        ];
        let mut seen = 0;
        for source in sources {
            let (states, kinds) = stored_literals(source);
            for state in &states {
                assert!(
                    state.parse::<DeliveryState>().is_ok()
                        || state.parse::<ConsumerState>().is_ok(),
                    "{state:?} is neither a delivery nor a consumer state"
                );
            }
            for kind in &kinds {
                kind.parse::<AuditKind>().unwrap();
            }
            seen += states.len() + kinds.len();
        }
        assert!(seen > 10, "the scan found only {seen} literals");
    }
}
