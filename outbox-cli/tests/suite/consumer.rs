//! The consumer runtime against a real PostgreSQL: ordered delivery, reconciliation, the
//! transactional handler, retries and parking, lease fencing and wake-ups.

use std::sync::Arc;
use std::time::Duration;

use outbox_consumer::config::LiveQuery;
use outbox_consumer::handler::ReconcileReason;
use outbox_consumer::{
    Consumer, ConsumerError, FailureClass, Handler, HandlerFailure, ObservedEvent, RetrySchedule,
    StartFrom, TransactionalHandler,
};
use outbox_core::{Schema, Writer, WriterProcessId};
use outbox_tests::consumer_kit::{
    Recorder, SeedCursor, WAIT, cursor, eventually, eventually_count, fast_config, seed_consumer,
    start, write_event,
};
use outbox_tests::stats_kit::{
    BIG_PROJECT, SMALL_PROJECT, assert_only_the_work_list_read, assert_the_counters_move,
    event_table_reads, stale_statistics,
};
use outbox_tests::{TestDb, fresh_db};
use tokio_util::sync::CancellationToken;

/// Runs a consumer that is expected to refuse to start, and returns why.
async fn refused_start(db: &TestDb, config: outbox_consumer::ConsumerConfig) -> ConsumerError {
    Consumer::new(
        db.pool(3),
        None,
        config,
        Recorder::default(),
        Recorder::default(),
    )
    .run(CancellationToken::new())
    .await
    .unwrap_err()
}

async fn query_i64(db: &TestDb, sql: &str) -> i64 {
    db.connect().await.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn delivers_every_event_in_order_and_releases_the_lease() {
    let db = fresh_db().await;
    for i in 0..5 {
        write_event(&db, "p", &format!("t{i}")).await;
    }
    let recorder = Recorder::default();
    let (shutdown, run) = start(&db, fast_config("p", "c1"), &recorder);
    eventually(WAIT, "5 events", || async { recorder.events().len() == 5 }).await;
    for i in 5..8 {
        write_event(&db, "p", &format!("t{i}")).await;
    }
    eventually(WAIT, "8 events", || async { recorder.events().len() == 8 }).await;
    shutdown.cancel();
    let summary = run.await.unwrap().unwrap();
    assert_eq!(summary.delivered, 8);
    assert_eq!(summary.generation, 1);
    assert_eq!(recorder.sequences(), (1..=8).collect::<Vec<_>>());
    let first = &recorder.events()[0];
    assert!(first.observed);
    assert_eq!(first.writer_process_id, "test-writer");
    assert_eq!(first.consumer_id.as_str(), "c1");
    assert_eq!(first.task_id, "t0");
    assert_eq!(first.event_type, "task:deleted");
    assert!(!first.replay);
    assert_eq!(first.attempt, 1);
    assert_eq!(cursor(&db, "p", "c1").await, Some(8));
    let owner: Option<String> = db
        .connect()
        .await
        .query_one(
            "SELECT lease_owner FROM outbox.lifecycle_consumer_cursors",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, None, "graceful shutdown releases the lease");
}

#[tokio::test]
async fn a_new_consumer_reconciles_from_the_live_set_then_follows() {
    let db = fresh_db().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "INSERT INTO tasks (id, project_id) SELECT 't' || g, 'p' FROM generate_series(1, 5) g;
             INSERT INTO tasks (id, project_id) VALUES ('other', 'q');
             UPDATE tasks SET deleted_at = now() WHERE id = 't1';",
        )
        .await
        .unwrap();
    write_event(&db, "p", "t1").await;
    let recorder = Recorder::default();
    let mut config = fast_config("p", "c1");
    config.delivery.start_from = StartFrom::Reconcile;
    let (shutdown, run) = start(&db, config, &recorder);
    eventually(WAIT, "a reconciliation", || async {
        !recorder.reconciliations().is_empty()
    })
    .await;
    let live = &recorder.reconciliations()[0];
    assert_eq!(live.reason, ReconcileReason::MissingCursor);
    let mut ids = live.task_ids.clone();
    ids.sort();
    assert_eq!(ids, vec!["t2", "t3", "t4", "t5"]);
    assert_eq!(
        live.head_sequence, 1,
        "the earlier deletion is covered by the snapshot"
    );
    client
        .batch_execute("UPDATE tasks SET deleted_at = now() WHERE id = 't2'")
        .await
        .unwrap();
    write_event(&db, "p", "t2").await;
    eventually(WAIT, "the next event", || async {
        recorder.events().len() == 1
    })
    .await;
    assert_eq!(recorder.events()[0].sequence, 2);
    assert_eq!(recorder.events()[0].task_id, "t2");
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let audits = query_i64(
        &db,
        "SELECT count FROM outbox.lifecycle_audit WHERE kind = 'lifecycle-observation:reconciled'",
    )
    .await;
    assert_eq!(audits, 4, "the audit row counts the live set");
}

