//! A primary and a streaming standby of a test's own, for failover tests: the primary is
//! started with `scripts/pg.sh` (like [`crate::cluster_kit::PrivateCluster`]), the standby is
//! made from it with `pg_basebackup -R` and streams from it over the primary's Unix socket.
//! Both listen only on sockets in their own directories. Helpers stop the standby's WAL
//! receipt (so a tail written afterwards exists only on the primary), stop the primary
//! immediately, and promote the standby; the pair can also run with synchronous replication.
//! Both servers are stopped however the test ends.

use std::process::Command;
use std::time::Duration;

use outbox_core::Schema;
use tokio_postgres::Config;

use crate::TestDb;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg.sh");
/// The sockets' port number (each socket lives in its node's own directory).
pub const PORT: u16 = 54341;

/// How the standby's commits are confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// The primary commits without waiting for the standby: a failover may lose a tail.
    Asynchronous,
    /// `synchronous_standby_names = '*'`, `synchronous_commit = on`: a commit returns only
    /// once the standby has flushed it, so nothing acknowledged to a writer is lost.
    Synchronous,
}

/// One server of the pair.
struct Node {
    /// The directory holding `data/`, `run/` (the socket) and `server.log`.
    dir: String,
}

impl Node {
    fn run_dir(&self) -> String {
        format!("{}/run", self.dir)
    }

    fn data_dir(&self) -> String {
        format!("{}/data", self.dir)
    }
}

/// A primary and its streaming standby; both stopped when dropped.
pub struct StandbyPair {
    primary: Node,
    standby: Node,
    /// The PostgreSQL user both are reached as.
    user: String,
}

