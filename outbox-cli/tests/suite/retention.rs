//! The retention sweep against a real PostgreSQL: what it prunes and what it never prunes,
//! dead-letter retention, the exact floor, concurrent sweeps, pruning under live writing and
//! consuming, reconciliation after pruning, the runtime's schedule and `outbox prune`.
//!
//! Time is simulated by moving `occurred_at` / `resolved_at` back with UPDATE; nothing sleeps
//! for days.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use outbox_consumer::handler::ReconcileReason;
use outbox_consumer::{Handler, HandlerFailure, ObservedEvent};
use outbox_core::retention::{HoldBack, PruneOptions, PruneReport, Pruner};
use outbox_core::sequencer::Sequencer;
use outbox_core::{ProjectId, Schema};
use outbox_tests::consumer_kit::{
    Recorder, SeedEvent, WAIT, cursor, eventually, fast_config, seed_consumer, seed_delivery,
    start, start_with, write_event,
};
use outbox_tests::process_kit::run_outbox;
use outbox_tests::{TestDb, fresh_db};
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

/// Writes `n` events for `project` in one transaction (through the SQL writer) and numbers
/// them; returns the project's head.
async fn write_sequenced(db: &TestDb, project: &str, n: i64) -> i64 {
    let mut client = db.connect().await;
    client
        .execute(
            "SELECT outbox.write_task_deleted($1, 'bulk-' || g || '-' || $3::text, now(), 'w', NULL)
             FROM generate_series(1, $2::bigint) AS g",
            &[&project, &n, &rand::random::<u32>().to_string()],
        )
        .await
        .unwrap();
    Sequencer::new(&Schema::default())
        .drain(&mut client)
        .await
        .unwrap();
    head(db, project).await
}

async fn head(db: &TestDb, project: &str) -> i64 {
    db.connect()
        .await
        .query_opt(
            "SELECT head_sequence FROM outbox.lifecycle_project_heads WHERE project_id = $1",
            &[&project],
        )
        .await
        .unwrap()
        .map_or(0, |row| row.get(0))
}

async fn floor(db: &TestDb, project: &str) -> i64 {
    db.connect()
        .await
        .query_opt(
            "SELECT pruned_through FROM outbox.lifecycle_project_heads WHERE project_id = $1",
            &[&project],
        )
        .await
        .unwrap()
        .map_or(0, |row| row.get(0))
}

/// Moves events `from..=through` of `project` back in time by `days`.
async fn age(db: &TestDb, project: &str, from: i64, through: i64, days: i32) {
    db.connect()
        .await
        .execute(
            "UPDATE outbox.lifecycle_outbox
             SET occurred_at = occurred_at - make_interval(days => $4)
             WHERE project_id = $1 AND sequence BETWEEN $2 AND $3",
            &[&project, &from, &through, &days],
        )
        .await
        .unwrap();
}

async fn set_cursor(db: &TestDb, project: &str, consumer: &str, cursor: i64) {
    db.connect()
        .await
        .execute(
            "INSERT INTO outbox.lifecycle_consumer_positions
                 (project_id, consumer_id, last_acked_sequence)
             VALUES ($1, $2, $3)",
            &[&project, &consumer, &cursor],
        )
        .await
        .unwrap();
}

/// The delivery rows left, as (consumer, sequence, state), in order.
async fn deliveries(db: &TestDb, project: &str) -> Vec<(String, i64, String)> {
    db.connect()
        .await
        .query(
            "SELECT consumer_id, sequence, state FROM outbox.lifecycle_deliveries
             WHERE project_id = $1 ORDER BY consumer_id, sequence",
            &[&project],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

/// Retained sequences of `project`, in order.
async fn retained(db: &TestDb, project: &str) -> Vec<i64> {
    db.connect()
        .await
        .query(
            "SELECT sequence FROM outbox.lifecycle_outbox
             WHERE project_id = $1 AND sequence IS NOT NULL ORDER BY sequence",
            &[&project],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// The floor is exact: every event at or below it is gone, every one above it retained.
async fn assert_exact_floor(db: &TestDb, project: &str) {
    let (floor, head) = (floor(db, project).await, head(db, project).await);
    assert_eq!(
        retained(db, project).await,
        (floor + 1..=head).collect::<Vec<_>>(),
        "project {project}: floor {floor}, head {head}"
    );
}

fn options(retention: Duration) -> PruneOptions {
    PruneOptions {
        retention,
        ..PruneOptions::default()
    }
}

async fn prune(db: &TestDb, options: PruneOptions) -> PruneReport {
    let pruner = Pruner::new(&Schema::default(), options).unwrap();
    let mut client = db.connect().await;
    pruner.run(&mut client).await.unwrap()
}

fn entry<'r>(report: &'r PruneReport, project: &str) -> &'r outbox_core::retention::ProjectPrune {
    report
        .projects
        .iter()
        .find(|p| p.project_id == project)
        .unwrap_or_else(|| panic!("project {project} missing from {report:#?}"))
}

/// `pruned` audit rows as (project, consumer, actor, count).
async fn pruned_audits(db: &TestDb) -> Vec<(String, Option<String>, String, i64)> {
    db.connect()
        .await
        .query(
            "SELECT project_id, consumer_id, actor, count FROM outbox.lifecycle_audit
             WHERE kind = 'lifecycle-observation:pruned' ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect()
}

// ------------------------------------------------------------------------------------------
// The rule
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn prunes_exactly_the_old_events_every_active_consumer_acknowledged() {
    let db = fresh_db().await;
    assert_eq!(write_sequenced(&db, "p", 10).await, 10);
    seed_consumer(&db, "p", "fast", Some(10), false).await;
    seed_consumer(&db, "p", "slow", Some(6), false).await;
    age(&db, "p", 1, 8, 31).await;

    let report = prune(&db, PruneOptions::default()).await;
    assert!(report.complete && !report.dry_run);
    let p = entry(&report, "p");
    assert_eq!(
        (p.floor_before, p.floor, p.head, p.events_pruned),
        (0, 6, 10, 6)
    );
    assert_eq!(
        p.held_by,
        Some(HoldBack::Cursor {
            consumer_id: "slow".into(),
            cursor: 6
        }),
        "the slowest consumer holds the floor"
    );
    assert_eq!(retained(&db, "p").await, vec![7, 8, 9, 10]);
    assert_eq!(floor(&db, "p").await, 6);

    // Once it catches up, the age rule is what stops the floor: 9 and 10 are recent.
    set_cursor(&db, "p", "slow", 10).await;
    let report = prune(&db, PruneOptions::default()).await;
    let p = entry(&report, "p");
    assert_eq!((p.floor_before, p.floor, p.events_pruned), (6, 8, 2));
    assert_eq!(p.held_by, Some(HoldBack::Retention { sequence: 9 }));
    assert_exact_floor(&db, "p").await;

    // Nothing left that may go: a sweep changes nothing.
    let report = prune(&db, PruneOptions::default()).await;
    assert_eq!(report.events_pruned, 0);
    assert_eq!(floor(&db, "p").await, 8);

    // One audit row per project per sweep that pruned, with the count; ids and counts only.
    assert_eq!(
        pruned_audits(&db).await,
        vec![
            ("p".into(), None, "retention-sweep".into(), 6),
            ("p".into(), None, "retention-sweep".into(), 2),
        ]
    );
}

#[tokio::test]
async fn never_prunes_an_event_an_active_consumer_has_not_acknowledged() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 20).await;
    age(&db, "p", 1, 20, 400).await;
    seed_consumer(&db, "p", "c", Some(0), false).await;
    let report = prune(&db, options(Duration::ZERO)).await;
    assert_eq!(report.events_pruned, 0, "even with zero retention");
    assert_eq!(retained(&db, "p").await.len(), 20);
    for cursor in [1, 7, 19, 20] {
        set_cursor(&db, "p", "c", cursor).await;
        prune(&db, options(Duration::ZERO)).await;
        assert_eq!(floor(&db, "p").await, cursor);
        assert_exact_floor(&db, "p").await;
    }
}

#[tokio::test]
async fn a_consumer_without_a_cursor_holds_back_everything_until_retired() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 5).await;
    age(&db, "p", 1, 5, 60).await;
    seed_consumer(&db, "p", "done", Some(5), false).await;
    seed_consumer(&db, "p", "new", None, false).await;
    let report = prune(&db, PruneOptions::default()).await;
    assert_eq!(report.events_pruned, 0);
    assert_eq!(
        entry(&report, "p").held_by,
        Some(HoldBack::MissingCursor {
            consumer_id: "new".into()
        })
    );
    db.connect()
        .await
        .execute(
            "UPDATE outbox.lifecycle_consumers SET state = 'retired', retired_at = now()
             WHERE consumer_id = 'new'",
            &[],
        )
        .await
        .unwrap();
    let report = prune(&db, PruneOptions::default()).await;
    assert_eq!(report.events_pruned, 5);
    assert_eq!(
        entry(&report, "p").held_by,
        None,
        "the floor reached the head"
    );
    assert_exact_floor(&db, "p").await;
}

