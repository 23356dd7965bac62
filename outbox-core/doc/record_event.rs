use chrono::{DateTime, Utc};
use outbox_core::{
    Event, Payload, ProjectId, Schema, TaskId, WriteOutcome, Writer, WriterProcessId,
};

/// Archives task `task` of project `p1` through `client`: the archival and its `task:archived`
/// event (major 1, registered with `outbox contracts add contracts/task-archived.json`) commit
/// together, or neither does; `traceparent` is the caller's W3C trace context, carried to
/// every process that observes the event.
pub async fn archive(
    client: &mut tokio_postgres::Client,
    task: &str,
    archived_at: DateTime<Utc>,
    traceparent: &str,
) -> Result<WriteOutcome, Box<dyn std::error::Error + Send + Sync>> {
    let writer = Writer::new(&Schema::default(), WriterProcessId::new("api-1")?);
    // Values are checked as they are added, with the SQL writer's messages.
    let event = Event::new(
        ProjectId::new("p1")?,
        "task:archived@1".parse()?,
        TaskId::new(task)?,
        Payload::new().timestamp("archived_at", archived_at).object(
            "prior",
            Payload::new()
                .identifier("column", "done")
                .identifier("status", "closed"),
        ),
    )?
    .with_traceparent(traceparent)?;
    let tx = client.transaction().await?;
    // ... the service's own archival, in `tx` ...
    // The contract is checked in the same round trip that records the event.
    let outcome = writer.record_event(&tx, &event).await?; // Recorded or AlreadyRecorded
    tx.commit().await?;
    Ok(outcome)
}
