//! What the findings *aggregate*, kept apart from what they *conclude*.
//!
//! Every per-call finding (cpu_preemption, tail_latency, the bottleneck
//! verdicts, pageable_copy) reads only the accumulators below, which are fed
//! one call at a time; the thresholds, severities, texts and evidence are
//! pure functions of them (time.rs, bottleneck.rs, verdict.rs). The
//! in-memory path ([`FindingInputs::of`], for tests and for traces without
//! stored rollups) feeds them from the vectors of a `TraceData`; a stream of
//! calls (the writer's end-of-trace pass) can feed the same accumulators, so
//! there is one implementation of each finding.
//!
//! Feeding order, the only contract:
//! - [`FindingInputs::add_call`]: every non-nested call of a thread in start
//!   order (ties: their order in the trace), threads in any order, each call
//!   with its culprits and its index in the trace (the examples' tie-break);
//! - [`FindingInputs::add_in_end_order`]: every call of a process in end
//!   order (ties: index), for the pinned-memory replay of pageable_copy.
//!
//! Percentiles: [`Resolution::Exact`] keeps one histogram bucket per distinct
//! duration, so nearest-rank percentiles and the tail split (calls above p95)
//! are exact; [`Resolution::Bucketed`] uses the rollup histogram
//! (`rollup::bucket_of`): percentiles within `rollup::MAX_RELATIVE_ERROR`, the
//! tail split leaving out only calls within one bucket of p95.

use crate::decompose::{culprit_times, CulpritTime, Split, TailSplit};
use crate::event::{CallEvent, Culprit};
use crate::ops::OpClass;
use crate::rollup::{bucket_bounds, bucket_of, bucket_value, Bucket};
use crate::threads::{is_tracer, ThreadSplit};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

mod merge;
mod per_process;
pub use merge::{PinnedState, ResolutionMismatch};
pub use per_process::ProcessInputs;

/// How finely a [`LatencyHist`] keeps durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// One bucket per distinct duration: exact percentiles.
    Exact,
    /// The rollup histogram's buckets: bounded memory, documented error.
    Bucketed,
}

/// Durations of a group of calls with the split sums of each bucket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencyHist {
    res: Resolution,
    max_ns: u64,
    /// Stored as rows of their own (a histogram can outgrow one SQL value).
    #[serde(skip)]
    buckets: BTreeMap<u64, Bucket>,
}

impl LatencyHist {
    pub fn new(res: Resolution) -> LatencyHist {
        LatencyHist {
            res,
            max_ns: 0,
            buckets: BTreeMap::new(),
        }
    }

    fn key(&self, v: u64) -> u64 {
        match self.res {
            Resolution::Exact => v,
            Resolution::Bucketed => u64::from(bucket_of(v)),
        }
    }

    /// Smallest duration of a bucket, and the value a percentile landing in it reports.
    fn bounds(&self, k: u64) -> (u64, u64) {
        match self.res {
            Resolution::Exact => (k, k),
            Resolution::Bucketed => {
                let b = u32::try_from(k).unwrap_or(u32::MAX);
                let lo = bucket_bounds(b).0;
                (lo, bucket_value(b).min(self.max_ns).max(lo))
            }
        }
    }

    /// Adds another histogram of the same resolution and trace (bucket
    /// counts and splits add; the maximum is the larger).
    fn add_hist(&mut self, o: &LatencyHist) {
        debug_assert_eq!(self.res, o.res);
        self.max_ns = self.max_ns.max(o.max_ns);
        for (&k, b) in &o.buckets {
            let e = self.buckets.entry(k).or_default();
            e.count = e.count.saturating_add(b.count);
            e.split.add(b.split);
        }
    }

    /// One value with the split of the time it stands for.
    pub fn add(&mut self, v: u64, split: Split) {
        self.max_ns = self.max_ns.max(v);
        let b = self.buckets.entry(self.key(v)).or_default();
        b.count += 1;
        b.split.add(split);
    }

    /// The largest value added (0 when none).
    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    pub fn count(&self) -> u64 {
        // Saturating: stored counts are checked by their readers, but
        // merged files add theirs (`inputs::merge`).
        self.buckets
            .values()
            .fold(0u64, |n, b| n.saturating_add(b.count))
    }

