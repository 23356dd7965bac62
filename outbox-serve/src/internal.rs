//! What `outbox serve` (the CLI) reaches that is not part of the server's API: it is public only
//! because the CLI is a separate crate, hidden from the documentation, not a stable API, and may
//! change in any release.
//!
//! - [`waiting_router`]: the probes alone, answered while the CLI waits for its database
//!   before the server starts.

pub use crate::routes::waiting_router;
