//! `status`: per project the head, unsequenced backlog, retention floor and pruning backlog;
//! per consumer the cursor, lag, lease and failures; each judged into bounded
//! [`Health`](crate::states::Health) codes by pure functions of the figures and the
//! [`HealthThresholds`].
//!
//! The rules live in `health`, the per-project and per-consumer results in `report`; this
//! module holds the query that gathers the figures and its SQL.

mod health;
mod report;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::{Client, Row, Transaction};

use super::{Admin, AdminError, InputError, Target};
use crate::ids::ProjectId;
use crate::retention::{MAX_RETENTION, PruneOptions, PruneOptionsError, Pruner};
use crate::schema::Schema;
use crate::stmt::Unnamed as _;

pub use health::{HealthThresholds, consumer_health, project_health};
pub use report::{ConsumerStatus, ProjectStatus};

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
            ..Self::default()
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
/// The backlog is counted from the sequencer frontier's work (migration 0010), read in the
/// order only the frontier index yields without a sort, with the project matched outside that
/// subquery (`OFFSET 0` keeps the filter from being pushed into it). Statistics taken during a
/// backlog make `sequence IS NULL` look common; with both conditions on the table, the planner
/// then reads the whole table, or a filtered project's whole history through the
/// `(project_id, event_id)` key, even when nothing waits.
const PROJECTS: &str = "
WITH unsequenced AS (
    SELECT project_id, count(*) AS pending, min(occurred_at) AS oldest
    FROM (SELECT project_id, occurred_at FROM {{schema}}.lifecycle_outbox_unsequenced
          OFFSET 0) AS work
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
    use std::time::Duration;

    #[test]
    fn status_pruner_refuses_bad_thresholds() {
        let t = HealthThresholds::default();
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
    }
}
