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
//! use outbox_relay::{Credentials, PublisherSettings, Relay, Security, StreamSpec, Tls};
//! use outbox_relay::parse_nats_urls;
//! use outbox_service::Connections;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = ConnectSettings::parse("postgresql://app@localhost/app")?;
//! let connections = Connections::new(&settings, 4, true)?;
//! let config = ConsumerConfig::new(ProjectId::new("p1")?, ConsumerId::new("relay")?);
//! let publisher = PublisherSettings {
//!     servers: parse_nats_urls("tls://nats-1:4222,tls://nats-2:4222")?.servers,
//!     security: Security {
//!         credentials: Credentials::Token(std::env::var("NATS_TOKEN")?),
//!         tls: Tls { required: true, ..Tls::default() },
//!     },
//!     stream: "LIFECYCLE".into(),
//!     expect_sequence: true,
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
//! Modules, base first: `settings` (URLs, names, subjects) and `security` (credentials and
//! TLS) import nothing of the crate; `tail` (each subject's last stored message),
//! `provenance` (whether that message is the relay's own), `diagnose`
//! (failures named by cause, the start-up publish probe) and `stream` (creating or verifying
//! the stream) use them; `publisher` (the handler) uses those; `relay` runs it all.

#![forbid(unsafe_code)]

mod diagnose;
mod provenance;
mod publisher;
mod relay;
mod security;
mod settings;
mod stream;
mod tail;

pub use publisher::{Publisher, PublisherSettings};
pub use relay::{Relay, RelayError};
pub use security::{Credentials, Security, Tls};
pub use settings::{
    NatsServer, NatsUrls, UserInfo, parse_nats_urls, validate_stream_name, validate_subject_prefix,
};
pub use stream::{Ensured, StreamError, StreamSpec, ensure};
