//! The option groups the commands share (clap derive; doc comments are the help text): the
//! global options, the output and log formats, `migrate`'s and `sequence`'s arguments, the
//! options of every command that runs consumers, and the duration rules (`cli/durations.rs`).
//! The command tree itself is `command.rs`, which uses these; nothing here uses a command.

use clap::{Args, ValueEnum};
use std::time::Duration;

use outbox_core::{ConsumerId, ProjectId, Schema};

use crate::db::DatabaseUrl;

mod durations;
pub use durations::{
    DURATIONS_HELP, human, parse_duration, parse_long_duration, parse_retention, parse_tick_pause,
    parse_up_to,
};

/// Options shared by every command.
#[derive(Debug, Args)]
pub struct Global {
    // Kept as text and parsed by `Global::database`, so that a parse error never echoes a
    // password back. DATABASE_URL is read there too (not through clap), so usage lines never
    // list this option as missing when the variable is set.
    /// PostgreSQL URL, e.g. postgresql://user@host:5432/db (or key=value form). Defaults to
    /// DATABASE_URL; without either, the libpq variables (PGHOST, PGPORT, PGUSER, PGDATABASE,
    /// PGPASSWORD) describe the connection. A missing password comes from PGPASSFILE or
    /// ~/.pgpass.
    #[arg(long, global = true)]
    pub database_url: Option<String>,
    /// Schema holding the outbox tables: 1 to 40 characters from a-z, 0-9 and _, starting with
    /// a letter or _ (an empty OUTBOX_SCHEMA means the default).
    #[arg(long, env = "OUTBOX_SCHEMA", global = true, default_value = outbox_core::schema::DEFAULT_SCHEMA, value_parser = parse_schema)]
    pub schema: Schema,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// A pooler between this process and PostgreSQL: `transaction` for PgBouncer (or alike) in
    /// transaction mode: no session state, unnamed statements only, and no LISTEN (consumers
    /// poll). TLS settings go in the URL (sslmode, sslrootcert, sslcert, sslkey) or PGSSLMODE
    /// and PGSSLROOTCERT.
    #[arg(long, env = "OUTBOX_POOLER", global = true, value_enum, default_value_t = PoolerArg::None)]
    pub pooler: PoolerArg,
}

/// `--pooler`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PoolerArg {
    /// A direct connection (or a session-mode pooler).
    None,
    /// A transaction-mode pooler such as PgBouncer with `pool_mode = transaction`.
    Transaction,
}

