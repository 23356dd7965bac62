//! One connection factory for every process: the CLI, the consumer's pool and its LISTEN
//! connection, the benches and the test kit.
//!
//! It reads the TLS settings libpq users know (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`,
//! in the URL or through `PGSSLMODE` / `PGSSLROOTCERT`), builds a rustls connector for them,
//! and carries the [`Pooler`] mode, which decides how statements are sent.
//!
//! TLS is rustls with the `ring` provider, so nothing links OpenSSL. The modes follow libpq:
//!
//! | sslmode       | TLS                    | server certificate checked against the roots | host name |
//! |---------------|------------------------|----------------------------------------------|-----------|
//! | `disable`     | never                  | -                                            | -         |
//! | `prefer`      | if the server offers it| no                                           | no        |
//! | `require`     | always                 | only when `sslrootcert` is given (as libpq)  | no        |
//! | `verify-ca`   | always                 | yes                                          | no        |
//! | `verify-full` | always                 | yes                                          | yes       |

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode as WireSslMode;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How a connection uses TLS (libpq's `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS when the server offers it, unverified; plain otherwise (libpq's default).
    #[default]
    Prefer,
    /// TLS always; the certificate is checked only when a root certificate is given.
    Require,
    /// TLS always; the certificate must chain to a trusted root.
    VerifyCa,
    /// TLS always; the certificate must chain to a trusted root and name the host.
    VerifyFull,
}

impl SslMode {
    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = ConnectError;
    fn from_str(s: &str) -> Result<Self, ConnectError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(ConnectError::Invalid(format!(
                    "invalid sslmode {other:?}: use disable, prefer, require, verify-ca or \
                     verify-full"
                )));
            }
        })
    }
}

/// Where trusted root certificates come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file of one or more CA certificates.
    File(PathBuf),
    /// The operating system's store (`sslrootcert=system`).
    System,
}

/// Whether a transaction-mode pooler (PgBouncer `pool_mode = transaction`) sits between the
/// process and PostgreSQL. Chosen explicitly, never guessed.
///
/// Behind such a pooler consecutive transactions of one client may run on different server
/// sessions, so nothing may outlive a transaction on the server: no named prepared statement
/// (the runtime sends unnamed statements in one round trip), no session `SET`, no session
/// advisory lock, no temporary table, and no `LISTEN` (consumers poll).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// A direct connection (or a session-mode pooler): statements may be cached per
    /// connection and `LISTEN` works.
    #[default]
    None,
    /// A transaction-mode pooler.
    Transaction,
}

impl Pooler {
    /// The spelling of `--pooler` and `OUTBOX_POOLER`.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooler::None => "none",
            Pooler::Transaction => "transaction",
        }
    }
}

impl FromStr for Pooler {
    type Err = ConnectError;
    fn from_str(s: &str) -> Result<Self, ConnectError> {
        match s {
            "none" => Ok(Pooler::None),
            "transaction" => Ok(Pooler::Transaction),
            other => Err(ConnectError::Invalid(format!(
                "invalid pooler mode {other:?}: use none or transaction"
            ))),
        }
    }
}

/// Why settings could not be used or a connection could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The settings themselves are wrong (a bad `sslmode`, a malformed URL): retrying cannot
    /// help.
    #[error("{0}")]
    Invalid(String),
    /// A certificate or key file is missing, unreadable or holds no usable PEM data.
    #[error("{0}")]
    File(String),
    /// Connecting failed; the message names the cause where it is known.
    #[error("{message}")]
    Connect {
        /// What went wrong, for the operator.
        message: String,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
}

/// Everything needed to open connections to one database.
#[derive(Clone)]
pub struct ConnectSettings {
    /// The driver's configuration (host, port, user, database, ...). Its own `ssl_mode` is
    /// derived from [`ConnectSettings::ssl_mode`] when connecting.
    pub config: Config,
    /// TLS use and verification.
    pub ssl_mode: SslMode,
    /// Trusted roots; `None` means none given.
    pub ssl_root_cert: Option<RootCert>,
    /// Client certificate (PEM), sent when the server asks for one.
    pub ssl_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub ssl_key: Option<PathBuf>,
    /// Whether a transaction-mode pooler is in between.
    pub pooler: Pooler,
}

