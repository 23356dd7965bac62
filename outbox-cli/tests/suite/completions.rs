//! `outbox completions SHELL` and `outbox man --dir DIR`: a script per shell (bash's loaded in
//! a real bash to complete a subcommand), and man pages that `man` renders without warnings.

use std::path::PathBuf;
use std::process::Command;

use outbox_tests::process_kit::{outbox_binary, run_outbox};

/// A directory of its own under the system's temporary directory.
fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("outbox-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test]
async fn a_completion_script_is_generated_for_each_shell() {
    let shells = [
        ("bash", "complete -F _outbox"),
        ("zsh", "#compdef outbox"),
        ("fish", "complete -c outbox"),
        ("elvish", "edit:completion:arg-completer[outbox]"),
        ("powershell", "Register-ArgumentCompleter"),
    ];
    for (shell, marker) in shells {
        let (code, script, stderr) = run_outbox(&["completions", shell]).await;
        assert_eq!(code, 0, "{shell}: {stderr}");
        assert!(script.contains(marker), "{shell} script lacks {marker:?}");
        for word in ["dead-letters", "consumer-id", "completions"] {
            assert!(script.contains(word), "{shell} script lacks {word:?}");
        }
    }
}

#[tokio::test]
async fn an_unknown_shell_is_refused_with_exit_2() {
    let (code, _, stderr) = run_outbox(&["completions", "tcsh"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("tcsh"), "{stderr}");
}

/// What bash's completion function offers for the words typed so far (the last one being
/// completed), with the script loaded as a user's shell would load it.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let script = r#"
source <("$OUTBOX" completions bash)
read -r -a COMP_WORDS <<< "$WORDS"
[ -n "$PARTIAL" ] || COMP_WORDS+=("")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMP_LINE="$WORDS"
COMP_POINT=${#COMP_LINE}
prev=""
[ "$COMP_CWORD" -gt 0 ] && prev=${COMP_WORDS[COMP_CWORD-1]}
_outbox outbox "${COMP_WORDS[COMP_CWORD]}" "$prev"
printf '%s\n' "${COMPREPLY[@]}"
"#;
    let output = Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("OUTBOX", outbox_binary())
        .env("WORDS", words.join(" "))
        .env("PARTIAL", if words.last() == Some(&"") { "" } else { "1" })
        .output()
        .expect("run bash (needed for this test)");
    assert!(
        output.status.success(),
        "bash failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn bash_loads_the_script_and_completes_a_subcommand() {
    assert_eq!(bash_completes(&["outbox", "dead-l"]), ["dead-letters"]);
    assert_eq!(
        bash_completes(&["outbox", "dead-letters", "rep"]),
        ["replay"]
    );
    let options = bash_completes(&["outbox", "relay", "nats", "--nats-u"]);
    assert_eq!(options, ["--nats-url", "--nats-user"]);
}

#[tokio::test]
async fn man_pages_are_written_for_every_command_and_render_without_warnings() {
    let dir = scratch_dir("man");
    let dir_text = dir.to_str().unwrap();
    let (code, listed, stderr) = run_outbox(&["man", "--dir", dir_text]).await;
    assert_eq!(code, 0, "{stderr}");
    let pages: Vec<&str> = listed.lines().collect();
    for name in [
        "outbox.1",
        "outbox-consume.1",
        "outbox-dead-letters-replay.1",
        "outbox-relay-nats.1",
        "outbox-serve.1",
        "outbox-man.1",
    ] {
        let path = dir.join(name);
        assert!(
            pages.contains(&path.to_str().unwrap()),
            "{name} not listed: {listed}"
        );
    }
    let on_disk = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(on_disk, pages.len(), "every page written is listed");
    for page in pages {
        // -ww: every groff warning; the page goes to a pipe, so man uses no pager.
        let output = Command::new("man")
            .args(["--warnings=w", "-E", "UTF-8", "-l", page])
            .env("MANWIDTH", "80")
            .output()
            .expect("run man (install man-db and groff: scripts/promtool.sh ensure)");
        let rendered = String::from_utf8_lossy(&output.stdout);
        let warnings = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "man {page}: {warnings}");
        assert!(warnings.trim().is_empty(), "man {page} warns:\n{warnings}");
        assert!(
            rendered.contains("NAME"),
            "man {page} rendered:\n{rendered}"
        );
    }
    let consume = std::fs::read_to_string(dir.join("outbox-consume.1")).unwrap();
    assert!(consume.contains("consumer\\-id"), "flags are documented");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn man_refuses_a_file_as_its_directory() {
    let file = scratch_dir("man-file");
    std::fs::write(&file, "not a directory").unwrap();
    let (code, _, stderr) = run_outbox(&["man", "--dir", file.to_str().unwrap()]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is not a directory"), "{stderr}");
    std::fs::remove_file(&file).unwrap();
}

/// The build script that stamps the commit into `outbox --version` reruns only when this
/// checkout's commit changes: it watches `HEAD` and the one ref `HEAD` points to, never a
/// directory of refs (every branch's commit, in every worktree, rebuilt the binary).
#[tokio::test]
async fn the_version_stamp_is_rebuilt_only_when_the_commit_changes() {
    let binary = outbox_binary();
    let build = binary.parent().unwrap().join("build");
    let newest = std::fs::read_dir(&build)
        .unwrap()
        .filter_map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name()?.to_str()?.to_owned();
            let output = path.join("output");
            (name.starts_with("outbox-cli-") && output.is_file()).then_some(output)
        })
        .max_by_key(|output| std::fs::metadata(output).unwrap().modified().unwrap())
        .expect("the outbox-cli build script ran");
    let text = std::fs::read_to_string(&newest).unwrap();
    let watched: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("cargo:rerun-if-changed="))
        .collect();
    assert!(watched.contains(&"build.rs"), "{text}");
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let head = git(&["rev-parse", "--git-path", "HEAD"]);
    let head = std::fs::canonicalize(&head).unwrap_or_else(|_| head.into());
    assert!(
        watched.iter().any(|w| std::path::Path::new(w) == head),
        "HEAD {} is watched: {watched:?}",
        head.display()
    );
    for file in watched {
        assert!(
            !std::path::Path::new(file).is_dir(),
            "{file} is a directory: a change to any ref in it would rebuild"
        );
    }
}
