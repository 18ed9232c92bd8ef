//! Per-op rollups kept while a trace is written, so `stats` (and the
//! end-of-trace summary) answer from a few thousand rows instead of loading
//! every call.
//!
//! Each (process, op) keeps exact counts, error counts, totals, the exact
//! maximum and the on-CPU / runnable / blocked sums, plus a latency histogram
//! whose buckets also carry the split sums (for the tail split above p95).
//!
//! Histogram: durations below [`EXACT_BELOW`] ns have one bucket each (exact);
//! above, every power of two is cut into 1024 equal buckets, so a bucket spans
//! at most 1/1024 of its lower bound and its midpoint is within
//! [`MAX_RELATIVE_ERROR`] (1/2048 ≈ 0.049%, under the 0.1% the docs promise)
//! of every duration in it. Percentiles are nearest-rank over the buckets,
//! never above the exact maximum. The tail split counts the calls in buckets
//! above the p95 bucket: exact below [`EXACT_BELOW`], and above it leaves out
//! only calls within one bucket (≤ 0.1%) of p95.

use crate::data::TraceData;
use crate::decompose::{culprit_times, CulpritTime, Split, TailSplit};
use crate::event::CallEvent;
use crate::int_hash::IntHashState;
use crate::ops::op_by_id;
use crate::stats::{Measured, OpStats, StatsReport, TOP_CULPRITS_PER_OP};
use crate::threads::{sort_splits, ThreadSplit};
use std::collections::{BTreeMap, HashMap};

/// Durations below this many ns are counted exactly (one bucket per value).
pub const EXACT_BELOW: u64 = 2048;
const SUB_BITS: u32 = 10;
const EXACT_BITS: u32 = 11; // log2(EXACT_BELOW)
/// Largest relative error of a percentile taken from the histogram.
pub const MAX_RELATIVE_ERROR: f64 = 1.0 / 2048.0;

/// The histogram bucket of a duration.
pub fn bucket_of(v: u64) -> u32 {
    if v < EXACT_BELOW {
        return v as u32;
    }
    let e = 63 - v.leading_zeros(); // >= EXACT_BITS
    let sub = (v >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    EXACT_BELOW as u32 + ((e - EXACT_BITS) << SUB_BITS) + sub as u32
}

/// Smallest and largest duration of a bucket (inclusive). Buckets past the
/// last one a u64 can reach are clamped to u64::MAX.
pub fn bucket_bounds(b: u32) -> (u64, u64) {
    if u64::from(b) < EXACT_BELOW {
        return (u64::from(b), u64::from(b));
    }
    let k = b - EXACT_BELOW as u32;
    let e = EXACT_BITS + (k >> SUB_BITS);
    if e > 63 {
        return (u64::MAX, u64::MAX);
    }
    let sub = u64::from(k & ((1 << SUB_BITS) - 1));
    let width = 1u64 << (e - SUB_BITS);
    let lo = (1u64 << e) | (sub << (e - SUB_BITS));
    (lo, lo.saturating_add(width - 1))
}

/// The value reported for a bucket: its midpoint (exact buckets: the value).
pub fn bucket_value(b: u32) -> u64 {
    let (lo, hi) = bucket_bounds(b);
    lo + (hi - lo) / 2
}

/// One histogram bucket: calls and the sum of their splits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    pub count: u64,
    pub split: Split,
}

/// Everything `stats` needs about one (process, op), kept call by call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpRollup {
    pub count: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub split: Split,
    pub buckets: Buckets,
}

/// A histogram's buckets by index. Hashed: the writer adds every stored
/// call to one, and a `BTreeMap`'s search was 11% of its CPU per event
/// (a profile of `bench --footprint-only`, round 11); readers that need
/// the index order sort the few hundred keys ([`Buckets::sorted`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Buckets(HashMap<u32, Bucket, IntHashState>);

