//! The lifecycle-outbox JetStream relay: a durable consumer whose handler publishes every event
//! of its project to a NATS JetStream stream, so that many downstream services fan out from
//! JetStream instead of each polling the application's database. `outbox relay nats` is this
//! crate behind command-line options; an application can run it inside its own tokio
//! service, as this function does (`outbox-cli/tests/suite/embedding.rs` runs it against a
//! real database and nats-server):
//!
#![doc = concat!("```\n", include_str!("../doc/embedding.rs"), "```")]
//!
//! The root holds what the example uses; the rest of the public surface is in [`settings`]
//! (the NATS URLs as given), [`subjects`] (the rules of the subject prefix and the stream
//! name, and each type's subject), [`stream`] (the stream's specification, and creating or
//! verifying it) and [`metric`].
//!
//! Modules, base first: `settings` (the NATS URLs), `subjects` (the prefix, the stream name
//! and each type's subject), `security` (credentials and TLS) and [`metric`] (the names and
//! help text of what it records) import nothing of the crate; `tail` (each subject's last
//! stored message), `provenance` (whether that message is the relay's own), `fence` (the
//! order fences and the servers that enforce them), `diagnose` (failures named by cause, the
//! start-up publish probe) and `stream` (creating or verifying the stream) use them;
//! `publisher` (the handler) uses those, with `link` (its NATS client) and `fenced` (its
//! stream-fenced window); `relay` runs it all.

#![forbid(unsafe_code)]

mod diagnose;
mod fence;
mod fenced;
mod gate;
mod link;
pub mod metric;
mod provenance;
mod publisher;
mod relay;
mod security;
pub mod settings;
pub mod stream;
pub mod subjects;
mod tail;

pub use fence::Fence;
pub use publisher::{Publisher, PublisherSettings};
pub use relay::{Relay, RelayError};
pub use security::{Credentials, Security, Tls};
pub use settings::parse_nats_urls;
pub use stream::StreamSpec;