    /// `(bucket key, calls, split)` of every bucket, ascending.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, Split)> + '_ {
        self.buckets.iter().map(|(&k, b)| (k, b.count, b.split))
    }

    /// Puts back a stored bucket.
    pub fn set_bucket(&mut self, key: u64, count: u64, split: Split) {
        self.buckets.insert(key, Bucket { count, split });
    }

    /// Nearest-rank percentile `p` (as `stats::nearest_rank`) and its bucket.
    fn percentile_at(&self, p: u32) -> Option<(u64, u64)> {
        self.at_rank(crate::stats::rank_of(p, self.count()))
    }

    /// Percentile `p`, or the value of the `k`-th slowest call where `p`'s
    /// rank is past it (too few calls for `p` to leave `k` calls at or
    /// above it), and whether it is `p`. Decided on ranks, so exact and
    /// bucketed durations decide alike.
    pub fn percentile_or_kth_slowest(&self, p: u32, k: u64) -> Option<(u64, bool)> {
        let n = self.count();
        let kth = n.saturating_add(1).saturating_sub(k);
        let rank = crate::stats::rank_of(p, n);
        let on_p = rank <= kth;
        let at = if on_p { rank } else { kth.max(1) };
        self.at_rank(at).map(|x| (x.0, on_p))
    }

    /// The value at ascending rank `rank` (1-based, at most the count) and its bucket.
    fn at_rank(&self, rank: u64) -> Option<(u64, u64)> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = rank.clamp(1, n);
        if rank == n {
            // The last rank is the maximum, kept exactly.
            return Some((self.max_ns, self.key(self.max_ns)));
        }
        let mut seen = 0u64;
        for (&k, b) in &self.buckets {
            seen = seen.saturating_add(b.count);
            if seen >= rank {
                return Some((self.bounds(k).1, k));
            }
        }
        None
    }

    pub fn percentile(&self, p: u32) -> Option<u64> {
        self.percentile_at(p).map(|x| x.0)
    }

    /// The calls strictly above percentile `p`: how many and their summed split.
    pub fn above(&self, p: u32) -> (u64, Split) {
        let mut n = 0u64;
        let mut s = Split::default();
        if let Some((pv, pk)) = self.percentile_at(p) {
            for (&k, b) in self.buckets.range(pk..) {
                if k > pk || self.bounds(k).0 > pv {
                    n = n.saturating_add(b.count);
                    s.add(b.split);
                }
            }
        }
        (n, s)
    }

    /// [`TailSplit`] of the calls at or above `v` (in its bucket or a
    /// slower one where durations are bucketed).
    pub fn tail_from(&self, v: u64) -> TailSplit {
        let mut calls = 0u64;
        let mut s = Split::default();
        for b in self.buckets.range(self.key(v)..).map(|(_, b)| b) {
            calls = calls.saturating_add(b.count);
            s.add(b.split);
        }
        tail_split(calls, s)
    }

    /// [`TailSplit`] of the calls above p95.
    pub fn tail(&self) -> TailSplit {
        let (calls, s) = self.above(95);
        tail_split(calls, s)
    }
}

/// One example call kept for a finding's evidence, with its first culprits.
/// Stored, an example is its index (the call's row id) only: the call and
/// its culprits are read back by id ([`FindingInputs::fill_examples`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Example {
    pub index: usize,
    #[serde(skip)]
    pub call: CallEvent,
    /// The tasks that held the CPU during it (at most two, largest first).
    #[serde(skip)]
    pub culprits: Vec<Culprit>,
}

/// Where a kept call ranks: largest key first, then smaller `order`, then index.
type Rank = (Reverse<u64>, u64, usize);

/// The `k` calls with the largest key (ties: smaller `order`, then index).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopK {
    k: usize,
    kept: Vec<(Rank, Example)>,
}

impl TopK {
    pub fn new(k: usize) -> TopK {
        TopK {
            k,
            kept: Vec::new(),
        }
    }

    /// Offers call `index`; `ex` builds its example only when it is kept.
    pub fn offer(&mut self, key: u64, order: u64, index: usize, ex: impl FnOnce() -> Example) {
        let rank = (Reverse(key), order, index);
        if self.kept.len() == self.k && self.kept.last().is_none_or(|l| l.0 <= rank) {
            return;
        }
        let at = self.kept.partition_point(|x| x.0 < rank);
        self.kept.insert(at, (rank, ex()));
        self.kept.truncate(self.k);
    }

