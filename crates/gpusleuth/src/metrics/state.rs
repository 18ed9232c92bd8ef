//! The metric values, updated per event.
//!
//! Cardinality bound: a process gets its own `pid`/`comm` label set when it
//! makes its first CUDA call, up to [`MAX_PROCESSES`] at a time. Past that,
//! the oldest process that has exited is folded into the `pid="other"` set
//! (its counters are added there, so sums over processes never go down); if
//! none has exited, the new process is counted under `other` from the start.
//! Ops come from the fixed op table, so a process contributes at most
//! (ops × series per op) series.

use sleuth_core::decompose::Split;
use sleuth_core::record::stat;
use sleuth_core::{CallEvent, Event, OpClass, OpCount, ProcKind};
use std::collections::{BTreeMap, HashMap};

/// Processes with their own labels at a time (the rest: `pid="other"`).
pub const MAX_PROCESSES: usize = 200;

/// pids remembered as `other`; past this the memory is forgotten (a pid
/// seen again may then get its own labels again).
const MAX_OVERFLOW_PIDS: usize = 65_536;

/// Upper bounds of the latency histogram buckets, in seconds (`+Inf` implied).
pub const BUCKETS_S: [f64; 15] = [
    1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0, 10.0,
];

/// One (process, op) series group.
#[derive(Debug, Default, Clone)]
pub struct OpSeries {
    /// Calls seen as per-call records.
    pub calls: u64,
    pub errors: u64,
    /// Non-cumulative counts per bucket; the last slot is `+Inf`.
    pub buckets: [u64; BUCKETS_S.len() + 1],
    pub sum_ns: u128,
    pub split: [u128; 3],
}

impl OpSeries {
    fn add_call(&mut self, c: &CallEvent) {
        self.calls += 1;
        self.errors += u64::from(c.failed());
        let secs = c.dur_ns as f64 / 1e9;
        let slot = BUCKETS_S
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(BUCKETS_S.len());
        self.buckets[slot] += 1;
        self.sum_ns += u128::from(c.dur_ns);
        let s = Split::of(c);
        self.split[0] += u128::from(s.on_cpu_ns);
        self.split[1] += u128::from(s.runnable_ns);
        self.split[2] += u128::from(s.blocked_ns);
    }

    fn merge(&mut self, o: &OpSeries) {
        self.calls += o.calls;
        self.errors += o.errors;
        for (a, b) in self.buckets.iter_mut().zip(o.buckets) {
            *a += b;
        }
        self.sum_ns += o.sum_ns;
        for (a, b) in self.split.iter_mut().zip(o.split) {
            *a += b;
        }
    }
}

/// One labelled process (or the `other` set).
#[derive(Debug, Default)]
pub struct Proc {
    pub comm: String,
    pub exited: bool,
    /// When it got its labels (eviction order).
    seq: u64,
    pub ops: BTreeMap<u16, OpSeries>,
    /// Live device allocations by pointer, and `cuMemCreate` handles.
    ptrs: HashMap<u64, u64>,
    handles: HashMap<u64, u64>,
    pub live_bytes: u64,
    pub peak_bytes: u64,
}

impl Proc {
    fn add_call(&mut self, c: &CallEvent) {
        self.ops.entry(c.op).or_default().add_call(c);
        self.ledger(c);
    }

    /// Device memory as the ledger counts it: successful, non-nested
    /// allocations (device and `cuMemCreate`), effective at return, each
    /// freed once.
    fn ledger(&mut self, c: &CallEvent) {
        let Some(info) = c.info() else { return };
        if c.nested || c.failed() {
            return;
        }
        let (Some(ptr), map) = (
            c.ptr,
            match info.class {
                OpClass::DeviceAlloc | OpClass::DeviceFree => &mut self.ptrs,
                OpClass::PhysCreate | OpClass::PhysRelease => &mut self.handles,
                _ => return,
            },
        ) else {
            return;
        };
        match info.class {
            OpClass::DeviceAlloc | OpClass::PhysCreate => {
                let bytes = c.size.unwrap_or(0);
                if let Some(old) = map.insert(ptr, bytes) {
                    self.live_bytes = self.live_bytes.saturating_sub(old);
                }
                self.live_bytes = self.live_bytes.saturating_add(bytes);
                self.peak_bytes = self.peak_bytes.max(self.live_bytes);
            }
            _ => {
                if let Some(bytes) = map.remove(&ptr) {
                    self.live_bytes = self.live_bytes.saturating_sub(bytes);
                }
            }
        }
    }
}

