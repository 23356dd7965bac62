//! The contract registry, from the operator's side: list and show what is registered, add a
//! contract (a new type, a new major, or a compatible new minor), deprecate and retire one.
//! Every change is audited (`contract-added`, `contract-deprecated`, `contract-retired`)
//! with the operator; a retirement is refused while a consumer still has events of the major
//! to handle.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::{Client, Row, Transaction};

use super::{Admin, AdminError, Reason, Target};
use crate::contract::{Contract, ContractFileError, ContractRef, ContractStatus};
use crate::ids::OperatorName;
use crate::schema::Schema;
use crate::states::AuditKind;
use crate::stmt::Unnamed as _;

/// A registered contract with its registry metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredContract {
    /// The contract at its current minor.
    pub contract: Contract,
    /// Its status.
    pub status: ContractStatus,
    /// Who registered the major.
    pub registered_by: String,
    /// When.
    pub registered_at: DateTime<Utc>,
    /// Who last changed it (a new minor, a status), if anyone.
    pub changed_by: Option<String>,
    /// When.
    pub changed_at: Option<DateTime<Utc>>,
}

impl Serialize for RegisteredContract {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut value = self.contract.to_file_json();
        let map = value.as_object_mut().expect("a contract file is an object");
        map.insert(
            "contract".into(),
            self.contract.reference().to_string().into(),
        );
        map.insert("status".into(), self.status.as_str().into());
        map.insert("registered_by".into(), self.registered_by.clone().into());
        map.insert(
            "registered_at".into(),
            crate::event::format_timestamp(self.registered_at).into(),
        );
        map.insert("changed_by".into(), self.changed_by.clone().into());
        map.insert(
            "changed_at".into(),
            self.changed_at.map(crate::event::format_timestamp).into(),
        );
        value.serialize(s)
    }
}

/// What `add` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Registration {
    /// A type or major new to the registry.
    Added,
    /// A compatible new minor of a registered major.
    NewMinor {
        /// The minor it replaced.
        from: u32,
    },
    /// The same file was registered before; nothing changed and nothing was audited.
    AlreadyRegistered,
}

/// The statements of this module, rendered once for a schema.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    list: String,
    lock: String,
    insert: String,
    new_minor: String,
    set_status: String,
    retire_blocker: String,
}

impl Statements {
    pub(super) fn new(schema: &Schema) -> Self {
        Self {
            list: schema.render(LIST),
            lock: schema.render(&format!("{LIST_ONE}\nFOR UPDATE")),
            insert: schema.render(INSERT),
            new_minor: schema.render(NEW_MINOR),
            set_status: schema.render(SET_STATUS),
            retire_blocker: schema.render(RETIRE_BLOCKER),
        }
    }
}

fn decode(row: &Row) -> Result<RegisteredContract, AdminError> {
    let event_type: String = row.try_get("event_type")?;
    let major: i32 = row.try_get("major")?;
    let status: String = row.try_get("status")?;
    let contract = Contract::from_stored(
        &event_type,
        major,
        row.try_get("minor")?,
        row.try_get("description")?,
        row.try_get("identity")?,
        &row.try_get::<_, serde_json::Value>("fields")?,
    )
    .map_err(|e| {
        ContractFileError(format!(
            "the registry's row for {event_type}@{major} does not read back: {e}"
        ))
    })
    .map_err(|e| AdminError::Invalid(e.into()))?;
    Ok(RegisteredContract {
        contract,
        status: ContractStatus::parse(&status).ok_or_else(|| {
            AdminError::Invalid(
                ContractFileError(format!("unknown contract status {status:?}")).into(),
            )
        })?,
        registered_by: row.try_get("registered_by")?,
        registered_at: row.try_get("registered_at")?,
        changed_by: row.try_get("changed_by")?,
        changed_at: row.try_get("changed_at")?,
    })
}

fn not_found(contract: &ContractRef) -> AdminError {
    AdminError::NotFound {
        target: Target::Contract {
            contract: contract.clone(),
        },
    }
}

impl Admin {
    /// Every registered contract, by type and major.
    pub async fn contracts(
        &self,
        client: &mut Client,
    ) -> Result<Vec<RegisteredContract>, AdminError> {
        let tx = Self::snapshot(client).await?;
        let rows = tx.query_unnamed(&self.contracts.list, &[]).await?;
        rows.iter().map(decode).collect()
    }

    /// One registered contract.
    pub async fn contract(
        &self,
        client: &mut Client,
        reference: &ContractRef,
    ) -> Result<RegisteredContract, AdminError> {
        self.contracts(client)
            .await?
            .into_iter()
            .find(|c| c.contract.reference() == *reference)
            .ok_or_else(|| not_found(reference))
    }

