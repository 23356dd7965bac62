//! The libpq environment: `PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE`, `PGPASSWORD`,
//! `PGAPPNAME`, `PGCONNECT_TIMEOUT`, and the password file (`PGPASSFILE`, or `~/.pgpass`).
//!
//! tokio-postgres reads none of these; operators expect them to work as they do for `psql`.
//! The environment is read through a lookup function, so tests need not touch the process's.

use std::path::PathBuf;
use std::time::Duration;

use tokio_postgres::Config;
use tokio_postgres::config::Host;

/// The variables that describe a connection; one of them set means "connect as libpq would".
pub const CONNECTION_VARIABLES: [&str; 4] = ["PGHOST", "PGPORT", "PGUSER", "PGDATABASE"];

/// A connection described by the libpq environment, with a printable description that never
/// shows the password.
#[derive(Debug, Clone)]
pub struct EnvConnection {
    /// The configuration.
    pub config: Config,
    /// `PGHOST=... PGPORT=... PGUSER=... PGDATABASE=...`, for messages.
    pub description: String,
}

/// A problem with a libpq variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {variable}={value:?}: {problem}")]
pub struct EnvError {
    /// The variable.
    pub variable: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong.
    pub problem: String,
}

/// The connection the libpq variables describe, or `None` when none of
/// [`CONNECTION_VARIABLES`] is set. Defaults as libpq's: the Unix socket directory
/// (`/var/run/postgresql` where it exists, else `/tmp`), port 5432, the OS user, a database
/// named after the user.
pub fn config_from_env(
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<EnvConnection>, EnvError> {
    let var = |name: &str| var(name).filter(|v| !v.is_empty());
    if CONNECTION_VARIABLES.iter().all(|name| var(name).is_none()) {
        return Ok(None);
    }
    let mut config = Config::new();
    let hosts = var("PGHOST").unwrap_or_else(default_socket_dir);
    for host in hosts.split(',') {
        config.host(host);
    }
    let port = var("PGPORT").unwrap_or_else(|| "5432".into());
    for text in port.split(',') {
        let parsed = text.parse::<u16>().map_err(|_| EnvError {
            variable: "PGPORT",
            value: port.clone(),
            problem: "not a port number".into(),
        })?;
        config.port(parsed);
    }
    let user = var("PGUSER")
        .or_else(|| var("USER"))
        .or_else(|| var("LOGNAME"))
        .unwrap_or_else(|| "postgres".into());
    config.user(&user);
    let dbname = var("PGDATABASE").unwrap_or_else(|| user.clone());
    config.dbname(&dbname);
    if let Some(password) = var("PGPASSWORD") {
        config.password(password);
    }
    if let Some(name) = var("PGAPPNAME") {
        config.application_name(&name);
    }
    if let Some(text) = var("PGCONNECT_TIMEOUT") {
        let seconds = text.parse::<u64>().map_err(|_| EnvError {
            variable: "PGCONNECT_TIMEOUT",
            value: text.clone(),
            problem: "not a number of seconds".into(),
        })?;
        if seconds > 0 {
            config.connect_timeout(Duration::from_secs(seconds.max(2)));
        }
    }
    let description = format!("PGHOST={hosts} PGPORT={port} PGUSER={user} PGDATABASE={dbname}");
    Ok(Some(EnvConnection {
        config,
        description,
    }))
}

fn default_socket_dir() -> String {
    if std::path::Path::new("/var/run/postgresql").is_dir() {
        "/var/run/postgresql".into()
    } else {
        "/tmp".into()
    }
}

/// Where libpq looks for the password file: `PGPASSFILE`, else `~/.pgpass`.
pub fn passfile_path(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(path) = var("PGPASSFILE").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(path));
    }
    var("HOME")
        .filter(|v| !v.is_empty())
        .map(|home| PathBuf::from(home).join(".pgpass"))
}

