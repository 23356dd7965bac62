//! Contract files: the JSON an operator registers with `outbox contracts add FILE`, and the
//! stored form read back from the registry. Both go through one parser, so a contract that
//! reads back is one that would have been accepted.
//!
//! ```json
//! {
//!   "type": "task:archived", "major": 1, "minor": 0,
//!   "description": "A task moved to the archive, with its state before the move.",
//!   "identity": ["archived_at"],
//!   "fields": {
//!     "archived_at": {"type": "timestamp", "required": true},
//!     "prior": {"type": "object", "fields": {
//!       "column": {"type": "identifier", "max_length": 64}}}
//!   }
//! }
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Contract, EventTypeName, FieldSpec, FieldType, Fields, MAX_IDENTIFIER_LEN};
use crate::ids::validate_identifier;

/// Deepest nesting of objects in a payload.
const MAX_DEPTH: usize = 4;
/// Most fields of one object.
const MAX_FIELDS: usize = 64;
/// Most identity fields.
const MAX_IDENTITY: usize = 8;
/// Most values of an enum.
const MAX_ENUM_VALUES: usize = 256;
/// Longest enum value.
const MAX_ENUM_VALUE_LEN: usize = 64;
/// The event ID's fixed parts: `noun-verb` (65), `.v9999` (6), the subject (128) and the
/// separators are counted; an identity field adds its longest canonical text.
const TIMESTAMP_ID_LEN: usize = 27;
/// Longest canonical integer (`-9223372036854775808`).
const INTEGER_ID_LEN: usize = 20;

/// A contract file (or stored contract) was refused; the message names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ContractFileError(pub String);

fn refuse(message: impl Into<String>) -> ContractFileError {
    ContractFileError(message.into())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawContract {
    #[serde(rename = "type")]
    event_type: String,
    major: u32,
    minor: u32,
    description: String,
    #[serde(default)]
    identity: Vec<String>,
    fields: BTreeMap<String, RawField>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawField {
    #[serde(rename = "type")]
    field_type: String,
    #[serde(default)]
    required: bool,
    max_length: Option<u32>,
    minimum: Option<i64>,
    maximum: Option<i64>,
    values: Option<Vec<String>>,
    fields: Option<BTreeMap<String, RawField>>,
}

impl Contract {
    /// Parses and checks a contract file.
    pub fn from_json(text: &str) -> Result<Self, ContractFileError> {
        let raw: RawContract = serde_json::from_str(text)
            .map_err(|error| refuse(format!("malformed contract file: {error}")))?;
        let event_type = EventTypeName::new(&raw.event_type).map_err(|e| refuse(e.0))?;
        if !(1..=9999).contains(&raw.major) {
            return Err(refuse(format!(
                "invalid major {}: use 1 to 9999",
                raw.major
            )));
        }
        if raw.minor > 9999 {
            return Err(refuse(format!(
                "invalid minor {}: use 0 to 9999",
                raw.minor
            )));
        }
        let description_len = raw.description.chars().count();
        if !(1..=500).contains(&description_len) || raw.description.chars().any(char::is_control) {
            return Err(refuse(
                "invalid description: use 1 to 500 characters without control characters",
            ));
        }
        let fields = parse_fields(raw.fields, "", 1)?;
        let contract = Self {
            event_type,
            major: raw.major,
            minor: raw.minor,
            description: raw.description,
            identity: raw.identity,
            fields,
        };
        contract.check_identity()?;
        Ok(contract)
    }

    /// The contract back from its stored columns.
    pub fn from_stored(
        event_type: &str,
        major: i32,
        minor: i32,
        description: &str,
        identity: Vec<String>,
        fields: &serde_json::Value,
    ) -> Result<Self, ContractFileError> {
        let file = serde_json::json!({
            "type": event_type,
            "major": major,
            "minor": minor,
            "description": description,
            "identity": identity,
            "fields": fields,
        });
        Self::from_json(&file.to_string())
    }

    /// The contract as a file, in the form [`Contract::from_json`] reads.
    pub fn to_file_json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": self.event_type,
            "major": self.major,
            "minor": self.minor,
            "description": self.description,
            "identity": self.identity,
            "fields": self.fields_json(),
        })
    }

    fn check_identity(&self) -> Result<(), ContractFileError> {
        if self.identity.len() > MAX_IDENTITY {
            return Err(refuse(format!(
                "invalid identity: at most {MAX_IDENTITY} fields"
            )));
        }
        // noun-verb, `.vN`, the subject and one separator per part.
        let mut longest = self.event_type.as_str().len() + 6 + 1 + crate::ids::MAX_ID_LEN;
        for (index, name) in self.identity.iter().enumerate() {
            if self.identity[..index].contains(name) {
                return Err(refuse(format!(
                    "invalid identity: field \"{name}\" is named twice"
                )));
            }
            let Some(spec) = self.fields.get(name) else {
                return Err(refuse(format!(
                    "invalid identity: field \"{name}\" is not a top-level field of the contract"
                )));
            };
            if !spec.required {
                return Err(refuse(format!(
                    "invalid identity: field \"{name}\" must be required (every event needs \
                     its identity)"
                )));
            }
            longest += 1 + match &spec.field_type {
                FieldType::Identifier { max_length } => *max_length as usize,
                FieldType::Timestamp => TIMESTAMP_ID_LEN,
                FieldType::Integer { .. } => INTEGER_ID_LEN,
                FieldType::Enum { values } => values.iter().map(String::len).max().unwrap_or(0),
                other => {
                    return Err(refuse(format!(
                        "invalid identity: field \"{name}\" is {} {}; identity fields are \
                         identifiers, timestamps, integers or enums",
                        article(other.name()),
                        other.name()
                    )));
                }
            };
        }
        if longest > super::MAX_EVENT_ID_LEN {
            return Err(refuse(format!(
                "invalid identity: event IDs could reach {longest} characters, over the limit \
                 of {}; lower the max_length of its identifier fields",
                super::MAX_EVENT_ID_LEN
            )));
        }
        Ok(())
    }
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

