//! Per-op latency statistics: exact nearest-rank percentiles over every
//! recorded call, the on-CPU / runnable / blocked decomposition, the tail
//! split and the top culprits, plus the event and drop counters of the trace.
//!
//! Ops counted in the kernel only (hot launch paths) have an exact count but
//! no per-call latency: they are reported as `measured: counted` with null
//! latency fields rather than invented numbers.

use crate::data::TraceData;
use crate::decompose::{aggregate_culprits, culprits_of, CulpritTime, Split, TailSplit};
use crate::event::{CallEvent, Culprit};
use crate::ops::{op_by_id, Layer};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// How many culprits each op lists.
pub const TOP_CULPRITS_PER_OP: usize = 5;

/// Prefix of `TraceData::stats` keys that count recorded events.
pub const EVENTS_PREFIX: &str = "events_";
/// Prefix of `TraceData::stats` keys that count lost events.
pub const DROPS_PREFIX: &str = "drop_";
/// Prefix of `TraceData::stats` keys that count expected edges of attaching
/// to running processes (not losses): `edge_return_without_entry`,
/// `edge_call_open_at_end`.
pub const EDGES_PREFIX: &str = "edge_";
/// `edge_` counter: traced calls still in progress when the trace stopped.
pub const EDGE_OPEN_AT_END: &str = "call_open_at_end";
/// `edge_` counter: traced calls whose thread exited before they returned
/// (a process killed mid-call; counted as open at the end before round 52).
pub const EDGE_CUT_BY_EXIT: &str = "call_cut_by_exit";

/// Nearest-rank percentile `p` (1..=100) of an ascending slice: the value at
/// rank ceil(p/100 * n). None for an empty slice.
pub fn nearest_rank(sorted: &[u64], p: u32) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = rank_of(p, sorted.len() as u64);
    sorted.get((rank - 1) as usize).copied()
}

/// The nearest rank of percentile `p` (1..=100) among `n` values:
/// ceil(p/100 * n), at least 1. In u128: a stored histogram's count may be
/// near u64::MAX. Every percentile (of raw calls, rollups, finding
/// histograms) takes its rank from here.
pub fn rank_of(p: u32, n: u64) -> u64 {
    u64::try_from((u128::from(p.clamp(1, 100)) * u128::from(n)).div_ceil(100))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Whether an op's numbers come from per-call records or kernel counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Measured {
    PerCall,
    Counted,
}

/// One row of the stats table. Latency, error and decomposition fields are
/// None (JSON null) for kernel-counted ops.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpStats {
    pub layer: Layer,
    pub op: &'static str,
    pub count: u64,
    pub errors: Option<u64>,
    pub p50_ns: Option<u64>,
    pub p95_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub max_ns: Option<u64>,
    pub total_ns: Option<u64>,
    pub on_cpu_ns: Option<u64>,
    pub runnable_ns: Option<u64>,
    pub blocked_ns: Option<u64>,
    pub tail: Option<TailSplit>,
    pub measured: Measured,
    /// Tasks that held the CPU while this op's calls were runnable-waiting (top 5).
    pub culprits: Vec<CulpritTime>,
    /// Calls of this op counted in the kernel on top of the per-call records
    /// (should not happen: both paths enabled for one op). Included in `count`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub also_counted: Option<u64>,
}

/// The whole stats answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatsReport {
    /// Per-call ops by total time (largest first), then counted ops by count.
    pub ops: Vec<OpStats>,
    /// Lost events per cause (every known cause listed, 0 included) and `total`.
    pub drops: BTreeMap<String, u64>,
    /// Expected edges of attaching, not losses (every kind listed, 0 included) and `total`.
    pub attach_edges: BTreeMap<String, u64>,
    /// Recorded events per kind and `total`.
    pub events: BTreeMap<String, u64>,
    /// Where each CUDA-issuing thread's time went, inside and between CUDA
    /// calls (see `threads.rs`); empty without host context.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<crate::threads::ThreadSplit>,
    /// What a recorded call's probes (its entry and return traps) cost a
    /// traced thread, as the tracer measured it (`probe_call_trap_ns`):
    /// part of every recorded call's time above (a runtime call's holds its
    /// nested driver call's too). Absent where not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_call_trap_ns: Option<u64>,
}

/// Per-op statistics of `data`, culprits joined from its waits.
pub fn compute(data: &TraceData) -> StatsReport {
    op_stats(
        data,
        &crate::culprits::call_culprits(&data.calls, &data.waits, crate::threads::tracer_pid(data)),
    )
}

