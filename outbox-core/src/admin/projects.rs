//! Whether a project or consumer named on the command line exists, so every command that takes
//! a `--project` or `--consumer-id` refuses an unknown one the same way
//! ([`AdminError::NotFound`], exit 3) instead of reporting an empty listing that looks like a
//! healthy, quiet project or a consumer without dead letters.

use tokio_postgres::GenericClient;

use super::{Admin, AdminError, Target};
use crate::ids::{ConsumerId, ProjectId};
use crate::stmt::Unnamed;

/// A project exists once it has an event (numbered or not), a head or a consumer. Each probe
/// is one index lookup: the event key and both tables' keys lead with `project_id`.
const PROJECT_KNOWN: &str = "\
SELECT EXISTS (SELECT 1 FROM {{schema}}.lifecycle_projects WHERE project_id = $1)
    OR EXISTS (SELECT 1 FROM {{schema}}.lifecycle_consumer_cursors WHERE project_id = $1)
    OR EXISTS (SELECT 1 FROM {{schema}}.lifecycle_outbox WHERE project_id = $1) AS known";

/// A consumer exists while it has a row; for the audit trail also once it has audit rows (a
/// deleted consumer's stay). `$1` project (NULL: any), `$2` consumer, `$3` whether audit rows
/// count. The audit probe reads the trail only for an ID without a row.
const CONSUMER_KNOWN: &str = "\
SELECT EXISTS (SELECT 1 FROM {{schema}}.lifecycle_consumers
               WHERE ($1::text IS NULL OR project_id = $1) AND consumer_id = $2)
    OR ($3 AND EXISTS (SELECT 1 FROM {{schema}}.lifecycle_audit
                       WHERE ($1::text IS NULL OR project_id = $1) AND consumer_id = $2))
       AS known";

impl Admin {
    /// Fails with [`AdminError::NotFound`] naming `consumer` (of `project`, when given) when
    /// the database has no such consumer: a filter by a mistyped ID is refused instead of
    /// answering with an empty listing. With `audited`, a consumer that only left audit rows
    /// (deleted since) is known too.
    pub async fn require_consumer<C: GenericClient + Sync>(
        &self,
        client: &C,
        project: Option<&ProjectId>,
        consumer: &ConsumerId,
        audited: bool,
    ) -> Result<(), AdminError> {
        let known: bool = client
            .query_one_unnamed(
                &self.schema.render(CONSUMER_KNOWN),
                &[
                    &project.map(ProjectId::as_str),
                    &consumer.as_str(),
                    &audited,
                ],
            )
            .await?
            .try_get("known")?;
        if known {
            return Ok(());
        }
        let target = match project {
            Some(project) => Target::Consumer {
                project: project.clone(),
                consumer: consumer.clone(),
            },
            None => Target::ConsumerId {
                consumer: consumer.clone(),
            },
        };
        Err(AdminError::NotFound { target })
    }

    /// Fails with [`AdminError::NotFound`] naming `project` when the database has never seen
    /// it (or, under row security, when this role may not see it).
    pub async fn require_project<C: GenericClient + Sync>(
        &self,
        client: &C,
        project: &ProjectId,
    ) -> Result<(), AdminError> {
        let known: bool = client
            .query_one_unnamed(&self.schema.render(PROJECT_KNOWN), &[&project.as_str()])
            .await?
            .try_get("known")?;
        if known {
            Ok(())
        } else {
            Err(AdminError::NotFound {
                target: Target::Project {
                    project: project.clone(),
                },
            })
        }
    }
}
