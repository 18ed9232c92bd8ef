//! The GPU memory ledger: per process, live device bytes, peak and when,
//! unfreed and failed allocations, a timeline; host-pinned and managed memory
//! apart from device memory.
//!
//! Each device allocation counts once: a driver call flagged `nested` (made
//! inside a runtime call on the same thread, like `cuMemAlloc_v2` inside
//! `cudaMalloc`) is the same memory as its runtime caller and is skipped;
//! driver calls made directly are counted. Physical allocations of the
//! virtual memory API (`cuMemCreate` / `cuMemRelease`, keyed by handle) are
//! device memory too; mapping and reserving address ranges is not.
//!
//! An allocation takes effect when its call returns (the pointer exists from
//! then on), and so does a free.

use crate::data::TraceData;
use crate::event::CallEvent;
use crate::ops::{OpClass, OpInfo, OPS};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::{BTreeMap, HashMap};

mod peak_sites;
mod state;
mod timeline;
use peak_sites::PeakSites;
pub use peak_sites::{live_by_stack, LiveByStack};
pub use state::ProcessState;
use timeline::Timeline;

/// A timeline longer than this is thinned (see [`thin_timeline`]).
pub const MAX_TIMELINE_POINTS: usize = 2000;

/// Failed allocations a process's ledger lists; later ones are counted
/// (`ProcessLedger::failed_allocs_not_kept`): a ledger's memory stays
/// bounded by what is live, not by how often an allocation failed.
pub const MAX_FAILED_KEPT: usize = 1000;

/// For `skip_serializing_if`: a counter left out at 0.
pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A device pointer or handle, written as `"0x..."` in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ptr(pub u64);

impl Serialize for Ptr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:#x}", self.0))
    }
}

impl<'de> Deserialize<'de> for Ptr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ptr, D::Error> {
        let text = String::deserialize(d)?;
        text.strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .map(Ptr)
            .ok_or_else(|| serde::de::Error::custom(format!("not a pointer: {text:.40}")))
    }
}

/// An op name read back (the ledger rollup of a trace, `sleuth_store`): the
/// name of an op this build knows, else an error.
pub(crate) fn known_op(name: &str) -> Result<&'static str, String> {
    crate::op_by_name(name)
        .map(|o| o.name)
        .ok_or_else(|| format!("unknown op {name:.80}"))
}

/// The records below as read back: an owned op name, checked against the
/// op table on the way in (serde cannot give `&'static str` itself).
mod stored {
    use super::*;

    #[derive(Deserialize)]
    pub(super) struct Unfreed {
        ptr: Option<Ptr>,
        bytes: u64,
        op: String,
        ts_ns: u64,
        stack_id: Option<u64>,
        site: Option<String>,
    }

    impl TryFrom<Unfreed> for super::Unfreed {
        type Error = String;
        fn try_from(u: Unfreed) -> Result<Self, String> {
            Ok(super::Unfreed {
                ptr: u.ptr,
                bytes: u.bytes,
                op: known_op(&u.op)?,
                ts_ns: u.ts_ns,
                stack_id: u.stack_id,
                site: u.site,
            })
        }
    }

    #[derive(Deserialize)]
    pub(super) struct FailedAlloc {
        op: String,
        bytes: u64,
        error: i64,
        ts_ns: u64,
        live_bytes_at: u64,
        stack_id: Option<u64>,
        site: Option<String>,
    }

    impl TryFrom<FailedAlloc> for super::FailedAlloc {
        type Error = String;
        fn try_from(f: FailedAlloc) -> Result<Self, String> {
            Ok(super::FailedAlloc {
                op: known_op(&f.op)?,
                bytes: f.bytes,
                error: f.error,
                ts_ns: f.ts_ns,
                live_bytes_at: f.live_bytes_at,
                stack_id: f.stack_id,
                site: f.site,
            })
        }
    }

    #[derive(Deserialize)]
    pub(super) struct SizeCount {
        bytes: u64,
        times: u64,
        op: String,
    }

    /// `Deserialize` through the stored form (by hand: a derive would ask
    /// the input to live for `'static` because of the `&'static str` field).
    macro_rules! through_stored {
        ($t:ident) => {
            impl<'de> Deserialize<'de> for super::$t {
                fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    $t::deserialize(d)?
                        .try_into()
                        .map_err(serde::de::Error::custom)
                }
            }
        };
    }
    through_stored!(Unfreed);
    through_stored!(FailedAlloc);
    through_stored!(SizeCount);

    impl TryFrom<SizeCount> for super::SizeCount {
        type Error = String;
        fn try_from(c: SizeCount) -> Result<Self, String> {
            Ok(super::SizeCount {
                bytes: c.bytes,
                times: c.times,
                op: known_op(&c.op)?,
            })
        }
    }
}

/// An allocation still live at the end (or at `--at`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unfreed {
    /// None (JSON null) when the returned pointer is unknown (imported traces).
    pub ptr: Option<Ptr>,
    pub bytes: u64,
    pub op: &'static str,
    pub ts_ns: u64,
    /// Call site of the allocation (a stack id), when captured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_id: Option<u64>,
    /// The site as one line (`file:line function`), when captured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

/// An allocation call that returned an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedAlloc {
    pub op: &'static str,
    pub bytes: u64,
    pub error: i64,
    pub ts_ns: u64,
    /// The process's live device bytes when the call was made.
    pub live_bytes_at: u64,
    /// Call site of the failed call (a stack id), when captured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_id: Option<u64>,
    /// The site as one line, when captured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

/// One point of the device-bytes timeline: live bytes after a change at `ts_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelinePoint {
    pub ts_ns: u64,
    pub live_bytes: u64,
}

/// The ledger of one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessLedger {
    pub pid: u32,
    pub comm: String,
    /// Device bytes live at the end of the trace, at process exit, or at `--at`.
    pub live_bytes: u64,
    pub peak_bytes: u64,
    /// When the peak was first reached (None when nothing was allocated).
    pub peak_ts_ns: Option<u64>,
    /// Device allocations (including `cuMemCreate` handles) not freed, oldest first.
    pub unfreed: Vec<Unfreed>,
    /// The first [`MAX_FAILED_KEPT`] failed allocations, in return order.
    pub failed_allocs: Vec<FailedAlloc>,
    /// Failed allocations after those listed: counted, not kept (a program
    /// retrying an allocation that fails would otherwise grow the tracer's
    /// ledger with the trace). Absent from the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_allocs_not_kept: u64,
    /// Page-locked host memory live at the end (not device memory).
    pub host_pinned_bytes: u64,
    /// Managed (unified) memory live at the end (not counted in `live_bytes`).
    pub managed_bytes: u64,
    /// Device live bytes after each change (thinned above MAX_TIMELINE_POINTS).
    pub timeline: Vec<TimelinePoint>,
    /// Of `live_bytes`, physical memory created through `cuMemCreate`.
    pub vmm_bytes: u64,
    /// Counted device allocations (successful, not nested).
    pub allocs: u64,
    /// Matched device frees.
    pub frees: u64,
    /// Device bytes of the counted allocations (made during the trace).
    pub allocated_bytes: u64,
    /// Device bytes given back by matched frees (and by allocations whose
    /// pointer was still live, see `reused_live_ptrs`): `allocated_bytes −
    /// freed_bytes = live_bytes`.
    pub freed_bytes: u64,
    /// Successful frees of a pointer this process never allocated in the
    /// trace (allocated before tracing started, or the allocation was lost).
    pub unmatched_frees: u64,
    /// An allocation returned a pointer that was still live: the free of the
    /// old one was lost. The old one is treated as freed.
    pub reused_live_ptrs: u64,
    /// Successful device allocations whose returned pointer is unknown
    /// (Ingero stores the size, not the pointer). They count in `allocs`,
    /// `live_bytes` and `peak_bytes`, but no free can be matched to them:
    /// when `unmatched_frees` is not 0 as well, live bytes are an upper bound.
    pub unknown_ptr_allocs: u64,
    /// Exit time, when the process exited during the trace.
    pub exit_ns: Option<u64>,
    /// Freeing and re-allocating the same sizes (see [`Churn`]).
    pub churn: Churn,
    /// Device memory per device ordinal. The device of an allocation is its
    /// thread's last `cudaSetDevice` (0 before any); driver-API context
    /// switches (`cuCtxSetCurrent`) are not followed.
    pub devices: Vec<DeviceBytes>,
}

