//! The sweep: [`Pruner`] applies the plan batch by batch, each batch its own short
//! transaction under the schema's `prune` advisory lock; [`Sweep`] is one sweep in progress.

use std::collections::VecDeque;

use tokio_postgres::Client;

use super::batches::{
    Batch, Current, deliveries_batch, dry_run_project, events_batch, log_project,
};
use crate::error::Error;
use crate::ids::ProjectId;
use crate::stmt::Unnamed as _;

pub use super::pruner::Pruner;
pub use super::report::{ProjectPrune, PruneReport, SweepProgress};

impl Pruner {
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
