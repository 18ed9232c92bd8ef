//! Where each CUDA-issuing thread's time goes, over its whole CUDA phase:
//! inside CUDA calls (on-CPU / runnable / blocked, from the call records) and
//! *between* them (host compute on the CPU, blocked with who woke it,
//! runnable with who held the CPU), from the stored off-CPU intervals.
//!
//! A thread's window runs from the start of its first recorded CUDA call to
//! the end of its last one (nested driver calls are part of their runtime
//! caller and are skipped). Time before the first call (imports, model
//! loading) is not the loop being diagnosed and is left out.
//!
//! Between calls: wall = window - time inside calls; blocked and runnable are
//! the parts of the thread's waits that fall outside every call; on-CPU is the
//! rest. Kernel launches counted in the kernel (`--launches driver`, the
//! default) have no record, so the host time spent launching is on-CPU time
//! between calls here.

use crate::data::TraceData;
use crate::decompose::Split;
use crate::event::{CallEvent, WaitEvent};
use crate::ops::OpClass;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Comm of gpusleuth's main thread and prefix of its helper threads (`gpusleuth-db`).
pub const TRACER_COMM: &str = "gpusleuth";
/// Name of the `stats` entry holding the tracer's own pid (written by `trace`).
pub const TRACER_PID_STAT: &str = "tracer_pid";
/// Name of the `stats` entry holding what one probe trap cost a traced
/// thread, in ns, measured as the probes of counted launches were attached,
/// on a function that begins as the probed launch function does
/// (`sleuth_probe::trap_cost`; absent in traces written before round 56,
/// in traces that count no launch since round 57, or where it could not be).
pub const PROBE_TRAP_STAT: &str = "probe_trap_ns";
/// Name of the `stats` entry holding what a recorded call's probes (its
/// entry and return traps) cost a traced thread, in ns, measured as the
/// libraries that record calls were attached, on a function that begins as
/// their recorded launch function does (`--launches full`), else as their
/// first recorded function (absent in traces written before round 58, or
/// where it could not be measured).
pub const PROBE_CALL_TRAP_STAT: &str = "probe_call_trap_ns";

/// Whether a task is gpusleuth itself: never a culprit, never a waker to
/// blame. By the trace's tracer pid, and by name (`gpusleuth`,
/// `gpusleuth-*`): a merged trace names no tracer, and tracers run side by
/// side (a node agent's and a user's; CI's tests) take each other's CPU.
/// So another gpusleuth process that took the CPU (or a process that
/// names itself so) is counted as gpusleuth's interference, not a culprit
/// (round 51 tried the pid alone where it is stored: other tracers running
/// at once then became culprits of every parallel test's trace).
pub fn is_tracer(pid: u32, comm: &str, tracer_pid: Option<u32>) -> bool {
    tracer_pid == Some(pid)
        || comm == TRACER_COMM
        || comm
            .strip_prefix(TRACER_COMM)
            .is_some_and(|rest| rest.starts_with('-'))
}

/// The tracer's pid recorded in a trace, if any.
pub fn tracer_pid(data: &TraceData) -> Option<u32> {
    data.stats
        .get(TRACER_PID_STAT)
        .and_then(|&p| u32::try_from(p).ok())
        .filter(|&p| p != 0)
}

/// What woke a thread blocked between CUDA calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WakerKind {
    /// Another task (thread or process): the thread waited for it.
    Task,
    /// An interrupt (a timer expiring, a device completing I/O).
    Interrupt,
    /// The trace holds no waker for these waits (not captured, or not seen).
    Unknown,
}

/// Blocked time between CUDA calls ended by one waker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WakerTime {
    pub kind: WakerKind,
    /// The waking task (0 for interrupts and unknown).
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// Blocked time (outside CUDA calls) that this waker ended.
    pub blocked_ns: u64,
    /// Share of the thread's blocked time between calls, 0.0..=1.0.
    pub share: f64,
}

/// Runnable time between CUDA calls while one task held the CPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HolderTime {
    pub pid: u32,
    pub comm: String,
    pub runnable_ns: u64,
}

/// A long stretch between two consecutive calls of a thread: a pause
/// (loading a dataset after `set_device`, an evaluation, a hang) as against
/// time lost at every step. The verdicts judge the steady steps without a
/// one-off among them (`findings::bottleneck::left_out_pause`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pause {
    /// The end of the call before it and the start of the call after it.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Blocked and runnable time inside it; the rest was on the CPU.
    pub blocked_ns: u64,
    pub runnable_ns: u64,
    /// What ended its blocked time, largest first (at most
    /// [`PAUSE_WAKERS`]; `share` of its blocked time).
    pub wakers: Vec<WakerTime>,
    /// What the first sync after it added to `sync_stall`'s overlappable
    /// time through the pause (`min(H, S)` less what it is without the
    /// pause's on-CPU time, where the pause lies in that sync's host
    /// stretch `H`): taken out with the pause.
    #[serde(default)]
    pub sync_overlap_ns: u64,
}

