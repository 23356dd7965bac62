//! The `task:deleted` event: what a writer records and what an observer receives.

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{IdError, ProjectId, TaskId, validate_identifier};

/// The first event type of the stream, registered by the schema itself.
pub const TASK_DELETED: &str = "task:deleted";

/// Version of the payload layout written by this library.
pub const PAYLOAD_VERSION: i32 = 1;

/// Longest accepted `prior` value, in characters.
pub const MAX_PRIOR_VALUE_LEN: usize = 64;

/// How far ahead of the clock a `deleted_at` may lie before it is refused as a clock error.
pub const MAX_FUTURE_SKEW: TimeDelta = TimeDelta::minutes(5);

/// The earliest accepted `deleted_at`, 2000-01-01T00:00:00Z: an earlier time (year 1900, a BC
/// date, `-infinity`) is a default value or a bug in the writer, never a real deletion, and
/// PostgreSQL's writer refuses the same range.
pub const MIN_DELETED_AT: DateTime<Utc> = DateTime::from_timestamp_nanos(946_684_800_000_000_000);

/// Why an event was refused before anything was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// An identifier is malformed.
    #[error(transparent)]
    Id(#[from] IdError),
    /// `deleted_at` lies further in the future than [`MAX_FUTURE_SKEW`].
    #[error("invalid deleted_at: {} is more than 5 minutes in the future", format_timestamp(*.0))]
    DeletedAtInFuture(DateTime<Utc>),
    /// `deleted_at` lies before [`MIN_DELETED_AT`].
    #[error("invalid deleted_at: {} is before 2000-01-01T00:00:00Z", format_timestamp(*.0))]
    DeletedAtTooEarly(DateTime<Utc>),
    /// `prior` is not a JSON object.
    #[error("invalid prior: must be a JSON object")]
    PriorNotObject,
    /// `prior` has a key other than `column` or `status`.
    #[error("invalid prior: unknown key {} (known keys: column, status)", serde_json::Value::String(.0.clone()))]
    PriorUnknownKey(String),
    /// A `prior` value is not a string.
    #[error("invalid prior.{0}: must be a string")]
    PriorValueNotString(String),
    /// A payload value was refused (`invalid payload for task:archived@1: field "x": ...`).
    #[error("{0}")]
    Payload(String),
    /// A W3C trace context header was malformed.
    #[error("invalid traceparent: {0}")]
    Traceparent(String),
}

/// The task's state just before deletion: the minimum an observer needs to update its view.
/// Bounded identifiers only, never free text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prior {
    /// The board column the task was in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<String>,
    /// The task's status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

impl Prior {
    /// Validates a JSON value the way the SQL writer does. `null` means no prior state.
    pub fn from_json(value: &serde_json::Value) -> Result<Self, ValidationError> {
        let object = match value {
            serde_json::Value::Null => return Ok(Self::default()),
            serde_json::Value::Object(object) => object,
            _ => return Err(ValidationError::PriorNotObject),
        };
        let mut keys: Vec<&String> = object.keys().collect();
        keys.sort();
        let mut prior = Self::default();
        for key in keys {
            let slot = match key.as_str() {
                "column" => &mut prior.column,
                "status" => &mut prior.status,
                _ => return Err(ValidationError::PriorUnknownKey(key.clone())),
            };
            let text = object[key]
                .as_str()
                .ok_or_else(|| ValidationError::PriorValueNotString(key.clone()))?;
            validate_identifier(&format!("prior.{key}"), text, MAX_PRIOR_VALUE_LEN)?;
            *slot = Some(text.to_owned());
        }
        Ok(prior)
    }

    fn validate(&self) -> Result<(), ValidationError> {
        // Checked in key order, as the SQL writer does.
        if let Some(column) = &self.column {
            validate_identifier("prior.column", column, MAX_PRIOR_VALUE_LEN)?;
        }
        if let Some(status) = &self.status {
            validate_identifier("prior.status", status, MAX_PRIOR_VALUE_LEN)?;
        }
        Ok(())
    }

    /// The stored payload object.
    pub fn to_payload(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("Prior serializes to an object")
    }
}

/// A stored payload column as its JSON text, borrowed from the row (`json`, or `jsonb`
/// without its format-version byte), so a reader decodes it straight into [`Prior`] with
/// `serde_json::from_slice` instead of building a `serde_json::Value` first: one parse and
/// two strings per event where a tree of maps and strings cost several allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadText<'a>(pub &'a [u8]);

