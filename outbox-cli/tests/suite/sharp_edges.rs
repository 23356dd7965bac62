//! Regression tests for the sharp edges a new user hit: a live query of the wrong shape, a
//! closed stdout, a child command that cannot run, orphaned child processes, work after a
//! shutdown signal, and passwords in printed connection strings.

use std::process::Stdio;
use std::time::Duration;

use outbox_tests::consumer_kit::{cursor, eventually, eventually_count, write_event};
use outbox_tests::process_kit::{ConsumeProcess, outbox_binary, run_outbox, send_signal};
use outbox_tests::{TestDb, fresh_db};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

/// Options for a quick consumer of project `p` that starts from the earliest event, retrying
/// every 50 ms up to 3 attempts.
fn quick(consumer: &str) -> Vec<String> {
    quick_with(consumer, "50ms", "3")
}

/// [`quick`] with its own retry delays and attempts.
fn quick_with(consumer: &str, retry_delays: &str, max_attempts: &str) -> Vec<String> {
    [
        "--project",
        "p",
        "--consumer-id",
        consumer,
        "--start-from",
        "earliest",
        "--retry-delays",
        retry_delays,
        "--max-attempts",
        max_attempts,
        "--sequence-interval",
        "10ms",
        "--poll-interval",
        "100ms",
        "--shutdown-grace",
        "30s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Starts `outbox consume` with the given stdout; stderr is collected.
fn spawn_consume(db: &TestDb, args: &[String], stdout: Stdio) -> Child {
    Command::new(outbox_binary())
        .arg("--database-url")
        .arg(&db.url)
        .arg("consume")
        .args(args)
        .env("OUTBOX_LOG", "info")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn outbox consume")
}

/// Waits (bounded) for `child` to exit; returns its code (-1 for a signal) and its stderr.
async fn exit_of(child: &mut Child, within: Duration) -> (i32, String) {
    let mut stderr = child.stderr.take().expect("piped stderr");
    let status = tokio::time::timeout(within, child.wait())
        .await
        .unwrap_or_else(|_| panic!("outbox did not exit within {within:?}"))
        .expect("wait");
    let mut text = String::new();
    let _ = stderr.read_to_string(&mut text).await;
    (status.code().unwrap_or(-1), text)
}

async fn lease_owner(db: &TestDb, consumer: &str) -> Option<String> {
    db.connect()
        .await
        .query_opt(
            "SELECT lease_owner FROM outbox.lifecycle_consumer_cursors \
             WHERE project_id = 'p' AND consumer_id = $1",
            &[&consumer],
        )
        .await
        .unwrap()
        .and_then(|row| row.get(0))
}

async fn delivery_rows(db: &TestDb) -> i64 {
    db.connect()
        .await
        .query_one("SELECT count(*) FROM outbox.lifecycle_deliveries", &[])
        .await
        .unwrap()
        .get(0)
}

/// PIDs of live (non-zombie) processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let output = std::process::Command::new("ps")
        .args(["-eo", "pid=,stat=,args="])
        .output()
        .expect("run ps");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains(marker) && !line.contains("ps -eo"))
        .filter(|line| {
            line.split_whitespace()
                .nth(1)
                .is_some_and(|s| !s.starts_with('Z'))
        })
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_live_query_of_the_wrong_shape_is_a_usage_error_that_holds_nothing() {
    let db = fresh_db().await;
    let client = db.connect().await;
    client
        .execute(
            "INSERT INTO public.tasks (id, project_id) VALUES ('t1', 'p')",
            &[],
        )
        .await
        .unwrap();
    let cases = [
        (
            "SELECT 1 FROM tasks WHERE project_id = $1",
            "its column \"?column?\" is int4",
        ),
        ("SELECT id::text FROM tasks", "exactly one parameter"),
        (
            "SELECT id::text, project_id FROM tasks WHERE project_id = $1",
            "exactly one column",
        ),
        (
            "SELECT id FROM no_such_table WHERE project_id = $1",
            "cannot be prepared",
        ),
        // Queries that write: reconciliation runs the query in a read-only snapshot, where
        // they would fail with what looks like a standby's answer.
        (
            "DELETE FROM tasks WHERE project_id = $1 RETURNING id",
            "it is not a SELECT; a live query must only read",
        ),
        (
            "WITH gone AS (DELETE FROM tasks WHERE project_id = $1 RETURNING id) SELECT id FROM gone",
            "it writes (a data-modifying statement in WITH)",
        ),
        (
            "SELECT id FROM tasks WHERE project_id = $1 FOR UPDATE",
            "it writes (cannot execute SELECT FOR UPDATE in a read-only transaction",
        ),
    ];
    for (query, expected) in cases {
        let (code, _, stderr) = run_outbox(&[
            "consume",
            "--database-url",
            &db.url,
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--live-query",
            query,
        ])
        .await;
        assert_eq!(code, 2, "{query}: {stderr}");
        assert!(
            stderr.contains("invalid --live-query") && stderr.contains(expected),
            "{query}: {stderr:?} lacks {expected:?}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(lease_owner(&db, "c").await, None, "nothing is left held");
    }

    let kept: i64 = client
        .query_one("SELECT count(*) FROM public.tasks", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 1, "the refused queries deleted nothing");

    // The default query, on a database without its `tasks` table, is checked before anything
    // is claimed, as a custom one is: the same usage error, and no consumer registered to hold
    // retention.
    client
        .batch_execute("DROP TABLE public.tasks")
        .await
        .unwrap();
    let (code, _, stderr) = run_outbox(&[
        "consume",
        "--database-url",
        &db.url,
        "--project",
        "p",
        "--consumer-id",
        "d",
    ])
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("the default live query") && stderr.contains("--live-query"),
        "{stderr}"
    );
    assert_eq!(lease_owner(&db, "d").await, None, "the lease was released");
    let registered: i64 = client
        .query_one("SELECT count(*) FROM outbox.lifecycle_consumers", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(registered, 0, "no consumer was registered");
}

#[tokio::test]
async fn a_live_query_whose_function_writes_stops_the_consumer_and_is_no_outage() {
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute(
            "CREATE TABLE public.seen (project text);
             CREATE FUNCTION public.live_tasks(p text) RETURNS SETOF text LANGUAGE sql VOLATILE
                 AS $$ INSERT INTO public.seen VALUES (p) RETURNING p $$;",
        )
        .await
        .unwrap();
    write_event(&db, "p", "t1").await;
    // A new consumer that reconciles first.
    let mut args: Vec<String> = quick("writes")
        .into_iter()
        .map(|a| match a.as_str() {
            "earliest" => "reconcile".to_owned(),
            _ => a,
        })
        .collect();
    args.extend(["--live-query".into(), "SELECT live_tasks($1)".into()]);
    let mut consumer = spawn_consume(&db, &args, Stdio::null());
    let (code, stderr) = exit_of(&mut consumer, Duration::from_secs(20)).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("the live query failed during reconciliation: it tried to write")
            && stderr.contains("a live query must only read"),
        "{stderr}"
    );
    assert!(!stderr.contains("unavailable"), "{stderr}");
    assert_eq!(cursor(&db, "p", "writes").await, None, "nothing reconciled");
}

#[tokio::test]
async fn a_closed_stdout_stops_the_consumer_without_acknowledging_or_parking() {
    let db = fresh_db().await;
    let args = quick("pipe");
    let mut consumer = spawn_consume(&db, &args, Stdio::piped());
    // The reader goes away, as with `| head -0`.
    drop(consumer.stdout.take());
    write_event(&db, "p", "t1").await;
    let (code, stderr) = exit_of(&mut consumer, Duration::from_secs(20)).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cannot write to stdout"), "{stderr}");
    assert!(!stderr.contains("dead letter"), "{stderr}");
    assert_eq!(
        cursor(&db, "p", "pipe").await,
        Some(0),
        "nothing acknowledged"
    );
    assert_eq!(delivery_rows(&db).await, 0, "no failure recorded");
    assert_eq!(
        lease_owner(&db, "pipe").await,
        None,
        "the lease was released"
    );

    // The next run delivers the event.
    let mut next = ConsumeProcess::spawn(
        &db.url,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    eventually(
        Duration::from_secs(20),
        "delivery on the next run",
        || async { next.sequences() == vec![1] },
    )
    .await;
    next.signal("TERM");
    assert_eq!(next.wait().await, 0);
}

#[tokio::test]
async fn a_child_command_that_cannot_run_stops_the_consumer_without_burning_attempts() {
    let db = fresh_db().await;
    write_event(&db, "p", "t1").await;
    let mut args = quick("missing");
    args.extend(["--child".into(), "/nonexistent/child-program --flag".into()]);
    let mut consumer = spawn_consume(&db, &args, Stdio::null());
    let (code, stderr) = exit_of(&mut consumer, Duration::from_secs(20)).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("cannot be run") && stderr.contains("command not found"),
        "{stderr}"
    );
    assert_eq!(delivery_rows(&db).await, 0, "no attempt was charged");
    assert_eq!(cursor(&db, "p", "missing").await, Some(0));
}

#[tokio::test]
async fn a_child_that_prints_a_banner_before_its_first_answer_stops_without_charging_events() {
    let db = fresh_db().await;
    write_event(&db, "p", "t1").await;
    write_event(&db, "p", "t2").await;
    let (_dir, script) = child_script(
        "echo \"child v1 starting\"\nwhile read -r line; do echo '{\"ack\": 1}'; done\n",
    );
    let mut args = quick("banner");
    args.extend(["--child".into(), script]);
    let mut consumer = spawn_consume(&db, &args, Stdio::null());
    let (code, stderr) = exit_of(&mut consumer, Duration::from_secs(20)).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("broke the protocol before its first answer")
            && stderr.contains("child v1 starting"),
        "{stderr}"
    );
    assert_eq!(delivery_rows(&db).await, 0, "no attempt was charged");
    assert_eq!(cursor(&db, "p", "banner").await, Some(0));
    assert_eq!(
        lease_owner(&db, "banner").await,
        None,
        "the lease was released"
    );
}

