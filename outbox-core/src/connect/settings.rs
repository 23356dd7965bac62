//! [`ConnectSettings`] and the values it carries ([`SslMode`], [`RootCert`], [`Pooler`]):
//! parsing a URL or key=value string, with the parameters the driver does not know (or does
//! not read as libpq does) taken out first, and libpq's environment filling what the text
//! leaves out. Both forms may name several hosts (`postgresql://h1:5432,h2:5432/db`,
//! `?host=/a,/b&port=1,2`, `host=a,b port=1,2`), tried in order, with libpq's
//! `target_session_attrs` (`read-write` or `primary` to skip a standby; see `hosts`).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use percent_encoding::percent_decode_str;
use tokio_postgres::Config;
use tokio_postgres::config::SslMode as WireSslMode;

use super::error::ConnectError;
use super::hosts::TargetSession;

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
    /// The kind of server to reach (`target_session_attrs`); the driver's configuration
    /// carries only the part it checks itself.
    pub target_session: TargetSession,
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
            .field("target_session", &self.target_session)
            .finish()
    }
}

/// The parameters this module handles itself, in both forms: the TLS ones (the driver knows
/// none but `sslmode`, and only three of its values) and `target_session_attrs` (which may
/// also come from `PGTARGETSESSIONATTRS`, so whether the text gave it must be known).
const OWN_KEYS: [&str; 5] = [
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "target_session_attrs",
];

impl ConnectSettings {
    /// Settings for an already-parsed configuration, with libpq's defaults (`prefer`).
    pub fn from_config(config: Config) -> Self {
        let ssl_mode = match config.get_ssl_mode() {
            WireSslMode::Disable => SslMode::Disable,
            WireSslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        };
        let target_session = TargetSession::from_wire(config.get_target_session_attrs());
        Self {
            config,
            ssl_mode,
            ssl_root_cert: None,
            ssl_cert: None,
            ssl_key: None,
            pooler: Pooler::None,
            target_session,
        }
    }

    /// Parses a `postgresql://` URL or a key=value string, taking the TLS variables
    /// (`PGSSLMODE`, `PGSSLROOTCERT`, ...) and `PGTARGETSESSIONATTRS` from the process
    /// environment where the text does not set them.
    pub fn parse(text: &str) -> Result<Self, ConnectError> {
        Self::parse_with_env(text, |key| std::env::var(key).ok())
    }

