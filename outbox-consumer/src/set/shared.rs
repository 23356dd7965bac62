//! What the consumers of a set share: one lease heartbeat, one fallback poll, one listener
//! routing notifications by project, project discovery, reads of each project's events
//! ([`SharedReads`]) and grouped acknowledgements ([`GroupAcks`]). It is each member's
//! [`Membership`].
//!
//! This shared side is what keeps a thousand idle consumers cheap. On its own a consumer renews its
//! lease every heartbeat interval and polls its project every poll interval; in a set, one
//! statement renews every lease the set holds ([`sql::HEARTBEAT_SET`]) and one statement
//! reads the heads of all its projects and the consumers with a replay request
//! ([`sql::POLL_SET`]), waking only the consumers of projects whose head moved.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use outbox_core::internal::Unnamed as _;
use outbox_core::{ProjectId, Schema};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::acks::{AckQueue, GroupAcks};
use super::reads::SharedReads;
use crate::config::ConsumerConfig;
use crate::error::ConsumerError;
use crate::lease::{Fence, Lease};
use crate::listener::Wake;
use crate::probe::PollClock;
use crate::repeat::Repeat;
use crate::runtime::{Fetched, GroupedAck, Joined, Membership, ReadAfter, RunContext};
use crate::signals::Signals;
use crate::sql;
use crate::store::Statements;

/// A running member of the set: its lease and its wake-ups.
struct Member {
    lease: Arc<Lease>,
    signals: Arc<Signals>,
}

/// The shared side of a consumer set.
pub(crate) struct Shared {
    /// The lease owner of every member: one token per set, so one statement renews them all
    /// (each lease is still fenced by its own generation).
    pub owner: String,
    /// The runtime's statements, rendered once for all members.
    pub statements: Arc<Statements>,
    /// [`sql::HEARTBEAT_SET`], rendered.
    heartbeat_set: String,
    /// [`sql::POLL_SET`], rendered.
    poll_set: String,
    /// The projects polled; `None` for every project (discovery).
    listed: Option<Vec<String>>,
    /// Every consumer ID of the set, for the replay-request part of the poll.
    consumer_ids: Vec<String>,
    /// Running members by project.
    members: Mutex<HashMap<String, Vec<Member>>>,
    /// Each project's head at the last poll: a member is woken only when its head moved.
    heads: Mutex<HashMap<String, i64>>,
    /// Projects already followed, so a discovered one is announced once.
    followed: Mutex<HashSet<String>>,
    /// Where newly discovered projects go, when the set follows every project.
    discovered: Option<mpsc::UnboundedSender<String>>,
    /// When [`Shared::poll_once`] last succeeded: a member waiting idle counts it as its own
    /// poll (see [`crate::probe::Probe`]).
    pub poll_clock: Arc<PollClock>,
    /// Each project's latest read, shared by its consumers.
    pub reads: SharedReads,
    /// Acknowledgements gathered into one statement.
    pub acks: GroupAcks,
    /// The acknowledging task's queue, until [`Shared::ack_task`] takes it.
    ack_queue: Mutex<Option<AckQueue>>,
    /// [`sql::ACK_SET`], rendered.
    ack_set: String,
    /// Held while the set's heartbeat or one of its grouped acknowledgements runs: both write
    /// many rows, in the order their plans visit them, so they must never run side by side
    /// (they could deadlock).
    row_writes: Arc<tokio::sync::Mutex<()>>,
    /// The process's view of its database, which the set's heartbeat and poll report to.
    pub availability: crate::outage::Availability,
}

impl Shared {
    /// The shared side for `consumer_ids` over `listed` projects, or, with `discovered`, over every
    /// project (new ones are sent there).
    pub fn new(
        schema: &Schema,
        pooler: outbox_core::connect::Pooler,
        availability: crate::outage::Availability,
        listed: Option<Vec<String>>,
        consumer_ids: Vec<String>,
        discovered: Option<mpsc::UnboundedSender<String>>,
    ) -> Self {
        let followed = listed.iter().flatten().cloned().collect();
        let (acks, ack_queue) = GroupAcks::new();
        Self {
            owner: outbox_core::internal::owner_token(),
            statements: Arc::new(Statements::new(schema, pooler)),
            heartbeat_set: schema.render(sql::HEARTBEAT_SET),
            poll_set: schema.render(sql::POLL_SET),
            listed,
            consumer_ids,
            members: Mutex::new(HashMap::new()),
            heads: Mutex::new(HashMap::new()),
            followed: Mutex::new(followed),
            discovered,
            poll_clock: Arc::default(),
            reads: SharedReads::default(),
            acks,
            ack_queue: Mutex::new(Some(ack_queue)),
            ack_set: schema.render(sql::ACK_SET),
            row_writes: Arc::default(),
            availability,
        }
    }

