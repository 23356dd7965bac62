//! The sweep: [`Pruner`] applies the plan batch by batch, each batch its own short
//! transaction under the schema's `prune` advisory lock; [`Sweep`] is one sweep in progress.

use crate::stmt::Unnamed as _;
use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;
use tokio_postgres::{Client, IsolationLevel, Transaction};

use super::plan::{
    BATCH_IDLE_TIMEOUT, BATCH_LOCK_TIMEOUT, HoldBack, Plan, ProjectState, PruneOptions,
    PruneOptionsError, bound,
};
use super::sql;
use crate::admin::{AuditLog, AuditRecord};
use crate::error::Error;
use crate::ids::ProjectId;
use crate::schema::Schema;
use crate::states::AuditKind;

/// What a sweep did (or, in a dry run, would do) to one project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProjectPrune {
    /// The project.
    pub project_id: String,
    /// Its head when last looked at.
    pub head: i64,
    /// The retention floor before the sweep.
    pub floor_before: i64,
    /// The retention floor after the sweep (would-be floor in a dry run).
    pub floor: i64,
    /// Events removed (would be removed).
    pub events_pruned: u64,
    /// Delivery rows removed (would be removed): settled dead letters past retention and the
    /// rows of retired consumers.
    pub dead_letters_pruned: u64,
    /// Why the floor stops below the head; `None` when it reached the head (or the sweep
    /// stopped before deciding).
    pub held_by: Option<HoldBack>,
}

/// What a sweep did. See [`Pruner`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Nothing was deleted; the figures say what would have been.
    pub dry_run: bool,
    /// The retention period, in seconds.
    pub retention_secs: u64,
    /// Events (or delivery rows) per batch.
    pub batch_size: i64,
    /// Every selected project was swept to the end (false when the sweep was stopped early).
    pub complete: bool,
    /// Events removed in all projects.
    pub events_pruned: u64,
    /// Delivery rows removed in all projects.
    pub dead_letters_pruned: u64,
    /// Per project, in project order; a project the sweep stopped inside is included.
    pub projects: Vec<ProjectPrune>,
}

/// Where a running sweep is, for progress displays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepProgress {
    /// Projects finished.
    pub projects_done: usize,
    /// Projects selected (0 until listed).
    pub projects_total: usize,
    /// The project being swept, with its current floor and head.
    pub current: Option<(String, i64, i64)>,
    /// Events removed so far.
    pub events_pruned: u64,
    /// Delivery rows removed so far.
    pub dead_letters_pruned: u64,
}

/// Rendered statements of one schema.
#[derive(Debug, Clone)]
struct Statements {
    bound_batch: String,
    lock: String,
    projects: String,
    project_state: String,
    first_held: String,
    delete_events: String,
    count_events: String,
    advance_floor: String,
    delete_deliveries: String,
    count_deliveries: String,
    any_deliveries: String,
    audit: AuditLog,
    audit_add: String,
}

