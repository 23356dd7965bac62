//! What builds of earlier migrations did, for upgrade tests that must leave a database as such
//! a build left it.

use outbox_core::{MIGRATIONS, Schema, Sequencer};
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

/// The numbering of builds of migrations 10 to 12: this build's sequencer, whose idle probe is
/// the function migration 13 adds. The function is created for the call, from migration 13's
/// own text, and dropped again, so the schema stays as those builds left it.
pub async fn number_from_frontier(client: &mut Client) -> u64 {
    let probe = MIGRATIONS
        .iter()
        .find(|m| m.version == 13)
        .expect("migration 13");
    client
        .batch_execute(&Schema::default().render(probe.template))
        .await
        .expect("the probe function of migration 13");
    let numbered = Sequencer::new(&Schema::default())
        .drain(client)
        .await
        .expect("numbering as builds of migrations 10 to 12 did");
    client
        .batch_execute("DROP FUNCTION outbox.lifecycle_outbox_unsequenced_exists()")
        .await
        .expect("dropping the probe function again");
    numbered
}
