//! Two relays with one consumer ID at the same moment: the lease holder is paused (SIGSTOP)
//! in the middle of a batch (given a backlog, resumed until the stream grows, paused again),
//! until its lease expires; a new relay claims the lease (its cursor behind what the old
//! holder already stored) and the old holder is resumed (SIGCONT) as the new one starts
//! publishing. Repeated round after round under live writers, on one node and on a three-node
//! R3 cluster, on both servers; then the stream is read back through every node: every event
//! exactly once, in order.
//!
//! What the rounds exercise: the new holder finds the stream ahead of its cursor and does not
//! publish those events again; the resumed holder learns from its heartbeat that its lease is
//! gone and stops dispatching (in the runs so far it never sent a publish after resuming, so
//! the fence's refusal of a stale window is not what these rounds show; the test prints how
//! many resumed holders the fence refused).
//!
//! The same race under `--fence subject` on a 2.9 cluster is not run: that server checks the
//! per-subject expectation of a replicated stream against applied messages only (fixed in
//! 2.9.21), and with the mid-batch pause its new holder once did not advance within 60 s,
//! which is not understood yet.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_tests::cluster_kit::try_write;
use outbox_tests::consumer_kit::{cursor, eventually};
use outbox_tests::nats_cluster_kit::NatsCluster;
use outbox_tests::nats_kit::{self, NatsServer, assert_exactly_once_in_order, read_stream};
use outbox_tests::process_kit::OutboxProcess;
use outbox_tests::{TestDb, fresh_db, sequenced};

const STREAM: &str = "ZOMBIE";

/// One node or three.
enum Nats {
    One(NatsServer),
    Three(NatsCluster),
}

impl Nats {
    async fn start(replicas: usize) -> Self {
        match replicas {
            1 => Self::One(NatsServer::start().await),
            _ => Self::Three(NatsCluster::start().await),
        }
    }

    fn urls(&self) -> String {
        match self {
            Self::One(server) => server.url(),
            Self::Three(cluster) => cluster.urls(),
        }
    }

    fn nodes(&self) -> Vec<&NatsServer> {
        match self {
            Self::One(server) => vec![server],
            Self::Three(cluster) => cluster.nodes.iter().collect(),
        }
    }
}

fn spawn_relay(db: &TestDb, urls: &str, replicas: usize, fence: &str) -> OutboxProcess {
    let replicas = replicas.to_string();
    nats_kit::spawn_relay(
        &db.url,
        &[
            "--project",
            "p1",
            "--consumer-id",
            "relay-p1",
            "--nats-url",
            urls,
            "--stream",
            STREAM,
            "--stream-replicas",
            &replicas,
            "--fence",
            fence,
            "--start-from",
            "earliest",
            "--lease-ttl",
            "2s",
            "--heartbeat-interval",
            "300ms",
            "--poll-interval",
            "50ms",
            "--retry-delays",
            "100ms,200ms",
            "--max-attempts",
            "1000",
            "--publish-timeout",
            "2s",
            "--nats-connect-timeout",
            "1s",
            "--shutdown-grace",
            "2s",
            "--no-prune",
        ],
    )
}

/// The lease's generation and whether it has expired (`None` before the first claim).
async fn lease(client: &tokio_postgres::Client) -> Option<(i64, bool)> {
    client
        .query_opt(
            "SELECT lease_generation, coalesce(lease_expires_at < now(), true) \
             FROM outbox.lifecycle_consumer_cursors \
             WHERE project_id = 'p1' AND consumer_id = 'relay-p1'",
            &[],
        )
        .await
        .unwrap()
        .map(|row| (row.get(0), row.get(1)))
}

/// Messages in the stream, through the first node that answers.
async fn stream_messages(nats: &Nats) -> u64 {
    for node in nats.nodes() {
        if !node.running() {
            continue;
        }
        if let Ok(mut handle) = node.jetstream().await.get_stream(STREAM).await {
            if let Ok(info) = handle.info().await {
                return info.state.messages;
            }
        }
    }
    0
}

