//! The lease: one process at a time acts as a consumer, and a stale one is fenced off.
//!
//! A claim takes the consumer row when it is free or expired and bumps its generation. Every
//! later write names owner and generation and changes nothing if either moved on. Locally the
//! holder also keeps a deadline, `last renewal sent + TTL - margin`, and stops dispatching
//! once it passes: a paused or partitioned process cannot keep acting on an expired lease
//! while another process has already claimed it.
//!
//! A holder that is gone for certain (a process of this host whose PID no longer exists,
//! [`owner`]) is not waited for: its lease is taken over at once, with the generation bumped
//! as in any claim, so fencing holds even if it were somehow still writing.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use outbox_core::internal::Unnamed as _;
use outbox_core::states::ConsumerState;
use outbox_core::{ConsumerId, ProjectId};
use tokio_postgres::GenericClient;
use tokio_util::sync::CancellationToken;

use crate::config::ConsumerConfig;
use crate::error::ConsumerError;
use crate::sql;

mod owner;
mod reactivation;

/// Identifies a lease in fenced statements: `$1`..`$4`.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    /// Project of the consumer row.
    pub project: ProjectId,
    /// Consumer of the consumer row.
    pub consumer: ConsumerId,
    /// This process's lease owner token (not the consumer ID: it names one process run).
    pub owner: String,
    /// The generation this process claimed.
    pub generation: i64,
}

impl Fence {
    /// The four fence parameters.
    pub fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 4] {
        [&self.project, &self.consumer, &self.owner, &self.generation]
    }
}

/// Why a lease was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Loss {
    /// An operator retired the consumer.
    Retired {
        /// Who retired it.
        by: String,
        /// Why.
        reason: String,
    },
    /// Anything else: another process claimed it, the row is gone, a write was refused.
    Other(String),
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Loss::Retired { by, reason } => write!(f, "the consumer was retired by {by}: {reason}"),
            Loss::Other(reason) => f.write_str(reason),
        }
    }
}

/// Safety margin subtracted from the lease TTL for the local deadline: a tenth of the TTL,
/// at least 100 ms, so clock-rate differences never let two holders overlap.
pub(crate) fn local_margin(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(100)).min(ttl / 2)
}

/// The local deadline of a lease renewed by a statement sent at `sent_at`. The database
/// computed its expiry from a clock reading taken after `sent_at`, so this is conservative.
pub(crate) fn local_deadline(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl - local_margin(ttl)
}

/// The lease as this process holds it.
#[derive(Debug)]
pub(crate) struct Lease {
    /// Fence parameters.
    pub fence: Fence,
    /// Local deadline; dispatch stops once it passes.
    valid_until: Mutex<Instant>,
    /// Cancelled when a fenced write or heartbeat was rejected.
    lost: CancellationToken,
    /// Why it was lost, for the error.
    lost_reason: Mutex<Option<Loss>>,
    /// Reads the consumer row to explain a rejected write.
    explain: String,
    /// Lease length.
    ttl: Duration,
    /// Tests only (`OUTBOX_TEST_LEASE_CHECK_DELAY_MS`): a failed check within this long of
    /// the last passed one is ignored, and the last time a check passed.
    check_delay: Option<(Duration, Mutex<Option<Instant>>)>,
}

/// The environment variable of [`test_check_delay`].
pub(crate) const TEST_CHECK_DELAY_VAR: &str = "OUTBOX_TEST_LEASE_CHECK_DELAY_MS";

/// **For tests only**: `OUTBOX_TEST_LEASE_CHECK_DELAY_MS`, milliseconds for which a holder
/// keeps dispatching after its lease check starts failing, as if it had been paused between
/// its check and its work. The zombie-race tests set it so that a holder resumed from SIGSTOP
/// publishes while its successor does; nothing else may: it defeats the local deadline.
fn test_check_delay() -> Option<Duration> {
    let value = std::env::var(TEST_CHECK_DELAY_VAR).ok()?;
    let millis: u64 = value.trim().parse().ok()?;
    tracing::warn!(
        millis,
        "{TEST_CHECK_DELAY_VAR} is set (for tests only): failed lease checks are ignored \
         for that long after the last one that passed"
    );
    Some(Duration::from_millis(millis))
}

impl Lease {
    fn new(fence: Fence, claimed_at: Instant, ttl: Duration, explain: String) -> Self {
        Self {
            explain,
            fence,
            valid_until: Mutex::new(local_deadline(claimed_at, ttl)),
            lost: CancellationToken::new(),
            lost_reason: Mutex::new(None),
            ttl,
            check_delay: test_check_delay().map(|delay| (delay, Mutex::new(None))),
        }
    }

