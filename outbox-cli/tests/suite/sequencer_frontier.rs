//! Numbering from the frontier (migration 0010) under the conditions that broke the work-list
//! design: a snapshot held while tens of thousands of events are numbered costs a tick no more
//! than before it, a writer that holds its transaction open while thousands of later events
//! commit is numbered after them and never skipped, and a tick cut off in the middle or failed
//! leaves nothing half-done.

use std::time::Duration;

use outbox_core::Schema;
use outbox_core::sequencer::Sequencer;
use outbox_tests::consumer_kit::{eventually, eventually_count};
use outbox_tests::{TestDb, fresh_db, hold_snapshot, sequenced};
use tokio_postgres::Client;

const WAIT: Duration = Duration::from_secs(30);

/// Writes `count` events in one statement, spread over projects `p0`..`p7`; `tag` keeps the
/// task IDs of different calls apart.
async fn write(client: &Client, tag: &str, count: i32) {
    client
        .execute(
            "SELECT outbox.write_task_deleted('p' || (g % 8), $1 || '-' || g, now(), 'w') \
             FROM generate_series(1, $2::int) AS g",
            &[&tag, &count],
        )
        .await
        .unwrap();
}

/// Checks that each project `p0`..`p7` holds exactly `1..=k`; returns how many events they hold.
async fn assert_dense(client: &Client) -> usize {
    let mut total = 0;
    for p in 0..8 {
        let project = format!("p{p}");
        let numbers: Vec<i64> = sequenced(client, &project)
            .await
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(
            numbers,
            (1..=numbers.len() as i64).collect::<Vec<_>>(),
            "{project}"
        );
        total += numbers.len();
    }
    total
}