async fn acked(db: &TestDb) -> i64 {
    cursor(db, "p1", "relay-p1").await.unwrap_or(0)
}

/// `rounds` takeovers with the old holder resumed as the new one starts, then the check.
async fn race(replicas: usize, fence: &str, rounds: usize) {
    let db = fresh_db().await;
    let nats = Nats::start(replicas).await;
    let urls = nats.urls();
    let client = db.connect().await;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (config, stop) = (db.config.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let _ = try_write(&config, "p1", &format!("t-{i}")).await;
                i += 1;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    let mut holder = spawn_relay(&db, &urls, replicas, fence);
    let mut zombies = Vec::new();
    eventually(
        Duration::from_secs(60),
        "the first relay publishing",
        || async { acked(&db).await >= 20 },
    )
    .await;
    for round in 0..rounds {
        let (generation, _) = lease(&client).await.expect("claimed");
        // The holder is paused in the middle of a window: paused, given a backlog, resumed
        // until the stream grows, paused again with the rest of its batch in hand.
        holder.signal("STOP");
        for i in 0..300 {
            let _ = try_write(&db.config, "p1", &format!("backlog-{round}-{i}")).await;
        }
        let before = stream_messages(&nats).await;
        holder.signal("CONT");
        eventually(
            Duration::from_secs(30),
            "the holder publishing the backlog",
            || async { stream_messages(&nats).await > before },
        )
        .await;
        holder.signal("STOP");
        eventually(
            Duration::from_secs(30),
            "the paused holder's lease expired",
            || async { lease(&client).await.is_some_and(|(_, expired)| expired) },
        )
        .await;
        // The new holder claims the lease, and the old one resumes as it starts publishing
        // (resumed any earlier, the old holder would renew its lease before anyone claimed it).
        let successor = spawn_relay(&db, &urls, replicas, fence);
        eventually(
            Duration::from_secs(60),
            "the new holder claimed",
            || async { lease(&client).await.is_some_and(|(g, _)| g > generation) },
        )
        .await;
        holder.signal("CONT");
        let at_claim = acked(&db).await;
        eventually(
            Duration::from_secs(60),
            &format!("round {round}: the new holder publishing"),
            || async { acked(&db).await >= at_claim + 20 },
        )
        .await;
        // The old holder has raced; it goes, so that the next pause is the holder's.
        let mut old = std::mem::replace(&mut holder, successor);
        old.signal("KILL");
        old.wait().await;
        zombies.push(old.stderr());
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    eventually(
        Duration::from_secs(60),
        "every committed event sequenced",
        || async {
            client
                .query_one(
                    "SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence IS NULL",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                == 0
        },
    )
    .await;
    let expected = sequenced(&client, "p1").await;
    let last = expected.last().expect("events written").0;
    eventually(
        Duration::from_secs(90),
        "every event acknowledged",
        || async { acked(&db).await >= last },
    )
    .await;
    for node in nats.nodes() {
        let messages = read_stream(&node.jetstream().await, STREAM).await;
        assert_exactly_once_in_order(&messages, "lifecycle", "p1", &expected);
    }
    holder.signal("TERM");
    assert_eq!(holder.wait().await, 0, "{}", holder.stderr());
    let refused = zombies
        .iter()
        .filter(|log| log.contains("reading the stream's end again"))
        .count();
    eprintln!(
        "{refused} of {rounds} resumed holders were refused by the fence or found their events stored"
    );
}

async fn a_paused_holder_resumed_as_a_new_one_starts_repeats_and_reorders_nothing() {
    race(1, "stream", 4).await;
}

async fn zombie_race_on_r3_repeats_and_reorders_nothing() {
    race(3, "stream", 8).await;
}

outbox_tests::on_both_servers!(
    a_paused_holder_resumed_as_a_new_one_starts_repeats_and_reorders_nothing,
    zombie_race_on_r3_repeats_and_reorders_nothing,
);
