//! The command tree: `outbox` and its subcommands, each one's arguments from its own module,
//! and how the command line is parsed. The top of the crate's layers: it uses the commands'
//! argument types and the shared option groups (`cli.rs`); nothing uses it but `main.rs`.

use clap::{Parser, Subcommand};

use crate::cli::{ConsumeArgs, Global, LogFormat, MigrateArgs, SequenceArgs};

/// Operate lifecycle-outbox: migrate, run consumers, inspect and repair.
#[derive(Debug, Parser)]
#[command(name = "outbox", version = env!("OUTBOX_VERSION_LONG"), about)]
pub struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub global: Global,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Parses the command line, or prints the problem and exits 2 (0 for `--help`).
///
/// Clap suggests the subcommand closest in spelling, which for an action that is not a
/// subcommand is often its opposite (`consumers reactivate` -> `retire`). Those words get the
/// command that does what was asked instead.
pub fn parse_or_exit() -> Cli {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use clap::{CommandFactory, FromArgMatches};
    let parsed = Cli::command().try_get_matches().and_then(|matches| {
        crate::cli::record_given(&Cli::command(), &matches);
        Cli::from_arg_matches(&matches)
    });
    parsed.unwrap_or_else(|error| {
        if error.kind() == ErrorKind::InvalidSubcommand {
            if let Some(ContextValue::String(word)) = error.get(ContextKind::InvalidSubcommand) {
                if let Some(tip) = instead_of(word) {
                    eprintln!(
                        "error: unrecognized subcommand '{word}'\n\n  tip: {tip}\n\n\
                         For more information, try '--help'."
                    );
                    std::process::exit(2);
                }
            }
        }
        error.exit()
    })
}

/// What to run instead of a subcommand that does not exist, where clap's nearest spelling
/// would point to the opposite action.
fn instead_of(word: &str) -> Option<&'static str> {
    match word {
        "reactivate" | "unretire" | "activate" | "restore" | "resume" => Some(
            "a retired consumer is reactivated with: outbox consumers reactivate --project P \
             --consumer-id C --by OPERATOR --reason TEXT, or by starting it again with \
             outbox consume --project P --consumer-id C --reactivate (it reconciles first)",
        ),
        "unresolve" | "reopen" | "unpark" => Some(
            "a resolution is final and audited; to deliver a dead letter again, replay it before \
             resolving: outbox dead-letters replay",
        ),
        _ => None,
    }
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the outbox schema (safe to run repeatedly and concurrently).
    Migrate(MigrateArgs),
    /// Number committed events (the consumer runtime does this too; use this to run the
    /// sequencer on its own or to drain a backlog).
    #[command(after_help = crate::cli::DURATIONS_HELP)]
    Sequence(SequenceArgs),
    /// Run a durable consumer: one JSON line per delivered event on stdout (logs on stderr),
    /// or drive a long-lived child process with --child.
    #[command(after_help = crate::cli::DURATIONS_HELP)]
    Consume(Box<ConsumeArgs>),
    /// Remove events older than the retention period that every non-retired consumer has
    /// acknowledged, and settled dead letters, in short batches; prints what went.
    #[command(after_help = crate::cli::DURATIONS_HELP)]
    Prune(crate::prune_cmd::PruneArgs),
    /// Per project: head, unsequenced backlog, retention floor, pruning backlog; per consumer:
    /// cursor, lag, lease, retrying event, dead letters; each with health codes.
    #[command(after_help = crate::cli::DURATIONS_HELP)]
    Status(crate::status_cmd::StatusArgs),
    /// List, retire, reactivate or delete consumers.
    #[command(subcommand)]
    Consumers(crate::consumers_cmd::ConsumersCommand),
    /// The event contract registry: register, list, show, deprecate, retire and export the
    /// contracts of the event types the stream carries.
    #[command(subcommand)]
    Contracts(crate::contracts_cmd::ContractsCommand),
    /// List, show, replay or resolve dead letters.
    #[command(subcommand)]
    DeadLetters(crate::dead_letters_cmd::DeadLettersCommand),
    /// The audit trail: who parked, replayed, resolved or retired what, and when.
    Audit(crate::audit_cmd::AuditArgs),
    /// Relay a project's events into another system (NATS JetStream) for fan-out.
    #[command(subcommand)]
    Relay(crate::relay::RelayCommand),
    /// Run durable consumers (one per --project) and serve them over HTTP: an SSE event
    /// stream per project, Prometheus /metrics, /healthz and /readyz, and an operator
    /// dashboard at /.
    #[command(after_help = crate::cli::DURATIONS_HELP)]
    Serve(Box<crate::serve::ServeArgs>),
    /// Prove gap safety on this connection path (URL, pooler, TLS, role): concurrent probe
    /// transactions (some rolled back, some committed late) into a dedicated probe project,
    /// received by a probe consumer and checked for dense numbering, commit order, nothing
    /// missing, duplicated or rolled back; then cleaned up. Exit 5 names each failed check.
    #[command(after_help = crate::cli::DURATIONS_HELP)]
    Verify(crate::verify_cmd::VerifyArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions(crate::completions_cmd::CompletionsArgs),
    /// Write man pages for every command into a directory.
    Man(crate::completions_cmd::ManArgs),
}

