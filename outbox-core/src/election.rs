//! One active sequencer among many processes: a lease row with a generation, and an adaptive
//! tick for the process that holds it.
//!
//! Every process that may sequence (each consumer's embedded sequencer, `outbox sequence
//! --every`) runs an [`ElectedSequencer`]. The holder of the lease row ticks; the others only
//! try to take the row every quarter of the lease TTL, one statement that matches nothing and
//! writes nothing while the lease is held. So 50 idle processes cost the database about
//! `50 / (TTL / 4)` statements per second for the election, plus the leader's idle ticks,
//! instead of one probe per process every 10 ms.
//!
//! The lease is a row, not a session advisory lock, so it works through transaction-mode
//! poolers and outlives a reconnect. It decides who *should* tick, never whether numbering is
//! correct: each tick still takes the transaction-level sequencer lock and numbers in a
//! snapshot taken after it (see [`Sequencer`]), so a deposed leader that has not noticed yet
//! (paused, say, then continued) and its successor still number one at a time, gap-free and
//! never twice.
//!
//! Timing, with TTL `t`: the leader renews every `t/4` and regards itself the leader until
//! `t - t/5` after its last successful renewal was sent (so it steps down before the row
//! expires, even when renewals fail); a follower looks at the row every `t/4`. When the leader
//! dies its row expires at most `t` after its last renewal, and a follower takes over within
//! `t/4` of that: numbering pauses for at most `1.25 t`. A leader that stops cleanly releases
//! the row and a follower takes over at its next look. A leader that died without releasing
//! it (`kill -9`, a crash) on this host is taken over at a follower's next look, and at once
//! by a process started after it, without waiting for the row to expire: [`holder_is_gone`](crate::owner::holder_is_gone),
//! the rule the consumer lease uses too.
//!
//! The leader's tick is adaptive ([`Cadence`]): soon after a tick that numbered something (so
//! a steady stream is numbered nearly back to back, each tick taking what committed during the
//! last one), then 1 ms, doubling after each tick that found nothing, up to the idle tick. So
//! a steady stream waits about one tick for its numbers, and an idle leader costs one probe per
//! idle tick. "Soon" grows with the tick's batch: [`BUSY_PAUSE_PER_EVENT`] per event it
//! numbered, at most the maximum tick pause ([`DEFAULT_MAX_TICK_PAUSE`]). A light stream
//! (a few events a tick) is numbered back to back as before; under saturation every tick pays
//! its fixed cost (a transaction, its commit, the lock, the frontier row) for more events.
//!
//! A minimum tick pause (`--min-tick-pause`, none by default) trades latency for work at
//! moderate rates, where the per-event pause stays near zero: a leader pausing at least 5 ms
//! ticks at most about 200 times a second, so every tick, every consumer's read that follows
//! it and every acknowledgement carry more events, and an event waits at most that much longer
//! for its number. It is the lever for processes whose clients are paced anyway (an SSE fan-out
//! at tens of milliseconds) on a database whose CPU the writers need.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::Client;

use crate::error::Error;
use crate::owner::holder_is_gone;
use crate::schema::Schema;
use crate::sequencer::Sequencer;
use crate::sql;
use crate::stmt::Unnamed as _;

/// The pause after a tick, per event it numbered. A tick costs the server about 0.45 ms
/// however few events it numbers, plus about 30 µs per event (bench/RESULTS-tick-cost.md):
/// a tick of 2 events waits 0.1 ms before the next, one of 40 the maximum pause.
pub const BUSY_PAUSE_PER_EVENT: Duration = Duration::from_micros(50);

/// Default longest pause after a tick that numbered something: what a saturated stream adds
/// to an event's wait for its number, for ticks that each carry their fixed cost for more
/// events.
pub const DEFAULT_MAX_TICK_PAUSE: Duration = Duration::from_millis(2);

/// Longest pause `--max-tick-pause` and `--min-tick-pause` accept: past this the pause is
/// latency, not pacing.
pub const MAX_TICK_PAUSE_LIMIT: Duration = Duration::from_millis(100);

/// The first delay after a tick that found nothing; it doubles from here up to the idle tick.
const FIRST_IDLE_STEP: Duration = Duration::from_millis(1);

/// Default slowest tick of an idle leader.
pub const DEFAULT_IDLE_TICK: Duration = Duration::from_millis(50);

/// Default length of the sequencer lease.
pub const DEFAULT_SEQUENCER_LEASE_TTL: Duration = Duration::from_secs(10);

