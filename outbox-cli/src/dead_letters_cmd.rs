//! `outbox dead-letters list|show|replay|resolve`.

use clap::{ArgGroup, Args, Subcommand};
use outbox_core::{
    Admin, ConsumerId, DeadLetterFilter, DeliveryState, EventId, MAX_LIMIT, OperatorName,
    ProjectId, Reason, ReplayTarget,
};

use crate::cli::{Global, Output};
use crate::failure::Failure;
use crate::output::{Table, emit, fields, json, opt, time};

/// `outbox dead-letters ...`.
#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// List dead letters (all but `retrying` deliveries unless --state says otherwise).
    List(ListArgs),
    /// Show one dead letter (or retrying delivery) with its event.
    Show(ShowArgs),
    /// Ask the consumer's lease holder to re-dispatch dead letters (`dead` ->
    /// `replay_requested`); it marks each `replayed`, or `dead` again if it fails.
    Replay(ReplayArgs),
    /// Close a dead letter without delivering it (`dead` or `replay_requested` ->
    /// `resolved`), audited.
    Resolve(ResolveArgs),
}

/// `outbox dead-letters list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this project.
    #[arg(long)]
    pub project: Option<ProjectId>,
    /// Only this consumer.
    #[arg(long)]
    pub consumer_id: Option<ConsumerId>,
    /// Only these states (repeat or separate with commas): retrying, dead, replay_requested,
    /// replayed, resolved.
    #[arg(long, value_delimiter = ',')]
    pub state: Vec<DeliveryState>,
    /// At most this many rows.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=MAX_LIMIT))]
    pub limit: i64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// The dead letter an operation is about.
#[derive(Debug, Args)]
pub struct Letter {
    /// The project.
    #[arg(long)]
    pub project: ProjectId,
    /// The consumer whose delivery failed.
    #[arg(long)]
    pub consumer_id: ConsumerId,
    /// The event (task-deleted:<task>:<deleted_at>).
    #[arg(long)]
    pub event_id: EventId,
}

/// `outbox dead-letters show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Which dead letter.
    #[command(flatten)]
    pub letter: Letter,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `outbox dead-letters replay`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["event_id", "all"])))]