#[tokio::test]
async fn a_retired_consumer_never_holds_back_pruning() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 8).await;
    age(&db, "p", 1, 8, 31).await;
    seed_consumer(&db, "p", "active", Some(8), false).await;
    seed_consumer(&db, "p", "gone", Some(1), true).await;
    seed_consumer(&db, "p", "never-started", None, true).await;
    let report = prune(&db, PruneOptions::default()).await;
    assert_eq!(entry(&report, "p").floor, 8);
    assert!(retained(&db, "p").await.is_empty());
}

#[tokio::test]
async fn a_project_without_consumers_is_pruned_by_age_alone() {
    let db = fresh_db().await;
    write_sequenced(&db, "lonely", 6).await;
    write_sequenced(&db, "young", 3).await;
    age(&db, "lonely", 1, 4, 31).await;
    let report = prune(&db, PruneOptions::default()).await;
    assert_eq!(entry(&report, "lonely").floor, 4);
    assert_eq!(
        entry(&report, "young").held_by,
        Some(HoldBack::Retention { sequence: 1 })
    );
    assert_eq!(entry(&report, "young").events_pruned, 0);
    assert_exact_floor(&db, "lonely").await;
    assert_exact_floor(&db, "young").await;
}

#[tokio::test]
async fn the_floor_stops_at_the_first_young_event_even_if_later_ones_are_old() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 10).await;
    age(&db, "p", 1, 3, 31).await;
    age(&db, "p", 5, 10, 31).await; // 4 is recent: clock skew between writers, say
    let report = prune(&db, PruneOptions::default()).await;
    assert_eq!(entry(&report, "p").floor, 3);
    assert_eq!(retained(&db, "p").await, (4..=10).collect::<Vec<_>>());
}

#[tokio::test]
async fn dead_letter_retention_rules() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 10).await;
    age(&db, "p", 1, 10, 90).await;
    seed_consumer(&db, "p", "c", Some(10), false).await;
    seed_consumer(&db, "p", "r", Some(10), true).await;
    seed_delivery(&db, "p", "c", SeedEvent::Sequence(2), "resolved", 10, 31).await; // settled long ago: goes
    seed_delivery(&db, "p", "c", SeedEvent::Sequence(3), "resolved", 10, 1).await; // settled yesterday: kept
    seed_delivery(&db, "p", "c", SeedEvent::Sequence(4), "dead", 10, 0).await; // unresolved: kept, and so is event 4
    seed_delivery(&db, "p", "c", SeedEvent::Sequence(5), "replayed", 10, 31).await; // replayed long ago: goes
    seed_delivery(&db, "p", "c", SeedEvent::Sequence(6), "replayed", 10, 2).await; // replayed recently: kept
    seed_delivery(&db, "p", "r", SeedEvent::Sequence(7), "dead", 10, 0).await; // of a retired consumer: goes
    seed_delivery(&db, "p", "r", SeedEvent::Sequence(8), "resolved", 10, 0).await; // of a retired consumer: goes

    let dead_event = event_id_at(&db, "p", 4).await;
    let report = prune(&db, PruneOptions::default()).await;
    let p = entry(&report, "p");
    assert_eq!(
        p.floor, 3,
        "the unresolved dead letter's event stops the floor"
    );
    assert_eq!(
        p.held_by,
        Some(HoldBack::DeadLetter {
            consumer_id: "c".into(),
            event_id: dead_event,
            sequence: 4
        })
    );
    assert_eq!(p.dead_letters_pruned, 4);
    assert_eq!(
        deliveries(&db, "p").await,
        vec![
            ("c".into(), 3, "resolved".into()),
            ("c".into(), 4, "dead".into()),
            ("c".into(), 6, "replayed".into()),
        ]
    );
    assert_eq!(retained(&db, "p").await, (4..=10).collect::<Vec<_>>());
    let audits = pruned_audits(&db).await;
    assert!(audits.contains(&("p".into(), None, "retention-sweep".into(), 3)));
    assert!(audits.contains(&("p".into(), Some("c".into()), "retention-sweep".into(), 2)));
    assert!(audits.contains(&("p".into(), Some("r".into()), "retention-sweep".into(), 2)));

    // A replay request is still unresolved: it holds the event too.
    db.connect()
        .await
        .execute(
            "UPDATE outbox.lifecycle_deliveries SET state = 'replay_requested' WHERE sequence = 4",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(prune(&db, PruneOptions::default()).await.events_pruned, 0);

    // Resolved now: the event goes at the next sweep, the dead letter 30 days later.
    db.connect()
        .await
        .execute(
            "UPDATE outbox.lifecycle_deliveries SET state = 'resolved', resolved_at = now()
             WHERE sequence = 4",
            &[],
        )
        .await
        .unwrap();
    let report = prune(&db, PruneOptions::default()).await;
    assert_eq!(entry(&report, "p").floor, 10);
    assert_eq!(report.dead_letters_pruned, 0);
    assert_eq!(deliveries(&db, "p").await.len(), 3);
    db.connect()
        .await
        .execute(
            "UPDATE outbox.lifecycle_deliveries
             SET resolved_at = resolved_at - interval '31 days',
                 updated_at = updated_at - interval '31 days'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        prune(&db, PruneOptions::default())
            .await
            .dead_letters_pruned,
        3
    );
    assert!(deliveries(&db, "p").await.is_empty());
    assert_exact_floor(&db, "p").await;
}

