//! Connections, a fresh database, the backlog and cursor reads.

use std::str::FromStr;
use std::time::Instant;

use outbox_core::Schema;
use tokio_postgres::{Client, Config, NoTls};

use crate::BoxResult;

/// Parses a `postgresql://` URL.
pub fn parse(url: &str) -> BoxResult<Config> {
    Config::from_str(url).map_err(|e| format!("invalid database URL: {e}").into())
}

/// `url` with its database name replaced by `name` (for the URLs `scripts/pg.sh` prints).
pub fn with_dbname(url: &str, name: &str) -> BoxResult<String> {
    let after_scheme = url
        .find("://")
        .map(|i| i + 3)
        .ok_or("the benchmark needs a postgresql:// URL")?;
    let path_start = url[after_scheme..]
        .find(['/', '?'])
        .map_or(url.len(), |i| after_scheme + i);
    let path_end = url[path_start..]
        .find('?')
        .map_or(url.len(), |i| path_start + i);
    Ok(format!(
        "{}/{}{}",
        &url[..path_start],
        name,
        &url[path_end..]
    ))
}

/// One connection whose driver runs on the current runtime.
pub async fn connect(config: &Config) -> BoxResult<Client> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Drops and re-creates database `name`, migrates it, returns its URL.
pub async fn fresh_database(admin_url: &str, name: &str) -> BoxResult<String> {
    let admin = connect(&parse(admin_url)?).await?;
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

/// Writes `events` already-sequenced events of `project` (dense 1..N, head at N, an hour old
/// at most so no retention sweep touches them), then VACUUM ANALYZE and CHECKPOINT so no run
/// pays for the backlog's own write-out. Numbering at insert time is only for speed; the
/// relay cannot tell the difference. Returns the seconds spent.
pub async fn write_backlog(url: &str, project: &str, events: i64) -> BoxResult<f64> {
    let client = connect(&parse(url)?).await?;
    let schema = Schema::default();
    let started = Instant::now();
    client
        .execute(
            &schema.render(
                "INSERT INTO {{schema}}.lifecycle_outbox
                    (project_id, sequence, event_type, event_id, task_id, deleted_at,
                     writer_process_id, occurred_at, payload_version, payload, sequenced_at)
                 SELECT $1, n, 'task:deleted',
                        'task-deleted:b' || n || ':'
                          || to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                        'b' || n, ts, 'bench-backlog', now(), 1,
                        jsonb_build_object('column', 'todo', 'status', 'open'),
                        now()
                 FROM generate_series(1, $2::bigint) AS n,
                      LATERAL (SELECT now() - interval '1 hour'
                                      + n * interval '1 microsecond') AS t(ts)
                 ORDER BY n",
            ),
            &[&project, &events],
        )
        .await?;
    client
        .execute(
            &schema.render(
                "INSERT INTO {{schema}}.lifecycle_project_heads (project_id, head_sequence)
                 VALUES ($1, $2)",
            ),
            &[&project, &events],
        )
        .await?;
    for statement in [
        "VACUUM (ANALYZE) {{schema}}.lifecycle_outbox",
        "VACUUM (ANALYZE) {{schema}}.lifecycle_project_heads",
        "CHECKPOINT",
    ] {
        client.batch_execute(&schema.render(statement)).await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

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

/// Server version and the settings that matter for these figures.
pub async fn server_description(url: &str) -> BoxResult<String> {
    let client = connect(&parse(url)?).await?;
    let version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
    let settings: String = client
        .query_one(
            "SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ', ' ORDER BY name)
             FROM pg_settings
             WHERE name IN ('shared_buffers', 'fsync', 'synchronous_commit')",
            &[],
        )
        .await?
        .get(0);
    Ok(format!("PostgreSQL {version}: {settings}"))
}
