//! Who holds a lease: the owner token a process writes into a lease row (`host:pid:suffix`),
//! and the rule that a holder of this host whose process no longer exists is gone, shared by
//! the sequencer lease and every consumer lease.

/// This machine's host name (the kernel's), or `None` when it cannot be read.
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
}

/// A name for this process run in a lease row: host, PID and a per-run suffix (so a
/// restarted process with a recycled PID is a different owner), `host:pid:suffix`.
pub fn owner_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = host_name().unwrap_or_else(|| UNKNOWN_HOST.into());
    // RandomState is seeded randomly per process; mixed with the time it names this run.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!(
        "{host}:{}:{:08x}",
        std::process::id(),
        hasher.finish() as u32
    )
}

/// True when `owner`, a lease holder's [`owner_token`], names a process of this host whose
/// PID does not exist: the holder is gone, and its lease may be taken over at once instead
/// of after its TTL. The one rule of both leases, the sequencer's and each consumer's.
///
/// A process ended without releasing its lease (a second Ctrl-C, `kill -9`, a crash) leaves
/// the lease held until its TTL runs out. When the holder ran on this host, the operating
/// system can say for certain that it is gone, and the next start on this host need not wait.
/// Anything less than certainty keeps the wait: another host's process, a token that names no
/// host, a PID that exists (even if recycled by an unrelated process, or a zombie not yet
/// reaped) or that this process may not signal. Host names are taken to name one PID
/// namespace: containers sharing a host name but not their PIDs would each see the other's
/// holder as gone.
pub fn holder_is_gone(owner: &str) -> bool {
    let Some((host, pid)) = token_host_and_pid(owner) else {
        return false;
    };
    host_name().as_deref() == Some(host) && pid_is_gone(pid)
}

/// True only when signal 0 to `pid` fails with "no such process".
fn pid_is_gone(pid: u32) -> bool {
    use nix::errno::Errno;
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    match i32::try_from(pid) {
        Ok(pid) if pid > 0 => kill(Pid::from_raw(pid), None) == Err(Errno::ESRCH),
        _ => false,
    }
}

/// The host part of an [`owner_token`] whose host name could not be read: it says nothing
/// about where the process ran, so [`token_host_and_pid`] never reports it.
const UNKNOWN_HOST: &str = "host";

/// The host name and PID an [`owner_token`] names, or `None` for any other text (or a token
/// made where the host name could not be read).
pub fn token_host_and_pid(token: &str) -> Option<(&str, u32)> {
    let mut parts = token.rsplitn(3, ':');
    let _suffix = parts.next()?;
    let pid = parts.next()?.parse().ok()?;
    let host = parts.next()?;
    (!host.is_empty() && host != UNKNOWN_HOST).then_some((host, pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tokens_differ_per_call() {
        assert_ne!(owner_token(), owner_token());
        assert!(owner_token().contains(&std::process::id().to_string()));
    }

    /// A PID that existed and is now gone: a child that has exited and been reaped.
    fn ended_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn only_a_missing_process_of_this_host_is_gone() {
        let host = host_name().expect("a readable host name");
        let gone = ended_pid();
        assert!(holder_is_gone(&format!("{host}:{gone}:0badcafe")));
        // This process, and PID 1, exist.
        let me = std::process::id();
        assert!(!holder_is_gone(&format!("{host}:{me}:0badcafe")));
        assert!(!holder_is_gone(&format!("{host}:1:0badcafe")));
        // Another host's process, an unknown host, no PID, or not a token at all: keep waiting.
        assert!(!holder_is_gone(&format!(
            "{host}-elsewhere:{gone}:0badcafe"
        )));
        assert!(!holder_is_gone(&format!("host:{gone}:0badcafe")));
        assert!(!holder_is_gone(&format!("{host}:0:0badcafe")));
        assert!(!holder_is_gone(&format!("{host}:4294967295:0badcafe")));
        assert!(!holder_is_gone("operator"));
    }

    #[test]
    fn owner_tokens_name_their_host_and_pid() {
        let token = owner_token();
        if let Some(host) = host_name() {
            assert_eq!(
                token_host_and_pid(&token),
                Some((host.as_str(), std::process::id()))
            );
        }
        assert_eq!(
            token_host_and_pid("worker-3:4711:0badcafe"),
            Some(("worker-3", 4711))
        );
        for other in [
            "host:4711:0badcafe",
            ":4711:ab",
            "w:x:ab",
            "w:4711",
            "ops",
            "",
        ] {
            assert_eq!(token_host_and_pid(other), None, "{other:?}");
        }
    }
}
