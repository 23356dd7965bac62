//! The book's reference pages generated from the code, each checked current like the CLI
//! reference (`OUTBOX_BLESS=1` rewrites them):
//!
//! - `docs/src/reference/metrics.md`: every metric the crates record, from their `metric::ALL`
//!   lists (the same name, type and help text `/metrics` shows);
//! - `docs/src/reference/sql.md`: every function of the schema as `sql/schema.sql` (itself
//!   generated from a migrated database) defines it, with the roles that may call it.

use std::path::PathBuf;

use outbox_consumer::metric::{Kind, Metric};

const REGENERATE: &str = "OUTBOX_BLESS=1 cargo test -p outbox-cli --test docs_book generated";

fn repository(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

/// Fails unless the committed page at `path` is `current`; with `OUTBOX_BLESS=1`, writes it.
fn check_current(path: &str, current: &str) {
    let file = repository(path);
    if std::env::var("OUTBOX_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&file, current).unwrap_or_else(|e| panic!("write {path}: {e}"));
        return;
    }
    let committed = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        committed == current,
        "{path} is not current; regenerate it with `{REGENERATE}` and commit it"
    );
}

fn kind(kind: Kind) -> &'static str {
    match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
        Kind::Histogram => "histogram",
    }
}

fn metrics_page() -> String {
    let crates: [(&str, &str, &[Metric]); 3] = [
        (
            "Consumers",
            "every consuming command (`consume`, `serve`, `relay nats`) and the library",
            outbox_consumer::metric::ALL,
        ),
        ("Live surfaces", "`outbox serve`", outbox_serve::metric::ALL),
        (
            "The relay",
            "`outbox relay nats`",
            outbox_relay::metric::ALL,
        ),
    ];
    let mut page = format!(
        "# Metrics\n\n\
         <!-- Generated from the crates' metric lists; do not edit by hand. Regenerate with:\n     \
         {REGENERATE} -->\n\n\
         What `--metrics-addr` (and `outbox serve`'s `/metrics`) exports, in Prometheus' text \
         format, with the help text it carries there. Labels, alerts and dashboards are in \
         [Operating](../operating.md).\n"
    );
    for (title, who, metrics) in crates {
        page.push_str(&format!(
            "\n## {title}\n\nRecorded by {who}.\n\n| metric | type | what it measures |\n|---|---|---|\n"
        ));
        for metric in metrics {
            page.push_str(&format!(
                "| `{}` | {} | {} |\n",
                metric.name,
                kind(metric.kind),
                metric.help.replace('|', "\\|")
            ));
        }
    }
    page
}

/// One function of the schema: its `CREATE FUNCTION` line and the roles granted it.
struct Function {
    signature: String,
    granted: Vec<String>,
}

/// The functions of `sql/schema.sql`, in its order, and who may call each: `pg_dump` writes a
/// `REVOKE ... FROM PUBLIC` for those closed to every role but their owner and the granted
/// ones, and nothing for those left to PUBLIC.
fn functions(schema: &str) -> Vec<Function> {
    let mut out: Vec<Function> = schema
        .lines()
        .filter_map(|line| line.strip_prefix("CREATE FUNCTION "))
        .map(|signature| Function {
            signature: signature.to_owned(),
            granted: Vec::new(),
        })
        .collect();
    for function in &mut out {
        let name = function
            .signature
            .split('(')
            .next()
            .expect("a function name");
        let on = format!(" ON FUNCTION {name}(");
        let revoked = schema
            .lines()
            .any(|l| l.starts_with("REVOKE ALL") && l.contains(&on));
        let mut granted: Vec<String> = schema
            .lines()
            .filter(|l| l.starts_with("GRANT ALL") && l.contains(&on))
            .filter_map(|l| l.rsplit(" TO ").next())
            .map(|role| role.trim_end_matches(';').to_owned())
            .collect();
        if !revoked {
            granted.insert(0, "PUBLIC".to_owned());
        }
        function.granted = granted;
    }
    out
}

fn sql_page() -> String {
    let schema =
        std::fs::read_to_string(repository("sql/schema.sql")).expect("read sql/schema.sql");
    let mut page = format!(
        "# SQL API\n\n\
         <!-- Generated from sql/schema.sql; do not edit by hand. Regenerate with:\n     \
         {REGENERATE} -->\n\n\
         The functions of the schema (`outbox` by default) as the migrations leave them. A \
         service writes with `write_task_deleted` or `write_event` inside its own transaction \
         ([Writing events](../writing.md), [Event contracts](../contracts.md)); \
         `payload_is_valid` is the check `write_event` runs, generated from the contract \
         registry. The others serve the schema itself (payload checks, the sequencer's tick, \
         row security) and are called by the runtime, not by services. The whole schema, \
         tables and views included, is `sql/schema.sql` in the repository.\n\n\
         PUBLIC below is PostgreSQL's default for a function: every role that may use the \
         schema, which the migrations grant to the `outbox_writer`, `outbox_consumer` and \
         `outbox_operator` roles only ([Deploying](../deploying.md)).\n\n\
         | function | may be called by |\n|---|---|\n"
    );
    for function in functions(&schema) {
        let callers = if function.granted.is_empty() {
            "its owner only".to_owned()
        } else {
            function.granted.join(", ")
        };
        page.push_str(&format!(
            "| `{}` | {} |\n",
            function.signature.replace('|', "\\|"),
            callers
        ));
    }
    page
}

#[test]
fn generated_metrics_reference_is_current() {
    check_current("docs/src/reference/metrics.md", &metrics_page());
}

#[test]
fn generated_sql_reference_is_current() {
    check_current("docs/src/reference/sql.md", &sql_page());
}

#[test]
fn the_sql_reference_names_the_writers_and_their_role() {
    let page = sql_page();
    for writer in ["outbox.write_task_deleted(", "outbox.write_event("] {
        let row = page
            .lines()
            .find(|l| l.contains(writer))
            .unwrap_or_else(|| panic!("{writer} is not in the SQL reference"));
        assert!(row.contains("outbox_writer"), "{row}");
    }
}
