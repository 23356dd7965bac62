//! `outbox consume` with several projects, several consumer IDs or --all-projects: one
//! process, the same JSON lines, and nothing lost across kill -9.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use outbox_tests::consumer_kit::{
    PROCESS_WAIT as WAIT, Writers, cursor, eventually, sessions_ended, write_event,
};
use outbox_tests::process_kit::{ConsumeProcess, outbox_on};
use outbox_tests::set_kit::{PairEvents, events_by_pair};
use outbox_tests::{TestDb, fresh_db};
use rand::Rng;

/// Fast settings, after the projects and consumer IDs.
fn args(targets: &[&str]) -> Vec<String> {
    let fast = [
        "--start-from",
        "earliest",
        "--lease-ttl",
        "1s",
        "--heartbeat-interval",
        "250ms",
        "--poll-interval",
        "100ms",
        "--sequence-interval",
        "10ms",
        "--sequencer-lease-ttl",
        "1s",
        "--shutdown-grace",
        "1s",
    ];
    targets.iter().chain(&fast).map(|s| s.to_string()).collect()
}

/// [`args`] without `--start-from earliest`: a new consumer of a project there at start
/// reconciles, as it does by default.
fn reconciling_args(targets: &[&str]) -> Vec<String> {
    let all = args(targets);
    let at = all
        .iter()
        .position(|a| a == "--start-from")
        .expect("args starts from the earliest event");
    [&all[..at], &all[at + 2..]].concat()
}

