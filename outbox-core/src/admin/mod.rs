//! The operator surface: inspect projects, consumers, dead letters and the audit trail, and
//! repair what the runtime cannot decide on its own (replay, resolve, retire).
//!
//! ```no_run
//! use outbox_core::admin::{Admin, Reason};
//! use outbox_core::{ConsumerId, EventId, OperatorName, ProjectId, Schema};
//!
//! # async fn example(client: &mut tokio_postgres::Client) -> Result<(), outbox_core::admin::AdminError> {
//! let admin = Admin::new(&Schema::default());
//! let project = ProjectId::new("p1")?;
//! let consumer = ConsumerId::new("dashboard")?;
//! let event = EventId::new("task-deleted:FN-1:2026-01-02T03:04:05.000000Z")?;
//! let done = admin
//!     .resolve(client, &project, &consumer, &event,
//!              &OperatorName::new("alice")?, &Reason::new("task restored by hand")?)
//!     .await?;
//! println!("resolved at {}", done.resolved_at);
//! # Ok(()) }
//! ```
//!
//! ## Guarantees
//! - Every operation is one transaction. A write locks its target row, checks the state it
//!   needs and changes it, or changes nothing and says why: [`AdminError::NotFound`] names the
//!   missing target, [`AdminError::Conflict`] names the target and the state it is in.
//! - Operator text (`reason`) is stored on the consumer or delivery row it explains and never
//!   in the audit trail, which holds identifiers, counts and the acting operator only.
//! - Reads of several tables ([`Admin::status`], [`Admin::dead_letter`]) come from one
//!   snapshot, and ages are measured on the database clock.
//! - Writes lock their target row before checking its state, so a check and the change it
//!   guards are one decision. The consumer runtime's fenced writes lock the consumer row before
//!   delivery rows, and so do these, so the two never wait on each other in a cycle.
//!
//! ## Modules
//! Each noun keeps its types, its operations and their SQL (templates over `{{schema}}`; reads
//! take optional filters as nullable parameters, `$n::text IS NULL OR ...`) together:
//! - [`status`]: health codes, thresholds, project and consumer status, [`Admin::status`].
//! - [`consumers`]: consumer listing and retirement ([`Admin::consumers`], [`Admin::retire`]).
//! - [`consumer_admin`]: a retired consumer reactivated ([`Admin::reactivate`]; it reconciles
//!   at its next start, as after the runtime's own reactivation at its claim) or deleted with
//!   its rows ([`Admin::delete_consumer`]).
//! - [`dead_letters`]: listing, showing, replaying and resolving dead letters.
//! - [`projects`]: [`Admin::require_project`], the one rule for an unknown `--project`.
//! - [`audit`]: the audit trail, and [`AuditLog`], the one statement that appends to it.
//! - [`error`]: [`AdminError`], [`InputError`], [`Target`].
//! - [`reason`]: [`Reason`], the validated operator text.

pub mod audit;
pub mod consumer_admin;
pub mod consumers;
pub mod contracts;
pub mod dead_letters;
pub mod error;
pub mod projects;
pub mod reason;
pub mod status;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::{Client, Transaction};

use crate::schema::Schema;
use crate::snapshot::read_only_snapshot;
use crate::states::UnknownValue;

pub use crate::audit_log::{AuditLog, AuditRecord};
pub use crate::ids::{EventId, MAX_EVENT_ID_LEN, MAX_OPERATOR_LEN, OperatorName};
pub use crate::states::{AuditKind, ConsumerState, DeliveryState, Health};
pub use audit::{AuditEntry, AuditFilter};
pub use consumer_admin::{Deletion, Reactivation};
pub use consumers::{ConsumerInfo, Retirement, RetryingEvent};
pub use contracts::{RegisteredContract, Registration};
pub use dead_letters::{
    DeadLetter, DeadLetterDetail, DeadLetterFilter, EventFields, ReplayRequest, ReplayTarget,
    Resolution,
};
pub use error::{AdminError, InputError, Target};
pub use reason::{MAX_REASON_LEN, Reason, ReasonError};
pub use status::{
    ConsumerStatus, HealthThresholds, ProjectStatus, Status, consumer_health, project_health,
};

/// Most rows one listing returns.
pub const MAX_LIMIT: i64 = 10_000;

/// How long a write waits for a row another transaction holds (a consumer in the middle of a
/// transactional delivery, say) before giving up with [`AdminError::Busy`].
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '10s'";
/// Upper bound for any operator statement, so a command never hangs silently.
const STATEMENT_TIMEOUT: &str = "SET LOCAL statement_timeout = '60s'";

/// A listing, with whether the limit cut it short.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listing<T> {
    /// The rows.
    pub items: Vec<T>,
    /// True when more rows matched than the limit allowed.
    pub truncated: bool,
}

impl<T> Listing<T> {
    /// Keeps the first `limit` of `items` (read with a limit of `limit + 1`), noting whether
    /// there were more.
    fn cut(mut items: Vec<T>, limit: i64) -> Self {
        let truncated = items.len() as i64 > limit;
        items.truncate(limit as usize);
        Self { items, truncated }
    }
}

/// Operator operations on one schema. Cheap to clone; holds only rendered statements.
#[derive(Debug, Clone)]
pub struct Admin {
    /// `status` statements.
    status: status::Statements,
    /// Consumer statements.
    consumers: consumers::Statements,
    /// Reactivation and deletion statements.
    consumer_admin: consumer_admin::Statements,
    /// Dead-letter statements.
    dead_letters: dead_letters::Statements,
    /// Contract registry statements.
    contracts: contracts::Statements,
    /// The audit trail's reader.
    audit_trail: String,
    /// The audit trail's writer.
    audit: AuditLog,
    /// The schema, for the retention rule's statements (`status`).
    schema: Schema,
}

fn parse_state<T: std::str::FromStr<Err = UnknownValue>>(text: &str) -> Result<T, AdminError> {
    text.parse::<T>().map_err(AdminError::from)
}

fn check_limit(limit: i64) -> Result<(), InputError> {
    if (1..=MAX_LIMIT).contains(&limit) {
        Ok(())
    } else {
        Err(InputError::Limit(limit))
    }
}

fn format_time(at: Option<DateTime<Utc>>) -> String {
    at.map(|at| at.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| "an unknown time".into())
}

impl Admin {
    /// Operations on the tables in `schema`.
    pub fn new(schema: &Schema) -> Self {
        Self {
            status: status::Statements::new(schema),
            consumers: consumers::Statements::new(schema),
            consumer_admin: consumer_admin::Statements::new(schema),
            dead_letters: dead_letters::Statements::new(schema),
            contracts: contracts::Statements::new(schema),
            audit_trail: schema.render(audit::AUDIT_TRAIL),
            audit: AuditLog::new(schema),
            schema: schema.clone(),
        }
    }

    /// A read-only transaction on one snapshot.
    async fn snapshot(client: &mut Client) -> Result<Transaction<'_>, AdminError> {
        let tx = read_only_snapshot(client).await?;
        tx.batch_execute(STATEMENT_TIMEOUT).await?;
        Ok(tx)
    }

    /// A read-write transaction whose row locks give up after the lock timeout.
    async fn write(client: &mut Client) -> Result<Transaction<'_>, AdminError> {
        let tx = client.transaction().await?;
        tx.batch_execute(&format!("{STATEMENT_TIMEOUT}; {LOCK_TIMEOUT}"))
            .await?;
        Ok(tx)
    }
}