    /// Keeps the `k` best ranks of both lists, of calls of one trace (row
    /// indexes compare): the list sequential offers of both would keep.
    fn add_same_trace(&mut self, o: &TopK) {
        for (rank, ex) in &o.kept {
            let (Reverse(key), order, index) = *rank;
            self.offer(key, order, index, || ex.clone());
        }
    }

    /// Largest key first.
    pub fn examples(&self) -> impl Iterator<Item = &Example> {
        self.kept.iter().map(|x| &x.1)
    }
}

/// What cpu_preemption and tail_latency aggregate about one op's calls
/// (non-nested, all processes).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpInputs {
    pub hist: LatencyHist,
    pub split: Split,
    pub pids: BTreeSet<u32>,
    /// Calls with runnable time, and their processes.
    pub slowed: u64,
    pub slowed_pids: BTreeSet<u32>,
    #[serde(with = "culprit_rows")]
    culprits: HashMap<(u32, String), u64>,
    /// Examples ranked by runnable time (cpu_preemption) and by wall time (tail_latency).
    pub by_runnable: TopK,
    pub by_dur: TopK,
}

impl OpInputs {
    fn new(res: Resolution) -> OpInputs {
        OpInputs {
            hist: LatencyHist::new(res),
            split: Split::default(),
            pids: BTreeSet::new(),
            slowed: 0,
            slowed_pids: BTreeSet::new(),
            culprits: HashMap::new(),
            by_runnable: TopK::new(super::EXAMPLE_CALLS),
            by_dur: TopK::new(super::EXAMPLE_CALLS),
        }
    }

    fn add(&mut self, index: usize, c: &CallEvent, culprits: &[Culprit]) {
        let s = Split::of(c);
        self.hist.add(c.dur_ns, s);
        self.split.add(s);
        self.pids.insert(c.pid);
        if s.runnable_ns > 0 {
            self.slowed += 1;
            self.slowed_pids.insert(c.pid);
        }
        for k in culprits {
            let e = self.culprits.entry((k.pid, k.comm.clone())).or_default();
            *e = e.saturating_add(k.ns);
        }
        let example = || Example {
            index,
            call: c.clone(),
            culprits: culprits.iter().take(2).cloned().collect(),
        };
        self.by_runnable.offer(s.runnable_ns, 0, index, example);
        self.by_dur.offer(c.dur_ns, 0, index, example);
    }

    pub fn count(&self) -> u64 {
        self.hist.count()
    }

    /// Adds the aggregates of other calls of the same trace (another
    /// process's calls of this op): as if they had been added here.
    fn add_same_trace(&mut self, o: &OpInputs) {
        self.hist.add_hist(&o.hist);
        self.add_sums(o);
        self.by_runnable.add_same_trace(&o.by_runnable);
        self.by_dur.add_same_trace(&o.by_dur);
    }

    /// Adds `o`'s sums, processes and culprit sums (not its histogram or
    /// examples, which a file boundary and one trace add differently).
    fn add_sums(&mut self, o: &OpInputs) {
        self.split.add(o.split);
        self.pids.extend(&o.pids);
        self.slowed = self.slowed.saturating_add(o.slowed);
        self.slowed_pids.extend(&o.slowed_pids);
        for (k, &ns) in &o.culprits {
            let e = self.culprits.entry(k.clone()).or_default();
            *e = e.saturating_add(ns);
        }
    }

    /// Culprits summed per task, largest first.
    pub fn culprits(&self) -> Vec<CulpritTime> {
        culprit_times(
            self.culprits
                .iter()
                .map(|((p, c), &n)| ((*p, c.as_str()), n)),
        )
    }
}

/// Culprit sums stored as `[pid, comm, ns]` rows.
mod culprit_rows {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        m: &HashMap<(u32, String), u64>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut rows: Vec<(u32, &str, u64)> =
            m.iter().map(|((p, c), &n)| (*p, c.as_str(), n)).collect();
        rows.sort_unstable();
        s.collect_seq(rows)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<HashMap<(u32, String), u64>, D::Error> {
        let rows: Vec<(u32, String, u64)> = Vec::deserialize(d)?;
        Ok(rows.into_iter().map(|(p, c, n)| ((p, c), n)).collect())
    }
}

