//! **For tests only**: `OUTBOX_TEST_PUBLISH_GATE`, a file's path. While that file exists the
//! relay holds each publish just before sending it, its expectations already set, and logs
//! once that it is held. That is the moment a stale lease holder is dangerous: it decided what
//! to publish, then stopped (a pause, a long GC, a SIGSTOP) while its lease expired and a new
//! holder took over. The zombie-race tests close the gate, pause the holder there, let a new
//! holder publish, then resume the old one and open the gate at once, so that the two publish
//! together on every round. Nothing else may set it.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable naming the gate file.
pub const TEST_PUBLISH_GATE_VAR: &str = "OUTBOX_TEST_PUBLISH_GATE";

/// The gate file, read once.
fn gate() -> Option<&'static PathBuf> {
    static GATE: OnceLock<Option<PathBuf>> = OnceLock::new();
    GATE.get_or_init(|| {
        let path = std::env::var_os(TEST_PUBLISH_GATE_VAR).map(PathBuf::from)?;
        tracing::warn!(
            path = %path.display(),
            "{TEST_PUBLISH_GATE_VAR} is set (for tests only): publishes are held while the \
             file exists"
        );
        Some(path)
    })
    .as_ref()
}

/// Waits while the gate file exists (at once when no gate is set).
pub async fn pass(sequence: i64) {
    let Some(path) = gate() else {
        return;
    };
    if !path.exists() {
        return;
    }
    tracing::info!(sequence, "publish held at the test gate");
    while path.exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tracing::info!(sequence, "publish released by the test gate");
}
