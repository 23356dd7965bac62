//! `outbox relay nats` into a three-node NATS cluster with a stream of three replicas, under
//! live writers on two projects: kill -9 of the stream's leader in the middle of the stream,
//! its restart, later kill -9 of a follower. Every committed event is in the stream exactly
//! once and in per-project order, read back through every node with the Rust client and
//! through a durable pull consumer. And a relay started while the cluster cannot answer (two
//! of its three nodes down, so no leader) waits for it instead of exiting.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_tests::cluster_kit::try_write;
use outbox_tests::consumer_kit::{cursor, write_event};
use outbox_tests::nats_cluster_kit::NatsCluster;
use outbox_tests::nats_kit::{assert_exactly_once_in_order, consume_durable, read_stream};
use outbox_tests::process_kit::OutboxProcess;
use outbox_tests::{TestDb, fresh_db, sequenced};

const PROJECTS: [&str; 2] = ["p1", "p2"];
const STREAM: &str = "CLUSTERED";

/// Each project's stream: the stream fence wants a stream per relay.
fn stream_of(project: &str) -> String {
    format!("{STREAM}_{project}")
}

/// A relay of `project` into the cluster, logging its start-up checks at debug level so a
/// failure shows what NATS answered each time.
fn spawn_relay(db: &TestDb, urls: &str, project: &str) -> OutboxProcess {
    let consumer = format!("relay-{project}");
    OutboxProcess::spawn_with_env(
        &db.url,
        "relay",
        &[
            "nats",
            "--project",
            project,
            "--consumer-id",
            &consumer,
            "--nats-url",
            urls,
            "--stream",
            &stream_of(project),
            "--stream-replicas",
            "3",
            "--start-from",
            "earliest",
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
            "--nats-ping-interval",
            "1s",
            "--shutdown-grace",
            "2s",
            "--no-prune",
        ],
        &[("OUTBOX_LOG", "outbox_relay=debug,info")],
    )
}