impl ProcessLedger {
    /// Every failed allocation, those listed and those only counted.
    pub fn failed_alloc_count(&self) -> u64 {
        (self.failed_allocs.len() as u64).saturating_add(self.failed_allocs_not_kept)
    }
}

/// Live and peak device bytes on one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceBytes {
    pub device: u32,
    pub live_bytes: u64,
    pub peak_bytes: u64,
}

/// The free-then-allocate-again pattern of a cache being emptied and refilled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Churn {
    /// Device allocations of a size this process had allocated and freed
    /// before (each earlier free is matched by at most one re-allocation).
    pub reallocs: u64,
    /// Wall time spent in counted device allocation and free calls (not
    /// stream-ordered ones: they come from the driver's pool).
    pub alloc_free_ns: u64,
    /// The most re-allocated sizes, most frequent first (at most 5).
    pub top_sizes: Vec<SizeCount>,
}

/// How many times allocations of one size were re-made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SizeCount {
    pub bytes: u64,
    pub times: u64,
    /// The op of the latest re-allocation of this size.
    pub op: &'static str,
}

/// Which pool a live allocation belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Device,
    Physical,
    Managed,
    HostPinned,
}

/// A live allocation, held once by every ledger for each allocation live:
/// 32 bytes, 41 per hash-map slot with its key and control byte (65 with
/// the op's name and an `Option` stack id: 8.5 MB per ledger at 65,536
/// live, docs/benchmarks.md).
#[derive(Debug, Clone, Copy)]
struct Live {
    bytes: u64,
    ts_ns: u64,
    /// The call site's stack id, when `has_stack`.
    stack: u64,
    /// Device ordinal: the allocating thread's last `cudaSetDevice` (0 before any).
    device: u32,
    /// The allocating op's id (`crate::ops::OPS`, a memory op).
    op: u16,
    pool: Pool,
    has_stack: bool,
}

impl Live {
    fn new(
        bytes: u64,
        op: &crate::ops::OpInfo,
        ts_ns: u64,
        pool: Pool,
        device: u32,
        stack_id: Option<u64>,
    ) -> Live {
        Live {
            bytes,
            ts_ns,
            stack: stack_id.unwrap_or(0),
            device,
            op: op.id,
            pool,
            has_stack: stack_id.is_some(),
        }
    }

    /// The allocating op's name.
    fn op(&self) -> &'static str {
        // Only made from an op this build knows (`new`).
        crate::ops::op_by_id(self.op).map_or("?", |i| i.name)
    }

    fn stack_id(&self) -> Option<u64> {
        self.has_stack.then_some(self.stack)
    }
}

/// Running state of one process while replaying its calls.
#[derive(Debug, Clone, Default)]
struct Replay {
    /// Bounded memory for a live ledger: no timeline, no list of failures
    /// (both grow with the trace); every count and byte total is kept.
    no_history: bool,
    /// Device, managed and host allocations by pointer.
    by_ptr: HashMap<u64, Live>,
    /// `cuMemCreate` allocations by handle (a separate namespace).
    by_handle: HashMap<u64, Live>,
    /// Allocations whose pointer is unknown: live until the end.
    no_ptr: Vec<Live>,
    device: u64,
    vmm: u64,
    managed: u64,
    host: u64,
    peak: u64,
    peak_ts: Option<u64>,
    /// Bounded while replaying (`timeline`), thinned when finished.
    timeline: Timeline,
    failed: Vec<FailedAlloc>,
    /// Failed allocations past [`MAX_FAILED_KEPT`] (counted only).
    failed_not_kept: u64,
    allocs: u64,
    frees: u64,
    allocated_bytes: u64,
    freed_bytes: u64,
    unmatched_frees: u64,
    reused_live_ptrs: u64,
    unknown_ptr_allocs: u64,
    /// Freed device allocation sizes not yet re-allocated, with their count.
    freed_sizes: HashMap<u64, u64>,
    realloc_sizes: HashMap<u64, (u64, &'static str)>,
    churn: Churn,
    /// Each thread's current device (`cudaSetDevice`); threads start on 0.
    thread_device: HashMap<u32, u32>,
    /// Live and peak device bytes per device ordinal.
    per_device: BTreeMap<u32, DeviceBytes>,
    /// What was live per site at the peak, when asked for
    /// ([`LedgerBuilder::with_peak_sites`]).
    sites: Option<Box<PeakSites>>,
}

impl Replay {
    /// A device allocation became live (`added`) or stopped being live, by
    /// a call that returned at `ts`: what the per-site state at the peak follows.
    fn site_changed(&mut self, l: &Live, added: bool, ts: u64) {
        if !matches!(l.pool, Pool::Device | Pool::Physical) {
            return;
        }
        let after_peak = self.peak_ts.is_some_and(|p| ts > p);
        if let Some(s) = &mut self.sites {
            s.change(l.stack_id(), l.bytes, added, after_peak);
        }
    }

    fn add(&mut self, pool: Pool, bytes: u64, dev: u32) {
        if matches!(pool, Pool::Device | Pool::Physical) {
            let d = self.per_device.entry(dev).or_insert(DeviceBytes {
                device: dev,
                live_bytes: 0,
                peak_bytes: 0,
            });
            d.live_bytes = d.live_bytes.saturating_add(bytes);
            d.peak_bytes = d.peak_bytes.max(d.live_bytes);
        }
        self.update_pool(pool, |v| v.saturating_add(bytes));
    }

    fn sub(&mut self, pool: Pool, bytes: u64, dev: u32) {
        if matches!(pool, Pool::Device | Pool::Physical) {
            if let Some(d) = self.per_device.get_mut(&dev) {
                d.live_bytes = d.live_bytes.saturating_sub(bytes);
            }
        }
        self.update_pool(pool, |v| v.saturating_sub(bytes));
    }

    /// Applies `f` to the counters `pool` feeds: physical (VMM) memory is
    /// device memory too, so it moves both `device` and `vmm`.
    fn update_pool(&mut self, pool: Pool, f: impl Fn(u64) -> u64) {
        match pool {
            Pool::Device => self.device = f(self.device),
            Pool::Physical => {
                self.device = f(self.device);
                self.vmm = f(self.vmm);
            }
            Pool::Managed => self.managed = f(self.managed),
            Pool::HostPinned => self.host = f(self.host),
        }
    }

    fn device_changed(&mut self, ts: u64) {
        if self.device > self.peak {
            self.peak = self.device;
            self.peak_ts = Some(ts);
            if let Some(s) = &mut self.sites {
                s.new_peak();
            }
        }
        if !self.no_history {
            self.timeline.push(TimelinePoint {
                ts_ns: ts,
                live_bytes: self.device,
            });
        }
    }

