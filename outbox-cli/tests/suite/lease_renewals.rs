//! Lease renewals (migration 0012) under a held snapshot: a consumer's heartbeat appends a
//! renewal instead of rewriting the consumer row, so the row every fenced write locks keeps
//! one version however long a snapshot is held, and neither the fence, the renewal itself nor
//! a read of the lease grows with the heartbeats sent since the snapshot was taken. And a
//! claim that arrives while a renewal is in flight reads that renewal: it never takes a lease
//! its holder was just told it renewed.

use std::time::Duration;

use outbox_core::Schema;
use outbox_tests::consumer_kit::{Recorder, eventually_count, fast_config, start};
use outbox_tests::{fresh_db, hold_snapshot};
use tokio_postgres::{Client, GenericClient};

/// The statement that takes the held snapshot (see [`hold_snapshot`]).
const HOLD: &str = "SELECT count(*) FROM outbox.lifecycle_consumer_cursors";

/// Heartbeats sent under the held snapshot: at the default interval (10 s), what one consumer
/// sends in eight hours, or 48 consumers of one process in ten minutes.
const RENEWALS: usize = 3_000;

/// Buffers (shared hits and reads) of one node of a JSON plan, its children included.
fn node_buffers(node: &serde_json::Value) -> i64 {
    node["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + node["Shared Read Blocks"].as_i64().unwrap_or(0)
}

/// Buffers of the delete nodes below `node`: a renewal's removal of the one it replaces, a
/// part of the statement that nothing reads, so the top node's figure leaves it out.
fn delete_buffers(node: &serde_json::Value) -> i64 {
    node["Plans"]
        .as_array()
        .map(|plans| {
            plans
                .iter()
                .map(|plan| {
                    if plan["Operation"] == "Delete" {
                        node_buffers(plan)
                    } else {
                        delete_buffers(plan)
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Buffers one statement touches, from `EXPLAIN (ANALYZE, BUFFERS)`: a figure of the plan and
/// the data, not of time. Run in a transaction that is rolled back, so a measured renewal
/// changes nothing; a set's statement under the settings the set sends it with.
async fn buffers(client: &mut Client, statement: &str, key_scans_only: bool) -> i64 {
    let tx = client.transaction().await.unwrap();
    if key_scans_only {
        tx.batch_execute(outbox_consumer::internal::KEY_SCANS_ONLY)
            .await
            .unwrap();
    }
    let plan: serde_json::Value = tx
        .query_one(
            &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    tx.rollback().await.unwrap();
    let top = &plan[0]["Plan"];
    node_buffers(top) + delete_buffers(top)
}

/// The probe of a consumer set's renewal, which the set sends under key scans only.
const SET_RENEWAL: &str = "a set's renewal";

/// The statements whose cost must not grow: the fence every position write takes, a read of
/// the lease as operators see it, and a renewal as a lone consumer and as a consumer set send
/// it (with the same parameters the runtime binds).
fn probes() -> Vec<(&'static str, String)> {
    let schema = Schema::default();
    vec![
        (
            "the fence",
            "SELECT 1 FROM outbox.lifecycle_consumers \
             WHERE project_id = 'p' AND consumer_id = 'c' AND lease_owner = 'probe' \
               AND lease_generation = 7 AND state = 'active' FOR NO KEY UPDATE"
                .to_owned(),
        ),
        (
            "the lease as operators read it",
            "SELECT lease_owner, lease_expires_at, heartbeat_at \
             FROM outbox.lifecycle_consumer_cursors WHERE project_id = 'p' AND consumer_id = 'c'"
                .to_owned(),
        ),
        (
            "a consumer's renewal",
            lone_renewal(&schema.render(outbox_consumer::internal::HEARTBEAT_STATEMENT)),
        ),
        (
            SET_RENEWAL,
            set_renewal(&schema.render(outbox_consumer::internal::HEARTBEAT_SET_STATEMENT)),
        ),
    ]
}

/// A lone consumer's heartbeat with its parameters written in.
fn lone_renewal(statement: &str) -> String {
    statement
        .replace("$1", "'p'")
        .replace("$2", "'c'")
        .replace("$3", "'probe'")
        .replace("$4", "7::bigint")
        .replace("$5", "30::float8")
}

/// A consumer set's heartbeat for the one consumer, with its parameters written in.
fn set_renewal(statement: &str) -> String {
    statement
        .replace("$1", "ARRAY['p']")
        .replace("$2", "ARRAY['c']")
        .replace("$3", "ARRAY[7]")
        .replace("$4", "'probe'")
        .replace("$5", "30::float8")
}

async fn costs(client: &mut Client) -> Vec<(&'static str, i64)> {
    let mut out = Vec::new();
    for (what, statement) in probes() {
        let key_scans_only = what == SET_RENEWAL;
        out.push((what, buffers(client, &statement, key_scans_only).await));
    }
    out
}

/// Adds consumer `p`/`c` with its lease held by `owner` in `generation`, claimed
/// `claimed_ago` seconds ago and running out `expires_in` seconds from now (negative: already
/// run out).
async fn leased_consumer(
    client: &Client,
    owner: &str,
    generation: i64,
    expires_in: i32,
    claimed_ago: i32,
) {
    client
        .execute(
            "INSERT INTO outbox.lifecycle_consumers
                 (project_id, consumer_id, lease_owner, lease_generation, claimed_until,
                  claimed_at)
             VALUES ('p', 'c', $1, $2, now() + make_interval(secs => $3),
                     now() - make_interval(secs => $4))",
            &[
                &owner,
                &generation,
                &f64::from(expires_in),
                &f64::from(claimed_ago),
            ],
        )
        .await
        .unwrap();
}

/// Sends `count` renewals of consumer `p`/`c`'s lease, alternating a lone consumer's and a
/// set's statement, each prepared once as the runtime's pool keeps them; every one must renew.
async fn renew(client: &impl GenericClient, count: usize) {
    let schema = Schema::default();
    let lone = client
        .prepare(&schema.render(outbox_consumer::internal::HEARTBEAT_STATEMENT))
        .await
        .unwrap();
    let set = client
        .prepare(&schema.render(outbox_consumer::internal::HEARTBEAT_SET_STATEMENT))
        .await
        .unwrap();
    for i in 0..count {
        let renewed = if i % 2 == 0 {
            client
                .execute(&lone, &[&"p", &"c", &"probe", &7i64, &30f64])
                .await
                .unwrap()
        } else {
            client
                .query(
                    &set,
                    &[&vec!["p"], &vec!["c"], &vec![7i64], &"probe", &30f64],
                )
                .await
                .unwrap()
                .len() as u64
        };
        assert_eq!(renewed, 1, "renewal {i} was refused");
    }
}

/// The regression test of lease renewals under a held snapshot. Before migration 0012 every
/// heartbeat updated the consumer's row, and a snapshot older than the updates keeps every
/// version of it, so the fence of every later position write, and every read of the lease,
/// walked them all: on that design this test's 3,000 renewals took the fence from 3 buffers
/// to 37, a read of the lease from 4 to 38 and a renewal from 5 to 39 (and in the old-snapshot
/// benchmark a position write's buffers grew by about 4 a minute, from 51 to 167 in a
/// 30-minute hold). Measured now: the fence 3 → 3, the read 6 → 7, a consumer's renewal
/// 11 → 14 and a set's 10 → 12 (a renewal is an insert and a delete where it was an update).
#[tokio::test]
async fn renewals_under_a_held_snapshot_do_not_grow_the_cost_of_the_lease() {
    let db = fresh_db().await;
    let mut client = db.connect().await;
    leased_consumer(&client, "probe", 7, 30, 0).await;
    renew(&client, 10).await;
    let before = costs(&mut client).await;

    let mut holder = db.connect().await;
    let (hold, _) = hold_snapshot(&mut holder, HOLD).await;
    renew(&client, RENEWALS).await;
    // Measured with the statistics autovacuum would take now, whether or not it has run yet:
    // the plans under the held snapshot's dead rows are what must stay cheap.
    client
        .batch_execute(
            "ANALYZE outbox.lifecycle_lease_renewals, outbox.lifecycle_consumers, \
             outbox.lifecycle_consumer_positions",
        )
        .await
        .unwrap();
    let after = costs(&mut client).await;
    hold.rollback().await.unwrap();

    let grown: Vec<String> = before
        .into_iter()
        .zip(after)
        .filter(|((_, before), (_, after))| *after > 2 * before + 4)
        .map(|((what, before), (_, after))| format!("{what}: {before} -> {after}"))
        .collect();
    assert!(
        grown.is_empty(),
        "buffers before and after {RENEWALS} renewals under a held snapshot: {grown:?}"
    );
}

/// A holder whose renewal reaches the database just as its lease runs out, while another
/// process claims: the renewal holds the consumer row's lock, so the claim waits for it, and
/// must then judge the lease by that renewal. Read in the claim's first snapshot (taken before
/// it waited), the renewal would be unseen and the claim would take a lease renewed for 30
/// seconds, while its holder, told the renewal succeeded, dispatched beside it.
#[tokio::test]
async fn a_claim_waiting_for_a_renewal_in_flight_reads_it_and_leaves_the_lease() {
    let db = fresh_db().await;
    let mut client = db.connect().await;
    leased_consumer(&client, "holder", 3, -1, 3).await;
    // The holder's renewal, sent before the claim and not yet committed.
    let renewal = client.transaction().await.unwrap();
    let renewed = renewal
        .execute(
            &Schema::default().render(outbox_consumer::internal::HEARTBEAT_STATEMENT),
            &[&"p", &"c", &"holder", &3i64, &30f64],
        )
        .await
        .unwrap();
    assert_eq!(renewed, 1);

    let recorder = Recorder::default();
    let mut config = fast_config("p", "c");
    config.duties.sequence_interval = None;
    let (shutdown, run) = start(&db, config, &recorder);
    let watcher = db.connect().await;
    eventually_count(
        &watcher,
        Duration::from_secs(60),
        "the claim to wait for the renewal's lock",
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
        1,
    )
    .await;
    renewal.commit().await.unwrap();

    // The claimant looks again at least once a second; the lease stays the holder's.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let row = watcher
        .query_one(
            "SELECT lease_owner, lease_generation FROM outbox.lifecycle_consumers
             WHERE project_id = 'p' AND consumer_id = 'c'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, i64>(1)),
        ("holder".to_owned(), 3),
        "the claim took a lease renewed while it waited"
    );
    shutdown.cancel();
    let summary = run.await.unwrap().unwrap();
    assert_eq!(summary.generation, 0, "nothing was claimed");
    assert!(recorder.sequences().is_empty());
}
