//! Acknowledgements grouped across the consumers of a set: one statement advances the cursors
//! of every consumer that acknowledged meanwhile.
//!
//! Under load every consumer of a set acknowledges after each small batch, a thousand
//! statements for a thousand consumers woken at once. A consumer instead hands its
//! acknowledgement to the set's one acknowledging task and waits; the task sends whatever has
//! gathered as one fenced statement ([`sql::ACK_SET`]) and answers each consumer: done, or its
//! lease is gone. While a statement runs the next group gathers, so the group grows with the
//! load, like a group commit. An acknowledgement that also clears saved retry state takes the
//! consumer's own statement instead.
//!
//! The statement runs in a transaction of its own under key scans only ([`sql::KEY_SCANS_ONLY`]),
//! so the plan kept for it reads each consumer's current position from the high end of the
//! key whatever the table's size when it was made.
//!
//! The statement writes each row once, locking rows in plan order; the set's lease heartbeat,
//! its other many-row write, waits for it (and it for the heartbeat) on one lock, so the two
//! never deadlock.

use std::collections::HashSet;
use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use outbox_core::internal::Unnamed as _;
use tokio_postgres::types::ToSql;

use crate::error::ConsumerError;
use crate::lease::Fence;
use crate::runtime::GroupedAck;
use crate::sql;

/// Most acknowledgements in one statement.
const MAX_GROUP: usize = 1000;

/// One consumer's acknowledgement waiting for its group.
struct Request {
    /// The consumer's lease.
    fence: Fence,
    /// The new cursor.
    through: i64,
    /// Where the consumer left its cursor: the acknowledgement is conditional on it.
    left_at: i64,
    /// How it went.
    reply: oneshot::Sender<GroupedAck>,
}

/// The consumers' side: hands acknowledgements to the task.
pub(crate) struct GroupAcks {
    requests: mpsc::UnboundedSender<Request>,
}

/// The task's side, run by [`GroupAcks::run`].
pub(crate) struct AckQueue(mpsc::UnboundedReceiver<Request>);

impl GroupAcks {
    pub fn new() -> (Self, AckQueue) {
        let (requests, queue) = mpsc::unbounded_channel();
        (Self { requests }, AckQueue(queue))
    }

    /// Acknowledges through `through` for the lease `fence` in the next group, if the cursor
    /// is still at `left_at`; not grouped when the group's statement failed (or the set is
    /// stopping): the caller then acknowledges on its own, which reports the error properly.
    pub async fn ack(&self, fence: &Fence, left_at: i64, through: i64) -> GroupedAck {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            fence: fence.clone(),
            through,
            left_at,
            reply,
        };
        if self.requests.send(request).is_err() {
            return GroupedAck::NotGrouped;
        }
        answer.await.unwrap_or(GroupedAck::NotGrouped)
    }

    /// Sends the gathered acknowledgements, one statement per group, until `stop`.
    pub async fn run(
        mut queue: AckQueue,
        pool: Pool,
        statement: String,
        owner: String,
        cached: bool,
        row_writes: Arc<tokio::sync::Mutex<()>>,
        stop: CancellationToken,
    ) {
        loop {
            let first = tokio::select! {
                _ = stop.cancelled() => return,
                first = queue.0.recv() => match first {
                    Some(first) => first,
                    None => return,
                },
            };
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match queue.0.try_recv() {
                    Ok(request) => group.push(request),
                    Err(_) => break,
                }
            }
            let outcome = {
                // Never beside the set's heartbeat (see `Shared::row_writes`).
                let _writing = row_writes.lock().await;
                send(&pool, &statement, &owner, cached, &group).await
            };
            if let Err(e) = &outcome {
                tracing::debug!(error = %e, "grouped acknowledgement failed; each consumer acknowledges alone");
            }
            for request in group {
                let key = (
                    request.fence.project.to_string(),
                    request.fence.consumer.to_string(),
                );
                let answer = match &outcome {
                    Ok(acked) if acked.contains(&key) => GroupedAck::Acknowledged,
                    Ok(_) => GroupedAck::Refused,
                    Err(_) => GroupedAck::NotGrouped,
                };
                let _ = request.reply.send(answer);
            }
        }
    }
}

/// One group's statement; the (project, consumer) pairs it acknowledged.
async fn send(
    pool: &Pool,
    statement: &str,
    owner: &str,
    cached: bool,
    group: &[Request],
) -> Result<HashSet<(String, String)>, ConsumerError> {
    let projects: Vec<&str> = group.iter().map(|r| r.fence.project.as_str()).collect();
    let consumers: Vec<&str> = group.iter().map(|r| r.fence.consumer.as_str()).collect();
    let generations: Vec<i64> = group.iter().map(|r| r.fence.generation).collect();
    let through: Vec<i64> = group.iter().map(|r| r.through).collect();
    let left_at: Vec<i64> = group.iter().map(|r| r.left_at).collect();
    let params: [&(dyn ToSql + Sync); 6] = [
        &projects,
        &consumers,
        &generations,
        &through,
        &owner,
        &left_at,
    ];
    let mut client = pool.get().await?;
    // One transaction, so the statement is planned (and its plan kept) under key scans only.
    let tx = client.transaction().await?;
    tx.batch_execute(sql::KEY_SCANS_ONLY).await?;
    // Prepared once per pooled connection where that is safe: under load this runs hundreds
    // of times a second.
    let rows = if cached {
        let prepared = tx.prepare_cached(statement).await?;
        tx.query(&prepared, &params).await?
    } else {
        tx.query_unnamed(statement, &params).await?
    };
    tx.commit().await?;
    rows.iter()
        .map(|row| Ok((row.try_get("project_id")?, row.try_get("consumer_id")?)))
        .collect()
}