/// Copies one thread made from pageable host memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PageableInputs {
    pub count: u64,
    pub bytes: u64,
    /// On-CPU time inside the copies: the host staging them.
    pub on_cpu: u64,
    /// Runnable time inside the copies: other tasks held the CPU (that is
    /// `cpu_preemption`'s, not staging; counted as staging until round 52,
    /// so a preempted copy was said twice). Absent from older files' stored
    /// inputs, whose `on_cpu` still holds it.
    #[serde(default)]
    pub runnable: u64,
    pub wall: u64,
    pub h2d: u64,
    pub d2h: u64,
    /// Copies of this thread that used pinned memory.
    pub pinned_copies: u64,
    /// Ranked by on-CPU time (ties: earlier end).
    pub examples: TopK,
}

impl Default for PageableInputs {
    fn default() -> Self {
        PageableInputs {
            count: 0,
            bytes: 0,
            on_cpu: 0,
            runnable: 0,
            wall: 0,
            h2d: 0,
            d2h: 0,
            pinned_copies: 0,
            examples: TopK::new(super::EXAMPLE_CALLS),
        }
    }
}

/// What the bottleneck verdicts aggregate about one issuing thread, beyond
/// its [`ThreadSplit`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThreadInputs {
    /// Recorded launch calls and their wall time and durations.
    pub launches: LatencyHist,
    pub launch_ns: u64,
    /// sync_stall's overlappable time by the rule before round 56 (over
    /// syncs, min(the whole stretch since the previous sync ended, the
    /// sync's wall time less its runnable time)): read only from traces
    /// stored then, whose thread splits carry none of their own
    /// ([`crate::threads::ThreadSplit::sync_overlap_ns`]); 0 since.
    #[serde(default)]
    pub overlap_ns: u64,
    /// The host stretches between syncs (from the previous sync's end, or
    /// the window start, to the sync's start): the longest says whether
    /// the syncs sampled the whole window.
    pub host_gaps: LatencyHist,
    /// End of the previous sync (or the window start).
    #[serde(skip)]
    prev_end: Option<u64>,
    pub pageable: PageableInputs,
}

impl ThreadInputs {
    fn new(res: Resolution) -> ThreadInputs {
        ThreadInputs {
            launches: LatencyHist::new(res),
            launch_ns: 0,
            overlap_ns: 0,
            host_gaps: LatencyHist::new(res),
            prev_end: None,
            pageable: PageableInputs::default(),
        }
    }

    /// A non-nested call of the thread, in start order.
    fn add(&mut self, c: &CallEvent) {
        // The first call starts the window: host time before the first sync counts from there.
        let prev = *self.prev_end.get_or_insert(c.ts_ns);
        match c.info().map(|o| o.class) {
            Some(OpClass::Launch) => {
                self.launches.add(c.dur_ns, Split::default());
                self.launch_ns += c.dur_ns;
            }
            Some(OpClass::Sync) => {
                let h = c.ts_ns.saturating_sub(prev);
                self.host_gaps.add(h, Split::default());
                self.prev_end = Some(c.end_ns());
            }
            _ => {}
        }
    }
}

/// Pinned host ranges of one process, as replayed up to a moment.
#[derive(Debug, Default, Clone)]
struct PinnedRanges {
    /// start -> end (exclusive)
    live: BTreeMap<u64, u64>,
}

impl PinnedRanges {
    fn contains(&self, p: u64) -> bool {
        self.live
            .range(..=p)
            .next_back()
            .is_some_and(|(_, &end)| p < end)
    }
}

/// Everything the per-call findings aggregate over a trace.
#[derive(Debug)]
pub struct FindingInputs {
    res: Resolution,
    tracer: Option<u32>,
    /// Per op id, ascending (a stable order).
    pub ops: BTreeMap<u16, OpInputs>,
    pub threads: HashMap<(u32, u32), ThreadInputs>,
    /// First call start and last call end of each process (non-nested calls).
    pub spans: HashMap<u32, (u64, u64)>,
    /// Every calling thread's whole-thread split, largest window first.
    pub splits: Vec<ThreadSplit>,
    /// `ops` of each process apart, when kept ([`FindingInputs::keep_process_ops`]):
    /// the writer stores them so that one process is explained without
    /// reading its calls (`explain --pid`). Keyed by (pid, op id).
    pub process_ops: Option<BTreeMap<(u32, u16), OpInputs>>,
    /// Calls go to `process_ops` only, and `ops` is their merge, made by
    /// [`FindingInputs::settle`] ([`FindingInputs::whole_from_processes`]).
    whole_from_processes: bool,
    pinned: HashMap<u32, PinnedRanges>,
}

