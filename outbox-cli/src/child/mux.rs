//! A child answering in any order (`--lanes` above 1): several events are out with it at once,
//! each of a different task, and each answer names its sequence (`{"ack": SEQ}`,
//! `{"fail": SEQ, "class": "code"}`). One reader task routes the answers to the events waiting
//! for them. The rules of the one-at-a-time child hold: a timeout, an exit or an answer out of
//! protocol ends the child's whole process group (every event out with it is then delivered
//! again, after a restart with backoff), and a child that cannot be run or breaks the protocol
//! before its first answer is a broken sink.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::Duration;

use outbox_consumer::{FailureClass, HandlerFailure};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::ChildStdout;
use tokio::sync::oneshot;
use tokio_util::task::AbortOnDropHandle;

use super::{Answer, CANNOT_RUN, CLASS_RULE, Inner, Running, class};

/// Generations of multiplexed children, so that an event never ends a child started after the
/// one it was sent to.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// What the reader hands an event waiting for its answer.
enum Reply {
    Ack,
    Fail(String),
    /// A line that is no answer about an event out with the child; `first`: before any
    /// answer in protocol.
    OutOfProtocol {
        received: String,
        first: bool,
    },
}

/// The events out with the child, each waiting for its answer.
#[derive(Default)]
struct Table {
    /// Set by the reader when the child's stdout ended or broke the protocol: nothing more
    /// is sent to it.
    dead: bool,
    /// The line that broke the protocol, and whether it came before any answer in protocol.
    broken: Option<(String, bool)>,
    waiting: HashMap<i64, oneshot::Sender<Reply>>,
}

/// A running child answering in any order.
pub(super) struct Multiplexed {
    /// The child, without its stdout (the reader's).
    pub(super) running: Running,
    table: Arc<SyncMutex<Table>>,
    /// Whether it gave at least one answer in protocol.
    answered: Arc<AtomicBool>,
    generation: u64,
    /// Routes its answers; ends with its stdout.
    _reader: AbortOnDropHandle<()>,
}

/// Why an event got no answer.
enum Lost {
    TimedOut,
    Exited,
    OutOfProtocol { received: String, first: bool },
}

