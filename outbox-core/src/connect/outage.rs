//! Which failures mean "the database is unavailable for now": the server is down, restarting,
//! shutting down, not yet accepting connections, or (after a failover) not yet the primary.
//! A long-running process waits these out; anything else (a wrong password, an unknown
//! database, a refused privilege, an untrusted certificate, a bad setting) can never succeed
//! by waiting, and is reported at once.

use tokio_postgres::error::SqlState;

use super::error::ConnectError;
use super::explain::find_rustls_error;
use super::hosts::{WrongServer, wrong_server};

/// What tokio-postgres reports when `target_session_attrs=read-write` finds only servers that
/// do not accept writes (standbys not yet promoted).
const READ_ONLY_SERVER: &str = "database does not allow writes";

/// True when `e` says the database is unavailable for now (see the module docs): connection
/// refused, no socket file, a connection reset or cut off, a connect timeout, SQLSTATE class
/// 08 (connection exception), 57P01/57P02/57P03 (administrator or crash shutdown, cannot
/// connect now), 25006 (read-only transaction: a standby that is not the primary yet), and
/// the driver's refusal of a read-only server under `target_session_attrs=read-write`, and a
/// standby refused under `target_session_attrs=primary` (no host answers as the primary yet:
/// the failover window).
pub fn is_outage(e: &tokio_postgres::Error) -> bool {
    if let Some(code) = e.code() {
        return [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::READ_ONLY_SQL_TRANSACTION,
        ]
        .contains(code)
            || code.code().starts_with("08");
    }
    if find_rustls_error(e).is_some() {
        return false;
    }
    if let Some(wrong) = wrong_server(e) {
        return wrong == WrongServer::InRecovery;
    }
    if e.is_closed() {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            // tokio-postgres's `target_session_attrs=read-write` check; matched by its message,
            // because the same kind also covers a socket's permissions, which never change.
            if io.kind() == K::PermissionDenied {
                return io.to_string() == READ_ONLY_SERVER;
            }
            return matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::NotFound
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::BrokenPipe
                    | K::UnexpectedEof
                    | K::TimedOut
                    | K::AddrNotAvailable
                    | K::HostUnreachable
                    | K::NetworkUnreachable
            );
        }
        source = cause.source();
    }
    // No SQLSTATE and no I/O cause: the driver's own "connection closed" or a protocol
    // failure on a connection that was working.
    e.to_string().contains("connection closed")
}

impl ConnectError {
    /// True when connecting failed because the database is unavailable for now
    /// ([`is_outage`]); settings, files and TLS failures never are.
    pub fn is_outage(&self) -> bool {
        match self {
            ConnectError::Connect { source, .. } => is_outage(source),
            ConnectError::Invalid(_) | ConnectError::File(_) => false,
        }
    }
}

impl crate::Error {
    /// True when this is a database failure that [`is_outage`] waits out.
    pub fn is_outage(&self) -> bool {
        match self {
            crate::Error::Database(e) => is_outage(e),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn connect_error(config: &str) -> tokio_postgres::Error {
        let config: tokio_postgres::Config = config.parse().unwrap();
        config
            .connect(tokio_postgres::NoTls)
            .await
            .err()
            .expect("nothing listens there")
    }

    #[tokio::test]
    async fn a_refused_connection_and_a_missing_socket_are_outages() {
        let refused = connect_error("host=127.0.0.1 port=1 user=u dbname=d").await;
        assert!(is_outage(&refused), "{refused:?}");
        let no_socket = connect_error("host=/nonexistent-dir port=5432 user=u dbname=d").await;
        assert!(is_outage(&no_socket), "{no_socket:?}");
    }

    #[test]
    fn settings_are_never_outages() {
        assert!(!ConnectError::Invalid("bad sslmode".into()).is_outage());
        assert!(!ConnectError::File("no such file".into()).is_outage());
        assert!(!crate::Error::NotMigrated { schema: "s".into() }.is_outage());
    }
}