impl fmt::Debug for ConnectSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `Config`'s own Debug already redacts the password.
        f.debug_struct("ConnectSettings")
            .field("config", &self.config)
            .field("ssl_mode", &self.ssl_mode)
            .field("ssl_root_cert", &self.ssl_root_cert)
            .field("ssl_cert", &self.ssl_cert)
            .field("ssl_key", &self.ssl_key)
            .field("pooler", &self.pooler)
            .finish()
    }
}

/// The TLS parameters this module handles itself (the driver knows none but `sslmode`, and
/// only three of its values).
const TLS_KEYS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

impl ConnectSettings {
    /// Settings for an already-parsed configuration, with libpq's defaults (`prefer`).
    pub fn from_config(config: Config) -> Self {
        let ssl_mode = match config.get_ssl_mode() {
            WireSslMode::Disable => SslMode::Disable,
            WireSslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        };
        Self {
            config,
            ssl_mode,
            ssl_root_cert: None,
            ssl_cert: None,
            ssl_key: None,
            pooler: Pooler::None,
        }
    }

    /// Parses a `postgresql://` URL or a key=value string, taking `PGSSLMODE` and
    /// `PGSSLROOTCERT` from the process environment where the text does not set them.
    pub fn parse(text: &str) -> Result<Self, ConnectError> {
        Self::parse_with_env(text, |key| std::env::var(key).ok())
    }

