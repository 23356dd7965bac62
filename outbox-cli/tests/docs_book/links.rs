//! No dead relative link in the docs book or the README. mdBook 0.4 checks no links, so this
//! does: every relative link of `README.md` and of every page under `docs/src/` (with the
//! files it `{{#include}}`s expanded, since the book renders them as part of the page) must
//! name a file that exists, and an anchor (`#...`) into a Markdown file must be one of its
//! headings. A link from a book page must stay inside `docs/src/`: mdBook publishes nothing
//! else, so a link out of it is dead in the built book even when the file exists.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

fn repo() -> PathBuf {
    normalize(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
}

fn book_src() -> PathBuf {
    repo().join("docs/src")
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// A page's text as the book renders it: each `{{#include FILE}}` or `{{#include FILE:ANCHOR}}`
/// line replaced by that file (or the part between its `ANCHOR: x` and `ANCHOR_END: x` lines).
fn expanded(page: &Path) -> String {
    let dir = page.parent().expect("a page has a directory");
    let mut out = String::new();
    for line in read(page).lines() {
        let directive = line
            .trim()
            .strip_prefix("{{#include ")
            .and_then(|rest| rest.strip_suffix("}}"));
        let Some(directive) = directive else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let (file, anchor) = match directive.trim().split_once(':') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (directive.trim(), None),
        };
        let included = dir.join(file);
        assert!(
            included.is_file(),
            "{}: includes {file}, which does not exist",
            page.display()
        );
        let text = read(&included);
        match anchor {
            None => out.push_str(&text),
            Some(anchor) => {
                let start = format!("ANCHOR: {anchor}");
                let end = format!("ANCHOR_END: {anchor}");
                let part: Vec<&str> = text
                    .lines()
                    .skip_while(|l| !l.contains(&start))
                    .skip(1)
                    .take_while(|l| !l.contains(&end))
                    .collect();
                assert!(
                    text.contains(&start) && text.contains(&end) && !part.is_empty(),
                    "{}: includes {file}:{anchor}, but {file} has no such anchor",
                    page.display()
                );
                for l in part {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
        out.push('\n');
    }
    out
}

/// The lines outside fenced code blocks, inline code spans removed.
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut kept = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(part);
            }
        }
        out.push(kept);
    }
    out
}

/// The targets of the inline links and images `[text](target)` of a text.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(close) = after.find(')') else { break };
            let target = after[..close].split_whitespace().next().unwrap_or("");
            out.push(target.to_owned());
            rest = &after[close..];
        }
    }
    out
}

/// The anchor ids of a Markdown text's headings, as mdBook (and GitHub) make them: the
/// heading's text lower-cased, spaces as `-`, every character but letters, digits, `-` and `_`
/// dropped; a repeated id gets `-1`, `-2`, ...
fn heading_ids(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if fenced || hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let mut title = line[hashes..].trim().to_owned();
        // `[text](url)` reads as its text.
        while let (Some(open), Some(mid)) = (title.find('['), title.find("](")) {
            let Some(close) = title[mid..].find(')').map(|c| mid + c) else {
                break;
            };
            if open > mid {
                break;
            }
            title = format!(
                "{}{}{}",
                &title[..open],
                &title[open + 1..mid],
                &title[close + 1..]
            );
        }
        let id: String = title
            .chars()
            .filter_map(|c| {
                if c.is_alphanumeric() || c == '_' || c == '-' {
                    Some(c.to_lowercase().next().unwrap_or(c))
                } else if c.is_whitespace() {
                    Some('-')
                } else {
                    None
                }
            })
            .collect();
        let mut unique = id.clone();
        let mut n = 1;
        while ids.contains(&unique) {
            unique = format!("{id}-{n}");
            n += 1;
        }
        ids.insert(unique);
    }
    ids
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The text a link into `target` sees: a book page with its includes expanded.
fn rendered(target: &Path) -> String {
    if target.starts_with(book_src()) {
        expanded(target)
    } else {
        read(target)
    }
}

