//! Wake-ups: a dedicated, unpooled connection LISTENs on the sequencer's channel.
//!
//! A notification is only a hint that the project's head moved; the cursor scan is the
//! authority. The connection is checked with TCP keepalives and a periodic `SELECT 1`; when it
//! dies it is re-opened with capped, jittered backoff, and every (re)connect wakes the loop so
//! that whatever was missed meanwhile is scanned.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use rand::Rng;
use tokio::sync::{Notify, mpsc};
use tokio_postgres::{AsyncMessage, Config, NoTls};
use tokio_util::sync::CancellationToken;

use crate::background::{TaskGuard, backoff};

/// How often an idle listener connection is checked.
const PING_INTERVAL: Duration = Duration::from_secs(5);
/// How long a check may take before the connection is declared dead.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// Listens until `stop`, calling `wake.notify_one()` for each notification about `project`
/// and after each (re)connect.
pub(crate) async fn listen(
    mut config: Config,
    channel: String,
    project: String,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        config.keepalives_idle(Duration::from_secs(10));
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    let mut failures: u32 = 0;
    loop {
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            outcome = session(&config, &channel, &project, &wake) => outcome,
        };
        match outcome {
            Ok(()) => failures = 0,
            Err(reason) => {
                tracing::warn!(%reason, failures, "listener connection unavailable");
                failures = failures.saturating_add(1);
            }
        }
        let delay = backoff(failures, rand::rng().random());
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// One connection's lifetime. `Ok` when a working session ended (the connection died after
/// LISTEN succeeded), `Err` when it could not be set up.
async fn session(
    config: &Config,
    channel: &str,
    project: &str,
    wake: &Notify,
) -> Result<(), String> {
    let (client, mut connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| format!("connect: {}", outbox_core::describe(&e)))?;
    let (tx, mut notifications) = mpsc::unbounded_channel();
    // The connection must be polled while the client runs statements, so it gets its own task.
    let _driver = TaskGuard::spawn(async move {
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
    });
    client
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .map_err(|e| format!("LISTEN: {}", outbox_core::describe(&e)))?;
    tracing::debug!(channel, "listening");
    // Anything committed while we were not listening must be scanned now.
    wake.notify_one();
    let mut ping = tokio::time::interval(PING_INTERVAL);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.tick().await;
    loop {
        tokio::select! {
            payload = notifications.recv() => match payload {
                Some(payload) if payload == project => wake.notify_one(),
                Some(_) => {}
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
