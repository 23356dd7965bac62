//! `outbox relay nats` against a real nats-server with JetStream: every committed event lands
//! in the stream exactly once and in per-project order, read back with the Rust client, across
//! kill -9 of the relay under live writers, a nats-server restart and a PostgreSQL restart; a
//! refused publish follows the retry schedule into a dead letter that `dead-letters replay`
//! then publishes; a stream deleted while the relay runs is created again; bad input exits 2.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::stream::Config as StreamConfig;
use outbox_tests::cluster_kit::{PrivateCluster, try_write};
use outbox_tests::consumer_kit::{cursor, eventually, write_event};
use outbox_tests::nats_kit;
use outbox_tests::nats_kit::{
    NatsServer, Server, assert_exactly_once_in_order, consume_durable, read_stream, with_server,
};
use outbox_tests::process_kit::{OutboxProcess, run_outbox};
use outbox_tests::{TestDb, fresh_db, sequenced};
use rand::Rng;
use tokio_postgres::Config;

const PROJECTS: [&str; 2] = ["p1", "p2"];

/// Relay options tuned for tests: fast lease takeover after kill -9, fast retries, short
/// publish timeout.
fn relay_args(nats: &str, project: &str, consumer: &str, stream: &str) -> Vec<String> {
    [
        "--project",
        project,
        "--consumer-id",
        consumer,
        "--nats-url",
        nats,
        "--stream",
        stream,
        "--start-from",
        "earliest",
        "--lease-ttl",
        "2s",
        "--heartbeat-interval",
        "300ms",
        "--poll-interval",
        "100ms",
        "--retry-delays",
        "100ms,200ms,400ms",
        "--max-attempts",
        "1000",
        "--publish-timeout",
        "1s",
        "--nats-connect-timeout",
        "1s",
        "--max-in-flight",
        "64",
        "--shutdown-grace",
        "2s",
        "--no-prune",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn spawn_relay(url: &str, nats: &str, project: &str, stream: &str) -> OutboxProcess {
    let args = relay_args(nats, project, &format!("relay-{project}"), stream);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    nats_kit::spawn_relay(url, &args)
}

/// Writers committing events to every project until `stop`; each tolerates a database that
/// is away (a write whose outcome is unknown is simply not counted: the check reads what
/// committed).
fn start_writers(config: &Config, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
    PROJECTS
        .iter()
        .flat_map(|project| (0..2).map(move |w| (project, w)))
        .map(|(project, w)| {
            let (config, stop) = (config.clone(), stop.clone());
            let project = project.to_string();
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    if try_write(&config, &project, &format!("{project}-w{w}-{i}"))
                        .await
                        .is_err()
                    {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect()
}

/// Each project's stream: the stream fence wants a stream per relay.
fn stream_of(stream: &str, project: &str) -> String {
    format!("{stream}_{project}")
}

/// Waits until every committed event is sequenced and acknowledged by its relay, then checks
/// each project's stream (see `stream_of`) against the database.
async fn check_stream(config: &Config, nats: &NatsServer, stream: &str) {
    let client = outbox_tests::connect(config).await;
    eventually(
        Duration::from_secs(60),
        "every committed event sequenced and acknowledged",
        || async {
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence IS NULL), \
                            (SELECT count(*) FROM outbox.lifecycle_project_heads h \
                             LEFT JOIN outbox.lifecycle_consumer_cursors c \
                               ON c.project_id = h.project_id \
                             WHERE c.last_acked_sequence IS DISTINCT FROM h.head_sequence)",
                    &[],
                )
                .await;
            matches!(row, Ok(row) if row.get::<_, i64>(0) == 0 && row.get::<_, i64>(1) == 0)
        },
    )
    .await;
    let js = nats.jetstream().await;
    for project in PROJECTS {
        let stream = stream_of(stream, project);
        let messages = read_stream(&js, &stream).await;
        let expected = sequenced(&client, project).await;
        assert!(
            expected.len() > 50,
            "{project}: only {} events written",
            expected.len()
        );
        assert_exactly_once_in_order(&messages, "lifecycle", project, &expected);
        assert_eq!(messages.len(), expected.len(), "nothing else in {stream}");

        // A downstream service's durable consumer sees the same: in order, once.
        let delivered = consume_durable(
            &js,
            &stream,
            "downstream",
            &format!("lifecycle.{project}.task_deleted"),
            expected.len(),
        )
        .await;
        let got: Vec<i64> = delivered.iter().map(|(_, _, seq)| *seq).collect();
        let want: Vec<i64> = (1..=got.len() as i64).collect();
        assert_eq!(got, want, "{project} through a durable consumer");
    }
}

async fn kill_9_of_the_relay_under_live_writers_loses_and_repeats_nothing() {
    let db = fresh_db().await;
    let nats = NatsServer::start().await;
    let mut relays: Vec<OutboxProcess> = PROJECTS
        .iter()
        .map(|p| spawn_relay(&db.url, &nats.url(), p, &stream_of("KILLS", p)))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers = start_writers(&db.config, &stop);

    for kill in 0..4 {
        let pause = rand::rng().random_range(300..1200);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let victim = kill % PROJECTS.len();
        relays[victim].signal("KILL");
        relays[victim].wait().await;
        relays[victim] = spawn_relay(
            &db.url,
            &nats.url(),
            PROJECTS[victim],
            &stream_of("KILLS", PROJECTS[victim]),
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    check_stream(&db.config, &nats, "KILLS").await;
    for relay in &mut relays {
        relay.signal("TERM");
        assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
    }
}

async fn a_nats_server_restart_mid_stream_loses_and_repeats_nothing() {
    let db = fresh_db().await;
    let mut nats = NatsServer::start().await;
    let mut relays: Vec<OutboxProcess> = PROJECTS
        .iter()
        .map(|p| spawn_relay(&db.url, &nats.url(), p, &stream_of("RESTART", p)))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers = start_writers(&db.config, &stop);

    tokio::time::sleep(Duration::from_millis(1500)).await;
    nats.restart(Duration::from_millis(1500)).await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    check_stream(&db.config, &nats, "RESTART").await;
    for relay in &relays {
        let log = relay.stderr();
        assert!(
            log.matches("connected to NATS").count() >= 2,
            "the relay reconnected after the restart: {log}"
        );
    }
    for relay in &mut relays {
        relay.signal("TERM");
        assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
    }
}

/// On each server in turn: the PostgreSQL cluster of its own is one per name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_restart_mid_stream_loses_and_repeats_nothing() {
    for server in [Server::Debian, Server::Current] {
        with_server(server, postgres_restart_mid_stream()).await;
    }
}

async fn postgres_restart_mid_stream() {
    // A cluster of its own: restarting the shared one would break every other test.
    let cluster = PrivateCluster::start("relay-restart");
    let url = cluster.url.clone();
    let config = cluster.migrate().await;
    let nats = NatsServer::start().await;
    let mut relays: Vec<OutboxProcess> = PROJECTS
        .iter()
        .map(|p| spawn_relay(&url, &nats.url(), p, &stream_of("PGRESTART", p)))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers = start_writers(&config, &stop);

    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.stop();
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.resume();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    check_stream(&config, &nats, "PGRESTART").await;
    for relay in &mut relays {
        relay.signal("TERM");
        assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
    }
}

/// The configuration of stream `name` as JetStream holds it now.
async fn stream_config(js: &async_nats::jetstream::Context, name: &str) -> StreamConfig {
    js.get_stream(name)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone()
}

/// Writes project p1's first event and waits until the relay has it in `stream` (which the
/// relay creates at start); returns its event ID.
async fn first_event_relayed(
    db: &TestDb,
    js: &async_nats::jetstream::Context,
    stream: &str,
) -> String {
    let event = write_event(db, "p1", "T-1").await;
    eventually(
        Duration::from_secs(20),
        "the first event relayed",
        || async {
            js.get_stream(stream).await.is_ok() && read_stream(js, stream).await.len() == 1
        },
    )
    .await;
    event
}

/// The delivery state of one event: (state, attempts, last failure class).
async fn delivery(db: &TestDb, event_id: &str) -> Option<(String, i32, Option<String>)> {
    db.connect()
        .await
        .query_opt(
            "SELECT state, attempts, last_failure_class FROM outbox.lifecycle_deliveries \
             WHERE project_id = 'p1' AND consumer_id = 'relay-p1' AND event_id = $1",
            &[&event_id],
        )
        .await
        .unwrap()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
}

async fn a_refused_publish_retries_then_parks_and_replay_publishes_it() {
    let db = fresh_db().await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    let mut args = relay_args(&nats.url(), "p1", "relay-p1", "REFUSE");
    let at = args.iter().position(|a| a == "--max-attempts").unwrap();
    args[at + 1] = "3".into();
    let at = args.iter().position(|a| a == "--retry-delays").unwrap();
    args[at + 1] = "300ms".into();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut relay = nats_kit::spawn_relay(&db.url, &args);

    let first = first_event_relayed(&db, &js, "REFUSE").await;

    // Point the stream elsewhere: JetStream now has no stream for the relay's subject.
    let mut refusing = stream_config(&js, "REFUSE").await;
    let original = refusing.clone();
    refusing.subjects = vec!["elsewhere.>".into()];
    js.update_stream(refusing).await.unwrap();

    let second = write_event(&db, "p1", "T-2").await;
    let written = tokio::time::Instant::now();
    eventually(
        Duration::from_secs(30),
        "the refused event parked",
        || async { matches!(delivery(&db, &second).await, Some((state, _, _)) if state == "dead") },
    )
    .await;
    let parked_after = written.elapsed();
    let (_, attempts, class) = delivery(&db, &second).await.unwrap();
    assert_eq!(attempts, 3, "parked after the last of 3 attempts");
    assert_eq!(class.as_deref(), Some("nats_no_stream"));
    // Two waits of the schedule separate the three attempts.
    assert!(
        parked_after >= Duration::from_millis(600),
        "parked after {parked_after:?}, before the schedule's two 300 ms waits"
    );
    assert_eq!(
        relay.stderr().matches("event failed; will retry").count(),
        2,
        "{}",
        relay.stderr()
    );
    assert_eq!(
        cursor(&db, "p1", "relay-p1").await,
        Some(2),
        "the cursor moved past it"
    );
    assert_eq!(
        read_stream(&js, "REFUSE").await.len(),
        1,
        "nothing more in the stream"
    );

    // The operator repairs the stream and replays the dead letter.
    js.update_stream(original).await.unwrap();
    let (code, _, stderr) = run_outbox(&[
        "--database-url",
        &db.url,
        "dead-letters",
        "replay",
        "--project",
        "p1",
        "--consumer-id",
        "relay-p1",
        "--event-id",
        &second,
        "--by",
        "operator",
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    eventually(Duration::from_secs(20), "the replay published", || async {
        matches!(delivery(&db, &second).await, Some((state, _, _)) if state == "replayed")
    })
    .await;
    let third = write_event(&db, "p1", "T-3").await;
    eventually(
        Duration::from_secs(20),
        "the next event relayed",
        || async { read_stream(&js, "REFUSE").await.len() == 3 },
    )
    .await;
    let messages = read_stream(&js, "REFUSE").await;
    let expected = sequenced(&db.connect().await, "p1").await;
    assert_eq!(
        expected
            .iter()
            .map(|(_, id)| id.clone())
            .collect::<Vec<_>>(),
        vec![first, second.clone(), third]
    );
    assert_exactly_once_in_order(&messages, "lifecycle", "p1", &expected);
    assert_eq!(messages[1].body["replay"], true, "flagged as a replay");
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
}

async fn a_stream_deleted_under_the_relay_is_created_again() {
    let db = fresh_db().await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    let mut relay = spawn_relay(&db.url, &nats.url(), "p1", "GONE");
    first_event_relayed(&db, &js, "GONE").await;

    // The stream disappears while the relay runs (an operator deleted it, or the cluster
    // lost it). The relay's next publish finds no stream; it checks the stream again, as at
    // start, which creates it, and the event lands in the new stream.
    js.delete_stream("GONE").await.unwrap();
    let second = write_event(&db, "p1", "T-2").await;
    eventually(
        Duration::from_secs(30),
        "the stream created again and the next event relayed",
        || async {
            js.get_stream("GONE").await.is_ok()
                && read_stream(&js, "GONE").await.len() == 1
                && cursor(&db, "p1", "relay-p1").await == Some(2)
        },
    )
    .await;
    let messages = read_stream(&js, "GONE").await;
    assert_eq!(
        messages
            .iter()
            .map(|m| m.msg_id.clone())
            .collect::<Vec<_>>(),
        vec![second.clone()]
    );
    assert_eq!(
        stream_config(&js, "GONE").await.subjects,
        vec!["lifecycle.p1.>".to_owned()],
        "created as at start: the project's subjects (the stream fence's stream is its own)"
    );
    assert!(
        relay.stderr().contains("created the stream again"),
        "{}",
        relay.stderr()
    );
    assert!(
        !matches!(delivery(&db, &second).await, Some((state, _, _)) if state == "dead"),
        "never parked"
    );
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
}

/// Runs `outbox relay nats ARGS` against a database URL that is never reached.
async fn relay_refuses(args: &[&str]) -> (i32, String) {
    let mut all = vec![
        "--database-url",
        "postgresql://nobody@127.0.0.1:1/none",
        "relay",
        "nats",
        "--project",
        "p1",
        "--consumer-id",
        "r",
    ];
    all.extend_from_slice(args);
    let (code, _, stderr) = run_outbox(&all).await;
    (code, stderr)
}

#[tokio::test]
async fn bad_input_exits_2_with_a_clear_message() {
    for (args, says) in [
        (
            vec!["--nats-url", "http://127.0.0.1:4222"],
            "unknown scheme \"http\"",
        ),
        (vec!["--nats-url", "127.0.0.1:4222"], "missing scheme"),
        (vec!["--nats-url", "nats://127.0.0.1:99999"], "not 1-65535"),
        (vec!["--nats-url", "nats://"], "empty host"),
        (
            vec![
                "--nats-url",
                "nats://127.0.0.1:4222",
                "--subject-prefix",
                "",
            ],
            "--subject-prefix: must not be empty",
        ),
        (
            vec![
                "--nats-url",
                "nats://127.0.0.1:4222",
                "--subject-prefix",
                "life.*",
            ],
            "wildcard '*'",
        ),
        (
            vec![
                "--nats-url",
                "nats://127.0.0.1:4222",
                "--subject-prefix",
                "life.>",
            ],
            "wildcard '>'",
        ),
        (
            vec!["--nats-url", "nats://127.0.0.1:4222", "--stream", "A.B"],
            "not allowed in a stream name",
        ),
        (
            vec![
                "--nats-url",
                "nats://127.0.0.1:4222",
                "--duplicate-window",
                "2h",
                "--stream-max-age",
                "1h",
            ],
            "longer than --stream-max-age",
        ),
        (
            vec!["--nats-url", "nats://127.0.0.1:4222", "--child", "cat"],
            "unexpected argument '--child'",
        ),
        (
            vec![
                "--nats-url",
                "nats://relayer:s3cret@127.0.0.1:4222",
                "--nats-password",
                "other",
            ],
            "--nats-url has a password and --nats-password (or NATS_PASSWORD) gives another",
        ),
        (
            vec!["--nats-url", "nats://relayer:s3cret@127.0.0.1:abc"],
            "invalid --nats-url \"nats://relayer:***@127.0.0.1:abc\"",
        ),
        (
            vec![
                "--nats-url",
                "nats://127.0.0.1:4222",
                "--nats-nkey",
                "/nonexistent/relayer.nk",
            ],
            "cannot read --nats-nkey /nonexistent/relayer.nk",
        ),
        (
            vec![
                "--nats-url",
                "nats://127.0.0.1:4222",
                "--nats-nkey",
                concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
            ],
            "not an NKey user seed",
        ),
        (
            vec![
                "--nats-url",
                "nats://127.0.0.1:4222",
                "--nats-tls-ca",
                concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
            ],
            "no PEM CERTIFICATE",
        ),
        (
            vec![
                "--nats-url",
                "nats://127.0.0.1:4222",
                "--nats-token",
                "s3cret",
                "--nats-user",
                "u",
                "--nats-password",
                "p",
            ],
            "choose one way to authenticate to NATS; given: user and password, token",
        ),
        (
            vec![
                "--nats-url",
                "nats://127.0.0.1:4222",
                "--nats-tls-cert",
                "c.pem",
            ],
            "--nats-tls-key",
        ),
    ] {
        let (code, stderr) = relay_refuses(&args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(
            !stderr.contains("s3cret"),
            "{args:?} printed a secret: {stderr}"
        );
        assert!(
            stderr.contains(says),
            "{args:?}: expected {says:?} in {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_does_not_match_exits_2_and_is_left_alone() {
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    js.create_stream(StreamConfig {
        name: "OTHER".into(),
        subjects: vec!["elsewhere.>".into()],
        duplicate_window: Duration::from_secs(60),
        max_age: Duration::from_secs(7 * 86400),
        ..Default::default()
    })
    .await
    .unwrap();
    let url = nats.url();
    let (code, stderr) = relay_refuses(&["--nats-url", &url, "--stream", "OTHER"]).await;
    assert_eq!(code, 2, "{stderr}");
    for says in [
        "stream OTHER does not match",
        "subjects [\"elsewhere.>\"] do not cover lifecycle.p1.>",
        "duplicate window is 1m, the relay asks for 10m",
        "never reconfigures",
    ] {
        assert!(stderr.contains(says), "expected {says:?} in {stderr}");
    }
    let after = stream_config(&js, "OTHER").await;
    assert_eq!(
        after.subjects,
        vec!["elsewhere.>".to_string()],
        "left alone"
    );
    assert_eq!(
        after.duplicate_window,
        Duration::from_secs(60),
        "left alone"
    );

    // Matching flags are accepted (the database is then unreachable, and waited for until
    // --give-up-after: exit 1, not 2).
    let (code, stderr) = relay_refuses(&[
        "--nats-url",
        &url,
        "--stream",
        "OTHER",
        "--subject-prefix",
        "elsewhere",
        "--duplicate-window",
        "1m",
        "--give-up-after",
        "1s",
    ])
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("giving up"), "{stderr}");
    assert!(!stderr.contains("does not match"), "{stderr}");
}

/// `relay nats --help` offers only what the relay accepts: no child handler, no
/// `--all-projects`, and `--project`/`--consumer-id` once each; passing any of those is clap's
/// own usage error (exit 2), while `consume` and `serve` keep them.
#[tokio::test]
async fn relay_nats_offers_only_what_it_accepts() {
    let (code, help, err) = run_outbox(&["relay", "nats", "--help"]).await;
    assert_eq!(code, 0, "{err}");
    for refused in [
        "--all-projects",
        "--child",
        "--child-timeout",
        "--child-stop-grace",
    ] {
        assert!(
            !help.contains(refused),
            "relay nats --help offers {refused}:\n{help}"
        );
    }
    assert!(help.contains("--project <PROJECT>"), "{help}");
    assert!(help.contains("--consumer-id <CONSUMER_ID>"), "{help}");
    assert!(
        !help.contains("repeat it"),
        "nothing is repeatable:\n{help}"
    );
    let base = [
        "relay",
        "nats",
        "--project",
        "p1",
        "--consumer-id",
        "relay",
        "--nats-url",
        "nats://127.0.0.1:4222",
    ];
    for (extra, expected) in [
        (
            vec!["--all-projects"],
            "unexpected argument '--all-projects'",
        ),
        (vec!["--child", "cat"], "unexpected argument '--child'"),
        (
            vec!["--child-timeout", "1s"],
            "unexpected argument '--child-timeout'",
        ),
        (
            vec!["--child-stop-grace", "1s"],
            "unexpected argument '--child-stop-grace'",
        ),
        (
            vec!["--project", "p2"],
            "the argument '--project <PROJECT>' cannot be used multiple times",
        ),
        (
            vec!["--consumer-id", "other"],
            "the argument '--consumer-id <CONSUMER_ID>' cannot be used multiple times",
        ),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(&extra);
        let (code, _, err) = run_outbox(&args).await;
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(expected), "{extra:?}: {err}");
    }
    for command in [&["consume", "--help"][..], &["serve", "--help"][..]] {
        let (code, help, err) = run_outbox(command).await;
        assert_eq!(code, 0, "{err}");
        for kept in ["--child <COMMAND>", "--child-timeout", "--child-stop-grace"] {
            assert!(help.contains(kept), "{command:?} lost {kept}:\n{help}");
        }
    }
    let (_, help, _) = run_outbox(&["consume", "--help"]).await;
    assert!(help.contains("--all-projects"), "{help}");
}

outbox_tests::on_both_servers!(
    kill_9_of_the_relay_under_live_writers_loses_and_repeats_nothing,
    a_nats_server_restart_mid_stream_loses_and_repeats_nothing,
    a_refused_publish_retries_then_parks_and_replay_publishes_it,
    a_stream_deleted_under_the_relay_is_created_again,
);
