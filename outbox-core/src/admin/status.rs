//! `status`: per project the head, unsequenced backlog, retention floor and pruning backlog;
//! per consumer the cursor, lag, lease and failures; each judged into bounded [`Health`]
//! codes by pure functions of the figures and the [`HealthThresholds`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::{Client, Row, Transaction};

use super::{Admin, AdminError, ConsumerInfo, InputError, Target};
use crate::ids::ProjectId;
use crate::retention::{
    DEFAULT_RETENTION, HoldBack, MAX_RETENTION, PruneOptions, PruneOptionsError, Pruner,
};
use crate::schema::Schema;
use crate::states::{ConsumerState, Health};
use crate::stmt::Unnamed as _;

/// When `status` reports a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthThresholds {
    /// A consumer further behind than this many events is `lagging`.
    pub max_lag: i64,
    /// An event failing for longer than this is `stuck_retrying`.
    pub max_retrying_age: Duration,
    /// A held lease whose heartbeat is older than this is `stale_heartbeat` (default: twice
    /// the runtime's default heartbeat interval of 10 s).
    pub max_heartbeat_age: Duration,
    /// A committed event unsequenced for longer than this means `sequencer_stalled`.
    pub max_unsequenced_age: Duration,
    /// More prunable events than this in a project mean `pruning_backlog`. Prunable events
    /// are counted up to `max_prunable + 1` only, so the cost of `status` is bounded by it.
    pub max_prunable: i64,
    /// The retention period the prunable count and `retention_held` are judged by (that of
    /// the sweeps: `outbox prune --retention`, `outbox consume --retention`).
    pub retention: Duration,
    /// An event the sweep would keep that is older than `retention` plus this means
    /// `retention_held`.
    pub max_retention_overrun: Duration,
}

impl Default for HealthThresholds {
    /// 10 000 events, 15 min, 20 s, 60 s, 100 000 events, retention 30 days, 1 day.
    fn default() -> Self {
        Self {
            max_lag: 10_000,
            max_retrying_age: Duration::from_secs(15 * 60),
            max_heartbeat_age: Duration::from_secs(20),
            max_unsequenced_age: Duration::from_secs(60),
            max_prunable: 100_000,
            retention: DEFAULT_RETENTION,
            max_retention_overrun: Duration::from_secs(86_400),
        }
    }
}

impl Serialize for HealthThresholds {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("HealthThresholds", 7)?;
        st.serialize_field("max_lag", &self.max_lag)?;
        st.serialize_field(
            "max_retrying_age_secs",
            &self.max_retrying_age.as_secs_f64(),
        )?;
        st.serialize_field(
            "max_heartbeat_age_secs",
            &self.max_heartbeat_age.as_secs_f64(),
        )?;
        st.serialize_field(
            "max_unsequenced_age_secs",
            &self.max_unsequenced_age.as_secs_f64(),
        )?;
        st.serialize_field("max_prunable", &self.max_prunable)?;
        st.serialize_field("retention_secs", &self.retention.as_secs_f64())?;
        st.serialize_field(
            "max_retention_overrun_secs",
            &self.max_retention_overrun.as_secs_f64(),
        )?;
        st.end()
    }
}

/// One project's stream.
#[derive(Debug, Clone, PartialEq, Serialize)]
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

/// What `status` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// The database clock when the snapshot was taken.
    pub as_of: DateTime<Utc>,
    /// The thresholds the health codes were judged by.
    pub thresholds: HealthThresholds,
    /// Projects, by ID.
    pub projects: Vec<ProjectStatus>,
    /// Consumers, by project and ID.
    pub consumers: Vec<ConsumerStatus>,
}

/// `[ok]` for no problems, else the problems in a fixed order.
fn codes(mut problems: Vec<Health>) -> Vec<Health> {
    if problems.is_empty() {
        return vec![Health::Ok];
    }
    problems.sort();
    problems.dedup();
    problems
}