/// Writers committing events to both projects until `stop`.
fn start_writers(db: &TestDb, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
    PROJECTS
        .iter()
        .map(|project| {
            let (config, stop) = (db.config.clone(), stop.clone());
            let project = project.to_string();
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let _ = try_write(&config, &project, &format!("{project}-{i}")).await;
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect()
}

/// Messages in the projects' streams, through any node.
async fn stored(cluster: &NatsCluster) -> u64 {
    let js = cluster.jetstream().await;
    let mut total = 0;
    for project in PROJECTS {
        if let Ok(mut handle) = js.get_stream(stream_of(project)).await {
            if let Ok(info) = handle.info().await {
                total += info.state.messages;
            }
        }
    }
    total
}

/// Waits until the stream holds at least `n` messages; when that does not happen, fails with
/// what the relays logged last, which says why.
async fn grows_past(cluster: &NatsCluster, n: u64, relays: &[OutboxProcess]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while stored(cluster).await < n {
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "the stream never held {n} messages; the relays' last lines:\n{}",
                last_lines(relays)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The last lines each relay logged.
fn last_lines(relays: &[OutboxProcess]) -> String {
    relays
        .iter()
        .map(|relay| {
            let stderr = relay.stderr();
            let lines: Vec<&str> = stderr.lines().collect();
            lines[lines.len().saturating_sub(60)..].join("\n")
        })
        .collect::<Vec<_>>()
        .join("\n-----\n")
}

/// Waits until every committed event is sequenced and acknowledged by both relays; when that
/// does not happen, fails with what the relays logged last, which says why.
async fn settled(client: &tokio_postgres::Client, relays: &[OutboxProcess]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
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
        if matches!(row, Ok(ref row) if row.get::<_, i64>(0) == 0 && row.get::<_, i64>(1) == 0) {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            let logs: Vec<String> = relays
                .iter()
                .map(|relay| {
                    let stderr = relay.stderr();
                    let lines: Vec<&str> = stderr.lines().collect();
                    lines[lines.len().saturating_sub(60)..].join("\n")
                })
                .collect();
            panic!(
                "timed out waiting for every committed event sequenced and acknowledged \
                 ({row:?}); the relays' last lines:\n{}",
                logs.join("\n-----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn an_r3_stream_loses_its_leader_then_a_follower_and_keeps_every_event_once_in_order() {
    let db = fresh_db().await;
    let mut cluster = NatsCluster::start().await;
    let urls = cluster.urls();
    let mut relays: Vec<OutboxProcess> = PROJECTS
        .iter()
        .map(|p| spawn_relay(&db, &urls, p))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers = start_writers(&db, &stop);

    grows_past(&cluster, 100, &relays).await;
    let leader = cluster.stream_leader(&stream_of("p1")).await;
    let info = cluster
        .jetstream()
        .await
        .get_stream(stream_of("p1"))
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .clone();
    assert_eq!(info.config.num_replicas, 3, "the relay made an R3 stream");

    // The leader dies in the middle of the stream; the others elect a new one.
    cluster.nodes[leader].kill_9();
    let before = stored(&cluster).await;
    grows_past(&cluster, before + 100, &relays).await;
    cluster.nodes[leader].launch().await;
    for project in PROJECTS {
        cluster.wait_replicas_current(&stream_of(project)).await;
    }

    // Later a follower dies.
    let before = stored(&cluster).await;
    grows_past(&cluster, before + 100, &relays).await;
    let leader = cluster.stream_leader(&stream_of("p1")).await;
    let follower = (leader + 1) % 3;
    cluster.nodes[follower].kill_9();
    let before = stored(&cluster).await;
    grows_past(&cluster, before + 100, &relays).await;
    cluster.nodes[follower].launch().await;

    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    let client = db.connect().await;
    settled(&client, &relays).await;
    for project in PROJECTS {
        cluster.wait_replicas_current(&stream_of(project)).await;
    }

    let mut expected = Vec::new();
    for project in PROJECTS {
        expected.push(sequenced(&client, project).await);
    }
    for (i, node) in cluster.nodes.iter().enumerate() {
        for (project, expected) in PROJECTS.iter().zip(&expected) {
            let messages = read_stream(&node.jetstream().await, &stream_of(project)).await;
            assert!(expected.len() > 100, "{project}: only {}", expected.len());
            assert_exactly_once_in_order(&messages, "lifecycle", project, expected);
            assert_eq!(messages.len(), expected.len(), "through n{i}: nothing else");
        }
    }

    let js = cluster.jetstream().await;
    for (project, expected) in PROJECTS.iter().zip(&expected) {
        let delivered = consume_durable(
            &js,
            &stream_of(project),
            "downstream",
            &format!("lifecycle.{project}.task_deleted"),
            expected.len(),
        )
        .await;
        let got: Vec<i64> = delivered.iter().map(|(_, _, seq)| *seq).collect();
        let want: Vec<i64> = (1..=got.len() as i64).collect();
        assert_eq!(got, want, "{project} through a durable consumer");
    }
    for relay in &mut relays {
        relay.signal("TERM");
        assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_started_while_the_cluster_has_no_leader_waits_for_one() {
    let db = fresh_db().await;
    let mut cluster = NatsCluster::start().await;
    let urls = cluster.urls();
    // n0 alone accepts connections, but without a quorum JetStream cannot answer the relay's
    // stream check (it times out or says the cluster is unavailable).
    cluster.nodes[1].kill_9();
    cluster.nodes[2].kill_9();
    let mut relay = spawn_relay(&db, &urls, "p1");
    let event = write_event(&db, "p1", "T-1").await;
    // The first check may take a JetStream request timeout (10 s) per request of the stream
    // check after the process's own start, longer on a loaded host.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !relay
        .stderr()
        .contains("NATS did not answer the stream check; asking again until it does")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the relay did not say within 60 s that it waits for NATS (exit {:?}); it said:\n{}",
            relay.exited(),
            relay.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(relay.exited(), None, "still waiting:\n{}", relay.stderr());

    cluster.nodes[1].launch().await;
    cluster.nodes[2].launch().await;
    // Generous: each unanswered check can take the JetStream request timeout (10 s) plus a
    // backoff of up to 10 s, and a loaded host elects the cluster's leaders slowly.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while cursor(&db, "p1", "relay-p1").await != Some(1) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the event was not relayed within 120 s of the cluster's return; the relay (exit \
             {:?}) said:\n{}",
            relay.exited(),
            relay.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let messages = read_stream(&cluster.jetstream().await, &stream_of("p1")).await;
    assert_eq!(
        messages
            .iter()
            .map(|m| m.msg_id.clone())
            .collect::<Vec<_>>(),
        vec![event]
    );
    relay.signal("TERM");
    assert_eq!(relay.wait().await, 0, "{}", relay.stderr());
}

outbox_tests::on_both_servers!(
    an_r3_stream_loses_its_leader_then_a_follower_and_keeps_every_event_once_in_order,
);
