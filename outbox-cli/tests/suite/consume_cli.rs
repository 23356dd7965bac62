//! `outbox consume` as a user types it: bad input, exit codes, the child-process sink and its
//! metrics.

use std::time::Duration;

use outbox_tests::consumer_kit::{
    SeedCursor, cursor, eventually, eventually_count, seed_consumer, write_event,
};
use outbox_tests::fresh_db;
use outbox_tests::process_kit::{ConsumeProcess, outbox_binary, run_outbox};
use outbox_tests::serve_kit::{Metrics, free_port, get};
use outbox_tests::stats_kit::{
    SMALL_PROJECT, assert_the_counters_move, event_table_reads, stale_statistics,
};

#[tokio::test]
async fn usage_errors_exit_2_with_a_clear_message() {
    let db = fresh_db().await;
    let url = db.url.as_str();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["consume", "--database-url", url, "--project", "p"],
            "--consumer-id",
        ),
        (
            vec!["consume", "--database-url", url, "--consumer-id", "c"],
            "--project",
        ),
        (
            vec![
                "consume",
                "--database-url",
                url,
                "--project",
                "p",
                "--consumer-id",
                "bad id",
            ],
            "invalid consumer_id: character \" \" at position 4",
        ),
        (
            vec![
                "consume",
                "--database-url",
                url,
                "--project",
                "",
                "--consumer-id",
                "c",
            ],
            "invalid project_id: must not be empty",
        ),
        (
            vec![
                "consume",
                "--database-url",
                url,
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--lease-ttl",
                "5 parsecs",
            ],
            "invalid duration",
        ),
        (
            vec![
                "consume",
                "--database-url",
                url,
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--poll-interval",
                "0s",
            ],
            "must be greater than zero",
        ),
        (
            vec![
                "consume",
                "--database-url",
                url,
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--lease-ttl",
                "1y",
            ],
            "invalid duration \"1y\": at most 24h",
        ),
        (
            vec![
                "consume",
                "--database-url",
                url,
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--lease-ttl",
                "-1s",
            ],
            "invalid duration \"-1s\": must be greater than zero and at most 24h",
        ),
        (
            vec![
                "consume",
                "--database-url",
                url,
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--retry-delays",
                "1s,99999999999d",
            ],
            "invalid duration \"99999999999d\"",
        ),
        (
            vec![
                "consume",
                "--database-url",
                url,
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--lease-ttl",
                "10s",
                "--heartbeat-interval",
                "9s",
            ],
            "--heartbeat-interval 9s must be at most half of --lease-ttl 10s",
        ),
        (
            vec![
                "consume",
                "--database-url",
                url,
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--batch-size",
                "0",
            ],
            "--batch-size",
        ),
        (
            vec!["consume", "--project", "p", "--consumer-id", "c"],
            "pass --database-url or set DATABASE_URL",
        ),
        (
            vec![
                "consume",
                "--database-url",
                "postgresql://u:hunter2@db:notaport/x",
                "--project",
                "p",
                "--consumer-id",
                "c",
            ],
            "invalid database URL postgresql://u:***@db:notaport/x",
        ),
    ];
    for (args, expected) in cases {
        let (code, _, stderr) = run_outbox(&args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: {stderr:?} lacks {expected:?}"
        );
        assert!(!stderr.contains("hunter2"), "passwords are never printed");
    }
}

#[tokio::test]
async fn an_unreachable_database_is_waited_for_until_give_up_after_naming_the_redacted_url() {
    let (code, _, stderr) = run_outbox(&[
        "consume",
        "--database-url",
        "postgresql://app:hunter2@127.0.0.1:1/db?connect_timeout=2",
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--give-up-after",
        "1s",
    ])
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("giving up"), "{stderr}");
    assert!(stderr.contains("app:***@127.0.0.1:1"), "{stderr}");
    assert!(!stderr.contains("hunter2"));
}

#[tokio::test]
async fn no_wait_refuses_a_held_lease_with_exit_4() {
    let db = fresh_db().await;
    let args = [
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--start-from",
        "earliest",
    ];
    let mut holder = ConsumeProcess::spawn(&db.url, &args);
    eventually(Duration::from_secs(10), "the holder's claim", || async {
        cursor(&db, "p", "c").await.is_some()
    })
    .await;
    let (code, _, stderr) = run_outbox(&[
        "consume",
        "--database-url",
        &db.url,
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--no-wait",
    ])
    .await;
    assert_eq!(code, 4, "{stderr}");
    assert!(
        stderr.contains("consumer c of project p is held by"),
        "{stderr}"
    );
    holder.signal("TERM");
    assert_eq!(holder.wait().await, 0);
}

