//! Names and command lines of processes, read from /proc while they live.

use sleuth_core::ProcessInfo;

/// Reads what /proc says about `pid` now. Missing fields stay empty: the
/// process may already be gone.
pub fn read(pid: u32, first_seen_ns: u64) -> ProcessInfo {
    let base = format!("/proc/{pid}");
    let comm = comm(pid).unwrap_or_default();
    let cmdline = std::fs::read(format!("{base}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let ppid = stat(pid).and_then(|s| u32::try_from(s.ppid).ok());
    ProcessInfo {
        pid,
        ppid,
        comm,
        cmdline,
        start_ns: Some(first_seen_ns),
        ..Default::default()
    }
}

/// The name /proc gives process `pid`, None when it is gone. Read as
/// bytes: the kernel cuts a name at 15 bytes, maybe inside a UTF-8
/// character, and a strict read lost the whole name (the live view showed
/// "the main thread of  (pid N)", the metrics `?`: round 55's testers);
/// the cut part is U+FFFD, as the trace's lifecycle events store it.
pub fn comm(pid: u32) -> Option<String> {
    std::fs::read(format!("/proc/{pid}/comm"))
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim_end().to_string())
}

/// The processes running now that descend from any of `roots` (children,
/// their children, …), roots left out, in pid order. `trace --pid` follows
/// children forked from then on in the kernel; those already running are
/// found here (round 51's tester: attached to a launcher, `bash -c` or
/// `torchrun`, it recorded nothing).
pub fn descendants(roots: &std::collections::BTreeSet<u32>) -> Vec<u32> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    let mut children: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for p in all.flatten() {
        let Ok(st) = p.stat() else { continue };
        if let (Ok(pid), Ok(ppid)) = (u32::try_from(st.pid), u32::try_from(st.ppid)) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut found = std::collections::BTreeSet::new();
    let mut todo: Vec<u32> = roots.iter().copied().collect();
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            if !roots.contains(&c) && found.insert(c) {
                todo.push(c);
            }
        }
    }
    found.into_iter().collect()
}

/// `/proc/PID/stat`, parsed by procfs; None once the process is gone.
fn stat(pid: u32) -> Option<procfs::process::Stat> {
    let pid = i32::try_from(pid).ok()?;
    procfs::process::Process::new(pid).ok()?.stat().ok()
}

/// Whether a process exists (and is not a zombie, nor dead: killed and
/// not yet reaped, it runs nothing).
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| !matches!(s.state, 'Z' | 'X'))
}

#[cfg(test)]
mod tests {
    /// A name the kernel cut inside a UTF-8 character (15 bytes of
    /// "ééééééééé") is read with the cut part as U+FFFD, as the trace's
    /// lifecycle events store it, not lost whole.
    #[test]
    fn a_name_cut_inside_a_character_is_kept() {
        let dir = std::env::temp_dir().join(format!("gs-procinfo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("ééééééééé");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/bin/sleep", &link).unwrap();
        let mut child = std::process::Command::new(&link).arg("5").spawn().unwrap();
        // The kernel names the process late in its exec, after the spawn
        // may have returned: read again until the name is the program's.
        let mut info = super::read(child.id(), 0);
        for _ in 0..200 {
            if info.comm.starts_with('é') {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            info = super::read(child.id(), 0);
        }
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(info.comm, "ééééééé\u{FFFD}");
    }
}
