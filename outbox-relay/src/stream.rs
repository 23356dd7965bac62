//! The relay's JetStream stream: created on first start, verified on every later one. The relay
//! never changes an existing stream: a stream that differs from what the flags ask for is an
//! operator decision (exit 2), not something to overwrite silently under other consumers.

use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{CreateStreamErrorKind, GetStreamErrorKind};
use async_nats::jetstream::stream::{Config, RetentionPolicy, StorageType};

use crate::subjects::covers;

/// What the stream must look like.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Stream name (`--stream`).
    pub name: String,
    /// Subject prefix; the stream must cover `<prefix>.>`.
    pub prefix: String,
    /// JetStream's duplicate window: repeats of a `Nats-Msg-Id` within it are dropped.
    pub duplicate_window: Duration,
    /// Retention policy.
    pub retention: RetentionPolicy,
    /// Maximum message age; zero keeps messages until another limit removes them.
    pub max_age: Duration,
    /// Replicas (1 for a single server, 3 for a 3-node cluster).
    pub replicas: usize,
}

/// Why the stream could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The stream exists and differs from the spec (exit 2).
    #[error(
        "stream {name} does not match the relay's settings: {}; the relay never reconfigures an existing stream: change the flags to match, or update or recreate the stream yourself",
        differences.join("; ")
    )]
    Mismatch {
        /// The stream.
        name: String,
        /// One line per difference.
        differences: Vec<String>,
    },
    /// JetStream refused or did not answer (exit 1 unless `transient`).
    #[error("cannot {action} stream {name}: {detail}")]
    Nats {
        /// What was being done.
        action: &'static str,
        /// The stream.
        name: String,
        /// The server's or client's words.
        detail: String,
        /// Whether asking again can succeed: no answer in time, a connection lost in the
        /// middle of the request, or a cluster between leaders (a node just died). A refusal
        /// (a bad configuration, too few servers for the replicas) is not.
        transient: bool,
    },
}

impl StreamError {
    /// Whether the check may succeed when asked again (see [`StreamError::Nats`]).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Nats {
                transient: true,
                ..
            }
        )
    }
}

/// JetStream's answers that mean "no leader to answer right now" or "the cluster's groups are
/// still forming", which a cluster gives while it elects leaders and nodes rejoin.
fn between_leaders(error: &async_nats::jetstream::Error) -> bool {
    [
        ErrorCode::CLUSTER_NOT_AVAILABLE,
        ErrorCode::CLUSTER_NOT_LEADER,
        ErrorCode::CLUSTER_NOT_ACTIVE,
        ErrorCode::CLUSTER_INCOMPLETE,
        ErrorCode::CLUSTER_NOT_ASSIGNED,
        ErrorCode::RAFT_GENERAL,
    ]
    .contains(&error.error_code())
}

/// Whether the stream was made now or found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// Created by this start.
    Created,
    /// Existed and matches.
    Verified,
}

impl StreamSpec {
    /// The configuration the relay creates.
    pub fn config(&self) -> Config {
        Config {
            name: self.name.clone(),
            subjects: vec![format!("{}.>", self.prefix)],
            retention: self.retention,
            max_age: self.max_age,
            num_replicas: self.replicas,
            duplicate_window: self.duplicate_window,
            storage: StorageType::File,
            ..Default::default()
        }
    }

    /// Every way `existing` differs from this spec, as operator-readable lines.
    pub fn differences(&self, existing: &Config) -> Vec<String> {
        let mut out = Vec::new();
        let wanted = format!("{}.>", self.prefix);
        if !existing.subjects.iter().any(|s| covers(s, &self.prefix)) {
            out.push(format!(
                "subjects {:?} do not cover {wanted} (--subject-prefix)",
                existing.subjects
            ));
        }
        if existing.duplicate_window != self.duplicate_window {
            out.push(format!(
                "duplicate window is {}, the relay asks for {} (--duplicate-window)",
                human(existing.duplicate_window),
                human(self.duplicate_window)
            ));
        }
        if existing.retention != self.retention {
            out.push(format!(
                "retention is {}, the relay asks for {} (--stream-retention)",
                retention_name(existing.retention),
                retention_name(self.retention)
            ));
        }
        if existing.max_age != self.max_age {
            out.push(format!(
                "max age is {}, the relay asks for {} (--stream-max-age)",
                human(existing.max_age),
                human(self.max_age)
            ));
        }
        if existing.num_replicas.max(1) != self.replicas {
            out.push(format!(
                "replicas is {}, the relay asks for {} (--stream-replicas)",
                existing.num_replicas, self.replicas
            ));
        }
        if existing.storage != StorageType::File {
            out.push(
                "storage is memory; the relay needs file storage, which survives a server restart"
                    .into(),
            );
        }
        if existing.no_ack {
            out.push("no_ack is set: publishes would never be confirmed".into());
        }
        if existing.sealed {
            out.push("the stream is sealed".into());
        }
        out
    }
}

