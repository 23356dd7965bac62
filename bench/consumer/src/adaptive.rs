//! The report's comparison of the adaptive read batch (reads doubling from 500 while they come
//! back full) with the fixed batches of 500 every read had before it, measured in the same
//! repetitions, back to back.

use std::fmt::Write;

use crate::catchup::Run;
use crate::report::Results;
use crate::stats::median;

/// Goals from issue 44: catch-up at least this many times the fixed batches' in the same run.
const GOAL_RATIO: f64 = 1.3;
/// ... with a peak RSS of at most this.
const GOAL_RSS_MIB: f64 = 32.0;

fn median_of(runs: &[Run], field: impl Fn(&Run) -> f64) -> f64 {
    median(&runs.iter().map(field).collect::<Vec<_>>()).unwrap_or(f64::NAN)
}

fn peak_mib(runs: &[Run]) -> f64 {
    runs.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0) as f64 / 1024.0
}

fn row(out: &mut String, label: &str, runs: &[Run], fixed_rate: f64) -> std::fmt::Result {
    let rate = median_of(runs, |x| x.rate);
    writeln!(
        out,
        "| {label} | {} | {:.2} | {rate:.0} | {:.2} | {:.1} | {:.2} | {:.2} | {:.0} | {:.2} |",
        runs.len(),
        median_of(runs, |x| x.report.seconds),
        rate / fixed_rate,
        peak_mib(runs),
        median_of(runs, |x| x.consumer_cpu),
        median_of(runs, |x| x.backend_cpu.unwrap_or(f64::NAN)),
        median_of(runs, |x| x.wal_syncs.map_or(f64::NAN, |w| w as f64)),
        median_of(runs, |x| x.load_at_start),
    )
}

/// The section and its goals.
pub fn write(out: &mut String, r: &Results) -> std::fmt::Result {
    let default_max = outbox_consumer::config::DEFAULT_MAX_BATCH_SIZE;
    writeln!(out, "## Adaptive read batch against fixed batches")?;
    writeln!(out)?;
    writeln!(
        out,
        "The catch-up above, in each repetition right after the same consumer with fixed \
         batches of 500 (`max_batch_size` = `batch_size` = 500: every read as before the \
         adaptive batch). Adaptive: reads start at 500 and double while they come back full, \
         up to the maximum (default {default_max}); a short read returns them to 500. A crash \
         repeats at most one read batch. Medians over the repetitions; peak RSS: the largest."
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| reads | runs | seconds | events/s | x fixed | peak RSS MiB | consumer CPU s | \
         backend CPU s | WAL syncs | load |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    let fixed_rate = median_of(&r.fixed, |x| x.rate);
    row(out, "fixed 500 (before)", &r.fixed, fixed_rate)?;
    row(
        out,
        &format!("500 growing to {default_max} (default)"),
        &r.clean,
        fixed_rate,
    )?;
    for (variant, runs) in &r.other_maxima {
        row(
            out,
            &format!("500 growing to {}", variant.max_batch_size),
            runs,
            fixed_rate,
        )?;
    }
    writeln!(out)?;
    let ratio = median_of(&r.clean, |x| x.rate) / fixed_rate;
    // The same ratio within each repetition (the two runs back to back, under the same load
    // on the machine), then its median.
    let paired: Vec<f64> = r
        .clean
        .iter()
        .zip(&r.fixed)
        .map(|(adaptive, fixed)| adaptive.rate / fixed.rate)
        .collect();
    let paired = median(&paired).unwrap_or(f64::NAN);
    let rss = peak_mib(&r.clean);
    let met = |ok: bool| if ok { "**met**" } else { "**not met**" };
    writeln!(out, "### Goals (issue 44)")?;
    writeln!(out)?;
    writeln!(
        out,
        "- Catch-up >= {GOAL_RATIO} x the fixed batches' in the same run: {ratio:.2} x (ratio \
         of the medians; median of the per-repetition ratios {paired:.2} x): {}.",
        met(ratio >= GOAL_RATIO && paired >= GOAL_RATIO)
    )?;
    writeln!(
        out,
        "- Peak RSS <= {GOAL_RSS_MIB} MiB: {rss:.1} MiB: {}.",
        met(rss <= GOAL_RSS_MIB)
    )?;
    writeln!(out)
}
