//! The runtime's sampled gauges: lag, dead letters and the unsequenced backlog. Counters are
//! recorded where things happen; these figures live in the database, so the lease holder
//! samples them once per poll interval (one round trip) while it runs.

use std::time::Duration;

use deadpool_postgres::Pool;
use outbox_core::{ConsumerId, ProjectId, Schema};
use tokio_util::sync::CancellationToken;

use crate::sql;

/// Samples every `interval` until `stop`; a failed sample is skipped (the gauges keep their
/// last values) and tried again at the next tick.
pub(crate) async fn sample(
    pool: Pool,
    schema: Schema,
    project: ProjectId,
    consumer: ConsumerId,
    interval: Duration,
    stop: CancellationToken,
) {
    let statement = schema.render(sql::GAUGES);
    let labels = [
        ("project", project.to_string()),
        ("consumer", consumer.to_string()),
    ];
    loop {
        let sampled = async {
            let client = pool.get().await.ok()?;
            client
                .query_one(&statement, &[&project.as_str(), &consumer.as_str()])
                .await
                .ok()
        }
        .await;
        if let Some(row) = sampled {
            let head: i64 = row.try_get("head").unwrap_or(0);
            let cursor: Option<i64> = row.try_get("cursor").unwrap_or(None);
            let dead: i64 = row.try_get("dead_letters").unwrap_or(0);
            let unsequenced: i64 = row.try_get("unsequenced").unwrap_or(0);
            let oldest: Option<f64> = row.try_get("oldest_unsequenced").unwrap_or(None);
            if let Some(cursor) = cursor {
                metrics::gauge!(crate::metric::CONSUMER_LAG.name, &labels)
                    .set((head - cursor).max(0) as f64);
            }
            metrics::gauge!(crate::metric::DEAD_LETTERS.name, &labels).set(dead as f64);
            metrics::gauge!(crate::metric::UNSEQUENCED_EVENTS.name).set(unsequenced as f64);
            metrics::gauge!(crate::metric::OLDEST_UNSEQUENCED.name).set(oldest.unwrap_or(0.0));
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
