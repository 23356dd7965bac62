//! The JSON lines that describe an event and a reconciliation: what `outbox consume` prints,
//! what an SSE client receives as `data:` and what the relay publishes. One definition, so the
//! three never drift apart.

use outbox_consumer::{LiveSet, ObservedEvent};
use serde_json::json;

/// The line describing an event.
pub fn event_line(event: &ObservedEvent) -> String {
    let mut value = serde_json::to_value(event).expect("events serialize");
    value["type"] = json!("event");
    value.to_string()
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
