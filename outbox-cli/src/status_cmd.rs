//! `outbox status`: every project's stream and every consumer's position, with health codes.

use std::time::Duration;

use clap::Args;
use outbox_core::ProjectId;
use outbox_core::admin::{Admin, HealthThresholds, Status};

use crate::cli::{Global, Output, parse_duration, parse_retention};
use crate::failure::{ExitCode, Failure};
use crate::output::{Render, Table, age, opt, print, time};

/// `outbox status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Only this project (exit 3 if it has no events and no consumers).
    #[arg(long)]
    pub project: Option<ProjectId>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Act as a monitoring probe: print as usual, then exit 5 if any health code is not `ok`
    /// (naming each on stderr), 0 if all are.
    #[arg(long)]
    pub check: bool,
    /// A consumer more than this many events behind the head is `lagging` (0 or more).
    #[arg(long, default_value_t = 10_000, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(0..))]
    pub max_lag: i64,
    /// An event failing (and holding its consumer's cursor) for longer is `stuck_retrying`.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "15m")]
    pub max_retrying_age: Duration,
    /// A live lease whose last heartbeat is older is `stale_heartbeat`; once the lease has
    /// expired (or with none), a heartbeat this old while events wait is `not_running`, and
    /// while requested replays wait `replay_unserved`; a consumer registered longer ago than
    /// this that never acknowledged anything is `never_acknowledged` (default: twice the
    /// default heartbeat interval).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "20s")]
    pub max_heartbeat_age: Duration,
    /// Committed events unsequenced for longer mean `sequencer_stalled` (no consumer or
    /// `outbox sequence` is numbering events).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "60s")]
    pub max_unsequenced_age: Duration,
    /// More events than this that a retention sweep would prune now mean `pruning_backlog`
    /// (no consumer runs the sweep for the project and no `outbox prune` is scheduled).
    /// Prunable events are counted up to this number + 1 only (shown as `N+`), so status
    /// stays cheap on a large table; a larger value makes it read more. 0 to 100000000.
    #[arg(long, default_value_t = 100_000, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(0..=100_000_000))]
    pub max_prunable: i64,
    /// Retention period the prunable count and `retention_held` are judged by: use the one
    /// the sweeps run with (`outbox prune --retention`, `outbox consume --retention`): 0s to
    /// 36500 days.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_retention, default_value = "30d")]
    pub retention: Duration,
    /// The oldest event a sweep would keep being older than the retention period plus this
    /// means `retention_held` (a lagging consumer, a missing cursor or an unresolved dead
    /// letter holds the floor back; HELD_BY names it): 0s to 36500 days.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_retention, default_value = "1d")]
    pub max_retention_overrun: Duration,
}

/// The health thresholds `args` give.
pub(crate) fn thresholds(args: &StatusArgs) -> HealthThresholds {
    HealthThresholds {
        max_lag: args.max_lag,
        max_retrying_age: args.max_retrying_age,
        max_heartbeat_age: args.max_heartbeat_age,
        max_unsequenced_age: args.max_unsequenced_age,
        max_prunable: args.max_prunable,
        retention: args.retention,
        max_retention_overrun: args.max_retention_overrun,
    }
}

pub async fn run(global: &Global, args: StatusArgs) -> Result<(), Failure> {
    let mut client = global.database()?.connect().await?;
    let thresholds = thresholds(&args);
    let status = Admin::new(&global.schema)
        .status(&mut client, args.project.as_ref(), &thresholds)
        .await?;
    print(args.output, &status)?;
    if !args.check {
        return Ok(());
    }
    let problems = problems(&status);
    if problems.is_empty() {
        return Ok(());
    }
    Err(Failure {
        code: ExitCode::Unhealthy,
        message: format!("unhealthy: {}", problems.join("; ")),
    })
}

/// Every health code that is not `ok`, with what it is about.
fn problems(status: &Status) -> Vec<String> {
    let unhealthy = |health: &[outbox_core::states::Health]| {
        health
            .iter()
            .any(|h| *h != outbox_core::states::Health::Ok)
            .then(|| codes(health))
    };
    let projects = status.projects.iter().filter_map(|p| {
        unhealthy(&p.health).map(|codes| format!("project {}: {codes}", p.project_id))
    });
    let consumers = status.consumers.iter().filter_map(|s| {
        unhealthy(&s.health).map(|codes| {
            format!(
                "consumer {} of project {}: {codes}",
                s.consumer.consumer_id, s.consumer.project_id
            )
        })
    });
    projects.chain(consumers).collect()
}

impl Render for Status {
    fn table(&self) -> String {
        render(self)
    }

    fn json(&self) -> impl serde::Serialize + '_ {
        self
    }
}

fn codes(health: &[outbox_core::states::Health]) -> String {
    health
        .iter()
        .map(|h| h.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn render(status: &Status) -> String {
    let mut projects = Table::new(&[
        "PROJECT",
        "HEAD",
        "UNSEQUENCED",
        "OLDEST_UNSEQUENCED",
        "PRUNED_THROUGH",
        "PRUNABLE",
        "OLDEST_RETAINED",
        "HELD_BY",
        "HEALTH",
    ]);
    for p in &status.projects {
        projects.row(vec![
            p.project_id.clone(),
            p.head_sequence.to_string(),
            p.unsequenced.to_string(),
            age(p.oldest_unsequenced_age_secs),
            p.pruned_through.to_string(),
            if p.prunable_capped {
                format!("{}+", p.prunable)
            } else {
                p.prunable.to_string()
            },
            age(p.oldest_retained_age_secs),
            opt(p.held_by.as_ref()),
            codes(&p.health),
        ]);
    }
    let mut consumers = Table::new(&[
        "PROJECT",
        "CONSUMER",
        "STATE",
        "CURSOR",
        "LAG",
        "HANDLED_AHEAD",
        "LEASE_OWNER",
        "GEN",
        "LEASE_LEFT",
        "HEARTBEAT_AGE",
        "RETRYING",
        "ATTEMPTS",
        "NEXT_ATTEMPT",
        "DEAD_LETTERS",
        "HEALTH",
    ]);
    for s in &status.consumers {
        let c = &s.consumer;
        let lease_left = match (&c.lease_owner, c.lease_expires_at) {
            (None, _) => "-".to_owned(),
            (Some(_), Some(expires)) if c.lease_live => age(Some(
                (expires - status.as_of).num_milliseconds() as f64 / 1000.0,
            )),
            (Some(_), _) => "expired".to_owned(),
        };
        let retrying = c.retrying.as_ref();
        consumers.row(vec![
            c.project_id.clone(),
            c.consumer_id.clone(),
            c.state.to_string(),
            opt(c.cursor),
            opt(c.lag),
            opt(c.handled_ahead),
            opt(c.lease_owner.as_deref()),
            c.lease_generation.to_string(),
            lease_left,
            age(c.heartbeat_age_secs),
            opt(retrying.map(|r| format!("{} (seq {})", r.event_id, r.sequence))),
            opt(retrying.map(|r| r.attempts)),
            time(retrying.and_then(|r| r.next_attempt_at)),
            if c.replay_requested > 0 {
                format!("{} (+{} replaying)", c.dead_letters, c.replay_requested)
            } else {
                c.dead_letters.to_string()
            },
            codes(&s.health),
        ]);
    }
    format!("{}\n{}", projects.render(), consumers.render())
}