fn parse_fields(
    raw: BTreeMap<String, RawField>,
    prefix: &str,
    depth: usize,
) -> Result<Fields, ContractFileError> {
    if depth > MAX_DEPTH {
        return Err(refuse(format!(
            "invalid field \"{}\": objects nest at most {MAX_DEPTH} deep",
            prefix.trim_end_matches('.')
        )));
    }
    if raw.len() > MAX_FIELDS {
        return Err(refuse(format!(
            "too many fields in {}: at most {MAX_FIELDS}",
            if prefix.is_empty() {
                "the payload".to_owned()
            } else {
                format!("\"{}\"", prefix.trim_end_matches('.'))
            }
        )));
    }
    let mut fields = Fields::new();
    for (name, field) in raw {
        let path = format!("{prefix}{name}");
        let mut chars = name.chars();
        let valid_name = matches!(chars.next(), Some('a'..='z'))
            && name.len() <= 64
            && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'));
        if !valid_name {
            return Err(refuse(format!(
                "invalid field name \"{path}\": use a lower-case letter followed by up to 63 \
                 lower-case letters, digits or _"
            )));
        }
        let spec = parse_field(field, &path, depth)?;
        fields.insert(name, spec);
    }
    Ok(fields)
}

fn parse_field(raw: RawField, path: &str, depth: usize) -> Result<FieldSpec, ContractFileError> {
    let RawField {
        field_type,
        required,
        max_length,
        minimum,
        maximum,
        values,
        fields,
    } = raw;
    let unexpected = |attribute: &str| {
        refuse(format!(
            "invalid field \"{path}\": {attribute} does not apply to {} {field_type}",
            article(&field_type)
        ))
    };
    let field_type = match field_type.as_str() {
        "identifier" => FieldType::Identifier {
            max_length: match max_length {
                None => MAX_IDENTIFIER_LEN,
                Some(n @ 1..=MAX_IDENTIFIER_LEN) => n,
                Some(n) => {
                    return Err(refuse(format!(
                        "invalid field \"{path}\": max_length {n} is outside 1 to \
                         {MAX_IDENTIFIER_LEN}"
                    )));
                }
            },
        },
        "timestamp" => FieldType::Timestamp,
        "integer" => {
            if let (Some(low), Some(high)) = (minimum, maximum)
                && low > high
            {
                return Err(refuse(format!(
                    "invalid field \"{path}\": minimum {low} is above maximum {high}"
                )));
            }
            FieldType::Integer { minimum, maximum }
        }
        "boolean" => FieldType::Boolean,
        "enum" => {
            let values = values.ok_or_else(|| {
                refuse(format!(
                    "invalid field \"{path}\": an enum lists its values (\"values\": [...])"
                ))
            })?;
            if values.is_empty() || values.len() > MAX_ENUM_VALUES {
                return Err(refuse(format!(
                    "invalid field \"{path}\": an enum has 1 to {MAX_ENUM_VALUES} values"
                )));
            }
            for (index, value) in values.iter().enumerate() {
                validate_identifier(
                    &format!("value of field \"{path}\""),
                    value,
                    MAX_ENUM_VALUE_LEN,
                )
                .map_err(|e| refuse(e.to_string()))?;
                if values[..index].contains(value) {
                    return Err(refuse(format!(
                        "invalid field \"{path}\": value \"{value}\" is listed twice"
                    )));
                }
            }
            return finish(
                FieldType::Enum { values },
                required,
                [
                    max_length.map(|_| "max_length"),
                    minimum.map(|_| "minimum"),
                    maximum.map(|_| "maximum"),
                    fields.as_ref().map(|_| "fields"),
                ],
                unexpected,
            );
        }
        "object" => {
            let fields = fields.ok_or_else(|| {
                refuse(format!(
                    "invalid field \"{path}\": an object lists its fields (\"fields\": {{...}})"
                ))
            })?;
            let fields = parse_fields(fields, &format!("{path}."), depth + 1)?;
            return finish(
                FieldType::Object { fields },
                required,
                [
                    max_length.map(|_| "max_length"),
                    minimum.map(|_| "minimum"),
                    maximum.map(|_| "maximum"),
                    values.as_ref().map(|_| "values"),
                ],
                unexpected,
            );
        }
        other => {
            return Err(refuse(format!(
                "invalid field \"{path}\": type {} is not one of identifier, timestamp, \
                 integer, boolean, enum, object (there is no free-text type: payloads never \
                 carry prose, credentials or free text)",
                serde_json::Value::String(other.into())
            )));
        }
    };
    let misplaced = match &field_type {
        FieldType::Identifier { .. } => [
            None,
            minimum.map(|_| "minimum"),
            maximum.map(|_| "maximum"),
            values.as_ref().map(|_| "values"),
        ],
        FieldType::Integer { .. } => [
            max_length.map(|_| "max_length"),
            None,
            values.as_ref().map(|_| "values"),
            None,
        ],
        _ => [
            max_length.map(|_| "max_length"),
            minimum.map(|_| "minimum"),
            maximum.map(|_| "maximum"),
            values.as_ref().map(|_| "values"),
        ],
    };
    if fields.is_some() {
        return Err(unexpected("fields"));
    }
    finish(field_type, required, misplaced, unexpected)
}

