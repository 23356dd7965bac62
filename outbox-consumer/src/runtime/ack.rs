//! Acknowledgement of what this run handled: grouped with other members of a consumer set
//! where possible, else with the run's own fenced statement.

use super::Consumer;
use super::membership::GroupedAck;
use super::progress::Progress;
use crate::error::ConsumerError;
use crate::lease::Lease;
use crate::store::{self, Statements};

impl<D, R> Consumer<D, R> {
    /// Acknowledges events this run handled but could not yet acknowledge (the write failed,
    /// say, because the database restarted). They are not dispatched again by this process.
    pub(super) async fn ack_handled(
        &self,
        lease: &Lease,
        statements: &Statements,
        progress: &mut Progress,
    ) -> Result<(), ConsumerError> {
        let Some(last) = progress.position.handled().map(|h| h.last) else {
            return Ok(());
        };
        let Some(left_at) = progress.position.cursor() else {
            return Ok(());
        };
        let held = progress.position.held_sequence();
        self.write_ack(lease, statements, left_at, last, held)
            .await?;
        if let Some(handled) = progress.position.take_handled() {
            progress.advance(handled);
        }
        Ok(())
    }

    /// The acknowledgement's write: the cursor from `left_at` to `last`, clearing saved retry
    /// state when the `held` event is among them.
    pub(super) async fn write_ack(
        &self,
        lease: &Lease,
        statements: &Statements,
        left_at: i64,
        last: i64,
        held: Option<i64>,
    ) -> Result<(), ConsumerError> {
        // An acknowledgement that also clears saved retry state takes the run's own statement.
        let clears_retry = held.is_some_and(|held| held <= last);
        let grouped = match clears_retry {
            true => GroupedAck::NotGrouped,
            false => self.membership.ack(&lease.fence, left_at, last).await,
        };
        match grouped {
            GroupedAck::Acknowledged => {}
            GroupedAck::Refused => {
                let client = self.pool.get().await?;
                store::rejected(&**client, statements, lease, left_at, last).await?;
            }
            GroupedAck::NotGrouped => {
                let mut client = self.pool.get().await?;
                store::ack(&mut client, statements, lease, held, left_at, last).await?;
            }
        }
        Ok(())
    }
}
