//! `outbox migrate`.

use crate::cli::{Global, MigrateArgs, Output};
use crate::failure::Failure;

pub async fn run(global: &Global, args: MigrateArgs) -> Result<(), Failure> {
    let mut database = global.database()?;
    // Migrate brings the schema to this build's version; it checks applied migrations itself.
    database.check_schema = None;
    let mut client = database.connect().await?;
    if args.dry_run {
        return dry_run(global, &client, args.output).await;
    }
    let report = outbox_core::migrate(&mut client, &global.schema).await?;
    if args.row_security {
        outbox_core::enable_row_security(&mut client, &global.schema).await?;
    }
    match args.output {
        Output::Json => println!(
            "{}",
            serde_json::json!({
                "schema": global.schema.name(),
                "applied": report.applied,
                "already_applied": report.already_applied,
                "row_security": args.row_security,
            })
        ),
        Output::Table => {
            if report.applied.is_empty() {
                println!(
                    "schema {} is up to date ({} migration(s) applied earlier)",
                    global.schema,
                    report.already_applied.len()
                );
            } else {
                println!(
                    "schema {}: applied migration(s) {:?}",
                    global.schema, report.applied
                );
            }
            if args.row_security {
                println!(
                    "schema {}: per-project row security is on for its roles",
                    global.schema
                );
            }
        }
    }
    Ok(())
}

/// Lists what `migrate` would apply, without taking its lock or changing anything; refuses,
/// as `migrate` would, a schema migrated by a newer build or with an altered migration.
async fn dry_run(
    global: &Global,
    client: &tokio_postgres::Client,
    output: Output,
) -> Result<(), Failure> {
    let version = outbox_core::schema_version(client, &global.schema).await?;
    match output {
        Output::Json => println!(
            "{}",
            serde_json::json!({
                "schema": global.schema.name(),
                "dry_run": true,
                "already_applied": version.applied,
                "pending": version.pending.iter().map(|m| serde_json::json!({
                    "version": m.version,
                    "name": m.name,
                    "checksum": m.checksum(),
                })).collect::<Vec<_>>(),
            })
        ),
        Output::Table => {
            if version.pending.is_empty() {
                println!(
                    "schema {} is up to date ({} migration(s) applied); nothing to do",
                    global.schema,
                    version.applied.len()
                );
            } else {
                println!(
                    "schema {}: {} pending migration(s) (dry run, nothing applied):",
                    global.schema,
                    version.pending.len()
                );
                for m in &version.pending {
                    println!("  {:04}_{}", m.version, m.name);
                }
            }
        }
    }
    Ok(())
}
