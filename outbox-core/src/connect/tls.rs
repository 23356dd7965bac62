//! The rustls client configuration for [`ConnectSettings`]: trusted roots, the verifier
//! the `sslmode` calls for, and the client certificate; the certificate files are read here.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::client::danger::ServerCertVerifier;
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::error::ConnectError;
use super::settings::{ConnectSettings, RootCert, SslMode};
use super::verifiers::{IgnoreHostName, Unverified};

/// The client configuration for `settings`: reads the certificate files now, so a missing or
/// unreadable file is reported before any connection attempt.
pub(super) fn client_config(settings: &ConnectSettings) -> Result<ClientConfig, ConnectError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let roots = match (&settings.ssl_root_cert, settings.ssl_mode) {
        (_, SslMode::Disable) => None,
        (Some(root), _) => Some(load_roots(root)?),
        (None, SslMode::VerifyCa | SslMode::VerifyFull) => {
            let default = default_root_cert();
            match default.filter(|p| p.exists()) {
                Some(path) => Some(load_roots(&RootCert::File(path))?),
                None => {
                    return Err(ConnectError::File(format!(
                        "sslmode={} needs trusted root certificates: set sslrootcert (a \
                             PEM file, or `system` for the operating system's store) or \
                             PGSSLROOTCERT",
                        settings.ssl_mode
                    )));
                }
            }
        }
        (None, _) => None,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match (roots, settings.ssl_mode) {
        (Some(roots), SslMode::VerifyFull) => {
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| ConnectError::File(format!("unusable root certificates: {e}")))?
        }
        (Some(roots), SslMode::VerifyCa | SslMode::Require) => Arc::new(IgnoreHostName(
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| ConnectError::File(format!("unusable root certificates: {e}")))?,
        )),
        _ => Arc::new(Unverified(algorithms)),
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConnectError::Invalid(format!("TLS setup: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&settings.ssl_cert, &settings.ssl_key) {
        (Some(cert), Some(key)) if settings.ssl_mode != SslMode::Disable => {
            let certs = load_certs(cert, "sslcert")?;
            let bytes = read_file(key, "sslkey")?;
            let key = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
                ConnectError::File(format!(
                    "sslkey file {}: no usable private key ({e})",
                    key.display()
                ))
            })?;
            builder.with_client_auth_cert(certs, key).map_err(|e| {
                ConnectError::File(format!("sslcert and sslkey do not form a pair: {e}"))
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(config)
}

/// libpq's default root certificate file, `~/.postgresql/root.crt`.
pub(super) fn default_root_cert() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|home| Path::new(&home).join(".postgresql/root.crt"))
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path)
        .map_err(|e| ConnectError::File(format!("cannot read {what} file {}: {e}", path.display())))
}

fn load_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, ConnectError> {
    let bytes = read_file(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            ConnectError::File(format!("{what} file {}: bad PEM ({e})", path.display()))
        })?;
    if certs.is_empty() {
        return Err(ConnectError::File(format!(
            "{what} file {} holds no certificate",
            path.display()
        )));
    }
    Ok(certs)
}

fn load_roots(root: &RootCert) -> Result<RootCertStore, ConnectError> {
    let mut store = RootCertStore::empty();
    match root {
        RootCert::File(path) => {
            for cert in load_certs(path, "sslrootcert")? {
                store.add(cert).map_err(|e| {
                    ConnectError::File(format!(
                        "sslrootcert file {}: unusable certificate ({e})",
                        path.display()
                    ))
                })?;
            }
        }
        RootCert::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(ConnectError::File(
                    "sslrootcert=system: the system's certificate store holds no usable \
                     certificate"
                        .to_owned(),
                ));
            }
        }
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_missing_files() {
        let s = ConnectSettings::parse_with_env(
            "postgresql://u@db/x?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            |_| None,
        )
        .unwrap();
        let err = s.connector().err().unwrap();
        assert!(matches!(err, ConnectError::File(_)));
        assert!(
            err.to_string()
                .contains("cannot read sslrootcert file /nonexistent/ca.pem"),
            "{err}"
        );
    }
}