impl<'a> tokio_postgres::types::FromSql<'a> for PayloadText<'a> {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        if *ty != tokio_postgres::types::Type::JSONB {
            return Ok(Self(raw));
        }
        // jsonb's binary form is a version byte, then the text.
        match raw.split_first() {
            Some((1, text)) => Ok(Self(text)),
            Some((version, _)) => Err(format!("unsupported jsonb format version {version}").into()),
            None => Err("empty jsonb value".into()),
        }
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        matches!(
            *ty,
            tokio_postgres::types::Type::JSON | tokio_postgres::types::Type::JSONB
        )
    }
}

/// A validated `task:deleted` event, ready to be written in the deleting transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDeleted {
    project_id: ProjectId,
    task_id: TaskId,
    deleted_at: DateTime<Utc>,
    prior: Prior,
}

impl TaskDeleted {
    /// Validates an event against the current clock.
    ///
    /// `deleted_at` is truncated to microseconds, PostgreSQL's precision, so the event ID
    /// computed here is the one the database would compute.
    pub fn new(
        project_id: ProjectId,
        task_id: TaskId,
        deleted_at: DateTime<Utc>,
        prior: Prior,
    ) -> Result<Self, ValidationError> {
        Self::new_at(project_id, task_id, deleted_at, prior, Utc::now())
    }

    /// Like [`TaskDeleted::new`], against an explicit clock reading.
    pub fn new_at(
        project_id: ProjectId,
        task_id: TaskId,
        deleted_at: DateTime<Utc>,
        prior: Prior,
        now: DateTime<Utc>,
    ) -> Result<Self, ValidationError> {
        let deleted_at = deleted_at.trunc_subsecs(6);
        if deleted_at > now + MAX_FUTURE_SKEW {
            return Err(ValidationError::DeletedAtInFuture(deleted_at));
        }
        if deleted_at < MIN_DELETED_AT {
            return Err(ValidationError::DeletedAtTooEarly(deleted_at));
        }
        prior.validate()?;
        Ok(Self {
            project_id,
            task_id,
            deleted_at,
            prior,
        })
    }

    /// The project the event belongs to.
    pub fn project_id(&self) -> &ProjectId {
        &self.project_id
    }

    /// The deleted task.
    pub fn task_id(&self) -> &TaskId {
        &self.task_id
    }

    /// The deletion identity: a repeated delete with the same `deleted_at` is the same event.
    pub fn deleted_at(&self) -> DateTime<Utc> {
        self.deleted_at
    }

    /// The task's state before deletion.
    pub fn prior(&self) -> &Prior {
        &self.prior
    }

    /// `task-deleted:<task_id>:<deleted_at, RFC 3339 UTC with microseconds>`.
    pub fn event_id(&self) -> String {
        format!(
            "task-deleted:{}:{}",
            self.task_id,
            format_timestamp(self.deleted_at)
        )
    }
}