impl Buckets {
    /// Bucket `k`, added empty if absent.
    pub fn get_or_default(&mut self, k: u32) -> &mut Bucket {
        self.0.entry(k).or_default()
    }

    /// Sets bucket `k` (a stored histogram's row).
    pub fn insert(&mut self, k: u32, b: Bucket) {
        self.0.insert(k, b);
    }

    /// Every bucket, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Bucket)> {
        self.0.iter().map(|(&k, b)| (k, b))
    }

    /// Every bucket in index order (shortest durations first).
    pub fn sorted(&self) -> Vec<(u32, Bucket)> {
        let mut v: Vec<(u32, Bucket)> = self.0.iter().map(|(&k, &b)| (k, b)).collect();
        v.sort_unstable_by_key(|&(k, _)| k);
        v
    }

    /// Calls in all buckets (saturating: a stored histogram may hold anything).
    pub fn count(&self) -> u64 {
        self.0.values().fold(0u64, |n, b| n.saturating_add(b.count))
    }
}

impl OpRollup {
    pub fn add(&mut self, c: &CallEvent) {
        self.count += 1;
        self.errors += u64::from(c.failed());
        self.total_ns = self.total_ns.saturating_add(c.dur_ns);
        self.max_ns = self.max_ns.max(c.dur_ns);
        let s = Split::of(c);
        self.split.add(s);
        let b = self.buckets.get_or_default(bucket_of(c.dur_ns));
        b.count += 1;
        b.split.add(s);
    }

    /// Adds another rollup of the same op (another process's).
    pub fn merge(&mut self, o: &OpRollup) {
        self.count = self.count.saturating_add(o.count);
        self.errors = self.errors.saturating_add(o.errors);
        self.total_ns = self.total_ns.saturating_add(o.total_ns);
        self.max_ns = self.max_ns.max(o.max_ns);
        self.split.add(o.split);
        for (k, b) in o.buckets.iter() {
            let e = self.buckets.get_or_default(k);
            e.count = e.count.saturating_add(b.count);
            e.split.add(b.split);
        }
    }

    /// Nearest-rank percentile `p` and the bucket it fell in.
    fn percentile(&self, p: u32) -> Option<(u64, u32)> {
        self.percentile_in(&self.buckets.sorted(), p)
    }

    /// [`Self::percentile`] over `sorted` (this rollup's [`Buckets::sorted`]:
    /// one sort for the several percentiles of a stats row).
    fn percentile_in(&self, sorted: &[(u32, Bucket)], p: u32) -> Option<(u64, u32)> {
        self.at_rank_in(sorted, crate::stats::rank_of(p, sorted_count(sorted)))
    }

    /// Nearest-rank percentile `p` (1..=100) as `stats::nearest_rank` gives
    /// it over the sorted durations, within [`MAX_RELATIVE_ERROR`]; the
    /// 100th is the exact maximum. None without calls.
    pub fn percentile_ns(&self, p: u32) -> Option<u64> {
        self.percentile(p).map(|x| x.0)
    }

    /// The fastest call's duration, within [`MAX_RELATIVE_ERROR`] (exact
    /// below [`EXACT_BELOW`] and for a single call). None without calls.
    pub fn min_ns(&self) -> Option<u64> {
        self.at_rank_in(&self.buckets.sorted(), 1).map(|x| x.0)
    }

    /// The duration of the `rank`-th fastest call (1-based) and its bucket,
    /// over `sorted` (this rollup's [`Buckets::sorted`]).
    fn at_rank_in(&self, sorted: &[(u32, Bucket)], rank: u64) -> Option<(u64, u32)> {
        let n = sorted_count(sorted);
        if n == 0 || rank == 0 {
            return None;
        }
        if rank >= n {
            // The last rank is the maximum, which is kept exactly.
            return Some((self.max_ns, bucket_of(self.max_ns)));
        }
        let mut seen = 0u64;
        for &(k, ref b) in sorted {
            seen = seen.saturating_add(b.count);
            if seen >= rank {
                let (lo, _) = bucket_bounds(k);
                return Some((bucket_value(k).min(self.max_ns).max(lo), k));
            }
        }
        None
    }
}

