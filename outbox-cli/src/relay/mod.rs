//! `outbox relay nats`: a durable consumer whose handler publishes every event of its project
//! to a NATS JetStream stream, so that many downstream services fan out from JetStream instead
//! of each polling the application's database.

mod auth;

use std::time::Duration;

use async_nats::jetstream::stream::RetentionPolicy;
use clap::{Args, Subcommand, ValueEnum};

use crate::args::ConsumerRef;
use crate::cli::{ConsumerOptions, Global, parse_duration};
use crate::consume_cmd::{build_config, finish};
use crate::failure::Failure;
use crate::shutdown::Shutdown;
use crate::start::Started;

use outbox_relay::settings::NatsServer;
use outbox_relay::stream::StreamError;
use outbox_relay::subjects::{
    event_subjects, project_prefix, validate_stream_name, validate_subject_prefix,
};
use outbox_relay::{
    Fence, PublisherSettings, Relay, RelayError, Security, StreamSpec, parse_nats_urls,
};

pub use auth::NatsAuthArgs;
use auth::resolve_security;

/// `outbox relay`.
#[derive(Debug, Subcommand)]
pub enum RelayCommand {
    /// Relay the project's events into a NATS JetStream stream: one message per event on
    /// <prefix>.<project>.<type> (task:deleted on task_deleted, task:archived on
    /// task_archived: one subject per declared type), acknowledged only after JetStream
    /// confirms it. Relays
    /// one project as one consumer (--project and --consumer-id once each; run one relay per
    /// project) and takes the `consume` options of one consumer (its handler is the JetStream
    /// publisher).
    Nats(Box<NatsArgs>),
}

/// JetStream's retention policy for a stream the relay creates.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RetentionArg {
    /// Keep messages until max-age (or another limit) removes them; any number of
    /// downstream consumers, each with its own position.
    Limits,
    /// Keep a message until every downstream consumer that exists has acknowledged it.
    Interest,
    /// A work queue: a message goes once one consumer acknowledges it.
    Workqueue,
}

impl From<RetentionArg> for RetentionPolicy {
    fn from(arg: RetentionArg) -> Self {
        match arg {
            RetentionArg::Limits => RetentionPolicy::Limits,
            RetentionArg::Interest => RetentionPolicy::Interest,
            RetentionArg::Workqueue => RetentionPolicy::WorkQueue,
        }
    }
}

/// The order fence (`--fence`).
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FenceArg {
    /// `Nats-Expected-Last-Sequence` (and `Nats-Expected-Last-Msg-Id`), pipelined.
    Stream,
    /// `Nats-Expected-Last-Subject-Sequence`, one publish at a time.
    Subject,
    /// No expectation, pipelined.
    None,
}

impl From<FenceArg> for Fence {
    fn from(arg: FenceArg) -> Self {
        match arg {
            FenceArg::Stream => Fence::Stream,
            FenceArg::Subject => Fence::Subject,
            FenceArg::None => Fence::None,
        }
    }
}

/// `outbox relay nats`.
#[derive(Debug, Args)]
pub struct NatsArgs {
    /// The project and consumer relayed (once each).
    #[command(flatten)]
    pub target: ConsumerRef,
    /// The `outbox consume` options of one consumer (no child handler: the handler is the
    /// publisher).
    #[command(flatten)]
    pub consume: ConsumerOptions,
    /// NATS server, nats://HOST:PORT (tls://HOST:PORT for TLS, with USER:PASSWORD@ or TOKEN@
    /// before the host when the server wants them); a comma-separated list for a cluster.
    #[arg(long, value_name = "URL")]
    pub nats_url: String,
    /// Authentication and TLS.
    #[command(flatten)]
    pub auth: NatsAuthArgs,
    /// JetStream stream the relay publishes into (created when missing, verified otherwise).
    #[arg(long, default_value = "LIFECYCLE")]
    pub stream: String,
    /// Subject prefix: events go to <prefix>.<project>.<type> (task_deleted, task_archived,
    /// ...); the stream covers <prefix>.>.
    #[arg(long, default_value = "lifecycle")]
    pub subject_prefix: String,
    /// JetStream duplicate window: a repeat of an event within it is dropped. At least the
    /// longest relay outage or crash-restart you expect.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "10m")]
    pub duplicate_window: Duration,
    /// Retention policy of the stream.
    #[arg(long, value_enum, default_value_t = RetentionArg::Limits)]
    pub stream_retention: RetentionArg,
    /// Maximum age of a message in the stream ("unlimited" for none). At least the duplicate
    /// window.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_max_age, default_value = "7d")]
    pub stream_max_age: Duration,
    /// Replicas of the stream (3 on a 3-node cluster).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub stream_replicas: u8,
    /// How JetStream enforces the order of the project's messages. stream: every message
    /// names the stream's last sequence before it (and, within a window, the relay's message
    /// before it), --window of them in flight (NATS 2.2 or later; the stream is the
    /// project's own: created covering <prefix>.<project>.>, one chain across its subjects).
    /// subject: every message names its subject's last sequence (each event type's subject
    /// its own), one publish per round trip (NATS 2.3 or later; on a replicated stream before 2.9.21 not
    /// enforced for publishes close together). none: no expectation, pipelined; the order
    /// rests on the connection alone (a refused message can be overtaken, counted in
    /// outbox_relay_out_of_order_total).
    #[arg(long, value_enum, default_value_t = FenceArg::Stream)]
    pub fence: FenceArg,
    /// Most publishes awaiting JetStream's confirmation at once (--fence stream or none;
    /// with --fence subject each publish waits for the one before it).
    #[arg(long, alias = "max-in-flight", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub window: u32,
    /// How long one publish may wait for JetStream's confirmation before it counts as failed.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "5s")]
    pub publish_timeout: Duration,
    /// How long one connection attempt to NATS may take.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "5s")]
    pub nats_connect_timeout: Duration,
    /// How often the client pings NATS (a dead connection is noticed after two missed pongs).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "10s")]
    pub nats_ping_interval: Duration,
}

