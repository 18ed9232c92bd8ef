//! Findings about time: cpu_preemption, tail_latency.

use super::inputs::{FindingInputs, OpInputs, TopK};
use super::*;
use crate::decompose::{Split, TailSplit};
use crate::ops::OpClass;
use crate::units::fmt_ns;
use serde_json::json;

impl Severity {
    /// The three-step ladder the threshold findings share (cpu_preemption
    /// here, memory_growth, collective_straggler, the bottleneck verdicts):
    /// at or above `high` is high, at or above `medium` is medium, anything
    /// less is low.
    pub(super) fn grade<T: PartialOrd>(value: T, high: T, medium: T) -> Severity {
        if value >= high {
            Severity::High
        } else if value >= medium {
            Severity::Medium
        } else {
            Severity::Low
        }
    }
}

/// What every time finder needs: the per-op aggregates, the trace's time
/// origin and how to name a call site.
pub(super) struct Context<'a> {
    inputs: &'a FindingInputs,
    has_host_context: bool,
    start_ns: u64,
    end_ns: u64,
    /// Where the examples' offsets count from: the trace's start, also in a window.
    origin_ns: u64,
    site: &'a dyn Fn(Option<u64>) -> String,
}

/// Per-op numbers shared by the finders.
struct OpView<'a> {
    op: &'static str,
    class: OpClass,
    agg: &'a OpInputs,
    split: Split,
    p50: u64,
    p95: u64,
    p99: u64,
    tail: TailSplit,
    pids: Vec<u32>,
}

impl<'a> Context<'a> {
    pub(super) fn new(
        inputs: &'a FindingInputs,
        has_host_context: bool,
        span: crate::TraceSpan,
        window: (Option<u64>, Option<u64>),
        site: &'a dyn Fn(Option<u64>) -> String,
    ) -> Self {
        // A window's span is the trace's inside it (a window past the
        // trace's end or before its start adds no time).
        let start_ns = window.0.map_or(span.start_ns, |s| s.max(span.start_ns));
        let end_ns = window
            .1
            .map_or(span.end_ns, |u| u.min(span.end_ns))
            .max(start_ns);
        Context {
            inputs,
            has_host_context,
            start_ns,
            end_ns,
            origin_ns: span.start_ns,
            site,
        }
    }

    /// Duration of the trace (start to end, or first to last call).
    pub(super) fn span_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }

    /// The trace's (or the window's) start and end.
    pub(super) fn bounds(&self) -> (u64, u64) {
        (self.start_ns, self.end_ns)
    }

    /// The runnable time gpusleuth's own threads took from the CUDA
    /// threads of `pids`, inside or between their calls: at most the
    /// tracer's part of an op's runnable time (its calls' waits name no
    /// culprit for it: `culprits::culprits_of_call`); evidence.
    fn tracer_runnable_of(&self, pids: &[u32]) -> u64 {
        self.inputs
            .splits
            .iter()
            .filter(|t| pids.contains(&t.pid))
            // Saturating: the splits may come from a stored aggregate.
            .fold(0u64, |a, t| a.saturating_add(t.tracer_runnable_ns))
    }

    fn views(&self) -> impl Iterator<Item = OpView<'_>> + '_ {
        self.inputs.ops.iter().filter_map(move |(&op, agg)| {
            let info = crate::ops::op_by_id(op)?;
            Some(OpView {
                op: info.name,
                class: info.class,
                agg,
                split: agg.split,
                p50: agg.hist.percentile(50)?,
                p95: agg.hist.percentile(95)?,
                p99: agg.hist.percentile(99)?,
                tail: agg.hist.tail(),
                pids: agg.pids.iter().copied().collect(),
            })
        })
    }

    /// The kept example calls (largest key first), as evidence.
    fn examples(&self, top: &TopK) -> serde_json::Value {
        top.examples()
            .map(|e| {
                let c = &e.call;
                let s = Split::of(c);
                // Unknown without host context (imports): null, never 0.
                let known = |v: u64| self.has_host_context.then_some(v);
                let culprits: Vec<_> = e
                    .culprits
                    .iter()
                    .map(|k| json!({"pid": k.pid, "comm": k.comm, "runnable_ns": k.ns}))
                    .collect();
                json!({
                    "ts_ns": c.ts_ns,
                    "offset_ns": c.ts_ns.saturating_sub(self.origin_ns),
                    "pid": c.pid,
                    "tid": c.tid,
                    "dur_ns": c.dur_ns,
                    "on_cpu_ns": known(s.on_cpu_ns),
                    "runnable_ns": known(s.runnable_ns),
                    "blocked_ns": known(s.blocked_ns),
                    "culprits": culprits,
                    // The line that made the call (slow calls take a site, `trace --site-slow`).
                    "site": c.stack_id.map(|_| (self.site)(c.stack_id)),
                })
            })
            .collect()
    }
}

