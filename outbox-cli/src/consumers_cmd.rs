//! `outbox consumers list|retire`.

use clap::{Args, Subcommand};
use outbox_core::{Admin, ConsumerId, OperatorName, ProjectId, Reason};

use crate::cli::{Global, Output};
use crate::failure::Failure;
use crate::output::{Table, age, emit, json, opt, time};

/// `outbox consumers ...`.
#[derive(Debug, Subcommand)]
pub enum ConsumersCommand {
    /// List consumers: state, cursor, lag, lease, dead letters, retirement.
    List(ListArgs),
    /// Retire a consumer (audited): it stops holding back retention, its unresolved dead
    /// letters become prunable, a process holding its lease stops at its next fenced write,
    /// and it cannot start again without `outbox consume --reactivate`.
    Retire(RetireArgs),
}

/// `outbox consumers list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only consumers of this project.
    #[arg(long)]
    pub project: Option<ProjectId>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `outbox consumers retire`.
#[derive(Debug, Args)]
pub struct RetireArgs {
    /// The consumer's project.
    #[arg(long)]
    pub project: ProjectId,
    /// The consumer to retire.
    #[arg(long)]
    pub consumer_id: ConsumerId,
    /// Who retires it (recorded in the audit trail): A-Z a-z 0-9 . _ : @ -, at most 64.
    #[arg(long, value_name = "OPERATOR")]
    pub by: OperatorName,
    /// Why (one line, at most 200 characters; kept on the consumer row, not in the audit).
    #[arg(long)]
    pub reason: Reason,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn run(global: &Global, command: ConsumersCommand) -> Result<(), Failure> {
    let mut client = global.database()?.connect().await?;
    let admin = Admin::new(&global.schema);
    match command {
        ConsumersCommand::List(args) => {
            let consumers = admin.consumers(&mut client, args.project.as_ref()).await?;
            if args.output == Output::Json {
                return json(&serde_json::json!({ "consumers": consumers }));
            }
            let mut table = Table::new(&[
                "PROJECT",
                "CONSUMER",
                "STATE",
                "CURSOR",
                "LAG",
                "LEASE_OWNER",
                "GEN",
                "HEARTBEAT_AGE",
                "DEAD",
                "REPLAY_REQUESTED",
                "CREATED",
                "RETIRED",
                "RETIRED_BY",
                "RETIRED_REASON",
            ]);
            for c in &consumers {
                table.row(vec![
                    c.project_id.clone(),
                    c.consumer_id.clone(),
                    c.state.to_string(),
                    opt(c.cursor),
                    opt(c.lag),
                    opt(c.lease_owner.as_deref().filter(|_| c.lease_live)),
                    c.lease_generation.to_string(),
                    age(c.heartbeat_age_secs),
                    c.dead_letters.to_string(),
                    c.replay_requested.to_string(),
                    time(Some(c.created_at)),
                    time(c.retired_at),
                    opt(c.retired_by.as_deref()),
                    opt(c.retired_reason.as_deref()),
                ]);
            }
            emit(&table.render())
        }
        ConsumersCommand::Retire(args) => {
            let retired = admin
                .retire(
                    &mut client,
                    &args.project,
                    &args.consumer_id,
                    &args.by,
                    &args.reason,
                )
                .await?;
            if args.output == Output::Json {
                return json(&retired);
            }
            let mut text = format!(
                "retired consumer {} of project {} (by {} at {})\n",
                retired.consumer_id,
                retired.project_id,
                retired.retired_by,
                time(Some(retired.retired_at))
            );
            if let Some(owner) = &retired.stopping_lease_owner {
                text.push_str(&format!(
                    "its lease holder {owner} (generation {}) stops at its next fenced write\n",
                    retired.lease_generation
                ));
            }
            if retired.unresolved_dead_letters > 0 {
                text.push_str(&format!(
                    "{} unresolved dead letter(s) may now be pruned by retention\n",
                    retired.unresolved_dead_letters
                ));
            }
            emit(&text)
        }
    }
}
