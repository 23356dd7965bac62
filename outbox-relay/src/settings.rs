//! What the relay is told on the command line, checked before anything connects: NATS server
//! addresses, the subject prefix, the stream name. Pure functions, so every refusal has a unit
//! test and a message naming the problem.

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
pub fn redact_nats_urls(text: &str) -> String {
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

/// Checks `--subject-prefix`: one or more dot-separated NATS tokens without wildcards. The
/// relay publishes to `<prefix>.<project>.<type token>` and its stream covers `<prefix>.>`;
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

/// The project's subject token: the project ID with every `.` written `%2E`, so that it is
/// always exactly one NATS token (`acme.eu` → `acme%2Eeu`; otherwise it would be two, and
/// `<prefix>.*.task_deleted` would miss it while `<prefix>.acme.>` caught it). Project IDs
/// cannot contain `%` (nor `*`, `>` or whitespace), so replacing `%2E` by `.` gives the ID
/// back, and an ID without a dot is its own token.
pub fn project_token(project: &str) -> String {
    project.replace('.', "%2E")
}

/// The subjects of one project: `<prefix>.<token>`, under which its events and reconciliation
/// notices go; what a stream of the stream fence covers (`<prefix>.<token>.>`), so each project
/// has a stream to itself.
pub fn project_prefix(prefix: &str, project: &str) -> String {
    format!("{prefix}.{}", project_token(project))
}

/// The subject of a project's events of `event_type`: `<prefix>.<project>.<type token>`
/// (`task:archived` → `task_archived`; `task:deleted` → `task_deleted`, the one subject of the
/// relay before there were other types). The token is [`outbox_core::contract::subject_token`],
/// the rule the AsyncAPI document's channels follow too.
pub fn event_subject(prefix: &str, project: &str, event_type: &str) -> String {
    format!(
        "{prefix}.{}.{}",
        project_token(project),
        outbox_core::contract::subject_token(event_type)
    )
}

/// The subjects of the types a consumer declares, one per type (its majors share it), in
/// declaration order. Refused when two declared types share a token (`a_b:c` and `a:b_c`):
/// their events would be one subject, and a downstream filter could not tell them apart.
pub fn event_subjects(
    prefix: &str,
    project: &str,
    types: &outbox_core::EventTypes,
) -> Result<Vec<(String, String)>, String> {
    let mut subjects: Vec<(String, String)> = Vec::new();
    for reference in types.refs() {
        let event_type = reference.event_type.as_str();
        let subject = event_subject(prefix, project, event_type);
        match subjects.iter().find(|(_, known)| *known == subject) {
            Some((other, _)) if other == event_type => {}
            Some((other, _)) => {
                return Err(format!(
                    "invalid --event-types: {other} and {event_type} would both be relayed to \
                     {subject} (one subject token per type); relay them with two relays, each \
                     declaring one of them"
                ));
            }
            None => subjects.push((event_type.to_owned(), subject)),
        }
    }
    Ok(subjects)
}

/// The subject of each type a relay declares, looked up per event.
#[derive(Debug, Clone)]
pub(crate) struct EventSubjects {
    prefix: String,
    project: String,
    /// Each declared type and its subject, in declaration order.
    by_type: Vec<(String, String)>,
}

impl EventSubjects {
    /// The subjects of `types` (a type's majors share one).
    pub(crate) fn new(prefix: &str, project: &str, types: &outbox_core::EventTypes) -> Self {
        let mut by_type: Vec<(String, String)> = Vec::new();
        for reference in types.refs() {
            let event_type = reference.event_type.as_str();
            if !by_type.iter().any(|(known, _)| known == event_type) {
                by_type.push((
                    event_type.to_owned(),
                    event_subject(prefix, project, event_type),
                ));
            }
        }
        Self {
            prefix: prefix.to_owned(),
            project: project.to_owned(),
            by_type,
        }
    }

    /// The subject of an event of `event_type`; a type not declared here (a consumer
    /// configured apart from the relay's settings) follows the same rule.
    pub(crate) fn of(&self, event_type: &str) -> String {
        match self.by_type.iter().find(|(known, _)| known == event_type) {
            Some((_, subject)) => subject.clone(),
            None => event_subject(&self.prefix, &self.project, event_type),
        }
    }

    /// The declared types' subjects.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        self.by_type.iter().map(|(_, subject)| subject.as_str())
    }
}

/// Whether `subject` (one of a project's, see [`project_prefix`]) carries reconciliation
/// notices rather than events: an event type's token always holds a `_`, `reconcile` none.
pub fn is_reconcile_subject(subject: &str) -> bool {
    subject.ends_with(".reconcile")
}

/// The subject of a project's reconciliation notices.
pub fn reconcile_subject(prefix: &str, project: &str) -> String {
    format!("{prefix}.{}.reconcile", project_token(project))
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
            event_subject("lifecycle", "p1", "task:deleted"),
            "lifecycle.p1.task_deleted"
        );
        assert_eq!(
            event_subject("lifecycle", "p1", "task:archived"),
            "lifecycle.p1.task_archived"
        );
        assert!(!is_reconcile_subject("lifecycle.p1.task_archived"));
        assert!(is_reconcile_subject(&reconcile_subject("lifecycle", "p1")));
        assert_eq!(
            reconcile_subject("lifecycle", "p1"),
            "lifecycle.p1.reconcile"
        );
    }

    #[test]
    fn each_declared_type_has_a_subject_of_its_own() {
        let types: outbox_core::EventTypes = "task:deleted@1,task:archived@1,task:archived@2"
            .parse()
            .unwrap();
        assert_eq!(
            event_subjects("lifecycle", "p1", &types).unwrap(),
            vec![
                (
                    "task:deleted".to_owned(),
                    "lifecycle.p1.task_deleted".to_owned()
                ),
                (
                    "task:archived".to_owned(),
                    "lifecycle.p1.task_archived".to_owned()
                ),
            ]
        );
        let clash: outbox_core::EventTypes = "a_b:c@1,a:b_c@1".parse().unwrap();
        let err = event_subjects("lifecycle", "p1", &clash).unwrap_err();
        assert!(
            err.contains("a_b:c and a:b_c would both be relayed to lifecycle.p1.a_b_c"),
            "{err}"
        );
    }

    #[test]
    fn a_dotted_project_is_one_token() {
        assert_eq!(
            event_subject("lifecycle", "acme.eu", "task:deleted"),
            "lifecycle.acme%2Eeu.task_deleted"
        );
        assert_eq!(
            reconcile_subject("acme.lifecycle", "a.b.c"),
            "acme.lifecycle.a%2Eb%2Ec.reconcile"
        );
        for project in ["p1", "acme.eu", "a..b", ".x.", "A-Z_0:9@x"] {
            let token = project_token(project);
            assert!(!token.contains(['.', '*', '>', ' ']), "{token}");
            assert_eq!(token.replace("%2E", "."), project, "reversible");
        }
    }
}
