//! The one way a long-running command learns it should stop: SIGINT or SIGTERM cancels a
//! token that the command's loops (and the consumer runtime) select on, in every wait,
//! including reconnecting to a database that is down. A second signal ends the process at
//! once (exit 130), after the registered last-resort hooks (killing a child's process group):
//! nothing further is acknowledged.

use std::sync::{Arc, Mutex};

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::failure::Failure;

/// A shutdown token fed by SIGINT and SIGTERM. The handlers are installed when it is
/// created, so a signal that arrives at any later moment is not lost; dropping it stops
/// listening.
pub struct Shutdown {
    /// Cancelled on the first signal.
    token: CancellationToken,
    /// The task that waits for the signals, aborted when this is dropped.
    _task: AbortOnDropHandle<()>,
    /// Run on a second signal, just before the process exits.
    hooks: Arc<Mutex<Vec<ForceHook>>>,
}

/// Something to do at once when the operator insists (a second signal).
type ForceHook = Box<dyn Fn() + Send>;

/// The exit code of a process ended by a second signal (as shells report SIGINT).
const FORCED_EXIT: i32 = 130;

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
        let hooks: Arc<Mutex<Vec<ForceHook>>> = Arc::default();
        let forced = hooks.clone();
        let task = AbortOnDropHandle::new(tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("shutdown requested (a second signal stops at once)");
            cancel.cancel();
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::warn!("second signal: stopping at once; nothing further is acknowledged");
            if let Ok(hooks) = forced.lock() {
                for hook in hooks.iter() {
                    hook();
                }
            }
            std::process::exit(FORCED_EXIT);
        }));
        Ok(Self {
            token,
            _task: task,
            hooks,
        })
    }

    /// Registers `hook` to run on a second signal, just before the process exits.
    pub fn on_force(&self, hook: impl Fn() + Send + 'static) {
        if let Ok(mut hooks) = self.hooks.lock() {
            hooks.push(Box::new(hook));
        }
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