/// Committed events without a number (this session sees no others).
async fn unsequenced(client: &Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_outbox WHERE sequence IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Entries read from every index of the schema, and rows read by sequential scans of its
/// tables, so far: what a tick reads, whatever the plan, counted by the statistics system.
/// Taken once no client session of the database is left but `client` and `keep` (the session
/// holding the snapshot): a backend reports its counters when it exits.
async fn reads(client: &Client, keep: i32) -> i64 {
    eventually(WAIT, "the ticking session to end", || async {
        client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND backend_type = 'client backend'
                   AND pid <> pg_backend_pid() AND pid <> $1",
                &[&keep],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 0
    })
    .await;
    client
        .query_one(
            "SELECT pg_stat_clear_snapshot(),
                    (SELECT COALESCE(sum(idx_tup_read), 0)::int8 FROM pg_stat_user_indexes
                     WHERE schemaname = 'outbox')
                  + (SELECT COALESCE(sum(seq_tup_read), 0)::int8 FROM pg_stat_user_tables
                     WHERE schemaname = 'outbox') AS entries",
            &[],
        )
        .await
        .unwrap()
        .get("entries")
}

/// One tick of `count` new events in a session of its own; returns the entries it read.
async fn measured_tick(db: &TestDb, client: &Client, keep: i32, tag: &str, count: i32) -> i64 {
    write(client, tag, count).await;
    let before = reads(client, keep).await;
    {
        let mut ticker = db.connect().await;
        let numbered = Sequencer::new(&Schema::default())
            .tick(&mut ticker)
            .await
            .unwrap()
            .numbered;
        assert_eq!(numbered, count as u64);
    }
    reads(client, keep).await - before
}

/// The regression test of issue 21. A REPEATABLE READ snapshot taken before the history keeps
/// every numbered row's old version (and, on the design before migration 10, every work-list
/// entry and every head row version) visible to it. The entries one tick of 100 events reads
/// must not grow with the 30,000 events numbered while the snapshot is held: on the design
/// before migration 10 they went from about 100 to over 60,000.
#[tokio::test]
async fn a_tick_under_a_held_snapshot_reads_its_batch_not_the_history() {
    let db = fresh_db().await;
    let client = db.connect().await;
    write(&client, "warm", 200).await;
    Sequencer::new(&Schema::default())
        .drain(&mut db.connect().await)
        .await
        .unwrap();

    let mut holder = db.connect().await;
    let (hold, row) = hold_snapshot(
        &mut holder,
        "SELECT pg_backend_pid() FROM outbox.lifecycle_outbox LIMIT 1",
    )
    .await;
    let holder_pid: i32 = row.get(0);

    let first = measured_tick(&db, &client, holder_pid, "first", 100).await;

    let mut ticker = db.connect().await;
    let sequencer = Sequencer::new(&Schema::default());
    for round in 0..100 {
        write(&client, &format!("history-{round}"), 300).await;
        assert_eq!(sequencer.drain(&mut ticker).await.unwrap(), 300);
    }
    drop(ticker);

    let last = measured_tick(&db, &client, holder_pid, "last", 100).await;
    // The held snapshot still sees the table as it was: nothing here was vacuumed away.
    let seen: i64 = hold
        .query_one("SELECT count(*) FROM outbox.lifecycle_outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 200);
    hold.rollback().await.unwrap();
    eprintln!("entries read by a tick of 100 events: {first} before the history, {last} after");
    assert!(
        last <= 2 * first + 100,
        "a tick of 100 events read {first} entries before 30,000 events of history under a \
         held snapshot and {last} after"
    );
    assert_dense(&client).await;
}

/// A writer that takes its transaction ID, writes one event and stays open while 10,000 later
/// events commit and are numbered: the frontier keeps probing its transaction, and the first
/// tick after its commit numbers its event after all of them, never skipping it.
#[tokio::test]
async fn a_writer_holding_its_transaction_open_is_numbered_after_later_commits() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let mut slow = db.connect().await;
    let open = slow.transaction().await.unwrap();
    open.execute(
        "SELECT outbox.write_task_deleted('p0', 'held', now(), 'w')",
        &[],
    )
    .await
    .unwrap();

    let mut ticker = db.connect().await;
    let sequencer = Sequencer::new(&Schema::default()).with_batch(1_000);
    for round in 0..10 {
        write(&client, &format!("later-{round}"), 1_000).await;
        assert_eq!(sequencer.drain(&mut ticker).await.unwrap(), 1_000);
    }
    open.commit().await.unwrap();
    assert_eq!(sequencer.drain(&mut ticker).await.unwrap(), 1);

    let p0 = sequenced(&client, "p0").await;
    assert_eq!(p0.len(), 1_251);
    let numbers: Vec<i64> = p0.iter().map(|(s, _)| *s).collect();
    assert_eq!(numbers, (1..=1_251).collect::<Vec<_>>());
    let held: i64 = client
        .query_one(
            "SELECT sequence FROM outbox.lifecycle_outbox WHERE task_id = 'held'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        held, 1_251,
        "numbered after the 1,250 events of p0 that committed first"
    );
}

/// A backlog larger than the batch is numbered one batch per tick in commit-frontier order,
/// while rolled-back writers leave nothing behind and a transaction that was open during the
/// partial ticks (its ID below where they stopped) is still numbered when it commits.
#[tokio::test]
async fn partial_ticks_skip_nothing_committed_meanwhile_and_nothing_rolled_back() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let mut early = db.connect().await;
    let early_tx = early.transaction().await.unwrap();
    // Takes its ID before the backlog is written; writes after the first partial tick.
    early_tx
        .execute("SELECT pg_current_xact_id()", &[])
        .await
        .unwrap();
    let mut undone = db.connect().await;
    let undone_tx = undone.transaction().await.unwrap();
    undone_tx
        .execute(
            "SELECT outbox.write_task_deleted('p1', 'undone', now(), 'w')",
            &[],
        )
        .await
        .unwrap();
    write(&client, "backlog", 2_500).await;

    let mut ticker = db.connect().await;
    let sequencer = Sequencer::new(&Schema::default()).with_batch(1_000);
    assert_eq!(sequencer.tick(&mut ticker).await.unwrap().numbered, 1_000);
    early_tx
        .execute(
            "SELECT outbox.write_task_deleted('p1', 'early', now(), 'w')",
            &[],
        )
        .await
        .unwrap();
    early_tx.commit().await.unwrap();
    undone_tx.rollback().await.unwrap();
    write(&client, "after", 10).await;
    assert_eq!(sequencer.drain(&mut ticker).await.unwrap(), 1_511);
    assert_eq!(sequencer.drain(&mut ticker).await.unwrap(), 0);

    assert_eq!(unsequenced(&client).await, 0);
    assert_dense(&client).await;
    let tasks: Vec<String> = client
        .query(
            "SELECT task_id FROM outbox.lifecycle_outbox WHERE task_id IN ('early', 'undone')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(tasks, vec!["early".to_owned()]);
}

/// A tick cut off in the middle of its statement (its backend terminated after it numbered
/// the rows and before it stored the frontier and committed) leaves no number and no
/// frontier behind; the next tick numbers the same events, densely.
#[tokio::test]
async fn a_tick_cut_off_in_the_middle_leaves_nothing_half_done() {
    let db = fresh_db().await;
    let client = db.connect().await;
    write(&client, "first", 50).await;
    Sequencer::new(&Schema::default())
        .drain(&mut db.connect().await)
        .await
        .unwrap();
    // Storing the frontier is the tick's last step: make it wait there.
    client
        .batch_execute(
            "CREATE FUNCTION public.stall() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$;
             CREATE TRIGGER stall BEFORE INSERT ON outbox.lifecycle_sequencer_frontier
                 FOR EACH ROW EXECUTE FUNCTION public.stall();",
        )
        .await
        .unwrap();
    write(&client, "second", 50).await;
    let stalled = {
        let mut ticker = db.connect().await;
        tokio::spawn(async move {
            Sequencer::new(&Schema::default())
                .tick(&mut ticker)
                .await
                .map(|t| t.numbered)
        })
    };
    eventually_count(
        &client,
        WAIT,
        "the tick to reach the frontier",
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event = 'PgSleep'",
        1,
    )
    .await;
    client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event = 'PgSleep'",
            &[],
        )
        .await
        .unwrap();
    assert!(stalled.await.unwrap().is_err(), "the cut-off tick failed");
    client
        .batch_execute("DROP TRIGGER stall ON outbox.lifecycle_sequencer_frontier")
        .await
        .unwrap();

    assert_eq!(
        unsequenced(&client).await,
        50,
        "the cut-off tick's numbers were rolled back"
    );
    let numbered = Sequencer::new(&Schema::default())
        .drain(&mut db.connect().await)
        .await
        .unwrap();
    assert_eq!(numbered, 50);
    assert_eq!(assert_dense(&client).await, 100);
}

