//! The metrics `outbox-relay` records, each with its help text, and [`describe`], which gives
//! them to the installed recorder (the consumer's own are `outbox_consumer::metric`'s).

pub use outbox_consumer::metric::{Kind, Metric};

/// `outbox_relay_out_of_order_total`.
pub const OUT_OF_ORDER: Metric = Metric {
    name: "outbox_relay_out_of_order_total",
    kind: Kind::Counter,
    help: "Messages JetStream stored after a later one of the same project (logged at error level).",
};

/// `outbox_relay_fence_refusals_total`.
pub const FENCE_REFUSALS: Metric = Metric {
    name: "outbox_relay_fence_refusals_total",
    kind: Kind::Counter,
    help: "Publishes JetStream refused because the stream did not end where the relay expected \
           (another writer published); the relay then read the stream's end again.",
};

/// Every metric this crate records.
pub const ALL: &[Metric] = &[OUT_OF_ORDER, FENCE_REFUSALS];

/// Describes every metric of [`ALL`] to the installed recorder.
pub fn describe() {
    for metric in ALL {
        metric.describe();
    }
}
