//! Commit to JetStream consumer: a writer's `COMMIT` returning, to a downstream JetStream pull
//! consumer receiving the relayed message.
//!
//! Writers and the JetStream consumer run in this process and read one monotonic clock; the
//! relay is the real `outbox relay nats` process in between (LISTEN wake-ups, sequencer every
//! 10 ms, the defaults). Writers commit one event per transaction with the Rust `Writer` on
//! an open-loop schedule (event k due at `t0 + k / rate`), so a stall shows up as latency
//! instead of lowering the rate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use chrono::Utc;
use futures_util::StreamExt;
use outbox_core::{Prior, ProjectId, Schema, TaskDeleted, TaskId, Writer, WriterProcessId};

use crate::{BoxResult, Percentiles, RelayProcess, Settings, Target, db, percentiles, progress};

/// Writer tasks, each with its own connection, sharing one schedule.
const WRITERS: usize = 8;

/// What the latency run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Target rate.
    pub rate: u32,
    /// Seconds of writing.
    pub seconds: f64,
    /// Commit-to-consumer latencies.
    pub latency: Percentiles,
    /// Achieved commit rate.
    pub achieved_rate: f64,
    /// Committed events never received.
    pub missing: usize,
    /// Messages received twice.
    pub duplicates: usize,
    /// Messages whose Outbox-Sequence did not follow the previous one.
    pub out_of_order: usize,
}

/// Runs the scenario against `url` (a fresh database) and `target`.
pub async fn run(
    settings: &Settings,
    target: &Target,
    url: &str,
    rate: u32,
    seconds: f64,
) -> BoxResult<Outcome> {
    let (project, consumer_id, stream, prefix) = ("lat", "relay-lat", "BENCH_LATENCY", "latency");
    let mut relay = RelayProcess::spawn(
        settings,
        target,
        url,
        &[
            "--project",
            project,
            "--consumer-id",
            consumer_id,
            "--stream",
            stream,
            "--subject-prefix",
            prefix,
            "--start-from",
            "earliest",
            "--no-prune",
        ],
    )?;
    let client = crate::connect(&target.urls).await?;
    let js = async_nats::jetstream::new(client);
    let started = Instant::now();
    let stream_handle = loop {
        if let Ok(s) = js.get_stream(stream).await {
            break s;
        }
        relay.check_alive()?;
        if started.elapsed() > Duration::from_secs(30) {
            return Err("the relay did not create its stream within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let consumer = stream_handle
        .create_consumer(pull::Config {
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::None,
            filter_subject: format!("{prefix}.{project}.task_deleted"),
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let received: Arc<Mutex<Vec<(String, i64, Instant)>>> = Arc::default();
    let reader = tokio::spawn({
        let received = received.clone();
        async move {
            while let Some(Ok(message)) = messages.next().await {
                let at = Instant::now();
                let headers = message.headers.as_ref();
                let msg_id = headers
                    .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default();
                let sequence = headers
                    .and_then(|h| h.get("Outbox-Sequence"))
                    .and_then(|v| v.as_str().parse().ok())
                    .unwrap_or(-1);
                received.lock().expect("lock").push((msg_id, sequence, at));
            }
        }
    });

    // Wait for the relay to hold its lease before the clock starts.
    let config = db::parse(url)?;
    let probe = db::connect(&config).await?;
    while probe
        .query_opt(
            "SELECT 1 FROM outbox.lifecycle_consumer_cursors
             WHERE project_id = $1 AND consumer_id = $2 AND lease_owner IS NOT NULL",
            &[&project, &consumer_id],
        )
        .await?
        .is_none()
    {
        relay.check_alive()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let total = (f64::from(rate) * seconds).round() as usize;
    let mut clients = Vec::with_capacity(WRITERS);
    for _ in 0..WRITERS {
        clients.push(db::connect(&config).await?);
    }
    progress!("latency: writing {total} events at {rate}/s");
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let t0 = Instant::now() + Duration::from_millis(100);
    let mut writers = Vec::with_capacity(WRITERS);
    for (w, client) in clients.into_iter().enumerate() {
        let writer = Writer::new(
            &Schema::default(),
            WriterProcessId::new(format!("bench-w{w}"))?,
        );
        let project = ProjectId::new(project)?;
        writers.push(tokio::spawn(async move {
            let mut client = client;
            let mut commits = Vec::new();
            let mut k = w;
            while k < total {
                tokio::time::sleep_until((t0 + interval * k as u32).into()).await;
                let tx = client.transaction().await?;
                let event = TaskDeleted::new(
                    project.clone(),
                    TaskId::new(format!("t{k}"))?,
                    Utc::now(),
                    Prior::default(),
                )?;
                writer.record(&tx, &event).await?;
                tx.commit().await?;
                commits.push((event.event_id(), Instant::now()));
                k += WRITERS;
            }
            BoxResult::Ok(commits)
        }));
    }
    let mut commits: HashMap<String, Instant> = HashMap::with_capacity(total);
    for writer in writers {
        commits.extend(writer.await??);
    }
    let (first, last) = commits
        .values()
        .fold((None::<Instant>, None::<Instant>), |(f, l), at| {
            (
                Some(f.map_or(*at, |f| f.min(*at))),
                Some(l.map_or(*at, |l| l.max(*at))),
            )
        });
    let deadline = Instant::now() + Duration::from_secs(15);
    while received.lock().expect("lock").len() < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    reader.abort();
    relay.terminate().await?;
    let received = std::mem::take(&mut *received.lock().expect("lock"));
    js.delete_stream(stream).await?;

    let mut latencies = Vec::with_capacity(received.len());
    let mut seen = std::collections::HashSet::new();
    let (mut duplicates, mut out_of_order) = (0, 0);
    let mut previous = 0;
    for (msg_id, sequence, at) in &received {
        if !seen.insert(msg_id.clone()) {
            duplicates += 1;
        }
        if *sequence != previous + 1 {
            out_of_order += 1;
        }
        previous = *sequence;
        if let Some(committed) = commits.get(msg_id) {
            latencies.push(at.saturating_duration_since(*committed));
        }
    }
    let missing = commits.keys().filter(|id| !seen.contains(*id)).count();
    let span = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    Ok(Outcome {
        rate,
        seconds,
        latency: percentiles(&mut latencies).ok_or("no latency samples")?,
        achieved_rate: if span > 0.0 {
            (total - 1) as f64 / span
        } else {
            0.0
        },
        missing,
        duplicates,
        out_of_order,
    })
}
