//! `Handler::before_ack_prefix`: a handler that confirms its effects after the fact (a
//! pipelined publisher) acknowledges exactly the confirmed prefix; the first unconfirmed event
//! fails on its own (held cursor, persisted attempt) and everything after it is delivered again.
//! A failure that names a broken sink stops the run with nothing acknowledged or charged; one
//! abandoned at shutdown acknowledges the durable prefix and charges nothing.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_consumer::handler::PartialAck;
use outbox_consumer::{
    Consumer, ConsumerError, FailureClass, Handler, HandlerFailure, LiveSet, ObservedEvent,
    Reconciler,
};
use outbox_tests::consumer_kit::{cursor, eventually, fast_config, write_event};
use outbox_tests::fresh_db;
use tokio_util::sync::CancellationToken;

/// Accepts every event in `handle`; in `before_ack_prefix` reports the first event of a task
/// in `unconfirmed` as failed, and everything before it as durable.
#[derive(Clone, Default)]
struct Confirming {
    handled: Arc<Mutex<Vec<String>>>,
    unconfirmed: Arc<Mutex<BTreeSet<String>>>,
}

impl Handler for Confirming {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        self.handled.lock().unwrap().push(event.task_id.clone());
        Ok(())
    }

    async fn before_ack_prefix(&self, handled: &[ObservedEvent]) -> Result<(), PartialAck> {
        let unconfirmed = self.unconfirmed.lock().unwrap();
        match handled
            .iter()
            .position(|e| unconfirmed.contains(&e.task_id))
        {
            None => Ok(()),
            Some(durable) => Err(PartialAck {
                durable,
                failure: FailureClass::new("unconfirmed").unwrap().into(),
            }),
        }
    }
}

impl Reconciler for Confirming {
    async fn reconcile(&self, _live: &LiveSet) -> Result<(), HandlerFailure> {
        Ok(())
    }
}

#[tokio::test]
async fn only_the_confirmed_prefix_is_acknowledged() {
    let db = fresh_db().await;
    for task in ["T1", "T2", "T3", "T4", "T5"] {
        write_event(&db, "p", task).await;
    }
    let handler = Confirming::default();
    handler.unconfirmed.lock().unwrap().insert("T3".into());
    let mut config = fast_config("p", "pipelined");
    config.delivery.retry =
        outbox_consumer::RetrySchedule::new(vec![Duration::from_millis(200)], 100).unwrap();
    let shutdown = CancellationToken::new();
    let consumer = Consumer::new(db.pool(4), None, config, handler.clone(), handler.clone());
    let token = shutdown.clone();
    let run = tokio::spawn(async move { consumer.run(token).await });

    let state = || async {
        db.connect()
            .await
            .query_opt(
                "SELECT state, attempts, last_failure_class FROM outbox.lifecycle_deliveries \
                 WHERE consumer_id = 'pipelined' AND sequence = 3",
                &[],
            )
            .await
            .unwrap()
            .map(|row| {
                (
                    row.get::<_, String>(0),
                    row.get::<_, i32>(1),
                    row.get::<_, String>(2),
                )
            })
    };
    eventually(
        Duration::from_secs(10),
        "two failed attempts of T3",
        || async { matches!(state().await, Some((_, attempts, _)) if attempts >= 2) },
    )
    .await;
    let (delivery_state, _, class) = state().await.unwrap();
    assert_eq!(
        (delivery_state.as_str(), class.as_str()),
        ("retrying", "unconfirmed")
    );
    assert_eq!(
        cursor(&db, "p", "pipelined").await,
        Some(2),
        "held just before the unconfirmed event"
    );
    let handled = handler.handled.lock().unwrap().clone();
    assert_eq!(&handled[..5], ["T1", "T2", "T3", "T4", "T5"]);
    assert_eq!(
        &handled[5..8],
        ["T3", "T4", "T5"],
        "redelivered from T3: {handled:?}"
    );
    assert_eq!(
        handled.iter().filter(|t| *t == "T1").count(),
        1,
        "the confirmed prefix is not delivered again"
    );

    handler.unconfirmed.lock().unwrap().clear();
    eventually(
        Duration::from_secs(10),
        "everything acknowledged",
        || async { cursor(&db, "p", "pipelined").await == Some(5) },
    )
    .await;
    assert_eq!(state().await, None, "a success leaves no delivery state");
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

/// Accepts every event in `handle`; `before_ack_prefix` reports T3 as failed with `failure`
/// (a broken sink or a shutdown abandonment), with T1 and T2 durable. An abandonment cancels
/// `shutdown` first, as a real one happens at shutdown.
#[derive(Clone)]
struct Refusing {
    handled: Arc<Mutex<Vec<String>>>,
    failure: HandlerFailure,
    shutdown: CancellationToken,
}

impl Handler for Refusing {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        self.handled.lock().unwrap().push(event.task_id.clone());
        Ok(())
    }

    async fn before_ack_prefix(&self, handled: &[ObservedEvent]) -> Result<(), PartialAck> {
        match handled.iter().position(|e| e.task_id == "T3") {
            None => Ok(()),
            Some(durable) => {
                if self.failure.is_abandoned() {
                    self.shutdown.cancel();
                }
                Err(PartialAck {
                    durable,
                    failure: self.failure.clone(),
                })
            }
        }
    }
}

