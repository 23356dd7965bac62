//! `outbox completions SHELL` and `outbox man --dir DIR`: shell completions and man pages,
//! both generated from the clap definitions (`command.rs` hands the command tree in), so they
//! never drift from the flags the binary takes.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use clap_complete::Shell;

use crate::failure::Failure;

/// `outbox completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for; the script goes to stdout (see docs/src/operating.md, "Shell completions
    /// and man pages", for where each shell loads it from).
    #[arg(value_enum)]
    pub shell: Shell,
}

/// `outbox man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Directory to write the pages into (created when missing): `outbox.1` and one
    /// `outbox-COMMAND.1` per command and subcommand.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// Writes the completion script of `command` (the whole `outbox` tree) for `args.shell` to
/// stdout.
pub fn completions(args: CompletionsArgs, mut command: clap::Command) -> Result<(), Failure> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "outbox", &mut script);
    match std::io::stdout().write_all(&script) {
        // A reader that stopped early (`| head`) wanted no more.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Failure::runtime(format!(
            "cannot write the completion script: {e}"
        ))),
        _ => Ok(()),
    }
}

/// Writes every man page of `command` (the whole `outbox` tree) into `args.dir` and prints
/// each path written.
pub fn man(args: ManArgs, command: clap::Command) -> Result<(), Failure> {
    let dir = &args.dir;
    if dir.exists() && !dir.is_dir() {
        return Err(Failure::usage(format!(
            "--dir {}: exists and is not a directory",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::runtime(format!("cannot create {}: {e}", dir.display())))?;
    let mut command = command.disable_help_subcommand(true);
    command.build();
    let mut written = Vec::new();
    write_pages(&command, dir, &mut written).map_err(|e| {
        Failure::runtime(format!("cannot write man pages to {}: {e}", dir.display()))
    })?;
    let listing: String = written
        .iter()
        .map(|path| format!("{}\n", path.display()))
        .collect();
    crate::output::emit(&listing)
}

/// The page of `command`, then those of its subcommands, depth first.
fn write_pages(
    command: &clap::Command,
    dir: &std::path::Path,
    written: &mut Vec<PathBuf>,
) -> std::io::Result<()> {
    written.push(clap_mangen::Man::new(command.clone()).generate_to(dir)?);
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, written)?;
    }
    Ok(())
}
