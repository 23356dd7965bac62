//! The probe writers: concurrent transactions through the SQL writer, some committed at once,
//! some with several events, some rolled back, and some held open while the others commit
//! (committed late, after later writes were numbered: the case that makes a naive cursor skip
//! an event for good).

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use outbox_core::internal::Unnamed;
use outbox_core::{ProjectId, Schema};

use super::checks::{Ending, ProbeTx};
use super::sql;
use crate::failure::Failure;

/// The writer ID every probe event carries (how the probe project's events are told apart).
pub const PROBE_WRITER: &str = "outbox-verify";

/// What the writers do.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The probe project.
    pub project: ProjectId,
    /// This run's tag, part of every task ID (`verify-RUN-TX-N`).
    pub run: String,
    /// Transactions in all.
    pub transactions: usize,
    /// Concurrent writers.
    pub writers: usize,
    /// How long a late transaction stays open after its writes.
    pub late_commit: Duration,
}

/// The kind of the `index`-th transaction: the four kinds interleave, and shift from writer to
/// writer so that every writer runs each kind.
fn kind(index: usize, writers: usize) -> (Ending, usize) {
    let writers = writers.max(1);
    match (index / writers + index % writers) % 4 {
        0 => (Ending::Committed, 1),
        1 => (Ending::Committed, 3),
        2 => (Ending::RolledBack, 2),
        _ => (Ending::CommittedLate, 1),
    }
}

/// Runs the plan's writers to completion; returns every transaction as its writer saw it.
/// Dropping the future (the probe stopped early) stops the writers: an open transaction is
/// rolled back, none is begun.
pub async fn write(pool: &Pool, schema: &Schema, plan: &Plan) -> Result<Vec<ProbeTx>, Failure> {
    let statement = schema.render(sql::WRITE_PROBE);
    let tasks: Vec<_> = (0..plan.writers)
        .map(|writer| {
            let (pool, statement, plan) = (pool.clone(), statement.clone(), plan.clone());
            tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
                let mut done = Vec::new();
                for index in (writer..plan.transactions).step_by(plan.writers) {
                    done.push(one_transaction(&pool, &statement, &plan, index).await?);
                }
                Ok::<_, Failure>(done)
            }))
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        let written = task
            .await
            .map_err(|e| Failure::runtime(format!("a probe writer failed: {e}")))??;
        all.extend(written);
    }
    Ok(all)
}

/// One probe transaction.
async fn one_transaction(
    pool: &Pool,
    statement: &str,
    plan: &Plan,
    index: usize,
) -> Result<ProbeTx, Failure> {
    let (ending, events) = kind(index, plan.writers);
    let mut client = pool
        .get()
        .await
        .map_err(|e| Failure::runtime(format!("probe writer: no connection: {e}")))?;
    let begun = Instant::now();
    let tx = client.transaction().await?;
    let mut event_ids = Vec::with_capacity(events);
    for n in 0..events {
        let task = format!("verify-{}-{index}-{n}", plan.run);
        let row = tx
            .query_one_unnamed(
                statement,
                &[
                    &plan.project.as_str(),
                    &task,
                    &chrono::Utc::now(),
                    &PROBE_WRITER,
                ],
            )
            .await?;
        event_ids.push(row.get::<_, String>("event_id"));
    }
    let committed = match ending {
        Ending::RolledBack => {
            tx.rollback().await?;
            None
        }
        Ending::Committed => {
            tx.commit().await?;
            Some(Instant::now())
        }
        Ending::CommittedLate => {
            tokio::time::sleep(plan.late_commit).await;
            tx.commit().await?;
            Some(Instant::now())
        }
    };
    Ok(ProbeTx {
        event_ids,
        ending,
        begun,
        committed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_writer_runs_every_kind() {
        for writers in 1..=6 {
            for writer in 0..writers {
                let kinds: std::collections::BTreeSet<_> = (writer..writers * 8)
                    .step_by(writers)
                    .map(|i| format!("{:?}{}", kind(i, writers).0, kind(i, writers).1))
                    .collect();
                assert_eq!(kinds.len(), 4, "writer {writer} of {writers}: {kinds:?}");
            }
        }
    }
}
