//! The operator surface as an operator types it: `outbox status`, `consumers list|retire`,
//! `dead-letters list|show|replay|resolve` and `audit`, run as the real binary against a real
//! PostgreSQL, with the consumer runtime acting on what the operator asked for.

use std::time::Duration;

use outbox_consumer::{ConsumerError, RetrySchedule};
use outbox_core::Schema;
use outbox_core::sequencer::Sequencer;
use outbox_tests::consumer_kit::{
    Recorder, SeedCursor, SeedEvent, WAIT, cursor, eventually, fast_config, seed_consumer,
    seed_delivery, start, write_event,
};
use outbox_tests::process_kit::{ConsumeProcess, outbox_json, outbox_on as outbox, run_outbox};
use outbox_tests::stats_kit::{
    BIG_PROJECT, SMALL_PROJECT, assert_only_the_work_list_read, assert_the_counters_move,
    event_table_reads, stale_statistics,
};
use outbox_tests::{TestDb, fresh_db};
use serde_json::Value;

/// Runs a command expected to fail with `code`; returns its stderr.
async fn outbox_fails(db: &TestDb, code: i32, args: &[&str]) -> String {
    let (actual, out, err) = outbox(db, args).await;
    assert_eq!(
        actual, code,
        "outbox {args:?}: expected exit {code}, got {actual}\nstdout: {out}\nstderr: {err}"
    );
    assert!(
        out.is_empty(),
        "a failed command prints nothing on stdout: {out}"
    );
    err
}

async fn sequence(db: &TestDb) {
    let mut client = db.connect().await;
    Sequencer::new(&Schema::default())
        .drain(&mut client)
        .await
        .unwrap();
}

/// Writes and numbers an event for `task`, and records `consumer`'s delivery of it in
/// `state` with `attempts`, as the runtime would have; returns the event ID.
async fn seed_letter(
    db: &TestDb,
    project: &str,
    consumer: &str,
    task: &str,
    state: &str,
    attempts: i32,
) -> String {
    let event = write_event(db, project, task).await;
    sequence(db).await;
    seed_consumer(db, project, consumer, SeedCursor::Head, false).await;
    seed_delivery(
        db,
        project,
        consumer,
        SeedEvent::Id(&event),
        state,
        attempts,
        0,
    )
    .await;
    event
}

/// (state, attempts) of one delivery.
async fn delivery(db: &TestDb, project: &str, consumer: &str, event: &str) -> (String, i32) {
    let row = db
        .connect()
        .await
        .query_one(
            "SELECT state, attempts FROM outbox.lifecycle_deliveries \
             WHERE project_id = $1 AND consumer_id = $2 AND event_id = $3",
            &[&project, &consumer, &event],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Audit rows as (kind without prefix, event, actor, count), oldest first.
async fn audit(db: &TestDb) -> Vec<(String, Option<String>, Option<String>, Option<i64>)> {
    db.connect()
        .await
        .query(
            "SELECT replace(kind, 'lifecycle-observation:', ''), event_id, actor, count \
             FROM outbox.lifecycle_audit ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect()
}

fn health(value: &Value) -> Vec<&str> {
    value["health"]
        .as_array()
        .expect("health is a list")
        .iter()
        .map(|code| code.as_str().unwrap())
        .collect()
}

/// The column names of a rendered table.
fn header(table: &str) -> Vec<&str> {
    table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect()
}

fn by_id<'a>(items: &'a Value, key: &str, id: &str) -> &'a Value {
    items
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item[key] == id)
        .unwrap_or_else(|| panic!("no {key} = {id} in {items}"))
}

