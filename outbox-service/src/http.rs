//! Serving HTTP the way every outbox server does: bind first (a used address is bad input,
//! named with the option it came from), then an accept loop that can close any one
//! connection (a lagging SSE client) or, at shutdown, let them all finish within a drain
//! period and close what remains.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// An address that cannot be listened on: bad input, named with the option it came from.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({what}): {reason}")]
pub struct BindError {
    /// The address.
    pub addr: SocketAddr,
    /// Where it came from (`--listen`, `--metrics-addr`).
    pub what: String,
    /// Why, in words.
    pub reason: String,
}

/// Binds `addr`; an address in use is named as such.
pub async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr).await.map_err(|e| {
        let reason = if e.kind() == std::io::ErrorKind::AddrInUse {
            "the address is already in use".to_owned()
        } else {
            e.to_string()
        };
        BindError {
            addr,
            what: what.to_owned(),
            reason,
        }
    })
}

/// Closes the connection a request arrived on; inserted into every request's extensions.
#[derive(Clone)]
pub struct ConnectionToken(pub Arc<CancellationToken>);

/// Serves `app` on `listener` until `stop`; then lets open connections finish for up to
/// `drain`, and closes what remains. A connection whose request head has not fully arrived
/// within `header_read_timeout` is closed, so that clients trickling headers (slowloris)
/// cannot hold connections open.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    stop: CancellationToken,
    drain: Duration,
    header_read_timeout: Duration,
) {
    let graceful = CancellationToken::new();
    let kill = CancellationToken::new();
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        while connections.try_join_next().is_some() {}
        let (stream, _) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: wait a moment rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let token = Arc::new(kill.child_token());
        let app = app.clone();
        let this = token.clone();
        let service = hyper::service::service_fn(
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(ConnectionToken(this.clone()));
                app.clone().oneshot(request)
            },
        );
        let graceful = graceful.clone();
        connections.spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = token.cancelled() => return,
                _ = graceful.cancelled() => {}
            }
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = token.cancelled() => {}
            }
        });
    }
    drop(listener);
    graceful.cancel();
    let drained = tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            remaining = connections.len(),
            "closing connections that did not finish in time"
        );
        kill.cancel();
        while connections.join_next().await.is_some() {}
    }
}
