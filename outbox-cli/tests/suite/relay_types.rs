//! `outbox relay nats --event-types`: every declared type on a subject of its own
//! (`<prefix>.<project>.<type token>`), the project's events in one sequence order across those
//! subjects with their CloudEvents headers, under each order fence and across kill -9 of the
//! relay under live writers of several types (nothing lost, nothing twice); a type the relay
//! does not declare passes without a message; the AsyncAPI export names the subjects the relay
//! publishes to; with the stream fence, a stranger's message on another type's subject (even
//! one the relay does not declare) is not adopted at restart; and the refusals (two types
//! sharing a subject, an unregistered type).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_tests::consumer_kit::{cursor, eventually, write_event};
use outbox_tests::nats_kit::{self, NatsServer, Relayed, read_stream};
use outbox_tests::process_kit::{OutboxProcess, outbox_on, run_outbox};
use outbox_tests::{TestDb, fresh_db};
use rand::Rng;

/// The declaration every relay of these tests makes: `task:restored` is registered too, and
/// written, but not declared.
const DECLARED: &str = "task:deleted@1,task:archived@1";

/// Registers the shipped contracts of `task:archived` and `task:restored`.
async fn register_contracts(db: &TestDb) {
    for file in ["task-archived.json", "task-restored.json"] {
        let path = format!("{}/../contracts/{file}", env!("CARGO_MANIFEST_DIR"));
        let (code, out, err) = outbox_on(db, &["contracts", "add", &path, "--by", "ops"]).await;
        assert_eq!(code, 0, "{out}{err}");
    }
}