impl Inner {
    /// Sends `line` to the child answering in any order and waits for the answer about
    /// `sequence`.
    pub(super) async fn exchange_any_order(
        &self,
        line: String,
        sequence: i64,
    ) -> Result<(), HandlerFailure> {
        let deadline = tokio::time::Instant::now() + self.answer_timeout;
        let (sender, answer) = oneshot::channel();
        let generation = {
            let mut slot = self.multiplexed.lock().await;
            if slot.is_none() {
                if self.shutdown.is_cancelled() {
                    return Err(HandlerFailure::abandon());
                }
                *slot = Some(self.start_multiplexed().await?);
            }
            let Some(child) = slot.as_mut() else {
                return Err(HandlerFailure::abandon());
            };
            let generation = child.generation;
            let refused = {
                let mut table = child.table.lock().unwrap_or_else(|e| e.into_inner());
                match table.dead {
                    true => Some(match table.broken.clone() {
                        Some((received, first)) => Lost::OutOfProtocol { received, first },
                        None => Lost::Exited,
                    }),
                    false => {
                        table.waiting.insert(sequence, sender);
                        None
                    }
                }
            };
            if let Some(why) = refused {
                drop(slot);
                return self.lost(generation, sequence, why).await;
            }
            let written = tokio::time::timeout_at(deadline, async {
                child.running.stdin.write_all(line.as_bytes()).await?;
                child.running.stdin.write_all(b"\n").await?;
                child.running.stdin.flush().await
            })
            .await;
            match written {
                Ok(Ok(())) => generation,
                failed => {
                    drop(slot);
                    let why = match failed {
                        Err(_) => Lost::TimedOut,
                        _ => Lost::Exited,
                    };
                    return self.lost(generation, sequence, why).await;
                }
            }
        };
        let why = match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(Reply::Ack)) => {
                *self.restarts.lock().await = 0;
                return Ok(());
            }
            Ok(Ok(Reply::Fail(code))) => {
                *self.restarts.lock().await = 0;
                return Err(HandlerFailure::new(FailureClass::new(code.clone()).unwrap_or_else(
                    |_| {
                        tracing::warn!(
                            sequence,
                            class = %code,
                            "child's failure class breaks the rule {CLASS_RULE}; recorded as handler_error"
                        );
                        FailureClass::handler_error()
                    },
                )));
            }
            Ok(Ok(Reply::OutOfProtocol { received, first })) => {
                Lost::OutOfProtocol { received, first }
            }
            Ok(Err(_)) => Lost::Exited,
            Err(_) => Lost::TimedOut,
        };
        self.lost(generation, sequence, why).await
    }

    /// Starts the child and the reader of its answers.
    async fn start_multiplexed(&self) -> Result<Multiplexed, HandlerFailure> {
        let mut running = self.spawn().await?;
        let Some(stdout) = running.stdout.take() else {
            return Err(HandlerFailure::stop("the child started without its stdout"));
        };
        let table = Arc::new(SyncMutex::new(Table::default()));
        let answered = Arc::new(AtomicBool::new(false));
        let reader = tokio::spawn(read_answers(stdout, table.clone(), answered.clone()));
        Ok(Multiplexed {
            running,
            table,
            answered,
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            _reader: AbortOnDropHandle::new(reader),
        })
    }

    /// The event `sequence` got no answer from child `generation`: the child is ended (by the
    /// first of its events to find out; every other one out with it then fails too, and is
    /// delivered again) and the failure named as the one-at-a-time child names it.
    async fn lost(&self, generation: u64, sequence: i64, why: Lost) -> Result<(), HandlerFailure> {
        let dead = {
            let mut slot = self.multiplexed.lock().await;
            match slot.as_ref() {
                Some(child) if child.generation == generation => slot.take(),
                _ => None,
            }
        };
        let timed_out = matches!(why, Lost::TimedOut);
        if let Some(mut dead) = dead {
            let status = match timed_out {
                true => None,
                false => {
                    tokio::time::timeout(Duration::from_millis(500), dead.running.child.wait())
                        .await
                        .ok()
                        .and_then(Result::ok)
                }
            };
            let never_answered = !dead.answered.load(Ordering::SeqCst);
            {
                let mut table = dead.table.lock().unwrap_or_else(|e| e.into_inner());
                table.dead = true;
                table.waiting.clear();
            }
            self.end(dead.running).await;
            if let Some(code) = status.and_then(|s| s.code()) {
                if never_answered && CANNOT_RUN.contains(&code) {
                    return Err(HandlerFailure::stop(format!(
                        "the child command {:?} cannot be run (sh exited with {code})",
                        self.command
                    )));
                }
            }
            if let Lost::OutOfProtocol {
                received,
                first: true,
            } = &why
            {
                return Err(HandlerFailure::stop(format!(
                    "the child command {:?} broke the protocol before its first answer: it \
                     printed {received:?} where one line {{\"ack\": SEQ}} or {{\"fail\": SEQ, \
                     \"class\": \"code\"}} about an event sent to it was expected (stdout \
                     carries answers only; print banners and logs to stderr); no attempt was \
                     charged",
                    self.command
                )));
            }
            if !self.shutdown.is_cancelled() {
                *self.restarts.lock().await += 1;
            }
            match &why {
                Lost::TimedOut => tracing::warn!(
                    sequence,
                    timeout = %humantime::format_duration(self.answer_timeout),
                    "child did not answer in time; ended its process group"
                ),
                Lost::Exited => tracing::warn!(sequence, "child exited before answering"),
                Lost::OutOfProtocol { received, .. } => tracing::error!(
                    sequence,
                    received = %received,
                    "child answered out of protocol: expected one line {{\"ack\": SEQ}} or \
                     {{\"fail\": SEQ, \"class\": \"code\"}} about an event sent to it, with class \
                     {CLASS_RULE}; restarting it"
                ),
            }
        }
        if self.shutdown.is_cancelled() {
            return Err(HandlerFailure::abandon());
        }
        Err(class(match why {
            Lost::TimedOut => "child_timeout",
            Lost::Exited => "child_exited",
            Lost::OutOfProtocol { .. } => "child_protocol_error",
        }))
    }
}

/// Routes the child's answers to the events waiting for them, until its stdout ends or it
/// breaks the protocol (every event still waiting then learns it).
async fn read_answers(
    stdout: BufReader<ChildStdout>,
    table: Arc<SyncMutex<Table>>,
    answered: Arc<AtomicBool>,
) {
    let mut lines = stdout.lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut table = table.lock().unwrap_or_else(|e| e.into_inner());
        let routed = match serde_json::from_str::<Answer>(line.trim()) {
            Ok(Answer::Ack { ack }) => table.waiting.remove(&ack).map(|s| (s, Reply::Ack)),
            Ok(Answer::Fail { fail, class }) => {
                table.waiting.remove(&fail).map(|s| (s, Reply::Fail(class)))
            }
            Err(_) => None,
        };
        match routed {
            Some((sender, reply)) => {
                answered.store(true, Ordering::SeqCst);
                let _ = sender.send(reply);
            }
            None => {
                let first = !answered.load(Ordering::SeqCst);
                table.dead = true;
                table.broken = Some((line.trim().to_owned(), first));
                for (_, sender) in table.waiting.drain() {
                    let _ = sender.send(Reply::OutOfProtocol {
                        received: line.trim().to_owned(),
                        first,
                    });
                }
                return;
            }
        }
    }
    let mut table = table.lock().unwrap_or_else(|e| e.into_inner());
    table.dead = true;
    table.waiting.clear();
}
