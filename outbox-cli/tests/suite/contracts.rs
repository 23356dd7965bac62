//! Event contracts: the registry (`outbox contracts`), the SQL and Rust writers of any
//! registered type, consumers that declare the types they understand, the published schemas,
//! and the writer's trace context carried to every observer.

use chrono::{TimeZone, Utc};
use outbox_consumer::{
    Consumer, ConsumerError, HandlerFailure, ObservedEvent, TransactionalHandler,
};
use outbox_core::admin::Admin;
use outbox_core::connect::ConnectSettings;
use outbox_core::contract::Contract;
use outbox_core::{
    Event, Payload, ProjectId, Schema, TaskId, WriteOutcome, Writer, WriterProcessId,
};
use outbox_tests::consumer_kit::{
    PROCESS_WAIT, Recorder, WAIT, cursor, eventually, fast_config, seed_consumer, start,
    write_event,
};
use outbox_tests::process_kit::{ConsumeProcess, outbox_on};
use outbox_tests::serve_kit::{ServeProcess, SseClient};
use outbox_tests::{TestDb, fresh_db};
use std::path::{Path, PathBuf};
use tokio_util::sync::CancellationToken;

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn contracts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../contracts")
}

fn shipped(name: &str) -> String {
    contracts_dir().join(name).display().to_string()
}