impl Pause {
    pub fn wall_ns(&self) -> u64 {
        // Saturating: a stored split is read from a file that may be crafted.
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// On-CPU plus runnable time: the host working (or wanting to).
    pub fn host_ns(&self) -> u64 {
        self.wall_ns().saturating_sub(self.blocked_ns)
    }
}

/// Stretches kept per thread ([`ThreadSplit::pauses`]).
pub const MAX_PAUSES: usize = 5;
/// Wakers kept per stretch ([`Pause::wakers`]).
pub const PAUSE_WAKERS: usize = 4;

/// Adds `p` to `pauses` (longest first, ties: earlier first), keeping the
/// [`MAX_PAUSES`] longest.
pub fn keep_longest(pauses: &mut Vec<Pause>, p: Pause) {
    let at = pauses.partition_point(|q| {
        q.wall_ns() > p.wall_ns() || q.wall_ns() == p.wall_ns() && q.start_ns <= p.start_ns
    });
    pauses.insert(at, p);
    pauses.truncate(MAX_PAUSES);
}

/// The whole-thread split of one CUDA-issuing thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadSplit {
    pub pid: u32,
    pub tid: u32,
    /// The process's name (thread names are not recorded).
    pub comm: String,
    pub start_ns: u64,
    pub end_ns: u64,
    /// `end_ns - start_ns`.
    pub wall_ns: u64,
    /// Recorded CUDA calls (not nested).
    pub calls: u64,
    /// Recorded calls nested in those (a driver call inside a runtime
    /// call): each cost the thread its own probes' traps. 0 in a split
    /// stored before round 58.
    #[serde(default)]
    pub nested_calls: u64,
    /// Time inside CUDA calls.
    pub in_calls: Split,
    /// Time between CUDA calls.
    pub between: Split,
    /// Sync calls (`cudaStreamSynchronize`, ...), their total wall time and median.
    pub syncs: u64,
    pub sync_ns: u64,
    pub sync_p50_ns: u64,
    /// Its slowest sync: start and wall time (0, 0 without syncs, or a
    /// split stored before round 52). A GPU hang inside one sync of a
    /// GPU-bound loop is no verdict; the summary line names it.
    #[serde(default)]
    pub slowest_sync: (u64, u64),
    /// Blocked time between calls by waker, largest first.
    pub wakers: Vec<WakerTime>,
    /// Runnable time between calls by the task holding the CPU, largest first
    /// (gpusleuth's own threads excluded: see `tracer_runnable_ns`).
    pub preempted_by: Vec<HolderTime>,
    /// Runnable time of this thread (inside or between calls) while one of
    /// gpusleuth's own threads held its CPU: the tracer's measured interference.
    pub tracer_runnable_ns: u64,
    /// Its [`MAX_PAUSES`] longest stretches between two of its calls,
    /// longest first (empty: calls back to back, or a split stored before
    /// round 52): the verdicts pass over those that held counted launches
    /// and compare the longest left with the next.
    #[serde(default)]
    pub pauses: Vec<Pause>,
    /// `sync_stall`'s overlappable time: over its syncs, `Σ min(H, S)`,
    /// `S` the sync's wall time less its runnable time, `H` the thread's
    /// on-CPU time between calls after it until it queued kernels or
    /// synced again ([`crate::ops::queues_kernels`]; a stretch the window's
    /// end cuts counts nothing). None in a split stored before round 56
    /// (the verdict then reads [`crate::findings::ThreadInputs`]'
    /// `overlap_ns`: the whole stretch between syncs, off-CPU time too).
    #[serde(default)]
    pub sync_overlap_ns: Option<u64>,
    /// The median of those `H` (None where `sync_overlap_ns` is).
    #[serde(default)]
    pub sync_host_p50_ns: Option<u64>,
}

impl ThreadSplit {
    /// Share of the window, 0.0 when the window is empty.
    pub fn share(&self, ns: u64) -> f64 {
        if self.wall_ns == 0 {
            0.0
        } else {
            ns as f64 / self.wall_ns as f64
        }
    }

    /// Blocked time between calls ended by other tasks (not interrupts, not unknown).
    pub fn blocked_by_tasks_ns(&self) -> u64 {
        self.wakers
            .iter()
            .filter(|w| w.kind == WakerKind::Task)
            // Saturating: a stored split's values are each at most 2^62.
            .fold(0u64, |n, w| n.saturating_add(w.blocked_ns))
    }
}

