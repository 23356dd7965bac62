//! The publisher's NATS client: one connection per client, replaced by the relay itself (see
//! "Order across connections" in `publisher.rs`), with backoff, rotating through the servers.

use async_nats::client::Client;
use async_nats::connection::State;
use async_nats::jetstream::Context;
use outbox_consumer::HandlerFailure;
use tokio::time::Instant;

use crate::diagnose::{PermissionWatch, describe_connect_error};
use crate::publisher::{Pipeline, Publisher, class};

/// One client and its JetStream context; never reconnected (see the module docs).
pub(crate) struct Link {
    /// The client.
    pub(crate) client: Client,
    /// Its JetStream context.
    pub(crate) js: Context,
    /// Permissions violations the server reported on this client.
    pub(crate) permissions: PermissionWatch,
}

impl Publisher {
    /// Connects once, to any server, for the start-up checks; the error names each server.
    /// Returns the server's version too (its INFO), to check the fence against it.
    pub async fn connect_now(&self) -> Result<(Context, PermissionWatch, String), String> {
        let mut errors = Vec::new();
        let mut state = self.state.lock().await;
        for _ in 0..self.settings.servers.len() {
            match self.open(&mut state).await {
                Ok(()) => {
                    let link = state.link.as_ref().expect("just opened");
                    let version = link.client.server_info().version;
                    return Ok((link.js.clone(), link.permissions.clone(), version));
                }
                Err(e) => errors.push(e),
            }
        }
        Err(errors.join("; "))
    }

    /// Opens a new client to the next server in turn.
    pub(crate) async fn open(&self, state: &mut Pipeline) -> Result<(), String> {
        let server = &self.settings.servers[state.next_server % self.settings.servers.len()];
        state.next_server = state.next_server.wrapping_add(1);
        let permissions = PermissionWatch::default();
        let options = permissions
            .watch(
                self.settings
                    .security
                    .apply(async_nats::ConnectOptions::new()),
            )
            .name(format!(
                "outbox-relay {}/{}",
                self.settings.project, self.settings.consumer
            ))
            .max_reconnects(1)
            .ignore_discovered_servers()
            .connection_timeout(self.settings.connect_timeout)
            .ping_interval(self.settings.ping_interval);
        let client = options
            .connect(server.address.as_str())
            .await
            .map_err(|e| describe_connect_error(&e, &server.address, &self.settings.security))?;
        let js = async_nats::jetstream::ContextBuilder::new()
            .timeout(self.settings.publish_timeout)
            .max_ack_inflight(self.settings.window.max(1) + 1)
            .backpressure_on_inflight(true)
            .build(client.clone());
        tracing::info!(server = %server.address, "connected to NATS");
        state.link = Some(Link {
            client,
            js,
            permissions,
        });
        state.tails.clear();
        state.chain = None;
        Ok(())
    }

    /// Whether the current client can still take publishes: connected, and on the
    /// connection it started with.
    fn link_usable(link: &Link) -> bool {
        link.client.connection_state() == State::Connected
            && link
                .client
                .statistics()
                .connects
                .load(std::sync::atomic::Ordering::Relaxed)
                <= 1
    }

    /// A usable client, replacing a dead one (with backoff) once nothing of the old one is
    /// still outstanding.
    pub(crate) async fn ensure_link(&self, state: &mut Pipeline) -> Result<(), HandlerFailure> {
        if state.link.as_ref().is_some_and(Self::link_usable) {
            return Ok(());
        }
        if !state.in_flight.is_empty() {
            // The old connection's publishes must be resolved first: they fail once it is
            // gone, and a new connection must not overtake them.
            return Err(class("nats_disconnected"));
        }
        if let Some(old) = state.link.take() {
            tracing::warn!("NATS connection lost; opening a new one");
            drop(old);
        }
        if let Some(at) = state.retry_connect_at {
            tokio::time::sleep_until(at).await;
        }
        match self.open(state).await {
            Ok(()) => {
                state.connect_failures = 0;
                state.retry_connect_at = None;
                Ok(())
            }
            Err(e) => {
                state.connect_failures = state.connect_failures.saturating_add(1);
                // The consumers' one backoff: doubling, capped, with jitter so that restarted
                // relays do not reconnect in lock-step.
                let delay =
                    outbox_consumer::backoff::backoff(state.connect_failures - 1, rand::random());
                tracing::warn!(
                    error = %e,
                    retry_in = %outbox_core::internal::Readable(delay),
                    "NATS unavailable"
                );
                state.retry_connect_at = Some(Instant::now() + delay);
                Err(class("nats_unavailable"))
            }
        }
    }
}