/// What to do when other tasks take the CUDA thread's CPU: the process's
/// own threads (`same_process`), or neighbours.
pub(super) fn preemption_advice(same_process: bool) -> &'static str {
    if same_process {
        "Threads of the traced process itself compete for the CPU with the thread issuing CUDA calls: \
         reduce CPU-side worker threads (e.g. OMP_NUM_THREADS, DataLoader workers) or give the CUDA \
         thread a dedicated core."
    } else {
        "Give the CUDA process CPUs the neighbours do not use: pin it (taskset / cpuset cgroup) and \
         move or isolate the culprits, lower their priority (nice / SCHED_IDLE), or cap them with a \
         cgroup cpu.max limit."
    }
}

/// "; 8.00ms of it with no task of this machine seen holding the CPU (…)"
/// where a tenth or more of `lost` runnable time had no task named
/// (`named`), empty otherwise: the findings that claim other tasks held
/// the CPU say how much of the time they give no task held.
pub(super) fn unnamed_clause(lost: u64, named: u64) -> String {
    let unnamed = lost.saturating_sub(named);
    if unnamed == 0 || unnamed.saturating_mul(10) < lost {
        return String::new();
    }
    format!(
        "; {} of it with no task of this machine seen holding the CPU (gpusleuth's own threads, a \
         hypervisor taking the CPU, wake-up latency or a migration)",
        fmt_ns(unnamed)
    )
}

/// CUDA calls slowed because the CPU was given to other tasks.
pub(super) fn cpu_preemption(ctx: &Context) -> Vec<Finding> {
    let mut out = Vec::new();
    for v in ctx.views() {
        let wall = v.split.wall_ns();
        let lost = v.split.runnable_ns;
        let op_share = share(lost, wall);
        // Only the time tasks of this machine were seen holding the CPU is
        // other tasks' doing: gpusleuth's own threads are never a culprit
        // (round 58's tester: a healthy loop's 2.56 ms in one launch call,
        // all of it the tracer's, was a finding), and runnable time no task
        // held (a VM's CPU taken by its hypervisor, wake-up latency, a
        // migration) is none's (round 59's tester: 35 ms inside the
        // sleeping syncs of a healthy run on the 2-vCPU VM, once in 13
        // runs, "by tasks the trace did not name").
        let all = v.agg.culprits();
        let named = all
            .iter()
            .fold(0u64, |n, c| n.saturating_add(c.runnable_ns))
            .min(lost);
        let named_tail = v.tail.runnable_share * share(named, lost);
        if named < PREEMPTION_MIN_RUNNABLE_NS
            || share(named, ctx.span_ns()) < PREEMPTION_MIN_TRACE_SHARE
            || (share(named, wall) < PREEMPTION_MIN_SHARE && named_tail < PREEMPTION_MIN_TAIL_SHARE)
        {
            continue;
        }
        let tracer_ns = ctx.tracer_runnable_of(&v.pids);
        let severity = Severity::grade(
            share(named, wall),
            PREEMPTION_HIGH_SHARE,
            PREEMPTION_MEDIUM_SHARE,
        );
        let mut culprits: Vec<FindingCulprit> = all
            .into_iter()
            .map(|c| FindingCulprit {
                share: share(c.runnable_ns, lost).min(1.0),
                pid: c.pid,
                tid: None,
                comm: c.comm,
                runnable_ns: c.runnable_ns,
            })
            .collect();
        culprits.truncate(TOP_CULPRITS);
        let affected: Vec<u32> = v.agg.slowed_pids.iter().copied().collect();
        let slowed = v.agg.slowed;
        // Named time is at least 1 ms: a culprit exists.
        let who = culprits.first().map_or(String::new(), |c| {
            format!(
                "mostly {} (pid {}, {} of the lost time)",
                c.comm,
                c.pid,
                pct(c.share)
            )
        });
        let unnamed_text = unnamed_clause(lost, named);
        let summary = format!(
            "{} calls waited {} runnable while other tasks held the CPU ({} of their {} wall time), {}{}",
            v.op,
            fmt_ns(lost),
            pct(op_share),
            fmt_ns(wall),
            who,
            unnamed_text
        );
        // Advice follows the main culprit: a CUDA helper thread of the process
        // itself taking 0.1% must not turn a neighbour problem into a threading one.
        let same_process = culprits.first().is_some_and(|c| affected.contains(&c.pid));
        let recommendation = preemption_advice(same_process);
        out.push(Finding {
            kind: Kind::CpuPreemption,
            severity,
            op: v.op.to_string(),
            pids: affected,
            summary,
            evidence: json!({
                "calls": v.agg.count(),
                "calls_with_runnable_time": slowed,
                "wall_ns": wall,
                "on_cpu_ns": v.split.on_cpu_ns,
                "runnable_ns": lost,
                "named_runnable_ns": named,
                "tracer_runnable_ns": tracer_ns,
                "blocked_ns": v.split.blocked_ns,
                "runnable_share": op_share,
                "tail": v.tail,
                "p50_ns": v.p50,
                "p99_ns": v.p99,
                "examples": ctx.examples(&v.agg.by_runnable),
            }),
            culprits,
            recommendation: recommendation.to_string(),
            impact_ns: lost,
            wall_share: Some(share(lost, ctx.span_ns()).min(1.0)),
        });
    }
    out
}

