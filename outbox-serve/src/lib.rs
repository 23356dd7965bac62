//! The lifecycle-outbox HTTP server: durable consumers whose handled events are fanned out
//! over HTTP, Server-Sent Events for ephemeral clients, with Prometheus metrics, Kubernetes
//! probes and an operator dashboard. `outbox serve` is this crate behind command-line
//! options; an application can run it inside its own tokio service, as this function does
//! (`outbox-cli/tests/suite/embedding.rs` runs it against a real database and an SSE client):
//!
#![doc = concat!("```\n", include_str!("../doc/embedding.rs"), "```")]
//!
//! All served projects run as one [`outbox_consumer::ConsumerSet`]: one pool, one LISTEN
//! connection and one place in the sequencer election, however many projects it serves, on
//! a thread and runtime of its own beside the caller's (a thousand clients' writes never delay
//! a reply from the database to it). Each
//! project's consumer is the ordinary runtime, with lease, retries and all; its sink
//! publishes to the project's [`FanOut`](fan_out::FanOut). SSE clients own no cursor: they resume from the
//! fan-out's ring, from retained history (read-only) or from a reconciliation. Their ids
//! ([`StreamId`](fan_out::StreamId)) carry the identity of the event they name, so a client resuming with an id
//! from another history (the lost tail of a failover) is sent a reconciliation rather than
//! the events after a number that names another event here.
//!
//! The root holds the server, its settings and what they take ([`AdminAuth`],
//! [`AllowedHosts`]); the fan-out and its SSE ids are in [`fan_out`], the metrics' names in
//! [`metric`].
//!
//! Modules, base first: `sse` (the wire format of a message and a comment), `sse_id` (the
//! form of the SSE `id:` field), [`metric`] (the names and help text of what it records) and
//! `auth` import nothing of the crate; `host` (which `Host` a request may name) uses only `state`'s error body; [`fan_out`] uses `sse` and `sse_id`; `state` holds what handlers share; `stream` (the
//! SSE endpoint) and `dashboard` use it; `routes` wires them with the probes; `server` runs it
//! all.

#![forbid(unsafe_code)]

mod auth;
mod dashboard;
pub mod fan_out;
mod host;
#[doc(hidden)]
pub mod internal;
pub mod metric;
mod routes;
mod server;
mod sse;
mod sse_id;
mod state;
mod stream;

pub use auth::AdminAuth;
pub use host::{AllowedHosts, InvalidAllowedHost};
pub use server::{Direct, ServeError, Server, ServerSettings};