/// The whole-thread split of every thread that made a (non-nested) CUDA
/// call, largest window first.
pub fn thread_splits(data: &TraceData) -> Vec<ThreadSplit> {
    stream_threads(data, |_, _| {})
}

/// [`thread_splits`], also handing every non-nested call with its index in
/// `data.calls` to `on_call`, thread by thread in start order (ties: trace
/// order): the order the findings' per-thread accumulators need.
pub fn stream_threads(
    data: &TraceData,
    mut on_call: impl FnMut(usize, &CallEvent),
) -> Vec<ThreadSplit> {
    let tracer = tracer_pid(data);
    let mut calls: BTreeMap<(u32, u32), Vec<(usize, &CallEvent)>> = BTreeMap::new();
    let mut nested: HashMap<(u32, u32), u64> = HashMap::new();
    for (i, c) in data.calls.iter().enumerate() {
        if c.nested {
            *nested.entry((c.pid, c.tid)).or_default() += 1;
        } else {
            calls.entry((c.pid, c.tid)).or_default().push((i, c));
        }
    }
    let mut waits: HashMap<(u32, u32), Vec<&WaitEvent>> = HashMap::new();
    for w in &data.waits {
        if calls.contains_key(&(w.pid, w.tid)) {
            waits.entry((w.pid, w.tid)).or_default().push(w);
        }
    }
    let mut out: Vec<ThreadSplit> = calls
        .iter_mut()
        .map(|(&(pid, tid), cs)| {
            cs.sort_by_key(|c| c.1.ts_ns);
            let mut ws = waits.remove(&(pid, tid)).unwrap_or_default();
            ws.sort_by_key(|w| (w.on_ns, w.off_ns));
            let window = (
                cs.iter().map(|c| c.1.ts_ns).min().unwrap_or(0),
                cs.iter().map(|c| c.1.end_ns()).max().unwrap_or(0),
            );
            let mut t = ThreadStream::new(pid, tid, window, tracer);
            t.add_nested(nested.get(&(pid, tid)).copied().unwrap_or(0));
            let mut next = cs.iter().peekable();
            for w in ws {
                while let Some(&(i, c)) = next.next_if(|c| c.1.ts_ns < w.on_ns) {
                    t.add_call(c);
                    on_call(i, c);
                }
                t.add_wait(w);
            }
            for &(i, c) in next {
                t.add_call(c);
                on_call(i, c);
            }
            t.finish(data.comm_of(pid))
        })
        .collect();
    sort_splits(&mut out);
    out
}

/// The documented order of thread splits: largest window first.
pub fn sort_splits(splits: &mut [ThreadSplit]) {
    splits.sort_by(|a, b| {
        b.wall_ns
            .cmp(&a.wall_ns)
            .then(a.pid.cmp(&b.pid))
            .then(a.tid.cmp(&b.tid))
    });
}

/// One thread's split computed as its calls and waits stream past, in
/// memory bounded by the calls overlapping one wait (plus 8 bytes per sync
/// call for the median), so a thread of any length fits.
///
/// Feed the thread's non-nested calls in start order and its waits in
/// `on_ns` order, interleaved so that every call starting before a wait's
/// `on_ns` is added before that wait. `window` is the thread's first call
/// start and last call end (known beforehand: the writer keeps them), or
/// only its start, the end given by [`ThreadStream::close_window`] once
/// the last call is added (a reader of a scope's calls learns it then).
pub struct ThreadStream {
    pid: u32,
    tid: u32,
    window: (u64, u64),
    tracer: Option<u32>,
    /// Merged `[start, end)` call intervals that a later wait may still overlap.
    busy: std::collections::VecDeque<(u64, u64)>,
    in_wall: u64,
    calls: u64,
    nested_calls: u64,
    in_calls: Split,
    sync_durs: Vec<u64>,
    slowest_sync: (u64, u64),
    blocked: u64,
    runnable: u64,
    wakers: HashMap<(WakerKind, u32, u32, String), u64>,
    holders: HashMap<(u32, String), u64>,
    tracer_ns: u64,
    /// Blocked and runnable time of the waits since the last call (the
    /// stretch the next call closes), and their wakers' time.
    gap_blocked: u64,
    gap_runnable: u64,
    gap_wakers: Vec<((WakerKind, u32, u32, String), u64)>,
    pauses: Vec<Pause>,
    /// The stretch after the last sync, while no GPU work has been queued
    /// since: `sync_stall`'s `H` so far (None before the first sync and
    /// once a kernel submission closed it).
    stretch: Option<SyncStretch>,
    /// `Σ min(H, S)` over the closed stretches, and each one's `H`.
    sync_overlap: u64,
    sync_host: Vec<u64>,
}

