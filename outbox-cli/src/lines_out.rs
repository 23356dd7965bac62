//! Stdout shared by every consumer of a process, written by one thread and flushed as a
//! group.
//!
//! A consumer set of a thousand consumers flushes before every acknowledgement, tens of
//! thousands of times a second under load. Flushing each in turn under one lock made every
//! flush a hand-off to a blocking thread and one `write` of a single line, and the consumers
//! queued behind each other for it. Here a consumer appends its lines to a shared buffer
//! (never waiting for I/O) and, to flush, waits until the writer thread has written past the
//! end of what it appended: whatever gathered while the previous `write` ran goes out in the
//! next one, the way a group commit works. Lines are whole and never interleave, since each
//! is appended in one piece.

use std::sync::{Arc, Condvar, Mutex};

use tokio::sync::watch;

/// Appending waits once this many bytes are waiting to be written, so a reader slower than
/// the consumers bounds the buffer (and the process's memory) instead of letting it grow.
const MAX_BACKLOG: u64 = 4 << 20;

/// How far the writer got: bytes written since the start, or why it stopped.
#[derive(Clone, Debug)]
enum Written {
    Through(u64),
    Failed(Arc<str>),
}

/// What the consumers append and the writer takes.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    /// Bytes appended since the start.
    appended: u64,
    /// Set by [`LinesOut::close`]: the writer ends once the buffer is empty.
    closed: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    /// Signalled when something is appended or the output is closed.
    appended: Condvar,
    written: watch::Sender<Written>,
}

/// A handle on the process's shared stdout; clones write to the same buffer.
#[derive(Clone)]
pub struct LinesOut {
    shared: Arc<Shared>,
    writer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl LinesOut {
    /// Starts the writer thread on stdout.
    pub fn stdout() -> Self {
        Self::new(std::io::stdout())
    }

    /// Starts the writer thread on `out`.
    fn new(mut out: impl std::io::Write + Send + 'static) -> Self {
        let (written, _) = watch::channel(Written::Through(0));
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            appended: Condvar::new(),
            written,
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("stdout-writer".into())
                .spawn(move || write_out(&shared, &mut out))
                .expect("cannot start the stdout writer thread")
        };
        Self {
            shared,
            writer: Arc::new(Mutex::new(Some(thread))),
        }
    }

    /// Appends `line` and a newline; waits only while the backlog is over its bound. An error
    /// when stdout can no longer be written.
    pub async fn line(&self, line: &str) -> Result<(), Arc<str>> {
        let end = {
            let mut pending = self.shared.pending.lock().expect("stdout lock");
            if let Written::Failed(e) = &*self.shared.written.borrow() {
                return Err(e.clone());
            }
            if pending.closed {
                return Err("stdout is closed".into());
            }
            pending.bytes.extend_from_slice(line.as_bytes());
            pending.bytes.push(b'\n');
            pending.appended += line.len() as u64 + 1;
            pending.appended
        };
        self.shared.appended.notify_one();
        self.written_through(end.saturating_sub(MAX_BACKLOG)).await
    }

    /// Waits until everything appended so far, by anyone, has been written to stdout.
    pub async fn flush(&self) -> Result<(), Arc<str>> {
        let end = self.shared.pending.lock().expect("stdout lock").appended;
        self.written_through(end).await
    }

    async fn written_through(&self, target: u64) -> Result<(), Arc<str>> {
        let mut written = self.shared.written.subscribe();
        let reached = written
            .wait_for(|w| match w {
                Written::Through(n) => *n >= target,
                Written::Failed(_) => true,
            })
            .await
            .expect("the sender lives in the shared state");
        match &*reached {
            Written::Through(_) => Ok(()),
            Written::Failed(e) => Err(e.clone()),
        }
    }

    /// Writes out what is left and stops the writer thread.
    pub async fn close(&self) {
        self.shared.pending.lock().expect("stdout lock").closed = true;
        self.shared.appended.notify_one();
        let thread = self.writer.lock().expect("writer lock").take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// The writer thread: takes whatever gathered and writes it in one go, until closed and empty
/// or until a write fails.
fn write_out(shared: &Shared, out: &mut impl std::io::Write) {
    let mut spare = Vec::new();
    loop {
        let (mut chunk, through) = {
            let mut pending = shared.pending.lock().expect("stdout lock");
            while pending.bytes.is_empty() && !pending.closed {
                pending = shared.appended.wait(pending).expect("stdout lock");
            }
            if pending.bytes.is_empty() {
                return;
            }
            (
                std::mem::replace(&mut pending.bytes, std::mem::take(&mut spare)),
                pending.appended,
            )
        };
        if let Err(e) = out.write_all(&chunk).and_then(|()| out.flush()) {
            shared
                .written
                .send_replace(Written::Failed(e.to_string().into()));
            return;
        }
        shared.written.send_replace(Written::Through(through));
        chunk.clear();
        spare = chunk;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A writer whose reader has gone.
    struct Closed;

    impl std::io::Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lines_of_many_writers_come_out_whole_and_a_flush_waits_for_its_own() {
        let captured = Captured::default();
        let out = LinesOut::new(captured.clone());
        let mut writers = Vec::new();
        for w in 0..8 {
            let out = out.clone();
            writers.push(tokio::spawn(async move {
                for i in 0..200 {
                    out.line(&format!("writer {w} line {i}")).await.unwrap();
                    if i % 10 == 0 {
                        out.flush().await.unwrap();
                    }
                }
                out.flush().await.unwrap();
            }));
        }
        for writer in writers {
            writer.await.unwrap();
        }
        // Every writer flushed after its last line: all of them are out, none cut.
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8 * 200);
        for w in 0..8 {
            let own: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| l.starts_with(&format!("writer {w} ")))
                .collect();
            let expected: Vec<String> = (0..200).map(|i| format!("writer {w} line {i}")).collect();
            assert_eq!(own, expected, "writer {w}'s lines, whole and in order");
        }
        out.close().await;
    }

    #[tokio::test]
    async fn a_failed_write_fails_the_flush_and_every_later_line() {
        let out = LinesOut::new(Closed);
        // The writer thread may fail the write before `line` returns, in which case `line`
        // already reports it; either way the flush must.
        let _ = out.line("lost").await;
        let flushed = out.flush().await;
        assert!(
            flushed.unwrap_err().contains("pipe"),
            "the error names the cause"
        );
        assert!(out.line("next").await.is_err());
        assert!(out.flush().await.is_err());
    }
}
