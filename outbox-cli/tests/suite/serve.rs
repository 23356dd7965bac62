//! `outbox serve` against a real server process and a real PostgreSQL: the SSE stream (order,
//! content, ids, resume from the ring, from PostgreSQL and from below the retention floor),
//! slow clients, readiness with two processes, metrics, admin actions and refusals.

use std::time::Duration;

use outbox_tests::consumer_kit::{cursor, eventually, write_event};
use outbox_tests::process_kit::{ConsumeProcess, outbox_json, outbox_on, run_outbox};
use outbox_tests::serve_kit::{Metrics, ServeProcess, SseClient, free_port, get, post, sse_id};
use outbox_tests::{TestDb, fresh_db};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Timings compressed so tests run in seconds.
const FAST: &[&str] = &[
    "--lease-ttl",
    "2s",
    "--heartbeat-interval",
    "300ms",
    "--poll-interval",
    "100ms",
    "--shutdown-grace",
    "500ms",
    "--keep-alive",
    "1s",
    "--ready-max-poll-age",
    "3s",
    "--dashboard-refresh",
    "300ms",
    "--drain-timeout",
    "2s",
    "--no-prune",
];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut all: Vec<&str> = FAST.to_vec();
    all.extend_from_slice(extra);
    all
}

/// [`args`] with some of the compressed timings replaced (clap refuses a flag given twice).
fn args_with<'a>(replaced: &[(&'a str, &'a str)], extra: &[&'a str]) -> Vec<&'a str> {
    let mut all: Vec<&str> = Vec::new();
    let mut fast = FAST.iter();
    while let Some(&flag) = fast.next() {
        let value = match flag {
            "--no-prune" => None,
            _ => fast.next().copied(),
        };
        match replaced.iter().find(|(name, _)| *name == flag) {
            Some(&(name, new)) => all.extend([name, new]),
            None => all.extend(std::iter::once(flag).chain(value)),
        }
    }
    all.extend_from_slice(extra);
    all
}

async fn ready(server: &ServeProcess) {
    let addr = server.addr;
    eventually(
        Duration::from_secs(15),
        "/readyz answers 200",
        || async move { matches!(get(addr, "/readyz", &[]).await, Ok((200, _, _))) },
    )
    .await;
}

async fn add_tasks(db: &TestDb, project: &str, tasks: &[&str]) {
    let client = db.connect().await;
    for task in tasks {
        client
            .execute(
                "INSERT INTO public.tasks (id, project_id) VALUES ($1, $2)",
                &[task, &project],
            )
            .await
            .unwrap();
    }
}

async fn delete_task(db: &TestDb, project: &str, task: &str) {
    db.connect()
        .await
        .query_one(
            "WITH d AS (UPDATE public.tasks SET deleted_at = now() \
                        WHERE id = $1 AND deleted_at IS NULL \
                        RETURNING project_id, id, deleted_at, column_name, status) \
             SELECT outbox.write_task_deleted(project_id, id, deleted_at, 'test-writer', \
                        jsonb_build_object('column', column_name, 'status', status)) FROM d",
            &[&task],
        )
        .await
        .unwrap_or_else(|e| panic!("delete {task} in {project}: {e}"));
}

