//! Schema migrations: numbered files in `sql/`, embedded at build time.
//!
//! All pending migrations apply in one transaction under an advisory lock, so two processes
//! migrating at once serialise and the second finds nothing to do, and a failure leaves the
//! schema as it was. An applied migration whose checksum differs from the embedded file is
//! refused: the code would otherwise run against a schema it was not written for.
//!
//! Per-project row security ([`enable_row_security`]) is here too: a deployment step taken
//! beside migrating (`outbox migrate --row-security`), not a schema version.

use sha2::{Digest, Sha256};
use tokio_postgres::{Client, Row};

use crate::error::Error;
use crate::schema::Schema;
use crate::sql;
use crate::stmt::Unnamed;

pub use crate::row_security::{ROW_SECURITY_TABLES, enable_row_security, row_security_enabled};

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Version number: the file's numeric prefix.
    pub version: i32,
    /// Name: the rest of the file name.
    pub name: &'static str,
    /// The file as written, with `{{schema}}` placeholders.
    pub template: &'static str,
}

impl Migration {
    /// SHA-256 of the file as written, in hex.
    pub fn checksum(&self) -> String {
        Sha256::digest(self.template.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Every migration this build carries, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        template: include_str!("../../sql/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "roles",
        template: include_str!("../../sql/0002_roles.sql"),
    },
    Migration {
        version: 3,
        name: "sharp_edges",
        template: include_str!("../../sql/0003_sharp_edges.sql"),
    },
    Migration {
        version: 4,
        name: "sequencer_lease",
        template: include_str!("../../sql/0004_sequencer_lease.sql"),
    },
    Migration {
        version: 5,
        name: "role_grants",
        template: include_str!("../../sql/0005_role_grants.sql"),
    },
    Migration {
        version: 6,
        name: "event_table_without_id_key",
        template: include_str!("../../sql/0006_event_table_without_id_key.sql"),
    },
    Migration {
        version: 7,
        name: "cheaper_checks",
        template: include_str!("../../sql/0007_cheaper_checks.sql"),
    },
    Migration {
        version: 8,
        name: "deleted_at_lower_bound",
        template: include_str!("../../sql/0008_deleted_at_lower_bound.sql"),
    },
    Migration {
        version: 9,
        name: "cursor_identity",
        template: include_str!("../../sql/0009_cursor_identity.sql"),
    },
    Migration {
        version: 10,
        name: "frontier_numbering",
        template: include_str!("../../sql/0010_frontier_numbering.sql"),
    },
    Migration {
        version: 11,
        name: "cursor_positions",
        template: include_str!("../../sql/0011_cursor_positions.sql"),
    },
    Migration {
        version: 12,
        name: "lease_renewals",
        template: include_str!("../../sql/0012_lease_renewals.sql"),
    },
    Migration {
        version: 13,
        name: "unsequenced_probe",
        template: include_str!("../../sql/0013_unsequenced_probe.sql"),
    },
    Migration {
        version: 14,
        name: "tick_function",
        template: include_str!("../../sql/0014_tick_function.sql"),
    },
    Migration {
        version: 15,
        name: "consumer_admin",
        template: include_str!("../../sql/0015_consumer_admin.sql"),
    },
    Migration {
        version: 16,
        name: "event_contracts",
        template: include_str!("../../sql/0016_event_contracts.sql"),
    },
    Migration {
        version: 17,
        name: "contract_checks",
        template: include_str!("../../sql/0017_contract_checks.sql"),
    },
    Migration {
        version: 18,
        name: "lane_receipts",
        template: include_str!("../../sql/0018_lane_receipts.sql"),
    },
];

/// What a migration run did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigrationReport {
    /// Versions applied by this run.
    pub applied: Vec<i32>,
    /// Versions that were already applied.
    pub already_applied: Vec<i32>,
}

/// Brings `schema` up to date.
pub async fn migrate(client: &mut Client, schema: &Schema) -> Result<MigrationReport, Error> {
    migrate_with(client, schema, MIGRATIONS).await
}

/// Applies `migrations` (tests use this to present a tampered file).
pub async fn migrate_with(
    client: &mut Client,
    schema: &Schema,
    migrations: &[Migration],
) -> Result<MigrationReport, Error> {
    let tx = client.transaction().await?;
    tx.execute_unnamed(sql::LOCK, &[&schema.lock_key("migrate")])
        .await?;
    tx.batch_execute(&schema.render(sql::MIGRATIONS_TABLE))
        .await?;
    refuse_foreign_table(&tx, schema).await?;
    let applied = tx
        .query_unnamed(&schema.render(sql::APPLIED_MIGRATIONS), &[])
        .await?;

    let mut report = MigrationReport {
        already_applied: verify_applied(&applied, migrations)?,
        ..MigrationReport::default()
    };

    for migration in migrations {
        if report.already_applied.contains(&migration.version) {
            continue;
        }
        tracing::info!(version = migration.version, name = migration.name, schema = %schema, "applying migration");
        tx.batch_execute(&schema.render(migration.template)).await?;
        tx.execute_unnamed(
            &schema.render(sql::RECORD_MIGRATION),
            &[&migration.version, &migration.name, &migration.checksum()],
        )
        .await?;
        report.applied.push(migration.version);
    }
    tx.commit().await?;
    Ok(report)
}

/// The versions of the recorded `applied` rows, each checked to be one of `migrations` and
/// unchanged since it was applied.
fn verify_applied(applied: &[Row], migrations: &[Migration]) -> Result<Vec<i32>, Error> {
    let mut versions = Vec::with_capacity(applied.len());
    for row in applied {
        let version: i32 = row.try_get("version")?;
        let name: String = row.try_get("name")?;
        let recorded: String = row.try_get("checksum")?;
        let Some(known) = migrations.iter().find(|m| m.version == version) else {
            return Err(Error::UnknownMigration { version, name });
        };
        let expected = known.checksum();
        if recorded != expected {
            return Err(Error::ChecksumMismatch {
                version,
                name,
                recorded,
                expected,
            });
        }
        versions.push(version);
    }
    Ok(versions)
}

/// Where a schema stands against this build's migrations, read without taking any lock.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SchemaVersion {
    /// Versions recorded in the database (empty when the schema was never migrated).
    pub applied: Vec<i32>,
    /// This build's migrations not yet applied, in order.
    pub pending: Vec<Migration>,
}

