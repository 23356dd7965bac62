//! The JSON lines that describe an event and a reconciliation: what `outbox consume` prints,
//! what an SSE client receives as `data:` and what the relay publishes. One definition, so the
//! three never drift apart.

use outbox_consumer::{LiveSet, ObservedEvent};
use outbox_core::Prior;
use serde::Serialize;
use serde_json::json;

/// The line describing an event: the event's fields and `"type": "event"`, every object's
/// keys in byte order (the payload's too), with no spaces.
pub fn event_line(event: &ObservedEvent) -> String {
    // The payload as stored (jsonb's text: shortest keys first, spaced) in the line's form.
    let payload: serde_json::Value =
        serde_json::from_str(event.payload.as_str()).expect("payloads are JSON");
    let line = EventLine {
        attempt: event.attempt,
        consumer_id: event.consumer_id.as_str(),
        deleted_at: event.deleted_at.map(outbox_core::event::format_timestamp),
        event_id: &event.event_id,
        event_type: &event.event_type,
        observed: event.observed,
        occurred_at: outbox_core::event::format_timestamp(event.occurred_at),
        payload,
        payload_version: event.payload_version,
        prior: &event.prior,
        project_id: event.project_id.as_str(),
        replay: event.replay,
        sequence: event.sequence,
        task_id: &event.task_id,
        traceparent: event.traceparent.as_deref(),
        kind: "event",
        type_major: event.type_major,
        type_minor: event.type_minor,
        writer_process_id: &event.writer_process_id,
    };
    // Sized for a line at once: grown from serde_json's default, it would be copied three times.
    let mut text = Vec::with_capacity(640 + event.payload.as_str().len());
    serde_json::to_writer(&mut text, &line).expect("event lines serialize");
    String::from_utf8(text).expect("serde_json writes UTF-8")
}

/// An event line's fields, declared in byte order of their names: the order a JSON object
/// of them prints in.
#[derive(Serialize)]
struct EventLine<'a> {
    attempt: u32,
    consumer_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted_at: Option<String>,
    event_id: &'a str,
    event_type: &'a str,
    observed: bool,
    occurred_at: String,
    payload: serde_json::Value,
    payload_version: i32,
    prior: &'a Prior,
    project_id: &'a str,
    replay: bool,
    sequence: i64,
    task_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'static str,
    type_major: i32,
    type_minor: i32,
    writer_process_id: &'a str,
}

/// The line describing a reconciliation.
pub fn reconcile_line(live: &LiveSet, consumer: &str) -> String {
    json!({
        "type": "reconcile",
        "project_id": live.project_id,
        "consumer_id": consumer,
        "reason": live.reason,
        "head_sequence": live.head_sequence,
        "live_task_ids": live.task_ids,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use outbox_consumer::event::EventPayload;
    use outbox_core::{ConsumerId, ProjectId};

    /// The line as a tree of JSON values prints it: every object's keys sorted. The line is
    /// written without the tree, and must be the same bytes.
    fn through_a_tree(event: &ObservedEvent) -> String {
        let mut value = serde_json::to_value(event).unwrap();
        value["type"] = json!("event");
        value.to_string()
    }

    fn event(deleted: bool, traceparent: bool, payload: &str, prior: Prior) -> ObservedEvent {
        let at = Utc.with_ymd_and_hms(2026, 3, 4, 5, 6, 7).unwrap()
            + chrono::Duration::microseconds(123_456);
        ObservedEvent {
            observed: true,
            event_type: if deleted {
                "task:deleted"
            } else {
                "task:archived"
            }
            .into(),
            type_major: 1,
            type_minor: 2,
            project_id: ProjectId::new("p-1").unwrap(),
            consumer_id: ConsumerId::new("c_1").unwrap(),
            sequence: 9_007_199_254_740_993,
            event_id: "task-deleted:t\"1\u{e9}:2026-03-04T05:06:07.123456Z".into(),
            task_id: "t\"1\u{e9}\n".into(),
            deleted_at: deleted.then_some(at),
            writer_process_id: "w/1".into(),
            occurred_at: at,
            payload_version: 1,
            prior,
            payload: EventPayload::from_json(payload.into()).unwrap(),
            traceparent: traceparent
                .then(|| "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            replay: !traceparent,
            attempt: 3,
        }
    }

    #[test]
    fn an_event_line_is_the_bytes_a_sorted_json_tree_prints() {
        let payloads = [
            "{}",
            r#"{"prior": {"status": "open", "column": "todo"}, "deleted_at": "2026-03-04T05:06:07.123456Z"}"#,
            r#"{"z": [3, {"b": 1, "a": null}], "a": "\u00e9\"", "m": 1.5e3, "n": -0}"#,
        ];
        let priors = [
            Prior::default(),
            Prior {
                column: Some("to\"do".into()),
                status: None,
            },
            Prior {
                column: Some("todo".into()),
                status: Some("open".into()),
            },
        ];
        for payload in payloads {
            for prior in &priors {
                for (deleted, traceparent) in [(true, true), (true, false), (false, false)] {
                    let event = event(deleted, traceparent, payload, prior.clone());
                    assert_eq!(event_line(&event), through_a_tree(&event), "{payload}");
                }
            }
        }
    }
}
