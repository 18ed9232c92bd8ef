//! PID namespaces: NVML always reports pids of the initial (host) namespace.
//! Inside a container the same number can name an unrelated local process,
//! so NVML pids are only matched to `/proc` when we run in the initial namespace.

use serde::Serialize;
use std::path::Path;

/// `PROC_PID_INIT_INO` (include/linux/proc_ns.h): inode of the initial pid namespace.
pub const INITIAL_PIDNS_INODE: u64 = 0xEFFF_FFFC;

/// Where this process sits and whether NVML pids can be matched to `/proc`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PidNamespace {
    /// True when we run in the host's pid namespace.
    pub initial: bool,
    pub inode: Option<u64>,
    /// True when an NVML pid can be looked up in our `/proc`.
    pub translatable: bool,
    pub note: Option<String>,
}

/// Detects our pid namespace from `/proc/self/ns/pid`.
pub fn detect(proc_root: &Path) -> PidNamespace {
    use std::os::unix::fs::MetadataExt;
    let inode = std::fs::metadata(proc_root.join("self/ns/pid"))
        .ok()
        .map(|m| m.ino());
    match inode {
        Some(INITIAL_PIDNS_INODE) => PidNamespace { initial: true, inode, translatable: true, note: None },
        Some(i) => PidNamespace {
            initial: false,
            inode,
            translatable: false,
            note: Some(format!(
                "gpusleuth runs in a child pid namespace (inode {i}): NVML reports host pids, which cannot be translated to local pids here (NSpid only lists pids from this namespace inward); NVML pids are shown as host pids and never signalled. Device-file holders below are local pids."
            )),
        },
        None => PidNamespace {
            initial: false,
            inode: None,
            translatable: false,
            note: Some("cannot read /proc/self/ns/pid: NVML pids are not matched to local processes".into()),
        },
    }
}