async fn event_id_at(db: &TestDb, project: &str, sequence: i64) -> String {
    db.connect()
        .await
        .query_one(
            "SELECT event_id FROM outbox.lifecycle_outbox WHERE project_id = $1 AND sequence = $2",
            &[&project, &sequence],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_retired_consumers_dead_letter_does_not_hold_its_event() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 4).await;
    age(&db, "p", 1, 4, 31).await;
    seed_consumer(&db, "p", "r", Some(1), false).await;
    seed_delivery(&db, "p", "r", SeedEvent::Sequence(2), "dead", 10, 0).await;
    assert_eq!(prune(&db, PruneOptions::default()).await.events_pruned, 1);
    db.connect()
        .await
        .execute(
            "UPDATE outbox.lifecycle_consumers SET state = 'retired', retired_at = now()",
            &[],
        )
        .await
        .unwrap();
    let report = prune(&db, PruneOptions::default()).await;
    assert_eq!(report.events_pruned, 3);
    assert_eq!(report.dead_letters_pruned, 1);
    assert_exact_floor(&db, "p").await;
}

/// Random projects (cursors, retirements, missing cursors, dead letters in every state,
/// events of mixed ages) against a model of the rule: the floor is exactly the model's, and
/// exactly the model's delivery rows go.
#[tokio::test]
async fn matches_the_rule_on_random_projects() {
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let db = fresh_db().await;
    let states = [
        "retrying",
        "dead",
        "replay_requested",
        "replayed",
        "resolved",
    ];

    struct Model {
        project: String,
        head: i64,
        expected_floor: i64,
        kept_deliveries: Vec<(String, i64, String)>,
    }
    let mut models = Vec::new();
    for index in 0..24 {
        let project = format!("p{index}");
        let head = write_sequenced(&db, &project, rng.random_range(1..=30)).await;
        let mut old = vec![true; head as usize + 1];
        for sequence in 1..=head {
            old[sequence as usize] = rng.random_bool(0.85);
            if old[sequence as usize] {
                age(&db, &project, sequence, sequence, 31).await;
            }
        }
        let mut consumers = Vec::new();
        for c in 0..rng.random_range(0..=3) {
            let name = format!("c{c}");
            let retired = rng.random_bool(0.25);
            let cursor = if rng.random_bool(0.1) {
                None
            } else {
                Some(rng.random_range(0..=head))
            };
            seed_consumer(&db, &project, &name, cursor, retired).await;
            consumers.push((name, cursor, retired));
        }
        let mut kept = Vec::new();
        let mut held = BTreeSet::new();
        for (name, _, retired) in &consumers {
            for _ in 0..rng.random_range(0..=2) {
                let sequence = rng.random_range(1..=head);
                let state = states[rng.random_range(0..states.len())];
                let days = if rng.random_bool(0.5) { 31 } else { 1 };
                let exists = kept
                    .iter()
                    .any(|(c, s, _): &(String, i64, String)| c == name && *s == sequence)
                    || deliveries(&db, &project)
                        .await
                        .iter()
                        .any(|(c, s, _)| c == name && *s == sequence);
                if exists {
                    continue;
                }
                seed_delivery(
                    &db,
                    &project,
                    name,
                    SeedEvent::Sequence(sequence),
                    state,
                    10,
                    days,
                )
                .await;
                let settled_long_ago = matches!(state, "resolved" | "replayed") && days == 31;
                if !*retired && !settled_long_ago {
                    kept.push((name.clone(), sequence, state.to_owned()));
                }
                if !*retired && matches!(state, "dead" | "replay_requested") {
                    held.insert(sequence);
                }
            }
        }
        kept.sort();
        let active: Vec<Option<i64>> = consumers
            .iter()
            .filter(|(_, _, retired)| !retired)
            .map(|(_, cursor, _)| *cursor)
            .collect();
        let eligible = |sequence: i64| {
            old[sequence as usize]
                && !held.contains(&sequence)
                && active.iter().all(|c| c.is_some_and(|c| c >= sequence))
        };
        let mut expected_floor = 0;
        while expected_floor < head && eligible(expected_floor + 1) {
            expected_floor += 1;
        }
        models.push(Model {
            project,
            head,
            expected_floor,
            kept_deliveries: kept,
        });
    }

    let batch_size = rng.random_range(1..=7);
    let report = prune(
        &db,
        PruneOptions {
            batch_size,
            ..PruneOptions::default()
        },
    )
    .await;
    assert!(report.complete, "seed {seed}");
    for model in &models {
        let p = entry(&report, &model.project);
        let context = format!("seed {seed}, batch {batch_size}, project {}", model.project);
        assert_eq!(p.floor, model.expected_floor, "{context}: {p:?}");
        assert_eq!(p.events_pruned, model.expected_floor as u64, "{context}");
        assert_eq!(p.head, model.head, "{context}");
        assert_eq!(p.held_by.is_none(), p.floor == p.head, "{context}: {p:?}");
        assert_eq!(
            floor(&db, &model.project).await,
            model.expected_floor,
            "{context}"
        );
        assert_exact_floor(&db, &model.project).await;
        assert_eq!(
            deliveries(&db, &model.project).await,
            model.kept_deliveries,
            "{context}"
        );
    }
    let again = prune(&db, PruneOptions::default()).await;
    assert_eq!(
        (again.events_pruned, again.dead_letters_pruned),
        (0, 0),
        "seed {seed}: a second sweep finds nothing"
    );
}

// ------------------------------------------------------------------------------------------
// Batches, dry runs, audit
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn sweeps_in_bounded_batches_with_one_audit_row_per_project() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 1234).await;
    write_sequenced(&db, "q", 10).await;
    age(&db, "p", 1, 1234, 31).await;
    age(&db, "q", 1, 10, 31).await;
    let pruner = Pruner::new(
        &Schema::default(),
        PruneOptions {
            batch_size: 100,
            project: Some(ProjectId::new("p").unwrap()),
            actor: "test-actor".into(),
            ..PruneOptions::default()
        },
    )
    .unwrap();
    let mut client = db.connect().await;
    let mut sweep = pruner.sweep();
    let mut floors = Vec::new();
    while sweep.step(&mut client).await.unwrap() {
        // Between steps the committed floor is exact and moves by at most one batch.
        let f = floor(&db, "p").await;
        assert_eq!(
            retained(&db, "p").await.first().copied(),
            Some(f + 1).filter(|s| *s <= 1234)
        );
        floors.push(f);
    }
    let report = sweep.into_report();
    assert!(report.complete);
    assert_eq!(report.events_pruned, 1234);
    assert_eq!(report.projects.len(), 1, "--project selects one project");
    assert!(floors.windows(2).all(|w| w[1] - w[0] <= 100), "{floors:?}");
    assert!(floors.len() >= 13, "13 batches at least: {floors:?}");
    assert_eq!(
        pruned_audits(&db).await,
        vec![("p".into(), None, "test-actor".into(), 1234)]
    );
    assert_eq!(
        retained(&db, "q").await.len(),
        10,
        "another project is untouched"
    );
}

