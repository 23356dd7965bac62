//! The NATS servers the relay is told on the command line, checked before anything connects:
//! their addresses, the credentials a URL may carry, and the redaction of both for printing
//! (the subject prefix and the stream name are `subjects`'). Pure functions, so every refusal
//! has a unit test and a message naming the problem.

/// One NATS server address, as the operator wrote it (`nats://host:port`, `tls://host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsServer {
    /// `scheme://host:port` (port 4222 when omitted), what the client connects to; never
    /// with credentials, so it is also what messages show.
    pub address: String,
    /// Whether the scheme is `tls://`: the connection must use TLS.
    pub tls: bool,
}

/// The user info of a `--nats-url` (`user:password@` or `token@`), percent-decoded.
#[derive(Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// The part before `:`: a user name, or a token when no password follows.
    pub name: String,
    /// The part after `:`.
    pub password: Option<String>,
}

impl std::fmt::Debug for UserInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserInfo(***)")
    }
}

/// `--nats-url` parsed: the servers, and the credentials written in the URLs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsUrls {
    /// Servers, in the order given.
    pub servers: Vec<NatsServer>,
    /// Credentials from the URLs (the same in every entry that has any).
    pub user_info: Option<UserInfo>,
}

/// Parses `--nats-url`: one `nats://[USER:PASSWORD@|TOKEN@]HOST[:PORT]` or several,
/// comma-separated (a cluster's seed list); `tls://` instead of `nats://` requires TLS. Other
/// schemes are refused: a URL the relay would quietly reinterpret is worse than a refusal.
/// Messages never repeat a password or token (see `redact`).
pub fn parse_nats_urls(text: &str) -> Result<NatsUrls, String> {
    let mut servers = Vec::new();
    let mut user_info: Option<UserInfo> = None;
    for part in text.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!(
                "invalid --nats-url {:?}: empty entry (expected nats://HOST:PORT[,nats://HOST:PORT...])",
                redact_nats_urls(text)
            ));
        }
        let (server, info) = parse_nats_url(part, text)?;
        if let Some(info) = info {
            if user_info.as_ref().is_some_and(|known| *known != info) {
                return Err(format!(
                    "invalid --nats-url {:?}: the entries carry different credentials (give \
                     them once, the same for every server)",
                    redact_nats_urls(text)
                ));
            }
            user_info = Some(info);
        }
        servers.push(server);
    }
    if servers.iter().any(|s| s.tls) && servers.iter().any(|s| !s.tls) {
        return Err(format!(
            "invalid --nats-url {:?}: mixes tls:// and nats:// (use tls:// for every server, \
             or --nats-tls-required)",
            redact_nats_urls(text)
        ));
    }
    Ok(NatsUrls { servers, user_info })
}

/// Parses one entry of `whole`; messages show `whole` redacted, and pieces of the entry (a
/// scheme, a port) only when `whole` has no credentials a piece could be part of.
fn parse_nats_url(text: &str, whole: &str) -> Result<(NatsServer, Option<UserInfo>), String> {
    let shown = redact_nats_urls(whole);
    let piece = |piece: &str| {
        if whole.contains('@') {
            String::new()
        } else {
            format!(" {piece:?}")
        }
    };
    let Some((scheme, rest)) = text.split_once("://") else {
        return Err(format!(
            "invalid --nats-url {shown:?}: missing scheme (expected nats://HOST:PORT)"
        ));
    };
    let tls = if scheme.eq_ignore_ascii_case("nats") {
        false
    } else if scheme.eq_ignore_ascii_case("tls") {
        true
    } else {
        return Err(format!(
            "invalid --nats-url {shown:?}: unknown scheme{} (nats:// or tls://)",
            piece(scheme)
        ));
    };
    let (user_info, rest) = match rest.rsplit_once('@') {
        Some((info, host)) => (Some(parse_user_info(info, &shown)?), host),
        None => (None, rest),
    };
    if rest.contains(['/', '?', '#']) {
        return Err(format!(
            "invalid --nats-url {shown:?}: only nats://HOST:PORT is supported (no path or query)"
        ));
    }
    let (host, port) = split_host_port(rest)
        .ok_or_else(|| format!("invalid --nats-url {shown:?}: expected nats://HOST:PORT"))?;
    if host.is_empty() {
        return Err(format!("invalid --nats-url {shown:?}: empty host"));
    }
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "invalid --nats-url {shown:?}: the host contains whitespace"
        ));
    }
    let port = match port {
        None => 4222,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
            format!(
                "invalid --nats-url {shown:?}: port{} is not 1-65535",
                piece(p)
            )
        })?,
    };
    let scheme = if tls { "tls" } else { "nats" };
    let server = NatsServer {
        address: format!("{scheme}://{host}:{port}"),
        tls,
    };
    Ok((server, user_info))
}

