//! Command-line definitions (clap derive; doc comments are the help text).

use clap::{Args, Parser, Subcommand, ValueEnum};
use outbox_core::Schema;

use crate::db::DatabaseUrl;

/// Operate lifecycle-outbox: migrate, run consumers, inspect and repair.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, about)]
pub struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub global: Global,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Options shared by every command.
#[derive(Debug, Args)]
pub struct Global {
    /// PostgreSQL URL, e.g. postgresql://user@host:5432/db (or key=value form).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<DatabaseUrl>,
    /// Schema holding the outbox tables.
    #[arg(long, env = "OUTBOX_SCHEMA", global = true, default_value = "outbox")]
    pub schema: Schema,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How logs are written to stderr.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Output of read commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// An aligned table.
    Table,
    /// One JSON document.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the outbox schema (safe to run repeatedly and concurrently).
    Migrate(MigrateArgs),
    /// Number committed events (the consumer runtime does this too; use this to run the
    /// sequencer on its own or to drain a backlog).
    Sequence(SequenceArgs),
}

/// `outbox migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `outbox sequence`.
#[derive(Debug, Args)]
pub struct SequenceArgs {
    /// Keep running, ticking at this interval (e.g. 50ms); without it, drain once and exit.
    #[arg(long, value_parser = parse_duration)]
    pub every: Option<std::time::Duration>,
    /// Most events numbered per transaction.
    #[arg(long, default_value_t = outbox_core::DEFAULT_BATCH, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub batch_size: i64,
}

/// Parses a human duration ("250ms", "10s", "5m"); zero is refused.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(text)
        .map_err(|e| format!("invalid duration {text:?}: {e} (examples: 250ms, 10s, 5m)"))?;
    if d.is_zero() {
        return Err(format!("invalid duration {text:?}: must be greater than zero"));
    }
    Ok(d)
}

impl Global {
    /// The database URL, or a usage error naming both ways to give it.
    pub fn database(&self) -> Result<&DatabaseUrl, crate::failure::Failure> {
        self.database_url.as_ref().ok_or_else(|| {
            crate::failure::Failure::usage(
                "no database given: pass --database-url or set DATABASE_URL",
            )
        })
    }
}

impl Cli {
    /// Logs go to stderr, so stdout stays machine-readable.
    pub fn init_logging(&self) {
        let filter = tracing_subscriber::EnvFilter::try_from_env("OUTBOX_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tokio_postgres=warn"));
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        match self.global.log_format {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder.json().init(),
        }
    }
}
