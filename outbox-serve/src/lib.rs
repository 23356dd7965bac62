//! The lifecycle-outbox HTTP server: durable consumers whose handled events are fanned out
//! over HTTP, Server-Sent Events for ephemeral clients, with Prometheus metrics, Kubernetes
//! probes and an operator dashboard. `outbox serve` is this crate behind command-line
//! options; an application can run it inside its own tokio service:
//!
//! ```no_run
//! use outbox_consumer::{DeliverySettings, Duties};
//! use outbox_core::{ConnectSettings, ConsumerId, ProjectId};
//! use outbox_serve::{Server, ServerSettings};
//! use outbox_service::Connections;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = ConnectSettings::parse("postgresql://app@localhost/app")?;
//! let connections = Connections::new(&settings, 4, true)?;
//! let read_pool = settings.pool(4)?;
//! let consumer = ConsumerId::new("dashboard")?;
//! let projects = vec![ProjectId::new("p1")?, ProjectId::new("p2")?];
//! // Every project's consumer delivers as `delivery`; the duties are carried out once.
//! let (delivery, duties) = (DeliverySettings::default(), Duties::default());
//! let settings = ServerSettings::new(consumer);
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! let shutdown = CancellationToken::new();
//! Server::new(connections, read_pool, delivery, duties, projects, settings)
//!     .run(listener, shutdown)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! All served projects run as one [`outbox_consumer::ConsumerSet`]: one pool, one LISTEN
//! connection and one place in the sequencer election, however many projects it serves. Each
//! project's consumer is the ordinary runtime, with lease, retries and all; its sink
//! publishes to the project's [`FanOut`]. SSE clients own no cursor: they resume from the
//! fan-out's ring, from retained history (read-only) or from a reconciliation. Their ids
//! ([`StreamId`]) carry the identity of the event they name, so a client resuming with an id
//! from another history (the lost tail of a failover) is sent a reconciliation rather than
//! the events after a number that names another event here.
//!
//! Modules, base first: `sse_id` (the form of the SSE `id:` field) and `auth` import nothing
//! of the crate; `host` (which `Host` a request may name) uses only `state`'s error body; [`fan_out`] uses `sse_id`; `state` holds what handlers share; `stream` (the
//! SSE endpoint) and `dashboard` use it; `routes` wires them with the probes; `server` runs it
//! all.

#![forbid(unsafe_code)]

mod auth;
mod dashboard;
pub mod fan_out;
mod host;
mod routes;
mod server;
mod sse_id;
mod state;
mod stream;

pub use auth::AdminAuth;
pub use fan_out::{FanOut, FanOutSink};
pub use host::{AllowedHosts, InvalidAllowedHost};
pub use routes::waiting_router;
pub use server::{Direct, ServeError, Server, ServerSettings};
pub use sse_id::{MalformedId, StreamId, Tag};