#[tokio::test]
async fn a_child_that_answered_before_and_then_breaks_the_protocol_fails_that_event() {
    let db = fresh_db().await;
    write_event(&db, "p", "t1").await;
    write_event(&db, "p", "t2").await;
    let (_dir, script) = child_script(
        "read -r line; echo '{\"ack\": 1}'\nwhile read -r line; do echo 'oops'; done\n",
    );
    let mut args = quick_with("garbled", "50ms", "1");
    args.extend(["--child".into(), script]);
    let mut consumer = spawn_consume(&db, &args, Stdio::null());
    let client = db.connect().await;
    eventually(
        Duration::from_secs(20),
        "event 2 parked as child_protocol_error",
        || async {
            client
                .query_opt(
                    "SELECT 1 FROM outbox.lifecycle_deliveries WHERE sequence = 2 \
                     AND state = 'dead' AND last_failure_class = 'child_protocol_error'",
                    &[],
                )
                .await
                .unwrap()
                .is_some()
        },
    )
    .await;
    assert_eq!(cursor(&db, "p", "garbled").await, Some(2));
    send_signal(consumer.id().expect("pid"), "TERM");
    let (code, stderr) = exit_of(&mut consumer, Duration::from_secs(20)).await;
    assert_eq!(code, 0, "{stderr}");
}

