//! Plumbing shared by this workspace's own crates (the consumer runtime, the servers, the CLI)
//! and by its tests. It is public only because those are separate crates: it is hidden from the
//! documentation, not a stable API, and may change in any release. An application uses the
//! documented modules instead.
//!
//! - [`observe`], [`in_observed_dispatch`]: the mark the consumer runtime puts on a handler's
//!   task, so the writer refuses to run inside it.
//! - [`owner_token`], [`holder_is_gone`], [`host_name`], [`token_host_and_pid`]: who holds a
//!   lease row, and the rule that a holder whose process is gone may be taken over at once.
//! - [`Unnamed`]: statements sent unnamed, which a transaction-mode pooler survives.
//! - [`read_only_snapshot`]: the read-only transaction of multi-statement reports.
//! - [`redact_connection_string`]: passwords out of a connection string before it is printed.
//! - [`Readable`]: durations as log lines show them.

pub use crate::observed::{in_observed_dispatch, observe};
pub use crate::owner::{holder_is_gone, host_name, owner_token, token_host_and_pid};
pub use crate::readable::Readable;
pub use crate::redact::redact_connection_string;
pub use crate::snapshot::read_only_snapshot;
pub use crate::stmt::Unnamed;
