//! The lifecycle-outbox JetStream relay: a durable consumer whose handler publishes every event
//! of its project to a NATS JetStream stream, so that many downstream services fan out from
//! JetStream instead of each polling the application's database. `outbox relay nats` is this
//! crate behind command-line options; an application can run it inside its own tokio
//! service:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use async_nats::jetstream::stream::RetentionPolicy;
//! use outbox_consumer::ConsumerConfig;
//! use outbox_core::{ConnectSettings, ConsumerId, ProjectId};
//! use outbox_relay::{PublisherSettings, Relay, StreamSpec, parse_nats_urls};
//! use outbox_service::Connections;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = ConnectSettings::parse("postgresql://app@localhost/app")?;
//! let connections = Connections::new(&settings, 4, true)?;
//! let config = ConsumerConfig::new(ProjectId::new("p1")?, ConsumerId::new("relay")?);
//! let publisher = PublisherSettings {
//!     servers: parse_nats_urls("nats://localhost:4222")?,
//!     prefix: "lifecycle".into(),
//!     project: "p1".into(),
//!     consumer: "relay".into(),
//!     window: 256,
//!     publish_timeout: Duration::from_secs(5),
//!     connect_timeout: Duration::from_secs(5),
//!     ping_interval: Duration::from_secs(10),
//! };
//! let stream = StreamSpec {
//!     name: "LIFECYCLE".into(),
//!     prefix: "lifecycle".into(),
//!     duplicate_window: Duration::from_secs(600),
//!     retention: RetentionPolicy::Limits,
//!     max_age: Duration::from_secs(7 * 24 * 3600),
//!     replicas: 1,
//! };
//!
//! let shutdown = CancellationToken::new();
//! Relay::connect(publisher, &stream)
//!     .await?
//!     .run(&connections, config, shutdown)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! Modules, base first: `settings` (URLs, names, subjects) imports nothing of the crate;
//! `stream` (creating or verifying the stream) and `publisher` (the pipelined handler) use
//! it; `relay` runs them.

#![forbid(unsafe_code)]

mod publisher;
mod relay;
mod settings;
mod stream;

pub use publisher::{Publisher, PublisherSettings};
pub use relay::{Relay, RelayError};
pub use settings::{NatsServer, parse_nats_urls, validate_stream_name, validate_subject_prefix};
pub use stream::{Ensured, StreamError, StreamSpec, ensure};