impl StandbyPair {
    /// A fresh primary in `.pg-<name>-a` and a standby of it in `.pg-<name>-b`, both running,
    /// the default schema migrated on the primary and replayed on the standby.
    pub async fn start(name: &str, replication: Replication) -> Self {
        let base = format!("{}/../.pg-{name}", env!("CARGO_MANIFEST_DIR"));
        let primary = Node {
            dir: format!("{base}-a"),
        };
        let standby = Node {
            dir: format!("{base}-b"),
        };
        pg(&standby.dir, "down");
        let _ = std::fs::remove_dir_all(&standby.dir);
        let url = pg(&primary.dir, "reset");
        let user = url
            .strip_prefix("postgresql://")
            .and_then(|rest| rest.split('@').next())
            .expect("pg.sh prints a URL with a user")
            .to_owned();
        let pair = Self {
            primary,
            standby,
            user,
        };
        if replication == Replication::Synchronous {
            pair.sql_on_primary("ALTER SYSTEM SET synchronous_standby_names = '*'")
                .await;
            pair.sql_on_primary("SELECT pg_reload_conf()").await;
        }
        std::fs::create_dir_all(pair.standby.run_dir()).expect("standby directory");
        as_postgres(Command::new("chown").args(["-R", "postgres:", &pair.standby.dir]));
        let basebackup = pg_bin("pg_basebackup");
        let standby_data = pair.standby.data_dir();
        let primary_run = pair.primary.run_dir();
        let port = PORT.to_string();
        run_as_owner(&[
            basebackup.as_str(),
            "-D",
            &standby_data,
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "-h",
            &primary_run,
            "-p",
            &port,
            "-U",
            &pair.user,
        ]);
        let conf = format!("{standby_data}/postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("read the standby's configuration");
        text.push_str(&format!(
            "unix_socket_directories = '{}'\nhot_standby = on\n",
            pair.standby.run_dir()
        ));
        std::fs::write(&conf, text).expect("write the standby's configuration");
        pg(&pair.standby.dir, "up");
        // The base backup copied the primary's `synchronous_standby_names`; once promoted, the
        // standby has no standby of its own to wait for.
        let standby = crate::connect(&pair.standby_config()).await;
        standby
            .batch_execute("ALTER SYSTEM RESET synchronous_standby_names")
            .await
            .expect("reset synchronous_standby_names on the standby");
        standby
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .expect("reload the standby's configuration");
        drop(standby);
        let config = pair.primary_config();
        let mut client = crate::connect(&config).await;
        outbox_core::migrate(&mut client, &Schema::default())
            .await
            .expect("migrate the primary");
        client
            .batch_execute(crate::TASKS_TABLE)
            .await
            .expect("create the tasks table");
        pair.caught_up().await;
        pair
    }

    /// The primary's connection configuration (database `postgres`).
    pub fn primary_config(&self) -> Config {
        node_config(&self.primary, &self.user)
    }

    /// The standby's connection configuration.
    pub fn standby_config(&self) -> Config {
        node_config(&self.standby, &self.user)
    }

    /// The primary as a [`TestDb`] (database `postgres`).
    pub fn primary_db(&self) -> TestDb {
        test_db(self.primary_url(), self.primary_config())
    }

    /// The standby (later the promoted primary) as a [`TestDb`].
    pub fn standby_db(&self) -> TestDb {
        test_db(self.standby_url(), self.standby_config())
    }

    /// Both nodes as one [`TestDb`] whose connections reach whichever accepts writes
    /// ([`Self::multi_host_url`]).
    pub fn either_db(&self) -> TestDb {
        let config = self
            .multi_host_keywords()
            .parse()
            .expect("the multi-host string parses");
        test_db(self.multi_host_url(), config)
    }

    fn primary_url(&self) -> String {
        format!(
            "postgresql://{}@/postgres?host={}&port={PORT}",
            self.user,
            self.primary.run_dir()
        )
    }

    fn standby_url(&self) -> String {
        format!(
            "postgresql://{}@/postgres?host={}&port={PORT}",
            self.user,
            self.standby.run_dir()
        )
    }

    /// The multi-host connection string naming the primary first and the standby second,
    /// with `target_session_attrs=read-write`: it reaches whichever of them accepts writes.
    pub fn multi_host_url(&self) -> String {
        format!(
            "postgresql://{}@/postgres?host={},{}&port={PORT},{PORT}&\
             target_session_attrs=read-write",
            self.user,
            self.primary.run_dir(),
            self.standby.run_dir()
        )
    }

    /// The same in key=value form.
    pub fn multi_host_keywords(&self) -> String {
        format!(
            "host={},{} port={PORT},{PORT} user={} dbname=postgres \
             target_session_attrs=read-write",
            self.primary.run_dir(),
            self.standby.run_dir(),
            self.user
        )
    }

    /// Waits until the standby has replayed everything the primary has written so far.
    pub async fn caught_up(&self) {
        let primary = crate::connect(&self.primary_config()).await;
        let target: String = primary
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .expect("primary's WAL position")
            .get(0);
        let standby = crate::connect(&self.standby_config()).await;
        for _ in 0..600 {
            let behind: bool = standby
                .query_one(
                    "SELECT pg_wal_lsn_diff($1::text::pg_lsn, \
                     COALESCE(pg_last_wal_replay_lsn(), '0/0')) > 0",
                    &[&target],
                )
                .await
                .expect("standby's replay position")
                .get(0);
            if !behind {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the standby did not replay up to {target}");
    }

    /// Stops the standby's WAL receipt: `primary_conninfo` cleared and the configuration
    /// reloaded, which ends its WAL receiver. What the primary writes afterwards exists only
    /// there. Waits until the receiver is gone.
    pub async fn stop_wal_receipt(&self) {
        self.caught_up().await;
        let standby = crate::connect(&self.standby_config()).await;
        standby
            .batch_execute("ALTER SYSTEM SET primary_conninfo = ''")
            .await
            .expect("clear primary_conninfo");
        standby
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .expect("reload the standby's configuration");
        for _ in 0..500 {
            let receiving: bool = standby
                .query_one("SELECT EXISTS (SELECT FROM pg_stat_wal_receiver)", &[])
                .await
                .expect("read pg_stat_wal_receiver")
                .get(0);
            if !receiving {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the standby's WAL receiver did not stop");
    }

    /// The primary stopped at once (`pg_ctl stop -m immediate`): no shutdown checkpoint, no
    /// last WAL sent, client connections cut.
    pub fn stop_primary_immediately(&self) {
        let pg_ctl = pg_bin("pg_ctl");
        let data = self.primary.data_dir();
        run_as_owner(&[
            pg_ctl.as_str(),
            "-D",
            &data,
            "-m",
            "immediate",
            "-w",
            "stop",
        ]);
    }

    /// Promotes the standby and waits until it accepts writes.
    pub async fn promote_standby(&self) {
        let pg_ctl = pg_bin("pg_ctl");
        let data = self.standby.data_dir();
        run_as_owner(&[pg_ctl.as_str(), "-D", &data, "-w", "-t", "60", "promote"]);
        let standby = crate::connect(&self.standby_config()).await;
        for _ in 0..500 {
            let in_recovery: bool = standby
                .query_one("SELECT pg_is_in_recovery()", &[])
                .await
                .expect("read pg_is_in_recovery")
                .get(0);
            if !in_recovery {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the standby was not promoted");
    }

    /// Runs `sql` on the primary.
    async fn sql_on_primary(&self, sql: &str) {
        let client = crate::connect(&self.primary_config()).await;
        client
            .batch_execute(sql)
            .await
            .expect("statement on the primary");
    }
}

impl Drop for StandbyPair {
    fn drop(&mut self) {
        for node in [&self.standby, &self.primary] {
            let _ = Command::new("bash")
                .arg(SCRIPT)
                .arg("down")
                .env("OUTBOX_PG_DIR", &node.dir)
                .env("OUTBOX_PG_PORT", PORT.to_string())
                .status();
        }
    }
}

fn test_db(url: String, config: Config) -> TestDb {
    TestDb {
        name: "postgres".into(),
        url,
        config,
    }
}

/// The connection configuration of one node's socket.
fn node_config(node: &Node, user: &str) -> Config {
    let mut config = Config::new();
    config
        .host(node.run_dir())
        .port(PORT)
        .user(user)
        .dbname("postgres");
    config
}

/// The path of a PostgreSQL server program: from `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin` (as `scripts/pg.sh` finds them).
fn pg_bin(program: &str) -> String {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|dir| std::path::Path::new(&format!("{dir}/pg_ctl")).exists());
    let dir = from_pg_config.unwrap_or_else(|| {
        let mut dirs: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries")
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin"))
            .filter(|p| p.join("pg_ctl").exists())
            .collect();
        dirs.sort();
        dirs.pop()
            .expect("PostgreSQL server binaries")
            .display()
            .to_string()
    });
    format!("{dir}/{program}")
}

/// Whether this process runs as root (PostgreSQL then runs as `postgres`).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs `command` only as root (ownership changes for the `postgres` user).
fn as_postgres(command: &mut Command) {
    if is_root() {
        let status = command.status().expect("run command");
        assert!(status.success(), "{command:?} failed");
    }
}

/// Runs `argv` as the cluster's owner (`postgres` when running as root), asserting success.
fn run_as_owner(argv: &[&str]) {
    let output = if is_root() {
        Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .args(argv)
            .output()
    } else {
        Command::new(argv[0]).args(&argv[1..]).output()
    }
    .expect("run a PostgreSQL program");
    assert!(
        output.status.success(),
        "{argv:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs `scripts/pg.sh ACTION` for the node in `dir`; returns its stdout.
fn pg(dir: &str, action: &str) -> String {
    let output = Command::new("bash")
        .arg(SCRIPT)
        .arg(action)
        .env("OUTBOX_PG_DIR", dir)
        .env("OUTBOX_PG_PORT", PORT.to_string())
        .output()
        .expect("run scripts/pg.sh");
    assert!(
        output.status.success(),
        "pg.sh {action}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}
