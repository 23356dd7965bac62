//! A connection string's hosts tried one by one as libpq tries them: TLS per host (never
//! over a Unix socket, whatever `sslmode` says, as libpq ignores it there), and the kind of
//! server `target_session_attrs` asks for, including the values the driver cannot check
//! itself (`primary`, `standby`, `prefer-standby`).
//!
//! The driver tries a list of hosts with one TLS mode for all, so `sslmode=require` over a
//! socket directory fails ("server does not support TLS") where libpq and `psql` connect, and
//! it knows only `any`, `read-write` and `read-only`. Here every host gets a configuration of
//! its own and is connected to alone; `read-write` and `read-only` are still checked by the
//! driver (`SHOW transaction_read_only`), `primary` and `standby` by `pg_is_in_recovery()`
//! after connecting, and `prefer-standby` tries the list for a standby first, then again for
//! any server.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::str::FromStr;
use std::task::Poll;

use futures_util::FutureExt as _;
use tokio_postgres::config::{Host, LoadBalanceHosts, SslMode as WireSslMode, TargetSessionAttrs};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::{Client, Config, Connection, Error, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::error::ConnectError;
use super::settings::SslMode;

/// A connection made by [`super::Connector::open`], whose messages the caller polls (or
/// spawns).
pub type TlsConnection = Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

/// libpq's `target_session_attrs`: which kind of server a connection must reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetSession {
    /// Any server (libpq's default).
    #[default]
    Any,
    /// A server whose sessions accept writes by default.
    ReadWrite,
    /// A server whose sessions are read-only by default (a standby, or
    /// `default_transaction_read_only = on`).
    ReadOnly,
    /// A server not in recovery.
    Primary,
    /// A server in recovery (a hot standby).
    Standby,
    /// A standby if any host is one, otherwise any server.
    PreferStandby,
}

impl TargetSession {
    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSession::Any => "any",
            TargetSession::ReadWrite => "read-write",
            TargetSession::ReadOnly => "read-only",
            TargetSession::Primary => "primary",
            TargetSession::Standby => "standby",
            TargetSession::PreferStandby => "prefer-standby",
        }
    }

    /// What the driver checks itself; the rest is checked here, so the driver checks nothing.
    pub(super) fn wire(self) -> TargetSessionAttrs {
        match self {
            TargetSession::ReadWrite => TargetSessionAttrs::ReadWrite,
            TargetSession::ReadOnly => TargetSessionAttrs::ReadOnly,
            _ => TargetSessionAttrs::Any,
        }
    }

    /// The value the driver's configuration says.
    pub(super) fn from_wire(attrs: TargetSessionAttrs) -> Self {
        match attrs {
            TargetSessionAttrs::ReadWrite => TargetSession::ReadWrite,
            TargetSessionAttrs::ReadOnly => TargetSession::ReadOnly,
            _ => TargetSession::Any,
        }
    }
}

impl fmt::Display for TargetSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TargetSession {
    type Err = ConnectError;
    fn from_str(s: &str) -> Result<Self, ConnectError> {
        Ok(match s {
            "any" => TargetSession::Any,
            "read-write" => TargetSession::ReadWrite,
            "read-only" => TargetSession::ReadOnly,
            "primary" => TargetSession::Primary,
            "standby" => TargetSession::Standby,
            "prefer-standby" => TargetSession::PreferStandby,
            other => {
                return Err(ConnectError::Invalid(format!(
                    "invalid target_session_attrs {other:?}: use any, read-write, read-only, \
                     primary, standby or prefer-standby"
                )));
            }
        })
    }
}

/// A server of the wrong kind for `target_session_attrs=primary` or `standby` (libpq's
/// words). It reaches the caller inside the driver's error, as the cause of a failed read of
/// `pg_is_in_recovery()`, so the pool (whose errors are the driver's) carries it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WrongServer {
    /// `primary` asked for, a standby found.
    #[error("server is in hot standby mode")]
    InRecovery,
    /// `standby` asked for, a primary found.
    #[error("server is not in hot standby mode")]
    NotInRecovery,
}

/// `pg_is_in_recovery()` read as a check: `true` must be `WANT_RECOVERY`.
struct Recovery<const WANT_RECOVERY: bool>;

