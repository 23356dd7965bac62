//! What every long-running lifecycle-outbox service shares, whether it prints events
//! (`outbox consume`), fans them out over HTTP (`outbox-serve`) or relays them to NATS
//! (`outbox-relay`), so that none of them imports another:
//!
//! - [`Connections`]: the consumers' pool, LISTEN connection and TLS, and the one place that
//!   builds a lone consumer or a consumer set on them;
//! - [`metrics`]: the Prometheus recorder, `/metrics`, and the `--metrics-addr` endpoint;
//! - [`http`]: binding and the accept loop with per-connection close and drain;
//! - [`lines`]: the JSON lines that describe events and reconciliations.

#![forbid(unsafe_code)]

mod connections;
pub mod http;
pub mod lines;
pub mod metrics;

pub use connections::Connections;
pub use metrics::{MetricsEndpoint, MetricsError};