impl From<PoolerArg> for outbox_core::connect::Pooler {
    fn from(arg: PoolerArg) -> Self {
        match arg {
            PoolerArg::None => outbox_core::connect::Pooler::None,
            PoolerArg::Transaction => outbox_core::connect::Pooler::Transaction,
        }
    }
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

/// `outbox migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// List the pending migrations and change nothing.
    #[arg(long, conflicts_with = "row_security")]
    pub dry_run: bool,
    /// Also enable per-project row security: the schema's writer, consumer and operator
    /// roles then see and write only the projects bound to them in lifecycle_role_projects
    /// (see docs/src/deploying.md). Idempotent.
    #[arg(long)]
    pub row_security: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `outbox sequence`.
#[derive(Debug, Args)]
pub struct SequenceArgs {
    /// Keep running as a candidate in the sequencer election; while elected, tick nearly back
    /// to back while events arrive (see --max-tick-pause) and at most this far apart when idle
    /// (e.g. 50ms). Without it, drain
    /// once and exit (no election; safe beside a running sequencer).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration)]
    pub every: Option<std::time::Duration>,
    /// Length of the sequencer lease with --every (at least 500ms); a dead sequencer is
    /// replaced within 1.25 times this.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "10s", requires = "every")]
    pub lease_ttl: std::time::Duration,
    /// With --every: the longest pause after a tick that numbered events, 0s to 100ms (0s:
    /// tick again at once). The pause is 50µs per event the tick numbered, so a light stream is
    /// numbered back to back and a saturated one in fewer, larger ticks.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = parse_tick_pause, default_value = "2ms", requires = "every")]
    pub max_tick_pause: std::time::Duration,
    /// With --every: the shortest pause after a tick that numbered events, 0s to 100ms (raises
    /// --max-tick-pause to itself): fewer, larger ticks at moderate rates, for up to this much
    /// more wait for a number.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = parse_tick_pause, default_value = "0s", requires = "every")]
    pub min_tick_pause: std::time::Duration,
    /// Most events numbered per transaction: 1 to 1000000.
    #[arg(long, default_value_t = outbox_core::sequencer::DEFAULT_BATCH, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub batch_size: i64,
    /// Output format of a single drain (with --every nothing is printed; logs go to stderr).
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// With --every: exit (code 1) once the database has been unavailable this long; by
    /// default the process waits for the database however long it takes.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = parse_long_duration, requires = "every")]
    pub give_up_after: Option<std::time::Duration>,
}

/// The long IDs of the options given on the command line or in the environment (not left at
/// their default), recorded once as the command line is parsed: an error about an option's
/// value names the option the user typed, and a default the user never set as a default.
static GIVEN: std::sync::OnceLock<std::collections::BTreeSet<String>> = std::sync::OnceLock::new();

/// Records which options of `command` (and of the subcommand chosen) `matches` got from the
/// command line or the environment.
pub fn record_given(command: &clap::Command, matches: &clap::ArgMatches) {
    fn walk(
        command: &clap::Command,
        matches: &clap::ArgMatches,
        given: &mut std::collections::BTreeSet<String>,
    ) {
        use clap::parser::ValueSource;
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            // `try_contains_id` first: `value_source` panics on an ID it does not know.
            if matches.try_contains_id(id).unwrap_or(false)
                && matches!(
                    matches.value_source(id),
                    Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                )
            {
                given.insert(id.to_owned());
            }
        }
        if let Some((name, sub)) = matches.subcommand() {
            if let Some(sub_command) = command.find_subcommand(name) {
                walk(sub_command, sub, given);
            }
        }
    }
    let mut given = std::collections::BTreeSet::new();
    walk(command, matches, &mut given);
    let _ = GIVEN.set(given);
}

/// Whether option `id` (its field name, `heartbeat_interval`) was given rather than left at
/// its default.
pub fn given(id: &str) -> bool {
    GIVEN.get().is_some_and(|given| given.contains(id))
}

/// Refuses a `--min-tick-pause` longer than the slowest idle tick, option `idle_id`
/// (`sequence_interval` for a consumer process, `every` for `outbox sequence`).
pub fn check_min_tick_pause(pause: Duration, idle_id: &str, idle: Duration) -> Result<(), String> {
    if pause <= idle {
        return Ok(());
    }
    Err(format!(
        "{} is longer than {}: the pause after a busy tick must not exceed the slowest idle tick",
        flag_value("min_tick_pause", &human(pause)),
        flag_value(idle_id, &human(idle)),
    ))
}

/// `--flag VALUE` for a given option, `--flag VALUE (the default)` for one left alone.
pub fn flag_value(id: &str, value: &str) -> String {
    let flag = format!("--{}", id.replace('_', "-"));
    match given(id) {
        true => format!("{flag} {value}"),
        false => format!("{flag} {value} (the default)"),
    }
}

/// A schema name; empty (an empty OUTBOX_SCHEMA, say) means the default.
fn parse_schema(text: &str) -> Result<Schema, String> {
    if text.is_empty() {
        return Ok(Schema::default());
    }
    text.parse::<Schema>().map_err(|e| e.to_string())
}