/// Per-op statistics of `data`. `per_call_culprits` is aligned with
/// `data.calls` (see `culprits::call_culprits`); pass `&[]` when unknown.
pub fn op_stats(data: &TraceData, per_call_culprits: &[Vec<Culprit>]) -> StatsReport {
    let mut by_op: HashMap<u16, Vec<usize>> = HashMap::new();
    for (i, c) in data.calls.iter().enumerate() {
        by_op.entry(c.op).or_default().push(i);
    }
    let mut counted: HashMap<u16, u64> = HashMap::new();
    for oc in &data.counts {
        let e = counted.entry(oc.op).or_default();
        *e = e.saturating_add(oc.count);
    }

    let per_call: Vec<OpStats> = by_op
        .iter()
        .filter_map(|(&op, idx)| {
            let calls: Vec<&CallEvent> = idx.iter().map(|&i| &data.calls[i]).collect();
            let culprits =
                aggregate_culprits(idx.iter().map(|&i| culprits_of(per_call_culprits, i)));
            per_call_row(
                op,
                &calls,
                culprits,
                counted.remove(&op),
                data.has_host_context,
            )
        })
        .collect();
    let threads = if data.has_host_context {
        crate::threads::thread_splits(data)
    } else {
        Vec::new()
    };
    assemble(per_call, counted, data, threads)
}

/// The report from per-call rows, kernel counts per op and thread splits,
/// in the documented order; counters come from `data.stats`. Shared by the
/// raw path above and the rollup path (`rollup::stats_report`).
pub(crate) fn assemble(
    mut per_call: Vec<OpStats>,
    counted: HashMap<u16, u64>,
    data: &TraceData,
    threads: Vec<crate::threads::ThreadSplit>,
) -> StatsReport {
    per_call.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then(a.layer.cmp(&b.layer))
            .then(a.op.cmp(b.op))
    });

    let mut counted_rows: Vec<OpStats> = counted
        .into_iter()
        .filter_map(|(op, count)| counted_row(op, count))
        .collect();
    counted_rows.sort_by(|a, b| b.count.cmp(&a.count).then(a.op.cmp(b.op)));
    per_call.extend(counted_rows);

    StatsReport {
        ops: per_call,
        drops: drop_counters(data),
        attach_edges: attach_edges(data),
        events: event_counters(data),
        threads,
        probe_call_trap_ns: data
            .stats
            .get(crate::threads::PROBE_CALL_TRAP_STAT)
            .copied()
            .filter(|&ns| ns > 0),
    }
}

fn per_call_row(
    op: u16,
    calls: &[&CallEvent],
    mut culprits: Vec<CulpritTime>,
    also_counted: Option<u64>,
    host_context: bool,
) -> Option<OpStats> {
    let info = op_by_id(op)?;
    // Without host context (imported traces) the split is unknown: null, never 0.
    let known = |v: u64| host_context.then_some(v);
    let mut durs: Vec<u64> = calls.iter().map(|c| c.dur_ns).collect();
    durs.sort_unstable();
    let p95 = nearest_rank(&durs, 95);
    let split = Split::total(calls.iter().copied());
    culprits.truncate(TOP_CULPRITS_PER_OP);
    Some(OpStats {
        layer: info.layer,
        op: info.name,
        count: calls.len() as u64 + also_counted.unwrap_or(0),
        // A function that returns nothing has no errors to count (JSON null, "-").
        errors: info
            .returns_status
            .then(|| calls.iter().filter(|c| c.failed()).count() as u64),
        p50_ns: nearest_rank(&durs, 50),
        p95_ns: p95,
        p99_ns: nearest_rank(&durs, 99),
        max_ns: durs.last().copied(),
        total_ns: Some(durs.iter().fold(0u64, |a, &d| a.saturating_add(d))),
        on_cpu_ns: known(split.on_cpu_ns),
        runnable_ns: known(split.runnable_ns),
        blocked_ns: known(split.blocked_ns),
        tail: host_context.then(|| TailSplit::of(calls.iter().copied(), p95.unwrap_or(0))),
        measured: Measured::PerCall,
        culprits,
        also_counted,
    })
}

fn counted_row(op: u16, count: u64) -> Option<OpStats> {
    let info = op_by_id(op)?;
    Some(OpStats {
        layer: info.layer,
        op: info.name,
        count,
        errors: None,
        p50_ns: None,
        p95_ns: None,
        p99_ns: None,
        max_ns: None,
        total_ns: None,
        on_cpu_ns: None,
        runnable_ns: None,
        blocked_ns: None,
        tail: None,
        measured: Measured::Counted,
        culprits: Vec::new(),
        also_counted: None,
    })
}

