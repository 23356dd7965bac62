//! NATS failures in words naming their cause: a refused connection (credentials, TLS trust,
//! host name, a missing client certificate, TLS on one side only) and a publish the server
//! dropped for lack of permission, which the client sees only as a missing PubAck.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;

use async_nats::{ConnectError, ConnectErrorKind, ConnectOptions, Event, ServerError};

use crate::security::{Credentials, Security};

/// A connection failure in words naming its cause (exit 1).
pub fn describe_connect_error(error: &ConnectError, server: &str, security: &Security) -> String {
    let detail = error.to_string();
    let cause = match error.kind() {
        ConnectErrorKind::AuthorizationViolation => match &security.credentials {
            Credentials::None => "authorization violation: the server requires credentials \
                 (--nats-user/--nats-password, --nats-token, --nats-nkey or --nats-creds)"
                .to_owned(),
            credentials => format!(
                "authorization violation: the server refused the relay's {} (wrong user, \
                 password, token or key?)",
                credentials.kind()
            ),
        },
        ConnectErrorKind::Tls => tls_cause(&detail, server, security),
        ConnectErrorKind::Authentication => {
            "authentication failed: the NKey could not sign the server's challenge".to_owned()
        }
        // The client reports some TLS failures (an untrusted certificate, an alert from the
        // server) as I/O errors.
        _ if mentions_tls(&detail) => tls_cause(&detail, server, security),
        _ => return format!("cannot connect to {server}: {detail}"),
    };
    format!("cannot connect to {server}: {cause} ({detail})")
}

fn mentions_tls(detail: &str) -> bool {
    let lower = detail.to_ascii_lowercase();
    [
        "tls",
        "certificate",
        "handshake",
        "fatal alert",
        "corrupt message",
    ]
    .iter()
    .any(|word| lower.contains(word))
}

/// Names a TLS failure by what the TLS library reported.
fn tls_cause(detail: &str, server: &str, security: &Security) -> String {
    let lower = detail.to_ascii_lowercase();
    let host = server
        .split_once("://")
        .map_or(server, |(_, rest)| rest)
        .rsplit_once(':')
        .map_or(server, |(host, _)| host);
    let required_by_server = if security.tls.required {
        ""
    } else {
        "the server requires TLS, and "
    };
    if lower.contains("unknownissuer") || lower.contains("unknown issuer") {
        format!(
            "{required_by_server}its certificate is not trusted: it is not signed by a CA in \
             {}",
            match &security.tls.ca {
                Some(ca) => format!("--nats-tls-ca {}", ca.display()),
                None => "the system's roots (give --nats-tls-ca)".to_owned(),
            }
        )
    } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
        format!(
            "{required_by_server}host name mismatch: the server's certificate is not valid for \
             {host}"
        )
    } else if lower.contains("certificaterequired")
        || lower.contains("certificate required")
        || lower.contains("badcertificate")
        || lower.contains("handshakefailure")
    {
        "the server requires a client certificate (--nats-tls-cert and --nats-tls-key) or \
         refused the one given"
            .to_owned()
    } else if security.tls.required {
        "TLS failed: is TLS enabled on the server? (the relay requires it: tls://, \
         --nats-tls-required or a --nats-tls-* file)"
            .to_owned()
    } else {
        format!("{required_by_server}the TLS handshake failed")
    }
}

/// The last permissions violation the server reported on one client. NATS drops a publish the
/// user may not make and says so only in an asynchronous `-ERR`, so a missing PubAck is
/// explained by looking here.
#[derive(Debug, Clone, Default)]
pub struct PermissionWatch(Arc<Mutex<Option<String>>>);

impl PermissionWatch {
    /// Options that record the server's permissions violations here.
    pub fn watch(&self, options: ConnectOptions) -> ConnectOptions {
        let seen = self.0.clone();
        options.event_callback(move |event| {
            let seen = seen.clone();
            async move {
                if let Event::ServerError(ServerError::Other(text)) = event {
                    if text.to_ascii_lowercase().contains("permissions violation") {
                        *seen.lock().expect("not poisoned") = Some(text);
                    }
                }
            }
        })
    }

    /// The violation reported since the last call, if any.
    pub fn take(&self) -> Option<String> {
        self.0.lock().expect("not poisoned").take()
    }
}

/// Checks at start-up that the relay may publish to `subject`, with a publish JetStream can
/// never store: it expects the subject's last message at stream sequence `u64::MAX`. A
/// refused expectation proves the permission; a dropped publish with a permissions
/// violation is the failure (exit 1); anything else is left to the running relay.
pub async fn probe_publish(
    js: &Context,
    subject: &str,
    permissions: &PermissionWatch,
    timeout: Duration,
) -> Result<(), String> {
    let message = PublishMessage::build()
        .payload(Bytes::new())
        .expected_last_subject_sequence(u64::MAX);
    let Ok(ack) = js.send_publish(subject.to_owned(), message).await else {
        return Ok(());
    };
    let outcome = tokio::time::timeout(timeout, ack.into_future()).await;
    if matches!(outcome, Ok(Err(_)) | Err(_)) {
        if let Some(violation) = permissions.take() {
            return Err(format!(
                "authorization violation on publish: the NATS user may not publish to \
                 {subject} ({violation})"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::Tls;

    fn security(required: bool, credentials: Credentials) -> Security {
        Security {
            credentials,
            tls: Tls {
                required,
                ..Tls::default()
            },
        }
    }

    #[test]
    fn tls_failures_are_named() {
        let plain = security(false, Credentials::None);
        let required = security(true, Credentials::None);
        let untrusted = tls_cause(
            "invalid peer certificate: UnknownIssuer",
            "tls://h:1",
            &required,
        );
        assert!(
            untrusted.starts_with("its certificate is not trusted"),
            "{untrusted}"
        );
        let surprise = tls_cause(
            "invalid peer certificate: UnknownIssuer",
            "nats://h:1",
            &plain,
        );
        assert!(
            surprise.starts_with("the server requires TLS, and its certificate"),
            "{surprise}"
        );
        let name = tls_cause(
            "invalid peer certificate: certificate not valid for name \"127.0.0.1\"",
            "tls://127.0.0.1:4222",
            &required,
        );
        assert!(name.contains("host name mismatch"), "{name}");
        assert!(name.contains("not valid for 127.0.0.1"), "{name}");
        for alert in ["CertificateRequired", "BadCertificate"] {
            let client = tls_cause(
                &format!("received fatal alert: {alert}"),
                "tls://h:1",
                &required,
            );
            assert!(client.contains("requires a client certificate"), "{client}");
        }
    }
}
