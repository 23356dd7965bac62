//! The metrics `outbox-serve` records, each with its help text, and [`describe`], which gives
//! them to the installed recorder (the consumers' own are `outbox_consumer::metric`'s).

pub use outbox_consumer::metric::{Kind, Metric};

/// `outbox_sse_clients`.
pub const SSE_CLIENTS: Metric = Metric {
    name: "outbox_sse_clients",
    kind: Kind::Gauge,
    help: "Server-sent-event clients connected to the project's stream.",
};

/// `outbox_sse_dropped_total`.
pub const SSE_DROPPED: Metric = Metric {
    name: "outbox_sse_dropped_total",
    kind: Kind::Counter,
    help: "SSE clients disconnected because their queue overflowed (they resume on reconnect).",
};

/// Every metric this crate records.
pub const ALL: &[Metric] = &[SSE_CLIENTS, SSE_DROPPED];

/// Describes every metric of [`ALL`] to the installed recorder.
pub fn describe() {
    for metric in ALL {
        metric.describe();
    }
}