    /// The task sending grouped acknowledgements until `stop` (once; `None` after that).
    pub fn ack_task(
        &self,
        pool: Pool,
        stop: CancellationToken,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let queue = self.ack_queue.lock().expect("set lock").take()?;
        let (statement, owner) = (self.ack_set.clone(), self.owner.clone());
        let cached = self.statements.cached;
        let row_writes = self.row_writes.clone();
        Some(GroupAcks::run(
            queue, pool, statement, owner, cached, row_writes, stop,
        ))
    }

    /// Adds a member holding `lease`; its first round checks for replay requests.
    pub fn register(&self, lease: &Arc<Lease>) -> Arc<Signals> {
        let signals = Arc::new(Signals::default());
        signals.replay_due.store(true, Ordering::Relaxed);
        self.members
            .lock()
            .expect("set lock")
            .entry(lease.fence.project.to_string())
            .or_default()
            .push(Member {
                lease: lease.clone(),
                signals: signals.clone(),
            });
        signals
    }

    /// Removes the member holding `lease` (before it releases the lease, so the heartbeat
    /// neither renews nor mourns it).
    pub fn unregister(&self, lease: &Arc<Lease>) {
        let mut members = self.members.lock().expect("set lock");
        if let Some(list) = members.get_mut(lease.fence.project.as_str()) {
            list.retain(|m| !Arc::ptr_eq(&m.lease, lease));
        }
    }

    /// Whether `lease` still belongs to a running member.
    fn is_member(&self, lease: &Arc<Lease>) -> bool {
        self.members
            .lock()
            .expect("set lock")
            .get(lease.fence.project.as_str())
            .is_some_and(|list| list.iter().any(|m| Arc::ptr_eq(&m.lease, lease)))
    }

    /// Wakes every member of `project`, after marking its shared read stale.
    fn wake_project(&self, project: &str) {
        self.reads.signal(project);
        if let Some(list) = self.members.lock().expect("set lock").get(project) {
            for member in list {
                member.signals.wake.notify_one();
            }
        }
    }

    /// Announces `project` to the set if it follows every project and has not seen it yet; a
    /// probe project ([`outbox_core::ids::PROBE_PROJECT_PREFIX`]) is no user's and never followed.
    fn discover(&self, project: &str) {
        if outbox_core::ids::is_probe_project(project) {
            return;
        }
        if let Some(discovered) = &self.discovered {
            if self
                .followed
                .lock()
                .expect("set lock")
                .insert(project.to_owned())
            {
                let _ = discovered.send(project.to_owned());
            }
        }
    }

