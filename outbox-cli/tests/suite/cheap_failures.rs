//! Failures inside a batch: the failure is saved with the acknowledgement of the prefix
//! handled before it, the rest of the batch is kept in memory across the retry wait, and
//! every event is still handled once (twice for the failed ones), in order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_consumer::{FailureClass, Handler, HandlerFailure, ObservedEvent, RetrySchedule};
use outbox_core::sequencer::Sequencer;
use outbox_tests::consumer_kit::{Recorder, WAIT, cursor, eventually, fast_config, start_with};
use outbox_tests::fresh_db;

/// Fails the first attempt of every event whose sequence is a multiple of `every`.
#[derive(Clone)]
struct FailOnce {
    every: i64,
    seen: Arc<Mutex<Vec<(i64, u32)>>>,
}

impl Handler for FailOnce {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        self.seen
            .lock()
            .unwrap()
            .push((event.sequence, event.attempt));
        if event.attempt == 1 && event.sequence % self.every == 0 {
            return Err(FailureClass::new("injected").unwrap().into());
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_inside_batches_retry_from_memory_in_order() {
    let db = fresh_db().await;
    let events: i64 = 230;
    {
        let client = db.connect().await;
        client
            .execute(
                "INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, \
                 deleted_at, writer_process_id, payload_version, payload) \
                 SELECT 'p', 'task:deleted', 'e-' || g, 't-' || g, now(), 'w', 1, '{}'::jsonb \
                 FROM generate_series(1, $1::bigint) AS g",
                &[&events],
            )
            .await
            .unwrap();
        // One event the runtime cannot decode, behind events kept across a retry wait.
        client
            .execute(
                "UPDATE outbox.lifecycle_outbox SET payload = '\"x\"'::jsonb WHERE event_id = 'e-120'",
                &[],
            )
            .await
            .unwrap();
        let mut client = db.connect().await;
        Sequencer::new(&outbox_core::Schema::default())
            .drain(&mut client)
            .await
            .unwrap();
    }
    let handler = FailOnce {
        every: 7,
        seen: Arc::default(),
    };
    let mut config = fast_config("p", "c");
    config.delivery.batch_size = 50;
    config.delivery.max_batch_size = 50;
    config.delivery.retry = RetrySchedule::new(vec![Duration::from_millis(1)], 5).unwrap();
    let (stop, run) = start_with(&db, config, handler.clone(), Recorder::default());
    eventually(WAIT, "the cursor at the last event", || async {
        cursor(&db, "p", "c").await == Some(events)
    })
    .await;
    stop.cancel();
    let summary = run.await.unwrap().unwrap();
    assert_eq!(
        summary.delivered,
        events as u64 - 1,
        "all but the parked one"
    );

    let seen = handler.seen.lock().unwrap().clone();
    let mut expected = Vec::new();
    for sequence in 1..=events {
        if sequence == 120 {
            // Never reaches the handler: it fails to decode, five times, and is parked.
            continue;
        }
        if sequence % 7 == 0 {
            expected.push((sequence, 1));
            expected.push((sequence, 2));
        } else {
            expected.push((sequence, 1));
        }
    }
    assert_eq!(
        seen, expected,
        "each event once, failed ones retried at once"
    );
    let client = db.connect().await;
    let rows = client
        .query(
            "SELECT sequence, state, attempts FROM outbox.lifecycle_deliveries",
            &[],
        )
        .await
        .unwrap();
    let left: Vec<(i64, String, i32)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        left,
        vec![(120, "dead".to_owned(), 5)],
        "no retry state is left behind; the undecodable event is parked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_saved_with_the_acknowledgement_of_the_prefix() {
    let db = fresh_db().await;
    {
        let client = db.connect().await;
        client
            .execute(
                "INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, \
                 deleted_at, writer_process_id, payload_version, payload) \
                 SELECT 'p', 'task:deleted', 'e-' || g, 't-' || g, now(), 'w', 1, '{}'::jsonb \
                 FROM generate_series(1, 10) AS g",
                &[],
            )
            .await
            .unwrap();
        let mut client = db.connect().await;
        Sequencer::new(&outbox_core::Schema::default())
            .drain(&mut client)
            .await
            .unwrap();
    }
    // Event 6 fails every time, with a long delay: the state to inspect stays put.
    let recorder = Recorder::default();
    recorder.fail_task("t-6");
    let mut config = fast_config("p", "c");
    config.delivery.retry = RetrySchedule::new(vec![Duration::from_secs(60)], 5).unwrap();
    let (stop, run) = start_with(&db, config, recorder.clone(), recorder.clone());
    eventually(WAIT, "the failure to be saved", || async {
        let client = db.connect().await;
        client
            .query_opt(
                "SELECT 1 FROM outbox.lifecycle_deliveries \
                 WHERE sequence = 6 AND state = 'retrying' AND attempts = 1",
                &[],
            )
            .await
            .unwrap()
            .is_some()
    })
    .await;
    assert_eq!(
        cursor(&db, "p", "c").await,
        Some(5),
        "the prefix is acknowledged"
    );
    assert_eq!(recorder.sequences(), vec![1, 2, 3, 4, 5, 6]);
    stop.cancel();
    run.await.unwrap().unwrap();
}
