//! What `status` reports per project and per consumer.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::admin::ConsumerInfo;
use crate::retention::HoldBack;
use crate::states::Health;

/// One project's stream. The default is a project with nothing in it yet.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProjectStatus {
    /// The project.
    pub project_id: String,
    /// The last assigned sequence (0 before the first).
    pub head_sequence: i64,
    /// The retention floor: events up to here were pruned.
    pub pruned_through: i64,
    /// Committed events not numbered yet.
    pub unsequenced: i64,
    /// When the oldest of them was written.
    pub oldest_unsequenced_at: Option<DateTime<Utc>>,
    /// How long ago that was, in seconds (database clock).
    pub oldest_unsequenced_age_secs: Option<f64>,
    /// Events a retention sweep would prune now (the sweep's own rule, judged with
    /// `thresholds.retention`), counted up to `max_prunable + 1`.
    pub prunable: i64,
    /// The count stopped at `max_prunable + 1`: at least that many are prunable.
    pub prunable_capped: bool,
    /// When the oldest retained event (the lowest sequence above the floor) was written.
    pub oldest_retained_at: Option<DateTime<Utc>>,
    /// How long ago that was, in seconds.
    pub oldest_retained_age_secs: Option<f64>,
    /// What stops the floor below the head once the prunable events are gone (as `outbox
    /// prune --dry-run` names it); `None` when nothing does, or when the count was capped.
    pub held_by: Option<HoldBack>,
    /// Age in seconds of the oldest event a sweep would keep (the one `held_by` names);
    /// `None` when the sweep would reach the head, or when the count was capped.
    pub oldest_held_age_secs: Option<f64>,
    /// Health codes; `[ok]` when there is nothing to report.
    pub health: Vec<Health>,
}

/// A consumer as `status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsumerStatus {
    /// The consumer.
    #[serde(flatten)]
    pub consumer: ConsumerInfo,
    /// Health codes; `[ok]` when there is nothing to report.
    pub health: Vec<Health>,
}
