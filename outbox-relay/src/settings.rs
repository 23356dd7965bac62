//! What the relay is told on the command line, checked before anything connects: NATS server
//! addresses, the subject prefix, the stream name. Pure functions, so every refusal has a unit
//! test and a message naming the problem.

/// One NATS server address, as the operator wrote it (`nats://host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsServer {
    /// `host:port` (port 4222 when omitted), what the client connects to.
    pub address: String,
    /// The text as given, for messages (user info removed).
    pub shown: String,
}

/// Parses `--nats-url`: one `nats://HOST[:PORT]` or several, comma-separated (a cluster's seed
/// list). Only the `nats` scheme is accepted: this build speaks plain NATS, and a URL whose
/// scheme the relay would quietly reinterpret is worse than a refusal.
pub fn parse_nats_urls(text: &str) -> Result<Vec<NatsServer>, String> {
    let mut servers = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!(
                "invalid --nats-url {text:?}: empty entry (expected nats://HOST:PORT[,nats://HOST:PORT...])"
            ));
        }
        servers.push(parse_nats_url(part)?);
    }
    Ok(servers)
}

fn parse_nats_url(text: &str) -> Result<NatsServer, String> {
    let Some((scheme, rest)) = text.split_once("://") else {
        return Err(format!(
            "invalid --nats-url {text:?}: missing scheme (expected nats://HOST:PORT)"
        ));
    };
    if !scheme.eq_ignore_ascii_case("nats") {
        return Err(format!(
            "invalid --nats-url {text:?}: unknown scheme {scheme:?} (only nats:// is supported)"
        ));
    }
    if rest.contains(['@', '/', '?', '#']) {
        return Err(format!(
            "invalid --nats-url {text:?}: only nats://HOST:PORT is supported (no credentials, path or query)"
        ));
    }
    let (host, port) = split_host_port(rest)
        .ok_or_else(|| format!("invalid --nats-url {text:?}: expected nats://HOST:PORT"))?;
    if host.is_empty() {
        return Err(format!("invalid --nats-url {text:?}: empty host"));
    }
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "invalid --nats-url {text:?}: the host contains whitespace"
        ));
    }
    let port = match port {
        None => 4222,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("invalid --nats-url {text:?}: port {p:?} is not 1-65535"))?,
    };
    Ok(NatsServer {
        address: format!("{host}:{port}"),
        shown: format!("nats://{host}:{port}"),
    })
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

/// Checks `--subject-prefix`: one or more dot-separated NATS tokens without wildcards. The
/// relay publishes to `<prefix>.<project>.task_deleted` and its stream covers `<prefix>.>`;
/// an empty prefix would claim every subject, a wildcard would make the subjects unpublishable.
pub fn validate_subject_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Err("invalid --subject-prefix: must not be empty".into());
    }
    if let Some(c) = prefix.chars().find(|c| matches!(c, '*' | '>')) {
        return Err(format!(
            "invalid --subject-prefix {prefix:?}: wildcard {c:?} is not allowed"
        ));
    }
    if let Some(c) = prefix.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "invalid --subject-prefix {prefix:?}: character {c:?} is not allowed"
        ));
    }
    if prefix.split('.').any(str::is_empty) {
        return Err(format!(
            "invalid --subject-prefix {prefix:?}: empty token (leading, trailing or double dot)"
        ));
    }
    Ok(())
}

/// Checks `--stream`: JetStream refuses names with whitespace, `.`, `*`, `>`, `/` or `\`.
pub fn validate_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("invalid --stream: must not be empty".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Err(format!(
            "invalid --stream {name:?}: character {c:?} is not allowed in a stream name"
        ));
    }
    if name.len() > 255 {
        return Err(format!(
            "invalid --stream: {} characters, at most 255",
            name.len()
        ));
    }
    Ok(())
}

/// The subject of a project's deletions.
pub fn event_subject(prefix: &str, project: &str) -> String {
    format!("{prefix}.{project}.task_deleted")
}

/// The subject of a project's reconciliation notices.
pub fn reconcile_subject(prefix: &str, project: &str) -> String {
    format!("{prefix}.{project}.reconcile")
}

/// Whether the stream subject `pattern` matches every subject under `<prefix>.>`: token by
/// token, a literal must equal the prefix's token and `>` covers the rest; `*` covers one
/// token but can never cover the open-ended tail.
pub fn covers(pattern: &str, prefix: &str) -> bool {
    let mut want = prefix.split('.');
    for token in pattern.split('.') {
        match token {
            ">" => return true,
            "*" => {
                if want.next().is_none() {
                    return false;
                }
            }
            literal => {
                if want.next() != Some(literal) {
                    return false;
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let one = parse_nats_urls("nats://127.0.0.1:4222").unwrap();
        assert_eq!(one[0].address, "127.0.0.1:4222");
        let default_port = parse_nats_urls("nats://nats.internal").unwrap();
        assert_eq!(default_port[0].address, "nats.internal:4222");
        let three = parse_nats_urls("nats://a:1,nats://b:2, nats://c:3").unwrap();
        assert_eq!(three.len(), 3);
        assert_eq!(three[2].address, "c:3");
        let v6 = parse_nats_urls("nats://[::1]:4222").unwrap();
        assert_eq!(v6[0].address, "[::1]:4222");
        for (bad, says) in [
            ("", "empty entry"),
            ("127.0.0.1:4222", "missing scheme"),
            ("http://x:4222", "unknown scheme \"http\""),
            ("tls://x:4222", "unknown scheme"),
            ("nats://", "empty host"),
            ("nats://:4222", "empty host"),
            ("nats://x:0", "not 1-65535"),
            ("nats://x:99999", "not 1-65535"),
            ("nats://x:abc", "not 1-65535"),
            ("nats://u:p@x:4222", "no credentials"),
            ("nats://x:4222/path", "no credentials"),
            ("nats://a:1,,nats://b:2", "empty entry"),
            ("nats://a b:1", "whitespace"),
        ] {
            let err = parse_nats_urls(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn prefixes() {
        for good in ["lifecycle", "acme.lifecycle", "a-b_c"] {
            validate_subject_prefix(good).unwrap();
        }
        for (bad, says) in [
            ("", "must not be empty"),
            ("life.*", "wildcard '*'"),
            ("life.>", "wildcard '>'"),
            ("a b", "character ' '"),
            (".a", "empty token"),
            ("a.", "empty token"),
            ("a..b", "empty token"),
        ] {
            let err = validate_subject_prefix(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn stream_names() {
        validate_stream_name("LIFECYCLE").unwrap();
        for bad in ["", "A.B", "A B", "A*", "A>", "a/b"] {
            assert!(validate_stream_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn coverage() {
        assert!(covers("lifecycle.>", "lifecycle"));
        assert!(covers(">", "lifecycle"));
        assert!(covers("acme.>", "acme.lifecycle"));
        assert!(covers("*.>", "lifecycle"));
        assert!(covers("acme.*.>", "acme.lifecycle"));
        assert!(!covers("lifecycle.*", "lifecycle"));
        assert!(!covers("lifecycle.*.task_deleted", "lifecycle"));
        assert!(!covers("other.>", "lifecycle"));
        assert!(!covers("lifecycle", "lifecycle"));
        assert!(!covers("acme.lifecycle.p1.>", "acme.lifecycle"));
    }

    #[test]
    fn subjects() {
        assert_eq!(
            event_subject("lifecycle", "p1"),
            "lifecycle.p1.task_deleted"
        );
        assert_eq!(
            reconcile_subject("lifecycle", "p1"),
            "lifecycle.p1.reconcile"
        );
    }
}
