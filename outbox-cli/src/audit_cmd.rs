//! `outbox audit`: who parked, replayed, resolved, retired or reconciled what, and when.

use clap::Args;
use outbox_core::{Admin, AuditEntry, AuditFilter, AuditKind, EventId, Listing, MAX_LIMIT};
use serde::Serialize;

use crate::args::ConsumerFilter;
use crate::cli::{Global, Output};
use crate::failure::Failure;
use crate::output::{Render, Table, opt, print, time};

/// `outbox audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only this project and consumer.
    #[command(flatten)]
    pub filter: ConsumerFilter,
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
        project: args.filter.project,
        consumer: args.filter.consumer_id,
        kinds: args.kind,
        event: args.event_id,
        limit: args.limit,
    };
    let listing = Admin::new(&global.schema)
        .audit_trail(&mut client, &filter)
        .await?;
    print(
        args.output,
        &AuditList {
            listing,
            limit: args.limit,
        },
    )
}

/// The audit trail as listed: `{"audit": [...], "truncated": bool}`.
struct AuditList {
    /// The rows, newest first.
    listing: Listing<AuditEntry>,
    /// The limit asked for, for the note when it cut the listing short.
    limit: i64,
}

#[derive(Serialize)]
struct AuditListJson<'a> {
    audit: &'a [AuditEntry],
    truncated: bool,
}

impl Render for AuditList {
    fn table(&self) -> String {
        let mut table = Table::new(&[
            "ID", "RECORDED", "KIND", "PROJECT", "CONSUMER", "EVENT", "ACTOR", "COUNT",
        ]);
        for entry in &self.listing.items {
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
        table.render()
    }

    fn json(&self) -> impl Serialize + '_ {
        AuditListJson {
            audit: &self.listing.items,
            truncated: self.listing.truncated,
        }
    }

    fn note(&self) -> Option<String> {
        self.listing.truncated.then(|| {
            format!(
                "only the newest {} audit rows are shown; narrow the filter or raise --limit",
                self.limit
            )
        })
    }
}