/// `user:password` or `token`, percent-decoded.
fn parse_user_info(info: &str, shown: &str) -> Result<UserInfo, String> {
    let (name, password) = match info.split_once(':') {
        Some((name, password)) => (name, Some(password)),
        None => (info, None),
    };
    let decode = |part: &str| {
        percent_decode(part).ok_or_else(|| {
            format!(
                "invalid --nats-url {shown:?}: the credentials are not valid percent-encoded UTF-8"
            )
        })
    };
    let name = decode(name)?;
    if name.is_empty() {
        return Err(format!(
            "invalid --nats-url {shown:?}: empty user name or token before '@'"
        ));
    }
    Ok(UserInfo {
        name,
        password: password.map(decode).transpose()?,
    })
}

/// Decodes `%XX` escapes; `None` for a malformed escape or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `--nats-url` with its credentials masked: `scheme://user:***@host` for a password, or
/// `scheme://***@host` for a token, which is a secret in its own right. Conservative, so safe
/// to print whatever the text: everything between the scheme and the *last* `@` is masked
/// (in a list with credentials, the hosts before the last one are masked too), and a user
/// name is kept only when it cannot hold a piece of anything else.
pub(crate) fn redact_nats_urls(text: &str) -> String {
    let Some(at) = text.rfind('@') else {
        return text.to_owned();
    };
    let start = match text.find("://") {
        Some(i) if i + 3 <= at && text[..i].chars().all(|c| c.is_ascii_alphanumeric()) => i + 3,
        _ => 0,
    };
    let user = text[start..at]
        .split_once(':')
        .map(|(user, _)| user)
        .filter(|user| !user.is_empty() && !user.contains(['@', ',', '/']));
    match user {
        Some(user) => format!("{}{user}:***{}", &text[..start], &text[at..]),
        None => format!("{}***{}", &text[..start], &text[at..]),
    }
}

