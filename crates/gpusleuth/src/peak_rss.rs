//! This process's own peak resident set, written where `bench` asks for it.
//!
//! `bench` times each command as a child process. The kernel's figure for a
//! child (`ru_maxrss` from `wait4`) is a floor, not the child's: a child
//! spawned from the bench starts with the bench's resident set (its memory
//! map before `exec`), and the bench holds a trace it just wrote. `VmHWM` in
//! `/proc/self/status` belongs to the memory map `exec` created, so it is
//! the command's own peak. With [`PEAK_RSS_ENV`] set, `main` writes it to
//! that file as the command ends.

use std::path::Path;

/// The file a command writes its peak RSS to (in kB, one number) as it ends.
pub const PEAK_RSS_ENV: &str = "GPUSLEUTH_PEAK_RSS_FILE";

/// `VmHWM` of this process, in kB.
pub fn own_peak_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    vm_hwm_kb(&status)
}

fn vm_hwm_kb(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Writes this process's peak RSS where [`PEAK_RSS_ENV`] says, if it is set.
/// Best effort: the figure is for `bench`, never a reason to fail a command.
pub fn report_if_asked() {
    let Some(path) = std::env::var_os(PEAK_RSS_ENV) else {
        return;
    };
    if let Some(kb) = own_peak_kb() {
        let _ = std::fs::write(Path::new(&path), format!("{kb}\n"));
    }
}

/// The peak a command wrote to `path` (see [`report_if_asked`]).
pub fn read_reported(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_hwm_from_a_status_file() {
        let status = "Name:\tgpusleuth\nVmPeak:\t  200 kB\nVmHWM:\t   18312 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(vm_hwm_kb(status), Some(18312));
        assert_eq!(vm_hwm_kb("Name:\tx\n"), None);
        // This very process has one, and it is at least what it holds now.
        let hwm = own_peak_kb().unwrap();
        assert!(hwm > 0);
    }
}
