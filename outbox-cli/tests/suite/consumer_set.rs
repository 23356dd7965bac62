//! Consumer sets (many (project, consumer) pairs in one process): order per pair, isolation
//! of a poison event and of a lost lease, discovery of new projects, and the connection
//! budget of pool size + 1.

use std::time::Duration;

use outbox_consumer::{ConsumerError, Projects, RetrySchedule};
use outbox_tests::consumer_kit::{
    WAIT, cursor, eventually, fast_delivery, fast_duties, write_event,
};
use outbox_tests::fresh_db;
use outbox_tests::set_kit::{
    Recorders, SET_APPLICATION, SET_LISTENER, SetConfig, connections_named, listed, start_set,
};

/// Every connection of the test set: its pool's and its listener's.
async fn set_connections(db: &outbox_tests::TestDb) -> i64 {
    connections_named(db, SET_APPLICATION).await + connections_named(db, SET_LISTENER).await
}

/// The configuration of every test set.
fn template() -> SetConfig {
    SetConfig {
        delivery: fast_delivery(),
        duties: fast_duties(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_projects_are_each_delivered_in_order_to_every_consumer() {
    let db = fresh_db().await;
    let recorders = Recorders::default();
    let projects = ["p1", "p2", "p3"];
    let (shutdown, run) = start_set(
        &db,
        template(),
        listed(&projects),
        &["c1", "c2"],
        4,
        true,
        &recorders,
    );
    for i in 0..10 {
        for project in projects {
            write_event(&db, project, &format!("{project}-t{i}")).await;
        }
    }
    let expected: Vec<i64> = (1..=10).collect();
    for project in projects {
        for consumer in ["c1", "c2"] {
            eventually(
                WAIT,
                &format!("{project}/{consumer} to get 10 events"),
                || async { recorders.sequences(project, consumer).len() >= 10 },
            )
            .await;
            assert_eq!(
                recorders.sequences(project, consumer),
                expected,
                "{project}/{consumer}"
            );
            let tasks: Vec<String> = recorders
                .of(project, consumer)
                .events()
                .iter()
                .map(|e| e.task_id.clone())
                .collect();
            let written: Vec<String> = (0..10).map(|i| format!("{project}-t{i}")).collect();
            assert_eq!(
                tasks, written,
                "{project}/{consumer} got its own project's events"
            );
        }
    }
    shutdown.cancel();
    let outcomes = run.await.unwrap().unwrap();
    assert_eq!(outcomes.len(), 6);
    for outcome in outcomes {
        let summary = outcome.result.expect("every pair stops cleanly");
        assert_eq!(summary.cursor, Some(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_event_in_one_project_does_not_stall_another() {
    let db = fresh_db().await;
    let recorders = Recorders::default();
    recorders.of("a", "c").fail_task("poison");
    let mut config = template();
    // Long enough that project a stays held on the poison event for the whole test.
    config.delivery.retry = RetrySchedule::new(vec![Duration::from_secs(30)], 10).unwrap();
    let (shutdown, run) = start_set(
        &db,
        config,
        listed(&["a", "b"]),
        &["c"],
        4,
        true,
        &recorders,
    );
    write_event(&db, "a", "fine").await;
    write_event(&db, "a", "poison").await;
    for i in 0..20 {
        write_event(&db, "a", &format!("a-after-{i}")).await;
        write_event(&db, "b", &format!("b-{i}")).await;
    }
    eventually(WAIT, "project b to be delivered in full", || async {
        cursor(&db, "b", "c").await == Some(20)
    })
    .await;
    assert_eq!(recorders.sequences("b", "c"), (1..=20).collect::<Vec<_>>());
    assert_eq!(
        cursor(&db, "a", "c").await,
        Some(1),
        "a is held before the poison event"
    );
    assert_eq!(
        recorders.sequences("a", "c"),
        vec![1, 2],
        "a tried the poison event once"
    );
    let retrying: i64 = db
        .connect()
        .await
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_deliveries \
             WHERE project_id = 'a' AND consumer_id = 'c' AND sequence = 2 AND state = 'retrying'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        retrying, 1,
        "the poison event's retry is saved for its own pair"
    );
    // Project b keeps flowing while a waits.
    write_event(&db, "b", "b-later").await;
    eventually(WAIT, "a later event of b", || async {
        cursor(&db, "b", "c").await == Some(21)
    })
    .await;
    shutdown.cancel();
    for outcome in run.await.unwrap().unwrap() {
        outcome.result.expect("both pairs stop cleanly");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_lease_stops_only_its_pair() {
    let db = fresh_db().await;
    let recorders = Recorders::default();
    let (shutdown, run) = start_set(
        &db,
        template(),
        listed(&["p1", "p2"]),
        &["c1", "c2"],
        4,
        true,
        &recorders,
    );
    write_event(&db, "p1", "first").await;
    eventually(
        WAIT,
        "every pair to deliver and acknowledge the first event",
        || async {
            recorders.sequences("p1", "c1") == vec![1]
                && recorders.sequences("p1", "c2") == vec![1]
                && cursor(&db, "p1", "c1").await == Some(1)
        },
    )
    .await;
    // Another process takes p1/c1 over (as after a pause longer than the lease).
    let stolen = db
        .connect()
        .await
        .execute(
            "UPDATE outbox.lifecycle_consumers \
             SET lease_owner = 'thief', lease_generation = lease_generation + 1, \
                 claimed_until = now() + interval '1 hour' \
             WHERE project_id = 'p1' AND consumer_id = 'c1'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(stolen, 1);
    // The set's next heartbeat (every 300 ms) finds the lease gone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..5 {
        write_event(&db, "p1", &format!("p1-{i}")).await;
        write_event(&db, "p2", &format!("p2-{i}")).await;
    }
    eventually(WAIT, "the other pairs to go on", || async {
        cursor(&db, "p1", "c2").await == Some(6)
            && cursor(&db, "p2", "c1").await == Some(5)
            && cursor(&db, "p2", "c2").await == Some(5)
    })
    .await;
    assert_eq!(
        recorders.sequences("p1", "c1"),
        vec![1],
        "the robbed pair stopped"
    );
    assert_eq!(cursor(&db, "p1", "c1").await, Some(1));
    assert!(
        !run.is_finished(),
        "the set goes on without the robbed pair"
    );
    shutdown.cancel();
    let outcomes = run.await.unwrap().unwrap();
    assert_eq!(outcomes.len(), 4);
    for outcome in outcomes {
        let pair = (outcome.project_id.as_str(), outcome.consumer_id.as_str());
        match pair {
            ("p1", "c1") => assert!(
                matches!(outcome.result, Err(ConsumerError::LeaseLost { .. })),
                "p1/c1: {:?}",
                outcome.result
            ),
            _ => {
                outcome.result.unwrap_or_else(|e| panic!("{pair:?}: {e}"));
            }
        }
    }
}

/// With LISTEN and a poll too slow to matter, the notification naming a new project finds
/// it; without LISTEN, the poll of every project's head finds it within a poll interval.
async fn all_projects_follows_a_project_that_appears_later(listen: bool) {
    let db = fresh_db().await;
    write_event(&db, "early", "e1").await;
    outbox_core::sequencer::Sequencer::new(&outbox_core::Schema::default())
        .drain(&mut db.connect().await)
        .await
        .unwrap();
    let recorders = Recorders::default();
    let mut config = template();
    if listen {
        config.delivery.poll_interval = Duration::from_secs(600);
    }
    let (shutdown, run) = start_set(
        &db,
        config,
        Projects::All,
        &["c1", "c2"],
        4,
        listen,
        &recorders,
    );
    eventually(WAIT, "the existing project", || async {
        recorders.sequences("early", "c1") == vec![1]
            && recorders.sequences("early", "c2") == vec![1]
    })
    .await;
    write_event(&db, "late", "l1").await;
    write_event(&db, "late", "l2").await;
    for consumer in ["c1", "c2"] {
        eventually(WAIT, &format!("the new project for {consumer}"), || async {
            recorders.sequences("late", consumer) == vec![1, 2]
        })
        .await;
    }
    shutdown.cancel();
    let outcomes = run.await.unwrap().unwrap();
    assert_eq!(outcomes.len(), 4, "two projects, two consumers each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_projects_discovers_a_new_project_by_its_notification() {
    all_projects_follows_a_project_that_appears_later(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_projects_discovers_a_new_project_by_polling_without_listen() {
    all_projects_follows_a_project_that_appears_later(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_consumers_hold_at_most_pool_size_plus_one_connections() {
    let db = fresh_db().await;
    let recorders = Recorders::default();
    let projects: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    let names: Vec<&str> = projects.iter().map(String::as_str).collect();
    let consumers = ["c0", "c1", "c2", "c3", "c4"];
    let pool_size = 4;
    let (shutdown, run) = start_set(
        &db,
        template(),
        listed(&names),
        &consumers,
        pool_size,
        true,
        &recorders,
    );
    let mut most = 0;
    for (i, project) in names.iter().enumerate() {
        write_event(&db, project, &format!("t{i}")).await;
        most = most.max(set_connections(&db).await);
    }
    for project in &names {
        for consumer in consumers {
            eventually(WAIT, &format!("{project}/{consumer}"), || async {
                recorders.sequences(project, consumer) == vec![1]
            })
            .await;
        }
    }
    most = most.max(set_connections(&db).await);
    assert!(
        most <= pool_size as i64 + 1,
        "{most} connections for 100 consumers on a pool of {pool_size}"
    );
    assert!(most >= 2, "the pool and the listener were counted ({most})");
    assert_eq!(
        connections_named(&db, SET_LISTENER).await,
        1,
        "one LISTEN connection for the whole set"
    );
    shutdown.cancel();
    assert_eq!(run.await.unwrap().unwrap().len(), 100);
}
