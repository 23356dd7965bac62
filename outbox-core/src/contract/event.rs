//! An event of any registered type, as a writer builds it: the project, the type and major,
//! the subject (the task it is about), a typed payload and an optional trace context.
//!
//! Values are checked as they are added, with the messages `write_event` raises (an identifier
//! against the identifier rule, a timestamp against the 2000-01-01 floor); what only the
//! registry knows (which fields the contract names, which are required, an enum's values, an
//! identifier's own limit) is checked by `write_event` in the same round trip that records the
//! event, inside the writer's transaction.

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use super::ContractRef;
use crate::event::{MIN_DELETED_AT, ValidationError, format_timestamp};
use crate::ids::{IdError, MAX_ID_LEN, ProjectId, TaskId, validate_identifier};

/// A payload under construction: fields by name, each of a contract type.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Payload {
    fields: Map<String, Value>,
    /// The first value refused, reported when the event is built.
    refused: Option<(String, String)>,
}

impl Payload {
    /// An empty payload.
    pub fn new() -> Self {
        Self::default()
    }

    fn refuse(&mut self, name: &str, why: String) {
        if self.refused.is_none() {
            self.refused = Some((name.to_owned(), why));
        }
    }

    /// An identifier field (`A-Z a-z 0-9 . _ : @ -`, at most 128 characters; the contract
    /// may allow fewer).
    pub fn identifier(mut self, name: &str, value: &str) -> Self {
        match validate_identifier(name, value, MAX_ID_LEN) {
            Ok(()) => {
                self.fields.insert(name.into(), value.into());
            }
            Err(error) => self.refuse(name, identifier_problem(&error)),
        }
        self
    }

    /// A timestamp field, written as RFC 3339 UTC with microseconds.
    pub fn timestamp(mut self, name: &str, at: DateTime<Utc>) -> Self {
        if at < MIN_DELETED_AT {
            self.refuse(
                name,
                format!("{} is before 2000-01-01T00:00:00Z", format_timestamp(at)),
            );
        } else {
            self.fields.insert(name.into(), format_timestamp(at).into());
        }
        self
    }

    /// An integer field.
    pub fn integer(mut self, name: &str, value: i64) -> Self {
        self.fields.insert(name.into(), value.into());
        self
    }

    /// A boolean field.
    pub fn boolean(mut self, name: &str, value: bool) -> Self {
        self.fields.insert(name.into(), value.into());
        self
    }

    /// An enum field: one of the values the contract lists.
    pub fn enumeration(self, name: &str, value: &str) -> Self {
        self.identifier(name, value)
    }

    /// An object field.
    pub fn object(mut self, name: &str, object: Payload) -> Self {
        if let Some((inner, why)) = object.refused {
            self.refuse(&format!("{name}.{inner}"), why);
        } else {
            self.fields
                .insert(name.into(), Value::Object(object.fields));
        }
        self
    }

    /// The payload as JSON.
    pub fn to_json(&self) -> Value {
        Value::Object(self.fields.clone())
    }
}

/// What `validate_identifier` says about a value, without its own "invalid <field>:" prefix.
fn identifier_problem(error: &IdError) -> String {
    let text = error.to_string();
    match text.split_once(": ") {
        Some((_, problem)) => problem.to_owned(),
        None => text,
    }
}

/// Checks a W3C `traceparent` header (version 00) with the messages of the SQL writer.
pub fn validate_traceparent(traceparent: &str) -> Result<(), ValidationError> {
    let refuse = |why: String| Err(ValidationError::Traceparent(why));
    let len = traceparent.chars().count();
    if len != 55 {
        return refuse(format!("{len} characters, a version 00 header has 55"));
    }
    let hex = |part: &str| part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let parts: Vec<&str> = traceparent.split('-').collect();
    match parts.as_slice() {
        ["00", trace, parent, flags]
            if trace.len() == 32
                && parent.len() == 16
                && flags.len() == 2
                && hex(trace)
                && hex(parent)
                && hex(flags) =>
        {
            if trace.bytes().all(|b| b == b'0') || parent.bytes().all(|b| b == b'0') {
                return refuse("an all-zero trace ID or parent ID is not allowed".into());
            }
            Ok(())
        }
        _ => refuse(
            "expected 00-<32 hex trace ID>-<16 hex parent ID>-<2 hex flags>, lower case".into(),
        ),
    }
}