#[tokio::test]
async fn stream_carries_handled_events_in_order_and_resumes_from_ring_and_history() {
    let db = fresh_db().await;
    let server = ServeProcess::start(
        &db.url,
        &args(&[
            "--project",
            "p1",
            "--consumer-id",
            "feed",
            "--ring-size",
            "3",
        ]),
    )
    .await;
    ready(&server).await;
    let live = SseClient::open(server.addr, "/v1/projects/p1/events", &[]).await;

    let mut ids = Vec::new();
    for n in 1..=5 {
        ids.push(write_event(&db, "p1", &format!("T-{n}")).await);
    }
    eventually(
        Duration::from_secs(10),
        "five events on the live client",
        || {
            let n = live.sequences().len();
            async move { n >= 5 }
        },
    )
    .await;
    assert_eq!(live.sequences(), vec![1, 2, 3, 4, 5]);
    for (n, message) in live
        .events()
        .iter()
        .filter(|m| m.event.as_deref() == Some("task:deleted"))
        .enumerate()
    {
        let data = message.json();
        let sequence = n as i64 + 1;
        let id = sse_id(sequence, ids[n].as_str());
        assert_eq!(message.id.as_deref(), Some(id.as_str()));
        assert_eq!(data["sequence"], sequence);
        assert_eq!(data["type"], "event");
        assert_eq!(data["event_type"], "task:deleted");
        assert_eq!(data["observed"], true);
        assert_eq!(data["project_id"], "p1");
        assert_eq!(data["consumer_id"], "feed");
        assert_eq!(data["task_id"], format!("T-{sequence}"));
        assert_eq!(data["event_id"], ids[n]);
        assert_eq!(data["replay"], false);
        assert_eq!(data["writer_process_id"], "test-writer");
    }

    // The ring holds 3..5: a resume after 3 is served from memory.
    let from_ring = SseClient::open(
        server.addr,
        "/v1/projects/p1/events",
        &[("last-event-id", "3")],
    )
    .await;
    // After 0, events 1 and 2 are only in PostgreSQL.
    let from_history = SseClient::open(
        server.addr,
        "/v1/projects/p1/events",
        &[("last-event-id", "0")],
    )
    .await;
    let by_query = SseClient::open(server.addr, "/v1/projects/p1/events?after=1", &[]).await;
    // Both: Last-Event-ID wins (an EventSource reconnecting to its first URL sends both).
    let reconnected = SseClient::open(
        server.addr,
        "/v1/projects/p1/events?after=1",
        &[("last-event-id", "4")],
    )
    .await;
    eventually(Duration::from_secs(10), "resumed clients catch up", || {
        let done = from_ring.sequences().len() >= 2
            && from_history.sequences().len() >= 5
            && by_query.sequences().len() >= 4
            && !reconnected.sequences().is_empty();
        async move { done }
    })
    .await;
    assert_eq!(reconnected.sequences(), vec![5]);
    assert_eq!(from_ring.sequences(), vec![4, 5]);
    assert_eq!(from_history.sequences(), vec![1, 2, 3, 4, 5]);
    assert_eq!(by_query.sequences(), vec![2, 3, 4, 5]);
    let first = &from_history.events()[0].json();
    assert_eq!(first["event_id"], ids[0], "history carries the same JSON");

    // New events reach every client once, after what they resumed with.
    write_event(&db, "p1", "T-6").await;
    eventually(Duration::from_secs(10), "event 6 everywhere", || {
        let done = [&live, &from_ring, &from_history, &by_query]
            .iter()
            .all(|c| c.sequences().last() == Some(&6));
        async move { done }
    })
    .await;
    assert_eq!(live.sequences(), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(from_ring.sequences(), vec![4, 5, 6]);
    assert_eq!(from_history.sequences(), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(by_query.sequences(), vec![2, 3, 4, 5, 6]);

    // Keep-alive comments flow while nothing happens (every second here).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        live.messages()
            .iter()
            .any(|m| m.comment.as_deref() == Some("keep-alive")),
        "no keep-alive comment: {:?}",
        live.messages()
    );
}

#[tokio::test]
async fn a_client_below_the_retention_floor_reconciles_first() {
    let db = fresh_db().await;
    add_tasks(&db, "p1", &["A", "B", "C", "D", "E"]).await;
    let server = ServeProcess::start(
        &db.url,
        &args(&["--project", "p1", "--consumer-id", "feed"]),
    )
    .await;
    ready(&server).await;
    for task in ["A", "B", "C"] {
        delete_task(&db, "p1", task).await;
    }
    eventually(Duration::from_secs(10), "cursor at 3", || {
        let db = &db;
        async move { cursor(db, "p1", "feed").await == Some(3) }
    })
    .await;
    let (code, out, err) = run_outbox(&[
        "prune",
        "--database-url",
        &db.url,
        "--retention",
        "0s",
        "--project",
        "p1",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let floor: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT pruned_through FROM outbox.lifecycle_project_heads WHERE project_id = 'p1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(floor >= 2, "prune left the floor at {floor}");

    let client = SseClient::open(
        server.addr,
        "/v1/projects/p1/events",
        &[("last-event-id", "1")],
    )
    .await;
    eventually(Duration::from_secs(10), "a reconcile message", || {
        let n = client.events().len();
        async move { n >= 1 }
    })
    .await;
    let first = client.events()[0].clone();
    assert_eq!(first.event.as_deref(), Some("reconcile"));
    assert_eq!(
        first.sequence(),
        Some(3),
        "the reconciliation's id is the head"
    );
    let data = first.json();
    assert_eq!(data["type"], "reconcile");
    assert_eq!(data["head_sequence"], 3);
    assert_eq!(data["reason"], "below_retention_floor");
    let mut live: Vec<String> = data["live_task_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    live.sort();
    assert_eq!(live, vec!["D", "E"]);

    delete_task(&db, "p1", "D").await;
    eventually(
        Duration::from_secs(10),
        "event 4 after the reconcile",
        || {
            let done = client.sequences() == vec![4];
            async move { done }
        },
    )
    .await;
    let events = client.events();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1].json()["task_id"], "D");
}

#[tokio::test]
async fn a_slow_client_is_dropped_while_a_fast_one_keeps_up() {
    let db = fresh_db().await;
    let server = ServeProcess::start(
        &db.url,
        &args(&[
            "--project",
            "p1",
            "--consumer-id",
            "feed",
            "--batch-size",
            "50",
            "--client-queue",
            "200",
            "--lagged-grace",
            "10s",
        ]),
    )
    .await;
    ready(&server).await;
    let fast = SseClient::open(server.addr, "/v1/projects/p1/events", &[]).await;

    // A client that sends its request and then reads nothing, with a tiny receive buffer.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut slow = socket.connect(server.addr).await.unwrap();
    slow.write_all(
        format!(
            "GET /v1/projects/p1/events HTTP/1.1\r\nhost: {}\r\naccept: text/event-stream\r\n\r\n",
            server.addr
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    eventually(Duration::from_secs(10), "two SSE clients", || {
        let server = &server;
        async move {
            server
                .metrics()
                .await
                .get("outbox_sse_clients", &[("project", "p1")])
                == Some(2.0)
        }
    })
    .await;

    let total = 10_000;
    db.connect()
        .await
        .execute(
            "SELECT outbox.write_task_deleted('p1', 'S-' || g, now(), 'bulk', NULL) \
             FROM generate_series(1, $1::int) AS g",
            &[&total],
        )
        .await
        .unwrap();

    eventually(
        Duration::from_secs(60),
        "the slow client is dropped",
        || {
            let server = &server;
            async move {
                server
                    .metrics()
                    .await
                    .get("outbox_sse_dropped_total", &[("project", "p1")])
                    == Some(1.0)
            }
        },
    )
    .await;
    // Read what the server still wrote: queued events, then the final `lagged` message, then
    // the end of the connection.
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), slow.read_to_end(&mut received)).await;
    assert!(
        read.is_ok(),
        "the server did not close the slow client's connection"
    );
    let text = String::from_utf8_lossy(&received);
    assert!(
        text.contains("event: lagged"),
        "no lagged message; the slow client got {} bytes ending in {:?}",
        text.len(),
        &text[text.len().saturating_sub(300)..]
    );
    // It names the last message the client was sent: its sequence, and its whole id to
    // resume with.
    let (before, lagged) = text.rsplit_once("event: lagged\ndata: ").unwrap();
    let lagged: serde_json::Value = serde_json::from_str(lagged.lines().next().unwrap()).unwrap();
    let last_id = before
        .lines()
        .filter_map(|line| line.strip_prefix("id: "))
        .next_back()
        .expect("events before the lagged message");
    assert_eq!(lagged["last_id"], last_id, "{lagged}");
    let sequence: i64 = last_id.split_once(':').unwrap().0.parse().unwrap();
    assert_eq!(lagged["last_event_id"], sequence, "{lagged}");

    eventually(
        Duration::from_secs(60),
        "the fast client gets everything",
        || {
            let n = fast.sequences().len();
            async move { n >= total as usize }
        },
    )
    .await;
    assert_eq!(fast.sequences(), (1..=total as i64).collect::<Vec<_>>());
    assert!(!fast.ended(), "the fast client was disconnected");
    assert!(
        fast.events()
            .iter()
            .all(|m| m.event.as_deref() == Some("task:deleted")),
        "the fast client got something other than events"
    );
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.get("outbox_sse_clients", &[("project", "p1")]),
        Some(1.0)
    );
    assert_eq!(
        metrics.get("outbox_sse_dropped_total", &[("project", "p1")]),
        Some(1.0)
    );
}

#[tokio::test]
async fn only_the_lease_holder_is_ready_and_sigterm_drains() {
    let db = fresh_db().await;
    let common = args(&["--project", "p1", "--consumer-id", "shared"]);
    let mut first = ServeProcess::start(&db.url, &common).await;
    ready(&first).await;
    let second = ServeProcess::start(&db.url, &common).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, _, body) = get(second.addr, "/readyz", &[]).await.unwrap();
    assert_eq!(status, 503, "{body}");
    let reason: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reason["ready"], false);
    assert!(
        reason["error"]
            .as_str()
            .unwrap()
            .contains("does not hold the lease"),
        "{body}"
    );
    assert_eq!(get(second.addr, "/healthz", &[]).await.unwrap().0, 200);
    let held = |m: &Metrics| {
        m.get(
            "outbox_lease_held",
            &[("project", "p1"), ("consumer", "shared")],
        )
    };
    assert_eq!(held(&first.metrics().await), Some(1.0));
    assert_ne!(held(&second.metrics().await), Some(1.0));

    write_event(&db, "p1", "T-1").await;
    let client = SseClient::open(
        first.addr,
        "/v1/projects/p1/events",
        &[("last-event-id", "0")],
    )
    .await;
    eventually(Duration::from_secs(10), "event 1", || {
        let done = client.sequences() == vec![1];
        async move { done }
    })
    .await;

    first.signal("TERM");
    assert_eq!(first.wait().await, 0, "stderr:\n{}", first.stderr());
    eventually(Duration::from_secs(5), "the stream ends", || {
        let done = client.ended();
        async move { done }
    })
    .await;
    let last = client.messages().last().cloned().unwrap();
    assert_eq!(last.comment.as_deref(), Some("server shutting down"));
    assert_eq!(cursor(&db, "p1", "shared").await, Some(1), "acknowledged");
    let row = db
        .connect()
        .await
        .query_one(
            "SELECT lease_owner, lease_generation FROM outbox.lifecycle_consumer_cursors \
             WHERE project_id = 'p1' AND consumer_id = 'shared'",
            &[],
        )
        .await
        .unwrap();
    let (owner, generation): (Option<String>, i64) = (row.get(0), row.get(1));
    // Released at shutdown (or already claimed by the second process).
    assert!(owner.is_none() || generation >= 2, "{owner:?} {generation}");
    ready(&second).await;
    assert_eq!(held(&second.metrics().await), Some(1.0));
}

