//! What the probe runs through: the role, the server, TLS, the pooler mode in effect, and
//! whether LISTEN/NOTIFY works end to end on this connection path.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use outbox_core::connect::Pooler;
use outbox_core::internal::Unnamed;
use serde::Serialize;
use tokio_postgres::AsyncMessage;

use super::sql;
use crate::db::DatabaseUrl;
use crate::failure::Failure;

/// Transactions run on one connection to see whether the backend changes between them.
const BACKEND_SAMPLES: usize = 4;

/// The connection path the probe ran through.
#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    /// The role the probe connected as.
    pub role: String,
    /// PostgreSQL's version.
    pub server_version: String,
    /// TLS of the server's side of the session (behind a pooler: the pooler's connection).
    pub tls: String,
    /// `--pooler` as given.
    pub pooler: &'static str,
    /// Distinct backends that served `BACKEND_SAMPLES` transactions of one client connection:
    /// more than one means a transaction pooler sits in between.
    pub backends_per_connection: usize,
    /// Whether a notification sent on a second connection reached a LISTEN connection.
    pub listen: Listen,
}

/// LISTEN availability.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Listen {
    /// A notification arrived; the probe consumer was woken by notifications.
    Available {
        /// How long the notification took, in milliseconds.
        round_trip_ms: f64,
    },
    /// Not tried: `--pooler transaction` (consumers poll).
    NotUsed,
    /// Tried and failed; the probe consumer polled.
    Unavailable {
        /// Why.
        reason: String,
    },
}

impl Listen {
    /// Whether the probe consumer should listen.
    pub fn works(&self) -> bool {
        matches!(self, Listen::Available { .. })
    }

    /// One line for the table.
    pub fn describe(&self) -> String {
        match self {
            Listen::Available { round_trip_ms } => {
                format!("available (notification in {round_trip_ms:.1} ms)")
            }
            Listen::NotUsed => "not used: --pooler transaction (consumers poll)".to_owned(),
            Listen::Unavailable { reason } => format!("unavailable ({reason}); consumers poll"),
        }
    }
}

/// Looks at the connection path; `channel` is this run's own notification channel.
pub async fn inspect(
    database: &DatabaseUrl,
    channel: &str,
    listen_timeout: Duration,
) -> Result<Topology, Failure> {
    let client = database.connect().await?;
    let session = client.query_one_unnamed(sql::SESSION, &[]).await?;
    let mut backends = BTreeSet::new();
    for _ in 0..BACKEND_SAMPLES {
        let row = client.query_one_unnamed(sql::BACKEND, &[]).await?;
        backends.insert(row.get::<_, i32>("pid"));
    }
    let pooler = database.settings.pooler;
    let listen = match pooler {
        Pooler::Transaction => Listen::NotUsed,
        Pooler::None => match listen_round_trip(database, &client, channel, listen_timeout).await {
            Ok(elapsed) => Listen::Available {
                round_trip_ms: elapsed.as_secs_f64() * 1000.0,
            },
            Err(reason) => Listen::Unavailable { reason },
        },
    };
    Ok(Topology {
        role: session.get("role"),
        server_version: session.get("server_version"),
        tls: session.get("tls"),
        pooler: match pooler {
            Pooler::None => "none",
            Pooler::Transaction => "transaction",
        },
        backends_per_connection: backends.len(),
        listen,
    })
}

/// LISTENs on a connection of its own (as the consumer's listener does), notifies from
/// `sender`, and times the notification's arrival.
async fn listen_round_trip(
    database: &DatabaseUrl,
    sender: &tokio_postgres::Client,
    channel: &str,
    timeout: Duration,
) -> Result<Duration, String> {
    let connector = database
        .settings
        .connector()
        .map_err(|e| format!("no TLS connector: {e}"))?;
    let mut config = database.settings.wire_config();
    config.application_name("outbox-verify-listener");
    let (listener, mut connection) = connector
        .open(&config)
        .await
        .map_err(|e| format!("cannot open a LISTEN connection: {e}"))?;
    let (notified, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                let _ = notified.send(n.channel().to_owned());
            }
        }
    });
    let result = async {
        listener
            .batch_execute(&format!("LISTEN \"{channel}\""))
            .await
            .map_err(|e| format!("LISTEN refused: {e}"))?;
        let sent = Instant::now();
        sender
            .query_one_unnamed(sql::NOTIFY, &[&channel])
            .await
            .map_err(|e| format!("NOTIFY refused: {e}"))?;
        match tokio::time::timeout(timeout, arrivals.recv()).await {
            Ok(Some(_)) => Ok(sent.elapsed()),
            Ok(None) => Err("the LISTEN connection closed".to_owned()),
            Err(_) => Err(format!("no notification within {timeout:?}")),
        }
    }
    .await;
    drop(listener);
    driver.abort();
    result
}