impl FindingInputs {
    pub fn new(res: Resolution, tracer: Option<u32>) -> FindingInputs {
        FindingInputs {
            res,
            tracer,
            ops: BTreeMap::new(),
            threads: HashMap::new(),
            spans: HashMap::new(),
            splits: Vec::new(),
            process_ops: None,
            whole_from_processes: false,
            pinned: HashMap::new(),
        }
    }

    /// [`FindingInputs::keep_process_ops`], with each call added to its
    /// process's op only: the whole trace's `ops` are empty until
    /// [`FindingInputs::settle`] merges them from the processes' (the same
    /// aggregates: sums, sets and histograms add up, the kept examples are
    /// the best ranks of both, compared by row index as in one trace). The
    /// writer's end-of-trace pass feeds every call this way: each call's
    /// histogram, sums and examples are updated once, not twice (a
    /// histogram update is a cache miss, most of `OpInputs::add`).
    pub fn whole_from_processes(self) -> FindingInputs {
        FindingInputs {
            whole_from_processes: true,
            ..self.keep_process_ops()
        }
    }

    /// Makes the whole trace's `ops` from the processes' when
    /// [`FindingInputs::whole_from_processes`] left them out; nothing
    /// otherwise. Call it once every call is in, before reading `ops`.
    pub fn settle(&mut self) {
        if !std::mem::take(&mut self.whole_from_processes) {
            return;
        }
        let res = self.res;
        for (&(_, op), o) in self.process_ops.iter().flatten() {
            self.ops
                .entry(op)
                .or_insert_with(|| OpInputs::new(res))
                .add_same_trace(o);
        }
    }

    /// Also aggregates each process's ops apart (`process_ops`): every
    /// other aggregate is already per thread or per process.
    pub fn keep_process_ops(mut self) -> FindingInputs {
        self.process_ops = Some(BTreeMap::new());
        self
    }

    /// Aggregates read back from storage (`splits`: the stored thread splits).
    pub fn from_parts(
        tracer: Option<u32>,
        ops: BTreeMap<u16, OpInputs>,
        threads: HashMap<(u32, u32), ThreadInputs>,
        spans: HashMap<u32, (u64, u64)>,
        mut splits: Vec<ThreadSplit>,
    ) -> FindingInputs {
        crate::threads::sort_splits(&mut splits);
        FindingInputs {
            res: Resolution::Bucketed,
            tracer,
            ops,
            threads,
            spans,
            splits,
            process_ops: None,
            whole_from_processes: false,
            pinned: HashMap::new(),
        }
    }

    /// The in-memory path: every call and wait of `data`, with the per-call
    /// culprits aligned with `data.calls` (may be shorter: none then).
    pub fn of(data: &crate::TraceData, per_call_culprits: &[Vec<Culprit>]) -> FindingInputs {
        Self::of_pinned(data, per_call_culprits, PinnedState::default(), &[])
    }

    /// [`Self::of`] of a scope (a window, an op) with the host ranges
    /// `pinned` live before `data`'s calls, and `pinning`: pinning calls
    /// outside the scope (other ops') replayed in end order with its calls,
    /// for the pinned ranges alone. A copy in the scope is then judged
    /// pinned where the whole trace judges it so.
    pub fn of_pinned(
        data: &crate::TraceData,
        per_call_culprits: &[Vec<Culprit>],
        pinned: PinnedState,
        pinning: &[CallEvent],
    ) -> FindingInputs {
        Self::of_pinned_at(Resolution::Exact, data, per_call_culprits, pinned, pinning)
    }

