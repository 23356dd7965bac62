//! The sequencer: dense, gap-free, never n+1 before n, whatever order writers commit in.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use outbox_core::sequencer::Sequencer;
use outbox_core::{
    Prior, ProjectId, Schema, TaskDeleted, TaskId, WriteOutcome, Writer, WriterProcessId,
};
use outbox_tests::stats_kit::{assert_the_counters_move, event_table_reads};
use outbox_tests::{TestDb, fresh_db, hold_snapshot, sequenced};
use rand::Rng;
use tokio::sync::Mutex;

const PROJECTS: [&str; 4] = ["alpha", "beta", "gamma", "delta"];

fn writer(n: usize) -> Writer {
    Writer::new(
        &Schema::default(),
        WriterProcessId::new(format!("writer-{n}")).unwrap(),
    )
}

fn event(project: &str, task: String) -> TaskDeleted {
    TaskDeleted::new(
        ProjectId::new(project).unwrap(),
        TaskId::new(task).unwrap(),
        Utc::now(),
        Prior::default(),
    )
    .unwrap()
}

#[derive(Default)]
struct Ledger {
    committed: BTreeMap<String, BTreeSet<String>>,
    rolled_back: BTreeSet<String>,
}

/// Reads every project's visible sequences and checks each is exactly 1..=k.
async fn check_prefix(client: &tokio_postgres::Client) -> usize {
    let rows = client
        .query(
            "SELECT project_id, array_agg(sequence ORDER BY sequence) \
             FROM outbox.lifecycle_outbox WHERE sequence IS NOT NULL GROUP BY project_id",
            &[],
        )
        .await
        .unwrap();
    let mut seen = 0;
    for row in rows {
        let project: String = row.get(0);
        let sequences: Vec<i64> = row.get(1);
        let expected: Vec<i64> = (1..=sequences.len() as i64).collect();
        assert_eq!(
            sequences, expected,
            "project {project}: visible sequences are not a dense prefix"
        );
        seen += sequences.len();
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gap_free_under_hostile_commit_order() {
    let db = fresh_db().await;
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));

    // The sequencer ticks continuously while writers run.
    let sequencer = {
        let db = db.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut client = db.connect().await;
            let sequencer = Sequencer::new(&Schema::default()).with_batch(7);
            let mut ticks = 0u64;
            while !stop.load(Ordering::Relaxed) {
                sequencer.tick(&mut client).await.unwrap();
                ticks += 1;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            ticks
        })
    };

    // A sampler checks the visible prefix again and again during the run.
    let sampler = {
        let db = db.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let client = db.connect().await;
            let mut samples = 0u64;
            while !stop.load(Ordering::Relaxed) {
                check_prefix(&client).await;
                samples += 1;
            }
            samples
        })
    };

    // One slow-committing writer: writes first, then sleeps in its transaction.
    let slow = {
        let db = db.clone();
        let ledger = ledger.clone();
        tokio::spawn(async move {
            let mut client = db.connect().await;
            let tx = client.transaction().await.unwrap();
            let e = event("alpha", "slow-task".into());
            writer(99).record(&tx, &e).await.unwrap();
            tx.execute("SELECT pg_sleep(1.5)", &[]).await.unwrap();
            tx.commit().await.unwrap();
            ledger
                .lock()
                .await
                .committed
                .entry("alpha".into())
                .or_default()
                .insert(e.event_id());
        })
    };

    let mut writers = Vec::new();
    for w in 0..16 {
        let db = db.clone();
        let ledger = ledger.clone();
        writers.push(tokio::spawn(async move {
            let mut client = db.connect().await;
            for i in 0..25 {
                let (project, sleep_ms, roll_back) = {
                    let mut rng = rand::rng();
                    (
                        PROJECTS[rng.random_range(0..PROJECTS.len())],
                        rng.random_range(0..=50u64),
                        rng.random_bool(0.1),
                    )
                };
                let e = event(project, format!("w{w}-t{i}"));
                let tx = client.transaction().await.unwrap();
                let outcome = writer(w).record(&tx, &e).await.unwrap();
                assert!(matches!(outcome, WriteOutcome::Recorded { .. }));
                tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
                if roll_back {
                    tx.rollback().await.unwrap();
                    ledger.lock().await.rolled_back.insert(e.event_id());
                } else {
                    tx.commit().await.unwrap();
                    ledger
                        .lock()
                        .await
                        .committed
                        .entry(project.into())
                        .or_default()
                        .insert(e.event_id());
                }
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    slow.await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let ticks = sequencer.await.unwrap();
    let samples = sampler.await.unwrap();
    assert!(
        ticks > 10 && samples > 10,
        "ticks {ticks}, samples {samples}"
    );

    let mut client = db.connect().await;
    Sequencer::new(&Schema::default())
        .drain(&mut client)
        .await
        .unwrap();
    check_prefix(&client).await;
    let ledger = ledger.lock().await;
    assert!(
        !ledger.rolled_back.is_empty(),
        "the run rolled some writers back"
    );
    let mut total = 0;
    for project in PROJECTS {
        let rows = sequenced(&client, project).await;
        let sequences: Vec<i64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(sequences, (1..=rows.len() as i64).collect::<Vec<_>>());
        let ids: BTreeSet<String> = rows.into_iter().map(|r| r.1).collect();
        let expected = ledger.committed.get(project).cloned().unwrap_or_default();
        assert_eq!(ids, expected, "project {project}: committed set differs");
        assert!(ids.is_disjoint(&ledger.rolled_back));
        total += ids.len();
    }
    let unsequenced: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(unsequenced, 0);
    assert_eq!(total, 16 * 25 + 1 - ledger.rolled_back.len());
    let heads = client
        .query(
            "SELECT project_id, head_sequence FROM outbox.lifecycle_project_heads",
            &[],
        )
        .await
        .unwrap();
    for row in heads {
        let project: String = row.get(0);
        let head: i64 = row.get(1);
        assert_eq!(head as usize, ledger.committed[&project].len());
    }
}

async fn write_committed(db: &TestDb, project: &str, task: &str) -> String {
    let mut client = db.connect().await;
    let tx = client.transaction().await.unwrap();
    let e = event(project, task.into());
    writer(1).record(&tx, &e).await.unwrap();
    tx.commit().await.unwrap();
    e.event_id()
}

#[tokio::test]
async fn open_transactions_elsewhere_do_not_stall_sequencing() {
    let db = fresh_db().await;
    // An unrelated long transaction holding a snapshot and an xid.
    let mut idle = db.connect().await;
    let (idle_tx, _) = hold_snapshot(&mut idle, "SELECT txid_current()").await;
    idle_tx
        .batch_execute("INSERT INTO tasks (id, project_id) VALUES ('x', 'p')")
        .await
        .unwrap();
    // An outbox writer that has written but not committed.
    let mut pending = db.connect().await;
    let pending_tx = pending.transaction().await.unwrap();
    let early = event("p", "early".into());
    writer(2).record(&pending_tx, &early).await.unwrap();

    let later = write_committed(&db, "p", "later").await;
    let mut client = db.connect().await;
    let sequencer = Sequencer::new(&Schema::default());
    let tick = sequencer.tick(&mut client).await.unwrap();
    assert!(tick.ran);
    assert_eq!(tick.numbered, 1, "the committed event is numbered at once");
    assert_eq!(tick.heads, vec![("p".to_owned(), 1)]);
    assert_eq!(sequenced(&client, "p").await, vec![(1, later.clone())]);

    // The earlier-inserted event commits late: it is numbered after, never before, 1.
    pending_tx.commit().await.unwrap();
    sequencer.tick(&mut client).await.unwrap();
    assert_eq!(
        sequenced(&client, "p").await,
        vec![(1, later), (2, early.event_id())]
    );
    idle_tx.rollback().await.unwrap();
}

/// A session in a transaction that holds the sequencer's lock, as a tick in progress holds
/// it; `COMMIT` on it releases the lock.
async fn hold_sequencer_lock(db: &TestDb) -> tokio_postgres::Client {
    let holder = db.connect().await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&Schema::default().lock_key("sequence")],
        )
        .await
        .unwrap();
    holder
}

#[tokio::test]
async fn a_held_lock_makes_other_sequencers_skip() {
    let db = fresh_db().await;
    let holder = hold_sequencer_lock(&db).await;
    let mut client = db.connect().await;
    let sequencer = Sequencer::new(&Schema::default());
    // With nothing to number the tick ends at its probe, before asking for the lock.
    let idle = sequencer.tick(&mut client).await.unwrap();
    assert!(idle.ran, "an idle tick does not ask for the lock");
    write_committed(&db, "p", "a").await;
    let tick = sequencer.tick(&mut client).await.unwrap();
    assert!(!tick.ran);
    assert_eq!(tick.numbered, 0);
    holder.batch_execute("COMMIT").await.unwrap();
    assert_eq!(sequencer.tick(&mut client).await.unwrap().numbered, 1);
}

/// A reconciliation reads the head right after draining; another sequencer's tick, holding
/// the lock, may be numbering the very events it means to include. `drain` stops at the lock;
/// `drain_through` waits for the holder to commit, and gives up only after its patience.
#[tokio::test]
async fn draining_through_waits_out_another_sequencers_tick() {
    let db = fresh_db().await;
    let holder = hold_sequencer_lock(&db).await;
    write_committed(&db, "p", "a").await;
    let mut client = db.connect().await;
    let sequencer = Sequencer::new(&Schema::default());
    assert_eq!(sequencer.drain(&mut client).await.unwrap(), 0);
    let started = std::time::Instant::now();
    assert_eq!(
        sequencer
            .drain_through(&mut client, Duration::from_millis(200))
            .await
            .unwrap(),
        0,
        "past its patience it leaves the events to the holder"
    );
    assert!(started.elapsed() >= Duration::from_millis(200));

    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.batch_execute("COMMIT").await.unwrap();
    });
    assert_eq!(
        sequencer
            .drain_through(&mut client, Duration::from_secs(30))
            .await
            .unwrap(),
        1,
        "numbered once the holder's transaction ended"
    );
    assert_eq!(sequenced(&client, "p").await.len(), 1);
    release.await.unwrap();
}

