//! Cursor positions (migration 0011) under a held snapshot: reading a consumer's cursor costs
//! no more after thousands of acknowledgements than before them, because positions are
//! appended and the current one is read from the high end of their key, while the consumer
//! row itself changes only with its lease; a consumer set's grouped acknowledgements keep
//! their cost under a held snapshot; and a claim waits for the previous holder's last
//! position write and starts from it.

use std::time::Duration;

use outbox_consumer::{Consumer, Duties};
use outbox_core::Schema;
use outbox_core::sequencer::Sequencer;
use outbox_tests::consumer_kit::{
    Recorder, cursor, eventually, eventually_count, fast_config, fast_delivery, fast_duties, start,
};
use outbox_tests::set_kit::{Recorders, SetConfig, listed, start_set};
use outbox_tests::{TestDb, fresh_db, hold_snapshot};
use tokio_postgres::{Client, GenericClient};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);

/// The statement that takes the held snapshot (see [`hold_snapshot`]).
const HOLD: &str = "SELECT count(*) FROM outbox.lifecycle_consumer_cursors";

/// Writes and numbers `count` more events of project `p`.
async fn write_numbered(db: &TestDb, client: &Client, tag: &str, count: i32) {
    client
        .execute(
            "SELECT outbox.write_task_deleted('p', $1 || '-' || g, now(), 'w') \
             FROM generate_series(1, $2::int) AS g",
            &[&tag, &count],
        )
        .await
        .unwrap();
    Sequencer::new(&Schema::default())
        .drain(&mut db.connect().await)
        .await
        .unwrap();
}

