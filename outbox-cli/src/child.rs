//! The child-process sink of `outbox consume --child`: a long-lived process driven one line at
//! a time.
//!
//! The child's rules:
//! - Each event (and each reconciliation) arrives as one JSON line on its stdin.
//! - It answers each line with one line on stdout: `{"ack": SEQ}` or
//!   `{"fail": SEQ, "class": "code"}`, where the class matches `[a-z0-9_]{1,64}`. Stdout
//!   carries answers only; logs go to stderr.
//! - With `--lanes` above 1, several events are out with it at once (each of a different
//!   task): it may answer them in any order, each answer naming its sequence
//!   ([`mux`]). With one lane it has one event at a time.
//! - It runs in its own process group. A timeout, a restart or shutdown ends the whole group:
//!   SIGTERM, then SIGKILL after the stop grace period. No process of the child outlives
//!   `outbox`.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use outbox_consumer::{FailureClass, Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use outbox_service::lines::{event_line, reconcile_line};

mod mux;

/// The rule a child's failure class must follow, as shown in messages.
const CLASS_RULE: &str = "[a-z0-9_]{1,64}";

/// `sh` exits with these when the command cannot be run at all (126: not executable, 127: not
/// found): the sink is broken, not the event.
const CANNOT_RUN: [i32; 2] = [126, 127];

/// The child's answer to one line.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Answer {
    Ack { ack: i64 },
    Fail { fail: i64, class: String },
}

/// A running child and its pipes.
struct Running {
    /// The `sh -c` process, leader of the child's process group.
    child: Child,
    /// The process group (the leader's PID).
    group: Pid,
    stdin: BufWriter<ChildStdin>,
    /// Its answers: taken by the reader of a child answering in any order ([`mux`]).
    stdout: Option<BufReader<ChildStdout>>,
    /// Whether this child has given at least one answer in protocol. A child that never did
    /// and exits with 126 or 127 could not be run; one whose first line breaks the protocol
    /// (a banner on stdout, say) cannot speak it. Either is a broken sink, not a failed event.
    answered: bool,
    /// Set once the group has been ended, so dropping does not signal a reused ID.
    ended: bool,
}

impl Drop for Running {
    /// The last resort on every path (an error, a dropped future): kill the whole group.
    fn drop(&mut self) {
        if !self.ended {
            let _ = killpg(self.group, Signal::SIGKILL);
        }
    }
}

/// Drives a long-lived child process: one line in, one acknowledgement line out. A child that
/// exits or hangs is ended (with its whole process group) and restarted with backoff, and the
/// unacknowledged event is delivered again. Cloning shares the one child.
#[derive(Clone)]
pub struct ChildSink {
    inner: Arc<Inner>,
}

struct Inner {
    /// The command line, run with `sh -c`.
    command: String,
    /// The child, when running.
    running: Mutex<Option<Running>>,
    /// Consecutive restarts without a successful answer, for the backoff.
    restarts: Mutex<u32>,
    /// How long to wait for one answer.
    answer_timeout: Duration,
    /// How long a child has between SIGTERM and SIGKILL.
    stop_grace: Duration,
    /// For the reconciliation line.
    consumer: String,
    /// Once cancelled, no child is started (or restarted) and nothing new is sent.
    shutdown: CancellationToken,
    /// The running child's process group (0 when none), readable without the lock so a second
    /// signal can kill it at once.
    group: AtomicI32,
    /// Whether events go out several at once, answered in any order (`--lanes` above 1).
    any_order: bool,
    /// The child of [`Inner::any_order`], with the events out with it.
    multiplexed: Mutex<Option<mux::Multiplexed>>,
}

impl ChildSink {
    /// A sink for `command`; nothing starts until the first line.
    pub fn new(
        command: String,
        consumer: String,
        answer_timeout: Duration,
        stop_grace: Duration,
        shutdown: CancellationToken,
        any_order: bool,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                any_order,
                multiplexed: Mutex::new(None),
                command,
                running: Mutex::new(None),
                restarts: Mutex::new(0),
                answer_timeout,
                stop_grace,
                consumer,
                shutdown,
                group: AtomicI32::new(0),
            }),
        }
    }

    /// Ends the child's process group gracefully (SIGTERM, then SIGKILL after the grace
    /// period). Called when the consumer has stopped.
    pub async fn close(&self) {
        let running = self.inner.running.lock().await.take();
        if let Some(running) = running {
            self.inner.end(running).await;
        }
        let multiplexed = self.inner.multiplexed.lock().await.take();
        if let Some(multiplexed) = multiplexed {
            self.inner.end(multiplexed.running).await;
        }
    }

    /// Kills the child's process group at once, without waiting (for a second signal).
    pub fn kill_now(&self) {
        let group = self.inner.group.load(Ordering::SeqCst);
        if group > 0 {
            let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
        }
    }
}