/// A tick whose numbering fails (here a trigger refuses the frontier) leaves nothing behind
/// and its session usable: the tick's transaction is rolled back whole, and the same
/// connection's next tick numbers what the failed one did not.
#[tokio::test]
async fn a_failed_tick_leaves_nothing_behind_and_its_session_usable() {
    let db = fresh_db().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'frontier refused'; END $$;
             CREATE TRIGGER refuse BEFORE INSERT ON outbox.lifecycle_sequencer_frontier
                 FOR EACH ROW EXECUTE FUNCTION public.refuse();",
        )
        .await
        .unwrap();
    write(&client, "refused", 30).await;
    let mut ticker = db.connect().await;
    for _ in 0..2 {
        let sequencer = Sequencer::new(&Schema::default());
        let error = sequencer.tick(&mut ticker).await.unwrap_err();
        assert!(
            error.to_string().contains("frontier refused"),
            "the tick reports the failure: {error}"
        );
        assert_eq!(
            unsequenced(&client).await,
            30,
            "the failed tick's numbers were rolled back"
        );
        let status: String = ticker
            .query_one("SELECT 'usable'::text", &[])
            .await
            .expect("the failed tick's session takes the next statement")
            .get(0);
        assert_eq!(status, "usable");
    }
    client
        .batch_execute("DROP TRIGGER refuse ON outbox.lifecycle_sequencer_frontier")
        .await
        .unwrap();
    let tick = Sequencer::new(&Schema::default())
        .tick(&mut ticker)
        .await
        .unwrap();
    assert!(tick.ran);
    assert_eq!(tick.numbered, 30);
    assert_eq!(assert_dense(&client).await, 30);
}

/// A frontier ahead of this cluster's transaction IDs, as a logical restore from another
/// cluster leaves it, is ignored: the new cluster's writers are numbered, not taken for done.
#[tokio::test]
async fn a_frontier_from_another_clusters_transaction_ids_is_ignored() {
    let db = fresh_db().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "INSERT INTO outbox.lifecycle_sequencer_frontier (base, upto, after_xid, after_id)
             VALUES ('900000000000:900000000000:', '900000000000:900000000000:',
                     '900000000000', 0)",
        )
        .await
        .unwrap();
    write(&client, "restored", 40).await;
    let numbered = Sequencer::new(&Schema::default())
        .drain(&mut db.connect().await)
        .await
        .unwrap();
    assert_eq!(numbered, 40);
    let newest: String = client
        .query_one(
            "SELECT upto::text FROM outbox.lifecycle_sequencer_frontier ORDER BY tick DESC LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!newest.starts_with("900000000000"), "{newest}");
}