#[tokio::test]
async fn a_dry_run_reports_what_would_go_and_changes_nothing() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 50).await;
    age(&db, "p", 1, 40, 31).await;
    seed_consumer(&db, "p", "c", Some(45), false).await;
    seed_consumer(&db, "p", "r", Some(0), true).await;
    seed_delivery(&db, "p", "r", SeedEvent::Sequence(3), "dead", 10, 0).await;
    seed_delivery(&db, "p", "c", SeedEvent::Sequence(2), "resolved", 10, 40).await;
    let dry = prune(
        &db,
        PruneOptions {
            dry_run: true,
            batch_size: 7,
            ..PruneOptions::default()
        },
    )
    .await;
    assert!(dry.dry_run && dry.complete);
    assert_eq!(entry(&dry, "p").floor, 40);
    assert_eq!(dry.events_pruned, 40);
    assert_eq!(dry.dead_letters_pruned, 2);
    assert_eq!(floor(&db, "p").await, 0);
    assert_eq!(retained(&db, "p").await.len(), 50);
    assert_eq!(deliveries(&db, "p").await.len(), 2);
    assert!(pruned_audits(&db).await.is_empty());

    let real = prune(&db, PruneOptions::default()).await;
    assert_eq!(
        (
            real.events_pruned,
            real.dead_letters_pruned,
            entry(&real, "p").floor
        ),
        (
            dry.events_pruned,
            dry.dead_letters_pruned,
            entry(&dry, "p").floor
        ),
        "the dry run predicted the real sweep"
    );
    assert_eq!(entry(&real, "p").held_by, entry(&dry, "p").held_by);
}

