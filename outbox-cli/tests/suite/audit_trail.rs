//! The audit trail as an operator reads it: every action with its actor, reasons that outlive
//! a reactivation, `--since`, `--follow`, and dead letters named by sequence.

use std::process::Stdio;
use std::time::Duration;

use outbox_tests::consumer_kit::{
    SeedCursor, SeedEvent, eventually, seed_consumer, seed_delivery, write_event,
};
use outbox_tests::process_kit::{OutboxProcess, outbox_binary, outbox_json, outbox_on as outbox};
use outbox_tests::{TestDb, fresh_db};
use serde_json::Value;
use tokio::process::Command;

/// A consumer `c` of project `p` with one dead letter at sequence 1.
async fn with_dead_letter(db: &TestDb) -> String {
    let event = write_event(db, "p", "t1").await;
    let (code, _, err) = outbox(db, &["sequence"]).await;
    assert_eq!(code, 0, "{err}");
    seed_consumer(db, "p", "c", SeedCursor::Head, false).await;
    seed_delivery(db, "p", "c", SeedEvent::Sequence(1), "dead", 10, 0).await;
    event
}

#[tokio::test]
async fn a_retirement_reason_survives_reactivation_and_every_row_names_its_actor() {
    let db = fresh_db().await;
    with_dead_letter(&db).await;
    let (code, _, err) = outbox(
        &db,
        &[
            "consumers",
            "retire",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--by",
            "alice",
            "--reason",
            "moved to the new dashboard",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = outbox(
        &db,
        &[
            "consume",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--reactivate",
            "--exit-when-caught-up",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let listed = outbox_json(&db, &["consumers", "list"]).await;
    assert_eq!(listed["consumers"][0]["state"], "active");
    assert_eq!(listed["consumers"][0]["retired_reason"], Value::Null);

    let retired = outbox_json(&db, &["audit", "--kind", "consumer-retired"]).await;
    assert_eq!(retired["audit"][0]["actor"], "alice");
    assert_eq!(retired["audit"][0]["reason"], "moved to the new dashboard");
    let reactivated = outbox_json(&db, &["audit", "--kind", "consumer-reactivated"]).await;
    let actor = reactivated["audit"][0]["actor"].as_str().expect("an actor");
    assert!(actor.contains('@'), "user@host: {actor}");

    // The table shows the reason too.
    let (code, table, _) = outbox(&db, &["audit", "--kind", "consumer-retired"]).await;
    assert_eq!(code, 0);
    assert!(table.lines().next().unwrap().ends_with("REASON"), "{table}");
    assert!(table.contains("moved to the new dashboard"), "{table}");
}

/// A service started without `$USER` or `$LOGNAME` (systemd, cron, a container) is still
/// named in the reactivation's audit row, by its uid's account.
#[tokio::test]
async fn a_reactivation_without_user_variables_is_audited_with_the_uids_account() {
    let db = fresh_db().await;
    with_dead_letter(&db).await;
    let (code, _, err) = outbox(
        &db,
        &[
            &[
                "consumers",
                "retire",
                "--project",
                "p",
                "--consumer-id",
                "c",
            ][..],
            &["--by", "alice", "--reason", "moved"],
        ]
        .concat(),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let reactivation = Command::new(outbox_binary())
        .args(["--database-url", db.url.as_str(), "consume"])
        .args(["--project", "p", "--consumer-id", "c"])
        .args(["--reactivate", "--exit-when-caught-up"])
        .env_remove("USER")
        .env_remove("LOGNAME")
        .env("OUTBOX_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run outbox consume");
    assert!(
        reactivation.status.success(),
        "{}",
        String::from_utf8_lossy(&reactivation.stderr)
    );
    let account = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let account = String::from_utf8_lossy(&account.stdout).trim().to_owned();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let reactivated = outbox_json(&db, &["audit", "--kind", "consumer-reactivated"]).await;
    assert_eq!(
        reactivated["audit"][0]["actor"],
        format!("{account}@{}", host.trim())
    );
}

#[tokio::test]
async fn dead_letters_are_named_by_sequence_and_replay_requests_are_audited() {
    let db = fresh_db().await;
    let event = with_dead_letter(&db).await;
    let show = outbox_json(
        &db,
        &[
            "dead-letters",
            "show",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--sequence",
            "1",
        ],
    )
    .await;
    assert_eq!(show["event_id"], event.as_str());
    assert!(show["event"]["prior"].is_object(), "{show}");
    assert_eq!(show["event"]["writer_process_id"], "test-writer");
    let (code, table, _) = outbox(
        &db,
        &[
            "dead-letters",
            "show",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--sequence",
            "1",
        ],
    )
    .await;
    assert_eq!(code, 0);
    assert!(table.lines().any(|l| l.starts_with("prior ")), "{table}");

    let (code, _, err) = outbox(
        &db,
        &[
            "dead-letters",
            "show",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--sequence",
            "7",
        ],
    )
    .await;
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("dead letter at sequence 7 of consumer c in project p not found"),
        "{err}"
    );

    let request = outbox_json(
        &db,
        &[
            "dead-letters",
            "replay",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--sequence",
            "1",
            "--by",
            "bob",
        ],
    )
    .await;
    assert_eq!(request["requested"], serde_json::json!([event]));
    assert_eq!(request["requested_by"], "bob");
    let trail = outbox_json(&db, &["audit", "--kind", "dead-letter-replay-requested"]).await;
    let row = &trail["audit"][0];
    assert_eq!(row["actor"], "bob");
    assert_eq!(row["event_id"], event.as_str());
    assert_eq!(row["count"], 10, "the letter's attempts so far");
}

#[tokio::test]
async fn audit_since_and_follow() {
    let db = fresh_db().await;
    with_dead_letter(&db).await;
    let resolve = [
        "dead-letters",
        "resolve",
        "--project",
        "p",
        "--consumer-id",
        "c",
        "--sequence",
        "1",
        "--by",
        "carol",
        "--reason",
        "not needed",
    ];

    // Following: rows recorded after it started arrive as JSON lines.
    let mut follow = OutboxProcess::spawn_command(
        &db.url,
        "audit",
        &["--follow", "--follow-interval", "100ms", "--output", "json"],
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, _, err) = outbox(&db, &resolve).await;
    assert_eq!(code, 0, "{err}");
    eventually(
        Duration::from_secs(10),
        "the resolution to be followed",
        || async {
            follow
                .lines()
                .iter()
                .any(|l| l.value["kind"] == "lifecycle-observation:dead-letter-resolved")
        },
    )
    .await;
    let line = follow
        .lines()
        .into_iter()
        .find(|l| l.value["kind"] == "lifecycle-observation:dead-letter-resolved")
        .unwrap();
    assert_eq!(line.value["actor"], "carol");
    assert_eq!(line.value["reason"], "not needed");
    follow.signal("TERM");
    assert_eq!(follow.wait().await, 0, "{}", follow.stderr());

    // --since: an hour ago finds it, a moment after it does not.
    let recent = outbox_json(&db, &["audit", "--since", "1h"]).await;
    assert_eq!(recent["audit"].as_array().unwrap().len(), 1);
    let at = recent["audit"][0]["recorded_at"]
        .as_str()
        .unwrap()
        .to_owned();
    let later = chrono::DateTime::parse_from_rfc3339(&at).unwrap() + chrono::Duration::seconds(1);
    let none = outbox_json(&db, &["audit", "--since", &later.to_rfc3339()]).await;
    assert_eq!(none["audit"], serde_json::json!([]));
    let (code, _, err) = outbox(&db, &["audit", "--since", "yesterday-ish"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("invalid --since"), "{err}");
}

/// A login role of this test's own that is a member of `outbox_operator`; returns its URL.
async fn operator_url(db: &TestDb) -> String {
    let role = format!("{}_operator", db.name);
    db.connect()
        .await
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN IN ROLE \"outbox_operator\""
        ))
        .await
        .unwrap();
    db.url.replacen("postgres@", &format!("{role}@"), 1)
}

/// `consumers <action> --project p --consumer-id ID --by BY --reason REASON` as `url`.
async fn consumer_action(url: &str, action: &str, id: &str, by: &str) -> (i32, String, String) {
    outbox_tests::process_kit::run_outbox(&[
        "--database-url",
        url,
        "consumers",
        action,
        "--project",
        "p",
        "--consumer-id",
        id,
        "--by",
        by,
        "--reason",
        "housekeeping",
    ])
    .await
}

/// `outbox consumers reactivate` and `delete` are operator commands, run here under the
/// least-privilege operator role: both refuse an active consumer, both are audited with the
/// operator and the reason, a reactivated consumer has a missing cursor (it reconciles) and a
/// bumped generation, and a deletion takes the consumer's delivery rows with it but leaves its
/// audit rows. `consumers list --state` filters.
#[tokio::test]
async fn operators_reactivate_and_delete_retired_consumers_audited() {
    let db = fresh_db().await;
    with_dead_letter(&db).await;
    seed_consumer(&db, "p", "d", SeedCursor::Head, false).await;
    let url = operator_url(&db).await;

    // An active consumer is neither deleted nor reactivated.
    let (code, out, err) = consumer_action(&url, "delete", "c", "carol").await;
    assert_eq!(code, 4, "{out}{err}");
    assert!(err.contains("retire it first"), "{err}");
    let (code, _, err) = consumer_action(&url, "reactivate", "c", "bob").await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("not retired"), "{err}");
    let (code, _, err) = consumer_action(&url, "retire", "c", "alice").await;
    assert_eq!(code, 0, "{err}");

    let ids = |listed: &Value| -> Vec<String> {
        listed["consumers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["consumer_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let retired = outbox_json(&db, &["consumers", "list", "--state", "retired"]).await;
    assert_eq!(ids(&retired), ["c"]);
    let active = outbox_json(&db, &["consumers", "list", "--state", "active"]).await;
    assert_eq!(ids(&active), ["d"]);
    let generation = retired["consumers"][0]["lease_generation"]
        .as_i64()
        .unwrap();

    let (code, out, err) = consumer_action(&url, "reactivate", "c", "bob").await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("reactivated consumer c of project p (by bob)"),
        "{out}"
    );
    let listed = outbox_json(&db, &["consumers", "list", "--state", "active"]).await;
    assert_eq!(ids(&listed), ["c", "d"]);
    let c = &listed["consumers"][0];
    assert_eq!(c["cursor"], Value::Null, "it reconciles at its next start");
    assert_eq!(
        c["lease_generation"],
        generation + 1,
        "a stale holder stays fenced"
    );
    let trail = outbox_json(&db, &["audit", "--kind", "consumer-reactivated"]).await;
    assert_eq!(trail["audit"][0]["actor"], "bob");
    assert_eq!(trail["audit"][0]["reason"], "housekeeping");

    let (code, _, err) = consumer_action(&url, "retire", "c", "alice").await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = consumer_action(&url, "delete", "c", "carol").await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("and its 1 delivery row(s)"), "{out}");
    let listed = outbox_json(&db, &["consumers", "list"]).await;
    assert_eq!(ids(&listed), ["d"]);
    let left: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT (SELECT count(*) FROM outbox.lifecycle_deliveries WHERE consumer_id = 'c') \
                  + (SELECT count(*) FROM outbox.lifecycle_consumer_positions \
                     WHERE consumer_id = 'c') \
                  + (SELECT count(*) FROM outbox.lifecycle_lease_renewals \
                     WHERE consumer_id = 'c')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "nothing of the consumer is left");
    let trail = outbox_json(&db, &["audit", "--kind", "consumer-deleted"]).await;
    assert_eq!(trail["audit"][0]["actor"], "carol");
    assert_eq!(trail["audit"][0]["count"], 1);
    assert_eq!(trail["audit"][0]["reason"], "housekeeping");
    let retirements = outbox_json(&db, &["audit", "--kind", "consumer-retired"]).await;
    assert_eq!(retirements["audit"].as_array().unwrap().len(), 2, "kept");

    // Gone: deleting again is not found.
    let (code, _, err) = consumer_action(&url, "delete", "c", "carol").await;
    assert_eq!(code, 3, "{err}");
}

/// `--existing-only` refuses (exit 3) to register a consumer ID that does not exist, and
/// registers nothing; an existing one starts as usual. Not with `--all-projects`.
#[tokio::test]
async fn existing_only_refuses_to_register_a_new_consumer() {
    let db = fresh_db().await;
    with_dead_letter(&db).await;
    let consume = |id: &'static str| {
        [
            "consume",
            "--project",
            "p",
            "--consumer-id",
            id,
            "--existing-only",
            "--exit-when-caught-up",
            "--start-from",
            "earliest",
        ]
    };
    let (code, out, err) = outbox(&db, &consume("dashbaord")).await;
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        err.contains("consumer dashbaord of project p does not exist and --existing-only"),
        "{err}"
    );
    // The same for a consumer set and for `serve`, whose pairs claim the same way.
    for args in [
        &[
            "consume",
            "--project",
            "p",
            "--project",
            "q",
            "--consumer-id",
            "nope",
        ][..],
        &[
            "serve",
            "--project",
            "p",
            "--consumer-id",
            "nope",
            "--listen",
            "127.0.0.1:0",
        ],
    ] {
        let (code, out, err) = outbox(&db, &[args, &["--existing-only"]].concat()).await;
        assert_eq!(code, 3, "{args:?}: {out}{err}");
        assert!(err.contains("does not exist and --existing-only"), "{err}");
    }
    let listed = outbox_json(&db, &["consumers", "list"]).await;
    assert_eq!(
        listed["consumers"].as_array().unwrap().len(),
        1,
        "nothing registered"
    );
    let (code, _, err) = outbox(&db, &consume("c")).await;
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = outbox(
        &db,
        &[
            "consume",
            "--all-projects",
            "--consumer-id",
            "c",
            "--existing-only",
        ],
    )
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--existing-only cannot be used with --all-projects"),
        "{err}"
    );
}

