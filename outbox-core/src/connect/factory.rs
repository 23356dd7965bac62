//! Opening connections and pools with [`ConnectSettings`]: the [`Connector`] (TLS set up
//! once) and the deadpool pool.

use std::fmt;

use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::error::ConnectError;
use super::explain::explain;
use super::settings::ConnectSettings;
use super::tls::client_config;

impl ConnectSettings {
    /// Builds the TLS connector: reads the certificate files now, so a missing or unreadable
    /// file is reported before any connection attempt.
    pub fn connector(&self) -> Result<Connector, ConnectError> {
        Ok(Connector {
            tls: MakeRustlsConnect::new(client_config(self)?),
        })
    }

    /// Opens one connection; its driver task runs on the current runtime and ends when the
    /// client is dropped.
    pub async fn connect(&self) -> Result<Client, ConnectError> {
        self.connector()?.connect(self).await
    }

    /// A deadpool pool of at most `size` connections made by this factory.
    pub fn pool(&self, size: usize) -> Result<deadpool_postgres::Pool, ConnectError> {
        let manager = deadpool_postgres::Manager::from_config(
            self.wire_config(),
            self.connector()?.tls,
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

/// A TLS connector built from [`ConnectSettings`]; cheap to clone.
#[derive(Clone)]
pub struct Connector {
    tls: MakeRustlsConnect,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Connector")
    }
}

impl Connector {
    /// The rustls connector, for code that drives `tokio_postgres::Config::connect` itself.
    pub fn tls(&self) -> MakeRustlsConnect {
        self.tls.clone()
    }

    /// Opens one connection with `settings` (whose TLS files this connector was built from).
    pub async fn connect(&self, settings: &ConnectSettings) -> Result<Client, ConnectError> {
        self.connect_config(&settings.wire_config(), settings).await
    }

    /// Opens one connection with `config` (already carrying the wire TLS mode), naming the
    /// cause of a failure from `settings`.
    pub async fn connect_config(
        &self,
        config: &Config,
        settings: &ConnectSettings,
    ) -> Result<Client, ConnectError> {
        let (client, connection) =
            config
                .connect(self.tls.clone())
                .await
                .map_err(|e| ConnectError::Connect {
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