impl<'a, const WANT_RECOVERY: bool> FromSql<'a> for Recovery<WANT_RECOVERY> {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        match (bool::from_sql(ty, raw)?, WANT_RECOVERY) {
            (true, true) | (false, false) => Ok(Recovery),
            (true, false) => Err(Box::new(WrongServer::InRecovery)),
            (false, true) => Err(Box::new(WrongServer::NotInRecovery)),
        }
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::BOOL
    }
}

/// Opens a connection to the first host of `config` that answers and is of the kind
/// `target` asks for, with TLS as `ssl_mode` says on TCP and none on a Unix socket. The
/// error is the last host's, as the driver reports it.
pub(super) async fn open(
    tls: &MakeRustlsConnect,
    config: &Config,
    ssl_mode: SslMode,
    target: TargetSession,
) -> Result<(Client, TlsConnection), Error> {
    let hosts = per_host(config, ssl_mode, target);
    let passes: &[TargetSession] = match target {
        TargetSession::PreferStandby => &[TargetSession::Standby, TargetSession::Any],
        _ => &[target],
    };
    let mut last = None;
    for &pass in passes {
        for host in &hosts {
            match open_one(tls, host, pass).await {
                Ok(opened) => return Ok(opened),
                Err(e) => last = Some(e),
            }
        }
    }
    match last {
        Some(e) => Err(e),
        // No host at all: the driver's own error for it.
        None => config.connect(tls.clone()).await,
    }
}

/// One host: connect (the driver checks `read-write` and `read-only`), then check
/// `primary` or `standby`.
async fn open_one(
    tls: &MakeRustlsConnect,
    config: &Config,
    target: TargetSession,
) -> Result<(Client, TlsConnection), Error> {
    let (client, mut connection) = config.connect(tls.clone()).await?;
    match target {
        TargetSession::Primary => {
            check::<false>(&client, &mut connection).await?;
        }
        TargetSession::Standby => {
            check::<true>(&client, &mut connection).await?;
        }
        _ => {}
    }
    Ok((client, connection))
}

/// Reads `pg_is_in_recovery()` as [`Recovery`], driving the connection meanwhile (nothing
/// else polls it yet). An unnamed statement, so a transaction pooler keeps nothing.
async fn check<const WANT_RECOVERY: bool>(
    client: &Client,
    connection: &mut TlsConnection,
) -> Result<(), Error> {
    let query = async {
        let rows = client
            .query_typed("SELECT pg_is_in_recovery()", &[])
            .await?;
        match rows.first() {
            Some(row) => row.try_get::<_, Recovery<WANT_RECOVERY>>(0).map(|_| ()),
            None => Ok(()),
        }
    };
    driving(connection, query).await
}

/// Runs `work` while polling `connection`, as the driver does for its own checks.
async fn driving<T>(
    connection: &mut TlsConnection,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let mut work = pin!(work);
    let mut ended = false;
    poll_fn(|cx| {
        if let Poll::Ready(done) = work.as_mut().poll(cx) {
            return Poll::Ready(done);
        }
        if !ended {
            match connection.poll_unpin(cx) {
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                // Closed: the work sees it on its next poll.
                Poll::Ready(Ok(())) => {
                    ended = true;
                    cx.waker().wake_by_ref();
                }
                Poll::Pending => {}
            }
        }
        Poll::Pending
    })
    .await
}

/// One configuration per host of `config`, in the order to try them (shuffled under
/// `load_balance_hosts=random`), each with the TLS mode for its kind of address and the
/// driver's part of `target`.
pub(super) fn per_host(config: &Config, ssl_mode: SslMode, target: TargetSession) -> Vec<Config> {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    let ports = config.get_ports();
    let count = hosts.len().max(addrs.len());
    let mut order: Vec<usize> = (0..count).collect();
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        shuffle(&mut order);
    }
    order
        .into_iter()
        .map(|i| {
            let mut one = without_hosts(config);
            let host = hosts.get(i);
            let addr = addrs.get(i);
            match host {
                Some(Host::Tcp(name)) => {
                    one.host(name);
                }
                #[cfg(unix)]
                Some(Host::Unix(path)) => {
                    one.host_path(path);
                }
                None => {}
            }
            if let Some(addr) = addr {
                one.hostaddr(*addr);
            }
            if let Some(port) = ports.get(i).or(ports.first()) {
                one.port(*port);
            }
            #[cfg(unix)]
            let socket = addr.is_none() && matches!(host, Some(Host::Unix(_)));
            #[cfg(not(unix))]
            let socket = false;
            one.ssl_mode(match ssl_mode {
                // libpq ignores sslmode on a Unix socket: no TLS there, and no error.
                _ if socket => WireSslMode::Disable,
                SslMode::Disable => WireSslMode::Disable,
                SslMode::Prefer => WireSslMode::Prefer,
                SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => WireSslMode::Require,
            });
            one.target_session_attrs(target.wire());
            one
        })
        .collect()
}

