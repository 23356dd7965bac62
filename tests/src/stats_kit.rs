//! Planner statistics that outlived a backlog, and the counters that show how a statement
//! then read the event table.
//!
//! Statistics taken while most events waited for a number make `sequence IS NULL` look common
//! long after the sequencer caught up. A statement that filters on it alone may then be planned
//! as a sequential scan of the whole table, or as a walk of a project's whole history through
//! the `(project_id, event_id)` key, although the work list (the partial index on unsequenced
//! rows) is empty. Tests set that up with [`stale_statistics`], compare [`event_table_reads`]
//! before and after running the code under test, and end with [`assert_the_counters_move`],
//! which shows that the counters they compared would have shown a scan.

use std::time::Duration;

use outbox_core::Schema;
use outbox_core::sequencer::Sequencer;

use crate::TestDb;
use crate::consumer_kit::eventually;

/// The project that holds most of the history (20,000 events): a filter on it matches most of
/// the table, so a sequential scan looks cheapest.
pub const BIG_PROJECT: &str = "big";

/// One of 200 small projects (50 events each): a filter on it looks selective, so a walk of its
/// history through the `(project_id, event_id)` key looks cheapest.
pub const SMALL_PROJECT: &str = "p7";

/// Events in [`SMALL_PROJECT`]'s history.
pub const SMALL_HISTORY: i64 = 50;

/// Fills `db` with a backlog of 30,000 unsequenced events ([`BIG_PROJECT`] and 200 small
/// projects), analyses the table, then numbers every event: the work list is empty and the
/// statistics say almost every row is unsequenced. Autovacuum is off for the table so that no
/// background analysis corrects them during the test. Returns once every session it used has
/// ended (so their reads are counted before the test starts measuring).
pub async fn stale_statistics(db: &TestDb) {
    let client = db.connect().await;
    client
        .batch_execute(
            "ALTER TABLE outbox.lifecycle_outbox SET (autovacuum_enabled = off);
             INSERT INTO outbox.lifecycle_outbox (project_id, event_type, event_id, task_id,
                 deleted_at, writer_process_id, payload_version, payload)
             SELECT CASE WHEN g % 3 = 0 THEN 'p' || g % 200 ELSE 'big' END, 'task:deleted',
                    'e' || g, 't' || g, now(), 'w', 1, '{}'
             FROM generate_series(1, 30000) AS g;
             ANALYZE outbox.lifecycle_outbox;",
        )
        .await
        .expect("fill and analyse the backlog");
    drop(client);
    let mut sequencer = db.connect().await;
    let numbered = Sequencer::new(&Schema::default())
        .drain(&mut sequencer)
        .await
        .expect("number the backlog");
    assert_eq!(numbered, 30_000);
    drop(sequencer);
    event_table_reads(db).await;
}

/// How `lifecycle_outbox` has been read so far, as the cumulative statistics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTableReads {
    /// Sequential scans of the table.
    pub seq_scans: i64,
    /// Entries read from the `(project_id, event_id)` key (`lifecycle_outbox_event_key`).
    pub event_key_entries: i64,
}

/// The event table's read counters, taken once every other client session of `db` has ended:
/// a backend reports its counters when it exits, and otherwise only some time after its
/// statements ran.
pub async fn event_table_reads(db: &TestDb) -> EventTableReads {
    let client = db.connect().await;
    eventually(
        Duration::from_secs(10),
        "the other sessions to end",
        || async {
            client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND backend_type = 'client backend'",
                    &[],
                )
                .await
                .expect("count sessions")
                .get::<_, i64>(0)
                == 0
        },
    )
    .await;
    let row = client
        .query_one(
            "SELECT pg_stat_clear_snapshot(),
                    (SELECT seq_scan FROM pg_stat_user_tables
                     WHERE relid = 'outbox.lifecycle_outbox'::regclass) AS seq_scans,
                    (SELECT idx_tup_read FROM pg_stat_user_indexes
                     WHERE indexrelid = 'outbox.lifecycle_outbox_event_key'::regclass)
                        AS event_key_entries",
            &[],
        )
        .await
        .expect("read the table's statistics");
    EventTableReads {
        seq_scans: row.get("seq_scans"),
        event_key_entries: row.get("event_key_entries"),
    }
}

/// Asserts that what ran between `before` and `after` (named by `what`) read the event table
/// only through the work list: no sequential scan, and fewer entries of the
/// `(project_id, event_id)` key than [`SMALL_PROJECT`]'s history holds.
pub fn assert_only_the_work_list_read(what: &str, before: EventTableReads, after: EventTableReads) {
    assert_eq!(
        after.seq_scans, before.seq_scans,
        "{what} scanned the event table: {before:?} then {after:?}"
    );
    assert!(
        after.event_key_entries - before.event_key_entries < SMALL_HISTORY,
        "{what} walked a project's history: {before:?} then {after:?}"
    );
}

/// The positive control of a statistics test, run after its last reading `last`: in a session
/// of its own, one sequential scan of the event table and one read of [`SMALL_HISTORY`]
/// entries of the `(project_id, event_id)` key, which the next reading must show. A test whose
/// counters cannot move (statistics not collected, or not yet reported when read) then fails
/// here instead of passing.
pub async fn assert_the_counters_move(db: &TestDb, last: EventTableReads) {
    let client = db.connect().await;
    client
        .batch_execute(&format!(
            "SET enable_indexscan = off; SET enable_indexonlyscan = off;
             SET enable_bitmapscan = off;
             SELECT count(*) FROM outbox.lifecycle_outbox;
             RESET ALL; SET enable_seqscan = off; SET enable_sort = off;
             SELECT project_id, event_id FROM outbox.lifecycle_outbox
             ORDER BY project_id, event_id LIMIT {SMALL_HISTORY};"
        ))
        .await
        .expect("the canary scans");
    drop(client);
    let next = event_table_reads(db).await;
    assert!(
        next.seq_scans > last.seq_scans,
        "a sequential scan of the event table did not show in its counters: {last:?} then \
         {next:?}"
    );
    assert!(
        next.event_key_entries - last.event_key_entries >= SMALL_HISTORY,
        "{SMALL_HISTORY} entries read from the event key did not show in its counters: \
         {last:?} then {next:?}"
    );
}