impl Reconciler for Refusing {
    async fn reconcile(&self, _live: &LiveSet) -> Result<(), HandlerFailure> {
        Ok(())
    }
}

/// Runs a `Refusing` consumer over T1..T5 until it stops; returns the run's result, the
/// cursor and the number of delivery-state rows left.
async fn run_refusing(
    failure: HandlerFailure,
) -> (
    Result<outbox_consumer::RunSummary, ConsumerError>,
    Option<i64>,
    i64,
) {
    let db = fresh_db().await;
    for task in ["T1", "T2", "T3", "T4", "T5"] {
        write_event(&db, "p", task).await;
    }
    let shutdown = CancellationToken::new();
    let handler = Refusing {
        handled: Arc::default(),
        failure,
        shutdown: shutdown.clone(),
    };
    let consumer = Consumer::new(
        db.pool(4),
        None,
        fast_config("p", "refusing"),
        handler.clone(),
        handler.clone(),
    );
    let result = tokio::time::timeout(Duration::from_secs(10), consumer.run(shutdown))
        .await
        .expect("the run ends");
    assert_eq!(
        handler.handled.lock().unwrap().as_slice(),
        ["T1", "T2", "T3", "T4", "T5"],
        "each handled once"
    );
    let rows: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_deliveries WHERE consumer_id = 'refusing'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    (result, cursor(&db, "p", "refusing").await, rows)
}

#[tokio::test]
async fn a_partial_ack_naming_a_broken_sink_stops_the_run_without_acknowledging_or_charging() {
    let (result, cursor, rows) = run_refusing(HandlerFailure::stop("publisher gone")).await;
    match result {
        Err(ConsumerError::SinkFailed { reason }) => assert_eq!(reason, "publisher gone"),
        other => panic!("expected SinkFailed, got {other:?}"),
    }
    assert_eq!(
        cursor,
        Some(0),
        "nothing acknowledged: the next run delivers all again"
    );
    assert_eq!(rows, 0, "no event is charged with the sink's failure");
}

#[tokio::test]
async fn a_partial_ack_abandoned_at_shutdown_acknowledges_the_durable_prefix_uncounted() {
    let (result, cursor, rows) = run_refusing(HandlerFailure::abandon()).await;
    result.expect("a shutdown ends the run cleanly");
    assert_eq!(cursor, Some(2), "the durable prefix is acknowledged");
    assert_eq!(
        rows, 0,
        "the abandoned event is not charged with an attempt"
    );
}

/// Each slice `before_ack_prefix` received: its events' sequences and task IDs.
type Slices = Arc<Mutex<Vec<Vec<(i64, String)>>>>;

