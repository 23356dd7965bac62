//! Opening connections and pools with [`ConnectSettings`]: the [`Connector`] (TLS set up
//! once) and the deadpool pool. Every connection, the pool's included, is opened by
//! [`Connector::open`], which tries the hosts as libpq does (see `hosts`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::error::ConnectError;
use super::explain::explain;
use super::hosts::{TargetSession, TlsConnection, open};
use super::settings::{ConnectSettings, SslMode};
use super::tls::client_config;

impl ConnectSettings {
    /// Builds the TLS connector: reads the certificate files now, so a missing or unreadable
    /// file is reported before any connection attempt. When every host is a Unix socket no
    /// TLS will be used (libpq ignores `sslmode` there), so no file is read either.
    pub fn connector(&self) -> Result<Connector, ConnectError> {
        let tls = if self.only_sockets() {
            let mut plain = self.clone();
            plain.ssl_mode = SslMode::Disable;
            client_config(&plain)?
        } else {
            client_config(self)?
        };
        Ok(Connector {
            tls: MakeRustlsConnect::new(tls),
            ssl_mode: self.ssl_mode,
            target: self.target_session,
        })
    }

    /// Opens one connection; its driver task runs on the current runtime and ends when the
    /// client is dropped.
    pub async fn connect(&self) -> Result<Client, ConnectError> {
        self.connector()?.connect(self).await
    }

    /// A deadpool pool of at most `size` connections made by this factory.
    pub fn pool(&self, size: usize) -> Result<deadpool_postgres::Pool, ConnectError> {
        let manager = deadpool_postgres::Manager::from_connect(
            self.wire_config(),
            self.connector()?,
            deadpool_postgres::ManagerConfig {
                // `Fast` sends nothing on recycle; `Clean` would send DISCARD ALL, which a
                // transaction pooler refuses to pass on and a direct connection does not need.
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        deadpool_postgres::Pool::builder(manager)
            .max_size(size)
            .build()
            .map_err(|e| ConnectError::Invalid(format!("connection pool: {e}")))
    }
}

/// A TLS connector built from [`ConnectSettings`], with its `sslmode` and
/// `target_session_attrs`; cheap to clone.
#[derive(Clone)]
pub struct Connector {
    tls: MakeRustlsConnect,
    ssl_mode: SslMode,
    target: TargetSession,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("ssl_mode", &self.ssl_mode)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// The rustls connector, for code that drives `tokio_postgres::Config::connect` itself
    /// (which tries every host with one TLS mode and knows only some
    /// `target_session_attrs`: prefer [`Connector::open`]).
    pub fn tls(&self) -> MakeRustlsConnect {
        self.tls.clone()
    }

    /// Opens a connection with `config` (the hosts, user and the rest; its TLS mode and
    /// session attributes are this connector's): the first host that answers and is of the
    /// kind `target_session_attrs` asks for, with no TLS over a Unix socket. The caller
    /// drives the connection (spawns it, or polls it for notifications).
    pub async fn open(
        &self,
        config: &Config,
    ) -> Result<(Client, TlsConnection), tokio_postgres::Error> {
        open(&self.tls, config, self.ssl_mode, self.target).await
    }

    /// Opens one connection with `settings` (whose TLS files this connector was built from).
    pub async fn connect(&self, settings: &ConnectSettings) -> Result<Client, ConnectError> {
        self.connect_config(&settings.wire_config(), settings).await
    }

    /// Opens one connection with `config`, naming the cause of a failure from `settings`.
    pub async fn connect_config(
        &self,
        config: &Config,
        settings: &ConnectSettings,
    ) -> Result<Client, ConnectError> {
        let (client, connection) = self.open(config).await.map_err(|e| ConnectError::Connect {
            message: explain(&e, settings),
            source: e,
        })?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection closed");
            }
        });
        Ok(client)
    }
}

/// The pool's connections are opened as every other connection is.
impl deadpool_postgres::Connect for Connector {
    fn connect(
        &self,
        pg_config: &Config,
    ) -> Pin<
        Box<
            dyn Future<Output = Result<(Client, JoinHandle<()>), tokio_postgres::Error>>
                + Send
                + '_,
        >,
    > {
        let config = pg_config.clone();
        Box::pin(async move {
            let (client, connection) = self.open(&config).await?;
            let task = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "pooled connection closed");
                }
            });
            Ok((client, task))
        })
    }
}
