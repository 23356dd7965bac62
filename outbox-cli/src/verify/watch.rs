//! Watching the probe while it runs: why the probe consumer ended early, named by its cause
//! (a transaction-mode pooler that `--pooler` did not declare, a refused privilege), and
//! progress on a terminal.

use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

use outbox_consumer::ConsumerError;
use outbox_core::connect::Pooler;
use tokio_postgres::error::SqlState;

use crate::failure::{Failure, permission_denied};

/// What to pass when a transaction-mode pooler was found behind a `--pooler none` run.
const POOLER_DETECTED: &str =
    "a pooler in transaction mode was detected: pass --pooler transaction";

/// The failure for a connection path where one client connection's transactions ran on
/// `backends` server sessions: a transaction-mode pooler (exit 2: the command as typed cannot
/// work through it).
pub fn pooler_detected(backends: usize) -> Failure {
    Failure::usage(format!(
        "{POOLER_DETECTED} ({backends} server sessions served 4 transactions of one \
         connection)"
    ))
}

/// The failure for a probe consumer that ended with `e`: a refused privilege as
/// "permission denied: role R may not ...", a prepared statement lost or found twice on a
/// server session (SQLSTATE 26000 or 42P05, what a transaction-mode pooler does to named
/// statements) as the pooler detected, anything else in the consumer's own words.
pub fn consumer_failure(e: &ConsumerError, pooler: Pooler) -> Failure {
    if let Some(denied) = permission_denied(e) {
        return denied;
    }
    if pooler == Pooler::None && statement_lost(e) {
        return Failure::usage(format!(
            "{POOLER_DETECTED} (the probe consumer's prepared statements did not survive \
             between transactions: {e})"
        ));
    }
    Failure::runtime(format!("the probe consumer failed: {e}"))
}

/// True when a prepared statement was missing (26000) or already existed (42P05) anywhere in
/// `e`'s chain of causes.
fn statement_lost(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(e);
    while let Some(error) = current {
        let code = error
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(tokio_postgres::Error::code);
        if code.is_some_and(|c| {
            *c == SqlState::DUPLICATE_PSTATEMENT || *c == SqlState::INVALID_SQL_STATEMENT_NAME
        }) {
            return true;
        }
        current = error.source();
    }
    false
}

/// One status line on stderr, rewritten in place, only when stderr is a terminal (a pipe or a
/// log file gets nothing): what the probe waits for.
pub struct Progress {
    /// Whether stderr is a terminal.
    on: bool,
    /// When the line was last written.
    shown: Option<Instant>,
}

/// How often the line is rewritten at most.
const REFRESH: Duration = Duration::from_millis(200);

impl Progress {
    /// Progress on stderr if it is a terminal.
    pub fn new() -> Self {
        Self {
            on: std::io::stderr().is_terminal(),
            shown: None,
        }
    }

    /// Rewrites the line with `text()`, at most every [`REFRESH`].
    pub fn show(&mut self, text: impl FnOnce() -> String) {
        if !self.on || self.shown.is_some_and(|at| at.elapsed() < REFRESH) {
            return;
        }
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{}", text());
        let _ = err.flush();
        self.shown = Some(Instant::now());
    }

    /// Erases the line, so the report or an error starts on a clean one.
    pub fn clear(&mut self) {
        if self.shown.take().is_some() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pooler_message_names_the_flag() {
        let failure = pooler_detected(3);
        assert_eq!(failure.code, crate::failure::ExitCode::Usage);
        assert!(
            failure.message.starts_with(
                "a pooler in transaction mode was detected: pass --pooler transaction"
            ),
            "{}",
            failure.message
        );
    }
}