#[tokio::test]
async fn a_cursor_below_the_retention_floor_reconciles() {
    let db = fresh_db().await;
    for i in 0..3 {
        write_event(&db, "p", &format!("t{i}")).await;
    }
    let mut client = db.connect().await;
    outbox_core::sequencer::Sequencer::new(&Schema::default())
        .drain(&mut client)
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO tasks (id, project_id) VALUES ('alive', 'p');
             INSERT INTO outbox.lifecycle_consumers (project_id, consumer_id) VALUES ('p', 'c1');
             INSERT INTO outbox.lifecycle_consumer_positions
                 (project_id, consumer_id, last_acked_sequence) VALUES ('p', 'c1', 1);
             DELETE FROM outbox.lifecycle_outbox WHERE sequence <= 2;
             UPDATE outbox.lifecycle_projects SET pruned_through = 2;",
        )
        .await
        .unwrap();
    let recorder = Recorder::default();
    let (shutdown, run) = start(&db, fast_config("p", "c1"), &recorder);
    eventually(WAIT, "a reconciliation", || async {
        !recorder.reconciliations().is_empty()
    })
    .await;
    let live = recorder.reconciliations()[0].clone();
    assert_eq!(live.reason, ReconcileReason::BelowRetentionFloor);
    assert_eq!(live.task_ids, vec!["alive"]);
    assert_eq!(live.head_sequence, 3);
    write_event(&db, "p", "t3").await;
    eventually(WAIT, "the event after the snapshot", || async {
        recorder.sequences() == vec![4]
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(cursor(&db, "p", "c1").await, Some(4));
}

#[tokio::test]
async fn a_cursor_above_the_head_is_a_divergence_and_reconciles() {
    let db = fresh_db().await;
    write_event(&db, "p", "t0").await;
    db.connect()
        .await
        .batch_execute(
            "INSERT INTO outbox.lifecycle_consumers (project_id, consumer_id) VALUES ('p', 'c1');
             INSERT INTO outbox.lifecycle_consumer_positions
                 (project_id, consumer_id, last_acked_sequence) VALUES ('p', 'c1', 40)",
        )
        .await
        .unwrap();
    let recorder = Recorder::default();
    let (shutdown, run) = start(&db, fast_config("p", "c1"), &recorder);
    eventually(WAIT, "a reconciliation", || async {
        !recorder.reconciliations().is_empty()
    })
    .await;
    assert_eq!(
        recorder.reconciliations()[0].reason,
        ReconcileReason::HistoryDiverged
    );
    let diverged: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_audit \
             WHERE kind = 'lifecycle-observation:history-diverged' AND consumer_id = 'c1' \
               AND count = 40",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(diverged, 1, "the divergence is audited once");
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(cursor(&db, "p", "c1").await, Some(1));
}

/// Records each event in the handler's transaction, then fails on task `bad`.
struct EffectWriter;

impl TransactionalHandler for EffectWriter {
    async fn handle(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        event: &ObservedEvent,
    ) -> Result<(), HandlerFailure> {
        tx.execute(
            "INSERT INTO effects (event_id) VALUES ($1)",
            &[&event.event_id],
        )
        .await
        .map_err(|_| FailureClass::new("effect_insert_failed").unwrap())?;
        if event.task_id == "bad" {
            return Err(FailureClass::new("forced_failure").unwrap().into());
        }
        Ok(())
    }
}

#[tokio::test]
async fn transactional_handler_effects_commit_and_roll_back_with_the_cursor() {
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute("CREATE TABLE effects (event_id text PRIMARY KEY)")
        .await
        .unwrap();
    for task in ["a", "bad", "b"] {
        write_event(&db, "p", task).await;
    }
    let mut config = fast_config("p", "c1");
    config.delivery.retry = RetrySchedule::new(vec![Duration::from_millis(300)], 3).unwrap();
    let shutdown = CancellationToken::new();
    let consumer = Consumer::transactional(
        db.pool(4),
        Some(db.config.clone()),
        config,
        EffectWriter,
        Recorder::default(),
    );
    let token = shutdown.clone();
    let run = tokio::spawn(async move { consumer.run(token).await });

    // While `bad` is retrying, `a` is committed with its effect and `bad` has none.
    eventually(WAIT, "a retrying delivery", || async {
        query_i64(
            &db,
            "SELECT count(*) FROM outbox.lifecycle_deliveries WHERE state = 'retrying'",
        )
        .await
            == 1
    })
    .await;
    assert_eq!(cursor(&db, "p", "c1").await, Some(1));
    assert_eq!(query_i64(&db, "SELECT count(*) FROM effects").await, 1);

    eventually(WAIT, "the poison event parked and b delivered", || async {
        cursor(&db, "p", "c1").await == Some(3)
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let effects: Vec<String> = db
        .connect()
        .await
        .query("SELECT event_id FROM effects ORDER BY event_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        effects.len(),
        2,
        "exactly one effect per acknowledged event: {effects:?}"
    );
    assert!(effects.iter().all(|e| !e.contains(":bad:")));
}

#[tokio::test]
async fn a_poison_event_retries_on_schedule_then_parks_and_the_stream_moves_on() {
    let db = fresh_db().await;
    for task in ["a", "poison", "b"] {
        write_event(&db, "p", task).await;
    }
    let recorder = Recorder::default();
    recorder.fail_task("poison");
    let mut config = fast_config("p", "c1");
    config.delivery.retry = RetrySchedule::new(
        vec![Duration::from_millis(100), Duration::from_millis(200)],
        4,
    )
    .unwrap();
    let (shutdown, run) = start(&db, config, &recorder);
    eventually(WAIT, "b after the parked event", || async {
        recorder.events().iter().any(|e| e.task_id == "b")
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let attempts: Vec<u32> = recorder
        .events()
        .iter()
        .filter(|e| e.task_id == "poison")
        .map(|e| e.attempt)
        .collect();
    assert_eq!(attempts, vec![1, 2, 3, 4], "exactly max_attempts attempts");
    let client = db.connect().await;
    let row = client
        .query_one(
            "SELECT state, attempts, last_failure_class, sequence FROM outbox.lifecycle_deliveries",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "dead");
    assert_eq!(row.get::<_, i32>(1), 4);
    assert_eq!(row.get::<_, String>(2), "forced_failure");
    assert_eq!(row.get::<_, i64>(3), 2);
    let audit = client
        .query(
            "SELECT kind, project_id, consumer_id, event_id, count FROM outbox.lifecycle_audit \
             WHERE kind = 'lifecycle-observation:consumer-poisoned'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(audit.len(), 1);
    assert!(audit[0].get::<_, String>(3).contains(":poison:"));
    assert_eq!(audit[0].get::<_, i64>(4), 4);
    assert_eq!(cursor(&db, "p", "c1").await, Some(3));
}

#[tokio::test]
async fn a_restart_honours_the_saved_retry_time_and_continues_the_count() {
    let db = fresh_db().await;
    write_event(&db, "p", "flaky").await;
    let recorder = Recorder::default();
    recorder.fail_task("flaky");
    let mut config = fast_config("p", "c1");
    config.delivery.retry = RetrySchedule::new(vec![Duration::from_secs(3)], 10).unwrap();
    let (shutdown, run) = start(&db, config.clone(), &recorder);
    eventually(WAIT, "a saved retry", || async {
        query_i64(&db, "SELECT count(*) FROM outbox.lifecycle_deliveries").await == 1
    })
    .await;
    let wait_ms = query_i64(
        &db,
        "SELECT (extract(epoch FROM next_attempt_at - updated_at) * 1000)::bigint \
         FROM outbox.lifecycle_deliveries",
    )
    .await;
    assert!(
        (2900..=3100).contains(&wait_ms),
        "next attempt saved 3 s ahead, got {wait_ms} ms"
    );
    shutdown.cancel();
    run.await.unwrap().unwrap();

    let restarted = Recorder::default();
    let consumer = Consumer::new(
        db.pool(4),
        Some(db.config.clone()),
        config,
        restarted.clone(),
        restarted.clone(),
    );
    let probe = consumer.probe();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let token = shutdown.clone();
        async move { consumer.run(token).await }
    });
    // The restarted consumer holds its lease and has finished a round of its loop: it has
    // taken up the held event and decided whether to dispatch it.
    eventually(WAIT, "the restarted consumer's first round", || async {
        probe.lease_held() && probe.since_last_poll().is_some()
    })
    .await;
    assert!(
        restarted.events().is_empty(),
        "no retry before the saved time"
    );
    assert_eq!(
        query_i64(
            &db,
            "SELECT count(*) FROM outbox.lifecycle_deliveries WHERE next_attempt_at > now()"
        )
        .await,
        1,
        "the saved retry time had not come when the restarted consumer was checked"
    );
    eventually(WAIT, "the retry", || async {
        !restarted.events().is_empty()
    })
    .await;
    assert_eq!(
        restarted.events()[0].attempt,
        2,
        "the attempt count continues"
    );
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(cursor(&db, "p", "c1").await, Some(1));
    assert_eq!(
        query_i64(&db, "SELECT count(*) FROM outbox.lifecycle_deliveries").await,
        0,
        "a retried event that succeeded leaves no delivery state"
    );
}

#[tokio::test]
async fn a_second_process_waits_or_refuses_then_takes_over_with_a_higher_generation() {
    let db = fresh_db().await;
    let first = Recorder::default();
    let (shutdown_first, run_first) = start(&db, fast_config("p", "c1"), &first);
    eventually(WAIT, "the first claim", || async {
        cursor(&db, "p", "c1").await.is_some()
    })
    .await;

    let mut refusing = fast_config("p", "c1");
    refusing.delivery.wait_for_lease = false;
    let refused = refused_start(&db, refusing).await;
    assert!(
        matches!(refused, ConsumerError::LeaseHeld { generation: 1, .. }),
        "{refused}"
    );

    let second = Recorder::default();
    let (shutdown_second, run_second) = start(&db, fast_config("p", "c1"), &second);
    write_event(&db, "p", "t1").await;
    eventually(WAIT, "delivery to the holder", || async {
        first.events().len() == 1
    })
    .await;
    assert!(
        second.events().is_empty(),
        "the waiting process never dispatches"
    );
    shutdown_first.cancel();
    assert_eq!(run_first.await.unwrap().unwrap().generation, 1);
    write_event(&db, "p", "t2").await;
    eventually(WAIT, "delivery to the successor", || async {
        second.events().len() == 1
    })
    .await;
    assert_eq!(
        second.events()[0].sequence,
        2,
        "the successor resumes from the cursor"
    );
    shutdown_second.cancel();
    assert_eq!(run_second.await.unwrap().unwrap().generation, 2);
}

/// Blocks on the task `slow` until released, then succeeds or fails.
#[derive(Clone)]
struct Gate {
    release: Arc<tokio::sync::Notify>,
    entered: Arc<tokio::sync::Notify>,
    fail: bool,
}

impl Handler for Gate {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        if event.task_id == "slow" {
            self.entered.notify_one();
            self.release.notified().await;
            if self.fail {
                return Err(FailureClass::new("forced_failure").unwrap().into());
            }
        }
        Ok(())
    }
}

async fn stale_holder(fail: bool) {
    let db = fresh_db().await;
    write_event(&db, "p", "fast").await;
    write_event(&db, "p", "slow").await;
    let gate = Gate {
        release: Arc::new(tokio::sync::Notify::new()),
        entered: Arc::new(tokio::sync::Notify::new()),
        fail,
    };
    let mut config = fast_config("p", "c1");
    // Long enough that no heartbeat notices the takeover before the handler returns.
    config.delivery.lease_ttl = Duration::from_secs(60);
    config.delivery.heartbeat_interval = Duration::from_secs(20);
    config.delivery.batch_size = 1;
    config.delivery.max_batch_size = 1;
    let shutdown = CancellationToken::new();
    let consumer = Consumer::new(db.pool(4), None, config, gate.clone(), Recorder::default());
    let run = tokio::spawn({
        let token = shutdown.clone();
        async move { consumer.run(token).await }
    });
    tokio::time::timeout(WAIT, gate.entered.notified())
        .await
        .unwrap();
    assert_eq!(cursor(&db, "p", "c1").await, Some(1));
    // Another process claims the (as if expired) lease while the handler is busy.
    db.connect()
        .await
        .batch_execute(
            "UPDATE outbox.lifecycle_consumers
             SET lease_owner = 'intruder', lease_generation = lease_generation + 1,
                 claimed_until = now() + interval '1 minute'",
        )
        .await
        .unwrap();
    gate.release.notify_one();
    let err = tokio::time::timeout(WAIT, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    match &err {
        ConsumerError::LeaseLost {
            generation, reason, ..
        } => {
            assert_eq!(*generation, 1);
            assert!(reason.contains("intruder"), "{reason}");
        }
        other => panic!("expected LeaseLost, got {other}"),
    }
    assert_eq!(
        cursor(&db, "p", "c1").await,
        Some(1),
        "the stale ack changed nothing"
    );
    assert_eq!(
        query_i64(&db, "SELECT count(*) FROM outbox.lifecycle_deliveries").await,
        0,
        "the stale failure record changed nothing"
    );
    let owner: String = db
        .connect()
        .await
        .query_one(
            "SELECT lease_owner FROM outbox.lifecycle_consumer_cursors",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        owner, "intruder",
        "a stale holder does not release another's lease"
    );
}

#[tokio::test]
async fn a_stale_holders_ack_is_rejected() {
    stale_holder(false).await;
}

#[tokio::test]
async fn a_stale_holders_failure_record_is_rejected() {
    stale_holder(true).await;
}

/// Calls the writer from inside its dispatch and keeps the outcome.
struct Reentrant {
    outcome: Arc<std::sync::Mutex<Option<String>>>,
    pool: deadpool_postgres::Pool,
}

impl Handler for Reentrant {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        let client = self.pool.get().await.unwrap();
        let writer = Writer::new(
            &Schema::default(),
            WriterProcessId::new("observer").unwrap(),
        );
        let again = outbox_core::TaskDeleted::new(
            event.project_id.clone(),
            outbox_core::TaskId::new(event.task_id.clone()).unwrap(),
            chrono::Utc::now(),
            outbox_core::Prior::default(),
        )
        .unwrap();
        let result = writer.record(&**client, &again).await;
        *self.outcome.lock().unwrap() = Some(match result {
            Err(outbox_core::Error::WriteInsideObservedDispatch) => "refused".into(),
            other => format!("{other:?}"),
        });
        Ok(())
    }
}

#[tokio::test]
async fn the_writer_refuses_to_run_inside_an_observed_dispatch() {
    let db = fresh_db().await;
    write_event(&db, "p", "t1").await;
    let outcome = Arc::new(std::sync::Mutex::new(None));
    let handler = Reentrant {
        outcome: outcome.clone(),
        pool: db.pool(2),
    };
    let shutdown = CancellationToken::new();
    let consumer = Consumer::new(
        db.pool(4),
        None,
        fast_config("p", "c1"),
        handler,
        Recorder::default(),
    );
    let run = tokio::spawn({
        let token = shutdown.clone();
        async move { consumer.run(token).await }
    });
    eventually(WAIT, "the dispatch", || async {
        outcome.lock().unwrap().is_some()
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(outcome.lock().unwrap().as_deref(), Some("refused"));
    assert_eq!(
        query_i64(&db, "SELECT count(*) FROM outbox.lifecycle_outbox").await,
        1,
        "the observer wrote nothing"
    );
}

#[tokio::test]
async fn wake_ups_survive_a_terminated_listener_connection() {
    let db = fresh_db().await;
    let recorder = Recorder::default();
    let mut config = fast_config("p", "c1");
    // Polling alone would take 30 s: prompt delivery proves the wake-up path.
    config.delivery.poll_interval = Duration::from_secs(30);
    let mut listen = db.config.clone();
    listen.application_name("test-listener");
    let shutdown = CancellationToken::new();
    let consumer = Consumer::new(
        db.pool(4),
        Some(listen),
        config,
        recorder.clone(),
        recorder.clone(),
    );
    let run = tokio::spawn({
        let token = shutdown.clone();
        async move { consumer.run(token).await }
    });
    let client = db.connect().await;
    let listeners = || async {
        client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'test-listener'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    eventually(WAIT, "the listener", || async { listeners().await == 1 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    write_event(&db, "p", "t1").await;
    eventually(Duration::from_secs(5), "a woken delivery", || async {
        recorder.events().len() == 1
    })
    .await;

    let terminated: bool = client
        .query_one(
            "SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'test-listener'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(terminated);
    write_event(&db, "p", "t2").await;
    eventually(
        Duration::from_secs(5),
        "delivery after the listener died",
        || async { recorder.events().len() == 2 },
    )
    .await;
    eventually(WAIT, "a new listener", || async { listeners().await == 1 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    write_event(&db, "p", "t3").await;
    eventually(
        Duration::from_secs(5),
        "a woken delivery after reconnect",
        || async { recorder.events().len() == 3 },
    )
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(recorder.sequences(), vec![1, 2, 3]);
}

#[tokio::test]
async fn poll_only_delivers_without_a_listener() {
    let db = fresh_db().await;
    let recorder = Recorder::default();
    let mut config = fast_config("p", "c1");
    config.duties.listen = false;
    let (shutdown, run) = start(&db, config, &recorder);
    write_event(&db, "p", "t1").await;
    write_event(&db, "p", "t2").await;
    eventually(WAIT, "polled deliveries", || async {
        recorder.events().len() == 2
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let listeners = query_i64(
        &db,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .await;
    assert_eq!(listeners, 0);
}

/// Makes `owner` the holder of `c1`'s lease at generation 4, valid for another hour, as a
/// process that ended without releasing it leaves the row.
async fn held_by(db: &TestDb, owner: &str) {
    db.connect()
        .await
        .execute(
            "UPDATE outbox.lifecycle_consumers
             SET lease_owner = $1, lease_generation = 4,
                 claimed_until = now() + interval '1 hour', claimed_at = now()
             WHERE project_id = 'p' AND consumer_id = 'c1'",
            &[&owner],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_lease_held_by_a_process_of_this_host_that_is_gone_is_taken_over_at_once() {
    let db = fresh_db().await;
    write_event(&db, "p", "t1").await;
    seed_consumer(&db, "p", "c1", SeedCursor::At(0), false).await;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let host = host.trim();
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    let gone = ended.id();
    ended.wait().unwrap();
    let mut no_wait = fast_config("p", "c1");
    no_wait.delivery.wait_for_lease = false;

    // A holder that may still be running is waited for: a live PID of this host, or any
    // PID of another host.
    for alive in [
        format!("{host}:{}:0badcafe", std::process::id()),
        format!("{host}-elsewhere:{gone}:0badcafe"),
    ] {
        held_by(&db, &alive).await;
        let refused = refused_start(&db, no_wait.clone()).await;
        assert!(
            matches!(refused, ConsumerError::LeaseHeld { generation: 4, .. }),
            "{alive}: {refused}"
        );
    }

    let dead = format!("{host}:{gone}:0badcafe");
    held_by(&db, &dead).await;
    let recorder = Recorder::default();
    let (shutdown, run) = start(&db, no_wait, &recorder);
    eventually(WAIT, "delivery by the new holder", || async {
        recorder.events().len() == 1
    })
    .await;
    let (owner, generation): (String, i64) = {
        let row = db
            .connect()
            .await
            .query_one(
                "SELECT lease_owner, lease_generation FROM outbox.lifecycle_consumer_cursors",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_ne!(owner, dead, "the lease changed hands");
    assert_eq!(
        generation, 5,
        "the takeover bumps the generation: the old fence is void"
    );
    shutdown.cancel();
    assert_eq!(run.await.unwrap().unwrap().generation, 5);
}

async fn retire(db: &TestDb) {
    db.connect()
        .await
        .batch_execute(
            "UPDATE outbox.lifecycle_consumers
             SET state = 'retired', retired_by = 'alice', retired_reason = 'moved', retired_at = now()",
        )
        .await
        .unwrap();
}

/// A reconciliation whose lease is lost while its live query runs is abandoned at once, and
/// the query cancelled on the server rather than left to run to its end.
#[tokio::test]
async fn a_lost_lease_abandons_the_reconciliation_and_cancels_its_live_query() {
    let db = fresh_db().await;
    write_event(&db, "p", "t1").await;
    let recorder = Recorder::default();
    let mut config = fast_config("p", "c1");
    config.delivery.start_from = StartFrom::Reconcile;
    config.delivery.live_query =
        LiveQuery::Custom("SELECT $1::text FROM pg_sleep(3600) AS lost_lease_query".into());
    let (_shutdown, run) = start(&db, config, &recorder);
    let client = db.connect().await;
    let running = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND state = 'active' AND query LIKE '%lost_lease_query%' \
                   AND pid <> pg_backend_pid()";
    eventually_count(&client, WAIT, "the live query to run", running, 1).await;
    retire(&db).await;
    let ended = tokio::time::timeout(WAIT, run)
        .await
        .expect("the run ends with the loss, not with the query");
    let err = ended.unwrap().unwrap_err();
    assert!(matches!(err, ConsumerError::Retired { .. }), "{err:?}");
    eventually_count(
        &client,
        WAIT,
        "no backend running the live query",
        running,
        0,
    )
    .await;
    assert!(recorder.reconciliations().is_empty());
    assert_eq!(cursor(&db, "p", "c1").await, None, "nothing reconciled");
}

#[tokio::test]
async fn a_retired_holder_stops_releases_and_a_reactivated_consumer_reconciles() {
    let db = fresh_db().await;
    write_event(&db, "p", "t1").await;
    let first = Recorder::default();
    let (_shutdown, run) = start(&db, fast_config("p", "c1"), &first);
    eventually(WAIT, "the first delivery", || async {
        first.events().len() == 1
    })
    .await;
    retire(&db).await;
    match tokio::time::timeout(WAIT, run).await.unwrap().unwrap() {
        Err(ConsumerError::Retired { by, reason, .. }) => {
            assert_eq!((by.as_str(), reason.as_str()), ("alice", "moved"));
        }
        other => panic!("expected the retirement to stop the holder, got {other:?}"),
    }
    let row = db
        .connect()
        .await
        .query_one(
            "SELECT lease_owner, lease_generation FROM outbox.lifecycle_consumer_cursors",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, Option<String>>(0),
        None,
        "the retired holder released its lease"
    );
    assert_eq!(row.get::<_, i64>(1), 1);

    let refused = refused_start(&db, fast_config("p", "c1")).await;
    assert!(
        matches!(refused, ConsumerError::Retired { .. }),
        "{refused}"
    );

    let second = Recorder::default();
    let mut config = fast_config("p", "c1");
    config.delivery.reactivate = true;
    config.delivery.wait_for_lease = false;
    let (shutdown, run) = start(&db, config, &second);
    eventually(WAIT, "the reconciliation", || async {
        !second.reconciliations().is_empty()
    })
    .await;
    assert_eq!(
        second.reconciliations()[0].reason,
        ReconcileReason::MissingCursor
    );
    shutdown.cancel();
    assert_eq!(
        run.await.unwrap().unwrap().generation,
        3,
        "reactivation and the claim each bump the generation"
    );
    assert_eq!(
        query_i64(
            &db,
            "SELECT count(*) FROM outbox.lifecycle_audit \
             WHERE kind = 'lifecycle-observation:consumer-reactivated'"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn reactivation_never_overlaps_a_holder_that_has_not_noticed_its_retirement() {
    let db = fresh_db().await;
    let first = Recorder::default();
    let mut slow = fast_config("p", "c1");
    slow.delivery.lease_ttl = Duration::from_secs(60);
    slow.delivery.heartbeat_interval = Duration::from_secs(20);
    let (_shutdown, run) = start(&db, slow, &first);
    eventually(WAIT, "the claim", || async {
        cursor(&db, "p", "c1").await.is_some()
    })
    .await;
    retire(&db).await;
    let mut config = fast_config("p", "c1");
    config.delivery.reactivate = true;
    config.delivery.wait_for_lease = false;
    let refused = refused_start(&db, config).await;
    assert!(
        matches!(refused, ConsumerError::LeaseHeld { .. }),
        "the old holder's lease is still running: {refused}"
    );
    // The reactivation bumped the generation: the old holder's next write is refused.
    write_event(&db, "p", "t1").await;
    match tokio::time::timeout(WAIT, run).await.unwrap().unwrap() {
        Err(ConsumerError::LeaseLost { generation: 1, .. }) => {}
        other => panic!("expected the old holder to be fenced off, got {other:?}"),
    }
    assert_eq!(
        cursor(&db, "p", "c1").await,
        None,
        "the old holder acknowledged nothing"
    );
}

#[tokio::test]
async fn each_failure_saves_the_next_attempt_from_the_schedule() {
    let db = fresh_db().await;
    write_event(&db, "p", "flaky").await;
    let recorder = Recorder::default();
    recorder.fail_task("flaky");
    let schedule = [
        Duration::from_millis(400),
        Duration::from_millis(800),
        Duration::from_millis(1200),
    ];
    let mut config = fast_config("p", "c1");
    config.delivery.retry = RetrySchedule::new(schedule.to_vec(), 4).unwrap();
    let (shutdown, run) = start(&db, config, &recorder);
    let client = db.connect().await;
    let mut saved: Vec<(i32, i64)> = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while saved.len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "three saved retries, got {saved:?}"
        );
        if let Some(row) = client
            .query_opt(
                "SELECT attempts, \
                        (extract(epoch FROM next_attempt_at - updated_at) * 1000)::bigint \
                 FROM outbox.lifecycle_deliveries WHERE state = 'retrying'",
                &[],
            )
            .await
            .unwrap()
        {
            let entry = (row.get::<_, i32>(0), row.get::<_, i64>(1));
            if saved.last() != Some(&entry) {
                saved.push(entry);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (attempts, wait_ms) in &saved {
        let expected = schedule[(*attempts - 1) as usize].as_millis() as i64;
        assert!(
            (wait_ms - expected).abs() <= 50,
            "after attempt {attempts} the next attempt is saved {wait_ms} ms ahead, \
             expected {expected} ms"
        );
    }
    assert_eq!(
        saved.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![1, 2, 3],
        "one saved row per failure, counting up"
    );
    eventually(
        WAIT,
        "the event parked after the fourth attempt",
        || async { cursor(&db, "p", "c1").await == Some(1) },
    )
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let state: String = client
        .query_one("SELECT state FROM outbox.lifecycle_deliveries", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "dead");
}

/// The check a consumer that exits when caught up makes (does anything of its project still
/// wait for a number?) reads the work list, however stale the statistics: neither the whole
/// event table (a project holding most of it) nor a small project's whole history.
#[tokio::test]
async fn the_caught_up_check_reads_the_work_list_under_stale_statistics() {
    let db = fresh_db().await;
    stale_statistics(&db).await;
    let mut reads = Vec::new();
    for project in [BIG_PROJECT, SMALL_PROJECT] {
        seed_consumer(&db, project, "c1", SeedCursor::Head, false).await;
        let before = event_table_reads(&db).await;
        let recorder = Recorder::default();
        let mut config = fast_config(project, "c1");
        config.delivery.exit_when_caught_up = true;
        let (_shutdown, run) = start(&db, config, &recorder);
        let summary = tokio::time::timeout(WAIT, run)
            .await
            .expect("the consumer stops once caught up")
            .unwrap()
            .unwrap();
        assert_eq!(summary.delivered, 0);
        reads.push((project, before, event_table_reads(&db).await));
    }
    let last = reads.last().expect("readings").2;
    for (project, before, after) in reads {
        assert_only_the_work_list_read(&format!("{project}: the check"), before, after);
    }
    assert_the_counters_move(&db, last).await;
}

/// A consumer asked to start from the earliest event whose first process stopped (killed,
/// say) after registering it and before its first position is as new as one registered now:
/// it replays from the first event. Reconciling instead skipped the project's history (for a
/// relay: events never published while its cursor passed them).
#[tokio::test]
async fn a_consumer_registered_by_a_process_that_stopped_before_its_first_position_replays() {
    let db = fresh_db().await;
    for task in ["t1", "t2", "t3"] {
        write_event(&db, "p", task).await;
    }
    seed_consumer(&db, "p", "c1", SeedCursor::Missing, false).await;
    let recorder = Recorder::default();
    let mut config = fast_config("p", "c1");
    config.delivery.start_from = StartFrom::Earliest;
    let (shutdown, run) = start(&db, config, &recorder);
    eventually(WAIT, "three events delivered", || async {
        recorder.sequences().len() == 3
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(recorder.sequences(), vec![1, 2, 3]);
    assert!(recorder.reconciliations().is_empty(), "no reconciliation");
    assert_eq!(cursor(&db, "p", "c1").await, Some(3));
}
