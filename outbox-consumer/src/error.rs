//! The one error type of `outbox-consumer`.

use outbox_core::{ConsumerId, ProjectId};

/// Why a consumer stopped or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The configuration is inconsistent.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A core-library failure.
    #[error(transparent)]
    Core(#[from] outbox_core::Error),
    /// A statement failed.
    #[error("database error: {}", outbox_core::describe(.0))]
    Database(#[from] tokio_postgres::Error),
    /// No pooled connection could be had.
    #[error("connection pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// Another process holds this consumer's lease (only without waiting).
    #[error(
        "consumer {consumer} of project {project} is held by {owner} (generation {generation}) \
         for another {expires_in:.1}s"
    )]
    LeaseHeld {
        /// Project.
        project: ProjectId,
        /// Consumer.
        consumer: ConsumerId,
        /// The current holder.
        owner: String,
        /// The holder's generation.
        generation: i64,
        /// Seconds until the lease expires unless renewed.
        expires_in: f64,
    },
    /// This process lost its lease: a fenced write was rejected.
    #[error("lease of consumer {consumer} (generation {generation}) lost: {reason}")]
    LeaseLost {
        /// Consumer.
        consumer: ConsumerId,
        /// The generation this process held.
        generation: i64,
        /// What the consumer row says now.
        reason: String,
    },
    /// The reconciler failed; reconciliation is tried again after a backoff.
    #[error("reconciler failed ({class})")]
    ReconcilerFailed {
        /// The reconciler's failure class.
        class: crate::event::FailureClass,
    },
    /// The handler's sink cannot work ([`crate::HandlerFailure::stop`]); nothing of the current
    /// batch was acknowledged or recorded as failed.
    #[error("{reason}; stopped without acknowledging or failing the undelivered events")]
    SinkFailed {
        /// What the sink reported.
        reason: String,
    },
    /// The reconciliation live-set query does not have the required shape (checked when it
    /// is first prepared, before the lease is claimed).
    #[error("invalid live query: {0}")]
    LiveQueryInvalid(String),
    /// The reconciliation live-set query failed when it ran.
    #[error("the live query failed during reconciliation: {0}")]
    LiveQueryFailed(String),
    /// The consumer was retired by an operator.
    #[error(
        "consumer {consumer} of project {project} is retired (by {by}: {reason}); start it with \
         reactivation to reconcile and resume"
    )]
    Retired {
        /// Project.
        project: ProjectId,
        /// Consumer.
        consumer: ConsumerId,
        /// Who retired it.
        by: String,
        /// Why.
        reason: String,
    },
}

impl ConsumerError {
    /// True for transient failures the runtime rides out by waiting and retrying.
    pub fn is_retryable(&self) -> bool {
        match self {
            ConsumerError::Database(e) => outbox_core::is_retryable_db(e),
            ConsumerError::Core(e) => e.is_retryable(),
            ConsumerError::Pool(e) => match e {
                deadpool_postgres::PoolError::Backend(e) => outbox_core::is_retryable_db(e),
                deadpool_postgres::PoolError::Timeout(_) => true,
                _ => false,
            },
            ConsumerError::ReconcilerFailed { .. } => true,
            _ => false,
        }
    }
}