#[tokio::test]
async fn metrics_follow_the_stream() {
    let db = fresh_db().await;
    let server =
        ServeProcess::start(&db.url, &args(&["--project", "p1", "--consumer-id", "m"])).await;
    ready(&server).await;
    let labels = [("project", "p1"), ("consumer", "m")];
    let metrics = server.metrics().await;
    assert_eq!(metrics.get("outbox_lease_held", &labels), Some(1.0));
    assert!(metrics.get("outbox_lease_generation", &labels).unwrap() >= 1.0);
    assert_eq!(
        metrics.get("outbox_sse_clients", &[("project", "p1")]),
        Some(0.0)
    );
    assert_eq!(
        metrics.get("outbox_sse_dropped_total", &[("project", "p1")]),
        Some(0.0)
    );

    let client = SseClient::open(server.addr, "/v1/projects/p1/events", &[]).await;
    for n in 1..=4 {
        write_event(&db, "p1", &format!("T-{n}")).await;
    }
    let wanted = |m: &Metrics, delivered: f64| {
        m.get("outbox_events_delivered_total", &labels) == Some(delivered)
            && m.get("outbox_consumer_lag_events", &labels) == Some(0.0)
            && m.get("outbox_commit_to_dispatch_seconds_count", &[]) == Some(delivered)
            && m.get("outbox_sse_clients", &[("project", "p1")]) == Some(1.0)
    };
    eventually(Duration::from_secs(10), "4 delivered, no lag", || {
        let server = &server;
        async move { wanted(&server.metrics().await, 4.0) }
    })
    .await;
    for n in 5..=7 {
        write_event(&db, "p1", &format!("T-{n}")).await;
    }
    eventually(Duration::from_secs(10), "7 delivered, no lag", || {
        let server = &server;
        async move { wanted(&server.metrics().await, 7.0) }
    })
    .await;
    // The client is written once per write interval: the last event may follow the metrics.
    eventually(Duration::from_secs(10), "the client to have all 7", || {
        let n = client.sequences().len();
        async move { n == 7 }
    })
    .await;
    let metrics = server.metrics().await;
    assert_eq!(metrics.get("outbox_dead_letters", &labels), Some(0.0));
    // Sampled once per poll interval: it may still show an event the sequencer has numbered
    // since.
    eventually(Duration::from_secs(10), "no unsequenced events", || {
        let server = &server;
        async move { server.metrics().await.get("outbox_unsequenced_events", &[]) == Some(0.0) }
    })
    .await;
    assert!(
        metrics
            .get("outbox_oldest_unsequenced_seconds", &[])
            .is_some()
    );
    let inf = metrics
        .get(
            "outbox_commit_to_dispatch_seconds_bucket",
            &[("le", "+Inf")],
        )
        .unwrap();
    assert_eq!(inf, 7.0, "histogram, not a summary");
}

#[tokio::test]
async fn refusals_404_400_503_and_usage_errors() {
    let db = fresh_db().await;
    let server = ServeProcess::start(
        &db.url,
        &args(&[
            "--project",
            "p1",
            "--project",
            "p2",
            "--consumer-id",
            "feed",
            "--max-clients",
            "1",
        ]),
    )
    .await;
    let addr = server.addr;
    let (status, _, body) = get(addr, "/v1/projects/p3/events", &[]).await.unwrap();
    assert_eq!(status, 404, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"], "project \"p3\" is not served here");
    assert_eq!(error["projects"], json!(["p1", "p2"]));
    for bad in ["abc", "-1", "1.5", ""] {
        let (status, _, body) = get(addr, "/v1/projects/p1/events", &[("last-event-id", bad)])
            .await
            .unwrap();
        assert_eq!(status, 400, "Last-Event-ID {bad:?}: {body}");
        assert!(body.contains("malformed Last-Event-ID"), "{body}");
    }
    // An id with a malformed identity after the sequence names that part.
    for bad in ["5:", "5:abc", "5:e3b0c44298fc1c14:1", "5:zzzzzzzzzzzzzzzz"] {
        let (status, _, body) = get(addr, "/v1/projects/p1/events", &[("last-event-id", bad)])
            .await
            .unwrap();
        assert_eq!(status, 400, "Last-Event-ID {bad:?}: {body}");
        let error: serde_json::Value = serde_json::from_str(&body).unwrap();
        let message = error["error"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("malformed Last-Event-ID {bad:?}: "))
                && message.contains("16 hex digits"),
            "{message}"
        );
    }
    let (status, _, body) = get(addr, "/v1/projects/p1/events?after=x", &[])
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    let message = error["error"].as_str().unwrap();
    assert!(
        message.starts_with("malformed after=\"x\": expected a sequence"),
        "{message}"
    );
    let (status, _, body) = get(addr, "/v1/projects/p1/events?after=3:12", &[])
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("16 hex digits"), "{body}");

    ready(&server).await;
    let _only = SseClient::open(addr, "/v1/projects/p2/events", &[]).await;
    let (status, headers, body) = get(addr, "/v1/projects/p1/events", &[]).await.unwrap();
    assert_eq!(status, 503, "{body}");
    let retry: u64 = headers["retry-after"].parse().unwrap();
    assert!(retry >= 1);
    assert!(
        body.contains("already has 1 SSE client (--max-clients)"),
        "{body}"
    );
    // The dashboard's own stream takes a slot too.
    let (status, headers, body) = get(addr, "/v1/dashboard/stream", &[]).await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(headers.contains_key("retry-after"));

    // The address in use.
    let listen = addr.to_string();
    let (code, _, err) = run_outbox(&[
        "--database-url",
        &db.url,
        "serve",
        "--project",
        "p1",
        "--consumer-id",
        "x",
        "--listen",
        &listen,
    ])
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("cannot listen on {listen}")) && err.contains("already in use"),
        "{err}"
    );

    let port = free_port().to_string();
    let local = format!("127.0.0.1:{port}");
    let any = format!("0.0.0.0:{port}");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--listen", &local, "--admin-operator", "alice"],
            "--admin-operator needs --admin-token",
        ),
        (
            vec!["--listen", &local, "--admin-token", "t"],
            "--admin-token needs --admin-operator",
        ),
        (
            vec![
                "--listen",
                &any,
                "--admin-token",
                " ",
                "--admin-operator",
                "alice",
            ],
            "refusing to serve admin actions on non-loopback address",
        ),
        (
            vec![
                "--listen",
                &local,
                "--admin-token",
                "t",
                "--admin-operator",
                "bad name",
            ],
            "invalid --admin-operator",
        ),
        (
            vec![
                "--listen",
                &local,
                "--client-queue",
                "10",
                "--batch-size",
                "50",
            ],
            "--client-queue",
        ),
        (
            vec!["--listen", &local, "--project", "p1"],
            "--project p1 is given more than once",
        ),
        (
            vec!["--listen", &local, "--exit-when-caught-up"],
            "outbox serve runs until it is stopped",
        ),
        (
            vec!["--listen", &local, "--keep-alive", "-1s"],
            "must be greater than zero",
        ),
        (vec!["--listen", "localhost"], "invalid --listen"),
    ];
    for (extra, expected) in cases {
        let mut argv = vec![
            "--database-url",
            &db.url,
            "serve",
            "--project",
            "p1",
            "--consumer-id",
            "x",
        ];
        argv.extend(extra.iter().copied());
        let (code, _, err) = run_outbox(&argv).await;
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(expected), "{extra:?}: {err}");
    }
}

