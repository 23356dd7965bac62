//! The server as a whole: one [`ConsumerSet`] (one pool, one LISTEN connection, one place in
//! the sequencer election, however many projects it serves) whose pairs publish to the
//! projects' fan-outs, and the HTTP routes in front of them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use deadpool_postgres::Pool;
use outbox_consumer::history::History;
use outbox_consumer::set::{PairFactory, PairOutcome};
use outbox_consumer::{
    ConsumerError, ConsumerSet, DeliverySettings, Duties, Handler, HandlerFailure, ObservedEvent,
    Projects, Reconciler,
};
use outbox_core::{ConsumerId, ProjectId};
use outbox_service::{Connections, MetricsError};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::AdminAuth;
use crate::fan_out::{FanOut, FanOutSink};
use crate::host::{AllowedHosts, InvalidAllowedHost};
use crate::routes::router;
use crate::state::AppState;

/// How the server treats its clients; [`ServerSettings::new`] gives the defaults of
/// `outbox serve`.
pub struct ServerSettings {
    /// The consumer ID every project is followed under.
    pub consumer_id: ConsumerId,
    /// Recent events kept in memory per project for clients that resume.
    pub ring_size: usize,
    /// Events a client may have queued; one that falls further behind receives
    /// `event: lagged` and is disconnected.
    pub client_queue: usize,
    /// How long a dropped client may take to read its final `lagged` message.
    pub lagged_grace: Duration,
    /// Most SSE clients at once, over all projects; past it, 503 with Retry-After.
    pub max_clients: usize,
    /// What a 503 asks clients to wait.
    pub retry_after: Duration,
    /// Interval of SSE keep-alive comments.
    pub keep_alive: Duration,
    /// Shortest time between two writes to one SSE client: events published meanwhile go out
    /// together in the next write. Bounds each client's writes per second under a steady
    /// stream, for up to this much more latency; zero writes each published batch at once.
    pub client_write_interval: Duration,
    /// `/readyz` fails when a consumer has not polled successfully for this long.
    pub ready_max_poll_age: Duration,
    /// How often the dashboard's status, dead letters and audit trail refresh.
    pub dashboard_refresh: Duration,
    /// How long open connections may take to finish at shutdown.
    pub drain_timeout: Duration,
    /// How long a client may take to send a request's head; a slower connection is closed.
    pub header_read_timeout: Duration,
    /// Enables admin actions for requests that carry its token.
    pub admin: Option<AdminAuth>,
    /// Host names (`NAME` or `NAME:PORT`) answered besides the listen address and localhost
    /// (see [`AllowedHosts`]): the names clients reach the server by.
    pub allowed_hosts: Vec<String>,
}

impl ServerSettings {
    /// Default shortest time between two writes to one SSE client
    /// ([`ServerSettings::client_write_interval`]).
    pub const DEFAULT_CLIENT_WRITE_INTERVAL: Duration = Duration::from_millis(20);

    /// Longest client write interval `outbox serve` accepts: past this it is latency, not
    /// pacing.
    pub const MAX_CLIENT_WRITE_INTERVAL: Duration = Duration::from_secs(1);

    /// The defaults of `outbox serve`, following every project under `consumer_id`.
    pub fn new(consumer_id: ConsumerId) -> Self {
        Self {
            consumer_id,
            ring_size: 4096,
            client_queue: 4096,
            lagged_grace: Duration::from_secs(2),
            max_clients: 1000,
            retry_after: Duration::from_secs(5),
            keep_alive: Duration::from_secs(15),
            client_write_interval: Self::DEFAULT_CLIENT_WRITE_INTERVAL,
            ready_max_poll_age: Duration::from_secs(30),
            dashboard_refresh: Duration::from_secs(2),
            drain_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(10),
            admin: None,
            allowed_hosts: Vec::new(),
        }
    }
}

/// Why the server stopped other than by `shutdown`.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The metrics recorder could not be installed.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// A consumer failed (the first of them, when several did); the server stops with it.
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    /// An `allowed_hosts` value is not a host name.
    #[error(transparent)]
    AllowedHost(#[from] InvalidAllowedHost),
    /// The listener has no local address.
    #[error("the listener has no local address: {0}")]
    Listener(std::io::Error),
    /// The consumers' thread or its runtime could not be started.
    #[error("could not start the consumers' thread: {0}")]
    ConsumerThread(std::io::Error),
}

/// No handler before the fan-out: the consumers only fan out.
pub struct Direct;