pub struct ReplayArgs {
    /// The project.
    #[arg(long)]
    pub project: ProjectId,
    /// The consumer whose dead letters to replay.
    #[arg(long)]
    pub consumer_id: ConsumerId,
    /// One dead letter.
    #[arg(long)]
    pub event_id: Option<EventId>,
    /// Every dead letter of the consumer.
    #[arg(long)]
    pub all: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `outbox dead-letters resolve`.
#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// Which dead letter.
    #[command(flatten)]
    pub letter: Letter,
    /// Who resolves it (recorded in the audit trail): A-Z a-z 0-9 . _ : @ -, at most 64.
    #[arg(long, value_name = "OPERATOR")]
    pub by: OperatorName,
    /// Why (one line, at most 200 characters; kept on the dead letter, not in the audit).
    #[arg(long)]
    pub reason: Reason,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn run(global: &Global, command: DeadLettersCommand) -> Result<(), Failure> {
    let mut client = global.database()?.connect().await?;
    let admin = Admin::new(&global.schema);
    match command {
        DeadLettersCommand::List(args) => {
            let filter = DeadLetterFilter {
                project: args.project,
                consumer: args.consumer_id,
                states: args.state,
                limit: args.limit,
            };
            let listing = admin.dead_letters(&mut client, &filter).await?;
            if args.output == Output::Json {
                return json(&serde_json::json!({
                    "dead_letters": listing.items,
                    "truncated": listing.truncated,
                }));
            }
            let mut table = Table::new(&[
                "PROJECT",
                "CONSUMER",
                "EVENT",
                "SEQ",
                "STATE",
                "ATTEMPTS",
                "LAST_FAILURE",
                "PARKED",
                "UPDATED",
                "RESOLVED_BY",
            ]);
            for d in &listing.items {
                table.row(vec![
                    d.project_id.clone(),
                    d.consumer_id.clone(),
                    d.event_id.clone(),
                    d.sequence.to_string(),
                    d.state.to_string(),
                    d.attempts.to_string(),
                    opt(d.last_failure_class.as_deref()),
                    time(d.parked_at),
                    time(Some(d.updated_at)),
                    opt(d.resolved_by.as_deref()),
                ]);
            }
            emit(&table.render())?;
            if listing.truncated {
                eprintln!(
                    "note: only the first {} dead letters are shown; narrow the filter or raise \
                     --limit",
                    args.limit
                );
            }
            Ok(())
        }
        DeadLettersCommand::Show(args) => {
            let l = &args.letter;
            let detail = admin
                .dead_letter(&mut client, &l.project, &l.consumer_id, &l.event_id)
                .await?;
            if args.output == Output::Json {
                return json(&detail);
            }
            let d = &detail.dead_letter;
            let mut pairs = vec![
                ("project", d.project_id.clone()),
                ("consumer", d.consumer_id.clone()),
                ("event", d.event_id.clone()),
                ("sequence", d.sequence.to_string()),
                ("state", d.state.to_string()),
                ("attempts", d.attempts.to_string()),
                ("last_failure", opt(d.last_failure_class.as_deref())),
                ("first_failed_at", time(Some(d.first_failed_at))),
                ("parked_at", time(d.parked_at)),
                ("next_attempt_at", time(d.next_attempt_at)),
                ("updated_at", time(Some(d.updated_at))),
                ("resolved_at", time(d.resolved_at)),
                ("resolved_by", opt(d.resolved_by.as_deref())),
                ("resolved_reason", opt(d.resolved_reason.as_deref())),
            ];
            match &detail.event {
                Some(e) => pairs.extend([
                    ("event_type", e.event_type.clone()),
                    ("task_id", e.task_id.clone()),
                    ("deleted_at", outbox_core::format_timestamp(e.deleted_at)),
                    ("writer", e.writer_process_id.clone()),
                    ("occurred_at", time(Some(e.occurred_at))),
                    ("payload_version", e.payload_version.to_string()),
                    ("payload", e.payload.to_string()),
                ]),
                None => pairs.push(("event", "pruned by retention".to_owned())),
            }
            emit(&fields(&pairs))
        }
        DeadLettersCommand::Replay(args) => {
            let which = match args.event_id {
                Some(event) => ReplayTarget::One(event),
                None => ReplayTarget::AllDead,
            };
            let request = admin
                .request_replay(&mut client, &args.project, &args.consumer_id, &which)
                .await?;
            if args.output == Output::Json {
                return json(&request);
            }
            let mut text = if request.requested.is_empty() {
                format!(
                    "consumer {} of project {} has no dead letters that can be replayed\n",
                    request.consumer_id, request.project_id
                )
            } else {
                let mut text = format!(
                    "replay requested for {} dead letter(s) of consumer {} in project {}; the \
                     consumer re-dispatches them while it runs:\n",
                    request.requested.len(),
                    request.consumer_id,
                    request.project_id
                );
                for event in &request.requested {
                    text.push_str(&format!("  {event}\n"));
                }
                text
            };
            if !request.skipped_pruned.is_empty() {
                text.push_str(&format!(
                    "left {} dead letter(s) whose events retention pruned (resolve them \
                     instead):\n",
                    request.skipped_pruned.len()
                ));
                for event in &request.skipped_pruned {
                    text.push_str(&format!("  {event}\n"));
                }
            }
            emit(&text)
        }
        DeadLettersCommand::Resolve(args) => {
            let l = &args.letter;
            let resolution = admin
                .resolve(
                    &mut client,
                    &l.project,
                    &l.consumer_id,
                    &l.event_id,
                    &args.by,
                    &args.reason,
                )
                .await?;
            if args.output == Output::Json {
                return json(&resolution);
            }
            emit(&format!(
                "resolved dead letter {} of consumer {} in project {} (was {} after {} \
                 attempt(s)) by {} at {}\n",
                resolution.event_id,
                resolution.consumer_id,
                resolution.project_id,
                resolution.previous_state,
                resolution.attempts,
                resolution.resolved_by,
                time(Some(resolution.resolved_at))
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Probe {
        #[command(subcommand)]
        command: DeadLettersCommand,
    }

    #[test]
    fn replay_needs_exactly_one_of_event_or_all() {
        let base = ["x", "replay", "--project", "p", "--consumer-id", "c"];
        assert!(Probe::try_parse_from(base).is_err());
        let both = [&base[..], &["--all", "--event-id", "task-deleted:t:x"]].concat();
        assert!(Probe::try_parse_from(both).is_err());
        let all = [&base[..], &["--all"]].concat();
        assert!(matches!(
            Probe::try_parse_from(all).unwrap().command,
            DeadLettersCommand::Replay(ReplayArgs { all: true, .. })
        ));
    }

    #[test]
    fn states_parse_from_a_list() {
        let probe = Probe::try_parse_from(["x", "list", "--state", "dead,resolved"]).unwrap();
        let DeadLettersCommand::List(args) = probe.command else {
            panic!("list expected");
        };
        assert_eq!(
            args.state,
            vec![DeliveryState::Dead, DeliveryState::Resolved]
        );
        assert!(Probe::try_parse_from(["x", "list", "--state", "gone"]).is_err());
    }
}
