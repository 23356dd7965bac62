//! The committed SQL a reviewer reads is current: `sql/schema.sql` is the schema the
//! migrations build, dumped from a freshly migrated database the way `scripts/schema.sh`
//! dumps it. `OUTBOX_BLESS=1` (which `bash scripts/schema.sh` sets) rewrites the file instead.

use std::path::{Path, PathBuf};
use std::process::Command;

use outbox_core::{Schema, migrate};
use outbox_tests::empty_db;

/// The one command that regenerates `sql/schema.sql`.
const REGENERATE: &str = "bash scripts/schema.sh";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where `committed` and `current` first differ, as a line number and the two lines.
fn first_difference(committed: &str, current: &str) -> String {
    let mut committed_lines = committed.lines();
    let mut current_lines = current.lines();
    for number in 1.. {
        match (committed_lines.next(), current_lines.next()) {
            (None, None) => break,
            (a, b) if a == b => {}
            (a, b) => {
                return format!(
                    "first difference at line {number}:\n  committed: {}\n  current:   {}",
                    a.unwrap_or("(end of file)"),
                    b.unwrap_or("(end of file)")
                );
            }
        }
    }
    "the files differ only in their line endings".to_owned()
}

#[tokio::test]
async fn schema_file_is_current() {
    let db = empty_db().await;
    let mut client = db.connect().await;
    migrate(&mut client, &Schema::default())
        .await
        .expect("migrate a fresh database");
    drop(client);

    let output = Command::new("bash")
        .arg(workspace().join("scripts/schema.sh"))
        .arg("dump")
        .arg(&db.url)
        .output()
        .expect("run scripts/schema.sh dump");
    assert!(
        output.status.success(),
        "scripts/schema.sh dump failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let current = String::from_utf8(output.stdout).expect("the dump is UTF-8");
    assert!(
        current.contains("CREATE TABLE outbox.lifecycle_outbox"),
        "the dump holds no event table:\n{current}"
    );

    let path = workspace().join("sql/schema.sql");
    if std::env::var("OUTBOX_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &current).expect("write sql/schema.sql");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == current,
        "sql/schema.sql is not the schema the migrations build; regenerate it with `{REGENERATE}` \
         and commit it ({})",
        first_difference(&committed, &current)
    );
}