/// Shortest sequencer lease accepted (tests use short ones; below this, renewals would crowd
/// the database and a slow round trip would cost the lease).
pub const MIN_SEQUENCER_LEASE_TTL: Duration = Duration::from_millis(500);

/// The adaptive tick: a pause growing with the batch after a tick that numbered something
/// ([`BUSY_PAUSE_PER_EVENT`] per event, at most `max_pause`), then from `FIRST_IDLE_STEP`
/// doubling while idle, capped at the idle tick. A pure state machine.
///
/// With the defaults (2 ms, 50 ms): after a tick that numbered 4 events the next comes after
/// 0.2 ms, after one of 100 after 2 ms; then after 1, 2, 4, 8, 16, 32, 50, 50, ... ms while
/// nothing arrives. A `max_pause` of zero ticks again at once after any tick that numbered
/// something.
#[derive(Debug, Clone)]
pub struct Cadence {
    /// The shortest pause after a tick that numbered something.
    min_pause: Duration,
    /// The longest pause after a tick that numbered something.
    max_pause: Duration,
    /// The cap while idle.
    idle: Duration,
    /// The last delay while idle (zero after a tick that numbered something).
    idle_step: Duration,
}

impl Cadence {
    /// A cadence pausing at most `max_pause` after a busy tick (lowered to `idle` if above it)
    /// and at most `idle` while idle.
    pub fn new(max_pause: Duration, idle: Duration) -> Self {
        Self {
            min_pause: Duration::ZERO,
            max_pause: max_pause.min(idle),
            idle,
            idle_step: Duration::ZERO,
        }
    }

    /// Pauses at least `min_pause` after a busy tick however few events it numbered (lowered
    /// to the idle tick if above it; the longest pause is raised to it if below).
    pub fn with_min_pause(mut self, min_pause: Duration) -> Self {
        self.min_pause = min_pause.min(self.idle);
        self.max_pause = self.max_pause.max(self.min_pause);
        self
    }

    /// The delay before the next tick, after a tick that numbered `numbered` events.
    pub fn after_tick(&mut self, numbered: u64) -> Duration {
        if numbered > 0 {
            self.idle_step = Duration::ZERO;
            return BUSY_PAUSE_PER_EVENT
                .saturating_mul(u32::try_from(numbered).unwrap_or(u32::MAX))
                .min(self.max_pause)
                .max(self.min_pause);
        }
        self.idle_step = self
            .idle_step
            .saturating_mul(2)
            .max(FIRST_IDLE_STEP)
            .min(self.idle);
        self.idle_step
    }
}

/// The interval of renewals (leader) and looks at the row (followers): a quarter of the TTL.
fn check_interval(ttl: Duration) -> Duration {
    ttl / 4
}

/// How long after sending a successful claim or renewal the leader regards the lease as its
/// own: the TTL less a fifth, so it steps down before the row expires on the server even if
/// its clock runs slow or its renewals fail.
fn local_validity(ttl: Duration) -> Duration {
    ttl - ttl / 5
}

/// The lease as this process holds it.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// The generation of the lease row while this process holds it.
    generation: i64,
    /// Until when this process regards itself the leader.
    valid_until: Instant,
    /// When to renew next.
    renew_at: Instant,
}

/// A sequencer that ticks only while it holds the sequencer lease. See the module docs.
#[derive(Debug)]
pub struct ElectedSequencer {
    /// The numbering itself.
    sequencer: Sequencer,
    /// The claim/renew statement for the schema.
    claim: String,
    /// The take-over statement for the schema (a holder that is gone).
    take_over: String,
    /// The release statement for the schema.
    release: String,
    /// This process's name in the lease row (host, PID, random suffix).
    owner: String,
    /// Length of the lease.
    ttl: Duration,
    /// The lease, while held.
    held: Option<Held>,
    /// When a follower looks at the row next.
    next_check: Instant,
    /// The leader's adaptive tick.
    cadence: Cadence,
}