#[tokio::test]
async fn status_and_listings_in_table_and_json_with_health_codes() {
    let db = fresh_db().await;
    // Project p: three events. c-ok is at the head with a fresh lease and one dead letter;
    // c-behind is at 0 with event 1 failing for 20 minutes; c-stale holds a lease whose
    // heartbeat is a minute old.
    let dead = seed_letter(&db, "p", "c-ok", "t1", "dead", 10).await;
    write_event(&db, "p", "t2").await;
    write_event(&db, "p", "t3").await;
    sequence(&db).await;
    let client = db.connect().await;
    client
        .batch_execute(
            "UPDATE outbox.lifecycle_consumers \
             SET lease_owner = 'host:1:aa', lease_generation = 2, \
                 claimed_until = now() + interval '50 seconds', claimed_at = now() \
             WHERE consumer_id = 'c-ok'; \
             INSERT INTO outbox.lifecycle_consumers (project_id, consumer_id, lease_owner, \
                 lease_generation, claimed_until, claimed_at) \
             VALUES ('p', 'c-behind', NULL, 1, NULL, now() - interval '1 hour'), \
                    ('p', 'c-stale', 'host:2:bb', 5, now() - interval '1 second', \
                     now() - interval '1 minute'); \
             INSERT INTO outbox.lifecycle_consumer_positions \
                 (project_id, consumer_id, last_acked_sequence) \
             VALUES ('p', 'c-ok', 3), ('p', 'c-behind', 0), ('p', 'c-stale', 3);",
        )
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO outbox.lifecycle_deliveries (project_id, consumer_id, event_id, \
                 sequence, attempts, next_attempt_at, last_failure_class, state, \
                 first_failed_at) \
             SELECT 'p', 'c-behind', event_id, 1, 7, now() + interval '15 minutes', \
                    'http_503', 'retrying', now() - interval '20 minutes' \
             FROM outbox.lifecycle_outbox WHERE project_id = 'p' AND sequence = 1",
            &[],
        )
        .await
        .unwrap();
    // Project q: a committed event nobody numbered for two minutes (no sequencer running).
    client
        .execute(
            "INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, \
                 deleted_at, writer_process_id, occurred_at, payload_version, payload) \
             VALUES ('q', 'task:deleted', 'task-deleted:x:2026-01-01T00:00:00.000000Z', 'x', \
                     '2026-01-01T00:00:00Z', 'w', now() - interval '2 minutes', 1, '{}')",
            &[],
        )
        .await
        .unwrap();

    let status = outbox_json(&db, &["status", "--max-lag", "2"]).await;
    let p = by_id(&status["projects"], "project_id", "p");
    assert_eq!(p["head_sequence"], 3);
    assert_eq!(p["unsequenced"], 0);
    assert_eq!(p["pruned_through"], 0);
    assert_eq!(health(p), ["ok"]);
    let q = by_id(&status["projects"], "project_id", "q");
    assert_eq!(q["head_sequence"], 0);
    assert_eq!(q["unsequenced"], 1);
    assert!(q["oldest_unsequenced_age_secs"].as_f64().unwrap() >= 120.0);
    assert_eq!(health(q), ["sequencer_stalled"]);
    assert_eq!(status["thresholds"]["max_lag"], 2);

    let consumers = &status["consumers"];
    assert_eq!(consumers.as_array().unwrap().len(), 3);
    let ok = by_id(consumers, "consumer_id", "c-ok");
    assert_eq!(ok["cursor"], 3);
    assert_eq!(ok["lag"], 0);
    assert_eq!(ok["lease_owner"], "host:1:aa");
    assert_eq!(ok["lease_generation"], 2);
    assert_eq!(ok["lease_live"], true);
    assert_eq!(ok["dead_letters"], 1);
    assert_eq!(ok["state"], "active");
    assert_eq!(ok["retrying"], Value::Null);
    assert_eq!(health(ok), ["dead_letters"]);
    let behind = by_id(consumers, "consumer_id", "c-behind");
    assert_eq!(behind["lag"], 3);
    assert_eq!(behind["retrying"]["sequence"], 1);
    assert_eq!(behind["retrying"]["attempts"], 7);
    assert_eq!(behind["retrying"]["last_failure_class"], "http_503");
    assert!(behind["retrying"]["next_attempt_at"].is_string());
    assert_eq!(
        health(behind),
        ["lagging", "stuck_retrying", "not_running"],
        "a released lease is not a stale heartbeat; with events waiting, nobody runs it"
    );
    let stale = by_id(consumers, "consumer_id", "c-stale");
    assert_eq!(stale["lease_live"], false);
    assert_eq!(
        health(stale),
        ["ok"],
        "an expired lease is no longer a stale heartbeat, and nothing waits for c-stale"
    );

    // The same in a table, with defaults: nothing lags by 10000 events.
    let (code, table, _) = outbox(&db, &["status"]).await;
    assert_eq!(code, 0);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        header(&table),
        [
            "PROJECT",
            "HEAD",
            "UNSEQUENCED",
            "OLDEST_UNSEQUENCED",
            "PRUNED_THROUGH",
            "PRUNABLE",
            "OLDEST_RETAINED",
            "HELD_BY",
            "HEALTH"
        ]
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("q ") && l.ends_with("sequencer_stalled")),
        "{table}"
    );
    let consumers_header = lines
        .iter()
        .position(|l| l.starts_with("PROJECT") && l.contains("CONSUMER"))
        .expect("a consumers table");
    assert_eq!(
        header(lines[consumers_header]),
        [
            "PROJECT",
            "CONSUMER",
            "STATE",
            "CURSOR",
            "LAG",
            "HANDLED_AHEAD",
            "LEASE_OWNER",
            "GEN",
            "LEASE_LEFT",
            "HEARTBEAT_AGE",
            "RETRYING",
            "ATTEMPTS",
            "NEXT_ATTEMPT",
            "DEAD_LETTERS",
            "HEALTH"
        ]
    );
    // In the consumers table: the projects table's HELD_BY names c-behind too.
    let behind_line = lines[consumers_header..]
        .iter()
        .find(|l| l.contains("c-behind"))
        .expect("c-behind row");
    assert!(
        behind_line.ends_with("stuck_retrying,not_running"),
        "{behind_line}"
    );
    assert!(
        behind_line.contains(&format!("{dead} (seq 1)")),
        "{behind_line}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("c-stale") && l.contains("expired") && l.contains("1m0")),
        "{table}"
    );

    // As a monitoring probe: the same table, then exit 5 naming every code that is not ok.
    let (code, checked, err) = outbox(&db, &["status", "--check"]).await;
    assert_eq!(code, 5, "{err}");
    assert_eq!(checked.lines().count(), table.lines().count());
    assert!(
        err.contains("consumer c-behind of project p: stuck_retrying,not_running")
            && err.contains("consumer c-ok of project p: dead_letters"),
        "{err}"
    );
    let (code, json, _) = outbox(&db, &["status", "--check", "--output", "json"]).await;
    assert_eq!(code, 5);
    assert!(serde_json::from_str::<Value>(&json).is_ok(), "{json}");

    // One project only; an unknown project is not found.
    let only_q = outbox_json(&db, &["status", "--project", "q"]).await;
    assert_eq!(only_q["projects"].as_array().unwrap().len(), 1);
    assert_eq!(only_q["consumers"].as_array().unwrap().len(), 0);
    let err = outbox_fails(&db, 3, &["status", "--project", "nope"]).await;
    assert!(err.contains("project nope not found"), "{err}");

    // consumers list.
    let list = outbox_json(&db, &["consumers", "list", "--project", "p"]).await;
    let ids: Vec<&str> = list["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["consumer_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c-behind", "c-ok", "c-stale"]);
    let none = outbox_json(&db, &["consumers", "list", "--project", "q"]).await;
    assert_eq!(none["consumers"], Value::Array(vec![]));
    let (code, table, _) = outbox(&db, &["consumers", "list"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        header(&table)[..5],
        ["PROJECT", "CONSUMER", "STATE", "CURSOR", "LAG"]
    );
    assert_eq!(table.lines().count(), 4, "{table}");

    // dead-letters list: dead letters by default, retrying deliveries when asked.
    let letters = outbox_json(&db, &["dead-letters", "list"]).await;
    let items = letters["dead_letters"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["event_id"], dead.as_str());
    assert_eq!(items[0]["state"], "dead");
    assert_eq!(items[0]["attempts"], 10);
    assert_eq!(letters["truncated"], false);
    let retrying_list = outbox_json(
        &db,
        &[
            "dead-letters",
            "list",
            "--project",
            "p",
            "--state",
            "retrying",
        ],
    )
    .await;
    assert_eq!(retrying_list["dead_letters"][0]["consumer_id"], "c-behind");
    let truncated = outbox_json(
        &db,
        &[
            "dead-letters",
            "list",
            "--state",
            "dead,retrying",
            "--limit",
            "1",
        ],
    )
    .await;
    assert_eq!(truncated["dead_letters"].as_array().unwrap().len(), 1);
    assert_eq!(truncated["truncated"], true);
    let (code, table, _) = outbox(&db, &["dead-letters", "list", "--consumer-id", "c-ok"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        header(&table)[..4],
        ["PROJECT", "CONSUMER", "EVENT_ID", "SEQUENCE"]
    );
    assert!(
        table.contains(&dead) && table.contains("forced_failure"),
        "{table}"
    );

    // dead-letters show: the delivery with its event.
    let letter = [
        "--project",
        "p",
        "--consumer-id",
        "c-ok",
        "--event-id",
        dead.as_str(),
    ];
    let show = outbox_json(&db, &[&["dead-letters", "show"][..], &letter].concat()).await;
    assert_eq!(show["event_id"], dead.as_str());
    assert_eq!(show["state"], "dead");
    assert_eq!(show["event"]["task_id"], "t1");
    assert_eq!(show["event"]["event_type"], "task:deleted");
    assert_eq!(show["event"]["writer_process_id"], "test-writer");
    let (code, block, _) = outbox(&db, &[&["dead-letters", "show"][..], &letter].concat()).await;
    assert_eq!(code, 0);
    assert!(
        block
            .lines()
            .any(|l| l.starts_with("task_id") && l.ends_with("t1")),
        "{block}"
    );
    assert!(
        block
            .lines()
            .any(|l| l.starts_with("state") && l.ends_with("dead")),
        "{block}"
    );
}

/// `outbox status` counts each project's unsequenced events from the work list, however stale
/// the statistics: for every project, for the project holding most of the table and for a small
/// one, it neither scans the whole event table nor walks a project's whole history.
#[tokio::test]
async fn status_reads_the_work_list_under_stale_statistics() {
    let db = fresh_db().await;
    stale_statistics(&db).await;
    let mut reads = Vec::new();
    for args in [
        vec!["status"],
        vec!["status", "--project", BIG_PROJECT],
        vec!["status", "--project", SMALL_PROJECT],
    ] {
        let before = event_table_reads(&db).await;
        let status = outbox_json(&db, &args).await;
        let projects = status["projects"].as_array().unwrap();
        assert_eq!(projects.len(), if args.len() == 1 { 201 } else { 1 });
        assert!(projects.iter().all(|p| p["unsequenced"] == 0), "{status}");
        reads.push((args, before, event_table_reads(&db).await));
    }
    let last = reads.last().expect("readings").2;
    for (args, before, after) in reads {
        assert_only_the_work_list_read(&format!("{args:?}"), before, after);
    }
    assert_the_counters_move(&db, last).await;
}

#[tokio::test]
async fn a_replay_is_redispatched_by_the_running_consumer_fails_back_to_dead_then_succeeds() {
    let db = fresh_db().await;
    for task in ["a", "poison", "b"] {
        write_event(&db, "p", task).await;
    }
    let recorder = Recorder::default();
    recorder.fail_task("poison");
    let mut config = fast_config("p", "c");
    config.delivery.retry = RetrySchedule::new(vec![Duration::from_millis(10)], 3).unwrap();
    let (shutdown, run) = start(&db, config, &recorder);
    eventually(WAIT, "the stream to pass the parked event", || async {
        cursor(&db, "p", "c").await == Some(3)
    })
    .await;
    let listed = outbox_json(
        &db,
        &[
            "dead-letters",
            "list",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--state",
            "dead",
        ],
    )
    .await;
    let poison = listed["dead_letters"][0]["event_id"]
        .as_str()
        .expect("one dead letter")
        .to_owned();
    assert_eq!(listed["dead_letters"][0]["attempts"], 3);
    let letter = [
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--event-id",
        poison.as_str(),
    ];
    let replay = [&["dead-letters", "replay", "--by", "bob"][..], &letter].concat();

    // Replay while the handler still fails: re-dispatched once, back to dead, counted, audited.
    let requested = outbox_json(&db, &replay).await;
    assert_eq!(requested["requested"], serde_json::json!([poison]));
    eventually(WAIT, "the failed replay to return to dead", || async {
        delivery(&db, "p", "c", &poison).await == ("dead".into(), 4)
    })
    .await;
    let poisoned: Vec<_> = audit(&db)
        .await
        .into_iter()
        .filter(|(kind, ..)| kind == "consumer-poisoned")
        .collect();
    assert_eq!(
        poisoned,
        vec![
            (
                "consumer-poisoned".into(),
                Some(poison.clone()),
                None,
                Some(3)
            ),
            (
                "consumer-poisoned".into(),
                Some(poison.clone()),
                Some("bob".into()),
                Some(4)
            ),
        ],
        "the failed replay names who asked for it"
    );
    let requests: Vec<_> = audit(&db)
        .await
        .into_iter()
        .filter(|(kind, ..)| kind == "dead-letter-replay-requested")
        .collect();
    assert_eq!(
        requests,
        vec![(
            "dead-letter-replay-requested".into(),
            Some(poison.clone()),
            Some("bob".into()),
            Some(3)
        )],
        "the request itself is audited, with its actor"
    );

    // Replay after the fix: replayed and audited; the handler saw it flagged as a replay.
    recorder.heal_task("poison");
    let (code, out, err) = outbox(&db, &replay).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("replay requested by bob for 1 dead letter(s)"),
        "{out}"
    );
    eventually(WAIT, "the replay to succeed", || async {
        delivery(&db, "p", "c", &poison).await.0 == "replayed"
    })
    .await;
    let replays: Vec<_> = recorder
        .events()
        .into_iter()
        .filter(|e| e.task_id == "poison" && e.replay)
        .map(|e| e.attempt)
        .collect();
    assert_eq!(
        replays,
        vec![4, 5],
        "two replays, attempts continuing the count"
    );
    let trail = outbox_json(
        &db,
        &["audit", "--project", "p", "--kind", "consumer-replayed"],
    )
    .await;
    let rows = trail["audit"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["event_id"], poison.as_str());
    assert_eq!(rows[0]["kind"], "lifecycle-observation:consumer-replayed");
    assert_eq!(rows[0]["actor"], "bob", "the replay names who asked for it");

    // A replayed letter is not dead: neither replay nor resolve applies.
    let err = outbox_fails(&db, 4, &replay).await;
    assert!(
        err.contains(&format!(
            "dead letter {poison} of consumer c in project p is replayed, not dead"
        )),
        "{err}"
    );
    let err = outbox_fails(
        &db,
        4,
        &[
            &["dead-letters", "resolve"][..],
            &letter,
            &["--by", "alice", "--reason", "done"],
        ]
        .concat(),
    )
    .await;
    assert!(err.contains("is replayed, not dead"), "{err}");
    // --all with nothing dead is fine and says so.
    let (code, out, _) = outbox(
        &db,
        &[
            "dead-letters",
            "replay",
            "--by",
            "bob",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--all",
        ],
    )
    .await;
    assert_eq!(code, 0);
    assert!(
        out.contains("has no dead letters that can be replayed"),
        "{out}"
    );

    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(
        cursor(&db, "p", "c").await,
        Some(3),
        "replays never move the cursor"
    );
}

/// A replay is served only by the lease holder: requested for a consumer nobody runs, it
/// waits, and `status` says so with a code of its own until a process takes the lease.
#[tokio::test]
async fn a_replay_requested_while_nobody_runs_the_consumer_is_replay_unserved() {
    let db = fresh_db().await;
    let event = seed_letter(&db, "p", "c", "t1", "dead", 3).await;
    let consumer_health = |status: &Value| -> Vec<String> {
        health(by_id(&status["consumers"], "consumer_id", "c"))
            .into_iter()
            .map(str::to_owned)
            .collect()
    };
    let status = outbox_json(&db, &["status"]).await;
    assert_eq!(consumer_health(&status), vec!["dead_letters"]);

    let replay = [
        "dead-letters",
        "replay",
        "--by",
        "bob",
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--all",
    ];
    let (code, _, err) = outbox(&db, &replay).await;
    assert_eq!(code, 0, "{err}");
    let status = outbox_json(&db, &["status"]).await;
    assert_eq!(consumer_health(&status), vec!["replay_unserved"]);
    let (code, out, err) = outbox(&db, &["status", "--check"]).await;
    assert_eq!(code, 5, "{out}\n{err}");
    assert!(
        err.contains("consumer c of project p: replay_unserved"),
        "{err}"
    );
    assert!(out.contains("replay_unserved"), "{out}");

    // Once a process holds the lease, it serves the request and the code clears.
    let recorder = Recorder::default();
    let (shutdown, run) = start(&db, fast_config("p", "c"), &recorder);
    eventually(WAIT, "the replay to be served", || async {
        delivery(&db, "p", "c", &event).await.0 == "replayed"
    })
    .await;
    let status = outbox_json(&db, &["status"]).await;
    assert_eq!(consumer_health(&status), vec!["ok"]);
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn replay_all_marks_every_dead_letter_and_skips_pruned_events() {
    let db = fresh_db().await;
    let one = seed_letter(&db, "p", "c", "one", "dead", 10).await;
    let two = seed_letter(&db, "p", "c", "two", "dead", 10).await;
    let gone = seed_letter(&db, "p", "c", "gone", "dead", 10).await;
    let resolved = seed_letter(&db, "p", "c", "done", "resolved", 10).await;
    // Retention pruned one event (the dead letter row stays until resolved).
    db.connect()
        .await
        .execute(
            "DELETE FROM outbox.lifecycle_outbox WHERE event_id = $1",
            &[&gone],
        )
        .await
        .unwrap();
    let err = outbox_fails(
        &db,
        4,
        &[
            "dead-letters",
            "replay",
            "--by",
            "bob",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--event-id",
            &gone,
        ],
    )
    .await;
    assert!(
        err.contains(&format!(
            "dead letter {gone} of consumer c in project p is dead"
        )) && err.contains("retention pruned its event"),
        "{err}"
    );
    let show = outbox_json(
        &db,
        &[
            "dead-letters",
            "show",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--event-id",
            &gone,
        ],
    )
    .await;
    assert_eq!(show["event"], Value::Null);

    let request = outbox_json(
        &db,
        &[
            "dead-letters",
            "replay",
            "--by",
            "bob",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--all",
        ],
    )
    .await;
    assert_eq!(request["requested"], serde_json::json!([one, two]));
    assert_eq!(request["skipped_pruned"], serde_json::json!([gone]));
    assert_eq!(delivery(&db, "p", "c", &one).await.0, "replay_requested");
    assert_eq!(delivery(&db, "p", "c", &two).await.0, "replay_requested");
    assert_eq!(delivery(&db, "p", "c", &gone).await.0, "dead");
    assert_eq!(delivery(&db, "p", "c", &resolved).await.0, "resolved");

    // Asking again: replay_requested is not dead.
    let err = outbox_fails(
        &db,
        4,
        &[
            "dead-letters",
            "replay",
            "--by",
            "bob",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--event-id",
            &one,
        ],
    )
    .await;
    assert!(
        err.contains(&format!(
            "dead letter {one} of consumer c in project p is replay_requested, not dead"
        )),
        "{err}"
    );
    // A pending replay can still be resolved instead.
    let (code, out, err) = outbox(
        &db,
        &[
            "dead-letters",
            "resolve",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--event-id",
            &one,
            "--by",
            "bob",
            "--reason",
            "handled upstream",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("(was replay_requested after 10 attempt(s)) by bob"),
        "{out}"
    );
}

#[tokio::test]
async fn resolve_records_who_and_why_on_the_letter_and_only_ids_in_the_audit() {
    let db = fresh_db().await;
    let event = seed_letter(&db, "p", "c", "t1", "dead", 10).await;
    let reason = "task restored by hand — see ticket OPS-12";
    let resolve = [
        "dead-letters",
        "resolve",
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--event-id",
        event.as_str(),
        "--by",
        "alice@ops",
        "--reason",
        reason,
    ];
    let done = outbox_json(&db, &resolve).await;
    assert_eq!(done["previous_state"], "dead");
    assert_eq!(done["resolved_by"], "alice@ops");
    assert_eq!(done["attempts"], 10);

    let row = db
        .connect()
        .await
        .query_one(
            "SELECT state, resolved_by, resolved_reason, resolved_at IS NOT NULL \
             FROM outbox.lifecycle_deliveries WHERE event_id = $1",
            &[&event],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "resolved");
    assert_eq!(row.get::<_, String>(1), "alice@ops");
    assert_eq!(row.get::<_, String>(2), reason);
    assert!(row.get::<_, bool>(3));
    assert_eq!(
        audit(&db).await,
        vec![(
            "dead-letter-resolved".into(),
            Some(event.clone()),
            Some("alice@ops".into()),
            Some(10)
        )]
    );
    let leaked: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_audit AS a \
             WHERE row_to_json(a)::text LIKE '%restored%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        leaked, 1,
        "the reason is on the resolution's audit row, and only there"
    );
    let trail = outbox_json(&db, &["audit", "--kind", "dead-letter-resolved"]).await;
    assert_eq!(trail["audit"][0]["reason"], reason);

    // Shown with who and why; resolving or replaying again is a conflict naming the state.
    let show = outbox_json(
        &db,
        &[
            "dead-letters",
            "show",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--event-id",
            &event,
        ],
    )
    .await;
    assert_eq!(show["resolved_reason"], reason);
    let err = outbox_fails(&db, 4, &resolve).await;
    assert!(
        err.contains(&format!(
            "dead letter {event} of consumer c in project p is resolved, not dead \
             (resolved by alice@ops at "
        )),
        "{err}"
    );
    let err = outbox_fails(
        &db,
        4,
        &[
            "dead-letters",
            "replay",
            "--by",
            "bob",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--event-id",
            &event,
        ],
    )
    .await;
    assert!(err.contains("is resolved, not dead"), "{err}");
    assert_eq!(
        audit(&db).await.len(),
        1,
        "refused operations write nothing"
    );

    // The audit command shows it, in a table and as JSON.
    let (code, table, _) = outbox(&db, &["audit", "--consumer-id", "c"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        header(&table),
        [
            "ID", "RECORDED", "KIND", "PROJECT", "CONSUMER", "EVENT_ID", "ACTOR", "COUNT", "REASON"
        ]
    );
    assert!(
        table
            .lines()
            .any(|l| l.contains("dead-letter-resolved") && l.contains("alice@ops")),
        "{table}"
    );
    let trail = outbox_json(&db, &["audit", "--event-id", &event, "--limit", "5"]).await;
    assert_eq!(trail["audit"][0]["actor"], "alice@ops");
    assert_eq!(trail["truncated"], false);
}

#[tokio::test]
async fn concurrent_resolutions_apply_once() {
    let db = fresh_db().await;
    let event = seed_letter(&db, "p", "c", "t1", "dead", 10).await;
    let args = |by: &'static str| {
        vec![
            "dead-letters".to_owned(),
            "resolve".into(),
            "--project".into(),
            "p".into(),
            "--consumer-id".into(),
            "c".into(),
            "--event-id".into(),
            event.clone(),
            "--by".into(),
            by.into(),
            "--reason".into(),
            "racing".into(),
        ]
    };
    let (a, b) = (args("alice"), args("bob"));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let b: Vec<&str> = b.iter().map(String::as_str).collect();
    let ((code_a, _, err_a), (code_b, _, err_b)) = tokio::join!(outbox(&db, &a), outbox(&db, &b));
    let mut codes = [code_a, code_b];
    codes.sort();
    assert_eq!(codes, [0, 4], "one wins, one conflicts: {err_a} / {err_b}");
    let loser = if code_a == 4 { err_a } else { err_b };
    assert!(loser.contains("is resolved, not dead"), "{loser}");
    let resolutions = audit(&db)
        .await
        .into_iter()
        .filter(|(kind, ..)| kind == "dead-letter-resolved")
        .count();
    assert_eq!(resolutions, 1);
}

#[tokio::test]
async fn retire_stops_the_running_consumer_refuses_a_restart_and_reactivation_reconciles() {
    let db = fresh_db().await;
    write_event(&db, "p", "t1").await;
    let dead = seed_letter(&db, "p", "c", "t2", "dead", 10).await;
    let recorder = Recorder::default();
    let (_shutdown, run) = start(&db, fast_config("p", "c"), &recorder);
    eventually(WAIT, "the consumer to hold its lease", || async {
        let status = outbox_json(&db, &["status", "--project", "p"]).await;
        status["consumers"][0]["lease_live"] == true
    })
    .await;

    let retire = [
        "consumers",
        "retire",
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--by",
        "alice",
        "--reason",
        "dashboard decommissioned",
    ];
    let (code, out, err) = outbox(&db, &retire).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("retired consumer c of project p (by alice at "),
        "{out}"
    );
    assert!(out.contains("stops at its next fenced write"), "{out}");
    assert!(
        out.contains("1 unresolved dead letter(s) may now be pruned"),
        "{out}"
    );

    // The runtime finds out at its next fenced write (here its heartbeat) and stops, naming
    // who retired it and why.
    let stopped = tokio::time::timeout(WAIT, run)
        .await
        .expect("the retired consumer stops")
        .unwrap();
    match stopped {
        Err(ConsumerError::Retired { by, reason, .. }) => {
            assert_eq!(by, "alice");
            assert_eq!(reason, "dashboard decommissioned");
        }
        other => panic!("expected the retirement to stop it, got {other:?}"),
    }

    // Retiring twice, or replaying for a retired consumer, conflicts.
    let err = outbox_fails(&db, 4, &retire).await;
    assert!(
        err.contains("consumer c of project p is retired, not active (retired by alice at "),
        "{err}"
    );
    let err = outbox_fails(
        &db,
        4,
        &[
            "dead-letters",
            "replay",
            "--by",
            "bob",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--event-id",
            &dead,
        ],
    )
    .await;
    assert!(
        err.contains("consumer c of project p is retired, not active"),
        "{err}"
    );
    let listed = outbox_json(&db, &["consumers", "list"]).await;
    assert_eq!(listed["consumers"][0]["state"], "retired");
    assert_eq!(listed["consumers"][0]["retired_by"], "alice");
    assert_eq!(
        listed["consumers"][0]["retired_reason"],
        "dashboard decommissioned"
    );
    let status = outbox_json(&db, &["status"]).await;
    assert_eq!(
        health(&status["consumers"][0]),
        ["ok"],
        "retired holds nothing back"
    );
    let trail = outbox_json(&db, &["audit", "--kind", "consumer-retired"]).await;
    assert_eq!(trail["audit"][0]["actor"], "alice");
    assert_eq!(trail["audit"][0]["count"], 1);

    // The real binary refuses to start it (waiting or not)...
    let consume = [
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--poll-interval",
        "100ms",
    ];
    let err = outbox_fails(&db, 4, &[&["consume"][..], &consume].concat()).await;
    assert!(err.contains("consumer c of project p is retired"), "{err}");
    assert!(
        err.contains("run: outbox consume --project p --consumer-id c --reactivate"),
        "the refusal names the exact command: {err}"
    );

    // ...unless reactivated, which reconciles from the live set.
    let mut process = ConsumeProcess::spawn(&db.url, &[&consume[..], &["--reactivate"]].concat());
    eventually(WAIT, "the reactivated consumer to reconcile", || async {
        process
            .lines()
            .iter()
            .any(|l| l.value["type"] == "reconcile")
    })
    .await;
    let reconcile = process
        .lines()
        .into_iter()
        .find(|l| l.value["type"] == "reconcile")
        .unwrap();
    assert_eq!(reconcile.value["reason"], "missing_cursor");
    eventually(WAIT, "the cursor at the head", || async {
        cursor(&db, "p", "c").await == Some(2)
    })
    .await;
    process.signal("TERM");
    assert_eq!(process.wait().await, 0, "{}", process.stderr());
    let kinds: Vec<String> = audit(&db)
        .await
        .into_iter()
        .map(|(kind, ..)| kind)
        .collect();
    assert_eq!(
        kinds,
        ["consumer-retired", "consumer-reactivated", "reconciled"],
        "{kinds:?}"
    );
    let listed = outbox_json(&db, &["consumers", "list", "--project", "p"]).await;
    assert_eq!(listed["consumers"][0]["state"], "active");
}

#[tokio::test]
async fn missing_targets_exit_3_naming_them() {
    let db = fresh_db().await;
    let event = seed_letter(&db, "p", "c", "t1", "dead", 10).await;
    let unknown = "task-deleted:nope:2026-01-01T00:00:00.000000Z";
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec![
                "dead-letters",
                "show",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--event-id",
                unknown,
            ],
            format!("dead letter {unknown} of consumer c in project p not found"),
        ),
        (
            vec![
                "dead-letters",
                "show",
                "--project",
                "p",
                "--consumer-id",
                "zz",
                "--event-id",
                &event,
            ],
            "consumer zz of project p not found".into(),
        ),
        (
            vec![
                "dead-letters",
                "replay",
                "--by",
                "bob",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--event-id",
                unknown,
            ],
            format!("dead letter {unknown} of consumer c in project p not found"),
        ),
        (
            vec![
                "dead-letters",
                "replay",
                "--by",
                "bob",
                "--project",
                "x",
                "--consumer-id",
                "c",
                "--all",
            ],
            "consumer c of project x not found".into(),
        ),
        (
            vec![
                "dead-letters",
                "resolve",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--event-id",
                unknown,
                "--by",
                "alice",
                "--reason",
                "r",
            ],
            format!("dead letter {unknown} of consumer c in project p not found"),
        ),
        (
            vec![
                "dead-letters",
                "resolve",
                "--project",
                "p",
                "--consumer-id",
                "zz",
                "--event-id",
                &event,
                "--by",
                "alice",
                "--reason",
                "r",
            ],
            "consumer zz of project p not found".into(),
        ),
        (
            vec![
                "consumers",
                "retire",
                "--project",
                "p",
                "--consumer-id",
                "zz",
                "--by",
                "alice",
                "--reason",
                "r",
            ],
            "consumer zz of project p not found".into(),
        ),
        (
            vec!["status", "--project", "x"],
            "project x not found".into(),
        ),
        // A filter by an unknown consumer is refused, not answered with an empty listing.
        (
            vec!["dead-letters", "list", "--consumer-id", "zz"],
            "consumer zz (in any project) not found".into(),
        ),
        (
            vec![
                "dead-letters",
                "list",
                "--project",
                "p",
                "--consumer-id",
                "zz",
            ],
            "consumer zz of project p not found".into(),
        ),
        (
            vec!["audit", "--consumer-id", "zz"],
            "consumer zz (in any project) not found".into(),
        ),
        (
            vec!["audit", "--project", "p", "--consumer-id", "zz", "--follow"],
            "consumer zz of project p not found".into(),
        ),
    ];
    for (args, message) in cases {
        let err = outbox_fails(&db, 3, &args).await;
        assert!(err.contains(&message), "outbox {args:?}: {err}");
    }
    assert_eq!(delivery(&db, "p", "c", &event).await, ("dead".into(), 10));
    assert!(audit(&db).await.is_empty());
}

