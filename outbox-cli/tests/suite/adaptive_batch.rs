//! The adaptive read batch of a lone consumer: a backlog is read in batches that double from
//! the batch size up to the maximum, a consumer that caught up reads the batch size again, and
//! a consumer killed with SIGKILL in the middle of a large catch-up repeats at most one read
//! batch (at most the maximum) when it restarts.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outbox_consumer::{Handler, HandlerFailure, ObservedEvent};
use outbox_core::Schema;
use outbox_core::sequencer::Sequencer;
use outbox_tests::consumer_kit::{
    PROCESS_WAIT, Recorder, cursor, eventually, fast_config, sessions_ended, start_with,
};
use outbox_tests::process_kit::{ConsumeProcess, outbox_on, run_outbox};
use outbox_tests::{TestDb, fresh_db};

const WAIT: Duration = Duration::from_secs(120);

/// Writes `count` events of project `p` in one transaction and numbers them in one drain, so
/// that a consumer reads them all or none.
async fn write_numbered(db: &TestDb, tag: &str, count: i32) {
    let mut client = db.connect().await;
    client
        .execute(
            "SELECT outbox.write_task_deleted('p', $1 || '-' || g, now(), 'w') \
             FROM generate_series(1, $2::int) AS g",
            &[&tag, &count],
        )
        .await
        .unwrap();
    Sequencer::new(&Schema::default())
        .drain(&mut client)
        .await
        .unwrap();
}

/// A handler that sees the batch boundaries: a plain dispatch calls `before_ack` once after
/// each batch it handled, before acknowledging it.
#[derive(Default)]
struct Boundaries {
    since_ack: AtomicUsize,
    batches: Mutex<Vec<usize>>,
}

