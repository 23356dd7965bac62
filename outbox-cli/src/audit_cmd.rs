//! `outbox audit`: who parked, replayed, resolved, retired or reconciled what, and when.

use chrono::{DateTime, Utc};
use clap::Args;
use outbox_core::EventId;
use outbox_core::admin::{Admin, AuditEntry, AuditFilter, Listing, MAX_LIMIT};
use outbox_core::states::AuditKind;
use serde::Serialize;

use crate::args::ConsumerFilter;
use crate::cli::{Global, Output};
use crate::failure::Failure;
use crate::output::{Render, Table, opt, print, time};
use crate::shutdown::Shutdown;

/// `outbox audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only this project and consumer.
    #[command(flatten)]
    pub filter: ConsumerFilter,
    /// Only these kinds (repeat or separate with commas), with or without the
    /// `lifecycle-observation:` prefix: consumer-poisoned, consumer-replayed,
    /// dead-letter-replay-requested, dead-letter-resolved, consumer-retired,
    /// consumer-reactivated, consumer-deleted, reconciled, pruned, history-diverged.
    #[arg(long, value_delimiter = ',')]
    pub kind: Vec<AuditKind>,
    /// Only rows about this event.
    #[arg(long)]
    pub event_id: Option<EventId>,
    /// Only rows recorded since then: a duration ago (30m, 2h, 7d) or an RFC 3339 time
    /// (2026-12-01T09:00:00Z).
    #[arg(long, value_parser = parse_since)]
    pub since: Option<Since>,
    /// Keep running and print new rows as they are recorded (oldest first), until
    /// interrupted; the table header is printed once.
    #[arg(long)]
    pub follow: bool,
    /// How often --follow looks for new rows.
    #[arg(long, allow_hyphen_values = true, value_parser = crate::cli::parse_duration, default_value = "1s")]
    pub follow_interval: std::time::Duration,
    /// At most this many rows, newest first: 1 to 10000.
    #[arg(long, default_value_t = 50, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(1..=MAX_LIMIT))]
    pub limit: i64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Where `--since` starts: a moment, or a duration before now.
#[derive(Debug, Clone, Copy)]
pub enum Since {
    /// An absolute time.
    At(DateTime<Utc>),
    /// This long ago.
    Ago(std::time::Duration),
}

impl Since {
    fn moment(self) -> Result<DateTime<Utc>, Failure> {
        match self {
            Since::At(at) => Ok(at),
            Since::Ago(ago) => chrono::Duration::from_std(ago)
                .ok()
                .and_then(|ago| Utc::now().checked_sub_signed(ago))
                .ok_or_else(|| Failure::usage("invalid --since: too far in the past")),
        }
    }
}

/// Parses `--since`: an RFC 3339 time, or a duration ago.
fn parse_since(text: &str) -> Result<Since, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(Since::At(at.with_timezone(&Utc)));
    }
    humantime::parse_duration(text)
        .map(Since::Ago)
        .map_err(|_| {
            format!(
                "invalid --since {text:?}: give a duration ago (30m, 2h, 7d) or an RFC 3339 time \
             (2026-12-01T09:00:00Z)"
            )
        })
}

pub async fn run(global: &Global, args: AuditArgs) -> Result<(), Failure> {
    let shutdown = args.follow.then(Shutdown::install).transpose()?;
    let mut client = global.database()?.connect().await?;
    let admin = Admin::new(&global.schema);
    if let Some(project) = &args.filter.project {
        admin.require_project(&client, project).await?;
    }
    if let Some(consumer) = &args.filter.consumer_id {
        let project = args.filter.project.as_ref();
        admin
            .require_consumer(&client, project, consumer, true)
            .await?;
    }
    let mut filter = AuditFilter {
        project: args.filter.project,
        consumer: args.filter.consumer_id,
        kinds: args.kind,
        event: args.event_id,
        since: args.since.map(Since::moment).transpose()?,
        after_id: None,
        limit: args.limit,
    };
    let listing = admin.audit_trail(&mut client, &filter).await?;
    let Some(shutdown) = shutdown else {
        return print(
            args.output,
            &AuditList {
                listing,
                limit: args.limit,
            },
        );
    };
    // Following: what exists now, oldest first, then each new row as it is recorded.
    let mut rows = listing.items;
    rows.reverse();
    let mut first = true;
    loop {
        if let Some(last) = rows.last() {
            filter.after_id = Some(last.id);
        }
        if !follow_print(args.output, &rows, first)? {
            // The reader is gone (`| head -2`): what it wanted was printed.
            return Ok(());
        }
        first = false;
        tokio::select! {
            _ = shutdown.requested() => return Ok(()),
            _ = tokio::time::sleep(args.follow_interval) => {}
        }
        filter.since = None;
        filter.limit = MAX_LIMIT;
        let mut listing = admin.audit_trail(&mut client, &filter).await?;
        listing.items.reverse();
        rows = listing.items;
    }
}

/// Prints followed rows: table lines (the header only the first time) or one JSON object
/// per line; false once stdout's reader is gone.
fn follow_print(output: Output, rows: &[AuditEntry], header: bool) -> Result<bool, Failure> {
    let mut text = String::new();
    match output {
        Output::Json => {
            for entry in rows {
                let line = serde_json::to_string(entry)
                    .map_err(|e| Failure::runtime(format!("cannot encode an audit row: {e}")))?;
                text.push_str(&line);
                text.push('\n');
            }
        }
        Output::Table => {
            let table = audit_table(Table::fixed(&AUDIT_COLUMNS, &FOLLOW_WIDTHS), rows).render();
            let mut lines = table.lines();
            if !header {
                lines.next();
            }
            for line in lines {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    crate::output::emit_open(&text)
}

/// The audit table's columns.
const AUDIT_COLUMNS: [&str; 9] = [
    "ID", "RECORDED", "KIND", "PROJECT", "CONSUMER", "EVENT_ID", "ACTOR", "COUNT", "REASON",
];

/// Column widths under `--follow`, where rows arrive after their header was printed: a row
/// id, a timestamp, the longest kind, room for common identifiers (a longer one is printed
/// whole and shifts the rest of its row).
const FOLLOW_WIDTHS: [usize; 9] = [8, 20, 28, 16, 16, 56, 16, 6, crate::output::MAX_CELL];

/// `rows` in an audit table (fitted to them, or `fixed` for following).
fn audit_table(mut table: Table, rows: &[AuditEntry]) -> Table {
    for entry in rows {
        table.row(vec![
            entry.id.to_string(),
            time(Some(entry.recorded_at)),
            entry.kind.short_name().to_owned(),
            opt(entry.project_id.as_deref()),
            opt(entry.consumer_id.as_deref()),
            // A contract row names its contract where an event row names its event.
            opt(entry.event_id.as_deref().or(entry.contract.as_deref())),
            opt(entry.actor.as_deref()),
            opt(entry.count),
            opt(entry.reason.as_deref()),
        ]);
    }
    table
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
        audit_table(Table::new(&AUDIT_COLUMNS), &self.listing.items).render()
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

#[cfg(test)]
mod tests {
    use outbox_core::states::AuditKind;

    use super::FOLLOW_WIDTHS;

    #[test]
    fn every_audit_kind_fits_its_followed_column() {
        for kind in AuditKind::ALL {
            assert!(
                kind.short_name().len() <= FOLLOW_WIDTHS[2],
                "{}",
                kind.short_name()
            );
        }
    }
}
