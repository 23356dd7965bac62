//! The gap-safety checks: pure functions of what the probe transactions did and what the
//! consumer received, so each can be tested on hand-made histories.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde::Serialize;

/// How a probe transaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// Committed at once.
    Committed,
    /// Held open while other transactions committed, then committed.
    CommittedLate,
    /// Rolled back: its events must never be delivered.
    RolledBack,
}

/// One probe transaction as its writer saw it.
#[derive(Debug, Clone)]
pub struct ProbeTx {
    /// The event IDs the writer returned, in write order.
    pub event_ids: Vec<String>,
    /// How it ended.
    pub ending: Ending,
    /// Before its first write.
    pub begun: Instant,
    /// When COMMIT returned (committed transactions only).
    pub committed: Option<Instant>,
}

/// One event as the consumer received it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Its sequence.
    pub sequence: i64,
    /// Its event ID.
    pub event_id: String,
    /// When the handler received it.
    pub at: Instant,
}

/// The outcome of one named check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// The check's name (stable: scripts match on it).
    pub name: &'static str,
    /// Whether it holds.
    pub ok: bool,
    /// What was found.
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, problem: Option<String>, fine: String) -> Self {
        match problem {
            Some(detail) => Self {
                name,
                ok: false,
                detail,
            },
            None => Self {
                name,
                ok: true,
                detail: fine,
            },
        }
    }
}

/// Every check over `txs` and `deliveries`, where the project's head was `start_head` before
/// the first probe and `end_head` after the last was delivered.
pub fn run_all(
    txs: &[ProbeTx],
    deliveries: &[Delivery],
    start_head: i64,
    end_head: i64,
) -> Vec<Check> {
    vec![
        dense_numbering(deliveries, start_head, end_head),
        commit_order(txs, deliveries),
        nothing_missing(txs, deliveries),
        nothing_duplicated(deliveries),
        nothing_rolled_back(txs, deliveries),
        only_probe_events(txs, deliveries),
    ]
}

/// The deliveries are exactly `start_head + 1 ..= end_head`, each one more than the last.
pub fn dense_numbering(deliveries: &[Delivery], start_head: i64, end_head: i64) -> Check {
    let mut expected = start_head + 1;
    let mut problem = None;
    for d in deliveries {
        if d.sequence != expected {
            problem = Some(format!(
                "expected sequence {expected}, received {} (after {})",
                d.sequence,
                expected - 1
            ));
            break;
        }
        expected += 1;
    }
    if problem.is_none() && expected - 1 != end_head {
        problem = Some(format!(
            "received up to {}, but the project's head is {end_head}",
            expected - 1
        ));
    }
    Check::new(
        "dense_numbering",
        problem,
        format!("sequences {}..={end_head} in order, no gap", start_head + 1),
    )
}

/// A transaction whose COMMIT returned before another began has every event numbered
/// before all of the other's.
pub fn commit_order(txs: &[ProbeTx], deliveries: &[Delivery]) -> Check {
    let sequence: BTreeMap<&str, i64> = deliveries
        .iter()
        .map(|d| (d.event_id.as_str(), d.sequence))
        .collect();
    let span = |tx: &ProbeTx| -> Option<(i64, i64)> {
        let seqs: Vec<i64> = tx
            .event_ids
            .iter()
            .filter_map(|id| sequence.get(id.as_str()).copied())
            .collect();
        Some((*seqs.iter().min()?, *seqs.iter().max()?))
    };
    let committed: Vec<(&ProbeTx, (i64, i64))> = txs
        .iter()
        .filter(|tx| tx.committed.is_some())
        .filter_map(|tx| Some((tx, span(tx)?)))
        .collect();
    let mut pairs = 0;
    let mut problem = None;
    'outer: for (a, (_, a_max)) in &committed {
        for (b, (b_min, _)) in &committed {
            if a.committed.is_some_and(|done| done < b.begun) {
                pairs += 1;
                if a_max >= b_min {
                    problem = Some(format!(
                        "event {} (sequence {a_max}) committed before the transaction of \
                         event {} (sequence {b_min}) began, but was numbered after it",
                        a.event_ids.last().unwrap(),
                        b.event_ids[0]
                    ));
                    break 'outer;
                }
            }
        }
    }
    Check::new(
        "commit_order",
        problem,
        format!("{pairs} ordered pairs of transactions numbered in commit order"),
    )
}

/// Every event of a committed transaction was delivered.
pub fn nothing_missing(txs: &[ProbeTx], deliveries: &[Delivery]) -> Check {
    let delivered: BTreeSet<&str> = deliveries.iter().map(|d| d.event_id.as_str()).collect();
    let committed: Vec<&str> = committed_ids(txs).collect();
    let missing: Vec<&&str> = committed
        .iter()
        .filter(|id| !delivered.contains(**id))
        .collect();
    let problem = (!missing.is_empty()).then(|| {
        format!(
            "{} of {} committed events were never delivered (first: {})",
            missing.len(),
            committed.len(),
            missing[0]
        )
    });
    Check::new(
        "nothing_missing",
        problem,
        format!("all {} committed events delivered", committed.len()),
    )
}

/// No event ID and no sequence was delivered twice.
pub fn nothing_duplicated(deliveries: &[Delivery]) -> Check {
    let mut ids = BTreeSet::new();
    let mut seqs = BTreeSet::new();
    let repeat = deliveries
        .iter()
        .find(|d| !ids.insert(d.event_id.as_str()) || !seqs.insert(d.sequence));
    let problem = repeat.map(|d| {
        format!(
            "event {} (sequence {}) delivered more than once",
            d.event_id, d.sequence
        )
    });
    Check::new(
        "nothing_duplicated",
        problem,
        format!("{} deliveries, each event once", deliveries.len()),
    )
}