/// Records every slice `before_ack_prefix` receives; reports the first event of a task in
/// `unconfirmed` as failed, everything before it in the slice as durable.
#[derive(Clone, Default)]
struct LaneConfirming {
    inner: Confirming,
    slices: Slices,
}

impl Handler for LaneConfirming {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        self.inner.handle(event).await
    }

    async fn before_ack_prefix(&self, handled: &[ObservedEvent]) -> Result<(), PartialAck> {
        self.slices.lock().unwrap().push(
            handled
                .iter()
                .map(|e| (e.sequence, e.event_type.clone()))
                .collect(),
        );
        self.inner.before_ack_prefix(handled).await
    }
}

/// With lanes, as with one lane: `before_ack_prefix` receives only the events the handler was
/// called for (not those of undeclared types, which pass without a call), and a partial
/// acknowledgement moves the cursor over the durable prefix (up to an event of an undeclared
/// type right before the failed one), charges the failed event, and delivers it and what
/// follows again, not the durable prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lanes_before_ack_prefix_sees_what_one_lane_sees_and_keeps_the_durable_prefix() {
    let db = fresh_db().await;
    // 1 T1, 2 T2, 3 an undeclared type, 4 T4 (unconfirmed at first), 5 T5.
    write_event(&db, "p", "T1").await;
    write_event(&db, "p", "T2").await;
    db.connect()
        .await
        .execute(
            "INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id, \
             writer_process_id, payload_version, payload) \
             VALUES ('p', 'task:archived', 'archived-1', 'T3', 'w', 1, '{}'::jsonb)",
            &[],
        )
        .await
        .unwrap();
    write_event(&db, "p", "T4").await;
    write_event(&db, "p", "T5").await;
    let handler = LaneConfirming::default();
    handler
        .inner
        .unconfirmed
        .lock()
        .unwrap()
        .insert("T4".into());
    let mut config = fast_config("p", "lanes");
    config.delivery.lanes = 4;
    config.delivery.retry =
        outbox_consumer::RetrySchedule::new(vec![Duration::from_millis(200)], 100).unwrap();
    let shutdown = CancellationToken::new();
    let consumer = Consumer::new(
        db.pool(4),
        None,
        config,
        handler.clone(),
        handler.inner.clone(),
    );
    let token = shutdown.clone();
    let run = tokio::spawn(async move { consumer.run(token).await });

    let attempts = || async {
        db.connect()
            .await
            .query_opt(
                "SELECT attempts FROM outbox.lifecycle_deliveries \
                 WHERE consumer_id = 'lanes' AND sequence = 4 AND state = 'retrying'",
                &[],
            )
            .await
            .unwrap()
            .map(|row| row.get::<_, i32>(0))
    };
    eventually(
        Duration::from_secs(15),
        "two failed attempts of T4",
        || async { attempts().await.is_some_and(|n| n >= 2) },
    )
    .await;
    assert_eq!(
        cursor(&db, "p", "lanes").await,
        Some(3),
        "held just before the unconfirmed event, past the undeclared one"
    );
    let handled = handler.inner.handled.lock().unwrap().clone();
    for task in ["T1", "T2"] {
        assert_eq!(
            handled.iter().filter(|t| *t == task).count(),
            1,
            "the durable {task} is not delivered again: {handled:?}"
        );
    }
    assert!(
        handled.iter().filter(|t| *t == "T4").count() >= 2,
        "T4 delivered again: {handled:?}"
    );

    handler.inner.unconfirmed.lock().unwrap().clear();
    eventually(
        Duration::from_secs(15),
        "everything acknowledged",
        || async { cursor(&db, "p", "lanes").await == Some(5) },
    )
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    let slices = handler.slices.lock().unwrap().clone();
    assert!(
        slices
            .iter()
            .flatten()
            .all(|(_, event_type)| event_type == "task:deleted"),
        "before_ack_prefix saw an event the handler was not called for: {slices:?}"
    );
}
