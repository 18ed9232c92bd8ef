//! Names and command lines of processes, read from /proc while they live.

use sleuth_core::ProcessInfo;

/// Reads what /proc says about `pid` now. Missing fields stay empty: the
/// process may already be gone.
pub fn read(pid: u32, first_seen_ns: u64) -> ProcessInfo {
    let base = format!("/proc/{pid}");
    let comm = std::fs::read_to_string(format!("{base}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default();
    let cmdline = std::fs::read(format!("{base}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let ppid = std::fs::read_to_string(format!("{base}/stat"))
        .ok()
        .and_then(|s| {
            // The comm field may contain spaces and parentheses: parse after the last ')'.
            let rest = &s[s.rfind(')')? + 2..];
            rest.split(' ').nth(1)?.parse().ok()
        });
    ProcessInfo {
        pid,
        ppid,
        comm,
        cmdline,
        start_ns: Some(first_seen_ns),
        ..Default::default()
    }
}

/// Whether a process exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.rfind(')').and_then(|i| s.get(i + 2..i + 3)) != Some("Z"),
        Err(_) => false,
    }
}
