//! Per-project row security (`outbox migrate --row-security`): roles bound to project A in
//! `lifecycle_role_projects` cannot read B's events, claim B's consumers, see B's dead
//! letters, or record events for B; their own project works end to end; and their sequencer
//! numbers only their projects and leaves the numbering frontier to one that sees all; an
//! upgrade of a schema under row security switches it on for the tables it adds; another
//! event type stays in its project, and only an operator bound to every project changes the
//! contracts.

use std::time::Duration;

use chrono::Utc;
use outbox_consumer::{Consumer, ConsumerError};
use outbox_core::connect::ConnectSettings;
use outbox_core::migrate::{MIGRATIONS, migrate_with};
use outbox_core::sequencer::Sequencer;
use outbox_core::{Prior, ProjectId, Schema, TaskDeleted, TaskId, Writer, WriterProcessId};
use outbox_tests::consumer_kit::{
    Recorder, cursor, eventually, fast_config, seed_consumer, write_event,
};
use outbox_tests::process_kit::run_outbox;
use outbox_tests::{TestDb, empty_db, fresh_db, legacy, sequenced};
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

/// Creates login role `<db>_<kind>_a`, a member of `outbox_<kind>` bound to project A.
async fn bound_login(db: &TestDb, kind: &str) -> String {
    let role = format!("{}_{kind}_a", db.name);
    db.connect()
        .await
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN IN ROLE \"outbox_{kind}\";
             INSERT INTO outbox.lifecycle_role_projects (role_name, project_id)
             VALUES ('{role}', 'A');"
        ))
        .await
        .unwrap();
    db.url.replacen("postgres@", &format!("{role}@"), 1)
}