    async fn lock_contract(
        &self,
        tx: &Transaction<'_>,
        reference: &ContractRef,
    ) -> Result<Option<RegisteredContract>, AdminError> {
        let major = reference.major as i32;
        let row = tx
            .query_opt_unnamed(
                &self.contracts.lock,
                &[&reference.event_type.as_str(), &major],
            )
            .await?;
        row.as_ref().map(decode).transpose()
    }

    /// Registers `contract`: a new type or major as it is; a new minor of a registered major
    /// only when that major is active and the change only adds optional fields (the refusal
    /// names the field). Registering the same file again changes nothing. Audited
    /// `contract-added`.
    pub async fn add_contract(
        &self,
        client: &mut Client,
        contract: &Contract,
        by: &OperatorName,
    ) -> Result<Registration, AdminError> {
        let tx = Self::write(client).await?;
        let reference = contract.reference();
        let major = contract.major as i32;
        let minor = contract.minor as i32;
        let identity = contract.identity.clone();
        let fields = contract.fields_json();
        let registration = match self.lock_contract(&tx, &reference).await? {
            None => {
                tx.execute_unnamed(
                    &self.contracts.insert,
                    &[
                        &reference.event_type.as_str(),
                        &major,
                        &minor,
                        &contract.description,
                        &identity,
                        &fields,
                        &by.as_str(),
                    ],
                )
                .await?;
                Registration::Added
            }
            Some(registered) if registered.contract == *contract => {
                return Ok(Registration::AlreadyRegistered);
            }
            Some(registered) => {
                if registered.status != ContractStatus::Active {
                    return Err(AdminError::Conflict {
                        target: Target::Contract {
                            contract: reference,
                        },
                        state: registered.status.to_string(),
                        refusal: "so it takes no new minor; register a new major".into(),
                    });
                }
                if registered.contract.minor == contract.minor {
                    return Err(AdminError::Invalid(
                        ContractFileError(format!(
                            "{reference} minor {} is registered with other content; a change \
                             is a new minor (or, if incompatible, a new major)",
                            contract.minor
                        ))
                        .into(),
                    ));
                }
                registered.contract.check_successor(contract)?;
                tx.execute_unnamed(
                    &self.contracts.new_minor,
                    &[
                        &reference.event_type.as_str(),
                        &major,
                        &minor,
                        &contract.description,
                        &fields,
                        &by.as_str(),
                    ],
                )
                .await?;
                Registration::NewMinor {
                    from: registered.contract.minor,
                }
            }
        };
        let reason = match registration {
            Registration::NewMinor { from } => format!("minor {from} -> {}", contract.minor),
            _ => format!("minor {}", contract.minor),
        };
        self.audit
            .record_contract(
                &tx,
                AuditKind::ContractAdded,
                &reference.to_string(),
                by.as_str(),
                &reason,
            )
            .await?;
        tx.commit().await?;
        tracing::info!(contract = %reference, minor = contract.minor, by = %by, "contract registered");
        Ok(registration)
    }

    /// Marks a major deprecated: writes are still accepted; consumers should move to its
    /// successor. Audited `contract-deprecated`.
    pub async fn deprecate_contract(
        &self,
        client: &mut Client,
        reference: &ContractRef,
        by: &OperatorName,
        reason: &Reason,
    ) -> Result<RegisteredContract, AdminError> {
        self.change_status(client, reference, ContractStatus::Deprecated, by, reason)
            .await
    }

    /// Retires a major: the writer refuses new events of it. Refused while an active consumer
    /// still has events of it to handle (after its cursor, or as a dead letter not yet
    /// settled), and for `task:deleted@1`, which `write_task_deleted` writes without the
    /// registry. Audited `contract-retired`.
    pub async fn retire_contract(
        &self,
        client: &mut Client,
        reference: &ContractRef,
        by: &OperatorName,
        reason: &Reason,
    ) -> Result<RegisteredContract, AdminError> {
        self.change_status(client, reference, ContractStatus::Retired, by, reason)
            .await
    }

