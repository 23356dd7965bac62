//! The observed-dispatch guard.
//!
//! Observers receive events that another process wrote. The writer owns the delete's side
//! effects, so an observer that called the writer would record (or trigger) them a second time.
//! The consumer runtime runs every handler inside [`observe`]; the writer refuses to run there.

use std::future::Future;

tokio::task_local! {
    static OBSERVED_DISPATCH: ();
}

/// Runs `future` as an observed dispatch: the writer refuses to run inside it.
///
/// The mark is task-local: a task spawned from the handler is not covered. Handlers should
/// await their work rather than detach it.
pub async fn observe<F: Future>(future: F) -> F::Output {
    OBSERVED_DISPATCH.scope((), future).await
}

/// True inside [`observe`].
pub fn in_observed_dispatch() -> bool {
    OBSERVED_DISPATCH.try_with(|_| ()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn marks_only_the_scope() {
        assert!(!in_observed_dispatch());
        assert!(observe(async { in_observed_dispatch() }).await);
        assert!(!in_observed_dispatch());
    }
}