/// Calls in a sorted histogram (saturating).
fn sorted_count(sorted: &[(u32, Bucket)]) -> u64 {
    sorted
        .iter()
        .fold(0u64, |n, (_, b)| n.saturating_add(b.count))
}

/// What the writer keeps of a trace's calls while it writes them: each
/// calling thread's windows, for the per-thread pass at the end. The
/// per-(pid, op) rollups ([`OpRollup`]) are made by that pass, one process
/// at a time, from the same read of every call: kept here, they held every
/// process's histograms to the end of the file (~5.7 KB for a short-lived
/// process of six ops, issue 16 round 46).
#[derive(Debug, Clone, Default)]
pub struct Rollup {
    pub threads: BTreeMap<(u32, u32), ThreadWindows>,
}

/// A thread's window (first start, last end of its non-nested calls; None
/// with nested calls only) and within it each op's (the same of its
/// non-nested calls of that op). A split clamps waits to its window, so the
/// pass at the end needs them before it reads the waits.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ThreadWindows {
    /// The earliest start of any of its calls (nested ones too): a process
    /// seen only through its calls starts there.
    pub first_ns: Option<u64>,
    pub whole: Option<(u64, u64)>,
    /// By op id, in the order first seen (a thread calls a few ops).
    pub ops: Vec<(u16, (u64, u64))>,
}

impl ThreadWindows {
    /// Adds the windows of more calls of the same thread (kept apart: a
    /// process's windows set aside at its exit, and calls of its pid after).
    pub fn merge(&mut self, o: &ThreadWindows) {
        self.first_ns = match (self.first_ns, o.first_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some((s, e)) = o.whole {
            widen(self.whole.get_or_insert((s, e)), s, e);
        }
        for &(op, (s, e)) in &o.ops {
            match self.ops.iter_mut().find(|(mine, _)| *mine == op) {
                Some((_, w)) => widen(w, s, e),
                None => self.ops.push((op, (s, e))),
            }
        }
    }
}

impl Rollup {
    /// Takes the windows of process `pid`'s threads out (the writer sets
    /// them aside at the process's exit, so it holds the windows of the
    /// processes alive, not of every process the trace saw).
    pub fn take_process(&mut self, pid: u32) -> Vec<((u32, u32), ThreadWindows)> {
        take_range(&mut self.threads, (pid, 0)..=(pid, u32::MAX))
    }

