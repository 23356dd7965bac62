//! Helpers for consumer tests: recording handlers, fast timings, writing events, waiting.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use outbox_consumer::{
    ConsumerConfig, FailureClass, Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler,
    RetrySchedule, StartFrom,
};
use outbox_core::{
    ConsumerId, Prior, ProjectId, Schema, TaskDeleted, TaskId, Writer, WriterProcessId,
};

use crate::TestDb;

/// A configuration with timings compressed so tests run in seconds.
pub fn fast_config(project: &str, consumer: &str) -> ConsumerConfig {
    let mut config = ConsumerConfig::new(
        ProjectId::new(project).unwrap(),
        ConsumerId::new(consumer).unwrap(),
    );
    config.lease_ttl = Duration::from_secs(2);
    config.heartbeat_interval = Duration::from_millis(300);
    config.poll_interval = Duration::from_millis(100);
    config.sequence_interval = Some(Duration::from_millis(10));
    config.retry = RetrySchedule::new(vec![Duration::from_millis(50)], 3).unwrap();
    config.shutdown_grace = Duration::from_millis(500);
    config.start_from = StartFrom::Earliest;
    config
}

/// Writes and commits one event for `task` in `project`; returns its event ID.
pub async fn write_event(db: &TestDb, project: &str, task: &str) -> String {
    let mut client = db.connect().await;
    let tx = client.transaction().await.unwrap();
    let event = TaskDeleted::new(
        ProjectId::new(project).unwrap(),
        TaskId::new(task).unwrap(),
        Utc::now(),
        Prior::default(),
    )
    .unwrap();
    Writer::new(
        &Schema::default(),
        WriterProcessId::new("test-writer").unwrap(),
    )
    .record(&tx, &event)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    event.event_id()
}

/// Waits up to `timeout` for `check` to hold, polling every 20 ms.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Records what it receives; fails the tasks in `failing` with class `forced_failure`.
#[derive(Clone, Default)]
pub struct Recorder {
    /// Every delivery, in order.
    pub events: Arc<Mutex<Vec<ObservedEvent>>>,
    /// Every reconciliation.
    pub reconciliations: Arc<Mutex<Vec<LiveSet>>>,
    /// Task IDs whose events fail.
    pub failing: Arc<Mutex<BTreeSet<String>>>,
}

impl Recorder {
    /// Delivered events so far.
    pub fn events(&self) -> Vec<ObservedEvent> {
        self.events.lock().unwrap().clone()
    }

    /// Sequences delivered so far, in delivery order.
    pub fn sequences(&self) -> Vec<i64> {
        self.events().iter().map(|e| e.sequence).collect()
    }

    /// Reconciliations so far.
    pub fn reconciliations(&self) -> Vec<LiveSet> {
        self.reconciliations.lock().unwrap().clone()
    }

    /// Makes events of `task` fail.
    pub fn fail_task(&self, task: &str) {
        self.failing.lock().unwrap().insert(task.to_owned());
    }

    /// Makes events of `task` succeed again.
    pub fn heal_task(&self, task: &str) {
        self.failing.lock().unwrap().remove(task);
    }
}

impl Handler for Recorder {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        self.events.lock().unwrap().push(event.clone());
        if self.failing.lock().unwrap().contains(&event.task_id) {
            return Err(FailureClass::new("forced_failure").unwrap().into());
        }
        Ok(())
    }
}

impl Reconciler for Recorder {
    async fn reconcile(&self, live: &LiveSet) -> Result<(), HandlerFailure> {
        self.reconciliations.lock().unwrap().push(live.clone());
        Ok(())
    }
}

/// The stored cursor of a consumer.
pub async fn cursor(db: &TestDb, project: &str, consumer: &str) -> Option<i64> {
    db.connect()
        .await
        .query_opt(
            "SELECT last_acked_sequence FROM outbox.lifecycle_consumer_cursors \
             WHERE project_id = $1 AND consumer_id = $2",
            &[&project, &consumer],
        )
        .await
        .unwrap()
        .and_then(|row| row.get(0))
}
