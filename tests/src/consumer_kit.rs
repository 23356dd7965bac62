//! Helpers for consumer tests: recording handlers, fast timings, starting a consumer, writing
//! events, seeding consumer and delivery rows directly, waiting.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use outbox_consumer::{
    Consumer, ConsumerConfig, ConsumerError, DeliverySettings, Duties, FailureClass, Handler,
    HandlerFailure, LiveSet, ObservedEvent, Reconciler, RetrySchedule, RunSummary, StartFrom,
};
use outbox_core::{
    ConsumerId, Prior, ProjectId, Schema, TaskDeleted, TaskId, Writer, WriterProcessId,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::TestDb;

/// How long a test waits for something a consumer in the same process should do soon.
pub const WAIT: Duration = Duration::from_secs(15);
/// How long a test waits for separate processes (started, killed, restarted) to get there.
pub const PROCESS_WAIT: Duration = Duration::from_secs(20);

/// A running consumer: its shutdown token and its run.
pub type Running = (
    CancellationToken,
    JoinHandle<Result<RunSummary, ConsumerError>>,
);

/// Starts a consumer on a pool of 4 with a listener, `recorder` as handler and reconciler.
pub fn start(db: &TestDb, config: ConsumerConfig, recorder: &Recorder) -> Running {
    start_with(db, config, recorder.clone(), recorder.clone())
}

/// Starts a consumer on a pool of 4 with a listener and the given handler and reconciler.
pub fn start_with<H, R>(db: &TestDb, config: ConsumerConfig, handler: H, reconciler: R) -> Running
where
    H: Handler + 'static,
    R: Reconciler + 'static,
{
    let shutdown = CancellationToken::new();
    let consumer = Consumer::new(
        db.pool(4),
        Some(db.config.clone()),
        config,
        handler,
        reconciler,
    );
    let token = shutdown.clone();
    (
        shutdown,
        tokio::spawn(async move { consumer.run(token).await }),
    )
}

/// Where a seeded consumer's cursor stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedCursor {
    /// Missing (NULL): the consumer has not reconciled yet.
    Missing,
    /// At this sequence.
    At(i64),
    /// At the project's head.
    Head,
}

impl From<Option<i64>> for SeedCursor {
    fn from(cursor: Option<i64>) -> Self {
        cursor.map_or(SeedCursor::Missing, SeedCursor::At)
    }
}

/// Adds a consumer row directly, without a lease (nothing if it exists already). On a schema
/// from before migration 0011 (an upgrade test's starting point) the cursor is a column of the
/// consumer row; from 0011 on it is the consumer's first position.
pub async fn seed_consumer(
    db: &TestDb,
    project: &str,
    consumer: &str,
    cursor: impl Into<SeedCursor>,
    retired: bool,
) {
    let cursor = cursor.into();
    let (at, head) = match cursor {
        SeedCursor::Missing => (None, false),
        SeedCursor::At(sequence) => (Some(sequence), false),
        SeedCursor::Head => (None, true),
    };
    let client = db.connect().await;
    let positions: bool = client
        .query_one(
            "SELECT to_regclass('outbox.lifecycle_consumer_positions') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let statement = if positions {
        "WITH consumer AS (
             INSERT INTO outbox.lifecycle_consumers
                 (project_id, consumer_id, state, retired_at, retired_by)
             VALUES ($1, $2, CASE WHEN $4 THEN 'retired' ELSE 'active' END,
                     CASE WHEN $4 THEN now() END, CASE WHEN $4 THEN 'test' END)
             ON CONFLICT DO NOTHING
             RETURNING project_id, consumer_id
         )
         INSERT INTO outbox.lifecycle_consumer_positions
             (project_id, consumer_id, last_acked_sequence)
         SELECT project_id, consumer_id,
                CASE WHEN $5 THEN (SELECT COALESCE(max(head_sequence), 0)
                                   FROM outbox.lifecycle_project_heads
                                   WHERE project_id = $1)
                     ELSE $3 END
         FROM consumer
         WHERE $5 OR $3::bigint IS NOT NULL"
    } else {
        "INSERT INTO outbox.lifecycle_consumer_cursors
             (project_id, consumer_id, last_acked_sequence, state, retired_at, retired_by)
         VALUES ($1, $2,
                 CASE WHEN $5 THEN (SELECT COALESCE(max(head_sequence), 0)
                                    FROM outbox.lifecycle_project_heads
                                    WHERE project_id = $1)
                      ELSE $3 END,
                 CASE WHEN $4 THEN 'retired' ELSE 'active' END,
                 CASE WHEN $4 THEN now() END, CASE WHEN $4 THEN 'test' END)
         ON CONFLICT DO NOTHING"
    };
    client
        .execute(statement, &[&project, &consumer, &at, &retired, &head])
        .await
        .unwrap();
}

/// Which retained event a seeded delivery is about.
#[derive(Debug, Clone, Copy)]
pub enum SeedEvent<'a> {
    /// The event with this sequence.
    Sequence(i64),
    /// The event with this ID.
    Id(&'a str),
}

