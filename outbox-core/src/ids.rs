//! Identifier validation shared by every entry point, and the identifier types.
//!
//! Project, task, writer, consumer, operator and event IDs share one rule so that an ID accepted in one place is
//! accepted everywhere: 1 to 128 characters (operators 64, event IDs 256) from
//! `A-Z a-z 0-9 . _ : @ -`. The SQL writer
//! (`check_identifier` in `sql/0001_init.sql`) raises exactly the messages produced here.

use std::fmt;

/// Longest accepted project, task, writer process or consumer ID, in characters.
pub const MAX_ID_LEN: usize = 128;

/// Why an identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The value is the empty string.
    #[error("invalid {field}: must not be empty")]
    Empty {
        /// Which argument.
        field: String,
    },
    /// The value is longer than allowed.
    #[error("invalid {field}: {len} characters exceeds the limit of {max}")]
    TooLong {
        /// Which argument.
        field: String,
        /// Its length in characters.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The value contains a control character (C0, DEL or C1).
    #[error("invalid {field}: control character at position {position}")]
    ControlCharacter {
        /// Which argument.
        field: String,
        /// 1-based character position.
        position: usize,
    },
    /// The value contains a printable character outside the allowed set.
    #[error(
        "invalid {field}: character {} at position {position} is not allowed \
         (allowed: A-Z a-z 0-9 . _ : @ -)",
        json_quoted(*character)
    )]
    InvalidCharacter {
        /// Which argument.
        field: String,
        /// The offending character.
        character: char,
        /// 1-based character position.
        position: usize,
    },
}

fn json_quoted(c: char) -> String {
    serde_json::Value::String(c.to_string()).to_string()
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '-')
}

/// Checks `value` against the identifier rule, naming `field` in the error.
pub(crate) fn validate_identifier(field: &str, value: &str, max: usize) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty {
            field: field.to_owned(),
        });
    }
    let len = value.chars().count();
    if len > max {
        return Err(IdError::TooLong {
            field: field.to_owned(),
            len,
            max,
        });
    }
    for (index, character) in value.chars().enumerate() {
        let position = index + 1;
        if character.is_control() {
            return Err(IdError::ControlCharacter {
                field: field.to_owned(),
                position,
            });
        }
        if !allowed(character) {
            return Err(IdError::InvalidCharacter {
                field: field.to_owned(),
                character,
                position,
            });
        }
    }
    Ok(())
}

/// Longest accepted operator name (`--by`), in characters.
pub const MAX_OPERATOR_LEN: usize = 64;
/// Longest accepted event ID, in characters (`task-deleted:` + a task ID of up to 128
/// characters + `:` + a 27-character timestamp fits with room to spare).
pub const MAX_EVENT_ID_LEN: usize = 256;

macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        identifier!($(#[$doc])* $name, $field, MAX_ID_LEN);
    };
    ($(#[$doc:meta])* $name:ident, $field:literal, $max:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps `value`.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                validate_identifier($field, &value, $max)?;
                Ok(Self(value))
            }

            /// The ID as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(value: &str) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        /// Bound as its text, so typed IDs go into statements as they are.
        impl tokio_postgres::types::ToSql for $name {
            fn to_sql(
                &self,
                ty: &tokio_postgres::types::Type,
                out: &mut tokio_postgres::types::private::BytesMut,
            ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
                self.0.to_sql(ty, out)
            }

            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <String as tokio_postgres::types::ToSql>::accepts(ty)
            }

            tokio_postgres::types::to_sql_checked!();
        }
    };
}

identifier!(
    /// A project: the unit of ordering. Events are numbered densely per project.
    ProjectId,
    "project_id"
);
/// The start of every probe project's ID: `outbox verify` writes its probe events only into
/// a project named so (its default project is exactly this), and a consumer set that follows
/// every project never follows one, so a running `--all-projects` consumer neither receives
/// probe events as deletions nor registers a consumer that makes the next `verify` refuse the
/// project.
pub const PROBE_PROJECT_PREFIX: &str = "outbox-verify";

impl ProjectId {
    /// Whether this is a probe project (its ID starts with [`PROBE_PROJECT_PREFIX`]).
    pub fn is_probe(&self) -> bool {
        is_probe_project(&self.0)
    }
}

/// Whether the project ID `project` names a probe project (see [`PROBE_PROJECT_PREFIX`]).
pub fn is_probe_project(project: &str) -> bool {
    project.starts_with(PROBE_PROJECT_PREFIX)
}

identifier!(
    /// A task whose deletion is recorded.
    TaskId,
    "task_id"
);
identifier!(
    /// The identity of the process that wrote an event, carried to observers as its origin.
    WriterProcessId,
    "writer_process_id"
);
identifier!(
    /// A durable consumer's explicit, stable identity. Never generated at boot: a consumer that
    /// forgets its ID would silently start a new cursor and lose its place.
    ConsumerId,
    "consumer_id"
);
identifier!(
    /// Who performs an operation (`--by`), up to [`MAX_OPERATOR_LEN`] characters. Recorded as
    /// the audit row's `actor`.
    OperatorName,
    "operator",
    MAX_OPERATOR_LEN
);
identifier!(
    /// An event's identity as stored (`task-deleted:<task_id>:<deleted_at>`), up to
    /// [`MAX_EVENT_ID_LEN`] characters.
    EventId,
    "event_id",
    MAX_EVENT_ID_LEN
);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_typical_ids() {
        for id in ["FN-8683", "a", "proj.1", "dashboard@node-1", "x:y_z"] {
            ProjectId::new(id).unwrap();
        }
        ProjectId::new("a".repeat(MAX_ID_LEN)).unwrap();
    }

    #[test]
    fn names_each_problem() {
        assert_eq!(
            TaskId::new("").unwrap_err().to_string(),
            "invalid task_id: must not be empty"
        );
        assert_eq!(
            TaskId::new("a".repeat(129)).unwrap_err().to_string(),
            "invalid task_id: 129 characters exceeds the limit of 128"
        );
        assert_eq!(
            ConsumerId::new("ab\ncd").unwrap_err().to_string(),
            "invalid consumer_id: control character at position 3"
        );
        assert_eq!(
            ProjectId::new("a b").unwrap_err().to_string(),
            "invalid project_id: character \" \" at position 2 is not allowed \
             (allowed: A-Z a-z 0-9 . _ : @ -)"
        );
        assert_eq!(
            ProjectId::new("é").unwrap_err(),
            IdError::InvalidCharacter {
                field: "project_id".into(),
                character: 'é',
                position: 1
            }
        );
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

    proptest! {
        #[test]
        fn valid_iff_matches_the_pattern(s in "\\PC{0,140}|[A-Za-z0-9._:@-]{0,140}") {
            let expected = !s.is_empty()
                && s.chars().count() <= MAX_ID_LEN
                && s.chars().all(allowed);
            prop_assert_eq!(ProjectId::new(s.clone()).is_ok(), expected);
        }
    }
}
