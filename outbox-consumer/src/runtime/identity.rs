//! The identity check: whether the database still has the history this process's position
//! came from. After a failover to a standby that lacked the tail, or a restore from backup,
//! a sequence number can name another event, or none; a process that kept its position
//! would wait for a number the new history already used and skip what lies between. So at
//! the claim, at start and after every reconnection the position is checked, and a position
//! the database no longer has is audited, counted and healed by a full reconciliation.

use tokio_util::sync::CancellationToken;

use super::Consumer;
use super::progress::Progress;
use crate::error::ConsumerError;
use crate::handler::{ReconcileReason, Reconciler};
use crate::lease::Lease;
use crate::store::{self, DatabasePosition, Statements};

/// How the database's history differs from the one the position came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Divergence {
    /// The event at the position (or the one the database's cursor records there) has
    /// another identity than the one this process acknowledged.
    IdentityDiffers,
    /// The database's cursor is behind the process's position: the acknowledgements that
    /// brought it there are gone.
    CursorBehind,
    /// The database's cursor, or the position, is beyond the project's head.
    BeyondHead,
}

impl Divergence {
    /// Stable text for logs and the audit row.
    pub fn as_str(&self) -> &'static str {
        match self {
            Divergence::IdentityDiffers => "identity_differs",
            Divergence::CursorBehind => "cursor_behind",
            Divergence::BeyondHead => "beyond_head",
        }
    }
}

/// The check itself, a pure function of the process's position (`position`, standing on the
/// event `identity` when known) and what the database has. A database cursor ahead of the
/// position, in a history that agrees at the position, is no divergence: only the lease
/// holder moves the cursor, so it is this process's own acknowledgement whose answer was
/// lost; the caller takes the database's cursor.
pub(crate) fn check(
    position: i64,
    identity: Option<&str>,
    database: &DatabasePosition,
) -> Option<Divergence> {
    let Some(cursor) = database.cursor else {
        return Some(Divergence::CursorBehind);
    };
    if cursor > database.head || position > database.head {
        return Some(Divergence::BeyondHead);
    }
    if cursor < position {
        return Some(Divergence::CursorBehind);
    }
    let identity = identity?;
    let differs = |other: &Option<String>| other.as_deref().is_some_and(|o| o != identity);
    if differs(&database.event_at_position)
        || (cursor == position && differs(&database.cursor_identity))
    {
        return Some(Divergence::IdentityDiffers);
    }
    None
}

impl<D, R: Reconciler> Consumer<D, R> {
    /// The check after every (re)start, at the position `cursor`: a divergence of history
    /// (audited, counted, then a reconciliation); a cursor below the retention floor
    /// (reconcile); otherwise loads the saved retry state of the next event.
    pub(super) async fn check_position(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        cursor: i64,
    ) -> Result<Option<ReconcileReason>, ConsumerError> {
        let client = self.pool.get().await?;
        // After the connection was had: a read on a connection opened later checks again.
        let checked_at = std::time::Instant::now();
        let database = store::position_check(&**client, statements, lease, cursor).await?;
        let identity = progress.position.identity().map(str::to_owned);
        if let Some(divergence) = check(cursor, identity.as_deref(), &database) {
            self.record_divergence(
                &**client,
                statements,
                lease,
                progress,
                (cursor, identity),
                &database,
                divergence,
            )
            .await?;
            return Ok(Some(ReconcileReason::HistoryDiverged));
        }
        let cursor = match database.cursor {
            Some(ahead) if ahead > cursor => {
                tracing::info!(
                    position = cursor,
                    cursor = ahead,
                    "the database's cursor is ahead: an acknowledgement whose answer was lost \
                     took effect; continuing from it"
                );
                progress.forget_after_cursor();
                progress.prefetched = None;
                progress.moved_to(ahead, database.cursor_identity.clone());
                ahead
            }
            _ => cursor,
        };
        if cursor < database.floor {
            return Ok(Some(ReconcileReason::BelowRetentionFloor));
        }
        let held = store::load_held(&**client, statements, lease, cursor).await?;
        progress.position.hold(held);
        progress.bounds_checked = true;
        progress.checked_at = checked_at;
        Ok(None)
    }

    /// The handler's sink holds output up to `position` (the event `identity`) that the
    /// database does not have ([`crate::HandlerFailure::history_diverged`]): the sink was
    /// written from a history lost since (a failover while this consumer was stopped, so its
    /// own position never saw the lost tail). Audited and healed as a divergence of its own
    /// position.
    pub(super) async fn sink_diverged(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        position: i64,
        identity: String,
    ) -> Result<(), ConsumerError> {
        let client = self.pool.get().await?;
        let database = store::position_check(&**client, statements, lease, position).await?;
        let divergence =
            check(position, Some(&identity), &database).unwrap_or(Divergence::IdentityDiffers);
        self.record_divergence(
            &**client,
            statements,
            lease,
            progress,
            (position, Some(identity)),
            &database,
            divergence,
        )
        .await
    }

