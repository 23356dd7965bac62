//! Every SQL statement of the consumer runtime, as templates over `{{schema}}`.
//!
//! Fenced statements take `$1` project, `$2` consumer, `$3` lease owner, `$4` generation and
//! change nothing unless that lease is still the current one of an active consumer.
//!
//! A consumer's lease and state live in its `lifecycle_consumers` row; its position is the
//! newest of its `lifecycle_consumer_positions` rows (migration 0011). A position write locks
//! the consumer row under the fence (a row lock writes no new version), appends the new
//! position and deletes the one it replaces by its exact key, so no read of a position ever
//! walks the versions an old snapshot keeps. The lock is what keeps the position current for
//! the statement: every other writer of a consumer's positions (a claim, a takeover, a
//! reactivation) changes the lease generation or the state, which voids the fence.
//!
//! Renewals are written the same way (migration 0012): a heartbeat appends the lease's new
//! expiry to `lifecycle_lease_renewals` under the fence and deletes the renewal it replaces,
//! so the consumer row changes only when the lease changes hands or the consumer its state,
//! and the row every fenced write locks keeps one version however old the oldest snapshot is.
//! The row's `claimed_until` and `claimed_at` are what the claim gave the lease; the lease's
//! expiry and heartbeat are the newest renewal's when it belongs to the row's generation (see
//! `lease_expiry!`).
//!
//! The statements are kept by the table they serve: the lease (`sql/lease.rs`), the cursor's
//! positions (`sql/positions.rs`), failed deliveries (`sql/deliveries.rs`), the events and
//! heads (`sql/events.rs`) and the transactional handler's lanes (`sql/lanes.rs`); the
//! fragments they share are the macros below, which every one of those files sees (they are
//! defined before the files' `mod` lines).

/// The fence as a row lock on the consumer row: one row while lease `$3`/`$4` is current.
macro_rules! fence {
    () => {
        "SELECT 1 FROM {{schema}}.lifecycle_consumers
     WHERE project_id = $1 AND consumer_id = $2 AND lease_owner = $3 AND lease_generation = $4
       AND state = 'active'
     FOR NO KEY UPDATE"
    };
}

/// The newest row of an append-only table keyed `(project_id, consumer_id, $id)` at or below
/// `(project, consumer)` in key order, from the high end of its key: the current row of that
/// consumer when it has one (the caller keeps the row only if it is that consumer's). Every
/// replaced row lies below the current one in the key, so the backward scan stops at its
/// first entry however many a held snapshot keeps. The bound is a row comparison rather than
/// equalities so that the plan is that scan whatever the statistics: with equalities the
/// planner estimates one row, which leaves the ordered scan no cheaper than a bitmap scan and
/// a sort, which read every entry of the consumer (measured under a held snapshot: 261
/// buffers a consumer against 3). The bound's estimate (a third of the table) makes the scan
/// that stops at once the cheap plan.
macro_rules! newest_at_or_below {
    ($table:literal, $id:literal, $columns:literal, $project:literal, $consumer:literal) => {
        concat!(
            "SELECT ctid AS row_id, project_id, consumer_id, ",
            $id,
            ", ",
            $columns,
            "
     FROM {{schema}}.",
            $table,
            "
     WHERE (project_id, consumer_id, ",
            $id,
            ") <= (",
            $project,
            ", ",
            $consumer,
            ", 9223372036854775807)
     ORDER BY project_id DESC, consumer_id DESC, ",
            $id,
            " DESC
     LIMIT 1"
        )
    };
}

/// The newest positions row at or below `(project, consumer)` (see [`newest_at_or_below!`]).
macro_rules! newest_position_at_or_below {
    ($project:literal, $consumer:literal) => {
        newest_at_or_below!(
            "lifecycle_consumer_positions",
            "position_id",
            "last_acked_sequence, last_acked_event_id, last_acked_at, reconciled_at",
            $project,
            $consumer
        )
    };
}

/// The newest renewals row at or below `(project, consumer)` (see [`newest_at_or_below!`]).
macro_rules! newest_renewal_at_or_below {
    ($project:literal, $consumer:literal) => {
        newest_at_or_below!(
            "lifecycle_lease_renewals",
            "renewal_id",
            "lease_generation, lease_expires_at, heartbeat_at",
            $project,
            $consumer
        )
    };
}

/// `$column` of the newest renewal of consumer row `c`, when that renewal belongs to the row's
/// lease generation (NULL when the lease has not been renewed since it was claimed). A renewal
/// of an earlier generation, committed just before a takeover, is never the new lease's.
macro_rules! current_renewal {
    ($column:literal) => {
        concat!(
            "(SELECT newest.",
            $column,
            " FROM (",
            newest_renewal_at_or_below!("c.project_id", "c.consumer_id"),
            ") AS newest
      WHERE newest.project_id = c.project_id AND newest.consumer_id = c.consumer_id
        AND newest.lease_generation = c.lease_generation)"
        )
    };
}