impl Global {
    /// The database: --database-url, else DATABASE_URL, else the libpq variables; or a usage
    /// error naming the ways to give it.
    pub fn database(&self) -> Result<DatabaseUrl, crate::failure::Failure> {
        let env = |name: &str| std::env::var(name).ok();
        let text = self
            .database_url
            .clone()
            .or_else(|| env("DATABASE_URL").filter(|v| !v.is_empty()));
        let mut database = match text {
            Some(text) => text
                .parse::<DatabaseUrl>()
                .map_err(crate::failure::Failure::usage)?,
            None => DatabaseUrl::from_libpq_env(env)?,
        };
        if let Some(path) = outbox_core::connect::libpq_env::passfile_path(env) {
            outbox_core::connect::libpq_env::apply_passfile(&mut database.settings.config, &path);
        }
        database.check_schema = Some(self.schema.clone());
        Ok(database.with_pooler(self.pooler.into()))
    }

    /// The role this process connects as, for messages; `None` when no valid database is
    /// given (the command then fails on that first).
    pub fn role(&self) -> Option<String> {
        let database = self.database().ok()?;
        database.settings.config.get_user().map(str::to_owned)
    }
}

/// Where a consumer without a cursor starts.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StartFromArg {
    /// Reconcile from the live task set, then follow new events.
    Reconcile,
    /// Replay retained history from the first event (reconciles if history was pruned).
    Earliest,
}

/// Which consumers `outbox consume` runs: every consumer ID for every project. One project
/// and one ID is a lone consumer; anything more is a consumer set in one process.
#[derive(Debug, Clone, Args)]
pub struct ConsumeTargets {
    /// The project to consume; repeat it to consume several in one process.
    #[arg(
        long = "project",
        value_name = "PROJECT",
        required_unless_present = "all_projects"
    )]
    pub projects: Vec<ProjectId>,
    /// Follow every project, including projects whose first event is numbered while this
    /// process runs (found by the fallback poll, and sooner by their first notification).
    #[arg(long, conflicts_with = "projects")]
    pub all_projects: bool,
    /// The consumer's explicit, stable ID (never generated); repeat it to run several
    /// consumers of each project.
    #[arg(long = "consumer-id", value_name = "CONSUMER_ID", required = true)]
    pub consumer_ids: Vec<ConsumerId>,
}

impl ConsumeTargets {
    /// Refuses a project or consumer ID given twice: the process would run one pair twice,
    /// its two copies competing for one lease.
    pub fn check_distinct(&self) -> Result<(), String> {
        fn first_repeat<T: Ord + std::fmt::Display>(items: &[T]) -> Option<&T> {
            let mut seen = std::collections::BTreeSet::new();
            items.iter().find(|item| !seen.insert(*item))
        }
        if let Some(project) = first_repeat(&self.projects) {
            return Err(format!("--project {project} is given twice"));
        }
        if let Some(consumer) = first_repeat(&self.consumer_ids) {
            return Err(format!("--consumer-id {consumer} is given twice"));
        }
        Ok(())
    }

    /// The one (project, consumer) pair, when that is all that was asked for.
    pub fn single(&self) -> Option<(&ProjectId, &ConsumerId)> {
        match (
            self.all_projects,
            &self.projects[..],
            &self.consumer_ids[..],
        ) {
            (false, [project], [consumer]) => Some((project, consumer)),
            _ => None,
        }
    }
}

/// `outbox consume`.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// The consumers to run (`--project`, `--all-projects`, `--consumer-id`).
    #[command(flatten)]
    pub targets: ConsumeTargets,
    /// The child-process handler (`--child`).
    #[command(flatten)]
    pub child: ChildOptions,
    /// Key-level parallelism (`--lanes`, `--max-ahead`).
    #[command(flatten)]
    pub lanes: LaneOptions,
    /// How they run.
    #[command(flatten)]
    pub options: ConsumerOptions,
}

