//! The stdout sink of `outbox consume`: one JSON line per event (see [`outbox_service::lines`]).

use outbox_consumer::{Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler};
use outbox_service::lines::{event_line, reconcile_line};

use crate::failure::Failure;
use crate::lines_out::LinesOut;

/// Stdout that cannot be written (closed by the reader, EPIPE) is the sink's failure, never
/// the event's: the consumer stops and the next run delivers the event.
fn stdout_failed(e: std::sync::Arc<str>) -> HandlerFailure {
    HandlerFailure::stop(format!("cannot write to stdout ({e})"))
}

/// Refuses a stdout that was closed when the process started (`outbox consume >&-`): the
/// Rust runtime then opens `/dev/null` in its place, where every line would be written
/// without error, and every event acknowledged without having gone anywhere. The runtime opens
/// it read-write, which is what tells it from a `>/dev/null` the user chose (write-only, as
/// shells redirect): that one discards events on purpose and is accepted.
pub fn refuse_closed_stdout() -> Result<(), Failure> {
    match stdout_was_closed() {
        Ok(false) => Ok(()),
        Ok(true) => Err(Failure::runtime(
            "stdout was closed when outbox consume started, so the events would be \
             acknowledged without being written anywhere; give it a stdout to write to (a \
             pipe, a file), or redirect it to /dev/null (>/dev/null) to discard events on \
             purpose",
        )),
        Err(e) => Err(Failure::runtime(format!("cannot inspect stdout: {e}"))),
    }
}

/// Whether fd 1 is `/dev/null` opened read-write: what the Rust runtime puts in place of a
/// standard descriptor that was closed at start.
fn stdout_was_closed() -> std::io::Result<bool> {
    use std::os::fd::AsFd as _;
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let stdout = std::io::stdout();
    let fd = stdout.as_fd();
    let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL)?;
    let access = nix::fcntl::OFlag::from_bits_truncate(flags) & nix::fcntl::OFlag::O_ACCMODE;
    if access != nix::fcntl::OFlag::O_RDWR {
        return Ok(false);
    }
    let opened = std::fs::File::from(fd.try_clone_to_owned()?).metadata()?;
    let null = std::fs::metadata("/dev/null")?;
    Ok(opened.file_type().is_char_device() && opened.rdev() == null.rdev())
}

/// Writes one JSON line per event to stdout; flushes before each acknowledgement, so an
/// acknowledged event has always been written out.
pub struct StdoutSink {
    /// Stdout, shared by every consumer of a set: lines never interleave, and one write
    /// serves the flushes of every consumer that waits for it.
    out: LinesOut,
    /// For the reconciliation line.
    consumer: String,
}

impl StdoutSink {
    pub fn new(consumer: String) -> Self {
        Self {
            out: LinesOut::stdout(),
            consumer,
        }
    }

    /// The sink of another consumer of the same process, writing to the same buffer.
    pub fn for_consumer(&self, consumer: String) -> Self {
        Self {
            out: self.out.clone(),
            consumer,
        }
    }

    async fn write(&self, line: String) -> Result<(), HandlerFailure> {
        self.out.line(&line).await.map_err(stdout_failed)
    }

    /// Writes out what is still buffered and stops the writer thread; call once the
    /// consumers have stopped.
    pub async fn close(&self) {
        self.out.close().await;
    }
}

impl Handler for StdoutSink {
    async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
        self.write(event_line(event)).await
    }

    async fn before_ack(&self) -> Result<(), HandlerFailure> {
        self.out.flush().await.map_err(stdout_failed)
    }
}

impl Reconciler for StdoutSink {
    async fn reconcile(&self, live: &LiveSet) -> Result<(), HandlerFailure> {
        self.write(reconcile_line(live, &self.consumer)).await?;
        self.before_ack().await
    }
}
