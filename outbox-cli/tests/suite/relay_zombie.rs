//! Two relays with one consumer ID publishing at the same moment. The lease holder is paused
//! (SIGSTOP) in the middle of a batch (given a backlog, resumed until the stream grows, paused
//! again), until its lease expires; a new relay claims the lease (its cursor behind what the
//! old holder already stored) and the old holder is resumed (SIGCONT) as the new one starts
//! publishing. Repeated round after round under live writers, on one node and on a three-node
//! R3 cluster, on both servers; then the stream is read back through every node: every event
//! exactly once, in order.
//!
//! Left alone, a resumed holder finds its lease expired on its first look (its local deadline
//! passed while it was stopped) and publishes nothing more, so the rounds above show the new
//! holder finding the stream ahead of its cursor. The racing rounds force the race with two
//! test-only knobs: `OUTBOX_TEST_PUBLISH_GATE` (while a file exists the relay holds each
//! publish just before sending it, its expectations already set) and
//! `OUTBOX_TEST_LEASE_CHECK_DELAY_MS` (a failed lease check within that long of the last passed
//! one is ignored). The holder, given a backlog, is stopped holding the first publish of its
//! batch; once the new holder has claimed the lease and stored messages, the old one is resumed
//! and its gate opened: it sends the held publish, with a stale expectation, and the rest of its
//! batch while the new holder publishes the same events, until its acknowledgement is refused
//! in the database. Each relay's log shows every answer that reveals the other's messages (a
//! refusal, an event stored elsewhere, a duplicate where it expected its own); the test counts
//! the rounds with one and fails unless most rounds had one, then reads the stream back
//! through every node: every event once, in order.
//!
//! The same racing rounds with `--fence subject` on a 2.9.10 R3 cluster (a server that checks
//! the per-subject expectation against applied messages only, fixed in 2.9.21) run too
//! (`subject_fence_race_on_2_9_r3`, 6 racing rounds per test). What runs of 12 rounds found: in each round the resumed
//! holder's held publish was refused, and the stream held every event once, in order, through
//! every node (the relays publish the same event at a position, so a pair both accepted by
//! that server would be one event, absorbed by the duplicate window).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use outbox_tests::cluster_kit::try_write;
use outbox_tests::consumer_kit::{cursor, eventually};
use outbox_tests::nats_cluster_kit::NatsCluster;
use outbox_tests::nats_kit::{
    NatsServer, Relayed, Server, assert_exactly_once_in_order, read_stream, with_server,
};
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

/// How the rounds are run.
#[derive(Clone, Copy)]
struct Race {
    /// Three-node cluster with R3 streams, or one node.
    replicas: usize,
    /// `--fence`.
    fence: &'static str,
    /// Takeovers.
    rounds: usize,
    /// Whether a resumed holder publishes (`OUTBOX_TEST_LEASE_CHECK_DELAY_MS`).
    racing: bool,
}

/// How long a resumed holder ignores its failed lease checks in a racing round: longer than any
/// pause (the lease's two seconds, the new holder's start and first publishes), so it goes on
/// publishing the rest of its batch after the publish it held.
const LEASE_CHECK_DELAY_MS: &str = "60000";

/// A relay's publish gate (`OUTBOX_TEST_PUBLISH_GATE`): while the file exists, the relay holds
/// its next publish, its expectations already set.
struct Gate(PathBuf);

