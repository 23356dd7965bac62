//! A whole PostgreSQL restart mid-stream: the consumer process rides it out and resumes
//! without loss, delivering in order. Uses a cluster of its own, since restarting the shared
//! test cluster would break every other test.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_tests::cluster_kit::{PrivateCluster, try_write};
use outbox_tests::consumer_kit::eventually;
use outbox_tests::process_kit::ConsumeProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_restart_mid_stream_loses_nothing() {
    let cluster = PrivateCluster::start("restart");
    let url = cluster.url.clone();
    let config = cluster.migrate().await;
    let mut consumer = ConsumeProcess::spawn(
        &url,
        &[
            "--project",
            "p",
            "--consumer-id",
            "survivor",
            "--start-from",
            "earliest",
            "--lease-ttl",
            "20s",
            "--heartbeat-interval",
            "1s",
            "--poll-interval",
            "100ms",
            "--sequence-interval",
            "10ms",
        ],
    );

    let stop = Arc::new(AtomicBool::new(false));
    let confirmed = Arc::new(Mutex::new(BTreeSet::new()));
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let (config, stop, confirmed) = (config.clone(), stop.clone(), confirmed.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(id) = try_write(&config, "p", &format!("w{w}-{i}")).await {
                        confirmed.lock().unwrap().insert(id);
                    } else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before_restart = consumer.sequences().len();
    assert!(before_restart > 0, "delivery started before the restart");
    cluster.stop();
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.resume();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }

    let confirmed = confirmed.lock().unwrap().clone();
    eventually(
        Duration::from_secs(30),
        "every confirmed event delivered",
        || async {
            let delivered: BTreeSet<String> = consumer.event_ids().into_iter().collect();
            confirmed.is_subset(&delivered)
        },
    )
    .await;
    let sequences = consumer.sequences();
    assert!(
        sequences.windows(2).all(|w| w[0] < w[1]),
        "one process delivers in strictly increasing order, even across the restart"
    );
    assert!(
        sequences.len() > before_restart,
        "delivery resumed after the restart"
    );
    consumer.signal("TERM");
    assert_eq!(consumer.wait().await, 0, "{}", consumer.stderr());
}