    /// Renews every member's lease every `interval` until `stop`, in one statement. A member
    /// missing from the answer lost its lease: it is told at once and stops; the others go on.
    pub async fn heartbeat(
        &self,
        pool: Pool,
        ttl: Duration,
        interval: Duration,
        stop: CancellationToken,
    ) {
        let mut next = tokio::time::Instant::now() + interval;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            next = match self.renew_all(&pool, ttl).await {
                Ok(()) => tokio::time::Instant::now() + interval,
                Err(e) => {
                    // As a lone consumer does: try more often; each local deadline stops its
                    // member if the database stays unreachable.
                    if !self.availability.noted(crate::outage::is_outage(&e), &e) {
                        tracing::warn!(error = %e, "set heartbeat failed; retrying");
                    }
                    tokio::time::Instant::now() + (interval / 4).max(Duration::from_millis(50))
                }
            };
        }
    }

    /// One renewal of every live lease.
    async fn renew_all(&self, pool: &Pool, ttl: Duration) -> Result<(), ConsumerError> {
        let leases: Vec<Arc<Lease>> = {
            let members = self.members.lock().expect("set lock");
            members
                .values()
                .flatten()
                .filter(|m| !m.lease.is_lost())
                .map(|m| m.lease.clone())
                .collect()
        };
        if leases.is_empty() {
            return Ok(());
        }
        let projects: Vec<&str> = leases.iter().map(|l| l.fence.project.as_str()).collect();
        let consumers: Vec<&str> = leases.iter().map(|l| l.fence.consumer.as_str()).collect();
        let generations: Vec<i64> = leases.iter().map(|l| l.fence.generation).collect();
        let writing = self.row_writes.lock().await;
        let mut client = pool.get().await?;
        let sent_at = Instant::now();
        // Under key scans only, as the grouped acknowledgement: with statistics taken while a
        // held snapshot keeps the replaced renewals, the planner deletes them by a scan of the
        // whole table rather than by their addresses (10 buffers a renewal grew to 37 after
        // 3,000 renewals and an ANALYZE; see `lease_renewals.rs`).
        let tx = client.transaction().await?;
        tx.batch_execute(sql::KEY_SCANS_ONLY).await?;
        let rows = tx
            .query_unnamed(
                &self.heartbeat_set,
                &[
                    &projects,
                    &consumers,
                    &generations,
                    &self.owner,
                    &ttl.as_secs_f64(),
                ],
            )
            .await?;
        tx.commit().await?;
        self.availability.reached();
        drop(writing);
        let mut renewed = HashSet::with_capacity(rows.len());
        for row in &rows {
            let project: String = row.try_get("project_id")?;
            let consumer: String = row.try_get("consumer_id")?;
            renewed.insert((project, consumer));
        }
        for lease in leases {
            let key = (
                lease.fence.project.to_string(),
                lease.fence.consumer.to_string(),
            );
            if renewed.contains(&key) {
                lease.renewed(sent_at);
            } else if self.is_member(&lease) {
                lease.lose_after_rejection(&**client).await;
            }
        }
        Ok(())
    }

    /// Polls every `interval` until `stop` (the set's fallback for lost notifications, and its
    /// discovery of new projects), backing off while the database is unreachable.
    pub async fn poll(&self, pool: Pool, interval: Duration, stop: CancellationToken) {
        let mut repeat = Repeat::new(&stop, &self.availability, "set poll", interval);
        while repeat.next().await {
            repeat.done(self.poll_once(&pool).await.map(|()| interval));
        }
    }

    /// One poll: announces projects not followed yet, wakes the members of projects whose
    /// head moved since the last poll, and flags (and wakes) members with a replay request.
    pub async fn poll_once(&self, pool: &Pool) -> Result<(), ConsumerError> {
        let rows = {
            let client = pool.get().await?;
            client
                .query_unnamed(&self.poll_set, &[&self.listed, &self.consumer_ids])
                .await?
        };
        self.availability.reached();
        for row in &rows {
            let project: String = row.try_get("project_id")?;
            let head: i64 = row.try_get("head_sequence")?;
            let replay: Vec<String> = row.try_get("replay_requested")?;
            self.discover(&project);
            let moved = self
                .heads
                .lock()
                .expect("set lock")
                .insert(project.clone(), head)
                != Some(head);
            if moved {
                self.reads.signal(&project);
            }
            let members = self.members.lock().expect("set lock");
            for member in members.get(&project).into_iter().flatten() {
                if replay
                    .iter()
                    .any(|c| c == member.lease.fence.consumer.as_str())
                {
                    member.signals.replay_due.store(true, Ordering::Relaxed);
                    member.signals.wake.notify_one();
                } else if moved {
                    member.signals.wake.notify_one();
                }
            }
        }
        // Every member waiting idle now has its head read and is woken if it moved.
        self.poll_clock.ticked();
        Ok(())
    }
}

impl Wake for Shared {
    /// Routes a notification to the members of its project; a project nobody follows yet is
    /// discovered this way as soon as its first event is numbered (the poll would find it at
    /// its next round).
    fn notified(&self, payload: &str) {
        self.wake_project(payload);
        self.discover(payload);
    }

    fn connected(&self) {
        self.reads.signal_all();
        for list in self.members.lock().expect("set lock").values() {
            for member in list {
                member.signals.wake.notify_one();
            }
        }
    }
}

impl Membership for Shared {
    fn owner(&self) -> String {
        self.owner.clone()
    }

    fn statements(&self, _: &ConsumerConfig) -> Arc<Statements> {
        self.statements.clone()
    }

    fn checks_live_query(&self) -> bool {
        false
    }

    fn join(&self, _: &RunContext<'_>, lease: &Arc<Lease>) -> Joined {
        Joined {
            signals: self.register(lease),
            tasks: Vec::new(),
            polls_itself: false,
        }
    }

    fn leave(&self, lease: &Arc<Lease>) {
        self.unregister(lease);
    }

    fn read<'a>(
        &'a self,
        read: ReadAfter<'a>,
        _: &'a mut Option<crate::runtime::Prefetch>,
    ) -> BoxFuture<'a, Result<Fetched, ConsumerError>> {
        async move {
            let ReadAfter {
                pool,
                statements,
                config,
                cursor,
            } = read;
            let batch = self
                .reads
                .read(
                    pool,
                    statements,
                    &config.project_id,
                    &config.consumer_id,
                    cursor,
                    config.delivery.batch_size,
                )
                .await?;
            Ok(Fetched {
                batch,
                read_ahead: false,
            })
        }
        .boxed()
    }

    fn ack<'a>(
        &'a self,
        fence: &'a Fence,
        left_at: i64,
        through: i64,
    ) -> BoxFuture<'a, GroupedAck> {
        self.acks.ack(fence, left_at, through).boxed()
    }

    fn numbered(&self, project: &ProjectId) {
        self.reads.signal(project.as_str());
    }
}
