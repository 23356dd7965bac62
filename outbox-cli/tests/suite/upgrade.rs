//! Upgrades: `migrate --dry-run` lists what is pending and changes nothing; every command
//! refuses a schema migrated by a newer build or missing migrations; an upgrade from migration
//! 0001, and one from 0010, to the latest, run while a consumer holds its lease, keeps events, cursors, leases,
//! retrying deliveries and dead letters, and consumers continue from their cursors; an upgrade
//! from every earlier version numbers what waited for a number, after what was numbered, and
//! the new sequencer continues densely; and roles added after later migrations get grants on
//! what those added.

use std::time::Duration;

use outbox_consumer::{Consumer, RetrySchedule};
use outbox_core::migrate::{MIGRATIONS, migrate_with};
use outbox_core::sequencer::Sequencer;
use outbox_core::{Schema, migrate};
use outbox_tests::consumer_kit::{
    Recorder, SeedEvent, cursor, eventually, fast_config, seed_consumer, seed_delivery, write_event,
};
use outbox_tests::legacy;
use outbox_tests::process_kit::run_outbox;
use outbox_tests::{TASKS_TABLE, TestDb, empty_db, fresh_db};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

fn all_versions() -> Vec<i32> {
    MIGRATIONS.iter().map(|m| m.version).collect()
}

