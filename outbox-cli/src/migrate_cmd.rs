//! `outbox migrate`.

use outbox_core::{MigrationReport, Schema};
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
}

/// The JSON form of [`Migrated`].
#[derive(Serialize)]
struct MigratedJson<'a> {
    schema: &'a str,
    applied: &'a [i32],
    already_applied: &'a [i32],
}

impl Render for Migrated<'_> {
    fn table(&self) -> String {
        if self.report.applied.is_empty() {
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
        }
    }

    fn json(&self) -> impl Serialize + '_ {
        MigratedJson {
            schema: self.schema.name(),
            applied: &self.report.applied,
            already_applied: &self.report.already_applied,
        }
    }
}

pub async fn run(global: &Global, args: MigrateArgs) -> Result<(), Failure> {
    let mut client = global.database()?.connect().await?;
    let report = outbox_core::migrate(&mut client, &global.schema).await?;
    print(
        args.output,
        &Migrated {
            schema: &global.schema,
            report,
        },
    )
}