/// Judges a project: `sequencer_stalled` when its oldest unsequenced event is too old,
/// `pruning_backlog` when more than `max_prunable` events are prunable, `retention_held` when
/// the oldest event a sweep would keep is older than retention plus `max_retention_overrun`.
pub fn project_health(project: &ProjectStatus, thresholds: &HealthThresholds) -> Vec<Health> {
    let mut problems = Vec::new();
    if project
        .oldest_unsequenced_age_secs
        .is_some_and(|age| age > thresholds.max_unsequenced_age.as_secs_f64())
    {
        problems.push(Health::SequencerStalled);
    }
    if project.prunable > thresholds.max_prunable {
        problems.push(Health::PruningBacklog);
    }
    let held_past = thresholds
        .retention
        .saturating_add(thresholds.max_retention_overrun)
        .as_secs_f64();
    if project
        .oldest_held_age_secs
        .is_some_and(|age| age > held_past)
    {
        problems.push(Health::RetentionHeld);
    }
    codes(problems)
}

/// Judges a consumer. A retired consumer holds nothing back and is always `ok`.
pub fn consumer_health(consumer: &ConsumerInfo, thresholds: &HealthThresholds) -> Vec<Health> {
    if consumer.state == ConsumerState::Retired {
        return codes(Vec::new());
    }
    let mut problems = Vec::new();
    if consumer.lag.is_some_and(|lag| lag > thresholds.max_lag) {
        problems.push(Health::Lagging);
    }
    if consumer
        .retrying
        .as_ref()
        .is_some_and(|r| r.failing_for_secs > thresholds.max_retrying_age.as_secs_f64())
    {
        problems.push(Health::StuckRetrying);
    }
    let heartbeat_old = consumer
        .heartbeat_age_secs
        .is_none_or(|age| age > thresholds.max_heartbeat_age.as_secs_f64());
    let events_wait = consumer.head_sequence > consumer.cursor.unwrap_or(0);
    if consumer.lease_live && heartbeat_old {
        problems.push(Health::StaleHeartbeat);
    }
    if !consumer.lease_live && heartbeat_old && events_wait {
        problems.push(Health::NotRunning);
    }
    let never_acknowledged = consumer.cursor.is_none() || consumer.last_acked_at.is_none();
    if never_acknowledged
        && events_wait
        && !consumer.lease_live
        && consumer.created_age_secs > thresholds.max_heartbeat_age.as_secs_f64()
    {
        problems.push(Health::NeverAcknowledged);
    }
    if consumer.dead_letters > 0 {
        problems.push(Health::DeadLetters);
    }
    codes(problems)
}

/// The statements of this module, rendered once for a schema.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    projects: String,
    retained_after: String,
}

impl Statements {
    pub(super) fn new(schema: &Schema) -> Self {
        Self {
            projects: schema.render(PROJECTS),
            retained_after: schema.render(RETAINED_AFTER),
        }
    }
}

impl ProjectStatus {
    /// The stream figures of a row of [`PROJECTS`]; retention fields and health are filled
    /// in afterwards.
    fn decode(row: &Row) -> Result<Self, tokio_postgres::Error> {
        Ok(Self {
            project_id: row.try_get("project_id")?,
            head_sequence: row.try_get("head_sequence")?,
            pruned_through: row.try_get("pruned_through")?,
            unsequenced: row.try_get("unsequenced")?,
            oldest_unsequenced_at: row.try_get("oldest_unsequenced_at")?,
            oldest_unsequenced_age_secs: row.try_get("oldest_unsequenced_age")?,
            prunable: 0,
            prunable_capped: false,
            oldest_retained_at: None,
            oldest_retained_age_secs: None,
            held_by: None,
            oldest_held_age_secs: None,
            health: Vec::new(),
        })
    }
}

