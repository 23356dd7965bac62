//! A PostgreSQL cluster of a test's own, for tests that stop or restart the server (doing that
//! to the shared test cluster would break every other test). Started with `scripts/pg.sh`,
//! like the shared one, in a directory named after the test; stopped however the test ends.

use std::process::Command;

use chrono::Utc;
use outbox_core::connect::ConnectSettings;
use outbox_core::{Prior, ProjectId, Schema, TaskDeleted, TaskId, Writer, WriterProcessId};
use tokio_postgres::Config;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg.sh");
/// The socket's port number. The socket lives in the cluster's own directory, so clusters
/// of different tests (and worktrees) never meet on it.
const PORT: &str = "54339";

/// A private cluster; `down` when dropped.
pub struct PrivateCluster {
    /// Its data and socket directory.
    dir: String,
    /// Its connection URL.
    pub url: String,
}

impl PrivateCluster {
    /// A fresh cluster in `.pg-<name>` in the project directory, running.
    pub fn start(name: &str) -> Self {
        let dir = format!("{}/../.pg-{name}", env!("CARGO_MANIFEST_DIR"));
        let url = pg(&dir, "reset");
        Self { dir, url }
    }

    /// Stops the server (the data stays).
    pub fn stop(&self) {
        pg(&self.dir, "down");
    }

    /// Stops the server at once (`pg_ctl -m immediate`: no checkpoint, clients cut off, crash
    /// recovery at the next start).
    pub fn crash(&self) {
        pg(&self.dir, "down immediate");
    }

    /// Starts the server again.
    pub fn resume(&self) {
        pg(&self.dir, "up");
    }

    /// Migrates the default schema; returns the cluster's connection configuration.
    pub async fn migrate(&self) -> Config {
        let config: Config = self.url.parse().expect("cluster URL parses");
        let mut client = crate::connect(&config).await;
        outbox_core::migrate(&mut client, &Schema::default())
            .await
            .expect("migrate the private cluster");
        config
    }
}

/// Writes and commits one event of `project` on a connection of its own; `Err` when the
/// outcome is unknown (the database went away), for writers that keep going across a restart.
pub async fn try_write(config: &Config, project: &str, task: &str) -> Result<String, ()> {
    let mut client = ConnectSettings::from_config(config.clone())
        .connect()
        .await
        .map_err(|_| ())?;
    let tx = client.transaction().await.map_err(|_| ())?;
    let event = TaskDeleted::new(
        ProjectId::new(project).map_err(|_| ())?,
        TaskId::new(task).map_err(|_| ())?,
        Utc::now(),
        Prior::default(),
    )
    .map_err(|_| ())?;
    Writer::new(
        &Schema::default(),
        WriterProcessId::new("w").expect("valid"),
    )
    .record(&tx, &event)
    .await
    .map_err(|_| ())?;
    tx.commit().await.map_err(|_| ())?;
    Ok(event.event_id())
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(SCRIPT)
            .arg("down")
            .env("OUTBOX_PG_DIR", &self.dir)
            .env("OUTBOX_PG_PORT", PORT)
            .status();
    }
}

/// Runs `scripts/pg.sh ACTION` for the cluster in `dir`; returns its stdout.
fn pg(dir: &str, action: &str) -> String {
    let output = Command::new("bash")
        .arg(SCRIPT)
        .args(action.split(' '))
        .env("OUTBOX_PG_DIR", dir)
        .env("OUTBOX_PG_PORT", PORT)
        .output()
        .expect("run scripts/pg.sh");
    assert!(
        output.status.success(),
        "pg.sh {action}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}
