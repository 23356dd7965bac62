//! The least-privilege roles of migration 0002: each role can do what its process needs and
//! is refused (SQLSTATE 42501) what it must not do; the CLI names the role and the action.

use std::time::Duration;

use outbox_consumer::Consumer;
use outbox_core::connect::ConnectSettings;
use outbox_core::internal::Unnamed;
use outbox_core::{Schema, Writer, WriterProcessId};
use outbox_tests::consumer_kit::{Recorder, cursor, eventually, fast_config, write_event};
use outbox_tests::process_kit::run_outbox;
use outbox_tests::{TestDb, fresh_db};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

/// A login role of this test's own (roles are cluster-wide) that is a member of
/// `outbox_<kind>`; returns its URL.
async fn login(db: &TestDb, kind: &str) -> String {
    let role = format!("{}_{kind}", db.name);
    db.connect()
        .await
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN IN ROLE \"outbox_{kind}\""
        ))
        .await
        .unwrap();
    db.url.replacen("postgres@", &format!("{role}@"), 1)
}

async fn connect(url: &str) -> Client {
    ConnectSettings::parse(url)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn refused(client: &Client, sql: &str) {
    let err = client
        .batch_execute(sql)
        .await
        .expect_err(&format!("must be refused: {sql}"));
    assert_eq!(
        err.code(),
        Some(&SqlState::INSUFFICIENT_PRIVILEGE),
        "{sql}: {err:?}"
    );
}

async fn allowed(client: &Client, sql: &str) {
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("must be allowed: {sql}: {e:?}"));
}

#[tokio::test]
async fn the_writer_only_records_events() {
    let db = fresh_db().await;
    let url = login(&db, "writer").await;
    let mut client = connect(&url).await;

    // The Rust writer and the SQL writer both work.
    let tx = client.transaction().await.unwrap();
    let event = outbox_core::TaskDeleted::new(
        outbox_core::ProjectId::new("p").unwrap(),
        outbox_core::TaskId::new("t1").unwrap(),
        chrono::Utc::now(),
        outbox_core::Prior::default(),
    )
    .unwrap();
    Writer::new(&Schema::default(), WriterProcessId::new("w").unwrap())
        .record(&tx, &event)
        .await
        .expect("the writer role records events");
    tx.commit().await.unwrap();
    allowed(
        &client,
        "SELECT outbox.write_task_deleted('p', 't2', now(), 'w', '{\"status\": \"open\"}')",
    )
    .await;

    refused(&client, "SELECT payload FROM outbox.lifecycle_outbox").await;
    refused(&client, "DELETE FROM outbox.lifecycle_outbox").await;
    refused(&client, "UPDATE outbox.lifecycle_outbox SET sequence = 1").await;
    refused(
        &client,
        "INSERT INTO outbox.lifecycle_consumer_positions (project_id, consumer_id, \
         last_acked_sequence) VALUES ('p', 'c', 99)",
    )
    .await;
    refused(&client, "SELECT * FROM outbox.lifecycle_deliveries").await;
    refused(&client, "SELECT * FROM outbox.lifecycle_audit").await;

    // Through the CLI: a clear message naming the role and the action, exit 1.
    let (code, _, err) = run_outbox(&["--database-url", &url, "status"]).await;
    assert_eq!(code, 1, "{err}");
    let role = format!("{}_writer", db.name);
    assert!(
        err.contains(&format!(
            "permission denied: role {role} may not read the outbox status"
        )),
        "{err}"
    );
}

