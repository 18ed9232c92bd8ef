//! Space set aside beside a trace while it is written, so that a disk that
//! fills up mid-trace still leaves a complete, honest file.
//!
//! Without it, the first write past the disk's end failed, the writer
//! stopped, and the file was left without its rollups or its counters'
//! last values: a flood traced onto a 3-MB file system kept 8% of its
//! calls, said "0 dropped", and was read as "its tracer was killed"
//! (round 60's tester). With it, that failure hands the reserve back to
//! the file system, the writer stops storing calls and waits and counts
//! them as dropped (`drop_db_full`, as past `--max-db`), says so in a
//! note, and completes the file in the space released.
//!
//! The reserve is a hidden file beside the trace (`.NAME.reserve-PID`),
//! allocated for real (`posix_fallocate`: a sparse file frees nothing),
//! removed when the writer ends. A tracer killed meanwhile leaves it
//! behind; `gpusleuth finish` removes it ([`remove_stale`]).

use std::path::{Path, PathBuf};

/// The most set aside: the completion's rollups and, in WAL mode, the
/// pages the last checkpoint copies into the file (SQLite's automatic
/// checkpoint lets up to ~4 MB of them wait).
const RESERVE_MAX: u64 = 8 << 20;
/// Never more than this share of the space free when the trace begins.
const RESERVE_SHARE_OF_FREE: u64 = 4;
/// What the completion writes per stored call, at most: its two late
/// indexes over the calls (`schema::LATE_INDEXES`) take 31 bytes a call
/// (116,682 calls of a launch flood: 3.6 MB, 2026-12-08, VM), written
/// into the WAL first and then into the file.
const COMPLETION_BYTES_PER_CALL: u64 = 80;
/// Free space beyond the completion's needs under which a transaction
/// might fill the disk before the next look: another process would have
/// to write this much in one transaction's time (milliseconds).
const AT_RISK_MARGIN: u64 = 1 << 30;
/// Less than this is not worth a file: the trace goes on without.
const RESERVE_MIN: u64 = 256 << 10;

/// The space set aside for one trace file; removed when dropped.
#[derive(Debug)]
pub(crate) struct DiskReserve {
    path: PathBuf,
    bytes: u64,
}

impl DiskReserve {
    /// Sets space aside beside `trace`: up to [`RESERVE_MAX`], a quarter
    /// of the space free at most; None where that is under [`RESERVE_MIN`]
    /// or the file system refuses (the trace goes on as before).
    pub(crate) fn set_aside(trace: &Path) -> Option<DiskReserve> {
        let dir = trace.parent().filter(|d| !d.as_os_str().is_empty());
        let free = free_bytes(dir.unwrap_or(Path::new(".")))?;
        let bytes = (free / RESERVE_SHARE_OF_FREE).min(RESERVE_MAX);
        if bytes < RESERVE_MIN {
            return None;
        }
        let path = reserve_path(trace, std::process::id())?;
        let reserve = DiskReserve { path, bytes };
        reserve.allocate().then_some(reserve)
    }

    /// Bytes set aside.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Creates the file with its blocks allocated; false (nothing left
    /// behind) where that fails.
    fn allocate(&self) -> bool {
        use std::os::fd::AsRawFd as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&self.path);
        let Ok(file) = file else {
            return false;
        };
        // SAFETY: `file` is an open descriptor for the call's duration;
        // posix_fallocate reads no memory of ours.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, self.bytes as libc::off_t) };
        if rc != 0 {
            drop(file);
            let _ = std::fs::remove_file(&self.path);
            return false;
        }
        true
    }
}

impl Drop for DiskReserve {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The writer's watch over the disk holding its trace: the reserve, and
/// how low the space free on the disk may run before the writer stops
/// storing calls and waits.
#[derive(Debug)]
pub(crate) struct DiskWatch {
    dir: PathBuf,
    reserve: Option<DiskReserve>,
    low_water: u64,
    /// The bytes free when it ran low, once it has.
    ran_low: Option<u64>,
    /// At the last look: the bytes free, and what the completion needed.
    last: Option<(u64, u64)>,
}

impl DiskWatch {
    /// The watch over the disk of `trace`, its reserve set aside: the
    /// disk runs low when less than the reserve is free (the completion
    /// then has both), or without a reserve a quarter of what was free.
    pub(crate) fn start(trace: &Path) -> DiskWatch {
        let dir = match trace.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let reserve = DiskReserve::set_aside(trace);
        let low_water = match &reserve {
            Some(r) => r.bytes(),
            None => free_bytes(&dir).map_or(0, |f| (f / RESERVE_SHARE_OF_FREE).min(RESERVE_MIN)),
        };
        DiskWatch {
            dir,
            reserve,
            low_water,
            ran_low: None,
            last: None,
        }
    }

