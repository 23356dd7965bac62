//! Order enforced by JetStream: a foreign message on a project's subject makes the relay's
//! next publish fail its `Nats-Expected-Last-Subject-Sequence`, on the retry schedule into a
//! dead letter, never skipped and never stored silently after the stranger. A foreign message
//! stored while the relay was stopped is not adopted at restart: the same conflict. Once the
//! operator has removed the foreign message, the relay takes the subject's end (its own last
//! message) from the stream and `dead-letters replay` publishes the event. And a project ID
//! with a dot is one subject token.

use std::time::Duration;

use outbox_tests::consumer_kit::{cursor, eventually, write_event};
use outbox_tests::nats_kit::{self, NatsServer, read_stream};
use outbox_tests::process_kit::{OutboxProcess, run_outbox};
use outbox_tests::{TestDb, fresh_db};

fn spawn_relay(db: &TestDb, nats: &NatsServer, project: &str, stream: &str) -> OutboxProcess {
    spawn_relay_with(db, nats, project, stream, &[])
}

fn spawn_relay_with(
    db: &TestDb,
    nats: &NatsServer,
    project: &str,
    stream: &str,
    extra: &[&str],
) -> OutboxProcess {
    let consumer = format!("relay-{project}");
    let url = nats.url();
    let mut args = vec![
        "--project",
        project,
        "--consumer-id",
        &consumer,
        "--nats-url",
        &url,
        "--stream",
        stream,
        "--start-from",
        "earliest",
        "--poll-interval",
        "100ms",
        "--retry-delays",
        "300ms",
        "--max-attempts",
        "3",
        "--publish-timeout",
        "2s",
        "--shutdown-grace",
        "2s",
        "--no-prune",
    ];
    args.extend_from_slice(extra);
    nats_kit::spawn_relay(&db.url, &args)
}

/// The delivery state of one event of p1's relay: (state, attempts, last failure class).
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

async fn a_foreign_write_is_refused_retried_parked_and_replayed_once_it_is_gone() {
    let db = fresh_db().await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    let mut relay = spawn_relay(&db, &nats, "p1", "ORDER");
    let first = write_event(&db, "p1", "T-1").await;
    eventually(
        Duration::from_secs(20),
        "the first event relayed",
        || async { cursor(&db, "p1", "relay-p1").await == Some(1) },
    )
    .await;

    // Someone else publishes to the project's subject (a second, misconfigured relay, say).
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "intruder");
    headers.insert("Outbox-Sequence", "99");
    headers.insert("Outbox-Project", "p1");
    let foreign = js
        .publish_with_headers(
            "lifecycle.p1.task_deleted",
            headers,
            r#"{"type":"event","event_id":"intruder","sequence":99}"#.into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(foreign.sequence, 2);

    let second = write_event(&db, "p1", "T-2").await;
    eventually(
        Duration::from_secs(30),
        "the refused event parked",
        || async { matches!(delivery(&db, &second).await, Some((state, _, _)) if state == "dead") },
    )
    .await;
    let (_, attempts, class) = delivery(&db, &second).await.unwrap();
    assert_eq!(attempts, 3, "parked after the last of 3 attempts");
    assert_eq!(class.as_deref(), Some("nats_sequence_conflict"));
    // Each attempt reads the stream's end, finds the project's last message is not the
    // relay's own, and says so (the first after JetStream refused the publish).
    let stderr = relay.stderr();
    assert_eq!(
        stderr
            .matches("the subject's last message in the stream is not one this relay stored")
            .count(),
        3,
        "one clear line per refused attempt:\n{stderr}"
    );
    let state = js
        .get_stream("ORDER")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .clone();
    assert_eq!(
        (state.messages, state.last_sequence),
        (2, 2),
        "nothing stored after the foreign message"
    );

    // The operator removes the foreign message and restarts the relay, which takes the
    // subject's end (its own last message) from the stream, then replays the dead letter.
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
    remove_message(&js, "ORDER", foreign.sequence).await;
    let mut relay = spawn_relay(&db, &nats, "p1", "ORDER");
    replay(&db, &second).await;
    let third = write_event(&db, "p1", "T-3").await;
    eventually(
        Duration::from_secs(20),
        "the next event relayed",
        || async { cursor(&db, "p1", "relay-p1").await == Some(3) },
    )
    .await;
    assert_eq!(
        relayed(&js, "ORDER", 3).await,
        vec![(first, 1), (second, 2), (third, 3)],
        "every event once, in order, nothing else"
    );
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
}