/// When the lease of consumer row `c` expires: its newest renewal's expiry, or the claim's
/// (`claimed_until`) while it has none. Read against the row version the statement locked, so a claim that
/// waited for another claim judges the lease that one took.
macro_rules! lease_expiry {
    () => {
        concat!(
            "COALESCE(",
            current_renewal!("lease_expires_at"),
            ", c.claimed_until)"
        )
    };
}

/// The consumer's current position row (none while it never had one).
macro_rules! current_position {
    () => {
        concat!(
            "SELECT position_id, last_acked_sequence, last_acked_at, reconciled_at
     FROM (",
            newest_position_at_or_below!("$1", "$2"),
            ") AS newest
     WHERE project_id = $1 AND consumer_id = $2"
        )
    };
}

/// The identity of project `$1`'s event numbered `$seq` (NULL when none is retained).
macro_rules! event_id_at {
    ($seq:literal) => {
        concat!(
            "(SELECT o.event_id FROM {{schema}}.lifecycle_outbox AS o
         WHERE o.project_id = $1 AND o.sequence = ",
            $seq,
            ")"
        )
    };
}

/// Deletes the position `was` names, when the fence holds and `$cond` (over `was`) is true:
/// the replaced half of a position write. The position is given as a value (a scalar
/// subquery, at most one row), so the delete is one probe of the whole key: written as a join
/// with `was`, the plan matches the key on project and consumer only and filters the position,
/// walking every entry the consumer's replaced positions left in the index, which a held
/// snapshot keeps (248 buffers after 20,000 acknowledgements, against 4).
macro_rules! replace_position {
    ($cond:literal) => {
        concat!(
            "DELETE FROM {{schema}}.lifecycle_consumer_positions AS p
     WHERE p.project_id = $1 AND p.consumer_id = $2
       AND p.position_id = (SELECT was.position_id FROM fence, was WHERE ",
            $cond,
            ")"
        )
    };
}

/// The head of every fenced position write: `fence` (the lock), `was` (the current position)
/// and `replaced` (its deletion when `$cond` holds). The statement then appends the new
/// position under the same condition.
macro_rules! replacing_position {
    ($cond:literal) => {
        concat!(
            "
WITH fence AS (",
            fence!(),
            "),
was AS (",
            current_position!(),
            "),
replaced AS (",
            replace_position!($cond),
            ")"
        )
    };
}

/// The insert of a new position, every column the runtime writes.
macro_rules! insert_position {
    () => {
        "INSERT INTO {{schema}}.lifecycle_consumer_positions
        (project_id, consumer_id, last_acked_sequence, last_acked_event_id, last_acked_at,
         reconciled_at)"
    };
}

/// The event's columns, of `lifecycle_outbox AS o`, that every statement whose rows
/// `store::decode` reads starts with, in the order it reads them by position.
macro_rules! event_columns {
    () => {
        "o.sequence, o.event_type, o.event_id, o.task_id, o.deleted_at, o.writer_process_id,
       o.occurred_at, o.payload_version, o.payload, o.type_minor, o.traceparent"
    };
}

mod deliveries;
mod events;
mod lanes;
mod lease;
mod positions;

pub use deliveries::*;
pub use events::*;
pub use lanes::*;
pub use lease::*;
pub use positions::*;

/// The server process of this session: read inside a reconciliation's snapshot, so that an
/// abandoned snapshot's live query can be cancelled (behind a transaction pooler the session
/// is the snapshot transaction's).
pub const BACKEND_PID: &str = "SELECT pg_backend_pid() AS pid";

/// Cancels the statement server process `$1` runs (a role may cancel its own sessions').
pub const CANCEL_BACKEND: &str = "SELECT pg_cancel_backend($1) AS cancelled";

/// The text of this module's files: where `statements_file` and the literal check look for
/// statements.
#[cfg(test)]
pub(crate) const SOURCES: [&str; 6] = [
    include_str!("sql/lease.rs"),
    include_str!("sql/positions.rs"),
    include_str!("sql/deliveries.rs"),
    include_str!("sql/events.rs"),
    include_str!("sql/lanes.rs"),
    include_str!("sql.rs"),
];

/// Every statement of [`SOURCES`] by its constant's name, in the order `sql/statements.sql`
/// holds them rendered (checked by `statements_file`): the order they had when they were all
/// in this file, kept so the rendering did not move when they were split by table.
#[cfg(test)]
pub(crate) fn all() -> Vec<(&'static str, &'static str)> {
    macro_rules! named {
        ($($name:ident),* $(,)?) => { vec![$((stringify!($name), $name)),*] };
    }
    named![
        LOCK_FOR_CLAIM,
        CLAIM,
        TAKE_OVER,
        CONSUMER_ROW,
        REACTIVATE,
        HEARTBEAT,
        RELEASE,
        LOCK_FENCE,
        ACK,
        HAS_UNSEQUENCED,
        MOVE_CURSOR,
        RECORD_RECONCILED,
        PROJECT_BOUNDS,
        EVER_POSITIONED,
        CONTRACTS,
        READ_BATCH,
        HELD_DELIVERY,
        LANE_RETRIES,
        RECORD_RETRY,
        PARK,
        CLEAR_PASSED_RETRIES,
        ACK_CLEARING,
        ACK_AND_RETRY,
        LOCK_FENCE_SHARED,
        INSERT_RECEIPT,
        LANE_RECEIPTS,
        LANE_ACK,
        REPLAY_REQUESTED,
        MARK_REPLAYED,
        MARK_REPLAY_FAILED,
        HEARTBEAT_SET,
        ACK_SET,
        KEY_SCANS_ONLY,
        POLL_SET,
        READ_RANGE,
        GAUGES,
        POSITION_CHECK,
        RESUME_POINT,
        EVENT_AT,
        CURSOR_UNDER_LEASE,
        CLAIMED_POSITION,
        CURSOR,
        BACKEND_PID,
        CANCEL_BACKEND,
    ]
}

#[cfg(test)]
mod statements_file;

#[cfg(test)]
mod tests {
    use outbox_core::states::{AuditKind, ConsumerState, DeliveryState};

    /// The runtime's statements match and write only values of the shared enums.
    #[test]
    fn every_literal_in_the_statements_is_a_known_value() {
        let (states, kinds) = outbox_core::states::stored_literals(&super::SOURCES.concat());
        assert!(states.len() > 10, "the scan found only {states:?}");
        for state in &states {
            assert!(
                state.parse::<DeliveryState>().is_ok() || state.parse::<ConsumerState>().is_ok(),
                "{state:?} is neither a delivery nor a consumer state"
            );
        }
        for kind in &kinds {
            kind.parse::<AuditKind>().unwrap();
        }
    }
}