    fn apply(&mut self, c: &CallEvent) {
        let Some(info) = c.info() else { return };
        if c.nested {
            // The runtime call around it is the one that counts.
            return;
        }
        if info.name == "cudaSetDevice" {
            if let (false, Some(dev)) = (c.failed(), c.ptr) {
                self.thread_device.insert(c.tid, dev as u32);
            }
            return;
        }
        let dev = self.thread_device.get(&c.tid).copied().unwrap_or(0);
        let alloc_pool = match info.class {
            OpClass::DeviceAlloc => Some(Pool::Device),
            OpClass::PhysCreate => Some(Pool::Physical),
            OpClass::ManagedAlloc => Some(Pool::Managed),
            OpClass::HostAlloc => Some(Pool::HostPinned),
            _ => None,
        };
        let ts = c.end_ns();
        if let Some(pool) = alloc_pool {
            if c.failed() && self.no_history {
                return;
            }
            if c.failed() && self.failed.len() >= MAX_FAILED_KEPT {
                self.failed_not_kept += 1;
                return;
            }
            if c.failed() {
                self.failed.push(FailedAlloc {
                    op: info.name,
                    bytes: c.size.unwrap_or(0),
                    error: c.ret,
                    ts_ns: c.ts_ns,
                    live_bytes_at: self.device,
                    stack_id: c.stack_id,
                    site: None,
                });
                return;
            }
            let Some(bytes) = c.size else {
                return;
            };
            // A successful allocation that returned NULL (`cudaMalloc(0)`)
            // holds nothing, and freeing NULL is a no-op: not an allocation
            // (round 51's tester: 30 balanced `malloc 0; free` pairs left a
            // 0-byte "unfreed" allocation at 0x0 and 29 reused pointers).
            if c.ptr == Some(0) && pool != Pool::Physical {
                return;
            }
            let live = Live::new(bytes, info, c.ts_ns, pool, dev, c.stack_id);
            let old = match c.ptr {
                Some(ptr) if pool == Pool::Physical => self.by_handle.insert(ptr, live),
                Some(ptr) => self.by_ptr.insert(ptr, live),
                // The memory was allocated even if its address is unknown.
                None => {
                    self.unknown_ptr_allocs += 1;
                    self.no_ptr.push(live);
                    None
                }
            };
            self.site_changed(&live, true, ts);
            if let Some(old) = old {
                self.site_changed(&old, false, ts);
                self.reused_live_ptrs += 1;
                self.sub(old.pool, old.bytes, old.device);
                if matches!(old.pool, Pool::Device | Pool::Physical) {
                    self.freed_bytes = self.freed_bytes.saturating_add(old.bytes);
                }
            }
            self.add(pool, bytes, dev);
            if matches!(pool, Pool::Device | Pool::Physical) {
                self.allocs += 1;
                self.allocated_bytes = self.allocated_bytes.saturating_add(bytes);
            }
            // A stream-ordered allocation (`cudaMallocAsync`) comes from the
            // pool the driver keeps: freeing and asking again is what that
            // pool is for, the cure `allocation_churn` recommends (round
            // 51's false-positive hunt: 30 `cudaMallocAsync`/`cudaFreeAsync`
            // pairs were churn).
            if matches!(pool, Pool::Device | Pool::Physical) && !stream_ordered(info) {
                self.churn.alloc_free_ns = self.churn.alloc_free_ns.saturating_add(c.dur_ns);
                if let Some(n) = self.freed_sizes.get_mut(&bytes).filter(|n| **n > 0) {
                    *n -= 1;
                    self.churn.reallocs += 1;
                    let e = self.realloc_sizes.entry(bytes).or_insert((0, info.name));
                    *e = (e.0 + 1, info.name);
                }
            }
            let is_device = |p: Pool| matches!(p, Pool::Device | Pool::Physical);
            if is_device(pool) || old.is_some_and(|o| is_device(o.pool)) {
                self.device_changed(ts);
            }
            return;
        }
        let from_handles = match info.class {
            OpClass::DeviceFree | OpClass::HostFree => false,
            OpClass::PhysRelease => true,
            _ => return,
        };
        // Failed frees change nothing; freeing NULL is a legal no-op
        // (`cudaFree(0)` is the classic way to create a context).
        let Some(ptr) = c.ptr.filter(|&p| p != 0 && !c.failed()) else {
            return;
        };
        let map = if from_handles {
            &mut self.by_handle
        } else {
            &mut self.by_ptr
        };
        match map.remove(&ptr) {
            Some(old) => {
                self.site_changed(&old, false, ts);
                self.sub(old.pool, old.bytes, old.device);
                if matches!(old.pool, Pool::Device | Pool::Physical) {
                    self.frees += 1;
                    self.freed_bytes = self.freed_bytes.saturating_add(old.bytes);
                    if !stream_ordered(info) {
                        self.churn.alloc_free_ns =
                            self.churn.alloc_free_ns.saturating_add(c.dur_ns);
                        *self.freed_sizes.entry(old.bytes).or_default() += 1;
                    }
                    self.device_changed(ts);
                }
            }
            None => self.unmatched_frees += 1,
        }
    }

    fn finish(self, pid: u32, comm: String, exit_ns: Option<u64>) -> ProcessLedger {
        self.ledger(pid, comm, exit_ns)
    }

    /// The ledger so far, the replay left as it is: only what the answer
    /// lists is copied (the live maps are read, not cloned), so a tracer
    /// that stores a run's ledger and carries on holds its live
    /// allocations once more as the answer's list, not twice.
    fn ledger(&self, pid: u32, comm: String, exit_ns: Option<u64>) -> ProcessLedger {
        let mut top: Vec<SizeCount> = self
            .realloc_sizes
            .iter()
            .map(|(&bytes, &(times, op))| SizeCount { bytes, times, op })
            .collect();
        top.sort_by(|a, b| b.times.cmp(&a.times).then(b.bytes.cmp(&a.bytes)));
        top.truncate(5);
        let churn = Churn {
            top_sizes: top,
            ..self.churn.clone()
        };
        let mut unfreed: Vec<Unfreed> = self
            .by_ptr
            .iter()
            .chain(self.by_handle.iter())
            .map(|(&ptr, l)| (Some(Ptr(ptr)), l))
            .chain(self.no_ptr.iter().map(|l| (None, l)))
            .filter(|(_, l)| matches!(l.pool, Pool::Device | Pool::Physical))
            .map(|(ptr, l)| Unfreed {
                ptr,
                bytes: l.bytes,
                op: l.op(),
                ts_ns: l.ts_ns,
                stack_id: l.stack_id(),
                site: None,
            })
            .collect();
        // In place (a stable sort's buffer held as many entries again, at
        // the tracer's peak when it stores a run's ledger), over every field:
        // entries equal in all of them are alike, so the order is one.
        unfreed.sort_unstable_by_key(|u| (u.ts_ns, u.ptr, u.bytes, u.op, u.stack_id));
        ProcessLedger {
            pid,
            comm,
            live_bytes: self.device,
            peak_bytes: self.peak,
            peak_ts_ns: self.peak_ts,
            unfreed,
            failed_allocs: self.failed.clone(),
            failed_allocs_not_kept: self.failed_not_kept,
            host_pinned_bytes: self.host,
            managed_bytes: self.managed,
            timeline: self.timeline.finished(MAX_TIMELINE_POINTS),
            vmm_bytes: self.vmm,
            allocs: self.allocs,
            frees: self.frees,
            allocated_bytes: self.allocated_bytes,
            freed_bytes: self.freed_bytes,
            unmatched_frees: self.unmatched_frees,
            reused_live_ptrs: self.reused_live_ptrs,
            unknown_ptr_allocs: self.unknown_ptr_allocs,
            exit_ns,
            churn,
            devices: self.per_device.values().cloned().collect(),
        }
    }
}

/// Which of `processes` a listing shows in full and which it sums up, for
/// a trace of many processes (a node agent's run sees thousands come and
/// go; 6,000 short-lived ones made 66,000 lines of `memory`, round 47).
/// Up to `max_full` processes: all in full, in their order. Past it, in
/// full: those still running (no exit known: what they hold is held now)
/// and those with a failed allocation, most live bytes first, then most
/// failures, at most `max_full`, listed by pid; the rest (exited: the
/// driver freed what they held) to be summed up, highest peak first.
pub fn notable_first(
    processes: &[ProcessLedger],
    max_full: usize,
) -> (Vec<&ProcessLedger>, Vec<&ProcessLedger>) {
    if processes.len() <= max_full {
        return (processes.iter().collect(), Vec::new());
    }
    let matters = |p: &ProcessLedger| p.exit_ns.is_none() || p.failed_alloc_count() > 0;
    let (mut full, mut brief): (Vec<_>, Vec<_>) = processes.iter().partition(|p| matters(p));
    full.sort_by_key(|p| {
        (
            std::cmp::Reverse(p.live_bytes),
            std::cmp::Reverse(p.failed_alloc_count()),
            p.pid,
        )
    });
    brief.extend(full.drain(max_full.min(full.len())..));
    full.sort_by_key(|p| p.pid);
    brief.sort_by_key(|p| (std::cmp::Reverse(p.peak_bytes), p.pid));
    (full, brief)
}

/// Process `pid`'s live device bytes in `ledgers` (0 when it has none):
/// the reserved bytes its allocator views are rebuilt with.
pub fn live_bytes_of(ledgers: &[ProcessLedger], pid: u32) -> u64 {
    ledgers
        .iter()
        .find(|l| l.pid == pid)
        .map_or(0, |l| l.live_bytes)
}

/// The ledger of a process the trace saw no CUDA call of (e.g. one NVML
/// lists as holding memory that it allocated before the trace).
pub fn empty_ledger(pid: u32, comm: String, exit_ns: Option<u64>) -> ProcessLedger {
    Replay::default().finish(pid, comm, exit_ns)
}

/// The incremental ledger: feed calls in the order they returned (their
/// effects happen at return), ask for live and peak bytes at any time. The
/// one set of rules for device memory, used by [`ledger`] on a stored trace,
/// by `trace`'s live view and by its metrics, so the three agree.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// Boxed: a replay is ~600 bytes, and a map node holds eleven values
    /// inline, so a ledger of one process (each carried allocator replay's
    /// reserved-bytes counter) held a 6.7 KB node; ~1,000 of them were
    /// 10 MiB of a node agent's completion (round 54, heaptrack).
    procs: BTreeMap<u32, Box<Replay>>,
    /// See `Replay::no_history`.
    no_history: bool,
    /// Each process keeps what it held per site at its peak (`Replay::sites`).
    peak_sites: bool,
}

