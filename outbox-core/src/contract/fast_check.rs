//! A contract compiled into one SQL/JSON path predicate, stored with it in the registry, that
//! `write_event` evaluates (in C, without a PL/pgSQL call per field) before anything else: when
//! it holds, the payload is valid and the field-by-field check is skipped; when it does not,
//! that check runs and names the field. It is conservative, never lenient: it may turn away a
//! valid payload (a timestamp on the 29th to 31st of a month, or in the year 2000, whose
//! calendar and offset only the full check settles), which the full check then accepts.

use super::{Contract, FieldType, Fields};

/// An RFC 3339 time the full check would accept, restricted to what a pattern can settle
/// alone: a year from 2001 (so no offset can take it before 2000) and a day up to 28 (so every
/// month has it).
const FAST_TIMESTAMP: &str = "^(200[1-9]|20[1-9][0-9]|2[1-9][0-9][0-9]|[3-9][0-9][0-9][0-9])-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]([.][0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$";

impl Contract {
    /// The predicate over a payload (`$`), as `jsonpath` text.
    pub fn fast_check(&self) -> String {
        object("$", &self.fields)
    }
}

fn object(at: &str, fields: &Fields) -> String {
    let mut terms = vec![format!("{at}.type() == \"object\"")];
    if fields.is_empty() {
        terms.push(format!("!exists({at}.keyvalue())"));
    } else {
        let known: Vec<String> = fields
            .keys()
            .map(|name| format!("@.key == \"{name}\""))
            .collect();
        terms.push(format!(
            "!exists({at}.keyvalue() ? (!({})))",
            known.join(" || ")
        ));
    }
    for (name, spec) in fields {
        let path = format!("{at}.\"{name}\"");
        let valid = value(&path, &spec.field_type);
        terms.push(if spec.required {
            format!("(exists({path}) && {valid})")
        } else {
            format!("(!exists({path}) || {path}.type() == \"null\" || {valid})")
        });
    }
    format!("({})", terms.join(" && "))
}

fn value(path: &str, field_type: &FieldType) -> String {
    match field_type {
        FieldType::Identifier { max_length } => format!(
            "({path}.type() == \"string\" && {path} like_regex \"^[A-Za-z0-9._:@-]{{1,{max_length}}}$\")"
        ),
        FieldType::Timestamp => {
            format!("({path}.type() == \"string\" && {path} like_regex \"{FAST_TIMESTAMP}\")")
        }
        FieldType::Integer { minimum, maximum } => format!(
            "({path}.type() == \"number\" && {path} == {path}.floor() && {path} >= {} && {path} <= {})",
            minimum.unwrap_or(i64::MIN),
            maximum.unwrap_or(i64::MAX)
        ),
        FieldType::Boolean => format!("{path}.type() == \"boolean\""),
        FieldType::Enum { values } => {
            let any: Vec<String> = values
                .iter()
                .map(|v| format!("{path} == \"{v}\""))
                .collect();
            format!("({path}.type() == \"string\" && ({}))", any.join(" || "))
        }
        FieldType::Object { fields } => object(path, fields),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migration_stores_the_predicate_of_task_deleted_1() {
        let contract = Contract::from_json(
            r#"{"type": "task:deleted", "major": 1, "minor": 0, "description": "d",
                "identity": ["deleted_at"],
                "fields": {"deleted_at": {"type": "timestamp", "required": true},
                           "prior": {"type": "object", "fields": {
                               "column": {"type": "identifier", "max_length": 64},
                               "status": {"type": "identifier", "max_length": 64}}}}}"#,
        )
        .unwrap();
        let migration = include_str!("../../../sql/0016_event_contracts.sql");
        assert!(
            migration.contains(&contract.fast_check()),
            "sql/0016 must store task:deleted@1's predicate as generated:\n{}",
            contract.fast_check()
        );
    }
}
