//! `outbox migrate`.

use crate::cli::{Global, MigrateArgs, Output};
use crate::failure::Failure;

pub async fn run(global: &Global, args: MigrateArgs) -> Result<(), Failure> {
    let mut client = global.database()?.connect().await?;
    let report = outbox_core::migrate(&mut client, &global.schema).await?;
    match args.output {
        Output::Json => println!(
            "{}",
            serde_json::json!({
                "schema": global.schema.name(),
                "applied": report.applied,
                "already_applied": report.already_applied,
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
        }
    }
    Ok(())
}