impl Ledger {
    /// A ledger that keeps each process's timeline and failed allocations.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// A ledger for a running trace: memory bounded by what is live (no
    /// timeline, no list of failed calls).
    pub fn live() -> Ledger {
        Ledger {
            no_history: true,
            ..Default::default()
        }
    }

    fn replay(&mut self, pid: u32) -> &mut Replay {
        let (no_history, peak_sites) = (self.no_history, self.peak_sites);
        self.procs.entry(pid).or_insert_with(|| {
            Box::new(Replay {
                no_history,
                sites: peak_sites.then(Default::default),
                ..Default::default()
            })
        })
    }

    /// Applies one call (one that returned after every call applied before).
    pub fn apply(&mut self, c: &CallEvent) {
        self.replay(c.pid).apply(c);
    }

    /// Lists a process even if it made no memory call (it has a ledger row).
    pub fn track(&mut self, pid: u32) {
        self.replay(pid);
    }

    /// Drops a process's state (its memory died with it).
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Device bytes live now (`cuMemCreate` handles included).
    pub fn live_bytes(&self, pid: u32) -> u64 {
        self.procs.get(&pid).map_or(0, |r| r.device)
    }

    /// The highest `live_bytes` so far.
    pub fn peak_bytes(&self, pid: u32) -> u64 {
        self.procs.get(&pid).map_or(0, |r| r.peak)
    }

    /// Device allocations live now (pointers, handles and unknown pointers).
    pub fn live_allocations(&self, pid: u32) -> usize {
        self.procs.get(&pid).map_or(0, |r| {
            r.by_ptr
                .values()
                .chain(r.by_handle.values())
                .chain(r.no_ptr.iter())
                .filter(|l| matches!(l.pool, Pool::Device | Pool::Physical))
                .count()
        })
    }

    /// Processes in the ledger, by pid.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.procs.keys().copied()
    }

    /// The full ledger of one process now.
    pub fn snapshot(&self, pid: u32, comm: String, exit_ns: Option<u64>) -> ProcessLedger {
        match self.procs.get(&pid) {
            Some(r) => r.ledger(pid, comm, exit_ns),
            None => Replay::default().finish(pid, comm, exit_ns),
        }
    }
}

/// Whether a call of this op can change a ledger or the allocator's segment
/// map: allocations and frees of every pool, the virtual memory API and
/// `cudaSetDevice` (it decides the device of later allocations). Every
/// other call only lists its process, so a reader that streams a long
/// trace reads these calls alone (a small share of all calls).
pub fn is_memory_op(info: &OpInfo) -> bool {
    info.name == "cudaSetDevice"
        || matches!(
            info.class,
            OpClass::DeviceAlloc
                | OpClass::DeviceFree
                | OpClass::ManagedAlloc
                | OpClass::HostAlloc
                | OpClass::HostFree
                | OpClass::PhysCreate
                | OpClass::PhysRelease
                | OpClass::VirtualMap
        )
}

/// The names of the ops [`is_memory_op`] selects.
pub fn memory_op_names() -> Vec<&'static str> {
    OPS.iter()
        .filter(|o| is_memory_op(o))
        .map(|o| o.name)
        .collect()
}

/// Builds the ledgers of a trace from its calls fed one at a time in the
/// order they returned (ties in the order they started): the one replay
/// [`ledger`] runs over a loaded trace and `memory` runs over calls
/// streamed from the store, so both give the same answer while the
/// streamed one holds only what is live.
#[derive(Debug, Clone, Default)]
pub struct LedgerBuilder {
    ledger: Ledger,
    at_ns: Option<u64>,
    /// The latest return time of the calls applied (see [`Self::last_applied_end_ns`]).
    last_end_ns: Option<u64>,
}

impl LedgerBuilder {
    /// With `at_ns`, only calls that returned at or before it take effect.
    pub fn new(at_ns: Option<u64>) -> LedgerBuilder {
        LedgerBuilder {
            ledger: Ledger::new(),
            at_ns,
            last_end_ns: None,
        }
    }

    /// Takes process `pid` out of the replay and finishes its ledger as
    /// [`Self::finish_bare`] would, with what it held per site at its peak
    /// (when kept, and it had a peak): for a process that exited, once its
    /// calls are all in (no call of it may follow). A file's completion
    /// stores it at once and holds no replay of an exited process (issue
    /// 16, round 46). A process without a replay gets the empty ledger
    /// [`Self::track`] gives it.
    pub fn retire(&mut self, pid: u32) -> (ProcessLedger, Option<LiveByStack>) {
        self.ledger.track(pid);
        let mut r = self.ledger.procs.remove(&pid).unwrap_or_default();
        let at_peak = match (r.sites.take(), r.peak_ts) {
            (Some(s), Some(_)) => Some(s.at_peak()),
            _ => None,
        };
        (r.finish(pid, String::new(), None), at_peak)
    }

    /// Drops process `pid`'s replay without finishing it: a run's carried
    /// ledger retires a process that exited once its final ledger and
    /// state are stored (`sleuth_store`'s run ledger, round 47).
    pub fn forget(&mut self, pid: u32) {
        self.ledger.forget(pid);
    }

    /// Whether the builder holds a replay of process `pid`.
    pub fn holds(&self, pid: u32) -> bool {
        self.ledger.procs.contains_key(&pid)
    }

    /// A builder without history (no timeline, no failed allocations
    /// listed; every count, byte total and live allocation kept), bounded
    /// by what is live: states small enough to store often.
    pub fn without_history() -> LedgerBuilder {
        LedgerBuilder {
            ledger: Ledger::live(),
            ..LedgerBuilder::new(None)
        }
    }

    /// With `at_ns`, only calls that returned at or before it take effect
    /// from now on (see [`Self::new`]).
    pub fn until(mut self, at_ns: Option<u64>) -> LedgerBuilder {
        self.at_ns = at_ns;
        self
    }

    /// Lists a process that made a call (memory or not) or a counted call.
    pub fn track(&mut self, pid: u32) {
        self.ledger.track(pid);
    }

