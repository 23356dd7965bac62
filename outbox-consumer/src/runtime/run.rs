//! A run's set-up and teardown: checks, the lease claim, joining alone or in a set, the
//! delivery loop, and then the last acknowledgement, the tasks' end and the lease's release.

use std::sync::Arc;

use outbox_core::internal::Unnamed as _;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::membership::RunContext;
use super::progress::Progress;
use super::{Consumer, MIN_POOL_SIZE, RunSummary};
use crate::config::ConfigError;
use crate::dispatch::DispatchMode;
use crate::error::ConsumerError;
use crate::handler::Reconciler;
use crate::outage;
use crate::repeat::wait_out;
use crate::task;
use crate::{lease, sql, store};

impl<D: DispatchMode, R: Reconciler> Consumer<D, R> {
    /// Runs until `shutdown` is cancelled (then finishes or abandons the current event within
    /// the grace period, acknowledges what was handled and releases the lease), or until the
    /// lease is lost or a non-transient error occurs.
    ///
    /// On its own a consumer starts its own heartbeat, sequencer, sweep and listener; as a
    /// member of a consumer set, the set's shared side renews its lease, polls and wakes it, and runs
    /// the rest once for all members.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<RunSummary, ConsumerError> {
        self.config.validate()?;
        if self.config.delivery.lanes > 1 {
            if let Some(why) = self.dispatch.refuses_lanes() {
                return Err(ConfigError(format!(
                    "lanes {} refused: {why}",
                    self.config.delivery.lanes
                ))
                .into());
            }
        }
        let pool_size = self.pool.status().max_size;
        if pool_size < MIN_POOL_SIZE {
            return Err(ConfigError(format!(
                "the pool allows {pool_size} connection(s); a consumer needs at least \
                 {MIN_POOL_SIZE} (delivery, heartbeat, sequencer)"
            ))
            .into());
        }
        let statements = self.membership.statements(&self.config);
        // The live query is checked before the lease is claimed, so a wrong one registers and
        // holds nothing; only the default one of a consumer that replays history from the
        // earliest event is checked when it is first needed (such a consumer may never
        // reconcile, and its database need not have a `tasks` table). A consumer set checks
        // it once for all its members.
        // Each phase before the loop waits out an unavailable database (`outage::wait_out`),
        // as the loop does: a process started before its database, or during a restart,
        // begins once the database is back.
        if self.membership.checks_live_query() && self.config.delivery.checks_live_query_first() {
            let checked = wait_out(
                "the live query's check",
                &self.config.duties.availability,
                &shutdown,
                || async {
                    let mut client = self.pool.get().await?;
                    crate::live_query::check(&mut client, self.config.delivery.live_query.sql())
                        .await
                },
            )
            .await?;
            if checked.is_none() {
                return Ok(RunSummary::default());
            }
        }
        let declared = wait_out(
            "the event types' check",
            &self.config.duties.availability,
            &shutdown,
            || async {
                let client = self.pool.get().await?;
                store::check_declared(&**client, &statements, &self.config.delivery.event_types)
                    .await
            },
        );
        if declared.await?.is_none() {
            return Ok(RunSummary::default());
        }
        if self.config.delivery.reactivate
            && wait_out(
                "the consumer lookup",
                &self.config.duties.availability,
                &shutdown,
                || self.refuse_unknown(),
            )
            .await?
            .is_none()
        {
            return Ok(RunSummary::default());
        }
        let owner = self.membership.owner();
        let claim = wait_out(
            "the lease claim",
            &self.config.duties.availability,
            &shutdown,
            || lease::claim(&self.pool, &self.config, &owner, &shutdown),
        );
        let Some(Some(claimed)) = claim.await? else {
            return Ok(RunSummary::default());
        };
        if claimed.created {
            tracing::info!(
                "registering new consumer {} of project {}; it holds retention until retired",
                self.config.consumer_id,
                self.config.project_id
            );
        }
        let lease = Arc::new(claimed.lease);
        let lease_labels = [
            ("project", self.config.project_id.to_string()),
            ("consumer", self.config.consumer_id.to_string()),
        ];
        self.probe.claimed(lease.fence.generation);
        metrics::gauge!(crate::metric::LEASE_HELD.name, &lease_labels).set(1.0);
        metrics::gauge!(crate::metric::LEASE_GENERATION.name, &lease_labels)
            .set(lease.fence.generation as f64);
        let stop = CancellationToken::new();
        let context = RunContext {
            pool: &self.pool,
            listen: self.listen.as_ref(),
            config: &self.config,
            statements: &statements,
            stop: &stop,
        };
        let mut joined = self.membership.join(&context, &lease);
        let mut progress = Progress::new(
            &self.config,
            claimed.cursor,
            claimed.identity,
            claimed.created,
        );
        let span = tracing::info_span!(
            "consumer",
            project = %self.config.project_id,
            consumer = %self.config.consumer_id,
            generation = lease.fence.generation,
        );
        let mut result = self
            .deliver_loop(&lease, &statements, &joined, &shutdown, &mut progress)
            .instrument(span)
            .await;
        if result.is_ok() && progress.position.handled().is_some() {
            // One last try, so a clean stop does not leave handled events to be repeated.
            result = self.last_ack(&lease, &statements, &mut progress).await;
        }