/// A drain with a deadline stops at it even while full batches keep coming (here: a backlog
/// of many batches and a deadline already passed: one tick), so an elected sequencer gets
/// back to its lease between batches.
#[tokio::test]
async fn draining_until_a_deadline_stops_at_it_with_batches_still_full() {
    let db = fresh_db().await;
    for i in 0..10 {
        write_committed(&db, "p", &format!("t{i}")).await;
    }
    let mut client = db.connect().await;
    let sequencer = Sequencer::new(&Schema::default()).with_batch(3);
    let passed = tokio::time::Instant::now();
    assert_eq!(
        sequencer.drain_until(&mut client, passed).await.unwrap(),
        3,
        "one tick, then the deadline"
    );
    let later = tokio::time::Instant::now() + Duration::from_secs(60);
    assert_eq!(sequencer.drain_until(&mut client, later).await.unwrap(), 7);
    assert_eq!(sequenced(&client, "p").await.len(), 10);
}

/// An elected sequencer's step under a backlog far larger than its renewal interval allows
/// returns to renew: it numbers part of the backlog, not all of it (a step that drained
/// everything starved the lease's renewals while writers kept batches full).
#[tokio::test]
async fn an_elected_sequencers_step_returns_in_time_to_renew() {
    let db = fresh_db().await;
    let schema = Schema::default();
    let client = db.connect().await;
    client
        .batch_execute(
            "SELECT outbox.write_task_deleted('p', 't' || i, now(), 'w', '{}') \
             FROM generate_series(1, 5000) AS i",
        )
        .await
        .unwrap();
    // A 500 ms lease: renewals are due every 125 ms; 5,000 ticks of one event take longer.
    let mut elected = outbox_core::sequencer::ElectedSequencer::new(
        Sequencer::new(&schema).with_batch(1),
        &schema,
        "host:1:step".into(),
        Duration::from_millis(500),
        Duration::from_millis(50),
    );
    let mut client = db.connect().await;
    elected.step(&mut client).await.unwrap();
    assert_eq!(elected.generation(), Some(1), "it leads");
    let numbered = sequenced(&client, "p").await.len();
    assert!(
        (1..5000).contains(&numbered),
        "one step numbers part of the backlog and returns to renew: {numbered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_sequencers_never_assign_a_number_twice() {
    let db = fresh_db().await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut sequencers = Vec::new();
    for _ in 0..3 {
        let db = db.clone();
        let stop = stop.clone();
        sequencers.push(tokio::spawn(async move {
            let mut client = db.connect().await;
            let sequencer = Sequencer::new(&Schema::default()).with_batch(5);
            let mut numbered = 0;
            while !stop.load(Ordering::Relaxed) {
                numbered += sequencer.tick(&mut client).await.unwrap().numbered;
            }
            numbered
        }));
    }
    let mut writers = Vec::new();
    for w in 0..8 {
        let db = db.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..40 {
                write_committed(&db, PROJECTS[i % 2], &format!("w{w}-{i}")).await;
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for s in sequencers {
        total += s.await.unwrap();
    }
    let mut client = db.connect().await;
    total += Sequencer::new(&Schema::default())
        .drain(&mut client)
        .await
        .unwrap();
    assert_eq!(total, 8 * 40, "every event numbered exactly once");
    for project in &PROJECTS[..2] {
        let rows = sequenced(&client, project).await;
        assert_eq!(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            (1..=160).collect::<Vec<_>>()
        );
    }
}

#[tokio::test]
async fn sequencer_notifies_each_touched_project() {
    use futures_util::StreamExt;
    let db = fresh_db().await;
    let (listener, mut connection) = db.config.connect(tokio_postgres::NoTls).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
            }
        }
    });
    let sequencer = Sequencer::new(&Schema::default());
    listener
        .batch_execute(&format!("LISTEN \"{}\"", sequencer.channel()))
        .await
        .unwrap();
    write_committed(&db, "alpha", "a").await;
    write_committed(&db, "beta", "b").await;
    write_committed(&db, "beta", "c").await;
    let mut client = db.connect().await;
    sequencer.drain(&mut client).await.unwrap();
    let mut got = BTreeSet::new();
    for _ in 0..2 {
        let (channel, payload) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(channel, "outbox_lifecycle");
        got.insert(payload);
    }
    assert_eq!(got, BTreeSet::from(["alpha".to_owned(), "beta".to_owned()]));
}