#[tokio::test]
async fn admin_actions_need_the_token_and_are_audited() {
    let db = fresh_db().await;
    // A consumer whose child fails every event parks a dead letter; its own /metrics shows it.
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let mut broken = ConsumeProcess::spawn(
        &db.url,
        &[
            "--project",
            "p1",
            "--consumer-id",
            "broken",
            "--child",
            "exit 1",
            "--max-attempts",
            "1",
            "--poll-interval",
            "100ms",
            "--no-prune",
            "--start-from",
            "earliest",
            "--metrics-addr",
            &metrics_addr,
        ],
    );
    let event_id = write_event(&db, "p1", "T-1").await;
    let addr: std::net::SocketAddr = metrics_addr.parse().unwrap();
    let labels = [("project", "p1"), ("consumer", "broken")];
    eventually(
        Duration::from_secs(20),
        "a dead letter in the consumer's metrics",
        || async move {
            let Ok((200, _, body)) = get(addr, "/metrics", &[]).await else {
                return false;
            };
            let m = Metrics::parse(&body);
            m.get(
                "outbox_delivery_failures_total",
                &[
                    ("project", "p1"),
                    ("consumer", "broken"),
                    ("class", "child_exited"),
                ],
            ) == Some(1.0)
                && m.get("outbox_dead_letters", &labels) == Some(1.0)
        },
    )
    .await;
    broken.signal("TERM");
    assert_eq!(broken.wait().await, 0, "{}", broken.stderr());

    // Read-only server: admin actions are disabled.
    let read_only = ServeProcess::start(
        &db.url,
        &args(&["--project", "p1", "--consumer-id", "feed"]),
    )
    .await;
    let letter = json!({"project": "p1", "consumer_id": "broken", "event_id": event_id});
    let (status, _, body) = post(read_only.addr, "/v1/admin/replay", &[], &letter)
        .await
        .unwrap();
    assert_eq!(status, 403, "{body}");
    drop(read_only);

    let server = ServeProcess::start_with_env(
        &db.url,
        &args(&[
            "--project",
            "p1",
            "--consumer-id",
            "feed",
            "--admin-operator",
            "alice",
        ]),
        &[("OUTBOX_ADMIN_TOKEN", "s3cret-token")],
    )
    .await;
    let addr = server.addr;
    let good = [("authorization", "Bearer s3cret-token")];
    let wrong = [("authorization", "Bearer nope")];
    for (path, body) in [
        ("/v1/admin/replay", letter.clone()),
        (
            "/v1/admin/resolve",
            json!({"project": "p1", "consumer_id": "broken", "event_id": event_id, "reason": "fixed"}),
        ),
        (
            "/v1/admin/retire",
            json!({"project": "p1", "consumer_id": "broken", "reason": "gone"}),
        ),
    ] {
        for headers in [&[][..], &wrong[..]] {
            let (status, h, text) = post(addr, path, headers, &body).await.unwrap();
            assert_eq!(status, 401, "{path} {headers:?}: {text}");
            assert_eq!(h["www-authenticate"], "Bearer");
        }
    }
    // Nothing happened without the token.
    let audited = || async {
        db.connect()
            .await
            .query(
                "SELECT kind, actor FROM outbox.lifecycle_audit \
                 WHERE consumer_id = 'broken' ORDER BY id",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, Option<String>>(1)))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        audited().await.len(),
        1,
        "only the parking: {:?}",
        audited().await
    );

    let (status, _, text) = post(addr, "/v1/admin/replay", &good, &letter)
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    let replay: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(replay["requested"], json!([event_id]));
    // Replaying it again is a conflict (it is no longer dead), as in the CLI.
    let (status, _, text) = post(addr, "/v1/admin/replay", &good, &letter)
        .await
        .unwrap();
    assert_eq!(status, 409, "{text}");
    // The consumer's lease holder carries the replay out (its child fails again), and the
    // runtime audits the outcome, as after `outbox dead-letters replay`.
    let mut again = ConsumeProcess::spawn(
        &db.url,
        &[
            "--project",
            "p1",
            "--consumer-id",
            "broken",
            "--child",
            "exit 1",
            "--max-attempts",
            "1",
            "--poll-interval",
            "100ms",
            "--no-prune",
        ],
    );
    eventually(
        Duration::from_secs(20),
        "the replay is carried out and audited",
        || async {
            audited()
                .await
                .iter()
                .filter(|(kind, _)| kind.ends_with("consumer-poisoned"))
                .count()
                == 2
        },
    )
    .await;
    again.signal("TERM");
    assert_eq!(again.wait().await, 0, "{}", again.stderr());

    let resolve = json!({"project": "p1", "consumer_id": "broken", "event_id": event_id, "reason": "fixed by hand"});
    let (status, _, text) = post(addr, "/v1/admin/resolve", &good, &resolve)
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    let resolved: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(resolved["resolved_by"], "alice");
    assert_eq!(resolved["previous_state"], "dead");

    let retire = json!({"project": "p1", "consumer_id": "broken", "reason": "decommissioned"});
    let (status, _, text) = post(addr, "/v1/admin/retire", &good, &retire)
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    let retired: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(retired["retired_by"], "alice");

    let (status, _, text) = post(addr, "/v1/admin/resolve", &good, &json!({"project": "p1"}))
        .await
        .unwrap();
    assert_eq!(status, 400, "{text}");
    let (status, _, text) = post(
        addr,
        "/v1/admin/retire",
        &good,
        &json!({"project": "p1", "consumer_id": "nobody", "reason": "x"}),
    )
    .await
    .unwrap();
    assert_eq!(status, 404, "{text}");

    let trail = audited().await;
    assert!(
        trail
            .iter()
            .any(|(k, a)| k.ends_with("dead-letter-replay-requested")
                && a.as_deref() == Some("alice")),
        "the replay request is audited under the operator name, as with --by: {trail:?}"
    );
    assert!(
        trail
            .iter()
            .any(|(k, a)| k.ends_with("dead-letter-resolved") && a.as_deref() == Some("alice")),
        "{trail:?}"
    );
    assert!(
        trail
            .iter()
            .any(|(k, a)| k.ends_with("consumer-retired") && a.as_deref() == Some("alice")),
        "{trail:?}"
    );
    // The same rows the CLI writes: `outbox audit` shows them.
    let (code, out, err) = run_outbox(&[
        "--database-url",
        &db.url,
        "audit",
        "--consumer-id",
        "broken",
        "--output",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("\"actor\": \"alice\"") || out.contains("\"actor\":\"alice\""),
        "{out}"
    );
}

