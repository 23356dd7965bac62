//! The relay's cursor; everything else comes from the shared benchmark helpers.

use tokio_postgres::Client;

pub use outbox_bench::db::{connect, fresh_database, parse, server_description, write_backlog};

use crate::BoxResult;

/// A consumer's acknowledged cursor (0 when it has none yet).
pub async fn cursor(client: &Client, project: &str, consumer: &str) -> BoxResult<i64> {
    let row = client
        .query_opt(
            "SELECT last_acked_sequence FROM outbox.lifecycle_consumer_cursors
             WHERE project_id = $1 AND consumer_id = $2",
            &[&project, &consumer],
        )
        .await?;
    Ok(row.and_then(|r| r.get::<_, Option<i64>>(0)).unwrap_or(0))
}
