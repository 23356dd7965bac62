//! SIGTERM reaches every long-running command, also while it is waiting for a database that is
//! down: `outbox sequence --every` and `outbox consume` end within a few seconds, exit 0.
//! Each test stops a cluster of its own.

use std::time::Duration;

use outbox_tests::cluster_kit::PrivateCluster;
use outbox_tests::connect;
use outbox_tests::consumer_kit::{eventually, eventually_count};
use outbox_tests::process_kit::OutboxProcess;
use tokio::time::Instant;

/// How long a stop may take: the consumer's shutdown grace below is 1 s, everything else is
/// a select on the shutdown signal.
const PROMPT: Duration = Duration::from_secs(5);

/// How long the process may take to reach a state the test waits for; only a hang fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// Once `running` (a count query on the cluster) returns 1, that is the process is at work
/// against the database, stops the database under it; once the process says the database is
/// unavailable (it is inside its reconnect loop), sends SIGTERM and expects a clean exit
/// within [`PROMPT`].
async fn sigterm_while_database_down(
    cluster: &PrivateCluster,
    mut process: OutboxProcess,
    running: &str,
) {
    let client = connect(&cluster.url.parse().expect("cluster URL parses")).await;
    eventually_count(&client, PATIENCE, "the process at work", running, 1).await;
    drop(client);
    cluster.stop();
    eventually(PATIENCE, "the process to notice the outage", || async {
        process.stderr().contains("the database is unavailable")
    })
    .await;
    let sent = Instant::now();
    process.signal("TERM");
    let code = tokio::time::timeout(PROMPT, process.wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "still running {PROMPT:?} after SIGTERM with the database down; stderr:\n{}",
                process.stderr()
            )
        });
    assert_eq!(code, 0, "{}", process.stderr());
    assert!(
        process.stderr().contains("shutdown requested"),
        "{}",
        process.stderr()
    );
    eprintln!("stopped {:?} after SIGTERM", sent.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_every_stops_on_sigterm_while_the_database_is_down() {
    let cluster = PrivateCluster::start("shutdown-sequence");
    cluster.migrate().await;
    let process = OutboxProcess::spawn_command(&cluster.url, "sequence", &["--every", "50ms"]);
    let elected = "SELECT count(*) FROM outbox.lifecycle_sequencer_lease WHERE owner IS NOT NULL";
    sigterm_while_database_down(&cluster, process, elected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_stops_on_sigterm_while_the_database_is_down() {
    let cluster = PrivateCluster::start("shutdown-consume");
    cluster.migrate().await;
    let process = OutboxProcess::spawn(
        &cluster.url,
        &[
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--start-from",
            "earliest",
            "--poll-interval",
            "100ms",
            "--heartbeat-interval",
            "250ms",
            "--lease-ttl",
            "2s",
            "--shutdown-grace",
            "1s",
        ],
    );
    let claimed = "SELECT count(*) FROM outbox.lifecycle_consumers \
                   WHERE project_id = 'p' AND consumer_id = 'c' AND lease_owner IS NOT NULL";
    sigterm_while_database_down(&cluster, process, claimed).await;
}
