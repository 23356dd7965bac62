//! Everything through a real PgBouncer in transaction mode (pool of 3 server connections per
//! database): writers, two consumers of one project with their embedded sequencers, an
//! in-process consumer that parks dead letters, `outbox status`, `prune`, and dead-letter
//! replay and resolve. Half the writers record `task:archived` (`Writer::record_event`, its
//! contract registered through the pooler): the consumer declaring it receives every committed
//! event in order, the one that does not receives the deletions in order and its cursor passes
//! the archivals; no process ever sees a prepared-statement error (SQLSTATE 26000 or 42P05).

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::Utc;
use outbox_consumer::{Consumer, RetrySchedule};
use outbox_core::connect::{ConnectSettings, Pooler};
use outbox_core::{
    Event, Payload, Prior, ProjectId, Schema, TaskDeleted, TaskId, WriteOutcome, Writer,
    WriterProcessId,
};
use outbox_tests::consumer_kit::{Recorder, eventually, fast_config};
use outbox_tests::fresh_db;
use outbox_tests::pgbouncer::PgBouncer;
use outbox_tests::process_kit::{ConsumeProcess, run_outbox};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);
const WRITERS: usize = 4;
const PER_WRITER: usize = 40;

/// Runs `outbox --pooler transaction --database-url URL ARGS`.
async fn outbox(url: &str, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["--pooler", "transaction", "--database-url", url];
    all.extend_from_slice(args);
    run_outbox(&all).await
}

