//! `outbox consumers list|retire`.

use clap::{Args, Subcommand};
use outbox_core::{Admin, ConsumerInfo, ProjectId, Retirement};
use serde::Serialize;

use crate::args::{ConsumerRef, Operator};
use crate::cli::{Global, Output};
use crate::failure::Failure;
use crate::output::{Render, Table, age, opt, print, time};

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
    /// The consumer to retire.
    #[command(flatten)]
    pub consumer: ConsumerRef,
    /// Who retires it and why (the reason stays on the consumer row).
    #[command(flatten)]
    pub operator: Operator,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn run(global: &Global, command: ConsumersCommand) -> Result<(), Failure> {
    let mut client = global.database()?.connect().await?;
    let admin = Admin::new(&global.schema);
    match command {
        ConsumersCommand::List(args) => {
            if let Some(project) = &args.project {
                admin.require_project(&client, project).await?;
            }
            let consumers = admin.consumers(&mut client, args.project.as_ref()).await?;
            print(args.output, &ConsumerList(consumers))
        }
        ConsumersCommand::Retire(args) => {
            let retired = admin
                .retire(
                    &mut client,
                    &args.consumer.project,
                    &args.consumer.consumer_id,
                    &args.operator.by,
                    &args.operator.reason,
                )
                .await?;
            print(args.output, &retired)
        }
    }
}

/// `consumers list`: `{"consumers": [...]}`.
struct ConsumerList(Vec<ConsumerInfo>);

#[derive(Serialize)]
struct ConsumerListJson<'a> {
    consumers: &'a [ConsumerInfo],
}

impl Render for ConsumerList {
    fn table(&self) -> String {
        let mut table = Table::new(&[
            "PROJECT",
            "CONSUMER",
            "STATE",
            "CURSOR",
            "LAG",
            "LEASE_OWNER",
            "GEN",
            "HEARTBEAT_AGE",
            "DEAD_LETTERS",
            "REPLAY_REQUESTED",
            "CREATED",
            "RETIRED",
            "RETIRED_BY",
            "RETIRED_REASON",
        ]);
        for c in &self.0 {
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
        table.render()
    }

    fn json(&self) -> impl Serialize + '_ {
        ConsumerListJson { consumers: &self.0 }
    }
}

impl Render for Retirement {
    fn table(&self) -> String {
        let mut text = format!(
            "retired consumer {} of project {} (by {} at {})\n",
            self.consumer_id,
            self.project_id,
            self.retired_by,
            time(Some(self.retired_at))
        );
        if let Some(owner) = &self.stopping_lease_owner {
            text.push_str(&format!(
                "its lease holder {owner} (generation {}) stops at its next fenced write\n",
                self.lease_generation
            ));
        }
        if self.unresolved_dead_letters > 0 {
            text.push_str(&format!(
                "{} unresolved dead letter(s) may now be pruned by retention\n",
                self.unresolved_dead_letters
            ));
        }
        text
    }

    fn json(&self) -> impl Serialize + '_ {
        self
    }
}