/// Runs retention sweeps of one schema. Cheap to clone.
///
/// ```no_run
/// use outbox_core::{PruneOptions, Pruner, Schema};
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
    options: PruneOptions,
    /// The `prune` advisory lock of the schema.
    lock_key: i64,
    /// The retention period in seconds, as bound to `make_interval`.
    retention_secs: f64,
    /// The statements for the schema.
    sql: Statements,
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

    /// A sweep to drive batch by batch with [`Sweep::step`] (to show progress, to stop between
    /// batches, or to take a pooled connection per batch).
    pub fn sweep(&self) -> Sweep<'_> {
        Sweep {
            pruner: self,
            pending: None,
            projects_total: 0,
            current: None,
            done: Vec::new(),
            finished: false,
        }
    }

    /// Runs a whole sweep on `client`.
    pub async fn run(&self, client: &mut Client) -> Result<PruneReport, Error> {
        let mut sweep = self.sweep();
        while sweep.step(client).await? {}
        Ok(sweep.into_report())
    }

    /// Opens a batch transaction with its idle and lock timeouts set.
    async fn begin<'c>(&self, client: &'c mut Client) -> Result<Transaction<'c>, Error> {
        let tx = client.transaction().await?;
        let idle = BATCH_IDLE_TIMEOUT.as_millis().to_string();
        let wait = BATCH_LOCK_TIMEOUT.as_millis().to_string();
        tx.query_one_unnamed(&self.sql.bound_batch, &[&idle, &wait])
            .await?;
        Ok(tx)
    }

    /// Takes the sweep lock for the rest of `tx`, waiting for another sweep's batch.
    async fn lock(&self, tx: &Transaction<'_>) -> Result<(), Error> {
        tx.query_one_unnamed(&self.sql.lock, &[&self.lock_key])
            .await?;
        Ok(())
    }

    async fn project_state(
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
    async fn plan(
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

/// The project a sweep is inside.
#[derive(Debug)]
struct Current {
    /// The report entry being filled.
    entry: ProjectPrune,
    /// Whether the floor and head were read yet.
    started: bool,
    /// Events done; delivery rows next.
    events_done: bool,
    /// This sweep's audit row of the project's events.
    events_audit: Option<i64>,
    /// This sweep's audit rows of delivery rows, per consumer.
    delivery_audits: BTreeMap<String, i64>,
}

impl Current {
    fn new(project_id: String) -> Self {
        Self {
            entry: ProjectPrune {
                project_id,
                head: 0,
                floor_before: 0,
                floor: 0,
                events_pruned: 0,
                dead_letters_pruned: 0,
                held_by: None,
            },
            started: false,
            events_done: false,
            events_audit: None,
            delivery_audits: BTreeMap::new(),
        }
    }
}

/// How a batch ended.
enum Batch {
    /// Run another batch of the same kind.
    Continue,
    /// This kind of work is done for the project.
    Done,
}

/// One sweep in progress, driven by [`Sweep::step`]. Each step is one short transaction.
/// After a failed step (a database error) the sweep can be stepped again: the failed batch
/// was rolled back and is simply retried.
#[derive(Debug)]
pub struct Sweep<'a> {
    /// Rules and statements.
    pruner: &'a Pruner,
    /// Projects not yet started; `None` until listed.
    pending: Option<VecDeque<String>>,
    /// How many projects were selected.
    projects_total: usize,
    /// The project in progress.
    current: Option<Current>,
    /// Finished projects.
    done: Vec<ProjectPrune>,
    /// Nothing left to do.
    finished: bool,
}

impl Sweep<'_> {
    /// Runs the next batch; true while work remains.
    pub async fn step(&mut self, client: &mut Client) -> Result<bool, Error> {
        if self.finished {
            return Ok(false);
        }
        let Some(pending) = &mut self.pending else {
            let only = self.pruner.options.project.as_ref().map(ProjectId::as_str);
            let rows = client
                .query_unnamed(&self.pruner.sql.projects, &[&only])
                .await?;
            let projects = rows
                .iter()
                .map(|row| row.try_get("project_id"))
                .collect::<Result<VecDeque<String>, _>>()?;
            self.projects_total = projects.len();
            self.pending = Some(projects);
            return Ok(true);
        };
        if self.current.is_none() {
            match pending.pop_front() {
                Some(project) => self.current = Some(Current::new(project)),
                None => {
                    self.finished = true;
                    return Ok(false);
                }
            }
        }
        let pruner = self.pruner;
        let current = self.current.as_mut().expect("a current project");
        let outcome = if pruner.options.dry_run {
            dry_run_project(pruner, client, current).await?;
            Batch::Done
        } else if !current.events_done {
            match events_batch(pruner, client, current).await? {
                Batch::Done => {
                    current.events_done = true;
                    Batch::Continue
                }
                other => other,
            }
        } else {
            deliveries_batch(pruner, client, current).await?
        };
        match outcome {
            Batch::Continue => {}
            Batch::Done => {
                let current = self.current.take().expect("a current project");
                log_project(&current.entry, pruner.options.dry_run);
                self.done.push(current.entry);
            }
        }
        Ok(true)
    }

    /// Where the sweep is.
    pub fn progress(&self) -> SweepProgress {
        let current = self.current.as_ref().map(|c| &c.entry);
        let all = || self.done.iter().chain(current);
        SweepProgress {
            projects_done: self.done.len(),
            projects_total: self.projects_total,
            current: current.map(|e| (e.project_id.clone(), e.floor, e.head)),
            events_pruned: all().map(|e| e.events_pruned).sum(),
            dead_letters_pruned: all().map(|e| e.dead_letters_pruned).sum(),
        }
    }

    /// The report: complete when every step has run (`step` returned false), partial when
    /// the sweep is stopped earlier.
    pub fn into_report(self) -> PruneReport {
        let complete = self.finished;
        let mut projects = self.done;
        if let Some(current) = self.current.filter(|c| c.started) {
            projects.push(current.entry);
        }
        let options = &self.pruner.options;
        PruneReport {
            dry_run: options.dry_run,
            retention_secs: options.retention.as_secs(),
            batch_size: options.batch_size,
            complete,
            events_pruned: projects.iter().map(|p| p.events_pruned).sum(),
            dead_letters_pruned: projects.iter().map(|p| p.dead_letters_pruned).sum(),
            projects,
        }
    }
}