impl ElectedSequencer {
    /// An elected sequencer named `owner` (unique per process run), with lease `ttl` (at least
    /// [`MIN_SEQUENCER_LEASE_TTL`]) and `idle_tick` as the slowest tick while leading, pausing
    /// at most [`DEFAULT_MAX_TICK_PAUSE`] after a busy tick ([`Self::with_max_tick_pause`]).
    pub fn new(
        sequencer: Sequencer,
        schema: &Schema,
        owner: String,
        ttl: Duration,
        idle_tick: Duration,
    ) -> Self {
        Self {
            sequencer,
            claim: schema.render(sql::CLAIM_SEQUENCER_LEASE),
            take_over: schema.render(sql::TAKE_OVER_SEQUENCER_LEASE),
            release: schema.render(sql::RELEASE_SEQUENCER_LEASE),
            owner,
            ttl: ttl.max(MIN_SEQUENCER_LEASE_TTL),
            held: None,
            next_check: Instant::now(),
            cadence: Cadence::new(DEFAULT_MAX_TICK_PAUSE, idle_tick),
        }
    }

    /// Sets the longest pause after a tick that numbered something (zero: tick again at once).
    /// Call before [`Self::with_min_tick_pause`].
    pub fn with_max_tick_pause(mut self, max_pause: Duration) -> Self {
        self.cadence =
            Cadence::new(max_pause, self.cadence.idle).with_min_pause(self.cadence.min_pause);
        self
    }

    /// Sets the shortest pause after a tick that numbered something (zero, the default: as
    /// the batch asks); see the module docs.
    pub fn with_min_tick_pause(mut self, min_pause: Duration) -> Self {
        self.cadence = self.cadence.with_min_pause(min_pause);
        self
    }

    /// The generation of the lease while this process leads.
    pub fn generation(&self) -> Option<i64> {
        self.held.map(|h| h.generation)
    }

    /// This process's name in the lease row.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// One step: as a follower, looks at the lease row when due (taking it when free or
    /// expired); as the leader, renews when due and numbers what has committed. Returns how
    /// long to wait before the next step. An error leaves the role as it was, except that a
    /// leader whose renewals keep failing steps down when its local validity runs out.
    pub async fn step(&mut self, client: &mut Client) -> Result<Duration, Error> {
        let now = Instant::now();
        if let Some(held) = self.held {
            if now >= held.valid_until {
                tracing::warn!(
                    generation = held.generation,
                    "sequencer lease not renewed in time; stepping down"
                );
                self.held = None;
                self.next_check = now;
            } else if now >= held.renew_at {
                self.claim(client).await?;
            }
        }
        if self.held.is_none() {
            if now < self.next_check {
                return Ok(self.next_check - now);
            }
            self.claim(client).await?;
        }
        let Some(held) = self.held else {
            return Ok(self.next_check.saturating_duration_since(Instant::now()));
        };
        // Ticks no longer than until the next renewal is due: a drain under writers that
        // keep every batch full would otherwise starve the renewals, and go on numbering
        // after the lease ran out.
        let until = held.renew_at.min(held.valid_until);
        let numbered = self.sequencer.drain_until(client, until).await?;
        Ok(self.cadence.after_tick(numbered))
    }

    /// Claims or renews the lease, updating the role; takes it over at once from a holder
    /// that is gone ([`holder_is_gone`](crate::owner::holder_is_gone)), or from this very process run when a claim of its
    /// own committed but its answer was lost.
    async fn claim(&mut self, client: &Client) -> Result<(), Error> {
        let sent_at = Instant::now();
        let generation = self.held.map_or(0, |h| h.generation);
        let row = client
            .query_one_unnamed(
                &self.claim,
                &[&self.owner, &generation, &self.ttl.as_secs_f64()],
            )
            .await?;
        let mut claimed: Option<i64> = row.try_get("claimed")?;
        if claimed.is_none() {
            let holder: Option<String> = row.try_get("holder")?;
            let holder_generation: i64 = row.try_get("holder_generation")?;
            if let Some(holder) = holder.filter(|h| *h == self.owner || holder_is_gone(h)) {
                let taken = client
                    .query_opt_unnamed(
                        &self.take_over,
                        &[
                            &self.owner,
                            &self.ttl.as_secs_f64(),
                            &holder,
                            &holder_generation,
                        ],
                    )
                    .await?;
                if let Some(taken) = taken {
                    tracing::warn!(
                        holder = %holder, generation = holder_generation,
                        "the sequencer lease holder no longer exists on this host; taking the \
                         lease over"
                    );
                    claimed = Some(taken.try_get("generation")?);
                }
            }
        }
        let check = check_interval(self.ttl);
        match claimed {
            Some(new) => {
                if new != generation {
                    tracing::info!(generation = new, owner = %self.owner, "leading the sequencer");
                }
                self.held = Some(Held {
                    generation: new,
                    valid_until: sent_at + local_validity(self.ttl),
                    renew_at: sent_at + check,
                });
                // Right after taking over, tick fast: work may have piled up.
                self.cadence.after_tick(1);
            }
            None => {
                if let Some(held) = self.held.take() {
                    tracing::warn!(
                        generation = held.generation,
                        "sequencer lease taken over by another process; following"
                    );
                }
                self.next_check = sent_at + check;
            }
        }
        Ok(())
    }

