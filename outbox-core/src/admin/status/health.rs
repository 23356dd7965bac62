//! The health rules of `status`: [`HealthThresholds`] and the pure functions that judge a
//! project's and a consumer's figures into bounded [`Health`] codes.

use std::time::Duration;

use serde::Serialize;

use super::report::ProjectStatus;
use crate::admin::ConsumerInfo;
use crate::retention::DEFAULT_RETENTION;
use crate::states::{ConsumerState, Health};

/// When `status` reports a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthThresholds {
    /// A consumer further behind than this many events is `lagging`.
    pub max_lag: i64,
    /// An event failing for longer than this is `stuck_retrying`.
    pub max_retrying_age: Duration,
    /// A held lease whose heartbeat is older than this is `stale_heartbeat` (default: twice
    /// the runtime's default heartbeat interval of 10 s).
    pub max_heartbeat_age: Duration,
    /// A committed event unsequenced for longer than this means `sequencer_stalled`.
    pub max_unsequenced_age: Duration,
    /// More prunable events than this in a project mean `pruning_backlog`. Prunable events
    /// are counted up to `max_prunable + 1` only, so the cost of `status` is bounded by it.
    pub max_prunable: i64,
    /// The retention period the prunable count and `retention_held` are judged by (that of
    /// the sweeps: `outbox prune --retention`, `outbox consume --retention`).
    pub retention: Duration,
    /// An event the sweep would keep that is older than `retention` plus this means
    /// `retention_held`.
    pub max_retention_overrun: Duration,
}

impl Default for HealthThresholds {
    /// 10 000 events, 15 min, 20 s, 60 s, 100 000 events, retention 30 days, 1 day.
    fn default() -> Self {
        Self {
            max_lag: 10_000,
            max_retrying_age: Duration::from_secs(15 * 60),
            max_heartbeat_age: Duration::from_secs(20),
            max_unsequenced_age: Duration::from_secs(60),
            max_prunable: 100_000,
            retention: DEFAULT_RETENTION,
            max_retention_overrun: Duration::from_secs(86_400),
        }
    }
}

impl Serialize for HealthThresholds {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("HealthThresholds", 7)?;
        st.serialize_field("max_lag", &self.max_lag)?;
        st.serialize_field(
            "max_retrying_age_secs",
            &self.max_retrying_age.as_secs_f64(),
        )?;
        st.serialize_field(
            "max_heartbeat_age_secs",
            &self.max_heartbeat_age.as_secs_f64(),
        )?;
        st.serialize_field(
            "max_unsequenced_age_secs",
            &self.max_unsequenced_age.as_secs_f64(),
        )?;
        st.serialize_field("max_prunable", &self.max_prunable)?;
        st.serialize_field("retention_secs", &self.retention.as_secs_f64())?;
        st.serialize_field(
            "max_retention_overrun_secs",
            &self.max_retention_overrun.as_secs_f64(),
        )?;
        st.end()
    }
}

/// `[ok]` for no problems, else the problems in a fixed order.
fn codes(mut problems: Vec<Health>) -> Vec<Health> {
    if problems.is_empty() {
        return vec![Health::Ok];
    }
    problems.sort();
    problems.dedup();
    problems
}

/// Judges a project: `sequencer_stalled` when its oldest unsequenced event is too old,
/// `pruning_backlog` when more than `max_prunable` events are prunable, `retention_held` when
/// the oldest event a sweep would keep is older than retention plus `max_retention_overrun`.
pub fn project_health(project: &ProjectStatus, thresholds: &HealthThresholds) -> Vec<Health> {
    let mut problems = Vec::new();
    if project
        .oldest_unsequenced_age_secs
        .is_some_and(|age| age > thresholds.max_unsequenced_age.as_secs_f64())
    {
        problems.push(Health::SequencerStalled);
    }
    if project.prunable > thresholds.max_prunable {
        problems.push(Health::PruningBacklog);
    }
    let held_past = thresholds
        .retention
        .saturating_add(thresholds.max_retention_overrun)
        .as_secs_f64();
    if project
        .oldest_held_age_secs
        .is_some_and(|age| age > held_past)
    {
        problems.push(Health::RetentionHeld);
    }
    codes(problems)
}

