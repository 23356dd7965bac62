//! A transactional handler with lanes: each event handled above the cursor leaves a receipt in
//! the handler's own transaction, so its effect happens exactly once across kill -9 and
//! restarts; failures stay per event and per task; and `status` shows how far the lanes have
//! handled beyond the cursor.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_consumer::{
    FailureClass, Handler, HandlerFailure, ObservedEvent, RetrySchedule, TransactionalHandler,
};
use outbox_core::sequencer::Sequencer;
use outbox_tests::consumer_kit::{PROCESS_WAIT, Recorder, WAIT, cursor, eventually, fast_config};
use outbox_tests::process_kit::outbox_json;
use outbox_tests::{TestDb, fresh_db};
use tokio::sync::Notify;

use crate::lanes_tx_consumer;

/// Inserts `events` events of project `p`, event `g` for task `t-(g % tasks)`, and numbers them.
async fn seed(db: &TestDb, events: i64, tasks: i64) {
    let client = db.connect().await;
    client
        .execute(
            "INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, \
             deleted_at, writer_process_id, payload_version, payload) \
             SELECT 'p', 'task:deleted', 'e-' || g, 't-' || (g % $2::bigint), now(), 'w', 1, \
             '{}'::jsonb FROM generate_series(1, $1::bigint) AS g",
            &[&events, &tasks],
        )
        .await
        .unwrap();
    let mut client = db.connect().await;
    Sequencer::new(&outbox_core::Schema::default())
        .drain(&mut client)
        .await
        .unwrap();
}

/// The table the handlers write their effects to, one row per handling, in commit order of
/// each task (a task's events are handled one after another).
async fn effects_table(db: &TestDb) {
    db.connect()
        .await
        .batch_execute(
            "CREATE TABLE lane_effects (id bigserial PRIMARY KEY, sequence bigint NOT NULL, \
             task_id text NOT NULL)",
        )
        .await
        .unwrap();
}