/// Ops whose slowest calls are far slower than usual with no host explanation.
pub(super) fn tail_latency(ctx: &Context) -> Vec<Finding> {
    let host = ctx.has_host_context;
    let mut out = Vec::new();
    for v in ctx.views() {
        let n = v.agg.count();
        // Judged on p99, or on the third-slowest call where p99's rank is
        // past it (fewer than 200 calls), so that a tail is more than one call.
        let (tail_ns, on_p99) = v
            .agg
            .hist
            .percentile_or_kth_slowest(99, TAIL_MIN_SLOW_CALLS)
            .unwrap_or((v.p99, true));
        let ratio_of = |x: u64| {
            if v.p50 == 0 {
                f64::INFINITY
            } else {
                x as f64 / v.p50 as f64
            }
        };
        let ratio = ratio_of(tail_ns);
        // The slow calls whose split is judged: those above p95, or, where
        // fewer than TAIL_MIN_SLOW_CALLS are, the calls from the judged value up.
        let t = if v.tail.calls >= TAIL_MIN_SLOW_CALLS {
            v.tail
        } else {
            v.agg.hist.tail_from(tail_ns)
        };
        if n < TAIL_MIN_CALLS
            || ratio < TAIL_MIN_RATIO
            || tail_ns.saturating_sub(v.p50) < TAIL_MIN_EXCESS_NS
            || (host && t.runnable_share >= TAIL_HOST_EXPLAINED_SHARE)
            || (host && v.class == OpClass::Sync && t.blocked_share >= TAIL_SYNC_BLOCKED_SHARE)
        {
            continue;
        }
        let severity = if ratio >= TAIL_MEDIUM_RATIO {
            Severity::Medium
        } else {
            Severity::Low
        };
        let (known, recommendation) = if !host {
            (
                "host context was not captured, so whether the CPU was taken is unknown".to_string(),
                "Re-record with gpusleuth trace to split the slow calls into on-CPU, runnable and blocked time."
                    .to_string(),
            )
        } else if t.blocked_share >= t.on_cpu_share {
            let rec = if v.class == OpClass::Sync {
                "The slow syncs waited for GPU work that took longer: profile the GPU side (Nsight Systems) \
                 to see which kernels or copies vary."
            } else {
                "The thread slept inside the call (an implicit synchronization, a driver lock, page faults): \
                 copies from pageable memory wait for earlier GPU work, so use pinned memory and async copies, \
                 and check for other threads contending on the same CUDA context."
            };
            (
                format!(
                    "the slow calls were {} blocked, {} on-CPU, {} runnable: not CPU contention; what they waited for is not visible to gpusleuth",
                    pct(t.blocked_share),
                    pct(t.on_cpu_share),
                    pct(t.runnable_share)
                ),
                rec.to_string(),
            )
        } else {
            (
                format!(
                    "the slow calls were {} on-CPU, {} blocked, {} runnable: the time went to work inside the CUDA library, not to other tasks",
                    pct(t.on_cpu_share),
                    pct(t.blocked_share),
                    pct(t.runnable_share)
                ),
                "On-CPU time inside CUDA calls is usually staging of pageable memory or lazy loading of modules on \
                 first use: use pinned host memory, warm up before measuring, or set CUDA_MODULE_LOADING=EAGER."
                    .to_string(),
            )
        };
        let tail_wall: u64 = v.agg.hist.above(95).1.wall_ns();
        out.push(Finding {
            kind: Kind::TailLatency,
            severity,
            op: v.op.to_string(),
            pids: v.pids.clone(),
            summary: if on_p99 {
                format!(
                    "{} p99 is {:.0}x its p50 ({} vs {}); {}",
                    v.op,
                    ratio,
                    fmt_ns(v.p99),
                    fmt_ns(v.p50),
                    known
                )
            } else {
                format!(
                    "{} slowest {} of {} calls took {} or more, {:.0}x its p50 of {}; {}",
                    v.op,
                    TAIL_MIN_SLOW_CALLS,
                    n,
                    fmt_ns(tail_ns),
                    ratio,
                    fmt_ns(v.p50),
                    known
                )
            },
            evidence: json!({
                "calls": n,
                "p50_ns": v.p50,
                "p95_ns": v.p95,
                "p99_ns": v.p99,
                "p99_over_p50": finite(ratio_of(v.p99)),
                "tail_ns": tail_ns,
                "tail_judged_on": if on_p99 { "p99".to_string() } else { format!("call {TAIL_MIN_SLOW_CALLS} from the slowest") },
                "tail_over_p50": finite(ratio),
                "tail": if host { json!(t) } else { json!(null) },
                "host_context": host,
                "not_known": "what the GPU and the driver were doing during the slow calls",
                "examples": ctx.examples(&v.agg.by_dur),
            }),
            culprits: Vec::new(),
            recommendation,
            impact_ns: tail_wall,
            wall_share: None,
        });
    }
    out
}

/// A ratio as JSON: null where p50 was 0.
fn finite(r: f64) -> serde_json::Value {
    if r.is_finite() {
        json!(r)
    } else {
        json!(null)
    }
}