impl Handler for Boundaries {
    async fn handle(&self, _: &ObservedEvent) -> Result<(), HandlerFailure> {
        self.since_ack.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn before_ack(&self) -> Result<(), HandlerFailure> {
        let handled = self.since_ack.swap(0, Ordering::SeqCst);
        if handled > 0 {
            self.batches.lock().unwrap().push(handled);
        }
        Ok(())
    }
}

impl Boundaries {
    fn batches(&self) -> Vec<usize> {
        self.batches.lock().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_is_read_in_doubling_batches_and_a_caught_up_consumer_reads_the_base_size() {
    let db = fresh_db().await;
    // Numbered before the consumer starts (and no sequencer in it): every read of the
    // catch-up sees the whole backlog.
    write_numbered(&db, "a", 700).await;
    let handler = std::sync::Arc::new(Boundaries::default());
    let mut config = fast_config("p", "c");
    config.delivery.batch_size = 10;
    config.delivery.max_batch_size = 80;
    config.duties.sequence_interval = None;
    config.duties.prune_interval = None;
    let (stop, run) = start_with(&db, config, handler.clone(), Recorder::default());
    eventually(WAIT, "the backlog acknowledged", || async {
        cursor(&db, "p", "c").await == Some(700)
    })
    .await;
    // 10, 20, 40, then reads of 80 until one comes back short. (A read over a connection
    // opened since the position was checked is set aside for the check, and the read after
    // it asks for what the next one would have: a step of the doubling may be skipped.)
    let batches = handler.batches();
    assert_eq!(batches.iter().sum::<usize>(), 700, "{batches:?}");
    assert_eq!(
        batches[0], 10,
        "the first read is the batch size: {batches:?}"
    );
    let (last, growing) = batches.split_last().unwrap();
    assert!(
        growing
            .windows(2)
            .all(|w| w[1] == (w[0] * 2).min(80) || w[1] == (w[0] * 4).min(80)),
        "each full read is followed by a larger one, up to the maximum: {batches:?}"
    );
    assert!(*last <= 80, "{batches:?}");
    assert!(
        batches.iter().filter(|b| **b == 80).count() >= 6,
        "most of the backlog is read at the maximum: {batches:?}"
    );
    let caught_up = batches.len();

    // Caught up: 30 more, numbered at once, are read from the batch size again.
    write_numbered(&db, "b", 30).await;
    eventually(WAIT, "the new events acknowledged", || async {
        cursor(&db, "p", "c").await == Some(730)
    })
    .await;
    let batches = handler.batches();
    assert_eq!(
        batches[caught_up..],
        [10, 20],
        "back at the batch size once caught up: {batches:?}"
    );
    stop.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_maximum_equal_to_the_batch_size_reads_fixed_batches() {
    let db = fresh_db().await;
    write_numbered(&db, "a", 95).await;
    let handler = std::sync::Arc::new(Boundaries::default());
    let mut config = fast_config("p", "c");
    config.delivery.batch_size = 10;
    config.delivery.max_batch_size = 10;
    config.duties.sequence_interval = None;
    config.duties.prune_interval = None;
    let (stop, run) = start_with(&db, config, handler.clone(), Recorder::default());
    eventually(WAIT, "the backlog acknowledged", || async {
        cursor(&db, "p", "c").await == Some(95)
    })
    .await;
    let mut expected = vec![10; 9];
    expected.push(5);
    assert_eq!(handler.batches(), expected);
    stop.cancel();
    run.await.unwrap().unwrap();
}

/// `outbox consume` of project `p` from the earliest event, reads growing from 100 to `max`.
fn consume(db: &TestDb, max: i64) -> ConsumeProcess {
    let max = max.to_string();
    ConsumeProcess::spawn(
        &db.url,
        &[
            "--project",
            "p",
            "--consumer-id",
            "k",
            "--start-from",
            "earliest",
            "--batch-size",
            "100",
            "--max-batch-size",
            &max,
            "--lease-ttl",
            "1s",
            "--heartbeat-interval",
            "250ms",
            "--poll-interval",
            "100ms",
            "--no-sequencer",
            "--shutdown-grace",
            "1s",
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_kill_9_mid_catch_up_at_most_one_read_batch_is_repeated() {
    const MAX: i64 = 1600;
    const BACKLOG: i32 = 60_000;
    let db = fresh_db().await;
    write_numbered(&db, "a", BACKLOG).await;
    // The durable cursor before each run.
    let mut durable = 0;
    let mut repeats = Vec::new();
    for _ in 0..3 {
        let mut process = consume(&db, MAX);
        // Reads grow 100, 200, 400, 800, 1,600: by 4,000 printed events they are at the
        // maximum.
        eventually(PROCESS_WAIT, "the catch-up under way", || async {
            process.sequences().len() >= 4_000
        })
        .await;
        process.signal("KILL");
        process.wait().await;
        sessions_ended(&db).await;
        let printed = process.sequences();
        assert_eq!(
            printed,
            ((durable + 1)..=durable + printed.len() as i64).collect::<Vec<_>>(),
            "a run resumes right after the durable cursor, in order, without gaps"
        );
        let after = cursor(&db, "p", "k").await.unwrap();
        // What this run printed beyond its durable cursor is delivered again by the next.
        let repeated = printed.iter().filter(|s| **s > after).count() as i64;
        assert!(
            repeated <= MAX,
            "{repeated} events printed but not acknowledged: more than one read batch ({MAX})"
        );
        repeats.push(repeated);
        durable = after;
    }
    let mut last = consume(&db, MAX);
    eventually(PROCESS_WAIT, "the final run to catch up", || async {
        cursor(&db, "p", "k").await == Some(BACKLOG as i64)
    })
    .await;
    last.signal("TERM");
    assert_eq!(last.wait().await, 0, "graceful stop: {}", last.stderr());
    assert_eq!(
        last.sequences(),
        ((durable + 1)..=BACKLOG as i64).collect::<Vec<_>>(),
        "the last run resumes right after the durable cursor"
    );
    eprintln!("events repeated after each kill: {repeats:?}");
}

#[tokio::test]
async fn a_maximum_below_the_batch_size_is_refused_naming_both_flags() {
    let db = fresh_db().await;
    for command in ["consume", "serve"] {
        let mut args = vec![command, "--batch-size", "500", "--max-batch-size", "100"];
        args.extend(["--project", "p", "--consumer-id", "c"]);
        if command == "serve" {
            args.extend(["--listen", "127.0.0.1:0"]);
        }
        let (code, _, stderr) = outbox_on(&db, &args).await;
        assert_eq!(code, 2, "{command}: {stderr}");
        assert!(
            stderr.contains("--max-batch-size 100 is smaller than --batch-size 500"),
            "{command}: {stderr}"
        );
    }
    let registered: i64 = db
        .connect()
        .await
        .query_one("SELECT count(*) FROM outbox.lifecycle_consumers", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(registered, 0, "nothing registered");
    // Outside the documented range: refused by the parser, which names the range.
    let (code, _, stderr) = outbox_on(
        &db,
        &[
            "consume",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--max-batch-size",
            "10001",
        ],
    )
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("1..=10000"), "{stderr}");
    for command in ["consume", "serve", "relay nats"] {
        let mut args: Vec<&str> = command.split(' ').collect();
        args.push("--help");
        let (code, help, _) = run_outbox(&args).await;
        assert_eq!(code, 0, "{command}");
        let flattened = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flattened.contains("--max-batch-size <N>"), "{help}");
        assert!(
            flattened.contains("1..=10000 and at least --batch-size (default 4000"),
            "{help}"
        );
    }
}
