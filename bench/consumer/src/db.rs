//! Connections, fresh databases and the catch-up backlog.

use std::str::FromStr;
use std::time::Instant;

use outbox_core::Schema;
use outbox_core::connect::ConnectSettings;
use tokio_postgres::{Client, Config};

use crate::BoxResult;

/// Parses a `postgresql://` URL (or key=value string).
pub fn parse(url: &str) -> BoxResult<Config> {
    Config::from_str(url).map_err(|e| format!("invalid database URL: {e}").into())
}

/// `url` with its database name replaced by `name`, so a child process can be handed one URL.
/// Works for the URLs `scripts/pg.sh` prints (`postgresql://user@/db?host=...&port=...`).
pub fn with_dbname(url: &str, name: &str) -> BoxResult<String> {
    let after_scheme = url
        .find("://")
        .map(|i| i + 3)
        .ok_or("the benchmark needs a postgresql:// URL (it derives per-benchmark databases)")?;
    let path_start = url[after_scheme..]
        .find(['/', '?'])
        .map(|i| after_scheme + i)
        .unwrap_or(url.len());
    let path_end = url[path_start..]
        .find('?')
        .map(|i| path_start + i)
        .unwrap_or(url.len());
    Ok(format!(
        "{}/{}{}",
        &url[..path_start],
        name,
        &url[path_end..]
    ))
}

/// Opens one connection (through outbox-core's connection factory, as every process does)
/// whose driver runs on the current runtime.
pub async fn connect(config: &Config) -> BoxResult<Client> {
    Ok(ConnectSettings::from_config(config.clone())
        .connect()
        .await?)
}

/// A pool like the one `outbox consume` builds (fast recycling, `size` connections).
pub fn pool(config: &Config, size: usize) -> BoxResult<deadpool_postgres::Pool> {
    Ok(ConnectSettings::from_config(config.clone()).pool(size)?)
}

/// Drops and re-creates database `name` on the cluster of `admin_url`, migrates it, and
/// returns its URL. Each benchmark gets its own database so none sees another's rows.
pub async fn fresh_database(admin_url: &str, name: &str) -> BoxResult<String> {
    let admin = connect(&parse(admin_url)?).await?;
    // Two statements: DROP DATABASE refuses to run inside a (multi-statement) transaction.
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .await?;
    admin
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await?;
    let url = with_dbname(admin_url, name)?;
    let mut client = connect(&parse(&url)?).await?;
    outbox_core::migrate(&mut client, &Schema::default()).await?;
    Ok(url)
}

/// Writes `events` already-sequenced events for `project`, and registers the project, so that
/// the backlog is exactly what the writer plus the sequencer would have left: dense sequences
/// 1..N in arrival (`id`) order, `sequenced_at` set, the project's row in `lifecycle_projects`
/// (its head, N, is read from the sequence index). Numbering at insert time
/// is only for speed (one `INSERT ... SELECT` instead of a million writer calls and a
/// sequencer drain); the consumer cannot tell the difference. The events are an hour old at
/// most: the runtime's retention sweep (at consumer start) prunes acknowledged events older
/// than 30 days, and an older backlog would be pruned away after the first run, sending the
/// next consumer into reconciliation instead of replay.
///
/// Then `VACUUM (ANALYZE)` (hint bits and visibility map set, statistics current, as
/// autovacuum would have left a table this old) and a `CHECKPOINT` (so no run pays for the
/// backlog's own write-out). Returns the seconds spent.
pub async fn write_backlog(url: &str, project: &str, events: i64) -> BoxResult<f64> {
    let client = connect(&parse(url)?).await?;
    let schema = Schema::default();
    let started = Instant::now();
    let insert = schema.render(
        "INSERT INTO {{schema}}.lifecycle_outbox
            (project_id, sequence, event_type, event_id, task_id, deleted_at,
             writer_process_id, occurred_at, payload_version, payload, sequenced_at)
         SELECT $1, n, 'task:deleted',
                'task-deleted:b' || n || ':'
                    || to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                'b' || n, ts, 'bench-backlog', now(), 1,
                jsonb_build_object(
                    'column', (ARRAY['backlog', 'todo', 'doing', 'review', 'done'])[1 + n % 5],
                    'status', (ARRAY['open', 'blocked', 'closed'])[1 + n % 3]),
                now()
         FROM generate_series(1, $2::bigint) AS n,
              LATERAL (SELECT now() - interval '1 hour'
                              + n * interval '1 microsecond') AS t(ts)
         ORDER BY n",
    );
    client.execute(&insert, &[&project, &events]).await?;
    client
        .execute(
            &schema.render("INSERT INTO {{schema}}.lifecycle_projects (project_id) VALUES ($1)"),
            &[&project],
        )
        .await?;
    // One statement per call: VACUUM refuses to run inside a (multi-statement) transaction.
    for statement in [
        "VACUUM (ANALYZE) {{schema}}.lifecycle_outbox",
        "VACUUM (ANALYZE) {{schema}}.lifecycle_projects",
        "CHECKPOINT",
    ] {
        client.batch_execute(&schema.render(statement)).await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Server version and the settings that matter for these figures.
pub async fn server_description(url: &str) -> BoxResult<String> {
    let client = connect(&parse(url)?).await?;
    let version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
    let settings: String = client
        .query_one(
            "SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ', ' ORDER BY name)
             FROM pg_settings
             WHERE name IN ('shared_buffers', 'fsync', 'synchronous_commit', 'max_wal_size',
                            'full_page_writes', 'autovacuum')",
            &[],
        )
        .await?
        .get(0);
    Ok(format!("PostgreSQL {version}: {settings}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_database_name() {
        assert_eq!(
            with_dbname("postgresql://postgres@/postgres?host=/x/run&port=1", "b").unwrap(),
            "postgresql://postgres@/b?host=/x/run&port=1"
        );
        assert_eq!(
            with_dbname("postgresql://u@h:5432", "b").unwrap(),
            "postgresql://u@h:5432/b"
        );
        assert_eq!(
            with_dbname("postgresql://u@h?port=1", "b").unwrap(),
            "postgresql://u@h/b?port=1"
        );
        assert!(with_dbname("host=/tmp", "b").is_err());
    }
}