#[derive(Debug, Default)]
pub struct State {
    pub procs: BTreeMap<u32, Proc>,
    /// Processes beyond the label budget, and evicted ones.
    pub other: Proc,
    /// pids counted under `other` (so their later calls go there too).
    overflow: HashMap<u32, ()>,
    next_seq: u64,
    /// Loss counters indexed like `record::stat::NAMES`.
    pub drops: [u64; stat::MAX],
    /// Decoded events: call, wait, proc.
    pub events: [u64; 3],
    /// In-kernel op counts per (pid, op), as last read (kept at their maximum).
    pub kernel_counts: BTreeMap<(u32, u16), u64>,
    /// NVML readings of the GPU sampler.
    pub gpu: super::gpu::GpuState,
    /// Per-rank NCCL collective series.
    pub nccl: super::nccl::NcclMetrics,
}

impl State {
    pub fn observe(&mut self, ev: &Event, comm_of: impl Fn(u32) -> String) {
        match ev {
            Event::Call(c) => {
                self.events[0] += 1;
                self.proc_for(c.pid, &comm_of).add_call(c);
            }
            Event::Nccl(n) => {
                self.events[0] += 1;
                self.proc_for(n.call.pid, &comm_of).add_call(&n.call);
                self.nccl.observe(n);
            }
            Event::Wait(_) => self.events[1] += 1,
            // Caching-allocator events (--torch-allocator) have no metrics yet.
            Event::Block(_) => {}
            Event::Proc(p) => {
                self.events[2] += 1;
                if let Some(pr) = self.procs.get_mut(&p.pid) {
                    match p.kind {
                        ProcKind::Exec if !p.comm.is_empty() => pr.comm = p.comm.clone(),
                        ProcKind::Exit => pr.exited = true,
                        _ => {}
                    }
                }
            }
        }
    }

    /// The labelled process `pid`, creating it (within the budget) or `other`.
    fn proc_for(&mut self, pid: u32, comm_of: &impl Fn(u32) -> String) -> &mut Proc {
        if self.overflow.contains_key(&pid) {
            return &mut self.other;
        }
        if !self.procs.contains_key(&pid) {
            if self.procs.len() >= MAX_PROCESSES && !self.evict_one() {
                self.remember_overflow(pid);
                return &mut self.other;
            }
            self.next_seq += 1;
            let p = Proc {
                comm: comm_of(pid),
                seq: self.next_seq,
                ..Default::default()
            };
            self.procs.insert(pid, p);
        }
        self.procs.entry(pid).or_default()
    }

    /// Folds the oldest exited process into `other`; false when none exited.
    fn evict_one(&mut self) -> bool {
        let Some(pid) = self
            .procs
            .iter()
            .filter(|(_, p)| p.exited)
            .min_by_key(|(_, p)| p.seq)
            .map(|(pid, _)| *pid)
        else {
            return false;
        };
        if let Some(p) = self.procs.remove(&pid) {
            for (op, s) in &p.ops {
                self.other.ops.entry(*op).or_default().merge(s);
            }
            // Its memory died with it: nothing live to carry over.
            self.remember_overflow(pid);
        }
        true
    }

    fn remember_overflow(&mut self, pid: u32) {
        if self.overflow.len() >= MAX_OVERFLOW_PIDS {
            self.overflow.clear();
        }
        self.overflow.insert(pid, ());
    }