/// Relay options tuned for tests (fast lease takeover after kill -9, fast retries), declaring
/// `types` and parking an event after `attempts`.
fn relay_args(
    project: &str,
    nats: &str,
    stream: &str,
    types: &str,
    attempts: &str,
    extra: &[&str],
) -> Vec<String> {
    let mut args: Vec<String> = [
        "--project",
        project,
        "--consumer-id",
        "relay",
        "--nats-url",
        nats,
        "--stream",
        stream,
        "--event-types",
        types,
        "--max-attempts",
        attempts,
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
        "--publish-timeout",
        "2s",
        "--nats-connect-timeout",
        "1s",
        "--max-in-flight",
        "32",
        "--shutdown-grace",
        "2s",
        "--no-prune",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn spawn(db: &TestDb, args: &[String]) -> OutboxProcess {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    nats_kit::spawn_relay(&db.url, &args)
}

/// One relay per order fence, each on a project, subject prefix and stream of its own (a
/// stream of the stream fence covers `<prefix>.<project>.>`, the others `<prefix>.>`, and
/// JetStream refuses streams whose subjects overlap).
struct Lane {
    fence: &'static str,
    project: &'static str,
    prefix: &'static str,
    stream: &'static str,
}

const LANES: [Lane; 3] = [
    Lane {
        fence: "stream",
        project: "ps",
        prefix: "lifecycle",
        stream: "TYPES_STREAM",
    },
    Lane {
        fence: "subject",
        project: "pj",
        prefix: "bysubject",
        stream: "TYPES_SUBJECT",
    },
    Lane {
        fence: "none",
        project: "pn",
        prefix: "nofence",
        stream: "TYPES_NONE",
    },
];

impl Lane {
    fn args(&self, nats: &str) -> Vec<String> {
        relay_args(
            self.project,
            nats,
            self.stream,
            DECLARED,
            "1000",
            &["--fence", self.fence, "--subject-prefix", self.prefix],
        )
    }
}

/// Writes one event of `project`, its type chosen by `i`: deletes, archivals and restorations
/// (the last not declared by the relays) in turn, through the SQL writer.
async fn write_mixed(client: &tokio_postgres::Client, project: &str, i: usize) {
    let task = format!("T-{i}");
    let written = match i % 3 {
        0 => {
            client
                .execute(
                    "SELECT outbox.write_task_deleted($1, $2, now(), 'w')",
                    &[&project, &task],
                )
                .await
        }
        1 => {
            let payload = serde_json::json!({
                "archived_at": chrono::Utc::now().to_rfc3339(),
                "prior": {"column": "done", "status": "closed"},
            });
            client
                .execute(
                    "SELECT outbox.write_event($1, 'task:archived', 1, $2, $3, 'w')",
                    &[&project, &task, &payload],
                )
                .await
        }
        _ => {
            let payload = serde_json::json!({
                "restored_at": chrono::Utc::now().to_rfc3339(),
                "column": "todo",
            });
            client
                .execute(
                    "SELECT outbox.write_event($1, 'task:restored', 1, $2, $3, 'w')",
                    &[&project, &task, &payload],
                )
                .await
        }
    };
    written.expect("write an event");
}

/// Every sequenced event of `project`: (sequence, event ID, type).
async fn sequenced_typed(db: &TestDb, project: &str) -> Vec<(i64, String, String)> {
    db.connect()
        .await
        .query(
            "SELECT sequence, event_id, event_type FROM outbox.lifecycle_outbox \
             WHERE project_id = $1 AND sequence IS NOT NULL ORDER BY sequence",
            &[&project],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

/// Asserts that `messages` are exactly the declared events of `expected`, once each, in
/// sequence order, each on its type's subject under `prefix` with its CloudEvents headers,
/// and that no undeclared event has a message.
fn assert_relayed_by_type(
    messages: &[Relayed],
    prefix: &str,
    project: &str,
    expected: &[(i64, String, String)],
) {
    let declared: Vec<&(i64, String, String)> = expected
        .iter()
        .filter(|(_, _, event_type)| event_type != "task:restored")
        .collect();
    let got: Vec<i64> = messages.iter().map(|m| m.outbox_sequence).collect();
    let want: Vec<i64> = declared.iter().map(|(sequence, _, _)| *sequence).collect();
    if got != want {
        let mut seen = BTreeMap::new();
        for s in &got {
            *seen.entry(*s).or_insert(0) += 1;
        }
        let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        let missing: Vec<_> = want.iter().filter(|s| !seen.contains_key(s)).collect();
        let skipped: Vec<_> = expected
            .iter()
            .filter(|(s, _, t)| t == "task:restored" && seen.contains_key(s))
            .map(|(s, _, _)| s)
            .collect();
        panic!(
            "{project}: {} messages for {} declared events; twice {twice:?}, missing \
             {missing:?}, undeclared relayed {skipped:?}, {} out of order",
            got.len(),
            want.len(),
            got.windows(2).filter(|w| w[1] <= w[0]).count()
        );
    }
    for (message, (sequence, event_id, event_type)) in messages.iter().zip(declared) {
        let token = event_type.replace(':', "_");
        assert_eq!(
            message.subject,
            format!("{prefix}.{project}.{token}"),
            "subject of {sequence}"
        );
        assert_eq!(&message.msg_id, event_id, "Nats-Msg-Id of {sequence}");
        assert_eq!(message.body["event_type"], event_type.as_str());
        assert_eq!(message.body["sequence"], *sequence);
        let header = |name: &str| message.headers.get(name).map(String::as_str);
        assert_eq!(header("ce-specversion"), Some("1.0"), "{sequence}");
        assert_eq!(header("ce-type"), Some(event_type.as_str()), "{sequence}");
        assert_eq!(header("ce-id"), Some(event_id.as_str()), "{sequence}");
        let padded = format!("{sequence:020}");
        assert_eq!(header("ce-sequence"), Some(padded.as_str()), "{sequence}");
        let schema = format!("urn:lifecycle-outbox:contract:{event_type}:1");
        assert_eq!(header("ce-dataschema"), Some(schema.as_str()), "{sequence}");
        let source = format!("urn:lifecycle-outbox:project:{project}");
        assert_eq!(header("ce-source"), Some(source.as_str()), "{sequence}");
        assert!(
            header("ce-time").is_some() && header("ce-subject").is_some(),
            "{sequence}"
        );
    }
}

/// Three relays (one per fence) declaring deletes and archivals, under writers of deletes,
/// archivals and restorations, each relay killed with SIGKILL and started again twice; then
/// each stream holds exactly the declared events, once, in sequence order, on their subjects,
/// every cursor is at its head (the restorations passed) and nothing was parked. The subjects
/// are the ones the AsyncAPI export names.
async fn mixed_types_in_sequence_order_on_their_subjects_across_kill_9() {
    let db = fresh_db().await;
    register_contracts(&db).await;
    let nats = NatsServer::start().await;
    let url = nats.url();
    let mut relays: Vec<OutboxProcess> = LANES.iter().map(|l| spawn(&db, &l.args(&url))).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = LANES
        .iter()
        .map(|lane| {
            let (db_url, stop, project) = (db.config.clone(), stop.clone(), lane.project);
            tokio::spawn(async move {
                let client = outbox_tests::connect(&db_url).await;
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    write_mixed(&client, project, i).await;
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(8)).await;
                }
                i
            })
        })
        .collect();
    for kill in 0..2 * LANES.len() {
        let pause = rand::rng().random_range(300..900);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let victim = kill % LANES.len();
        relays[victim].signal("KILL");
        relays[victim].wait().await;
        relays[victim] = spawn(&db, &LANES[victim].args(&url));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        assert!(writer.await.unwrap() > 30, "the writers wrote");
    }

    let client = db.connect().await;
    eventually(
        Duration::from_secs(90),
        "every event sequenced and passed by its relay",
        || async {
            client
                .query_one(
                    "SELECT (SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence IS NULL) \
                          + (SELECT count(*) FROM outbox.lifecycle_project_heads h \
                             LEFT JOIN outbox.lifecycle_consumer_cursors c \
                               ON c.project_id = h.project_id \
                             WHERE c.last_acked_sequence IS DISTINCT FROM h.head_sequence)",
                    &[],
                )
                .await
                .is_ok_and(|row| row.get::<_, i64>(0) == 0)
        },
    )
    .await;
    let parked: i64 = client
        .query_one("SELECT count(*) FROM outbox.lifecycle_deliveries", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        parked, 0,
        "no delivery failed for good or is still retrying"
    );

    let js = nats.jetstream().await;
    for lane in &LANES {
        let messages = read_stream(&js, lane.stream).await;
        let expected = sequenced_typed(&db, lane.project).await;
        assert!(
            expected.iter().any(|(_, _, t)| t == "task:archived")
                && expected.iter().any(|(_, _, t)| t == "task:restored"),
            "{}: every type written",
            lane.fence
        );
        assert_relayed_by_type(&messages, lane.prefix, lane.project, &expected);

        // The AsyncAPI document names the subjects the relay published to.
        let (code, out, err) = outbox_on(
            &db,
            &[
                "contracts",
                "export",
                "--format",
                "asyncapi",
                "--subject-prefix",
                lane.prefix,
            ],
        )
        .await;
        assert_eq!(code, 0, "{err}");
        let document: serde_json::Value = serde_json::from_str(&out).unwrap();
        for message in &messages {
            let token = message.subject.rsplit('.').next().unwrap();
            let address = document["channels"][format!("nats_{token}")]["address"]
                .as_str()
                .unwrap_or_else(|| panic!("no channel for {}", message.subject));
            assert_eq!(
                address.replace("{project}", lane.project),
                message.subject,
                "the AsyncAPI channel of {}",
                message.subject
            );
        }
    }
    for relay in &mut relays {
        relay.signal("TERM");
        assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
    }
}

/// With the stream fence the relay reads the end of the project's subjects together: a
/// stranger's message stored, while the relay was stopped, on the subject of a type the relay
/// does not even declare (`task_archived`) is not adopted at restart. The next event fails as
/// a conflict (`nats_sequence_conflict`), is parked after its attempts, nothing is stored
/// after the stranger, and once the stranger is removed the replay follows the relay's own
/// last message.
async fn a_stranger_on_another_types_subject_is_not_adopted() {
    let db = fresh_db().await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    let url = nats.url();
    // The default declaration: task:deleted@1 alone.
    let args = || relay_args("p1", &url, "STRANGER", "task:deleted@1", "2", &[]);
    let mut relay = spawn(&db, &args());
    let first = write_event(&db, "p1", "T-1").await;
    eventually(
        Duration::from_secs(30),
        "the first event relayed",
        || async { cursor(&db, "p1", "relay").await == Some(1) },
    )
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());

    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "stranger");
    headers.insert("Outbox-Project", "p1");
    let foreign = js
        .publish_with_headers("lifecycle.p1.task_archived", headers, "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(foreign.sequence, 2);

    let mut relay = spawn(&db, &args());
    let second = write_event(&db, "p1", "T-2").await;
    let state = |event: String| {
        let db = &db;
        async move {
            db.connect()
                .await
                .query_opt(
                    "SELECT state, last_failure_class FROM outbox.lifecycle_deliveries \
                     WHERE project_id = 'p1' AND consumer_id = 'relay' AND event_id = $1",
                    &[&event],
                )
                .await
                .unwrap()
                .map(|row| (row.get::<_, String>(0), row.get::<_, Option<String>>(1)))
        }
    };
    eventually(Duration::from_secs(30), "the event parked", || async {
        matches!(state(second.clone()).await, Some((s, _)) if s == "dead")
    })
    .await;
    assert_eq!(
        state(second.clone()).await.unwrap().1.as_deref(),
        Some("nats_sequence_conflict")
    );
    let stderr = relay.stderr();
    assert!(
        stderr.contains("it has no numeric Outbox-Sequence header"),
        "the stranger named:\n{stderr}"
    );
    let stream_state = js
        .get_stream("STRANGER")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .clone();
    assert_eq!(
        (stream_state.messages, stream_state.last_sequence),
        (2, 2),
        "nothing stored after the stranger"
    );

    js.get_stream("STRANGER")
        .await
        .unwrap()
        .delete_message(foreign.sequence)
        .await
        .unwrap();
    let (code, _, stderr) = outbox_on(
        &db,
        &[
            "dead-letters",
            "replay",
            "--project",
            "p1",
            "--consumer-id",
            "relay",
            "--event-id",
            &second,
            "--by",
            "ops",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    eventually(Duration::from_secs(30), "the replay published", || async {
        matches!(state(second.clone()).await, Some((s, _)) if s == "replayed")
    })
    .await;
    let relayed = nats_kit::consume_durable(&js, "STRANGER", "check", "lifecycle.p1.>", 2).await;
    assert_eq!(
        relayed,
        vec![
            ("lifecycle.p1.task_deleted".to_owned(), first, 1),
            ("lifecycle.p1.task_deleted".to_owned(), second, 2),
        ],
        "the replay follows the relay's own last message"
    );
    let last = js
        .get_stream("STRANGER")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .last_sequence;
    assert_eq!(last, 3, "stored right after the stream's end");
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
}

outbox_tests::on_both_servers!(
    mixed_types_in_sequence_order_on_their_subjects_across_kill_9,
    a_stranger_on_another_types_subject_is_not_adopted,
);

/// Refused with exit 2 and a message naming the problem: two declared types sharing a subject
/// token (before anything is contacted), and a type the registry does not hold (before
/// anything is claimed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declarations_the_relay_cannot_serve_are_refused() {
    let (code, _, stderr) = run_outbox(&[
        "--database-url",
        "postgresql://nobody@127.0.0.1:1/none",
        "relay",
        "nats",
        "--project",
        "p1",
        "--consumer-id",
        "r",
        "--nats-url",
        "nats://127.0.0.1:1",
        "--event-types",
        "a_b:c@1,a:b_c@1",
    ])
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("a_b:c and a:b_c would both be relayed to lifecycle.p1.a_b_c"),
        "{stderr}"
    );

    let db = fresh_db().await;
    let nats = NatsServer::start().await;
    let args = relay_args(
        "p1",
        &nats.url(),
        "UNREGISTERED",
        "task:deleted@1,task:archivd@1",
        "3",
        &[],
    );
    let mut relay = spawn(&db, &args);
    assert_eq!(relay.wait().await, 2, "{}", relay.stderr());
    assert!(
        relay
            .stderr()
            .contains("event type task:archivd@1 is not registered"),
        "{}",
        relay.stderr()
    );
    assert_eq!(cursor(&db, "p1", "relay").await, None, "nothing claimed");
}
