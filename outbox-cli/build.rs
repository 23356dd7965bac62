//! Stamps the commit the binary was built from into `outbox --version`, so an operator can
//! tell exactly which build runs (a version number alone names many builds in between).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .filter(|text| !text.is_empty())
}

/// The files whose change means the commit changed, and nothing more: this checkout's `HEAD`
/// (a checkout of another branch) and the one ref it points to (a commit on it); while that
/// ref is packed, `packed-refs` too (the next commit writes the loose file again, and Cargo
/// reruns a script whose watched file is missing, until then). Absolute paths (in the main
/// checkout `--git-path` answers relative to this directory), so that each names its file
/// wherever it is read. Never the whole `refs/heads`:
/// every branch's ref lives there (shared by every worktree of the repository), and a commit
/// on any of them would rebuild this binary.
fn watched() -> Vec<String> {
    let mut files: Vec<String> =
        git(&["rev-parse", "--path-format=absolute", "--git-path", "HEAD"])
            .into_iter()
            .collect();
    let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) else {
        return files; // a detached HEAD holds the commit itself
    };
    if let Some(loose) = git(&[
        "rev-parse",
        "--path-format=absolute",
        "--git-path",
        &reference,
    ]) {
        if !std::path::Path::new(&loose).is_file() {
            files.extend(git(&[
                "rev-parse",
                "--path-format=absolute",
                "--git-path",
                "packed-refs",
            ]));
        }
        files.push(loose);
    }
    files
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    let version = env!("CARGO_PKG_VERSION");
    let long = match &commit {
        Some(commit) => format!("{version} (commit {commit})"),
        None => format!("{version} (commit unknown: built outside a git checkout)"),
    };
    println!("cargo:rustc-env=OUTBOX_VERSION_LONG={long}");
    for file in watched() {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