/// Splits `host[:port]`, keeping a bracketed IPv6 host whole.
fn split_host_port(text: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let host = &text[..host.len() + 2];
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?))),
        };
    }
    match text.rsplit_once(':') {
        Some((host, _)) if host.contains(':') => None,
        Some((host, port)) => Some((host, Some(port))),
        None => Some((text, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let one = parse_nats_urls("nats://127.0.0.1:4222").unwrap();
        assert_eq!(one.servers[0].address, "nats://127.0.0.1:4222");
        assert_eq!(one.user_info, None);
        let default_port = parse_nats_urls("nats://nats.internal").unwrap();
        assert_eq!(default_port.servers[0].address, "nats://nats.internal:4222");
        let three = parse_nats_urls("nats://a:1,nats://b:2, nats://c:3").unwrap();
        assert_eq!(three.servers.len(), 3);
        assert_eq!(three.servers[2].address, "nats://c:3");
        let v6 = parse_nats_urls("nats://[::1]:4222").unwrap();
        assert_eq!(v6.servers[0].address, "nats://[::1]:4222");
        let tls = parse_nats_urls("tls://n1:4222,TLS://n2").unwrap();
        assert!(tls.servers.iter().all(|s| s.tls));
        assert_eq!(tls.servers[1].address, "tls://n2:4222");
        for (bad, says) in [
            ("", "empty entry"),
            ("127.0.0.1:4222", "missing scheme"),
            ("http://x:4222", "unknown scheme \"http\""),
            ("nats://", "empty host"),
            ("nats://:4222", "empty host"),
            ("nats://x:0", "not 1-65535"),
            ("nats://x:99999", "not 1-65535"),
            ("nats://x:abc", "port \"abc\" is not 1-65535"),
            ("nats://x:4222/path", "no path or query"),
            ("nats://a:1,,nats://b:2", "empty entry"),
            ("nats://a b:1", "whitespace"),
            ("nats://a:1,tls://b:2", "mixes tls:// and nats://"),
            ("nats://u:p@a:1,nats://u:q@b:2", "different credentials"),
            ("nats://@a:1", "empty user name or token"),
            ("nats://u:%zz@a:1", "percent-encoded"),
        ] {
            let err = parse_nats_urls(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn credentials_in_urls() {
        let user = parse_nats_urls("nats://relayer:s3cr%40t@127.0.0.1:4222").unwrap();
        assert_eq!(user.servers[0].address, "nats://127.0.0.1:4222");
        let info = user.user_info.unwrap();
        assert_eq!(info.name, "relayer");
        assert_eq!(info.password.as_deref(), Some("s3cr@t"));
        assert_eq!(format!("{info:?}"), "UserInfo(***)");
        let token = parse_nats_urls("tls://t0ken@n1,tls://t0ken@n2").unwrap();
        assert_eq!(token.user_info.unwrap().name, "t0ken");
        assert_eq!(token.servers.len(), 2);
        let err = parse_nats_urls("nats://relayer:s3cret@x:abc").unwrap_err();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.contains("nats://relayer:***@x:abc"), "{err}");
    }

    #[test]
    fn redaction() {
        for (text, shown) in [
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("nats://u:pw@h:1", "nats://u:***@h:1"),
            ("tls://tok@h:1", "tls://***@h:1"),
            ("nats://u:a,b@h", "nats://u:***@h"),
            ("nats://u:a://b@h", "nats://u:***@h"),
            ("u:a://b@h", "u:***@h"),
            ("nats://tok@a:1,nats://u:p@b:2", "nats://***@b:2"),
            ("nats://u:p@a:1,nats://u:p@b:2", "nats://u:***@b:2"),
        ] {
            assert_eq!(redact_nats_urls(text), shown, "{text}");
        }
    }

    proptest::proptest! {
        /// No password or token, however it is written into `--nats-url`, appears in the
        /// redacted URL or in any refusal of the URL.
        #[test]
        fn no_secret_of_a_nats_url_is_ever_printed(
            secret in "[!-~]{4,24}",
            user in proptest::option::of("[a-z]{1,8}"),
            hosts in proptest::sample::select(vec![
                "127.0.0.1:4222", "n1", "n1:4222,nats://n2:4222", "x:abc", "x:4222/p", "[::1]:1",
            ]),
            scheme in proptest::sample::select(vec!["nats://", "tls://", "", "http://"]),
        ) {
            // A token with a ':' is a user and a password to every URL parser.
            proptest::prop_assume!(user.is_some() || !secret.contains(':'));
            let info = match &user {
                Some(user) => format!("{user}:{secret}"),
                None => secret.clone(),
            };
            let text = format!("{scheme}{info}@{hosts}");
            // A secret that is also a piece of the rest of the text cannot be told apart.
            let rest = text.replacen(&secret, "", 1);
            proptest::prop_assume!(!rest.contains(&secret) && !"***".contains(&secret));
            let shown = redact_nats_urls(&text);
            proptest::prop_assert!(!shown.contains(&secret), "{text:?} shown as {shown:?}");
            if let Err(message) = parse_nats_urls(&text) {
                proptest::prop_assert!(
                    !message.contains(&secret),
                    "{text:?} refused as {message:?}"
                );
            }
        }
    }
}