impl Command {
    /// Whether what the command changes belongs to every project at once (the contract
    /// registry): under row security only a role bound to every project (`*`) may change it,
    /// which a refusal's hint says instead of naming one project.
    pub fn spans_projects(&self) -> bool {
        use crate::contracts_cmd::ContractsCommand as K;
        matches!(
            self,
            Command::Contracts(K::Add(_) | K::Deprecate(_) | K::Retire(_))
        )
    }

    /// What the command does, as in "role R may not ...".
    pub fn action(&self) -> &'static str {
        use crate::consumers_cmd::ConsumersCommand as C;
        use crate::contracts_cmd::ContractsCommand as K;
        use crate::dead_letters_cmd::DeadLettersCommand as D;
        match self {
            Command::Migrate(_) => "migrate the outbox schema",
            Command::Sequence(_) => "number events (outbox sequence)",
            Command::Consume(_) => "consume events (read events, move its cursor and lease)",
            Command::Prune(_) => "prune events and settled dead letters",
            Command::Status(_) => "read the outbox status",
            Command::Consumers(C::List(_)) => "list consumers",
            Command::Consumers(C::Retire(_)) => "retire consumers",
            Command::Consumers(C::Reactivate(_)) => "reactivate consumers",
            Command::Consumers(C::Delete(_)) => "delete retired consumers",
            Command::Contracts(K::List(_) | K::Show(_) | K::Export(_)) => "read event contracts",
            Command::Contracts(K::Add(_)) => "register event contracts",
            Command::Contracts(K::Deprecate(_) | K::Retire(_)) => "change event contracts",
            Command::DeadLetters(D::List(_) | D::Show(_)) => "read dead letters",
            Command::DeadLetters(D::Replay(_)) => "replay dead letters",
            Command::DeadLetters(D::Resolve(_)) => "resolve dead letters",
            Command::Audit(_) => "read the audit trail",
            Command::Relay(_) => "relay events (read events, move its cursor and lease)",
            Command::Serve(_) => "serve events (read events, move its cursor and lease)",
            Command::Verify(_) => {
                "verify gap safety (write probe events, consume them, retire and prune)"
            }
            Command::Completions(_) => "print shell completions",
            Command::Man(_) => "write man pages",
        }
    }
}

impl Cli {
    /// Logs go to stderr, so stdout stays machine-readable.
    pub fn init_logging(&self) {
        // async_nats is silenced: the relay lets each NATS client give up after its one
        // connection (relay/publisher.rs), which the client reports as an error, and the relay
        // logs the loss and its own reconnect instead. deadpool's warnings (a connection that
        // could not be recycled, one that broke) come once per pooled connection in an outage,
        // which the consumer runtime reports once for the process.
        let filter =
            tracing_subscriber::EnvFilter::try_from_env("OUTBOX_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(
                    "info,tokio_postgres=warn,deadpool=error,async_nats=off",
                )
            });
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr);
        match self.global.log_format {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder.json().init(),
        }
    }
}