    /// The longest a fenced transaction may sit idle, in milliseconds as text: one lease
    /// length, after which the lease would have expired anyway.
    pub fn idle_limit_ms(&self) -> String {
        self.ttl.as_millis().to_string()
    }

    /// True while this process may dispatch.
    pub fn is_valid(&self) -> bool {
        let now = Instant::now();
        let valid =
            !self.lost.is_cancelled() && now < *self.valid_until.lock().expect("lease lock");
        let Some((delay, passed)) = &self.check_delay else {
            return valid;
        };
        let mut passed = passed.lock().expect("lease lock");
        if valid {
            *passed = Some(now);
            return true;
        }
        passed.is_some_and(|at| now < at + *delay)
    }

    /// True once the lease is known to be lost (not merely expired locally).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// The local deadline.
    #[cfg(test)]
    pub fn valid_until(&self) -> Instant {
        *self.valid_until.lock().expect("lease lock")
    }

    /// Records a successful renewal sent at `sent_at`.
    pub fn renewed(&self, sent_at: Instant) {
        let mut until = self.valid_until.lock().expect("lease lock");
        *until = (*until).max(local_deadline(sent_at, self.ttl));
    }

    /// Marks the lease lost; dispatch stops at once.
    pub fn lose(&self, loss: Loss) {
        let mut slot = self.lost_reason.lock().expect("lease lock");
        if slot.is_none() {
            tracing::error!(
                project = %self.fence.project, consumer = %self.fence.consumer,
                generation = self.fence.generation, reason = %loss,
                "lease lost: stopping dispatch"
            );
            *slot = Some(loss);
        }
        self.lost.cancel();
    }

    /// After a rejected write: reads the consumer row to say why, and marks the lease lost.
    pub async fn lose_after_rejection(
        &self,
        client: &(impl GenericClient + Sync),
    ) -> ConsumerError {
        let loss = match client
            .query_opt_unnamed(&self.explain, &[&self.fence.project, &self.fence.consumer])
            .await
        {
            Ok(Some(row)) => match ConsumerRow::decode(&row) {
                Ok(row) if row.retired() => Loss::Retired {
                    by: row.retired_by.unwrap_or_default(),
                    reason: row.retired_reason.unwrap_or_default(),
                },
                Ok(row) => Loss::Other(format!(
                    "claimed by {} (generation {})",
                    row.lease_owner.unwrap_or_else(|| "nobody".into()),
                    row.lease_generation
                )),
                Err(e) => Loss::Other(format!("the consumer row is unreadable: {e}")),
            },
            Ok(None) => Loss::Other("the consumer row is gone".into()),
            Err(e) => Loss::Other(format!(
                "a fenced write was rejected ({})",
                outbox_core::error::describe(&e)
            )),
        };
        self.lose(loss);
        self.lost_error()
    }

    /// Resolves when the lease is lost.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// The error describing the loss (or an expiry nobody has claimed yet).
    pub fn lost_error(&self) -> ConsumerError {
        let loss = self.lost_reason.lock().expect("lease lock").clone();
        match loss {
            Some(Loss::Retired { by, reason }) => ConsumerError::Retired {
                project: self.fence.project.clone(),
                consumer: self.fence.consumer.clone(),
                by,
                reason,
            },
            Some(Loss::Other(reason)) => ConsumerError::LeaseLost {
                consumer: self.fence.consumer.clone(),
                generation: self.fence.generation,
                reason,
            },
            None => ConsumerError::LeaseLost {
                consumer: self.fence.consumer.clone(),
                generation: self.fence.generation,
                reason: "lease expired locally before it could be renewed".into(),
            },
        }
    }
}

/// The consumer row as `CONSUMER_ROW` reads it: why a claim or a fenced write found nothing.
struct ConsumerRow {
    /// The stored state text (compared, not parsed: a state added later is not `retired`).
    state: String,
    lease_owner: Option<String>,
    lease_generation: i64,
    /// Seconds until the lease expires (0 when it has).
    expires_in: f64,
    retired_by: Option<String>,
    retired_reason: Option<String>,
}

impl ConsumerRow {
    fn decode(row: &tokio_postgres::Row) -> Result<Self, tokio_postgres::Error> {
        Ok(Self {
            state: row.try_get("state")?,
            lease_owner: row.try_get("lease_owner")?,
            lease_generation: row.try_get("lease_generation")?,
            expires_in: row.try_get("expires_in")?,
            retired_by: row.try_get("retired_by")?,
            retired_reason: row.try_get("retired_reason")?,
        })
    }

    fn retired(&self) -> bool {
        self.state == ConsumerState::Retired.as_str()
    }
}

/// A successful claim.
pub(crate) struct Claimed {
    /// The lease.
    pub lease: Lease,
    /// The stored cursor; `None` when missing.
    pub cursor: Option<i64>,
    /// The identity the stored cursor records (the event ID it stands on).
    pub identity: Option<String>,
    /// Whether this claim created the consumer row (a brand-new consumer).
    pub created: bool,
}