    /// Like [`ConnectSettings::parse`], with the environment given (for tests).
    pub fn parse_with_env(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConnectError> {
        let (rest, tls) = split_tls_params(text);
        let config = Config::from_str(&rest).map_err(|e| ConnectError::Invalid(e.to_string()))?;
        Self::with_tls(config, &tls, env)
    }

    /// Settings for a configuration read from the libpq variables: TLS from `PGSSLMODE`,
    /// `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY` in `env`.
    pub fn from_config_with_env(
        config: Config,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConnectError> {
        Self::with_tls(config, &[], env)
    }

    /// `config` with TLS as the `params` taken out of a URL say, else as `env` says, else
    /// libpq's default (`prefer`).
    fn with_tls(
        config: Config,
        params: &[(String, String)],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConnectError> {
        let mut settings = Self::from_config(config);
        settings.ssl_mode = SslMode::Prefer;
        let lookup = |key: &str, env_key: &str| {
            params
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .or_else(|| env(env_key).filter(|v| !v.is_empty()))
        };
        if let Some(mode) = lookup("sslmode", "PGSSLMODE") {
            settings.ssl_mode = mode.parse()?;
        }
        settings.ssl_root_cert = lookup("sslrootcert", "PGSSLROOTCERT").map(|v| {
            if v == "system" {
                RootCert::System
            } else {
                RootCert::File(PathBuf::from(v))
            }
        });
        settings.ssl_cert = lookup("sslcert", "PGSSLCERT").map(PathBuf::from);
        settings.ssl_key = lookup("sslkey", "PGSSLKEY").map(PathBuf::from);
        if settings.ssl_cert.is_some() != settings.ssl_key.is_some() {
            return Err(ConnectError::Invalid(
                "sslcert and sslkey go together: give both or neither".to_owned(),
            ));
        }
        Ok(settings)
    }

    /// The same settings with `pooler` as the statement mode.
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// The driver configuration with the wire-level TLS mode set.
    pub fn wire_config(&self) -> Config {
        let mut config = self.config.clone();
        config.ssl_mode(match self.ssl_mode {
            SslMode::Disable => WireSslMode::Disable,
            SslMode::Prefer => WireSslMode::Prefer,
            _ => WireSslMode::Require,
        });
        config
    }

    /// Builds the TLS connector: reads the certificate files now, so a missing or unreadable
    /// file is reported before any connection attempt.
    pub fn connector(&self) -> Result<Connector, ConnectError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let algorithms = provider.signature_verification_algorithms;
        let roots = match (&self.ssl_root_cert, self.ssl_mode) {
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
                            self.ssl_mode
                        )));
                    }
                }
            }
            (None, _) => None,
        };
        let verifier: Arc<dyn ServerCertVerifier> = match (roots, self.ssl_mode) {
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
        let config = match (&self.ssl_cert, &self.ssl_key) {
            (Some(cert), Some(key)) if self.ssl_mode != SslMode::Disable => {
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
        Ok(Connector {
            tls: MakeRustlsConnect::new(config),
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

fn find_rustls_error(error: &tokio_postgres::Error) -> Option<&rustls::Error> {
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

/// libpq's default root certificate file, `~/.postgresql/root.crt`.
fn default_root_cert() -> Option<PathBuf> {
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

/// Checks the chain against the roots but not the host name (`verify-ca`, and `require`
/// with a root certificate, as libpq does).
#[derive(Debug)]
struct IgnoreHostName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for IgnoreHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError as C;
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                C::NotValidForName | C::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Encrypts without authenticating the server (`prefer`, and `require` without a root
/// certificate, as libpq). The handshake signature is still checked, so the session key
/// belongs to whoever holds the presented certificate.
#[derive(Debug)]
struct Unverified(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// Splits the TLS parameters out of a URL's query or a key=value string; the rest goes to the
/// driver's parser, which knows none of them but `sslmode`, and only three of its values.
fn split_tls_params(text: &str) -> (String, Vec<(String, String)>) {
    let mut tls = Vec::new();
    if text.contains("://") {
        let Some(q) = text.find('?') else {
            return (text.to_owned(), tls);
        };
        let (base, query) = (&text[..q], &text[q + 1..]);
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if TLS_KEYS.contains(&key) {
                tls.push((key.to_owned(), percent_decode(value)));
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (rest, tls);
    }
    let mut kept = Vec::new();
    for pair in text.split_whitespace() {
        match pair.split_once('=') {
            Some((key, value)) if TLS_KEYS.contains(&key) => {
                tls.push((key.to_owned(), value.trim_matches('\'').to_owned()));
            }
            _ => kept.push(pair),
        }
    }
    (kept.join(" "), tls)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%' && i + 2 < bytes.len())
            .then(|| std::str::from_utf8(&bytes[i + 1..i + 3]).ok())
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        if let Some(byte) = escaped {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConnectSettings, ConnectError> {
        ConnectSettings::parse_with_env(text, |_| None)
    }

    #[test]
    fn reads_tls_params_from_urls_and_key_values() {
        let s = parse(
            "postgresql://u@db:5432/x?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&\
             application_name=a",
        )
        .unwrap();
        assert_eq!(s.ssl_mode, SslMode::VerifyFull);
        assert_eq!(
            s.ssl_root_cert,
            Some(RootCert::File(PathBuf::from("/etc/ca.pem")))
        );
        assert_eq!(s.config.get_application_name(), Some("a"));
        assert_eq!(s.wire_config().get_ssl_mode(), WireSslMode::Require);

        let s = parse("host=db user=u sslmode=disable sslrootcert=system").unwrap();
        assert_eq!(s.ssl_mode, SslMode::Disable);
        assert_eq!(s.ssl_root_cert, Some(RootCert::System));
        assert_eq!(parse("host=db").unwrap().ssl_mode, SslMode::Prefer);
    }

    #[test]
    fn environment_fills_what_the_url_leaves_out() {
        let env = |k: &str| match k {
            "PGSSLMODE" => Some("require".to_owned()),
            "PGSSLROOTCERT" => Some("/ca.pem".to_owned()),
            _ => None,
        };
        let s = ConnectSettings::parse_with_env("postgresql://u@db/x", env).unwrap();
        assert_eq!(s.ssl_mode, SslMode::Require);
        assert_eq!(
            s.ssl_root_cert,
            Some(RootCert::File(PathBuf::from("/ca.pem")))
        );
        let s =
            ConnectSettings::parse_with_env("postgresql://u@db/x?sslmode=disable", env).unwrap();
        assert_eq!(s.ssl_mode, SslMode::Disable);
    }

    #[test]
    fn refuses_bad_values() {
        let err = parse("postgresql://u@db/x?sslmode=verify").err().unwrap();
        assert!(
            err.to_string().contains("invalid sslmode \"verify\""),
            "{err}"
        );
        assert!(matches!(err, ConnectError::Invalid(_)));
        assert!(parse("postgresql://u@db/x?sslcert=/c.pem").is_err());
        assert!("bouncer".parse::<Pooler>().is_err());
        assert_eq!(
            "transaction".parse::<Pooler>().unwrap(),
            Pooler::Transaction
        );
    }

    #[test]
    fn names_missing_files() {
        let s = parse("postgresql://u@db/x?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")
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
