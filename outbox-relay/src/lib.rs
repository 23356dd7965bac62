//! The lifecycle-outbox JetStream relay: a durable consumer whose handler publishes every event
//! of its project to a NATS JetStream stream, so that many downstream services fan out from
//! JetStream instead of each polling the application's database.

#![forbid(unsafe_code)]

mod publisher;
mod settings;
mod stream;

pub use publisher::{Publisher, PublisherSettings};
pub use settings::{NatsServer, parse_nats_urls, validate_stream_name, validate_subject_prefix};
pub use stream::{Ensured, StreamError, StreamSpec, ensure};
