//! The writer: atomic with the caller's transaction, idempotent, strict about its input, and
//! identical in its Rust and SQL faces.

use chrono::{DateTime, TimeDelta, Utc};
use outbox_core::event::ValidationError;
use outbox_core::internal::observe;
use outbox_core::{
    Error, Prior, ProjectId, Schema, TaskDeleted, TaskId, WriteOutcome, Writer, WriterProcessId,
};
use outbox_tests::fresh_db;
use serde_json::json;
use tokio_postgres::Client;

fn writer() -> Writer {
    Writer::new(&Schema::default(), WriterProcessId::new("api-1").unwrap())
}

fn event(project: &str, task: &str, at: DateTime<Utc>) -> TaskDeleted {
    TaskDeleted::new(
        ProjectId::new(project).unwrap(),
        TaskId::new(task).unwrap(),
        at,
        Prior {
            column: Some("todo".into()),
            status: Some("open".into()),
        },
    )
    .unwrap()
}

async fn count(client: &Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM outbox.lifecycle_outbox", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn repeated_delete_records_once() {
    let db = fresh_db().await;
    let mut client = db.connect().await;
    let e = event("p1", "FN-1", Utc::now());
    let tx = client.transaction().await.unwrap();
    let first = writer().record(&tx, &e).await.unwrap();
    assert_eq!(
        first,
        WriteOutcome::Recorded {
            event_id: e.event_id()
        }
    );
    tx.commit().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let second = writer().record(&tx, &e).await.unwrap();
    assert_eq!(
        second,
        WriteOutcome::AlreadyRecorded {
            event_id: e.event_id()
        }
    );
    tx.commit().await.unwrap();
    assert_eq!(count(&client).await, 1);
}

