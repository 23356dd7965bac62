//! `outbox`: the operator CLI of lifecycle-outbox.

#![forbid(unsafe_code)]
// Doc comments on options are the `--help` text, where `<prefix>` and `<task>` mean what they say.
#![allow(rustdoc::invalid_html_tags)]

mod args;
mod audit_cmd;
mod child;
mod cli;
mod command;
mod completions_cmd;
mod consume_cmd;
mod consumers_cmd;
mod contracts_cmd;
mod db;
mod dead_letters_cmd;
mod failure;
#[cfg(test)]
mod library_defaults;
mod lines_out;
mod migrate_cmd;
mod output;
mod progress;
mod prune_cmd;
mod relay;
mod sequence_cmd;
mod serve;
mod shutdown;
mod sink;
mod start;
mod status_cmd;
mod verify;
mod verify_cmd;

use clap::CommandFactory;

use crate::cli::LogFormat;
use crate::command::Command;

fn main() -> std::process::ExitCode {
    let cli = command::parse_or_exit();
    cli.init_logging();
    let log_format = cli.global.log_format;
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
        failure::set_permission_context(role, cli.command.action(), cli.command.spans_projects());
    }
    let result = runtime.block_on(async {
        match cli.command {
            Command::Migrate(args) => migrate_cmd::run(&cli.global, args).await,
            Command::Sequence(args) => sequence_cmd::run(&cli.global, args).await,
            Command::Consume(args) => consume_cmd::run(&cli.global, *args).await,
            Command::Prune(args) => prune_cmd::run(&cli.global, args).await,
            Command::Status(args) => status_cmd::run(&cli.global, args).await,
            Command::Consumers(command) => consumers_cmd::run(&cli.global, command).await,
            Command::Contracts(command) => contracts_cmd::run(&cli.global, command).await,
            Command::DeadLetters(command) => dead_letters_cmd::run(&cli.global, command).await,
            Command::Audit(args) => audit_cmd::run(&cli.global, args).await,
            Command::Relay(command) => relay::run(&cli.global, command).await,
            Command::Serve(args) => serve::run(&cli.global, *args).await,
            Command::Verify(args) => verify_cmd::run(&cli.global, args).await,
            Command::Completions(args) => {
                completions_cmd::completions(args, command::Cli::command())
            }
            Command::Man(args) => completions_cmd::man(args, command::Cli::command()),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(failure) => {
            failure.report(matches!(log_format, LogFormat::Json));
            std::process::ExitCode::from(failure.code as u8)
        }
    }
}
