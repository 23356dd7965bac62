//! Reactivating a retired consumer at its claim (`reactivate` set), audited with the OS user
//! and host running the process.

use nix::unistd::{Uid, User};
use outbox_core::admin::{AuditLog, AuditRecord};
use outbox_core::internal::Unnamed as _;
use outbox_core::states::AuditKind;

use crate::config::ConsumerConfig;
use crate::error::ConsumerError;
use crate::sql;

/// Makes the retired consumer active again (missing cursor, so it reconciles) and audits who
/// did, in one transaction; nothing when it is no longer retired.
pub(super) async fn reactivate(
    client: &mut deadpool_postgres::Client,
    config: &ConsumerConfig,
) -> Result<(), ConsumerError> {
    let project = config.project_id.as_str();
    let consumer = config.consumer_id.as_str();
    let actor = reactivating_user();
    let tx = client.transaction().await?;
    let changed: i64 = tx
        .query_one_unnamed(
            &config.duties.schema.render(sql::REACTIVATE),
            &[&project, &consumer],
        )
        .await?
        .try_get("reactivated")?;
    if changed == 1 {
        let record = AuditRecord {
            kind: AuditKind::ConsumerReactivated,
            project_id: project,
            consumer_id: Some(consumer),
            event_id: None,
            actor: Some(&actor),
            count: None,
            reason: None,
        };
        AuditLog::new(&config.duties.schema)
            .record(&*tx, &record)
            .await?;
    }
    tx.commit().await?;
    if changed == 1 {
        tracing::info!(
            project,
            consumer,
            "retired consumer reactivated; it will reconcile"
        );
    }
    Ok(())
}

/// Who reactivates a consumer, for the audit row: the OS user and host running the process
/// (`alice@worker-3`), as `outbox consume --reactivate` takes no operator name.
fn reactivating_user() -> String {
    let from_env = ["USER", "LOGNAME"]
        .into_iter()
        .find_map(|name| std::env::var(name).ok().filter(|u| !u.is_empty()));
    let uid = Uid::current();
    let user = from_env.unwrap_or_else(|| user_of(uid, User::from_uid(uid).ok().flatten()));
    let host = outbox_core::internal::host_name().unwrap_or_else(|| "unknown-host".into());
    format!("{user}@{host}")
}

/// The name of `uid`'s account, or `uid-N` when it has none (a container running an ID the
/// password database does not know): a service started without `$USER` is still named.
fn user_of(uid: Uid, account: Option<User>) -> String {
    account
        .map(|account| account.name)
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| format!("uid-{uid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_without_an_account_is_named_by_uid() {
        let uid = Uid::current();
        let account = User::from_uid(uid).unwrap();
        let expected = account.as_ref().map(|a| a.name.clone());
        if let Some(name) = expected {
            assert_eq!(user_of(uid, account), name);
        }
        assert_eq!(user_of(Uid::from_raw(4242), None), "uid-4242");
    }
}
