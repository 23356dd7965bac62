//! SIGTERM reaches every long-running command, also while it is waiting for a database that is
//! down: `outbox sequence --every` and `outbox consume` end within a few seconds, exit 0.
//! Each test stops a cluster of its own.

use std::time::Duration;

use outbox_tests::cluster_kit::PrivateCluster;
use outbox_tests::process_kit::OutboxProcess;
use tokio::time::Instant;

/// How long a stop may take: the consumer's shutdown grace below is 1 s, everything else is
/// a select on the shutdown signal.
const PROMPT: Duration = Duration::from_secs(5);

/// Stops the database under the running `process`, lets it notice, then sends SIGTERM and
/// expects a clean exit within [`PROMPT`].
async fn sigterm_while_database_down(cluster: &PrivateCluster, mut process: OutboxProcess) {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.stop();
    // Long enough for the process to be inside its reconnect loop.
    tokio::time::sleep(Duration::from_millis(1500)).await;
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
    sigterm_while_database_down(&cluster, process).await;
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
    sigterm_while_database_down(&cluster, process).await;
}
