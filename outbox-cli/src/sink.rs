//! The built-in sinks of `outbox consume`: JSON lines on stdout, or a long-lived child
//! process that answers each line with an acknowledgement.

use std::process::Stdio;
use std::time::Duration;

use outbox_consumer::{FailureClass, Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler};
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;

/// The line describing an event.
pub fn event_line(event: &ObservedEvent) -> String {
    let mut value = serde_json::to_value(event).expect("events serialize");
    value["type"] = json!("event");
    value.to_string()
}

/// The line describing a reconciliation.
pub fn reconcile_line(live: &LiveSet, consumer: &str) -> String {
    json!({
        "type": "reconcile",
        "project_id": live.project_id,
        "consumer_id": consumer,
        "reason": live.reason,
        "head_sequence": live.head_sequence,
        "live_task_ids": live.task_ids,
    })
    .to_string()
}

fn class(code: &str) -> HandlerFailure {
    HandlerFailure::new(FailureClass::new(code).expect("built-in classes are valid"))
}

/// Writes one JSON line per event to stdout; flushes before each acknowledgement, so an
/// acknowledged event has always been written out.
pub struct StdoutSink {
    /// Buffered stdout.
    out: Mutex<BufWriter<tokio::io::Stdout>>,
    /// For the reconciliation line.
    consumer: String,
}

impl StdoutSink {
    pub fn new(consumer: String) -> Self {
        Self {
            out: Mutex::new(BufWriter::new(tokio::io::stdout())),
            consumer,
        }
    }

    async fn write(&self, line: String) -> Result<(), HandlerFailure> {
        let mut out = self.out.lock().await;
        out.write_all(line.as_bytes())
            .await
            .map_err(|_| class("stdout_write_failed"))?;
        out.write_all(b"\n")
            .await
            .map_err(|_| class("stdout_write_failed"))
    }
}

impl Handler for StdoutSink {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        self.write(event_line(event)).await
    }

    async fn before_ack(&self) -> Result<(), HandlerFailure> {
        self.out
            .lock()
            .await
            .flush()
            .await
            .map_err(|_| class("stdout_write_failed"))
    }
}

impl Reconciler for StdoutSink {
    async fn reconcile(&self, live: &LiveSet) -> Result<(), HandlerFailure> {
        self.write(reconcile_line(live, &self.consumer)).await?;
        self.before_ack().await
    }
}

/// The child's answer to one line.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Answer {
    Ack { ack: i64 },
    Fail { fail: i64, class: String },
}

/// A running child and its pipes.
struct Running {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

/// Drives a long-lived child process: one line in, one acknowledgement line out. A child that
/// exits is restarted (with backoff) and the unacknowledged event delivered again.
pub struct ChildSink {
    /// The command line, run with `sh -c`.
    command: String,
    /// The child, when running.
    running: Mutex<Option<Running>>,
    /// Consecutive restarts without a successful answer, for the backoff.
    restarts: Mutex<u32>,
    /// How long to wait for one answer.
    answer_timeout: Duration,
    /// For the reconciliation line.
    consumer: String,
}

impl ChildSink {
    pub fn new(command: String, consumer: String, answer_timeout: Duration) -> Self {
        Self {
            command,
            running: Mutex::new(None),
            restarts: Mutex::new(0),
            answer_timeout,
            consumer,
        }
    }

    async fn spawn(&self) -> Result<Running, HandlerFailure> {
        let restarts = *self.restarts.lock().await;
        if restarts > 0 {
            let delay =
                Duration::from_millis(100u64 << restarts.min(6)).min(Duration::from_secs(5));
            tracing::warn!(restarts, ?delay, "restarting child process");
            tokio::time::sleep(delay).await;
        }
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&self.command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                tracing::error!(error = %e, "cannot start child process");
                class("child_spawn_failed")
            })?;
        let stdin = BufWriter::new(child.stdin.take().expect("piped stdin"));
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        tracing::info!(pid = child.id(), "child process started");
        Ok(Running {
            child,
            stdin,
            stdout,
        })
    }

    /// Sends `line` and waits for the answer about `sequence`.
    async fn exchange(&self, line: String, sequence: i64) -> Result<(), HandlerFailure> {
        let mut slot = self.running.lock().await;
        if slot.is_none() {
            *slot = Some(self.spawn().await?);
        }
        let running = slot.as_mut().expect("child is running");
        let outcome = async {
            running.stdin.write_all(line.as_bytes()).await?;
            running.stdin.write_all(b"\n").await?;
            running.stdin.flush().await?;
            let mut answer = String::new();
            let read =
                tokio::time::timeout(self.answer_timeout, running.stdout.read_line(&mut answer))
                    .await
                    .map_err(|_| {
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer")
                    })??;
            Ok::<_, std::io::Error>((read, answer))
        }
        .await;
        let answer = match outcome {
            Ok((0, _)) | Err(_) => {
                // The child died or hung: restart it for the next delivery.
                if let Some(mut dead) = slot.take() {
                    let _ = dead.child.kill().await;
                }
                *self.restarts.lock().await += 1;
                return Err(class(match outcome {
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => "child_timeout",
                    _ => "child_exited",
                }));
            }
            Ok((_, answer)) => answer,
        };
        *self.restarts.lock().await = 0;
        match serde_json::from_str::<Answer>(answer.trim()) {
            Ok(Answer::Ack { ack }) if ack == sequence => Ok(()),
            Ok(Answer::Fail { fail, class: code }) if fail == sequence => Err(HandlerFailure::new(
                FailureClass::new(code).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "child reported an invalid failure class");
                    FailureClass::handler_error()
                }),
            )),
            _ => {
                tracing::error!(sequence, answer = %answer.trim(), "child answered out of protocol; restarting it");
                if let Some(mut dead) = slot.take() {
                    let _ = dead.child.kill().await;
                }
                Err(class("child_protocol_error"))
            }
        }
    }
}

impl Handler for ChildSink {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        self.exchange(event_line(event), event.sequence).await
    }
}

impl Reconciler for ChildSink {
    async fn reconcile(&self, live: &LiveSet) -> Result<(), HandlerFailure> {
        self.exchange(reconcile_line(live, &self.consumer), live.head_sequence)
            .await
    }
}