        stop.cancel();
        task::join_all(std::mem::take(&mut joined.tasks)).await;
        self.membership.leave(&lease);
        if !matches!(result, Err(ConsumerError::LeaseLost { .. })) {
            lease::release(&self.pool, &lease, &statements.release).await;
        }
        self.probe.released();
        metrics::gauge!(crate::metric::LEASE_HELD.name, &lease_labels).set(0.0);
        result.map(|()| RunSummary {
            generation: lease.fence.generation,
            delivered: progress.delivered,
            cursor: progress.position.cursor(),
        })
    }

    /// The acknowledgement at the end of a run, retried through an unavailable database
    /// while the lease is still valid and within the shutdown grace: a stop during an outage
    /// is not a failure, and what could not be acknowledged is delivered again later.
    async fn last_ack(
        &self,
        lease: &lease::Lease,
        statements: &crate::store::Statements,
        progress: &mut Progress,
    ) -> Result<(), ConsumerError> {
        let until = tokio::time::Instant::now() + self.config.delivery.shutdown_grace;
        let mut failures: u32 = 0;
        loop {
            match self.ack_handled(lease, statements, progress).await {
                Ok(()) => {
                    self.config.duties.availability.reached();
                    return Ok(());
                }
                Err(e) if e.is_retryable() && !matches!(e, ConsumerError::LeaseLost { .. }) => {
                    if outage::is_outage(&e) {
                        let _ = self.config.duties.availability.unreachable(&e);
                    }
                    failures = failures.saturating_add(1);
                    let next =
                        tokio::time::Instant::now() + crate::backoff::outage_backoff(failures);
                    if !lease.is_valid() || next > until {
                        tracing::warn!(
                            error = %e,
                            "the last acknowledgement failed; the handled events after the \
                             cursor will be delivered again"
                        );
                        return Ok(());
                    }
                    tokio::time::sleep_until(next).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reactivation applies to a consumer that exists: refuses one without a row.
    async fn refuse_unknown(&self) -> Result<(), ConsumerError> {
        let client = self.pool.get().await?;
        let (project, consumer) = (&self.config.project_id, &self.config.consumer_id);
        let row = client
            .query_opt_unnamed(
                &self.config.duties.schema.render(sql::CONSUMER_ROW),
                &[&project.as_str(), &consumer.as_str()],
            )
            .await?;
        match row {
            Some(_) => Ok(()),
            None => Err(ConsumerError::UnknownConsumer {
                project: project.clone(),
                consumer: consumer.clone(),
                existing_only: false,
            }),
        }
    }
}
