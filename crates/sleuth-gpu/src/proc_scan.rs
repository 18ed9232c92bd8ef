//! Reads `/proc` to find every process that holds NVIDIA device files,
//! open (fd symlinks) or mapped (`/proc/PID/maps`), whether NVML lists it or not.
//!
//! Plain `std::fs` on purpose: we need a handful of fields from four files and
//! must treat every read as racy (processes exit mid-scan), which is simpler
//! to get right by hand than through a general procfs crate.

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// `PF_KTHREAD` from include/linux/sched.h: the task is a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;

/// What a scan needs to know about where to look.
#[derive(Debug, Clone)]
pub struct ScanConfig {
    /// Root of procfs (`/proc`).
    pub proc_root: PathBuf,
    /// Device path prefix that marks a GPU device file (`/dev/nvidia`).
    /// Tests point it at stand-in files they create in a temp dir.
    pub dev_prefix: String,
}

impl Default for ScanConfig {
    fn default() -> Self {
        ScanConfig {
            proc_root: PathBuf::from("/proc"),
            dev_prefix: "/dev/nvidia".to_string(),
        }
    }
}

/// Scheduler state letter from `/proc/PID/stat`, in words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcState {
    Running,
    Sleeping,
    /// `D`: uninterruptible sleep, usually inside a driver call.
    DiskSleep,
    Zombie,
    Stopped,
    Idle,
    Dead,
    Other,
}

impl ProcState {
    pub fn from_letter(c: char) -> Self {
        match c {
            'R' => ProcState::Running,
            'S' => ProcState::Sleeping,
            'D' => ProcState::DiskSleep,
            'Z' => ProcState::Zombie,
            'T' | 't' => ProcState::Stopped,
            'I' => ProcState::Idle,
            'X' | 'x' => ProcState::Dead,
            _ => ProcState::Other,
        }
    }
}

/// The fields of `/proc/PID/stat` we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFields {
    pub comm: String,
    pub state: ProcState,
    pub ppid: u32,
    pub pgid: u32,
    pub sid: u32,
    pub flags: u64,
    /// Clock ticks after boot: with the pid, identifies a process across pid reuse.
    pub start_ticks: u64,
}

/// Parses `/proc/PID/stat` with `procfs` (the command name may contain
/// spaces and parentheses; procfs counts fields from the last `)`). None for
/// anything that is not a whole stat line.
pub fn parse_stat(text: &str) -> Option<StatFields> {
    use procfs::FromRead as _;
    let line = text.trim();
    // procfs slices around "PID (" and ") ": hand it only lines of that shape.
    let open = line.find(" (")?;
    let close = line.rfind(')')?;
    if open == 0 || !line.get(close..)?.starts_with(") ") {
        return None;
    }
    let s = procfs::process::Stat::from_read(line.as_bytes()).ok()?;
    Some(StatFields {
        comm: s.comm,
        state: ProcState::from_letter(s.state),
        ppid: u32::try_from(s.ppid).ok()?,
        pgid: u32::try_from(s.pgrp).ok()?,
        sid: u32::try_from(s.session).ok()?,
        flags: u64::from(s.flags),
        start_ticks: s.starttime,
    })
}

/// How a process touches the GPU device files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeviceHoldings {
    /// Device files open as file descriptors.
    pub open: BTreeSet<String>,
    /// Device files mapped into memory.
    pub mapped: BTreeSet<String>,
    /// Count of mappings of device files (GPU.md saw 30 for a PyTorch worker).
    pub mapping_count: usize,
    /// Set when fds or maps could not be read (another user's process while not root).
    pub unreadable: bool,
}

impl DeviceHoldings {
    pub fn holds_any(&self) -> bool {
        !self.open.is_empty() || !self.mapped.is_empty()
    }

    /// GPU minor numbers (`/dev/nvidiaN`) among the held files.
    pub fn gpu_minors(&self, prefix: &str) -> BTreeSet<u32> {
        self.open
            .iter()
            .chain(self.mapped.iter())
            .filter_map(|p| minor_of(p, prefix))
            .collect()
    }

    /// GPU minor numbers whose device file is mapped into memory: how a
    /// process reaches a CUDA context's device memory. Monitoring tools open
    /// these files without mapping them.
    pub fn mapped_gpu_minors(&self, prefix: &str) -> BTreeSet<u32> {
        self.mapped
            .iter()
            .filter_map(|p| minor_of(p, prefix))
            .collect()
    }

    /// Whether the unified-memory device (`/dev/nvidia-uvm`) is open or
    /// mapped: every CUDA context opens it; NVML tools and
    /// nvidia-persistenced do not.
    pub fn holds_uvm(&self, prefix: &str) -> bool {
        let uvm = format!("{prefix}-uvm");
        self.open
            .iter()
            .chain(self.mapped.iter())
            .any(|p| *p == uvm)
    }

    /// The held files, open or mapped, for a sentence.
    pub fn files(&self) -> Vec<String> {
        let all: BTreeSet<&String> = self.open.iter().chain(self.mapped.iter()).collect();
        all.into_iter().cloned().collect()
    }
}

