//! Helpers for consumer-set tests: one [`Recorder`] per (project, consumer) pair, a set
//! started on a pool with a known application name, and lines of a process grouped by pair.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use outbox_consumer::set::PairOutcome;
use outbox_consumer::{ConsumerError, ConsumerSet, DeliverySettings, Duties, Projects};
use outbox_core::{ConsumerId, ProjectId};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::TestDb;
use crate::consumer_kit::Recorder;
use crate::process_kit::Line;

/// The application name of the pool connections of a test set, to count them.
pub const SET_APPLICATION: &str = "set-under-test";
/// The application name of a test set's LISTEN connection.
pub const SET_LISTENER: &str = "set-under-test-listener";

/// The recorders of a set's pairs, made on demand as the set starts each pair.
#[derive(Clone, Default)]
pub struct Recorders(Arc<Mutex<BTreeMap<(String, String), Recorder>>>);

impl Recorders {
    /// The recorder of `consumer` of `project` (made now if the set has not started it yet,
    /// so a test can arrange failures before the pair exists).
    pub fn of(&self, project: &str, consumer: &str) -> Recorder {
        self.0
            .lock()
            .unwrap()
            .entry((project.to_owned(), consumer.to_owned()))
            .or_default()
            .clone()
    }

    /// Sequences delivered to `consumer` of `project`, in delivery order.
    pub fn sequences(&self, project: &str, consumer: &str) -> Vec<i64> {
        self.of(project, consumer).sequences()
    }
}

/// How a test set runs: every pair's delivery settings and the set's duties.
pub struct SetConfig {
    /// How every pair delivers.
    pub delivery: DeliverySettings,
    /// What the set does once for all pairs.
    pub duties: Duties,
}

/// A running set: its shutdown token and its run.
pub type RunningSet = (
    CancellationToken,
    JoinHandle<Result<Vec<PairOutcome>, ConsumerError>>,
);

/// Starts a set of `consumers` over `projects` configured as `template`, on a pool of
/// `pool_size` and (with `listen`) one listener, named [`SET_APPLICATION`] and
/// [`SET_LISTENER`].
pub fn start_set(
    db: &TestDb,
    template: SetConfig,
    projects: Projects,
    consumers: &[&str],
    pool_size: usize,
    listen: bool,
    recorders: &Recorders,
) -> RunningSet {
    let mut config = db.config.clone();
    config.application_name(SET_APPLICATION);
    let pool = outbox_core::connect::ConnectSettings::from_config(config.clone())
        .pool(pool_size)
        .expect("pool builds");
    config.application_name(SET_LISTENER);
    let consumers = consumers
        .iter()
        .map(|c| ConsumerId::new(*c).unwrap())
        .collect();
    let factory = {
        let recorders = recorders.clone();
        move |project: &ProjectId, consumer: &ConsumerId| {
            let recorder = recorders.of(project.as_str(), consumer.as_str());
            (recorder.clone(), recorder)
        }
    };
    let set = ConsumerSet::new(
        pool,
        listen.then_some(config),
        template.delivery,
        template.duties,
        projects,
        consumers,
        factory,
    );
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    (shutdown, tokio::spawn(async move { set.run(token).await }))
}

/// Projects from names.
pub fn listed(projects: &[&str]) -> Projects {
    Projects::Listed(
        projects
            .iter()
            .map(|p| ProjectId::new(*p).unwrap())
            .collect(),
    )
}

/// Connections of the test's database named `application` ([`SET_APPLICATION`],
/// [`SET_LISTENER`]).
pub async fn connections_named(db: &TestDb, application: &str) -> i64 {
    db.connect()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = $1",
            &[&application],
        )
        .await
        .unwrap()
        .get(0)
}

/// Events by (project, consumer): (sequence, event ID) in delivery order.
pub type PairEvents = BTreeMap<(String, String), Vec<(i64, String)>>;

/// Event lines of a process grouped by (project, consumer).
pub fn events_by_pair(lines: &[Line]) -> PairEvents {
    let mut pairs: BTreeMap<_, Vec<_>> = BTreeMap::new();
    for line in lines.iter().filter(|l| l.value["type"] == "event") {
        let v = &line.value;
        let key = (
            v["project_id"].as_str().expect("project_id").to_owned(),
            v["consumer_id"].as_str().expect("consumer_id").to_owned(),
        );
        let event = (
            v["sequence"].as_i64().expect("sequence"),
            v["event_id"].as_str().expect("event_id").to_owned(),
        );
        pairs.entry(key).or_default().push(event);
    }
    pairs
}
