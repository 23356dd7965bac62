use std::time::Duration;

use async_nats::jetstream::stream::RetentionPolicy;
use outbox_consumer::ConsumerConfig;
use outbox_core::connect::ConnectSettings;
use outbox_core::{ConsumerId, ProjectId};
use outbox_relay::parse_nats_urls;
use outbox_relay::{Credentials, Fence, PublisherSettings, Relay, Security, StreamSpec, Tls};
use outbox_service::Connections;
use tokio_util::sync::CancellationToken;

/// Relays project `p1` of the database at `database_url` into the JetStream stream
/// `LIFECYCLE` of the NATS servers `nats_urls` (`tls://nats-1:4222,tls://nats-2:4222`, say:
/// `tls://` requires TLS), as `credentials` (`Credentials::Token(token)`, say), until
/// `shutdown` is cancelled.
pub async fn relay(
    database_url: &str,
    nats_urls: &str,
    credentials: Credentials,
    shutdown: CancellationToken,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let settings = ConnectSettings::parse(database_url)?;
    let connections = Connections::new(&settings, 4, true)?;
    let config = ConsumerConfig::new(ProjectId::new("p1")?, ConsumerId::new("relay")?);
    let servers = parse_nats_urls(nats_urls)?.servers;
    let tls = Tls {
        required: servers.iter().any(|server| server.tls),
        ..Tls::default()
    };
    let publisher = PublisherSettings {
        servers,
        security: Security { credentials, tls },
        stream: "LIFECYCLE".into(),
        fence: Fence::Stream,
        prefix: "lifecycle".into(),
        project: "p1".into(),
        event_types: config.delivery.event_types.clone(),
        consumer: "relay".into(),
        window: 256,
        publish_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ping_interval: Duration::from_secs(10),
    };
    let stream = StreamSpec {
        name: "LIFECYCLE".into(),
        prefix: "lifecycle".into(),
        duplicate_window: Duration::from_secs(600),
        retention: RetentionPolicy::Limits,
        max_age: Duration::from_secs(7 * 24 * 3600),
        replicas: 1,
    };

    Relay::connect(publisher, &stream)
        .await?
        .run(&connections, config, shutdown)
        .await?;
    Ok(())
}