/// The time after a sync until the thread queues GPU work again (its first
/// kernel submission) or syncs again: the GPU had nothing queued by this
/// thread, and what the host did then could have overlapped the sync's wait.
struct SyncStretch {
    /// The sync's end, and its wait (`S`: its wall time less its runnable time).
    start: u64,
    wait: u64,
    /// Time inside other calls and off the CPU between calls so far: not
    /// the host's own work (a copy's staging is `pageable_copy`'s, blocked
    /// time `input_wait`'s, runnable time the CPU's holders').
    in_calls: u64,
    off_cpu: u64,
}

impl ThreadStream {
    pub fn new(pid: u32, tid: u32, window: (u64, u64), tracer: Option<u32>) -> ThreadStream {
        ThreadStream {
            pid,
            tid,
            window,
            tracer,
            busy: Default::default(),
            in_wall: 0,
            calls: 0,
            nested_calls: 0,
            in_calls: Split::default(),
            sync_durs: Vec::new(),
            slowest_sync: (0, 0),
            blocked: 0,
            runnable: 0,
            wakers: HashMap::new(),
            holders: HashMap::new(),
            tracer_ns: 0,
            gap_blocked: 0,
            gap_runnable: 0,
            gap_wakers: Vec::new(),
            pauses: Vec::new(),
            stretch: None,
            sync_overlap: 0,
            sync_host: Vec::new(),
        }
    }

    /// Sets the window's end, for a stream made with the end unknown
    /// (`u64::MAX`): call it after the last call and before the waits that
    /// went back on CPU after that call's start. The window's end only
    /// clamps waits, and a wait added before it went back on CPU by the
    /// start of a call, so by the end: the answer is the one a stream made
    /// with the whole window gives.
    pub fn close_window(&mut self, end_ns: u64) {
        self.window.1 = end_ns.max(self.window.0);
    }

    /// `n` nested calls of the thread (in any order): counted only, for
    /// their probes' traps (their time is their runtime caller's).
    pub fn add_nested(&mut self, n: u64) {
        self.nested_calls = self.nested_calls.saturating_add(n);
    }

    /// A non-nested call, in start order. Time inside calls counts each
    /// instant once: a call inside another of the thread (a PyTorch
    /// allocator call's `cudaMalloc`, which is not flagged nested: only a
    /// driver call inside a runtime call is) adds only what it lasts past
    /// the calls before it, in proportion to its split (before round 54
    /// such calls added up: "inside calls 101%").
    pub fn add_call(&mut self, c: &CallEvent) {
        self.calls += 1;
        let (s, e) = (c.ts_ns, c.end_ns());
        let beyond = match self.busy.back() {
            Some(last) if s <= last.1 => e.saturating_sub(last.1),
            _ => e - s,
        };
        self.in_calls.add(Split::of(c).part(beyond));
        let is_sync = c.info().is_some_and(|i| i.class == OpClass::Sync);
        // A sync, or the first kernel queued after one, ends its stretch
        // (below, once the gap before this call is among the pauses).
        let ends_stretch = is_sync || crate::ops::queues_kernels(c);
        if let Some(st) = self.stretch.as_mut().filter(|_| !ends_stretch) {
            st.in_calls += beyond;
        }
        if is_sync {
            self.sync_durs.push(c.dur_ns);
            if c.dur_ns > self.slowest_sync.1 {
                self.slowest_sync = (s, c.dur_ns);
            }
        }
        match self.busy.back_mut() {
            Some(last) if s <= last.1 => {
                self.in_wall += e.saturating_sub(last.1);
                last.1 = last.1.max(e);
            }
            last => {
                if let Some(gap_start) = last.map(|l| l.1) {
                    self.close_gap(gap_start, s);
                }
                self.in_wall += e - s;
                self.busy.push_back((s, e));
            }
        }
        if ends_stretch {
            self.close_stretch(s);
        }
        if is_sync {
            self.stretch = Some(SyncStretch {
                start: e,
                wait: c.dur_ns.saturating_sub(c.runnable_ns),
                in_calls: 0,
                off_cpu: 0,
            });
        }
    }

    /// The open sync stretch ends at `end` (a call's start): the host's own
    /// work in it (`H`) could have overlapped the sync's wait (`S`) had
    /// the sync not drained the queue first; `min(H, S)` counts. Pairing
    /// `S` with the work *after* the sync (round 56) also counts a stretch
    /// that a second sync ends at once (a `synchronize()` for timing after
    /// the host work, which waits for nothing).
    fn close_stretch(&mut self, end: u64) {
        let Some(st) = self.stretch.take() else {
            return;
        };
        let end = end.max(st.start);
        let host = (end - st.start)
            .saturating_sub(st.in_calls)
            .saturating_sub(st.off_cpu);
        let overlap = host.min(st.wait);
        self.sync_overlap += overlap;
        self.sync_host.push(host);
        // A pause in the stretch takes along what its on-CPU time added.
        if let Some(p) = self
            .pauses
            .iter_mut()
            .find(|p| p.start_ns >= st.start && p.end_ns <= end)
        {
            let pause_on_cpu = p.wall_ns().saturating_sub(p.blocked_ns + p.runnable_ns);
            p.sync_overlap_ns = overlap - host.saturating_sub(pause_on_cpu).min(st.wait);
        }
    }

