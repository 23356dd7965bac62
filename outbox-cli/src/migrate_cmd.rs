//! `outbox migrate`.

use outbox_core::Schema;
use outbox_core::migrate::{MigrationReport, SchemaVersion};
use serde::Serialize;

use crate::cli::{Global, MigrateArgs};
use crate::failure::Failure;
use crate::output::{Render, print};

/// What a migration run did to one schema.
struct Migrated<'a> {
    /// The schema.
    schema: &'a Schema,
    /// The migrations applied now and earlier.
    report: MigrationReport,
    /// Whether per-project row security is on for the schema after the run (turned on now or
    /// earlier).
    row_security: bool,
}

/// The JSON form of [`Migrated`].
#[derive(Serialize)]
struct MigratedJson<'a> {
    schema: &'a str,
    applied: &'a [i32],
    already_applied: &'a [i32],
    row_security: bool,
}

impl Render for Migrated<'_> {
    fn table(&self) -> String {
        let mut text = if self.report.applied.is_empty() {
            format!(
                "schema {} is up to date ({} migration(s) applied earlier)\n",
                self.schema,
                self.report.already_applied.len()
            )
        } else {
            format!(
                "schema {}: applied migration(s) {:?}\n",
                self.schema, self.report.applied
            )
        };
        if self.row_security {
            text += &format!(
                "schema {}: per-project row security is on for its roles\n",
                self.schema
            );
        }
        text
    }

    fn json(&self) -> impl Serialize + '_ {
        MigratedJson {
            schema: self.schema.name(),
            applied: &self.report.applied,
            already_applied: &self.report.already_applied,
            row_security: self.row_security,
        }
    }
}

/// What `migrate --dry-run` found: the migrations it would apply.
struct DryRun<'a> {
    schema: &'a Schema,
    version: SchemaVersion,
}

/// One pending migration, in JSON.
#[derive(Serialize)]
struct PendingJson {
    version: i32,
    name: &'static str,
    checksum: String,
}

/// The JSON form of [`DryRun`].
#[derive(Serialize)]
struct DryRunJson<'a> {
    schema: &'a str,
    dry_run: bool,
    already_applied: &'a [i32],
    pending: Vec<PendingJson>,
}

impl Render for DryRun<'_> {
    fn table(&self) -> String {
        if self.version.pending.is_empty() {
            return format!(
                "schema {} is up to date ({} migration(s) applied); nothing to do\n",
                self.schema,
                self.version.applied.len()
            );
        }
        let mut text = format!(
            "schema {}: {} pending migration(s) (dry run, nothing applied):\n",
            self.schema,
            self.version.pending.len()
        );
        for m in &self.version.pending {
            text += &format!("  {:04}_{}\n", m.version, m.name);
        }
        text
    }

    fn json(&self) -> impl Serialize + '_ {
        DryRunJson {
            schema: self.schema.name(),
            dry_run: true,
            already_applied: &self.version.applied,
            pending: self
                .version
                .pending
                .iter()
                .map(|m| PendingJson {
                    version: m.version,
                    name: m.name,
                    checksum: m.checksum(),
                })
                .collect(),
        }
    }
}

pub async fn run(global: &Global, args: MigrateArgs) -> Result<(), Failure> {
    let mut database = global.database()?;
    // Migrate brings the schema to this build's version; it checks applied migrations itself.
    database.check_schema = None;
    let mut client = database.connect().await?;
    if args.dry_run {
        // Lists what `migrate` would apply, without taking its lock or changing anything;
        // refuses, as `migrate` would, a schema migrated by a newer build or with an altered
        // migration.
        let version = outbox_core::migrate::schema_version(&client, &global.schema).await?;
        return print(
            args.output,
            &DryRun {
                schema: &global.schema,
                version,
            },
        );
    }
    let report = outbox_core::migrate(&mut client, &global.schema).await?;
    if args.row_security {
        outbox_core::migrate::enable_row_security(&mut client, &global.schema).await?;
    }
    let row_security = outbox_core::migrate::row_security_enabled(&client, &global.schema).await?;
    print(
        args.output,
        &Migrated {
            schema: &global.schema,
            report,
            row_security,
        },
    )
}
