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
    #[error("database error: {}", outbox_core::error::describe(.0))]
    Database(#[from] tokio_postgres::Error),
    /// No pooled connection could be had.
    #[error("no database connection: {}", describe_pool(.0))]
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
    /// The handler's sink holds output from a history the database no longer has
    /// ([`crate::HandlerFailure::history_diverged`]); the run audits it and reconciles.
    #[error(
        "the sink holds this consumer's output up to {position} ({identity}), which the \
         database does not have"
    )]
    SinkDiverged {
        /// The sink's position.
        position: i64,
        /// The event the sink holds there.
        identity: String,
    },
    /// The reconciliation live-set query does not have the required shape (checked when it
    /// is first prepared, before the lease is claimed).
    #[error("invalid live query: {0}")]
    LiveQueryInvalid(String),
    /// The reconciliation live-set query failed when it ran.
    #[error("the live query failed during reconciliation: {0}")]
    LiveQueryFailed(String),
    /// A consumer that does not exist was asked to reactivate, or to start with
    /// [`existing_only`](crate::DeliverySettings::existing_only): creating it would register a
    /// consumer under a mistyped ID, which holds retention back until retired.
    #[error("{}", unknown_consumer(project, consumer, *existing_only))]
    UnknownConsumer {
        /// Project.
        project: ProjectId,
        /// Consumer.
        consumer: ConsumerId,
        /// True when refused by `existing_only`, false for a reactivation.
        existing_only: bool,
    },
    /// The database stayed unavailable longer than the process was told to wait
    /// ([`crate::outage::Availability::set_give_up_after`]).
    #[error(
        "giving up: the database has been unavailable for longer than {} (--give-up-after); \
         last error: {error}",
        humantime_secs(*.limit)
    )]
    GaveUp {
        /// The limit.
        limit: std::time::Duration,
        /// The error the outage began with.
        error: String,
    },
    /// A conditional acknowledgement found the database's cursor elsewhere than this process
    /// left it, under a lease that is still ours: the database's history is not the one this
    /// process delivered from (a failover lost a tail, a backup was restored). The run checks
    /// its position again, which finds the divergence and reconciles.
    #[error(
        "the cursor is at {} in the database, not at {left_at} where this process left it",
        found.map_or_else(|| "none".to_owned(), |at| at.to_string())
    )]
    CursorMoved {
        /// Where this process left the cursor.
        left_at: i64,
        /// Where the database has it.
        found: Option<i64>,
    },
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
            ConsumerError::Database(e) => outbox_core::error::is_retryable_db(e),
            ConsumerError::Core(e) => e.is_retryable(),
            ConsumerError::Pool(e) => match e {
                deadpool_postgres::PoolError::Backend(e) => outbox_core::error::is_retryable_db(e),
                deadpool_postgres::PoolError::Timeout(_) => true,
                _ => false,
            },
            ConsumerError::ReconcilerFailed { .. } => true,
            _ => false,
        }
    }
}

/// A duration as the flags take it (`10s`, `1.5s`).
fn humantime_secs(d: std::time::Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// What went wrong getting a pooled connection, naming the cause (the database's own error
/// for a failed connect) rather than the pool's wrapper text.
fn describe_pool(e: &deadpool_postgres::PoolError) -> String {
    use deadpool_postgres::{HookError, PoolError, TimeoutType};
    match e {
        PoolError::Backend(e) | PoolError::PostCreateHook(HookError::Backend(e)) => {
            outbox_core::error::describe(e)
        }
        PoolError::PostCreateHook(HookError::Message(message)) => message.to_string(),
        PoolError::Timeout(TimeoutType::Wait) => {
            "timed out waiting for a free connection in the pool".to_owned()
        }
        PoolError::Timeout(TimeoutType::Create) => {
            "timed out connecting to the database".to_owned()
        }
        PoolError::Timeout(TimeoutType::Recycle) => {
            "timed out checking a pooled connection".to_owned()
        }
        PoolError::Closed => "the connection pool is closed".to_owned(),
        PoolError::NoRuntimeSpecified => "the connection pool has no runtime".to_owned(),
    }
}

/// The message of [`ConsumerError::UnknownConsumer`].
fn unknown_consumer(project: &ProjectId, consumer: &ConsumerId, existing_only: bool) -> String {
    match existing_only {
        true => format!(
            "consumer {consumer} of project {project} does not exist and --existing-only \
             refuses to register it; check the ID (outbox consumers list --project {project}), \
             or start it once without --existing-only to register a new consumer"
        ),
        false => format!(
            "consumer {consumer} of project {project} does not exist, so there is nothing to \
             reactivate; start it without reactivation to register a new consumer"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pool_error_names_the_cause() {
        // Nothing listens on port 1: the connect is refused at once.
        let config: tokio_postgres::Config =
            "host=127.0.0.1 port=1 user=u dbname=d connect_timeout=5"
                .parse()
                .unwrap();
        let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
        let pool = deadpool_postgres::Pool::builder(manager)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .unwrap();
        let e = ConsumerError::from(pool.get().await.expect_err("nothing listens on port 1"));
        let text = e.to_string();
        assert!(!text.contains("Error occurred while creating"), "{text}");
        assert!(text.contains("refused"), "{text}");
    }
}
