//! The plan of a retention batch: the options, and the pure part of the rule. A batch starting
//! at the floor may go no further than the head, the batch size and the slowest cursor allow,
//! and not at all while a consumer's cursor is missing (`bound`); the statements then stop it
//! at the first event that is too young or an unresolved dead letter's ([`HoldBack`]).

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use tokio_postgres::Row;

use crate::ids::ProjectId;

/// Default retention period of events and settled dead letters: 30 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 86_400);

/// Longest retention period accepted: 100 years (365-day years).
pub const MAX_RETENTION: Duration = Duration::from_secs(36_500 * 86_400);

/// Default number of events (or delivery rows) one batch removes.
pub const DEFAULT_PRUNE_BATCH: i64 = 500;

/// Largest batch accepted.
pub const MAX_PRUNE_BATCH: i64 = 100_000;

/// Default actor recorded on the sweep's audit rows.
pub const DEFAULT_PRUNE_ACTOR: &str = "retention-sweep";

/// The server ends a batch idle inside its transaction for longer (releasing its locks).
pub(super) const BATCH_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// A batch waiting longer than this for a row lock fails (and the sweep with it) rather than
/// queueing writers or the sequencer behind it.
pub(super) const BATCH_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// How a sweep runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneOptions {
    /// Events older than this (and acknowledged, and not a dead letter's) are pruned; settled
    /// dead letters are pruned this long after they were settled. Zero is allowed (tests,
    /// benchmarks).
    pub retention: Duration,
    /// Events (or delivery rows) per batch transaction, 1..=[`MAX_PRUNE_BATCH`].
    pub batch_size: i64,
    /// Only this project; `None` sweeps every project with sequenced events.
    pub project: Option<ProjectId>,
    /// Report what would go without deleting anything.
    pub dry_run: bool,
    /// Recorded as `actor` on the audit rows (same characters as an ID, 1..=200).
    pub actor: String,
}

impl Default for PruneOptions {
    /// 30 days, batches of 500, every project, for real, actor `retention-sweep`.
    fn default() -> Self {
        Self {
            retention: DEFAULT_RETENTION,
            batch_size: DEFAULT_PRUNE_BATCH,
            project: None,
            dry_run: false,
            actor: DEFAULT_PRUNE_ACTOR.to_owned(),
        }
    }
}

/// Sweep options were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PruneOptionsError {
    /// The batch size is out of range.
    #[error("invalid prune batch size {0}: use 1 to {MAX_PRUNE_BATCH}")]
    BatchSize(i64),
    /// The retention period is too long.
    #[error("invalid retention period {0:?}: at most 36500 days")]
    Retention(Duration),
    /// The audit actor is empty, too long or has characters outside `A-Za-z0-9._:@-`.
    #[error("invalid prune actor {0:?}: use 1 to 200 characters from A-Z a-z 0-9 . _ : @ -")]
    Actor(String),
}

impl PruneOptions {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), PruneOptionsError> {
        if !(1..=MAX_PRUNE_BATCH).contains(&self.batch_size) {
            return Err(PruneOptionsError::BatchSize(self.batch_size));
        }
        if self.retention > MAX_RETENTION {
            return Err(PruneOptionsError::Retention(self.retention));
        }
        let actor_ok = (1..=200).contains(&self.actor.len())
            && self
                .actor
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._:@-".contains(c));
        if !actor_ok {
            return Err(PruneOptionsError::Actor(self.actor.clone()));
        }
        Ok(())
    }
}

/// Why a project's floor stops where it does (below its head).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum HoldBack {
    /// A non-retired consumer has no cursor yet (it has not reconciled): nothing is pruned.
    MissingCursor {
        /// The consumer (the first by ID, if several).
        consumer_id: String,
    },
    /// The slowest non-retired consumer has acknowledged only up to `cursor`.
    Cursor {
        /// The consumer.
        consumer_id: String,
        /// Its last acknowledged sequence.
        cursor: i64,
    },
    /// The next event is younger than the retention period.
    Retention {
        /// The first retained event's sequence.
        sequence: i64,
    },
    /// The next event is an unresolved dead letter of a non-retired consumer.
    DeadLetter {
        /// The consumer.
        consumer_id: String,
        /// The dead letter's event.
        event_id: String,
        /// Its sequence.
        sequence: i64,
    },
}

impl fmt::Display for HoldBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldBack::MissingCursor { consumer_id } => {
                write!(
                    f,
                    "consumer {consumer_id} has no cursor (not reconciled yet)"
                )
            }
            HoldBack::Cursor {
                consumer_id,
                cursor,
            } => write!(f, "consumer {consumer_id} acknowledged up to {cursor}"),
            HoldBack::Retention { sequence } => {
                write!(f, "event {sequence} is within the retention period")
            }
            HoldBack::DeadLetter {
                consumer_id,
                sequence,
                ..
            } => write!(
                f,
                "event {sequence} is an unresolved dead letter of {consumer_id}"
            ),
        }
    }
}

/// A project's bounds as read at the start of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProjectState {
    /// Last assigned sequence.
    pub(super) head: i64,
    /// Current retention floor.
    pub(super) floor: i64,
    /// A non-retired consumer with a missing cursor.
    pub(super) missing: Option<String>,
    /// The slowest non-retired consumer with a cursor, and that cursor.
    pub(super) slowest: Option<(String, i64)>,
}

