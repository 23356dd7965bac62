//! What the benchmark binaries share: connections, fresh databases and the sequenced backlog
//! (`db`), and statistics over measurements (`stats`). `outbox-bench` and `outbox-relay-bench`
//! both measure against backlogs and report percentiles; one copy keeps their figures
//! comparable.

#![forbid(unsafe_code)]

pub mod db;
pub mod stats;

/// Errors of a benchmark binary: reported, never matched on.
pub type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;