/// Parses `--stream-max-age`: a duration, or `unlimited`.
fn parse_max_age(text: &str) -> Result<Duration, String> {
    if text.eq_ignore_ascii_case("unlimited") {
        return Ok(Duration::ZERO);
    }
    crate::cli::parse_long_duration(text)
}

/// Runs `outbox relay ...`.
pub async fn run(global: &Global, command: RelayCommand) -> Result<(), Failure> {
    match command {
        RelayCommand::Nats(args) => run_nats(global, *args).await,
    }
}

/// Everything checkable without a connection, in one place so that each refusal exits 2
/// before anything is contacted.
fn check(args: &NatsArgs) -> Result<(Vec<NatsServer>, Security, StreamSpec), Failure> {
    let urls = parse_nats_urls(&args.nats_url).map_err(Failure::usage)?;
    event_subjects(
        &args.subject_prefix,
        args.target.project.as_ref(),
        &args.consume.event_types,
    )
    .map_err(Failure::usage)?;
    let security = resolve_security(&urls, &args.auth).map_err(Failure::usage)?;
    validate_subject_prefix(&args.subject_prefix).map_err(Failure::usage)?;
    validate_stream_name(&args.stream).map_err(Failure::usage)?;
    if !args.stream_max_age.is_zero() && args.duplicate_window > args.stream_max_age {
        return Err(Failure::usage(format!(
            "--duplicate-window {} is longer than --stream-max-age {}: JetStream cannot \
             deduplicate against messages it no longer keeps",
            humantime::format_duration(args.duplicate_window),
            humantime::format_duration(args.stream_max_age)
        )));
    }
    // A stream of the stream fence is one project's alone: it covers that project's subjects.
    let prefix = match args.fence {
        FenceArg::Stream => project_prefix(&args.subject_prefix, args.target.project.as_ref()),
        FenceArg::Subject | FenceArg::None => args.subject_prefix.clone(),
    };
    let spec = StreamSpec {
        name: args.stream.clone(),
        prefix,
        duplicate_window: args.duplicate_window,
        retention: args.stream_retention.into(),
        max_age: args.stream_max_age,
        replicas: usize::from(args.stream_replicas),
    };
    Ok((urls.servers, security, spec))
}

async fn run_nats(global: &Global, args: NatsArgs) -> Result<(), Failure> {
    let (servers, security, spec) = check(&args)?;
    let shutdown = Shutdown::install()?;
    let consumer = args.target.clone();
    let project = &consumer.project;
    let config = build_config(global, &consumer, &args.consume)?;

    let publisher = PublisherSettings {
        servers,
        security,
        prefix: args.subject_prefix.clone(),
        stream: args.stream.clone(),
        fence: args.fence.into(),
        project: project.to_string(),
        event_types: args.consume.event_types.clone(),
        consumer: consumer.consumer_id.to_string(),
        window: args.window as usize,
        publish_timeout: args.publish_timeout,
        connect_timeout: args.nats_connect_timeout,
        ping_interval: args.nats_ping_interval,
    };
    // NATS and the stream first: a wrong stream is refused before the database is touched.
    // A signal while NATS is still being asked is a clean stop: nothing was claimed yet.
    let stop = shutdown.token();
    let connected = tokio::select! {
        connected = Relay::connect(publisher, &spec) => connected,
        () = stop.cancelled() => return Ok(()),
    };
    let relay = match connected {
        Ok(relay) => relay,
        Err(
            e @ (RelayError::Stream(StreamError::Mismatch { .. }) | RelayError::Unsupported(_)),
        ) => {
            return Err(Failure::usage(e.to_string()));
        }
        Err(e) => return Err(Failure::runtime(e.to_string())),
    };
    let Some(started) =
        Started::open_after(shutdown, global, &args.consume, &config.duties.availability).await?
    else {
        return Ok(());
    };
    let result = relay
        .run(&started.connections, config, started.shutdown.token())
        .await;
    // The metrics endpoint stops with the run, whichever way the run ended.
    started.close().await;
    finish(
        result,
        "relay",
        args.consume.live_query.is_some(),
        "outbox relay nats --nats-url URL",
    )
}