    /// The processes listed so far ([`Self::track`] or a call of theirs).
    pub fn tracked(&self) -> impl Iterator<Item = u32> + '_ {
        self.ledger.pids()
    }

    /// Also keeps, per process, what was live per site at its peak
    /// ([`Self::finish_with_peak_sites`]): what [`PeakSnapshots`] gives from
    /// a second replay, from this one.
    pub fn with_peak_sites(mut self) -> LedgerBuilder {
        self.ledger.peak_sites = true;
        self
    }

    /// Every process of `data`'s counted calls listed, then each of its
    /// calls pushed in return order (effects happen at return; stable for
    /// ties): a loaded trace, or the loaded part of one, after what was
    /// fed before.
    pub fn feed(&mut self, data: &TraceData) {
        let mut order: Vec<&CallEvent> = data.calls.iter().collect();
        order.sort_by_key(|c| c.end_ns());
        for oc in &data.counts {
            self.track(oc.pid);
        }
        for c in order {
            self.push(c);
        }
    }

    /// The next call in return order; its process is listed either way.
    pub fn push(&mut self, c: &CallEvent) {
        self.ledger.track(c.pid);
        if self.at_ns.is_some_and(|at| c.end_ns() > at) {
            return;
        }
        self.last_end_ns = self.last_end_ns.max(Some(c.end_ns()));
        self.ledger.apply(c);
    }

    /// Process `pid`'s device bytes live now, by the ledger's rules.
    pub fn live_bytes(&self, pid: u32) -> u64 {
        self.ledger.live_bytes(pid)
    }

    /// The latest return time of the calls applied so far (None before
    /// any): a state stored now holds nothing later, so a reader may take
    /// it up at any moment from then on.
    pub fn last_applied_end_ns(&self) -> Option<u64> {
        self.last_end_ns
    }

    /// The ledger of every listed process, by pid. Names, exit times and
    /// site labels come from `context` (its processes and stacks; its calls
    /// are not read).
    pub fn finish(self, context: &TraceData) -> Vec<ProcessLedger> {
        let at_ns = self.at_ns;
        self.finish_bare()
            .into_iter()
            .map(|l| in_context(l, context, at_ns))
            .collect()
    }

    /// [`Self::finish`], and the device bytes each process with a peak had
    /// live per site at it (by pid; empty unless built [`Self::with_peak_sites`]):
    /// the `unfreed` of `ledger(data, Some(peak))` of that process, summed by stack.
    pub fn finish_with_peak_sites(
        mut self,
        context: &TraceData,
    ) -> (Vec<ProcessLedger>, BTreeMap<u32, LiveByStack>) {
        let at_peak = self.take_peak_sites();
        (self.finish(context), at_peak)
    }

    /// [`Self::finish_bare`], and the device bytes each process with a
    /// peak had live per site at it, as [`Self::finish_with_peak_sites`]
    /// gives them (the site rollup a file stores when it is completed).
    pub fn finish_bare_with_peak_sites(
        mut self,
    ) -> (Vec<ProcessLedger>, BTreeMap<u32, LiveByStack>) {
        let at_peak = self.take_peak_sites();
        (self.finish_bare(), at_peak)
    }

    /// Each process's live bytes per site at its peak (by pid; only
    /// processes with a peak, and only when built [`Self::with_peak_sites`]).
    fn take_peak_sites(&mut self) -> BTreeMap<u32, LiveByStack> {
        let mut at_peak = BTreeMap::new();
        for (&pid, r) in &mut self.ledger.procs {
            if let (Some(s), Some(_)) = (r.sites.take(), r.peak_ts) {
                at_peak.insert(pid, s.at_peak());
            }
        }
        at_peak
    }

    /// What the builder holds that grows with the calls fed, summed over
    /// its processes: live allocations (pointers, handles, unknown
    /// pointers), failed allocations kept for the answer, distinct freed
    /// and re-allocated sizes (churn) and threads with a device. The
    /// timeline is bounded apart (`timeline::HELD_GROUPS`). A tracer that
    /// carries a run's ledger from file to file bounds it with this
    /// (`sleuth_store`'s run ledger).
    pub fn held_entries(&self) -> usize {
        self.ledger
            .procs
            .values()
            .map(|r| {
                r.by_ptr.len()
                    + r.by_handle.len()
                    + r.no_ptr.len()
                    + r.failed.len()
                    + r.freed_sizes.len()
                    + r.realloc_sizes.len()
                    + r.thread_device.len()
            })
            .sum()
    }

    /// Processes the builder holds a replay of: each has tables, a timeline
    /// and a peak of its own however few entries it holds (a run's carried
    /// ledger counts them toward its bound too).
    pub fn process_count(&self) -> usize {
        self.ledger.procs.len()
    }

    /// The ledgers without what [`in_context`] adds (no name, exit time or
    /// site label): what a trace stores when it ends (its ledger rollup),
    /// so a reader adds the context it reads and gets [`Self::finish`]'s answer.
    pub fn finish_bare(self) -> Vec<ProcessLedger> {
        self.ledger
            .procs
            .into_iter()
            .map(|(pid, r)| r.finish(pid, String::new(), None))
            .collect()
    }

    /// [`Self::finish_bare`]'s ledgers, the builder kept to be fed on (a
    /// run's ledger stored at each file's end): nothing cloned but what
    /// the ledgers list.
    pub fn bare_ledgers(&self) -> Vec<ProcessLedger> {
        self.ledger
            .procs
            .iter()
            .map(|(&pid, r)| r.ledger(pid, String::new(), None))
            .collect()
    }
}

/// What each process held at its peak, from its memory calls fed one at a
/// time in return order (as [`LedgerBuilder`] takes them): one replay, each
/// process's ledger taken just before its first call that returned after
/// its peak (`ledger(data, Some(peak))` of that process). The site rollup
/// written when a trace ends and the streamed per-site table of a reader
/// both need it, without holding the calls.
#[derive(Debug, Clone, Default)]
pub struct PeakSnapshots {
    peaks: HashMap<u32, u64>,
    replay: Ledger,
    at_peak: BTreeMap<u32, ProcessLedger>,
}

impl PeakSnapshots {
    /// For the processes of `ledgers` that have a peak.
    pub fn new(ledgers: &[ProcessLedger]) -> PeakSnapshots {
        PeakSnapshots {
            peaks: ledgers
                .iter()
                .filter_map(|l| l.peak_ts_ns.map(|t| (l.pid, t)))
                .collect(),
            ..Default::default()
        }
    }

    /// The latest peak: no call that returned after it is in a snapshot.
    pub fn last_peak(&self) -> Option<u64> {
        self.peaks.values().copied().max()
    }

    /// The next memory call in return order.
    pub fn push(&mut self, c: &CallEvent) {
        if let Some(&peak) = self.peaks.get(&c.pid) {
            if c.end_ns() > peak && !self.at_peak.contains_key(&c.pid) {
                let l = self.replay.snapshot(c.pid, String::new(), None);
                self.at_peak.insert(c.pid, l);
            }
        }
        self.replay.apply(c);
    }

    /// Each process's ledger at its peak, by pid (bare: no name, exit time
    /// or site label); a process whose peak no pushed call passed is taken
    /// as the replay left it.
    pub fn finish(mut self) -> BTreeMap<u32, ProcessLedger> {
        for &pid in self.peaks.keys() {
            if !self.at_peak.contains_key(&pid) {
                let l = self.replay.snapshot(pid, String::new(), None);
                self.at_peak.insert(pid, l);
            }
        }
        self.at_peak
    }
}

/// A ledger from [`LedgerBuilder::finish_bare`] with its process's name
/// and exit time (at or before `at_ns`) from `context`, and its sites named
/// from `context`'s stacks.
pub fn in_context(mut l: ProcessLedger, context: &TraceData, at_ns: Option<u64>) -> ProcessLedger {
    let info = context.process(l.pid);
    l.comm = info.map(|p| p.comm.clone()).unwrap_or_else(|| "?".into());
    l.exit_ns = info
        .and_then(|p| p.exit_ns)
        .filter(|&e| at_ns.is_none_or(|at| e <= at));
    name_sites(context, &mut l);
    l
}

/// Whether `info` allocates or frees in stream order, from the driver's
/// pool (`cudaMallocAsync`, `cudaFreeAsync`, `cuMemAllocAsync`,
/// `cuMemFreeAsync`): the allocation and free ops that take a stream.
fn stream_ordered(info: &crate::ops::OpInfo) -> bool {
    info.stream_arg.is_some()
}

/// The ledger of every process that made a recorded or counted call, by pid.
/// With `at_ns`, only calls that returned at or before that moment count
/// (and a call failing before it).
pub fn ledger(data: &TraceData, at_ns: Option<u64>) -> Vec<ProcessLedger> {
    let mut b = LedgerBuilder::new(at_ns);
    b.feed(data);
    b.finish(data)
}

/// Fills the `site` of unfreed and failed allocations from the trace's stacks.
fn name_sites(data: &TraceData, l: &mut ProcessLedger) {
    if data.stacks.is_empty() {
        return;
    }
    let label = |id: Option<u64>| id.map(|_| crate::sites::label_of(data, id));
    for u in &mut l.unfreed {
        u.site = label(u.stack_id);
    }
    for f in &mut l.failed_allocs {
        f.site = label(f.stack_id);
    }
}

