//! The metric values, updated per event.
//!
//! Cardinality bound: a process gets its own `pid`/`comm` label set when it
//! makes its first CUDA call (a call record, or a launch the kernel counted),
//! up to [`MAX_PROCESSES`] at a time. Past that,
//! the oldest process that has exited is folded into the `pid="other"` set
//! (its counters are added there, so sums over processes never go down); if
//! none has exited, the new process is counted under `other` from the start.
//! Ops come from the fixed op table, so a process contributes at most
//! (ops × series per op) series.

use sleuth_core::decompose::Split;
use sleuth_core::latency::LogHistogram;
use sleuth_core::ledger::Ledger;
use sleuth_core::record::stat;
use sleuth_core::{CallEvent, Event, OpCount, ProcKind};
use std::collections::{BTreeMap, HashMap};

/// Processes with their own labels at a time (the rest: `pid="other"`).
pub const MAX_PROCESSES: usize = 200;

/// pids remembered as `other`; past this the memory is forgotten (a pid
/// seen again may then get its own labels again).
const MAX_OVERFLOW_PIDS: usize = 65_536;

/// Names the tracer read for processes not labelled yet (`set_process`),
/// kept until they get their labels; past this the names are forgotten
/// (a process then gets the name /proc gives when it is labelled).
const MAX_PENDING_NAMES: usize = 4_096;

/// Upper bounds of the latency histogram buckets, in seconds (`+Inf` implied).
/// Counts come from the core's `LogHistogram` (sleuth_core::latency): a
/// bucket holds every call at or below its bound, and may hold calls of up
/// to 6.25% above it (docs/metrics.md).
pub const BUCKETS_S: [f64; 15] = [
    1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0, 10.0,
];

/// One (process, op) series group.
#[derive(Debug, Default, Clone)]
pub struct OpSeries {
    /// Calls seen as per-call records.
    pub calls: u64,
    pub errors: u64,
    /// Durations (ns), the one latency model of a running trace.
    pub hist: LogHistogram,
    pub sum_ns: u128,
    pub split: [u128; 3],
}

impl OpSeries {
    /// Cumulative counts at each of [`BUCKETS_S`], then `+Inf`.
    pub fn cumulative_buckets(&self) -> [u64; BUCKETS_S.len() + 1] {
        let mut out = [self.calls; BUCKETS_S.len() + 1];
        for (slot, b) in out.iter_mut().zip(BUCKETS_S) {
            *slot = self.hist.count_le((b * 1e9).round() as u64);
        }
        out
    }

    fn add_call(&mut self, c: &CallEvent) {
        self.calls += 1;
        self.errors += u64::from(c.failed());
        self.hist.add(c.dur_ns);
        self.sum_ns += u128::from(c.dur_ns);
        let s = Split::of(c);
        self.split[0] += u128::from(s.on_cpu_ns);
        self.split[1] += u128::from(s.runnable_ns);
        self.split[2] += u128::from(s.blocked_ns);
    }

