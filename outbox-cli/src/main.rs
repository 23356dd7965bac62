//! `outbox`: the operator CLI of lifecycle-outbox.

#![forbid(unsafe_code)]
// Doc comments on options are the `--help` text, where `<prefix>` and `<task>` mean what they say.
#![allow(rustdoc::invalid_html_tags)]

mod args;
mod audit_cmd;
mod child;
mod cli;
mod consume_cmd;
mod consumers_cmd;
mod db;
mod dead_letters_cmd;
mod failure;
mod lines_out;
mod migrate_cmd;
mod output;
mod prune_cmd;
mod relay;
mod sequence_cmd;
mod serve;
mod shutdown;
mod sink;
mod start;
mod status_cmd;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cli.init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    if let Some(role) = cli.global.role() {
        failure::set_permission_context(role, cli.command.action());
    }
    let result = runtime.block_on(async {
        match cli.command {
            Command::Migrate(args) => migrate_cmd::run(&cli.global, args).await,
            Command::Sequence(args) => sequence_cmd::run(&cli.global, args).await,
            Command::Consume(args) => consume_cmd::run(&cli.global, *args).await,
            Command::Prune(args) => prune_cmd::run(&cli.global, args).await,
            Command::Status(args) => status_cmd::run(&cli.global, args).await,
            Command::Consumers(command) => consumers_cmd::run(&cli.global, command).await,
            Command::DeadLetters(command) => dead_letters_cmd::run(&cli.global, command).await,
            Command::Audit(args) => audit_cmd::run(&cli.global, args).await,
            Command::Relay(command) => relay::run(&cli.global, command).await,
            Command::Serve(args) => serve::run(&cli.global, *args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {failure}");
            std::process::ExitCode::from(failure.code as u8)
        }
    }
}
