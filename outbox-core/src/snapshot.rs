//! A read-only transaction on one snapshot, for reads of several statements whose figures must
//! agree: the operator reports, a sweep's dry run, a consumer's look at retained history.

use tokio_postgres::{Client, IsolationLevel, Transaction};

/// Starts a read-only `REPEATABLE READ` transaction: every statement in it sees the database
/// as of its first statement, and none can change anything.
pub async fn read_only_snapshot(
    client: &mut Client,
) -> Result<Transaction<'_>, tokio_postgres::Error> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
}
