//! `outbox serve`: the options of [`outbox_serve::Server`] (durable consumers, one per
//! `--project`, all under one consumer ID, whose handled events are fanned out over HTTP),
//! and its start-up and exit code.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use outbox_core::{ConsumerId, OperatorName, ProjectId};
use outbox_serve::{AdminAuth, ServeError, Server, ServerSettings};

use crate::child::ChildSink;
use crate::cli::{ConsumerOptions, Global, parse_duration};
use crate::consume_cmd::{classify, delivery_settings, duties};
use crate::failure::Failure;
use crate::start::Started;

/// `outbox serve`.
#[derive(Debug, Args)]
// A server runs until it is stopped: the one consume option that ends a run is not offered
// (and refused when given).
#[command(mut_arg("exit_when_caught_up", |a| a.hide(true)))]
pub struct ServeArgs {
    /// A project to follow; repeat to follow several (one durable consumer each, all under
    /// one consumer ID).
    #[arg(long, required = true)]
    pub project: Vec<ProjectId>,
    /// The consumers' explicit, stable ID (never generated).
    #[arg(long)]
    pub consumer_id: ConsumerId,
    /// The child-process handler (`--child`).
    #[command(flatten)]
    pub child: crate::cli::ChildOptions,
    /// Key-level parallelism (`--lanes`, `--max-ahead`).
    #[command(flatten)]
    pub lanes: crate::cli::LaneOptions,
    /// Every other `outbox consume` option.
    #[command(flatten)]
    pub consume: ConsumerOptions,
    /// Address to serve HTTP on: IP:PORT, or HOST:PORT with a name that resolves
    /// (localhost:8080).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// A host name clients reach the server by (NAME, any port, or NAME:PORT), answered
    /// besides the listen address and localhost; repeat for several. Requests naming any
    /// other Host are refused with 421 (against DNS rebinding). Listening on 0.0.0.0 or ::
    /// answers every IP address as Host (a Kubernetes probe names the pod's IP), but names
    /// only when given here.
    #[arg(long, value_name = "HOST")]
    pub allowed_host: Vec<String>,
    /// Most SSE clients at once, over all projects; past it, 503 with Retry-After.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_clients: u64,
    /// Recent events kept in memory per project for clients that resume.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub ring_size: u64,
    /// Events a client may have queued; one that falls further behind receives
    /// `event: lagged` and is disconnected.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub client_queue: u64,
    /// How long a dropped (lagging) client may take to read its final `lagged` message before
    /// its connection is closed.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "2s")]
    pub lagged_grace: Duration,
    /// Interval of SSE keep-alive comments.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "15s")]
    pub keep_alive: Duration,
    /// Shortest time between two writes to one SSE client, 0s to 1s: events published
    /// meanwhile go out together. Caps each client's writes under a steady stream (the cost of
    /// many clients), for up to this much more latency; 0s writes every batch at once.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = parse_client_write_interval, default_value = "20ms")]
    pub client_write_interval: Duration,
    /// /readyz fails when a consumer has not polled successfully for this long (an idle
    /// consumer counts the server's shared poll, every --poll-interval); longer than
    /// --poll-interval.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "30s")]
    pub ready_max_poll_age: Duration,
    /// How often the dashboard's status, dead letters and audit trail refresh.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "2s")]
    pub dashboard_refresh: Duration,
    /// How long open connections may take to finish at shutdown.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "5s")]
    pub drain_timeout: Duration,
    /// How long a client may take to send a request's headers; a slower connection is closed
    /// (it would otherwise hold a connection open by trickling them).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration, default_value = "10s")]
    pub header_read_timeout: Duration,
    /// Enables admin actions (replay, resolve, retire) for requests that carry this token in
    /// `Authorization: Bearer`. Prefer the environment variable.
    #[arg(long, env = "OUTBOX_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// The operator name admin actions are recorded under (required with a token).
    #[arg(long, env = "OUTBOX_ADMIN_OPERATOR")]
    pub admin_operator: Option<String>,
}

/// `--client-write-interval`: a duration from 0s to
/// [`outbox_serve::ServerSettings::MAX_CLIENT_WRITE_INTERVAL`].
fn parse_client_write_interval(text: &str) -> Result<Duration, String> {
    crate::cli::parse_up_to(
        text,
        outbox_serve::ServerSettings::MAX_CLIENT_WRITE_INTERVAL,
        "0s, 20ms",
    )
}