/// Runs consumer `c` of project `p`, one event per batch (so one position write per event),
/// until its cursor reaches `through`.
async fn consume_through(db: &TestDb, through: i64) {
    let mut config = fast_config("p", "c");
    config.delivery.batch_size = 1;
    config.delivery.max_batch_size = 1;
    config.duties.sequence_interval = None;
    config.duties.prune_interval = None;
    let recorder = Recorder::default();
    let runtime = Consumer::new(
        db.pool(4),
        Some(db.config.clone()),
        config,
        recorder.clone(),
        recorder,
    );
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let run = tokio::spawn(async move { runtime.run(token).await });
    eventually(WAIT, "the consumer to reach its target", || async {
        cursor(db, "p", "c").await == Some(through)
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
}

/// Buffers (shared hits and reads) one statement touches, from `EXPLAIN (ANALYZE, BUFFERS)`:
/// a figure of the plan and the data, not of time.
async fn buffers(client: &impl GenericClient, statement: &str) -> i64 {
    let plan: serde_json::Value = client
        .query_one(
            &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let top = &plan[0]["Plan"];
    top["Shared Hit Blocks"].as_i64().unwrap() + top["Shared Read Blocks"].as_i64().unwrap()
}

/// What every fenced write and every cursor read pays: the consumer row, locked as a fence
/// is, and the cursor as readers see it.
async fn read_costs(client: &mut Client) -> (i64, i64) {
    let cursor = buffers(
        client,
        "SELECT last_acked_sequence, last_acked_event_id \
         FROM outbox.lifecycle_consumer_cursors WHERE project_id = 'p' AND consumer_id = 'c'",
    )
    .await;
    let tx = client.transaction().await.unwrap();
    let fence = buffers(
        &tx,
        "SELECT 1 FROM outbox.lifecycle_consumers \
         WHERE project_id = 'p' AND consumer_id = 'c' AND state = 'active' FOR NO KEY UPDATE",
    )
    .await;
    tx.rollback().await.unwrap();
    (cursor, fence)
}

/// Buffers of the delete node(s) in a JSON plan: the replaced position's removal.
fn delete_buffers(node: &serde_json::Value) -> i64 {
    let own = if node["Operation"] == "Delete" {
        node["Shared Hit Blocks"].as_i64().unwrap() + node["Shared Read Blocks"].as_i64().unwrap()
    } else {
        0
    };
    own + node["Plans"]
        .as_array()
        .map(|plans| plans.iter().map(delete_buffers).sum())
        .unwrap_or(0)
}

/// What one acknowledgement of consumer `p`/`c` at cursor `at` costs, as the runtime sends it
/// (a consumer's own, and a set's grouped one for that consumer alone), under a custom and
/// under a generic plan (a pool's prepared statement switches to a generic plan after five
/// runs): the buffers of its insert (with the fence and the read of the current position it
/// joins) and of its delete of the replaced position (a part of the statement that nothing
/// reads, so the top node's figure leaves it out). Run under a lease taken for the probe, in a
/// transaction that is rolled back.
async fn ack_costs(client: &mut Client, at: i64) -> Vec<(String, i64, i64)> {
    let schema = Schema::default();
    let (ack, ack_set) = (
        schema.render(outbox_consumer::internal::ACK_STATEMENT),
        schema.render(outbox_consumer::internal::ACK_SET_STATEMENT),
    );
    let next = at + 1;
    let statements = [
        (
            "a consumer's",
            format!("(text, text, text, bigint, bigint, bigint) AS {ack}"),
            format!("('p', 'c', 'probe', 99, {next}, {at})"),
        ),
        (
            "a set's",
            format!("(text[], text[], bigint[], bigint[], text, bigint[]) AS {ack_set}"),
            format!(
                "(ARRAY['p'], ARRAY['c'], ARRAY[99]::bigint[], ARRAY[{next}]::bigint[], \
                  'probe', ARRAY[{at}]::bigint[])"
            ),
        ),
    ];
    let mut costs = Vec::new();
    for (kind, prepared, arguments) in &statements {
        for mode in ["force_custom_plan", "force_generic_plan"] {
            let tx = client.transaction().await.unwrap();
            tx.batch_execute(&format!(
                "SET LOCAL plan_cache_mode = {mode};
                 UPDATE outbox.lifecycle_consumers
                 SET lease_owner = 'probe', lease_generation = 99
                 WHERE project_id = 'p' AND consumer_id = 'c';
                 PREPARE ack_probe {prepared};"
            ))
            .await
            .unwrap();
            let plan: serde_json::Value = tx
                .query_one(
                    &format!(
                        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE ack_probe {arguments}"
                    ),
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            let moved: Option<i64> = tx
                .query_one(
                    "SELECT last_acked_sequence FROM outbox.lifecycle_consumer_cursors \
                     WHERE project_id = 'p' AND consumer_id = 'c'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(moved, Some(next), "{kind} probe acknowledged: {plan}");
            let top = &plan[0]["Plan"];
            let insert = top["Shared Hit Blocks"].as_i64().unwrap()
                + top["Shared Read Blocks"].as_i64().unwrap();
            costs.push((format!("{kind}, {mode}"), insert, delete_buffers(top)));
            tx.rollback().await.unwrap();
            client.batch_execute("DEALLOCATE ack_probe").await.unwrap();
        }
    }
    costs
}

/// The regression test of the cursor row under a held snapshot. Before migration 0011 every
/// acknowledgement updated the consumer's row, and a snapshot older than the updates keeps
/// every version of it, so each later read of the row walked them all: on that design this
/// test's 3,000 acknowledgements took a read of the cursor from 2 buffers to 69 (and the
/// benchmark's three minutes took an acknowledgement from 17 buffers to 4,423). Now the cursor
/// read, the fence and the acknowledgement itself must cost what they cost before the
/// acknowledgements (measured: cursor 4 → 7 buffers, fence 3 → 3; a consumer's
/// acknowledgement 9-20 → 12-13 for its insert and 3 → 4 for its delete of the position it
/// replaces, a set's 8-9 → 11-12 and 2 → 2). Written as a join with the position it read, the
/// delete matched the key on project and consumer only and went from 4 to 2,985 (a consumer's)
/// and from 3 to 2,970 (a set's).
#[tokio::test]
async fn cursor_reads_under_a_held_snapshot_do_not_grow_with_acknowledgements() {
    let db = fresh_db().await;
    let mut client = db.connect().await;
    write_numbered(&db, &client, "warm", 50).await;
    consume_through(&db, 50).await;
    let (cursor_before, fence_before) = read_costs(&mut client).await;
    let acks_before = ack_costs(&mut client, 50).await;

    let mut holder = db.connect().await;
    let (hold, _) = hold_snapshot(&mut holder, HOLD).await;

    let writes_before = position_traffic(&client).await.0;
    write_numbered(&db, &client, "held", 3_000).await;
    consume_through(&db, 3_050).await;
    // One position per event was written under the snapshot. (A backend reports its
    // statistics when it exits; the consumer's pool has closed.)
    eventually(WAIT, "3,000 position writes", || async {
        position_traffic(&client).await.0 - writes_before >= 3_000
    })
    .await;
    let (cursor_after, fence_after) = read_costs(&mut client).await;
    let acks_after = ack_costs(&mut client, 3_050).await;
    hold.rollback().await.unwrap();

    assert!(
        cursor_after <= 2 * cursor_before + 4,
        "reading the cursor: {cursor_before} buffers before 3,000 acknowledgements under a \
         held snapshot, {cursor_after} after"
    );
    assert!(
        fence_after <= 2 * fence_before + 4,
        "the fence's lock: {fence_before} buffers before, {fence_after} after"
    );
    for ((mode, insert_before, delete_before), (_, insert_after, delete_after)) in
        acks_before.into_iter().zip(acks_after)
    {
        eprintln!(
            "COSTS {mode}: insert {insert_before} -> {insert_after}, delete {delete_before} -> {delete_after}"
        );
        assert!(
            delete_after <= 2 * delete_before + 4 && insert_after <= 2 * insert_before + 4,
            "an acknowledgement ({mode}), before and after 3,000 acknowledgements under a held \
             snapshot: its insert {insert_before} and {insert_after} buffers, its delete of the \
             replaced position {delete_before} and {delete_after}"
        );
    }
}

/// A holder whose lease ran out may still be writing a position: its write holds the consumer
/// row's lock, so the successor's claim waits for it and the old holder's fence stays valid
/// until the claim commits. The claim's statement took its snapshot before that write
/// committed, so the successor reads its starting position once the claim is done. It starts
/// from the old holder's last position: nothing between is delivered again and no divergence
/// is recorded.
#[tokio::test]
async fn a_claim_that_waited_for_the_last_holders_write_starts_from_it() {
    let db = fresh_db().await;
    let mut client = db.connect().await;
    write_numbered(&db, &client, "e", 10).await;
    client
        .batch_execute(
            "INSERT INTO outbox.lifecycle_consumers
                 (project_id, consumer_id, lease_owner, lease_generation, claimed_until,
                  claimed_at)
             VALUES ('p', 'c', 'elsewhere:1:old', 3, now() - interval '1 second',
                     now() - interval '3 seconds');
             INSERT INTO outbox.lifecycle_consumer_positions
                 (project_id, consumer_id, last_acked_sequence)
             VALUES ('p', 'c', 5);",
        )
        .await
        .unwrap();

    // The old holder's last acknowledgement, as the runtime writes it, not yet committed.
    let old_holder = client.transaction().await.unwrap();
    old_holder
        .batch_execute(
            "SELECT 1 FROM outbox.lifecycle_consumers
             WHERE project_id = 'p' AND consumer_id = 'c' AND lease_owner = 'elsewhere:1:old'
               AND lease_generation = 3 AND state = 'active'
             FOR NO KEY UPDATE;
             DELETE FROM outbox.lifecycle_consumer_positions
             WHERE project_id = 'p' AND consumer_id = 'c';
             INSERT INTO outbox.lifecycle_consumer_positions
                 (project_id, consumer_id, last_acked_sequence, last_acked_at)
             VALUES ('p', 'c', 8, now());",
        )
        .await
        .unwrap();

    let recorder = Recorder::default();
    let mut config = fast_config("p", "c");
    config.duties.sequence_interval = None;
    let (shutdown, run) = start(&db, config, &recorder);
    let watcher = db.connect().await;
    eventually_count(
        &watcher,
        WAIT,
        "the claim to wait for the old holder's lock",
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'
           AND query LIKE '%FROM %lifecycle_consumers%FOR NO KEY UPDATE%'",
        1,
    )
    .await;
    old_holder.commit().await.unwrap();

    eventually(WAIT, "the successor to reach the head", || async {
        cursor(&db, "p", "c").await == Some(10)
    })
    .await;
    shutdown.cancel();
    let summary = run.await.unwrap().unwrap();
    assert_eq!(summary.generation, 4);
    assert_eq!(
        recorder.sequences(),
        vec![9, 10],
        "the successor starts where the old holder's last write left the cursor"
    );
    let diverged: i64 = watcher
        .query_one(
            "SELECT count(*) FROM outbox.lifecycle_audit
             WHERE kind = 'lifecycle-observation:history-diverged'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(diverged, 0);
}

/// Position writes so far and the buffers every statement spent on the positions table (its
/// heap and its key), from the statistics views.
async fn position_traffic(client: &Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT pg_stat_clear_snapshot(), t.n_tup_ins AS writes,
                    io.heap_blks_hit + io.heap_blks_read + io.idx_blks_hit + io.idx_blks_read
                        AS buffers
             FROM pg_stat_user_tables AS t JOIN pg_statio_user_tables AS io USING (relid)
             WHERE t.schemaname = 'outbox' AND t.relname = 'lifecycle_consumer_positions'",
            &[],
        )
        .await
        .unwrap();
    (row.get("writes"), row.get("buffers"))
}

/// Waits until the statistics show `writes` position writes (backends report theirs within
/// seconds), then returns them with the buffers.
async fn traffic_after(client: &Client, writes: i64) -> (i64, i64) {
    eventually(WAIT, "the position writes in the statistics", || async {
        position_traffic(client).await.0 >= writes
    })
    .await;
    position_traffic(client).await
}

/// A consumer set keeps its grouped acknowledgement prepared on each connection, with the
/// plan it made while the positions table was a page or two. Made without the set's planner
/// settings, that plan read the table whole for each consumer, so under a held snapshot every
/// acknowledgement read every position written since the hold began (in the benchmark, 1,193
/// buffers an acknowledgement in the first minute of a hold). Per position write, the traffic
/// on the positions table while 3,000 events are acknowledged one by one under a held
/// snapshot must stay what it was before the hold (measured: 7.3 buffers before, 9.3 under
/// the hold; 7.4 and 32.2 with the plan made without the settings).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sets_acknowledgements_under_a_held_snapshot_keep_their_cost() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let recorders = Recorders::default();
    let mut delivery = fast_delivery();
    delivery.batch_size = 1;
    delivery.max_batch_size = 1;
    delivery.heartbeat_interval = Duration::from_secs(1);
    let duties = Duties {
        prune_interval: None,
        ..fast_duties()
    };
    let (shutdown, run) = start_set(
        &db,
        SetConfig { delivery, duties },
        listed(&["p"]),
        &["c"],
        4,
        true,
        &recorders,
    );
    write_numbered(&db, &client, "warm", 300).await;
    eventually(WAIT, "the set to acknowledge the warm-up", || async {
        cursor(&db, "p", "c").await == Some(300)
    })
    .await;
    let (writes_0, buffers_0) = traffic_after(&client, 300).await;

    let mut holder = db.connect().await;
    let (hold, _) = hold_snapshot(&mut holder, HOLD).await;
    let (writes_1, buffers_1) = position_traffic(&client).await;
    write_numbered(&db, &client, "held", 3_000).await;
    eventually(WAIT, "the set to acknowledge under the hold", || async {
        cursor(&db, "p", "c").await == Some(3_300)
    })
    .await;
    let (writes_2, buffers_2) = traffic_after(&client, writes_1 + 3_000).await;
    hold.rollback().await.unwrap();
    shutdown.cancel();
    for outcome in run.await.unwrap().unwrap() {
        outcome.result.expect("the pair stops cleanly");
    }

    let before = buffers_0 as f64 / writes_0 as f64;
    let held = (buffers_2 - buffers_1) as f64 / (writes_2 - writes_1) as f64;
    assert!(
        held <= 2.0 * before + 4.0,
        "buffers on the positions table per position write: {before:.1} before the hold \
         ({writes_0} writes), {held:.1} under it ({} writes)",
        writes_2 - writes_1
    );
}
