//! What every long-running lifecycle-outbox service shares, whether it prints events
//! (`outbox consume`), fans them out over HTTP (`outbox-serve`) or relays them to NATS
//! (`outbox-relay`), so that none of them imports another:
//!
//! - [`Connections`]: the consumers' pool, LISTEN connection and TLS, and the one place that
//!   builds a lone consumer or a consumer set on them;
//! - [`lines`]: the JSON lines that describe events and reconciliations;
//! - with the `http` feature (on by default): `metrics`, the Prometheus recorder, `/metrics`
//!   and the `--metrics-addr` endpoint, and `http`, binding and the accept loop with
//!   per-connection close and drain. The relay serves no HTTP of its own and builds this crate
//!   without them, so it does not pull in axum; the workspace's dependency entry has the
//!   default off, and outbox-serve and outbox-cli turn it on.
//!
//! A service of one's own, printing what `outbox consume` prints, with `/metrics` and
//! `/readyz` beside it (the `http` feature):
//!
//! ```no_run
//! use outbox_consumer::{
//!     ConsumerConfig, Handler, HandlerFailure, LiveSet, ObservedEvent, Reconciler,
//! };
//! use outbox_core::connect::ConnectSettings;
//! use outbox_core::{ConsumerId, ProjectId};
//! use outbox_service::{Connections, MetricsEndpoint, lines};
//! use tokio_util::sync::CancellationToken;
//!
//! struct Stdout;
//! impl Handler for Stdout {
//!     async fn handle(&self, event: &ObservedEvent) -> Result<(), HandlerFailure> {
//!         println!("{}", lines::event_line(event));
//!         Ok(())
//!     }
//! }
//! impl Reconciler for Stdout {
//!     async fn reconcile(&self, live: &LiveSet) -> Result<(), HandlerFailure> {
//!         println!("{}", lines::reconcile_line(live, "printer"));
//!         Ok(())
//!     }
//! }
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = ConnectSettings::parse("postgresql://app@localhost/app")?;
//! let connections = Connections::new(&settings, 4, true)?;
//! let shutdown = CancellationToken::new();
//! let config = ConsumerConfig::new(ProjectId::new("p1")?, ConsumerId::new("printer")?);
//! // `/readyz` answers from the availability the consumer's duties carry.
//! let availability = &config.duties.availability;
//! let metrics = MetricsEndpoint::start(Some("127.0.0.1:9464".parse()?), availability, &shutdown)
//!     .await?;
//! connections.consumer(config, Stdout).run(shutdown).await?;
//! metrics.stop().await;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod connections;
#[cfg(feature = "http")]
pub mod http;
pub mod lines;
#[cfg(feature = "http")]
pub mod metrics;

pub use connections::Connections;
#[cfg(feature = "http")]
pub use metrics::{MetricsEndpoint, MetricsError};
