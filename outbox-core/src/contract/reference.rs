//! Names of event types and of their majors (`task:archived@1`), and the set of them a
//! consumer declares it understands.

use std::fmt;
use std::str::FromStr;

use crate::event::TASK_DELETED;

use super::TASK_DELETED_MAJOR;

/// Why a type name, a contract reference or a list of them was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RefError(pub String);

/// An event type's name: `noun:verb`, each part a lower-case letter followed by up to 31
/// lower-case letters, digits or `_` (`task:deleted`, `task:archived`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct EventTypeName(String);

impl EventTypeName {
    /// Checks `name` against the `noun:verb` rule.
    pub fn new(name: &str) -> Result<Self, RefError> {
        let valid_part = |part: &str| {
            let mut chars = part.chars();
            matches!(chars.next(), Some('a'..='z'))
                && part.len() <= 32
                && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        };
        match name.split_once(':') {
            Some((noun, verb)) if valid_part(noun) && valid_part(verb) => Ok(Self(name.into())),
            _ => Err(RefError(format!(
                "invalid event type {}: use noun:verb in lower case (task:archived), each part \
                 a letter followed by up to 31 letters, digits or _",
                serde_json::Value::String(name.into())
            ))),
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as one token of a NATS subject or a URL path (`task_archived`): see
    /// [`subject_token`].
    pub fn token(&self) -> String {
        subject_token(&self.0)
    }
}

impl fmt::Display for EventTypeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An event type's subject token: the name with its `:` written `_` (`task:archived` →
/// `task_archived`, `task:deleted` → `task_deleted`, the relay's subject since before there
/// were other types). One rule for the relay's subjects and the AsyncAPI document's channels,
/// so the document names the subjects the relay publishes to. A name has one `:` and no `.`,
/// `*`, `>` or whitespace, so the token is always one NATS token; two names can share a token
/// (`a_b:c` and `a:b_c`), which the relay refuses to declare together.
pub fn subject_token(event_type: &str) -> String {
    event_type.replace(':', "_")
}

/// One major version of an event type: `task:archived@1`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContractRef {
    /// The type.
    pub event_type: EventTypeName,
    /// The major version, from 1.
    pub major: u32,
}

impl ContractRef {
    /// `task:deleted@1`, what every consumer accepts unless it declares otherwise.
    pub fn task_deleted() -> Self {
        Self {
            event_type: EventTypeName(TASK_DELETED.into()),
            major: TASK_DELETED_MAJOR,
        }
    }
}

impl fmt::Display for ContractRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.event_type, self.major)
    }
}

impl serde::Serialize for ContractRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl FromStr for ContractRef {
    type Err = RefError;

    fn from_str(text: &str) -> Result<Self, RefError> {
        let Some((name, major)) = text.rsplit_once('@') else {
            return Err(RefError(format!(
                "invalid event type {}: name the major version too (task:deleted@1)",
                serde_json::Value::String(text.into())
            )));
        };
        let event_type = EventTypeName::new(name)?;
        let major = match major.parse::<u32>() {
            Ok(number @ 1..=9999) if !major.starts_with(['0', '+']) => number,
            _ => {
                return Err(RefError(format!(
                    "invalid major version {} in {}: use a whole number from 1 to 9999",
                    serde_json::Value::String(major.into()),
                    serde_json::Value::String(text.into())
                )));
            }
        };
        Ok(Self { event_type, major })
    }
}

/// The types and majors a consumer understands. An event of a type not in the set passes
/// without a handler call; an event of a type in the set but of another major is parked as a
/// `contract_mismatch` dead letter, since a retry cannot make it understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTypes(Vec<ContractRef>);

/// What a consumer does with an event, by its type and major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acceptance {
    /// Declared: deliver it.
    Deliver,
    /// A type the consumer did not declare: pass it without a handler call.
    Skip,
    /// A declared type in a major the consumer did not declare: park it.
    Mismatch,
}