impl Inner {
    async fn spawn(&self) -> Result<Running, HandlerFailure> {
        let restarts = *self.restarts.lock().await;
        if restarts > 0 {
            let delay =
                Duration::from_millis(100u64 << restarts.min(6)).min(Duration::from_secs(5));
            tracing::warn!(
                restarts,
                delay = %humantime::format_duration(delay),
                "restarting child process"
            );
            tokio::select! {
                _ = self.shutdown.cancelled() => return Err(HandlerFailure::abandon()),
                _ = tokio::time::sleep(delay) => {}
            }
        }
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&self.command)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| HandlerFailure::stop(format!("cannot start the child with sh -c: {e}")))?;
        let (Some(pid), Some(stdin), Some(stdout)) =
            (child.id(), child.stdin.take(), child.stdout.take())
        else {
            return Err(HandlerFailure::stop(
                "the child started without its pipes or exited at once",
            ));
        };
        let group = Pid::from_raw(pid as i32);
        self.group.store(group.as_raw(), Ordering::SeqCst);
        tracing::info!(pid, "child process started (own process group)");
        Ok(Running {
            child,
            group,
            stdin: BufWriter::new(stdin),
            stdout: Some(BufReader::new(stdout)),
            answered: false,
            ended: false,
        })
    }

    /// Ends `running`'s whole process group: SIGTERM, then SIGKILL for whatever is left after
    /// the grace period.
    async fn end(&self, mut running: Running) {
        let group = running.group;
        self.group.store(0, Ordering::SeqCst);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + self.stop_grace;
        let _ = tokio::time::timeout_at(deadline, running.child.wait()).await;
        while group_runs(group) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if group_runs(group) {
            tracing::warn!(
                group = group.as_raw(),
                grace = %humantime::format_duration(self.stop_grace),
                "child process group outlived SIGTERM; killing it"
            );
            let _ = killpg(group, Signal::SIGKILL);
        }
        let _ = running.child.wait().await;
        running.ended = true;
    }

    /// Sends `line` and waits for the answer about `sequence`.
    async fn exchange(&self, line: String, sequence: i64) -> Result<(), HandlerFailure> {
        if self.any_order {
            return self.exchange_any_order(line, sequence).await;
        }
        let mut slot = self.running.lock().await;
        if slot.is_none() {
            if self.shutdown.is_cancelled() {
                return Err(HandlerFailure::abandon());
            }
            *slot = Some(self.spawn().await?);
        }
        let Some(running) = slot.as_mut() else {
            return Err(HandlerFailure::abandon());
        };
        let outcome = async {
            running.stdin.write_all(line.as_bytes()).await?;
            running.stdin.write_all(b"\n").await?;
            running.stdin.flush().await?;
            let mut answer = String::new();
            let stdout = running
                .stdout
                .as_mut()
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "no stdout"))?;
            let read = tokio::time::timeout(self.answer_timeout, stdout.read_line(&mut answer))
                .await
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))??;
            Ok::<_, std::io::Error>((read, answer))
        }
        .await;
        let answer = match outcome {
            Ok((read, answer)) if read > 0 => answer,
            failed => {
                let timed_out =
                    matches!(&failed, Err(e) if e.kind() == std::io::ErrorKind::TimedOut);
                let Some(mut dead) = slot.take() else {
                    return Err(HandlerFailure::abandon());
                };
                let status = if timed_out {
                    None
                } else {
                    tokio::time::timeout(Duration::from_millis(500), dead.child.wait())
                        .await
                        .ok()
                        .and_then(Result::ok)
                };
                let never_answered = !dead.answered;
                self.end(dead).await;
                if let Some(code) = status.and_then(|s| s.code()) {
                    if never_answered && CANNOT_RUN.contains(&code) {
                        return Err(HandlerFailure::stop(format!(
                            "the child command {:?} cannot be run (sh exited with {code}: {})",
                            self.command,
                            if code == 127 {
                                "command not found"
                            } else {
                                "not executable"
                            }
                        )));
                    }
                }
                if self.shutdown.is_cancelled() {
                    return Err(HandlerFailure::abandon());
                }
                *self.restarts.lock().await += 1;
                if timed_out {
                    tracing::warn!(
                        sequence,
                        timeout = %humantime::format_duration(self.answer_timeout),
                        "child did not answer in time; ended its process group"
                    );
                    return Err(class("child_timeout"));
                }
                let status = status.map_or_else(|| "unknown".to_owned(), |s| s.to_string());
                tracing::warn!(sequence, %status, "child exited before answering");
                return Err(class("child_exited"));
            }
        };
        let in_protocol = match serde_json::from_str::<Answer>(answer.trim()) {
            Ok(Answer::Ack { ack }) if ack == sequence => Some(Ok(())),
            Ok(Answer::Fail { fail, class: code }) if fail == sequence => {
                Some(Err(HandlerFailure::new(
                    FailureClass::new(code.clone()).unwrap_or_else(|_| {
                        tracing::warn!(
                            sequence,
                            class = %code,
                            "child's failure class breaks the rule {CLASS_RULE}; recorded as handler_error"
                        );
                        FailureClass::handler_error()
                    }),
                )))
            }
            _ => None,
        };
        match in_protocol {
            Some(outcome) => {
                running.answered = true;
                *self.restarts.lock().await = 0;
                outcome
            }
            None if !running.answered => {
                let received = answer.trim().to_owned();
                if let Some(dead) = slot.take() {
                    self.end(dead).await;
                }
                Err(HandlerFailure::stop(format!(
                    "the child command {:?} broke the protocol before its first answer: it \
                     printed {received:?} where one line {{\"ack\": {sequence}}} or \
                     {{\"fail\": {sequence}, \"class\": \"code\"}} was expected (stdout \
                     carries answers only; print banners and logs to stderr); no attempt was \
                     charged",
                    self.command
                )))
            }
            None => {
                tracing::error!(
                    sequence,
                    received = %answer.trim(),
                    "child answered out of protocol: expected one line {{\"ack\": {sequence}}} or \
                     {{\"fail\": {sequence}, \"class\": \"code\"}} with class {CLASS_RULE} \
                     (stdout carries answers only; log to stderr); restarting it"
                );
                if let Some(dead) = slot.take() {
                    self.end(dead).await;
                }
                Err(class("child_protocol_error"))
            }
        }
    }
}

