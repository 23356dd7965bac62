//! `outbox dead-letters list|show|replay|resolve`.

use clap::{ArgGroup, Args, Subcommand};
use outbox_core::EventId;
use outbox_core::admin::{
    Admin, DeadLetter, DeadLetterDetail, DeadLetterFilter, Listing, MAX_LIMIT, ReplayRequest,
    ReplayTarget, Resolution,
};
use outbox_core::states::DeliveryState;
use serde::Serialize;

use crate::args::{ConsumerFilter, ConsumerRef, Operator};
use crate::cli::{Global, Output};
use crate::failure::Failure;
use crate::output::{Render, Table, fields, opt, print, time};
use outbox_core::OperatorName;

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
    /// Only this project and consumer.
    #[command(flatten)]
    pub filter: ConsumerFilter,
    /// Only these states (repeat or separate with commas): retrying, dead, replay_requested,
    /// replayed, resolved.
    #[arg(long, value_delimiter = ',')]
    pub state: Vec<DeliveryState>,
    /// At most this many rows: 1 to 10000.
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(1..=MAX_LIMIT))]
    pub limit: i64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// The dead letter an operation is about: by event ID or by the sequence `list` shows.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("letter").required(true).args(["event_id", "sequence"])))]
pub struct Letter {
    /// The consumer whose delivery failed.
    #[command(flatten)]
    pub consumer: ConsumerRef,
    /// The event (task-deleted:<task>:<deleted_at>).
    #[arg(long)]
    pub event_id: Option<EventId>,
    /// The event's sequence, instead of its ID.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(1..))]
    pub sequence: Option<i64>,
}

impl Letter {
    /// The event ID, looking up a sequence when that is what was given.
    async fn event_id(
        &self,
        admin: &Admin,
        client: &mut tokio_postgres::Client,
    ) -> Result<EventId, Failure> {
        match (&self.event_id, self.sequence) {
            (Some(event), _) => Ok(event.clone()),
            (None, Some(sequence)) => Ok(admin
                .dead_letter_at(
                    client,
                    &self.consumer.project,
                    &self.consumer.consumer_id,
                    sequence,
                )
                .await?),
            (None, None) => Err(Failure::usage("give --event-id or --sequence")),
        }
    }
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
#[command(group(ArgGroup::new("which").required(true).args(["event_id", "sequence", "all"])))]
pub struct ReplayArgs {
    /// The consumer whose dead letters to replay.
    #[command(flatten)]
    pub consumer: ConsumerRef,
    /// One dead letter.
    #[arg(long)]
    pub event_id: Option<EventId>,
    /// One dead letter, by its event's sequence.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(1..))]
    pub sequence: Option<i64>,
    /// Every dead letter of the consumer.
    #[arg(long)]
    pub all: bool,
    /// Who asks for the replay (recorded in the audit trail, with the replay's outcome): A-Z
    /// a-z 0-9 . _ : @ -, at most 64.
    #[arg(long, value_name = "OPERATOR")]
    pub by: OperatorName,
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
    /// Who resolves it and why (the reason stays on the dead letter).
    #[command(flatten)]
    pub operator: Operator,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn run(global: &Global, command: DeadLettersCommand) -> Result<(), Failure> {
    let mut client = global.database()?.connect().await?;
    let admin = Admin::new(&global.schema);
    match command {
        DeadLettersCommand::List(args) => {
            if let Some(project) = &args.filter.project {
                admin.require_project(&client, project).await?;
            }
            if let Some(consumer) = &args.filter.consumer_id {
                let project = args.filter.project.as_ref();
                admin
                    .require_consumer(&client, project, consumer, false)
                    .await?;
            }
            let filter = DeadLetterFilter {
                project: args.filter.project,
                consumer: args.filter.consumer_id,
                states: args.state,
                limit: args.limit,
            };
            let listing = admin.dead_letters(&mut client, &filter).await?;
            let list = DeadLetterList {
                listing,
                limit: args.limit,
            };
            print(args.output, &list)
        }
        DeadLettersCommand::Show(args) => {
            let event = args.letter.event_id(&admin, &mut client).await?;
            let c = &args.letter.consumer;
            let detail = admin
                .dead_letter(&mut client, &c.project, &c.consumer_id, &event)
                .await?;
            print(args.output, &detail)
        }
        DeadLettersCommand::Replay(args) => {
            let c = &args.consumer;
            let which = match (args.event_id, args.sequence) {
                (Some(event), _) => ReplayTarget::One(event),
                (None, Some(sequence)) => ReplayTarget::One(
                    admin
                        .dead_letter_at(&mut client, &c.project, &c.consumer_id, sequence)
                        .await?,
                ),
                (None, None) => ReplayTarget::AllDead,
            };
            let request = admin
                .request_replay(&mut client, &c.project, &c.consumer_id, &which, &args.by)
                .await?;
            print(args.output, &request)
        }
        DeadLettersCommand::Resolve(args) => {
            let event = args.letter.event_id(&admin, &mut client).await?;
            let c = &args.letter.consumer;
            let resolution = admin
                .resolve(
                    &mut client,
                    &c.project,
                    &c.consumer_id,
                    &event,
                    &args.operator.by,
                    &args.operator.reason,
                )
                .await?;
            print(args.output, &resolution)
        }
    }
}

/// `dead-letters list`: `{"dead_letters": [...], "truncated": bool}`.
struct DeadLetterList {
    /// The rows.
    listing: Listing<DeadLetter>,
    /// The limit asked for, for the note when it cut the listing short.
    limit: i64,
}

#[derive(Serialize)]
struct DeadLetterListJson<'a> {
    dead_letters: &'a [DeadLetter],
    truncated: bool,
}

impl Render for DeadLetterList {
    fn table(&self) -> String {
        let mut table = Table::new(&[
            "PROJECT",
            "CONSUMER",
            "EVENT_ID",
            "SEQUENCE",
            "STATE",
            "ATTEMPTS",
            "LAST_FAILURE",
            "PARKED",
            "UPDATED",
            "RESOLVED_BY",
        ]);
        for d in &self.listing.items {
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
        table.render()
    }

    fn json(&self) -> impl Serialize + '_ {
        DeadLetterListJson {
            dead_letters: &self.listing.items,
            truncated: self.listing.truncated,
        }
    }

