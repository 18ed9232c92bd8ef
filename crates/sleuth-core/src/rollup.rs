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
    pub buckets: BTreeMap<u32, Bucket>,
}

impl OpRollup {
    pub fn add(&mut self, c: &CallEvent) {
        self.count += 1;
        self.errors += u64::from(c.failed());
        self.total_ns = self.total_ns.saturating_add(c.dur_ns);
        self.max_ns = self.max_ns.max(c.dur_ns);
        let s = Split::of(c);
        self.split.add(s);
        let b = self.buckets.entry(bucket_of(c.dur_ns)).or_default();
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
        for (&k, b) in &o.buckets {
            let e = self.buckets.entry(k).or_default();
            e.count = e.count.saturating_add(b.count);
            e.split.add(b.split);
        }
    }

    /// Nearest-rank percentile `p` and the bucket it fell in.
    fn percentile(&self, p: u32) -> Option<(u64, u32)> {
        let n: u64 = self.buckets.values().map(|b| b.count).sum();
        if n == 0 {
            return None;
        }
        let rank = (u64::from(p.clamp(1, 100)) * n).div_ceil(100).max(1);
        if rank == n {
            // The last rank is the maximum, which is kept exactly.
            return Some((self.max_ns, bucket_of(self.max_ns)));
        }
        let mut seen = 0u64;
        for (&k, b) in &self.buckets {
            seen += b.count;
            if seen >= rank {
                let (lo, _) = bucket_bounds(k);
                return Some((bucket_value(k).min(self.max_ns).max(lo), k));
            }
        }
        None
    }
}

/// Rollups of a whole trace as the writer keeps them: per (pid, op id), plus
/// each calling thread's window (first start, last end of its non-nested
/// calls; None with nested calls only), for the per-thread pass at the end.
#[derive(Debug, Clone, Default)]
pub struct Rollup {
    pub ops: HashMap<(u32, u16), OpRollup>,
    pub threads: BTreeMap<(u32, u32), Option<(u64, u64)>>,
}

impl Rollup {
    pub fn add_call(&mut self, c: &CallEvent) {
        self.ops.entry((c.pid, c.op)).or_default().add(c);
        let w = self.threads.entry((c.pid, c.tid)).or_default();
        if !c.nested {
            let (s, e) = w.get_or_insert((c.ts_ns, c.end_ns()));
            *s = (*s).min(c.ts_ns);
            *e = (*e).max(c.end_ns());
        }
    }
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
    let p95 = r.percentile(95);
    culprits.truncate(TOP_CULPRITS_PER_OP);
    let tail = host_context.then(|| {
        let mut s = Split::default();
        let mut n = 0u64;
        if let Some((p95_ns, pb)) = p95 {
            for (&k, b) in r.buckets.range(pb..) {
                // Exact buckets hold one value: the p95 bucket itself is not above p95.
                let above = if k == pb {
                    bucket_bounds(k).0 > p95_ns
                } else {
                    true
                };
                if above {
                    n += b.count;
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
        p50_ns: r.percentile(50).map(|x| x.0),
        p95_ns: p95.map(|x| x.0),
        p99_ns: r.percentile(99).map(|x| x.0),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decompose::tests::call;
    use crate::stats::nearest_rank;

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
}
