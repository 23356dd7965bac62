//! The one writer of the audit trail (`lifecycle_audit`), for the operator surface, the
//! consumer runtime and the retention sweep alike. It sits below all three (it imports only
//! the schema, the states and the statement helpers), so none of them depends on another to
//! record what it did.

use tokio_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use crate::schema::Schema;
use crate::states::AuditKind;
use crate::stmt::Unnamed as _;

/// A row to append to the audit trail: identifiers, a count, the actor, and for the operator
/// actions that take one (retire, resolve) the operator's reason, so it survives a later change
/// of the row it explains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditRecord<'a> {
    /// What happened.
    pub kind: AuditKind,
    /// The project.
    pub project_id: &'a str,
    /// The consumer, if the row is about one.
    pub consumer_id: Option<&'a str>,
    /// The event, if the row is about one.
    pub event_id: Option<&'a str>,
    /// The operator (or sweep) that acted; `None` for the consumer runtime's own rows.
    pub actor: Option<&'a str>,
    /// Attempts, events or tasks, depending on the kind (see [`AuditEntry::count`](crate::admin::AuditEntry::count)).
    pub count: Option<i64>,
    /// The operator's reason, for the actions that take one.
    pub reason: Option<&'a str>,
}

impl<'a> AuditRecord<'a> {
    /// An operator's action on a consumer (retire, reactivate, delete): the operator, the
    /// reason, and the kind's count.
    pub fn consumer_action(
        kind: AuditKind,
        project_id: &'a str,
        consumer_id: &'a str,
        by: &'a str,
        count: Option<i64>,
        reason: &'a str,
    ) -> Self {
        Self {
            kind,
            project_id,
            consumer_id: Some(consumer_id),
            event_id: None,
            actor: Some(by),
            count,
            reason: Some(reason),
        }
    }
}

/// Appends to the audit trail of one schema: the only writer of `lifecycle_audit` rows.
#[derive(Debug, Clone)]
pub struct AuditLog {
    /// [`AUDIT`], rendered for the schema.
    insert: String,
    /// [`AUDIT`] with `RETURNING id`, rendered for the schema.
    insert_returning_id: String,
    /// [`AUDIT_CONTRACT`], rendered for the schema.
    insert_contract: String,
}

impl AuditLog {
    /// The writer for the trail in `schema`.
    pub fn new(schema: &Schema) -> Self {
        Self {
            insert: schema.render(AUDIT),
            insert_returning_id: schema.render(&format!("{AUDIT}\nRETURNING id")),
            insert_contract: schema.render(AUDIT_CONTRACT),
        }
    }

    /// Appends `record` on `client` (normally inside the transaction whose change it records).
    ///
    /// A plain insert: the consumer role may append to the trail but not read it, and
    /// `RETURNING` needs the right to read what it returns.
    pub async fn record(
        &self,
        client: &(impl GenericClient + Sync),
        record: &AuditRecord<'_>,
    ) -> Result<(), tokio_postgres::Error> {
        client
            .execute_unnamed(&self.insert, &params(&record.kind.as_str(), record))
            .await?;
        Ok(())
    }

    /// Appends `record` like [`record`](Self::record) and returns the new row's ID, for the
    /// retention sweep, which adds to its row later. Needs the right to read the trail (the
    /// operator's).
    pub async fn record_returning_id(
        &self,
        client: &(impl GenericClient + Sync),
        record: &AuditRecord<'_>,
    ) -> Result<i64, tokio_postgres::Error> {
        client
            .query_one_unnamed(
                &self.insert_returning_id,
                &params(&record.kind.as_str(), record),
            )
            .await?
            .try_get("id")
    }
}

impl AuditLog {
    /// Appends an operator's change to the contract registry: no project (a contract is the
    /// schema's), the contract (`task:archived@1`), the operator and the reason.
    pub async fn record_contract(
        &self,
        client: &(impl GenericClient + Sync),
        kind: AuditKind,
        contract: &str,
        by: &str,
        reason: &str,
    ) -> Result<(), tokio_postgres::Error> {
        client
            .execute_unnamed(
                &self.insert_contract,
                &[&kind.as_str(), &contract, &by, &reason],
            )
            .await?;
        Ok(())
    }
}

/// [`AUDIT`]'s parameters, `kind` being `record.kind` as stored.
fn params<'r>(kind: &'r &'static str, record: &'r AuditRecord<'_>) -> [&'r (dyn ToSql + Sync); 7] {
    [
        kind,
        &record.project_id,
        &record.consumer_id,
        &record.event_id,
        &record.actor,
        &record.count,
        &record.reason,
    ]
}

/// Appends an audit row: `$1` kind, `$2` project, `$3` consumer (or NULL), `$4` event (or
/// NULL), `$5` actor (or NULL), `$6` count (or NULL), `$7` reason (or NULL).
const AUDIT: &str = "
INSERT INTO {{schema}}.lifecycle_audit
    (kind, project_id, consumer_id, event_id, actor, count, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// Appends a contract registry row: `$1` kind, `$2` contract, `$3` operator, `$4` reason.
const AUDIT_CONTRACT: &str = "
INSERT INTO {{schema}}.lifecycle_audit (kind, contract, actor, reason)
VALUES ($1, $2, $3, $4)";