    fn note(&self) -> Option<String> {
        self.listing.truncated.then(|| {
            format!(
                "only the first {} dead letters are shown; narrow the filter or raise --limit",
                self.limit
            )
        })
    }
}

impl Render for DeadLetterDetail {
    fn table(&self) -> String {
        let d = &self.dead_letter;
        let mut pairs = vec![
            ("project", d.project_id.clone()),
            ("consumer", d.consumer_id.clone()),
            ("event_id", d.event_id.clone()),
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
        match &self.event {
            Some(e) => pairs.extend([
                ("event_type", e.event_type.clone()),
                ("task_id", e.task_id.clone()),
                (
                    "deleted_at",
                    outbox_core::event::format_timestamp(e.deleted_at),
                ),
                ("writer_process_id", e.writer_process_id.clone()),
                ("occurred_at", time(Some(e.occurred_at))),
                ("payload_version", e.payload_version.to_string()),
                ("prior", e.prior.to_string()),
            ]),
            None => pairs.push(("event", "pruned by retention".to_owned())),
        }
        fields(&pairs)
    }

    fn json(&self) -> impl Serialize + '_ {
        self
    }
}

impl Render for ReplayRequest {
    fn table(&self) -> String {
        let mut text = if self.requested.is_empty() {
            format!(
                "consumer {} of project {} has no dead letters that can be replayed\n",
                self.consumer_id, self.project_id
            )
        } else {
            let mut text = format!(
                "replay requested by {} for {} dead letter(s) of consumer {} in project {}; the \
                 consumer re-dispatches them while it runs:\n",
                self.requested_by,
                self.requested.len(),
                self.consumer_id,
                self.project_id
            );
            for event in &self.requested {
                text.push_str(&format!("  {event}\n"));
            }
            text
        };
        if !self.skipped_pruned.is_empty() {
            text.push_str(&format!(
                "left {} dead letter(s) whose events retention pruned (resolve them \
                 instead):\n",
                self.skipped_pruned.len()
            ));
            for event in &self.skipped_pruned {
                text.push_str(&format!("  {event}\n"));
            }
        }
        text
    }

    fn json(&self) -> impl Serialize + '_ {
        self
    }
}

impl Render for Resolution {
    fn table(&self) -> String {
        format!(
            "resolved dead letter {} of consumer {} in project {} (was {} after {} \
             attempt(s)) by {} at {}\n",
            self.event_id,
            self.consumer_id,
            self.project_id,
            self.previous_state,
            self.attempts,
            self.resolved_by,
            time(Some(self.resolved_at))
        )
    }

    fn json(&self) -> impl Serialize + '_ {
        self
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
    fn replay_needs_exactly_one_of_event_sequence_or_all_and_an_operator() {
        let base = [
            "x",
            "replay",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--by",
            "alice",
        ];
        assert!(Probe::try_parse_from(base).is_err());
        let both = [&base[..], &["--all", "--event-id", "task-deleted:t:x"]].concat();
        assert!(Probe::try_parse_from(both).is_err());
        let both = [
            &base[..],
            &["--sequence", "3", "--event-id", "task-deleted:t:x"],
        ]
        .concat();
        assert!(Probe::try_parse_from(both).is_err());
        let nobody = [
            "x",
            "replay",
            "--project",
            "p",
            "--consumer-id",
            "c",
            "--all",
        ];
        assert!(Probe::try_parse_from(nobody).is_err(), "--by is required");
        let zero = [&base[..], &["--sequence", "0"]].concat();
        assert!(Probe::try_parse_from(zero).is_err());
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