fn spawn(db: &TestDb, args: &[String]) -> ConsumeProcess {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    ConsumeProcess::spawn(&db.url, &refs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_process_consumes_listed_and_later_projects_with_the_usual_lines() {
    let db = fresh_db().await;
    let mut listed = spawn(
        &db,
        &args(&[
            "--project",
            "a",
            "--project",
            "b",
            "--consumer-id",
            "c1",
            "--consumer-id",
            "c2",
        ]),
    );
    let mut all = spawn(&db, &args(&["--all-projects", "--consumer-id", "every"]));
    for i in 0..5 {
        write_event(&db, "a", &format!("a{i}")).await;
        write_event(&db, "b", &format!("b{i}")).await;
        write_event(&db, "new", &format!("n{i}")).await;
    }
    eventually(WAIT, "both processes to print every event", || async {
        listed.event_ids().len() == 20 && all.event_ids().len() == 15
    })
    .await;
    let expected: Vec<i64> = (1..=5).collect();
    let pairs = events_by_pair(&listed.lines());
    assert_eq!(pairs.len(), 4, "{pairs:?}");
    for ((project, consumer), events) in &pairs {
        let sequences: Vec<i64> = events.iter().map(|e| e.0).collect();
        assert_eq!(sequences, expected, "{project}/{consumer}");
        assert!(
            events
                .iter()
                .all(|e| e.1.starts_with(&format!("task-deleted:{project}"))),
            "{project}/{consumer}: {events:?}"
        );
    }
    let pairs = events_by_pair(&all.lines());
    let projects: BTreeSet<&str> = pairs.keys().map(|(p, _)| p.as_str()).collect();
    assert_eq!(projects, BTreeSet::from(["a", "b", "new"]));
    for events in pairs.values() {
        assert_eq!(events.iter().map(|e| e.0).collect::<Vec<_>>(), expected);
    }
    for process in [&mut listed, &mut all] {
        process.signal("TERM");
        assert_eq!(process.wait().await, 0, "{}", process.stderr());
    }
    assert_eq!(cursor(&db, "new", "every").await, Some(5));
    assert_eq!(cursor(&db, "b", "c2").await, Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_drives_only_a_lone_consumer() {
    let db = fresh_db().await;
    let (code, _, stderr) = outbox_on(
        &db,
        &[
            "consume",
            "--project",
            "a",
            "--project",
            "b",
            "--consumer-id",
            "c",
            "--child",
            "cat",
        ],
    )
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--child drives one consumer"), "{stderr}");
}

#[tokio::test]
async fn a_project_or_consumer_given_twice_is_refused() {
    let db = fresh_db().await;
    for (targets, named) in [
        (
            ["--project", "a", "--project", "a", "--consumer-id", "c"],
            "--project a is given twice",
        ),
        (
            ["--project", "a", "--consumer-id", "c", "--consumer-id", "c"],
            "--consumer-id c is given twice",
        ),
    ] {
        let mut argv = vec!["consume"];
        argv.extend(targets);
        let (code, _, stderr) = outbox_on(&db, &argv).await;
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains(named), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_a_consumer_set_then_restart_loses_nothing() {
    let db = fresh_db().await;
    const PROJECTS: &[&str] = &["p1", "p2", "p3"];
    let writers = Writers::start(&db, 3, PROJECTS, 5..25);
    let args = args(&[
        "--project",
        "p1",
        "--project",
        "p2",
        "--project",
        "p3",
        "--consumer-id",
        "k1",
        "--consumer-id",
        "k2",
    ]);
    // Per pair: the events of each run, and the durable cursor after it died.
    let mut runs: Vec<PairEvents> = Vec::new();
    let mut cursors: Vec<BTreeMap<(String, String), Option<i64>>> = Vec::new();
    let pairs: Vec<(String, String)> = PROJECTS
        .iter()
        .flat_map(|p| ["k1", "k2"].map(|c| (p.to_string(), c.to_string())))
        .collect();
    for _ in 0..4 {
        let mut process = spawn(&db, &args);
        let alive = rand::rng().random_range(1000..2500);
        tokio::time::sleep(Duration::from_millis(alive)).await;
        process.signal("KILL");
        process.wait().await;
        sessions_ended(&db).await;
        runs.push(events_by_pair(&process.lines()));
        let mut after = BTreeMap::new();
        for (project, consumer) in &pairs {
            let key = (project.clone(), consumer.clone());
            after.insert(key, cursor(&db, project, consumer).await);
        }
        cursors.push(after);
    }
    let committed = writers.stop().await;

    let mut last = spawn(&db, &args);
    let mut heads: BTreeMap<&str, i64> = BTreeMap::new();
    for (project, _) in &committed {
        *heads.entry(project.as_str()).or_default() += 1;
    }
    eventually(WAIT, "the final run to catch up on every pair", || async {
        for (project, consumer) in &pairs {
            if cursor(&db, project, consumer).await != heads.get(project.as_str()).copied() {
                return false;
            }
        }
        true
    })
    .await;
    last.signal("TERM");
    assert_eq!(
        last.wait().await,
        0,
        "graceful stop exits 0: {}",
        last.stderr()
    );
    runs.push(events_by_pair(&last.lines()));

    for pair in &pairs {
        let mut delivered = BTreeSet::new();
        let mut previous: Option<i64> = None;
        for (index, run) in runs.iter().enumerate() {
            let events = run.get(pair).cloned().unwrap_or_default();
            let sequences: Vec<i64> = events.iter().map(|e| e.0).collect();
            assert!(
                sequences.windows(2).all(|w| w[0] < w[1]),
                "{pair:?} run {index} out of order: {sequences:?}"
            );
            if let (Some(first), Some(before)) = (sequences.first(), previous) {
                assert_eq!(
                    *first,
                    before + 1,
                    "{pair:?} run {index} resumes after its cursor"
                );
            }
            delivered.extend(events.into_iter().map(|e| e.1));
            previous = cursors.get(index).map_or(previous, |c| c[pair]);
        }
        let expected: BTreeSet<String> = committed
            .iter()
            .filter(|(project, _)| *project == pair.0)
            .map(|(_, id)| id.clone())
            .collect();
        let missing: Vec<_> = expected.difference(&delivered).collect();
        assert!(
            missing.is_empty(),
            "{pair:?}: committed but never delivered: {missing:?}"
        );
    }
    assert!(
        runs[..4].iter().filter(|r| !r.is_empty()).count() >= 2,
        "several killed runs delivered something"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_set_exits_when_every_consumer_has_caught_up() {
    let db = fresh_db().await;
    for i in 0..30 {
        write_event(&db, "a", &format!("a{i}")).await;
        write_event(&db, "b", &format!("b{i}")).await;
    }
    let mut process = spawn(
        &db,
        &args(&[
            "--project",
            "a",
            "--project",
            "b",
            "--consumer-id",
            "c1",
            "--consumer-id",
            "c2",
            "--exit-when-caught-up",
        ]),
    );
    let code = tokio::time::timeout(WAIT, process.wait())
        .await
        .expect("the set stops by itself");
    assert_eq!(code, 0, "{}", process.stderr());
    let pairs = events_by_pair(&process.lines());
    assert_eq!(pairs.len(), 4);
    for (pair, events) in pairs {
        let sequences: Vec<i64> = events.iter().map(|e| e.0).collect();
        assert_eq!(sequences, (1..=30).collect::<Vec<_>>(), "{pair:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_projects_set_that_exits_when_caught_up_exits_0_with_no_project_at_all() {
    let db = fresh_db().await;
    let mut process = spawn(
        &db,
        &args(&[
            "--all-projects",
            "--consumer-id",
            "c",
            "--exit-when-caught-up",
        ]),
    );
    let code = tokio::time::timeout(WAIT, process.wait())
        .await
        .unwrap_or_else(|_| panic!("still running with no project: {}", process.stderr()));
    assert_eq!(code, 0, "{}", process.stderr());
    assert!(process.lines().is_empty(), "{:?}", process.lines());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_that_does_not_wait_exits_4_at_once_when_one_pair_is_held_elsewhere() {
    let db = fresh_db().await;
    write_event(&db, "a", "a0").await;
    write_event(&db, "b", "b0").await;
    let mut holder = spawn(&db, &args(&["--project", "a", "--consumer-id", "c"]));
    eventually(WAIT, "the holder's claim of a/c", || async {
        cursor(&db, "a", "c").await.is_some()
    })
    .await;
    let mut set = spawn(
        &db,
        &args(&[
            "--project",
            "a",
            "--project",
            "b",
            "--consumer-id",
            "c",
            "--no-wait",
        ]),
    );
    let code = tokio::time::timeout(WAIT, set.wait())
        .await
        .unwrap_or_else(|_| panic!("the set kept running: {}", set.stderr()));
    assert_eq!(code, 4, "{}", set.stderr());
    assert!(
        set.stderr().contains("consumer c of project a is held by"),
        "{}",
        set.stderr()
    );
    holder.signal("TERM");
    assert_eq!(holder.wait().await, 0, "{}", holder.stderr());
}

/// The lines of `process` about `project`, of `kind` (`event`, `reconcile`).
fn lines_of(process: &ConsumeProcess, project: &str, kind: &str) -> Vec<serde_json::Value> {
    process
        .lines()
        .into_iter()
        .map(|l| l.value)
        .filter(|v| v["project_id"] == project && v["type"] == kind)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_born_while_all_projects_runs_is_delivered_from_its_first_event() {
    let db = fresh_db().await;
    write_event(&db, "old", "o1").await;
    // Numbered before the process starts: a project there at start.
    let (code, _, err) = outbox_on(&db, &["sequence"]).await;
    assert_eq!(code, 0, "{err}");
    let mut all = spawn(
        &db,
        &reconciling_args(&["--all-projects", "--consumer-id", "every"]),
    );
    eventually(
        WAIT,
        "the reconciliation of the project there at start",
        || async { !lines_of(&all, "old", "reconcile").is_empty() },
    )
    .await;
    write_event(&db, "born", "b1").await;
    write_event(&db, "born", "b2").await;
    write_event(&db, "old", "o2").await;
    eventually(
        WAIT,
        "the new project's events and the old one's next",
        || async {
            lines_of(&all, "born", "event").len() == 2 && lines_of(&all, "old", "event").len() == 1
        },
    )
    .await;

    // The new project's first deletion arrives as an event, with its writer, time and prior;
    // it is not folded into a reconciliation.
    let born = lines_of(&all, "born", "event");
    let sequences: Vec<_> = born.iter().map(|v| v["sequence"].as_i64()).collect();
    assert_eq!(sequences, vec![Some(1), Some(2)], "{born:?}");
    assert_eq!(born[0]["task_id"], "b1", "{born:?}");
    assert_eq!(born[0]["writer_process_id"], "test-writer", "{born:?}");
    assert!(born[0]["deleted_at"].is_string(), "{born:?}");
    assert!(born[0]["prior"].is_object(), "{born:?}");
    assert!(
        lines_of(&all, "born", "reconcile").is_empty(),
        "{:?}",
        all.lines()
    );
    // The project there at start kept the default start: reconciled at its head, then its
    // next event.
    let old = lines_of(&all, "old", "reconcile");
    assert_eq!(old.len(), 1, "{old:?}");
    assert_eq!(old[0]["head_sequence"], 1, "{old:?}");
    assert_eq!(lines_of(&all, "old", "event")[0]["sequence"], 2);

    all.signal("TERM");
    assert_eq!(all.wait().await, 0, "{}", all.stderr());
    assert_eq!(cursor(&db, "born", "every").await, Some(2));
    assert_eq!(cursor(&db, "old", "every").await, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_projects_never_follows_the_probe_project_of_outbox_verify() {
    let db = fresh_db().await;
    let mut all = spawn(&db, &args(&["--all-projects", "--consumer-id", "every"]));
    write_event(&db, "user", "u1").await;
    eventually(WAIT, "the consumer to follow a user project", || async {
        lines_of(&all, "user", "event").len() == 1
    })
    .await;
    // While the consumer runs, verify writes its probe events (and is notified of them, as
    // the consumer is); twice, since a consumer that had taken the probe project over would
    // make the second run refuse it.
    for run in 1..=2 {
        let (code, out, err) = outbox_on(&db, &["verify", "--poll-interval", "50ms"]).await;
        assert_eq!(code, 0, "verify run {run}: {out}\n{err}\n{}", all.stderr());
    }
    write_event(&db, "user", "u2").await;
    eventually(
        WAIT,
        "the consumer to go on with its user project",
        || async { lines_of(&all, "user", "event").len() == 2 },
    )
    .await;
    let probe_lines: Vec<_> = all
        .lines()
        .into_iter()
        .filter(|l| {
            l.value["project_id"]
                .as_str()
                .is_some_and(|p| p.starts_with(outbox_core::ids::PROBE_PROJECT_PREFIX))
        })
        .collect();
    assert!(probe_lines.is_empty(), "{probe_lines:?}");
    let registered: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_consumers \
             WHERE consumer_id = 'every' AND project_id LIKE 'outbox-verify%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(registered, 0, "no consumer of the probe project registered");
    all.signal("TERM");
    assert_eq!(all.wait().await, 0, "{}", all.stderr());
}