/// `audit --follow` prints identifiers whole (a longer one shifts the rest of its row, an
/// operator copies it from there), and ends with exit 0, not 1, when its reader has what it
/// wanted (`| head -2`), as `status | head -1` does.
#[tokio::test]
async fn followed_rows_keep_identifiers_whole_and_a_closed_pipe_ends_the_follow_cleanly() {
    let db = fresh_db().await;
    let long = "search-indexer-blue-green-deployment-2026-12";
    seed_consumer(&db, "p", long, SeedCursor::Head, false).await;
    seed_consumer(&db, "p", "other", SeedCursor::Head, false).await;
    let retire = |id: &'static str| {
        [
            "consumers",
            "retire",
            "--project",
            "p",
            "--consumer-id",
            id,
            "--by",
            "alice",
            "--reason",
            "gone",
        ]
    };
    let (code, _, err) = outbox(&db, &retire(long)).await;
    assert_eq!(code, 0, "{err}");
    let mut pipeline = Command::new("bash")
        .arg("-c")
        .arg(
            "\"$0\" --database-url \"$1\" audit --follow --follow-interval 100ms | head -2; \
             echo \"outbox exited ${PIPESTATUS[0]}\"",
        )
        .arg(outbox_binary())
        .arg(db.url.as_str())
        .env("OUTBOX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = tokio::io::BufReader::new(pipeline.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(30),
            tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut line),
        )
        .await
        .expect("a followed line")
        .unwrap();
        lines.push(line);
    }
    assert!(lines[0].starts_with("ID"), "{lines:?}");
    assert!(lines[1].contains(long), "the whole ID: {lines:?}");
    // `head` is gone; the next row finds the pipe closed.
    let (code, _, err) = outbox(&db, &retire("other")).await;
    assert_eq!(code, 0, "{err}");
    let output = tokio::time::timeout(Duration::from_secs(30), pipeline.wait_with_output())
        .await
        .expect("the follow ends at its next row")
        .unwrap();
    let mut rest = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut rest)
        .await
        .unwrap();
    assert_eq!(
        rest.trim(),
        "outbox exited 0",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