#[tokio::test]
async fn reactivating_an_unknown_consumer_is_refused_with_exit_3_and_creates_nothing() {
    let db = fresh_db().await;
    let args = [
        "consume",
        "--database-url",
        &db.url,
        "--project",
        "p",
        "--consumer-id",
        "nobody",
        "--reactivate",
    ];
    let refused = run_outbox(&args);
    // A consumer it registered would run until stopped.
    let (code, _, stderr) = tokio::time::timeout(Duration::from_secs(20), refused)
        .await
        .expect("refused at once, not started");
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("consumer nobody of project p does not exist"),
        "{stderr}"
    );
    let rows: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_consumer_cursors WHERE consumer_id = 'nobody'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "the refused consumer was registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_grace_bounds_a_slow_live_query_and_cancels_it_on_the_server() {
    let db = fresh_db().await;
    // Far longer than the grace: without the bound, the stop waits for the whole query.
    let slow = "SELECT $1::text FROM pg_sleep(3600)";
    let running = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND state = 'active' AND query LIKE '%pg_sleep(3600)%' \
                   AND pid <> pg_backend_pid()";
    let client = db.connect().await;
    let mut process = ConsumeProcess::spawn(
        &db.url,
        &[
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--live-query",
            slow,
            "--shutdown-grace",
            "1s",
        ],
    );
    eventually_count(
        &client,
        Duration::from_secs(10),
        "the live query to run on the server",
        running,
        1,
    )
    .await;
    process.signal("INT");
    let code = tokio::time::timeout(Duration::from_secs(20), process.wait())
        .await
        .unwrap_or_else(|_| panic!("still reconciling after SIGINT: {}", process.stderr()));
    assert_eq!(code, 0, "{}", process.stderr());
    assert!(
        process
            .stderr()
            .contains("shutdown grace ran out while reading the live set"),
        "{}",
        process.stderr()
    );
    assert_eq!(cursor(&db, "p", "c").await, None, "nothing was reconciled");
    // The abandoned query was cancelled, not left running to its end on the server.
    eventually_count(
        &client,
        Duration::from_secs(20),
        "no backend still running the abandoned live query",
        running,
        0,
    )
    .await;
}

/// Runs `outbox --database-url URL consume ARGS` from `sh`, with its stdout redirected by
/// `redirect` (`>&-` closes it); returns (exit code, stderr).
async fn consume_redirected(url: &str, args: &[&str], redirect: &str) -> (i32, String) {
    let output = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("exec \"$0\" \"$@\" {redirect}"))
        .arg(outbox_binary())
        .args(["--database-url", url, "consume"])
        .args(args)
        .env("OUTBOX_LOG", "info")
        .stdin(std::process::Stdio::null())
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), output)
        .await
        .expect("outbox consume stops by itself")
        .expect("run sh");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_stdout_closed_at_start_is_refused_and_dev_null_chosen_on_purpose_is_not() {
    let db = fresh_db().await;
    write_event(&db, "p", "t1").await;
    let lone = [
        "--project",
        "p",
        "--consumer-id",
        "closed",
        "--start-from",
        "earliest",
        "--exit-when-caught-up",
    ];
    let set = [
        "--all-projects",
        "--consumer-id",
        "closed",
        "--exit-when-caught-up",
    ];
    for args in [&lone[..], &set[..]] {
        let (code, stderr) = consume_redirected(&db.url, args, ">&-").await;
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains("stdout was closed when outbox consume started")
                && stderr.contains(">/dev/null"),
            "{args:?}: {stderr}"
        );
    }
    let registered: i64 = db
        .connect()
        .await
        .query_one("SELECT count(*) FROM outbox.lifecycle_consumers", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(registered, 0, "nothing registered, nothing acknowledged");

    // Discarding the lines on purpose: the user's own redirection is honoured.
    let (code, stderr) = consume_redirected(&db.url, &lone, ">/dev/null").await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("delivered=1"), "{stderr}");
    assert_eq!(cursor(&db, "p", "closed").await, Some(1));
}

#[tokio::test]
async fn help_of_live_query_shows_the_default_query() {
    let (code, out, err) = run_outbox(&["consume", "--help"]).await;
    assert_eq!(code, 0, "{err}");
    let flattened = out.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flattened.contains(outbox_consumer::config::DEFAULT_LIVE_QUERY),
        "{out}"
    );
}

