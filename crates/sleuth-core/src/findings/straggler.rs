//! `straggler`: one rank of an NCCL communicator enters its collectives last,
//! so every other rank waits for it inside NCCL. The finding names the rank,
//! its pid and host, and what its thread did meanwhile; the waiting ranks'
//! time is attributed to it rather than to NCCL.

use super::{Finding, FindingCulprit, Kind, Severity};
use crate::data::TraceData;
use crate::nccl::stragglers::{analyze, Cause, Straggler};
use serde_json::json;

/// Share of a communicator's lateness (collectives at least
/// `STRAGGLER_MIN_LATENESS_NS` late) that one rank must carry.
pub const STRAGGLER_MIN_SHARE: f64 = 0.6;
/// ... with at least this much lateness in total ...
pub const STRAGGLER_MIN_TOTAL_NS: u64 = 10_000_000;
/// ... over at least this many collectives.
pub const STRAGGLER_MIN_COLLECTIVES: u64 = 3;
/// Lateness as a share of the trace span from which severity is high / medium.
pub const STRAGGLER_HIGH_SHARE: f64 = 0.10;
pub const STRAGGLER_MEDIUM_SHARE: f64 = 0.02;

pub(super) fn straggler(data: &TraceData, span_ns: u64) -> Vec<Finding> {
    analyze(data, STRAGGLER_MIN_SHARE)
        .stragglers
        .into_iter()
        .filter(|s| {
            s.lateness_ns >= STRAGGLER_MIN_TOTAL_NS
                && s.late_collectives >= STRAGGLER_MIN_COLLECTIVES
        })
        .map(|s| finding(&s, span_ns))
        .collect()
}

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

fn finding(s: &Straggler, span_ns: u64) -> Finding {
    let share_of_span = super::share(s.lateness_ns, span_ns);
    let severity = Severity::grade(share_of_span, STRAGGLER_HIGH_SHARE, STRAGGLER_MEDIUM_SHARE);
    let t = &s.thread;
    let cause_part = match s.cause {
        Cause::HostCompute => t.host_compute_ns,
        Cause::InputWait => t.input_wait_ns,
        Cause::Preemption => t.preemption_ns,
        Cause::GpuWait => t.gpu_wait_ns,
    };
    let by_whom = match (s.cause, t.culprits.first()) {
        (Cause::Preemption, Some(c)) => format!(", mostly by {} (pid {})", c.comm, c.pid),
        _ => String::new(),
    };
    let summary = format!(
        "rank {} of {} (pid {} on {}) entered {} of {} matched collectives last, {} late in total \
         (max {}); the other ranks waited {} for it inside NCCL. Meanwhile its thread {} was {} of \
         that time in {}{}",
        s.rank,
        s.nranks,
        s.host_pid,
        s.host,
        s.late_collectives,
        s.matched,
        ms(s.lateness_ns),
        ms(s.max_lateness_ns),
        ms(s.caused_wait_ns),
        t.tid,
        super::pct(t.share(cause_part)),
        s.cause.describe(),
        by_whom
    );
    let recommendation = match s.cause {
        Cause::InputWait => "The rank waits for its input between steps: give its data loader more \
             workers or prefetching, check its storage/network reads, or balance the data shards.",
        Cause::HostCompute => "The rank computes longer on the CPU between collectives than the \
             others: look for rank-specific host work (logging, checkpointing, uneven preprocessing).",
        Cause::Preemption => "The rank's CPU is taken by other tasks: pin the training processes to \
             their own cores, or move the named tasks away.",
        Cause::GpuWait => "The rank waits on its GPU before the collective: its GPU is slower or \
             busier (throttling, another process, uneven work).",
    }
    .to_string();
    let split = |t: &crate::nccl::stragglers::ThreadSplit| {
        json!({
            "tid": t.tid,
            "window_ns": t.window_ns,
            "host_compute_ns": t.host_compute_ns,
            "input_wait_ns": t.input_wait_ns,
            "preemption_ns": t.preemption_ns,
            "gpu_wait_ns": t.gpu_wait_ns,
        })
    };
    let evidence = json!({
        "comm_id": s.comm_id,
        "rank": s.rank,
        "nranks": s.nranks,
        "pid": s.pid,
        "host": s.host,
        "host_pid": s.host_pid,
        "op": s.op,
        "matched_collectives": s.matched,
        "late_collectives": s.late_collectives,
        "lateness_ns": s.lateness_ns,
        "max_lateness_ns": s.max_lateness_ns,
        "share_of_lateness": s.share,
        "waited_ns": s.caused_wait_ns,
        "cause": s.cause.as_str(),
        "thread": split(&s.thread),
        "issuing_thread": s.issuing_thread.as_ref().map(split),
        "worst_collectives": s.examples.iter().map(|(seq, late)| json!({"seq": seq, "lateness_ns": late})).collect::<Vec<_>>(),
    });
    let lost: u64 = t.culprits.iter().fold(0u64, |a, c| a.saturating_add(c.ns));
    let culprits = t
        .culprits
        .iter()
        .take(super::TOP_CULPRITS)
        .map(|c| FindingCulprit {
            pid: c.pid,
            tid: None,
            comm: c.comm.clone(),
            runnable_ns: c.ns,
            share: super::share(c.ns, lost),
        })
        .collect();
    Finding {
        kind: Kind::Straggler,
        severity,
        op: s.op.to_string(),
        pids: vec![s.pid],
        summary,
        evidence,
        culprits,
        recommendation,
        impact_ns: s.caused_wait_ns,
        wall_share: Some(share_of_span.min(1.0)),
    }
}