    pub fn set_kernel_counters(&mut self, losses: &[u64], counts: &[OpCount]) {
        for (d, &v) in self.drops.iter_mut().zip(losses) {
            *d = (*d).max(v);
        }
        for c in counts {
            let e = self.kernel_counts.entry((c.pid, c.op)).or_default();
            *e = (*e).max(c.count);
        }
    }

    /// Kernel-counted calls per (labelled pid or None for `other`, op).
    pub fn kernel_counts_by_label(&self) -> BTreeMap<(Option<u32>, u16), u64> {
        let mut out = BTreeMap::new();
        for (&(pid, op), &n) in &self.kernel_counts {
            let key = if self.procs.contains_key(&pid) {
                Some(pid)
            } else {
                None
            };
            *out.entry((key, op)).or_default() += n;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::op_by_name;

    fn call(pid: u32, op: &str, dur: u64, ret: i64, size: Option<u64>, ptr: Option<u64>) -> Event {
        Event::Call(CallEvent {
            ts_ns: 0,
            dur_ns: dur,
            pid,
            tid: pid,
            op: op_by_name(op).unwrap().id,
            ret,
            size,
            ptr,
            runnable_ns: dur / 4,
            blocked_ns: dur / 2,
            ..Default::default()
        })
    }

    #[test]
    fn counts_buckets_split_and_memory() {
        let mut s = State::default();
        let comm = |_| "w".to_string();
        s.observe(
            &call(1, "cudaMalloc", 2_000, 0, Some(100), Some(0x10)),
            comm,
        );
        s.observe(&call(1, "cudaMalloc", 3_000, 0, Some(50), Some(0x20)), comm);
        s.observe(&call(1, "cudaMalloc", 3_000, 2, Some(1 << 50), None), comm);
        s.observe(&call(1, "cudaFree", 8_000, 0, None, Some(0x10)), comm);
        let p = &s.procs[&1];
        let m = &p.ops[&op_by_name("cudaMalloc").unwrap().id];
        assert_eq!((m.calls, m.errors), (3, 1));
        // 2 µs and 3 µs fall in the (1 µs, 5 µs] bucket.
        assert_eq!(m.buckets[1], 3);
        assert_eq!(m.sum_ns, 8_000);
        assert_eq!(m.split, [2_000, 2_000, 4_000]);
        assert_eq!((p.live_bytes, p.peak_bytes), (50, 150));
        assert_eq!(s.events, [4, 0, 0]);
    }

    #[test]
    fn label_budget_folds_exited_processes_into_other() {
        let mut s = State::default();
        let comm = |_| "w".to_string();
        for pid in 0..MAX_PROCESSES as u32 {
            s.observe(&call(pid, "cudaFree", 1, 0, None, None), comm);
        }
        // No room and nobody exited: the newcomer goes to `other`.
        s.observe(&call(9999, "cudaFree", 1, 0, None, None), comm);
        assert!(!s.procs.contains_key(&9999));
        assert_eq!(s.other.ops.values().map(|o| o.calls).sum::<u64>(), 1);
        // Process 5 exits: the next newcomer takes its place, 5's calls fold into other.
        s.observe(
            &Event::Proc(sleuth_core::ProcEvent {
                kind: ProcKind::Exit,
                ts_ns: 0,
                pid: 5,
                tid: 5,
                ppid: 0,
                exit_code: 0,
                comm: String::new(),
            }),
            comm,
        );
        s.observe(&call(10_000, "cudaFree", 1, 0, None, None), comm);
        assert!(s.procs.contains_key(&10_000) && !s.procs.contains_key(&5));
        assert_eq!(s.procs.len(), MAX_PROCESSES);
        assert_eq!(s.other.ops.values().map(|o| o.calls).sum::<u64>(), 2);
        // Later calls of 9999 still go to `other`.
        s.observe(&call(9999, "cudaFree", 1, 0, None, None), comm);
        assert_eq!(s.other.ops.values().map(|o| o.calls).sum::<u64>(), 3);
    }
}