/// The address `--listen` names: an IP address and port, or a host name and port resolved
/// here (the first address it resolves to).
async fn listen_addr(listen: &str) -> Result<SocketAddr, Failure> {
    if let Ok(addr) = listen.parse() {
        return Ok(addr);
    }
    let invalid = |reason: String| {
        Failure::usage(format!(
            "invalid --listen {listen:?}: {reason} (expected IP:PORT or HOST:PORT, such as \
             127.0.0.1:8080 or localhost:8080)"
        ))
    };
    let Some((host, port)) = listen.rsplit_once(':') else {
        return Err(invalid("no port".to_owned()));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(invalid(format!("{port:?} is not a port")));
    }
    let mut addrs = tokio::net::lookup_host(listen)
        .await
        .map_err(|e| invalid(format!("cannot resolve {host:?}: {e}")))?;
    addrs
        .next()
        .ok_or_else(|| invalid(format!("{host:?} resolves to no address")))
}

/// Refuses a project named twice: one durable consumer per project.
fn distinct_projects(projects: &[ProjectId]) -> Result<(), Failure> {
    let mut seen = std::collections::BTreeSet::new();
    for project in projects {
        if !seen.insert(project) {
            return Err(Failure::usage(format!(
                "--project {project} is given more than once: each project is served once"
            )));
        }
    }
    Ok(())
}

/// The admin credentials `args` ask for; refuses half or unsafe configurations.
fn admin_auth(args: &ServeArgs, listen: SocketAddr) -> Result<Option<AdminAuth>, Failure> {
    let loopback = listen.ip().is_loopback();
    match (&args.admin_token, &args.admin_operator) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(Failure::usage(
            "--admin-operator needs --admin-token (or OUTBOX_ADMIN_TOKEN): admin actions are \
             never served without a token",
        )),
        (Some(token), _) if token.trim().is_empty() => Err(Failure::usage(if loopback {
            "the admin token is empty: give a non-empty --admin-token (or OUTBOX_ADMIN_TOKEN)"
                .to_owned()
        } else {
            format!(
                "refusing to serve admin actions on non-loopback address {} without a token: \
                 the admin token is empty",
                listen
            )
        })),
        (Some(_), None) => Err(Failure::usage(
            "--admin-token needs --admin-operator (or OUTBOX_ADMIN_OPERATOR): the name admin \
             actions are recorded under",
        )),
        (Some(token), Some(operator)) => {
            let operator = OperatorName::new(operator.clone())
                .map_err(|e| Failure::usage(format!("invalid --admin-operator: {e}")))?;
            Ok(Some(AdminAuth::new(token.trim(), operator)))
        }
    }
}

/// [`Started::open`], with `listener` answering the probes meanwhile
/// ([`outbox_serve::internal::waiting_router`]: `/readyz` is 503 `database_unavailable` while the
/// database is awaited); the listener is handed back for the server once the database answers.
async fn open_answering_probes(
    global: &Global,
    consume: &crate::cli::ConsumerOptions,
    availability: &outbox_consumer::outage::Availability,
    listener: tokio::net::TcpListener,
    args: &ServeArgs,
) -> Result<Option<(Started, tokio::net::TcpListener)>, Failure> {
    let socket = listener
        .into_std()
        .map_err(|e| Failure::runtime(format!("--listen: {e}")))?;
    let probes = socket
        .try_clone()
        .and_then(tokio::net::TcpListener::from_std)
        .map_err(|e| Failure::runtime(format!("--listen: {e}")))?;
    let listener = tokio::net::TcpListener::from_std(socket)
        .map_err(|e| Failure::runtime(format!("--listen: {e}")))?;
    let stop = tokio_util::sync::CancellationToken::new();
    let hosts = outbox_serve::AllowedHosts::new(
        listener
            .local_addr()
            .map_err(|e| Failure::runtime(format!("--listen: {e}")))?,
        &args.allowed_host,
    )
    .map_err(|e| Failure::usage(e.to_string()))?;
    let answering = tokio::spawn(outbox_service::http::serve(
        probes,
        outbox_serve::internal::waiting_router(hosts, availability.clone()),
        stop.clone(),
        std::time::Duration::from_secs(1),
        args.header_read_timeout,
    ));
    let started = Started::open(global, consume, availability).await;
    stop.cancel();
    let _ = answering.await;
    Ok(started?.map(|started| (started, listener)))
}

