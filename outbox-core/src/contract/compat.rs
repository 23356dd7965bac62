//! Compatibility within a major: a new minor may only add optional fields, so that every
//! event written under it is also a valid event of every earlier minor's readers, and every
//! earlier event stays valid under it.

use super::file::ContractFileError;
use super::{Contract, FieldType, Fields};

impl Contract {
    /// Checks that `next` may follow `self` as a new minor of the same major: a higher minor,
    /// the same identity, every field kept exactly as it was (objects may gain fields), and
    /// every added field optional. The refusal names the field and says what to do instead.
    pub fn check_successor(&self, next: &Contract) -> Result<(), ContractFileError> {
        let label = self.reference();
        if next.minor <= self.minor {
            return Err(ContractFileError(format!(
                "{label} is at minor {}: a new minor must be higher (an identical file is \
                 accepted as already registered)",
                self.minor
            )));
        }
        if next.identity != self.identity {
            return Err(ContractFileError(format!(
                "incompatible change to {label}: the identity changes from {:?} to {:?}; \
                 that is a new major, registered beside the old one",
                self.identity, next.identity
            )));
        }
        compare(&label.to_string(), "", &self.fields, &next.fields)
    }
}

fn compare(label: &str, prefix: &str, old: &Fields, new: &Fields) -> Result<(), ContractFileError> {
    let refuse = |path: &str, what: String| {
        Err(ContractFileError(format!(
            "incompatible change to {label}: field \"{path}\" {what}; a new minor may only add \
             optional fields, so this is a new major, registered beside the old one"
        )))
    };
    for (name, before) in old {
        let path = format!("{prefix}{name}");
        let Some(after) = new.get(name) else {
            return refuse(&path, "is removed".into());
        };
        if after.required != before.required {
            return refuse(
                &path,
                if after.required {
                    "becomes required".into()
                } else {
                    "becomes optional".into()
                },
            );
        }
        match (&before.field_type, &after.field_type) {
            (FieldType::Object { fields: a }, FieldType::Object { fields: b }) => {
                compare(label, &format!("{path}."), a, b)?;
            }
            (a, b) if a.name() != b.name() => {
                return refuse(
                    &path,
                    format!("is retyped from {} to {}", a.name(), b.name()),
                );
            }
            (a, b) if a != b => {
                return refuse(&path, format!("changes its {} rule", a.name()));
            }
            _ => {}
        }
    }
    for (name, after) in new {
        if !old.contains_key(name) && after.required {
            return refuse(&format!("{prefix}{name}"), "is added as required".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(minor: u32, fields: &str) -> Contract {
        Contract::from_json(&format!(
            r#"{{"type": "task:archived", "major": 1, "minor": {minor}, "description": "d",
                "identity": ["at"], "fields": {{"at": {{"type": "timestamp", "required": true}},
                {fields}}}}}"#
        ))
        .unwrap()
    }

    const BASE: &str = r#""column": {"type": "identifier", "max_length": 64},
        "prior": {"type": "object", "fields": {"status": {"type": "enum", "values": ["a"]}}}"#;

    fn refusal(next: &str) -> String {
        version(0, BASE)
            .check_successor(&version(1, next))
            .unwrap_err()
            .0
    }

    #[test]
    fn a_minor_may_add_optional_fields_at_any_depth() {
        let next = version(
            1,
            r#""column": {"type": "identifier", "max_length": 64}, "flag": {"type": "boolean"},
            "prior": {"type": "object", "fields": {"status": {"type": "enum", "values": ["a"]},
                      "rank": {"type": "integer"}}}"#,
        );
        version(0, BASE).check_successor(&next).unwrap();
    }

    #[test]
    fn removing_retyping_or_requiring_a_field_names_it() {
        let m = refusal(
            r#""prior": {"type": "object", "fields": {"status": {"type": "enum", "values": ["a"]}}}"#,
        );
        assert!(m.contains("field \"column\" is removed"), "{m}");
        let m = refusal(
            r#""column": {"type": "integer"}, "prior": {"type": "object", "fields": {"status": {"type": "enum", "values": ["a"]}}}"#,
        );
        assert!(
            m.contains("\"column\" is retyped from identifier to integer"),
            "{m}"
        );
        let m = refusal(
            r#""column": {"type": "identifier", "max_length": 64, "required": true}, "prior": {"type": "object", "fields": {"status": {"type": "enum", "values": ["a"]}}}"#,
        );
        assert!(m.contains("\"column\" becomes required"), "{m}");
        let m = refusal(
            r#""column": {"type": "identifier", "max_length": 64}, "prior": {"type": "object", "fields": {"status": {"type": "enum", "values": ["a", "b"]}}}"#,
        );
        assert!(m.contains("\"prior.status\" changes its enum rule"), "{m}");
        let m = refusal(
            r#""column": {"type": "identifier", "max_length": 64}, "new": {"type": "boolean", "required": true}, "prior": {"type": "object", "fields": {"status": {"type": "enum", "values": ["a"]}}}"#,
        );
        assert!(
            m.contains("\"new\" is added as required") && m.contains("new major"),
            "{m}"
        );
    }

    #[test]
    fn a_minor_must_be_higher() {
        let m = version(1, BASE)
            .check_successor(&version(1, BASE))
            .unwrap_err()
            .0;
        assert!(m.contains("must be higher"), "{m}");
    }
}