impl Admin {
    /// Per project: head, unsequenced backlog, retention floor and pruning backlog; per
    /// consumer: cursor, lag, lease, the retrying event holding it and dead-letter counts;
    /// each with health codes. With `project`, only that project, which must exist.
    ///
    /// The prunable count applies the retention sweep's own rule ([`Pruner`]) with
    /// `thresholds.retention`, looking at most `max_prunable + 1` events past each floor, so
    /// a large backlog costs no more than that many index entries per project.
    pub async fn status(
        &self,
        client: &mut Client,
        project: Option<&ProjectId>,
        thresholds: &HealthThresholds,
    ) -> Result<Status, AdminError> {
        let filter = project.map(ProjectId::as_str);
        let pruner = self.status_pruner(thresholds)?;
        let limit = thresholds.max_prunable.saturating_add(1);
        let tx = Self::snapshot(client).await?;
        let as_of: DateTime<Utc> = tx
            .query_one_unnamed("SELECT now() AS as_of", &[])
            .await?
            .try_get("as_of")?;
        let rows = tx.query_unnamed(&self.status.projects, &[&filter]).await?;
        let mut projects = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut status = ProjectStatus::decode(row)?;
            self.retention_status(&tx, &pruner, limit, &mut status)
                .await?;
            status.health = project_health(&status, thresholds);
            projects.push(status);
        }
        let consumers = self
            .consumer_rows(&tx, filter, None)
            .await?
            .into_iter()
            .map(|consumer| ConsumerStatus {
                health: consumer_health(&consumer, thresholds),
                consumer,
            })
            .collect();
        tx.commit().await?;
        if let (Some(project), true) = (project, projects.is_empty()) {
            return Err(AdminError::NotFound {
                target: Target::Project {
                    project: project.clone(),
                },
            });
        }
        Ok(Status {
            as_of,
            thresholds: thresholds.clone(),
            projects,
            consumers,
        })
    }

    /// The retention rule as `status` applies it: a dry-run pruner with the thresholds'
    /// retention period.
    pub(super) fn status_pruner(
        &self,
        thresholds: &HealthThresholds,
    ) -> Result<Pruner, AdminError> {
        if thresholds.max_prunable < 0 {
            return Err(InputError::Threshold(format!(
                "max_prunable {} is negative",
                thresholds.max_prunable
            ))
            .into());
        }
        let options = PruneOptions {
            retention: thresholds.retention,
            dry_run: true,
            ..PruneOptions::default()
        };
        Pruner::new(&self.schema, options).map_err(|e| match e {
            PruneOptionsError::Retention(_) => InputError::Threshold(format!(
                "retention {:?} is longer than {} days",
                thresholds.retention,
                MAX_RETENTION.as_secs() / 86_400
            ))
            .into(),
            other => InputError::Threshold(other.to_string()).into(),
        })
    }

    /// Fills a project's retention fields: what a sweep would prune now (bounded by `limit`),
    /// the oldest retained event, and the oldest one a sweep would keep.
    async fn retention_status(
        &self,
        tx: &Transaction<'_>,
        pruner: &Pruner,
        limit: i64,
        status: &mut ProjectStatus,
    ) -> Result<(), AdminError> {
        let project = status.project_id.as_str();
        let Some(prunable) = pruner.prunable(tx, project, limit).await? else {
            return Ok(());
        };
        let retained_after = |sequence: i64| async move {
            tx.query_opt_unnamed(&self.status.retained_after, &[&project, &sequence])
                .await
                .and_then(|row| {
                    row.map(|row| Ok((row.try_get("occurred_at")?, row.try_get("age")?)))
                        .transpose()
                })
        };
        if prunable.floor < prunable.head {
            if let Some((at, age)) = retained_after(prunable.floor).await? {
                status.oldest_retained_at = Some(at);
                status.oldest_retained_age_secs = Some(age);
            }
        }
        status.prunable = prunable.events;
        status.prunable_capped = prunable.capped;
        if !prunable.capped && prunable.target < prunable.head {
            status.held_by = prunable.hold;
            status.oldest_held_age_secs = if prunable.target == prunable.floor {
                status.oldest_retained_age_secs
            } else {
                retained_after(prunable.target).await?.map(|(_, age)| age)
            };
        }
        Ok(())
    }
}

/// Projects with their head, retention floor and unsequenced backlog; `$1` project or NULL.
/// A project is known once it has a head, a consumer or an unsequenced (committed) event.
/// Ages are measured on the database clock.
///
/// The backlog is counted from the whole work list, read in `id` order (which only its index
/// yields without a sort), with the project matched outside that subquery (`OFFSET 0` keeps
/// the filter from being pushed into it). Statistics taken during a backlog make
/// `sequence IS NULL` look common; with both conditions on the table, the planner then reads
/// the whole table, or a filtered project's whole history through the `(project_id,
/// event_id)` key, even when the work list is empty.
const PROJECTS: &str = "
WITH unsequenced AS (
    SELECT project_id, count(*) AS pending, min(occurred_at) AS oldest
    FROM (SELECT project_id, occurred_at FROM {{schema}}.lifecycle_outbox
          WHERE sequence IS NULL ORDER BY id OFFSET 0) AS work_list
    WHERE $1::text IS NULL OR project_id = $1
    GROUP BY project_id
),
projects AS (
    SELECT project_id FROM {{schema}}.lifecycle_project_heads
    WHERE $1::text IS NULL OR project_id = $1
    UNION
    SELECT project_id FROM {{schema}}.lifecycle_consumer_cursors
    WHERE $1::text IS NULL OR project_id = $1
    UNION
    SELECT project_id FROM unsequenced
)
SELECT p.project_id,
       COALESCE(h.head_sequence, 0) AS head_sequence,
       COALESCE(h.pruned_through, 0) AS pruned_through,
       COALESCE(u.pending, 0) AS unsequenced,
       u.oldest AS oldest_unsequenced_at,
       extract(epoch FROM now() - u.oldest)::float8 AS oldest_unsequenced_age
