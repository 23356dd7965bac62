//! What a new user meets in the first hour: connecting the way libpq does, errors that name
//! their cause and the next step, and options for scripts.

use std::process::Stdio;
use std::time::Duration;

use outbox_tests::consumer_kit::{cursor, write_event};
use outbox_tests::process_kit::outbox_binary;
use outbox_tests::{TestDb, empty_db, fresh_db};
use tokio::process::Command;
use tokio_postgres::config::Host;

/// Runs `outbox ARGS` with exactly `env` (plus PATH and HOME); returns (code, stdout, stderr).
async fn run_with_env(args: &[&str], env: &[(&str, String)]) -> (i32, String, String) {
    let mut command = Command::new(outbox_binary());
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", "/nonexistent-home")
        .env("OUTBOX_LOG", "info")
        .stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("outbox finished")
        .expect("run outbox");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The libpq variables describing `db`.
fn libpq_env(db: &TestDb) -> Vec<(&'static str, String)> {
    let host = match &db.config.get_hosts()[0] {
        Host::Unix(path) => path.display().to_string(),
        Host::Tcp(name) => name.clone(),
    };
    vec![
        ("PGHOST", host),
        ("PGPORT", db.config.get_ports()[0].to_string()),
        ("PGUSER", db.config.get_user().unwrap().to_owned()),
        ("PGDATABASE", db.name.clone()),
    ]
}

#[tokio::test]
async fn the_libpq_variables_describe_the_database_when_no_url_is_given() {
    let db = fresh_db().await;
    write_event(&db, "p", "t1").await;
    let (code, out, err) = run_with_env(&["status", "--output", "json"], &libpq_env(&db)).await;
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["projects"][0]["project_id"], "p");

    // Nothing at all: a usage error naming every way.
    let (code, _, err) = run_with_env(&["status"], &[]).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("pass --database-url or set DATABASE_URL") && err.contains("PGHOST"),
        "{err}"
    );
}

