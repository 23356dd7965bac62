//! The relay as a whole: NATS reached and the stream checked (or created), then one durable
//! consumer whose handler and reconciler is the [`Publisher`].

use outbox_consumer::{ConsumerConfig, ConsumerError, RunSummary};
use outbox_service::Connections;
use tokio_util::sync::CancellationToken;

use crate::diagnose::probe_publish;
use crate::fence::{Fence, check_server};
use crate::provenance::Ledger;
use crate::publisher::{Publisher, PublisherSettings};
use crate::stream::{Ensured, StreamError, StreamSpec, ensure};
use crate::subjects::{event_subjects, project_prefix};
use crate::tail::stream_end;

/// Why the relay cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// NATS could not be reached at start.
    #[error("{0}")]
    Unreachable(String),
    /// NATS refused the relay's publish to its subject (an authorization violation).
    #[error("{0}")]
    Refused(String),
    /// The server cannot enforce the order fence asked for (`--fence`).
    #[error("{0}")]
    Unsupported(String),
    /// The stream could not be created, or does not match what the relay needs.
    #[error(transparent)]
    Stream(#[from] StreamError),
}

/// A durable consumer relaying its project into a JetStream stream, once NATS has answered
/// and the stream is known to fit. See the crate docs.
pub struct Relay {
    /// The consumer's handler and reconciler.
    publisher: Publisher,
}

impl Relay {
    /// Connects to NATS as `publisher` and checks `stream` (creating it when missing), before
    /// anything is claimed in the database: fails fast when NATS cannot be reached at all,
    /// refuses the relay, or the stream is wrong. A check that NATS did not answer (a node
    /// died in the middle of it, a cluster between leaders) is asked again, through a new
    /// connection and with backoff, until it is answered; drop the future to stop waiting.
    /// Once running, the relay rides out NATS outages through the consumer's retry schedule.
    pub async fn connect(
        publisher: PublisherSettings,
        stream: &StreamSpec,
    ) -> Result<Self, RelayError> {
        let publish_timeout = publisher.publish_timeout;
        let (fence, window) = (publisher.fence, publisher.window);
        let own = project_prefix(&publisher.prefix, &publisher.project);
        event_subjects(
            &publisher.prefix,
            &publisher.project,
            &publisher.event_types,
        )
        .map_err(RelayError::Unsupported)?;
        let publisher = Publisher::new(publisher, stream.clone());
        let mut unanswered = 0;
        loop {
            let (js, permissions, version) = match publisher.connect_now().await {
                Ok(link) => link,
                // Reached before, so its credentials and TLS were fine: a node is down.
                Err(e) if unanswered > 0 => {
                    unanswered = Self::wait_before_asking_again(unanswered, &e).await;
                    continue;
                }
                Err(e) => return Err(RelayError::Unreachable(e)),
            };
            // The fence is checked against the server answering now; a cluster is upgraded
            // node by node, so each start checks again.
            match check_server(fence, &version, stream.replicas) {
                Ok(None) => {}
                Ok(Some(warning)) => tracing::warn!(%fence, "{warning}"),
                Err(refusal) => return Err(RelayError::Unsupported(refusal)),
            }
            tracing::info!(
                %fence,
                window = if fence == Fence::Subject { 1 } else { window.max(1) },
                server_version = %version,
                "order fence"
            );
            match ensure(&js, stream).await {
                Ok(Ensured::Created) => tracing::info!(stream = %stream.name, "created the stream"),
                Ok(Ensured::Verified) => tracing::info!(stream = %stream.name, "stream matches"),
                Err(e) if e.is_transient() => {
                    unanswered = Self::wait_before_asking_again(unanswered, &e.to_string()).await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            if fence == Fence::Stream {
                match stream_end(&js, &stream.name, &own).await {
                    Ok(end) if !end.foreign_subjects.is_empty() => {
                        return Err(RelayError::Unsupported(format!(
                            "--fence stream needs stream {} to itself, and it holds messages of \
                             other subjects ({}): give each project its own stream (--stream), \
                             or use --fence subject",
                            stream.name,
                            end.foreign_subjects.join(", ")
                        )));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        unanswered =
                            Self::wait_before_asking_again(unanswered, &e.to_string()).await;
                        continue;
                    }
                }
            }
            for subject in publisher.subjects() {
                probe_publish(&js, subject, &permissions, publish_timeout)
                    .await
                    .map_err(RelayError::Refused)?;
            }
            if unanswered > 0 {
                tracing::info!(stream = %stream.name, "NATS answered the stream check");
            }
            return Ok(Self { publisher });
        }
    }

    /// Logs the first of a run of unanswered start-up checks (the rest at debug level),
    /// sleeps the consumers' backoff, and returns the new count.
    async fn wait_before_asking_again(unanswered: u32, error: &str) -> u32 {
        let delay = outbox_consumer::backoff::backoff(unanswered, rand::random());
        if unanswered == 0 {
            tracing::warn!(
                error,
                "NATS did not answer the stream check; asking again until it does"
            );
        } else {
            tracing::debug!(
                error,
                retry_in = %outbox_core::internal::Readable(delay),
                "NATS still does not answer"
            );
        }
        tokio::time::sleep(delay).await;
        unanswered.saturating_add(1)
    }

    /// Relays as consumer `config` on `connections` until `shutdown`, or until the consumer
    /// stops on its own.
    ///
    /// The last message the stream holds for the project is adopted as the one to publish
    /// after only when it is the relay's own (checked against the events in the database):
    /// a message another writer stored while the relay was stopped is a conflict.
    pub async fn run(
        mut self,
        connections: &Connections,
        config: ConsumerConfig,
        shutdown: CancellationToken,
    ) -> Result<RunSummary, ConsumerError> {
        self.publisher
            .set_ledger(Ledger::new(connections.pool.clone(), &config.duties.schema));
        // Described and exported at 0 from the start (the recorder exists by now), so a rate
        // or an alert over it has a series before the first out-of-order store.
        crate::metric::describe();
        metrics::counter!(crate::metric::OUT_OF_ORDER.name).increment(0);
        connections
            .consumer(config, self.publisher)
            .run(shutdown)
            .await
    }
}
