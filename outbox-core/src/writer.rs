//! The transactional writer: records `task:deleted` inside the caller's delete transaction,
//! and events of any registered type through the SQL writer `write_event`.

use tokio_postgres::GenericClient;
use tokio_postgres::types::Type;

use crate::contract::Event;
use crate::error::Error;
use crate::event::{PAYLOAD_VERSION, TaskDeleted, ValidationError};
use crate::ids::WriterProcessId;
use crate::observed::in_observed_dispatch;
use crate::schema::Schema;
use crate::sql;

/// What a write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    /// A new event row was inserted; it commits or rolls back with the caller's transaction.
    Recorded {
        /// The event's identity.
        event_id: String,
    },
    /// This deletion (same task, same `deleted_at`) is already recorded; nothing was written.
    AlreadyRecorded {
        /// The event's identity.
        event_id: String,
    },
}

impl WriteOutcome {
    /// The event's identity.
    pub fn event_id(&self) -> &str {
        match self {
            WriteOutcome::Recorded { event_id } | WriteOutcome::AlreadyRecorded { event_id } => {
                event_id
            }
        }
    }
}

/// Writes `task:deleted` events on behalf of one process.
///
/// The writer costs one round trip and one indexed insert. It never begins, commits or
/// changes session state, never takes a shared counter row and never sends `NOTIFY`: numbering
/// and wake-ups are the sequencer's job, after commit.
#[derive(Debug, Clone)]
pub struct Writer {
    /// Carried in every event as its origin, so observers can tell who deleted.
    process_id: WriterProcessId,
    /// The insert statement rendered for the configured schema.
    insert: String,
    /// The generic writer's call, rendered for the configured schema.
    write_event: String,
    /// Whether the caller's transaction recorded an event, rendered for the schema.
    recorded_here: String,
}

impl Writer {
    /// A writer for `schema`, identifying itself as `process_id`.
    pub fn new(schema: &Schema, process_id: WriterProcessId) -> Self {
        Self {
            process_id,
            insert: schema.render(sql::WRITE_TASK_DELETED),
            write_event: schema.render(sql::WRITE_EVENT),
            recorded_here: schema.render(sql::RECORDED_HERE),
        }
    }

    /// The identity recorded as each event's origin.
    pub fn process_id(&self) -> &WriterProcessId {
        &self.process_id
    }

    /// Records `event` through `client`, which should be the caller's open delete transaction.
    pub async fn record<C>(&self, client: &C, event: &TaskDeleted) -> Result<WriteOutcome, Error>
    where
        C: GenericClient + Sync,
    {
        if in_observed_dispatch() {
            return Err(Error::WriteInsideObservedDispatch);
        }
        let event_id = event.event_id();
        let deleted_at = event.deleted_at();
        let payload = event.prior().to_payload();
        let rows = client
            .query_typed(
                &self.insert,
                &[
                    (&event.project_id().as_str(), Type::TEXT),
                    (&event_id.as_str(), Type::TEXT),
                    (&event.task_id().as_str(), Type::TEXT),
                    (&deleted_at, Type::TIMESTAMPTZ),
                    (&self.process_id.as_str(), Type::TEXT),
                    (&PAYLOAD_VERSION, Type::INT4),
                    (&payload, Type::JSONB),
                ],
            )
            .await?;
        Ok(if rows.is_empty() {
            WriteOutcome::AlreadyRecorded { event_id }
        } else {
            WriteOutcome::Recorded { event_id }
        })
    }

    /// Records an event of any registered type through `client`, the caller's open
    /// transaction, with one call of the SQL writer `write_event`: the payload is checked
    /// against the type's contract there, in the same round trip (an unknown or retired type,
    /// or a payload that breaks its contract, is refused with a message naming the field and
    /// nothing is written). A repeated write of one occurrence (same subject and identity
    /// fields) records nothing new: [`WriteOutcome::AlreadyRecorded`], told apart by a second
    /// statement (an indexed read) since the SQL writer returns only the ID.
    ///
    /// The example (the book's, run against a real database by
    /// `outbox-cli/tests/suite/embedding.rs`):
    #[doc = concat!("```\n", include_str!("../doc/record_event.rs"), "```")]
    pub async fn record_event<C>(&self, client: &C, event: &Event) -> Result<WriteOutcome, Error>
    where
        C: GenericClient + Sync,
    {
        if in_observed_dispatch() {
            return Err(Error::WriteInsideObservedDispatch);
        }
        let contract = event.contract();
        let major = i32::try_from(contract.major).unwrap_or(i32::MAX);
        let row = client
            .query_typed(
                &self.write_event,
                &[
                    (&event.project_id().as_str(), Type::TEXT),
                    (&contract.event_type.as_str(), Type::TEXT),
                    (&major, Type::INT4),
                    (&event.subject_id().as_str(), Type::TEXT),
                    (event.payload(), Type::JSONB),
                    (&self.process_id.as_str(), Type::TEXT),
                    (&event.traceparent(), Type::TEXT),
                ],
            )
            .await?;
        let row = row.first().ok_or_else(|| {
            Error::Validation(ValidationError::Payload(format!(
                "write_event returned no row for {contract}"
            )))
        })?;
        let event_id: String = row.try_get("event_id")?;
        let project = event.project_id().as_str();
        let inserted = client
            .query_typed(
                &self.recorded_here,
                &[(&project, Type::TEXT), (&event_id.as_str(), Type::TEXT)],
            )
            .await?
            .first()
            .map(|row| row.try_get::<_, bool>("inserted"))
            .transpose()?
            .unwrap_or(false);
        Ok(if inserted {
            WriteOutcome::Recorded { event_id }
        } else {
            WriteOutcome::AlreadyRecorded { event_id }
        })
    }
}
