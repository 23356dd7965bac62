//! The start-up every consumer command shares (`consume`, `relay nats`, `serve`), written
//! once: signal handlers first, then the database checked (fail fast, naming the redacted
//! URL, when it cannot be reached or its schema does not match this build; once running, the
//! consumers ride out outages instead), the consumers' connections, and `--metrics-addr`.

use outbox_service::{Connections, MetricsEndpoint, MetricsError};

use crate::cli::{ConsumerOptions, Global};
use crate::db::DatabaseUrl;
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
    /// Starts a command running consumers with `options`.
    pub async fn open(global: &Global, options: &ConsumerOptions) -> Result<Self, Failure> {
        Self::open_after(Shutdown::install()?, global, options).await
    }

    /// As [`Started::open`], for a command that installed its signal handlers earlier (to
    /// check something else first, cancellably).
    pub async fn open_after(
        shutdown: Shutdown,
        global: &Global,
        options: &ConsumerOptions,
    ) -> Result<Self, Failure> {
        let database = global.database()?;
        drop(database.connect().await?);
        let connections = Connections::new(
            &database.settings,
            usize::from(options.pool_size),
            !options.no_listen,
        )
        .map_err(|e| database.failure(e))?;
        let metrics = MetricsEndpoint::start(options.metrics_addr, &shutdown.token())
            .await
            .map_err(|e| match e {
                MetricsError::Bind(e) => Failure::usage(e.to_string()),
                other => Failure::runtime(other.to_string()),
            })?;
        Ok(Self {
            shutdown,
            database,
            connections,
            metrics,
        })
    }

    /// Stops `--metrics-addr` (whichever way the run ended) once the consumers have stopped.
    pub async fn close(self) {
        self.metrics.stop().await;
    }
}