impl ConsumerOptions {
    /// The relations between options, each refusal naming the options as typed (a default
    /// the user never set is named as one), with the range that would be accepted. The
    /// runtime checks the same relations again (`DeliverySettings::validate`), in its own
    /// words.
    pub fn check_relations(&self) -> Result<(), String> {
        let min_lease = Duration::from_secs(1);
        if self.lease_ttl < min_lease {
            return Err(format!(
                "{} is too short: the lease lasts at least 1s",
                flag_value("lease_ttl", &human(self.lease_ttl))
            ));
        }
        if self.heartbeat_interval * 2 > self.lease_ttl {
            return Err(format!(
                "{} must be at most half of {}: give --heartbeat-interval {} or less, or a \
                 longer --lease-ttl",
                flag_value("heartbeat_interval", &human(self.heartbeat_interval)),
                flag_value("lease_ttl", &human(self.lease_ttl)),
                human(self.lease_ttl / 2),
            ));
        }
        if self.sequencer_lease_ttl < outbox_core::sequencer::MIN_SEQUENCER_LEASE_TTL {
            return Err(format!(
                "{} is too short: the sequencer lease lasts at least {}",
                flag_value("sequencer_lease_ttl", &human(self.sequencer_lease_ttl)),
                human(outbox_core::sequencer::MIN_SEQUENCER_LEASE_TTL)
            ));
        }
        Ok(())
    }
}