    /// Gives the lease up, if held, so a follower takes over at its next look. Best effort:
    /// an unreleased lease simply expires.
    pub async fn release(&mut self, client: &Client) {
        let Some(held) = self.held.take() else {
            return;
        };
        if let Err(e) = client
            .execute_unnamed(&self.release, &[&self.owner, &held.generation])
            .await
        {
            tracing::warn!(error = %e, "could not release the sequencer lease; it will expire");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cadence_pauses_with_the_batch_and_backs_off_to_idle() {
        let mut c = Cadence::new(DEFAULT_MAX_TICK_PAUSE, DEFAULT_IDLE_TICK);
        let us = |d: Duration| d.as_micros();
        assert_eq!(us(c.after_tick(1)), 50);
        assert_eq!(us(c.after_tick(4)), 200);
        assert_eq!(us(c.after_tick(40)), 2_000);
        assert_eq!(us(c.after_tick(5_000)), 2_000);
        assert_eq!(us(c.after_tick(u64::MAX)), 2_000);
        let idle: Vec<u128> = (0..9).map(|_| us(c.after_tick(0)) / 1000).collect();
        assert_eq!(idle, vec![1, 2, 4, 8, 16, 32, 50, 50, 50]);
        // Activity starts the idle back-off over.
        assert_eq!(us(c.after_tick(2)), 100);
        let idle: Vec<u128> = (0..3).map(|_| us(c.after_tick(0)) / 1000).collect();
        assert_eq!(idle, vec![1, 2, 4]);
        // No pause at all: back to back after any tick that numbered something.
        let mut c = Cadence::new(Duration::ZERO, DEFAULT_IDLE_TICK);
        assert_eq!(us(c.after_tick(500)), 0);
        assert_eq!(us(c.after_tick(0)), 1_000);
        // A pause above the idle tick is lowered to it.
        let mut c = Cadence::new(Duration::from_millis(20), Duration::from_millis(5));
        assert_eq!(us(c.after_tick(1_000)), 5_000);
        let idle: Vec<u128> = (0..5).map(|_| us(c.after_tick(0))).collect();
        assert_eq!(idle, vec![1_000, 2_000, 4_000, 5_000, 5_000]);
    }

    #[test]
    fn a_minimum_pause_holds_after_small_ticks_and_raises_the_maximum() {
        let us = |d: Duration| d.as_micros();
        let mut c = Cadence::new(DEFAULT_MAX_TICK_PAUSE, DEFAULT_IDLE_TICK)
            .with_min_pause(Duration::from_millis(5));
        assert_eq!(us(c.after_tick(1)), 5_000);
        assert_eq!(us(c.after_tick(40)), 5_000);
        assert_eq!(us(c.after_tick(5_000)), 5_000);
        // Idle back-off is unchanged by it.
        let idle: Vec<u128> = (0..3).map(|_| us(c.after_tick(0)) / 1000).collect();
        assert_eq!(idle, vec![1, 2, 4]);
        // Below the maximum, large ticks still pause with their batch.
        let mut c = Cadence::new(Duration::from_millis(10), DEFAULT_IDLE_TICK)
            .with_min_pause(Duration::from_millis(1));
        assert_eq!(us(c.after_tick(2)), 1_000);
        assert_eq!(us(c.after_tick(100)), 5_000);
        assert_eq!(us(c.after_tick(1_000)), 10_000);
        // Never above the idle tick.
        let mut c = Cadence::new(Duration::ZERO, Duration::from_millis(5))
            .with_min_pause(Duration::from_millis(20));
        assert_eq!(us(c.after_tick(1)), 5_000);
    }

    #[test]
    fn lease_arithmetic_steps_down_before_expiry() {
        let ttl = Duration::from_secs(10);
        assert_eq!(check_interval(ttl), Duration::from_millis(2500));
        assert_eq!(local_validity(ttl), Duration::from_secs(8));
        // Three renewals are attempted before the leader steps down.
        assert!(check_interval(ttl) * 3 < local_validity(ttl));
        assert!(local_validity(ttl) < ttl);
    }
}