/// `lost` events' share of every event the probes produced, in words:
/// "P% of those the probes produced" ("under 1% …" below one percent). The
/// writer counts what it received (`received`), the `capped` events it could
/// not store for the size cap among them; the other losses never reached it.
/// A finding read from a sixth of the calls is not one read from all but a
/// few: 16 processes flooding one writer lost 75-86% (round 40).
pub fn lost_share(lost: u64, capped: u64, received: u64) -> String {
    let produced = received.saturating_add(lost.saturating_sub(capped));
    let pct = 100.0 * lost as f64 / produced.max(1) as f64;
    if pct < 1.0 {
        "under 1% of those the probes produced".to_string()
    } else {
        format!("{pct:.0}% of those the probes produced")
    }
}

/// [`lost_share`] of a trace's drop and event counters ([`drop_counters`],
/// [`event_counters`]); None when nothing was lost.
pub fn lost_share_of(
    drops: &BTreeMap<String, u64>,
    events: &BTreeMap<String, u64>,
) -> Option<String> {
    let get = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    let lost = get(drops, "total");
    (lost > 0).then(|| lost_share(lost, get(drops, "db_full"), get(events, "total")))
}

/// Drop counters by cause (prefix stripped), every cause the kernel knows
/// listed even at 0, plus `total`.
pub fn drop_counters(data: &TraceData) -> BTreeMap<String, u64> {
    use crate::record::stat;
    let mut out: BTreeMap<String, u64> = stat::losses()
        .map(|i| (stat::NAMES[i].to_string(), 0))
        .collect();
    // Traces written before attach edges were told apart stored them as drops.
    let edges: Vec<&str> = (0..stat::MAX)
        .filter(|&i| stat::is_attach_edge(i))
        .map(|i| stat::NAMES[i])
        .collect();
    out.extend(prefixed(data, DROPS_PREFIX).filter(|(k, _)| !edges.contains(&k.as_str())));
    with_total(out)
}

/// What a memory ledger of `data` cannot know: call records that were not
/// stored (past the database's size cap or after its disk ran low, or lost in a full ring buffer)
/// may hold allocations and frees, so the ledger may miss them; None when
/// none was lost. `memory` said an incomplete ledger as fact (round 50:
/// 8 of 80 allocations past `--max-db 1M`, no word of it).
pub fn ledger_loss_note(data: &TraceData) -> Option<String> {
    let d = drop_counters(data);
    let db_full = d.get("db_full").copied().unwrap_or(0);
    let ring = d.get("ring_full_call").copied().unwrap_or(0);
    let lost = db_full.saturating_add(ring);
    (lost > 0).then(|| {
        format!(
            "{lost} record(s) of calls and waits were not stored ({db_full} past the database's size cap or after its disk ran low, {ring} lost in a full ring buffer): allocations and frees among them are missing, so this ledger may be incomplete"
        )
    })
}

/// Attach edges by kind (`return_without_entry`: a call that began before its
/// process was traced returned during the trace; `call_open_at_end`: a traced
/// call had not returned when the trace stopped), plus `total`. Older traces
/// stored the first as `drop_unmatched_return`; it is read as an edge.
pub fn attach_edges(data: &TraceData) -> BTreeMap<String, u64> {
    use crate::record::stat;
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for i in (0..stat::MAX).filter(|&i| stat::is_attach_edge(i)) {
        let old = data
            .stats
            .get(&format!("{DROPS_PREFIX}{}", stat::NAMES[i]))
            .copied()
            .unwrap_or(0);
        out.insert(stat::edge_name(i).to_string(), old);
    }
    out.insert(EDGE_OPEN_AT_END.to_string(), 0);
    out.insert(EDGE_CUT_BY_EXIT.to_string(), 0);
    for (k, v) in prefixed(data, EDGES_PREFIX) {
        let e = out.entry(k).or_default();
        *e = e.saturating_add(v);
    }
    with_total(out)
}

/// Recorded-event counters by kind (prefix stripped), plus `total`.
pub fn event_counters(data: &TraceData) -> BTreeMap<String, u64> {
    with_total(prefixed(data, EVENTS_PREFIX).collect())
}

fn prefixed<'a>(data: &'a TraceData, prefix: &'a str) -> impl Iterator<Item = (String, u64)> + 'a {
    data.stats
        .iter()
        .filter_map(move |(k, &v)| k.strip_prefix(prefix).map(|name| (name.to_string(), v)))
}