async fn record(url: &str, project: &str, task: &str) -> Result<(), outbox_core::Error> {
    let mut client = ConnectSettings::parse(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let tx = client.transaction().await?;
    let event = TaskDeleted::new(
        ProjectId::new(project).unwrap(),
        TaskId::new(task).unwrap(),
        Utc::now(),
        Prior::default(),
    )?;
    Writer::new(&Schema::default(), WriterProcessId::new("w").unwrap())
        .record(&tx, &event)
        .await?;
    tx.commit().await?;
    Ok(())
}

#[tokio::test]
async fn roles_bound_to_a_project_see_and_write_only_that_project() {
    let db = fresh_db().await;
    let (code, out, err) =
        run_outbox(&["--database-url", &db.url, "migrate", "--output", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(report["row_security"], false, "off until turned on: {out}");
    let (code, out, err) =
        run_outbox(&["--database-url", &db.url, "migrate", "--row-security"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("row security is on"), "{out}");
    // A later run without the flag reports the schema's state, not the flag.
    let (code, out, err) =
        run_outbox(&["--database-url", &db.url, "migrate", "--output", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(report["row_security"], true, "{out}");

    // B's history, written and consumed by the owner: events, a consumer, a dead letter.
    for task in ["b1", "b-poison", "b3"] {
        write_event(&db, "B", task).await;
    }
    let owner = Recorder::default();
    owner.fail_task("b-poison");
    let mut config = fast_config("B", "shared");
    config.delivery.retry =
        outbox_consumer::RetrySchedule::new(vec![Duration::from_millis(10)], 1).unwrap();
    let shutdown = CancellationToken::new();
    let run = {
        let consumer = Consumer::new(db.pool(4), None, config, owner.clone(), owner.clone());
        let token = shutdown.clone();
        tokio::spawn(async move { consumer.run(token).await })
    };
    eventually(WAIT, "B consumed past its dead letter", || async {
        cursor(&db, "B", "shared").await == Some(3)
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();

    // Writers of A record for A, and are refused for B.
    let writer = bound_login(&db, "writer").await;
    for task in ["a1", "a2"] {
        record(&writer, "A", task)
            .await
            .expect("A's writer writes A");
    }
    let err = record(&writer, "B", "x")
        .await
        .expect_err("A's writer must not write B");
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{err}");

    // A's consumer: sequences and delivers A (its embedded sequencer numbers A's events).
    let consumer_url = bound_login(&db, "consumer").await;
    let settings = ConnectSettings::parse(&consumer_url).unwrap();
    let mut config = fast_config("A", "a-reader");
    config.duties.prune_interval = None;
    let recorder = Recorder::default();
    let shutdown = CancellationToken::new();
    let run = {
        let consumer = Consumer::new(
            settings.pool(4).unwrap(),
            Some(settings.wire_config()),
            config,
            recorder.clone(),
            recorder.clone(),
        );
        let token = shutdown.clone();
        tokio::spawn(async move { consumer.run(token).await })
    };
    eventually(WAIT, "A delivered to A's consumer", || async {
        recorder.sequences() == vec![1, 2]
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert!(
        recorder
            .events()
            .iter()
            .all(|e| e.project_id.as_str() == "A")
    );

    // It reads none of B's events, consumers or dead letters.
    let client = settings.connect().await.unwrap();
    for (sql, what) in [
        (
            "SELECT count(*) FROM outbox.lifecycle_outbox WHERE project_id = 'B'",
            "events",
        ),
        (
            "SELECT count(*) FROM outbox.lifecycle_consumer_cursors WHERE project_id = 'B'",
            "consumers",
        ),
        (
            "SELECT count(*) FROM outbox.lifecycle_deliveries WHERE project_id = 'B'",
            "dead letters",
        ),
    ] {
        let n: i64 = client.query_one(sql, &[]).await.unwrap().get(0);
        assert_eq!(n, 0, "A's consumer sees B's {what}");
    }

    // It cannot claim B's existing consumer, nor start a new one on B.
    for consumer_id in ["shared", "new-on-b"] {
        let mut config = fast_config("B", consumer_id);
        config.duties.prune_interval = None;
        config.delivery.wait_for_lease = false;
        let recorder = Recorder::default();
        let consumer = Consumer::new(
            settings.pool(4).unwrap(),
            None,
            config,
            recorder.clone(),
            recorder.clone(),
        );
        let result = tokio::time::timeout(WAIT, consumer.run(CancellationToken::new()))
            .await
            .expect("refused promptly");
        let err = result.expect_err("A's consumer must not claim B's consumers");
        let denied = match &err {
            ConsumerError::Database(e) => e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            ConsumerError::Core(e) => e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            _ => false,
        };
        assert!(denied, "{consumer_id}: {err:?}");
        assert!(recorder.events().is_empty());
    }
    // Through the CLI, the refusal names the fix: a binding row, not a grant.
    let (code, _, err) = run_outbox(&[
        "--database-url",
        &consumer_url,
        "consume",
        "--project",
        "B",
        "--consumer-id",
        "new-on-b",
        "--no-wait",
        "--no-sequencer",
        "--no-prune",
    ])
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("add a row") && err.contains("lifecycle_role_projects"),
        "{err}"
    );
    assert!(!err.contains("grant it the role"), "{err}");

    // A's operator lists no dead letter of B, and its status shows only A.
    let operator = bound_login(&db, "operator").await;
    let (code, out, err) = run_outbox(&[
        "--database-url",
        &operator,
        "dead-letters",
        "list",
        "--output",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["dead_letters"], serde_json::json!([]), "{out}");
    let (code, out, err) =
        run_outbox(&["--database-url", &operator, "status", "--output", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    let projects: Vec<&str> = status["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["project_id"].as_str().unwrap())
        .collect();
    assert_eq!(projects, vec!["A"], "{out}");

    // The owner still sees everything.
    let (code, out, _) = run_outbox(&[
        "--database-url",
        &db.url,
        "dead-letters",
        "list",
        "--output",
        "json",
    ])
    .await;
    assert_eq!(code, 0);
    assert!(out.contains("b-poison"), "{out}");
}

/// `outbox <args>` against `url`: (exit code, stdout, stderr).
async fn outbox_at(url: &str, args: &[&str]) -> (i32, String, String) {
    run_outbox(&[&["--database-url", url], args].concat()).await
}

/// Another registered type under row security: a writer bound to A records `task:archived`
/// for A and is refused for B (through SQL and through `Writer::record_event`); A's consumer,
/// declaring it, receives A's archival and never B's; an operator bound to A reads the
/// contracts but may not change them (they are every project's) and is told to bind the role
/// to `*`, which an operator bound to `*` then does.
#[tokio::test]
async fn another_type_stays_in_its_project_and_only_an_operator_of_every_project_changes_contracts()
{
    let db = fresh_db().await;
    let (code, _, err) = outbox_at(&db.url, &["migrate", "--row-security"]).await;
    assert_eq!(code, 0, "{err}");
    let contract = |file: &str| format!("{}/../contracts/{file}", env!("CARGO_MANIFEST_DIR"));
    let archived = contract("task-archived.json");
    let (code, _, err) = outbox_at(&db.url, &["contracts", "add", &archived, "--by", "ops"]).await;
    assert_eq!(code, 0, "{err}");
    let payload = serde_json::json!({"archived_at": "2026-01-02T03:04:05Z", "prior": {}});
    let archive_sql = "SELECT outbox.write_event($1, 'task:archived', 1, $2, $3, 'w')";
    db.connect()
        .await
        .execute(archive_sql, &[&"B", &"b-archived", &payload])
        .await
        .unwrap();

    let writer = bound_login(&db, "writer").await;
    let client = ConnectSettings::parse(&writer)
        .unwrap()
        .connect()
        .await
        .unwrap();
    client
        .execute(archive_sql, &[&"A", &"a-archived", &payload])
        .await
        .expect("A's writer archives in A");
    let refused = client
        .execute(archive_sql, &[&"B", &"x", &payload])
        .await
        .expect_err("A's writer must not archive in B");
    assert_eq!(
        refused.code(),
        Some(&SqlState::INSUFFICIENT_PRIVILEGE),
        "{refused}"
    );
    let event = outbox_core::Event::new(
        ProjectId::new("B").unwrap(),
        "task:archived@1".parse().unwrap(),
        TaskId::new("y").unwrap(),
        outbox_core::Payload::new()
            .timestamp("archived_at", Utc::now())
            .object("prior", outbox_core::Payload::new()),
    )
    .unwrap();
    let refused = Writer::new(&Schema::default(), WriterProcessId::new("w").unwrap())
        .record_event(&client, &event)
        .await
        .expect_err("A's writer must not record B's event");
    assert_eq!(
        refused.code(),
        Some(&SqlState::INSUFFICIENT_PRIVILEGE),
        "{refused}"
    );

    let consumer_url = bound_login(&db, "consumer").await;
    let settings = ConnectSettings::parse(&consumer_url).unwrap();
    let mut config = fast_config("A", "a-reader");
    config.duties.prune_interval = None;
    config.delivery.event_types = "task:deleted@1,task:archived@1".parse().unwrap();
    let recorder = Recorder::default();
    let shutdown = CancellationToken::new();
    let run = {
        let consumer = Consumer::new(
            settings.pool(4).unwrap(),
            Some(settings.wire_config()),
            config,
            recorder.clone(),
            recorder.clone(),
        );
        let token = shutdown.clone();
        tokio::spawn(async move { consumer.run(token).await })
    };
    eventually(WAIT, "A's archival delivered to A's consumer", || async {
        recorder.sequences() == vec![1]
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let events = recorder.events();
    assert_eq!(
        (events[0].project_id.as_str(), events[0].event_type.as_str()),
        ("A", "task:archived")
    );
    assert_eq!(events[0].task_id.as_str(), "a-archived");

    let operator = bound_login(&db, "operator").await;
    let (code, out, err) = outbox_at(&operator, &["contracts", "list", "--output", "json"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("task:archived"), "{out}");
    let restored = contract("task-restored.json");
    for args in [
        vec!["contracts", "add", &restored, "--by", "ops"],
        vec![
            "contracts",
            "deprecate",
            "task:archived@1",
            "--by",
            "ops",
            "--reason",
            "v2",
        ],
    ] {
        let (code, _, err) = outbox_at(&operator, &args).await;
        assert_eq!(code, 1, "{args:?}: {err}");
        let role = format!("{}_operator_a", db.name);
        assert!(
            err.contains("event contracts are shared by every project")
                && err.contains(&format!("('{role}', '*')")),
            "{args:?}: {err}"
        );
    }
    let (code, out, _) = outbox_at(&db.url, &["contracts", "list", "--output", "json"]).await;
    assert_eq!(code, 0);
    assert!(
        !out.contains("task:restored") && !out.contains("deprecated"),
        "{out}"
    );

    let every = format!("{}_ops_all", db.name);
    db.connect()
        .await
        .batch_execute(&format!(
            "CREATE ROLE \"{every}\" LOGIN IN ROLE outbox_operator;
             INSERT INTO outbox.lifecycle_role_projects (role_name, project_id)
             VALUES ('{every}', '*');"
        ))
        .await
        .unwrap();
    let every_url = db.url.replacen("postgres@", &format!("{every}@"), 1);
    let (code, _, err) =
        outbox_at(&every_url, &["contracts", "add", &restored, "--by", "ops"]).await;
    assert_eq!(code, 0, "{err}");
}

/// A sequencer under row security sees only its projects' rows, so it cannot know it took
/// everything: it numbers its own projects' events and stores no frontier. Had it stored one,
/// the events of other projects committed before its tick would sit below that frontier and
/// never be numbered; here a later tick of the owner still numbers them.
#[tokio::test]
async fn a_bound_sequencer_numbers_its_projects_and_leaves_the_frontier_alone() {
    let db = fresh_db().await;
    let (code, _, err) =
        run_outbox(&["--database-url", &db.url, "migrate", "--row-security"]).await;
    assert_eq!(code, 0, "{err}");
    for (project, task) in [("A", "a1"), ("B", "b1"), ("A", "a2"), ("B", "b2")] {
        write_event(&db, project, task).await;
    }
    let bound = bound_login(&db, "consumer").await;
    let mut client = ConnectSettings::parse(&bound)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let numbered = Sequencer::new(&Schema::default())
        .drain(&mut client)
        .await
        .unwrap();
    assert_eq!(numbered, 2, "A's two events only");

    let owner = db.connect().await;
    let frontiers: i64 = owner
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_sequencer_frontier",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(frontiers, 0, "the bound tick stored no frontier");
    let numbered = Sequencer::new(&Schema::default())
        .drain(&mut db.connect().await)
        .await
        .unwrap();
    assert_eq!(numbered, 2, "B's two events, numbered by the owner's tick");
    for project in ["A", "B"] {
        let numbers: Vec<i64> = sequenced(&owner, project)
            .await
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(numbers, vec![1, 2], "{project}");
    }
}

/// A schema already under row security at migration 10 keeps it through migration 11: the new
/// positions table is switched on with the consumers table, so a bound role sees and writes
/// only its projects' positions, and `migrate` reports row security as on.
#[tokio::test]
async fn an_upgrade_under_row_security_switches_it_on_for_the_positions_too() {
    let db = empty_db().await;
    let mut owner = db.connect().await;
    migrate_with(&mut owner, &Schema::default(), &MIGRATIONS[..10])
        .await
        .unwrap();
    // Row security as `migrate --row-security` of a build of migration 10 switched it on.
    for table in [
        "lifecycle_outbox",
        "lifecycle_projects",
        "lifecycle_consumer_cursors",
        "lifecycle_deliveries",
        "lifecycle_audit",
    ] {
        owner
            .batch_execute(&format!(
                "ALTER TABLE outbox.{table} ENABLE ROW LEVEL SECURITY"
            ))
            .await
            .unwrap();
    }
    for (project, task) in [("A", "a1"), ("B", "b1"), ("A", "a2")] {
        write_event(&db, project, task).await;
    }
    legacy::number_from_frontier(&mut owner, 10).await;
    seed_consumer(&db, "A", "c", Some(1), false).await;
    seed_consumer(&db, "B", "c", Some(1), false).await;

    let (code, out, err) =
        run_outbox(&["--database-url", &db.url, "migrate", "--output", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(report["row_security"], true, "{out}");
    let on: bool = owner
        .query_one(
            "SELECT relrowsecurity FROM pg_class \
             WHERE oid = 'outbox.lifecycle_consumer_positions'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(on, "row security on the positions table");

    let bound = bound_login(&db, "consumer").await;
    let client = ConnectSettings::parse(&bound)
        .unwrap()
        .connect()
        .await
        .unwrap();
    for relation in ["lifecycle_consumer_positions", "lifecycle_consumer_cursors"] {
        let projects: Vec<String> = client
            .query(
                &format!("SELECT DISTINCT project_id FROM outbox.{relation}"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(projects, vec!["A".to_string()], "{relation}");
    }
    let err = client
        .execute(
            "INSERT INTO outbox.lifecycle_consumer_positions \
                 (project_id, consumer_id, last_acked_sequence) VALUES ('B', 'c', 5)",
            &[],
        )
        .await
        .expect_err("a position for another project");
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{err}");

    // The bound consumer continues A from its migrated position.
    write_event(&db, "A", "a3").await;
    let mut config = fast_config("A", "c");
    config.duties.prune_interval = None;
    let recorder = Recorder::default();
    let shutdown = CancellationToken::new();
    let runtime = Consumer::new(
        ConnectSettings::parse(&bound).unwrap().pool(4).unwrap(),
        None,
        config,
        recorder.clone(),
        recorder.clone(),
    );
    let token = shutdown.clone();
    let run = tokio::spawn(async move { runtime.run(token).await });
    eventually(WAIT, "the bound consumer to reach A's head", || async {
        cursor(&db, "A", "c").await == Some(3)
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(recorder.sequences(), vec![2, 3]);
    assert_eq!(
        cursor(&db, "B", "c").await,
        Some(1),
        "B's position untouched"
    );
}