impl ConsumeArgs {
    /// The checks of the targets against each other and against the options: a repeated
    /// project or consumer ID; `--existing-only` with `--all-projects`, which registers its
    /// consumers in every project born while it runs.
    pub fn check(&self) -> Result<(), String> {
        self.targets.check_distinct()?;
        if self.targets.all_projects && self.options.existing_only {
            return Err(
                "--existing-only cannot be used with --all-projects, which registers its \
                        consumers in every new project; name the projects with --project"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The child-process handler of `outbox consume` and `outbox serve` (`outbox relay nats` has
/// none: its handler is the JetStream publisher, so it does not offer these).
#[derive(Debug, Args)]
pub struct ChildOptions {
    /// Drive this command (run with sh -c, in its own process group): one event line on its
    /// stdin, one answer line on its stdout per event: {"ack": SEQ} or {"fail": SEQ, "class":
    /// "code"} with class matching [a-z0-9_]{1,64}. Stdout carries answers only (log to
    /// stderr). With --lanes above 1, up to that many events (each of another task) are out
    /// with it at once, answered in any order. A timeout, restart or shutdown ends the
    /// child's whole process group: SIGTERM, then SIGKILL after --child-stop-grace.
    #[arg(long, value_name = "COMMAND")]
    pub child: Option<String>,
    /// How long the child may take to answer one line.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "60s")]
    pub child_timeout: Duration,
    /// How long the child's process group has between SIGTERM and SIGKILL.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "5s")]
    pub child_stop_grace: Duration,
}

/// Key-level parallelism of `outbox consume` and `outbox serve` (`outbox relay nats` keeps
/// one lane: a NATS subject is a project, and its order is the stream's).
#[derive(Debug, Args)]
pub struct LaneOptions {
    /// Events of one project handled at once, each of a different task (the event's subject):
    /// a task's events are never handled concurrently nor out of order. 1 (the default)
    /// handles the stream one event at a time. 1 to 256.
    #[arg(long, default_value_t = 1, value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(u16).range(1..=outbox_consumer::config::MAX_LANES as i64))]
    pub lanes: u16,
    /// With --lanes above 1: how far beyond the cursor lanes may run, in events. The cursor
    /// moves only over events all handled (or parked); a crash repeats at most this many.
    /// At least --batch-size, at most 100000.
    #[arg(long, default_value_t = outbox_consumer::config::DEFAULT_MAX_AHEAD, value_name = "EVENTS", allow_negative_numbers = true)]
    pub max_ahead: i64,
}

impl LaneOptions {
    /// Sets the lanes of `delivery`, checked against its batch size.
    pub fn apply(&self, delivery: &mut outbox_consumer::DeliverySettings) -> Result<(), String> {
        if self.lanes > 1 {
            if self.max_ahead < delivery.batch_size {
                return Err(format!(
                    "--max-ahead {} is smaller than --batch-size {}: lanes read a batch at a \
                     time ahead of the cursor",
                    self.max_ahead, delivery.batch_size
                ));
            }
            if self.max_ahead > outbox_consumer::config::MAX_AHEAD_CEILING {
                return Err(format!(
                    "--max-ahead {} is above the ceiling of {}: the events ahead are held in \
                     memory",
                    self.max_ahead,
                    outbox_consumer::config::MAX_AHEAD_CEILING
                ));
            }
        }
        delivery.lanes = usize::from(self.lanes);
        delivery.max_ahead = self.max_ahead;
        delivery.validate().map_err(|e| e.to_string())
    }
}

/// Every option of a running consumer beside which one it is and its child handler
/// ([`ChildOptions`]): `outbox consume`, `outbox relay nats` and `outbox serve` (which takes
/// `--project` repeated) share them.
#[derive(Debug, Args)]
pub struct ConsumerOptions {
    /// The event types and majors handled, comma-separated (`task:deleted@1,task:archived@1`;
    /// see `outbox contracts list`). An event of another type passes without being handled
    /// (counted in outbox_events_skipped_total); one of a named type in another major is
    /// parked at once as a contract_mismatch dead letter. Each must be registered.
    #[arg(long, value_name = "TYPE@MAJOR,...", default_value = "task:deleted@1")]
    pub event_types: outbox_core::contract::EventTypes,
    /// Poll only; no LISTEN connection (implied by `--pooler transaction`).
    #[arg(long)]
    pub no_listen: bool,
    /// Connections in the pool, shared by every consumer of the process (which holds one
    /// more, for LISTEN): 3 to 100.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true, value_parser = clap::value_parser!(u16).range(outbox_consumer::config::MIN_POOL_SIZE as i64..=100))]
    pub pool_size: u16,
    /// Exit at once (code 4) if another process holds this consumer's lease.
    #[arg(long)]
    pub no_wait: bool,
    /// Start a retired consumer again; it reconciles first.
    #[arg(long)]
    pub reactivate: bool,
    /// Refuse (exit 3) to register a consumer ID that does not exist yet, instead of creating
    /// it: for production units, where a new ID is a typo that would hold retention back.
    /// Not for a consumer set that follows every project, which registers its consumers in
    /// every new project.
    #[arg(long)]
    pub existing_only: bool,
    /// Stop with exit 0 once every committed event is numbered and handled (for scripts and
    /// batch jobs); a failed event waiting for its retry is waited for, and so is numbering
    /// (with --no-sequencer, another process must run the sequencer).
    #[arg(long)]
    pub exit_when_caught_up: bool,
    /// Where a consumer without a cursor starts.
    #[arg(long, value_enum, default_value_t = StartFromArg::Reconcile)]
    pub start_from: StartFromArg,
    /// Events per batch: 1 to 10000.
    #[arg(long, default_value_t = outbox_consumer::config::DEFAULT_BATCH_SIZE, allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(1..=outbox_consumer::config::MAX_BATCH_SIZE_CEILING))]
    pub batch_size: i64,
    /// Most events per read while catching up, 1..=10000 and at least --batch-size (default
    /// 4000, or --batch-size when larger). While reads come back full, each asks for twice the
    /// last, from --batch-size up to this; once one comes back short (caught up) reads return
    /// to --batch-size. A crash repeats at most one read batch, so at most this many events.
    /// Equal to --batch-size: fixed batches. Reads of a single consumer (`consume` of one
    /// project and ID, `relay`); the consumers of a set (`consume` of several, `serve`) share
    /// reads of --batch-size.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(1..=outbox_consumer::config::MAX_BATCH_SIZE_CEILING))]
    pub max_batch_size: Option<i64>,
    /// Lease length: at least 1s.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "60s")]
    pub lease_ttl: Duration,
    /// Lease renewal interval: at most half of --lease-ttl.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "10s")]
    pub heartbeat_interval: Duration,
    /// Fallback poll interval when no wake-up arrives.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "1s")]
    pub poll_interval: Duration,
    /// Slowest tick of this process's sequencer while it is the elected one and idle (after
    /// a tick that numbered something it ticks again soon: 50µs per event it numbered, at most
    /// 2ms); one process at a time sequences.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "50ms")]
    pub sequence_interval: Duration,
    /// Length of the sequencer lease (at least 500ms); a dead sequencer is replaced within 1.25
    /// times this.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "10s")]
    pub sequencer_lease_ttl: Duration,
    /// Shortest pause of this process's sequencer after a tick that numbered events, 0s to
    /// 100ms: fewer, larger ticks (and reads and acknowledgements after them) at moderate
    /// rates, for up to this much more latency. 0s: as the batch asks (50µs per event).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = parse_tick_pause, default_value = "0s")]
    pub min_tick_pause: Duration,
    /// Do not run the sequencer in this process.
    #[arg(long)]
    pub no_sequencer: bool,
    /// Delays after the 1st, 2nd, ... failure; the last repeats.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, value_delimiter = ',', default_value = "1s,5s,30s,5m,15m")]
    pub retry_delays: Vec<Duration>,
    /// Attempts before an event is parked as a dead letter: 1 to 1000.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=outbox_consumer::retry::MAX_ATTEMPTS_CEILING as i64))]
    pub max_attempts: u32,
    /// Live-set query for reconciliation ($1 = project ID; one text column of task IDs; it
    /// must only read). Checked at start, exit 2 if it does not fit. Default: SELECT id::text
    /// FROM tasks WHERE project_id = $1 AND deleted_at IS NULL
    #[arg(long)]
    pub live_query: Option<String>,
    /// How long shutdown waits for a running handler.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "10s")]
    pub shutdown_grace: Duration,
    /// How often this process runs the retention sweep of its project (also once at start).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "1h")]
    pub prune_interval: Duration,
    /// Do not run the retention sweep in this process.
    #[arg(long, conflicts_with = "prune_interval")]
    pub no_prune: bool,
    /// Retention period of the sweep: 0s to 36500 days (see `outbox prune --help`).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_retention, default_value = "30d")]
    pub retention: Duration,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464), with /healthz
    /// and /readyz (503 while the database is unavailable).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Exit (code 1) once the database has been unavailable this long, for a supervisor to
    /// restart the process; by default the process waits for the database however long it
    /// takes.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = parse_long_duration)]
    pub give_up_after: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{parse_duration, parse_long_duration};

    #[test]
    fn durations_are_bounded_on_both_sides() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(
            parse_duration("1y").unwrap_err(),
            "invalid duration \"1y\": at most 24h"
        );
        assert_eq!(
            parse_duration("25h").unwrap_err(),
            "invalid duration \"25h\": at most 24h"
        );
        assert!(
            parse_duration("99999999999d")
                .unwrap_err()
                .starts_with("invalid duration \"99999999999d\": ")
        );
        assert_eq!(
            parse_duration("-1s").unwrap_err(),
            "invalid duration \"-1s\": must be greater than zero and at most 24h"
        );
        assert_eq!(
            parse_duration("0s").unwrap_err(),
            "invalid duration \"0s\": must be greater than zero"
        );
        assert!(
            parse_duration("5 parsecs")
                .unwrap_err()
                .contains("examples")
        );
        assert_eq!(
            parse_long_duration("90d"),
            Ok(Duration::from_secs(90 * 86_400))
        );
        assert_eq!(
            parse_long_duration("36501d").unwrap_err(),
            "invalid duration \"36501d\": at most 36500 days"
        );
    }
}
