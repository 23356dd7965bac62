//! A real PgBouncer in transaction mode in front of the test cluster.
//!
//! `scripts/test.sh` installs the Debian `pgbouncer` package when it is missing; a test that
//! needs PgBouncer and cannot find it fails, naming the fix. PgBouncer refuses to run as root,
//! so under root it runs as the `postgres` OS user (as the cluster does). It listens on
//! 127.0.0.1 on a port picked free at start, and reaches the cluster over its Unix socket;
//! every database of the cluster is reachable through it by name.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::Config;
use tokio_postgres::config::Host;

use crate::process_kit::is_root;

/// Server connections PgBouncer keeps per database and user: small, so that clients really
/// share server sessions and any session state leaking between them would show.
pub const POOL_SIZE: u32 = 3;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A running PgBouncer; stopped when dropped.
pub struct PgBouncer {
    child: Child,
    /// The TCP port it listens on (127.0.0.1).
    pub port: u16,
    /// Its working directory (configuration and log).
    pub dir: PathBuf,
    user: String,
}

/// The pgbouncer binary, or a panic naming how to get it.
pub fn pgbouncer_binary() -> PathBuf {
    for candidate in ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"] {
        let path = PathBuf::from(candidate);
        if path.exists() {
            return path;
        }
    }
    panic!(
        "pgbouncer is not installed: `make test` installs it (scripts/test-deps.sh runs \
         apt-get install pgbouncer); install it to run this test alone"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("pick a free TCP port")
}

impl PgBouncer {
    /// Starts PgBouncer (`pool_mode = transaction`, [`POOL_SIZE`] server connections per
    /// database) in front of the test cluster and waits until it accepts connections. Every
    /// client reaches the server as the cluster's superuser.
    pub fn start() -> Self {
        Self::launch(&[])
    }

    /// As [`PgBouncer::start`], but each client reaches the server as the role it names, and
    /// `users` (login roles the test made) may connect besides the superuser: a deployment
    /// whose processes log in as least-privilege roles.
    pub fn start_for_users(users: &[String]) -> Self {
        Self::launch(users)
    }

    fn launch(users: &[String]) -> Self {
        let binary = pgbouncer_binary();
        let cluster = Config::from_str(crate::cluster_url_cached()).expect("cluster URL parses");
        let socket_dir = cluster
            .get_hosts()
            .iter()
            .find_map(|h| match h {
                Host::Unix(path) => Some(path.clone()),
                _ => None,
            })
            .expect("the test cluster listens on a Unix socket");
        let cluster_port = cluster.get_ports().first().copied().unwrap_or(5432);
        let user = cluster.get_user().unwrap_or("postgres").to_owned();

        let dir = std::env::temp_dir().join(format!(
            "outbox-pgbouncer-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create pgbouncer directory");
        let port = free_port();
        // With no `user=`, PgBouncer logs in to the server as the client's own role.
        let server_user = match users.is_empty() {
            true => format!(" user={user}"),
            false => String::new(),
        };
        let ini = format!(
            "[databases]\n\
             * = host={socket} port={cluster_port}{server_user}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/users.txt\n\
             pool_mode = transaction\n\
             default_pool_size = {POOL_SIZE}\n\
             min_pool_size = 0\n\
             reserve_pool_size = 0\n\
             max_client_conn = 500\n\
             server_reset_query =\n\
             logfile = {dir}/pgbouncer.log\n\
             pidfile = {dir}/pgbouncer.pid\n\
             admin_users = {user}\n",
            socket = socket_dir.display(),
            dir = dir.display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).expect("write pgbouncer.ini");
        let auth_file: String = std::iter::once(&user)
            .chain(users)
            .map(|u| format!("\"{u}\" \"\"\n"))
            .collect();
        std::fs::write(dir.join("users.txt"), auth_file).expect("write users.txt");

        let root = is_root();
        let mut command = if root {
            let status = Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(&dir)
                .status()
                .expect("run chown");
            assert!(status.success(), "chown of {} failed", dir.display());
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&binary);
            c
        } else {
            Command::new(&binary)
        };
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let mut bouncer = Self {
            child,
            port,
            dir,
            user,
        };
        bouncer.wait_ready();
        bouncer
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "pgbouncer exited ({status}) before accepting connections; log:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not accept connections within 15s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    /// The URL of database `name` through PgBouncer.
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgresql://{}@127.0.0.1:{}/{name}?sslmode=disable",
            self.user, self.port
        )
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // SIGTERM: PgBouncer's immediate shutdown (SIGINT would wait for clients). Sent to
        // the pgbouncer process itself (from its pidfile) and to our child (runuser, when root).
        let pid = std::fs::read_to_string(self.dir.join("pgbouncer.pid")).unwrap_or_default();
        for target in [pid.trim().to_owned(), self.child.id().to_string()] {
            if !target.is_empty() {
                let _ = Command::new("kill").args(["-TERM", &target]).status();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
