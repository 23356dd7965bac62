//! [`Pruner`]: the retention rule of one schema applied in the database: its statements, the
//! batch transaction and its lock, and the next batch's plan. [`Pruner::prunable`] is the same
//! rule read without deleting, for `status`.

use tokio_postgres::{Client, Transaction};

use super::plan::{
    BATCH_IDLE_TIMEOUT, BATCH_LOCK_TIMEOUT, HoldBack, Plan, ProjectState, PruneOptions,
    PruneOptionsError, bound,
};
use super::sql;
use crate::audit_log::AuditLog;
use crate::error::Error;
use crate::schema::Schema;
use crate::stmt::Unnamed as _;

/// Rendered statements of one schema.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    pub(super) bound_batch: String,
    pub(super) lock: String,
    pub(super) projects: String,
    pub(super) project_state: String,
    pub(super) first_held: String,
    pub(super) delete_events: String,
    pub(super) count_events: String,
    pub(super) advance_floor: String,
    pub(super) delete_deliveries: String,
    pub(super) count_deliveries: String,
    pub(super) any_deliveries: String,
    pub(super) audit: AuditLog,
    pub(super) audit_add: String,
}

/// Runs retention sweeps of one schema. Cheap to clone.
///
/// ```no_run
/// use outbox_core::Schema;
/// use outbox_core::retention::{PruneOptions, Pruner};
///
/// # async fn example(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let pruner = Pruner::new(&Schema::default(), PruneOptions::default())?;
/// let report = pruner.run(client).await?;
/// println!("pruned {} events", report.events_pruned);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Pruner {
    /// The validated options.
    pub(super) options: PruneOptions,
    /// The `prune` advisory lock of the schema.
    pub(super) lock_key: i64,
    /// The retention period in seconds, as bound to `make_interval`.
    pub(super) retention_secs: f64,
    /// The statements for the schema.
    pub(super) sql: Statements,
}

impl Pruner {
    /// A pruner for `schema`; refuses out-of-range options.
    pub fn new(schema: &Schema, options: PruneOptions) -> Result<Self, PruneOptionsError> {
        options.validate()?;
        let r = |template: &str| schema.render(template);
        Ok(Self {
            retention_secs: options.retention.as_secs_f64(),
            options,
            lock_key: schema.lock_key("prune"),
            sql: Statements {
                bound_batch: sql::BOUND_BATCH.to_owned(),
                lock: sql::LOCK.to_owned(),
                projects: r(sql::PROJECTS),
                project_state: r(sql::PROJECT_STATE),
                first_held: r(sql::FIRST_HELD),
                delete_events: r(sql::DELETE_EVENTS),
                count_events: r(sql::COUNT_EVENTS),
                advance_floor: r(sql::ADVANCE_FLOOR),
                delete_deliveries: r(sql::DELETE_DELIVERIES),
                count_deliveries: r(sql::COUNT_DELIVERIES),
                any_deliveries: r(sql::ANY_DELIVERIES),
                audit: AuditLog::new(schema),
                audit_add: r(sql::AUDIT_ADD),
            },
        })
    }

    /// The options.
    pub fn options(&self) -> &PruneOptions {
        &self.options
    }

    /// Opens a batch transaction with its idle and lock timeouts set.
    pub(super) async fn begin<'c>(&self, client: &'c mut Client) -> Result<Transaction<'c>, Error> {
        let tx = client.transaction().await?;
        let idle = BATCH_IDLE_TIMEOUT.as_millis().to_string();
        let wait = BATCH_LOCK_TIMEOUT.as_millis().to_string();
        tx.query_one_unnamed(&self.sql.bound_batch, &[&idle, &wait])
            .await?;
        Ok(tx)
    }

    /// Takes the sweep lock for the rest of `tx`, waiting for another sweep's batch.
    pub(super) async fn lock(&self, tx: &Transaction<'_>) -> Result<(), Error> {
        tx.query_one_unnamed(&self.sql.lock, &[&self.lock_key])
            .await?;
        Ok(())
    }

    pub(super) async fn project_state(
        &self,
        tx: &Transaction<'_>,
        project: &str,
    ) -> Result<Option<ProjectState>, tokio_postgres::Error> {
        let row = tx
            .query_opt_unnamed(&self.sql.project_state, &[&project])
            .await?;
        row.as_ref().map(ProjectState::decode).transpose()
    }

    /// Decides the next batch of `project` from `floor`: how far it may go and why not further.
    pub(super) async fn plan(
        &self,
        tx: &Transaction<'_>,
        project: &str,
        state: &ProjectState,
        floor: i64,
    ) -> Result<Plan, tokio_postgres::Error> {
        self.plan_within(tx, project, state, floor, self.options.batch_size)
            .await
    }

    /// [`Pruner::plan`] with the batch size given: the rule looks no further than `batch`
    /// events past `floor`.
    async fn plan_within(
        &self,
        tx: &Transaction<'_>,
        project: &str,
        state: &ProjectState,
        floor: i64,
        batch: i64,
    ) -> Result<Plan, tokio_postgres::Error> {
        let (upper, mut hold) = bound(floor, state, batch);
        let mut target = upper;
        if upper > floor {
            let held = tx
                .query_opt_unnamed(
                    &self.sql.first_held,
                    &[&project, &floor, &upper, &self.retention_secs],
                )
                .await?;
            if let Some(row) = held {
                let (sequence, first) = HoldBack::decode_first_held(&row)?;
                target = sequence - 1;
                hold = Some(first);
            }
        }
        // No rule stopped this batch and the head is further: only the batch size did.
        let more = hold.is_none() && target < state.head;
        if target >= state.head {
            hold = None;
        }
        Ok(Plan { target, hold, more })
    }
}

/// What a sweep would prune from one project now, as [`Pruner::prunable`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prunable {
    /// The project's head.
    pub(crate) head: i64,
    /// Its retention floor.
    pub(crate) floor: i64,
    /// The floor a sweep would reach (at most `floor + limit`).
    pub(crate) target: i64,
    /// Events in `(floor, target]`: what the sweep would delete.
    pub(crate) events: i64,
    /// The limit stopped the look-ahead, not the rule: the sweep would go further.
    pub(crate) capped: bool,
    /// What stops the sweep at `target` below the head; `None` when it reaches the head or
    /// when `capped`.
    pub(crate) hold: Option<HoldBack>,
}

impl Pruner {
    /// What a sweep would prune from `project` now, read in the caller's transaction (no lock,
    /// nothing deleted): the same rule as a sweep, applied to at most `limit` events past the
    /// floor, so the cost is bounded by `limit` index entries whatever the backlog. `None` when
    /// the project has no sequenced events (no heads row).
    pub(crate) async fn prunable(
        &self,
        tx: &Transaction<'_>,
        project: &str,
        limit: i64,
    ) -> Result<Option<Prunable>, tokio_postgres::Error> {
        let Some(state) = self.project_state(tx, project).await? else {
            return Ok(None);
        };
        let plan = self
            .plan_within(tx, project, &state, state.floor, limit.max(1))
            .await?;
        let events: i64 = if plan.target > state.floor {
            // At most `limit` rows: the range is bounded by the look-ahead.
            tx.query_one_unnamed(
                &self.sql.count_events,
                &[&project, &state.floor, &plan.target],
            )
            .await?
            .try_get("events")?
        } else {
            0
        };
        Ok(Some(Prunable {
            head: state.head,
            floor: state.floor,
            target: plan.target,
            events,
            capped: plan.more,
            hold: plan.hold,
        }))
    }
}
