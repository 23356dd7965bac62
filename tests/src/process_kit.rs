//! Helpers for tests that run the real `outbox` binary as a separate process.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The `outbox` binary Cargo built for this test process, from the sources as they are now.
///
/// Cargo names it only to the integration tests of the package that owns it (`outbox-cli`),
/// as `CARGO_BIN_EXE_outbox` at compile time, which this library never sees. Those tests are
/// the suite that runs it, and Cargo builds the package's binaries before it runs them, into
/// the directory above the test binary's own (`target/<profile>/outbox` beside
/// `target/<profile>/deps/suite-<hash>`): so the kit finds it from where this process runs,
/// without building anything (a nested `cargo build`, as this kit once ran, held the first test
/// that ran the binary for as long as that build took). The suite checks that this is the path Cargo names
/// (`the_kit_runs_the_outbox_binary_cargo_built_for_this_suite`), so a change of that layout
/// fails one test by name instead of every test that runs the binary.
pub fn outbox_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(binary_beside_this_test).clone()
}

/// `outbox` in the directory above this test binary's (`target/<profile>/deps/<test>`).
fn binary_beside_this_test() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test binary lives in target/<profile>/deps")
        .join(format!("outbox{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "no outbox binary at {}: tests that run it belong to outbox-cli's suite \
         (`cargo test -p outbox-cli --test suite`), for which Cargo builds it",
        binary.display()
    );
    binary
}

/// Runs `outbox ARGS` to completion; returns (exit code, stdout, stderr).
pub async fn run_outbox(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(outbox_binary())
        .args(args)
        .env_remove("DATABASE_URL")
        .env("OUTBOX_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run outbox");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs `outbox --database-url <db> ARGS` to completion; returns (exit code, stdout, stderr).
pub async fn outbox_on(db: &crate::TestDb, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["--database-url", db.url.as_str()];
    all.extend_from_slice(args);
    run_outbox(&all).await
}

/// Runs a command on `db` that must succeed with `--output json`, and parses its document.
pub async fn outbox_json(db: &crate::TestDb, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--output", "json"]);
    let (code, out, err) = outbox_on(db, &all).await;
    assert_eq!(code, 0, "outbox {args:?} failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not one JSON document ({e}): {out}"))
}

/// Whether the tests run as root. PostgreSQL refuses to, so the kits that start a server of
/// their own (PgBouncer, the TLS cluster) then run it as `postgres`.
pub fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Sends the signal `name` (`KILL`, `TERM`, `INT`, `STOP`, `CONT`) to process `pid`.
pub fn send_signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// One line of `outbox consume` output with the moment the test read it.
#[derive(Debug, Clone)]
pub struct Line {
    /// When it was read.
    pub at: Instant,
    /// The parsed JSON line.
    pub value: serde_json::Value,
}

/// A running `outbox` process (`consume`, or another long-running command) whose stdout
/// lines (JSON) and stderr are collected.
pub struct OutboxProcess {
    /// The process.
    child: Child,
    /// Its stdout lines so far.
    lines: Arc<Mutex<Vec<Line>>>,
    /// Its stderr so far.
    stderr: Arc<Mutex<String>>,
}

/// The name the consumer tests know it by.
pub type ConsumeProcess = OutboxProcess;

impl OutboxProcess {
    /// Starts `outbox --database-url URL consume ARGS`.
    pub fn spawn(url: &str, args: &[&str]) -> Self {
        Self::spawn_command(url, "consume", args)
    }

    /// Starts `outbox --database-url URL COMMAND ARGS`.
    pub fn spawn_command(url: &str, command: &str, args: &[&str]) -> Self {
        Self::spawn_with_env(url, command, args, &[])
    }

    /// As [`OutboxProcess::spawn_command`], with extra environment variables. An admin token
    /// in the test's own environment is never passed on: tests give it explicitly.
    pub fn spawn_with_env(url: &str, command: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(outbox_binary())
            .arg("--database-url")
            .arg(url)
            .arg(command)
            .args(args)
            .env_remove("OUTBOX_ADMIN_TOKEN")
            .env("OUTBOX_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn outbox");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let stdout = child.stdout.take().expect("piped stdout");
        let sink = lines.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
                sink.lock().unwrap().push(Line {
                    at: Instant::now(),
                    value,
                });
            }
        });
        let err = child.stderr.take().expect("piped stderr");
        let sink = stderr.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(err).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let mut all = sink.lock().unwrap();
                all.push_str(&line);
                all.push('\n');
            }
        });
        Self {
            child,
            lines,
            stderr,
        }
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("process is running")
    }

    /// Lines read so far.
    pub fn lines(&self) -> Vec<Line> {
        self.lines.lock().unwrap().clone()
    }

    /// Sequences of the event lines read so far, in order.
    pub fn sequences(&self) -> Vec<i64> {
        self.lines()
            .iter()
            .filter(|l| l.value["type"] == "event")
            .map(|l| l.value["sequence"].as_i64().expect("sequence"))
            .collect()
    }

    /// Event IDs of the event lines read so far.
    pub fn event_ids(&self) -> Vec<String> {
        self.lines()
            .iter()
            .filter(|l| l.value["type"] == "event")
            .map(|l| l.value["event_id"].as_str().expect("event_id").to_owned())
            .collect()
    }

    /// Stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends a signal by name (`KILL`, `TERM`, `STOP`, `CONT`).
    pub fn signal(&self, name: &str) {
        send_signal(self.pid(), name);
    }

    /// The exit code if the process has ended (-1 for a signal), without waiting.
    pub fn exited(&mut self) -> Option<i32> {
        self.child
            .try_wait()
            .expect("check the process")
            .map(|status| status.code().unwrap_or(-1))
    }

    /// Waits for exit (after output is drained) and returns the exit code (-1 for a signal).
    pub async fn wait(&mut self) -> i32 {
        let status = self.child.wait().await.expect("wait for outbox");
        // Let the readers drain the pipes.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        status.code().unwrap_or(-1)
    }
}