/// Thins a timeline to at most `max` points, keeping the first and last
/// points and, in each bucket of consecutive points, the highest one (so the
/// peak stays visible). The exact peak is reported apart.
pub fn thin_timeline(points: Vec<TimelinePoint>, max: usize) -> Vec<TimelinePoint> {
    if points.len() <= max || max < 3 {
        return points;
    }
    let inner = &points[1..points.len() - 1];
    let buckets = max - 2;
    let per = inner.len().div_ceil(buckets);
    let mut out = Vec::with_capacity(max);
    out.push(points[0]);
    for chunk in inner.chunks(per) {
        out.extend(chunk.iter().copied().reduce(timeline::higher));
    }
    out.push(points[points.len() - 1]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ProcessInfo;
    use crate::ops::op_by_name;

    fn mem(op: &str, ts: u64, size: Option<u64>, ptr: Option<u64>) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: 10,
            pid: 1,
            tid: 1,
            op: op_by_name(op).unwrap().id,
            size,
            ptr,
            ..Default::default()
        }
    }
    fn alloc(op: &str, ts: u64, size: u64, ptr: u64) -> CallEvent {
        mem(op, ts, Some(size), Some(ptr))
    }
    fn free(op: &str, ts: u64, ptr: u64) -> CallEvent {
        mem(op, ts, None, Some(ptr))
    }
    fn nested(mut c: CallEvent) -> CallEvent {
        c.nested = true;
        c
    }
    /// A process retired once its calls are in gives the ledger and the peak
    /// sites the builder that kept every replay to the end gives it, a
    /// process never seen included (round 46).
    #[test]
    fn retired_processes_are_finished_as_the_end_finishes_them() {
        let on = |pid: u32, mut c: CallEvent| {
            (c.pid, c.tid) = (pid, pid);
            c.stack_id = Some(u64::from(pid) % 3);
            c
        };
        // Pids out of order in time; 7 leaks, 5 frees all, 9 fails once.
        let calls = [
            on(7, alloc("cudaMalloc", 10, 4096, 0xa000)),
            on(5, alloc("cudaMalloc", 20, 8192, 0xb000)),
            on(7, alloc("cudaMalloc", 30, 1 << 20, 0xc000)),
            on(5, free("cudaFree", 40, 0xb000)),
            on(9, alloc("cudaMalloc", 50, 1 << 40, 0)),
            on(7, free("cudaFree", 60, 0xa000)),
            on(9, alloc("cudaMalloc", 70, 512, 0xd000)),
        ];
        let whole = || LedgerBuilder::new(None).with_peak_sites();
        let mut kept = whole();
        let mut retiring = whole();
        let (mut retired, mut peaks) = (Vec::new(), BTreeMap::new());
        let mut retire = |b: &mut LedgerBuilder, pid| {
            let (l, at_peak) = b.retire(pid);
            retired.push(l);
            peaks.extend(at_peak.map(|p| (pid, p)));
        };
        for (i, c) in calls.iter().enumerate() {
            kept.push(c);
            retiring.push(c);
            // A process's last call: retired once it is in (7 and 9 stay).
            if c.pid == 5 && !calls[i + 1..].iter().any(|l| l.pid == c.pid) {
                retire(&mut retiring, c.pid);
            }
        }
        kept.track(3);
        retire(&mut retiring, 3);
        let (mut rest, rest_peaks) = retiring.finish_bare_with_peak_sites();
        rest.extend(retired);
        rest.sort_by_key(|l| l.pid);
        peaks.extend(rest_peaks);
        let json = |(l, p): (Vec<ProcessLedger>, BTreeMap<u32, LiveByStack>)| {
            serde_json::to_string(&(l, p.into_iter().collect::<Vec<_>>())).unwrap()
        };
        let (want, got) = (
            json(kept.finish_bare_with_peak_sites()),
            json((rest, peaks)),
        );
        assert_eq!(got, want);
        assert!(want.contains("1048576"), "{want}");
    }

    /// `cudaMalloc(0)` succeeds with NULL and `cudaFree(NULL)` does nothing:
    /// balanced pairs leave no allocation, no reused pointer, no churn
    /// (round 51's tester found a 0-byte "unfreed" allocation at 0x0).
    #[test]
    fn an_allocation_that_returned_null_holds_nothing() {
        let mut b = LedgerBuilder::new(None);
        for i in 0..30 {
            b.push(&alloc("cudaMalloc", 100 * i, 0, 0));
            b.push(&free("cudaFree", 100 * i + 50, 0));
        }
        b.push(&alloc("cudaMalloc", 5_000, 256, 0xa000));
        let l = b.finish_bare().remove(0);
        assert_eq!(
            (l.allocs, l.frees, l.reused_live_ptrs, l.unfreed.len()),
            (1, 0, 0, 1),
            "{l:?}"
        );
        assert_eq!(l.unfreed[0].ptr.map(|p| p.0), Some(0xa000));
        assert_eq!(l.churn.alloc_free_ns, 10);
    }

    /// Every ledger holds one `Live` per live allocation: it stays small.
    #[test]
    fn a_live_allocation_takes_32_bytes() {
        assert_eq!(std::mem::size_of::<Live>(), 32);
    }

    /// The packed entry gives back its op and its stack id, a stack id of
    /// 0 told apart from none, in the answer and through a stored state.
    #[test]
    fn a_live_allocation_keeps_its_op_and_its_stack() {
        let mut with_zero = alloc("cuMemAlloc_v2", 20, 512, 0xb000);
        with_zero.stack_id = Some(0);
        let mut with_stack = alloc("cudaMallocManaged", 30, 256, 0xc000);
        with_stack.stack_id = Some(u64::MAX);
        let calls = vec![alloc("cudaMalloc", 10, 4096, 0xa000), with_zero, with_stack];
        let mut b = LedgerBuilder::new(None);
        for c in &calls {
            b.push(c);
        }
        let stored = serde_json::to_string(&b.each_state().collect::<Vec<_>>()).unwrap();
        let states = serde_json::from_str(&stored).unwrap();
        let again = LedgerBuilder::from_states(states, None, false).unwrap();
        for l in [b.bare_ledgers(), again.bare_ledgers()] {
            let got: Vec<_> = l[0]
                .unfreed
                .iter()
                .map(|u| (u.op, u.bytes, u.stack_id))
                .collect();
            // Managed memory is not device memory: not listed as unfreed.
            assert_eq!(
                got,
                [("cudaMalloc", 4096, None), ("cuMemAlloc_v2", 512, Some(0))]
            );
        }
    }

    fn trace(calls: Vec<CallEvent>) -> TraceData {
        TraceData {
            calls,
            processes: vec![ProcessInfo {
                pid: 1,
                comm: "train".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }
    fn one(calls: Vec<CallEvent>) -> ProcessLedger {
        let mut l = ledger(&trace(calls), None);
        assert_eq!(l.len(), 1);
        l.remove(0)
    }

    /// The incremental ledger (live view, metrics) and the replay of a stored
    /// trace (`memory`) agree after every call, `cuMemCreate` included.
    #[test]
    fn incremental_ledger_matches_the_replay_after_every_call() {
        let mut failed = alloc("cudaMalloc", 700, 1 << 40, 0);
        failed.ret = 2;
        failed.ptr = None;
        let calls = vec![
            alloc("cudaMalloc", 100, 4096, 0xa000),
            nested(alloc("cuMemAlloc_v2", 101, 4096, 0xa000)),
            alloc("cuMemCreate", 200, 1 << 21, 0x77),
            alloc("cuMemAlloc_v2", 300, 512, 0xb000),
            free("cudaFree", 400, 0xa000),
            failed,
            free("cuMemRelease", 800, 0x77),
            alloc("cuMemCreate", 900, 1 << 20, 0x78),
            free("cudaFree", 1000, 0xdead),
        ];
        let mut live = Ledger::live();
        let mut full = Ledger::new();
        for (i, c) in calls.iter().enumerate() {
            live.apply(c);
            full.apply(c);
            let replay = one(calls[..=i].to_vec());
            assert_eq!(live.live_bytes(1), replay.live_bytes, "after call {i}");
            assert_eq!(live.peak_bytes(1), replay.peak_bytes, "after call {i}");
            assert_eq!(
                live.live_allocations(1),
                replay.unfreed.len(),
                "after call {i}"
            );
            assert_eq!(
                full.snapshot(1, "train".into(), None),
                replay,
                "after call {i}"
            );
        }
        assert_eq!(live.live_bytes(1), 512 + (1 << 20));
        assert_eq!(live.peak_bytes(1), 4096 + (1 << 21) + 512);
        // The live ledger keeps no history; the full one does.
        let snap = live.snapshot(1, "train".into(), None);
        assert!(snap.timeline.is_empty() && snap.failed_allocs.is_empty());
        assert_eq!(full.snapshot(1, String::new(), None).failed_allocs.len(), 1);
        live.forget(1);
        assert_eq!(live.live_bytes(1), 0);
    }

    #[test]
    fn runtime_allocation_with_nested_driver_call_counts_once() {
        let l = one(vec![
            alloc("cudaMalloc", 100, 4096, 0xa000),
            nested(alloc("cuMemAlloc_v2", 101, 4096, 0xa000)),
            alloc("cudaMalloc", 200, 1000, 0xb000),
            nested(alloc("cuMemAlloc_v2", 201, 1000, 0xb000)),
            free("cudaFree", 300, 0xa000),
            nested(free("cuMemFree_v2", 301, 0xa000)),
        ]);
        assert_eq!(
            (l.live_bytes, l.peak_bytes, l.allocs, l.frees),
            (1000, 5096, 2, 1)
        );
        assert_eq!(l.peak_ts_ns, Some(210));
        assert_eq!(l.unfreed.len(), 1);
        assert_eq!(
            (l.unfreed[0].ptr, l.unfreed[0].bytes, l.unfreed[0].op),
            (Some(Ptr(0xb000)), 1000, "cudaMalloc")
        );
        assert_eq!(l.unmatched_frees, 0);
        assert_eq!(l.comm, "train");
    }

    #[test]
    fn direct_driver_allocations_are_counted() {
        let l = one(vec![
            alloc("cuMemAlloc_v2", 1, 64, 0x10),
            alloc("cuMemAllocAsync", 2, 36, 0x20),
        ]);
        assert_eq!((l.live_bytes, l.allocs), (100, 2));
    }

    #[test]
    fn each_allocation_counted_once_property() {
        // Random interleavings of runtime allocs (with nested driver twins),
        // direct driver allocs and frees: live equals the bytes of the
        // allocations whose free was not issued, computed independently.
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d);
        for _ in 0..200 {
            let mut calls = Vec::new();
            let mut expected_live: HashMap<u64, u64> = HashMap::new();
            let mut expected_peak = 0u64;
            let mut ts = 0;
            for i in 0..60u64 {
                ts += 100;
                let r = next();
                let ptr = 0x1000 * (i + 1);
                let size = 1 + r % 10_000;
                if r.is_multiple_of(5) && !expected_live.is_empty() {
                    let victim = *expected_live.keys().min().unwrap();
                    expected_live.remove(&victim);
                    calls.push(free("cudaFree", ts, victim));
                    calls.push(nested(free("cuMemFree_v2", ts + 1, victim)));
                } else if r.is_multiple_of(3) {
                    calls.push(alloc("cuMemAlloc_v2", ts, size, ptr));
                    expected_live.insert(ptr, size);
                } else {
                    calls.push(alloc("cudaMalloc", ts, size, ptr));
                    calls.push(nested(alloc("cuMemAlloc_v2", ts + 1, size, ptr)));
                    expected_live.insert(ptr, size);
                }
                expected_peak = expected_peak.max(expected_live.values().sum());
            }
            let l = one(calls);
            assert_eq!(l.live_bytes, expected_live.values().sum::<u64>());
            assert_eq!(l.peak_bytes, expected_peak);
            assert_eq!(l.unfreed.len(), expected_live.len());
            assert_eq!(l.unfreed.iter().map(|u| u.bytes).sum::<u64>(), l.live_bytes);
        }
    }

    #[test]
    fn only_memory_calls_change_a_ledger() {
        // What a streamed reader relies on: replaying the memory calls alone
        // (listing every process) gives the ledger of all calls, at any moment.
        let mut next = crate::testing::xorshift(0x9e37_79b9_7f4a_7c15);
        let ops: Vec<&'static OpInfo> = OPS.iter().collect();
        for _ in 0..100 {
            let mut calls = Vec::new();
            for i in 0..80u64 {
                let r = next();
                let op = ops[(r % ops.len() as u64) as usize];
                calls.push(CallEvent {
                    ts_ns: 100 * i + r % 50,
                    dur_ns: r % 300,
                    pid: 1 + (r >> 20) as u32 % 3,
                    tid: 10 + (r >> 24) as u32 % 2,
                    op: op.id,
                    ret: i64::from(r.is_multiple_of(7)),
                    size: Some(1 + (r >> 8) % 4096),
                    ptr: Some(0x1000 * (1 + (r >> 12) % 8)),
                    nested: r.is_multiple_of(11),
                    ..Default::default()
                });
            }
            let all = trace(calls.clone());
            for at in [None, Some(2_000), Some(5_000)] {
                let want = ledger(&all, at);
                let mut order: Vec<&CallEvent> = calls.iter().collect();
                order.sort_by_key(|c| c.end_ns());
                let mut b = LedgerBuilder::new(at);
                for c in &calls {
                    b.track(c.pid);
                }
                for c in order
                    .into_iter()
                    .filter(|c| c.info().is_some_and(is_memory_op))
                {
                    b.push(c);
                }
                assert_eq!(b.finish(&all), want);
            }
        }
        assert!(memory_op_names().contains(&"cudaSetDevice"));
        assert!(!memory_op_names().contains(&"cudaLaunchKernel"));
    }

    #[test]
    fn unknown_and_null_frees_do_not_crash_or_count() {
        let mut failed_free = free("cudaFree", 5, 0xa);
        failed_free.ret = 1;
        let l = one(vec![
            free("cudaFree", 1, 0xdead),
            free("cudaFree", 2, 0),
            alloc("cudaMalloc", 3, 8, 0xa),
            failed_free,
        ]);
        assert_eq!((l.unmatched_frees, l.live_bytes, l.frees), (1, 8, 0));
    }

    #[test]
    fn failed_allocations_carry_live_bytes_at_that_moment() {
        let mut fail = alloc("cudaMalloc", 50, 1 << 40, 0);
        fail.ret = 2;
        fail.ptr = None;
        let mut inner = nested(alloc("cuMemAlloc_v2", 51, 1 << 40, 0));
        inner.ret = 2;
        let l = one(vec![alloc("cudaMalloc", 1, 300, 0xa), fail, inner]);
        assert_eq!(
            l.failed_allocs,
            vec![FailedAlloc {
                op: "cudaMalloc",
                bytes: 1 << 40,
                error: 2,
                ts_ns: 50,
                live_bytes_at: 300,
                stack_id: None,
                site: None,
            }]
        );
    }

    /// A process retrying an allocation that fails: the first
    /// `MAX_FAILED_KEPT` failures are listed, the rest counted; the JSON of
    /// a ledger with fewer failures has no count member (as before).
    #[test]
    fn failures_past_the_kept_list_are_counted_not_listed() {
        let fail = |ts: u64| {
            let mut f = alloc("cudaMalloc", ts, 1 << 40, 0);
            f.ret = 2;
            f.ptr = None;
            f
        };
        let n = MAX_FAILED_KEPT as u64 + 500;
        let mut calls = vec![alloc("cudaMalloc", 1, 300, 0xa)];
        calls.extend((0..n).map(|i| fail(10 + i)));
        calls.push(free("cudaFree", 10 + n, 0xa));
        let l = one(calls);
        assert_eq!(l.failed_allocs.len(), MAX_FAILED_KEPT);
        assert_eq!((l.failed_allocs_not_kept, l.failed_alloc_count()), (500, n));
        // The first ones, in order.
        assert_eq!(l.failed_allocs[0].ts_ns, 10);
        assert_eq!(
            l.failed_allocs.last().unwrap().ts_ns,
            10 + MAX_FAILED_KEPT as u64 - 1
        );
        assert_eq!((l.frees, l.live_bytes), (1, 0));
        let v = serde_json::to_value(&l).unwrap();
        assert_eq!(v["failed_allocs_not_kept"], 500);
        let few = one(vec![fail(1)]);
        let v = serde_json::to_value(&few).unwrap();
        assert!(v.get("failed_allocs_not_kept").is_none(), "{v}");
        assert_eq!(few.failed_alloc_count(), 1);
        // A stored ledger of an older build (no member) reads as none counted.
        let back: ProcessLedger = serde_json::from_value(v).unwrap();
        assert_eq!(back.failed_allocs_not_kept, 0);
    }

    #[test]
    fn host_pinned_and_managed_are_apart_from_device() {
        let l = one(vec![
            alloc("cudaMallocHost", 1, 100, 0x1),
            nested(alloc("cuMemAllocHost_v2", 2, 100, 0x1)),
            alloc("cudaMallocManaged", 3, 200, 0x2),
            alloc("cudaHostAlloc", 4, 50, 0x3),
            free("cudaFreeHost", 5, 0x3),
            alloc("cudaMalloc", 6, 7, 0x4),
        ]);
        assert_eq!(
            (l.live_bytes, l.host_pinned_bytes, l.managed_bytes),
            (7, 100, 200)
        );
        assert_eq!(l.unfreed.len(), 1);
        // Managed memory is freed with cudaFree.
        let l2 = one(vec![
            alloc("cudaMallocManaged", 3, 200, 0x2),
            free("cudaFree", 4, 0x2),
        ]);
        assert_eq!((l2.managed_bytes, l2.unmatched_frees, l2.frees), (0, 0, 0));
    }

    #[test]
    fn virtual_memory_api_counts_physical_memory_only() {
        let l = one(vec![
            alloc("cuMemAddressReserve", 1, 1 << 30, 0x7000_0000),
            alloc("cuMemCreate", 2, 2 << 20, 0x55),
            mem("cuMemMap", 3, Some(2 << 20), Some(0x7000_0000)),
            alloc("cuMemCreate", 4, 2 << 20, 0x56),
            mem("cuMemUnmap", 5, Some(2 << 20), Some(0x7000_0000)),
            free("cuMemRelease", 6, 0x55),
        ]);
        assert_eq!(
            (l.live_bytes, l.vmm_bytes, l.peak_bytes),
            (2 << 20, 2 << 20, 4 << 20)
        );
        assert_eq!(l.unfreed[0].op, "cuMemCreate");
        assert_eq!(l.unfreed[0].ptr, Some(Ptr(0x56)));
    }

    #[test]
    fn allocations_with_an_unknown_pointer_still_count() {
        // Ingero's shape: sizes, no pointers; a cuMemAlloc_v2 nested in each
        // cudaMalloc, and one direct driver allocation.
        let mut calls = Vec::new();
        for (i, size) in [2u64 << 20, 400 << 20].into_iter().enumerate() {
            let t = i as u64 * 100;
            calls.push(mem("cudaMalloc", t, Some(size), None));
            calls.push(nested(mem("cuMemAlloc_v2", t + 1, Some(size), None)));
        }
        calls.push(mem("cuMemAlloc_v2", 500, Some(1024), None));
        calls.push(free("cudaFree", 600, 0xdead)); // cannot be matched
        let l = one(calls);
        let total = (2 << 20) + (400 << 20) + 1024;
        assert_eq!((l.allocs, l.unknown_ptr_allocs), (3, 3));
        assert_eq!((l.live_bytes, l.peak_bytes), (total, total));
        assert_eq!(l.unmatched_frees, 1);
        assert_eq!(l.unfreed.len(), 3);
        assert!(l.unfreed.iter().all(|u| u.ptr.is_none()));
    }

    #[test]
    fn ledger_at_a_moment() {
        let calls = vec![
            alloc("cudaMalloc", 100, 10, 0xa),
            alloc("cudaMalloc", 200, 20, 0xb),
            free("cudaFree", 300, 0xa),
        ];
        let at = |t| ledger(&trace(calls.clone()), Some(t)).remove(0);
        assert_eq!(at(50).live_bytes, 0);
        assert_eq!(at(110).live_bytes, 10); // effect at return (ts + 10)
        assert_eq!(at(109).live_bytes, 0);
        assert_eq!(at(250).live_bytes, 30);
        assert_eq!(at(400).live_bytes, 20);
        assert_eq!(at(400).peak_bytes, 30);
    }

    #[test]
    fn reused_live_pointer_replaces_the_old_allocation() {
        let l = one(vec![
            alloc("cudaMalloc", 1, 10, 0xa),
            alloc("cudaMalloc", 2, 30, 0xa),
        ]);
        assert_eq!(
            (l.live_bytes, l.reused_live_ptrs, l.unfreed.len()),
            (30, 1, 1)
        );
    }

    #[test]
    fn churn_counts_reallocations_of_freed_sizes() {
        let mut calls = Vec::new();
        for round in 0..4u64 {
            let t = round * 1000;
            calls.push(alloc("cudaMalloc", t, 1 << 20, 0xa));
            calls.push(alloc("cudaMalloc", t + 100, 4096, 0xb));
            calls.push(free("cudaFree", t + 200, 0xa));
            calls.push(free("cudaFree", t + 300, 0xb));
        }
        calls.push(alloc("cudaMalloc", 9000, 777, 0xc)); // a new size: not a re-allocation
        let l = one(calls);
        assert_eq!(l.churn.reallocs, 6);
        assert_eq!(l.churn.alloc_free_ns, 17 * 10);
        assert_eq!(
            l.churn.top_sizes[0],
            SizeCount {
                bytes: 1 << 20,
                times: 3,
                op: "cudaMalloc"
            }
        );
        assert_eq!(l.churn.top_sizes.len(), 2);
    }

    /// Stream-ordered allocations come from the driver's pool: freeing and
    /// asking again is no churn (round 51: 30 pairs were, and the finding
    /// recommended the `cudaMallocAsync` the program used).
    #[test]
    fn stream_ordered_allocations_are_no_churn() {
        let mut calls = Vec::new();
        for round in 0..30u64 {
            let t = round * 1000;
            calls.push(alloc("cudaMallocAsync", t, 1 << 20, 0xa));
            calls.push(free("cudaFreeAsync", t + 500, 0xa));
        }
        let l = one(calls);
        assert_eq!((l.allocs, l.frees, l.live_bytes), (30, 30, 0));
        assert_eq!((l.churn.reallocs, l.churn.alloc_free_ns), (0, 0));
    }

    #[test]
    fn pointer_serializes_as_hex() {
        let mut u = Unfreed {
            ptr: Some(Ptr(0x7f00_0000_1000)),
            bytes: 1,
            op: "cudaMalloc",
            ts_ns: 0,
            stack_id: None,
            site: None,
        };
        assert_eq!(serde_json::to_value(&u).unwrap()["ptr"], "0x7f0000001000");
        u.ptr = None;
        assert!(serde_json::to_value(&u).unwrap()["ptr"].is_null());
    }

    #[test]
    fn thinning_keeps_ends_and_peak() {
        let pts: Vec<TimelinePoint> = (0..10_000u64)
            .map(|i| TimelinePoint {
                ts_ns: i,
                live_bytes: if i == 4321 { 1 << 40 } else { i % 97 },
            })
            .collect();
        let t = thin_timeline(pts.clone(), 100);
        assert!(t.len() <= 100);
        assert_eq!(t.first(), pts.first());
        assert_eq!(t.last(), pts.last());
        assert!(t.iter().any(|p| p.live_bytes == 1 << 40));
        assert!(t.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
    }

    #[test]
    fn processes_are_separate_and_counted_only_ones_appear() {
        let mut other = alloc("cudaMalloc", 1, 5, 0xa);
        other.pid = 2;
        let mut d = trace(vec![
            alloc("cudaMalloc", 1, 10, 0xa),
            other,
            free("cudaFree", 5, 0xa),
        ]);
        d.counts.push(crate::event::OpCount {
            pid: 3,
            op: 43,
            count: 9,
        });
        let l = ledger(&d, None);
        assert_eq!(
            l.iter().map(|p| (p.pid, p.live_bytes)).collect::<Vec<_>>(),
            [(1, 0), (2, 5), (3, 0)]
        );
        assert_eq!(l[1].comm, "?");
    }
}