/// No event of a rolled-back transaction was delivered.
pub fn nothing_rolled_back(txs: &[ProbeTx], deliveries: &[Delivery]) -> Check {
    let rolled_back: BTreeSet<&str> = txs
        .iter()
        .filter(|tx| tx.ending == Ending::RolledBack)
        .flat_map(|tx| tx.event_ids.iter().map(String::as_str))
        .collect();
    let leaked = deliveries
        .iter()
        .find(|d| rolled_back.contains(d.event_id.as_str()));
    let problem = leaked.map(|d| {
        format!(
            "event {} of a rolled-back transaction was delivered as sequence {}",
            d.event_id, d.sequence
        )
    });
    Check::new(
        "nothing_rolled_back",
        problem,
        format!("none of {} rolled-back events delivered", rolled_back.len()),
    )
}

/// Every delivered event was written by a probe transaction of this run (another writer in
/// the probe project would make the other checks meaningless).
pub fn only_probe_events(txs: &[ProbeTx], deliveries: &[Delivery]) -> Check {
    let written: BTreeSet<&str> = txs
        .iter()
        .flat_map(|tx| tx.event_ids.iter().map(String::as_str))
        .collect();
    let foreign = deliveries
        .iter()
        .find(|d| !written.contains(d.event_id.as_str()));
    let problem = foreign.map(|d| {
        format!(
            "event {} (sequence {}) was written by something other than this probe",
            d.event_id, d.sequence
        )
    });
    Check::new(
        "only_probe_events",
        problem,
        "every delivered event is this run's".to_owned(),
    )
}

/// The event IDs of committed transactions.
fn committed_ids(txs: &[ProbeTx]) -> impl Iterator<Item = &str> {
    txs.iter()
        .filter(|tx| tx.ending != Ending::RolledBack)
        .flat_map(|tx| tx.event_ids.iter().map(String::as_str))
}

/// Commit-to-delivery latency of each committed event's first delivery, in seconds, sorted.
pub fn latencies(txs: &[ProbeTx], deliveries: &[Delivery]) -> Vec<f64> {
    let mut first: BTreeMap<&str, Instant> = BTreeMap::new();
    for d in deliveries {
        first.entry(d.event_id.as_str()).or_insert(d.at);
    }
    let first = &first;
    let mut out: Vec<f64> = txs
        .iter()
        .filter_map(|tx| tx.committed.map(|at| (tx, at)))
        .flat_map(|(tx, committed)| {
            tx.event_ids.iter().filter_map(move |id| {
                let delivered = *first.get(id.as_str())?;
                Some(delivered.saturating_duration_since(committed).as_secs_f64())
            })
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tx(ids: &[&str], ending: Ending, begun: u64, committed: Option<u64>) -> ProbeTx {
        let base = base();
        ProbeTx {
            event_ids: ids.iter().map(|s| s.to_string()).collect(),
            ending,
            begun: base + Duration::from_millis(begun),
            committed: committed.map(|ms| base + Duration::from_millis(ms)),
        }
    }

    fn base() -> Instant {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }

    fn delivered(list: &[(i64, &str)]) -> Vec<Delivery> {
        list.iter()
            .map(|(sequence, id)| Delivery {
                sequence: *sequence,
                event_id: id.to_string(),
                at: base() + Duration::from_millis(100),
            })
            .collect()
    }

    fn history() -> Vec<ProbeTx> {
        vec![
            tx(&["a1", "a2"], Ending::Committed, 0, Some(5)),
            tx(&["late"], Ending::CommittedLate, 1, Some(30)),
            tx(&["gone"], Ending::RolledBack, 2, None),
            tx(&["b"], Ending::Committed, 10, Some(12)),
        ]
    }

    #[test]
    fn a_clean_history_passes_every_check() {
        let d = delivered(&[(8, "a1"), (9, "a2"), (10, "b"), (11, "late")]);
        let checks = run_all(&history(), &d, 7, 11);
        assert!(checks.iter().all(|c| c.ok), "{checks:?}");
        assert_eq!(latencies(&history(), &d).len(), 4);
    }

    #[test]
    fn each_fault_fails_its_own_check() {
        let h = history();
        let gap = delivered(&[(8, "a1"), (9, "a2"), (11, "late")]);
        assert!(!dense_numbering(&gap, 7, 11).ok);
        assert!(!nothing_missing(&h, &gap).ok);
        let short = delivered(&[(8, "a1"), (9, "a2"), (10, "b")]);
        assert!(
            !dense_numbering(&short, 7, 11).ok,
            "head beyond the last delivery"
        );
        let reordered = delivered(&[(8, "b"), (9, "a1"), (10, "a2"), (11, "late")]);
        assert!(!commit_order(&h, &reordered).ok);
        let twice = delivered(&[(8, "a1"), (9, "a2"), (10, "b"), (11, "late"), (11, "late")]);
        assert!(!nothing_duplicated(&twice).ok);
        let leaked = delivered(&[(8, "a1"), (9, "a2"), (10, "b"), (11, "late"), (12, "gone")]);
        assert!(!nothing_rolled_back(&h, &leaked).ok);
        let foreign = delivered(&[(8, "a1"), (9, "a2"), (10, "b"), (11, "late"), (12, "x")]);
        assert!(!only_probe_events(&h, &foreign).ok);
        assert!(
            only_probe_events(&h, &leaked).ok,
            "rolled back, not foreign"
        );
    }

    #[test]
    fn a_late_commit_may_be_numbered_after_transactions_that_began_later() {
        // "late" began first but committed last: numbering it last is commit order.
        let d = delivered(&[(1, "a1"), (2, "a2"), (3, "b"), (4, "late")]);
        assert!(commit_order(&history(), &d).ok);
    }
}
