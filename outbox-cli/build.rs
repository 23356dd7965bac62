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

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    let version = env!("CARGO_PKG_VERSION");
    let long = match &commit {
        Some(commit) => format!("{version} (commit {commit})"),
        None => format!("{version} (commit unknown: built outside a git checkout)"),
    };
    println!("cargo:rustc-env=OUTBOX_VERSION_LONG={long}");
    // Build again when HEAD moves: the file HEAD names, and the ref it points to.
    for path in ["HEAD", "refs/heads", "packed-refs"] {
        if let Some(file) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={file}");
        }
    }
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(file) = git(&["rev-parse", "--git-path", &reference]) {
            println!("cargo:rerun-if-changed={file}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