impl EventTypes {
    /// A set of the given references (duplicates refused, at least one).
    pub fn new(refs: Vec<ContractRef>) -> Result<Self, RefError> {
        if refs.is_empty() {
            return Err(RefError(
                "no event type declared: name at least one (task:deleted@1)".into(),
            ));
        }
        for (index, r) in refs.iter().enumerate() {
            if refs[..index].contains(r) {
                return Err(RefError(format!("event type {r} is declared twice")));
            }
        }
        Ok(Self(refs))
    }

    /// The references, in declaration order.
    pub fn refs(&self) -> &[ContractRef] {
        &self.0
    }

    /// Whether this is the default set (`task:deleted@1` alone).
    pub fn is_default(&self) -> bool {
        self.0 == [ContractRef::task_deleted()]
    }

    /// What to do with an event of `event_type` at `major`.
    pub fn accept(&self, event_type: &str, major: i32) -> Acceptance {
        let mut declared = false;
        for r in &self.0 {
            if r.event_type.as_str() == event_type {
                if i64::from(r.major) == i64::from(major) {
                    return Acceptance::Deliver;
                }
                declared = true;
            }
        }
        if declared {
            Acceptance::Mismatch
        } else {
            Acceptance::Skip
        }
    }
}

impl Default for EventTypes {
    fn default() -> Self {
        Self(vec![ContractRef::task_deleted()])
    }
}

impl fmt::Display for EventTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, r) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl FromStr for EventTypes {
    type Err = RefError;

    /// A comma-separated list: `task:deleted@1,task:archived@1`.
    fn from_str(text: &str) -> Result<Self, RefError> {
        let refs = text
            .split(',')
            .map(|entry| entry.trim().parse())
            .collect::<Result<Vec<ContractRef>, _>>()?;
        Self::new(refs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_are_noun_colon_verb_in_lower_case() {
        for good in ["task:deleted", "task:archived", "board_item:moved2"] {
            EventTypeName::new(good).unwrap();
        }
        for bad in [
            "",
            "task",
            "Task:deleted",
            "task:",
            ":deleted",
            "task:del eted",
            "task:deleted:x",
            "1task:deleted",
            "task.deleted",
        ] {
            let error = EventTypeName::new(bad).unwrap_err();
            assert!(error.0.contains("noun:verb"), "{bad}: {error}");
        }
        assert!(EventTypeName::new(&format!("{}:x", "a".repeat(33))).is_err());
        assert_eq!(
            EventTypeName::new("task:archived").unwrap().token(),
            "task_archived"
        );
    }

    #[test]
    fn references_name_a_major() {
        let r: ContractRef = "task:archived@2".parse().unwrap();
        assert_eq!(r.major, 2);
        assert_eq!(r.to_string(), "task:archived@2");
        for bad in [
            "task:archived",
            "task:archived@0",
            "task:archived@x",
            "task:archived@01",
            "task:archived@10000",
            "task:archived@-1",
        ] {
            assert!(bad.parse::<ContractRef>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_consumer_skips_undeclared_types_and_parks_undeclared_majors() {
        let types: EventTypes = "task:deleted@1, task:archived@2".parse().unwrap();
        assert_eq!(types.accept("task:deleted", 1), Acceptance::Deliver);
        assert_eq!(types.accept("task:archived", 2), Acceptance::Deliver);
        assert_eq!(types.accept("task:archived", 1), Acceptance::Mismatch);
        assert_eq!(types.accept("task:deleted", 2), Acceptance::Mismatch);
        assert_eq!(types.accept("task:restored", 1), Acceptance::Skip);
        assert!(EventTypes::default().is_default());
        assert_eq!(EventTypes::default().to_string(), "task:deleted@1");
        assert!(
            "task:deleted@1,task:deleted@1"
                .parse::<EventTypes>()
                .is_err()
        );
        assert!("".parse::<EventTypes>().is_err());
    }
}
