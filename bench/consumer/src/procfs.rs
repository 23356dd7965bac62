//! Reading another process's memory and CPU use, and the machine's load, from `/proc` (Linux
//! only).

/// The 1-minute load average (NaN when unreadable).
pub fn load_one() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|l| l.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// Clock ticks per second of `/proc/<pid>/stat` times. USER_HZ is fixed at 100 in the Linux
/// user-space ABI on the architectures this runs on; reading it with `sysconf` would need
/// `unsafe` (forbidden in this workspace) or another dependency.
const USER_HZ: f64 = 100.0;

/// Peak and current resident set size of a live process, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `VmHWM`: the peak resident set size over the process's life.
    pub peak_kib: u64,
    /// `VmRSS`: the resident set size now.
    pub current_kib: u64,
}

/// Reads `VmHWM` and `VmRSS` of `pid`.
pub fn memory(pid: u32) -> std::io::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> std::io::Result<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no {name} in /proc/{pid}/status")))
    };
    Ok(Memory {
        peak_kib: field("VmHWM:")?,
        current_kib: field("VmRSS:")?,
    })
}

/// User plus system CPU seconds that `pid` has used so far.
pub fn cpu_seconds(pid: u32) -> std::io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_cpu_seconds(&stat)
        .ok_or_else(|| std::io::Error::other(format!("unexpected /proc/{pid}/stat format")))
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` line. The command name (field
/// 2) may contain spaces and parentheses, so fields are counted after its last `)`.
fn parse_cpu_seconds(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let line = "1234 (a b) c) S 1 1234 1234 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 1 0 1 1 1";
        assert_eq!(parse_cpu_seconds(line), Some(3.0));
        assert_eq!(parse_cpu_seconds("garbage"), None);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let m = memory(me).unwrap();
        assert!(m.peak_kib >= m.current_kib && m.current_kib > 0);
        assert!(cpu_seconds(me).unwrap() >= 0.0);
    }
}