    /// [`Self::of_pinned`] with histograms of resolution `res`: bucketed
    /// to be added to the aggregates the store streams (a window over the
    /// files of a run, one of them loaded).
    pub fn of_pinned_at(
        res: Resolution,
        data: &crate::TraceData,
        per_call_culprits: &[Vec<Culprit>],
        pinned: PinnedState,
        pinning: &[CallEvent],
    ) -> FindingInputs {
        let mut f = FindingInputs::new(res, crate::threads::tracer_pid(data)).with_pinned(pinned);
        let splits = crate::threads::stream_threads(data, |i, c| {
            f.add_call(i, c, crate::decompose::culprits_of(per_call_culprits, i))
        });
        f.splits = splits;
        // The scope's calls by end (ties in their order, as ever) and the
        // outside pinning calls before those ending with them; an outside
        // call makes no example.
        let mut order: Vec<(u64, bool, usize)> = (0..data.calls.len())
            .map(|i| (data.calls[i].end_ns(), false, i))
            .chain(
                pinning
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.end_ns(), true, i)),
            )
            .collect();
        order.sort_by_key(|&(end, outside, i)| (end, !outside, i));
        for (_, outside, i) in order {
            match outside {
                false => f.add_in_end_order(i, &data.calls[i]),
                true => f.add_in_end_order(usize::MAX, &pinning[i]),
            }
        }
        f
    }

    /// A non-nested call (see the module's feeding order); gpusleuth's own
    /// threads are dropped from its culprits: they are never culprits.
    pub fn add_call(&mut self, index: usize, c: &CallEvent, culprits: &[Culprit]) {
        let mine: Vec<Culprit> = culprits
            .iter()
            .filter(|k| !is_tracer(k.pid, &k.comm, self.tracer))
            .cloned()
            .collect();
        let res = self.res;
        if !self.whole_from_processes {
            self.ops
                .entry(c.op)
                .or_insert_with(|| OpInputs::new(res))
                .add(index, c, &mine);
        }
        if let Some(p) = &mut self.process_ops {
            p.entry((c.pid, c.op))
                .or_insert_with(|| OpInputs::new(res))
                .add(index, c, &mine);
        }
        self.add_thread_call(c);
    }

    /// The part of [`FindingInputs::add_call`] that is its thread's and its
    /// process's (not the op aggregates'): what the writer keeps apart for
    /// each op's scope, whose op aggregates are the trace's own.
    pub fn add_thread_call(&mut self, c: &CallEvent) {
        let res = self.res;
        self.threads
            .entry((c.pid, c.tid))
            .or_insert_with(|| ThreadInputs::new(res))
            .add(c);
        let (s, e) = self.spans.entry(c.pid).or_insert((c.ts_ns, c.end_ns()));
        *s = (*s).min(c.ts_ns);
        *e = (*e).max(c.end_ns());
    }

    /// Any call (nested ones are skipped), in its process's end order.
    pub fn add_in_end_order(&mut self, index: usize, c: &CallEvent) {
        let Some(info) = c.info() else { return };
        if c.nested || c.failed() {
            return;
        }
        let r = self.pinned.entry(c.pid).or_default();
        match info.class {
            OpClass::HostAlloc | OpClass::HostRegister => {
                if let (Some(p), Some(n)) = (c.ptr, c.size) {
                    r.live.insert(p, p.saturating_add(n));
                }
            }
            OpClass::HostFree | OpClass::HostUnregister => {
                if let Some(p) = c.ptr {
                    r.live.remove(&p);
                }
            }
            OpClass::Copy => {
                let Some(hp) = c.host_ptr else { return };
                let pinned = r.contains(hp);
                let res = self.res;
                let a = &mut self
                    .threads
                    .entry((c.pid, c.tid))
                    .or_insert_with(|| ThreadInputs::new(res))
                    .pageable;
                if pinned {
                    a.pinned_copies += 1;
                    return;
                }
                a.count += 1;
                a.bytes += c.size.unwrap_or(0);
                a.on_cpu += c.on_cpu_ns();
                a.runnable += c.runnable_ns;
                a.wall += c.dur_ns;
                if crate::ops::host_ptr_arg(info, c.kind) == Some(1) {
                    a.h2d += 1;
                } else {
                    a.d2h += 1;
                }
                a.examples
                    .offer(c.on_cpu_ns(), c.end_ns(), index, || Example {
                        index,
                        call: c.clone(),
                        culprits: Vec::new(),
                    });
            }
            _ => {}
        }
    }

    /// Every example's index (row id), for reading the calls back.
    pub fn example_indices(&self) -> BTreeSet<usize> {
        self.tops()
            .flat_map(|t| t.kept.iter().map(|x| x.1.index))
            .collect()
    }

    /// Puts back each example's call and culprits (first two, gpusleuth's
    /// own threads left out) after the aggregates were read from storage.
    pub fn fill_examples(
        &mut self,
        mut call: impl FnMut(usize) -> Option<(CallEvent, Vec<Culprit>)>,
    ) {
        let tracer = self.tracer;
        for t in self.tops_mut() {
            for (_, e) in &mut t.kept {
                if let Some((c, k)) = call(e.index) {
                    e.call = c;
                    e.culprits = k
                        .into_iter()
                        .filter(|k| !is_tracer(k.pid, &k.comm, tracer))
                        .take(2)
                        .collect();
                }
            }
        }
    }

    /// Sets each example call's site (`site(index)`: its stack id), for
    /// aggregates fed by calls read without it (the scoped explanation's
    /// stream).
    pub fn set_example_sites(&mut self, mut site: impl FnMut(usize) -> Option<u64>) {
        for t in self.tops_mut() {
            for (_, e) in &mut t.kept {
                e.call.stack_id = site(e.index);
            }
        }
    }

    /// Every kept example list: the ops' two and each thread's pageable copies'.
    fn tops_mut(&mut self) -> impl Iterator<Item = &mut TopK> {
        self.ops
            .values_mut()
            .flat_map(|o| [&mut o.by_runnable, &mut o.by_dur])
            .chain(self.threads.values_mut().map(|t| &mut t.pageable.examples))
    }

    fn tops(&self) -> impl Iterator<Item = &TopK> {
        self.ops
            .values()
            .flat_map(|o| [&o.by_runnable, &o.by_dur])
            .chain(self.threads.values().map(|t| &t.pageable.examples))
    }

    /// First call start to last call end of one process ((0, 0) without calls).
    pub fn cuda_span(&self, pid: u32) -> (u64, u64) {
        self.spans.get(&pid).copied().unwrap_or((0, 0))
    }
}