/// Fills in the password from the password file when `config` has none, as libpq does: the
/// first line whose `hostname:port:database:username` matches (`*` matches anything; a Unix
/// socket matches `localhost`). A file readable by group or others is ignored with a warning,
/// as libpq ignores it.
pub fn apply_passfile(config: &mut Config, path: &std::path::Path) {
    if config.get_password().is_some() {
        return;
    }
    let Ok(metadata) = std::fs::metadata(path) else {
        return;
    };
    {
        use std::os::unix::fs::PermissionsExt;
        if metadata.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                "password file has group or world access; ignored (chmod 0600 it)"
            );
            return;
        }
    }
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(name)) => name.clone(),
        _ => "localhost".into(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let database = config.get_dbname().unwrap_or_default().to_owned();
    let user = config.get_user().unwrap_or_default().to_owned();
    if let Some(password) = passfile_lookup(&text, [&host, &port, &database, &user]) {
        config.password(password);
    }
}

/// The password of the first matching line of a password file.
fn passfile_lookup(text: &str, wanted: [&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_passfile_line(line);
        if fields.len() < 5 {
            continue;
        }
        let matches = fields[..4]
            .iter()
            .zip(wanted)
            .all(|(field, want)| field == "*" || field == want);
        if matches {
            return Some(fields[4..].join(":"));
        }
    }
    None
}

/// Splits on unescaped `:`; `\:` and `\\` stand for `:` and `\`.
fn split_passfile_line(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(next), Some(field)) = (chars.next(), fields.last_mut()) {
                    field.push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(field) = fields.last_mut() {
                    field.push(c);
                }
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn nothing_set_means_no_connection() {
        assert!(
            config_from_env(env(&[("HOME", "/root")]))
                .unwrap()
                .is_none()
        );
        assert!(config_from_env(env(&[("PGHOST", "")])).unwrap().is_none());
    }

    #[test]
    fn variables_and_defaults() {
        let c = config_from_env(env(&[
            ("PGHOST", "/tmp/sock"),
            ("PGUSER", "app"),
            ("PGPASSWORD", "pw"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.config.get_hosts(), &[Host::Unix("/tmp/sock".into())]);
        assert_eq!(c.config.get_ports(), &[5432]);
        assert_eq!(c.config.get_user(), Some("app"));
        assert_eq!(c.config.get_dbname(), Some("app"));
        assert_eq!(c.config.get_password(), Some(&b"pw"[..]));
        assert!(!c.description.contains("pw"));
        let err = config_from_env(env(&[("PGPORT", "fifty")])).unwrap_err();
        assert_eq!(err.variable, "PGPORT");
    }

    #[test]
    fn password_file_fills_a_missing_password_only_when_private() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("outbox-pgpass-unit-{}", std::process::id()));
        std::fs::write(&path, "localhost:5432:db:app:secret\n").unwrap();
        let config = || {
            let mut c = Config::new();
            c.host("/tmp").port(5432).dbname("db").user("app");
            c
        };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut open = config();
        apply_passfile(&mut open, &path);
        assert_eq!(open.get_password(), None, "a readable file is ignored");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut private = config();
        apply_passfile(&mut private, &path);
        assert_eq!(private.get_password(), Some(&b"secret"[..]));
        let mut given = config();
        given.password("mine");
        apply_passfile(&mut given, &path);
        assert_eq!(
            given.get_password(),
            Some(&b"mine"[..]),
            "a given password wins"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn password_file_lines() {
        let text =
            "# comment\ndb:5432:other:app:no\n*:5432:x\\:y:app:a\\:b:c\nlocalhost:*:*:*:sock\n";
        assert_eq!(
            passfile_lookup(text, ["db", "5432", "x:y", "app"]),
            Some("a:b:c".into())
        );
        assert_eq!(
            passfile_lookup(text, ["localhost", "6000", "d", "u"]),
            Some("sock".into())
        );
        assert_eq!(passfile_lookup(text, ["db", "5432", "none", "app"]), None);
    }
}
