//! Connection failures named by their cause, for the operator.

use super::hosts::wrong_server;
use super::settings::{ConnectSettings, RootCert};
use super::tls::default_root_cert;

/// Names the cause of a connection failure: an untrusted certificate, a host-name mismatch,
/// a server that insists on TLS, a server without TLS; otherwise the driver's own words.
pub fn explain(error: &tokio_postgres::Error, settings: &ConnectSettings) -> String {
    let host = settings
        .config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_default();
    if let Some(wrong) = wrong_server(error) {
        return format!(
            "no host is the kind of server target_session_attrs={} asks for ({wrong})",
            settings.target_session
        );
    }
    if let Some(tls) = find_rustls_error(error) {
        use rustls::CertificateError as C;
        return match tls {
            rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
                "TLS: the server's certificate is not trusted: it does not chain to a root in \
                 {} (sslmode={})",
                describe_roots(settings),
                settings.ssl_mode
            ),
            rustls::Error::InvalidCertificate(
                C::NotValidForName | C::NotValidForNameContext { .. },
            ) => format!(
                "TLS: host name mismatch: the server's certificate is not valid for host \
                 {host:?} (sslmode=verify-full checks the name; connect by a name the \
                 certificate lists)"
            ),
            rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
                "TLS: the server's certificate has expired".to_owned()
            }
            other => format!("TLS handshake failed: {other}"),
        };
    }
    if let Some(db) = error.as_db_error() {
        let message = db.message();
        if db.code() == &tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            && message.contains("no encryption")
        {
            return format!(
                "the server requires TLS but sslmode={} sent none; use sslmode=require or \
                 verify-full ({message})",
                settings.ssl_mode
            );
        }
    }
    let text = crate::error::describe(error);
    if text.contains("server does not support TLS") {
        return format!(
            "the server does not support TLS, and sslmode={} requires it",
            settings.ssl_mode
        );
    }
    text
}

fn describe_roots(settings: &ConnectSettings) -> String {
    match &settings.ssl_root_cert {
        Some(RootCert::File(path)) => format!("sslrootcert {}", path.display()),
        Some(RootCert::System) => "the system's certificate store".to_owned(),
        None => default_root_cert()
            .map(|p| format!("sslrootcert {}", p.display()))
            .unwrap_or_else(|| "the given root certificates".to_owned()),
    }
}

pub(super) fn find_rustls_error(error: &tokio_postgres::Error) -> Option<&rustls::Error> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(current) = source {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // io::Error hides its inner error from `source()`; look inside.
        let inner = current
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        if inner.is_some() {
            return inner;
        }
        source = current.source();
    }
    None
}
