//! Database URLs and connections.

use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::{Client, Config, NoTls};

use crate::failure::Failure;

/// A parsed `postgresql://` URL (or key=value string), with its text kept for messages.
#[derive(Debug, Clone)]
pub struct DatabaseUrl {
    /// The parsed configuration.
    pub config: Config,
    /// The URL with any password replaced, safe to print.
    pub redacted: String,
}

impl FromStr for DatabaseUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let redacted = redact(text);
        let mut config =
            Config::from_str(text).map_err(|e| format!("invalid database URL {redacted}: {e}"))?;
        if config.get_hosts().is_empty() {
            return Err(format!(
                "invalid database URL {redacted}: it names no host or socket directory"
            ));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        if config.get_application_name().is_none() {
            config.application_name("outbox");
        }
        Ok(Self { config, redacted })
    }
}

/// Replaces every password in a URL or key=value string (see
/// [`outbox_core::redact_connection_string`]).
pub fn redact(text: &str) -> String {
    outbox_core::redact_connection_string(text)
}

impl DatabaseUrl {
    /// The connection the libpq variables describe (PGHOST, PGPORT, PGUSER, PGDATABASE,
    /// PGPASSWORD, ...), or a usage error naming every way to give a database.
    pub fn from_libpq_env(var: impl Fn(&str) -> Option<String>) -> Result<Self, Failure> {
        let found = outbox_core::libpq_env::config_from_env(var)
            .map_err(|e| Failure::usage(e.to_string()))?;
        let Some(found) = found else {
            return Err(Failure::usage(
                "no database given: pass --database-url or set DATABASE_URL (or the libpq \
                 variables PGHOST, PGPORT, PGUSER, PGDATABASE)",
            ));
        };
        let mut config = found.config;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        if config.get_application_name().is_none() {
            config.application_name("outbox");
        }
        Ok(Self {
            config,
            redacted: found.description,
        })
    }

    /// A small pool for a consumer runtime or a command.
    pub fn pool(&self, size: usize) -> Result<deadpool_postgres::Pool, Failure> {
        outbox_consumer::build_pool(self.config.clone(), size)
            .map_err(|e| Failure::runtime(format!("cannot build the connection pool: {e}")))
    }

    /// Opens one connection; its driver task ends when the client is dropped.
    pub async fn connect(&self) -> Result<Client, Failure> {
        let (client, connection) = self.config.connect(NoTls).await.map_err(|e| {
            Failure::runtime(format!(
                "cannot connect to {}: {}",
                self.redacted,
                outbox_core::describe(&e)
            ))
        })?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection closed");
            }
        });
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_garbage() {
        let err = DatabaseUrl::from_str("postgresql://u:pw@db:notaport/x").unwrap_err();
        assert!(err.contains("u:***@"), "{err}");
        assert!(!err.contains("pw"), "{err}");
        assert!(DatabaseUrl::from_str("mysql://x").is_err());
        assert!(DatabaseUrl::from_str("postgresql:///x?user=a").is_err());
    }
}
