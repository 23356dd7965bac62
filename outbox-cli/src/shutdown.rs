//! The one way a long-running command learns it should stop: SIGINT or SIGTERM cancels a
//! token that the command's loops (and the consumer runtime) select on, in every wait,
//! including reconnecting to a database that is down.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::failure::Failure;

/// A shutdown token fed by SIGINT and SIGTERM. The handlers are installed when it is
/// created, so a signal that arrives at any later moment is not lost; dropping it stops
/// listening.
pub struct Shutdown {
    /// Cancelled on the first signal.
    token: CancellationToken,
    /// The task that waits for the signals.
    task: tokio::task::JoinHandle<()>,
}

impl Shutdown {
    /// Installs the handlers; call before anything that may wait.
    pub fn install() -> Result<Self, Failure> {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return Err(Failure::runtime("cannot install signal handlers"));
        };
        let token = CancellationToken::new();
        let cancel = token.clone();
        let task = tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("shutdown requested");
            cancel.cancel();
        });
        Ok(Self { token, task })
    }

    /// The token to pass on (cancelled on the first signal).
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Resolves on the first signal.
    pub async fn requested(&self) {
        self.token.cancelled().await
    }
}

impl Drop for Shutdown {
    fn drop(&mut self) {
        self.task.abort();
    }
}