/// Checks the effects: every sequence of `expected` exactly once, none other, and each task's
/// effects in sequence order.
async fn assert_effects(db: &TestDb, expected: &[i64]) {
    let rows = db
        .connect()
        .await
        .query(
            "SELECT sequence, task_id FROM lane_effects ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let mut times: BTreeMap<i64, usize> = BTreeMap::new();
    let mut last_of_task: BTreeMap<String, i64> = BTreeMap::new();
    for row in &rows {
        let (sequence, task): (i64, String) = (row.get(0), row.get(1));
        *times.entry(sequence).or_default() += 1;
        let before = last_of_task.insert(task.clone(), sequence).unwrap_or(0);
        assert!(
            before < sequence,
            "effect of {sequence} of {task} after {before}"
        );
    }
    let twice: Vec<(&i64, &usize)> = times.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(
        twice.is_empty(),
        "effects applied more than once: {twice:?}"
    );
    let applied: Vec<i64> = times.keys().copied().collect();
    assert_eq!(applied.len(), expected.len(), "effects of every event");
    assert_eq!(applied, expected);
}

/// How many receipts consumer `c` holds.
async fn receipts(db: &TestDb) -> i64 {
    db.connect()
        .await
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_lane_receipts WHERE consumer_id = 'c'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// A transactional handler in 16 lanes, killed -9 at random moments of a catch-up over 300
/// tasks, then run to the end: every event's effect exactly once, each task's in order, and
/// never more receipts than `max_ahead`, none left once the cursor passed them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_a_transactional_handler_in_lanes_applies_every_effect_exactly_once() {
    use rand::Rng;

    let db = fresh_db().await;
    effects_table(&db).await;
    let events: i64 = 6_000;
    seed(&db, events, 300).await;
    let max_ahead: i64 = 400;
    // The consumer's process: this test binary again, running the consumer's test alone.
    let binary = std::env::current_exe().expect("the test binary's path");
    let spawn = |last: bool| {
        let mut args = vec![db.url.clone(), "16".to_owned(), max_ahead.to_string()];
        if last {
            args.push("--exit-when-caught-up".to_owned());
        }
        let only = [
            lanes_tx_consumer::TEST,
            "--exact",
            "--ignored",
            "--nocapture",
        ];
        tokio::process::Command::new(&binary)
            .args(only)
            .env(lanes_tx_consumer::ARGS, args.join("\n"))
            .kill_on_drop(true)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("the consumer starts")
    };
    let count = |db: &TestDb| {
        let db = db.clone();
        async move {
            db.connect()
                .await
                .query_one("SELECT count(*) FROM lane_effects", &[])
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    let kills = 5;
    let most_receipts = AtomicI64::new(0);
    for _ in 0..kills {
        let before = count(&db).await;
        let mut run = spawn(false);
        // A random moment: after a random number of effects of this run.
        let more = rand::rng().random_range(1..1_000);
        eventually(PROCESS_WAIT, "effects of this run", || async {
            most_receipts.fetch_max(receipts(&db).await, Ordering::SeqCst);
            count(&db).await >= (before + more).min(events)
        })
        .await;
        run.start_kill().unwrap();
        run.wait().await.unwrap();
    }
    let mut last = spawn(true);
    let status = tokio::time::timeout(PROCESS_WAIT * 3, last.wait())
        .await
        .expect("the last run catches up")
        .unwrap();
    assert!(status.success(), "the last run exits 0: {status}");
    assert_eq!(cursor(&db, "p", "c").await, Some(events));
    let expected: Vec<i64> = (1..=events).collect();
    assert_effects(&db, &expected).await;
    let most_receipts = most_receipts.into_inner();
    assert!(
        most_receipts <= max_ahead,
        "{most_receipts} receipts with --max-ahead {max_ahead}"
    );
    assert_eq!(receipts(&db).await, 0, "the cursor passed every receipt");
}

/// Writes each event's effect in its transaction; event `poison` fails (its transaction
/// rolls back): with a retried class until `park` is set, then with one that parks it at once.
/// (A transactional handler must not wait inside its transaction: the session's idle limit
/// would end it.)
#[derive(Clone, Default)]
struct PoisonInTx {
    poison: i64,
    attempts: Arc<Mutex<Vec<u32>>>,
    park: Arc<AtomicBool>,
}

impl TransactionalHandler for PoisonInTx {
    async fn handle(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        event: &ObservedEvent,
    ) -> Result<(), HandlerFailure> {
        tx.execute(
            "INSERT INTO lane_effects (sequence, task_id) VALUES ($1, $2)",
            &[&event.sequence, &event.task_id],
        )
        .await
        .unwrap();
        if event.sequence == self.poison {
            self.attempts.lock().unwrap().push(event.attempt);
            let class = match self.park.load(Ordering::SeqCst) {
                true => FailureClass::contract_mismatch(),
                false => FailureClass::new("forced_failure").unwrap(),
            };
            return Err(HandlerFailure::new(class));
        }
        tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % 3)).await;
        Ok(())
    }
}

/// A poison event of a transactional handler in lanes: its task's later events wait, the
/// other tasks finish, the cursor stops right before it until it is parked, then moves on;
/// no effect of the failed attempts remains, every other effect once and in task order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_event_of_a_transactional_handler_in_lanes_holds_only_its_task() {
    let db = fresh_db().await;
    effects_table(&db).await;
    let (events, tasks) = (260_i64, 26_i64);
    seed(&db, events, tasks).await;
    let poison = 55;
    let task_a = |s: i64| s % tasks == poison % tasks;
    let handler = PoisonInTx {
        poison,
        ..PoisonInTx::default()
    };
    let mut config = fast_config("p", "c");
    config.delivery.lanes = 8;
    config.delivery.batch_size = 20;
    config.delivery.max_batch_size = 20;
    config.delivery.max_ahead = 500;
    config.delivery.retry = RetrySchedule::new(vec![Duration::from_millis(50)], 1000).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let consumer = outbox_consumer::Consumer::transactional(
        db.pool(12),
        Some(db.config.clone()),
        config,
        handler.clone(),
        Recorder::default(),
    );
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { consumer.run(stop).await }
    });

    let client = db.connect().await;
    eventually(
        WAIT,
        "the other tasks done, the cursor before the poison",
        || async {
            let done = handled(&client).await;
            let others_left = (1..=events).any(|s| !task_a(s) && !done.contains(&s));
            !others_left && cursor(&db, "p", "c").await == Some(poison - 1)
        },
    )
    .await;
    let attempts = handler.attempts.lock().unwrap().clone();
    assert!(attempts.len() >= 2, "retried: {attempts:?}");
    assert!(attempts.is_sorted(), "{attempts:?}");
    let done = handled(&client).await;
    let later: Vec<i64> = (poison + 1..=events)
        .filter(|&s| task_a(s) && done.contains(&s))
        .collect();
    assert!(later.is_empty(), "the poison's task went on: {later:?}");
    assert!(
        receipts(&db).await > 0,
        "events handled beyond the cursor have receipts"
    );

    handler.park.store(true, Ordering::SeqCst);
    eventually(WAIT, "the cursor at the end", || async {
        cursor(&db, "p", "c").await == Some(events)
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
    let attempts = handler.attempts.lock().unwrap().clone();
    assert_eq!(
        attempts,
        (1..=attempts.len() as u32).collect::<Vec<u32>>(),
        "one attempt after another"
    );
    let state: String = client
        .query_one(
            "SELECT state FROM outbox.lifecycle_deliveries WHERE sequence = $1",
            &[&poison],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "dead");
    let expected: Vec<i64> = (1..=events).filter(|&s| s != poison).collect();
    assert_effects(&db, &expected).await;
    assert_eq!(receipts(&db).await, 0);
}

/// The sequences with an effect.
async fn handled(client: &tokio_postgres::Client) -> Vec<i64> {
    client
        .query("SELECT DISTINCT sequence FROM lane_effects", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get::<_, i64>(0))
        .collect()
}

/// Holds every event of task `t-0` until the gate opens; handles the rest at once.
#[derive(Clone, Default)]
struct HoldTask {
    gate: Arc<Notify>,
}

impl Handler for HoldTask {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        if event.task_id == "t-0" {
            self.gate.notified().await;
        }
        Ok(())
    }
}