/// Writes `text` to a temporary contract file and returns its path.
fn contract_file(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outbox-contracts-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn register(db: &TestDb, name: &str) {
    let (code, out, err) =
        outbox_on(db, &["contracts", "add", &shipped(name), "--by", "ops"]).await;
    assert_eq!(code, 0, "{out}{err}");
}

/// `write_event` on `db`; the event ID or the error's SQLSTATE and message.
async fn write_sql(
    db: &TestDb,
    event_type: &str,
    major: i32,
    subject: &str,
    payload: serde_json::Value,
    traceparent: Option<&str>,
) -> Result<String, (String, String)> {
    let client = db.connect().await;
    client
        .query_one(
            "SELECT outbox.write_event('p', $1, $2, $3, $4, 'w1', $5)",
            &[&event_type, &major, &subject, &payload, &traceparent],
        )
        .await
        .map(|row| row.get(0))
        .map_err(|e| {
            let db = e.as_db_error().expect("a database error");
            (db.code().code().to_owned(), db.message().to_owned())
        })
}

fn archived(at: &str) -> serde_json::Value {
    serde_json::json!({"archived_at": at, "prior": {"column": "todo", "status": "open"}})
}

async fn registry_minor(db: &TestDb, contract: &str) -> i64 {
    let shown = outbox_tests::process_kit::outbox_json(db, &["contracts", "show", contract]).await;
    shown["minor"].as_i64().unwrap()
}

#[tokio::test]
async fn contracts_are_registered_deliberately_and_refused_when_malformed_or_incompatible() {
    let db = fresh_db().await;
    let dir = temp_dir("cli");
    let listed = outbox_tests::process_kit::outbox_json(&db, &["contracts", "list"]).await;
    assert_eq!(listed["contracts"][0]["contract"], "task:deleted@1");
    assert_eq!(listed["contracts"][0]["registered_by"], "migration-16");

    let (code, out, _) = outbox_on(
        &db,
        &[
            "contracts",
            "add",
            &shipped("task-archived.json"),
            "--by",
            "ops",
        ],
    )
    .await;
    assert_eq!(code, 0);
    assert_eq!(out, "registered task:archived@1 (minor 0)\n");
    let (code, out, _) = outbox_on(
        &db,
        &[
            "contracts",
            "add",
            &shipped("task-archived.json"),
            "--by",
            "ops",
        ],
    )
    .await;
    assert_eq!(code, 0);
    assert!(out.contains("already registered"), "{out}");

    let base = std::fs::read_to_string(contracts_dir().join("task-archived.json")).unwrap();
    let variant = |from: &str, to: &str| {
        assert!(base.contains(from), "{from}");
        base.replace(from, to)
            .replace("\"minor\": 0", "\"minor\": 1")
    };
    let refusals: Vec<(String, &str)> = vec![
        ("{".into(), "malformed contract file"),
        (
            base.replace(
                "\"type\": \"identifier\", \"max_length\": 64},\n        \"status\"",
                "\"type\": \"text\"},\n        \"status\"",
            ),
            "no free-text type",
        ),
        (base.replace("task:archived", "Task:Archived"), "noun:verb"),
        (
            variant(
                "\"archived_at\": {\"type\": \"timestamp\", \"required\": true},",
                "\"archived_at\": {\"type\": \"timestamp\", \"required\": true}, \
                     \"reason\": {\"type\": \"enum\", \"values\": [\"done\"], \"required\": true},",
            ),
            "field \"reason\" is added as required",
        ),
        (
            variant(
                "\"column\": {\"type\": \"identifier\", \"max_length\": 64},\n",
                "",
            ),
            "field \"prior.column\" is removed",
        ),
        (
            variant(
                "\"status\": {\"type\": \"identifier\", \"max_length\": 64}",
                "\"status\": {\"type\": \"integer\"}",
            ),
            "field \"prior.status\" is retyped from identifier to integer",
        ),
        (
            base.replace(
                "\"description\": \"A task",
                "\"description\": \"Another task",
            ),
            "minor 0 is registered with other content",
        ),
    ];
    for (index, (text, expected)) in refusals.iter().enumerate() {
        let file = contract_file(&dir, &format!("bad-{index}.json"), text);
        let (code, out, err) = outbox_on(&db, &["contracts", "add", &file, "--by", "ops"]).await;
        assert_eq!(code, 2, "{expected}: {out}{err}");
        assert!(err.contains(expected), "expected {expected:?} in {err}");
        assert!(out.is_empty(), "{out}");
    }
    assert_eq!(
        registry_minor(&db, "task:archived@1").await,
        0,
        "nothing written"
    );

    // A compatible minor: an optional field more.
    let next = contract_file(
        &dir,
        "minor-1.json",
        &variant(
            "\"archived_at\": {\"type\": \"timestamp\", \"required\": true},",
            "\"archived_at\": {\"type\": \"timestamp\", \"required\": true}, \
             \"pinned\": {\"type\": \"boolean\"},",
        ),
    );
    let (code, out, err) = outbox_on(&db, &["contracts", "add", &next, "--by", "ops"]).await;
    assert_eq!(
        (code, out.as_str()),
        (0, "registered task:archived@1 minor 1 (was minor 0)\n"),
        "{err}"
    );

    // Unknown targets and references.
    let (code, _, err) = outbox_on(&db, &["contracts", "show", "task:unknown@1"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("contract task:unknown@1 not found"), "{err}");
    let (code, _, err) = outbox_on(&db, &["contracts", "show", "task:archived"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("name the major version too"), "{err}");

    // Deprecation, then a retirement refused while a consumer has events of the major to
    // handle, allowed once it passed them; the writer then refuses the type.
    let change = |action: &'static str, contract: &'static str| {
        let db = &db;
        async move {
            outbox_on(
                db,
                &[
                    "contracts",
                    action,
                    contract,
                    "--by",
                    "ops",
                    "--reason",
                    "archive v2",
                ],
            )
            .await
        }
    };
    let (code, out, _) = change("deprecate", "task:archived@1").await;
    assert_eq!(
        (code, out.as_str()),
        (0, "task:archived@1 is now deprecated (by ops)\n")
    );
    seed_consumer(&db, "p", "late", Some(0), false).await;
    write_sql(
        &db,
        "task:archived",
        1,
        "t1",
        archived("2026-01-02T03:04:05Z"),
        None,
    )
    .await
    .unwrap();
    let (code, _, err) = change("retire", "task:archived@1").await;
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("consumer late of project p still has events of it"),
        "{err}"
    );
    let (code, out, err) = outbox_on(
        &db,
        &[
            "consume",
            "--project",
            "p",
            "--consumer-id",
            "late",
            "--exit-when-caught-up",
            "--event-types",
            "task:deleted@1,task:archived@1",
            "--sequence-interval",
            "10ms",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    let (code, out, err) = change("retire", "task:archived@1").await;
    assert_eq!(
        (code, out.as_str()),
        (0, "task:archived@1 is now retired (by ops)\n"),
        "{err}"
    );
    let refused = write_sql(
        &db,
        "task:archived",
        1,
        "t2",
        archived("2026-01-02T03:04:05Z"),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(refused.0, "22023");
    assert!(
        refused.1.contains("task:archived@1 is retired"),
        "{}",
        refused.1
    );
    let (code, _, err) = change("retire", "task:deleted@1").await;
    assert_eq!(code, 4);
    assert!(err.contains("deprecate it instead"), "{err}");
    // The already retired major: neither retired nor deprecated again.
    for action in ["retire", "deprecate"] {
        let (code, _, err) = change(action, "task:archived@1").await;
        assert_eq!(code, 4, "{action}: {err}");
        assert!(
            err.contains("is retired, so there is nothing to change"),
            "{action}: {err}"
        );
    }

    // Every change is audited under its kind, with the contract and the operator.
    let trail =
        outbox_tests::process_kit::outbox_json(&db, &["audit", "--kind", "contract-added"]).await;
    let added: Vec<&str> = trail["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["contract"].as_str().unwrap())
        .collect();
    assert_eq!(added, ["task:archived@1", "task:archived@1"], "{trail}");
    for kind in ["contract-deprecated", "contract-retired"] {
        let trail = outbox_tests::process_kit::outbox_json(&db, &["audit", "--kind", kind]).await;
        let entries = trail["audit"].as_array().unwrap();
        assert_eq!(entries.len(), 1, "{kind}: {trail}");
        assert_eq!(entries[0]["actor"], "ops");
        assert_eq!(entries[0]["reason"], "archive v2");
    }
}

#[tokio::test]
async fn the_sql_writer_checks_payloads_against_the_contract_and_writes_once() {
    let db = fresh_db().await;
    register(&db, "task-archived.json").await;
    let first = write_sql(
        &db,
        "task:archived",
        1,
        "t1",
        archived("2026-01-02T05:04:05+02:00"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(first, "task-archived:t1:2026-01-02T03:04:05.000000Z");
    // The same occurrence spelt another way is the same event.
    let again = write_sql(
        &db,
        "task:archived",
        1,
        "t1",
        archived("2026-01-02T03:04:05Z"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(again, first);
    // task:deleted through the generic writer is the original writer's event.
    let deleted = write_sql(
        &db,
        "task:deleted",
        1,
        "t1",
        serde_json::json!({"deleted_at": "2026-01-02T03:04:05Z", "prior": {"column": "todo"}}),
        None,
    )
    .await
    .unwrap();
    let client = db.connect().await;
    let original: String = client
        .query_one(
            "SELECT outbox.write_task_deleted('p', 't1', '2026-01-02T03:04:05Z', 'w2')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(deleted, original);
    let rows: i64 = client
        .query_one("SELECT count(*) FROM outbox.lifecycle_outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 2);

    let field = |name: &str, what: &str| {
        format!("invalid payload for task:archived@1: field \"{name}\": {what}")
    };
    let cases: Vec<(&str, i32, serde_json::Value, Option<&str>, String)> = vec![
        (
            "task:nothing",
            1,
            archived("2026-01-02T03:04:05Z"),
            None,
            "unknown event type task:nothing@1: no contract is registered".into(),
        ),
        (
            "task:archived",
            2,
            archived("2026-01-02T03:04:05Z"),
            None,
            "unknown event type task:archived@2".into(),
        ),
        (
            "task:archived",
            1,
            serde_json::json!({"prior": {}}),
            None,
            field("archived_at", "is required"),
        ),
        (
            "task:archived",
            1,
            serde_json::json!({"archived_at": "2026-01-02T03:04:05Z", "prior": {}, "note": "hello"}),
            None,
            field("note", "not in the contract"),
        ),
        (
            "task:archived",
            1,
            serde_json::json!({"archived_at": 17, "prior": {}}),
            None,
            field("archived_at", "must be an RFC 3339 timestamp"),
        ),
        (
            "task:archived",
            1,
            serde_json::json!({"archived_at": "2026-02-30T00:00:00Z", "prior": {}}),
            None,
            field("archived_at", "\"2026-02-30T00:00:00Z\" is not a date"),
        ),
        (
            "task:archived",
            1,
            serde_json::json!({"archived_at": "2026-01-02T03:04:05Z", "prior": {"column": "in progress"}}),
            None,
            field("prior.column", "only A-Z a-z 0-9 . _ : @ - are allowed"),
        ),
        (
            "task:archived",
            1,
            serde_json::json!({"archived_at": "2026-01-02T03:04:05Z", "prior": {"column": 7}}),
            None,
            field(
                "prior.column",
                "must be an identifier (a string), not number",
            ),
        ),
        (
            "task:archived",
            1,
            serde_json::json!({"archived_at": "2026-01-02T03:04:05Z", "prior": {"column": "x".repeat(65)}}),
            None,
            field("prior.column", "65 characters exceeds the limit of 64"),
        ),
        (
            "task:archived",
            1,
            serde_json::json!([1]),
            None,
            "invalid payload for task:archived@1: must be a JSON object".into(),
        ),
        (
            "task:archived",
            1,
            archived("2026-01-02T03:04:05Z"),
            Some("00-xyz"),
            "invalid traceparent: 6 characters, a version 00 header has 55".into(),
        ),
    ];
    for (event_type, major, payload, traceparent, expected) in cases {
        let (code, message) = write_sql(&db, event_type, major, "t9", payload, traceparent)
            .await
            .unwrap_err();
        assert_eq!(code, "22023", "{message}");
        assert!(
            message.starts_with(&expected),
            "expected {expected:?}, got {message:?}"
        );
    }
    let rows: i64 = client
        .query_one("SELECT count(*) FROM outbox.lifecycle_outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 2, "nothing written by a refused call");
}

#[tokio::test]
async fn the_rust_writer_records_any_registered_type_once_with_its_trace_context() {
    let db = fresh_db().await;
    register(&db, "task-archived.json").await;
    let writer = Writer::new(&Schema::default(), WriterProcessId::new("api-1").unwrap());
    let at = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
    let event = |task: &str| {
        Event::new(
            ProjectId::new("p").unwrap(),
            "task:archived@1".parse().unwrap(),
            TaskId::new(task).unwrap(),
            Payload::new()
                .timestamp("archived_at", at)
                .object("prior", Payload::new().identifier("column", "todo")),
        )
        .unwrap()
        .with_traceparent(TRACEPARENT)
        .unwrap()
    };
    let mut client = db.connect().await;
    let tx = client.transaction().await.unwrap();
    let outcome = writer.record_event(&tx, &event("t1")).await.unwrap();
    assert_eq!(
        outcome,
        WriteOutcome::Recorded {
            event_id: "task-archived:t1:2026-01-02T03:04:05.000000Z".into()
        }
    );
    tx.commit().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let again = writer.record_event(&tx, &event("t1")).await.unwrap();
    assert!(
        matches!(again, WriteOutcome::AlreadyRecorded { .. }),
        "{again:?}"
    );
    tx.commit().await.unwrap();
    // Refused before anything is sent, with the SQL writer's wording.
    let refused = Event::new(
        ProjectId::new("p").unwrap(),
        "task:archived@1".parse().unwrap(),
        TaskId::new("t2").unwrap(),
        Payload::new().object("prior", Payload::new().identifier("column", "in progress")),
    )
    .unwrap_err();
    assert!(
        refused
            .to_string()
            .starts_with("invalid payload for task:archived@1: field \"prior.column\": "),
        "{refused}"
    );
    // Refused by the contract, in the same round trip: nothing written.
    let tx = client.transaction().await.unwrap();
    let unknown_field = Event::new(
        ProjectId::new("p").unwrap(),
        "task:archived@1".parse().unwrap(),
        TaskId::new("t3").unwrap(),
        Payload::new()
            .timestamp("archived_at", at)
            .boolean("pinned", true),
    )
    .unwrap();
    let error = writer.record_event(&tx, &unknown_field).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("field \"pinned\": not in the contract"),
        "{error}"
    );
    drop(tx);
    let stored: (i64, Option<String>) = client
        .query_one(
            "SELECT count(*), max(traceparent) FROM outbox.lifecycle_outbox",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!(stored, (1, Some(TRACEPARENT.to_owned())));
}

/// Events of three types in project `p`: deleted, archived, deleted, restored (sequences 1-4).
async fn mixed_stream(db: &TestDb) {
    register(db, "task-archived.json").await;
    register(db, "task-restored.json").await;
    write_event(db, "p", "t1").await;
    write_sql(
        db,
        "task:archived",
        1,
        "t2",
        archived("2026-01-02T03:04:05Z"),
        Some(TRACEPARENT),
    )
    .await
    .unwrap();
    write_event(db, "p", "t3").await;
    write_sql(
        db,
        "task:restored",
        1,
        "t2",
        serde_json::json!({"restored_at": "2026-01-03T00:00:00Z", "column": "todo"}),
        None,
    )
    .await
    .unwrap();
}

async fn run_to_end(db: &TestDb, consumer: &str, types: &str, recorder: &Recorder, through: i64) {
    let mut config = fast_config("p", consumer);
    config.delivery.event_types = types.parse().unwrap();
    let (shutdown, run) = start(db, config, recorder);
    eventually(WAIT, "the cursor to pass every event", || async {
        cursor(db, "p", consumer).await == Some(through)
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_consumer_receives_only_the_types_it_declares_and_its_cursor_passes_the_rest() {
    let db = fresh_db().await;
    mixed_stream(&db).await;
    let deletes_only = Recorder::default();
    run_to_end(&db, "deletes", "task:deleted@1", &deletes_only, 4).await;
    let seen: Vec<(i64, String)> = deletes_only
        .events()
        .iter()
        .map(|e| (e.sequence, e.event_type.clone()))
        .collect();
    assert_eq!(
        seen,
        [(1, "task:deleted".into()), (3, "task:deleted".into())]
    );

    let all = Recorder::default();
    run_to_end(
        &db,
        "all",
        "task:deleted@1,task:archived@1,task:restored@1",
        &all,
        4,
    )
    .await;
    let events = all.events();
    assert_eq!(
        events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    let archived = &events[1];
    assert_eq!((archived.type_major, archived.type_minor), (1, 0));
    assert_eq!(archived.deleted_at, None);
    assert_eq!(archived.traceparent.as_deref(), Some(TRACEPARENT));
    let payload: serde_json::Value = archived.payload.parse().unwrap();
    assert_eq!(payload["prior"]["column"], "todo");
    let deleted: serde_json::Value = events[0].payload.parse().unwrap();
    assert_eq!(
        deleted["deleted_at"].as_str(),
        Some(outbox_core::event::format_timestamp(events[0].deleted_at.unwrap()).as_str())
    );

    // A transactional handler passes undeclared types too, the trailing one included.
    let db2 = &db;
    let mut config = fast_config("p", "in-tx");
    config.delivery.exit_when_caught_up = true;
    let consumer = Consumer::transactional(
        db2.pool(4),
        Some(db2.config.clone()),
        config,
        CountInTx,
        Recorder::default(),
    );
    let summary = consumer.run(CancellationToken::new()).await.unwrap();
    assert!(summary.delivered >= 2, "{summary:?}");
    assert_eq!(cursor(&db, "p", "in-tx").await, Some(4));
    let counted: i64 = db
        .connect()
        .await
        .query_one("SELECT count(*) FROM handled_in_tx", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(counted, 2, "only the two deletes reached the handler");

    // A declaration naming an unregistered type refuses to start.
    let mut config = fast_config("p", "typo");
    config.delivery.event_types = "task:deleted@1,task:archivd@1".parse().unwrap();
    let consumer = Consumer::new(
        db.pool(4),
        None,
        config,
        Recorder::default(),
        Recorder::default(),
    );
    let error = consumer.run(CancellationToken::new()).await.unwrap_err();
    assert!(matches!(error, ConsumerError::Config(_)), "{error}");
    assert!(
        error
            .to_string()
            .contains("event type task:archivd@1 is not registered"),
        "{error}"
    );
}

/// Counts what it handles in `handled_in_tx`, inside the acknowledging transaction.
struct CountInTx;

impl TransactionalHandler for CountInTx {
    async fn handle(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        event: &ObservedEvent,
    ) -> Result<(), HandlerFailure> {
        tx.batch_execute("CREATE TABLE IF NOT EXISTS handled_in_tx (event_id text PRIMARY KEY)")
            .await
            .map_err(|_| HandlerFailure::from(outbox_consumer::FailureClass::handler_error()))?;
        tx.execute("INSERT INTO handled_in_tx VALUES ($1)", &[&event.event_id])
            .await
            .map_err(|_| HandlerFailure::from(outbox_consumer::FailureClass::handler_error()))?;
        Ok(())
    }
}

#[tokio::test]
async fn an_undeclared_major_is_parked_at_once_and_replayed_after_the_declaration_names_it() {
    let db = fresh_db().await;
    mixed_stream(&db).await;
    // Version 2 of the archive contract, registered beside version 1.
    let dir = temp_dir("major");
    let v2 = std::fs::read_to_string(contracts_dir().join("task-archived.json"))
        .unwrap()
        .replace("\"major\": 1", "\"major\": 2");
    let file = contract_file(&dir, "v2.json", &v2);
    let (code, out, err) = outbox_on(&db, &["contracts", "add", &file, "--by", "ops"]).await;
    assert_eq!(code, 0, "{out}{err}");

    let recorder = Recorder::default();
    run_to_end(
        &db,
        "v2-reader",
        "task:deleted@1,task:archived@2",
        &recorder,
        4,
    )
    .await;
    assert_eq!(recorder.sequences(), [1, 3]);
    let client = db.connect().await;
    let parked = client
        .query_one(
            "SELECT state, attempts, last_failure_class FROM outbox.lifecycle_deliveries \
             WHERE consumer_id = 'v2-reader'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(parked.get::<_, String>(0), "dead");
    assert_eq!(
        parked.get::<_, i32>(1),
        1,
        "no retry schedule for a contract mismatch"
    );
    assert_eq!(parked.get::<_, String>(2), "contract_mismatch");

    // The operator asks for a replay; the consumer, upgraded to declare major 1, gets it.
    let (code, out, err) = outbox_on(
        &db,
        &[
            "dead-letters",
            "replay",
            "--project",
            "p",
            "--consumer-id",
            "v2-reader",
            "--sequence",
            "2",
            "--by",
            "ops",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let upgraded = Recorder::default();
    let mut config = fast_config("p", "v2-reader");
    config.delivery.event_types = "task:deleted@1,task:archived@1,task:archived@2"
        .parse()
        .unwrap();
    let (shutdown, run) = start(&db, config, &upgraded);
    eventually(WAIT, "the replay", || async {
        !upgraded.events().is_empty()
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let replayed = &upgraded.events()[0];
    assert!(replayed.replay);
    assert_eq!(
        (replayed.sequence, replayed.event_type.as_str()),
        (2, "task:archived")
    );
    let state: String = client
        .query_one(
            "SELECT state FROM outbox.lifecycle_deliveries WHERE consumer_id = 'v2-reader'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "replayed");
}

#[tokio::test]
async fn the_type_version_payload_and_trace_context_reach_lines_children_and_sse_clients() {
    let db = fresh_db().await;
    mixed_stream(&db).await;
    let types = "task:deleted@1,task:archived@1,task:restored@1";
    // The NDJSON line.
    let (code, out, err) = outbox_on(
        &db,
        &[
            "consume",
            "--project",
            "p",
            "--consumer-id",
            "lines",
            "--start-from",
            "earliest",
            "--event-types",
            types,
            "--exit-when-caught-up",
            "--sequence-interval",
            "10ms",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[1]["event_type"], "task:archived");
    assert_eq!(lines[1]["type_major"], 1);
    assert_eq!(lines[1]["type_minor"], 0);
    assert_eq!(lines[1]["traceparent"], TRACEPARENT);
    assert_eq!(lines[1]["payload"]["archived_at"], "2026-01-02T03:04:05Z");
    assert!(lines[1].get("deleted_at").is_none());
    assert!(lines[0].get("traceparent").is_none());

    // The child protocol: the same line on the child's stdin.
    let dir = temp_dir("child");
    let seen = dir.join("seen.ndjson");
    let child = format!(
        "while IFS= read -r line; do printf '%s\\n' \"$line\" >> {}; \
         seq=$(printf '%s' \"$line\" | sed -n 's/.*\"sequence\":\\([0-9]*\\).*/\\1/p'); \
         [ -n \"$seq\" ] && printf '{{\"ack\": %s}}\\n' \"$seq\"; done",
        seen.display()
    );
    let mut process = ConsumeProcess::spawn(
        &db.url,
        &[
            "--project",
            "p",
            "--consumer-id",
            "child",
            "--start-from",
            "earliest",
            "--event-types",
            types,
            "--child",
            &child,
            "--sequence-interval",
            "10ms",
            "--poll-interval",
            "100ms",
        ],
    );
    eventually(
        PROCESS_WAIT,
        "the child to acknowledge everything",
        || async { cursor(&db, "p", "child").await == Some(4) },
    )
    .await;
    process.signal("TERM");
    assert_eq!(process.wait().await, 0, "{}", process.stderr());
    let child_lines: Vec<serde_json::Value> = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &serde_json::Value| l.get("sequence").is_some())
        .collect();
    let archived = child_lines
        .iter()
        .find(|l| l["sequence"] == 2)
        .expect("event 2 reached the child");
    assert_eq!(archived["traceparent"], TRACEPARENT);
    assert_eq!(archived["event_type"], "task:archived");
    assert_eq!(archived["payload"]["prior"]["status"], "open");

    // SSE: `event:` is the type; the data carries the trace context.
    let server = ServeProcess::start(
        &db.url,
        &[
            "--project",
            "p",
            "--consumer-id",
            "sse",
            "--event-types",
            types,
            "--sequence-interval",
            "10ms",
            "--start-from",
            "earliest",
        ],
    )
    .await;
    eventually(
        PROCESS_WAIT,
        "the server's consumer to pass every event",
        || async { cursor(&db, "p", "sse").await == Some(4) },
    )
    .await;
    let client = SseClient::open(server.addr, "/v1/projects/p/events?after=0", &[]).await;
    eventually(WAIT, "four SSE events", || async {
        client.events().len() >= 4
    })
    .await;
    let events = client.events();
    let names: Vec<&str> = events.iter().map(|m| m.event.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "task:deleted",
            "task:archived",
            "task:deleted",
            "task:restored"
        ]
    );
    assert_eq!(events[1].json()["traceparent"], TRACEPARENT);

    // A server of the default declaration sends deletes only, live or from history.
    let deletes_only = ServeProcess::start(
        &db.url,
        &[
            "--project",
            "p",
            "--consumer-id",
            "sse-deletes",
            "--sequence-interval",
            "10ms",
            "--start-from",
            "earliest",
        ],
    )
    .await;
    eventually(
        PROCESS_WAIT,
        "the second server's consumer to pass every event",
        || async { cursor(&db, "p", "sse-deletes").await == Some(4) },
    )
    .await;
    let from_history =
        SseClient::open(deletes_only.addr, "/v1/projects/p/events?after=0", &[]).await;
    eventually(WAIT, "two SSE events", || async {
        from_history.events().len() >= 2
    })
    .await;
    write_event(&db, "p", "t5").await;
    eventually(WAIT, "the live delete", || async {
        from_history.events().len() >= 3
    })
    .await;
    let sequences: Vec<i64> = from_history
        .events()
        .iter()
        .filter_map(|m| m.sequence())
        .collect();
    assert_eq!(sequences, [1, 3, 5]);
}

#[tokio::test]
async fn published_json_schemas_accept_the_golden_payloads_and_refuse_broken_ones() {
    let db = fresh_db().await;
    register(&db, "task-archived.json").await;
    register(&db, "task-restored.json").await;
    let (code, out, err) =
        outbox_on(&db, &["contracts", "export", "--format", "json-schema"]).await;
    assert_eq!(code, 0, "{err}");
    let document: serde_json::Value = serde_json::from_str(&out).unwrap();
    let schemas = document["schemas"].as_array().unwrap();
    assert_eq!(schemas.len(), 3);
    let golden = serde_json::json!({
        "task:archived@1": [
            {"archived_at": "2026-01-02T03:04:05Z", "prior": {"column": "todo", "status": "open"}},
            {"archived_at": "2026-01-02T03:04:05.123456+02:00", "prior": {}}],
        "task:deleted@1": [
            {"deleted_at": "2026-01-02T03:04:05.000000Z", "prior": {"column": "todo"}},
            {"deleted_at": "2026-01-02T03:04:05Z"}],
        "task:restored@1": [
            {"restored_at": "2026-01-03T00:00:00Z", "column": "doing", "status": "open"}],
    });
    let broken = serde_json::json!({
        "task:archived@1": [
            {"prior": {}},
            {"archived_at": "yesterday", "prior": {}},
            {"archived_at": "2026-01-02T03:04:05Z", "prior": {"column": "in progress"}},
            {"archived_at": "2026-01-02T03:04:05Z", "prior": {}, "note": "free text"}],
        "task:deleted@1": [{"deleted_at": "2026-01-02T03:04:05Z", "prior": {"owner": "x"}}],
        "task:restored@1": [{"restored_at": "2026-01-03T00:00:00Z"}],
    });
    for schema in schemas {
        assert!(
            jsonschema::meta::is_valid(schema),
            "not a valid JSON Schema: {schema}"
        );
        let validator = jsonschema::validator_for(schema).unwrap();
        let title = schema["title"].as_str().unwrap();
        let contract = title.rsplit_once('.').unwrap().0;
        for payload in golden[contract].as_array().unwrap() {
            assert!(validator.is_valid(payload), "{contract} refused {payload}");
        }
        for payload in broken[contract].as_array().unwrap() {
            assert!(
                !validator.is_valid(payload),
                "{contract} accepted {payload}"
            );
        }
        // Every golden payload is also what the SQL writer accepts.
        let (event_type, major) = contract.split_once('@').unwrap();
        for (index, payload) in golden[contract].as_array().unwrap().iter().enumerate() {
            write_sql(
                &db,
                event_type,
                major.parse().unwrap(),
                &format!("g{index}"),
                payload.clone(),
                None,
            )
            .await
            .unwrap_or_else(|e| panic!("{contract}: {payload}: {e:?}"));
        }
    }

    let (code, out, _) = outbox_on(&db, &["contracts", "export", "--format", "asyncapi"]).await;
    assert_eq!(code, 0);
    let asyncapi: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(asyncapi["asyncapi"], "3.0.0");
    assert_eq!(
        asyncapi["channels"]["nats_task_archived"]["address"],
        "lifecycle.{project}.task_archived"
    );
    let message = &asyncapi["components"]["messages"]["task_archived_v1"];
    assert_eq!(
        message["headers"]["properties"]["ce-type"]["const"],
        "task:archived"
    );
    let payload_schema = &message["payload"]["properties"]["payload"];
    assert!(jsonschema::meta::is_valid(payload_schema));

    // The registry shows a contract as its file describes it.
    let shown =
        outbox_tests::process_kit::outbox_json(&db, &["contracts", "show", "task:restored@1"])
            .await;
    let file: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(contracts_dir().join("task-restored.json")).unwrap(),
    )
    .unwrap();
    let again = Contract::from_json(&file.to_string()).unwrap();
    assert_eq!(shown["fields"], again.fields_json());
    assert_eq!(shown["identity"], file["identity"]);
    let mut client = db.connect().await;
    let listed = Admin::new(&Schema::default())
        .contracts(&mut client)
        .await
        .unwrap();
    assert_eq!(listed.len(), 3);
}

/// The writer's generated check (`payload_is_valid`) never accepts what the field-by-field
/// check refuses: random payloads for `task:archived@1` and `task:restored@1`, each field
/// valid, broken, null or missing, sometimes with a stranger key, judged by both.
#[tokio::test]
async fn the_generated_check_never_accepts_a_payload_the_full_check_refuses() {
    use rand::Rng;
    use rand::seq::IndexedRandom;
    let db = fresh_db().await;
    register(&db, "task-archived.json").await;
    register(&db, "task-restored.json").await;
    let client = db.connect().await;
    let timestamps = [
        "2026-01-02T03:04:05Z",
        "2026-02-30T00:00:00Z",
        "2000-01-01T00:30:00+01:00",
        "2026-01-31T23:59:59.123456-05:00",
        "1999-12-31T23:59:59Z",
        "2026-13-01T00:00:00Z",
        "yesterday",
        "2026-01-02 03:04:05Z",
    ];
    let identifiers = ["todo", "in progress", "", "x:y@z.1-2", "é"];
    let long = "a".repeat(65);
    let mut rng = rand::rng();
    let mut accepted_fast = 0;
    for round in 0..400 {
        // Most values are valid, so that whole payloads often are too.
        let mut value = |valid: serde_json::Value| -> Option<serde_json::Value> {
            match rng.random_range(0..12) {
                0 => None,
                1 => Some(serde_json::Value::Null),
                2 => Some(serde_json::json!(*identifiers.choose(&mut rng).unwrap())),
                3 => Some(serde_json::json!(*timestamps.choose(&mut rng).unwrap())),
                4 => {
                    let odd = [
                        serde_json::json!(1),
                        serde_json::json!({"a": 2}),
                        serde_json::json!(3.5),
                        serde_json::json!(true),
                        serde_json::json!(long.clone()),
                    ];
                    Some(odd[rng.random_range(0..odd.len())].clone())
                }
                _ => Some(valid),
            }
        };
        let (contract, mut payload) = if round % 2 == 0 {
            let mut prior = serde_json::Map::new();
            for key in ["column", "status"] {
                if let Some(v) = value(serde_json::json!("todo")) {
                    prior.insert(key.into(), v);
                }
            }
            let mut payload = serde_json::Map::new();
            if let Some(v) = value(serde_json::json!("2026-01-02T03:04:05Z")) {
                payload.insert("archived_at".into(), v);
            }
            if let Some(v) = value(serde_json::Value::Object(prior)) {
                payload.insert("prior".into(), v);
            }
            ("task:archived", payload)
        } else {
            let mut payload = serde_json::Map::new();
            for (key, valid) in [
                (
                    "restored_at",
                    serde_json::json!("2026-01-03T00:00:00+02:00"),
                ),
                ("column", serde_json::json!("doing")),
                ("status", serde_json::json!("open")),
            ] {
                if let Some(v) = value(valid) {
                    payload.insert(key.into(), v);
                }
            }
            ("task:restored", payload)
        };
        if rng.random_range(0..8) == 0 {
            payload.insert("note".into(), serde_json::json!("free text"));
        }
        let payload = serde_json::Value::Object(payload);
        let fast: Option<bool> = client
            .query_one(
                "SELECT outbox.payload_is_valid($2, 1, $1)",
                &[&payload, &contract],
            )
            .await
            .unwrap()
            .get(0);
        let full = client
            .execute(
                "SELECT outbox.check_fields($2 || '@1', '', fields, $1) \
                 FROM outbox.lifecycle_event_contracts WHERE event_type = $2 AND major = 1",
                &[&payload, &contract],
            )
            .await;
        if fast == Some(true) {
            accepted_fast += 1;
            assert!(
                full.is_ok(),
                "the generated check accepted {payload}, the full check: {full:?}"
            );
        }
    }
    assert!(
        accepted_fast >= 20,
        "too few valid payloads drawn ({accepted_fast}) to mean anything"
    );
}

/// The writer's generated check follows the registry, written anew by the schema owner's
/// trigger whenever it changes: an operator, who may not create functions, registers a type
/// and a new minor, and the check takes both; a retired major leaves it. A field name outside
/// the rule (which could carry SQL into the generated text) is refused by the trigger, and
/// nothing is written.
#[tokio::test]
async fn the_generated_check_follows_the_registry_and_runs_no_operator_text() {
    use outbox_tests::process_kit::run_outbox;
    let db = fresh_db().await;
    let owner = db.connect().await;
    let role = format!("{}_operator", db.name);
    owner
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN IN ROLE \"outbox_operator\""
        ))
        .await
        .unwrap();
    let operator_url = db.url.replacen("postgres@", &format!("{role}@"), 1);
    let body = || async {
        let row = owner
            .query_one(
                "SELECT prosrc FROM pg_proc WHERE oid = 'outbox.payload_is_valid'::regproc",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, String>(0)
    };
    let valid = |contract: &'static str, major: i32, payload: serde_json::Value| {
        let owner = &owner;
        async move {
            owner
                .query_one(
                    "SELECT outbox.payload_is_valid($1, $2, $3)",
                    &[&contract, &major, &payload],
                )
                .await
                .unwrap()
                .get::<_, Option<bool>>(0)
        }
    };
    let archived_at = "2026-01-02T03:04:05Z";
    assert!(!body().await.contains("task:archived"));
    assert_eq!(
        valid("task:archived", 1, archived(archived_at)).await,
        Some(false)
    );

    let add = |file: String| {
        let url = operator_url.clone();
        async move {
            run_outbox(&[
                "--database-url",
                &url,
                "contracts",
                "add",
                &file,
                "--by",
                "ops",
            ])
            .await
        }
    };
    let (code, out, err) = add(shipped("task-archived.json")).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        body()
            .await
            .contains("WHEN event_type = 'task:archived' AND major = 1")
    );
    assert_eq!(
        valid("task:archived", 1, archived(archived_at)).await,
        Some(true)
    );

    // A new minor adds an optional field: the check takes it at once.
    let dir = temp_dir("generated-check");
    let mut minor: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shipped("task-archived.json")).unwrap())
            .unwrap();
    minor["minor"] = 1.into();
    minor["fields"]["archived_by"] = serde_json::json!({"type": "identifier", "max_length": 64});
    let file = contract_file(&dir, "archived-1.json", &minor.to_string());
    let (code, out, err) = add(file).await;
    assert_eq!(code, 0, "{out}{err}");
    let mut with_by = archived(archived_at);
    with_by["archived_by"] = "ops-7".into();
    assert_eq!(valid("task:archived", 1, with_by).await, Some(true));

    // A name the rule refuses never reaches the generated text, even when written to the
    // registry directly with the operator's rights.
    let operator = ConnectSettings::parse(&operator_url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let before = body().await;
    let err = operator
        .batch_execute(
            "INSERT INTO outbox.lifecycle_event_contracts \
                 (event_type, major, minor, description, identity, fields, registered_by) \
             VALUES ('task:moved', 1, 0, 'd', '{}', \
                 '{\"x'') OR pg_sleep(1) IS NULL OR (''\": {\"type\": \"boolean\"}}', 'ops')",
        )
        .await
        .expect_err("a field name outside the rule is refused");
    let db_err = err.as_db_error().expect("a database error");
    assert_eq!(db_err.code().code(), "22023", "{db_err:?}");
    assert!(
        db_err.message().contains("invalid contract: field name"),
        "{db_err:?}"
    );
    assert_eq!(body().await, before);
    assert!(
        owner
            .query_opt(
                "SELECT 1 FROM outbox.lifecycle_event_contracts WHERE event_type = 'task:moved'",
                &[],
            )
            .await
            .unwrap()
            .is_none()
    );

    // Retired: the branch is gone (and the writer refuses the type by its registry row).
    let (code, out, err) = run_outbox(&[
        "--database-url",
        &operator_url,
        "contracts",
        "retire",
        "task:archived@1",
        "--by",
        "ops",
        "--reason",
        "test",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(!body().await.contains("task:archived"));
}

/// With lanes, as with one: an undeclared type passes without a call, an undeclared major
/// is parked at once.
#[tokio::test]
async fn lanes_pass_undeclared_types_and_park_undeclared_majors() {
    let db = fresh_db().await;
    mixed_stream(&db).await;
    let recorder = Recorder::default();
    let mut config = fast_config("p", "laned");
    config.delivery.lanes = 4;
    config.delivery.event_types = "task:deleted@1,task:restored@2".parse().unwrap();
    let dir = temp_dir("lanes");
    let v2 = std::fs::read_to_string(contracts_dir().join("task-restored.json"))
        .unwrap()
        .replace("\"major\": 1", "\"major\": 2");
    let file = contract_file(&dir, "restored-v2.json", &v2);
    let (code, out, err) = outbox_on(&db, &["contracts", "add", &file, "--by", "ops"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let (shutdown, run) = start(&db, config, &recorder);
    eventually(WAIT, "the cursor to pass every event", || async {
        cursor(&db, "p", "laned").await == Some(4)
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let mut seen = recorder.sequences();
    seen.sort();
    assert_eq!(seen, [1, 3], "only the deletes reach the handler");
    let parked: (i64, String, i32) = db
        .connect()
        .await
        .query_one(
            "SELECT sequence, last_failure_class, attempts FROM outbox.lifecycle_deliveries \
             WHERE consumer_id = 'laned' AND state = 'dead'",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .unwrap();
    assert_eq!(parked, (4, "contract_mismatch".into(), 1));
}

/// Every message the relay publishes carries the CloudEvents binary-mode headers and, when
/// the writer passed one, its trace context (other types, on subjects of their own: see
/// `relay_types.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_publishes_cloudevents_headers_and_the_trace_context() {
    use outbox_tests::nats_kit::{NatsServer, read_stream, spawn_relay};
    let db = fresh_db().await;
    let client = db.connect().await;
    let traced: String = client
        .query_one(
            "SELECT outbox.write_task_deleted('p', 't1', now(), 'w1', NULL, $1)",
            &[&TRACEPARENT],
        )
        .await
        .unwrap()
        .get(0);
    let plain = write_event(&db, "p", "t2").await;
    let nats = NatsServer::start().await;
    let url = nats.url();
    let common = [
        "--project",
        "p",
        "--consumer-id",
        "jet",
        "--nats-url",
        url.as_str(),
        "--stream",
        "CE_p",
        "--start-from",
        "earliest",
        "--poll-interval",
        "100ms",
    ];
    let mut relay = spawn_relay(&db.url, &common);
    eventually(PROCESS_WAIT, "the relay to publish both events", || async {
        cursor(&db, "p", "jet").await == Some(2)
    })
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
    let messages = read_stream(&nats.jetstream().await, "CE_p").await;
    assert_eq!(messages.len(), 2);
    let first = &messages[0].headers;
    for (name, value) in [
        ("ce-specversion", "1.0"),
        ("ce-id", traced.as_str()),
        ("ce-source", "urn:lifecycle-outbox:project:p"),
        ("ce-type", "task:deleted"),
        ("ce-subject", "t1"),
        ("ce-sequence", "00000000000000000001"),
        (
            "ce-dataschema",
            "urn:lifecycle-outbox:contract:task:deleted:1",
        ),
        ("traceparent", TRACEPARENT),
    ] {
        assert_eq!(
            first.get(name).map(String::as_str),
            Some(value),
            "{name}: {first:?}"
        );
    }
    assert_eq!(
        first.get("ce-time"),
        Some(&messages[0].body["occurred_at"].as_str().unwrap().to_owned())
    );
    assert_eq!(messages[0].body["traceparent"], TRACEPARENT);
    let second = &messages[1].headers;
    assert_eq!(second.get("ce-id"), Some(&plain));
    assert_eq!(
        second.get("ce-sequence").map(String::as_str),
        Some("00000000000000000002")
    );
    assert!(!second.contains_key("traceparent"), "{second:?}");
}
