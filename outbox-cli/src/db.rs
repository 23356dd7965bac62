//! Database URLs and connections: a thin shell over outbox-core's connection factory
//! ([`outbox_core::connect::ConnectSettings`]), which handles TLS and the pooler mode.

use std::str::FromStr;
use std::time::Duration;

use outbox_core::Schema;
use outbox_core::connect::{ConnectError, ConnectSettings, Pooler};
use tokio_postgres::Client;

use crate::failure::Failure;

/// A parsed `postgresql://` URL (or key=value string, or the libpq variables), with a
/// printable description kept for messages.
#[derive(Debug, Clone)]
pub struct DatabaseUrl {
    /// The URL with any password replaced, safe to print.
    pub redacted: String,
    /// Connection, TLS settings and pooler mode, for the connection factory.
    pub settings: ConnectSettings,
    /// The schema whose version every connection checks before use (`None` for `migrate`,
    /// which brings it up to date itself).
    pub check_schema: Option<Schema>,
}

impl FromStr for DatabaseUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let redacted = redact(text);
        let settings = ConnectSettings::parse(text)
            .map_err(|e| format!("invalid database URL {redacted}: {e}"))?;
        if settings.config.get_hosts().is_empty() {
            return Err(format!(
                "invalid database URL {redacted}: it names no host or socket directory"
            ));
        }
        Ok(Self::with_defaults(settings, redacted))
    }
}

/// Replaces every password in a URL or key=value string (see
/// [`outbox_core::internal::redact_connection_string`]).
pub fn redact(text: &str) -> String {
    outbox_core::internal::redact_connection_string(text)
}

impl DatabaseUrl {
    /// The connection the libpq variables describe (PGHOST, PGPORT, PGUSER, PGDATABASE,
    /// PGPASSWORD, PGSSLMODE, PGSSLROOTCERT, ...), or a usage error naming every way to give
    /// a database.
    pub fn from_libpq_env(var: impl Fn(&str) -> Option<String>) -> Result<Self, Failure> {
        let found = outbox_core::connect::libpq_env::config_from_env(&var)
            .map_err(|e| Failure::usage(e.to_string()))?;
        let Some(found) = found else {
            return Err(Failure::usage(
                "no database given: pass --database-url or set DATABASE_URL (or the libpq \
                 variables PGHOST, PGPORT, PGUSER, PGDATABASE)",
            ));
        };
        let settings = ConnectSettings::from_config_with_env(found.config, &var)
            .map_err(|e| Failure::usage(format!("{}: {e}", found.description)))?;
        Ok(Self::with_defaults(settings, found.description))
    }

    /// A connect timeout and an application name unless given.
    fn with_defaults(mut settings: ConnectSettings, redacted: String) -> Self {
        let config = &mut settings.config;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        if config.get_application_name().is_none() {
            config.application_name("outbox");
        }
        Self {
            redacted,
            settings,
            check_schema: None,
        }
    }

    /// The same URL with `pooler` as its statement mode.
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        self.settings.pooler = pooler;
        self
    }

    /// A small pool for a consumer runtime or a command.
    pub fn pool(&self, size: usize) -> Result<deadpool_postgres::Pool, Failure> {
        self.settings.pool(size).map_err(|e| self.failure(e))
    }

    /// Opens one connection (its driver task ends when the client is dropped) and, unless
    /// this is `migrate`, checks that the schema matches this build.
    pub async fn connect(&self) -> Result<Client, Failure> {
        self.try_connect().await.map_err(|failed| failed.failure)
    }

    /// As [`DatabaseUrl::connect`], saying whether a failure found the database unavailable
    /// for now (which a long-running command waits out) rather than refusing for good.
    pub async fn try_connect(&self) -> Result<Client, ConnectFailed> {
        let client = self.settings.connect().await.map_err(|e| ConnectFailed {
            outage: e.is_outage(),
            failure: self.failure(e),
        })?;
        if let Some(schema) = &self.check_schema {
            outbox_core::migrate::check_schema_version(&client, schema)
                .await
                .map_err(|e| ConnectFailed {
                    outage: e.is_outage(),
                    failure: e.into(),
                })?;
        }
        Ok(client)
    }

    /// A connection failure naming the (redacted) URL and the cause; settings that can never
    /// work are usage errors.
    pub fn failure(&self, e: ConnectError) -> Failure {
        match e {
            ConnectError::Invalid(message) => {
                Failure::usage(format!("invalid database URL {}: {message}", self.redacted))
            }
            other => Failure::runtime(format!("cannot connect to {}: {other}", self.redacted)),
        }
    }
}

/// A failed [`DatabaseUrl::try_connect`].
#[derive(Debug)]
pub struct ConnectFailed {
    /// The command's failure, naming the database and the cause.
    pub failure: Failure,
    /// Whether the database was unavailable for now ([`outbox_core::connect::is_outage`]).
    pub outage: bool,
}

impl std::fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.failure.fmt(f)
    }
}

/// Connects as [`DatabaseUrl::try_connect`], waiting out an unavailable database (one log
/// line when it is, one when it is back; `--give-up-after` ends the wait with its failure):
/// `None` when `shutdown` came first. Any other failure is returned at once.
pub async fn connect_waiting(
    database: &DatabaseUrl,
    availability: &outbox_consumer::outage::Availability,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<Option<Client>, Failure> {
    let mut failures: u32 = 0;
    loop {
        let attempt = tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            attempt = database.try_connect() => attempt,
        };
        match attempt {
            Ok(client) => {
                availability.reached();
                return Ok(Some(client));
            }
            Err(failed) if failed.outage => {
                if let Err(gave_up) = availability.unreachable(&failed) {
                    return Err(Failure::runtime(format!(
                        "{gave_up} (connecting to {})",
                        database.redacted
                    )));
                }
            }
            Err(failed) => return Err(failed.failure),
        }
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(outbox_consumer::backoff::outage_backoff(failures)) => {}
        }
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