/// The sequencer reaches the rows it numbers through the work list and their addresses: a
/// tick over a few new events never reads the whole event table, however the planner weighs
/// the table (it is emptied and refilled often, so its statistics are often stale).
#[tokio::test]
async fn a_tick_never_scans_the_whole_event_table() {
    let sequencer = Sequencer::new(&Schema::default());
    let db = fresh_db().await;
    let client = db.connect().await;
    // Statistics taken during a backlog (every row unsequenced) and kept after the rows went:
    // the planner then expects the work list to hold a full batch, and joining a full batch
    // by hash over the whole table looks cheaper than fetching each row by its address.
    let fill = |sequence: &str| {
        format!(
            "INSERT INTO outbox.lifecycle_outbox (project_id, sequence, event_type, event_id, \
                 task_id, deleted_at, writer_process_id, payload_version, payload) \
             SELECT 'old', {sequence}, 'task:deleted', 'e' || g, 't' || g, now(), 'w', 1, '{{}}' \
             FROM generate_series(1, 30000) AS g;"
        )
    };
    client
        .batch_execute(&format!(
            "{} ANALYZE outbox.lifecycle_outbox; TRUNCATE outbox.lifecycle_outbox; {} \
             INSERT INTO outbox.lifecycle_projects (project_id) VALUES ('old'); \
             SELECT outbox.write_task_deleted('p' || g % 3, 'new-' || g, now(), 'w') \
             FROM generate_series(1, 20) AS g;",
            fill("NULL"),
            fill("g")
        ))
        .await
        .unwrap();
    drop(client);
    let before = event_table_reads(&db).await;
    {
        // Its own session, so its statistics are flushed when it ends.
        let mut ticker = db.connect().await;
        let numbered = sequencer.drain(&mut ticker).await.unwrap();
        assert_eq!(numbered, 20);
    }
    let after = event_table_reads(&db).await;
    assert_eq!(
        after.seq_scans, before.seq_scans,
        "the tick read the whole table"
    );
    assert_the_counters_move(&db, after).await;
}