/// Creates the stream, or checks that the existing one matches `spec`.
pub async fn ensure(js: &Context, spec: &StreamSpec) -> Result<Ensured, StreamError> {
    // Two relays starting at once may both find no stream; the loser of the create
    // verifies the winner's stream instead.
    for _ in 0..2 {
        match js.get_stream(&spec.name).await {
            Ok(mut stream) => {
                // Every failure to read a stream that was just found is the server not
                // answering (timed out, no responders, the connection gone).
                let info = stream.info().await.map_err(|e| StreamError::Nats {
                    action: "read",
                    name: spec.name.clone(),
                    detail: e.to_string(),
                    transient: true,
                })?;
                let differences = spec.differences(&info.config);
                return if differences.is_empty() {
                    Ok(Ensured::Verified)
                } else {
                    Err(StreamError::Mismatch {
                        name: spec.name.clone(),
                        differences,
                    })
                };
            }
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(js_err)
                    if js_err.error_code() == ErrorCode::STREAM_NOT_FOUND => {}
                kind => {
                    let transient = match kind {
                        GetStreamErrorKind::Request => true,
                        GetStreamErrorKind::JetStream(js_err) => between_leaders(&js_err),
                        _ => false,
                    };
                    return Err(StreamError::Nats {
                        action: "look up",
                        name: spec.name.clone(),
                        detail: e.to_string(),
                        transient,
                    });
                }
            },
        }
        match js.create_stream(spec.config()).await {
            Ok(_) => return Ok(Ensured::Created),
            Err(e) => match e.kind() {
                CreateStreamErrorKind::JetStream(js_err)
                    if js_err.error_code() == ErrorCode::STREAM_NAME_EXIST => {}
                kind => {
                    let transient = match kind {
                        CreateStreamErrorKind::JetStreamUnavailable
                        | CreateStreamErrorKind::TimedOut
                        | CreateStreamErrorKind::Response => true,
                        CreateStreamErrorKind::JetStream(js_err) => between_leaders(&js_err),
                        _ => false,
                    };
                    return Err(StreamError::Nats {
                        action: "create",
                        name: spec.name.clone(),
                        detail: e.to_string(),
                        transient,
                    });
                }
            },
        }
    }
    Err(StreamError::Nats {
        action: "create",
        name: spec.name.clone(),
        detail: "it appeared and disappeared while starting".into(),
        transient: true,
    })
}

fn retention_name(policy: RetentionPolicy) -> &'static str {
    match policy {
        RetentionPolicy::Limits => "limits",
        RetentionPolicy::Interest => "interest",
        RetentionPolicy::WorkQueue => "workqueue",
    }
}

fn human(d: Duration) -> String {
    if d.is_zero() {
        "unlimited".into()
    } else {
        humantime::format_duration(d).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> StreamSpec {
        StreamSpec {
            name: "LIFECYCLE".into(),
            prefix: "lifecycle".into(),
            duplicate_window: Duration::from_secs(600),
            retention: RetentionPolicy::Limits,
            max_age: Duration::from_secs(7 * 86400),
            replicas: 1,
        }
    }

    #[test]
    fn own_config_matches() {
        let spec = spec();
        assert!(spec.differences(&spec.config()).is_empty());
    }

    #[test]
    fn every_difference_is_named() {
        let spec = spec();
        let mut config = spec.config();
        config.subjects = vec!["other.>".into()];
        config.duplicate_window = Duration::from_secs(120);
        config.retention = RetentionPolicy::Interest;
        config.max_age = Duration::ZERO;
        config.num_replicas = 3;
        config.storage = StorageType::Memory;
        let diffs = spec.differences(&config);
        assert_eq!(diffs.len(), 6, "{diffs:?}");
        assert!(diffs[0].contains("do not cover lifecycle.>"));
        assert!(diffs[1].contains("duplicate window is 2m, the relay asks for 10m"));
        assert!(diffs[2].contains("retention is interest"));
        assert!(diffs[3].contains("max age is unlimited"));
        assert!(diffs[4].contains("replicas is 3"));
        assert!(diffs[5].contains("memory"));
    }

    #[test]
    fn a_wider_subject_covers() {
        let spec = spec();
        let mut config = spec.config();
        config.subjects = vec!["audit.>".into(), ">".into()];
        assert!(spec.differences(&config).is_empty());
    }
}