impl PartialEq for Migration {
    fn eq(&self, other: &Self) -> bool {
        self.version == other.version && self.name == other.name
    }
}

impl Eq for Migration {}

/// Reads which of this build's migrations `schema` lacks (for `migrate --dry-run`), checking
/// that every applied one is known and unchanged, as [`migrate`] would.
pub async fn schema_version(
    client: &(impl tokio_postgres::GenericClient + Sync),
    schema: &Schema,
) -> Result<SchemaVersion, Error> {
    let table = format!("{}.schema_migrations", schema.quoted());
    let exists: bool = client
        .query_one_unnamed(sql::TABLE_EXISTS, &[&table])
        .await?
        .try_get("present")?;
    let mut version = SchemaVersion::default();
    if exists {
        refuse_foreign_table(client, schema).await?;
        let rows = client
            .query_unnamed(&schema.render(sql::APPLIED_MIGRATIONS), &[])
            .await?;
        version.applied = verify_applied(&rows, MIGRATIONS)?;
    }
    version.pending = MIGRATIONS
        .iter()
        .filter(|m| !version.applied.contains(&m.version))
        .copied()
        .collect();
    Ok(version)
}

/// Refuses a `schema_migrations` table that is not this crate's (another tool's, in a shared
/// schema such as `public`), naming the collision instead of failing on its columns.
async fn refuse_foreign_table(
    client: &(impl tokio_postgres::GenericClient + Sync),
    schema: &Schema,
) -> Result<(), Error> {
    let table = format!("{}.schema_migrations", schema.quoted());
    let ours: bool = client
        .query_one_unnamed(sql::MIGRATIONS_TABLE_IS_OURS, &[&table])
        .await?
        .try_get("ours")?;
    match ours {
        true => Ok(()),
        false => Err(Error::ForeignMigrationsTable {
            schema: schema.name().to_owned(),
        }),
    }
}

/// Refuses to run against a schema this build does not match: one migrated by a newer build
/// (it may have changed what this code relies on), or one missing migrations this build
/// needs. Every command but `migrate` calls this first.
pub async fn check_schema_version(
    client: &(impl tokio_postgres::GenericClient + Sync),
    schema: &Schema,
) -> Result<(), Error> {
    let version = schema_version(client, schema).await?;
    if version.pending.is_empty() {
        return Ok(());
    }
    if version.applied.is_empty() {
        return Err(Error::NotMigrated {
            schema: schema.name().to_owned(),
        });
    }
    Err(Error::SchemaBehind {
        schema: schema.name().to_owned(),
        applied: version.applied.iter().copied().max().unwrap_or(0),
        needed: version.pending.iter().map(|m| m.version).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_increasing_and_checksums_stable() {
        let mut last = 0;
        for m in MIGRATIONS {
            assert!(m.version > last);
            last = m.version;
            assert_eq!(m.checksum().len(), 64);
            assert_eq!(m.checksum(), m.checksum());
            assert!(m.template.contains("{{schema}}"));
        }
    }
}