    /// The stretch `[a, s)` between two calls ends: the waits that went
    /// back on CPU by `s` were all added (the feeding order), so its
    /// blocked and runnable time is known; kept if among the longest.
    fn close_gap(&mut self, a: u64, s: u64) {
        let (a, s) = (a.max(self.window.0), s.min(self.window.1).max(a));
        let wall = s - a;
        let blocked = std::mem::take(&mut self.gap_blocked).min(wall);
        let runnable = std::mem::take(&mut self.gap_runnable).min(wall - blocked);
        let mut wakers = std::mem::take(&mut self.gap_wakers);
        if wall == 0
            || self.pauses.len() == MAX_PAUSES
                && self.pauses.last().is_some_and(|p| p.wall_ns() >= wall)
        {
            return;
        }
        wakers.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
        wakers.truncate(PAUSE_WAKERS);
        let pause = Pause {
            start_ns: a,
            end_ns: s,
            blocked_ns: blocked,
            runnable_ns: runnable,
            wakers: wakers
                .into_iter()
                .map(|((kind, pid, tid, comm), ns)| WakerTime {
                    kind,
                    pid,
                    tid,
                    comm,
                    blocked_ns: ns.min(blocked),
                    share: if blocked == 0 {
                        0.0
                    } else {
                        ns.min(blocked) as f64 / blocked as f64
                    },
                })
                .collect(),
            sync_overlap_ns: 0,
        };
        keep_longest(&mut self.pauses, pause);
    }

    /// Length of `[a, b)` inside the window and outside every call added so far.
    fn outside_calls(&self, a: u64, b: u64) -> u64 {
        let (a, b) = (a.max(self.window.0), b.min(self.window.1));
        if b <= a {
            return 0;
        }
        let mut covered = 0;
        for &(s, e) in &self.busy {
            if s >= b {
                break;
            }
            if e > a {
                covered += e.min(b) - s.max(a);
            }
        }
        (b - a) - covered
    }

    /// A wait of the thread, in `on_ns` order, after every call starting before its `on_ns`.
    pub fn add_wait(&mut self, w: &WaitEvent) {
        let (start_ns, end_ns) = self.window;
        let b = self.outside_calls(w.off_ns, w.wake_ns);
        let r = self.outside_calls(w.wake_ns, w.on_ns);
        if let Some(start) = self.stretch.as_ref().map(|st| st.start) {
            // Off the CPU in the open sync stretch (it ends at a call's
            // start, and this wait went back on CPU before the next call).
            let off = self.outside_calls(w.off_ns.max(start), w.on_ns);
            if let Some(st) = &mut self.stretch {
                st.off_cpu += off;
            }
        }
        self.blocked += b;
        self.runnable += r;
        self.gap_blocked += b;
        self.gap_runnable += r;
        if b > 0 {
            let key = match &w.waker {
                Some(k) if k.is_task() => (WakerKind::Task, k.pid, k.tid, k.comm.clone()),
                Some(_) => (
                    WakerKind::Interrupt,
                    0,
                    0,
                    "(interrupt: timer or device)".into(),
                ),
                None => (WakerKind::Unknown, 0, 0, "(waker not recorded)".into()),
            };
            // A stretch's wakers are few (a timer, a loader's threads); past
            // 16 a new one replaces the smallest it outweighs.
            let g = &mut self.gap_wakers;
            if let Some(i) = g.iter().position(|(k, _)| *k == key) {
                g[i].1 += b;
            } else if g.len() < 16 {
                g.push((key.clone(), b));
            } else if let Some(min) = g.iter_mut().min_by_key(|(_, ns)| *ns) {
                if b > min.1 {
                    *min = (key.clone(), b);
                }
            }
            *self.wakers.entry(key).or_default() += b;
        }
        // Culprits cover the runnable part; the share inside the window
        // (inside or between calls) that the tracer took is its interference.
        let whole = w.runnable_ns();
        let in_window = whole.min(w.on_ns.min(end_ns).saturating_sub(w.wake_ns.max(start_ns)));
        for c in &w.culprits {
            if whole == 0 {
                break;
            }
            let part = |span: u64| (c.ns.min(whole) as u128 * span as u128 / whole as u128) as u64;
            if is_tracer(c.pid, &c.comm, self.tracer) {
                self.tracer_ns += part(in_window);
            } else if r > 0 {
                *self.holders.entry((c.pid, c.comm.clone())).or_default() += part(r);
            }
        }
        // A thread's waits do not overlap: later ones start at or after this
        // one's end, so intervals ending by then can no longer be overlapped.
        // The last one stays (a call may still extend it).
        while self.busy.len() > 1 && self.busy.front().is_some_and(|iv| iv.1 <= w.on_ns) {
            self.busy.pop_front();
        }
    }