#[tokio::test]
async fn a_password_file_is_read_and_ignored_when_others_can_read_it() {
    let db = fresh_db().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE outbox_pgpass_user LOGIN PASSWORD 'from-the-file'; \
             EXCEPTION WHEN duplicate_object THEN NULL; END $$; \
             GRANT ALL ON SCHEMA outbox TO outbox_pgpass_user; \
             GRANT ALL ON ALL TABLES IN SCHEMA outbox TO outbox_pgpass_user",
        )
        .await
        .unwrap();
    // The test cluster trusts local connections, so this checks that the file is found and its
    // permission rule honoured; the unit tests of `libpq_env` check the password it supplies.
    let dir = std::env::temp_dir().join(format!("outbox-pgpass-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pgpass");
    std::fs::write(&file, "*:*:*:outbox_pgpass_user:from-the-file\n").unwrap();
    std::process::Command::new("chmod")
        .args(["0644", file.to_str().unwrap()])
        .status()
        .unwrap();
    let mut env = libpq_env(&db);
    env.retain(|(k, _)| *k != "PGUSER");
    env.push(("PGUSER", "outbox_pgpass_user".into()));
    env.push(("PGPASSFILE", file.display().to_string()));
    let (_, _, err) = run_with_env(&["status"], &env).await;
    assert!(
        err.contains("password file has group or world access; ignored"),
        "{err}"
    );
    std::process::Command::new("chmod")
        .args(["0600", file.to_str().unwrap()])
        .status()
        .unwrap();
    let (code, _, err) = run_with_env(&["status"], &env).await;
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("password file"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn database_url_from_the_environment_is_not_a_missing_option() {
    let db = fresh_db().await;
    let (code, _, err) = run_with_env(&["consume"], &[("DATABASE_URL", db.url.clone())]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--project"), "{err}");
    assert!(
        !err.contains("--database-url"),
        "usage must not ask for what DATABASE_URL gives: {err}"
    );
    // An empty OUTBOX_SCHEMA means the default schema.
    let (code, _, err) = run_with_env(
        &["status"],
        &[
            ("DATABASE_URL", db.url.clone()),
            ("OUTBOX_SCHEMA", String::new()),
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
}

#[tokio::test]
async fn connection_failures_name_their_cause() {
    let (code, _, err) = run_with_env(
        &["status", "--database-url", "host=/nonexistent/dir dbname=x"],
        &[],
    )
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no such socket file"), "{err}");
    let (code, _, err) = run_with_env(
        &[
            "status",
            "--database-url",
            "postgresql://u@127.0.0.1:1/x?connect_timeout=2",
        ],
        &[],
    )
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("Connection refused"), "{err}");
    let db = fresh_db().await;
    let missing = outbox_tests::with_dbname(&db.url, "no_such_database");
    let (code, _, err) = run_with_env(&["status", "--database-url", &missing], &[]).await;
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("database \"no_such_database\" does not exist"),
        "{err}"
    );
}

#[tokio::test]
async fn an_unmigrated_schema_says_how_to_fix_it() {
    let db = empty_db().await;
    for args in [
        vec!["status", "--database-url", &db.url],
        vec!["consumers", "list", "--database-url", &db.url],
        vec!["status", "--database-url", &db.url, "--schema", "typo"],
    ] {
        let (code, _, err) = run_with_env(&args, &[]).await;
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains("is not migrated (run `outbox migrate`, or check `--schema`)"),
            "{args:?}: {err}"
        );
    }
}

#[tokio::test]
async fn exit_when_caught_up_stops_at_the_head() {
    let db = fresh_db().await;
    for task in ["a", "b", "c"] {
        write_event(&db, "p", task).await;
    }
    let (code, out, err) = run_with_env(
        &[
            "consume",
            "--database-url",
            &db.url,
            "--project",
            "p",
            "--consumer-id",
            "batch",
            "--start-from",
            "earliest",
            "--exit-when-caught-up",
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let sequences: Vec<i64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["sequence"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(sequences, vec![1, 2, 3], "{out}");
    assert_eq!(cursor(&db, "p", "batch").await, Some(3));
    let acked_at: Option<chrono::DateTime<chrono::Utc>> = db
        .connect()
        .await
        .query_one(
            "SELECT last_acked_at FROM outbox.lifecycle_consumer_cursors \
             WHERE consumer_id = 'batch'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(acked_at.is_some(), "acknowledging records when");
    assert!(
        err.contains(
            "registering new consumer batch of project p; it holds retention until retired"
        ),
        "{err}"
    );
    // A second run has nothing to do, stops at once, and registers nothing.
    let (code, out, err) = run_with_env(
        &[
            "consume",
            "--database-url",
            &db.url,
            "--project",
            "p",
            "--consumer-id",
            "batch",
            "--exit-when-caught-up",
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "");
    assert!(!err.contains("registering new consumer"), "{err}");
}

#[tokio::test]
async fn status_check_exits_0_when_every_code_is_ok() {
    let db = fresh_db().await;
    let (code, out, err) =
        run_with_env(&["status", "--check", "--database-url", &db.url], &[]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("PROJECT"), "{out}");
}

/// A mistyped consumer ID registers a consumer that then holds retention back: `status`
/// says `never_acknowledged` (and `not_running`) once it has stopped and events wait.
#[tokio::test]
async fn a_mistyped_consumer_shows_as_never_acknowledged() {
    let db = fresh_db().await;
    // Run once and stop, before the project has events: registered, reconciled, but no
    // delivery ever acknowledged.
    let (code, _, err) = run_with_env(
        &[
            "consume",
            "--database-url",
            &db.url,
            "--project",
            "p",
            "--consumer-id",
            "dashbaord",
            "--exit-when-caught-up",
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("registering new consumer dashbaord"), "{err}");
    write_event(&db, "p", "a").await;
    write_event(&db, "p", "b").await;
    let (code, _, err) = run_with_env(&["sequence", "--database-url", &db.url], &[]).await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run_with_env(
        &[
            "status",
            "--database-url",
            &db.url,
            "--check",
            "--output",
            "json",
            "--max-heartbeat-age",
            "1ms",
            "--max-unsequenced-age",
            "1h",
        ],
        &[],
    )
    .await;
    assert_eq!(code, 5, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        status["consumers"][0]["health"],
        serde_json::json!(["not_running", "never_acknowledged"]),
        "{out}"
    );
    assert!(
        err.contains("consumer dashbaord of project p: not_running,never_acknowledged"),
        "{err}"
    );
}

/// The limits of the options are in `--help`, not only in the errors that enforce them; a
/// refusal of options that do not fit together names them as typed (a default the user never
/// set as a default); a negative number gets the range, not "unexpected argument".
#[tokio::test]
async fn limits_are_in_help_and_refusals_name_the_flags_as_typed() {
    let help = |args: &'static [&'static str]| async move {
        let (code, out, err) = run_with_env(args, &[]).await;
        assert_eq!(code, 0, "{args:?}: {err}");
        out.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let consume = help(&["consume", "--help"]).await;
    for limit in [
        "Events per batch: 1 to 10000",
        "more, for LISTEN): 3 to 100",
        "Lease length: at least 1s",
        "at most half of --lease-ttl",
        "(at least 500ms)",
        "dead letter: 1 to 1000",
        "0s to 36500 days",
        "greater than zero and at most 24h",
    ] {
        assert!(consume.contains(limit), "consume --help lacks {limit:?}");
    }
    assert!(
        help(&["--help"])
            .await
            .contains("1 to 40 characters from a-z, 0-9 and _")
    );
    assert!(
        help(&["audit", "--help"])
            .await
            .contains("newest first: 1 to 10000")
    );
    assert!(
        help(&["dead-letters", "list", "--help"])
            .await
            .contains("rows: 1 to 10000")
    );
    assert!(
        help(&["prune", "--help"])
            .await
            .contains("per transaction: 1 to 100000")
    );
    assert!(
        help(&["sequence", "--help"])
            .await
            .contains("transaction: 1 to 1000000")
    );
    let verify = help(&["verify", "--help"]).await;
    assert!(verify.contains("in turn): 4 to 10000"), "{verify}");
    assert!(verify.contains("of its own): 1 to 64"), "{verify}");
    assert!(
        help(&["consumers", "retire", "--help"])
            .await
            .contains("at most 200 characters")
    );

    let refused = |args: &'static [&'static str]| async move {
        let (code, out, err) = run_with_env(args, &[]).await;
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        err
    };
    let consume = ["consume", "--project", "p", "--consumer-id", "c"];
    let with = |more: &'static [&'static str]| -> &'static [&'static str] {
        Box::leak([&consume[..], more].concat().into_boxed_slice())
    };
    let err = refused(with(&["--lease-ttl", "5s"])).await;
    assert!(
        err.contains(
            "--heartbeat-interval 10s (the default) must be at most half of --lease-ttl 5s: give \
             --heartbeat-interval 2500ms or less"
        ),
        "{err}"
    );
    let err = refused(with(&["--heartbeat-interval", "40s"])).await;
    assert!(
        err.contains(
            "--heartbeat-interval 40s must be at most half of --lease-ttl 1m (the default)"
        ),
        "{err}"
    );
    let err = refused(with(&[
        "--lease-ttl",
        "500ms",
        "--heartbeat-interval",
        "100ms",
    ]))
    .await;
    assert!(
        err.contains("--lease-ttl 500ms is too short: the lease lasts at least 1s"),
        "{err}"
    );
    let err = refused(with(&["--sequencer-lease-ttl", "100ms"])).await;
    assert!(
        err.contains("--sequencer-lease-ttl 100ms is too short"),
        "{err}"
    );
    let err = refused(&["sequence", "--every", "1s", "--lease-ttl", "100ms"]).await;
    assert!(err.contains("--lease-ttl 100ms is too short"), "{err}");
    let err = refused(with(&["--min-tick-pause", "60ms"])).await;
    assert!(
        err.contains("--min-tick-pause 60ms is longer than --sequence-interval 50ms (the default)"),
        "{err}"
    );
    let err = refused(&["sequence", "--every", "10ms", "--min-tick-pause", "20ms"]).await;
    assert!(
        err.contains("--min-tick-pause 20ms is longer than --every 10ms"),
        "{err}"
    );
    for (args, range) in [
        (
            with(&["--lease-ttl", "-5s"]),
            "must be greater than zero and at most 24h",
        ),
        (with(&["--batch-size", "-1"]), "-1 is not in 1..=10000"),
        (with(&["--pool-size", "-1"]), "-1 is not in 3..=100"),
        (with(&["--max-attempts", "-3"]), "-3 is not in 1..=1000"),
        (&["audit", "--limit", "-1"][..], "-1 is not in 1..=10000"),
        (
            &["dead-letters", "list", "--limit", "-1"][..],
            "-1 is not in 1..=10000",
        ),
        (
            &["prune", "--batch-size", "-1"][..],
            "-1 is not in 1..=100000",
        ),
        (&["status", "--max-lag", "-1"][..], "-1 is not in 0.."),
        (
            &["status", "--retention", "-1s"][..],
            "must be between 0s and 36500 days",
        ),
        (
            &["audit", "--follow-interval", "-1s"][..],
            "must be greater than zero",
        ),
        (
            with(&["--min-tick-pause", "101ms"]),
            "must be between 0s and 100ms",
        ),
        (
            &[
                "serve",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--client-write-interval",
                "2s",
            ][..],
            "must be between 0s and 1s",
        ),
    ] {
        let err = refused(args).await;
        assert!(err.contains(range), "{args:?}: {err}");
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
    }
}