impl Handler for Direct {
    async fn handle(&self, _: &ObservedEvent) -> Result<(), HandlerFailure> {
        Ok(())
    }
}

impl Reconciler for Direct {
    async fn reconcile(&self, _: &outbox_consumer::LiveSet) -> Result<(), HandlerFailure> {
        Ok(())
    }
}

/// Makes the handler that runs before a project's fan-out.
type MakeFirst<C> = Arc<dyn Fn(&ProjectId) -> C + Send + Sync>;

/// Durable consumers of some projects, fanned out over HTTP. See the crate docs.
pub struct Server<C = Direct> {
    /// What the consumers run on.
    connections: Connections,
    /// For history reads, the dashboard and admin actions; apart from the consumers' pool so
    /// that many resuming clients never starve a durable consumer.
    read_pool: Pool,
    /// How every project's consumer delivers.
    template: DeliverySettings,
    /// What the server's consumer set does once for all projects.
    duties: Duties,
    /// The projects served, sorted, each once.
    projects: Vec<ProjectId>,
    /// How clients are treated.
    settings: ServerSettings,
    /// The handler before each project's fan-out, when there is one.
    first: Option<MakeFirst<C>>,
}

impl Server<Direct> {
    /// A server following `projects`, each as consumer `settings.consumer_id` delivering as
    /// `template`, on `connections`; the consumers carry out `duties` once for all projects.
    pub fn new(
        connections: Connections,
        read_pool: Pool,
        template: DeliverySettings,
        duties: Duties,
        projects: Vec<ProjectId>,
        settings: ServerSettings,
    ) -> Self {
        let mut projects = projects;
        projects.sort();
        projects.dedup();
        Self {
            connections,
            read_pool,
            template,
            duties,
            projects,
            settings,
            first: None,
        }
    }
}

impl<C: Handler + Reconciler> Server<C> {
    /// Runs a handler made by `make` for each project before its fan-out: clients then see
    /// only what that handler acknowledged.
    pub fn before_fan_out<D: Handler + Reconciler>(
        self,
        make: impl Fn(&ProjectId) -> D + Send + Sync + 'static,
    ) -> Server<D> {
        Server {
            connections: self.connections,
            read_pool: self.read_pool,
            template: self.template,
            duties: self.duties,
            projects: self.projects,
            settings: self.settings,
            first: Some(Arc::new(make)),
        }
    }