/// Writes `count` events for `project`, each in its own statement (`from` numbers the tasks).
async fn write_events(client: &tokio_postgres::Client, project: &str, from: i32, count: i32) {
    client
        .execute(
            "SELECT outbox.write_task_deleted($1, 't-' || g, now(), 'w') \
             FROM generate_series($2::int, $2::int + $3::int - 1) AS g",
            &[&project, &from, &count],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_plan_kept_from_a_small_work_list_reads_it_batch_by_batch() {
    // A leader's server session keeps the tick's plans from its first tick, when the table
    // held three events. Left free, the planner picks for that size a plan that collects the
    // whole work list and sorts it (a bitmap scan), cheap for three rows; kept, it would read
    // every pending row of a later backlog to number one batch of them, every tick (about
    // 210,000 index entries for the 20,000 events below). The tick's settings leave one way
    // to read the work list: its index, in order, one batch at a time (about 21,000).
    //
    // Autovacuum is off for the table: its analysis of the 20,000 new rows would invalidate
    // the kept plans, and the ticks after it would plan for the backlog instead.
    let db = fresh_db().await;
    db.connect()
        .await
        .batch_execute("ALTER TABLE outbox.lifecycle_outbox SET (autovacuum_enabled = off)")
        .await
        .unwrap();
    let sequencer = Sequencer::new(&Schema::default()).with_batch(1_000);
    let before = work_list_entries_read(&db).await;
    let client = db.connect().await;
    let mut ticker = db.connect().await;
    write_events(&client, "p", 1, 3).await;
    assert_eq!(sequencer.drain(&mut ticker).await.unwrap(), 3);
    write_events(&client, "p", 4, 20_000).await;
    assert_eq!(sequencer.drain(&mut ticker).await.unwrap(), 20_000);
    drop((client, ticker));
    let read = work_list_entries_read(&db).await - before;
    assert!(
        (20_003..30_000).contains(&read),
        "the ticks read {read} entries of the work list for 20,003 events"
    );
    let rows = sequenced(&db.connect().await, "p").await;
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=20_003).collect::<Vec<_>>()
    );
}

/// Entries read so far from the sequencer's work list (the frontier index), once every other
/// session of `db` has ended and so reported its counters.
async fn work_list_entries_read(db: &TestDb) -> i64 {
    event_table_reads(db).await;
    db.connect()
        .await
        .query_one(
            "SELECT idx_tup_read FROM pg_stat_user_indexes
             WHERE indexrelid = 'outbox.lifecycle_outbox_frontier_idx'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}