async fn dry_run(db: &TestDb) -> serde_json::Value {
    let (code, out, err) = run_outbox(&[
        "--database-url",
        &db.url,
        "migrate",
        "--dry-run",
        "--output",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

fn versions(value: &serde_json::Value) -> Vec<i32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["version"].as_i64().unwrap() as i32)
        .collect()
}

#[tokio::test]
async fn dry_run_lists_pending_migrations_and_changes_nothing() {
    let db = empty_db().await;
    let report = dry_run(&db).await;
    assert_eq!(versions(&report["pending"]), all_versions());
    let client = db.connect().await;
    let exists: bool = client
        .query_one(
            "SELECT to_regnamespace('outbox') IS NOT NULL OR \
             to_regclass('outbox.schema_migrations') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!exists, "a dry run creates nothing");

    let mut client = db.connect().await;
    migrate_with(&mut client, &Schema::default(), &MIGRATIONS[..1])
        .await
        .unwrap();
    let report = dry_run(&db).await;
    assert_eq!(report["already_applied"], serde_json::json!([1]));
    assert_eq!(versions(&report["pending"]), all_versions()[1..].to_vec());
    let (code, out, _) = run_outbox(&["--database-url", &db.url, "migrate", "--dry-run"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("pending migration(s)"), "{out}");
    assert!(out.contains("0002_roles"), "{out}");
}

/// Every command, as an operator would type it.
fn commands(url: &str) -> Vec<Vec<String>> {
    let base = |args: &[&str]| {
        let mut all = vec!["--database-url".to_owned(), url.to_owned()];
        all.extend(args.iter().map(|a| a.to_string()));
        all
    };
    vec![
        base(&["status"]),
        base(&["audit"]),
        base(&["consumers", "list"]),
        base(&[
            "consumers",
            "retire",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--by",
            "ops",
            "--reason",
            "r",
        ]),
        base(&["dead-letters", "list"]),
        base(&[
            "dead-letters",
            "replay",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--all",
            "--by",
            "ops",
        ]),
        base(&["prune"]),
        base(&["sequence"]),
        base(&["consume", "--project", "p", "--consumer-id", "c"]),
    ]
}

#[tokio::test]
async fn every_command_refuses_a_schema_from_a_newer_build() {
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute(
            "INSERT INTO outbox.schema_migrations (version, name, checksum) \
             VALUES (99, 'future', 'x')",
        )
        .await
        .unwrap();
    let mut all = commands(&db.url);
    all.push(vec![
        "--database-url".into(),
        db.url.clone(),
        "migrate".into(),
    ]);
    all.push(vec![
        "--database-url".into(),
        db.url.clone(),
        "migrate".into(),
        "--dry-run".into(),
    ]);
    for args in all {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = run_outbox(&args).await;
        assert_eq!(code, 1, "outbox {args:?}: {out}{err}");
        assert!(
            err.contains(
                "migration 99 (future) is applied in the database but unknown to this build"
            ),
            "outbox {args:?}: {err}"
        );
    }
}

#[tokio::test]
async fn every_command_refuses_a_schema_missing_migrations() {
    let db = empty_db().await;
    let mut client = db.connect().await;
    migrate_with(&mut client, &Schema::default(), &MIGRATIONS[..1])
        .await
        .unwrap();
    for args in commands(&db.url) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = run_outbox(&args).await;
        assert_eq!(code, 1, "outbox {args:?}: {out}{err}");
        assert!(
            err.contains("schema outbox is at migration 1, but this build needs migration(s)")
                && err.contains("run `outbox migrate` first"),
            "outbox {args:?}: {err}"
        );
    }
    let (code, _, err) = run_outbox(&["--database-url", &db.url, "migrate"]).await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run_outbox(&["--database-url", &db.url, "status"]).await;
    assert_eq!(code, 0, "{err}");
}

/// Snapshot of everything the upgrade must keep.
async fn state(db: &TestDb) -> Vec<String> {
    let client = db.connect().await;
    let mut lines = Vec::new();
    for row in client
        .query(
            "SELECT project_id, sequence, event_id FROM outbox.lifecycle_outbox \
             ORDER BY project_id, sequence",
            &[],
        )
        .await
        .unwrap()
    {
        lines.push(format!(
            "event {} {:?} {}",
            row.get::<_, String>(0),
            row.get::<_, Option<i64>>(1),
            row.get::<_, String>(2)
        ));
    }
    for row in client
        .query(
            "SELECT consumer_id, last_acked_sequence, lease_generation, state \
             FROM outbox.lifecycle_consumer_cursors ORDER BY consumer_id",
            &[],
        )
        .await
        .unwrap()
    {
        lines.push(format!(
            "cursor {} {:?} {} {}",
            row.get::<_, String>(0),
            row.get::<_, Option<i64>>(1),
            row.get::<_, i64>(2),
            row.get::<_, String>(3)
        ));
    }
    for row in client
        .query(
            "SELECT consumer_id, event_id, attempts, state FROM outbox.lifecycle_deliveries \
             ORDER BY consumer_id, event_id",
            &[],
        )
        .await
        .unwrap()
    {
        lines.push(format!(
            "delivery {} {} {} {}",
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, i32>(2),
            row.get::<_, String>(3)
        ));
    }
    lines
}

fn start(
    db: &TestDb,
    consumer: &str,
    recorder: &Recorder,
    retry: RetrySchedule,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<outbox_consumer::RunSummary, outbox_consumer::ConsumerError>>,
) {
    let mut config = fast_config("p", consumer);
    config.delivery.retry = retry;
    config.duties.prune_interval = None;
    let shutdown = CancellationToken::new();
    let runtime = Consumer::new(
        db.pool(4),
        Some(db.config.clone()),
        config,
        recorder.clone(),
        recorder.clone(),
    );
    let token = shutdown.clone();
    (
        shutdown,
        tokio::spawn(async move { runtime.run(token).await }),
    )
}

/// Numbers what waits as the build that migrated to `version` did: the work-list numbering
/// before migration 10, the frontier's from then on (this build's sequencer from 14).
async fn number_as_of(client: &mut tokio_postgres::Client, version: usize) -> u64 {
    if version < 10 {
        legacy::number_pending(client).await
    } else if version < 14 {
        legacy::number_from_frontier(client, version).await
    } else {
        Sequencer::new(&Schema::default())
            .drain(client)
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn upgrade_from_0001_keeps_live_data_and_consumers_continue() {
    upgrade_keeps_live_data_and_consumers_continue(1).await;
}

/// Migration 11 moves every cursor into the positions table.
#[tokio::test]
async fn upgrade_from_0010_keeps_live_data_and_consumers_continue() {
    upgrade_keeps_live_data_and_consumers_continue(10).await;
}

/// Migration 12 moves lease renewals into their own table: a lease held across it keeps the
/// expiry its consumer row records, and this build takes it over only once that has passed.
#[tokio::test]
async fn upgrade_from_0011_keeps_live_data_and_consumers_continue() {
    upgrade_keeps_live_data_and_consumers_continue(11).await;
}

async fn upgrade_keeps_live_data_and_consumers_continue(from: usize) {
    let db = empty_db().await;
    {
        let mut client = db.connect().await;
        migrate_with(&mut client, &Schema::default(), &MIGRATIONS[..from])
            .await
            .unwrap();
        client.batch_execute(TASKS_TABLE).await.unwrap();
    }
    let mut ids = Vec::new();
    for task in ["t1", "t2", "poison", "t4", "slow", "t6"] {
        ids.push(write_event(&db, "p", task).await);
    }
    // The state a build of migration `from` left behind (this build's consumers need the later
    // migrations, so it is written as that build wrote it): the events numbered by that
    // build's sequencer; c-dead parked "poison" and passed it; c-retry holds at "slow" with a
    // retry due later; c-live's process still holds its lease.
    let mut client = db.connect().await;
    assert_eq!(number_as_of(&mut client, from).await, 6);
    seed_consumer(&db, "p", "c-dead", Some(6), false).await;
    seed_delivery(&db, "p", "c-dead", SeedEvent::Id(&ids[2]), "dead", 2, 0).await;
    seed_consumer(&db, "p", "c-retry", Some(4), false).await;
    seed_delivery(
        &db,
        "p",
        "c-retry",
        SeedEvent::Id(&ids[4]),
        "retrying",
        1,
        0,
    )
    .await;
    seed_consumer(&db, "p", "c-live", Some(6), false).await;
    // The consumer rows are `lifecycle_consumers` from migration 11 on.
    let consumers = if from >= 11 {
        "lifecycle_consumers"
    } else {
        "lifecycle_consumer_cursors"
    };
    let lease_given_at = std::time::Instant::now();
    client
        .execute(
            &format!(
                "UPDATE outbox.{consumers} \
                 SET lease_owner = 'old-build:1:a', lease_generation = 1, \
                     lease_expires_at = now() + interval '2 seconds', heartbeat_at = now() \
                 WHERE consumer_id = 'c-live'"
            ),
            &[],
        )
        .await
        .unwrap();
    let (dead, retry, live) = (
        Recorder::default(),
        Recorder::default(),
        Recorder::default(),
    );
    retry.fail_task("slow");

    let before = state(&db).await;
    assert!(
        before
            .iter()
            .any(|l| l.starts_with("delivery c-dead") && l.ends_with("dead"))
    );
    assert!(
        before
            .iter()
            .any(|l| l.starts_with("delivery c-retry") && l.ends_with("retrying"))
    );

    // The upgrade, with c-live's lease held.
    let (code, out, err) = run_outbox(&["--database-url", &db.url, "migrate"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("applied migration(s)"), "{out}");
    assert_eq!(state(&db).await, before, "the upgrade changed no row");
    let mut client = db.connect().await;
    let report = migrate(&mut client, &Schema::default()).await.unwrap();
    assert_eq!(report.already_applied, all_versions());

    // New events after the upgrade: every consumer continues from its own cursor.
    for task in ["t7", "t8"] {
        write_event(&db, "p", task).await;
    }
    // c-live's old process is gone; this build takes its lease over once it expires.
    let (stop_live, run_live) = start(
        &db,
        "c-live",
        &live,
        RetrySchedule::new(vec![Duration::from_millis(10)], 3).unwrap(),
    );
    eventually(WAIT, "c-live to continue after the upgrade", || async {
        cursor(&db, "p", "c-live").await == Some(8)
    })
    .await;
    assert!(
        lease_given_at.elapsed() >= Duration::from_secs(2),
        "c-live's lease was taken before the expiry it was given"
    );
    stop_live.cancel();
    let summary = run_live.await.unwrap().unwrap();
    assert_eq!(summary.generation, 2, "the old lease's generation was kept");
    assert_eq!(live.sequences(), vec![7, 8]);

    let (stop, run) = start(
        &db,
        "c-dead",
        &dead,
        RetrySchedule::new(vec![Duration::from_millis(10)], 2).unwrap(),
    );
    eventually(WAIT, "c-dead to continue", || async {
        cursor(&db, "p", "c-dead").await == Some(8)
    })
    .await;
    stop.cancel();
    run.await.unwrap().unwrap();
    let after: Vec<i64> = dead.sequences().into_iter().filter(|s| *s > 6).collect();
    assert_eq!(after, vec![7, 8], "from its cursor, nothing repeated");

    retry.heal_task("slow");
    let (stop, run) = start(
        &db,
        "c-retry",
        &retry,
        RetrySchedule::new(vec![Duration::from_millis(10)], 5).unwrap(),
    );
    // Its saved retry state survived: the held event is retried at its saved due time
    // (an hour away), so nothing after it is delivered yet.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(cursor(&db, "p", "c-retry").await, Some(4));
    stop.cancel();
    run.await.unwrap().unwrap();
    let still = state(&db).await;
    assert!(
        still
            .iter()
            .any(|l| l.starts_with("delivery c-retry") && l.ends_with("1 retrying")),
        "{still:?}"
    );
}

/// Events of one project, `(sequence, task)` in sequence order.
async fn numbered(client: &tokio_postgres::Client, project: &str) -> Vec<(Option<i64>, String)> {
    client
        .query(
            "SELECT sequence, task_id FROM outbox.lifecycle_outbox WHERE project_id = $1 \
             ORDER BY sequence NULLS LAST, task_id",
            &[&project],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// From every earlier version: events numbered by the old sequencer and events still waiting
/// for a number when the upgrade runs. The upgrade numbers the waiting ones after the numbered
/// ones, in arrival order; the new sequencer then continues each project densely from its
/// head, and the heads read as before.
#[tokio::test]
async fn upgrade_from_every_earlier_version_numbers_what_waited_and_continues() {
    let write = "SELECT outbox.write_task_deleted($1, $2, now(), 'w')";
    for from in 1..MIGRATIONS.len() {
        let db = empty_db().await;
        let mut client = db.connect().await;
        migrate_with(&mut client, &Schema::default(), &MIGRATIONS[..from])
            .await
            .unwrap();
        for task in ["a1", "a2", "a3"] {
            client.execute(write, &[&"p", &task]).await.unwrap();
        }
        assert_eq!(number_as_of(&mut client, from).await, 3, "from {from}");
        for (project, task) in [("p", "a4"), ("p", "a5"), ("q", "b1")] {
            client.execute(write, &[&project, &task]).await.unwrap();
        }

        migrate(&mut client, &Schema::default()).await.unwrap();
        // Before migration 10 the upgrade itself numbers what waited; from 10 on, the
        // sequencer does, as it did before the upgrade.
        let waited = Sequencer::new(&Schema::default())
            .drain(&mut client)
            .await
            .unwrap();
        assert_eq!(waited, if from < 10 { 0 } else { 3 }, "from {from}");
        let expected = |tasks: &[&str]| {
            tasks
                .iter()
                .enumerate()
                .map(|(i, t)| (Some(i as i64 + 1), t.to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            numbered(&client, "p").await,
            expected(&["a1", "a2", "a3", "a4", "a5"]),
            "from {from}"
        );
        assert_eq!(
            numbered(&client, "q").await,
            expected(&["b1"]),
            "from {from}"
        );

        for (project, task) in [("q", "b2"), ("p", "a6"), ("r", "c1")] {
            client.execute(write, &[&project, &task]).await.unwrap();
        }
        let ticked = Sequencer::new(&Schema::default())
            .drain(&mut client)
            .await
            .unwrap();
        assert_eq!(ticked, 3, "from {from}");
        assert_eq!(
            numbered(&client, "p").await,
            expected(&["a1", "a2", "a3", "a4", "a5", "a6"]),
            "from {from}"
        );
        assert_eq!(
            numbered(&client, "q").await,
            expected(&["b1", "b2"]),
            "from {from}"
        );
        let heads: Vec<(String, i64)> = client
            .query(
                "SELECT project_id, head_sequence FROM outbox.lifecycle_project_heads \
                 ORDER BY project_id",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        assert_eq!(
            heads,
            vec![("p".into(), 6), ("q".into(), 2), ("r".into(), 1)],
            "from {from}"
        );
        // The upgraded schema knows task:deleted@1, and the generic writer writes it as the
        // original writer does, numbered after everything written before the upgrade.
        let generic: String = client
            .query_one(
                "SELECT outbox.write_event('p', 'task:deleted', 1, 'a7',                  jsonb_build_object('deleted_at', now()), 'w')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            generic.starts_with("task-deleted:a7:"),
            "from {from}: {generic}"
        );
        Sequencer::new(&Schema::default())
            .drain(&mut client)
            .await
            .unwrap();
        assert_eq!(
            numbered(&client, "p").await,
            expected(&["a1", "a2", "a3", "a4", "a5", "a6", "a7"]),
            "from {from}"
        );
    }
}

/// A schema that reached migrations 1, 3 and 4 before the roles existed gets 2 and 5 onwards,
/// and the roles can then use what 3 and 4 added (their grants are column by column).
#[tokio::test]
async fn roles_added_after_later_migrations_get_their_grants() {
    let db = empty_db().await;
    let mut client = db.connect().await;
    let without_roles: Vec<_> = MIGRATIONS
        .iter()
        .filter(|m| [1, 3, 4].contains(&m.version))
        .copied()
        .collect();
    migrate_with(&mut client, &Schema::default(), &without_roles)
        .await
        .unwrap();
    let rest: Vec<_> = MIGRATIONS
        .iter()
        .map(|m| m.version)
        .filter(|v| ![1, 3, 4].contains(v))
        .collect();
    assert_eq!(rest[..3], [2, 5, 6]);
    let report = dry_run(&db).await;
    assert_eq!(versions(&report["pending"]), rest);
    let report = migrate(&mut client, &Schema::default()).await.unwrap();
    assert_eq!(report.applied, rest);
    let row = client
        .query_one(
            "SELECT has_column_privilege('outbox_consumer', 'outbox.lifecycle_consumer_positions', \
                    'last_acked_at', 'INSERT') AS consumer_stamps_acks, \
                    has_any_column_privilege('outbox_consumer', \
                    'outbox.lifecycle_sequencer_lease', 'UPDATE') AS consumer_sequences, \
                    has_column_privilege('outbox_operator', 'outbox.lifecycle_deliveries', \
                    'replay_requested_by', 'UPDATE') AS operator_names_replays, \
                    has_table_privilege('outbox_writer', 'outbox.lifecycle_sequencer_lease', \
                    'SELECT') AS writer_sees_lease, \
                    has_column_privilege('outbox_consumer', 'outbox.lifecycle_lease_renewals', \
                    'heartbeat_at', 'INSERT') AS consumer_renews, \
                    has_table_privilege('outbox_operator', 'outbox.lifecycle_lease_renewals', \
                    'SELECT') AS operator_sees_renewals",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>("consumer_stamps_acks"));
    assert!(row.get::<_, bool>("consumer_sequences"));
    assert!(row.get::<_, bool>("operator_names_replays"));
    assert!(!row.get::<_, bool>("writer_sees_lease"));
    assert!(row.get::<_, bool>("consumer_renews"));
    assert!(row.get::<_, bool>("operator_sees_renewals"));
}