impl Gate {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self(std::env::temp_dir().join(format!("outbox-gate-{}-{n}", std::process::id())))
    }

    fn close(&self) {
        std::fs::write(&self.0, b"").unwrap();
    }

    fn open(&self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

fn spawn_relay(db: &TestDb, urls: &str, race: Race, gate: &Gate) -> OutboxProcess {
    let replicas = race.replicas.to_string();
    let gate = gate.0.to_str().expect("a UTF-8 temp dir").to_owned();
    let env: Vec<(&str, &str)> = match race.racing {
        true => vec![
            ("OUTBOX_TEST_LEASE_CHECK_DELAY_MS", LEASE_CHECK_DELAY_MS),
            ("OUTBOX_TEST_PUBLISH_GATE", gate.as_str()),
        ],
        false => vec![],
    };
    OutboxProcess::spawn_with_env(
        &db.url,
        "relay",
        &[
            "nats",
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
            race.fence,
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
        &env,
    )
}

/// Whether a relay's log (from some point on) shows it meeting the other relay's messages in
/// the stream: a publish refused by the fence, its event found stored elsewhere, or already
/// stored where it expected it (the other relay's publish of the same event came first).
fn met_the_other(log: &str) -> bool {
    meetings_in(log) > 0
}

/// How many times a relay's log shows it meeting the other relay's messages.
fn meetings_in(log: &str) -> usize {
    [
        "JetStream refused the publish",
        "elsewhere than the relay expected",
        "JetStream already held this event",
    ]
    .iter()
    .map(|line| log.matches(line).count())
    .sum()
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

/// What the stream holds of the project, against the events the database sequenced.
#[derive(Debug, Default, PartialEq, Eq)]
struct Findings {
    /// Events stored more than once: (sequence, copies).
    duplicates: Vec<(i64, usize)>,
    /// Events never stored.
    missing: Vec<i64>,
    /// Messages stored after a message of a later event.
    out_of_order: usize,
    /// Messages whose ID is not the event's at their sequence.
    wrong_ids: usize,
}

fn findings(messages: &[Relayed], expected: &[(i64, String)]) -> Findings {
    let events: Vec<&Relayed> = messages
        .iter()
        .filter(|m| m.subject == "lifecycle.p1.task_deleted")
        .collect();
    let ids: BTreeMap<i64, &str> = expected.iter().map(|(s, id)| (*s, id.as_str())).collect();
    let mut copies = BTreeMap::new();
    for m in &events {
        *copies.entry(m.outbox_sequence).or_insert(0) += 1;
    }
    Findings {
        duplicates: copies
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(s, n)| (*s, *n))
            .collect(),
        missing: ids
            .keys()
            .filter(|s| !copies.contains_key(s))
            .copied()
            .collect(),
        out_of_order: events
            .windows(2)
            .filter(|w| w[1].outbox_sequence < w[0].outbox_sequence)
            .count(),
        wrong_ids: events
            .iter()
            .filter(|m| ids.get(&m.outbox_sequence) != Some(&m.msg_id.as_str()))
            .count(),
    }
}

/// What the rounds showed (the rounds in which the relays met are asserted by `race`).
struct Outcome {
    /// The stream as read through each node.
    per_node: Vec<Findings>,
}

/// `race.rounds` takeovers with the old holder resumed as the new one starts; then the stream
/// is read back through every node.
async fn race(race: Race) -> Outcome {
    let db = fresh_db().await;
    let nats = Nats::start(race.replicas).await;
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
    let mut gate = Gate::new();
    let mut holder = spawn_relay(&db, &urls, race, &gate);
    let mut raced = 0;
    let mut meetings = 0;
    eventually(
        Duration::from_secs(60),
        "the first relay publishing",
        || async { acked(&db).await >= 20 },
    )
    .await;
    for round in 0..race.rounds {
        let (generation, _) = lease(&client).await.expect("claimed");
        let at_pause = if race.racing {
            // The holder is paused with a batch in hand and its first publish decided and not
            // sent: paused, given a backlog, its gate closed, resumed until it holds a
            // publish, and stopped there.
            holder.signal("STOP");
            for i in 0..300 {
                let _ = try_write(&db.config, "p1", &format!("backlog-{round}-{i}")).await;
            }
            let from = holder.stderr().len();
            gate.close();
            holder.signal("CONT");
            eventually(
                Duration::from_secs(30),
                &format!("round {round}: the holder holding a publish"),
                || async { holder.stderr()[from..].contains("publish held at the test gate") },
            )
            .await;
            holder.signal("STOP");
            stream_messages(&nats).await
        } else {
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
            0
        };
        eventually(
            Duration::from_secs(30),
            "the paused holder's lease expired",
            || async { lease(&client).await.is_some_and(|(_, expired)| expired) },
        )
        .await;
        // The new holder claims the lease, and the old one resumes as it starts publishing
        // (resumed any earlier, the old holder would renew its lease before anyone claimed it).
        let successor_gate = Gate::new();
        let successor = spawn_relay(&db, &urls, race, &successor_gate);
        eventually(
            Duration::from_secs(60),
            "the new holder claimed",
            || async { lease(&client).await.is_some_and(|(g, _)| g > generation) },
        )
        .await;
        if race.racing {
            // Resumed once the new holder has stored messages of its own: the held publish
            // names a stream end that has moved on.
            eventually(
                Duration::from_secs(60),
                &format!("round {round}: the new holder storing messages"),
                || async { stream_messages(&nats).await > at_pause },
            )
            .await;
        }
        let (zombie_from, successor_from) = (holder.stderr().len(), successor.stderr().len());
        gate.open();
        holder.signal("CONT");
        let at_claim = acked(&db).await;
        eventually(
            Duration::from_secs(60),
            &format!("round {round}: the new holder publishing"),
            || async { acked(&db).await >= at_claim + 20 },
        )
        .await;
        if race.racing {
            // The resumed holder publishes until its acknowledgement is refused, then stops.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while holder.exited().is_none() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "round {round}: the resumed holder did not stop: {}",
                    holder.stderr()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // The old holder has raced; it goes, so that the next pause is the holder's.
        let mut old = std::mem::replace(&mut holder, successor);
        gate = successor_gate;
        if old.exited().is_none() {
            old.signal("KILL");
        }
        old.wait().await;
        let zombie_log = &old.stderr()[zombie_from..];
        let zombie_published = zombie_log.contains("publish released by the test gate");
        meetings += meetings_in(zombie_log) + meetings_in(&holder.stderr()[successor_from..]);
        if race.racing && !zombie_published {
            eprintln!("round {round}: the resumed holder sent nothing: {zombie_log}");
        }
        if (!race.racing || zombie_published)
            && (met_the_other(zombie_log) || met_the_other(&holder.stderr()[successor_from..]))
        {
            raced += 1;
        }
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
    let mut per_node = Vec::new();
    for node in nats.nodes() {
        let messages = read_stream(&node.jetstream().await, STREAM).await;
        if race.fence == "stream" {
            assert_exactly_once_in_order(&messages, "lifecycle", "p1", &expected);
        }
        per_node.push(findings(&messages, &expected));
    }
    holder.signal("TERM");
    assert_eq!(holder.wait().await, 0, "{}", holder.stderr());
    eprintln!(
        "--fence {} on {} node(s), {} rounds{}: the relays met each other's messages in {raced} ({meetings} times); \
         the stream through each node: {:?}",
        race.fence,
        race.replicas,
        race.rounds,
        if race.racing {
            " with the resumed holder publishing"
        } else {
            ""
        },
        per_node
    );
    if race.racing {
        // Every round makes the resumed holder send a publish after the new holder stored
        // messages; any answer JetStream gives it (refused, stored elsewhere, a duplicate) is a
        // meeting. A round may lose that answer on a loaded host (a publish timeout), but
        // most may not: the test must not pass without the race.
        assert!(
            raced * 4 >= race.rounds * 3,
            "the relays met each other's messages in only {raced} of {} rounds",
            race.rounds
        );
    }
    Outcome { per_node }
}

async fn a_paused_holder_resumed_as_a_new_one_starts_repeats_and_reorders_nothing() {
    race(Race {
        replicas: 1,
        fence: "stream",
        rounds: 4,
        racing: false,
    })
    .await;
}

async fn zombie_race_on_r3_repeats_and_reorders_nothing() {
    race(Race {
        replicas: 3,
        fence: "stream",
        rounds: 5,
        racing: false,
    })
    .await;
}

/// The resumed holder publishes while the new holder does, round after round on R3: the
/// stream fence refuses whichever is behind, and the stream holds every event once, in order.
async fn two_holders_publishing_at_once_on_r3_store_every_event_once_in_order() {
    // `race` asserts that they met in most rounds and, with this fence, every event once in
    // order through every node.
    let outcome = race(Race {
        replicas: 3,
        fence: "stream",
        rounds: 6,
        racing: true,
    })
    .await;
    assert!(outcome.per_node.iter().all(|f| f == &Findings::default()));
}

outbox_tests::on_both_servers!(
    a_paused_holder_resumed_as_a_new_one_starts_repeats_and_reorders_nothing,
    zombie_race_on_r3_repeats_and_reorders_nothing,
    two_holders_publishing_at_once_on_r3_store_every_event_once_in_order,
);

/// The same racing rounds with `--fence subject` on 2.9.10 R3, the server whose per-subject
/// check of a replicated stream runs against applied messages only (fixed in 2.9.21).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subject_fence_race_on_2_9_r3() {
    let outcome = with_server(
        Server::Debian,
        race(Race {
            replicas: 3,
            fence: "subject",
            rounds: 6,
            racing: true,
        }),
    )
    .await;
    for findings in &outcome.per_node {
        assert_eq!(findings, &Findings::default());
    }
}