#[tokio::test]
async fn concurrent_identical_deletes_record_once() {
    let db = fresh_db().await;
    let mut a = db.connect().await;
    let mut b = db.connect().await;
    let e = event("p1", "FN-2", Utc::now());
    let tx_a = a.transaction().await.unwrap();
    assert!(matches!(
        writer().record(&tx_a, &e).await.unwrap(),
        WriteOutcome::Recorded { .. }
    ));
    // The second transaction blocks on the first one's unique key until it commits.
    let e2 = e.clone();
    let second = tokio::spawn(async move {
        let tx_b = b.transaction().await.unwrap();
        let outcome = writer().record(&tx_b, &e2).await.unwrap();
        tx_b.commit().await.unwrap();
        outcome
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        !second.is_finished(),
        "the second writer waits for the first"
    );
    tx_a.commit().await.unwrap();
    assert!(matches!(
        second.await.unwrap(),
        WriteOutcome::AlreadyRecorded { .. }
    ));
    assert_eq!(count(&db.connect().await).await, 1);
}

#[tokio::test]
async fn concurrent_identical_deletes_first_rolls_back() {
    let db = fresh_db().await;
    let mut a = db.connect().await;
    let mut b = db.connect().await;
    let e = event("p1", "FN-3", Utc::now());
    let tx_a = a.transaction().await.unwrap();
    writer().record(&tx_a, &e).await.unwrap();
    let e2 = e.clone();
    let second = tokio::spawn(async move {
        let tx_b = b.transaction().await.unwrap();
        let outcome = writer().record(&tx_b, &e2).await.unwrap();
        tx_b.commit().await.unwrap();
        outcome
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    tx_a.rollback().await.unwrap();
    assert!(matches!(
        second.await.unwrap(),
        WriteOutcome::Recorded { .. }
    ));
    assert_eq!(count(&db.connect().await).await, 1);
}

#[tokio::test]
async fn event_commits_and_rolls_back_with_the_delete() {
    let db = fresh_db().await;
    let mut client = db.connect().await;
    client
        .batch_execute("INSERT INTO tasks (id, project_id) VALUES ('FN-4', 'p1'), ('FN-5', 'p1')")
        .await
        .unwrap();
    for (task, commit) in [("FN-4", false), ("FN-5", true)] {
        let tx = client.transaction().await.unwrap();
        let at: DateTime<Utc> = tx
            .query_one(
                "UPDATE tasks SET deleted_at = now() WHERE id = $1 RETURNING deleted_at",
                &[&task],
            )
            .await
            .unwrap()
            .get(0);
        writer().record(&tx, &event("p1", task, at)).await.unwrap();
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }
    let rows = client
        .query("SELECT task_id FROM outbox.lifecycle_outbox", &[])
        .await
        .unwrap();
    let tasks: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(tasks, vec!["FN-5".to_owned()]);
    let live: i64 = client
        .query_one("SELECT count(*) FROM tasks WHERE deleted_at IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(live, 1, "the rolled-back delete left its task alive");
}

#[tokio::test]
async fn rust_and_sql_writers_write_identical_rows() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let at = Utc::now() - TimeDelta::seconds(3);
    writer()
        .record(&client, &event("p1", "FN-rust", at))
        .await
        .unwrap();
    let sql_id: String = client
        .query_one(
            "SELECT outbox.write_task_deleted('p1', 'FN-sql', $1, 'api-1', \
             '{\"column\": \"todo\", \"status\": \"open\"}')",
            &[&at],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(sql_id, event("p1", "FN-sql", at).event_id());
    let rows = client
        .query(
            "SELECT project_id, event_type, replace(event_id, task_id, ''), deleted_at, \
                    writer_process_id, payload_version, payload, sequence \
             FROM outbox.lifecycle_outbox ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    let describe = |r: &tokio_postgres::Row| {
        format!(
            "{} {} {} {} {} {} {} {:?}",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, String>(2),
            r.get::<_, DateTime<Utc>>(3),
            r.get::<_, String>(4),
            r.get::<_, i32>(5),
            r.get::<_, serde_json::Value>(6),
            r.get::<_, Option<i64>>(7),
        )
    };
    assert_eq!(describe(&rows[0]), describe(&rows[1]));
    assert_eq!(rows[0].get::<_, String>(1), "task:deleted");
    assert_eq!(
        rows[0].get::<_, Option<i64>>(7),
        None,
        "the writer never numbers"
    );
    // The SQL face is idempotent too.
    let again: String = client
        .query_one(
            "SELECT outbox.write_task_deleted('p1', 'FN-sql', $1, 'api-1')",
            &[&at],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(again, sql_id);
    assert_eq!(count(&client).await, 2);
}

#[tokio::test]
async fn writer_refuses_inside_observed_dispatch() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let e = event("p1", "FN-6", Utc::now());
    let err = observe(writer().record(&client, &e)).await.unwrap_err();
    assert!(matches!(err, Error::WriteInsideObservedDispatch));
    assert_eq!(count(&client).await, 0);
}

/// One bad input, as both faces receive it.
struct Case {
    project: &'static str,
    task: String,
    writer: &'static str,
    ahead: TimeDelta,
    prior: serde_json::Value,
}

fn base() -> Case {
    Case {
        project: "p1",
        task: "FN-7".into(),
        writer: "api-1",
        ahead: TimeDelta::zero(),
        prior: json!({"column": "todo"}),
    }
}

fn rust_validate(case: &Case) -> Result<TaskDeleted, String> {
    let project = ProjectId::new(case.project).map_err(|e| e.to_string())?;
    let task = TaskId::new(case.task.clone()).map_err(|e| e.to_string())?;
    WriterProcessId::new(case.writer).map_err(|e| e.to_string())?;
    let prior = Prior::from_json(&case.prior).map_err(|e| e.to_string())?;
    TaskDeleted::new(project, task, Utc::now() + case.ahead, prior).map_err(|e| e.to_string())
}

#[tokio::test]
async fn each_bad_input_gets_the_same_specific_error_in_rust_and_sql() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let cases: Vec<(Case, &str)> = vec![
        (
            Case {
                project: "",
                ..base()
            },
            "invalid project_id: must not be empty",
        ),
        (
            Case {
                task: "x".repeat(129),
                ..base()
            },
            "invalid task_id: 129 characters exceeds the limit of 128",
        ),
        (
            Case {
                task: "FN\u{7}8".into(),
                ..base()
            },
            "invalid task_id: control character at position 3",
        ),
        (
            Case {
                task: "FN 8".into(),
                ..base()
            },
            "invalid task_id: character \" \" at position 3 is not allowed (allowed: A-Z a-z 0-9 . _ : @ -)",
        ),
        (
            Case {
                writer: "",
                ..base()
            },
            "invalid writer_process_id: must not be empty",
        ),
        (
            Case {
                ahead: TimeDelta::days(30),
                ..base()
            },
            "is more than 5 minutes in the future",
        ),
        (
            Case {
                prior: json!("todo"),
                ..base()
            },
            "invalid prior: must be a JSON object",
        ),
        (
            Case {
                prior: json!({"column": "todo", "note": "free text"}),
                ..base()
            },
            "invalid prior: unknown key \"note\" (known keys: column, status)",
        ),
        (
            Case {
                prior: json!({"status": {"nested": true}}),
                ..base()
            },
            "invalid prior.status: must be a string",
        ),
        (
            Case {
                prior: json!({"column": "x".repeat(65)}),
                ..base()
            },
            "invalid prior.column: 65 characters exceeds the limit of 64",
        ),
    ];
    for (case, expected) in &cases {
        let rust = rust_validate(case).expect_err(expected);
        assert!(rust.contains(expected), "rust: {rust:?} lacks {expected:?}");
        let at = Utc::now() + case.ahead;
        let sql = client
            .query_one(
                "SELECT outbox.write_task_deleted($1, $2, $3, $4, $5)",
                &[&case.project, &case.task, &at, &case.writer, &case.prior],
            )
            .await
            .expect_err(expected);
        let db_error = sql.as_db_error().expect("a server error");
        assert_eq!(db_error.code().code(), "22023");
        assert!(
            db_error.message().contains(expected),
            "sql: {:?} lacks {expected:?}",
            db_error.message()
        );
        if !expected.starts_with("is more") {
            assert_eq!(db_error.message(), rust, "one contract, one message");
        }
    }
    assert_eq!(count(&client).await, 0, "nothing was written");
    // A valid case passes both.
    rust_validate(&base()).unwrap();
    assert!(matches!(
        rust_validate(&Case { ahead: TimeDelta::days(1), ..base() }).unwrap_err(),
        ref m if m.contains("future")
    ));
    let _ = ValidationError::PriorNotObject;
    // The limits themselves pass both faces: 128 characters per identifier, 64 per prior value.
    let longest = Case {
        project: "p1",
        task: "x".repeat(128),
        writer: "api-1",
        ahead: TimeDelta::zero(),
        prior: json!({"column": "c".repeat(64), "status": "s".repeat(64)}),
    };
    rust_validate(&longest).unwrap();
    client
        .query_one(
            "SELECT outbox.write_task_deleted($1, $2, now(), $3, $4)",
            &[
                &longest.project,
                &longest.task,
                &longest.writer,
                &longest.prior,
            ],
        )
        .await
        .unwrap();
    assert_eq!(count(&client).await, 1);
}

/// Every NULL argument of the SQL writer is a 22023 naming that argument, never a NOT NULL
/// violation naming a column.
#[tokio::test]
async fn sql_writer_names_each_null_argument() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let cases = [
        (
            "SELECT outbox.write_task_deleted(NULL, 'T', now(), 'w', NULL)",
            "invalid project_id: must not be empty",
        ),
        (
            "SELECT outbox.write_task_deleted('p1', NULL, now(), 'w', NULL)",
            "invalid task_id: must not be empty",
        ),
        (
            "SELECT outbox.write_task_deleted('p1', 'T', NULL, 'w', NULL)",
            "invalid deleted_at: must not be null",
        ),
        (
            "SELECT outbox.write_task_deleted('p1', 'T', now(), NULL, NULL)",
            "invalid writer_process_id: must not be empty",
        ),
        (
            "SELECT outbox.write_task_deleted('p1', 'T', now(), 'w', '{\"column\": null}')",
            "invalid prior.column: must be a string",
        ),
        (
            "SELECT outbox.write_task_deleted('p1', 'T', now(), 'w', '[]')",
            "invalid prior: must be a JSON object",
        ),
    ];
    for (statement, expected) in cases {
        let err = client.query_one(statement, &[]).await.expect_err(statement);
        let db_error = err.as_db_error().expect("a server error");
        assert_eq!(db_error.code().code(), "22023", "{statement}: {db_error:?}");
        assert_eq!(db_error.message(), expected, "{statement}");
    }
    assert_eq!(count(&client).await, 0, "nothing was written");
}

/// A `deleted_at` before 2000-01-01T00:00:00Z, or an infinity, is a 22023 naming the problem
/// in the SQL writer and a validation error in the Rust writer; the bound itself is accepted.
#[tokio::test]
async fn both_writers_bound_deleted_at_below() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let cases = [
        (
            "1999-12-31 23:59:59.999999+00",
            "invalid deleted_at: 1999-12-31T23:59:59.999999Z is before 2000-01-01T00:00:00Z",
        ),
        (
            "1900-01-01 00:00:00+00",
            "invalid deleted_at: 1900-01-01T00:00:00.000000Z is before 2000-01-01T00:00:00Z",
        ),
        (
            "4000-01-01 00:00:00+00 BC",
            "invalid deleted_at: 4000-01-01T00:00:00.000000Z BC is before 2000-01-01T00:00:00Z",
        ),
        (
            "-infinity",
            "invalid deleted_at: -infinity is not a finite time",
        ),
        (
            "infinity",
            "invalid deleted_at: infinity is not a finite time",
        ),
    ];
    for (at, expected) in cases {
        let err = client
            .query_one(
                "SELECT outbox.write_task_deleted('p1', 'T', $1::text::timestamptz, 'w', NULL)",
                &[&at],
            )
            .await
            .expect_err(at);
        let db_error = err.as_db_error().expect("a server error");
        assert_eq!(db_error.code().code(), "22023", "{at}: {db_error:?}");
        assert_eq!(db_error.message(), expected, "{at}");
    }
    assert_eq!(count(&client).await, 0, "nothing was written");

    let early: DateTime<Utc> = "1999-12-31T23:59:59.999999Z".parse().unwrap();
    let rust = TaskDeleted::new(
        ProjectId::new("p1").unwrap(),
        TaskId::new("T").unwrap(),
        early,
        Prior::default(),
    )
    .unwrap_err();
    assert_eq!(rust.to_string(), cases[0].1, "one contract, one message");

    client
        .query_one(
            "SELECT outbox.write_task_deleted('p1', 'T', '2000-01-01 00:00:00+00', 'w', NULL)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(count(&client).await, 1, "the bound itself is a valid time");
}
