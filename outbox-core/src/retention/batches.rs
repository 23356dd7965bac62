//! The batches of a sweep: one project's events, its delivery rows, or a dry run of it, each
//! one short transaction, filling the project's [`ProjectPrune`].

use std::collections::BTreeMap;

use tokio_postgres::{Client, Transaction};

use super::pruner::Pruner;
use super::report::ProjectPrune;
use crate::audit_log::AuditRecord;
use crate::error::Error;
use crate::snapshot::read_only_snapshot;
use crate::states::AuditKind;
use crate::stmt::Unnamed as _;

/// The project a sweep is inside.
#[derive(Debug)]
pub(super) struct Current {
    /// The report entry being filled.
    pub(super) entry: ProjectPrune,
    /// Whether the floor and head were read yet.
    pub(super) started: bool,
    /// Events done; delivery rows next.
    pub(super) events_done: bool,
    /// This sweep's audit row of the project's events.
    pub(super) events_audit: Option<i64>,
    /// This sweep's audit rows of delivery rows, per consumer.
    pub(super) delivery_audits: BTreeMap<String, i64>,
}

impl Current {
    pub(super) fn new(project_id: String) -> Self {
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
pub(super) enum Batch {
    /// Run another batch of the same kind.
    Continue,
    /// This kind of work is done for the project.
    Done,
}

/// Logs what a sweep did for one project, or, in a dry run, what it would have done.
pub(super) fn log_project(entry: &ProjectPrune, dry_run: bool) {
    if entry.events_pruned > 0 || entry.dead_letters_pruned > 0 {
        let (project, events, dead_letters, floor) = (
            &entry.project_id,
            entry.events_pruned,
            entry.dead_letters_pruned,
            entry.floor,
        );
        match dry_run {
            true => tracing::info!(%project, events, dead_letters, floor, "would prune"),
            false => tracing::info!(%project, events, dead_letters, floor, "pruned"),
        }
    } else if let Some(hold) = &entry.held_by {
        tracing::debug!(project = %entry.project_id, floor = entry.floor, held_by = %hold,
                        "nothing to prune");
    }
}

/// One batch of events: delete `(floor, target]` and advance the floor, in one transaction.
pub(super) async fn events_batch(
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
pub(super) async fn deliveries_batch(
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
            .record_returning_id(
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
pub(super) async fn dry_run_project(
    pruner: &Pruner,
    client: &mut Client,
    current: &mut Current,
) -> Result<(), Error> {
    let project = current.entry.project_id.clone();
    let tx = read_only_snapshot(client).await?;
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
