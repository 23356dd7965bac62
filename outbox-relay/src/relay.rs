//! The relay as a whole: the stream checked (or created), then one durable consumer whose
//! handler and reconciler is the [`Publisher`].

use outbox_consumer::{ConsumerConfig, ConsumerError, RunSummary};
use outbox_service::Connections;
use tokio_util::sync::CancellationToken;

use crate::publisher::{Publisher, PublisherSettings};
use crate::stream::{Ensured, StreamError, StreamSpec, ensure};

/// Why the relay stopped other than by `shutdown`.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// NATS could not be reached at start.
    #[error("{0}")]
    Unreachable(String),
    /// The stream could not be created, or does not match what the relay needs.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The durable consumer failed.
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
}

/// A durable consumer relaying its project into a JetStream stream. See the crate docs.
pub struct Relay {
    /// What the consumer runs on.
    connections: Connections,
    /// The consumer.
    config: ConsumerConfig,
    /// How the publisher reaches NATS.
    publisher: PublisherSettings,
    /// The stream published into.
    stream: StreamSpec,
}

impl Relay {
    /// A relay of consumer `config` on `connections`, publishing as `publisher` into
    /// `stream`.
    pub fn new(
        connections: Connections,
        config: ConsumerConfig,
        publisher: PublisherSettings,
        stream: StreamSpec,
    ) -> Self {
        Self {
            connections,
            config,
            publisher,
            stream,
        }
    }

    /// Checks NATS and the stream (creating it when missing), then relays until `shutdown`,
    /// or until the consumer stops on its own.
    ///
    /// Fails fast when NATS cannot be reached or the stream is wrong; once running, the relay
    /// rides out NATS outages through the consumer's retry schedule instead.
    pub async fn run(self, shutdown: CancellationToken) -> Result<RunSummary, RelayError> {
        let publisher = Publisher::new(self.publisher);
        let js = publisher
            .connect_now()
            .await
            .map_err(RelayError::Unreachable)?;
        match ensure(&js, &self.stream).await? {
            Ensured::Created => tracing::info!(stream = %self.stream.name, "created the stream"),
            Ensured::Verified => tracing::info!(stream = %self.stream.name, "stream matches"),
        }
        drop(js);
        let summary = self
            .connections
            .consumer(self.config, publisher)
            .run(shutdown)
            .await?;
        Ok(summary)
    }
}
