//! The lifecycle-outbox HTTP server: durable consumers whose handled events are fanned out
//! over HTTP (Server-Sent Events for ephemeral clients), with Prometheus metrics, Kubernetes
//! probes and an operator dashboard.

#![forbid(unsafe_code)]

pub mod dashboard;
pub mod fan_out;
pub mod http;
mod stream;
