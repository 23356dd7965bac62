//! `stamp-lines`: timestamps the event lines of `outbox consume` as they arrive
//! (bench/old-snapshot.sh).
//!
//! The benchmark measures what a user of the CLI sees: the time from an event's `deleted_at`
//! (the writer's `clock_timestamp()`, inside its transaction) to its line arriving on the
//! consumer's stdout. Both ends read the wall clock of one machine. Each event line becomes
//! `ARRIVAL_UNIX_MS LATENCY_US PROJECT SEQUENCE ARRIVAL_UNIX_US` on stdout, so the script can
//! cut the run into windows by arrival time, and join each arrival to its event's row (its
//! writer's commit timestamp, when it was numbered); other lines (reconciliations) are
//! skipped.

use std::io::{BufRead, BufWriter, Write};

use chrono::{DateTime, Utc};

use crate::BoxResult;

/// Options of `stamp-lines` (none: stdin to stdout).
#[derive(Debug, clap::Args)]
pub struct StampArgs {}

/// The fields of an event line this needs.
#[derive(serde::Deserialize)]
struct Line {
    #[serde(rename = "type")]
    kind: String,
    deleted_at: Option<DateTime<Utc>>,
    project_id: Option<String>,
    sequence: Option<i64>,
}

/// Reads lines until stdin closes. Each line is stamped when it is read, so buffering the
/// output changes no figure.
pub fn stamp(_args: StampArgs) -> BoxResult<()> {
    let stdin = std::io::stdin().lock();
    let mut out = BufWriter::new(std::io::stdout().lock());
    for line in stdin.lines() {
        let line = line?;
        let now = Utc::now();
        let Ok(parsed) = serde_json::from_str::<Line>(&line) else {
            continue;
        };
        let (true, Some(deleted_at), Some(project), Some(sequence)) = (
            parsed.kind == "event",
            parsed.deleted_at,
            parsed.project_id,
            parsed.sequence,
        ) else {
            continue;
        };
        let latency = (now - deleted_at).num_microseconds().unwrap_or(i64::MAX);
        writeln!(
            out,
            "{} {latency} {project} {sequence} {}",
            now.timestamp_millis(),
            now.timestamp_micros()
        )?;
    }
    out.flush()?;
    Ok(())
}