    /// Looked at after each commit, with `calls_stored` calls in the
    /// file: the bytes free, the first time they are under what the
    /// completion needs (the low-water mark, and the late indexes over
    /// those calls, twice: in the WAL, then in the file) — the reserve is
    /// handed back then; None otherwise.
    pub(crate) fn ran_low_now(&mut self, calls_stored: u64) -> Option<u64> {
        if self.ran_low.is_some() {
            return None;
        }
        let free = free_bytes(&self.dir)?;
        let needed = calls_stored
            .saturating_mul(COMPLETION_BYTES_PER_CALL)
            .saturating_add(self.low_water);
        self.last = Some((free, needed));
        if free >= needed {
            return None;
        }
        self.reserve = None;
        self.ran_low = Some(free);
        Some(free)
    }

    /// Whether the next transaction might find the disk full: less than
    /// [`AT_RISK_MARGIN`] beyond what the completion needs was free at the
    /// last look (or there was none yet). The writer then keeps what a
    /// failed transaction must set back (a copy per transaction, spared
    /// where gigabytes are free).
    pub(crate) fn at_risk(&self) -> bool {
        self.ran_low.is_none()
            && self
                .last
                .is_none_or(|(free, needed)| free < needed.saturating_add(AT_RISK_MARGIN))
    }

    /// The disk filled before [`Self::ran_low_now`] saw it coming (another
    /// process wrote to it): the reserve is handed back; the bytes free
    /// then.
    pub(crate) fn ran_out(&mut self) -> u64 {
        self.reserve = None;
        let free = free_bytes(&self.dir).unwrap_or(0);
        self.ran_low.get_or_insert(free);
        free
    }

    /// The bytes free when the disk ran low, if it did.
    pub(crate) fn ran_low(&self) -> Option<u64> {
        self.ran_low
    }

    /// Whether the reserve is still set aside.
    pub(crate) fn holds_reserve(&self) -> bool {
        self.reserve.is_some()
    }

    /// Hands the reserve back (to a completion that needs it, or at the end).
    pub(crate) fn release(&mut self) {
        self.reserve = None;
    }
}

/// `.NAME.reserve-PID` beside `trace`.
fn reserve_path(trace: &Path, pid: u32) -> Option<PathBuf> {
    let name = trace.file_name()?.to_string_lossy().into_owned();
    Some(trace.with_file_name(format!(".{name}.reserve-{pid}")))
}

/// Bytes free to an unprivileged writer on the file system of `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct we own from a NUL-terminated path.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above: `c` outlives the call, `s` is ours to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    Some((s.f_bavail as u64).saturating_mul(s.f_frsize as u64))
}

/// Removes the reserves that tracers no longer running left beside
/// `trace` (killed before their writer ended); how many.
pub fn remove_stale(trace: &Path) -> usize {
    let (Some(dir), Some(name)) = (trace.parent(), trace.file_name()) else {
        return 0;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = format!(".{}.reserve-", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = file
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks that the pid exists.
        let alive = pid != 0
            && (unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
                || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM));
        if !alive && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_is_allocated_beside_the_trace_and_gone_when_dropped() {
        let dir = std::env::temp_dir().join(format!("gs-reserve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace = dir.join("t.db");
        let r = DiskReserve::set_aside(&trace).expect("a temp dir has room");
        let path = dir.join(format!(".t.db.reserve-{}", std::process::id()));
        use std::os::unix::fs::MetadataExt as _;
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(m.len(), r.bytes());
        // Allocated, not sparse: the blocks are there to be handed back.
        assert!(m.blocks() * 512 >= r.bytes(), "{} blocks", m.blocks());
        assert!((RESERVE_MIN..=RESERVE_MAX).contains(&r.bytes()));
        drop(r);
        assert!(!path.exists());
        // One a dead tracer left is removed; a live one's is not.
        let dead = dir.join(".t.db.reserve-4194303");
        let live = dir.join(format!(".t.db.reserve-{}", std::process::id()));
        std::fs::write(&dead, b"x").unwrap();
        std::fs::write(&live, b"x").unwrap();
        assert_eq!(remove_stale(&trace), 1);
        assert!(!dead.exists() && live.exists());
        std::fs::remove_file(&live).unwrap();
        // At risk before the first look; after it, by the margin.
        let mut w = DiskWatch::start(&trace);
        assert!(w.at_risk());
        assert_eq!(w.ran_low_now(0), None, "a temp dir has room");
        let (free, needed) = w.last.unwrap();
        assert_eq!(w.at_risk(), free < needed + AT_RISK_MARGIN);
        // Past what the completion needs: ran low, the reserve handed back.
        assert!(w
            .ran_low_now(free / COMPLETION_BYTES_PER_CALL + 1)
            .is_some());
        assert!(w.ran_low().is_some() && !w.at_risk());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "no reserve left"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