/// The operator removes a message from the stream (`nats stream rmm`).
async fn remove_message(js: &async_nats::jetstream::Context, stream: &str, sequence: u64) {
    let removed = js
        .get_stream(stream)
        .await
        .unwrap()
        .delete_message(sequence)
        .await
        .unwrap();
    assert!(removed, "message {sequence} removed");
}

/// The messages on p1's event subject, read by a new durable consumer: (`Nats-Msg-Id`,
/// `Outbox-Sequence`), in stream order.
async fn relayed(
    js: &async_nats::jetstream::Context,
    stream: &str,
    count: usize,
) -> Vec<(String, i64)> {
    nats_kit::consume_durable(js, stream, "check", "lifecycle.p1.task_deleted", count)
        .await
        .into_iter()
        .map(|(_, id, sequence)| (id, sequence))
        .collect()
}

/// `dead-letters replay` of p1's relay's parked `event_id`, then waits for it to be published.
async fn replay(db: &TestDb, event_id: &str) {
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
        event_id,
        "--by",
        "operator",
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    eventually(Duration::from_secs(20), "the replay published", || async {
        matches!(delivery(db, event_id).await, Some((state, _, _)) if state == "replayed")
    })
    .await;
}

/// While the relay is stopped, another writer publishes to the project's subject a message
/// without the relay's headers. At restart the relay reads the subject's last message, finds
/// it is not its own, and does not publish after it: the next event fails as a refused
/// expectation does while running (`nats_sequence_conflict`, retried, parked), nothing is
/// stored after the stranger, and once the operator removes it the replay is published right
/// after the relay's own last message.
async fn a_foreign_message_stored_while_the_relay_was_stopped_is_not_adopted() {
    let db = fresh_db().await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    let mut relay = spawn_relay(&db, &nats, "p1", "ORDER");
    let first = write_event(&db, "p1", "T-1").await;
    eventually(
        Duration::from_secs(20),
        "the first event relayed",
        || async { cursor(&db, "p1", "relay-p1").await == Some(1) },
    )
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());

    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "stranger");
    let foreign = js
        .publish_with_headers(
            "lifecycle.p1.task_deleted",
            headers,
            r#"{"hello":"world"}"#.into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(foreign.sequence, 2);

    let mut relay = spawn_relay(&db, &nats, "p1", "ORDER");
    let second = write_event(&db, "p1", "T-2").await;
    eventually(Duration::from_secs(30), "the event parked", || async {
        matches!(delivery(&db, &second).await, Some((state, _, _)) if state == "dead")
    })
    .await;
    let (_, attempts, class) = delivery(&db, &second).await.unwrap();
    assert_eq!(attempts, 3, "parked after the last of 3 attempts");
    assert_eq!(class.as_deref(), Some("nats_sequence_conflict"));
    let stderr = relay.stderr();
    assert_eq!(
        stderr
            .matches(
                "the subject's last message in the stream is not one this relay stored (it \
                 has no Outbox-Project header)"
            )
            .count(),
        3,
        "one clear line per refused attempt:\n{stderr}"
    );
    let state = js
        .get_stream("ORDER")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .clone();
    assert_eq!(
        (state.messages, state.last_sequence),
        (2, 2),
        "nothing stored after the foreign message"
    );

    remove_message(&js, "ORDER", foreign.sequence).await;
    replay(&db, &second).await;
    assert_eq!(
        relayed(&js, "ORDER", 2).await,
        vec![(first, 1), (second, 2)],
        "the replay follows the relay's own last message"
    );
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
}