/// A child that acknowledges every event except those of task `poison`, and dies once on the
/// first event of task `crash`.
const CHILD: &str = r#"
while IFS= read -r line; do
  seq=$(printf '%s' "$line" | sed -n 's/.*"sequence":\([0-9]*\).*/\1/p')
  case "$line" in
    *'"task_id":"poison"'*) printf '{"fail": %s, "class": "poison_pill"}\n' "$seq" ;;
    *'"task_id":"crash"'*'"attempt":1,'*|*'"attempt":1,'*'"task_id":"crash"'*) exit 3 ;;
    *) printf '{"ack": %s}\n' "$seq" ;;
  esac
done
"#;

#[tokio::test]
async fn child_sink_retries_parks_the_poison_event_and_survives_a_crashing_child() {
    let db = fresh_db().await;
    for task in ["a", "crash", "poison", "b"] {
        write_event(&db, "p", task).await;
    }
    let mut consumer = ConsumeProcess::spawn(
        &db.url,
        &[
            "--project",
            "p",
            "--consumer-id",
            "child",
            "--start-from",
            "earliest",
            "--child",
            CHILD,
            "--retry-delays",
            "50ms,100ms",
            "--max-attempts",
            "10",
            "--sequence-interval",
            "10ms",
            "--poll-interval",
            "100ms",
        ],
    );
    eventually(
        Duration::from_secs(20),
        "the stream to pass the poison event",
        || async { cursor(&db, "p", "child").await == Some(4) },
    )
    .await;
    consumer.signal("TERM");
    assert_eq!(consumer.wait().await, 0, "{}", consumer.stderr());
    assert!(
        consumer.lines().is_empty(),
        "with --child nothing goes to stdout"
    );

    let client = db.connect().await;
    let rows = client
        .query(
            "SELECT event_id, state, attempts, last_failure_class FROM outbox.lifecycle_deliveries",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        rows.len(),
        1,
        "the crash was retried and succeeded; only the poison is left"
    );
    assert!(rows[0].get::<_, String>(0).contains(":poison:"));
    assert_eq!(rows[0].get::<_, String>(1), "dead");
    assert_eq!(rows[0].get::<_, i32>(2), 10, "exactly ten attempts");
    assert_eq!(rows[0].get::<_, String>(3), "poison_pill");
    let audits: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_audit \
             WHERE kind = 'lifecycle-observation:consumer-poisoned' AND count = 10",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(audits, 1);
    assert!(consumer.stderr().contains("child process started"));
}

/// The gauges a consumer with `--metrics-addr` samples every poll interval count the
/// unsequenced backlog from the work list, however stale the statistics: never by scanning the
/// whole event table.
#[tokio::test]
async fn the_gauges_read_the_work_list_under_stale_statistics() {
    let db = fresh_db().await;
    stale_statistics(&db).await;
    seed_consumer(&db, SMALL_PROJECT, "c", SeedCursor::Head, false).await;
    let before = event_table_reads(&db).await;
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let mut consumer = ConsumeProcess::spawn(
        &db.url,
        &[
            "--project",
            SMALL_PROJECT,
            "--consumer-id",
            "c",
            "--poll-interval",
            "100ms",
            "--no-prune",
            "--metrics-addr",
            &metrics_addr,
        ],
    );
    let addr: std::net::SocketAddr = metrics_addr.parse().unwrap();
    eventually(Duration::from_secs(20), "sampled gauges", || async move {
        let Ok((200, _, body)) = get(addr, "/metrics", &[]).await else {
            return false;
        };
        let metrics = Metrics::parse(&body);
        metrics.get("outbox_unsequenced_events", &[]) == Some(0.0)
            && metrics.get(
                "outbox_consumer_lag_events",
                &[("project", SMALL_PROJECT), ("consumer", "c")],
            ) == Some(0.0)
    })
    .await;
    // A few more samples.
    tokio::time::sleep(Duration::from_millis(300)).await;
    consumer.signal("TERM");
    assert_eq!(consumer.wait().await, 0, "{}", consumer.stderr());
    let after = event_table_reads(&db).await;
    assert_eq!(
        after.seq_scans, before.seq_scans,
        "the gauges scanned the event table: {before:?} then {after:?}"
    );
    assert_the_counters_move(&db, after).await;
}