/// Every dead link of one page, described.
fn dead_links(page: &Path, in_book: bool) -> Vec<String> {
    let repo = repo();
    let shown = page
        .strip_prefix(&repo)
        .unwrap_or(page)
        .display()
        .to_string();
    let text = if in_book { expanded(page) } else { read(page) };
    let dir = page.parent().expect("a page has a directory");
    let mut dead = Vec::new();
    for target in link_targets(&text) {
        if target.is_empty() {
            dead.push(format!("{shown}: an empty link target"));
            continue;
        }
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, fragment) = match target.split_once('#') {
            Some((file, fragment)) => (file, Some(fragment)),
            None => (target.as_str(), None),
        };
        let resolved = if file.is_empty() {
            page.to_path_buf()
        } else {
            normalize(&dir.join(file))
        };
        if !resolved.exists() {
            dead.push(format!("{shown}: {target} names no file"));
            continue;
        }
        if in_book && !resolved.starts_with(book_src()) {
            dead.push(format!(
                "{shown}: {target} leaves docs/src/, which is all the built book holds \
                 (include the file into a page instead)"
            ));
            continue;
        }
        if let Some(fragment) = fragment {
            if resolved.is_file() && resolved.extension().is_some_and(|e| e == "md") {
                let ids = heading_ids(&rendered(&resolved));
                if !ids.contains(fragment) {
                    dead.push(format!(
                        "{shown}: {target}: no heading has the id #{fragment}"
                    ));
                }
            }
        }
    }
    dead
}

#[test]
fn no_relative_link_is_dead() {
    let repo = repo();
    let mut pages = Vec::new();
    markdown_files(&book_src(), &mut pages);
    assert!(
        pages.len() > 5,
        "the book's pages are missing under docs/src"
    );
    let mut dead = dead_links(&repo.join("README.md"), false);
    for page in &pages {
        dead.extend(dead_links(page, true));
    }
    assert!(dead.is_empty(), "dead links:\n  {}", dead.join("\n  "));
}

#[test]
fn every_page_is_in_the_summary() {
    let src = book_src();
    let summary = read(&src.join("SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = link_targets(&summary)
        .into_iter()
        .map(|target| normalize(&src.join(target)))
        .collect();
    let mut pages = Vec::new();
    markdown_files(&src, &mut pages);
    let missing: Vec<String> = pages
        .iter()
        .filter(|page| page.file_name().is_some_and(|n| n != "SUMMARY.md"))
        .filter(|page| !listed.contains(*page))
        .map(|page| {
            page.strip_prefix(&src)
                .unwrap_or(page)
                .display()
                .to_string()
        })
        .collect();
    assert!(
        missing.is_empty(),
        "pages under docs/src/ that SUMMARY.md does not list (mdBook would not build them): {missing:?}"
    );
}

#[test]
fn every_benchmark_results_file_is_a_page() {
    let repo = repo();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(repo.join("bench")).expect("read bench/") {
        let name = entry.expect("directory entry").file_name();
        let name = name.to_string_lossy();
        let Some(short) = name
            .strip_prefix("RESULTS-")
            .and_then(|rest| rest.strip_suffix(".md"))
        else {
            continue;
        };
        let page = book_src().join(format!("benchmarks/{short}.md"));
        let include = format!("{{{{#include ../../../bench/{name}}}}}");
        if !page.is_file() || !read(&page).contains(&include) {
            missing.push(format!("docs/src/benchmarks/{short}.md with `{include}`"));
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "a results file the book does not show; add (and list in SUMMARY.md): {missing:?}"
    );
}

#[test]
fn heading_ids_follow_mdbook() {
    let ids = heading_ids("# A `b` c\n## Shell completions and man pages\n## x\n## x\n");
    let expected: BTreeSet<String> = ["a-b-c", "shell-completions-and-man-pages", "x", "x-1"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(ids, expected);
}
