//! The relay as a whole: NATS reached and the stream checked (or created), then one durable
//! consumer whose handler and reconciler is the [`Publisher`].

use outbox_consumer::{ConsumerConfig, ConsumerError, RunSummary};
use outbox_service::Connections;
use tokio_util::sync::CancellationToken;

use crate::diagnose::probe_publish;
use crate::publisher::{Publisher, PublisherSettings};
use crate::stream::{Ensured, StreamError, StreamSpec, ensure};

/// Why the relay cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// NATS could not be reached at start.
    #[error("{0}")]
    Unreachable(String),
    /// NATS refused the relay's publish to its subject (an authorization violation).
    #[error("{0}")]
    Refused(String),
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
    /// anything is claimed in the database: fails fast when NATS cannot be reached or the
    /// stream is wrong. Once running, the relay rides out NATS outages through the consumer's
    /// retry schedule instead.
    pub async fn connect(
        publisher: PublisherSettings,
        stream: &StreamSpec,
    ) -> Result<Self, RelayError> {
        let publish_timeout = publisher.publish_timeout;
        let publisher = Publisher::new(publisher);
        let (js, permissions) = publisher
            .connect_now()
            .await
            .map_err(RelayError::Unreachable)?;
        match ensure(&js, stream).await? {
            Ensured::Created => tracing::info!(stream = %stream.name, "created the stream"),
            Ensured::Verified => tracing::info!(stream = %stream.name, "stream matches"),
        }
        probe_publish(&js, publisher.subject(), &permissions, publish_timeout)
            .await
            .map_err(RelayError::Refused)?;
        Ok(Self { publisher })
    }

    /// Relays as consumer `config` on `connections` until `shutdown`, or until the consumer
    /// stops on its own.
    pub async fn run(
        self,
        connections: &Connections,
        config: ConsumerConfig,
        shutdown: CancellationToken,
    ) -> Result<RunSummary, ConsumerError> {
        connections
            .consumer(config, self.publisher)
            .run(shutdown)
            .await
    }
}