impl ProjectState {
    /// Decodes a row of `PROJECT_STATE`.
    pub(super) fn decode(row: &Row) -> Result<Self, tokio_postgres::Error> {
        let slowest_consumer: Option<String> = row.try_get("slowest_consumer")?;
        let slowest_cursor: Option<i64> = row.try_get("slowest_cursor")?;
        Ok(Self {
            head: row.try_get("head_sequence")?,
            floor: row.try_get("pruned_through")?,
            missing: row.try_get("missing_consumer")?,
            slowest: slowest_consumer.zip(slowest_cursor),
        })
    }
}

impl HoldBack {
    /// Decodes a row of `FIRST_HELD`: the first event past the bound's range that must stay,
    /// as what holds the floor below it, with that event's sequence.
    pub(super) fn decode_first_held(row: &Row) -> Result<(i64, Self), tokio_postgres::Error> {
        let kind: &str = row.try_get("kind")?;
        let sequence: i64 = row.try_get("sequence")?;
        let hold = if kind == "dead_letter" {
            HoldBack::DeadLetter {
                consumer_id: row.try_get("consumer_id")?,
                event_id: row.try_get("event_id")?,
                sequence,
            }
        } else {
            HoldBack::Retention { sequence }
        };
        Ok((sequence, hold))
    }
}

/// One batch's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plan {
    /// The new floor (equal to the old one when nothing may go).
    pub(super) target: i64,
    /// What stopped the floor below the head, if anything did.
    pub(super) hold: Option<HoldBack>,
    /// Only the batch size stopped it: run another batch.
    pub(super) more: bool,
}

/// The highest sequence a batch starting at `floor` may reach judging by head, batch size and
/// cursors alone, and the consumer that limits it (if one does). Never below `floor`.
pub(super) fn bound(floor: i64, state: &ProjectState, batch: i64) -> (i64, Option<HoldBack>) {
    let upper = state.head.min(floor.saturating_add(batch)).max(floor);
    if let Some(consumer_id) = &state.missing {
        let hold = HoldBack::MissingCursor {
            consumer_id: consumer_id.clone(),
        };
        return (floor, Some(hold));
    }
    match &state.slowest {
        Some((consumer_id, cursor)) if *cursor < upper => {
            let hold = HoldBack::Cursor {
                consumer_id: consumer_id.clone(),
                cursor: *cursor,
            };
            ((*cursor).max(floor), Some(hold))
        }
        _ => (upper, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(head: i64, floor: i64) -> ProjectState {
        ProjectState {
            head,
            floor,
            missing: None,
            slowest: None,
        }
    }

    #[test]
    fn options_are_checked() {
        PruneOptions::default().validate().unwrap();
        let mut o = PruneOptions {
            batch_size: 0,
            ..PruneOptions::default()
        };
        assert_eq!(o.validate(), Err(PruneOptionsError::BatchSize(0)));
        o.batch_size = MAX_PRUNE_BATCH + 1;
        assert!(o.validate().is_err());
        o.batch_size = MAX_PRUNE_BATCH;
        o.validate().unwrap();
        o.retention = Duration::ZERO;
        o.validate().unwrap();
        o.retention = MAX_RETENTION + Duration::from_secs(1);
        assert!(matches!(o.validate(), Err(PruneOptionsError::Retention(_))));
        for bad in ["", "a b", "x\n", &"a".repeat(201)] {
            let o = PruneOptions {
                actor: bad.to_owned(),
                ..PruneOptions::default()
            };
            assert!(
                matches!(o.validate(), Err(PruneOptionsError::Actor(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn no_consumers_bounds_by_head_and_batch() {
        assert_eq!(bound(0, &state(1000, 0), 500), (500, None));
        assert_eq!(bound(800, &state(1000, 800), 500), (1000, None));
        assert_eq!(bound(1000, &state(1000, 1000), 500), (1000, None));
    }

    #[test]
    fn a_missing_cursor_holds_everything() {
        let mut s = state(1000, 10);
        s.missing = Some("new".into());
        s.slowest = Some(("fast".into(), 900));
        let (upper, hold) = bound(10, &s, 500);
        assert_eq!(upper, 10);
        assert_eq!(
            hold,
            Some(HoldBack::MissingCursor {
                consumer_id: "new".into()
            })
        );
    }

    #[test]
    fn the_slowest_cursor_bounds_when_below_the_batch_end() {
        let mut s = state(1000, 0);
        s.slowest = Some(("slow".into(), 120));
        assert_eq!(
            bound(0, &s, 500),
            (
                120,
                Some(HoldBack::Cursor {
                    consumer_id: "slow".into(),
                    cursor: 120
                })
            )
        );
        // A cursor at or past the batch end does not limit this batch.
        s.slowest = Some(("slow".into(), 500));
        assert_eq!(bound(0, &s, 500), (500, None));
        // A cursor below the floor (the consumer will reconcile) never moves it back.
        s.slowest = Some(("slow".into(), 3));
        assert_eq!(bound(10, &s, 500).0, 10);
        // A cursor above the head (restored database) does not lift the bound past the head.
        s.slowest = Some(("slow".into(), 5000));
        assert_eq!(bound(900, &s, 500), (1000, None));
    }

    #[test]
    fn hold_back_reads_well() {
        let hold = HoldBack::DeadLetter {
            consumer_id: "c".into(),
            event_id: "e".into(),
            sequence: 7,
        };
        assert_eq!(
            hold.to_string(),
            "event 7 is an unresolved dead letter of c"
        );
        let json = serde_json::to_value(&hold).unwrap();
        assert_eq!(json["reason"], "dead_letter");
        assert_eq!(json["sequence"], 7);
    }
}