    async fn change_status(
        &self,
        client: &mut Client,
        reference: &ContractRef,
        status: ContractStatus,
        by: &OperatorName,
        reason: &Reason,
    ) -> Result<RegisteredContract, AdminError> {
        let tx = Self::write(client).await?;
        let registered = self
            .lock_contract(&tx, reference)
            .await?
            .ok_or_else(|| not_found(reference))?;
        let conflict = |refusal: String| AdminError::Conflict {
            target: Target::Contract {
                contract: reference.clone(),
            },
            state: registered.status.to_string(),
            refusal,
        };
        if registered.status == status || registered.status == ContractStatus::Retired {
            return Err(conflict("so there is nothing to change".into()));
        }
        let major = reference.major as i32;
        let kind = if status == ContractStatus::Retired {
            if *reference == ContractRef::task_deleted() {
                return Err(conflict(
                    "and stays so: write_task_deleted and the Rust writer's record write it \
                     without the registry; deprecate it instead"
                        .into(),
                ));
            }
            let blocker = tx
                .query_opt_unnamed(
                    &self.contracts.retire_blocker,
                    &[&reference.event_type.as_str(), &major],
                )
                .await?;
            if let Some(row) = blocker {
                let project: String = row.try_get("project_id")?;
                let consumer: String = row.try_get("consumer_id")?;
                return Err(conflict(format!(
                    "and consumer {consumer} of project {project} still has events of it to \
                     handle; let it catch up (or retire it) first"
                )));
            }
            AuditKind::ContractRetired
        } else {
            AuditKind::ContractDeprecated
        };
        tx.execute_unnamed(
            &self.contracts.set_status,
            &[
                &reference.event_type.as_str(),
                &major,
                &status.as_str(),
                &by.as_str(),
            ],
        )
        .await?;
        self.audit
            .record_contract(
                &tx,
                kind,
                &reference.to_string(),
                by.as_str(),
                reason.as_str(),
            )
            .await?;
        tx.commit().await?;
        tracing::info!(contract = %reference, status = %status, by = %by, "contract status changed");
        Ok(RegisteredContract {
            status,
            changed_by: Some(by.to_string()),
            changed_at: Some(Utc::now()),
            ..registered
        })
    }
}

/// Every contract, by type and major.
const LIST: &str = "
SELECT event_type, major, minor, description, identity, fields, status,
       registered_by, registered_at, changed_by, changed_at
FROM {{schema}}.lifecycle_event_contracts
ORDER BY event_type, major";

/// Contract `$1` major `$2`.
const LIST_ONE: &str = "
SELECT event_type, major, minor, description, identity, fields, status,
       registered_by, registered_at, changed_by, changed_at
FROM {{schema}}.lifecycle_event_contracts
WHERE event_type = $1 AND major = $2";

/// Registers type `$1` major `$2` at minor `$3`: description, identity, fields, operator. (A
/// trigger then writes the writer's generated check anew: `sql/0017_contract_checks.sql`.)
const INSERT: &str = "
INSERT INTO {{schema}}.lifecycle_event_contracts
    (event_type, major, minor, description, identity, fields, registered_by)
VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// Moves type `$1` major `$2` to minor `$3` with description `$4` and fields `$5`, by `$6`.
const NEW_MINOR: &str = "
UPDATE {{schema}}.lifecycle_event_contracts
SET minor = $3, description = $4, fields = $5,
    changed_by = $6, changed_at = now()
WHERE event_type = $1 AND major = $2";

/// Sets type `$1` major `$2` to status `$3`, by `$4`.
const SET_STATUS: &str = "
UPDATE {{schema}}.lifecycle_event_contracts
SET status = $3, changed_by = $4, changed_at = now()
WHERE event_type = $1 AND major = $2";

/// An active consumer that still has an event of type `$1` major `$2` to handle: one after its
/// cursor (or not numbered yet, or any, while its cursor is missing), or a dead letter or a
/// retry not settled yet.
const RETIRE_BLOCKER: &str = "
SELECT cur.project_id, cur.consumer_id
FROM {{schema}}.lifecycle_consumer_cursors cur
WHERE cur.state = 'active'
  AND (EXISTS (SELECT 1 FROM {{schema}}.lifecycle_outbox o
               WHERE o.project_id = cur.project_id
                 AND o.event_type = $1 AND o.payload_version = $2
                 AND (o.sequence IS NULL OR cur.last_acked_sequence IS NULL
                      OR o.sequence > cur.last_acked_sequence))
       OR EXISTS (SELECT 1 FROM {{schema}}.lifecycle_deliveries d
                  JOIN {{schema}}.lifecycle_outbox o
                    ON o.project_id = d.project_id AND o.event_id = d.event_id
                  WHERE d.project_id = cur.project_id AND d.consumer_id = cur.consumer_id
                    AND d.state IN ('retrying', 'dead', 'replay_requested')
                    AND o.event_type = $1 AND o.payload_version = $2))
ORDER BY cur.project_id, cur.consumer_id
LIMIT 1";