fn log_project(entry: &ProjectPrune, dry_run: bool) {
    if entry.events_pruned > 0 || entry.dead_letters_pruned > 0 {
        tracing::info!(
            project = %entry.project_id,
            events = entry.events_pruned,
            dead_letters = entry.dead_letters_pruned,
            floor = entry.floor,
            dry_run,
            "pruned"
        );
    } else if let Some(hold) = &entry.held_by {
        tracing::debug!(project = %entry.project_id, floor = entry.floor, held_by = %hold,
                        "nothing to prune");
    }
}

/// One batch of events: delete `(floor, target]` and advance the floor, in one transaction.
async fn events_batch(
    pruner: &Pruner,
    client: &mut Client,
    current: &mut Current,
) -> Result<Batch, Error> {
    let project = current.entry.project_id.clone();
    let tx = pruner.begin(client).await?;
    if !current.started {
        // Look before taking the lock: a project with nothing to prune never contends, so
        // sweeps running side by side only meet where there is work (and then one does it).
        let Some(state) = pruner.project_state(&tx, &project).await? else {
            tx.rollback().await?;
            return Ok(Batch::Done);
        };
        current.started = true;
        current.entry.floor_before = state.floor;
        current.entry.floor = state.floor;
        current.entry.head = state.head;
        let plan = pruner.plan(&tx, &project, &state, state.floor).await?;
        if plan.target <= state.floor {
            tx.commit().await?;
            current.entry.held_by = plan.hold;
            return Ok(Batch::Done);
        }
    }
    pruner.lock(&tx).await?;
    // Read again under the lock (a new statement, so a fresh snapshot): another sweep may
    // have moved the floor since.
    let Some(state) = pruner.project_state(&tx, &project).await? else {
        tx.rollback().await?;
        return Ok(Batch::Done);
    };
    current.entry.head = state.head;
    let floor = state.floor;
    let plan = pruner.plan(&tx, &project, &state, floor).await?;
    let mut deleted = 0;
    let mut audit = current.events_audit;
    if plan.target > floor {
        deleted = tx
            .execute_unnamed(&pruner.sql.delete_events, &[&project, &floor, &plan.target])
            .await?;
        let advanced = tx
            .execute_unnamed(&pruner.sql.advance_floor, &[&project, &floor, &plan.target])
            .await?;
        if advanced != 1 {
            // The floor moved although this batch holds the lock: someone changed it by hand.
            // Undo; the next batch starts from wherever it is now.
            tx.rollback().await?;
            tracing::warn!(project = %project, floor, "the retention floor moved outside a sweep");
            return Ok(Batch::Continue);
        }
        if deleted != (plan.target - floor) as u64 {
            tracing::warn!(
                project = %project, floor, target = plan.target, deleted,
                "pruned fewer events than the range holds: rows were missing"
            );
        }
        audit = Some(add_audit(pruner, &tx, &project, None, audit, deleted as i64).await?);
    }
    tx.commit().await?;
    current.events_audit = audit;
    current.entry.events_pruned += deleted;
    current.entry.floor = plan.target;
    current.entry.held_by = plan.hold;
    Ok(if plan.more {
        Batch::Continue
    } else {
        Batch::Done
    })
}