/// The shares of `calls` calls whose summed split is `s`.
fn tail_split(calls: u64, s: Split) -> TailSplit {
    let (on_cpu_share, runnable_share, blocked_share) = s.shares();
    TailSplit {
        calls,
        on_cpu_share,
        runnable_share,
        blocked_share,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::nearest_rank;

    #[test]
    fn exact_histogram_matches_nearest_rank_and_the_tail_filter() {
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d);
        let mut h = LatencyHist::new(Resolution::Exact);
        let mut durs = Vec::new();
        let mut calls = Vec::new();
        for _ in 0..500 {
            let seed = next();
            let c = CallEvent {
                dur_ns: seed % 5000,
                runnable_ns: (seed >> 20) % 300,
                blocked_ns: (seed >> 40) % 300,
                ..Default::default()
            };
            h.add(c.dur_ns, Split::of(&c));
            durs.push(c.dur_ns);
            calls.push(c);
        }
        durs.sort_unstable();
        for p in [1, 50, 95, 99, 100] {
            assert_eq!(h.percentile(p), nearest_rank(&durs, p), "p{p}");
        }
        let p95 = nearest_rank(&durs, 95).unwrap_or(0);
        assert_eq!(h.tail(), TailSplit::of(&calls, p95));
    }

    #[test]
    fn bucketed_percentiles_stay_within_the_documented_bound() {
        let mut h = LatencyHist::new(Resolution::Bucketed);
        let durs: Vec<u64> = (1..=1000u64).map(|i| i * 7919).collect();
        for &d in &durs {
            h.add(d, Split::default());
        }
        for p in [50, 95, 99] {
            let exact = nearest_rank(&durs, p).unwrap_or(0) as f64;
            let got = h.percentile(p).unwrap_or(0) as f64;
            assert!((got - exact).abs() / exact <= crate::rollup::MAX_RELATIVE_ERROR);
        }
        assert_eq!(h.percentile(100), durs.last().copied());
    }

    /// What `keep_process_ops` keeps of one process is what the same calls
    /// fed alone give: the writer stores it for `explain --pid`.
    #[test]
    fn process_ops_equal_each_process_fed_alone() {
        let ops = ["cudaMemcpy", "cudaLaunchKernel", "cudaMalloc"];
        let calls = crate::testing::noisy_calls(0x9e37_79b9_7f4a_7c15, 300, &ops, 1);
        let mut all = FindingInputs::new(Resolution::Bucketed, None).keep_process_ops();
        for (i, (c, k)) in calls.iter().enumerate() {
            all.add_call(i, c, k);
        }
        let kept = all.process_ops.as_ref().unwrap();
        let view = |o: &OpInputs| {
            let buckets: Vec<(u64, u64, Split)> = o.hist.buckets().collect();
            (serde_json::to_string(o).unwrap(), buckets, o.culprits())
        };
        for pid in [7, 9] {
            let mut alone = FindingInputs::new(Resolution::Bucketed, None);
            for (i, (c, k)) in calls.iter().enumerate().filter(|(_, (c, _))| c.pid == pid) {
                alone.add_call(i, c, k);
            }
            assert!(alone.process_ops.is_none());
            let mine: Vec<u16> = kept.keys().filter(|k| k.0 == pid).map(|k| k.1).collect();
            assert_eq!(
                mine,
                alone.ops.keys().copied().collect::<Vec<_>>(),
                "pid {pid}"
            );
            for (op, o) in &alone.ops {
                assert_eq!(view(&kept[&(pid, *op)]), view(o), "pid {pid} op {op}");
            }
        }
        // The whole trace's aggregates are unchanged by keeping the processes'.
        let mut plain = FindingInputs::new(Resolution::Bucketed, None);
        for (i, (c, k)) in calls.iter().enumerate() {
            plain.add_call(i, c, k);
        }
        for (op, o) in &plain.ops {
            assert_eq!(view(&all.ops[op]), view(o), "op {op}");
        }
    }

    /// The writer's mode (each call into its process's ops only, the whole
    /// trace's merged from them once every call is in) gives what adding
    /// every call to both gives: the same JSON, buckets and culprits, ties
    /// between the processes' examples broken by row index as one list
    /// breaks them.
    #[test]
    fn whole_trace_ops_merged_from_the_processes_equal_the_ops_fed_call_by_call() {
        let ops = ["cudaMemcpy", "cudaLaunchKernel", "cudaMalloc"];
        let mut calls = crate::testing::noisy_calls(0x2545_f491_4f6c_dd1d, 300, &ops, 1);
        // Ties across processes: the same durations and runnable times in
        // pid 9 as the slowest calls of pid 7, at later and earlier indexes.
        let mut slow: Vec<_> = calls.iter().filter(|(c, _)| c.pid == 7).cloned().collect();
        slow.sort_by_key(|(c, _)| std::cmp::Reverse(c.dur_ns));
        for (n, (c, k)) in slow.into_iter().take(4).enumerate() {
            let mut twin = c.clone();
            twin.pid = 9;
            twin.tid = 9;
            if n % 2 == 0 {
                calls.push((twin, k));
            } else {
                calls.insert(0, (twin, k));
            }
        }
        let feed = |mut f: FindingInputs| {
            for (i, (c, k)) in calls.iter().enumerate() {
                f.add_call(i, c, k);
            }
            f
        };
        let both = feed(FindingInputs::new(Resolution::Bucketed, None).keep_process_ops());
        let mut merged =
            feed(FindingInputs::new(Resolution::Bucketed, None).whole_from_processes());
        assert!(
            merged.ops.is_empty(),
            "the whole trace's ops wait for settle"
        );
        merged.settle();
        let view = |o: &OpInputs| {
            let buckets: Vec<(u64, u64, Split)> = o.hist.buckets().collect();
            (serde_json::to_string(o).unwrap(), buckets, o.culprits())
        };
        assert_eq!(
            both.ops.keys().collect::<Vec<_>>(),
            merged.ops.keys().collect::<Vec<_>>()
        );
        for (op, o) in &both.ops {
            assert_eq!(view(&merged.ops[op]), view(o), "op {op}");
        }
        let (bp, mp) = (
            both.process_ops.unwrap(),
            merged.process_ops.as_ref().unwrap(),
        );
        assert_eq!(bp.keys().collect::<Vec<_>>(), mp.keys().collect::<Vec<_>>());
        for (key, o) in &bp {
            assert_eq!(view(&mp[key]), view(o), "{key:?}");
        }
        // Settling twice adds nothing twice.
        merged.settle();
        for (op, o) in &both.ops {
            assert_eq!(view(&merged.ops[op]), view(o), "op {op}");
        }
    }

    #[test]
    fn top_k_keeps_the_largest_keys_and_breaks_ties_by_order_then_index() {
        let mut t = TopK::new(2);
        for (i, (key, order)) in [(5, 0), (9, 3), (9, 1), (7, 0), (9, 1)]
            .into_iter()
            .enumerate()
        {
            t.offer(key, order, i, || Example {
                index: i,
                call: CallEvent::default(),
                culprits: Vec::new(),
            });
        }
        let kept: Vec<usize> = t.examples().map(|e| e.index).collect();
        assert_eq!(kept, vec![2, 4]);
    }
}
