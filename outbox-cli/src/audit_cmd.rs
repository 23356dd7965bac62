//! `outbox audit`: who parked, replayed, resolved, retired or reconciled what, and when.

use clap::Args;
use outbox_core::{Admin, AuditFilter, AuditKind, ConsumerId, EventId, MAX_LIMIT, ProjectId};

use crate::cli::{Global, Output};
use crate::failure::Failure;
use crate::output::{Table, emit, json, opt, time};

/// `outbox audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only this project.
    #[arg(long)]
    pub project: Option<ProjectId>,
    /// Only this consumer.
    #[arg(long)]
    pub consumer_id: Option<ConsumerId>,
    /// Only these kinds (repeat or separate with commas), with or without the
    /// `lifecycle-observation:` prefix: consumer-poisoned, consumer-replayed,
    /// dead-letter-resolved, consumer-retired, consumer-reactivated, reconciled, pruned.
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<AuditKind>,
    /// Only rows about this event.
    #[arg(long)]
    pub event_id: Option<EventId>,
    /// At most this many rows, newest first.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=MAX_LIMIT))]
    pub limit: i64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn run(global: &Global, args: AuditArgs) -> Result<(), Failure> {
    let mut client = global.database()?.connect().await?;
    let filter = AuditFilter {
        project: args.project,
        consumer: args.consumer_id,
        kinds: args.kind,
        event: args.event_id,
        limit: args.limit,
    };
    let listing = Admin::new(&global.schema)
        .audit_trail(&mut client, &filter)
        .await?;
    if args.output == Output::Json {
        return json(&serde_json::json!({
            "audit": listing.items,
            "truncated": listing.truncated,
        }));
    }
    let mut table = Table::new(&[
        "ID", "RECORDED", "KIND", "PROJECT", "CONSUMER", "EVENT", "ACTOR", "COUNT",
    ]);
    for entry in &listing.items {
        table.row(vec![
            entry.id.to_string(),
            time(Some(entry.recorded_at)),
            entry.kind.short_name().to_owned(),
            opt(entry.project_id.as_deref()),
            opt(entry.consumer_id.as_deref()),
            opt(entry.event_id.as_deref()),
            opt(entry.actor.as_deref()),
            opt(entry.count),
        ]);
    }
    emit(&table.render())?;
    if listing.truncated {
        eprintln!(
            "note: only the newest {} audit rows are shown; narrow the filter or raise --limit",
            args.limit
        );
    }
    Ok(())
}
