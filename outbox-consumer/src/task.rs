//! Owned tasks: every spawned task is aborted when its owner drops it, so none outlives the
//! run that started it; and the shutdown grace that bounds how long a phase may run on.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// Runs `work` to its end, or until `grace` has passed since `shutdown`, whichever comes
/// first: `None` when the grace ran out (and `work` was dropped), so no phase holds a
/// shutdown longer than the grace.
pub(crate) async fn within_grace<T>(
    shutdown: &CancellationToken,
    grace: Duration,
    work: impl Future<Output = T>,
) -> Option<T> {
    let grace_over = async {
        shutdown.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        result = work => Some(result),
        () = grace_over => None,
    }
}

/// A spawned task that is aborted when dropped, so no task outlives its owner; awaiting it
/// waits for it to end instead.
pub(crate) type Task = AbortOnDropHandle<()>;

/// Spawns `task`, owned by the returned handle.
pub(crate) fn spawn(task: impl Future<Output = ()> + Send + 'static) -> Task {
    AbortOnDropHandle::new(tokio::spawn(task))
}

/// Waits for every task to end (their stop signal having been given).
pub(crate) async fn join_all(tasks: Vec<Task>) {
    for task in tasks {
        let _ = task.await;
    }
}