#[tokio::test]
async fn the_consumer_reads_and_moves_only_its_own_state() {
    let db = fresh_db().await;
    for task in ["a", "b", "c"] {
        write_event(&db, "p", task).await;
    }
    let url = login(&db, "consumer").await;
    let settings = ConnectSettings::parse(&url).unwrap();

    // A consumer running as this role: claims, sequences, reads, acks (no pruning: that is
    // the operator's).
    let mut config = fast_config("p", "c");
    config.duties.prune_interval = None;
    let recorder = Recorder::default();
    let shutdown = CancellationToken::new();
    let consumer = Consumer::new(
        settings.pool(4).unwrap(),
        Some(settings.wire_config()),
        config,
        recorder.clone(),
        recorder.clone(),
    );
    let run = {
        let token = shutdown.clone();
        tokio::spawn(async move { consumer.run(token).await })
    };
    eventually(WAIT, "the consumer role to deliver and ack", || async {
        cursor(&db, "p", "c").await == Some(3)
    })
    .await;
    shutdown.cancel();
    run.await
        .unwrap()
        .expect("the consumer role runs a consumer");
    assert_eq!(recorder.sequences(), vec![1, 2, 3]);

    let client = connect(&url).await;
    refused(&client, "DELETE FROM outbox.lifecycle_outbox").await;
    refused(
        &client,
        "INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, \
         deleted_at, writer_process_id, payload_version, payload) \
         VALUES ('p', 'task:deleted', 'x', 'x', now(), 'w', 1, '{}')",
    )
    .await;
    refused(
        &client,
        "SELECT outbox.write_task_deleted('p', 'x', now(), 'w', NULL)",
    )
    .await;
    refused(
        &client,
        "UPDATE outbox.lifecycle_projects SET pruned_through = 1",
    )
    .await;
    refused(
        &client,
        "UPDATE outbox.lifecycle_consumers SET state = 'retired'",
    )
    .await;
    refused(&client, "SELECT * FROM outbox.lifecycle_audit").await;

    // Pruning through the CLI is refused, naming the role.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (code, _, err) = run_outbox(&["--database-url", &url, "prune", "--retention", "1s"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "permission denied: role {}_consumer may not prune events",
            db.name
        )),
        "{err}"
    );
    let (code, _, err) = run_outbox(&[
        "--database-url",
        &url,
        "consumers",
        "retire",
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--by",
        "x",
        "--reason",
        "y",
    ])
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("may not retire consumers"), "{err}");
}

#[tokio::test]
async fn the_operator_prunes_retires_resolves_but_records_and_moves_nothing() {
    let db = fresh_db().await;
    for task in ["a", "b"] {
        write_event(&db, "p", task).await;
    }
    // A direct consumer acknowledges both, so they become prunable.
    let recorder = Recorder::default();
    let shutdown = CancellationToken::new();
    let consumer = Consumer::new(
        db.pool(4),
        None,
        fast_config("p", "c"),
        recorder.clone(),
        recorder.clone(),
    );
    let run = {
        let token = shutdown.clone();
        tokio::spawn(async move { consumer.run(token).await })
    };
    eventually(WAIT, "acks", || async {
        cursor(&db, "p", "c").await == Some(2)
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();

    let url = login(&db, "operator").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for args in [
        vec!["status"],
        vec!["audit"],
        vec!["consumers", "list"],
        vec!["dead-letters", "list"],
        vec!["prune", "--retention", "1s"],
        vec![
            "consumers",
            "retire",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--by",
            "ops",
            "--reason",
            "gone",
        ],
    ] {
        let mut all = vec!["--database-url", url.as_str()];
        all.extend_from_slice(&args);
        let (code, out, err) = run_outbox(&all).await;
        assert_eq!(code, 0, "operator: outbox {args:?}: {out}{err}");
    }
    let client = connect(&url).await;
    let pruned: i64 = client
        .query_one_unnamed(
            "SELECT pruned_through FROM outbox.lifecycle_project_heads WHERE project_id = 'p'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(pruned, 2, "the operator pruned");

    refused(
        &client,
        "SELECT outbox.write_task_deleted('p', 'x', now(), 'w', NULL)",
    )
    .await;
    refused(
        &client,
        "INSERT INTO outbox.lifecycle_consumer_positions (project_id, consumer_id, \
         last_acked_sequence) VALUES ('p', 'c', 0)",
    )
    .await;
    refused(
        &client,
        "UPDATE outbox.lifecycle_outbox SET payload = '{}'::jsonb",
    )
    .await;
    refused(
        &client,
        "UPDATE outbox.lifecycle_consumers SET lease_owner = 'me'",
    )
    .await;
}