/// Every setting of `config` except its hosts, addresses and ports (the driver's
/// configuration can add hosts but not remove them).
fn without_hosts(config: &Config) -> Config {
    let mut one = Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    one.keepalives(config.get_keepalives());
    one.keepalives_idle(config.get_keepalives_idle());
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.ssl_mode(config.get_ssl_mode());
    one.ssl_negotiation(config.get_ssl_negotiation());
    one.target_session_attrs(config.get_target_session_attrs());
    one.channel_binding(config.get_channel_binding());
    one.load_balance_hosts(config.get_load_balance_hosts());
    one
}

/// Fisher-Yates with the standard library's randomly seeded hasher as the source.
fn shuffle(order: &mut [usize]) {
    use std::hash::{BuildHasher, Hasher};
    let state = std::collections::hash_map::RandomState::new();
    for i in (1..order.len()).rev() {
        let mut hasher = state.build_hasher();
        hasher.write_usize(i);
        let j = (hasher.finish() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
}

/// The [`WrongServer`] inside a driver error, if that is what it is.
pub(super) fn wrong_server(error: &Error) -> Option<WrongServer> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(wrong) = cause.downcast_ref::<WrongServer>() {
            return Some(*wrong);
        }
        source = cause.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_single_host_configuration_keeps_every_other_setting() {
        let text = "host=db port=7 user=u password=pw dbname=d options=-cx=1 \
                    application_name=a connect_timeout=3 tcp_user_timeout=4 keepalives=0 \
                    keepalives_idle=5 keepalives_interval=6 keepalives_retries=2 \
                    channel_binding=disable load_balance_hosts=disable sslmode=require \
                    target_session_attrs=read-write";
        let config: Config = text.parse().unwrap();
        let one = per_host(&config, SslMode::Require, TargetSession::ReadWrite);
        assert_eq!(one, vec![config.clone()]);
        assert_eq!(
            without_hosts(&config).get_connect_timeout(),
            Some(&Duration::from_secs(3))
        );
    }

    #[test]
    fn sockets_get_no_tls_and_each_host_its_port() {
        let config: Config = "host=/run/pg,db,/other port=1,2,3 user=u".parse().unwrap();
        let hosts = per_host(&config, SslMode::VerifyFull, TargetSession::Primary);
        let modes: Vec<_> = hosts.iter().map(|c| c.get_ssl_mode()).collect();
        assert_eq!(
            modes,
            [
                WireSslMode::Disable,
                WireSslMode::Require,
                WireSslMode::Disable
            ]
        );
        let ports: Vec<_> = hosts.iter().map(|c| c.get_ports().to_vec()).collect();
        assert_eq!(ports, [vec![1], vec![2], vec![3]]);
        assert!(hosts.iter().all(|c| c.get_hosts().len() == 1));
        // The driver checks nothing for `primary`: that is checked here.
        assert!(
            hosts
                .iter()
                .all(|c| c.get_target_session_attrs() == TargetSessionAttrs::Any)
        );
        let config: Config = "host=a,b port=9 user=u".parse().unwrap();
        let ports: Vec<_> = per_host(&config, SslMode::Prefer, TargetSession::Any)
            .iter()
            .map(|c| c.get_ports().to_vec())
            .collect();
        assert_eq!(ports, [vec![9], vec![9]]);
    }

    #[test]
    fn shuffling_keeps_every_host() {
        let mut order: Vec<usize> = (0..10).collect();
        shuffle(&mut order);
        order.sort_unstable();
        assert_eq!(order, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn every_libpq_value_parses_and_prints_back() {
        for text in [
            "any",
            "read-write",
            "read-only",
            "primary",
            "standby",
            "prefer-standby",
        ] {
            assert_eq!(text.parse::<TargetSession>().unwrap().as_str(), text);
        }
        assert!("bogus".parse::<TargetSession>().is_err());
    }
}