async fn a_dotted_project_id_is_one_subject_token() {
    let db = fresh_db().await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    // One stream for both projects: the subject fence (the stream fence wants a stream each).
    let mut relay = spawn_relay_with(&db, &nats, "acme.eu", "DOTTED", &["--fence", "subject"]);
    let mut other = spawn_relay_with(&db, &nats, "acme", "DOTTED", &["--fence", "subject"]);
    write_event(&db, "acme.eu", "T-1").await;
    write_event(&db, "acme", "T-1").await;
    eventually(Duration::from_secs(60), "both relayed", || async {
        cursor(&db, "acme.eu", "relay-acme.eu").await == Some(1)
            && cursor(&db, "acme", "relay-acme").await == Some(1)
    })
    .await;
    let messages = read_stream(&js, "DOTTED").await;
    let mut subjects: Vec<(&str, &str)> = messages
        .iter()
        .map(|m| (m.subject.as_str(), m.project.as_str()))
        .collect();
    subjects.sort();
    assert_eq!(
        subjects,
        vec![
            ("lifecycle.acme%2Eeu.task_deleted", "acme.eu"),
            ("lifecycle.acme.task_deleted", "acme"),
        ]
    );
    // The README's filters: one token per project, so `*` catches both and `acme.>` only
    // acme's own subjects.
    let one_token = nats_kit::consume_durable(
        &js,
        "DOTTED",
        "every-project",
        "lifecycle.*.task_deleted",
        2,
    )
    .await;
    assert_eq!(one_token.len(), 2);
    let mut acme = js
        .get_stream("DOTTED")
        .await
        .unwrap()
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("acme".into()),
            filter_subject: "lifecycle.acme.>".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        acme.info().await.unwrap().num_pending,
        1,
        "lifecycle.acme.> holds acme's event only"
    );
    for relay in [&mut relay, &mut other] {
        relay.signal("TERM");
        assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
    }
}

outbox_tests::on_both_servers!(
    a_foreign_write_is_refused_retried_parked_and_replayed_once_it_is_gone,
    a_foreign_message_stored_while_the_relay_was_stopped_is_not_adopted,
    a_dotted_project_id_is_one_subject_token,
);

/// The stream fence needs the stream to itself: a relay started on a stream that holds another
/// project's messages (a stream covering every project, made for the subject fence) exits 2
/// naming them, before anything is claimed or published; with `--fence subject` it relays.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_stream_fence_refuses_a_stream_shared_with_another_project() {
    let db = fresh_db().await;
    let nats = NatsServer::start().await;
    let js = nats.jetstream().await;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "WIDE".into(),
        subjects: vec!["lifecycle.>".into()],
        duplicate_window: Duration::from_secs(600),
        max_age: Duration::from_secs(7 * 86400),
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
    .unwrap();
    js.publish("lifecycle.p2.task_deleted", "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    write_event(&db, "p1", "T-1").await;
    let mut relay = spawn_relay(&db, &nats, "p1", "WIDE");
    assert_eq!(relay.wait().await, 2, "{}", relay.stderr());
    assert!(
        relay.stderr().contains(
            "--fence stream needs stream WIDE to itself, and it holds messages of other \
             subjects (lifecycle.p2.task_deleted)"
        ),
        "{}",
        relay.stderr()
    );
    assert_eq!(cursor(&db, "p1", "relay-p1").await, None, "nothing claimed");

    let mut relay = spawn_relay_with(&db, &nats, "p1", "WIDE", &["--fence", "subject"]);
    eventually(
        Duration::from_secs(20),
        "relayed with the subject fence",
        || async { cursor(&db, "p1", "relay-p1").await == Some(1) },
    )
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
}
