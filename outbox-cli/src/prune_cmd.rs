//! `outbox prune`: one retention sweep, batch by batch, with what it removed (or would remove).

use std::time::Duration;

use clap::Args;
use outbox_core::ProjectId;
use outbox_core::retention::{PruneOptions, PruneReport, Pruner, SweepProgress};

use crate::cli::{Global, Output, parse_retention};
use crate::failure::Failure;
use crate::output::{Render, Table, print};
use crate::progress::Progress;

/// `outbox prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Report what would be removed without removing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Events (or dead letters) removed per transaction: 1 to 100000.
    #[arg(long, default_value_t = outbox_core::retention::DEFAULT_PRUNE_BATCH, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(1..=outbox_core::retention::MAX_PRUNE_BATCH))]
    pub batch_size: i64,
    /// Only this project (default: every project).
    #[arg(long)]
    pub project: Option<ProjectId>,
    /// Retention period: events older than this that every non-retired consumer acknowledged
    /// go, and dead letters resolved (or replayed) longer ago than this: 0s (everything
    /// acknowledged) to 36500 days.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_retention, default_value = "30d")]
    pub retention: Duration,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn run(global: &Global, args: PruneArgs) -> Result<(), Failure> {
    let options = PruneOptions {
        retention: args.retention,
        batch_size: args.batch_size,
        project: args.project.clone(),
        dry_run: args.dry_run,
        actor: "outbox-prune".to_owned(),
    };
    let pruner = Pruner::new(&global.schema, options).map_err(|e| Failure::usage(e.to_string()))?;
    let mut client = global.database()?.connect().await?;
    if let Some(project) = &args.project {
        outbox_core::admin::Admin::new(&global.schema)
            .require_project(&client, project)
            .await?;
    }
    let mut progress = Progress::new(args.output);
    let mut sweep = pruner.sweep();
    let result = loop {
        match sweep.step(&mut client).await {
            Ok(true) => show(&mut progress, &sweep.progress(), args.dry_run),
            Ok(false) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    progress.clear();
    let report = sweep.into_report();
    if let Err(e) = result {
        // Say what was done before the failure: those batches are committed.
        if report.events_pruned > 0 || report.dead_letters_pruned > 0 {
            eprintln!(
                "pruned {} event(s) and {} dead letter(s) before the failure",
                report.events_pruned, report.dead_letters_pruned
            );
        }
        return Err(e.into());
    }
    print(
        args.output,
        &Pruned {
            report,
            project: args.project.as_ref(),
        },
    )
}

/// A sweep's report, with the project it was limited to (for the "nothing to prune" line).
struct Pruned<'a> {
    /// What the sweep did.
    report: PruneReport,
    /// `--project`, if given.
    project: Option<&'a ProjectId>,
}

impl Render for Pruned<'_> {
    fn table(&self) -> String {
        render(&self.report, self.project)
    }

    fn json(&self) -> impl serde::Serialize + '_ {
        &self.report
    }
}

/// The report as an aligned table and a summary line.
fn render(report: &PruneReport, project: Option<&ProjectId>) -> String {
    let verb = if report.dry_run {
        "would prune"
    } else {
        "pruned"
    };
    let mut out = String::new();
    if report.projects.is_empty() {
        match project {
            Some(p) => out.push_str(&format!(
                "project {p} has no sequenced events: nothing to prune\n"
            )),
            None => out.push_str("no project has sequenced events: nothing to prune\n"),
        }
        return out;
    }
    let mut table = Table::new(&[
        "PROJECT",
        "HEAD",
        "FLOOR",
        "NEW_FLOOR",
        "EVENTS",
        "DEAD_LETTERS",
        "HELD_BY",
    ]);
    for p in &report.projects {
        table.row(vec![
            p.project_id.clone(),
            p.head.to_string(),
            p.floor_before.to_string(),
            p.floor.to_string(),
            p.events_pruned.to_string(),
            p.dead_letters_pruned.to_string(),
            p.held_by
                .as_ref()
                .map_or_else(|| "-".to_owned(), ToString::to_string),
        ]);
    }
    out.push_str(&table.render());
    out.push_str(&format!(
        "{}{verb} {} event(s) and {} dead letter(s) in {} project(s) (retention {}, batches of {})\n",
        if report.dry_run { "dry run: " } else { "" },
        report.events_pruned,
        report.dead_letters_pruned,
        report.projects.len(),
        crate::output::duration(Duration::from_secs(report.retention_secs)),
        report.batch_size,
    ));
    out
}

/// The progress line of a sweep: where it is and what it removed so far, with the rate.
fn show(progress: &mut Progress, sweep: &SweepProgress, dry_run: bool) {
    progress.draw(|line| {
        let place = match &sweep.current {
            Some((project, floor, head)) => format!(" {project}: floor {floor} of head {head};"),
            None => String::new(),
        };
        format!(
            "{}project {}/{}{place} {} event(s) ({}), {} dead letter(s)",
            if dry_run { "dry run: " } else { "pruning: " },
            (sweep.projects_done + 1).min(sweep.projects_total.max(1)),
            sweep.projects_total,
            sweep.events_pruned,
            line.rate(sweep.events_pruned),
            sweep.dead_letters_pruned,
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_accepts_zero_and_refuses_garbage() {
        assert_eq!(parse_retention("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_retention("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert!(parse_retention("soon").is_err());
        assert!(parse_retention("36501days").is_err());
    }
}
