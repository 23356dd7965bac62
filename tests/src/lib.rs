//! Test kit: one PostgreSQL cluster per test run, one fresh database per test.
//!
//! The cluster is the one named by `OUTBOX_TEST_DATABASE_URL` (`make test` starts a fresh
//! disposable cluster and sets it); when unset, `scripts/pg.sh up` starts or reuses the
//! project's disposable cluster. Each test binary migrates one template database once; every
//! test then gets `CREATE DATABASE ... TEMPLATE` of it, which takes milliseconds.

#![forbid(unsafe_code)]

pub mod cluster_kit;
pub mod consumer_kit;
pub mod legacy;
pub mod nats_cluster_kit;
pub mod nats_kit;
pub mod nats_secure_kit;
pub mod pgbouncer;
pub mod process_kit;
pub mod serve_kit;
pub mod set_kit;
pub mod standby_kit;
pub mod stats_kit;
pub mod tls_cluster;

use std::process::Command;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use outbox_core::Schema;
use outbox_core::connect::ConnectSettings;
use tokio::sync::OnceCell;
use tokio_postgres::{Client, Config};

/// A database of its own for one test.
#[derive(Debug, Clone)]
pub struct TestDb {
    /// Database name.
    pub name: String,
    /// Connection URL of this database.
    pub url: String,
    /// Parsed configuration of `url`.
    pub config: Config,
}

impl TestDb {
    /// A new connection; its driver runs on the current runtime.
    pub async fn connect(&self) -> Client {
        connect(&self.config).await
    }

    /// A deadpool pool of at most `size` connections, from outbox-core's connection factory
    /// (as `outbox consume` builds it).
    pub fn pool(&self, size: usize) -> deadpool_postgres::Pool {
        ConnectSettings::from_config(self.config.clone())
            .pool(size)
            .expect("pool builds")
    }
}

/// Opens a connection (through outbox-core's connection factory) whose driver task runs on the
/// current runtime.
pub async fn connect(config: &Config) -> Client {
    ConnectSettings::from_config(config.clone())
        .connect()
        .await
        .expect("connect to test database")
}

/// The cluster's URL (of its `postgres` database).
pub fn cluster_url() -> String {
    if let Ok(url) = std::env::var("OUTBOX_TEST_DATABASE_URL") {
        return url;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg.sh");
    let output = Command::new("bash")
        .arg(script)
        .arg("up")
        .output()
        .expect("run scripts/pg.sh up");
    assert!(
        output.status.success(),
        "scripts/pg.sh up failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8 URL")
        .trim()
        .to_owned()
}

/// `url` with its database name replaced by `name`.
pub fn with_dbname(url: &str, name: &str) -> String {
    let after_scheme = url.find("://").map(|i| i + 3).expect("URL with a scheme");
    let path_start = url[after_scheme..]
        .find('/')
        .map(|i| after_scheme + i)
        .unwrap_or(url.len());
    let path_end = url[path_start..]
        .find('?')
        .map(|i| path_start + i)
        .unwrap_or(url.len());
    format!("{}/{}{}", &url[..path_start], name, &url[path_end..])
}

static CLUSTER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
static TEMPLATE: OnceCell<String> = OnceCell::const_new();
static COUNTER: AtomicUsize = AtomicUsize::new(0);
/// This test process's prefix for the databases it creates: its PID and its start time, since
/// a long run spawns enough processes for PIDs to wrap around (`pid_max` is 32,768 by
/// default), and a later test binary with an earlier one's PID must not meet its databases.
static PREFIX: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_micros();
    format!("t_{}_{started}", std::process::id())
});

fn cluster() -> &'static str {
    CLUSTER.get_or_init(cluster_url)
}

/// The cluster's URL, resolved once per test binary.
pub fn cluster_url_cached() -> &'static str {
    cluster()
}

async fn admin() -> Client {
    connect(&Config::from_str(cluster()).expect("cluster URL parses")).await
}

async fn create_database(template: Option<&str>) -> TestDb {
    let name = format!("{}_{}", *PREFIX, COUNTER.fetch_add(1, Ordering::Relaxed));
    let admin = admin().await;
    let sql = match template {
        Some(template) => format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""),
        None => format!("CREATE DATABASE \"{name}\""),
    };
    // Two CREATE DATABASE statements copying one template at the same moment can collide;
    // retry briefly.
    let mut attempt = 0;
    loop {
        match admin.batch_execute(&sql).await {
            Ok(()) => break,
            Err(e) if attempt < 50 => {
                attempt += 1;
                let _ = e;
                tokio::time::sleep(std::time::Duration::from_millis(20 * attempt)).await;
            }
            Err(e) => panic!(
                "create database {name}: {}",
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |db| db.message().to_owned())
            ),
        }
    }
    let url = with_dbname(cluster(), &name);
    let config = Config::from_str(&url).expect("database URL parses");
    TestDb { name, url, config }
}

/// A fresh database with the outbox schema migrated (default schema `outbox`) and an
/// application `tasks` table.
pub async fn fresh_db() -> TestDb {
    let template = TEMPLATE
        .get_or_init(|| async {
            let db = create_database(None).await;
            let mut client = db.connect().await;
            outbox_core::migrate(&mut client, &Schema::default())
                .await
                .expect("migrate template");
            client
                .batch_execute(TASKS_TABLE)
                .await
                .expect("create tasks table");
            drop(client);
            // Let the connection close before the template is copied.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            db.name
        })
        .await;
    create_database(Some(template)).await
}

/// A fresh, empty database (no schema), for migration tests.
pub async fn empty_db() -> TestDb {
    create_database(None).await
}

/// The application table the demo, tests and reconciliation use.
pub const TASKS_TABLE: &str = "
CREATE TABLE public.tasks (
    id          text PRIMARY KEY,
    project_id  text NOT NULL,
    column_name text NOT NULL DEFAULT 'todo',
    status      text NOT NULL DEFAULT 'open',
    deleted_at  timestamptz
);
CREATE INDEX tasks_live_idx ON public.tasks (project_id) WHERE deleted_at IS NULL;";

/// The sequenced events of `project`, as (sequence, event_id), in sequence order.
pub async fn sequenced(client: &Client, project: &str) -> Vec<(i64, String)> {
    client
        .query(
            "SELECT sequence, event_id FROM outbox.lifecycle_outbox \
             WHERE project_id = $1 AND sequence IS NOT NULL ORDER BY sequence",
            &[&project],
        )
        .await
        .expect("read sequenced events")
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Opens a REPEATABLE READ transaction on `holder` whose first statement, `statement`, takes
/// its snapshot; returns the open transaction and that statement's first row. While it stays
/// open, every row version written afterwards stays visible to it, as `pg_dump`, a long
/// report or a replica's `hot_standby_feedback` keep them.
pub async fn hold_snapshot<'a>(
    holder: &'a mut Client,
    statement: &str,
) -> (tokio_postgres::Transaction<'a>, tokio_postgres::Row) {
    let hold = holder
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .expect("begin the holding transaction");
    let row = hold
        .query_one(statement, &[])
        .await
        .expect("take the held snapshot");
    (hold, row)
}