    /// Stops dispatching from the diverged position (nothing handled, held or read ahead is
    /// kept), writes the `lifecycle-observation:history-diverged` audit row and counts the
    /// divergence; the reconciliation that heals it follows, and is retried until it
    /// succeeds without auditing again.
    #[allow(clippy::too_many_arguments)]
    async fn record_divergence(
        &self,
        client: &(impl tokio_postgres::GenericClient + Sync),
        statements: &Statements,
        lease: &Lease,
        progress: &mut Progress,
        (position, identity): (i64, Option<String>),
        database: &DatabasePosition,
        divergence: Divergence,
    ) -> Result<(), ConsumerError> {
        progress.forget_after_cursor();
        progress.prefetched = None;
        let cursor = crate::cursor::ShownCursor(database.cursor);
        let shown_identity = identity.as_deref().unwrap_or("none");
        tracing::error!(
            divergence = divergence.as_str(),
            position,
            identity = shown_identity,
            database_cursor = %cursor,
            database_identity = database.cursor_identity.as_deref().unwrap_or("none"),
            head = database.head,
            "history diverged: the database no longer has this consumer's position; \
             reconciling"
        );
        let detail = format!(
            "{}: process at {position} ({shown_identity}), database cursor {cursor} ({}), \
             head {}",
            divergence.as_str(),
            database.cursor_identity.as_deref().unwrap_or("none"),
            database.head
        );
        store::audit_divergence(client, statements, lease, position, identity, &detail).await?;
        progress.meters.divergences.increment(1);
        progress.must_reconcile = Some(ReconcileReason::HistoryDiverged);
        Ok(())
    }

    /// The reconciliation a divergence asked for, before anything else is dispatched.
    pub(super) async fn heal(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
        shutdown: &CancellationToken,
    ) -> Result<bool, ConsumerError> {
        let Some(reason) = progress.must_reconcile else {
            return Ok(false);
        };
        self.reconcile(lease, statements, progress, reason, shutdown)
            .await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(cursor: Option<i64>, identity: &str, head: i64, at: &str) -> DatabasePosition {
        let known = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        DatabasePosition {
            cursor,
            cursor_identity: known(identity),
            head,
            floor: 0,
            event_at_position: known(at),
        }
    }

    #[test]
    fn the_same_history_passes() {
        let db = database(Some(100), "e100", 150, "e100");
        assert_eq!(check(100, Some("e100"), &db), None);
        // Nothing known to compare with (a reconciliation to an empty head, or pruned).
        assert_eq!(check(100, None, &database(Some(100), "", 150, "")), None);
        assert_eq!(
            check(100, Some("e100"), &database(Some(100), "", 100, "")),
            None
        );
    }

    #[test]
    fn a_cursor_ahead_in_the_same_history_is_an_acknowledgement_whose_answer_was_lost() {
        let db = database(Some(120), "e120", 150, "e100");
        assert_eq!(check(100, Some("e100"), &db), None);
    }

    #[test]
    fn another_identity_at_the_position_is_a_divergence() {
        let db = database(Some(100), "e100", 150, "other");
        assert_eq!(
            check(100, Some("e100"), &db),
            Some(Divergence::IdentityDiffers)
        );
        let db = database(Some(100), "other", 150, "");
        assert_eq!(
            check(100, Some("e100"), &db),
            Some(Divergence::IdentityDiffers)
        );
        // The cursor ahead, in a history that differs at the position.
        let db = database(Some(120), "e120", 150, "other");
        assert_eq!(
            check(100, Some("e100"), &db),
            Some(Divergence::IdentityDiffers)
        );
    }

    #[test]
    fn a_database_cursor_behind_the_position_is_a_divergence() {
        // The table: the process acknowledged 200 on the old primary; the promoted
        // standby has cursor 100 and, after new writes, head 210.
        let db = database(Some(100), "e100", 210, "b200");
        assert_eq!(
            check(200, Some("a200"), &db),
            Some(Divergence::CursorBehind)
        );
        assert_eq!(
            check(200, Some("a200"), &database(None, "", 210, "")),
            Some(Divergence::CursorBehind)
        );
    }

    #[test]
    fn a_cursor_or_position_beyond_the_head_is_a_divergence() {
        let db = database(Some(200), "a200", 150, "");
        assert_eq!(check(200, Some("a200"), &db), Some(Divergence::BeyondHead));
        let db = database(Some(100), "e100", 150, "");
        assert_eq!(check(200, Some("a200"), &db), Some(Divergence::BeyondHead));
    }
}