/// Whether a process of `group` still runs. `killpg(group, 0)` also finds members that have
/// ended but are not reaped yet: the child's own children, orphaned when it ends, wait as
/// zombies for init (or a subreaper) to reap them, which can take seconds; waiting for that
/// held every stop (`--exit-when-caught-up` included) for nothing. So the members' states are
/// read from `/proc` where there is one; elsewhere a member found is taken as running.
fn group_runs(group: Pid) -> bool {
    if killpg(group, None).is_err() {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|entry| {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|name| !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()));
        is_pid
            && std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|stat| state_and_group(&stat))
                .is_some_and(|(state, pgrp)| pgrp == group.as_raw() && !matches!(state, 'Z' | 'X'))
    })
}

/// The state and process group of a `/proc/PID/stat` line (`pid (comm) state ppid pgrp ...`;
/// the command name may hold spaces and parentheses, so the fields are read after its last
/// `)`).
fn state_and_group(stat: &str) -> Option<(char, i32)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

fn class(code: &str) -> HandlerFailure {
    match FailureClass::new(code) {
        Ok(class) => HandlerFailure::new(class),
        Err(_) => HandlerFailure::new(FailureClass::handler_error()),
    }
}

impl Handler for ChildSink {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        self.inner.exchange(event_line(event), event.sequence).await
    }
}

impl Reconciler for ChildSink {
    async fn reconcile(&self, live: &LiveSet) -> Result<(), HandlerFailure> {
        self.inner
            .exchange(
                reconcile_line(live, &self.inner.consumer),
                live.head_sequence,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_state_and_group() {
        assert_eq!(
            state_and_group("4242 (sh) S 4200 4242 4242 0 -1 4194560 ..."),
            Some(('S', 4242))
        );
        assert_eq!(
            state_and_group("17 (a (weird) name) Z 1 9 9 0"),
            Some(('Z', 9))
        );
        assert_eq!(state_and_group("garbage"), None);
    }

    #[test]
    fn this_process_group_runs_and_a_gone_one_does_not() {
        let own = nix::unistd::getpgrp();
        assert!(group_runs(own));
        // Process group IDs are process IDs; no process has an ID this large.
        assert!(!group_runs(Pid::from_raw(i32::MAX - 1)));
    }
}
