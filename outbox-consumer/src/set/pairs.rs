//! What each pair of a set tells the process hosting it: its [`Probe`] (lease and liveness,
//! for readiness) and, when the set samples gauges, the same lag and dead-letter gauges a
//! lone consumer samples while it holds its lease.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use outbox_core::{ConsumerId, ProjectId, Schema};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::gauges;
use crate::probe::Probe;

/// The probes of a set's pairs, by project and consumer; cheap to clone, shared with the set.
/// A pair's probe appears when the set starts the pair.
#[derive(Debug, Clone, Default)]
pub struct PairProbes(Arc<Shared>);

/// What the clones of a [`PairProbes`] share.
#[derive(Debug)]
struct Shared {
    by_pair: Mutex<ByPair>,
    /// Counts the pairs marked retired, so that whoever serves a pair's output learns of its
    /// retirement when it happens.
    retirements: watch::Sender<usize>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            by_pair: Mutex::default(),
            retirements: watch::channel(0).0,
        }
    }
}

/// A (project, consumer) pair.
type Pair = (ProjectId, ConsumerId);

/// Probes by pair, and the pairs that stopped because an operator retired them.
#[derive(Debug, Default)]
struct ByPair {
    probes: HashMap<Pair, Arc<Probe>>,
    retired: HashSet<Pair>,
}

impl PairProbes {
    /// The probe of the pair (`project`, `consumer`); `None` until the set has started it.
    pub fn get(&self, project: &ProjectId, consumer: &ConsumerId) -> Option<Arc<Probe>> {
        self.lock()
            .probes
            .get(&(project.clone(), consumer.clone()))
            .cloned()
    }

    /// Whether the pair stopped because an operator retired it: it holds no lease by
    /// decision, which a readiness check does not count against the process.
    pub fn retired(&self, project: &ProjectId, consumer: &ConsumerId) -> bool {
        self.lock()
            .retired
            .contains(&(project.clone(), consumer.clone()))
    }

    pub(super) fn insert(&self, project: &ProjectId, consumer: &ConsumerId, probe: Arc<Probe>) {
        let mut by_pair = self.lock();
        let pair = (project.clone(), consumer.clone());
        by_pair.retired.remove(&pair);
        by_pair.probes.insert(pair, probe);
    }

    /// Changes each time a pair is marked retired (then check [`PairProbes::retired`]); a new
    /// receiver has seen the retirements so far.
    pub fn retirements(&self) -> watch::Receiver<usize> {
        self.0.retirements.subscribe()
    }

    pub(super) fn mark_retired(&self, project: &ProjectId, consumer: &ConsumerId) {
        self.lock()
            .retired
            .insert((project.clone(), consumer.clone()));
        self.0.retirements.send_modify(|count| *count += 1);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ByPair> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.0.by_pair.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Samples one pair's gauges every `interval` while its lease is held, as a lone consumer does
/// from its claim to the end of its run; never returns (dropped when the pair's run ends).
pub(super) async fn gauges_while_held(
    pool: Pool,
    schema: Schema,
    project: ProjectId,
    consumer: ConsumerId,
    interval: Duration,
    probe: Arc<Probe>,
) {
    loop {
        while !probe.lease_held() {
            tokio::time::sleep(interval).await;
        }
        let stop = CancellationToken::new();
        let lost = async {
            while probe.lease_held() {
                tokio::time::sleep(interval).await;
            }
            stop.cancel();
        };
        let sampling = gauges::sample(
            pool.clone(),
            schema.clone(),
            project.clone(),
            consumer.clone(),
            interval,
            stop.clone(),
        );
        tokio::join!(sampling, lost);
    }
}
