//! What each pair of a set tells the process hosting it: its [`Probe`] (lease and liveness,
//! for readiness) and, when the set samples gauges, the same lag and dead-letter gauges a
//! lone consumer samples while it holds its lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use outbox_core::{ConsumerId, ProjectId, Schema};
use tokio_util::sync::CancellationToken;

use crate::gauges;
use crate::probe::Probe;

/// The probes of a set's pairs, by project and consumer; cheap to clone, shared with the set.
/// A pair's probe appears when the set starts the pair.
#[derive(Debug, Clone, Default)]
pub struct PairProbes(Arc<Mutex<ByPair>>);

/// Probes by (project, consumer).
type ByPair = HashMap<(ProjectId, ConsumerId), Arc<Probe>>;

impl PairProbes {
    /// The probe of the pair (`project`, `consumer`); `None` until the set has started it.
    pub fn get(&self, project: &ProjectId, consumer: &ConsumerId) -> Option<Arc<Probe>> {
        self.lock()
            .get(&(project.clone(), consumer.clone()))
            .cloned()
    }

    pub(super) fn insert(&self, project: &ProjectId, consumer: &ConsumerId, probe: Arc<Probe>) {
        self.lock()
            .insert((project.clone(), consumer.clone()), probe);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ByPair> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
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