    /// Serves HTTP on `listener` and runs the consumers until `shutdown`, or until a consumer
    /// fails (which stops the others and the server, and is returned). A consumer an operator
    /// retires stops alone: the other projects are served on, and the retirement is returned
    /// when the server stops. Open connections then have the drain timeout to finish.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), ServeError> {
        let metrics = outbox_service::metrics::install()?;
        crate::metric::describe();
        let settings = self.settings;
        let addr = listener.local_addr().map_err(ServeError::Listener)?;
        let hosts = AllowedHosts::new(addr, &settings.allowed_hosts)?;
        let consumer = settings.consumer_id.to_string();
        let mut sinks = BTreeMap::new();
        let mut fan_outs = BTreeMap::new();
        for project in &self.projects {
            let fan_out = Arc::new(FanOut::new(
                project.clone(),
                consumer.clone(),
                settings.ring_size,
                settings.client_queue,
                settings.lagged_grace,
            ));
            let first = self.first.as_ref().map(|make| make(project));
            let sink = Arc::new(FanOutSink {
                fan_out: fan_out.clone(),
                first,
            });
            sinks.insert(project.clone(), sink);
            fan_outs.insert(project.to_string(), fan_out);
        }
        let (template, mut duties) = (self.template, self.duties);
        // Gauges set before the recorder existed are lost: this one is known from the start.
        duties.availability.publish();
        let availability = duties.availability.clone();
        // `/metrics` always shows the consumers' lag and dead letters.
        duties.gauge_interval.get_or_insert(template.poll_interval);
        let live_query = template.live_query.sql().to_owned();
        let event_types = template.event_types.clone();
        let schema = duties.schema.clone();
        let factory = move |project: &ProjectId, _: &ConsumerId| {
            let sink = sinks
                .get(project)
                .expect("the set runs only the listed projects")
                .clone();
            (sink.clone(), sink)
        };
        let set = self
            .connections
            .set(
                template,
                duties,
                Projects::Listed(self.projects.clone()),
                vec![settings.consumer_id.clone()],
                factory,
            )
            .stop_on_failure();
        // Cancelled by `shutdown`, or when the consumers stop on their own.
        let stop = shutdown.child_token();
        let state = Arc::new(AppState {
            fan_outs,
            projects: self.projects,
            probes: set.probes(),
            history: History::for_types(&schema, event_types),
            schema,
            consumer_id: settings.consumer_id,
            read_pool: self.read_pool,
            live_query,
            metrics,
            availability,
            clients: AtomicUsize::new(0),
            max_clients: settings.max_clients,
            retry_after: settings.retry_after,
            keep_alive: settings.keep_alive,
            client_write_interval: settings.client_write_interval,
            ready_max_poll_age: settings.ready_max_poll_age,
            dashboard_refresh: settings.dashboard_refresh,
            admin: settings.admin,
            shutdown: stop.clone(),
        });
        tracing::info!(%addr, "listening; claiming the consumers' leases");
        // Ends by itself at `stop` at the latest.
        tokio::spawn(announce(state.clone(), addr));
        let http = tokio::spawn(outbox_service::http::serve(
            listener,
            router(state, hosts),
            stop.clone(),
            settings.drain_timeout,
            settings.header_read_timeout,
        ));
        let outcomes = run_apart(set, stop.clone())?.await;
        stop.cancel();
        let _ = http.await;
        // A failure first; else a retirement, which stopped only its project while the others
        // were served on.
        let errors: Vec<ConsumerError> = outcomes?
            .into_iter()
            .filter_map(|o| o.result.err())
            .collect();
        let (retired, failed): (Vec<_>, Vec<_>) = errors
            .into_iter()
            .partition(|e| matches!(e, ConsumerError::Retired { .. }));
        match failed.into_iter().chain(retired).next() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// Stack of the consumers' thread.
const CONSUMER_THREAD_STACK: usize = 8 << 20;

/// Runs the consumer set on a thread of its own, with a runtime of its own, and returns its
/// outcome when it ends.
///
/// Why apart: on the HTTP runtime, each published batch wakes every SSE client's task, and a
/// reply from the database to the durable side (the sequencer's tick, the consumer's read and
/// acknowledgement) then waits in the run queue behind a thousand socket writes. Each step of
/// an event's path waited a whole round of the clients, so the durable side fell behind the
/// writers exactly when clients were many (bench/RESULTS-serve.md). On its own thread the
/// operating system schedules it beside the HTTP workers, and a client never delays an
/// acknowledgement. The set's connections are opened from that thread, so their I/O is
/// driven there too; the fan-out's queues work across runtimes.
fn run_apart<F: PairFactory>(
    set: ConsumerSet<F>,
    stop: CancellationToken,
) -> Result<impl Future<Output = Result<Vec<PairOutcome>, ConsumerError>>, ServeError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeError::ConsumerThread)?;
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let span = tracing::Span::current();
    let thread = std::thread::Builder::new()
        .name("outbox-consumers".into())
        // As a main thread has: the set's own future was polled on the caller's `block_on`
        // thread before, and an unoptimised build's TLS set-up runs deep.
        .stack_size(CONSUMER_THREAD_STACK)
        .spawn(move || {
            let _entered = span.enter();
            let outcomes = runtime.block_on(set.run(stop));
            // The runtime ends here, with the connections' tasks; the outcome goes last.
            drop(runtime);
            let _ = sender.send(outcomes);
        })
        .map_err(ServeError::ConsumerThread)?;
    Ok(async move {
        match receiver.await {
            Ok(outcomes) => outcomes,
            // Dropped without a send: the thread panicked, as a task of the set would have on
            // the caller's runtime; the panic goes on here.
            Err(_) => match thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(()) => unreachable!("the consumers' thread sends its outcome before it ends"),
            },
        }
    })
}

/// Says "serving" once this process holds the lease of every served project (a retired one
/// excepted): not before, so a server that stops because a lease is held elsewhere
/// (`--no-wait`) never claims to have served. Checked every 100 ms until then; ends with it.
async fn announce(state: Arc<AppState>, addr: std::net::SocketAddr) {
    loop {
        let serving = state.projects.iter().all(|project| {
            state.probes.retired(project, &state.consumer_id)
                || state
                    .probes
                    .get(project, &state.consumer_id)
                    .is_some_and(|probe| probe.lease_held())
        });
        if serving {
            tracing::info!(%addr, projects = state.projects.len(), "serving");
            return;
        }
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}
