//! `outbox-consumer/sql/statements.sql`: every statement of [`super`] as the runtime sends it,
//! its macros expanded and rendered for the default schema, so that a reviewer reads SQL, not
//! macros. The test fails when the committed file is not current; `OUTBOX_BLESS=1` rewrites
//! it instead.

use outbox_core::Schema;

/// The committed rendering, relative to the crate.
const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/statements.sql");

/// The one command that regenerates the file.
const REGENERATE: &str = "OUTBOX_BLESS=1 cargo test -p outbox-consumer --lib statements_file";

/// The file's text: a header, then each statement under `-- NAME`, trimmed, with a closing
/// `;` so that the file reads (and parses) as SQL.
fn render() -> String {
    let schema = Schema::default();
    let mut out = format!(
        "-- Every statement the consumer runtime sends (outbox-consumer/src/sql.rs), its macros\n\
         -- expanded and rendered for the default schema `{schema}`; each ends with `;` here only.\n\
         -- Generated; do not edit by hand. Regenerate with:\n\
         --   {REGENERATE}\n"
    );
    for (name, template) in super::all() {
        out.push_str(&format!(
            "\n-- {name}\n{};\n",
            schema.render(template).trim()
        ));
    }
    out
}

/// The names of the `pub const` statements declared in `sql.rs` and `sql/`, sorted.
fn declared() -> Vec<&'static str> {
    let mut names: Vec<&str> = super::SOURCES
        .iter()
        .flat_map(|source| source.lines())
        .filter_map(|line| line.strip_prefix("pub const "))
        .filter_map(|rest| rest.split_once(": &str"))
        .map(|(name, _)| name)
        .collect();
    names.sort_unstable();
    names
}

#[test]
fn every_statement_is_listed() {
    let mut listed: Vec<&str> = super::all().into_iter().map(|(name, _)| name).collect();
    listed.sort_unstable();
    assert_eq!(
        listed,
        declared(),
        "sql::all() must list every statement of sql.rs and sql/, each once"
    );
}

/// Every file of `sql/` that may hold statements is one of [`super::SOURCES`], so a statement
/// in a new file cannot go unlisted.
#[test]
fn every_statement_file_is_a_source() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/sql");
    for entry in std::fs::read_dir(dir).expect("read src/sql") {
        let path = entry.expect("entry of src/sql").path();
        if path.extension().is_none_or(|e| e != "rs") || path.ends_with("statements_file.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read a file of src/sql");
        assert!(
            super::SOURCES.contains(&text.as_str()),
            "{} is not in sql::SOURCES",
            path.display()
        );
    }
}

#[test]
fn statements_file_is_current() {
    let current = render();
    if std::env::var("OUTBOX_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(PATH, &current).expect("write sql/statements.sql");
        return;
    }
    let committed = std::fs::read_to_string(PATH).unwrap_or_default();
    if committed != current {
        let line = committed
            .lines()
            .zip(current.lines())
            .position(|(a, b)| a != b)
            .map_or_else(
                || committed.lines().count().min(current.lines().count()) + 1,
                |i| i + 1,
            );
        panic!(
            "outbox-consumer/sql/statements.sql is not what sql.rs and sql/ send (first difference at \
             line {line}); regenerate it with `{REGENERATE}` and commit it"
        );
    }
}
