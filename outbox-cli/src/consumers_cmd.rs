//! `outbox consumers list|retire|reactivate|delete`.

use clap::{Args, Subcommand, ValueEnum};
use outbox_core::ProjectId;
use outbox_core::admin::{Admin, ConsumerInfo, Deletion, Reactivation, Retirement};
use outbox_core::states::ConsumerState;
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
    /// Make a retired consumer active again (audited): its cursor becomes missing, so it
    /// reconciles at its next start, and a process that held its lease before the retirement
    /// stays fenced off. `outbox consume --reactivate` does the same at start.
    Reactivate(RetireArgs),
    /// Delete a retired consumer's row with its positions, lease renewals and delivery rows,
    /// dead letters included (audited `consumer-deleted`; its audit rows stay). Refused for an
    /// active consumer: retire it first. Retention is unchanged (a retired consumer holds
    /// nothing back).
    Delete(RetireArgs),
}

/// `consumers list --state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    /// Consumers that receive events and hold retention back.
    Active,
    /// Retired consumers.
    Retired,
}

impl From<StateArg> for ConsumerState {
    fn from(state: StateArg) -> Self {
        match state {
            StateArg::Active => ConsumerState::Active,
            StateArg::Retired => ConsumerState::Retired,
        }
    }
}

/// `outbox consumers list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only consumers of this project.
    #[arg(long)]
    pub project: Option<ProjectId>,
    /// Only consumers in this state.
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `outbox consumers retire`, `reactivate` and `delete`: one consumer, the operator, why.
#[derive(Debug, Args)]
pub struct RetireArgs {
    /// The consumer.
    #[command(flatten)]
    pub consumer: ConsumerRef,
    /// Who acts and why (a retirement's reason also stays on the consumer row).
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
            let mut consumers = admin.consumers(&mut client, args.project.as_ref()).await?;
            if let Some(state) = args.state {
                consumers.retain(|c| c.state == ConsumerState::from(state));
            }
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
        ConsumersCommand::Reactivate(args) => {
            let (c, o) = (&args.consumer, &args.operator);
            let done = admin
                .reactivate(&mut client, &c.project, &c.consumer_id, &o.by, &o.reason)
                .await?;
            print(args.output, &done)
        }
        ConsumersCommand::Delete(args) => {
            let (c, o) = (&args.consumer, &args.operator);
            let done = admin
                .delete_consumer(&mut client, &c.project, &c.consumer_id, &o.by, &o.reason)
                .await?;
            print(args.output, &done)
        }
    }
}

impl Render for Reactivation {
    fn table(&self) -> String {
        format!(
            "reactivated consumer {} of project {} (by {}); it reconciles at its next start\n",
            self.consumer_id, self.project_id, self.reactivated_by
        )
    }

    fn json(&self) -> impl Serialize + '_ {
        self
    }
}

impl Render for Deletion {
    fn table(&self) -> String {
        format!(
            "deleted retired consumer {} of project {} (by {}) and its {} delivery row(s)\n",
            self.consumer_id, self.project_id, self.deleted_by, self.delivery_rows
        )
    }

    fn json(&self) -> impl Serialize + '_ {
        self
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
