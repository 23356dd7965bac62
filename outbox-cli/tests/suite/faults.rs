//! Fault tests with real processes: kill -9 of a consumer, two processes with one consumer
//! ID, a paused stale holder, and a PostgreSQL restart mid-stream.

use std::collections::BTreeSet;
use std::time::Duration;

use outbox_tests::consumer_kit::{
    PROCESS_WAIT as WAIT, Writers, cursor, eventually, sessions_ended, write_event,
};
use outbox_tests::process_kit::ConsumeProcess;
use outbox_tests::{TestDb, fresh_db};
use rand::Rng;

/// Fast settings for a test consumer process.
fn args(consumer: &str) -> Vec<String> {
    [
        "--project",
        "p",
        "--consumer-id",
        consumer,
        "--start-from",
        "earliest",
        "--lease-ttl",
        "1s",
        "--heartbeat-interval",
        "250ms",
        "--poll-interval",
        "100ms",
        "--sequence-interval",
        "10ms",
        "--sequencer-lease-ttl",
        "1s",
        "--shutdown-grace",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn spawn(db: &TestDb, args: &[String]) -> ConsumeProcess {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    ConsumeProcess::spawn(&db.url, &refs)
}

fn assert_strictly_increasing(sequences: &[i64], run: usize) {
    assert!(
        sequences.windows(2).all(|w| w[0] < w[1]),
        "run {run} delivered out of order: {sequences:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_at_random_moments_never_loses_or_skips_an_event() {
    let db = fresh_db().await;
    let writers = Writers::start(&db, 3, &["p"], 5..25);
    let args = args("k");
    // (sequences delivered, cursor after the process died)
    let mut runs: Vec<(Vec<i64>, Vec<String>, Option<i64>)> = Vec::new();
    for _ in 0..5 {
        let mut process = spawn(&db, &args);
        let alive = rand::rng().random_range(700..1800);
        tokio::time::sleep(Duration::from_millis(alive)).await;
        process.signal("KILL");
        process.wait().await;
        sessions_ended(&db).await;
        let after = cursor(&db, "p", "k").await;
        runs.push((process.sequences(), process.event_ids(), after));
    }
    let committed: BTreeSet<String> = writers.stop().await.into_iter().map(|(_, id)| id).collect();

    let mut last = spawn(&db, &args);
    let head = committed.len() as i64;
    eventually(WAIT, "the final run to catch up", || async {
        cursor(&db, "p", "k").await == Some(head)
    })
    .await;
    last.signal("TERM");
    assert_eq!(
        last.wait().await,
        0,
        "graceful stop exits 0: {}",
        last.stderr()
    );
    runs.push((last.sequences(), last.event_ids(), Some(head)));

    let mut delivered = BTreeSet::new();
    let mut previous_cursor: Option<i64> = None;
    for (index, (sequences, ids, after)) in runs.iter().enumerate() {
        assert_strictly_increasing(sequences, index);
        if let (Some(first), Some(before)) = (sequences.first(), previous_cursor) {
            assert_eq!(
                *first,
                before + 1,
                "run {index} must resume right after the durable cursor"
            );
        }
        // Anything delivered again later must lie after this run's durable cursor.
        for (later_sequences, _, _) in &runs[index + 1..] {
            for sequence in later_sequences {
                if sequences.contains(sequence) {
                    assert!(
                        Some(*sequence) > *after,
                        "sequence {sequence} was acknowledged by run {index} yet delivered again"
                    );
                }
            }
        }
        delivered.extend(ids.iter().cloned());
        previous_cursor = *after;
    }
    let missing: Vec<_> = committed.difference(&delivered).collect();
    assert!(
        missing.is_empty(),
        "committed but never delivered: {missing:?}"
    );
    assert!(
        runs.iter().filter(|r| !r.0.is_empty()).count() >= 3,
        "several killed runs delivered something"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_with_one_id_never_dispatch_together() {
    let db = fresh_db().await;
    let args = args("dup");
    let mut holder = spawn(&db, &args);
    for i in 0..5 {
        write_event(&db, "p", &format!("a{i}")).await;
    }
    eventually(WAIT, "the holder's deliveries", || async {
        holder.sequences().len() == 5
    })
    .await;
    let mut waiting = spawn(&db, &args);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 0..3 {
        write_event(&db, "p", &format!("b{i}")).await;
    }
    eventually(WAIT, "the holder's later deliveries", || async {
        holder.sequences().len() == 8
    })
    .await;
    assert!(waiting.lines().is_empty(), "the second process waits");
    // Killed once idle: the successor's first event is then known to follow the cursor.
    eventually(WAIT, "the holder's acknowledgements", || async {
        cursor(&db, "p", "dup").await == Some(8)
    })
    .await;

    holder.signal("KILL");
    holder.wait().await;
    let killed_at = tokio::time::Instant::now();
    let durable = cursor(&db, "p", "dup").await.unwrap();
    for i in 0..3 {
        write_event(&db, "p", &format!("c{i}")).await;
    }
    eventually(WAIT, "the takeover", || async {
        waiting.sequences().last() == Some(&11)
    })
    .await;
    assert!(waiting.lines().iter().all(|l| l.at >= killed_at));
    assert_eq!(waiting.sequences()[0], durable + 1);
    let generation: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT lease_generation FROM outbox.lifecycle_consumer_cursors",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(generation, 2, "the successor holds a higher generation");
    waiting.signal("TERM");
    assert_eq!(waiting.wait().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_holder_whose_lease_expired_is_fenced_off() {
    let db = fresh_db().await;
    let args = args("paused");
    let mut stale = spawn(&db, &args);
    for i in 0..3 {
        write_event(&db, "p", &format!("a{i}")).await;
    }
    eventually(WAIT, "the first deliveries", || async {
        stale.sequences().len() == 3
    })
    .await;
    eventually(WAIT, "the acknowledgement", || async {
        cursor(&db, "p", "paused").await == Some(3)
    })
    .await;
    stale.signal("STOP");
    tokio::time::sleep(Duration::from_millis(1600)).await;

    let mut successor = spawn(&db, &args);
    for i in 0..2 {
        write_event(&db, "p", &format!("b{i}")).await;
    }
    eventually(WAIT, "the successor's deliveries", || async {
        successor.sequences() == vec![4, 5]
    })
    .await;
    stale.signal("CONT");
    let code = tokio::time::timeout(WAIT, stale.wait()).await.unwrap();
    assert_eq!(code, 1, "the stale holder stops: {}", stale.stderr());
    assert!(stale.stderr().contains("lost"), "{}", stale.stderr());
    assert_eq!(
        stale.sequences(),
        vec![1, 2, 3],
        "nothing dispatched after the pause"
    );
    write_event(&db, "p", "c0").await;
    eventually(WAIT, "the successor continues", || async {
        successor.sequences() == vec![4, 5, 6]
    })
    .await;
    successor.signal("TERM");
    assert_eq!(successor.wait().await, 0);
}
