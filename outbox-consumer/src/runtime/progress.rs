//! A run's state beyond its position: what it delivered, what it still has to check, the
//! batch being read ahead, and its metrics.

use tokio::time::Instant;

use super::fetch::Prefetch;
use super::lanes::Ahead;
use super::position::{Handled, Position};
use crate::config::ConsumerConfig;
use crate::event::FailureClass;
use crate::handler::ReconcileReason;

/// Per-run delivery state.
pub(super) struct Progress {
    /// Where the run stands in the stream.
    pub position: Position,
    /// Whether the position was checked (identity, head, floor) since the last (re)start.
    pub bounds_checked: bool,
    /// When the position was last found to agree with the database: a read on a connection
    /// opened since may reach another server, so the check runs again first.
    pub checked_at: std::time::Instant,
    /// A reconciliation that must run before anything else is dispatched (the history
    /// diverged; the divergence is already audited).
    pub must_reconcile: Option<ReconcileReason>,
    /// When to look for replay requests next.
    pub next_replay_check: Instant,
    /// Events delivered in order.
    pub delivered: u64,
    /// Whether a missing cursor may start from the earliest event: only for a consumer row
    /// this run created. A reactivated consumer, or one that crashed before its first
    /// reconciliation finished, always reconciles.
    pub new_consumer: bool,
    /// A lone consumer's read size (growing in a catch-up) and the next batches, being read
    /// while this one is dispatched (after a full batch); a batch read ahead is used only if
    /// the cursor reaches the point it was read after. Dropped (`None`) after an anomaly: the
    /// next read then starts again at the base size.
    pub prefetched: Option<Prefetch>,
    /// With lanes: the events read ahead of the cursor and where each stands, kept between
    /// rounds (`None`: the next round starts over from the cursor).
    pub lanes: Option<Ahead>,
    /// The run's metrics.
    pub meters: Meters,
}

impl Progress {
    /// The state of a run that claimed the lease with `cursor`.
    pub fn new(
        config: &ConsumerConfig,
        cursor: Option<i64>,
        identity: Option<String>,
        new_consumer: bool,
    ) -> Self {
        let meters = Meters::new(config);
        if let Some(cursor) = cursor {
            meters.cursor.set(cursor as f64);
        }
        Self {
            position: Position::on(cursor, identity),
            bounds_checked: false,
            checked_at: std::time::Instant::now(),
            must_reconcile: None,
            next_replay_check: Instant::now(),
            delivered: 0,
            new_consumer,
            prefetched: None,
            lanes: None,
            meters,
        }
    }

    /// Records a cursor moved without delivery (a reconciliation to the head) in the
    /// position and the cursor gauge, which otherwise would still show the old position.
    pub fn moved_to(&mut self, cursor: i64, identity: Option<String>) {
        self.position.moved_to(cursor, identity);
        self.meters.cursor.set(cursor as f64);
    }

    /// Forgets everything handled, held, kept or run ahead after the cursor (see
    /// [`Position::forget_after_cursor`]).
    pub fn forget_after_cursor(&mut self) {
        self.position.forget_after_cursor();
        self.lanes = None;
    }

    /// Whether nothing is held back: nothing failed waits, nothing handled is unacknowledged,
    /// no lane has anything ahead of the cursor.
    pub fn is_settled(&self) -> bool {
        self.position.is_settled() && self.lanes.as_ref().is_none_or(Ahead::is_empty)
    }

    /// Records an acknowledged prefix in the position and the metrics.
    pub fn advance(&mut self, handled: Handled) {
        self.position.acknowledged(handled.last, handled.identity);
        self.delivered += handled.count;
        self.meters.delivered.increment(handled.count);
        self.meters.cursor.set(handled.last as f64);
    }
}

/// The consumer's metrics, labelled once per run with its project and ID (names as the
/// README's metric table lists them).
pub(super) struct Meters {
    /// The `project` and `consumer` labels, for the per-class failure counters.
    labels: [(&'static str, String); 2],
    /// `outbox_events_delivered_total`: events acknowledged in order.
    delivered: metrics::Counter,
    /// `outbox_consumer_cursor`: the last acknowledged sequence.
    cursor: metrics::Gauge,
    /// `outbox_dead_letters_parked_total`: events parked.
    pub dead_letters: metrics::Counter,
    /// `outbox_events_skipped_total`: events of undeclared types passed without a call.
    pub skipped: metrics::Counter,
    /// `outbox_history_divergences_total`: positions found not to exist in the database's
    /// history.
    pub divergences: metrics::Counter,
    /// `outbox_commit_to_dispatch_seconds`: writer's transaction start to first dispatch.
    pub commit_to_dispatch: metrics::Histogram,
    /// `outbox_lanes_busy`: lanes whose handler runs (only with more than one lane).
    lanes_busy: Option<metrics::Gauge>,
    /// `outbox_events_ahead_of_cursor`: events handled or parked beyond the cursor, not yet
    /// acknowledged (only with more than one lane).
    ahead_of_cursor: Option<metrics::Gauge>,
}

impl Meters {
    fn new(config: &ConsumerConfig) -> Self {
        let labels = [
            ("project", config.project_id.to_string()),
            ("consumer", config.consumer_id.to_string()),
        ];
        Self {
            delivered: metrics::counter!(crate::metric::EVENTS_DELIVERED.name, &labels),
            cursor: metrics::gauge!(crate::metric::CONSUMER_CURSOR.name, &labels),
            dead_letters: metrics::counter!(crate::metric::DEAD_LETTERS_PARKED.name, &labels),
            skipped: metrics::counter!(crate::metric::EVENTS_SKIPPED.name, &labels),
            divergences: metrics::counter!(crate::metric::HISTORY_DIVERGENCES.name, &labels),
            commit_to_dispatch: metrics::histogram!(crate::metric::COMMIT_TO_DISPATCH.name),
            lanes_busy: (config.delivery.lanes > 1)
                .then(|| metrics::gauge!(crate::metric::LANES_BUSY.name, &labels)),
            ahead_of_cursor: (config.delivery.lanes > 1)
                .then(|| metrics::gauge!(crate::metric::EVENTS_AHEAD_OF_CURSOR.name, &labels)),
            labels,
        }
    }

    /// Sets `outbox_lanes_busy`.
    pub fn lanes_busy(&self, running: usize) {
        if let Some(gauge) = &self.lanes_busy {
            gauge.set(running as f64);
        }
    }

    /// Sets `outbox_events_ahead_of_cursor`.
    pub fn ahead_of_cursor(&self, settled: usize) {
        if let Some(gauge) = &self.ahead_of_cursor {
            gauge.set(settled as f64);
        }
    }

    /// `outbox_delivery_failures_total`: failed attempts, by failure class.
    pub fn failure(&self, class: &FailureClass) -> metrics::Counter {
        let [project, consumer] = &self.labels;
        let labels = [
            project.clone(),
            consumer.clone(),
            ("class", class.to_string()),
        ];
        metrics::counter!(crate::metric::DELIVERY_FAILURES.name, &labels)
    }
}
