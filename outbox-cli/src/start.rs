//! The start-up every consumer command shares (`consume`, `relay nats`, `serve`), written
//! once: signal handlers first, `--metrics-addr` (so `/readyz` answers while the database is
//! awaited), then the database checked: an unavailable database is waited for (with
//! `--give-up-after` as the limit), anything else fails at once naming the redacted URL (a
//! wrong password, an unknown database, a schema that does not match this build). Then the
//! consumers' connections; once running, the consumers ride out outages the same way.

use outbox_consumer::outage::Availability;
use outbox_service::{Connections, MetricsEndpoint, MetricsError};

use crate::cli::{ConsumerOptions, Global};
use crate::db::{DatabaseUrl, connect_waiting};
use crate::failure::Failure;
use crate::shutdown::Shutdown;

/// A consumer command, started.
pub struct Started {
    /// SIGINT and SIGTERM.
    pub shutdown: Shutdown,
    /// The database the command runs against.
    pub database: DatabaseUrl,
    /// What its consumers run on.
    pub connections: Connections,
    /// `--metrics-addr`, when given.
    metrics: MetricsEndpoint,
}

impl Started {
    /// Starts a command running consumers with `options`, whose database is watched by
    /// `availability` (the one in the consumers' duties, [`crate::consume_cmd::duties`]):
    /// `None` when a shutdown was requested while the database was awaited.
    pub async fn open(
        global: &Global,
        options: &ConsumerOptions,
        availability: &Availability,
    ) -> Result<Option<Self>, Failure> {
        Self::open_after(Shutdown::install()?, global, options, availability).await
    }

    /// As [`Started::open`], for a command that installed its signal handlers earlier (to
    /// check something else first, cancellably).
    pub async fn open_after(
        shutdown: Shutdown,
        global: &Global,
        options: &ConsumerOptions,
        availability: &Availability,
    ) -> Result<Option<Self>, Failure> {
        let database = global.database()?;
        let connections = Connections::new(
            &database.settings,
            usize::from(options.pool_size),
            !options.no_listen,
        )
        .map_err(|e| database.failure(e))?;
        let metrics = MetricsEndpoint::start(options.metrics_addr, availability, &shutdown.token())
            .await
            .map_err(|e| match e {
                MetricsError::Bind(e) => Failure::usage(e.to_string()),
                other => Failure::runtime(other.to_string()),
            })?;
        match connect_waiting(&database, availability, &shutdown.token()).await {
            Ok(Some(client)) => drop(client),
            Ok(None) => {
                metrics.stop().await;
                return Ok(None);
            }
            Err(failure) => {
                metrics.stop().await;
                return Err(failure);
            }
        }
        Ok(Some(Self {
            shutdown,
            database,
            connections,
            metrics,
        }))
    }

    /// Stops `--metrics-addr` (whichever way the run ended) once the consumers have stopped.
    pub async fn close(self) {
        self.metrics.stop().await;
    }
}
