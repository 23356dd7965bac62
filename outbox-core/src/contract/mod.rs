//! Event contracts: what each event type and major version carries, registered in the schema
//! (`lifecycle_event_contracts`, migration 16) before any event of it may be written.
//!
//! A contract names its fields from a closed set of types (identifier, timestamp, integer,
//! boolean, enum and objects of those; there is no free-text type, so a payload never carries
//! prose, credentials or free text), which of them are required, and which make the event ID
//! (its identity, so a repeated write of one occurrence records nothing new). A new minor of
//! a major may only add optional fields ([`Contract::check_successor`]); anything else is a
//! new major, registered beside the old one. The SQL writer `write_event` checks payloads
//! against the stored form ([`Contract::fields_json`]): first with `payload_is_valid`, a plain
//! SQL expression the schema generates from every registered contract (migration 17), then,
//! for a payload that expression does not accept, field by field to name the problem.

mod compat;
mod event;
mod file;
mod reference;
mod schema_doc;

use std::collections::BTreeMap;

pub use event::{Event, Payload, validate_traceparent};
pub use file::ContractFileError;
pub use reference::{Acceptance, ContractRef, EventTypeName, EventTypes, RefError, subject_token};
pub use schema_doc::{asyncapi, json_schema, schema_id, schema_urn};

/// Longest identifier field, in characters (the identifier rule's limit).
pub const MAX_IDENTIFIER_LEN: u32 = 128;
/// Longest event ID a contract may produce, in characters.
pub const MAX_EVENT_ID_LEN: usize = crate::ids::MAX_EVENT_ID_LEN;
/// The `task:deleted` contract's major: the one every consumer accepts by default.
pub const TASK_DELETED_MAJOR: u32 = 1;

/// A field's type, from the closed set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldType {
    /// An identifier: 1 to `max_length` characters from `A-Z a-z 0-9 . _ : @ -`.
    Identifier {
        /// At most [`MAX_IDENTIFIER_LEN`].
        max_length: u32,
    },
    /// An RFC 3339 time with an offset, not before 2000-01-01.
    Timestamp,
    /// A 64-bit integer, optionally bounded.
    Integer {
        /// The least accepted value.
        minimum: Option<i64>,
        /// The greatest accepted value.
        maximum: Option<i64>,
    },
    /// `true` or `false`.
    Boolean,
    /// One of the listed values (identifiers).
    Enum {
        /// The accepted values, in the contract's order.
        values: Vec<String>,
    },
    /// An object of fields.
    Object {
        /// Its fields.
        fields: Fields,
    },
}

impl FieldType {
    /// The type's name in contract files.
    pub fn name(&self) -> &'static str {
        match self {
            FieldType::Identifier { .. } => "identifier",
            FieldType::Timestamp => "timestamp",
            FieldType::Integer { .. } => "integer",
            FieldType::Boolean => "boolean",
            FieldType::Enum { .. } => "enum",
            FieldType::Object { .. } => "object",
        }
    }
}

/// One field of a contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldSpec {
    /// Its type.
    pub field_type: FieldType,
    /// Whether every event must carry it (a JSON `null` counts as absent).
    pub required: bool,
}

/// Fields by name, in name order.
pub type Fields = BTreeMap<String, FieldSpec>;

/// A contract's status: `active` and `deprecated` accept writes; `retired` accepts none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContractStatus {
    /// Accepts writes and new minors.
    Active,
    /// Accepts writes; consumers should move to its successor.
    Deprecated,
    /// Accepts no writes; kept so that events already written stay described.
    Retired,
}

impl ContractStatus {
    /// As stored.
    pub fn as_str(&self) -> &'static str {
        match self {
            ContractStatus::Active => "active",
            ContractStatus::Deprecated => "deprecated",
            ContractStatus::Retired => "retired",
        }
    }

    /// Parses the stored form.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "active" => Some(ContractStatus::Active),
            "deprecated" => Some(ContractStatus::Deprecated),
            "retired" => Some(ContractStatus::Retired),
            _ => None,
        }
    }
}

impl std::fmt::Display for ContractStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event type at one major version, at its current minor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contract {
    /// `noun:verb`.
    pub event_type: EventTypeName,
    /// Incompatible versions are majors, registered side by side.
    pub major: u32,
    /// Compatible versions (optional fields added) within the major.
    pub minor: u32,
    /// What the event means, for people (1 to 500 characters, no control characters).
    pub description: String,
    /// The top-level fields whose values, with the type and the subject, make the event ID.
    pub identity: Vec<String>,
    /// The payload's fields.
    pub fields: Fields,
}

impl Contract {
    /// `task:archived@1`.
    pub fn reference(&self) -> ContractRef {
        ContractRef {
            event_type: self.event_type.clone(),
            major: self.major,
        }
    }

    /// The fields in the stored form `write_event` reads: every field with its `type` and
    /// `required`, and its type's attributes.
    pub fn fields_json(&self) -> serde_json::Value {
        fields_json(&self.fields)
    }
}

fn fields_json(fields: &Fields) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (name, spec) in fields {
        let mut field = serde_json::Map::new();
        field.insert("type".into(), spec.field_type.name().into());
        field.insert("required".into(), spec.required.into());
        match &spec.field_type {
            FieldType::Identifier { max_length } => {
                field.insert("max_length".into(), (*max_length).into());
            }
            FieldType::Integer { minimum, maximum } => {
                if let Some(minimum) = minimum {
                    field.insert("minimum".into(), (*minimum).into());
                }
                if let Some(maximum) = maximum {
                    field.insert("maximum".into(), (*maximum).into());
                }
            }
            FieldType::Enum { values } => {
                field.insert("values".into(), values.clone().into());
            }
            FieldType::Object { fields } => {
                field.insert("fields".into(), fields_json(fields));
            }
            FieldType::Timestamp | FieldType::Boolean => {}
        }
        out.insert(name.clone(), field.into());
    }
    out.into()
}
