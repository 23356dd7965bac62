//! PostgreSQL going away in every phase of every long-running command: a storm of fast and
//! immediate restarts at random moments while writers write and every kind of process
//! (`consume` alone, with `--lanes 8` and with `--all-projects`, `serve`, `relay nats`,
//! `sequence --every`) is killed -9 and started again, some of them while the database is
//! down. No process exits on its own and every committed event reaches every consumer,
//! `task:archived` events (a third of p2's, declared by every consumer) as well as deletions,
//! the relay's on their own subject. Beside it: a process started while PostgreSQL is down
//! begins when it comes up (readiness and the gauge say so meanwhile); permanent errors still
//! exit at once with their messages; `--give-up-after` ends the wait. Each test that stops
//! PostgreSQL uses a cluster of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use outbox_core::connect::ConnectSettings;
use outbox_core::{Event, Payload, ProjectId, Schema, TaskId, WriteOutcome};
use outbox_core::{Writer, WriterProcessId};
use outbox_tests::cluster_kit::{PrivateCluster, try_write};
use outbox_tests::consumer_kit::eventually;
use outbox_tests::nats_kit::{NatsServer, read_stream};
use outbox_tests::process_kit::{OutboxProcess, run_outbox};
use outbox_tests::serve_kit::{Metrics, free_port, get};
use rand::Rng;
use tokio_postgres::Config;

const PROJECTS: [&str; 3] = ["p1", "p2", "p3"];

/// Options every consumer of the storm shares: quick takeover, quick polls, numbering left
/// to `sequence --every` (so the sequencer process is on the path of every event).
const FAST: &[&str] = &[
    "--start-from",
    "earliest",
    "--lease-ttl",
    "3s",
    "--heartbeat-interval",
    "300ms",
    "--poll-interval",
    "200ms",
    "--shutdown-grace",
    "2s",
    "--no-sequencer",
    "--no-prune",
    "--event-types",
    "task:deleted@1,task:archived@1",
];

/// One kind of process of the storm, and how to start it.
struct Role {
    /// For messages.
    name: &'static str,
    /// `outbox` command and arguments (after `--database-url`).
    command: &'static str,
    args: Vec<String>,
    /// Every incarnation, oldest first; the last one is the running one.
    runs: Vec<OutboxProcess>,
}

impl Role {
    fn new(name: &'static str, command: &'static str, args: Vec<String>) -> Self {
        Self {
            name,
            command,
            args,
            runs: Vec::new(),
        }
    }

    fn start(&mut self, url: &str) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.runs
            .push(OutboxProcess::spawn_command(url, self.command, &args));
    }

    /// Panics when the running incarnation ended without being told to.
    fn assert_running(&mut self) {
        let run = self.runs.last_mut().expect("started");
        if let Some(code) = run.exited() {
            panic!(
                "{} exited on its own with {code}; stderr:\n{}",
                self.name,
                run.stderr()
            );
        }
    }

    /// Kills the running incarnation (-9), waits for it to be gone (it may still hold its
    /// listening socket for a moment), and starts a new one.
    async fn kill_and_restart(&mut self, url: &str) {
        self.assert_running();
        let run = self.runs.last_mut().expect("started");
        run.signal("KILL");
        run.wait().await;
        self.start(url);
    }

    /// Event IDs printed by any incarnation, per project.
    fn delivered(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for run in &self.runs {
            for line in run.lines() {
                if line.value["type"] == "event" {
                    let project = line.value["project_id"].as_str().expect("project_id");
                    let id = line.value["event_id"].as_str().expect("event_id");
                    out.entry(project.to_owned())
                        .or_default()
                        .insert(id.to_owned());
                }
            }
        }
        out
    }

    fn stderr(&self) -> String {
        self.runs
            .iter()
            .map(|r| r.stderr())
            .collect::<Vec<_>>()
            .join("\n---\n")
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Records an archival of `task` in `project` through the generic writer, like `try_write`:
/// its event ID once committed, `Err` when the outcome is unknown.
async fn try_archive(config: &Config, project: &str, task: &str) -> Result<String, ()> {
    let mut client = ConnectSettings::from_config(config.clone())
        .connect()
        .await
        .map_err(|_| ())?;
    let tx = client.transaction().await.map_err(|_| ())?;
    let event = Event::new(
        ProjectId::new(project).map_err(|_| ())?,
        "task:archived@1".parse().map_err(|_| ())?,
        TaskId::new(task).map_err(|_| ())?,
        Payload::new()
            .timestamp("archived_at", Utc::now())
            .object("prior", Payload::new()),
    )
    .map_err(|_| ())?;
    let outcome = Writer::new(
        &Schema::default(),
        WriterProcessId::new("w").expect("valid"),
    )
    .record_event(&tx, &event)
    .await
    .map_err(|_| ())?;
    tx.commit().await.map_err(|_| ())?;
    match outcome {
        WriteOutcome::Recorded { event_id } | WriteOutcome::AlreadyRecorded { event_id } => {
            Ok(event_id)
        }
    }
}

/// Writers over every project until `stop` (every third write of p2 an archival); a write
/// whose outcome is unknown (the database went away) is not counted: only confirmed commits
/// must arrive.
fn start_writers(
    config: &Config,
    stop: &Arc<AtomicBool>,
    confirmed: &Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    PROJECTS
        .iter()
        .map(|project| {
            let (config, stop, confirmed) = (config.clone(), stop.clone(), confirmed.clone());
            let project = project.to_string();
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let task = format!("{project}-{i}");
                    let written = match project == "p2" && i % 3 == 0 {
                        true => try_archive(&config, &project, &task).await,
                        false => try_write(&config, &project, &task).await,
                    };
                    match written {
                        Ok(id) => {
                            confirmed
                                .lock()
                                .unwrap()
                                .entry(project.clone())
                                .or_default()
                                .insert(id);
                        }
                        Err(()) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            })
        })
        .collect()
}