    fn merge(&mut self, o: &OpSeries) {
        self.calls += o.calls;
        self.errors += o.errors;
        self.hist.merge(&o.hist);
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
    /// Device bytes, from the state's ledger (for `other`: the sum over its processes).
    pub live_bytes: u64,
    pub peak_bytes: u64,
}

impl Proc {
    fn add_call(&mut self, c: &CallEvent) {
        self.ops.entry(c.op).or_default().add_call(c);
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
    /// In-kernel op counts per (pid, op), as last read.
    pub kernel_counts: BTreeMap<(u32, u16), u64>,
    /// Counts of earlier processes of a labelled pid whose kernel entry
    /// started again from 0 (a pid reused in a long run, its first
    /// process's entry taken out at its exit): added to the pid's series,
    /// which would otherwise wait for the new process to pass the old count
    /// (round 55's tester: 150 launches exported as 100).
    kernel_earlier: BTreeMap<(u32, u16), u64>,
    /// Names the tracer read for processes not labelled yet.
    pending_names: HashMap<u32, String>,
    /// In-kernel op counts of processes gone from the session's counts (they
    /// exited and a file stored their final counts), by op: counted under
    /// `other`, so sums never go down while a node agent's processes come
    /// and go without one entry each kept forever.
    kernel_gone: BTreeMap<u16, u64>,
    /// NVML readings of the GPU sampler.
    pub gpu: super::gpu::GpuState,
    /// Per-rank NCCL collective series.
    pub nccl: super::nccl::NcclMetrics,
    /// Device memory by the core's rules (the same as `memory` and the live view).
    ledger: Ledger,
}

impl State {
    pub fn observe(&mut self, ev: &Event, comm_of: impl Fn(u32) -> String) {
        match ev {
            Event::Call(c) => {
                self.events[0] += 1;
                self.add_call(c, &comm_of);
            }
            Event::Nccl(n) => {
                self.events[0] += 1;
                self.add_call(&n.call, &comm_of);
                self.nccl.observe(n);
            }
            Event::Wait(_) => self.events[1] += 1,
            // Caching-allocator events (--torch-allocator) have no metrics yet.
            Event::Block(_) => {}
            Event::Proc(p) => {
                self.events[2] += 1;
                if p.kind == ProcKind::Exit {
                    // No more calls can come from it: the driver freed what
                    // it held, and a process given its pid later starts from
                    // nothing. Its pending name stays: a launch-only process
                    // is labelled at the next read of the kernel's counts.
                    if self.overflow.contains_key(&p.pid) {
                        let gone = self.ledger.live_bytes(p.pid);
                        self.other.live_bytes = self.other.live_bytes.saturating_sub(gone);
                    }
                    self.ledger.forget(p.pid);
                }
                match p.kind {
                    // Its name from the kernel as it exec'd, for its labels
                    // (a name read at its fork is the parent's).
                    ProcKind::Exec if !self.procs.contains_key(&p.pid) => {
                        self.name_pending(p.pid, &p.comm)
                    }
                    // The kernel's name at its exit (or fork): for a
                    // process labelled `?` (a tracer of every process reads
                    // /proc up to 50 ms after the first call: round 55's
                    // tester found 41 of 45 short-lived processes `?`).
                    ProcKind::Exit | ProcKind::Fork => self.set_process(p.pid, &p.comm),
                    _ => {}
                }
                if let Some(pr) = self.procs.get_mut(&p.pid) {
                    match p.kind {
                        ProcKind::Exec if !p.comm.is_empty() => pr.comm = p.comm.clone(),
                        ProcKind::Exit => {
                            pr.exited = true;
                            // The driver frees a process's memory at its
                            // exit: a node's sum of live bytes is what is
                            // held now (the peak stays).
                            pr.live_bytes = 0;
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    fn add_call(&mut self, c: &CallEvent, comm_of: &impl Fn(u32) -> String) {
        let before = self.ledger.live_bytes(c.pid);
        self.ledger.apply(c);
        let (live, peak) = (self.ledger.live_bytes(c.pid), self.ledger.peak_bytes(c.pid));
        self.proc_for(c.pid, comm_of).add_call(c);
        if self.overflow.contains_key(&c.pid) {
            // `other` sums its processes: carry this one's change.
            let o = &mut self.other;
            o.live_bytes = (o.live_bytes + live).saturating_sub(before);
            o.peak_bytes = o.peak_bytes.max(o.live_bytes);
        } else if let Some(p) = self.procs.get_mut(&c.pid) {
            p.live_bytes = live;
            // The highest since the label was given (a reused pid's new
            // process starts its ledger from nothing).
            p.peak_bytes = p.peak_bytes.max(peak);
        }
    }

    /// The labelled process `pid`, creating it (within the budget) or `other`.
    fn proc_for(&mut self, pid: u32, comm_of: &impl Fn(u32) -> String) -> &mut Proc {
        if self.overflow.contains_key(&pid) || self.label(pid, || comm_of(pid)).is_none() {
            return &mut self.other;
        }
        self.procs.entry(pid).or_default()
    }

    /// Process `pid`'s labels, given now (named by the tracer's name for it,
    /// else `comm`) when the budget allows; None: it is counted under
    /// `other` from now on.
    fn label(&mut self, pid: u32, comm: impl FnOnce() -> String) -> Option<&mut Proc> {
        if !self.procs.contains_key(&pid) {
            if self.procs.len() >= MAX_PROCESSES && !self.evict_one() {
                self.remember_overflow(pid);
                return None;
            }
            self.next_seq += 1;
            let comm = self.pending_names.remove(&pid).unwrap_or_else(comm);
            let p = Proc {
                comm,
                seq: self.next_seq,
                ..Default::default()
            };
            self.procs.insert(pid, p);
        }
        self.procs.get_mut(&pid)
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
            self.ledger.forget(pid);
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

    /// The name the tracer read for process `pid` (from /proc as it first
    /// saw the process, or its exec): a process labelled later takes it,
    /// and a labelled one whose name could not be read takes it now
    /// (round 55's tester: processes that lived 1–3 ms were all `?`, the
    /// name read from /proc by this thread up to 50 ms later).
    pub fn set_process(&mut self, pid: u32, comm: &str) {
        if comm.is_empty() {
            return;
        }
        match self.procs.get_mut(&pid) {
            Some(p) if p.comm == "?" => p.comm = comm.to_string(),
            Some(_) => {}
            None => self.name_pending(pid, comm),
        }
    }

    /// Keeps `comm` for process `pid`'s labels, when it gets them.
    fn name_pending(&mut self, pid: u32, comm: &str) {
        if comm.is_empty() || self.overflow.contains_key(&pid) {
            return;
        }
        if self.pending_names.len() >= MAX_PENDING_NAMES {
            self.pending_names.clear();
        }
        self.pending_names.insert(pid, comm.to_string());
    }

    /// `alive_comm_of`: the process's name from /proc, None when it is gone.
    pub fn set_kernel_counters(
        &mut self,
        losses: &[u64],
        counts: &[OpCount],
        alive_comm_of: impl Fn(u32) -> Option<String>,
    ) {
        for (d, &v) in self.drops.iter_mut().zip(losses) {
            *d = (*d).max(v);
        }
        for c in counts {
            if !self.procs.contains_key(&c.pid) && !self.overflow.contains_key(&c.pid) {
                // A process that only launches (its launches counted in the
                // kernel, no call record) gets its labels at its first
                // counted launch, as another at its first call: before, it
                // stayed under `other`, and `other` went down when it made
                // its first recorded call (round 55's tester).
                let alive = alive_comm_of(c.pid);
                let exited = alive.is_none();
                let comm = alive.unwrap_or_else(|| "?".into());
                if let Some(p) = self.label(c.pid, || comm) {
                    p.exited = exited;
                }
            }
            let e = self.kernel_counts.entry((c.pid, c.op)).or_default();
            if c.count < *e {
                // The kernel's entry started again: another process with
                // the pid (snapshots come in order and only grow while an
                // entry lives).
                *self.kernel_earlier.entry((c.pid, c.op)).or_default() += *e;
            }
            *e = c.count;
        }
        // A process's counts leave the session's once it exited and a file
        // stored them (`CaptureSession::forget_exited_counts`); a labelled
        // one keeps its series until its label is given to another.
        let present: std::collections::HashSet<(u32, u16)> =
            counts.iter().map(|c| (c.pid, c.op)).collect();
        let State {
            kernel_counts,
            kernel_earlier,
            kernel_gone,
            procs,
            ..
        } = self;
        kernel_counts.retain(|&(pid, op), n| {
            let kept = present.contains(&(pid, op)) || procs.contains_key(&pid);
            if !kept {
                let earlier = kernel_earlier.remove(&(pid, op)).unwrap_or(0);
                *kernel_gone.entry(op).or_default() += *n + earlier;
            }
            kept
        });
    }

    /// Kernel-counted calls per (labelled pid or None for `other`, op).
    pub fn kernel_counts_by_label(&self) -> BTreeMap<(Option<u32>, u16), u64> {
        let mut out: BTreeMap<(Option<u32>, u16), u64> = self
            .kernel_gone
            .iter()
            .map(|(&op, &n)| ((None, op), n))
            .collect();
        for (&(pid, op), &n) in &self.kernel_counts {
            let key = if self.procs.contains_key(&pid) {
                Some(pid)
            } else {
                None
            };
            let earlier = self.kernel_earlier.get(&(pid, op)).copied().unwrap_or(0);
            *out.entry((key, op)).or_default() += n + earlier;
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
        assert_eq!(m.cumulative_buckets()[..2], [0, 3]);
        assert_eq!(*m.cumulative_buckets().last().unwrap(), 3);
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

    /// A process /proc no longer has.
    fn gone(_: u32) -> Option<String> {
        None
    }

    fn exit(pid: u32) -> Event {
        Event::Proc(sleuth_core::ProcEvent {
            kind: ProcKind::Exit,
            ts_ns: 0,
            pid,
            tid: pid,
            ppid: 0,
            exit_code: 0,
            comm: String::new(),
        })
    }

    fn launches(pid: u32, n: u64) -> OpCount {
        OpCount {
            pid,
            op: op_by_name("cuLaunchKernel").unwrap().id,
            count: n,
        }
    }

    /// The calls of `pid` (None: `other`) in the exposition's terms: call
    /// records plus kernel-counted launches.
    fn calls_of(s: &State, pid: Option<u32>) -> u64 {
        let records: u64 = match pid {
            Some(p) => s
                .procs
                .get(&p)
                .map_or(0, |p| p.ops.values().map(|o| o.calls).sum()),
            None => s.other.ops.values().map(|o| o.calls).sum(),
        };
        let counted: u64 = s
            .kernel_counts_by_label()
            .iter()
            .filter(|((k, _), _)| *k == pid)
            .map(|(_, n)| n)
            .sum();
        records + counted
    }

    /// A process that only launches gets its labels at its first counted
    /// launch, with the name the tracer read for it, and `other` never goes
    /// down (round 55's tester: `other` went 230 → 150 when such a process
    /// made its first recorded call, and one that lived 3 s stayed under
    /// `other` with 199 label slots free).
    #[test]
    fn a_process_that_only_launches_gets_its_labels() {
        let mut s = State::default();
        s.set_process(41, "trainer");
        s.set_kernel_counters(&[], &[launches(41, 130)], |_| Some("proc".into()));
        s.set_kernel_counters(&[], &[launches(41, 130), launches(42, 5)], |_| {
            Some("proc".into())
        });
        assert_eq!(s.procs[&41].comm, "trainer", "the tracer's name");
        assert_eq!(s.procs[&42].comm, "proc");
        assert_eq!((calls_of(&s, Some(41)), calls_of(&s, None)), (130, 0));
        s.observe(
            &call(41, "cudaMalloc", 1, 0, Some(4096), Some(0x10)),
            |_| "x".into(),
        );
        assert_eq!((calls_of(&s, Some(41)), calls_of(&s, None)), (131, 0));
        assert!(!s.procs[&41].exited);
        // Gone before its counts were read: labelled as exited (its slot
        // can be given to the next process).
        s.set_kernel_counters(&[], &[launches(41, 130), launches(43, 2)], gone);
        assert!(s.procs[&43].exited);
    }

    /// A pid that comes back in a long run (its first process's kernel
    /// entry taken out at its exit) keeps counting from where its series
    /// was (round 55's tester: 100 + 50 launches exported as 100).
    #[test]
    fn a_reused_pid_adds_to_its_series() {
        let mut s = State::default();
        let name = |_| Some("w".to_string());
        s.set_kernel_counters(&[], &[launches(7, 100)], name);
        s.observe(&exit(7), |_| "w".into());
        // Stored and taken out of the kernel's map, then the pid again.
        s.set_kernel_counters(&[], &[], name);
        s.set_kernel_counters(&[], &[launches(7, 20)], name);
        assert_eq!(calls_of(&s, Some(7)), 120);
        s.set_kernel_counters(&[], &[launches(7, 50)], name);
        assert_eq!(calls_of(&s, Some(7)), 150);
        // Folded into `other` with its earlier processes' counts.
        for pid in 1000..1000 + MAX_PROCESSES as u32 {
            s.observe(&call(pid, "cudaFree", 1, 0, None, None), |_| "w".into());
        }
        s.set_kernel_counters(&[], &[], name);
        assert!(!s.procs.contains_key(&7));
        assert_eq!(calls_of(&s, None), 150);
    }

    /// A process's live bytes drop to 0 at its exit (the driver frees them),
    /// its peak stays; a labelled process whose name /proc no longer had
    /// takes the tracer's.
    #[test]
    fn exit_frees_and_late_names_replace_the_unknown() {
        let mut s = State::default();
        // Named at its fork as its parent, then exec'd: the exec's name.
        s.set_process(8, "sh");
        let mut exec = exit(8);
        if let Event::Proc(p) = &mut exec {
            p.kind = ProcKind::Exec;
            p.comm = "workload".into();
        }
        s.observe(&exec, |_| "?".into());
        s.observe(&call(8, "cudaFree", 1, 0, None, None), |_| "?".into());
        assert_eq!(s.procs[&8].comm, "workload");
        s.observe(&call(9, "cudaMalloc", 1, 0, Some(4096), Some(0x10)), |_| {
            "?".into()
        });
        s.set_process(9, "worker");
        assert_eq!(s.procs[&9].comm, "worker");
        s.set_process(9, "other-name");
        assert_eq!(s.procs[&9].comm, "worker", "a name read is kept");
        s.observe(&exit(9), |_| "?".into());
        assert_eq!((s.procs[&9].live_bytes, s.procs[&9].peak_bytes), (0, 4096));
        // Another process given the pid starts from nothing; the peak stays.
        s.observe(&call(9, "cudaMalloc", 1, 0, Some(512), Some(0x10)), |_| {
            "?".into()
        });
        assert_eq!(
            (s.procs[&9].live_bytes, s.procs[&9].peak_bytes),
            (512, 4096)
        );
        // Labelled `?` (gone when /proc was read), named by its exit.
        s.observe(&call(10, "cudaFree", 1, 0, None, None), |_| "?".into());
        let mut gone = exit(10);
        if let Event::Proc(p) = &mut gone {
            p.comm = "shorty".into();
        }
        s.observe(&gone, |_| "?".into());
        assert_eq!(s.procs[&10].comm, "shorty");
    }

    /// Kernel counts of processes gone from the session's counts (exited,
    /// stored) fold into `other`: the sums never go down, and no entry per
    /// process is kept forever; a labelled process keeps its own.
    #[test]
    fn kernel_counts_of_processes_gone_fold_into_other() {
        let launch = op_by_name("cuLaunchKernel").unwrap().id;
        let count = |pid, n| OpCount {
            pid,
            op: launch,
            count: n,
        };
        let mut s = State::default();
        s.observe(&call(7, "cudaFree", 1, 0, None, None), |_| "w".into());
        // The label budget full of live processes: 8 and 9 are `other`'s.
        for pid in 1000..999 + MAX_PROCESSES as u32 {
            s.observe(&call(pid, "cudaFree", 1, 0, None, None), |_| "w".into());
        }
        let total = |s: &State| s.kernel_counts_by_label().values().sum::<u64>();
        s.set_kernel_counters(&[], &[count(7, 10), count(8, 20), count(9, 30)], gone);
        assert_eq!(total(&s), 60);
        // 8 and 9 exited and were stored: gone from the session's counts.
        s.set_kernel_counters(&[], &[count(7, 11)], gone);
        assert_eq!(total(&s), 61);
        assert_eq!(s.kernel_counts.len(), 1, "only the labelled process's own");
        let by = s.kernel_counts_by_label();
        assert_eq!((by[&(Some(7), launch)], by[&(None, launch)]), (11, 50));
        // The labelled process gone too keeps its series while it is labelled.
        s.set_kernel_counters(&[], &[], gone);
        assert_eq!(total(&s), 61);
    }
}
