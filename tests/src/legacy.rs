//! What builds of earlier migrations did, for upgrade tests that must leave a database as such
//! a build left it.

use outbox_core::Schema;
use outbox_core::migrate::MIGRATIONS;
use outbox_core::sequencer::Sequencer;
use tokio_postgres::Client;

/// The numbering of builds before migration 10: every committed, unsequenced row in arrival
/// (`id`) order, continuing the head stored in `lifecycle_project_heads` (then a table).
/// Returns how many rows it numbered.
pub async fn number_pending(client: &Client) -> u64 {
    client
        .execute(
            "WITH pending AS (
                 SELECT ctid AS row_id, project_id,
                        row_number() OVER (PARTITION BY project_id ORDER BY id) AS rank
                 FROM outbox.lifecycle_outbox WHERE sequence IS NULL),
             counts AS (SELECT project_id, count(*) AS numbered FROM pending GROUP BY project_id),
             heads AS (
                 INSERT INTO outbox.lifecycle_project_heads AS h (project_id, head_sequence)
                 SELECT project_id, numbered FROM counts
                 ON CONFLICT (project_id)
                     DO UPDATE SET head_sequence = h.head_sequence + EXCLUDED.head_sequence
                 RETURNING h.project_id, h.head_sequence)
             UPDATE outbox.lifecycle_outbox AS o
             SET sequence = heads.head_sequence - counts.numbered + pending.rank,
                 sequenced_at = now()
             FROM pending JOIN counts USING (project_id) JOIN heads USING (project_id)
             WHERE o.ctid = pending.row_id",
            &[],
        )
        .await
        .expect("numbering as builds before migration 10 did")
}

/// The functions this build's sequencer calls, by the migration that adds each: the idle
/// probe (13) and the tick (14).
const SEQUENCER_FUNCTIONS: &[(i32, &str)] = &[
    (13, "outbox.lifecycle_outbox_unsequenced_exists()"),
    (14, "outbox.lifecycle_outbox_tick(bigint, bigint, text)"),
];

/// The numbering of builds of migrations 10 to 13 (`version`): this build's sequencer, whose
/// statements live in functions that later migrations add. Each function the schema lacks is
/// created for the call, from its migration's own text, and dropped again, so the schema
/// stays as those builds left it.
pub async fn number_from_frontier(client: &mut Client, version: usize) -> u64 {
    assert!((10..14).contains(&version), "version {version}");
    let missing: Vec<_> = SEQUENCER_FUNCTIONS
        .iter()
        .filter(|(added, _)| *added as usize > version)
        .collect();
    for (added, _) in &missing {
        let migration = MIGRATIONS
            .iter()
            .find(|m| m.version == *added)
            .expect("the function's migration");
        client
            .batch_execute(&Schema::default().render(migration.template))
            .await
            .expect("the sequencer's function");
    }
    let numbered = Sequencer::new(&Schema::default())
        .drain(client)
        .await
        .unwrap_or_else(|e| panic!("numbering as builds of migration {version} did: {e}"));
    for (_, function) in missing.iter().rev() {
        client
            .batch_execute(&format!("DROP FUNCTION {function}"))
            .await
            .expect("dropping the sequencer's function again");
    }
    numbered
}