async fn outbox_ok(url: &str, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--output", "json"]);
    let (code, out, err) = outbox(url, &all).await;
    assert_eq!(code, 0, "outbox {args:?} failed: {err}");
    assert_no_statement_errors(&err);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn assert_no_statement_errors(text: &str) {
    for bad in ["26000", "42P05", "prepared statement"] {
        assert!(!text.contains(bad), "saw {bad:?}:\n{text}");
    }
}

/// Records one event per task through `settings`, each in its own transaction: deletions
/// from even writers, archivals (through the generic writer) from odd ones.
async fn write_through(settings: ConnectSettings, writer: usize) -> Vec<String> {
    let mut client = settings.connect().await.expect("connect through pgbouncer");
    let writer_id = WriterProcessId::new(format!("bouncer-writer-{writer}")).unwrap();
    let recorder = Writer::new(&Schema::default(), writer_id);
    let mut ids = Vec::new();
    for i in 0..PER_WRITER {
        let tx = client.transaction().await.unwrap();
        let task = TaskId::new(format!("w{writer}-t{i}")).unwrap();
        if writer % 2 == 1 {
            let event = Event::new(
                ProjectId::new("p1").unwrap(),
                "task:archived@1".parse().unwrap(),
                task,
                Payload::new()
                    .timestamp("archived_at", Utc::now())
                    .object("prior", Payload::new().identifier("column", "done")),
            )
            .unwrap();
            match recorder.record_event(&tx, &event).await.expect("record") {
                WriteOutcome::Recorded { event_id } => ids.push(event_id),
                other => panic!("recorded once: {other:?}"),
            }
            tx.commit().await.unwrap();
            continue;
        }
        let event = TaskDeleted::new(
            ProjectId::new("p1").unwrap(),
            task,
            Utc::now(),
            Prior::default(),
        )
        .unwrap();
        recorder.record(&tx, &event).await.expect("record");
        tx.commit().await.unwrap();
        ids.push(event.event_id());
    }
    ids
}

async fn delivery_state(settings: &ConnectSettings, event: &str) -> String {
    let client = settings.connect().await.unwrap();
    outbox_core::internal::Unnamed::query_opt_unnamed(
        &client,
        "SELECT state FROM outbox.lifecycle_deliveries \
         WHERE project_id = 'p2' AND consumer_id = 'c3' AND event_id = $1",
        &[&event],
    )
    .await
    .unwrap()
    .map(|row| row.get(0))
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_service_works_through_pgbouncer_in_transaction_mode() {
    let db = fresh_db().await;
    let bouncer = PgBouncer::start();
    let url = bouncer.url(&db.name);
    let settings = ConnectSettings::parse(&url)
        .unwrap()
        .with_pooler(Pooler::Transaction);

    // migrate (its transaction-scoped advisory lock) and its dry run, through the pooler.
    let migrated = outbox_ok(&url, &["migrate"]).await;
    assert_eq!(migrated["applied"], serde_json::json!([]));
    let dry = outbox_ok(&url, &["migrate", "--dry-run"]).await;
    assert_eq!(dry["pending"], serde_json::json!([]));
    let archived = format!(
        "{}/../contracts/task-archived.json",
        env!("CARGO_MANIFEST_DIR")
    );
    outbox_ok(&url, &["contracts", "add", &archived, "--by", "ops"]).await;

    // Two consumers of project p1, each running the embedded sequencer, polling; c1 declares
    // archivals too, c2 only deletions (the default).
    let consumers: Vec<ConsumeProcess> = [
        ("c1", "task:deleted@1,task:archived@1"),
        ("c2", "task:deleted@1"),
    ]
    .iter()
    .map(|(id, types)| {
        ConsumeProcess::spawn(
            &url,
            &[
                "--event-types",
                types,
                "--project",
                "p1",
                "--consumer-id",
                id,
                "--start-from",
                "earliest",
                "--poll-interval",
                "100ms",
                "--heartbeat-interval",
                "300ms",
                "--lease-ttl",
                "3s",
                "--prune-interval",
                "1s",
                "--pooler",
                "transaction",
            ],
        )
    })
    .collect();

    // An in-process consumer of p2 through the pooler, whose handler fails two tasks until
    // they are parked.
    let recorder = Recorder::default();
    recorder.fail_task("poison-a");
    recorder.fail_task("poison-b");
    let mut config = fast_config("p2", "c3");
    config.delivery.retry = RetrySchedule::new(vec![Duration::from_millis(20)], 2).unwrap();
    config.duties.pooler = Pooler::Transaction;
    let shutdown = CancellationToken::new();
    let consumer = Consumer::new(
        settings.pool(4).unwrap(),
        Some(settings.wire_config()),
        config,
        recorder.clone(),
        recorder.clone(),
    );
    let in_process = {
        let token = shutdown.clone();
        tokio::spawn(async move { consumer.run(token).await })
    };

    // Concurrent writers through the pooler.
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(write_through(settings.clone(), w)))
        .collect();
    let mut written = BTreeSet::new();
    let mut deleted = BTreeSet::new();
    for (w, writer) in writers.into_iter().enumerate() {
        let ids = writer.await.unwrap();
        if w % 2 == 0 {
            deleted.extend(ids.iter().cloned());
        }
        written.extend(ids);
    }
    let total = written.len();
    assert_eq!(total, WRITERS * PER_WRITER);
    assert_eq!(deleted.len(), total / 2);

    let mut p2_ids = Vec::new();
    {
        let mut client = settings.connect().await.unwrap();
        let writer = Writer::new(&Schema::default(), WriterProcessId::new("p2").unwrap());
        for task in ["ok-1", "poison-a", "poison-b", "ok-2"] {
            let tx = client.transaction().await.unwrap();
            let event = TaskDeleted::new(
                ProjectId::new("p2").unwrap(),
                TaskId::new(task).unwrap(),
                Utc::now(),
                Prior::default(),
            )
            .unwrap();
            writer.record(&tx, &event).await.unwrap();
            tx.commit().await.unwrap();
            p2_ids.push(event.event_id());
        }
    }

    // Every committed event reaches c1, in sequence order, exactly as written; c2 gets the
    // deletions in order and passes the archivals (its cursor reaches the head).
    let consumer = &consumers[0];
    eventually(WAIT, "every event delivered through pgbouncer", || async {
        // Fail at once, with the cause, rather than at the timeout.
        assert_no_statement_errors(&consumer.stderr());
        consumer.sequences().len() >= total
    })
    .await;
    assert_eq!(
        consumer.sequences(),
        (1..=total as i64).collect::<Vec<_>>(),
        "in order, no gaps, no repeats"
    );
    let seen: BTreeSet<String> = consumer.event_ids().into_iter().collect();
    assert_eq!(seen, written, "nothing lost");
    let consumer = &consumers[1];
    eventually(WAIT, "c2's cursor past every event", || async {
        assert_no_statement_errors(&consumer.stderr());
        let client = settings.connect().await.unwrap();
        let acked: Option<i64> = outbox_core::internal::Unnamed::query_opt_unnamed(
            &client,
            "SELECT last_acked_sequence FROM outbox.lifecycle_consumer_cursors \
             WHERE project_id = 'p1' AND consumer_id = 'c2'",
            &[],
        )
        .await
        .unwrap()
        .and_then(|row| row.get(0));
        acked == Some(total as i64)
    })
    .await;
    let sequences = consumer.sequences();
    assert!(
        sequences.windows(2).all(|w| w[0] < w[1]),
        "in order, no repeats: {sequences:?}"
    );
    let seen: BTreeSet<String> = consumer.event_ids().into_iter().collect();
    assert_eq!(seen, deleted, "the deletions, and nothing else");

    // The in-process consumer parks both poison events and passes them.
    eventually(WAIT, "two dead letters in p2", || async {
        delivery_state(&settings, &p2_ids[1]).await == "dead"
            && delivery_state(&settings, &p2_ids[2]).await == "dead"
    })
    .await;
    eventually(WAIT, "p2 delivered past the dead letters", || async {
        recorder.events().iter().any(|e| e.task_id == "ok-2")
    })
    .await;

    // status, prune, dead-letter list, replay and resolve through the pooler.
    let status = outbox_ok(&url, &["status"]).await;
    let projects = status["projects"].as_array().expect("projects");
    assert!(
        projects
            .iter()
            .any(|p| p["project_id"] == "p1" && p["head_sequence"] == total as i64),
        "{status}"
    );
    outbox_ok(&url, &["prune", "--retention", "1s"]).await;
    let listed = outbox_ok(&url, &["dead-letters", "list", "--project", "p2"]).await;
    assert_eq!(
        listed["dead_letters"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );

    recorder.heal_task("poison-a");
    let letter_a = [
        "--project",
        "p2",
        "--consumer-id",
        "c3",
        "--event-id",
        p2_ids[1].as_str(),
    ];
    outbox_ok(
        &url,
        &[&["dead-letters", "replay", "--by", "ops"][..], &letter_a].concat(),
    )
    .await;
    eventually(WAIT, "the replay to succeed", || async {
        delivery_state(&settings, &p2_ids[1]).await == "replayed"
    })
    .await;
    let letter_b = [
        "--project",
        "p2",
        "--consumer-id",
        "c3",
        "--event-id",
        p2_ids[2].as_str(),
        "--by",
        "ops",
        "--reason",
        "handled by hand",
    ];
    outbox_ok(
        &url,
        &[&["dead-letters", "resolve"][..], &letter_b].concat(),
    )
    .await;
    assert_eq!(delivery_state(&settings, &p2_ids[2]).await, "resolved");

    // Orderly shutdown; nobody saw a prepared-statement error.
    shutdown.cancel();
    in_process
        .await
        .unwrap()
        .expect("in-process consumer ran cleanly");
    for mut consumer in consumers {
        consumer.signal("TERM");
        let code = consumer.wait().await;
        let stderr = consumer.stderr();
        assert_eq!(code, 0, "{stderr}");
        assert_no_statement_errors(&stderr);
        assert!(
            !stderr.contains("listening"),
            "no LISTEN behind the pooler:\n{stderr}"
        );
    }
    assert_no_statement_errors(&bouncer.log());
}
