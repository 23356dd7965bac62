//! Which `Host` a request may name: the defence against DNS rebinding. A page on another
//! site can make a browser resolve the site's own name to this server's address and then read
//! the dashboard and the streams as a same-origin page; such a request names the other site
//! in its `Host`. So the server answers only requests that name it:
//!
//! - an IP address: the listen address's own (any port), or, when the server listens on an
//!   unspecified address (`0.0.0.0`, `::`), any IP address, since it then answers on every
//!   local interface (a Kubernetes probe names the pod's IP). An IP literal is never a
//!   rebinding: the browser's origin is then that address itself;
//! - a loopback name: `localhost` (any port), `127.0.0.1` and `[::1]` are IP addresses above,
//!   always accepted;
//! - a name given with `--allowed-host` (`NAME` with any port, or `NAME:PORT` with that one),
//!   compared without regard to case.
//!
//! Anything else is `421 Misdirected Request` with a JSON error naming the `Host`. A request
//! without a `Host` (HTTP/1.0) comes from no browser and is answered.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::json;

use crate::state::{error, quoted};

/// A `--allowed-host` value that is not a host name (with an optional port).
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid --allowed-host {value:?}: {problem} (expected NAME or NAME:PORT, such as outbox.example.com or outbox.example.com:8080)"
)]
pub struct InvalidAllowedHost {
    /// The value given.
    pub value: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// One `--allowed-host`: a name, and the one port it is accepted with, if given.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Allowed {
    name: String,
    port: Option<u16>,
}

/// The hosts a server answers; see the module docs.
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    /// The address the server listens on.
    listen: IpAddr,
    /// The `--allowed-host` values.
    allowed: Vec<Allowed>,
}

impl AllowedHosts {
    /// The hosts of a server listening on `listen`, with `allowed` names (`NAME` or
    /// `NAME:PORT`) besides.
    pub fn new(listen: SocketAddr, allowed: &[String]) -> Result<Self, InvalidAllowedHost> {
        let allowed = allowed
            .iter()
            .map(|value| parse_allowed(value))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            listen: listen.ip(),
            allowed,
        })
    }

    /// Checks that every `--allowed-host` value is well formed, before the server starts.
    pub fn check(values: &[String]) -> Result<(), InvalidAllowedHost> {
        values.iter().try_for_each(|v| parse_allowed(v).map(drop))
    }

    /// Whether a request naming `host` (a `Host` header's value) is answered.
    pub fn accepts(&self, host: &str) -> bool {
        let Some((name, port)) = split_host(host) else {
            return false;
        };
        if let Ok(ip) = name.parse::<IpAddr>() {
            return ip.is_loopback() || ip == self.listen || self.listen.is_unspecified();
        }
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        if name == "localhost" {
            return true;
        }
        self.allowed
            .iter()
            .any(|a| a.name == name && a.port.is_none_or(|p| Some(p) == port))
    }
}

/// `NAME` or `NAME:PORT`, the name lower-cased without a final dot.
fn parse_allowed(value: &str) -> Result<Allowed, InvalidAllowedHost> {
    let invalid = |problem| InvalidAllowedHost {
        value: value.to_owned(),
        problem,
    };
    if value.contains("://") || value.contains('/') {
        return Err(invalid("give a host name, not a URL"));
    }
    let (name, port) = split_host(value).ok_or_else(|| invalid("not a host name"))?;
    let name = name.strip_suffix('.').unwrap_or(name);
    let valid = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if !valid {
        return Err(invalid(
            "a host name is made of letters, digits, '.', '-' and '_'",
        ));
    }
    Ok(Allowed {
        name: name.to_ascii_lowercase(),
        port,
    })
}

/// A `Host` value's host and port: `name`, `name:port`, `1.2.3.4:port`, `[::1]:port`;
/// `None` when it is not of that form (a port that is not a number, an unclosed bracket).
fn split_host(host: &str) -> Option<(&str, Option<u16>)> {
    let host = host.trim();
    if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?.parse().ok()?),
        };
        return Some((inside, port));
    }
    match host.rsplit_once(':') {
        // A bare IPv6 address (no brackets) has several colons and no port.
        Some((name, _)) if name.contains(':') => Some((host, None)),
        Some((name, port)) => Some((name, Some(port.parse().ok()?))),
        None => Some((host, None)),
    }
}

/// The middleware refusing requests whose `Host` this server does not answer.
pub(crate) async fn check_host(
    State(hosts): State<Arc<AllowedHosts>>,
    request: Request,
    next: Next,
) -> Response {
    let named = request
        .headers()
        .get(header::HOST)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    match named {
        Some(host) if !hosts.accepts(&host) => error(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "Host {} is not a name of this server: it answers its listen address, \
                 localhost and the names given with --allowed-host (a page of another site \
                 may not read it through DNS rebinding)",
                quoted(&host)
            ),
            json!({ "host": host }),
        ),
        _ => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(listen: &str, allowed: &[&str]) -> AllowedHosts {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        AllowedHosts::new(listen.parse().unwrap(), &allowed).unwrap()
    }

    #[test]
    fn loopback_names_and_the_listen_address_are_answered() {
        let h = hosts("10.1.2.3:8080", &[]);
        for ok in [
            "localhost",
            "LOCALHOST:9999",
            "localhost.:8080",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:8080",
            "::1",
            "10.1.2.3",
            "10.1.2.3:8080",
        ] {
            assert!(h.accepts(ok), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:8080",
            "10.1.2.4:8080",
            "localhost.evil.example",
            "127.0.0.1:x",
            "[::1",
            "",
        ] {
            assert!(!h.accepts(refused), "{refused}");
        }
    }

    #[test]
    fn an_unspecified_listen_address_answers_every_ip_but_no_unknown_name() {
        for listen in ["0.0.0.0:8080", "[::]:8080"] {
            let h = hosts(listen, &[]);
            assert!(h.accepts("10.244.1.7:8080"), "{listen}");
            assert!(h.accepts("[fd00::7]:8080"), "{listen}");
            assert!(!h.accepts("evil.example:8080"), "{listen}");
        }
    }

    #[test]
    fn allowed_hosts_match_without_case_and_by_port_when_given() {
        let h = hosts(
            "0.0.0.0:8080",
            &["Outbox.Example.com", "svc.ns:80", "dash.local."],
        );
        assert!(h.accepts("outbox.example.com"));
        assert!(h.accepts("OUTBOX.example.com:8443"));
        assert!(h.accepts("svc.ns:80"));
        assert!(!h.accepts("svc.ns:8080"));
        assert!(!h.accepts("svc.ns"));
        assert!(h.accepts("dash.local"));
        assert!(!h.accepts("example.com"));
    }

    #[test]
    fn malformed_allowed_hosts_are_refused() {
        for bad in ["", "http://x", "x/y", "a b", "x:port", ":80"] {
            let error = AllowedHosts::check(&[bad.to_owned()]).expect_err(bad);
            assert!(error.to_string().contains("--allowed-host"), "{error}");
        }
        AllowedHosts::check(&["x.example:8080".to_owned(), "[::1]:80".to_owned()]).unwrap();
    }
}
