//! How JetStream is asked to enforce the order of a project's messages (`--fence`), and which
//! servers can enforce each way. Pure functions: the version checks have unit tests.
//!
//! - `stream` (the default): every message names the stream's last sequence before it
//!   (`Nats-Expected-Last-Sequence`) and, inside a window, the message ID of the relay's message
//!   before it (`Nats-Expected-Last-Msg-Id`), so `--window` messages can be in flight, each
//!   stored only right after the one before it. JetStream knows both headers since 2.2.
//! - `subject`: every message names its subject's last sequence
//!   (`Nats-Expected-Last-Subject-Sequence`), one publish per PubAck round trip. Since 2.3.
//!   On a clustered stream before 2.9.21 (and 2.10.0) the server checks it against applied
//!   messages only, so two publishes close together may both be stored: the relay warns.
//! - `none`: no expectation, pipelined; the order rests on the connection alone.

use std::fmt;

/// The order fence (`--fence`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// `Nats-Expected-Last-Sequence` and, within a window, `Nats-Expected-Last-Msg-Id`.
    Stream,
    /// `Nats-Expected-Last-Subject-Sequence`, one publish at a time.
    Subject,
    /// No expectation.
    None,
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Stream => "stream",
            Self::Subject => "subject",
            Self::None => "none",
        })
    }
}

/// A server version, `major.minor.patch` (a suffix such as `-RC.1` is ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// Parses the version a server announces in its INFO (`2.9.10`, `2.12.0-RC.1`).
pub fn parse_version(text: &str) -> Option<Version> {
    let core = text.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().flatten().unwrap_or(0);
    Some(Version(major, minor, patch))
}

/// What the server's version means for `fence`: `Err` (a refusal naming the problem) when the
/// server cannot enforce it, `Ok(Some(warning))` when it enforces it only partly.
pub fn check_server(
    fence: Fence,
    version: &str,
    replicas: usize,
) -> Result<Option<String>, String> {
    let Some(parsed) = parse_version(version) else {
        return Err(format!(
            "cannot read the NATS server's version {version:?}; --fence {fence} needs to know \
             that the server enforces it"
        ));
    };
    match fence {
        Fence::Stream if parsed < Version(2, 2, 0) => Err(format!(
            "NATS server {parsed} cannot enforce --fence stream (Nats-Expected-Last-Sequence and \
             Nats-Expected-Last-Msg-Id need 2.2 or later); upgrade the server"
        )),
        Fence::Subject if parsed < Version(2, 3, 0) => Err(format!(
            "NATS server {parsed} cannot enforce --fence subject \
             (Nats-Expected-Last-Subject-Sequence needs 2.3 or later); use --fence stream"
        )),
        Fence::Subject if replicas > 1 && parsed < Version(2, 9, 21) => Ok(Some(format!(
            "NATS server {parsed} checks Nats-Expected-Last-Subject-Sequence of a replicated \
             stream against applied messages only (fixed in 2.9.21 and 2.10.0): two publishes \
             close together can both be stored; --fence stream is enforced on this server"
        ))),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("2.9.10"), Some(Version(2, 9, 10)));
        assert_eq!(parse_version("2.12.0-RC.1"), Some(Version(2, 12, 0)));
        assert_eq!(parse_version("v2.14"), Some(Version(2, 14, 0)));
        assert_eq!(parse_version("nats"), None);
        assert!(Version(2, 9, 10) < Version(2, 10, 0));
    }

    #[test]
    fn what_each_server_enforces() {
        assert_eq!(check_server(Fence::Stream, "2.9.10", 3), Ok(None));
        assert_eq!(check_server(Fence::Stream, "2.14.6", 3), Ok(None));
        assert!(
            check_server(Fence::Stream, "2.1.9", 1)
                .unwrap_err()
                .contains("2.2")
        );
        assert!(
            check_server(Fence::Subject, "2.2.6", 1)
                .unwrap_err()
                .contains("2.3")
        );
        assert_eq!(check_server(Fence::Subject, "2.9.10", 1), Ok(None));
        assert!(
            check_server(Fence::Subject, "2.9.10", 3)
                .unwrap()
                .unwrap()
                .contains("2.9.21")
        );
        assert_eq!(check_server(Fence::Subject, "2.10.0", 3), Ok(None));
        assert_eq!(check_server(Fence::None, "2.0.0", 3), Ok(None));
        assert!(check_server(Fence::Stream, "weird", 1).is_err());
    }
}
