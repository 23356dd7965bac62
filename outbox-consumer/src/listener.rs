//! Wake-ups: a dedicated, unpooled connection LISTENs on the sequencer's channel.
//!
//! A notification (its payload is a project ID) is only a hint that the project's head moved;
//! the cursor scan is the authority. Where a notification goes is the [`Wake`]'s business:
//! one consumer, or every consumer of the project in a [`ConsumerSet`](crate::ConsumerSet). The
//! connection is checked with TCP keepalives and a periodic `SELECT 1`; when it
//! dies it is re-opened with capped, jittered backoff, and every (re)connect wakes the loop so
//! that whatever was missed meanwhile is scanned.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Config, NoTls};
use tokio_util::sync::CancellationToken;

use crate::repeat::Repeat;
use crate::signals::Signals;
use crate::task::{self, Task};

/// How often an idle listener connection is checked.
const PING_INTERVAL: Duration = Duration::from_secs(5);
/// How long a check may take before the connection is declared dead.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// Where the dedicated LISTEN connection goes.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The connection's configuration.
    pub config: Config,
    /// The pool's TLS connector, so that the listener verifies the server the same way;
    /// `None` connects without TLS.
    pub tls: Option<outbox_core::connect::Connector>,
}

/// Where the listener's wake-ups go.
pub(crate) trait Wake: Send + Sync + 'static {
    /// A notification arrived: the head of project `payload` moved.
    fn notified(&self, payload: &str);
    /// The listener (re)connected: anything may have been missed meanwhile.
    fn connected(&self);
    /// The listener's connection ended (or could not be set up): until it is back, only
    /// polling finds new events.
    fn disconnected(&self) {}
}

/// The wake-up of a single consumer: notifications about its project.
pub(crate) struct ProjectWake {
    /// The consumer's project.
    pub project: String,
    /// The consumer loop's wake-up.
    pub signals: Arc<Signals>,
}

impl Wake for ProjectWake {
    fn notified(&self, payload: &str) {
        if payload == self.project {
            self.signals.wake.notify_one();
        }
    }

    fn connected(&self) {
        self.signals.listening.store(true, Ordering::Relaxed);
        self.signals.wake.notify_one();
    }

    fn disconnected(&self) {
        self.signals.listening.store(false, Ordering::Relaxed);
    }
}

/// Listens until `stop`, passing every notification and every (re)connect to `wake`.
pub(crate) async fn listen(
    target: Target,
    channel: String,
    wake: Arc<dyn Wake>,
    availability: crate::outage::Availability,
    stop: CancellationToken,
) {
    let Target { mut config, tls } = target;
    if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        config.keepalives_idle(Duration::from_secs(10));
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    let mut repeat = Repeat::new(&stop, &availability, "listener connection", Duration::ZERO);
    while repeat.next().await {
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            outcome = session(&config, tls.as_ref(), &channel, &*wake, &availability) => outcome,
        };
        wake.disconnected();
        // A session that worked reconnects after the shortest backoff.
        repeat.done(outcome.map(|()| crate::backoff::backoff(0, rand::random())));
    }
}

/// Why a listener session could not be set up.
struct SessionError {
    /// What failed, for the log.
    message: String,
    /// Whether it found the database unavailable.
    outage: bool,
}

impl SessionError {
    fn new(step: &str, e: &tokio_postgres::Error) -> Self {
        Self {
            message: format!("{step}: {}", outbox_core::error::describe(e)),
            outage: outbox_core::connect::is_outage(e),
        }
    }
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl crate::outage::MaybeOutage for SessionError {
    fn is_outage(&self) -> bool {
        self.outage
    }
}

/// One connection's lifetime. `Ok` when a working session ended (the connection died after
/// LISTEN succeeded), `Err` when it could not be set up.
async fn session(
    config: &Config,
    tls: Option<&outbox_core::connect::Connector>,
    channel: &str,
    wake: &dyn Wake,
    availability: &crate::outage::Availability,
) -> Result<(), SessionError> {
    let (tx, mut notifications) = mpsc::unbounded_channel();
    let connect_error = |e: tokio_postgres::Error| SessionError::new("connect", &e);
    let (client, _driver) = match tls {
        Some(tls) => {
            let (client, connection) = tls.open(config).await.map_err(connect_error)?;
            (client, drive(connection, tx))
        }
        None => {
            let (client, connection) = config.connect(NoTls).await.map_err(connect_error)?;
            (client, drive(connection, tx))
        }
    };
    client
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .map_err(|e| SessionError::new("LISTEN", &e))?;
    tracing::debug!(channel, "listening");
    availability.reached();
    // Anything committed while we were not listening must be scanned now.
    wake.connected();
    let mut ping = tokio::time::interval(PING_INTERVAL);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.tick().await;
    loop {
        tokio::select! {
            payload = notifications.recv() => match payload {
                Some(payload) => wake.notified(&payload),
                None => return Ok(()),
            },
            _ = ping.tick() => {
                match tokio::time::timeout(PING_TIMEOUT, client.simple_query("SELECT 1")).await {
                    Ok(Ok(_)) => {}
                    _ => return Ok(()),
                }
            }
        }
    }
}

/// Polls `connection` on its own task (it must be polled while the client runs statements),
/// forwarding notification payloads to `tx`.
fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    tx: mpsc::UnboundedSender<String>,
) -> Task
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    task::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n.payload().to_owned()).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "listener connection failed");
                    return;
                }
            }
        }
    })
}
