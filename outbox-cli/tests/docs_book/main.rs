//! The docs book (`docs/`), checked as part of the test suite:
//!
//! - `docs/src/reference/cli.md`, the book's CLI reference: `outbox <command> --help` for every
//!   command and subcommand, as the built binary prints it, so the reference is clap's own text
//!   and cannot drift from the flags. The test fails when the committed page is not current;
//!   `OUTBOX_BLESS=1` rewrites it instead.
//! - [`generated`]: the metrics and SQL reference pages, generated from the code the same way.
//! - [`links`]: no relative link of the book or the README points at nothing.

mod generated;
mod links;

use std::path::PathBuf;
use std::process::Command;

/// The one command that regenerates the page.
const REGENERATE: &str = "OUTBOX_BLESS=1 cargo test -p outbox-cli --test docs_book cli_reference";

fn page_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference/cli.md")
}

/// `outbox ARGS... --help`, in a cleared environment: clap prints the value of a set `env`
/// variable (`DATABASE_URL`, say) beside its flag, which must not leak into the page.
fn help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .arg("--help")
        .env_clear()
        .env("COLUMNS", "100")
        .output()
        .expect("run outbox --help");
    assert!(
        output.status.success(),
        "outbox {} --help failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("--help is UTF-8")
}

/// The subcommands a help text lists under `Commands:`, without clap's own `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim_end() != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command path, depth first in the order `--help` lists them, with its help text.
fn walk(path: Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    let args: Vec<&str> = path.iter().map(String::as_str).collect();
    let text = help(&args);
    let children = subcommands(&text);
    out.push((path.clone(), text));
    for child in children {
        let mut next = path.clone();
        next.push(child);
        walk(next, out);
    }
}

fn render() -> String {
    let mut commands = Vec::new();
    walk(Vec::new(), &mut commands);
    let mut page = format!(
        "# CLI reference\n\n\
         <!-- Generated from the binary's clap definitions; do not edit by hand. Regenerate with:\n     \
         {REGENERATE} -->\n\n\
         Every command's `--help`, as `outbox` prints it. Shell completions and man pages are \
         generated from the same definitions (`outbox completions`, `outbox man`; see \
         [Operating](../operating.md#shell-completions-and-man-pages)).\n"
    );
    for (path, text) in commands {
        let name = std::iter::once("outbox".to_owned())
            .chain(path)
            .collect::<Vec<_>>()
            .join(" ");
        // clap pads its blank lines; the page keeps no trailing white space.
        let text: Vec<&str> = text.trim_end().lines().map(str::trim_end).collect();
        page.push_str(&format!(
            "\n## `{name}`\n\n```text\n{}\n```\n",
            text.join("\n")
        ));
    }
    page
}

#[test]
fn cli_reference_is_current() {
    let current = render();
    let path = page_path();
    if std::env::var("OUTBOX_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &current).expect("write docs/src/reference/cli.md");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
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
            "docs/src/reference/cli.md is not what `outbox --help` prints (first difference at \
             line {line}); regenerate it with `{REGENERATE}` and commit it"
        );
    }
}

#[test]
fn every_command_has_a_section() {
    let page = std::fs::read_to_string(page_path()).unwrap_or_default();
    for name in subcommands(&help(&[])) {
        assert!(
            page.contains(&format!("## `outbox {name}`")),
            "the CLI reference has no section for `outbox {name}`; regenerate it with `{REGENERATE}`"
        );
    }
}

/// The README is the short tour; the manual is the book. A README that grows past this is
/// taking the book's content back.
#[test]
fn readme_stays_short() {
    const MAX_LINES: usize = 250;
    let readme =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("read README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= MAX_LINES,
        "README.md has {lines} lines, over {MAX_LINES}: move the detail into a page of the docs \
         book (docs/src/) and link it"
    );
}
