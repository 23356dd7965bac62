//! Whether a lease holder is gone: a process of this host, named by its owner token, that no
//! longer exists.
//!
//! A process ended without releasing its lease (a second Ctrl-C, `kill -9`, a crash) leaves
//! the lease held until its TTL runs out. When the holder ran on this host, the operating
//! system can say for certain that it is gone, and the next start on this host need not wait.
//! Anything less than certainty keeps the wait: another host's process, a token that names no
//! host, a PID that exists (even if recycled by an unrelated process) or that this process may
//! not signal. Host names are taken to name one PID namespace: containers sharing a host name
//! but not their PIDs would each see the other's holder as gone.

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

/// True when `owner` names a process of this host whose PID does not exist.
pub(crate) fn holder_is_gone(owner: &str) -> bool {
    let Some((host, pid)) = outbox_core::token_host_and_pid(owner) else {
        return false;
    };
    outbox_core::host_name().as_deref() == Some(host) && pid_is_gone(pid)
}

/// True only when signal 0 to `pid` fails with "no such process".
fn pid_is_gone(pid: u32) -> bool {
    match i32::try_from(pid) {
        Ok(pid) if pid > 0 => kill(Pid::from_raw(pid), None) == Err(Errno::ESRCH),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PID that existed and is now gone: a child that has exited and been reaped.
    fn ended_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn only_a_missing_process_of_this_host_is_gone() {
        let host = outbox_core::host_name().expect("a readable host name");
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
}