FROM projects AS p
LEFT JOIN {{schema}}.lifecycle_project_heads AS h USING (project_id)
LEFT JOIN unsequenced AS u USING (project_id)
ORDER BY p.project_id";

/// The first retained event of project `$1` above sequence `$2`, with its age (database
/// clock): one probe of `lifecycle_outbox_sequence_idx`. Above the floor it is the oldest
/// retained event by sequence; `occurred_at` follows sequence closely but not exactly, and
/// the true `min(occurred_at)` would read every retained row of the project.
const RETAINED_AFTER: &str = "
SELECT o.occurred_at, extract(epoch FROM now() - o.occurred_at)::float8 AS age
FROM {{schema}}.lifecycle_outbox AS o
WHERE o.project_id = $1 AND o.sequence > $2
ORDER BY o.sequence
LIMIT 1";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::RetryingEvent;

    fn consumer(state: ConsumerState) -> ConsumerInfo {
        ConsumerInfo {
            project_id: "p".into(),
            consumer_id: "c".into(),
            state,
            cursor: Some(5),
            head_sequence: 5,
            lag: Some(0),
            lease_owner: Some("host:1:ab".into()),
            lease_generation: 1,
            lease_expires_at: None,
            lease_live: true,
            heartbeat_at: None,
            heartbeat_age_secs: Some(1.0),
            created_at: Utc::now(),
            created_age_secs: 3600.0,
            last_acked_at: Some(Utc::now()),
            reconciled_at: None,
            retired_at: None,
            retired_by: None,
            retired_reason: None,
            retrying: None,
            dead_letters: 0,
            replay_requested: 0,
        }
    }

    #[test]
    fn health_of_a_consumer() {
        let t = HealthThresholds::default();
        let healthy = consumer(ConsumerState::Active);
        assert_eq!(consumer_health(&healthy, &t), vec![Health::Ok]);

        let mut sick = healthy.clone();
        sick.lag = Some(10_001);
        sick.heartbeat_age_secs = Some(20.5);
        sick.dead_letters = 2;
        sick.retrying = Some(RetryingEvent {
            event_id: "e".into(),
            sequence: 6,
            attempts: 7,
            next_attempt_at: None,
            first_failed_at: Utc::now(),
            failing_for_secs: 15.0 * 60.0 + 1.0,
            last_failure_class: None,
        });
        assert_eq!(
            consumer_health(&sick, &t),
            vec![
                Health::Lagging,
                Health::StuckRetrying,
                Health::StaleHeartbeat,
                Health::DeadLetters
            ]
        );

        // At the thresholds exactly: still fine.
        let mut edge = healthy.clone();
        edge.lag = Some(10_000);
        edge.heartbeat_age_secs = Some(20.0);
        assert_eq!(consumer_health(&edge, &t), vec![Health::Ok]);

        // A released lease has no heartbeat to be stale; a missing cursor has no lag.
        let mut released = healthy.clone();
        released.lease_owner = None;
        released.lease_live = false;
        released.heartbeat_age_secs = Some(3600.0);
        released.lag = None;
        assert_eq!(consumer_health(&released, &t), vec![Health::Ok]);

        // Nobody runs it while events wait: not running. An expired lease is no longer a
        // stale heartbeat, it is not running.
        let mut stopped = released.clone();
        stopped.head_sequence = 8;
        stopped.lag = Some(3);
        assert_eq!(consumer_health(&stopped, &t), vec![Health::NotRunning]);
        let mut expired = stopped.clone();
        expired.lease_owner = Some("host:1:ab".into());
        assert_eq!(consumer_health(&expired, &t), vec![Health::NotRunning]);
        let mut recent = stopped.clone();
        recent.heartbeat_age_secs = Some(5.0);
        assert_eq!(consumer_health(&recent, &t), vec![Health::Ok]);

        // Never acknowledged anything (or no cursor at all), and holding events back.
        let mut typo = stopped.clone();
        typo.last_acked_at = None;
        assert_eq!(
            consumer_health(&typo, &t),
            vec![Health::NotRunning, Health::NeverAcknowledged]
        );
        typo.cursor = None;
        typo.lag = None;
        assert_eq!(
            consumer_health(&typo, &t),
            vec![Health::NotRunning, Health::NeverAcknowledged]
        );
        // A brand-new consumer gets its heartbeat's grace first.
        typo.created_age_secs = 1.0;
        assert_eq!(consumer_health(&typo, &t), vec![Health::NotRunning]);
        // Nothing waiting: nothing held back.
        let mut idle = typo.clone();
        idle.cursor = Some(8);
        assert_eq!(consumer_health(&idle, &t), vec![Health::Ok]);

        // Retired consumers hold nothing back.
        let mut retired = sick.clone();
        retired.state = ConsumerState::Retired;
        assert_eq!(consumer_health(&retired, &t), vec![Health::Ok]);
    }

    #[test]
    fn health_of_a_project() {
        let t = HealthThresholds::default();
        let mut project = ProjectStatus {
            project_id: "p".into(),
            head_sequence: 3,
            pruned_through: 0,
            unsequenced: 0,
            oldest_unsequenced_at: None,
            oldest_unsequenced_age_secs: None,
            prunable: 0,
            prunable_capped: false,
            oldest_retained_at: None,
            oldest_retained_age_secs: None,
            held_by: None,
            oldest_held_age_secs: None,
            health: Vec::new(),
        };
        assert_eq!(project_health(&project, &t), vec![Health::Ok]);
        project.unsequenced = 4;
        project.oldest_unsequenced_age_secs = Some(59.0);
        assert_eq!(project_health(&project, &t), vec![Health::Ok]);
        project.oldest_unsequenced_age_secs = Some(61.0);
        assert_eq!(project_health(&project, &t), vec![Health::SequencerStalled]);

        // A backlog is judged by count; an old retained event alone is not `retention_held`
        // (it may just be prunable): only the oldest event a sweep would keep counts.
        let day = 86_400.0;
        project.oldest_unsequenced_age_secs = None;
        project.prunable = 100_000;
        project.oldest_retained_age_secs = Some(90.0 * day);
        assert_eq!(project_health(&project, &t), vec![Health::Ok]);
        project.prunable = 100_001;
        project.prunable_capped = true;
        assert_eq!(project_health(&project, &t), vec![Health::PruningBacklog]);
        project.oldest_held_age_secs = Some(31.0 * day);
        assert_eq!(project_health(&project, &t), vec![Health::PruningBacklog]);
        project.oldest_held_age_secs = Some(31.0 * day + 1.0);
        assert_eq!(
            project_health(&project, &t),
            vec![Health::PruningBacklog, Health::RetentionHeld]
        );
        let tight = HealthThresholds {
            max_retention_overrun: Duration::ZERO,
            retention: Duration::from_secs(86_400),
            ..HealthThresholds::default()
        };
        project.prunable = 0;
        project.oldest_held_age_secs = Some(day + 1.0);
        assert_eq!(
            project_health(&project, &tight),
            vec![Health::RetentionHeld]
        );
        assert_eq!(Health::RetentionHeld.as_str(), "retention_held");
        let admin = Admin::new(&Schema::default());
        admin.status_pruner(&t).unwrap();
        let too_long = HealthThresholds {
            retention: MAX_RETENTION + Duration::from_secs(1),
            ..HealthThresholds::default()
        };
        assert!(matches!(
            admin.status_pruner(&too_long),
            Err(AdminError::Invalid(InputError::Threshold(_)))
        ));
        let negative = HealthThresholds {
            max_prunable: -1,
            ..HealthThresholds::default()
        };
        assert!(admin.status_pruner(&negative).is_err());
        assert_eq!(
            serde_json::to_value(Health::PruningBacklog).unwrap(),
            "pruning_backlog"
        );
    }
}