/// A child that records every line it gets and acknowledges each, except events of task
/// `poison`, which it fails.
const CHILD: &str = r#"
while IFS= read -r line; do
  printf '%s\n' "$line" >> "$CHILD_LOG"
  seq=$(printf '%s' "$line" | sed -n -E 's/.*"(head_)?sequence":([0-9]*).*/\2/p')
  case "$line" in
    *'"task_id":"poison"'*) printf '{"fail": %s, "class": "poison_pill"}\n' "$seq" ;;
    *) printf '{"ack": %s}\n' "$seq" ;;
  esac
done
"#;

#[tokio::test]
async fn with_a_child_the_stream_carries_what_the_child_acknowledged() {
    let db = fresh_db().await;
    let log = std::env::temp_dir().join(format!("outbox-serve-child-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let log_path = log.display().to_string();
    let server = ServeProcess::start_with_env(
        &db.url,
        &args(&[
            "--project",
            "p1",
            "--consumer-id",
            "feed",
            "--start-from",
            "earliest",
            "--child",
            CHILD,
            "--max-attempts",
            "1",
        ]),
        &[("CHILD_LOG", log_path.as_str())],
    )
    .await;
    ready(&server).await;
    let live = SseClient::open(server.addr, "/v1/projects/p1/events", &[]).await;
    for task in ["a", "poison", "b"] {
        write_event(&db, "p1", task).await;
    }
    eventually(
        Duration::from_secs(15),
        "events 1 and 3 on the stream",
        || {
            let done = live.sequences() == vec![1, 3];
            async move { done }
        },
    )
    .await;
    let child_saw = std::fs::read_to_string(&log).unwrap_or_default();
    for task in [
        "\"task_id\":\"a\"",
        "\"task_id\":\"poison\"",
        "\"task_id\":\"b\"",
    ] {
        assert!(
            child_saw.contains(task),
            "the child never got {task}: {child_saw}"
        );
    }
    // The parked event is not history either: a resume from 0 skips it.
    let resumed = SseClient::open(
        server.addr,
        "/v1/projects/p1/events",
        &[("last-event-id", "0")],
    )
    .await;
    write_event(&db, "p1", "c").await;
    eventually(Duration::from_secs(10), "event 4 on both", || {
        let done = live.sequences() == vec![1, 3, 4] && resumed.sequences() == vec![1, 3, 4];
        async move { done }
    })
    .await;
    let m = server.metrics().await;
    assert_eq!(
        m.get(
            "outbox_delivery_failures_total",
            &[
                ("project", "p1"),
                ("consumer", "feed"),
                ("class", "poison_pill")
            ]
        ),
        Some(1.0)
    );
    // Counted at acknowledgement, which follows publication.
    eventually(Duration::from_secs(10), "3 delivered", || {
        let server = &server;
        async move {
            server.metrics().await.get(
                "outbox_events_delivered_total",
                &[("project", "p1"), ("consumer", "feed")],
            ) == Some(3.0)
        }
    })
    .await;
    let _ = std::fs::remove_file(&log);
}

/// Connections to the test's database other than the one asking, and how many of them
/// are LISTEN connections.
async fn server_connections(db: &TestDb) -> (i64, i64) {
    let row = db
        .connect()
        .await
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE application_name = 'outbox-listener') \
             FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn a_hundred_projects_hold_the_pool_and_one_listen_connection() {
    let db = fresh_db().await;
    let projects: Vec<String> = (0..100).map(|i| format!("p{i:03}")).collect();
    // Slower polls than FAST: a hundred consumers on a pool of four, on a shared machine.
    let mut extra = vec![
        "--lease-ttl",
        "5s",
        "--heartbeat-interval",
        "1s",
        "--poll-interval",
        "500ms",
        "--ready-max-poll-age",
        "10s",
        "--no-prune",
        "--pool-size",
        "4",
        "--consumer-id",
        "wide",
    ];
    for project in &projects {
        extra.extend(["--project", project.as_str()]);
    }
    let server = ServeProcess::start(&db.url, &extra).await;
    ready(&server).await;
    write_event(&db, "p042", "T-1").await;
    eventually(Duration::from_secs(10), "p042's event acknowledged", || {
        let db = &db;
        async move { cursor(db, "p042", "wide").await == Some(1) }
    })
    .await;
    let (all, listeners) = server_connections(&db).await;
    assert_eq!(listeners, 1, "one LISTEN connection for every project");
    assert!(
        all <= 4 + 1,
        "{all} connections: more than the pool (4) and the LISTEN connection"
    );
}

#[tokio::test]
async fn a_resume_position_above_the_head_reconciles_instead_of_waiting() {
    let db = fresh_db().await;
    add_tasks(&db, "p1", &["A", "B", "C", "D", "E"]).await;
    let server = ServeProcess::start(
        &db.url,
        &args(&["--project", "p1", "--consumer-id", "feed"]),
    )
    .await;
    ready(&server).await;
    for task in ["A", "B", "C"] {
        delete_task(&db, "p1", task).await;
    }
    eventually(Duration::from_secs(10), "cursor at 3", || {
        let db = &db;
        async move { cursor(db, "p1", "feed").await == Some(3) }
    })
    .await;
    // Far above the head, by header; just above it, by query.
    let far = SseClient::open(
        server.addr,
        "/v1/projects/p1/events",
        &[("last-event-id", "100")],
    )
    .await;
    let next = SseClient::open(server.addr, "/v1/projects/p1/events?after=4", &[]).await;
    for client in [&far, &next] {
        eventually(Duration::from_secs(10), "a reconcile message", || {
            let n = client.events().len();
            async move { n >= 1 }
        })
        .await;
        let first = client.events()[0].clone();
        assert_eq!(first.event.as_deref(), Some("reconcile"), "{first:?}");
        assert_eq!(first.sequence(), Some(3), "the reconciliation's head");
        let data = first.json();
        assert_eq!(data["reason"], "above_head");
        let mut live: Vec<String> = data["live_task_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        live.sort();
        assert_eq!(live, vec!["D", "E"]);
    }
    delete_task(&db, "p1", "D").await;
    delete_task(&db, "p1", "E").await;
    for client in [&far, &next] {
        eventually(Duration::from_secs(10), "events 4 and 5 after it", || {
            let done = client.sequences() == vec![4, 5];
            async move { done }
        })
        .await;
    }
}

/// The stream's ids carry the identity of the event at their sequence, so a resume id from
/// another history (here one forged with another event's identity; `failover.rs` has the
/// real thing) is found whether the server checks it in its ring or in the database, and the
/// client is sent a reconciliation (`history_diverged`) and then every later event, instead
/// of continuing after a number that names another event here. The right id, a bare sequence
/// and a reconciliation's own id resume without one.
#[tokio::test]
async fn a_resume_id_from_another_history_reconciles_instead_of_skipping() {
    let db = fresh_db().await;
    add_tasks(&db, "p1", &["A", "B", "C", "D", "E", "F", "G"]).await;
    // A ring of one: event 5 is checked in memory, event 3 in the database.
    let server = ServeProcess::start(
        &db.url,
        &args(&[
            "--project",
            "p1",
            "--consumer-id",
            "feed",
            "--ring-size",
            "1",
        ]),
    )
    .await;
    ready(&server).await;
    for task in ["A", "B", "C", "D", "E"] {
        delete_task(&db, "p1", task).await;
    }
    eventually(Duration::from_secs(10), "cursor at 5", || {
        let db = &db;
        async move { cursor(db, "p1", "feed").await == Some(5) }
    })
    .await;
    let history = outbox_tests::sequenced(&db.connect().await, "p1").await;
    let (at3, at5) = (history[2].1.as_str(), history[4].1.as_str());
    let path = "/v1/projects/p1/events";
    let open = |id: String| async move {
        SseClient::open(server.addr, path, &[("last-event-id", id.as_str())]).await
    };
    let other_at_3 = open(sse_id(3, "an event of another history")).await;
    let other_at_5 = open(sse_id(5, "an event of another history")).await;
    let beyond = open(sse_id(9, "an event of another history")).await;
    let right_at_3 = open(sse_id(3, at3)).await;
    let bare_3 = open("3".to_owned()).await;
    let diverged = [
        ("other at 3", &other_at_3),
        ("other at 5", &other_at_5),
        ("beyond the head", &beyond),
    ];
    for (who, client) in diverged {
        eventually(Duration::from_secs(10), "a reconcile message", || {
            let n = client.events().len();
            async move { n >= 1 }
        })
        .await;
        let first = client.events()[0].clone();
        assert_eq!(
            first.event.as_deref(),
            Some("reconcile"),
            "{who}: {first:?}"
        );
        let data = first.json();
        assert_eq!(data["reason"], "history_diverged", "{who}");
        assert_eq!(data["head_sequence"], 5, "{who}");
        assert_eq!(data["live_task_ids"], json!(["F", "G"]), "{who}");
        // Resumable like an event's: the head and the identity of the event there.
        assert_eq!(first.id, Some(sse_id(5, at5)), "{who}");
    }
    let reconcile_id = other_at_3.events()[0].id.clone().unwrap();
    let from_reconcile = open(reconcile_id).await;
    for (who, client) in [("right at 3", &right_at_3), ("bare 3", &bare_3)] {
        eventually(Duration::from_secs(10), "events 4 and 5", || {
            let done = client.sequences() == vec![4, 5];
            async move { done }
        })
        .await;
        let events = client.events();
        assert_eq!(events.len(), 2, "{who}: no reconciliation: {events:?}");
    }

    delete_task(&db, "p1", "F").await;
    delete_task(&db, "p1", "G").await;
    for client in [&other_at_3, &other_at_5, &beyond] {
        eventually(Duration::from_secs(10), "events 6 and 7 after it", || {
            let done = client.sequences() == vec![6, 7];
            async move { done }
        })
        .await;
    }
    for client in [&right_at_3, &bare_3] {
        eventually(Duration::from_secs(10), "events 4 to 7", || {
            let done = client.sequences() == vec![4, 5, 6, 7];
            async move { done }
        })
        .await;
    }
    eventually(
        Duration::from_secs(10),
        "events 6 and 7 after the id",
        || {
            let done = from_reconcile.sequences() == vec![6, 7];
            async move { done }
        },
    )
    .await;
    let events = from_reconcile.events();
    assert_eq!(events.len(), 2, "no second reconciliation: {events:?}");
}

#[tokio::test]
async fn the_cursor_gauge_follows_a_reconciliation() {
    let db = fresh_db().await;
    add_tasks(&db, "p1", &["A", "B", "C"]).await;
    for task in ["A", "B"] {
        delete_task(&db, "p1", task).await;
    }
    // A new consumer reconciles to the head (2 once the server numbers the two deletions).
    let server =
        ServeProcess::start(&db.url, &args(&["--project", "p1", "--consumer-id", "g"])).await;
    ready(&server).await;
    eventually(Duration::from_secs(10), "the reconciled cursor", || {
        let db = &db;
        async move { cursor(db, "p1", "g").await == Some(2) }
    })
    .await;
    let labels = [("project", "p1"), ("consumer", "g")];
    eventually(Duration::from_secs(10), "outbox_consumer_cursor 2", || {
        let server = &server;
        async move {
            server
                .metrics()
                .await
                .get("outbox_consumer_cursor", &labels)
                == Some(2.0)
        }
    })
    .await;
}

#[tokio::test]
async fn retiring_one_served_project_stops_only_that_project() {
    let db = fresh_db().await;
    let mut server = ServeProcess::start_with_env(
        &db.url,
        &args(&[
            "--project",
            "p1",
            "--project",
            "p2",
            "--consumer-id",
            "feed",
            "--admin-operator",
            "alice",
        ]),
        &[("OUTBOX_ADMIN_TOKEN", "s3cret-token")],
    )
    .await;
    ready(&server).await;
    let addr = server.addr;
    let p1 = SseClient::open(addr, "/v1/projects/p1/events", &[]).await;
    let p2 = SseClient::open(addr, "/v1/projects/p2/events", &[]).await;
    let good = [("authorization", "Bearer s3cret-token")];
    let retire = json!({"project": "p1", "consumer_id": "feed", "reason": "moved"});
    let (status, _, text) = post(addr, "/v1/admin/retire", &good, &retire)
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    // p1's consumer stops at its next check; p2's goes on and the server stays ready.
    write_event(&db, "p1", "T-1").await;
    eventually(Duration::from_secs(10), "p1's consumer stopped", || {
        let stderr = server.stderr();
        async move { stderr.contains("is retired") }
    })
    .await;
    write_event(&db, "p2", "T-2").await;
    eventually(Duration::from_secs(10), "p2's event", || {
        let done = p2.sequences() == vec![1];
        async move { done }
    })
    .await;
    assert!(!p2.ended());
    let (status, _, body) = get(addr, "/readyz", &[]).await.unwrap();
    assert_eq!(status, 200, "{body}");
    // p1's open stream is told, and ends (a new request is answered 410).
    eventually(
        Duration::from_secs(10),
        "p1's stream told and ended",
        || {
            let done = p1.ended();
            async move { done }
        },
    )
    .await;
    let told: Vec<_> = p1
        .events()
        .into_iter()
        .filter(|m| m.event.as_deref() == Some("retired"))
        .collect();
    assert_eq!(told.len(), 1, "{:?}", p1.messages());
    let data = told[0].json();
    assert_eq!(data["type"], "retired", "{data}");
    assert_eq!(data["project_id"], "p1", "{data}");
    assert_eq!(data["consumer_id"], "feed", "{data}");
    assert!(told[0].id.is_none());
    assert!(!p2.ended());
    let (status, _, body) = get(addr, "/v1/projects/p1/events", &[]).await.unwrap();
    assert_eq!(status, 410, "{body}");

    server.signal("TERM");
    assert_eq!(server.wait().await, 4, "stderr:\n{}", server.stderr());
    let stderr = server.stderr();
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("outbox serve --project p2 --project p1 --consumer-id feed --reactivate"),
        "{stderr}"
    );
}

#[tokio::test]
async fn http_edges_scheme_query_long_ids_slow_headers_host_names_and_standby() {
    let db = fresh_db().await;
    let common = args(&[
        "--project",
        "p1",
        "--consumer-id",
        "edge",
        "--admin-operator",
        "alice",
        "--header-read-timeout",
        "300ms",
    ]);
    let token = [("OUTBOX_ADMIN_TOKEN", "s3cret-token")];
    let first = ServeProcess::start_on("localhost", &db.url, &common, &token).await;
    ready(&first).await;
    let addr = first.addr;

    // The scheme of Authorization is case-insensitive.
    let replay = json!({"project": "p1", "consumer_id": "edge", "all": true});
    for scheme in ["bearer", "BEARER"] {
        let header = format!("{scheme} s3cret-token");
        let (status, _, text) = post(
            addr,
            "/v1/admin/replay",
            &[("authorization", &header)],
            &replay,
        )
        .await
        .unwrap();
        assert_ne!(status, 401, "{scheme}: {text}");
    }

    // A repeated query key is a JSON 400.
    let (status, _, body) = get(addr, "/v1/projects/p1/events?after=1&after=2", &[])
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).expect("a JSON error");
    assert!(error["error"].as_str().unwrap().contains("after"), "{body}");

    // A long ID is not echoed whole.
    let long = "x".repeat(5000);
    for path in [format!("/v1/projects/{long}/events"), format!("/{long}")] {
        let (status, _, body) = get(addr, &path, &[]).await.unwrap();
        assert_eq!(status, 404);
        assert!(body.len() < 300, "{} bytes: {body:.200}", body.len());
        assert!(body.contains("characters)"), "{body}");
    }

    // A client that never finishes its headers is disconnected.
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the connection stayed open");

    // A standby process (the lease is held by the first) refuses SSE clients with 503.
    let second = ServeProcess::start_with_env(&db.url, &common, &token).await;
    let (status, headers, body) = get(second.addr, "/v1/projects/p1/events", &[])
        .await
        .unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(headers["retry-after"].parse::<u64>().unwrap() >= 1);
    assert!(body.contains("standby"), "{body}");
}

#[tokio::test]
async fn help_texts_say_what_serve_and_the_relay_take() {
    let (code, out, err) = run_outbox(&["serve", "--help"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("--exit-when-caught-up"), "{out}");
    assert!(out.contains("--header-read-timeout"), "{out}");
    assert!(
        out.contains("--allowed-host") && out.contains("DNS rebinding"),
        "{out}"
    );
    let (code, out, err) = run_outbox(&["relay", "nats", "--help"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("every `consume` option"), "{out}");
    assert!(out.contains("once each"), "{out}");
    let (code, _, err) = run_outbox(&[
        "relay",
        "nats",
        "--project",
        "p1",
        "--consumer-id",
        "r",
        "--nats-url",
        "nats://127.0.0.1:1",
        "--publish-timeout",
        "-1s",
    ])
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("must be greater than zero"), "{err}");
}

/// Readiness of an idle server: no event for many `--ready-max-poll-age`s, with one project
/// listening and with two projects polling only. Each consumer waits idle on the set's shared
/// poll, which counts as its poll; it does not poll on its own.
#[tokio::test]
async fn an_idle_server_stays_ready_beyond_many_poll_ages() {
    let db = fresh_db().await;
    let idle = |extra: &'static [&'static str]| {
        let url = db.url.clone();
        async move {
            let mut all = vec![
                "--consumer-id",
                "idle",
                "--poll-interval",
                "100ms",
                "--ready-max-poll-age",
                "1s",
                "--no-prune",
            ];
            all.extend_from_slice(extra);
            let server = ServeProcess::start(&url, &all).await;
            ready(&server).await;
            // Five poll ages without an event: ready throughout.
            let until = tokio::time::Instant::now() + Duration::from_secs(5);
            let mut checks = 0;
            while tokio::time::Instant::now() < until {
                let (status, _, body) = get(server.addr, "/readyz", &[]).await.unwrap();
                assert_eq!(status, 200, "{extra:?} after {checks} checks: {body}");
                checks += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            server
        }
    };
    let (one, two) = tokio::join!(
        idle(&["--project", "p1"]),
        idle(&["--project", "p2", "--project", "p3", "--no-listen"])
    );
    // Still following: an event after the idle time arrives.
    let stream = SseClient::open(two.addr, "/v1/projects/p3/events", &[]).await;
    write_event(&db, "p3", "T-1").await;
    eventually(Duration::from_secs(10), "the event after idling", || {
        let done = stream.sequences() == vec![1];
        async move { done }
    })
    .await;
    drop(one);
}

/// A child that acknowledges every line except events of task `stuck`, which it never
/// answers.
const STUCK_CHILD: &str = r#"
while IFS= read -r line; do
  case "$line" in *'"task_id":"stuck"'*) sleep 600 ;; esac
  seq=$(printf '%s' "$line" | sed -n -E 's/.*"(head_)?sequence":([0-9]*).*/\2/p')
  printf '{"ack": %s}\n' "$seq"
done
"#;

/// A consumer that is busy, not idle (here its child never answers), still makes the server
/// unready once it has not polled for `--ready-max-poll-age`.
#[tokio::test]
async fn a_stuck_consumer_still_fails_readiness() {
    let db = fresh_db().await;
    let server = ServeProcess::start(
        &db.url,
        &args_with(
            &[("--ready-max-poll-age", "1s")],
            &[
                "--project",
                "p1",
                "--project",
                "p2",
                "--consumer-id",
                "stuck",
                "--child",
                STUCK_CHILD,
                "--child-timeout",
                "60s",
            ],
        ),
    )
    .await;
    ready(&server).await;
    write_event(&db, "p1", "stuck").await;
    let addr = server.addr;
    eventually(
        Duration::from_secs(15),
        "/readyz names p1's poll",
        || async move {
            match get(addr, "/readyz", &[]).await {
                Ok((503, _, body)) => body.contains("project p1: no successful poll"),
                _ => false,
            }
        },
    )
    .await;
    let (_, _, body) = get(addr, "/readyz", &[]).await.unwrap();
    assert!(
        !body.contains("project p2"),
        "p2 is idle, not stuck: {body}"
    );
    // The child's process group is ended with the server.
    let mut server = server;
    server.signal("TERM");
    server.wait().await;
}

/// DNS rebinding: a request is answered only when its `Host` names this server (its listen
/// address, localhost, any IP when listening on every interface, or an `--allowed-host`).
#[tokio::test]
async fn requests_naming_another_host_are_refused() {
    let db = fresh_db().await;
    let common = args(&[
        "--project",
        "p1",
        "--consumer-id",
        "hosts",
        "--allowed-host",
        "outbox.example.com",
        "--allowed-host",
        "svc.ns:80",
    ]);
    let local = ServeProcess::start(&db.url, &common).await;
    ready(&local).await;
    let addr = local.addr;
    let port = addr.port().to_string();
    for path in [
        "/",
        "/readyz",
        "/metrics",
        "/v1/projects/p1/events",
        "/v1/dashboard/stream",
    ] {
        for host in ["evil.example", "evil.example:80", "10.9.8.7", "svc.ns:8080"] {
            let (status, _, body) = get(addr, path, &[("host", host)]).await.unwrap();
            assert_eq!(status, 421, "{path} {host}: {body}");
            let error: serde_json::Value = serde_json::from_str(&body).expect("a JSON error");
            assert_eq!(error["host"], host, "{body}");
            assert!(
                error["error"].as_str().unwrap().contains("--allowed-host"),
                "{body}"
            );
        }
    }
    for host in [
        format!("127.0.0.1:{port}"),
        "127.0.0.1".to_owned(),
        format!("localhost:{port}"),
        "LocalHost".to_owned(),
        "[::1]:9".to_owned(),
        "outbox.example.com".to_owned(),
        format!("OUTBOX.example.com:{port}"),
        "svc.ns:80".to_owned(),
    ] {
        let (status, _, body) = get(addr, "/readyz", &[("host", &host)]).await.unwrap();
        assert_eq!(status, 200, "{host}: {body}");
    }
    // On every interface: any IP address (a Kubernetes probe names the pod's IP), no
    // unknown name.
    let all = ServeProcess::start_on("0.0.0.0", &db.url, &common, &[]).await;
    let addr = all.addr;
    let (status, _, body) = get(addr, "/healthz", &[("host", "10.9.8.7:8080")])
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = get(addr, "/healthz", &[("host", "evil.example:8080")])
        .await
        .unwrap();
    assert_eq!(status, 421, "{body}");
    // Also while the server waits for its database at start.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let down = format!("postgresql://postgres@127.0.0.1:{}/postgres", free_port());
    let _waiting = ConsumeProcess::spawn_command(
        &down,
        "serve",
        &["--listen", &listen, "--project", "p1", "--consumer-id", "w"],
    );
    let addr: std::net::SocketAddr = listen.parse().unwrap();
    eventually(Duration::from_secs(10), "the waiting server answers", || async move {
        matches!(get(addr, "/healthz", &[]).await, Ok((200, _, body)) if body.contains("starting"))
    })
    .await;
    let (status, _, body) = get(addr, "/healthz", &[("host", "evil.example")])
        .await
        .unwrap();
    assert_eq!(status, 421, "{body}");
    // A malformed value is a usage error.
    let (code, _, err) = outbox_on(
        &db,
        &[
            "serve",
            "--project",
            "p1",
            "--consumer-id",
            "h",
            "--allowed-host",
            "http://x/",
        ],
    )
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--allowed-host"), "{err}");
}

/// Admin bodies are JSON objects with known keys: an array (once taken by position), another
/// JSON value, a wrong type or an unknown key is a 400 and nothing is done.
#[tokio::test]
async fn admin_bodies_are_objects_with_known_keys_only() {
    let db = fresh_db().await;
    let server = ServeProcess::start_with_env(
        &db.url,
        &args(&[
            "--project",
            "p1",
            "--consumer-id",
            "feed",
            "--admin-operator",
            "alice",
        ]),
        &[("OUTBOX_ADMIN_TOKEN", "s3cret-token")],
    )
    .await;
    ready(&server).await;
    let good = [("authorization", "Bearer s3cret-token")];
    for (path, body) in [
        ("/v1/admin/retire", json!(["p1", "feed", "reason"])),
        ("/v1/admin/retire", json!(["p1", "@:", "reason"])),
        ("/v1/admin/retire", json!("p1")),
        (
            "/v1/admin/retire",
            json!({"project": "p1", "consumer_id": ["feed"], "reason": "r"}),
        ),
        (
            "/v1/admin/retire",
            json!({"project": "p1", "consumer_id": "feed", "reason": "r", "by": "x"}),
        ),
        ("/v1/admin/replay", json!(["p1", "feed", null, true])),
        (
            "/v1/admin/replay",
            json!({"project": "p1", "consumer_id": "feed", "all": "yes"}),
        ),
        ("/v1/admin/resolve", json!(["p1", "feed", "e", "r"])),
    ] {
        let (status, _, text) = post(server.addr, path, &good, &body).await.unwrap();
        assert_eq!(status, 400, "{path} {body}: {text}");
        let error: serde_json::Value = serde_json::from_str(&text).expect("a JSON error");
        assert!(
            error["error"].as_str().unwrap().contains("request body"),
            "{text}"
        );
    }
    let arrays = post(
        server.addr,
        "/v1/admin/retire",
        &good,
        &json!(["p1", "feed", "r"]),
    )
    .await
    .unwrap()
    .2;
    assert!(arrays.contains("JSON object"), "{arrays}");
    // Nothing was retired or registered.
    let consumers = outbox_json(&db, &["consumers", "list"]).await;
    let consumers = consumers["consumers"].as_array().unwrap();
    assert_eq!(consumers.len(), 1, "{consumers:?}");
    assert_eq!(consumers[0]["consumer_id"], "feed");
    assert_eq!(consumers[0]["state"], "active");
}

/// "serving" is said once the server holds its leases: a `--no-wait` server that finds a
/// lease held elsewhere exits 4 without having said it.
#[tokio::test]
async fn serving_is_said_only_once_the_leases_are_held() {
    let db = fresh_db().await;
    let common = args(&["--project", "p1", "--consumer-id", "once"]);
    let first = ServeProcess::start(&db.url, &common).await;
    ready(&first).await;
    eventually(Duration::from_secs(10), "the first says serving", || {
        let said = first.stderr().contains(" serving ");
        async move { said }
    })
    .await;
    let port = free_port().to_string();
    let mut second_args = vec!["--listen", &format!("127.0.0.1:{port}")]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    second_args.extend(common.iter().map(|s| s.to_string()));
    second_args.push("--no-wait".to_owned());
    let second_args: Vec<&str> = second_args.iter().map(String::as_str).collect();
    let mut second = ConsumeProcess::spawn_command(&db.url, "serve", &second_args);
    let code = tokio::time::timeout(Duration::from_secs(30), second.wait())
        .await
        .expect("exits");
    assert_eq!(code, 4, "{}", second.stderr());
    eventually(Duration::from_secs(5), "the exit is explained", || {
        let said = second.stderr().contains("--no-wait") || second.stderr().contains("held");
        async move { said }
    })
    .await;
    let stderr = second.stderr();
    assert!(!stderr.contains(" serving "), "{stderr}");
    // A poll age the shared poll cannot meet is refused.
    let (code, _, err) = outbox_on(
        &db,
        &[
            "serve",
            "--project",
            "p1",
            "--consumer-id",
            "x",
            "--poll-interval",
            "2s",
            "--ready-max-poll-age",
            "1s",
        ],
    )
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--ready-max-poll-age"), "{err}");
}

/// Waits until `client` has `n` events; returns when that was seen (polled every 2 ms).
async fn nth_event_seen(client: &SseClient, n: usize) -> tokio::time::Instant {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while client.events().len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "event {n} did not arrive"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::Instant::now()
}

/// `--client-write-interval`: after a write, a client is not written again before the
/// interval has passed, however soon the next event is handled; the first event after a quiet
/// spell goes out at once (the first write below is not held back by the stream's opening).
#[tokio::test]
async fn a_client_is_written_at_most_once_per_write_interval() {
    let db = fresh_db().await;
    let server = ServeProcess::start(
        &db.url,
        &args(&[
            "--project",
            "p1",
            "--consumer-id",
            "feed",
            "--client-write-interval",
            "400ms",
        ]),
    )
    .await;
    ready(&server).await;
    let client = SseClient::open(server.addr, "/v1/projects/p1/events", &[]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    write_event(&db, "p1", "A").await;
    let first = nth_event_seen(&client, 1).await;
    write_event(&db, "p1", "B").await;
    let second = nth_event_seen(&client, 2).await;
    let gap = second - first;
    assert!(
        gap >= Duration::from_millis(350),
        "B came {gap:?} after A with a 400 ms write interval"
    );
    assert_eq!(client.sequences(), vec![1, 2]);
}
