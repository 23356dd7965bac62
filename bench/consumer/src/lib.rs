//! What the benchmark binaries share: connections, fresh databases and the sequenced backlog
//! (`db`), statistics over measurements (`stats`), and a process's memory and CPU time
//! (`procfs`). `outbox-bench`, `outbox-relay-bench` and `outbox-sse-bench` all report
//! percentiles; one copy keeps their figures comparable.

#![forbid(unsafe_code)]

pub mod db;
pub mod procfs;
pub mod stats;

/// Errors of a benchmark binary: reported, never matched on.
pub type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;