/// The cursor of every (project, consumer) and the project heads, or `None` while the
/// database does not answer.
async fn cursors_and_heads(
    config: &Config,
) -> Option<(BTreeMap<(String, String), i64>, BTreeMap<String, i64>, i64)> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.ok()?;
    tokio::spawn(connection);
    let cursors = client
        .query(
            "SELECT project_id, consumer_id, coalesce(last_acked_sequence, -1) \
             FROM outbox.lifecycle_consumer_cursors",
            &[],
        )
        .await
        .ok()?
        .into_iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect();
    let heads = client
        .query(
            "SELECT project_id, head_sequence FROM outbox.lifecycle_project_heads",
            &[],
        )
        .await
        .ok()?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let unsequenced: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence IS NULL",
            &[],
        )
        .await
        .ok()?
        .get(0);
    Some((cursors, heads, unsequenced))
}

/// `/readyz` of `addr`: the status and the body, or `None` while nothing answers.
async fn readyz(addr: SocketAddr) -> Option<(u16, String)> {
    get(addr, "/readyz", &[]).await.ok().map(|(s, _, b)| (s, b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_storm_stops_no_process_and_loses_nothing() {
    let cluster = PrivateCluster::start("restart-storm");
    let url = cluster.url.clone();
    let config = cluster.migrate().await;
    let archived = format!(
        "{}/../contracts/task-archived.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let (code, _, err) = run_outbox(&[
        "--database-url",
        &url,
        "contracts",
        "add",
        &archived,
        "--by",
        "ops",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let nats = NatsServer::start().await;
    let serve_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();

    let mut single = strings(&["--project", "p1", "--consumer-id", "single"]);
    single.extend(strings(FAST));
    let mut all = strings(&["--all-projects", "--consumer-id", "all"]);
    all.extend(strings(FAST));
    let mut lanes = strings(&["--project", "p3", "--consumer-id", "lanes", "--lanes", "8"]);
    lanes.extend(strings(FAST));
    let mut serve = strings(&[
        "--listen",
        &serve_addr.to_string(),
        "--project",
        "p1",
        "--project",
        "p2",
        "--consumer-id",
        "web",
    ]);
    serve.extend(strings(FAST));
    let mut relay = strings(&[
        "nats",
        "--project",
        "p2",
        "--consumer-id",
        "relay",
        "--nats-url",
        &nats.url(),
        "--stream",
        "STORM",
        "--retry-delays",
        "100ms,200ms,400ms",
        "--max-attempts",
        "1000",
        "--publish-timeout",
        "1s",
    ]);
    relay.extend(strings(FAST));
    let sequence = strings(&["--every", "20ms", "--lease-ttl", "2s"]);
    let mut roles = vec![
        Role::new("consume (single)", "consume", single),
        Role::new("consume --all-projects", "consume", all),
        Role::new("serve", "serve", serve),
        Role::new("relay nats", "relay", relay),
        Role::new("sequence --every", "sequence", sequence),
        Role::new("consume --lanes 8", "consume", lanes),
    ];
    for role in &mut roles {
        role.start(&url);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let confirmed = Arc::new(Mutex::new(BTreeMap::new()));
    let writers = start_writers(&config, &stop, &confirmed);

    // /readyz of serve, watched through the storm: it must answer 503 naming the database
    // while it is down (and serve is up), and 200 again after.
    let readiness = Arc::new(Mutex::new(BTreeSet::new()));
    let watcher = {
        let (stop, readiness) = (stop.clone(), readiness.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Some((status, body)) = readyz(serve_addr).await {
                    let unavailable = body.contains("database_unavailable");
                    readiness.lock().unwrap().insert((status, unavailable));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // The storm: restarts at random moments, each fast or immediate, with processes killed
    // -9 and started again in between, some of them while the database is down.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut restarts = 0;
    while restarts < 22 {
        let (immediate, down_for, up_for, victim, kill_while_down) = {
            let mut rng = rand::rng();
            (
                rng.random_bool(0.5),
                Duration::from_millis(rng.random_range(0..800)),
                Duration::from_millis(rng.random_range(300..2500)),
                rng.random_range(0..roles.len()),
                rng.random_bool(0.5),
            )
        };
        match immediate {
            true => cluster.crash(),
            false => cluster.stop(),
        }
        if kill_while_down {
            roles[victim].kill_and_restart(&url).await;
        }
        tokio::time::sleep(down_for).await;
        cluster.resume();
        restarts += 1;
        let other = (victim + 1 + restarts % (roles.len() - 1)) % roles.len();
        tokio::time::sleep(up_for / 2).await;
        roles[other].kill_and_restart(&url).await;
        tokio::time::sleep(up_for / 2).await;
        for role in &mut roles {
            role.assert_running();
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    watcher.await.unwrap();
    let confirmed = confirmed.lock().unwrap().clone();
    for project in PROJECTS {
        assert!(
            confirmed.get(project).is_some_and(|c| c.len() > 50),
            "writers got through to {project} during the storm"
        );
    }

    // Everything numbered and acknowledged by every consumer, everything printed.
    let expected_cursors = [
        ("p1", "single"),
        ("p1", "all"),
        ("p2", "all"),
        ("p3", "all"),
        ("p1", "web"),
        ("p2", "web"),
        ("p2", "relay"),
        ("p3", "lanes"),
    ];
    eventually(
        Duration::from_secs(40),
        "every consumer acknowledged every project's head",
        || async {
            let Some((cursors, heads, unsequenced)) = cursors_and_heads(&config).await else {
                return false;
            };
            unsequenced == 0
                && expected_cursors
                    .iter()
                    .all(|(p, c)| cursors.get(&(p.to_string(), c.to_string())) == heads.get(*p))
        },
    )
    .await;
    for role in &mut roles {
        role.assert_running();
    }
    let single = roles[0].delivered();
    let missing = confirmed["p1"]
        .difference(single.get("p1").unwrap_or(&BTreeSet::new()))
        .count();
    assert_eq!(
        missing, 0,
        "the single consumer printed every confirmed p1 event"
    );
    let all = roles[1].delivered();
    for project in PROJECTS {
        let printed = all.get(project).cloned().unwrap_or_default();
        let missing = confirmed[project].difference(&printed).count();
        assert_eq!(
            missing, 0,
            "--all-projects printed every confirmed {project} event"
        );
    }
    let in_lanes = roles[5].delivered();
    let missing = confirmed["p3"]
        .difference(in_lanes.get("p3").unwrap_or(&BTreeSet::new()))
        .count();
    assert_eq!(
        missing, 0,
        "the consumer with lanes printed every confirmed p3 event"
    );
    let messages: Vec<_> = read_stream(&nats.jetstream().await, "STORM")
        .await
        .into_iter()
        .filter(|m| m.body["type"] == "event")
        .collect();
    for message in &messages {
        let token = message.body["event_type"]
            .as_str()
            .unwrap()
            .replace(':', "_");
        assert_eq!(message.subject, format!("lifecycle.p2.{token}"));
    }
    let relayed: BTreeSet<String> = messages.into_iter().map(|m| m.msg_id).collect();
    let missing = confirmed["p2"].difference(&relayed).count();
    assert_eq!(missing, 0, "the relay published every confirmed p2 event");
    assert!(
        confirmed["p2"]
            .iter()
            .any(|id| id.starts_with("task-archived:")),
        "archivals among them"
    );
    let seen = readiness.lock().unwrap().clone();
    assert!(
        seen.contains(&(503, true)),
        "serve's /readyz answered 503 database_unavailable during the storm: {seen:?}"
    );
    assert!(
        seen.contains(&(200, false)),
        "and 200 between restarts: {seen:?}"
    );

    // A clean stop of everything, each exiting 0.
    for role in &mut roles {
        let run = role.runs.last_mut().expect("started");
        run.signal("TERM");
        let code = tokio::time::timeout(Duration::from_secs(20), run.wait())
            .await
            .expect("stops within 20 s");
        assert_eq!(code, 0, "{} stops cleanly: {}", role.name, role.stderr());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_started_while_postgres_is_down_begins_when_it_comes_up() {
    let cluster = PrivateCluster::start("started-down");
    let url = cluster.url.clone();
    let config = cluster.migrate().await;
    cluster.stop();
    let metrics_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut consumer = OutboxProcess::spawn(
        &url,
        &[
            "--project",
            "p",
            "--consumer-id",
            "early",
            "--start-from",
            "earliest",
            "--poll-interval",
            "100ms",
            "--metrics-addr",
            &metrics_addr.to_string(),
        ],
    );
    let serve_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut serve = OutboxProcess::spawn_command(
        &url,
        "serve",
        &[
            "--listen",
            &serve_addr.to_string(),
            "--project",
            "p",
            "--consumer-id",
            "web",
            "--start-from",
            "earliest",
            "--poll-interval",
            "100ms",
        ],
    );
    for (what, addr) in [
        ("consume --metrics-addr", metrics_addr),
        ("serve", serve_addr),
    ] {
        eventually(
            Duration::from_secs(20),
            &format!("/readyz of {what} answers 503 database_unavailable while PostgreSQL is down"),
            || async {
                matches!(readyz(addr).await,
                    Some((503, body)) if body.contains("database_unavailable"))
            },
        )
        .await;
    }
    let (_, _, body) = get(metrics_addr, "/metrics", &[]).await.expect("/metrics");
    assert_eq!(
        Metrics::parse(&body).get("outbox_database_up", &[]),
        Some(0.0),
        "{body}"
    );
    // Several attempts fail meanwhile; the log says so once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(consumer.exited(), None, "{}", consumer.stderr());
    assert_eq!(serve.exited(), None, "{}", serve.stderr());

    cluster.resume();
    let id = try_write(&config, "p", "t1")
        .await
        .expect("write after the start");
    eventually(Duration::from_secs(30), "the event delivered", || async {
        consumer.event_ids().contains(&id)
    })
    .await;
    eventually(Duration::from_secs(10), "/readyz answers 200", || async {
        matches!(readyz(metrics_addr).await, Some((200, _)))
    })
    .await;
    let (_, _, body) = get(metrics_addr, "/metrics", &[]).await.expect("/metrics");
    assert_eq!(
        Metrics::parse(&body).get("outbox_database_up", &[]),
        Some(1.0)
    );
    eventually(
        Duration::from_secs(20),
        "serve's /readyz answers 200",
        || async { matches!(readyz(serve_addr).await, Some((200, _))) },
    )
    .await;
    assert_eq!(
        serve
            .stderr()
            .matches("the database is unavailable")
            .count(),
        1,
        "{}",
        serve.stderr()
    );
    serve.signal("TERM");
    assert_eq!(serve.wait().await, 0, "{}", serve.stderr());
    let stderr = consumer.stderr();
    assert_eq!(
        stderr.matches("the database is unavailable").count(),
        1,
        "one line when the database became unavailable, not one per attempt:\n{stderr}"
    );
    assert_eq!(
        stderr.matches("the database is available again").count(),
        1,
        "one line when it is back:\n{stderr}"
    );
    consumer.signal("TERM");
    assert_eq!(consumer.wait().await, 0, "{}", consumer.stderr());
}

/// Runs `outbox ARGS` against `url` and expects it to fail at once (well within `within`).
async fn fails_at_once(url: &str, args: &[&str], within: Duration) -> (i32, String) {
    let mut all = vec!["--database-url", url];
    all.extend_from_slice(args);
    let (code, _, stderr) = tokio::time::timeout(within, run_outbox(&all))
        .await
        .unwrap_or_else(|_| panic!("`outbox {args:?}` did not exit within {within:?}"));
    (code, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_errors_exit_at_once_with_their_messages() {
    let cluster = PrivateCluster::start("permanent-errors");
    let config = cluster.migrate().await;
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    // A role that must give its password (the cluster trusts everyone else).
    client
        .batch_execute("CREATE ROLE pw LOGIN PASSWORD 'right'; GRANT ALL ON SCHEMA outbox TO pw")
        .await
        .unwrap();
    let hba: String = client
        .query_one("SELECT current_setting('hba_file')", &[])
        .await
        .unwrap()
        .get(0);
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("local all pw scram-sha-256\n{rules}")).unwrap();
    client
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    client
        .batch_execute("CREATE DATABASE unmigrated")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let host = config.get_hosts()[0].clone();
    let tokio_postgres::config::Host::Unix(dir) = host else {
        panic!("the private cluster listens on a socket")
    };
    let port = config.get_ports()[0];
    let url_of = |user: &str, database: &str| {
        format!(
            "postgresql://{user}@/{database}?host={}&port={port}",
            dir.display()
        )
    };
    let consume = ["consume", "--project", "p", "--consumer-id", "c"];
    let within = Duration::from_secs(8);

    let wrong_password = url_of("pw:wrong", "postgres");
    for args in [
        &consume[..],
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--project",
            "p",
            "--consumer-id",
            "c",
        ][..],
        &["sequence", "--every", "50ms"][..],
    ] {
        let (code, stderr) = fails_at_once(&wrong_password, args, within).await;
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains("password authentication failed") && stderr.contains("28P01"),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("wrong"),
            "the password is not printed: {stderr}"
        );
    }

    let unknown = url_of("postgres", "no_such_database");
    let (code, stderr) = fails_at_once(&unknown, &consume, within).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("\"no_such_database\" does not exist") && stderr.contains("3D000"),
        "{stderr}"
    );

    let unmigrated = url_of("postgres", "unmigrated");
    for args in [
        &consume[..],
        &["consume", "--all-projects", "--consumer-id", "c"][..],
    ] {
        let (code, stderr) = fails_at_once(&unmigrated, args, within).await;
        assert_eq!(code, 1, "{stderr}");
        assert!(
            stderr.contains("is not migrated (run `outbox migrate`"),
            "{args:?}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_up_after_ends_the_wait_and_bad_durations_are_refused() {
    // Nothing listens there: the database is unavailable for as long as the test runs.
    let nowhere = "postgresql://outbox@/outbox?host=/nonexistent-outbox-socket-dir&port=5432";
    let within = Duration::from_secs(15);
    for args in [
        &[
            "consume",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--give-up-after",
            "1s",
        ][..],
        &[
            "consume",
            "--all-projects",
            "--consumer-id",
            "c",
            "--give-up-after",
            "1s",
        ][..],
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--give-up-after",
            "1s",
        ][..],
        &["sequence", "--every", "50ms", "--give-up-after", "1s"][..],
    ] {
        let (code, stderr) = fails_at_once(nowhere, args, within).await;
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains("giving up: the database has been unavailable for longer than 1s")
                && stderr.contains("no such socket file"),
            "{args:?}: {stderr}"
        );
        assert_eq!(
            stderr.matches("the database is unavailable").count(),
            1,
            "{args:?}: one line for the outage: {stderr}"
        );
    }

    // Without the flag, the process keeps waiting.
    let mut waiting = OutboxProcess::spawn(nowhere, &["--project", "p", "--consumer-id", "c"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(waiting.exited(), None, "{}", waiting.stderr());
    waiting.signal("TERM");
    assert_eq!(
        waiting.wait().await,
        0,
        "a stop while waiting is clean: {}",
        waiting.stderr()
    );

    for bad in ["-1s", "0s", "soon"] {
        let (code, stderr) = fails_at_once(
            nowhere,
            &[
                "consume",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--give-up-after",
                bad,
            ],
            within,
        )
        .await;
        assert_eq!(code, 2, "{bad}: {stderr}");
        assert!(
            stderr.contains("--give-up-after") && stderr.contains("invalid duration"),
            "{bad}: {stderr}"
        );
    }

    // One-shot commands keep failing fast, with exit 1.
    for args in [
        &["status"][..],
        &["migrate"][..],
        &["prune"][..],
        &[
            "dead-letters",
            "list",
            "--project",
            "p",
            "--consumer-id",
            "c",
        ][..],
        &["consumers", "list", "--project", "p"][..],
        &["audit"][..],
        &["sequence"][..],
    ] {
        let (code, stderr) = fails_at_once(nowhere, args, within).await;
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(stderr.contains("no such socket file"), "{args:?}: {stderr}");
    }
}
