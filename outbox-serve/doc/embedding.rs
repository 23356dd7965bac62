use outbox_consumer::{DeliverySettings, Duties};
use outbox_core::connect::ConnectSettings;
use outbox_core::{ConsumerId, ProjectId};
use outbox_serve::{Server, ServerSettings};
use outbox_service::Connections;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves projects `p1` and `p2` of the database at `database_url` over HTTP on `listener`
/// (`TcpListener::bind("127.0.0.1:8080")`, say) until `shutdown` is cancelled.
pub async fn serve(
    database_url: &str,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let settings = ConnectSettings::parse(database_url)?;
    let connections = Connections::new(&settings, 4, true)?;
    let read_pool = settings.pool(4)?;
    let consumer = ConsumerId::new("dashboard")?;
    let projects = vec![ProjectId::new("p1")?, ProjectId::new("p2")?];
    // Every project's consumer delivers as `delivery`; the duties are carried out once.
    let (delivery, duties) = (DeliverySettings::default(), Duties::default());
    let settings = ServerSettings::new(consumer);

    Server::new(connections, read_pool, delivery, duties, projects, settings)
        .run(listener, shutdown)
        .await?;
    Ok(())
}