/// RFC 3339 in UTC with exactly six fractional digits, as used in event IDs.
pub fn format_timestamp(at: DateTime<Utc>) -> String {
    use chrono::{Datelike as _, Timelike as _};
    // Digits written in place: every event line and relayed message formats two timestamps,
    // and chrono's general formatter (or `format!`) costs several times as much. Years of four
    // digits only (chrono's own form of the others is kept).
    if !(0..=9999).contains(&at.year()) {
        return at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    }
    let mut text = *b"0000-00-00T00:00:00.000000Z";
    for (range, value) in [
        (0..4, at.year() as u32),
        (5..7, at.month()),
        (8..10, at.day()),
        (11..13, at.hour()),
        (14..16, at.minute()),
        (17..19, at.second()),
        (20..26, at.nanosecond() % 1_000_000_000 / 1_000),
    ] {
        let mut rest = value;
        for digit in text[range].iter_mut().rev() {
            *digit = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
    }
    String::from_utf8(text.to_vec()).expect("ASCII digits")
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn a_timestamp_formats_as_chrono_formats_it(micros in 0_i64..253_402_300_800_000_000) {
            let at = DateTime::from_timestamp_micros(micros).unwrap();
            proptest::prop_assert_eq!(
                format_timestamp(at),
                at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
            );
        }
    }

    #[test]
    fn a_timestamp_formats_with_six_fractional_digits_in_utc() {
        use chrono::TimeZone as _;
        let at = Utc.with_ymd_and_hms(2026, 3, 4, 5, 6, 7).unwrap();
        assert_eq!(format_timestamp(at), "2026-03-04T05:06:07.000000Z");
        let at = at + chrono::Duration::nanoseconds(123_456_789);
        assert_eq!(format_timestamp(at), "2026-03-04T05:06:07.123456Z");
        for at in [
            at,
            Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(12345, 1, 2, 3, 4, 5).unwrap(),
            Utc.with_ymd_and_hms(-5, 1, 2, 3, 4, 5).unwrap(),
        ] {
            assert_eq!(
                format_timestamp(at),
                at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
            );
        }
    }

    #[test]
    fn payload_text_is_the_json_without_jsonb_s_version_byte() {
        use tokio_postgres::types::{FromSql, Type};
        let text = br#"{"column": "todo"}"#;
        let mut jsonb = vec![1];
        jsonb.extend_from_slice(text);
        assert_eq!(PayloadText::from_sql(&Type::JSONB, &jsonb).unwrap().0, text);
        assert_eq!(PayloadText::from_sql(&Type::JSON, text).unwrap().0, text);
        jsonb[0] = 2;
        let refused = PayloadText::from_sql(&Type::JSONB, &jsonb).unwrap_err();
        assert!(refused.to_string().contains("version 2"), "{refused}");
        assert!(PayloadText::from_sql(&Type::JSONB, &[]).is_err());
        assert!(PayloadText::accepts(&Type::JSONB) && PayloadText::accepts(&Type::JSON));
        assert!(!PayloadText::accepts(&Type::TEXT));
        let prior: Prior = serde_json::from_slice(text).unwrap();
        assert_eq!(prior.column.as_deref(), Some("todo"));
    }
    use chrono::TimeZone;

    fn event(deleted_at: DateTime<Utc>, prior: Prior) -> Result<TaskDeleted, ValidationError> {
        TaskDeleted::new(
            ProjectId::new("p1").unwrap(),
            TaskId::new("FN-1").unwrap(),
            deleted_at,
            prior,
        )
    }

    #[test]
    fn event_id_has_microseconds_in_utc() {
        let at =
            Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap() + TimeDelta::nanoseconds(1_234_567);
        let e = event(at, Prior::default()).unwrap();
        assert_eq!(
            e.event_id(),
            "task-deleted:FN-1:2026-01-02T03:04:05.001234Z"
        );
        assert_eq!(e.deleted_at().timestamp_subsec_nanos(), 1_234_000);
    }

    #[test]
    fn refuses_far_future() {
        let now = Utc::now();
        assert!(event(now + TimeDelta::minutes(4), Prior::default()).is_ok());
        let err = event(now + TimeDelta::days(1), Prior::default()).unwrap_err();
        assert!(matches!(err, ValidationError::DeletedAtInFuture(_)));
        assert!(
            err.to_string()
                .ends_with("is more than 5 minutes in the future")
        );
    }

    #[test]
    fn refuses_times_before_2000() {
        assert_eq!(MIN_DELETED_AT.to_rfc3339(), "2000-01-01T00:00:00+00:00");
        assert!(event(MIN_DELETED_AT, Prior::default()).is_ok());
        let early = MIN_DELETED_AT - TimeDelta::microseconds(1);
        let err = event(early, Prior::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid deleted_at: 1999-12-31T23:59:59.999999Z is before 2000-01-01T00:00:00Z"
        );
        let err = event(DateTime::<Utc>::MIN_UTC, Prior::default()).unwrap_err();
        assert!(matches!(err, ValidationError::DeletedAtTooEarly(_)));
    }

    #[test]
    fn prior_must_be_small_object_of_known_keys() {
        use serde_json::json;
        assert_eq!(Prior::from_json(&json!(null)).unwrap(), Prior::default());
        let p = Prior::from_json(&json!({"column": "todo", "status": "open"})).unwrap();
        assert_eq!(p.to_payload(), json!({"column": "todo", "status": "open"}));
        assert_eq!(
            Prior::from_json(&json!([1])).unwrap_err().to_string(),
            "invalid prior: must be a JSON object"
        );
        assert_eq!(
            Prior::from_json(&json!({"note": "x"}))
                .unwrap_err()
                .to_string(),
            "invalid prior: unknown key \"note\" (known keys: column, status)"
        );
        assert_eq!(
            Prior::from_json(&json!({"status": 3}))
                .unwrap_err()
                .to_string(),
            "invalid prior.status: must be a string"
        );
        assert_eq!(
            Prior::from_json(&json!({"column": "a".repeat(65)}))
                .unwrap_err()
                .to_string(),
            "invalid prior.column: 65 characters exceeds the limit of 64"
        );
        let bad = Prior {
            column: Some("two words".into()),
            status: None,
        };
        assert!(event(Utc::now(), bad).is_err());
    }
}