    /// The split, once every call and wait was added.
    pub fn finish(mut self, comm: &str) -> ThreadSplit {
        let (start_ns, end_ns) = self.window;
        let wall_ns = end_ns - start_ns;
        let (blocked, runnable) = (self.blocked, self.runnable);
        let between_wall = wall_ns.saturating_sub(self.in_wall);
        let between = Split {
            on_cpu_ns: between_wall.saturating_sub(blocked + runnable),
            runnable_ns: runnable.min(between_wall),
            blocked_ns: blocked.min(between_wall.saturating_sub(runnable)),
        };
        let mut wakers: Vec<WakerTime> = self
            .wakers
            .into_iter()
            .map(|((kind, wpid, wtid, comm), ns)| WakerTime {
                kind,
                pid: wpid,
                tid: wtid,
                comm,
                blocked_ns: ns,
                share: if blocked == 0 {
                    0.0
                } else {
                    ns as f64 / blocked as f64
                },
            })
            .collect();
        wakers.sort_by(|a, b| {
            b.blocked_ns
                .cmp(&a.blocked_ns)
                .then(a.kind.cmp(&b.kind))
                .then(a.tid.cmp(&b.tid))
        });
        let mut preempted_by: Vec<HolderTime> = self
            .holders
            .into_iter()
            .filter(|(_, ns)| *ns > 0)
            .map(|((hpid, comm), ns)| HolderTime {
                pid: hpid,
                comm,
                runnable_ns: ns,
            })
            .collect();
        preempted_by.sort_by(|a, b| b.runnable_ns.cmp(&a.runnable_ns).then(a.pid.cmp(&b.pid)));
        self.sync_durs.sort_unstable();
        ThreadSplit {
            pid: self.pid,
            tid: self.tid,
            comm: comm.to_string(),
            start_ns,
            end_ns,
            wall_ns,
            calls: self.calls,
            nested_calls: self.nested_calls,
            in_calls: self.in_calls,
            between,
            syncs: self.sync_durs.len() as u64,
            sync_ns: self.sync_durs.iter().sum(),
            sync_p50_ns: crate::stats::nearest_rank(&self.sync_durs, 50).unwrap_or(0),
            slowest_sync: self.slowest_sync,
            wakers,
            preempted_by,
            tracer_runnable_ns: self.tracer_ns,
            pauses: self.pauses,
            sync_overlap_ns: Some(self.sync_overlap),
            sync_host_p50_ns: Some({
                self.sync_host.sort_unstable();
                crate::stats::nearest_rank(&self.sync_host, 50).unwrap_or(0)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Culprit, WaitKind, Waker};

    const MS: u64 = 1_000_000;

    fn call(op: u16, ts: u64, dur: u64) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: dur,
            pid: 10,
            tid: 11,
            op,
            ..Default::default()
        }
    }

    fn blocked(off: u64, wake: u64, on: u64, waker: Option<Waker>) -> WaitEvent {
        WaitEvent {
            pid: 10,
            tid: 11,
            kind: WaitKind::Blocked,
            off_ns: off,
            wake_ns: wake,
            on_ns: on,
            prev_state: 1,
            cpu: 0,
            culprits: Vec::new(),
            waker,
        }
    }

    fn task(pid: u32, tid: u32, comm: &str) -> Option<Waker> {
        Some(Waker {
            pid,
            tid,
            comm: comm.into(),
            irq: false,
        })
    }

    fn data(calls: Vec<CallEvent>, waits: Vec<WaitEvent>) -> TraceData {
        TraceData {
            calls,
            waits,
            has_host_context: true,
            ..Default::default()
        }
    }

    #[test]
    fn the_split_adds_up_to_the_window_and_separates_inside_from_between() {
        // Window [0, 100ms): a sync [40, 50) blocked 8 ms inside, a copy [90, 100).
        let mut sync = call(14, 40 * MS, 10 * MS);
        sync.blocked_ns = 8 * MS;
        let calls = vec![call(1, 0, MS), sync, call(9, 90 * MS, 10 * MS)];
        let waits = vec![
            // Blocked 10..30 (between calls), woken by a loader; runnable 30..32.
            blocked(10 * MS, 30 * MS, 32 * MS, task(20, 21, "pt_data_worker")),
            // Inside the sync: not between-call time.
            blocked(41 * MS, 44 * MS, 44 * MS, None),
            // Straddles the end of the sync [50, 60): 5 ms of it are between.
            blocked(
                45 * MS,
                55 * MS,
                55 * MS,
                Some(Waker {
                    irq: true,
                    ..task(0, 0, "swapper/0").unwrap()
                }),
            ),
        ];
        let s = &thread_splits(&data(calls, waits))[0];
        assert_eq!((s.start_ns, s.end_ns, s.wall_ns), (0, 100 * MS, 100 * MS));
        assert_eq!(s.calls, 3);
        assert_eq!(s.in_calls.wall_ns(), 21 * MS);
        assert_eq!(s.between.blocked_ns, 20 * MS + 5 * MS);
        assert_eq!(s.between.runnable_ns, 2 * MS);
        assert_eq!(s.between.wall_ns(), 79 * MS);
        assert_eq!(s.between.on_cpu_ns, 79 * MS - 27 * MS);
        assert_eq!(s.wakers.len(), 2);
        assert_eq!(
            (
                s.wakers[0].kind,
                s.wakers[0].pid,
                s.wakers[0].comm.as_str(),
                s.wakers[0].blocked_ns
            ),
            (WakerKind::Task, 20, "pt_data_worker", 20 * MS)
        );
        assert!((s.wakers[0].share - 0.8).abs() < 1e-9);
        assert_eq!(s.wakers[1].kind, WakerKind::Interrupt);
        assert_eq!(s.blocked_by_tasks_ns(), 20 * MS);
        assert_eq!((s.syncs, s.sync_ns, s.sync_p50_ns), (1, 10 * MS, 10 * MS));
    }

    #[test]
    fn nested_calls_and_other_threads_do_not_count() {
        let mut nested = call(43, 5 * MS, 50 * MS); // would cover the gap if counted
        nested.nested = true;
        let mut other = call(1, 0, 100 * MS);
        other.tid = 12;
        let d = data(
            vec![call(1, 0, MS), nested, call(1, 99 * MS, MS), other],
            vec![],
        );
        let s = thread_splits(&d);
        assert_eq!(s.len(), 2);
        let mine = s.iter().find(|t| t.tid == 11).unwrap();
        assert_eq!(mine.in_calls.wall_ns(), 2 * MS);
        // No waits recorded between the calls: the thread was on the CPU.
        assert_eq!(mine.between.on_cpu_ns, 98 * MS);
    }

    /// Round 54's tester: a PyTorch allocator call and the `cudaMalloc`
    /// inside it (not flagged nested) counted twice, "inside calls 101%".
    #[test]
    fn calls_inside_calls_count_each_instant_once() {
        let mut outer = call(1, 0, 60 * MS);
        (outer.blocked_ns, outer.runnable_ns) = (30 * MS, 6 * MS);
        let mut inner = call(2, 10 * MS, 40 * MS); // inside the outer one
        inner.blocked_ns = 30 * MS;
        let mut tail = call(3, 50 * MS, 20 * MS); // its last 10 ms are new
        tail.runnable_ns = 10 * MS;
        let d = data(vec![outer, inner, tail, call(4, 99 * MS, MS)], vec![]);
        let s = &thread_splits(&d)[0];
        assert_eq!(s.calls, 4);
        assert_eq!(s.in_calls.wall_ns(), 71 * MS, "each instant once");
        assert!(s.share(s.in_calls.wall_ns()) <= 1.0);
        // The outer call's split whole, half of the tail's (its new half).
        assert_eq!(s.in_calls.blocked_ns, 30 * MS);
        assert_eq!(s.in_calls.runnable_ns, 6 * MS + 5 * MS);
        assert_eq!(s.in_calls.on_cpu_ns, 24 * MS + 5 * MS + MS);
        assert_eq!(s.between.wall_ns(), 29 * MS);
    }

    #[test]
    fn the_tracer_is_never_a_holder_and_its_time_is_counted_apart() {
        let calls = vec![call(1, 0, MS), call(1, 99 * MS, MS)];
        let mut w = blocked(10 * MS, 10 * MS, 20 * MS, None);
        w.kind = WaitKind::Preempted;
        w.culprits = vec![
            Culprit {
                pid: 7,
                tid: 7,
                comm: "gpusleuth-db".into(),
                ns: 4 * MS,
            },
            Culprit {
                pid: 8,
                tid: 8,
                comm: "hog".into(),
                ns: 6 * MS,
            },
        ];
        let s = &thread_splits(&data(calls, vec![w]))[0];
        assert_eq!(
            s.preempted_by,
            vec![HolderTime {
                pid: 8,
                comm: "hog".into(),
                runnable_ns: 6 * MS
            }]
        );
        assert_eq!(s.tracer_runnable_ns, 4 * MS);
        assert_eq!(s.between.runnable_ns, 10 * MS);
    }

    /// A stream told its window's end after the last call (a reader of a
    /// scope's calls learns it then) gives the split of one told beforehand,
    /// with waits straddling the window's end and one wholly after it.
    /// The longest stretch between two calls, with its waits' time and the
    /// waker of its longest wait; a crafted stored one never underflows.
    #[test]
    fn the_longest_pause_is_the_longest_stretch_between_two_calls() {
        let calls = vec![call(14, 0, MS), call(14, 5 * MS, MS), call(14, 50 * MS, MS)];
        let timer = Some(Waker {
            pid: 0,
            tid: 0,
            comm: "swapper/0".into(),
            irq: true,
        });
        let waits = vec![
            blocked(2 * MS, 3 * MS, 3 * MS, None),
            blocked(10 * MS, 20 * MS, 20 * MS, timer.clone()),
            blocked(20 * MS, 45 * MS, 45 * MS, timer),
        ];
        let t = &thread_splits(&data(calls, waits))[0];
        // Two stretches, longest first.
        let spans: Vec<(u64, u64)> = t.pauses.iter().map(|p| (p.start_ns, p.end_ns)).collect();
        assert_eq!(spans, vec![(6 * MS, 50 * MS), (MS, 5 * MS)]);
        assert_eq!(t.pauses[1].blocked_ns, MS);
        let p = t.pauses[0].clone();
        assert_eq!((p.start_ns, p.end_ns), (6 * MS, 50 * MS));
        assert_eq!(
            (p.blocked_ns, p.runnable_ns, p.host_ns()),
            (35 * MS, 0, 9 * MS)
        );
        // Its two waits' waker, once with both waits' time.
        let w: Vec<(WakerKind, u64)> = p.wakers.iter().map(|w| (w.kind, w.blocked_ns)).collect();
        assert_eq!(w, vec![(WakerKind::Interrupt, 35 * MS)]);
        assert_eq!(t.pauses[1].wakers[0].kind, WakerKind::Unknown);
        let crafted = Pause {
            start_ns: 10,
            end_ns: 5,
            blocked_ns: 1 << 62,
            runnable_ns: 1 << 62,
            wakers: Vec::new(),
            sync_overlap_ns: 1 << 62,
        };
        assert_eq!((crafted.wall_ns(), crafted.host_ns()), (0, 0));
    }

    #[test]
    fn a_window_closed_after_the_last_call_gives_the_same_split() {
        let calls = [call(1, 10 * MS, MS), call(14, 40 * MS, 20 * MS)];
        let mut preempted = blocked(20 * MS, 22 * MS, 30 * MS, None);
        preempted.culprits = vec![Culprit {
            pid: 8,
            tid: 8,
            comm: "hog".into(),
            ns: 8 * MS,
        }];
        let mut straddling = blocked(55 * MS, 58 * MS, 70 * MS, task(20, 21, "w"));
        straddling.culprits = preempted.culprits.clone();
        let waits = [
            blocked(MS, 5 * MS, 6 * MS, None),
            preempted,
            straddling,
            blocked(80 * MS, 90 * MS, 95 * MS, None),
        ];
        let run = |window: (u64, u64), close: Option<u64>| {
            let mut t = ThreadStream::new(10, 11, window, None);
            let mut ws = waits.iter().peekable();
            for c in &calls {
                while let Some(w) = ws.next_if(|w| w.on_ns <= c.ts_ns) {
                    t.add_wait(w);
                }
                t.add_call(c);
            }
            if let Some(end) = close {
                t.close_window(end);
            }
            ws.for_each(|w| t.add_wait(w));
            t.finish("p")
        };
        let known = run((10 * MS, 60 * MS), None);
        assert_eq!(run((10 * MS, u64::MAX), Some(60 * MS)), known);
        assert_eq!(known.wall_ns, 50 * MS);
        assert!(known.between.runnable_ns > 0 && known.between.blocked_ns > 0);
    }

    #[test]
    fn tracer_threads_are_recognised_by_name_or_pid() {
        assert!(is_tracer(1, "gpusleuth", None));
        assert!(is_tracer(1, "gpusleuth-db", None));
        assert!(is_tracer(42, "tokio-runtime-w", Some(42)));
        // Another gpusleuth process too (tracers run side by side).
        assert!(is_tracer(7, "gpusleuth-x", Some(42)));
        assert!(!is_tracer(1, "gpusleuthx", None));
        assert!(!is_tracer(1, "python3", Some(2)));
        let mut d = TraceData::default();
        d.stats.insert(TRACER_PID_STAT.into(), 42);
        assert_eq!(tracer_pid(&d), Some(42));
    }
}