/// `N` of a GPU device file `PREFIXN`; None for nvidiactl, nvidia-uvm, caps.
fn minor_of(path: &str, prefix: &str) -> Option<u32> {
    path.strip_prefix(prefix)?.parse::<u32>().ok()
}

/// One process as seen in `/proc`.
#[derive(Debug, Clone, Serialize)]
pub struct ProcInfo {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    pub state: ProcState,
    pub ppid: u32,
    pub pgid: u32,
    pub sid: u32,
    pub uid: u32,
    pub user: String,
    pub start_ticks: u64,
    /// Start time as Unix seconds (boot time + start ticks).
    pub started_unix: Option<u64>,
    pub kernel_thread: bool,
    /// First line of `/proc/PID/cgroup` (the v2 path), for spotting containers.
    pub cgroup: String,
    /// Container id guessed from the cgroup path (docker, containerd, podman, kubepods).
    pub container: Option<String>,
    /// `NSpid` from `/proc/PID/status`: pid in each namespace, outermost visible first.
    pub nspid: Vec<u32>,
    pub devices: DeviceHoldings,
}

/// A consistent-enough picture of every process at one moment.
#[derive(Debug, Clone, Default)]
pub struct ProcSnapshot {
    pub procs: BTreeMap<u32, ProcInfo>,
}

impl ProcSnapshot {
    pub fn get(&self, pid: u32) -> Option<&ProcInfo> {
        self.procs.get(&pid)
    }
    /// Processes that hold at least one device file.
    pub fn holders(&self) -> impl Iterator<Item = &ProcInfo> {
        self.procs.values().filter(|p| p.devices.holds_any())
    }
}

/// Scans every numeric directory under the proc root. Processes that vanish
/// mid-scan are skipped; that is the normal race, not an error.
pub fn scan(cfg: &ScanConfig) -> std::io::Result<ProcSnapshot> {
    let users = UserNames::load();
    let boot = BootClock::load(&cfg.proc_root);
    let mut procs = BTreeMap::new();
    for entry in fs::read_dir(&cfg.proc_root)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(info) = read_process(cfg, pid, &users, &boot) {
            procs.insert(pid, info);
        }
    }
    Ok(ProcSnapshot { procs })
}

/// Reads one process; `None` when it no longer exists.
pub fn read_one(cfg: &ScanConfig, pid: u32) -> Option<ProcInfo> {
    read_process(
        cfg,
        pid,
        &UserNames::load(),
        &BootClock::load(&cfg.proc_root),
    )
}

