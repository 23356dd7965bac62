//! The PgQ peer of the catch-up benchmark (`bench/peers.sh`): one consumer drains a PgQ queue
//! with PgQ's batch API, the way a simple PgQ consumer does, on one connection:
//!
//! 1. `SELECT pgq.next_batch(queue, consumer)` (its own transaction; NULL: no batch yet);
//! 2. `SELECT ... FROM pgq.get_batch_events(batch)`, every row read and its `ev_data` decoded
//!    into the same `Prior` our runtime decodes from its payload (the handler is a no-op, as in
//!    our catch-up);
//! 3. `SELECT pgq.finish_batch(batch)` (its own transaction: the acknowledgement).
//!
//! Statements are prepared once. The run ends when `--expect` events were read; the report is
//! one JSON line on stdout.

use std::time::{Duration, Instant};

use outbox_core::Prior;
use serde::Serialize;

use crate::{BoxResult, db};

/// Arguments of `outbox-bench pgq-drain`.
#[derive(Debug, Clone, clap::Args)]
pub struct DrainArgs {
    /// URL of the database holding the queue.
    #[arg(long)]
    pub database_url: String,
    /// The queue.
    #[arg(long)]
    pub queue: String,
    /// A consumer registered on the queue before the backlog was written.
    #[arg(long)]
    pub consumer: String,
    /// Events to read before the run ends.
    #[arg(long)]
    pub expect: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout_seconds: u64,
}

/// What `pgq-drain` prints.
#[derive(Debug, Serialize)]
struct DrainReport {
    seconds: f64,
    events: u64,
    batches: u64,
    empty_polls: u64,
    rate: f64,
}

/// Drains `expect` events, prints the report.
pub async fn drain(args: DrainArgs) -> BoxResult<()> {
    let mut config = db::parse(&args.database_url)?;
    config.application_name(format!("pgq-drain:{}", args.consumer));
    let client = db::connect(&config).await?;
    let next = client.prepare("SELECT pgq.next_batch($1, $2)").await?;
    let events = client
        .prepare(
            "SELECT ev_id, ev_time, ev_txid, ev_retry, ev_type, ev_data,
                    ev_extra1, ev_extra2, ev_extra3, ev_extra4
             FROM pgq.get_batch_events($1)",
        )
        .await?;
    let finish = client.prepare("SELECT pgq.finish_batch($1)").await?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let started = Instant::now();
    let (mut read, mut batches, mut empty_polls) = (0_u64, 0_u64, 0_u64);
    while read < args.expect {
        if Instant::now() > deadline {
            return Err(format!(
                "pgq-drain: {read} of {} events after the timeout",
                args.expect
            )
            .into());
        }
        let batch: Option<i64> = client
            .query_one(&next, &[&args.queue, &args.consumer])
            .await?
            .get(0);
        let Some(batch) = batch else {
            empty_polls += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        for row in client.query(&events, &[&batch]).await? {
            let _id: i64 = row.get(0);
            let _time: chrono::DateTime<chrono::Utc> = row.get(1);
            let _txid: i64 = row.get(2);
            let _retry: Option<i32> = row.get(3);
            let _type: Option<String> = row.get(4);
            let data: Option<String> = row.get(5);
            let _extra: [Option<String>; 4] = [row.get(6), row.get(7), row.get(8), row.get(9)];
            let _prior: Prior = serde_json::from_str(data.as_deref().unwrap_or("{}"))?;
            read += 1;
        }
        client.query_one(&finish, &[&batch]).await?;
        batches += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    let report = DrainReport {
        seconds,
        events: read,
        batches,
        empty_polls,
        rate: read as f64 / seconds,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