/// Adds `consumer`'s delivery row of a retained event in `state` with `attempts`, as the
/// runtime (and, for `resolved`, an operator) would have left it; `settled_days_ago` moves
/// `updated_at` (and `resolved_at`) back. Retrying rows are due in a minute.
pub async fn seed_delivery(
    db: &TestDb,
    project: &str,
    consumer: &str,
    event: SeedEvent<'_>,
    state: &str,
    attempts: i32,
    settled_days_ago: i32,
) {
    let (sequence, event_id) = match event {
        SeedEvent::Sequence(sequence) => (Some(sequence), None),
        SeedEvent::Id(id) => (None, Some(id)),
    };
    let inserted = db
        .connect()
        .await
        .execute(
            "INSERT INTO outbox.lifecycle_deliveries
                 (project_id, consumer_id, event_id, sequence, attempts, next_attempt_at,
                  last_failure_class, state, parked_at, resolved_at, resolved_by, updated_at)
             SELECT $1, $2, o.event_id, o.sequence, $5,
                    CASE WHEN $4::text = 'retrying' THEN now() + interval '1 minute' END,
                    'forced_failure', $4::text,
                    CASE WHEN $4::text <> 'retrying' THEN now() END,
                    CASE WHEN $4::text = 'resolved' THEN now() - make_interval(days => $6) END,
                    CASE WHEN $4::text = 'resolved' THEN 'test' END,
                    now() - make_interval(days => $6)
             FROM outbox.lifecycle_outbox AS o
             WHERE o.project_id = $1 AND (o.sequence = $3 OR o.event_id = $7)",
            &[
                &project,
                &consumer,
                &sequence,
                &state,
                &attempts,
                &settled_days_ago,
                &event_id,
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        inserted, 1,
        "seeded delivery of {event:?} in project {project}"
    );
}

/// A configuration with timings compressed so tests run in seconds.
pub fn fast_config(project: &str, consumer: &str) -> ConsumerConfig {
    ConsumerConfig {
        project_id: ProjectId::new(project).unwrap(),
        consumer_id: ConsumerId::new(consumer).unwrap(),
        delivery: fast_delivery(),
        duties: fast_duties(),
    }
}

/// Delivery settings with timings compressed so tests run in seconds.
pub fn fast_delivery() -> DeliverySettings {
    DeliverySettings {
        lease_ttl: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(300),
        poll_interval: Duration::from_millis(100),
        retry: RetrySchedule::new(vec![Duration::from_millis(50)], 3).unwrap(),
        shutdown_grace: Duration::from_millis(500),
        start_from: StartFrom::Earliest,
        ..DeliverySettings::default()
    }
}

/// Duties with timings compressed so tests run in seconds.
pub fn fast_duties() -> Duties {
    Duties {
        sequence_interval: Some(Duration::from_millis(10)),
        sequencer_lease_ttl: Duration::from_secs(1),
        ..Duties::default()
    }
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

/// Waits up to `timeout` for `count`, a query returning one `bigint`, to return `expected`
/// (a row count reached, a session seen waiting).
pub async fn eventually_count(
    client: &tokio_postgres::Client,
    timeout: Duration,
    what: &str,
    count: &str,
    expected: i64,
) {
    eventually(timeout, what, || async {
        client
            .query_one(count, &[])
            .await
            .expect("count query")
            .get::<_, i64>(0)
            == expected
    })
    .await;
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

/// Waits until no `outbox` process has a session on the test's database. A process killed
/// with SIGKILL can leave a COMMIT in its socket that the server applies after the process is
/// gone, so a cursor read right after the kill may not be the durable one yet; it is once the
/// killed process's sessions have ended. Only for moments when no other `outbox` process runs.
pub async fn sessions_ended(db: &TestDb) {
    eventually(
        PROCESS_WAIT,
        "the killed process's sessions to end",
        || async { crate::set_kit::connections_named(db, "outbox").await == 0 },
    )
    .await;
}

/// Writers that commit events until stopped, spread over `projects`, each pausing a random
/// number of milliseconds from `pause` between commits.
pub struct Writers {
    /// Set to stop them.
    stop: Arc<AtomicBool>,
    /// (project, event ID) of every committed event.
    committed: Arc<Mutex<Vec<(String, String)>>>,
    /// The writer tasks.
    tasks: Vec<JoinHandle<()>>,
}

impl Writers {
    /// Starts `count` writers.
    pub fn start(
        db: &TestDb,
        count: usize,
        projects: &'static [&'static str],
        pause: Range<u64>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..count)
            .map(|w| {
                let (db, stop, committed) = (db.clone(), stop.clone(), committed.clone());
                let pause = pause.clone();
                tokio::spawn(async move {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let project = projects[(w + i) % projects.len()];
                        let id = write_event(&db, project, &format!("w{w}-{i}")).await;
                        committed.lock().unwrap().push((project.to_owned(), id));
                        i += 1;
                        let ms = rand::random_range(pause.clone());
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                })
            })
            .collect();
        Self {
            stop,
            committed,
            tasks,
        }
    }

    /// How many events were committed so far.
    pub fn count(&self) -> usize {
        self.committed.lock().unwrap().len()
    }

    /// Lets the writers go on until at least `events` are committed (however slow the
    /// machine, within [`PROCESS_WAIT`]), then stops them like [`Writers::stop`].
    pub async fn stop_after(self, events: usize) -> Vec<(String, String)> {
        eventually(PROCESS_WAIT, &format!("{events} committed events"), || {
            let count = self.count();
            async move { count >= events }
        })
        .await;
        self.stop().await
    }

    /// Stops the writers; returns (project, event ID) of every committed event.
    pub async fn stop(self) -> Vec<(String, String)> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        self.committed.lock().unwrap().clone()
    }
}
