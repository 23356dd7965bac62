//! Database URLs and connections: a thin shell over outbox-core's connection factory
//! ([`outbox_core::ConnectSettings`]), which handles TLS and the pooler mode.

use std::str::FromStr;
use std::time::Duration;

use outbox_core::{ConnectError, ConnectSettings, Pooler, Schema};
use tokio_postgres::Client;

use crate::failure::Failure;

/// A parsed `postgresql://` URL (or key=value string), with its text kept for messages.
#[derive(Debug, Clone)]
pub struct DatabaseUrl {
    /// The URL with any password replaced, safe to print.
    pub redacted: String,
    /// TLS settings and pooler mode, for the connection factory.
    pub settings: ConnectSettings,
    /// The schema whose version every connection checks before use (`None` for `migrate`,
    /// which brings it up to date itself).
    pub check_schema: Option<Schema>,
}

impl FromStr for DatabaseUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let redacted = redact(text);
        let mut settings = ConnectSettings::parse(text)
            .map_err(|e| format!("invalid database URL {redacted}: {e}"))?;
        let config = &mut settings.config;
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
        Ok(Self {
            redacted,
            settings,
            check_schema: None,
        })
    }
}

/// Replaces the password in a URL (`user:secret@`) or key=value string (`password=secret`).
pub fn redact(text: &str) -> String {
    if let Some(scheme_end) = text.find("://") {
        let rest = &text[scheme_end + 3..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        if let Some(at) = authority.rfind('@') {
            let userinfo = &authority[..at];
            if let Some(colon) = userinfo.find(':') {
                return format!(
                    "{}{}:***{}",
                    &text[..scheme_end + 3],
                    &userinfo[..colon],
                    &text[scheme_end + 3 + at..]
                );
            }
        }
        return redact_query_password(text);
    }
    text.split_whitespace()
        .map(|pair| {
            if pair.starts_with("password=") {
                "password=***".to_owned()
            } else {
                pair.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn redact_query_password(text: &str) -> String {
    let Some(q) = text.find('?') else {
        return text.to_owned();
    };
    let (base, query) = text.split_at(q + 1);
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| {
            if pair.starts_with("password=") {
                "password=***".to_owned()
            } else {
                pair.to_owned()
            }
        })
        .collect();
    format!("{base}{}", pairs.join("&"))
}

impl DatabaseUrl {
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
        let client = self.settings.connect().await.map_err(|e| self.failure(e))?;
        if let Some(schema) = &self.check_schema {
            outbox_core::check_schema_version(&client, schema).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("postgresql://app:s3cret@db:5432/x"),
            "postgresql://app:***@db:5432/x"
        );
        assert_eq!(redact("postgresql://app@db/x"), "postgresql://app@db/x");
        assert_eq!(
            redact("postgresql:///x?user=a&password=p&host=/tmp"),
            "postgresql:///x?user=a&password=***&host=/tmp"
        );
        assert_eq!(
            redact("host=db password=p user=a"),
            "host=db password=*** user=a"
        );
    }

    #[test]
    fn refuses_garbage() {
        let err = DatabaseUrl::from_str("postgresql://u:pw@db:notaport/x").unwrap_err();
        assert!(err.contains("u:***@"), "{err}");
        assert!(!err.contains("pw"), "{err}");
        assert!(DatabaseUrl::from_str("mysql://x").is_err());
        assert!(DatabaseUrl::from_str("postgresql:///x?user=a").is_err());
    }
}