fn with_total(mut m: BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    // A stored "total" wins over the computed one (it may count more).
    if !m.contains_key("total") {
        let total = m.values().fold(0u64, |a, &v| a.saturating_add(v));
        m.insert("total".into(), total);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decompose::tests::call;
    use crate::event::OpCount;

    #[test]
    fn nearest_rank_matches_the_definition() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 50), Some(50));
        assert_eq!(nearest_rank(&v, 95), Some(95));
        assert_eq!(nearest_rank(&v, 99), Some(99));
        assert_eq!(nearest_rank(&v, 100), Some(100));
        assert_eq!(nearest_rank(&[7], 50), Some(7));
        assert_eq!(nearest_rank(&[1, 2], 50), Some(1));
        assert_eq!(nearest_rank(&[1, 2, 3], 50), Some(2));
        assert_eq!(nearest_rank(&[], 50), None);
    }

    #[test]
    fn percentiles_are_monotonic_for_any_sample() {
        let mut seed = 12345u64;
        for n in 1..300usize {
            let mut v: Vec<u64> = (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 33) % 10_000
                })
                .collect();
            v.sort_unstable();
            let p = |q| nearest_rank(&v, q).unwrap();
            assert!(
                p(50) <= p(95) && p(95) <= p(99) && p(99) <= *v.last().unwrap(),
                "n={n}"
            );
            assert!(p(50) >= v[0]);
        }
    }

    fn data(calls: Vec<CallEvent>) -> TraceData {
        TraceData {
            calls,
            has_host_context: true,
            ..Default::default()
        }
    }

    #[test]
    fn per_op_rows_are_exact() {
        let mut calls: Vec<CallEvent> = (1..=100).map(|i| call(1, i, i * 1000, 0, 0)).collect();
        calls[99].runnable_ns = 60_000; // the slowest malloc was preempted
        calls[98].ret = 2;
        calls.push(call(14, 500, 6_000_000, 0, 4_000_000));
        let per_call = {
            let mut v = vec![Vec::new(); calls.len()];
            v[99] = vec![Culprit {
                pid: 9,
                tid: 9,
                comm: "hog".into(),
                ns: 60_000,
            }];
            v
        };
        let r = op_stats(&data(calls), &per_call);
        assert_eq!(r.ops.len(), 2);
        let sync = &r.ops[0];
        assert_eq!(sync.op, "cudaStreamSynchronize");
        assert_eq!(sync.blocked_ns, Some(4_000_000));
        let m = &r.ops[1];
        assert_eq!((m.op, m.count, m.errors), ("cudaMalloc", 100, Some(1)));
        assert_eq!(
            (m.p50_ns, m.p95_ns, m.p99_ns, m.max_ns),
            (Some(50_000), Some(95_000), Some(99_000), Some(100_000))
        );
        assert_eq!(m.total_ns, Some(5050 * 1000));
        assert_eq!(m.runnable_ns, Some(60_000));
        assert_eq!(
            m.on_cpu_ns.unwrap() + m.runnable_ns.unwrap() + m.blocked_ns.unwrap(),
            m.total_ns.unwrap()
        );
        let tail = m.tail.unwrap();
        assert_eq!(tail.calls, 5); // 96..100 us
        assert!((tail.runnable_share - 60.0 / 490.0).abs() < 1e-9);
        assert_eq!(m.culprits[0].comm, "hog");
        assert_eq!(m.measured, Measured::PerCall);
    }

    #[test]
    fn counted_ops_have_counts_but_no_latency_and_come_last() {
        let mut d = data(vec![call(1, 0, 10, 0, 0)]);
        d.counts = vec![
            OpCount {
                pid: 1,
                op: 43,
                count: 1000,
            },
            OpCount {
                pid: 2,
                op: 43,
                count: 500,
            },
            OpCount {
                pid: 1,
                op: 44,
                count: 7,
            },
        ];
        let r = op_stats(&d, &[]);
        let names: Vec<_> = r.ops.iter().map(|o| o.op).collect();
        assert_eq!(names, ["cudaMalloc", "cuLaunchKernel", "cuLaunchKernelEx"]);
        let l = &r.ops[1];
        assert_eq!(
            (l.count, l.measured, l.p50_ns, l.errors, l.tail),
            (1500, Measured::Counted, None, None, None)
        );
        let json = serde_json::to_value(l).unwrap();
        assert_eq!(json["measured"], "counted");
        assert!(json["p99_ns"].is_null() && json["runnable_ns"].is_null());
    }

    #[test]
    fn an_op_both_recorded_and_counted_sums_and_says_so() {
        let mut d = data(vec![call(43, 0, 10, 0, 0), call(43, 5, 20, 0, 0)]);
        d.counts = vec![OpCount {
            pid: 1,
            op: 43,
            count: 10,
        }];
        let r = op_stats(&d, &[]);
        assert_eq!(r.ops.len(), 1);
        assert_eq!((r.ops[0].count, r.ops[0].also_counted), (12, Some(10)));
        assert_eq!(r.ops[0].measured, Measured::PerCall);
        assert_eq!(r.ops[0].max_ns, Some(20));
    }

    #[test]
    fn without_host_context_the_split_is_unknown_not_zero() {
        let mut d = data(vec![call(1, 0, 10_000, 0, 0), call(1, 5, 20_000, 0, 0)]);
        d.has_host_context = false;
        let r = op_stats(&d, &[]);
        let m = &r.ops[0];
        assert_eq!((m.count, m.total_ns), (2, Some(30_000)));
        assert_eq!(
            (m.on_cpu_ns, m.runnable_ns, m.blocked_ns),
            (None, None, None)
        );
        assert!(m.tail.is_none());
        let json = serde_json::to_value(m).unwrap();
        assert!(json["on_cpu_ns"].is_null() && json["tail"].is_null());
    }

    #[test]
    fn a_function_returning_nothing_has_no_errors() {
        // NativeCachingAllocator::emptyCache is void: its "ret" is a leftover register.
        let empty_cache = crate::ops::op_by_name("NativeCachingAllocator::emptyCache")
            .unwrap()
            .id;
        let mut c = call(empty_cache, 0, 10, 0, 0);
        c.ret = 0x7f3a_1000;
        assert!(!c.failed());
        let r = op_stats(&data(vec![c.clone(), c]), &[]);
        assert_eq!((r.ops[0].count, r.ops[0].errors), (2, None));
    }

    #[test]
    fn attach_edges_are_not_drops_in_new_and_old_traces() {
        let mut d = data(vec![]);
        d.stats.insert("edge_return_without_entry".into(), 1);
        d.stats.insert("edge_call_open_at_end".into(), 2);
        d.stats.insert("drop_ring_full_wait".into(), 0);
        let r = op_stats(&d, &[]);
        assert_eq!(r.drops["total"], 0);
        assert_eq!(r.attach_edges["return_without_entry"], 1);
        assert_eq!(r.attach_edges["call_open_at_end"], 2);
        assert_eq!(r.attach_edges["total"], 3);
        // A trace written before the split stored the edge as a drop.
        let mut old = data(vec![]);
        old.stats.insert("drop_unmatched_return".into(), 1);
        let r = op_stats(&old, &[]);
        assert_eq!(r.drops["total"], 0);
        assert_eq!(r.attach_edges["return_without_entry"], 1);
    }

    #[test]
    fn drops_are_always_listed_and_totalled() {
        let mut d = data(vec![]);
        d.stats.insert("events_call".into(), 10);
        d.stats.insert("events_wait".into(), 4);
        d.stats.insert("drop_ring_full_call".into(), 3);
        let r = op_stats(&d, &[]);
        assert_eq!(r.events["call"], 10);
        assert_eq!(r.events["total"], 14);
        assert_eq!(r.drops["ring_full_call"], 3);
        assert_eq!(r.drops["inflight_map_full"], 0);
        assert_eq!(r.drops["total"], 3);
        assert!(
            !r.drops.contains_key("unmatched_return"),
            "an attach edge, not a drop"
        );
        assert_eq!(r.attach_edges["return_without_entry"], 0);
        assert_eq!(r.attach_edges["call_open_at_end"], 0);
        let empty = op_stats(&TraceData::default(), &[]);
        assert_eq!(empty.drops["total"], 0);
        assert!(empty.ops.is_empty());
    }

    #[test]
    fn json_has_the_contract_fields() {
        let r = op_stats(&data(vec![call(1, 0, 10, 0, 0)]), &[]);
        let v = serde_json::to_value(&r).unwrap();
        let op = &v["ops"][0];
        for k in [
            "layer",
            "op",
            "count",
            "errors",
            "p50_ns",
            "p95_ns",
            "p99_ns",
            "max_ns",
            "total_ns",
            "on_cpu_ns",
            "runnable_ns",
            "blocked_ns",
            "tail",
            "measured",
            "culprits",
        ] {
            assert!(op.get(k).is_some(), "missing {k}");
        }
        for k in ["calls", "on_cpu_share", "runnable_share", "blocked_share"] {
            assert!(op["tail"].get(k).is_some(), "missing tail.{k}");
        }
        assert_eq!(op["layer"], "runtime");
        assert!(v["drops"].is_object() && v["events"].is_object());
    }
}