fn read_process(
    cfg: &ScanConfig,
    pid: u32,
    users: &UserNames,
    boot: &BootClock,
) -> Option<ProcInfo> {
    let dir = cfg.proc_root.join(pid.to_string());
    let stat = parse_stat(&fs::read_to_string(dir.join("stat")).ok()?)?;
    let status = fs::read_to_string(dir.join("status")).unwrap_or_default();
    let uid = status_field(&status, "Uid:")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(u32::MAX);
    let nspid = status_field(&status, "NSpid:")
        .map(|v| {
            v.split_whitespace()
                .filter_map(|s| s.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let cmdline = fs::read(dir.join("cmdline"))
        .map(|b| {
            let s: Vec<String> = b
                .split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            s.join(" ")
        })
        .unwrap_or_default();
    let cgroup = fs::read_to_string(dir.join("cgroup"))
        .ok()
        .and_then(|c| {
            c.lines()
                .next()
                .map(|l| l.splitn(3, ':').nth(2).unwrap_or(l).to_string())
        })
        .unwrap_or_default();
    let kernel_thread = stat.flags & PF_KTHREAD != 0;
    let devices = if kernel_thread {
        DeviceHoldings::default()
    } else {
        read_holdings(&dir, &cfg.dev_prefix)
    };
    Some(ProcInfo {
        pid,
        comm: stat.comm,
        cmdline,
        state: stat.state,
        ppid: stat.ppid,
        pgid: stat.pgid,
        sid: stat.sid,
        uid,
        user: users.name(uid),
        start_ticks: stat.start_ticks,
        started_unix: boot.to_unix(stat.start_ticks),
        kernel_thread,
        container: container_from_cgroup(&cgroup),
        cgroup,
        nspid,
        devices,
    })
}

fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
}

/// Device files among a process's fds and mappings.
fn read_holdings(dir: &Path, prefix: &str) -> DeviceHoldings {
    let mut h = DeviceHoldings::default();
    match fs::read_dir(dir.join("fd")) {
        Ok(fds) => {
            for fd in fds.flatten() {
                if let Ok(target) = fs::read_link(fd.path()) {
                    let t = target.to_string_lossy();
                    if t.starts_with(prefix) {
                        h.open.insert(t.into_owned());
                    }
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => h.unreadable = true,
        Err(_) => {}
    }
    match fs::read_to_string(dir.join("maps")) {
        Ok(maps) => {
            for line in maps.lines() {
                // The path is the sixth column and may contain spaces.
                if let Some(path) = line
                    .splitn(6, char::is_whitespace)
                    .nth(5)
                    .map(str::trim_start)
                {
                    if path.starts_with(prefix) {
                        h.mapping_count += 1;
                        h.mapped.insert(path.to_string());
                    }
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => h.unreadable = true,
        Err(_) => {}
    }
    h
}

/// Container id from a cgroup path such as
/// `/system.slice/docker-<64 hex>.scope` or `/kubepods/.../<64 hex>`.
pub fn container_from_cgroup(cgroup: &str) -> Option<String> {
    let runtime = [
        "docker",
        "containerd",
        "libpod",
        "kubepods",
        "cri-o",
        "crio",
    ]
    .iter()
    .any(|r| cgroup.contains(r));
    if !runtime {
        return None;
    }
    cgroup
        .split(|c: char| !c.is_ascii_hexdigit())
        .find(|s| s.len() == 64)
        .map(|id| id[..12].to_string())
}

/// uid → name from /etc/passwd; numeric when unknown.
struct UserNames(BTreeMap<u32, String>);

impl UserNames {
    fn load() -> Self {
        let mut m = BTreeMap::new();
        if let Ok(p) = fs::read_to_string("/etc/passwd") {
            for line in p.lines() {
                let f: Vec<&str> = line.split(':').collect();
                if let (Some(name), Some(uid)) = (f.first(), f.get(2).and_then(|u| u.parse().ok()))
                {
                    m.insert(uid, name.to_string());
                }
            }
        }
        UserNames(m)
    }
    fn name(&self, uid: u32) -> String {
        self.0.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }
}

/// Converts start ticks to wall-clock seconds.
struct BootClock {
    btime: Option<u64>,
    ticks_per_sec: u64,
}

impl BootClock {
    fn load(proc_root: &Path) -> Self {
        let btime = fs::read_to_string(proc_root.join("stat"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
            });
        // SAFETY: sysconf has no memory-safety preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        BootClock {
            btime,
            ticks_per_sec: if hz > 0 { hz as u64 } else { 100 },
        }
    }
    fn to_unix(&self, ticks: u64) -> Option<u64> {
        Some(self.btime? + ticks / self.ticks_per_sec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_spaces_and_parens_in_comm() {
        // A whole line as Linux 6.x writes it (52 fields).
        let s = "4242 (my (odd) proc) Z 1 4240 4240 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 1 0 987654 \
                 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0 0 0 0 0 0 0 0 0";
        let f = parse_stat(s).expect("parses");
        assert_eq!(f.comm, "my (odd) proc");
        assert_eq!(f.state, ProcState::Zombie);
        assert_eq!((f.ppid, f.pgid, f.sid), (1, 4240, 4240));
        assert_eq!(f.flags, 4194560);
        assert_eq!(f.start_ticks, 987654);
    }

    #[test]
    fn stat_garbage_is_none() {
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x) R 0").is_none());
        for bad in [
            "",
            "(x) R",
            "1 (x)",
            ")",
            "1 (x) R 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0",
        ] {
            assert!(parse_stat(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn container_ids() {
        let id = "a".repeat(64);
        assert_eq!(
            container_from_cgroup(&format!("/system.slice/docker-{id}.scope")),
            Some("aaaaaaaaaaaa".into())
        );
        assert_eq!(container_from_cgroup("/user.slice/user-0.slice"), None);
    }

    #[test]
    fn gpu_minors_from_paths() {
        let mut h = DeviceHoldings::default();
        h.open.insert("/dev/nvidia0".into());
        h.open.insert("/dev/nvidiactl".into());
        h.mapped.insert("/dev/nvidia3".into());
        assert_eq!(
            h.gpu_minors("/dev/nvidia").into_iter().collect::<Vec<_>>(),
            vec![0, 3]
        );
        assert_eq!(
            h.mapped_gpu_minors("/dev/nvidia")
                .into_iter()
                .collect::<Vec<_>>(),
            vec![3]
        );
        assert!(!h.holds_uvm("/dev/nvidia"));
        h.open.insert("/dev/nvidia-uvm".into());
        assert!(h.holds_uvm("/dev/nvidia"));
    }

    #[test]
    fn own_process_is_scanned_with_held_file() {
        let dir = std::env::temp_dir().join(format!("sleuth-gpu-scan-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let dev = dir.join("nvidiactl");
        fs::write(&dev, b"").expect("stand-in device");
        let _held = fs::File::open(&dev).expect("open stand-in");
        let cfg = ScanConfig {
            dev_prefix: dir.join("nvidia").to_string_lossy().into_owned(),
            ..ScanConfig::default()
        };
        let me = read_one(&cfg, std::process::id()).expect("self readable");
        assert!(me
            .devices
            .open
            .contains(&dev.to_string_lossy().into_owned()));
        assert!(!me.kernel_thread);
        let _ = fs::remove_dir_all(&dir);
    }
}