/// An event of a registered type, ready for [`Writer::record_event`](crate::Writer::record_event).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    project_id: ProjectId,
    contract: ContractRef,
    subject_id: TaskId,
    payload: Value,
    traceparent: Option<String>,
}

impl Event {
    /// An event of `contract` about `subject_id` in `project_id`. Refused when a payload value
    /// was refused, naming the field as `write_event` does.
    pub fn new(
        project_id: ProjectId,
        contract: ContractRef,
        subject_id: TaskId,
        payload: Payload,
    ) -> Result<Self, ValidationError> {
        if let Some((field, why)) = payload.refused {
            return Err(ValidationError::Payload(format!(
                "invalid payload for {contract}: field \"{field}\": {why}"
            )));
        }
        Ok(Self {
            project_id,
            contract,
            subject_id,
            payload: Value::Object(payload.fields),
            traceparent: None,
        })
    }

    /// Carries the writer's W3C trace context (version 00) to every observer of the event.
    pub fn with_traceparent(mut self, traceparent: &str) -> Result<Self, ValidationError> {
        validate_traceparent(traceparent)?;
        self.traceparent = Some(traceparent.to_owned());
        Ok(self)
    }

    /// The project.
    pub fn project_id(&self) -> &ProjectId {
        &self.project_id
    }

    /// The type and major.
    pub fn contract(&self) -> &ContractRef {
        &self.contract
    }

    /// The task the event is about.
    pub fn subject_id(&self) -> &TaskId {
        &self.subject_id
    }

    /// The payload.
    pub fn payload(&self) -> &Value {
        &self.payload
    }

    /// The trace context, if any.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn event(payload: Payload) -> Result<Event, ValidationError> {
        Event::new(
            ProjectId::new("p").unwrap(),
            "task:archived@1".parse().unwrap(),
            TaskId::new("t").unwrap(),
            payload,
        )
    }

    #[test]
    fn a_refused_value_names_its_field_as_the_sql_writer_does() {
        let error =
            event(Payload::new().object("prior", Payload::new().identifier("column", "a b")))
                .unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid payload for task:archived@1: field \"prior.column\": character \" \" at \
             position 2 is not allowed (allowed: A-Z a-z 0-9 . _ : @ -)"
        );
        let old = Utc.with_ymd_and_hms(1999, 1, 1, 0, 0, 0).unwrap();
        let error = event(Payload::new().timestamp("archived_at", old)).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("field \"archived_at\": 1999-01-01"),
            "{error}"
        );
    }

    #[test]
    fn payloads_serialise_timestamps_in_the_id_format() {
        let at = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        let e = event(
            Payload::new()
                .timestamp("archived_at", at)
                .boolean("pinned", true),
        )
        .unwrap();
        assert_eq!(
            e.payload(),
            &serde_json::json!({"archived_at": "2026-01-02T03:04:05.000000Z", "pinned": true})
        );
    }

    #[test]
    fn traceparents_are_w3c_version_00() {
        validate_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
        for (bad, why) in [
            ("00-xyz", "6 characters"),
            (
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "expected 00-",
            ),
            (
                "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
                "lower case",
            ),
            (
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                "all-zero",
            ),
        ] {
            let error = validate_traceparent(bad).unwrap_err().to_string();
            assert!(error.contains(why), "{bad}: {error}");
            assert!(error.starts_with("invalid traceparent: "), "{error}");
        }
    }
}