/// Writes an executable child script into a fresh directory; returns (dir, script path).
fn child_script(body: &str) -> (tempdir::Dir, String) {
    let dir = tempdir::Dir::new();
    let path = dir.path.join("child.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    let status = std::process::Command::new("chmod")
        .arg("+x")
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success());
    (dir, path.display().to_string())
}

/// A scratch directory removed on drop.
mod tempdir {
    use std::path::PathBuf;

    pub struct Dir {
        pub path: PathBuf,
    }

    impl Dir {
        pub fn new() -> Self {
            let path = std::env::temp_dir().join(format!(
                "outbox-sharp-{}-{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ));
            std::fs::create_dir_all(&path).unwrap();
            Self { path }
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[tokio::test]
async fn a_hanging_child_is_ended_with_its_whole_process_group() {
    let db = fresh_db().await;
    // The script runs a grandchild that ignores SIGTERM and never answers.
    let (dir, script) = child_script(
        "trap '' TERM\nwhile read -r line; do sh -c \"trap '' TERM; sleep 600\" x hang-marker; done\n",
    );
    let marker = dir.path.display().to_string();
    write_event(&db, "p", "t1").await;
    let mut args = quick("hang");
    args.extend([
        "--child".into(),
        script.clone(),
        "--child-timeout".into(),
        "500ms".into(),
        "--child-stop-grace".into(),
        "300ms".into(),
    ]);
    let mut consumer = spawn_consume(&db, &args, Stdio::null());
    let client = db.connect().await;
    eventually_count(
        &client,
        Duration::from_secs(30),
        "the hung event to be parked",
        "SELECT count(*) FROM outbox.lifecycle_deliveries WHERE state = 'dead'",
        1,
    )
    .await;
    // Three timeouts happened; not one of those children is left.
    let left = processes_with(&marker);
    assert!(left.len() <= 1, "ended children linger: {left:?}");
    let hang_left: Vec<String> = processes_with("hang-marker");
    assert!(hang_left.len() <= 1, "grandchildren linger: {hang_left:?}");

    // And shutdown ends the current one.
    send_signal(consumer.id().unwrap(), "TERM");
    let (code, stderr) = exit_of(&mut consumer, Duration::from_secs(20)).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(processes_with(&marker), Vec::<String>::new());
    assert_eq!(processes_with("hang-marker"), Vec::<String>::new());
    let classes: Vec<String> = client
        .query(
            "SELECT last_failure_class FROM outbox.lifecycle_deliveries",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(classes, vec!["child_timeout".to_owned()]);
}

#[tokio::test]
async fn a_child_stop_does_not_wait_for_its_ended_processes_to_be_reaped() {
    // The child's own children, orphaned when it ends, are reaped by whoever adopts them:
    // here this test process, which never does, so they stay zombies for as long as it runs
    // (init may take seconds). Ended processes: the stop must not wait for them.
    nix::sys::prctl::set_child_subreaper(true).expect("become a subreaper");
    let db = fresh_db().await;
    let (_dir, script) =
        child_script("sleep 600 &\nwhile read -r line; do echo '{\"ack\": 1}'; done\n");
    write_event(&db, "p", "t1").await;
    let mut args = quick("orphans");
    args.extend([
        "--child".into(),
        script,
        "--child-stop-grace".into(),
        "60s".into(),
        "--exit-when-caught-up".into(),
    ]);
    let mut consumer = spawn_consume(&db, &args, Stdio::null());
    // Well within the stop grace: a stop that waited for the zombies would take all of it.
    let (code, stderr) = exit_of(&mut consumer, Duration::from_secs(30)).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("caught up; stopping"), "{stderr}");
    assert!(!stderr.contains("outlived SIGTERM"), "{stderr}");
    assert_eq!(cursor(&db, "p", "orphans").await, Some(1));
}

#[tokio::test]
async fn nothing_new_starts_after_a_shutdown_signal() {
    let db = fresh_db().await;
    // A child that dies on every line: the consumer is in its restart backoff most of the time.
    let (_dir, script) = child_script("read -r line; exit 3\n");
    write_event(&db, "p", "t1").await;
    let mut args = quick_with("crashy", "1ms", "1000");
    args.extend(["--child".into(), script]);
    let mut consumer = spawn_consume(&db, &args, Stdio::null());
    let client = db.connect().await;
    let attempts = || async {
        client
            .query_opt("SELECT attempts FROM outbox.lifecycle_deliveries", &[])
            .await
            .unwrap()
            .map_or(0, |row| row.get::<_, i32>(0))
    };
    // Restart backoff doubles from 100 ms: by the fifth attempt the consumer spends seconds
    // between attempts waiting to restart the child, where the signal lands.
    eventually(Duration::from_secs(30), "a few failed attempts", || async {
        attempts().await >= 5
    })
    .await;
    send_signal(consumer.id().unwrap(), "INT");
    let at_signal = attempts().await;
    let (code, stderr) = exit_of(&mut consumer, Duration::from_secs(10)).await;
    assert_eq!(code, 0, "{stderr}");
    let requested = stderr.find("shutdown requested").expect("shutdown logged");
    assert!(
        !stderr[requested..].contains("child process started"),
        "a child was started after the signal: {stderr}"
    );
    let after = attempts().await;
    assert!(
        after <= at_signal + 1,
        "attempts went from {at_signal} to {after} after the signal: {stderr}"
    );
    let dead: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_deliveries WHERE state = 'dead'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dead, 0, "nothing parked after the signal");
}

#[tokio::test]
async fn a_second_signal_ends_at_once_and_the_next_start_takes_the_left_lease_over() {
    let db = fresh_db().await;
    // The child marks the event it is stuck on, so the signal lands while it is in flight.
    let (dir, script) = child_script(
        "trap '' TERM INT\nwhile read -r line; do touch \"$(dirname \"$0\")/in-flight\"; sleep 600; done\n",
    );
    write_event(&db, "p", "t1").await;
    let mut args = quick("stubborn");
    args.extend(["--child".into(), script]);
    let mut consumer = spawn_consume(&db, &args, Stdio::null());
    let marker = dir.path.display().to_string();
    let in_flight = dir.path.join("in-flight");
    eventually(
        Duration::from_secs(20),
        "the child to have the event",
        || async { in_flight.exists() },
    )
    .await;
    let pid = consumer.id().unwrap();
    send_signal(pid, "INT");
    tokio::time::sleep(Duration::from_millis(300)).await;
    send_signal(pid, "INT");
    let (code, stderr) = exit_of(&mut consumer, Duration::from_secs(5)).await;
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("second signal"), "{stderr}");
    assert_eq!(
        cursor(&db, "p", "stubborn").await,
        Some(0),
        "nothing acknowledged"
    );
    eventually(
        Duration::from_secs(5),
        "the child group to be gone",
        || async { processes_with(&marker).is_empty() },
    )
    .await;
    let held = lease_owner(&db, "stubborn")
        .await
        .expect("the lease is left held");
    assert!(held.contains(&format!(":{pid}:")), "{held}");

    // The next start on this host need not wait for the lease of a PID that is gone.
    let mut restart = quick("stubborn");
    restart.extend(["--no-wait".into(), "--exit-when-caught-up".into()]);
    let mut successor = spawn_consume(&db, &restart, Stdio::null());
    let (code, stderr) = exit_of(&mut successor, Duration::from_secs(30)).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("the lease holder no longer exists on this host"),
        "{stderr}"
    );
    assert_eq!(cursor(&db, "p", "stubborn").await, Some(1));
}

#[tokio::test]
async fn a_quoted_password_in_a_key_value_string_is_never_printed() {
    let (code, _, stderr) = run_outbox(&[
        "status",
        "--database-url",
        "host=/nonexistent/socket/dir password='hunter 2' dbname=z connect_timeout=2",
    ])
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("password=***"), "{stderr}");
    assert!(!stderr.contains("hunter"), "{stderr}");
    assert!(!stderr.contains(" 2'"), "{stderr}");
}

#[tokio::test]
async fn version_names_the_commit_the_binary_was_built_from() {
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run git");
    assert!(head.status.success(), "the tests run in a git checkout");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    let (code, stdout, stderr) = run_outbox(&["--version"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout.trim(),
        format!("outbox {} (commit {head})", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test]
async fn a_missing_action_is_answered_with_the_command_that_does_it_not_its_opposite() {
    for (args, wanted) in [
        (
            &["consumers", "unretire"][..],
            "outbox consumers reactivate --project P",
        ),
        (&["consumers", "restore"][..], "--reactivate"),
        (
            &["reactivate"][..],
            "outbox consumers reactivate --project P",
        ),
        (
            &["dead-letters", "unresolve"][..],
            "outbox dead-letters replay",
        ),
    ] {
        let (code, _, stderr) = run_outbox(args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(wanted), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("a similar subcommand exists"),
            "{args:?}: {stderr}"
        );
    }
    // A plain typo still gets clap's spelling tip.
    let (code, _, stderr) = run_outbox(&["consumers", "retir"]).await;
    assert_eq!(code, 2);
    assert!(
        stderr.contains("similar subcommand") && stderr.contains("'retire'"),
        "{stderr}"
    );
}

#[tokio::test]
async fn an_unknown_project_exits_3_in_every_command_that_names_one() {
    let db = fresh_db().await;
    let url = db.url.as_str();
    for command in [
        &["status"][..],
        &["prune"][..],
        &["prune", "--dry-run"][..],
        &["consumers", "list"][..],
        &["dead-letters", "list"][..],
        &["audit"][..],
    ] {
        let mut args = vec!["--database-url", url];
        args.extend_from_slice(command);
        args.extend(["--project", "nowhere"]);
        let (code, out, err) = run_outbox(&args).await;
        assert_eq!(code, 3, "{command:?}: {out}{err}");
        assert_eq!(err, "error: project nowhere not found\n", "{command:?}");
    }
    // A project is known from its first event on, numbered or not: nothing to prune is exit 0.
    db.connect()
        .await
        .execute(
            "INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, \
             deleted_at, writer_process_id, payload_version, payload) VALUES ('fresh', \
             'task:deleted', 'task-deleted:t:2026-01-01T00:00:00.000000Z', 't', now(), 'w', 1, \
             '{}')",
            &[],
        )
        .await
        .unwrap();
    for command in [&["prune"][..], &["consumers", "list"][..], &["audit"][..]] {
        let mut args = vec!["--database-url", url];
        args.extend_from_slice(command);
        args.extend(["--project", "fresh"]);
        let (code, out, err) = run_outbox(&args).await;
        assert_eq!(code, 0, "{command:?}: {out}{err}");
    }
}

#[tokio::test]
async fn under_json_logs_the_final_error_line_is_json_too() {
    let (code, _, stderr) = run_outbox(&[
        "--log-format",
        "json",
        "--database-url",
        "postgresql://nobody@/x?host=/nonexistent-socket-dir",
        "status",
    ])
    .await;
    assert_eq!(code, 1, "{stderr}");
    let last = stderr.lines().last().expect("a final line");
    let line: serde_json::Value = serde_json::from_str(last).expect("the final line is JSON");
    assert_eq!(line["level"], "ERROR", "{last}");
    assert_eq!(line["fields"]["exit_code"], 1, "{last}");
    assert!(
        line["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("cannot connect to")),
        "{last}"
    );
    // Text logs keep the plain form.
    let (_, _, stderr) = run_outbox(&[
        "--database-url",
        "postgresql://nobody@/x?host=/nonexistent-socket-dir",
        "status",
    ])
    .await;
    assert!(
        stderr
            .lines()
            .last()
            .unwrap()
            .starts_with("error: cannot connect to"),
        "{stderr}"
    );
}
