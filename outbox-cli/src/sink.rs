//! The stdout sink of `outbox consume`: one JSON line per event (see [`outbox_service::lines`]).

use outbox_consumer::{Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler};
use outbox_service::lines::{event_line, reconcile_line};

use crate::lines_out::LinesOut;

/// Stdout that cannot be written (closed by the reader, EPIPE) is the sink's failure, never
/// the event's: the consumer stops and the next run delivers the event.
fn stdout_failed(e: std::sync::Arc<str>) -> HandlerFailure {
    HandlerFailure::stop(format!("cannot write to stdout ({e})"))
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