/// Judges a consumer. A retired consumer holds nothing back and is always `ok`. Whether
/// anybody runs it is judged like `not_running`, by the lease and the heartbeat's age (a
/// process restarting within `max_heartbeat_age` is not reported): `not_running` when events
/// wait for it, `replay_unserved` when requested replays wait for it (only the lease holder
/// replays).
pub fn consumer_health(consumer: &ConsumerInfo, thresholds: &HealthThresholds) -> Vec<Health> {
    if consumer.state == ConsumerState::Retired {
        return codes(Vec::new());
    }
    let mut problems = Vec::new();
    if consumer.lag.is_some_and(|lag| lag > thresholds.max_lag) {
        problems.push(Health::Lagging);
    }
    if consumer
        .retrying
        .as_ref()
        .is_some_and(|r| r.failing_for_secs > thresholds.max_retrying_age.as_secs_f64())
    {
        problems.push(Health::StuckRetrying);
    }
    let heartbeat_old = consumer
        .heartbeat_age_secs
        .is_none_or(|age| age > thresholds.max_heartbeat_age.as_secs_f64());
    let events_wait = consumer.head_sequence > consumer.cursor.unwrap_or(0);
    if consumer.lease_live && heartbeat_old {
        problems.push(Health::StaleHeartbeat);
    }
    if !consumer.lease_live && heartbeat_old && events_wait {
        problems.push(Health::NotRunning);
    }
    let never_acknowledged = consumer.cursor.is_none() || consumer.last_acked_at.is_none();
    if never_acknowledged
        && events_wait
        && !consumer.lease_live
        && consumer.created_age_secs > thresholds.max_heartbeat_age.as_secs_f64()
    {
        problems.push(Health::NeverAcknowledged);
    }
    if consumer.dead_letters > 0 {
        problems.push(Health::DeadLetters);
    }
    if consumer.replay_requested > 0 && !consumer.lease_live && heartbeat_old {
        problems.push(Health::ReplayUnserved);
    }
    codes(problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::RetryingEvent;
    use chrono::Utc;

    fn consumer(state: ConsumerState) -> ConsumerInfo {
        ConsumerInfo {
            project_id: "p".into(),
            consumer_id: "c".into(),
            state,
            cursor: Some(5),
            head_sequence: 5,
            lag: Some(0),
            handled_through: None,
            handled_ahead: None,
            lease_owner: Some("host:1:ab".into()),
            lease_generation: 1,
            lease_expires_at: None,
            lease_live: true,
            heartbeat_at: None,
            heartbeat_age_secs: Some(1.0),
            created_at: Utc::now(),
            created_age_secs: 3600.0,
            last_acked_at: Some(Utc::now()),
            reconciled_at: None,
            retired_at: None,
            retired_by: None,
            retired_reason: None,
            retrying: None,
            dead_letters: 0,
            replay_requested: 0,
        }
    }

    #[test]
    fn health_of_a_consumer() {
        let t = HealthThresholds::default();
        let healthy = consumer(ConsumerState::Active);
        assert_eq!(consumer_health(&healthy, &t), vec![Health::Ok]);

        let mut sick = healthy.clone();
        sick.lag = Some(10_001);
        sick.heartbeat_age_secs = Some(20.5);
        sick.dead_letters = 2;
        sick.retrying = Some(RetryingEvent {
            event_id: "e".into(),
            sequence: 6,
            attempts: 7,
            next_attempt_at: None,
            first_failed_at: Utc::now(),
            failing_for_secs: 15.0 * 60.0 + 1.0,
            last_failure_class: None,
        });
        assert_eq!(
            consumer_health(&sick, &t),
            vec![
                Health::Lagging,
                Health::StuckRetrying,
                Health::StaleHeartbeat,
                Health::DeadLetters
            ]
        );

        // At the thresholds exactly: still fine.
        let mut edge = healthy.clone();
        edge.lag = Some(10_000);
        edge.heartbeat_age_secs = Some(20.0);
        assert_eq!(consumer_health(&edge, &t), vec![Health::Ok]);

        // A released lease has no heartbeat to be stale; a missing cursor has no lag.
        let mut released = healthy.clone();
        released.lease_owner = None;
        released.lease_live = false;
        released.heartbeat_age_secs = Some(3600.0);
        released.lag = None;
        assert_eq!(consumer_health(&released, &t), vec![Health::Ok]);

        // Nobody runs it while events wait: not running. An expired lease is no longer a
        // stale heartbeat, it is not running.
        let mut stopped = released.clone();
        stopped.head_sequence = 8;
        stopped.lag = Some(3);
        assert_eq!(consumer_health(&stopped, &t), vec![Health::NotRunning]);
        let mut expired = stopped.clone();
        expired.lease_owner = Some("host:1:ab".into());
        assert_eq!(consumer_health(&expired, &t), vec![Health::NotRunning]);
        let mut recent = stopped.clone();
        recent.heartbeat_age_secs = Some(5.0);
        assert_eq!(consumer_health(&recent, &t), vec![Health::Ok]);

        // Never acknowledged anything (or no cursor at all), and holding events back.
        let mut typo = stopped.clone();
        typo.last_acked_at = None;
        assert_eq!(
            consumer_health(&typo, &t),
            vec![Health::NotRunning, Health::NeverAcknowledged]
        );
        typo.cursor = None;
        typo.lag = None;
        assert_eq!(
            consumer_health(&typo, &t),
            vec![Health::NotRunning, Health::NeverAcknowledged]
        );
        // A brand-new consumer gets its heartbeat's grace first.
        typo.created_age_secs = 1.0;
        assert_eq!(consumer_health(&typo, &t), vec![Health::NotRunning]);
        // Nothing waiting: nothing held back.
        let mut idle = typo.clone();
        idle.cursor = Some(8);
        assert_eq!(consumer_health(&idle, &t), vec![Health::Ok]);

        // Requested replays wait for a lease holder: served while it runs (or within the
        // heartbeat's grace after it stopped), unserved once nobody runs it, even with no
        // event waiting.
        let mut replaying = healthy.clone();
        replaying.replay_requested = 2;
        assert_eq!(consumer_health(&replaying, &t), vec![Health::Ok]);
        let mut unserved = released.clone();
        unserved.replay_requested = 2;
        assert_eq!(consumer_health(&unserved, &t), vec![Health::ReplayUnserved]);
        unserved.heartbeat_age_secs = None;
        assert_eq!(consumer_health(&unserved, &t), vec![Health::ReplayUnserved]);
        let mut restarting = unserved.clone();
        restarting.heartbeat_age_secs = Some(5.0);
        assert_eq!(consumer_health(&restarting, &t), vec![Health::Ok]);
        let mut stopped_with_letters = stopped.clone();
        stopped_with_letters.dead_letters = 1;
        stopped_with_letters.replay_requested = 1;
        assert_eq!(
            consumer_health(&stopped_with_letters, &t),
            vec![
                Health::NotRunning,
                Health::DeadLetters,
                Health::ReplayUnserved
            ]
        );
        let mut retired_unserved = unserved.clone();
        retired_unserved.state = ConsumerState::Retired;
        assert_eq!(consumer_health(&retired_unserved, &t), vec![Health::Ok]);

        // Retired consumers hold nothing back.
        let mut retired = sick.clone();
        retired.state = ConsumerState::Retired;
        assert_eq!(consumer_health(&retired, &t), vec![Health::Ok]);
    }

    #[test]
    fn health_of_a_project() {
        let t = HealthThresholds::default();
        let mut project = ProjectStatus {
            project_id: "p".into(),
            head_sequence: 3,
            ..ProjectStatus::default()
        };
        assert_eq!(project_health(&project, &t), vec![Health::Ok]);
        project.unsequenced = 4;
        project.oldest_unsequenced_age_secs = Some(59.0);
        assert_eq!(project_health(&project, &t), vec![Health::Ok]);
        project.oldest_unsequenced_age_secs = Some(61.0);
        assert_eq!(project_health(&project, &t), vec![Health::SequencerStalled]);

        // A backlog is judged by count; an old retained event alone is not `retention_held`
        // (it may just be prunable): only the oldest event a sweep would keep counts.
        let day = 86_400.0;
        project.oldest_unsequenced_age_secs = None;
        project.prunable = 100_000;
        project.oldest_retained_age_secs = Some(90.0 * day);
        assert_eq!(project_health(&project, &t), vec![Health::Ok]);
        project.prunable = 100_001;
        project.prunable_capped = true;
        assert_eq!(project_health(&project, &t), vec![Health::PruningBacklog]);
        project.oldest_held_age_secs = Some(31.0 * day);
        assert_eq!(project_health(&project, &t), vec![Health::PruningBacklog]);
        project.oldest_held_age_secs = Some(31.0 * day + 1.0);
        assert_eq!(
            project_health(&project, &t),
            vec![Health::PruningBacklog, Health::RetentionHeld]
        );
        let tight = HealthThresholds {
            max_retention_overrun: Duration::ZERO,
            retention: Duration::from_secs(86_400),
            ..HealthThresholds::default()
        };
        project.prunable = 0;
        project.oldest_held_age_secs = Some(day + 1.0);
        assert_eq!(
            project_health(&project, &tight),
            vec![Health::RetentionHeld]
        );
        assert_eq!(Health::RetentionHeld.as_str(), "retention_held");
        assert_eq!(
            serde_json::to_value(Health::PruningBacklog).unwrap(),
            "pruning_backlog"
        );
    }
}