/// `outbox status` shows how far lanes have handled beyond the cursor: while the first event
/// waits, the cursor stays before it and the gap grows to what the other tasks handled; once
/// everything is handled the gap is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_gap_between_the_cursor_and_the_highest_handled_event() {
    let db = fresh_db().await;
    // 100 events of tasks t-0..t-9; t-0's first event is sequence 10.
    seed(&db, 100, 10).await;
    let handler = HoldTask::default();
    let mut config = fast_config("p", "c");
    config.delivery.lanes = 4;
    config.delivery.batch_size = 20;
    config.delivery.max_ahead = 200;
    let (stop, run) =
        outbox_tests::consumer_kit::start_with(&db, config, handler.clone(), Recorder::default());
    let consumer = |status: &serde_json::Value| status["consumers"][0].clone();
    let seen = Mutex::new(serde_json::Value::Null);
    eventually(WAIT, "the gap beyond the held event in status", || async {
        let status = consumer(&outbox_json(&db, &["status"]).await);
        let there = status["cursor"] == 9 && status["handled_through"] == 99;
        *seen.lock().unwrap() = status;
        there
    })
    .await;
    let status = seen.lock().unwrap().clone();
    assert_eq!(status["handled_ahead"], 90, "{status}");
    let (code, table, _) =
        outbox_tests::process_kit::outbox_on(&db, &["status", "--project", "p"]).await;
    assert_eq!(code, 0);
    let header = table
        .lines()
        .find(|line| line.contains("HANDLED_AHEAD"))
        .expect("the consumers' header");
    let row = table
        .lines()
        .skip_while(|line| *line != header)
        .nth(1)
        .expect("the consumer's row");
    let column = header
        .split_whitespace()
        .position(|name| name == "HANDLED_AHEAD")
        .unwrap();
    assert_eq!(row.split_whitespace().nth(column), Some("90"), "{table}");

    // Open the gate for each held event in turn.
    for _ in 0..10 {
        handler.gate.notify_one();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eventually(WAIT, "everything handled, no gap", || async {
        handler.gate.notify_one();
        let status = consumer(&outbox_json(&db, &["status"]).await);
        status["cursor"] == 100 && status["handled_ahead"] == 0
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
}