fn finish(
    field_type: FieldType,
    required: bool,
    misplaced: [Option<&str>; 4],
    unexpected: impl Fn(&str) -> ContractFileError,
) -> Result<FieldSpec, ContractFileError> {
    if let Some(attribute) = misplaced.into_iter().flatten().next() {
        return Err(unexpected(attribute));
    }
    Ok(FieldSpec {
        field_type,
        required,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract(fields: &str, identity: &str) -> Result<Contract, ContractFileError> {
        Contract::from_json(&format!(
            r#"{{"type": "task:archived", "major": 1, "minor": 0, "description": "d",
                "identity": {identity}, "fields": {fields}}}"#
        ))
    }

    fn refusal(fields: &str, identity: &str) -> String {
        contract(fields, identity).unwrap_err().0
    }

    #[test]
    fn a_contract_file_reads_back_from_its_stored_form() {
        let c = contract(
            r#"{"archived_at": {"type": "timestamp", "required": true},
                "count": {"type": "integer", "minimum": 0},
                "kind": {"type": "enum", "values": ["a", "b"]},
                "prior": {"type": "object", "fields": {"column": {"type": "identifier", "max_length": 64}}}}"#,
            r#"["archived_at"]"#,
        )
        .unwrap();
        let again = Contract::from_json(&c.to_file_json().to_string()).unwrap();
        assert_eq!(again, c);
        assert!(!c.fields["prior"].required);
    }

    #[test]
    fn free_text_and_unknown_types_are_refused() {
        let m = refusal(r#"{"note": {"type": "text"}}"#, "[]");
        assert!(
            m.contains("\"note\"") && m.contains("no free-text type"),
            "{m}"
        );
        let m = refusal(r#"{"note": {"type": "string"}}"#, "[]");
        assert!(m.contains("is not one of"), "{m}");
    }

    #[test]
    fn malformed_files_and_misplaced_attributes_are_refused() {
        assert!(
            Contract::from_json("{")
                .unwrap_err()
                .0
                .starts_with("malformed")
        );
        let m = refusal(r#"{"a": {"type": "boolean", "max_length": 3}}"#, "[]");
        assert!(m.contains("max_length does not apply to a boolean"), "{m}");
        let m = refusal(r#"{"a": {"type": "enum"}}"#, "[]");
        assert!(m.contains("lists its values"), "{m}");
        let m = refusal(r#"{"A": {"type": "boolean"}}"#, "[]");
        assert!(m.contains("invalid field name \"A\""), "{m}");
        let m = refusal(
            r#"{"a": {"type": "integer", "minimum": 3, "maximum": 1}}"#,
            "[]",
        );
        assert!(m.contains("above maximum"), "{m}");
        let m = refusal(r#"{"a": {"type": "boolean", "colour": 1}}"#, "[]");
        assert!(m.contains("unknown field `colour`"), "{m}");
    }

    #[test]
    fn identity_fields_are_required_top_level_scalars_within_the_id_limit() {
        let m = refusal(r#"{"a": {"type": "timestamp"}}"#, r#"["a"]"#);
        assert!(m.contains("must be required"), "{m}");
        let m = refusal(
            r#"{"a": {"type": "boolean", "required": true}}"#,
            r#"["a"]"#,
        );
        assert!(m.contains("a boolean"), "{m}");
        let m = refusal(
            r#"{"a": {"type": "timestamp", "required": true}}"#,
            r#"["b"]"#,
        );
        assert!(m.contains("not a top-level field"), "{m}");
        let m = refusal(
            r#"{"a": {"type": "identifier", "required": true}}"#,
            r#"["a"]"#,
        );
        assert!(m.contains("over the limit of 256"), "{m}");
        contract(
            r#"{"a": {"type": "identifier", "required": true, "max_length": 64}}"#,
            r#"["a"]"#,
        )
        .unwrap();
    }
}