/// The server's settings from `args`, with `admin` (checked by [`admin_auth`]).
pub(crate) fn server_settings(args: &ServeArgs, admin: Option<AdminAuth>) -> ServerSettings {
    ServerSettings {
        ring_size: args.ring_size as usize,
        client_queue: args.client_queue as usize,
        lagged_grace: args.lagged_grace,
        max_clients: args.max_clients as usize,
        keep_alive: args.keep_alive,
        client_write_interval: args.client_write_interval,
        ready_max_poll_age: args.ready_max_poll_age,
        dashboard_refresh: args.dashboard_refresh,
        drain_timeout: args.drain_timeout,
        header_read_timeout: args.header_read_timeout,
        admin,
        allowed_hosts: args.allowed_host.clone(),
        ..ServerSettings::new(args.consumer_id.clone())
    }
}

/// Runs `outbox serve`.
pub async fn run(global: &Global, args: ServeArgs) -> Result<(), Failure> {
    distinct_projects(&args.project)?;
    let consume = &args.consume;
    if consume.exit_when_caught_up {
        return Err(Failure::usage(
            "outbox serve runs until it is stopped: --exit-when-caught-up is an option of \
             outbox consume",
        ));
    }
    outbox_serve::AllowedHosts::check(&args.allowed_host)
        .map_err(|e| Failure::usage(e.to_string()))?;
    if args.ready_max_poll_age <= consume.poll_interval {
        return Err(Failure::usage(format!(
            "--ready-max-poll-age {} must be longer than --poll-interval {}: an idle \
             server polls once per --poll-interval, so /readyz would fail between polls",
            humantime::format_duration(args.ready_max_poll_age),
            humantime::format_duration(consume.poll_interval)
        )));
    }
    let listen = listen_addr(&args.listen).await?;
    let admin = admin_auth(&args, listen)?;
    let mut template = delivery_settings(consume)?;
    args.lanes.apply(&mut template).map_err(Failure::usage)?;
    let duties = duties(global, consume)?;
    if (args.client_queue as i64) < consume.batch_size {
        return Err(Failure::usage(format!(
            "--client-queue {} is smaller than --batch-size {}: every client would be dropped \
             by the first full batch",
            args.client_queue, consume.batch_size
        )));
    }
    // Bind first: a used address is a usage error, reported before anything else happens.
    let listener = outbox_service::http::bind(listen, "--listen")
        .await
        .map_err(|e| Failure::usage(e.to_string()))?;
    let Some((started, listener)) =
        open_answering_probes(global, consume, &duties.availability, listener, &args).await?
    else {
        return Ok(());
    };
    let read_pool = started.database.pool(4)?;
    let settings = server_settings(&args, admin);
    let server = Server::new(
        started.connections.clone(),
        read_pool,
        template,
        duties,
        args.project.clone(),
        settings,
    );
    let shutdown = started.shutdown.token();
    let result = match &args.child.child {
        None => server.run(listener, shutdown).await,
        Some(command) => {
            // One child per project, each killed at once by a second signal.
            let children: BTreeMap<ProjectId, ChildSink> = args
                .project
                .iter()
                .map(|project| {
                    let child = ChildSink::new(
                        command.clone(),
                        args.consumer_id.to_string(),
                        args.child.child_timeout,
                        args.child.child_stop_grace,
                        shutdown.clone(),
                        args.lanes.lanes > 1,
                    );
                    let force = child.clone();
                    started.shutdown.on_force(move || force.kill_now());
                    (project.clone(), child)
                })
                .collect();
            let first = children.clone();
            let result = server
                .before_fan_out(move |project| first[project].clone())
                .run(listener, shutdown)
                .await;
            for child in children.values() {
                child.close().await;
            }
            result
        }
    };
    started.close().await;
    result.map_err(|e| match e {
        ServeError::Consumer(e) => {
            // The reactivation command names every served project: `serve` runs them as one.
            let mut command = "outbox serve".to_owned();
            let retired = match &e {
                outbox_consumer::ConsumerError::Retired { project, .. } => Some(project),
                _ => None,
            };
            for project in args.project.iter().filter(|p| Some(*p) != retired) {
                command.push_str(&format!(" --project {project}"));
            }
            classify(e, consume.live_query.is_some(), &command)
        }
        other => Failure::runtime(other.to_string()),
    })
}
