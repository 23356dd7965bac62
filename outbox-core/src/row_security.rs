//! Per-project row security: switching on the policies migration 0002 created.
//!
//! The policies bind the schema's writer, consumer and operator roles to the projects listed
//! for them in `lifecycle_role_projects`. They are inert until row security is enabled on the
//! tables, which is a deployment decision (`outbox migrate --row-security`), not a schema
//! version: enabling it is idempotent, and disabling it is one documented statement per table.

use tokio_postgres::Client;

use crate::error::Error;
use crate::schema::Schema;

/// The tables that carry a `project_id` and the `project_binding` policy.
pub const ROW_SECURITY_TABLES: [&str; 8] = [
    "lifecycle_outbox",
    "lifecycle_projects",
    "lifecycle_consumers",
    "lifecycle_consumer_positions",
    "lifecycle_lease_renewals",
    "lifecycle_deliveries",
    "lifecycle_audit",
    "lifecycle_lane_receipts",
];

/// Enables row security on every project table of `schema`, in one transaction. The tables'
/// owner (the role that migrates) stays exempt, as PostgreSQL exempts owners.
pub async fn enable_row_security(client: &mut Client, schema: &Schema) -> Result<(), Error> {
    let tx = client.transaction().await?;
    for table in ROW_SECURITY_TABLES {
        tx.batch_execute(&format!(
            "ALTER TABLE {}.{table} ENABLE ROW LEVEL SECURITY",
            schema.quoted()
        ))
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Whether row security is on for every project table of `schema`: the state the schema is in,
/// whoever turned it on and whenever (a run of `migrate` without `--row-security` leaves it as
/// it was, and reports it so).
pub async fn row_security_enabled(client: &Client, schema: &Schema) -> Result<bool, Error> {
    let tables: Vec<&str> = ROW_SECURITY_TABLES.to_vec();
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE c.relrowsecurity) = cardinality($2::text[]) AS on \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = ANY ($2::text[])",
            &[&schema.name(), &tables],
        )
        .await?;
    Ok(row.try_get("on")?)
}