    /// Like [`ConnectSettings::parse`], with the environment given (for tests).
    pub fn parse_with_env(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConnectError> {
        let (rest, own) = split_own_params(text);
        let mut config =
            Config::from_str(&rest).map_err(|e| ConnectError::Invalid(e.to_string()))?;
        for (_, hosts) in own.iter().filter(|(key, _)| key == "host") {
            add_hosts(&mut config, hosts);
        }
        Self::with_own_params(config, &own, env)
    }

    /// Settings for a configuration read from the libpq variables: TLS from `PGSSLMODE`,
    /// `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY`, the session wanted from
    /// `PGTARGETSESSIONATTRS`, in `env`.
    pub fn from_config_with_env(
        config: Config,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConnectError> {
        Self::with_own_params(config, &[], env)
    }

    /// `config` with TLS and `target_session_attrs` as the `params` taken out of the text
    /// say, else as `env` says, else libpq's defaults (`prefer`, `any`); refused when the
    /// hosts and ports do not pair up.
    fn with_own_params(
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
        if let Some(attrs) = lookup("target_session_attrs", "PGTARGETSESSIONATTRS") {
            let target: TargetSession = attrs.parse()?;
            settings.config.target_session_attrs(target.wire());
            settings.target_session = target;
        }
        check_host_and_port_counts(&settings.config)?;
        Ok(settings)
    }

    /// The same settings with `pooler` as the statement mode.
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// The driver configuration with the wire-level TLS mode set: none when every host is a
    /// Unix socket (libpq ignores `sslmode` there). [`super::Connector`] sets it per host
    /// when the hosts are of both kinds.
    pub fn wire_config(&self) -> Config {
        let mut config = self.config.clone();
        config.ssl_mode(match self.ssl_mode {
            _ if self.only_sockets() => WireSslMode::Disable,
            SslMode::Disable => WireSslMode::Disable,
            SslMode::Prefer => WireSslMode::Prefer,
            _ => WireSslMode::Require,
        });
        config
    }

    /// True when every host is a Unix socket directory (and no `hostaddr` is given).
    pub(super) fn only_sockets(&self) -> bool {
        let hosts = self.config.get_hosts();
        #[cfg(unix)]
        let sockets = hosts
            .iter()
            .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
        #[cfg(not(unix))]
        let sockets = false;
        !hosts.is_empty() && self.config.get_hostaddrs().is_empty() && sockets
    }
}

/// Adds the hosts of a URL's `host` query parameter: comma-separated, each a socket directory
/// (starting with `/`) or a host name. The driver's URL parser takes the whole value as one
/// host, so `?host=/a,/b&port=1,2` would name one host with two ports.
fn add_hosts(config: &mut Config, hosts: &str) {
    for host in hosts.split(',') {
        if host.starts_with('/') {
            config.host_path(host);
        } else {
            config.host(host);
        }
    }
}

/// libpq's rule: one port for every host, or one port per host. The driver would only find
/// out when connecting, as `invalid number of ports`.
fn check_host_and_port_counts(config: &Config) -> Result<(), ConnectError> {
    let hosts = config.get_hosts().len().max(config.get_hostaddrs().len());
    let ports = config.get_ports().len();
    if ports > 1 && ports != hosts {
        return Err(ConnectError::Invalid(format!(
            "{hosts} host(s) but {ports} ports: give one port for all hosts, or one per host"
        )));
    }
    Ok(())
}

/// Splits the parameters this module handles ([`OWN_KEYS`], and a URL's `host`) out of a
/// URL's query or a key=value string; the rest goes to the driver's parser.
fn split_own_params(text: &str) -> (String, Vec<(String, String)>) {
    let mut own = Vec::new();
    if text.contains("://") {
        let Some(q) = text.find('?') else {
            return (text.to_owned(), own);
        };
        let (base, query) = (&text[..q], &text[q + 1..]);
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if OWN_KEYS.contains(&key) || key == "host" {
                own.push((
                    key.to_owned(),
                    percent_decode_str(value).decode_utf8_lossy().into_owned(),
                ));
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (rest, own);
    }
    let mut kept = Vec::new();
    for pair in text.split_whitespace() {
        match pair.split_once('=') {
            Some((key, value)) if OWN_KEYS.contains(&key) => {
                own.push((key.to_owned(), value.trim_matches('\'').to_owned()));
            }
            _ => kept.push(pair),
        }
    }
    (kept.join(" "), own)
}

#[cfg(test)]
mod tests {
    use tokio_postgres::config::TargetSessionAttrs;

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
    fn reads_every_multi_host_form() {
        use tokio_postgres::config::Host;
        let s = parse("postgresql://u@h1:5433,h2/db?target_session_attrs=read-write").unwrap();
        assert_eq!(
            s.config.get_hosts(),
            [Host::Tcp("h1".into()), Host::Tcp("h2".into())]
        );
        assert_eq!(s.config.get_ports(), [5433, 5432]);
        assert_eq!(
            s.config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );

        let s = parse("postgresql://u@/db?host=/a,%2Fb&port=5611,5612").unwrap();
        assert_eq!(
            s.config.get_hosts(),
            [Host::Unix("/a".into()), Host::Unix("/b".into())]
        );
        assert_eq!(s.config.get_ports(), [5611, 5612]);
        assert_eq!(s.config.get_dbname(), Some("db"));

        let s = parse("host=a,/b port=1,2 target_session_attrs=read-only").unwrap();
        assert_eq!(
            s.config.get_hosts(),
            [Host::Tcp("a".into()), Host::Unix("/b".into())]
        );
        assert_eq!(
            s.config.get_target_session_attrs(),
            TargetSessionAttrs::ReadOnly
        );
        // One port serves every host.
        assert_eq!(parse("host=a,b port=7").unwrap().config.get_ports(), [7]);
    }

    #[test]
    fn target_session_attrs_from_the_environment_unless_the_text_sets_it() {
        let env = |k: &str| (k == "PGTARGETSESSIONATTRS").then(|| "read-write".to_owned());
        let s = ConnectSettings::parse_with_env("host=a,b", env).unwrap();
        assert_eq!(
            s.config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        let s = ConnectSettings::parse_with_env("host=a target_session_attrs=any", env).unwrap();
        assert_eq!(s.config.get_target_session_attrs(), TargetSessionAttrs::Any);
        let s = ConnectSettings::from_config_with_env(Config::new(), env).unwrap();
        assert_eq!(
            s.config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
    }

    #[test]
    fn refuses_bad_multi_host_strings() {
        for (text, expected) in [
            (
                "postgresql://u@h/db?target_session_attrs=bogus",
                "invalid target_session_attrs \"bogus\"",
            ),
            (
                "host=a target_session_attrs=bogus",
                "invalid target_session_attrs",
            ),
            (
                "postgresql://u@/db?host=/a,/b&port=1,2,3",
                "2 host(s) but 3 ports",
            ),
            ("host=a,b,c port=1,2", "3 host(s) but 2 ports"),
        ] {
            let err = parse(text)
                .err()
                .unwrap_or_else(|| panic!("{text} was accepted"));
            assert!(matches!(err, ConnectError::Invalid(_)), "{text}: {err:?}");
            assert!(err.to_string().contains(expected), "{text}: {err}");
        }
        let env = |k: &str| (k == "PGTARGETSESSIONATTRS").then(|| "master".to_owned());
        assert!(ConnectSettings::parse_with_env("host=a", env).is_err());
    }

    #[test]
    fn accepts_every_libpq_target_session_attrs_value() {
        for (text, target, wire) in [
            ("primary", TargetSession::Primary, TargetSessionAttrs::Any),
            ("standby", TargetSession::Standby, TargetSessionAttrs::Any),
            (
                "prefer-standby",
                TargetSession::PreferStandby,
                TargetSessionAttrs::Any,
            ),
            (
                "read-write",
                TargetSession::ReadWrite,
                TargetSessionAttrs::ReadWrite,
            ),
        ] {
            let s = parse(&format!("host=a,b target_session_attrs={text}")).unwrap();
            assert_eq!(s.target_session, target, "{text}");
            assert_eq!(s.config.get_target_session_attrs(), wire, "{text}");
            let env = |k: &str| (k == "PGTARGETSESSIONATTRS").then(|| text.to_owned());
            let s = ConnectSettings::parse_with_env("postgresql://u@h1,h2/db", env).unwrap();
            assert_eq!(s.target_session, target, "{text}");
        }
    }

    #[test]
    fn tls_is_never_asked_for_on_a_socket() {
        for mode in ["require", "verify-ca", "verify-full"] {
            let s = parse(&format!("host=/run/pg,/other user=u sslmode={mode}")).unwrap();
            assert_eq!(
                s.wire_config().get_ssl_mode(),
                WireSslMode::Disable,
                "{mode}"
            );
            let s = parse(&format!("host=/run/pg,db user=u sslmode={mode}")).unwrap();
            assert_eq!(
                s.wire_config().get_ssl_mode(),
                WireSslMode::Require,
                "{mode}"
            );
        }
    }
}
