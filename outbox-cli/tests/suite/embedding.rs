//! The libraries as libraries: `outbox_serve::Server` and `outbox_relay::Relay` run in this
//! process exactly as their crate docs show (the docs' example functions are these modules),
//! against a real database and a real nats-server; an event written reaches an SSE client and
//! the JetStream stream, and cancelling the shutdown token stops them cleanly. The typed
//! writer's example (`Writer::record_event`'s, the book's in Event contracts) records its
//! event as shown.

#[path = "../../../outbox-core/doc/record_event.rs"]
mod record_event_example;
#[path = "../../../outbox-relay/doc/embedding.rs"]
mod relay_example;
#[path = "../../../outbox-serve/doc/embedding.rs"]
mod serve_example;

use std::time::Duration;

use outbox_relay::Credentials;
use outbox_tests::consumer_kit::{cursor, eventually, write_event};
use outbox_tests::nats_kit::{NatsServer, assert_exactly_once_in_order, read_stream};
use outbox_tests::serve_kit::{SseClient, sse_id};
use outbox_tests::{TestDb, fresh_db, sequenced};
use tokio_util::sync::CancellationToken;

/// Long enough for a first claim and reconciliation on a loaded machine; only a hang fails.
const PATIENCE: Duration = Duration::from_secs(60);

/// Waits until consumer `consumer` of `project` has a cursor: its lease was claimed and its
/// first reconciliation recorded, so an event written now is delivered live.
async fn wait_for_cursor(db: &TestDb, project: &str, consumer: &str) {
    eventually(
        PATIENCE,
        &format!("{project}/{consumer} to claim and reconcile"),
        || async { cursor(db, project, consumer).await.is_some() },
    )
    .await;
}

/// The lease owners of `consumer`'s rows, by project (NULL once released).
async fn lease_owners(db: &TestDb, consumer: &str) -> Vec<(String, Option<String>)> {
    db.connect()
        .await
        .query(
            "SELECT project_id, lease_owner FROM outbox.lifecycle_consumers \
             WHERE consumer_id = $1 ORDER BY project_id",
            &[&consumer],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_server_runs_as_its_crate_docs_show_and_stops_at_its_token() {
    let db = fresh_db().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn({
        let (url, shutdown) = (db.url.clone(), shutdown.clone());
        async move { serve_example::serve(&url, listener, shutdown).await }
    });
    wait_for_cursor(&db, "p1", "dashboard").await;
    wait_for_cursor(&db, "p2", "dashboard").await;

    let client = SseClient::open(addr, "/v1/projects/p1/events", &[]).await;
    let event_id = write_event(&db, "p1", "t1").await;
    eventually(PATIENCE, "the event to reach the SSE client", || async {
        !client.sequences().is_empty()
    })
    .await;
    let events = client.events();
    assert_eq!(client.sequences(), vec![1]);
    assert_eq!(events[0].id.as_deref(), Some(sse_id(1, &event_id).as_str()));
    assert_eq!(events[0].json()["event_id"], event_id.as_str());

    shutdown.cancel();
    tokio::time::timeout(PATIENCE, server)
        .await
        .expect("the server stops once its token is cancelled")
        .unwrap()
        .expect("the server stops without an error");
    eventually(
        PATIENCE,
        "the SSE stream to be closed at shutdown",
        || async { client.ended() },
    )
    .await;
    assert_eq!(
        lease_owners(&db, "dashboard").await,
        vec![("p1".to_owned(), None), ("p2".to_owned(), None)],
        "both leases are released at shutdown"
    );
}

/// On a runtime whose worker threads have 8 MiB stacks: in an unoptimised build the relay's
/// TLS connection set-up, polled under the consumer loop, needs more than tokio's default
/// 2 MiB (an optimised build does not; the book says so for embedders).
#[test]
fn the_relay_runs_as_its_crate_docs_show_and_stops_at_its_token() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_stack_size(8 << 20)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
    let db = fresh_db().await;
    let nats = NatsServer::start().await;
    let shutdown = CancellationToken::new();
    let relay = tokio::spawn({
        let (url, nats_url, shutdown) = (db.url.clone(), nats.url(), shutdown.clone());
        async move { relay_example::relay(&url, &nats_url, Credentials::None, shutdown).await }
    });
    wait_for_cursor(&db, "p1", "relay").await;

    write_event(&db, "p1", "t1").await;
    let js = nats.jetstream().await;
    eventually(PATIENCE, "the event to reach the stream", || async {
        read_stream(&js, "LIFECYCLE")
            .await
            .iter()
            .any(|m| m.subject == "lifecycle.p1.task_deleted")
    })
    .await;
    let expected = sequenced(&db.connect().await, "p1").await;
    assert_eq!(expected.len(), 1);
    assert_exactly_once_in_order(
        &read_stream(&js, "LIFECYCLE").await,
        "lifecycle",
        "p1",
        &expected,
    );

    shutdown.cancel();
    tokio::time::timeout(PATIENCE, relay)
        .await
        .expect("the relay stops once its token is cancelled")
        .unwrap()
        .expect("the relay stops without an error");
    assert_eq!(
        lease_owners(&db, "relay").await,
        vec![("p1".to_owned(), None)],
        "the lease is released at shutdown"
    );
        });
}

/// The typed writer's example records its `task:archived` event once, with its trace
/// context: a second call with the same occurrence records nothing new.
#[tokio::test]
async fn the_typed_writer_records_as_its_docs_show() {
    use chrono::TimeZone as _;
    use outbox_core::WriteOutcome;

    const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let db = fresh_db().await;
    let path = format!(
        "{}/../contracts/task-archived.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let (code, out, err) =
        outbox_tests::process_kit::outbox_on(&db, &["contracts", "add", &path, "--by", "ops"])
            .await;
    assert_eq!(code, 0, "{out}{err}");
    let at = chrono::Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
    let mut client = db.connect().await;
    let outcome = record_event_example::archive(&mut client, "FN-9", at, TRACEPARENT)
        .await
        .unwrap();
    let event_id = "task-archived:FN-9:2026-01-02T03:04:05.000000Z";
    assert_eq!(
        outcome,
        WriteOutcome::Recorded {
            event_id: event_id.into()
        }
    );
    let again = record_event_example::archive(&mut client, "FN-9", at, TRACEPARENT)
        .await
        .unwrap();
    assert!(
        matches!(again, WriteOutcome::AlreadyRecorded { .. }),
        "{again:?}"
    );
    let row = client
        .query_one(
            "SELECT project_id, event_type, payload_version, traceparent, payload \
             FROM outbox.lifecycle_outbox",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "p1");
    assert_eq!(row.get::<_, String>(1), "task:archived");
    assert_eq!(row.get::<_, i32>(2), 1);
    assert_eq!(
        row.get::<_, Option<String>>(3).as_deref(),
        Some(TRACEPARENT)
    );
    assert_eq!(
        row.get::<_, serde_json::Value>(4)["prior"],
        serde_json::json!({"column": "done", "status": "closed"})
    );
}
