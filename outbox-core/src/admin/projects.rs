//! Whether a project named on the command line exists, so every command that takes a
//! `--project` refuses an unknown one the same way ([`AdminError::NotFound`], exit 3) instead
//! of reporting an empty listing that looks like a healthy, quiet project.

use tokio_postgres::GenericClient;

use super::{Admin, AdminError, Target};
use crate::ids::ProjectId;
use crate::stmt::Unnamed;

/// A project exists once it has an event (numbered or not), a head or a consumer. Each probe
/// is one index lookup: the event key and both tables' keys lead with `project_id`.
const PROJECT_KNOWN: &str = "\
SELECT EXISTS (SELECT 1 FROM {{schema}}.lifecycle_projects WHERE project_id = $1)
    OR EXISTS (SELECT 1 FROM {{schema}}.lifecycle_consumer_cursors WHERE project_id = $1)
    OR EXISTS (SELECT 1 FROM {{schema}}.lifecycle_outbox WHERE project_id = $1) AS known";

impl Admin {
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
