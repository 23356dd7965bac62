//! How an operator operation fails: refused input, a missing target, a target in the wrong
//! state, a busy row or the database. Every error names its target.

use std::fmt;

use tokio_postgres::error::SqlState;

use super::MAX_LIMIT;
use super::reason::ReasonError;
use crate::ids::{ConsumerId, EventId, IdError, ProjectId};
use crate::states::UnknownValue;

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
    /// A status threshold out of range (retention above [`MAX_RETENTION`](crate::retention::MAX_RETENTION), a negative
    /// `max_prunable`).
    #[error("invalid threshold: {0}")]
    Threshold(String),
    /// A contract file was refused, or is incompatible with the registered version.
    #[error(transparent)]
    Contract(#[from] crate::contract::ContractFileError),
}

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
    /// A consumer ID, in whichever project (a filter given without `--project`).
    ConsumerId {
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
    /// One consumer's delivery state of the event at a sequence.
    DeadLetterAt {
        /// The project.
        project: ProjectId,
        /// The consumer.
        consumer: ConsumerId,
        /// The event's sequence.
        sequence: i64,
    },
    /// An event type's major version in the contract registry.
    Contract {
        /// `task:archived@1`.
        contract: crate::contract::ContractRef,
    },
}

impl Target {
    pub(super) fn consumer(project: &ProjectId, consumer: &ConsumerId) -> Self {
        Target::Consumer {
            project: project.clone(),
            consumer: consumer.clone(),
        }
    }

    pub(super) fn dead_letter(project: &ProjectId, consumer: &ConsumerId, event: &EventId) -> Self {
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
            Target::ConsumerId { consumer } => write!(f, "consumer {consumer} (in any project)"),
            Target::DeadLetter {
                project,
                consumer,
                event,
            } => write!(
                f,
                "dead letter {event} of consumer {consumer} in project {project}"
            ),
            Target::DeadLetterAt {
                project,
                consumer,
                sequence,
            } => write!(
                f,
                "dead letter at sequence {sequence} of consumer {consumer} in project {project}"
            ),
            Target::Contract { contract } => write!(f, "contract {contract}"),
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

impl From<crate::contract::ContractFileError> for AdminError {
    fn from(e: crate::contract::ContractFileError) -> Self {
        AdminError::Invalid(InputError::Contract(e))
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
    pub(super) fn on(target: Target) -> impl FnOnce(tokio_postgres::Error) -> AdminError {
        move |e| {
            if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
                AdminError::Busy { target }
            } else {
                AdminError::Database(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