// ------------------------------------------------------------------------------------------
// Concurrency
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn concurrent_sweeps_prune_each_event_once() {
    let db = fresh_db().await;
    for project in ["a", "b", "c"] {
        write_sequenced(&db, project, 700).await;
        age(&db, project, 1, 700, 31).await;
    }
    let mut sweeps = Vec::new();
    for _ in 0..6 {
        let db = db.clone();
        sweeps.push(tokio::spawn(async move {
            let pruner = Pruner::new(
                &Schema::default(),
                PruneOptions {
                    batch_size: 13,
                    ..PruneOptions::default()
                },
            )
            .unwrap();
            let mut client = db.connect().await;
            let mut reports = Vec::new();
            // Sweep until a sweep finds nothing more: sweeps wait for each other batch by
            // batch and split the work.
            loop {
                let report = pruner.run(&mut client).await.unwrap();
                assert!(report.complete, "a sweep never gives up on contention");
                let done = report.events_pruned == 0;
                reports.push(report);
                if done {
                    return reports;
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut total = 0;
    for sweep in sweeps {
        for report in sweep.await.unwrap() {
            total += report.events_pruned;
        }
    }
    assert_eq!(total, 2100, "every event pruned exactly once");
    for project in ["a", "b", "c"] {
        assert_eq!(floor(&db, project).await, 700);
        assert_exact_floor(&db, project).await;
    }
    let audited: i64 = pruned_audits(&db).await.iter().map(|a| a.3).sum();
    assert_eq!(audited, 2100, "the audit counts agree with what went");
}

/// One batch at a time: a sweep waits for the schema's `prune` lock, at most 5 s (then it
/// fails with a retryable lock timeout); a project with nothing to prune needs no lock.
#[tokio::test]
async fn a_sweep_waits_for_the_prune_lock_within_a_bound() {
    let db = fresh_db().await;
    write_sequenced(&db, "busy", 10).await;
    age(&db, "busy", 1, 10, 31).await;
    write_sequenced(&db, "idle", 3).await;
    let key = Schema::default().lock_key("prune");
    let mut holder = db.connect().await;

    // Nothing to prune: passes over the project without waiting for the lock.
    let tx = holder.transaction().await.unwrap();
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&key])
        .await
        .unwrap();
    let idle_only = PruneOptions {
        project: Some(ProjectId::new("idle").unwrap()),
        ..PruneOptions::default()
    };
    let report = tokio::time::timeout(Duration::from_secs(2), prune(&db, idle_only))
        .await
        .expect("no lock needed where nothing goes");
    assert_eq!(report.events_pruned, 0);

    // Work to do: it waits while the lock is held and proceeds once it is released.
    let waiting = tokio::spawn({
        let db = db.clone();
        async move { prune(&db, PruneOptions::default()).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the sweep waits for the lock");
    assert_eq!(floor(&db, "busy").await, 0);
    tx.commit().await.unwrap();
    let report = waiting.await.unwrap();
    assert_eq!(entry(&report, "busy").events_pruned, 10);

    // Held for longer than the bound: the sweep fails, retryably, and changes nothing.
    write_sequenced(&db, "busy", 5).await;
    age(&db, "busy", 11, 15, 31).await;
    let tx = holder.transaction().await.unwrap();
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&key])
        .await
        .unwrap();
    let pruner = Pruner::new(&Schema::default(), PruneOptions::default()).unwrap();
    let mut client = db.connect().await;
    let started = std::time::Instant::now();
    let error = pruner.run(&mut client).await.unwrap_err();
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE),
        "{error}"
    );
    assert!(error.is_retryable());
    tx.rollback().await.unwrap();
    assert_eq!(floor(&db, "busy").await, 10);
    assert_eq!(prune(&db, PruneOptions::default()).await.events_pruned, 5);
}

/// A handler slower than the writers, so the consumer lags and unacknowledged events pile up
/// in front of the sweepers.
#[derive(Clone)]
/// A handler 4 ms an event, and held back entirely until `released`: the writers must get
/// ahead of it on any machine, however slow its writes are.
struct Slow(Recorder, Arc<AtomicBool>);

impl Handler for Slow {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        while !self.1.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(4)).await;
        self.0.handle(event).await
    }
}

/// Writers, a lagging consumer (which also runs its own sweep every 50 ms) and three more
/// sweepers with zero retention, all at once: writers never fail, the consumer receives every
/// committed event exactly in order without falling back to reconciliation, and the floor
/// never passes its cursor.
#[tokio::test]
async fn pruning_during_live_writing_and_consuming_loses_nothing() {
    let db = fresh_db().await;
    let recorder = Recorder::default();
    let mut config = fast_config("p", "c");
    config.duties.prune_interval = Some(Duration::from_millis(50));
    config.duties.retention = Duration::ZERO;
    config.delivery.batch_size = 20;
    config.delivery.max_batch_size = 20;
    let released = Arc::new(AtomicBool::new(false));
    let (shutdown, run) = start_with(
        &db,
        config,
        Slow(recorder.clone(), released.clone()),
        recorder.clone(),
    );
    eventually(WAIT, "the consumer's cursor", || async {
        cursor(&db, "p", "c").await.is_some()
    })
    .await;

    let writing = Arc::new(AtomicBool::new(true));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (db, writing) = (db.clone(), writing.clone());
        writers.push(tokio::spawn(async move {
            let mut written = Vec::new();
            let mut i = 0;
            while writing.load(Ordering::Relaxed) {
                written.push(write_event(&db, "p", &format!("w{w}-{i}")).await);
                i += 1;
            }
            written
        }));
    }
    let stop_pruning = CancellationToken::new();
    let mut pruners = Vec::new();
    for _ in 0..3 {
        let (db, stop) = (db.clone(), stop_pruning.clone());
        pruners.push(tokio::spawn(async move {
            let pruner = Pruner::new(
                &Schema::default(),
                PruneOptions {
                    retention: Duration::ZERO,
                    batch_size: 7,
                    ..PruneOptions::default()
                },
            )
            .unwrap();
            let mut client = db.connect().await;
            let mut pruned = 0;
            while !stop.is_cancelled() {
                pruned += pruner.run(&mut client).await.unwrap().events_pruned;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            pruned
        }));
    }
    let seen_lag = Arc::new(AtomicI64::new(0));
    let checker = {
        let (db, stop, seen_lag) = (db.clone(), stop_pruning.clone(), seen_lag.clone());
        tokio::spawn(async move {
            let client = db.connect().await;
            let (mut samples, mut max_lag) = (0, 0);
            while !stop.is_cancelled() {
                // One statement, one snapshot: floor and cursor as of the same moment.
                if let Some(row) = client
                    .query_opt(
                        "SELECT h.pruned_through, c.last_acked_sequence, h.head_sequence
                         FROM outbox.lifecycle_project_heads AS h
                         JOIN outbox.lifecycle_consumer_cursors AS c USING (project_id)
                         WHERE h.project_id = 'p'",
                        &[],
                    )
                    .await
                    .unwrap()
                {
                    let (floor, cursor): (i64, Option<i64>) = (row.get(0), row.get(1));
                    let cursor = cursor.expect("the consumer has a cursor");
                    assert!(floor <= cursor, "floor {floor} passed the cursor {cursor}");
                    max_lag = max_lag.max(row.get::<_, i64>(2) - cursor);
                    seen_lag.store(max_lag, Ordering::Relaxed);
                    samples += 1;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (samples, max_lag)
        })
    };

    // Hold the handler until the consumer has fallen behind enough for the sweeps to have
    // unacknowledged events in front of them, then let it consume while the writers and the
    // sweeps go on.
    eventually(WAIT, "the consumer to fall 20 events behind", || {
        let lag = seen_lag.load(Ordering::Relaxed);
        async move { lag >= 20 }
    })
    .await;
    released.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    writing.store(false, Ordering::Relaxed);
    let mut committed = BTreeSet::new();
    for writer in writers {
        committed.extend(writer.await.expect("writers never fail"));
    }
    eventually(WAIT, "the consumer to catch up", || async {
        recorder.events().len() == committed.len()
    })
    .await;
    // Let the sweeps run once more over the fully acknowledged stream.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop_pruning.cancel();
    for pruner in pruners {
        pruner.await.expect("concurrent sweeps never fail");
    }
    let (samples, max_lag) = checker.await.unwrap();
    shutdown.cancel();
    run.await.unwrap().unwrap();

    let head = head(&db, "p").await;
    assert_eq!(head as usize, committed.len());
    assert_eq!(
        recorder.sequences(),
        (1..=head).collect::<Vec<_>>(),
        "every committed event, once, in order"
    );
    let delivered: BTreeSet<String> = recorder
        .events()
        .iter()
        .map(|e| e.event_id.clone())
        .collect();
    assert_eq!(delivered, committed);
    assert!(
        recorder.reconciliations().is_empty(),
        "no gap ever forced a reconciliation"
    );
    assert!(
        samples > 50,
        "the checker sampled the floor {samples} times"
    );
    assert!(
        max_lag >= 20,
        "the consumer lagged by up to {max_lag} events only: the sweeps never had \
         unacknowledged events in front of them"
    );
    let final_floor = floor(&db, "p").await;
    assert_eq!(
        final_floor, head,
        "everything acknowledged and old enough went"
    );
    assert_exact_floor(&db, "p").await;
    let audited: i64 = pruned_audits(&db).await.iter().map(|a| a.3).sum();
    assert_eq!(audited, head, "each pruned event audited once");
}

// ------------------------------------------------------------------------------------------
// Reconciliation after pruning
// ------------------------------------------------------------------------------------------

/// A consumer stopped long enough for its events to be pruned: retired meanwhile (so it no
/// longer holds retention back), its events pruned, then started with reactivation: it
/// reconciles from the live set and continues with new events.
#[tokio::test]
async fn a_reactivated_consumer_whose_events_were_pruned_reconciles_then_continues() {
    let db = fresh_db().await;
    let client = db.connect().await;
    client
        .batch_execute("INSERT INTO tasks (id, project_id) VALUES ('alive', 'p'), ('t9', 'p')")
        .await
        .unwrap();
    let recorder = Recorder::default();
    let mut config = fast_config("p", "c");
    config.duties.prune_interval = None;
    let (shutdown, run) = start(&db, config.clone(), &recorder);
    for i in 0..3 {
        write_event(&db, "p", &format!("t{i}")).await;
    }
    eventually(WAIT, "3 events", || async { recorder.events().len() == 3 }).await;
    shutdown.cancel();
    run.await.unwrap().unwrap();

    client
        .batch_execute(
            "UPDATE outbox.lifecycle_consumers
             SET state = 'retired', retired_at = now(), retired_by = 'test'",
        )
        .await
        .unwrap();
    for i in 3..6 {
        write_event(&db, "p", &format!("t{i}")).await;
    }
    write_sequenced(&db, "p", 0).await;
    age(&db, "p", 1, 6, 31).await;
    let report = prune(&db, PruneOptions::default()).await;
    assert_eq!(
        entry(&report, "p").floor,
        6,
        "the retired consumer held nothing back"
    );

    let recorder = Recorder::default();
    config.delivery.reactivate = true;
    let (shutdown, run) = start(&db, config, &recorder);
    eventually(WAIT, "a reconciliation", || async {
        !recorder.reconciliations().is_empty()
    })
    .await;
    let live = recorder.reconciliations()[0].clone();
    assert_eq!(
        live.reason,
        ReconcileReason::MissingCursor,
        "reactivation clears the cursor; history is gone, so Earliest reconciles too"
    );
    assert_eq!(live.head_sequence, 6);
    client
        .batch_execute("UPDATE tasks SET deleted_at = now() WHERE id = 't9'")
        .await
        .unwrap();
    write_event(&db, "p", "t9").await;
    eventually(WAIT, "the next event", || async {
        recorder.sequences() == vec![7]
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(cursor(&db, "p", "c").await, Some(7));
}

/// A new consumer asked to start from the earliest event after history was pruned reconciles
/// instead, and says why: `below_retention_floor`, not `missing_cursor` (which a new consumer
/// starting from the earliest event would have replayed).
#[tokio::test]
async fn a_new_consumer_from_the_earliest_event_after_pruning_reconciles_below_the_floor() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 4).await;
    age(&db, "p", 1, 4, 31).await;
    assert_eq!(prune(&db, PruneOptions::default()).await.events_pruned, 4);
    write_sequenced(&db, "p", 1).await;

    let recorder = Recorder::default();
    let mut config = fast_config("p", "new");
    config.duties.prune_interval = None;
    config.delivery.start_from = outbox_consumer::StartFrom::Earliest;
    let (shutdown, run) = start(&db, config, &recorder);
    eventually(WAIT, "a reconciliation", || async {
        !recorder.reconciliations().is_empty()
    })
    .await;
    let live = recorder.reconciliations()[0].clone();
    assert_eq!(live.reason, ReconcileReason::BelowRetentionFloor);
    assert_eq!(live.head_sequence, 5);
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

/// The cursor itself below the floor (a consumer row restored or re-enabled by hand after its
/// events were pruned): the runtime reconciles for that reason, then follows new events.
#[tokio::test]
async fn a_cursor_left_below_the_floor_by_pruning_reconciles_then_continues() {
    let db = fresh_db().await;
    let recorder = Recorder::default();
    let mut config = fast_config("p", "c");
    config.duties.prune_interval = None;
    let (shutdown, run) = start(&db, config.clone(), &recorder);
    for i in 0..2 {
        write_event(&db, "p", &format!("t{i}")).await;
    }
    eventually(WAIT, "2 events", || async { recorder.events().len() == 2 }).await;
    shutdown.cancel();
    run.await.unwrap().unwrap();

    let client = db.connect().await;
    client
        .batch_execute("UPDATE outbox.lifecycle_consumers SET state = 'retired'")
        .await
        .unwrap();
    for i in 2..5 {
        write_event(&db, "p", &format!("t{i}")).await;
    }
    write_sequenced(&db, "p", 0).await;
    age(&db, "p", 1, 5, 31).await;
    assert_eq!(prune(&db, PruneOptions::default()).await.events_pruned, 5);
    client
        .batch_execute("UPDATE outbox.lifecycle_consumers SET state = 'active'")
        .await
        .unwrap();
    assert_eq!(cursor(&db, "p", "c").await, Some(2));
    assert_eq!(floor(&db, "p").await, 5);

    let recorder = Recorder::default();
    let (shutdown, run) = start(&db, config, &recorder);
    eventually(WAIT, "a reconciliation", || async {
        !recorder.reconciliations().is_empty()
    })
    .await;
    assert_eq!(
        recorder.reconciliations()[0].reason,
        ReconcileReason::BelowRetentionFloor
    );
    write_event(&db, "p", "t5").await;
    eventually(WAIT, "the next event", || async {
        recorder.sequences() == vec![6]
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

// ------------------------------------------------------------------------------------------
// The runtime's schedule
// ------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_runtime_sweeps_its_project_at_start_and_on_schedule() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 4).await;
    write_sequenced(&db, "other", 4).await;
    age(&db, "p", 1, 4, 31).await;
    age(&db, "other", 1, 4, 31).await;
    seed_consumer(&db, "p", "c", Some(4), false).await;

    let recorder = Recorder::default();
    let mut config = fast_config("p", "c");
    config.duties.prune_interval = Some(Duration::from_secs(3600));
    let (shutdown, run) = start(&db, config.clone(), &recorder);
    eventually(WAIT, "the sweep at start", || async {
        floor(&db, "p").await == 4
    })
    .await;
    assert_eq!(floor(&db, "other").await, 0, "only its own project");
    assert_eq!(
        pruned_audits(&db).await,
        vec![("p".into(), None, "consumer:c".into(), 4)]
    );
    // The next sweep is an hour away: newer events stay, although acknowledged and, once
    // aged, prunable.
    for i in 0..3 {
        write_event(&db, "p", &format!("t{i}")).await;
    }
    eventually(WAIT, "3 events", || async { recorder.events().len() == 3 }).await;
    age(&db, "p", 5, 7, 31).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(floor(&db, "p").await, 4);
    shutdown.cancel();
    run.await.unwrap().unwrap();

    // A short interval prunes them while running.
    config.duties.prune_interval = Some(Duration::from_millis(100));
    let (shutdown, run) = start(&db, config.clone(), &recorder);
    eventually(WAIT, "a scheduled sweep", || async {
        floor(&db, "p").await == 7
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();

    // Disabled: nothing is pruned.
    for i in 3..5 {
        write_event(&db, "p", &format!("t{i}")).await;
    }
    config.duties.prune_interval = None;
    let (shutdown, run) = start(&db, config, &recorder);
    eventually(WAIT, "5 events", || async { recorder.events().len() == 5 }).await;
    age(&db, "p", 8, 9, 31).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(floor(&db, "p").await, 7);
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_failing_sweep_is_not_fatal_to_the_consumer() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 3).await;
    // Make every batch fail: the sweep cannot update the heads row.
    db.connect()
        .await
        .batch_execute(
            "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN IF NEW.pruned_through <> OLD.pruned_through THEN
                    RAISE EXCEPTION 'refused by test'; END IF; RETURN NEW; END $$;
             CREATE TRIGGER refuse BEFORE UPDATE ON outbox.lifecycle_projects
                 FOR EACH ROW EXECUTE FUNCTION public.refuse();",
        )
        .await
        .unwrap();
    let recorder = Recorder::default();
    let mut config = fast_config("p", "c");
    config.duties.prune_interval = Some(Duration::from_millis(50));
    config.duties.retention = Duration::ZERO;
    let (shutdown, run) = start(&db, config, &recorder);
    eventually(WAIT, "3 events", || async { recorder.events().len() == 3 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    write_event(&db, "p", "later").await;
    eventually(WAIT, "the 4th event", || async {
        recorder.events().len() == 4
    })
    .await;
    assert!(!run.is_finished(), "the consumer keeps running");
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(floor(&db, "p").await, 0);
    assert_eq!(
        retained(&db, "p").await.len(),
        4,
        "failed batches rolled back"
    );
}

// ------------------------------------------------------------------------------------------
// `outbox prune`
// ------------------------------------------------------------------------------------------

/// `outbox prune` on a terminal draws a progress line on stderr (spinner, elapsed time, what
/// went so far and the rate), erased at the end; with `--output json` it draws none, on a
/// terminal too. (Without a terminal, none either: `outbox_prune_prints_what_it_removed`.)
#[tokio::test]
async fn prune_shows_progress_on_a_terminal_unless_the_output_is_json() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 6).await;
    age(&db, "p", 1, 6, 31).await;
    let on_a_terminal = |extra: &'static str| {
        let command = format!(
            "'{}' --database-url '{}' prune --retention 0s --dry-run {extra}",
            outbox_tests::process_kit::outbox_binary().display(),
            db.url
        );
        async move {
            // `script` runs the command on a pseudo-terminal: stdout and stderr are a TTY.
            let output = tokio::process::Command::new("script")
                .args(["-qec", &command, "/dev/null"])
                .env("OUTBOX_LOG", "warn")
                .env_remove("DATABASE_URL")
                .stdin(std::process::Stdio::null())
                .output()
                .await
                .expect("run script (util-linux)");
            assert!(output.status.success(), "{output:?}");
            String::from_utf8_lossy(&output.stdout).into_owned()
        }
    };
    let table = on_a_terminal("").await;
    assert!(table.contains("dry run: project 1/1"), "{table:?}");
    assert!(table.contains("\r\x1b[2K"), "the line is erased: {table:?}");
    assert!(table.contains("would prune 6 event(s)"), "{table:?}");
    let json = on_a_terminal("--output json").await;
    assert!(!json.contains("dry run: project"), "{json:?}");
    assert!(!json.contains('\x1b'), "{json:?}");
    assert!(json.contains("\"events_pruned\":6"), "{json:?}");
}

/// A dry run's log says what it would prune, never that it pruned.
#[tokio::test]
async fn a_dry_run_logs_would_prune() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 3).await;
    age(&db, "p", 1, 3, 31).await;
    let output = tokio::process::Command::new(outbox_tests::process_kit::outbox_binary())
        .args(["--database-url", db.url.as_str(), "prune", "--dry-run"])
        .env("OUTBOX_LOG", "info")
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{err}");
    assert!(err.contains("would prune project=p events=3"), "{err}");
    assert!(!err.contains(" pruned"), "{err}");
    assert_eq!(floor(&db, "p").await, 0);
}

#[tokio::test]
async fn outbox_prune_prints_what_it_removed() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 12).await;
    write_sequenced(&db, "q", 2).await;
    age(&db, "p", 1, 12, 31).await;
    seed_consumer(&db, "p", "c", Some(9), false).await;
    seed_consumer(&db, "p", "r", Some(0), true).await;
    seed_delivery(&db, "p", "r", SeedEvent::Sequence(1), "dead", 10, 0).await;
    let url = db.url.as_str();

    let (code, out, err) = run_outbox(&[
        "--database-url",
        url,
        "prune",
        "--dry-run",
        "--batch-size",
        "4",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        err.is_empty(),
        "no progress output when stderr is not a terminal: {err:?}"
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "PROJECT",
            "HEAD",
            "FLOOR",
            "NEW_FLOOR",
            "EVENTS",
            "DEAD_LETTERS",
            "HELD_BY"
        ]
    );
    assert!(
        lines[1].starts_with("p ") && lines[1].contains("consumer c acknowledged up to 9"),
        "{out}"
    );
    let cells: Vec<&str> = lines[1].split_whitespace().take(6).collect();
    assert_eq!(cells, ["p", "12", "0", "9", "9", "1"], "{out}");
    assert!(lines[2].starts_with("q ") && lines[2].contains("within the retention period"));
    assert!(
        out.contains(
            "dry run: would prune 9 event(s) and 1 dead letter(s) in 2 project(s) \
                      (retention 30d, batches of 4)"
        ),
        "{out}"
    );
    assert_eq!(floor(&db, "p").await, 0, "a dry run deletes nothing");

    let (code, out, err) = run_outbox(&[
        "--database-url",
        url,
        "prune",
        "--project",
        "p",
        "--output",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["dry_run"], false);
    assert_eq!(report["complete"], true);
    assert_eq!(report["events_pruned"], 9);
    assert_eq!(report["dead_letters_pruned"], 1);
    assert_eq!(report["projects"].as_array().unwrap().len(), 1);
    let p = &report["projects"][0];
    assert_eq!(p["project_id"], "p");
    assert_eq!(p["floor"], 9);
    assert_eq!(p["held_by"]["reason"], "cursor");
    assert_eq!(p["held_by"]["consumer_id"], "c");
    assert_eq!(floor(&db, "p").await, 9);
    assert_eq!(
        pruned_audits(&db).await,
        vec![
            ("p".into(), None, "outbox-prune".into(), 9),
            ("p".into(), Some("r".into()), "outbox-prune".into(), 1),
        ]
    );

    let (code, out, _) = run_outbox(&[
        "--database-url",
        url,
        "prune",
        "--retention",
        "0s",
        "--project",
        "q",
    ])
    .await;
    assert_eq!(code, 0);
    assert!(
        out.contains("pruned 2 event(s) and 0 dead letter(s) in 1 project(s)"),
        "{out}"
    );

    // An unknown project is refused as by every command that names one.
    let (code, _, err) =
        run_outbox(&["--database-url", url, "prune", "--project", "nowhere"]).await;
    assert_eq!(code, 3, "{err}");
    assert_eq!(err, "error: project nowhere not found\n");
}

#[tokio::test]
async fn outbox_prune_refuses_bad_input_with_exit_2() {
    let db = fresh_db().await;
    let url = db.url.as_str();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["prune", "--batch-size", "0"], "0 is not in 1..=100000"),
        (vec!["prune", "--batch-size", "100001"], "--batch-size"),
        (vec!["prune", "--batch-size", "many"], "--batch-size"),
        (vec!["prune", "--retention", "a while"], "invalid duration"),
        (
            vec!["prune", "--retention", "40000days"],
            "at most 36500 days",
        ),
        (
            vec!["prune", "--project", "bad project"],
            "invalid project_id",
        ),
        (vec!["prune", "--output", "yaml"], "--output"),
        (
            vec![
                "consume",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--prune-interval",
                "0s",
            ],
            "must be greater than zero",
        ),
        (
            vec![
                "consume",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--retention",
                "soon",
            ],
            "invalid duration",
        ),
        (
            vec![
                "consume",
                "--project",
                "p",
                "--consumer-id",
                "c",
                "--no-prune",
                "--prune-interval",
                "5m",
            ],
            "cannot be used with",
        ),
    ];
    for (args, expected) in cases {
        let mut full = vec!["--database-url", url];
        full.extend(&args);
        let (code, out, err) = run_outbox(&full).await;
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
    let (code, _, err) = run_outbox(&["prune"]).await;
    assert_eq!(code, 2, "no database: {err}");
    assert!(err.contains("DATABASE_URL"), "{err}");
}

// ------------------------------------------------------------------------------------------
// outbox status: pruning backlog and held retention
// ------------------------------------------------------------------------------------------

/// `outbox status ARGS --output json` of project `project`, and the thresholds.
async fn status_of(db: &TestDb, project: &str, args: &[&str]) -> (serde_json::Value, String) {
    let mut all = vec!["--database-url", db.url.as_str(), "status"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--output", "json"]);
    let (code, out, err) = run_outbox(&all).await;
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entry = status["projects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["project_id"] == project)
        .unwrap_or_else(|| panic!("no project {project}: {out}"))
        .clone();
    (entry, status["thresholds"].to_string())
}

fn codes(project: &serde_json::Value) -> Vec<&str> {
    project["health"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect()
}

const DAY: f64 = 86_400.0;

#[tokio::test]
async fn outbox_status_flags_the_pruning_backlog_and_a_held_floor_until_pruned() {
    let db = fresh_db().await;
    write_sequenced(&db, "p", 10).await;
    write_sequenced(&db, "q", 3).await;
    age(&db, "p", 1, 10, 40).await;
    seed_consumer(&db, "p", "fast", Some(10), false).await;
    seed_consumer(&db, "p", "slow", Some(4), false).await;
    let url = db.url.as_str();

    // 1..=4 are prunable (no sweep ran); 5..=10 are 40 days old and held by `slow`.
    let (p, thresholds) = status_of(&db, "p", &[]).await;
    assert_eq!(p["prunable"], 4, "{p}");
    assert_eq!(p["prunable_capped"], false);
    assert!(p["oldest_retained_age_secs"].as_f64().unwrap() > 40.0 * DAY - 60.0);
    assert_eq!(p["held_by"]["reason"], "cursor");
    assert_eq!(p["held_by"]["consumer_id"], "slow");
    assert!(p["oldest_held_age_secs"].as_f64().unwrap() > 40.0 * DAY - 60.0);
    assert_eq!(codes(&p), ["retention_held"], "{p}");
    assert!(
        thresholds.contains(r#""max_prunable":100000"#),
        "{thresholds}"
    );
    assert!(
        thresholds.contains(r#""retention_secs":2592000.0"#),
        "{thresholds}"
    );
    assert!(
        thresholds.contains(r#""max_retention_overrun_secs":86400.0"#),
        "{thresholds}"
    );
    let (q, _) = status_of(&db, "q", &[]).await;
    assert_eq!(q["prunable"], 0);
    assert_eq!(q["held_by"]["reason"], "retention");
    assert!(q["oldest_held_age_secs"].as_f64().unwrap() < 3600.0);
    assert_eq!(codes(&q), ["ok"]);

    // The count stops at max_prunable + 1; the held floor is judged only within that bound.
    let (p, thresholds) = status_of(&db, "p", &["--max-prunable", "2"]).await;
    assert_eq!(p["prunable"], 3, "{p}");
    assert_eq!(p["prunable_capped"], true);
    assert_eq!(p["held_by"], serde_json::Value::Null);
    assert_eq!(codes(&p), ["pruning_backlog"], "{p}");
    assert!(thresholds.contains(r#""max_prunable":2"#), "{thresholds}");
    let (p, _) = status_of(&db, "p", &["--max-prunable", "4"]).await;
    assert_eq!(
        (p["prunable"].clone(), codes(&p)),
        (4.into(), vec!["retention_held"])
    );
    let (p, _) = status_of(&db, "p", &["--max-prunable", "3"]).await;
    assert_eq!(
        codes(&p),
        ["pruning_backlog"],
        "4 prunable, counted as 4+: {p}"
    );
    // A longer overrun tolerates the held events; a shorter retention makes q prunable.
    let (p, _) = status_of(&db, "p", &["--max-retention-overrun", "11d"]).await;
    assert_eq!(codes(&p), ["ok"], "{p}");
    let (q, _) = status_of(&db, "q", &["--retention", "0s", "--max-prunable", "2"]).await;
    assert_eq!(q["prunable"], 3, "{q}");
    assert_eq!(codes(&q), ["pruning_backlog"], "{q}");

    // The table shows the same.
    let (code, table, err) =
        run_outbox(&["--database-url", url, "status", "--max-prunable", "2"]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "PROJECT",
            "HEAD",
            "UNSEQUENCED",
            "OLDEST_UNSEQUENCED",
            "PRUNED_THROUGH",
            "PRUNABLE",
            "OLDEST_RETAINED",
            "HELD_BY",
            "HEALTH"
        ]
    );
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(cells[0], "p", "{table}");
    assert_eq!(cells[5..7], ["3+", "40d00h"], "{table}");
    assert_eq!(cells.last(), Some(&"pruning_backlog"), "{table}");
    let (code, table, _) = run_outbox(&["--database-url", url, "status"]).await;
    assert_eq!(code, 0);
    let p_line = table.lines().find(|l| l.starts_with("p ")).unwrap();
    assert!(
        p_line.contains(" 4 ")
            && p_line.contains("consumer slow acknowledged up to 4")
            && p_line.ends_with("retention_held"),
        "{table}"
    );

    // The sweep clears the backlog; `slow` still holds the rest.
    let (code, _, err) = run_outbox(&["--database-url", url, "prune"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(floor(&db, "p").await, 4);
    let (p, _) = status_of(&db, "p", &["--max-prunable", "2"]).await;
    assert_eq!(p["prunable"], 0);
    assert_eq!(codes(&p), ["retention_held"], "{p}");

    // `slow` catches up, but an unresolved dead letter of `fast` at 7 holds the floor.
    set_cursor(&db, "p", "slow", 10).await;
    seed_delivery(&db, "p", "fast", SeedEvent::Sequence(7), "dead", 10, 0).await;
    let (p, _) = status_of(&db, "p", &[]).await;
    assert_eq!(p["prunable"], 2, "{p}");
    assert_eq!(p["held_by"]["reason"], "dead_letter");
    assert_eq!(p["held_by"]["sequence"], 7);
    assert_eq!(codes(&p), ["retention_held"], "{p}");

    // Resolved, nothing holds the floor: a backlog (at least 3 of 6), not a held floor.
    let event = event_id_at(&db, "p", 7).await;
    let (code, _, err) = run_outbox(&[
        "--database-url",
        url,
        "dead-letters",
        "resolve",
        "--project",
        "p",
        "--consumer-id",
        "fast",
        "--event-id",
        &event,
        "--by",
        "test",
        "--reason",
        "not needed",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let (p, _) = status_of(&db, "p", &["--max-prunable", "2"]).await;
    assert_eq!(
        (p["prunable"].clone(), p["prunable_capped"].clone()),
        (3.into(), true.into())
    );
    assert_eq!(codes(&p), ["pruning_backlog"], "{p}");
    let (p, _) = status_of(&db, "p", &[]).await;
    assert_eq!(p["prunable"], 6, "{p}");
    assert_eq!(p["held_by"], serde_json::Value::Null);
    assert_eq!(codes(&p), ["ok"], "{p}");

    // The sweep empties the project: both codes clear.
    let (code, _, err) = run_outbox(&["--database-url", url, "prune"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(floor(&db, "p").await, 10);
    let (p, _) = status_of(
        &db,
        "p",
        &["--max-prunable", "0", "--max-retention-overrun", "0s"],
    )
    .await;
    assert_eq!(p["prunable"], 0, "{p}");
    assert_eq!(p["oldest_retained_age_secs"], serde_json::Value::Null);
    assert_eq!(p["oldest_held_age_secs"], serde_json::Value::Null);
    assert_eq!(codes(&p), ["ok"], "{p}");
    let (q, _) = status_of(
        &db,
        "q",
        &["--max-prunable", "0", "--max-retention-overrun", "0s"],
    )
    .await;
    assert_eq!(
        codes(&q),
        ["ok"],
        "young events are neither a backlog nor held: {q}"
    );
}