#[tokio::test]
async fn retrying_deliveries_are_not_dead_letters() {
    let db = fresh_db().await;
    let event = seed_letter(&db, "p", "c", "t1", "retrying", 2).await;
    let letter = [
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--event-id",
        event.as_str(),
    ];
    let err = outbox_fails(
        &db,
        4,
        &[&["dead-letters", "replay", "--by", "bob"][..], &letter].concat(),
    )
    .await;
    assert!(
        err.contains(&format!(
            "dead letter {event} of consumer c in project p is retrying, not dead"
        )),
        "{err}"
    );
    let err = outbox_fails(
        &db,
        4,
        &[
            &["dead-letters", "resolve"][..],
            &letter,
            &["--by", "a", "--reason", "skip it"],
        ]
        .concat(),
    )
    .await;
    assert!(err.contains("is retrying, not dead"), "{err}");
    assert_eq!(
        delivery(&db, "p", "c", &event).await,
        ("retrying".into(), 2)
    );
    let show = outbox_json(&db, &[&["dead-letters", "show"][..], &letter].concat()).await;
    assert_eq!(show["state"], "retrying");
    assert!(show["next_attempt_at"].is_string());
}

#[tokio::test]
async fn bad_input_exits_2_and_changes_nothing() {
    let db = fresh_db().await;
    let event = seed_letter(&db, "p", "c", "t1", "dead", 10).await;
    let long = "x".repeat(201);
    let resolve = |by: &'static str, reason: &str| -> Vec<String> {
        [
            "dead-letters",
            "resolve",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--event-id",
            &event,
            "--by",
            by,
            "--reason",
            reason,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let owned: Vec<(Vec<String>, &str)> = vec![
        (resolve("alice", ""), "invalid reason: must not be empty"),
        (resolve("alice", "   "), "invalid reason: must not be blank"),
        (
            resolve("alice", "two\nlines"),
            "invalid reason: control character at position 4",
        ),
        (
            resolve("alice", "bell\u{7}"),
            "invalid reason: control character at position 5",
        ),
        (
            resolve("alice", "a\u{202E}b"),
            "invisible formatting character U+202E",
        ),
        (
            resolve("alice", &long),
            "invalid reason: 201 characters exceeds the limit of 200",
        ),
        (
            resolve("alice smith", "r"),
            "invalid operator: character \" \" at position 6",
        ),
        (resolve("", "r"), "invalid operator: must not be empty"),
    ];
    for (args, message) in &owned {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = outbox_fails(&db, 2, &args).await;
        assert!(err.contains(message), "outbox {args:?}: {err}");
    }
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["status", "--project", "bad project"],
            "invalid project_id: character \" \" at position 4",
        ),
        (
            vec!["consumers", "list", "--project", ""],
            "invalid project_id: must not be empty",
        ),
        (
            vec![
                "consumers",
                "retire",
                "--project",
                "p",
                "--consumer-id",
                "c/1",
                "--by",
                "a",
                "--reason",
                "r",
            ],
            "invalid consumer_id: character \"/\" at position 2",
        ),
        (
            vec![
                "consumers",
                "retire",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--by",
                "a",
                "--reason",
                "",
            ],
            "invalid reason: must not be empty",
        ),
        (
            vec![
                "consumers",
                "retire",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--by",
                "a",
            ],
            "--reason",
        ),
        (
            vec![
                "dead-letters",
                "show",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--event-id",
                "a b",
            ],
            "invalid event_id: character \" \" at position 2",
        ),
        (
            vec![
                "dead-letters",
                "replay",
                "--by",
                "bob",
                "--project",
                "p",
                "--consumer-id",
                "c",
            ],
            "--event-id",
        ),
        (
            vec![
                "dead-letters",
                "replay",
                "--by",
                "bob",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--all",
                "--event-id",
                &event,
            ],
            "cannot be used with",
        ),
        (
            vec!["dead-letters", "list", "--state", "gone"],
            "invalid state: \"gone\" is not one of retrying, dead, replay_requested",
        ),
        (vec!["dead-letters", "list", "--limit", "0"], "--limit"),
        (
            vec!["audit", "--kind", "retired"],
            "invalid audit kind: \"retired\"",
        ),
        (
            vec!["status", "--max-heartbeat-age", "soon"],
            "invalid duration",
        ),
        (vec!["status", "--output", "yaml"], "--output"),
    ];
    for (args, message) in cases {
        let err = outbox_fails(&db, 2, &args).await;
        assert!(err.contains(message), "outbox {args:?}: {err}");
    }
    assert_eq!(delivery(&db, "p", "c", &event).await, ("dead".into(), 10));
    assert!(audit(&db).await.is_empty());
    let state: String = db
        .connect()
        .await
        .query_one("SELECT state FROM outbox.lifecycle_consumer_cursors", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "active");
}

#[tokio::test]
async fn an_unreachable_database_exits_1() {
    let (code, out, err) = run_outbox(&[
        "status",
        "--database-url",
        "postgresql://nobody:secret@127.0.0.1:1/none?connect_timeout=2",
    ])
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty());
    assert!(err.contains("cannot connect"), "{err}");
    assert!(!err.contains("secret"), "{err}");
}
