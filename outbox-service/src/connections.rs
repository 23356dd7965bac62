//! The start-up every durable consumer of a service shares, written once: the pool, the
//! LISTEN connection's configuration and the TLS connector both use, and a lone
//! [`Consumer`] or a [`ConsumerSet`] built on them.

use std::sync::Arc;

use deadpool_postgres::Pool;
use outbox_consumer::handler::Plain;
use outbox_consumer::set::PairFactory;
use outbox_consumer::{
    Consumer, ConsumerConfig, ConsumerSet, DeliverySettings, Duties, Handler, Projects, Reconciler,
};
use outbox_core::ConsumerId;
use outbox_core::connect::{ConnectError, ConnectSettings, Connector};

/// The `application_name` of the LISTEN connection, so operators can tell it apart.
const LISTENER_APPLICATION: &str = "outbox-listener";

/// What a service's consumers run on.
#[derive(Clone)]
pub struct Connections {
    /// Shared by the consumers (and their heartbeat, sequencer and sweep).
    pub pool: Pool,
    /// The LISTEN connection's configuration; `None` polls only.
    pub listen: Option<tokio_postgres::Config>,
    /// TLS for both.
    pub tls: Connector,
}

impl Connections {
    /// A pool of `pool_size` and, when `listen`, the configuration of one LISTEN connection,
    /// from `settings`. Nothing is connected yet: check the database first (with
    /// [`ConnectSettings::connect`]) to fail fast when it cannot be reached.
    pub fn new(
        settings: &ConnectSettings,
        pool_size: usize,
        listen: bool,
    ) -> Result<Self, ConnectError> {
        let pool = settings.pool(pool_size)?;
        let tls = settings.connector()?;
        let mut config = settings.wire_config();
        config.application_name(LISTENER_APPLICATION);
        Ok(Self {
            pool,
            listen: listen.then_some(config),
            tls,
        })
    }

    /// A lone consumer configured as `config`, with `sink` as both its handler and its
    /// reconciler.
    pub fn consumer<S: Handler + Reconciler>(
        &self,
        config: ConsumerConfig,
        sink: S,
    ) -> Consumer<Plain<Arc<S>>, Arc<S>> {
        let sink = Arc::new(sink);
        Consumer::new(
            self.pool.clone(),
            self.listen.clone(),
            config,
            sink.clone(),
            sink,
        )
        .listen_tls(self.tls.clone())
    }

    /// A set of consumers on this one pool and LISTEN connection: every pair of `projects` ×
    /// `consumer_ids`, each delivering as `template`, with handlers from `factory`; the set
    /// carries out `duties` once for all of them.
    pub fn set<F: PairFactory>(
        &self,
        template: DeliverySettings,
        duties: Duties,
        projects: Projects,
        consumer_ids: Vec<ConsumerId>,
        factory: F,
    ) -> ConsumerSet<F> {
        ConsumerSet::new(
            self.pool.clone(),
            self.listen.clone(),
            template,
            duties,
            projects,
            consumer_ids,
            factory,
        )
        .listen_tls(self.tls.clone())
    }
}