    pub fn add_call(&mut self, c: &CallEvent) {
        let w = self.threads.entry((c.pid, c.tid)).or_default();
        w.first_ns = Some(w.first_ns.map_or(c.ts_ns, |f| f.min(c.ts_ns)));
        if !c.nested {
            let (s, e) = (c.ts_ns, c.end_ns());
            widen(w.whole.get_or_insert((s, e)), s, e);
            match w.ops.iter_mut().find(|(op, _)| *op == c.op) {
                Some((_, ow)) => widen(ow, s, e),
                None => w.ops.push((c.op, (s, e))),
            }
        }
    }
}

/// Takes the entries of `range` out of `m`, in key order: one process's
/// entries of a map keyed by (pid, ...), each removed by its key (a
/// `split_off` and `append` would move every entry after them).
pub(crate) fn take_range<K: Ord + Copy, V>(
    m: &mut BTreeMap<K, V>,
    range: std::ops::RangeInclusive<K>,
) -> Vec<(K, V)> {
    let keys: Vec<K> = m.range(range).map(|(&k, _)| k).collect();
    keys.into_iter()
        .filter_map(|k| m.remove(&k).map(|v| (k, v)))
        .collect()
}

/// Widens window `w` (first start, last end) to cover `[s, e)`.
fn widen(w: &mut (u64, u64), s: u64, e: u64) {
    w.0 = w.0.min(s);
    w.1 = w.1.max(e);
}

/// One stats row from an op's rollup, as `stats::compute` would give it
/// from the raw calls (percentiles within [`MAX_RELATIVE_ERROR`]).
pub fn op_stats_row(
    op: u16,
    r: &OpRollup,
    mut culprits: Vec<CulpritTime>,
    also_counted: Option<u64>,
    host_context: bool,
) -> Option<OpStats> {
    let info = op_by_id(op)?;
    let known = |v: u64| host_context.then_some(v);
    let sorted = r.buckets.sorted();
    let p95 = r.percentile_in(&sorted, 95);
    culprits.truncate(TOP_CULPRITS_PER_OP);
    let tail = host_context.then(|| {
        let mut s = Split::default();
        let mut n = 0u64;
        if let Some((p95_ns, pb)) = p95 {
            for &(k, b) in sorted.iter().filter(|&&(k, _)| k >= pb) {
                // Exact buckets hold one value: the p95 bucket itself is not above p95.
                let above = if k == pb {
                    bucket_bounds(k).0 > p95_ns
                } else {
                    true
                };
                if above {
                    n = n.saturating_add(b.count);
                    s.add(b.split);
                }
            }
        }
        let (on_cpu_share, runnable_share, blocked_share) = s.shares();
        TailSplit {
            calls: n,
            on_cpu_share,
            runnable_share,
            blocked_share,
        }
    });
    Some(OpStats {
        layer: info.layer,
        op: info.name,
        count: r.count + also_counted.unwrap_or(0),
        errors: info.returns_status.then_some(r.errors),
        p50_ns: r.percentile_in(&sorted, 50).map(|x| x.0),
        p95_ns: p95.map(|x| x.0),
        p99_ns: r.percentile_in(&sorted, 99).map(|x| x.0),
        max_ns: (r.count > 0).then_some(r.max_ns),
        total_ns: Some(r.total_ns),
        on_cpu_ns: known(r.split.on_cpu_ns),
        runnable_ns: known(r.split.runnable_ns),
        blocked_ns: known(r.split.blocked_ns),
        tail,
        measured: Measured::PerCall,
        culprits,
        also_counted,
    })
}

/// Rollups as stored in a trace: per (pid, op id), culprit sums per
/// (pid, op id), and every calling thread's split.
#[derive(Debug, Clone, Default)]
pub struct StoredRollups {
    pub ops: Vec<(u32, u16, OpRollup)>,
    pub culprits: Vec<(u32, u16, CulpritTime)>,
    pub threads: Vec<ThreadSplit>,
}

/// The stats answer from stored rollups (one process with `pid`). `base`
/// supplies what is small anyway: the counters (`stats`), the kernel op
/// counts and whether the trace has host context; its calls and waits are
/// not used.
pub fn stats_report(r: &StoredRollups, pid: Option<u32>, base: &TraceData) -> StatsReport {
    let keep = |p: u32| pid.is_none_or(|want| want == p);
    let mut by_op: BTreeMap<u16, OpRollup> = BTreeMap::new();
    for (_, op, o) in r.ops.iter().filter(|x| keep(x.0)) {
        by_op.entry(*op).or_default().merge(o);
    }
    let mut culprits: HashMap<u16, HashMap<(u32, &str), u64>> = HashMap::new();
    for (_, op, c) in r.culprits.iter().filter(|x| keep(x.0)) {
        let e = culprits
            .entry(*op)
            .or_default()
            .entry((c.pid, c.comm.as_str()))
            .or_default();
        *e = e.saturating_add(c.runnable_ns);
    }
    let mut counted: HashMap<u16, u64> = HashMap::new();
    for oc in base.counts.iter().filter(|c| keep(c.pid)) {
        let e = counted.entry(oc.op).or_default();
        *e = e.saturating_add(oc.count);
    }
    let per_call: Vec<OpStats> = by_op
        .iter()
        .filter(|(_, o)| o.count > 0)
        .filter_map(|(&op, o)| {
            let cs = culprit_times(culprits.remove(&op).unwrap_or_default());
            op_stats_row(op, o, cs, counted.remove(&op), base.has_host_context)
        })
        .collect();
    let mut threads: Vec<ThreadSplit> = if base.has_host_context {
        r.threads.iter().filter(|t| keep(t.pid)).cloned().collect()
    } else {
        Vec::new()
    };
    sort_splits(&mut threads);
    crate::stats::assemble(per_call, counted, base, threads)
}

/// Counters of a trace's `stats` table that describe the moment the file
/// ended or the tracer (its pid, a probe trap's measured cost), not an
/// amount: merging files keeps the last file's value.
pub const LAST_VALUE_STATS: [&str; 6] = [
    crate::threads::TRACER_PID_STAT,
    crate::threads::PROBE_TRAP_STAT,
    crate::threads::PROBE_CALL_TRAP_STAT,
    "map_traced_left",
    "map_threads_left",
    "map_counts_left",
];

impl StoredRollups {
    /// Adds the rollups of a later file of the same run (`trace --rotate`):
    /// per-op rollups of the same (pid, op) add up, culprit sums are
    /// appended (`stats_report` sums them per culprit), and a thread seen in
    /// both files gets one merged split ([`merge_thread_split`]).
    pub fn merge(&mut self, later: StoredRollups) {
        let mut ops: BTreeMap<(u32, u16), OpRollup> = std::mem::take(&mut self.ops)
            .into_iter()
            .map(|(p, op, o)| ((p, op), o))
            .collect();
        for (p, op, o) in later.ops {
            ops.entry((p, op)).or_default().merge(&o);
        }
        self.ops = ops.into_iter().map(|((p, op), o)| (p, op, o)).collect();
        self.culprits.extend(later.culprits);
        merge_thread_splits(&mut self.threads, later.threads);
    }
}

/// Adds a later file's thread splits to a run's: a thread seen in both
/// gets one merged split ([`merge_thread_split`]), a new one is appended.
pub fn merge_thread_splits(splits: &mut Vec<ThreadSplit>, later: Vec<ThreadSplit>) {
    for t in later {
        match splits.iter_mut().find(|x| (x.pid, x.tid) == (t.pid, t.tid)) {
            Some(x) => merge_thread_split(x, &t),
            None => splits.push(t),
        }
    }
}

/// Adds a later file's split of the same thread. Sums add up exactly; the
/// window is the files' windows added (`wall_ns`, so in-call + between
/// still equals it: the gap between a thread's last call in one file and
/// its first in the next belongs to neither file), `start_ns`/`end_ns` span
/// both. The sync median is that of the file with more syncs (an exact
/// median over files would need every sync duration).
pub fn merge_thread_split(a: &mut ThreadSplit, b: &ThreadSplit) {
    a.start_ns = a.start_ns.min(b.start_ns);
    a.end_ns = a.end_ns.max(b.end_ns);
    a.wall_ns = a.wall_ns.saturating_add(b.wall_ns);
    a.calls = a.calls.saturating_add(b.calls);
    a.nested_calls = a.nested_calls.saturating_add(b.nested_calls);
    a.in_calls.add(b.in_calls);
    a.between.add(b.between);
    (a.sync_p50_ns, a.sync_host_p50_ns) = if b.syncs > a.syncs {
        (b.sync_p50_ns, b.sync_host_p50_ns)
    } else {
        (a.sync_p50_ns, a.sync_host_p50_ns)
    };
    // A split stored before round 56 has none: the run's verdict then
    // reads the old rule's sums the files stored (a run whose files span
    // the upgrade: the newer files' are 0, so it reads low, never high).
    a.sync_overlap_ns = a
        .sync_overlap_ns
        .zip(b.sync_overlap_ns)
        .map(|(x, y)| x.saturating_add(y));
    if a.sync_overlap_ns.is_none() {
        a.sync_host_p50_ns = None;
    }
    if b.slowest_sync.1 > a.slowest_sync.1 {
        a.slowest_sync = b.slowest_sync;
    }
    a.syncs = a.syncs.saturating_add(b.syncs);
    a.sync_ns = a.sync_ns.saturating_add(b.sync_ns);
    a.tracer_runnable_ns = a.tracer_runnable_ns.saturating_add(b.tracer_runnable_ns);
    // The longest of both (a stretch across the files' boundary is in neither).
    for p in &b.pauses {
        crate::threads::keep_longest(&mut a.pauses, p.clone());
    }
    for w in &b.wakers {
        match a
            .wakers
            .iter_mut()
            .find(|x| (x.kind, x.pid, x.tid, &x.comm) == (w.kind, w.pid, w.tid, &w.comm))
        {
            Some(x) => x.blocked_ns = x.blocked_ns.saturating_add(w.blocked_ns),
            None => a.wakers.push(w.clone()),
        }
    }
    order_wakers(&mut a.wakers);
    for h in &b.preempted_by {
        match a
            .preempted_by
            .iter_mut()
            .find(|x| (x.pid, &x.comm) == (h.pid, &h.comm))
        {
            Some(x) => x.runnable_ns = x.runnable_ns.saturating_add(h.runnable_ns),
            None => a.preempted_by.push(h.clone()),
        }
    }
    a.preempted_by
        .sort_by(|x, y| y.runnable_ns.cmp(&x.runnable_ns).then(x.pid.cmp(&y.pid)));
}

/// Each waker's share set ([`waker_shares`]), and the wakers largest first
/// (ties: pid), as a split lists them after its wakers' times changed.
pub fn order_wakers(wakers: &mut [crate::threads::WakerTime]) {
    waker_shares(wakers);
    wakers.sort_by(|x, y| y.blocked_ns.cmp(&x.blocked_ns).then(x.pid.cmp(&y.pid)));
}

/// Sets each waker's share of the wakers' blocked time (0 when none),
/// as the analysis computes it (stored rollups and merged files alike).
pub fn waker_shares(wakers: &mut [crate::threads::WakerTime]) {
    // Summed as floats: stored splits (each value at most 2^62, added up
    // across threads and files) cannot overflow it, and below 2^53 ns (104
    // days) the sum is exact, as the integer sum was.
    let blocked: f64 = wakers.iter().map(|w| w.blocked_ns as f64).sum();
    for w in wakers {
        w.share = if blocked == 0.0 {
            0.0
        } else {
            w.blocked_ns as f64 / blocked
        };
    }
}

/// Adds a later file's counters (`stats` table) to a run's: amounts add up,
/// [`LAST_VALUE_STATS`] take the later file's value.
pub fn merge_counters(run: &mut BTreeMap<String, u64>, later: &BTreeMap<String, u64>) {
    for (k, &v) in later {
        let e = run.entry(k.clone()).or_default();
        *e = if LAST_VALUE_STATS.contains(&k.as_str()) {
            v
        } else {
            e.saturating_add(v)
        };
    }
}

/// Adds a later file's kernel op counts: per (pid, op), counts add up.
pub fn merge_op_counts(run: &mut Vec<crate::event::OpCount>, later: &[crate::event::OpCount]) {
    for c in later {
        match run.iter_mut().find(|x| (x.pid, x.op) == (c.pid, c.op)) {
            Some(x) => x.count = x.count.saturating_add(c.count),
            None => run.push(c.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decompose::tests::call;
    use crate::stats::nearest_rank;

    /// A process's threads' windows taken out and added back give the
    /// windows of all their calls fed at once; the other processes' stay.
    #[test]
    fn windows_taken_at_an_exit_add_up_to_those_of_every_call() {
        let on = |pid: u32, tid: u32, op: u16, ts: u64, dur: u64| {
            let mut c = call(op, ts, dur, 0, 0);
            (c.pid, c.tid) = (pid, tid);
            c
        };
        let early = [on(7, 7, 1, 100, 10), on(7, 8, 2, 50, 5), on(9, 9, 1, 70, 3)];
        let late = [on(7, 7, 2, 400, 20), on(7, 7, 1, 30, 1)];
        let mut whole = Rollup::default();
        early.iter().chain(&late).for_each(|c| whole.add_call(c));
        let mut r = Rollup::default();
        early.iter().for_each(|c| r.add_call(c));
        let taken = r.take_process(7);
        assert_eq!(
            taken.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            [(7, 7), (7, 8)]
        );
        assert_eq!(r.threads.keys().collect::<Vec<_>>(), [&(9, 9)]);
        // The pid again after its exit: calls in memory, added up after.
        late.iter().for_each(|c| r.add_call(c));
        for (k, mut w) in taken {
            if let Some(after) = r.threads.get(&k) {
                w.merge(after);
            }
            r.threads.insert(k, w);
        }
        assert_eq!(r.threads, whole.threads);
    }

    /// Stored splits hold values up to 2^62 each; five wakers at it add up
    /// past u64: their shares stay exact and nothing overflows.
    #[test]
    fn wakers_at_the_largest_stored_value_get_exact_shares() {
        use crate::threads::{WakerKind, WakerTime};
        let w = WakerTime {
            kind: WakerKind::Task,
            pid: 1,
            tid: 1,
            comm: "x".into(),
            blocked_ns: 1 << 62,
            share: 0.0,
        };
        let mut wakers = vec![w; 5];
        waker_shares(&mut wakers);
        assert!(wakers.iter().all(|w| w.share == 0.2), "{wakers:?}");
        let t = ThreadSplit {
            pid: 1,
            tid: 1,
            comm: "x".into(),
            start_ns: 0,
            end_ns: 0,
            wall_ns: 0,
            calls: 0,
            nested_calls: 0,
            in_calls: Split::default(),
            between: Split::default(),
            syncs: 0,
            sync_ns: 0,
            sync_p50_ns: 0,
            slowest_sync: (0, 0),
            wakers,
            preempted_by: Vec::new(),
            tracer_runnable_ns: 0,
            pauses: Vec::new(),
            sync_overlap_ns: None,
            sync_host_p50_ns: None,
        };
        assert_eq!(t.blocked_by_tasks_ns(), u64::MAX);
    }

    #[test]
    fn buckets_cover_every_value_in_order_and_within_the_bound() {
        let mut seed = 7u64;
        let mut vals: Vec<u64> = (0..5000u64).collect();
        for _ in 0..20_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            vals.push(seed >> (seed % 60));
        }
        vals.extend([u64::MAX, u64::MAX - 1, 1 << 63, (1 << 40) - 1, 1 << 40]);
        for v in vals {
            let b = bucket_of(v);
            let (lo, hi) = bucket_bounds(b);
            assert!(lo <= v && v <= hi, "{v} not in bucket {b} [{lo}, {hi}]");
            let rep = bucket_value(b);
            let err = rep.abs_diff(v) as f64 / v.max(1) as f64;
            assert!(err <= MAX_RELATIVE_ERROR, "{v}: {rep} err {err}");
            if v < EXACT_BELOW {
                assert_eq!(rep, v);
            }
            if v > 0 {
                assert!(bucket_of(v - 1) <= b, "buckets must be monotonic at {v}");
            }
        }
    }

    fn rows(durs: &[u64]) -> (OpRollup, Vec<CallEvent>) {
        let calls: Vec<CallEvent> = durs
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let mut c = call(1, i as u64 * 10, d, d / 4, d / 3);
                c.ret = i64::from(i % 7 == 0);
                c
            })
            .collect();
        let mut r = OpRollup::default();
        for c in &calls {
            r.add(c);
        }
        (r, calls)
    }

    #[test]
    fn rollup_row_matches_the_exact_row_within_the_bound() {
        let mut seed = 99u64;
        let durs: Vec<u64> = (0..3000)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                1000 + (seed >> 40) % 5_000_000
            })
            .collect();
        let (r, calls) = rows(&durs);
        let mut sorted = durs.clone();
        sorted.sort_unstable();
        let got = op_stats_row(1, &r, Vec::new(), None, true).unwrap();
        let exact = crate::stats::op_stats(
            &crate::data::TraceData {
                calls: calls.clone(),
                has_host_context: true,
                ..Default::default()
            },
            &[],
        );
        let want = &exact.ops[0];
        assert_eq!(
            (got.count, got.errors, got.total_ns, got.max_ns),
            (want.count, want.errors, want.total_ns, want.max_ns)
        );
        assert_eq!(
            (got.on_cpu_ns, got.runnable_ns, got.blocked_ns),
            (want.on_cpu_ns, want.runnable_ns, want.blocked_ns)
        );
        for (p, g) in [(50, got.p50_ns), (95, got.p95_ns), (99, got.p99_ns)] {
            let w = nearest_rank(&sorted, p).unwrap();
            let g = g.unwrap();
            assert!(
                g.abs_diff(w) as f64 / w as f64 <= 2.0 * MAX_RELATIVE_ERROR,
                "p{p}: {g} vs {w}"
            );
        }
        let (gt, wt) = (got.tail.unwrap(), want.tail.unwrap());
        assert!(gt.calls <= wt.calls && wt.calls - gt.calls <= 3);
    }

    #[test]
    fn small_durations_give_exactly_todays_answer() {
        let durs: Vec<u64> = (1..=200).map(|i| (i * 37) % 2000 + 1).collect();
        let (r, calls) = rows(&durs);
        let got = op_stats_row(1, &r, Vec::new(), None, true).unwrap();
        let want = crate::stats::op_stats(
            &crate::data::TraceData {
                calls,
                has_host_context: true,
                ..Default::default()
            },
            &[],
        );
        assert_eq!(got, want.ops[0]);
    }

    #[test]
    fn merged_processes_equal_one_rollup_of_all_calls() {
        let (a, ca) = rows(&[5, 9_000, 70_000]);
        let (b, cb) = rows(&[3_000_000, 12]);
        let mut m = a.clone();
        m.merge(&b);
        let mut whole = OpRollup::default();
        for c in ca.iter().chain(&cb) {
            whole.add(c);
        }
        assert_eq!(m, whole);
        assert_eq!(m.percentile(100).unwrap().0, 3_000_000);
    }

    #[test]
    fn files_of_a_run_merge_to_the_rollup_of_all_their_calls() {
        let (a, ca) = rows(&[5, 9_000, 70_000, 400]);
        let (b, cb) = rows(&[3_000_000, 12, 9_000]);
        let stored = |r: &OpRollup, pid: u32| StoredRollups {
            ops: vec![(pid, 1, r.clone())],
            culprits: vec![(
                pid,
                1,
                CulpritTime {
                    pid: 77,
                    comm: "hog".into(),
                    runnable_ns: 10,
                },
            )],
            threads: Vec::new(),
        };
        let mut run = stored(&a, 4);
        run.merge(stored(&b, 4));
        let mut whole = OpRollup::default();
        for c in ca.iter().chain(&cb) {
            whole.add(c);
        }
        assert_eq!(run.ops, vec![(4, 1, whole)]);
        assert_eq!(run.culprits.len(), 2);
        let mut counters = BTreeMap::from([("drop_ring".to_string(), 2), ("tracer_pid".into(), 9)]);
        merge_counters(
            &mut counters,
            &BTreeMap::from([("drop_ring".to_string(), 3), ("tracer_pid".into(), 9)]),
        );
        assert_eq!(counters["drop_ring"], 5);
        assert_eq!(counters["tracer_pid"], 9);
    }
}