/// One batch of delivery rows.
async fn deliveries_batch(
    pruner: &Pruner,
    client: &mut Client,
    current: &mut Current,
) -> Result<Batch, Error> {
    let project = current.entry.project_id.clone();
    let tx = pruner.begin(client).await?;
    let any: bool = tx
        .query_one_unnamed(
            &pruner.sql.any_deliveries,
            &[&project, &pruner.retention_secs],
        )
        .await?
        .try_get("any_prunable")?;
    if !any {
        tx.commit().await?;
        return Ok(Batch::Done);
    }
    pruner.lock(&tx).await?;
    let rows = tx
        .query_unnamed(
            &pruner.sql.delete_deliveries,
            &[&project, &pruner.retention_secs, &pruner.options.batch_size],
        )
        .await?;
    let mut per_consumer: BTreeMap<String, i64> = BTreeMap::new();
    for row in &rows {
        *per_consumer.entry(row.try_get("consumer_id")?).or_default() += 1;
    }
    let mut audits = Vec::with_capacity(per_consumer.len());
    for (consumer, count) in per_consumer {
        let existing = current.delivery_audits.get(&consumer).copied();
        let id = add_audit(pruner, &tx, &project, Some(&consumer), existing, count).await?;
        audits.push((consumer, id));
    }
    tx.commit().await?;
    current.delivery_audits.extend(audits);
    current.entry.dead_letters_pruned += rows.len() as u64;
    Ok(if rows.len() as i64 >= pruner.options.batch_size {
        Batch::Continue
    } else {
        Batch::Done
    })
}

/// Opens this sweep's audit row (or adds to it); returns its ID.
async fn add_audit(
    pruner: &Pruner,
    tx: &Transaction<'_>,
    project: &str,
    consumer: Option<&str>,
    existing: Option<i64>,
    count: i64,
) -> Result<i64, Error> {
    match existing {
        Some(id) => {
            tx.execute_unnamed(&pruner.sql.audit_add, &[&id, &count])
                .await?;
            Ok(id)
        }
        None => Ok(pruner
            .sql
            .audit
            .record(
                tx,
                &AuditRecord {
                    reason: None,
                    kind: AuditKind::Pruned,
                    project_id: project,
                    consumer_id: consumer,
                    event_id: None,
                    actor: Some(&pruner.options.actor),
                    count: Some(count),
                },
            )
            .await?),
    }
}

/// A dry run of one project, in one read-only snapshot: the same decisions batch by batch,
/// with the floor moved in memory only.
async fn dry_run_project(
    pruner: &Pruner,
    client: &mut Client,
    current: &mut Current,
) -> Result<(), Error> {
    let project = current.entry.project_id.clone();
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let Some(state) = pruner.project_state(&tx, &project).await? else {
        tx.rollback().await?;
        return Ok(());
    };
    current.started = true;
    current.entry.head = state.head;
    current.entry.floor_before = state.floor;
    let mut floor = state.floor;
    let mut hold;
    loop {
        let plan = pruner.plan(&tx, &project, &state, floor).await?;
        floor = plan.target;
        hold = plan.hold;
        if !plan.more {
            break;
        }
    }
    let events: i64 = tx
        .query_one_unnamed(&pruner.sql.count_events, &[&project, &state.floor, &floor])
        .await?
        .try_get("events")?;
    let deliveries: i64 = tx
        .query_unnamed(
            &pruner.sql.count_deliveries,
            &[&project, &pruner.retention_secs],
        )
        .await?
        .iter()
        .map(|row| row.try_get::<_, i64>("deliveries"))
        .sum::<Result<i64, _>>()?;
    tx.commit().await?;
    current.entry.floor = floor;
    current.entry.held_by = hold;
    current.entry.events_pruned = events as u64;
    current.entry.dead_letters_pruned = deliveries as u64;
    Ok(())
}