/// Claims the consumer's lease, waiting for a held one to expire if configured to. A lease
/// whose holder is a process of this host that no longer exists is taken over at once.
pub(crate) async fn claim(
    pool: &Pool,
    config: &ConsumerConfig,
    owner: &str,
    shutdown: &CancellationToken,
) -> Result<Option<Claimed>, ConsumerError> {
    let schema = &config.duties.schema;
    let project = config.project_id.as_str();
    let consumer = config.consumer_id.as_str();
    let ttl_secs = config.delivery.lease_ttl.as_secs_f64();
    let mut announced = false;
    loop {
        let mut client = pool.get().await?;
        let sent_at = Instant::now();
        let row = {
            let tx = client.transaction().await?;
            let exists = tx
                .execute_unnamed(&schema.render(sql::LOCK_FOR_CLAIM), &[&project, &consumer])
                .await?
                > 0;
            // The row is locked when it exists, so no deletion can slip in before the claim.
            if !exists && config.delivery.existing_only {
                return Err(ConsumerError::UnknownConsumer {
                    project: config.project_id.clone(),
                    consumer: config.consumer_id.clone(),
                    existing_only: true,
                });
            }
            let row = tx
                .query_opt_unnamed(
                    &schema.render(sql::CLAIM),
                    &[&project, &consumer, &owner, &ttl_secs],
                )
                .await?;
            tx.commit().await?;
            row
        };
        if let Some(row) = row {
            return claimed(&client, &row, sent_at, config, owner)
                .await
                .map(Some);
        }
        let row = client
            .query_one_unnamed(&schema.render(sql::CONSUMER_ROW), &[&project, &consumer])
            .await?;
        let row = ConsumerRow::decode(&row)?;
        if row.retired() {
            if config.delivery.reactivate {
                let mut client = client;
                reactivation::reactivate(&mut client, config).await?;
                continue;
            }
            return Err(ConsumerError::Retired {
                project: config.project_id.clone(),
                consumer: config.consumer_id.clone(),
                by: row.retired_by.unwrap_or_default(),
                reason: row.retired_reason.unwrap_or_default(),
            });
        }
        let holder: String = row.lease_owner.unwrap_or_default();
        let generation = row.lease_generation;
        let expires_in = row.expires_in;
        // This very process run holds it when a claim committed but its answer was lost to a
        // dropped connection (the claim is then retried): take it over at once, as from a
        // holder that is gone, rather than wait for our own lease to expire.
        let ours = holder == owner;
        if ours || owner::holder_is_gone(&holder) {
            let sent_at = Instant::now();
            let taken = client
                .query_opt_unnamed(
                    &schema.render(sql::TAKE_OVER),
                    &[&project, &consumer, &owner, &ttl_secs, &holder, &generation],
                )
                .await?;
            if let Some(taken) = taken {
                match ours {
                    true => tracing::info!(
                        project,
                        consumer,
                        generation,
                        "this process's own claim lost its answer; taking the lease over"
                    ),
                    false => tracing::warn!(
                        project, consumer, holder = %holder, generation, expires_in,
                        "the lease holder no longer exists on this host; taking the lease over"
                    ),
                }
                return claimed(&client, &taken, sent_at, config, owner)
                    .await
                    .map(Some);
            }
            // The row moved on since it was read: look again.
            continue;
        }
        if !config.delivery.wait_for_lease {
            return Err(ConsumerError::LeaseHeld {
                project: config.project_id.clone(),
                consumer: config.consumer_id.clone(),
                owner: holder,
                generation,
                expires_in,
            });
        }
        if !announced {
            tracing::info!(
                project, consumer, holder = %holder, generation, expires_in,
                "lease held by another process; waiting for it to be released or expire"
            );
            announced = true;
        }
        drop(client);
        let wait = Duration::from_secs_f64(expires_in.clamp(0.05, 1.0));
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// The lease a claim or a takeover sent at `sent_at` returned in `row`, with the position it
/// starts from, read once the claim has committed (see [`sql::CLAIMED_POSITION`]).
async fn claimed(
    client: &deadpool_postgres::Client,
    row: &tokio_postgres::Row,
    sent_at: Instant,
    config: &ConsumerConfig,
    owner: &str,
) -> Result<Claimed, ConsumerError> {
    let generation: i64 = row.try_get("lease_generation")?;
    let created: bool = row.try_get("created")?;
    let position = client
        .query_opt_unnamed(
            &config.duties.schema.render(sql::CLAIMED_POSITION),
            &[&config.project_id.as_str(), &config.consumer_id.as_str()],
        )
        .await?;
    let (cursor, identity): (Option<i64>, Option<String>) = match position {
        Some(row) => (
            row.try_get("last_acked_sequence")?,
            row.try_get("last_acked_event_id")?,
        ),
        None => (None, None),
    };
    tracing::info!(
        project = %config.project_id, consumer = %config.consumer_id, generation,
        cursor = %crate::cursor::ShownCursor(cursor),
        "lease claimed"
    );
    let fence = Fence {
        project: config.project_id.clone(),
        consumer: config.consumer_id.clone(),
        owner: owner.to_owned(),
        generation,
    };
    Ok(Claimed {
        lease: Lease::new(
            fence,
            sent_at,
            config.delivery.lease_ttl,
            config.duties.schema.render(sql::CONSUMER_ROW),
        ),
        cursor,
        identity,
        created,
    })
}

/// Renews the lease every `interval` until `stop`; marks it lost when a renewal is rejected.
/// Runs on its own connection and timer, so a slow handler cannot starve it.
pub(crate) async fn heartbeat(
    pool: Pool,
    lease: &Lease,
    statement: String,
    interval: Duration,
    availability: &crate::outage::Availability,
    stop: CancellationToken,
) {
    let ttl_secs = lease.ttl.as_secs_f64();
    let mut next = tokio::time::Instant::now() + interval;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = lease.lost() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        let sent_at = Instant::now();
        let result = async {
            let client = pool.get().await?;
            let [p, c, o, g] = lease.fence.params();
            if client
                .execute_unnamed(&statement, &[p, c, o, g, &ttl_secs])
                .await?
                == 1
            {
                Ok(())
            } else {
                Err(lease.lose_after_rejection(&**client).await)
            }
        }
        .await;
        match result {
            Ok(()) => {
                lease.renewed(sent_at);
                availability.reached();
                next = tokio::time::Instant::now() + interval;
            }
            Err(ConsumerError::LeaseLost { .. } | ConsumerError::Retired { .. }) => return,
            Err(e) => {
                // Keep trying more often than usual; the local deadline stops dispatch if the
                // database stays unreachable. An outage is logged once for the process.
                if !availability.noted(crate::outage::is_outage(&e), &e) {
                    tracing::warn!(error = %e, "heartbeat failed; retrying");
                }
                next = tokio::time::Instant::now() + (interval / 4).max(Duration::from_millis(50));
            }
        }
    }
}

/// Gives the lease back (best effort: an expired lease needs no release).
pub(crate) async fn release(pool: &Pool, lease: &Lease, statement: &str) {
    let result = async {
        let client = pool.get().await?;
        client
            .execute_unnamed(statement, &lease.fence.params())
            .await?;
        Ok::<_, ConsumerError>(())
    }
    .await;
    match result {
        Ok(()) => tracing::info!(
            project = %lease.fence.project, consumer = %lease.fence.consumer,
            generation = lease.fence.generation, "lease released"
        ),
        Err(e) => tracing::warn!(error = %e, "could not release the lease; it will expire"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_deadline_keeps_a_margin() {
        let t0 = Instant::now();
        assert_eq!(
            local_deadline(t0, Duration::from_secs(60)),
            t0 + Duration::from_secs(54)
        );
        assert_eq!(
            local_deadline(t0, Duration::from_secs(1)),
            t0 + Duration::from_millis(900)
        );
        assert_eq!(
            local_deadline(t0, Duration::from_millis(150)),
            t0 + Duration::from_millis(75)
        );
    }

    #[test]
    fn renewal_never_shortens_and_loss_is_final() {
        let fence = Fence {
            project: ProjectId::new("p").unwrap(),
            consumer: ConsumerId::new("c").unwrap(),
            owner: "o".into(),
            generation: 3,
        };
        let t0 = Instant::now();
        let lease = Lease::new(fence, t0, Duration::from_secs(60), String::new());
        assert!(lease.is_valid());
        let before = lease.valid_until();
        lease.renewed(t0 - Duration::from_secs(10));
        assert_eq!(lease.valid_until(), before);
        lease.renewed(t0 + Duration::from_secs(5));
        assert!(lease.valid_until() > before);
        lease.lose(Loss::Other("taken".into()));
        assert!(!lease.is_valid());
        assert!(lease.lost_error().to_string().contains("generation 3"));
    }

    #[test]
    fn an_expired_local_deadline_stops_dispatch() {
        let fence = Fence {
            project: ProjectId::new("p").unwrap(),
            consumer: ConsumerId::new("c").unwrap(),
            owner: "o".into(),
            generation: 1,
        };
        let lease = Lease::new(
            fence,
            Instant::now() - Duration::from_secs(61),
            Duration::from_secs(60),
            String::new(),
        );
        assert!(!lease.is_valid());
    }
}
