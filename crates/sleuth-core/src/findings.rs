//! Ranked, evidence-backed findings from a trace (`gpusleuth explain`).
//!
//! Rigor rule: only runnable-waiting time (the CPU was given to another
//! task) is blamed on CPU contention, with the tasks that held the CPU named.
//! Blocked time in sync calls is the host waiting for the GPU (`gpu_wait`):
//! informational, never blamed on the OS. Every threshold is a constant
//! below, documented with its exact trigger in docs/findings.md.

mod fragmentation;
mod memory;
mod straggler;
mod time;

pub use straggler::{
    STRAGGLER_HIGH_SHARE, STRAGGLER_MEDIUM_SHARE, STRAGGLER_MIN_COLLECTIVES, STRAGGLER_MIN_SHARE,
    STRAGGLER_MIN_TOTAL_NS,
};

use crate::data::TraceData;
use crate::event::Culprit;
use serde::Serialize;

// --- cpu_preemption -------------------------------------------------------
/// An op's calls must have lost at least this much runnable-waiting time in total.
pub const PREEMPTION_MIN_RUNNABLE_NS: u64 = 1_000_000;
/// ... and runnable time must be at least this share of the op's wall time ...
pub const PREEMPTION_MIN_SHARE: f64 = 0.05;
/// ... or at least this share of the wall time of its tail (calls above p95).
pub const PREEMPTION_MIN_TAIL_SHARE: f64 = 0.5;
/// Runnable share of the op's wall time from which severity is high / medium.
pub const PREEMPTION_HIGH_SHARE: f64 = 0.25;
pub const PREEMPTION_MEDIUM_SHARE: f64 = 0.10;

// --- gpu_wait ---------------------------------------------------------------
/// A sync op must have been blocked at least this long in total ...
pub const GPU_WAIT_MIN_NS: u64 = 10_000_000;
/// ... and at least this share of the trace's duration (thread-time, so
/// several threads waiting together can exceed 1).
pub const GPU_WAIT_MIN_SHARE: f64 = 0.10;

// --- allocation_failure -------------------------------------------------------
/// Any failed allocation is a finding (high severity).
pub const ALLOC_FAILURE_MIN_COUNT: usize = 1;

// --- unfreed_memory -----------------------------------------------------------
/// A process with at least this many unfreed device bytes at the end.
pub const UNFREED_MIN_BYTES: u64 = 1;
/// Unfreed bytes from which severity is high / medium (else low).
pub const UNFREED_HIGH_BYTES: u64 = 1 << 30;
pub const UNFREED_MEDIUM_BYTES: u64 = 64 << 20;

// --- allocation_churn ---------------------------------------------------------
/// A process must have re-allocated freed sizes at least this many times.
pub const CHURN_MIN_REALLOCS: u64 = 10;
/// Share of the trace duration spent in alloc/free calls from which severity is medium.
pub const CHURN_MEDIUM_SHARE: f64 = 0.05;

// --- tail_latency ---------------------------------------------------------------
/// An op needs at least this many per-call records ...
pub const TAIL_MIN_CALLS: u64 = 20;
/// ... a p99 at least this many times its p50 ...
pub const TAIL_MIN_RATIO: f64 = 10.0;
/// ... p99 - p50 at least this long (ignores tails of a few microseconds) ...
pub const TAIL_MIN_EXCESS_NS: u64 = 100_000;
/// ... and a tail whose runnable share stays below this (else the host explains it).
pub const TAIL_HOST_EXPLAINED_SHARE: f64 = PREEMPTION_MIN_TAIL_SHARE;
/// p99/p50 from which severity is medium (else low).
pub const TAIL_MEDIUM_RATIO: f64 = 100.0;

/// How many example calls a finding shows.
pub const EXAMPLE_CALLS: usize = 3;
/// How many culprits a finding names.
pub const TOP_CULPRITS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    AllocationFailure,
    Straggler,
    CpuPreemption,
    UnfreedMemory,
    Fragmentation,
    AllocationChurn,
    TailLatency,
    GpuWait,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::AllocationFailure => "allocation_failure",
            Kind::Straggler => "straggler",
            Kind::CpuPreemption => "cpu_preemption",
            Kind::UnfreedMemory => "unfreed_memory",
            Kind::Fragmentation => "fragmentation",
            Kind::AllocationChurn => "allocation_churn",
            Kind::TailLatency => "tail_latency",
            Kind::GpuWait => "gpu_wait",
        }
    }
}

/// Ordered most severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    High,
    Medium,
    Low,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::High => "high",
            Severity::Medium => "medium",
            Severity::Low => "low",
        }
    }
}

/// A task that held the CPU while the finding's calls were runnable-waiting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FindingCulprit {
    pub pid: u32,
    pub comm: String,
    pub runnable_ns: u64,
    /// Share of the finding's lost (runnable-waiting) time, 0.0..=1.0.
    pub share: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub kind: Kind,
    pub severity: Severity,
    /// The op concerned (for process-level memory findings: the main allocation op).
    pub op: String,
    pub pids: Vec<u32>,
    pub summary: String,
    pub evidence: serde_json::Value,
    pub culprits: Vec<FindingCulprit>,
    pub recommendation: String,
    /// Ranking key among findings of equal severity and kind: the time
    /// concerned (unfreed_memory: bytes; allocation_failure: 0).
    #[serde(skip)]
    pub impact_ns: u64,
}

/// Findings plus what could not be evaluated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    pub findings: Vec<Finding>,
    /// Limits of this trace (no host context, dropped events), in plain words.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Ranked findings of a trace.
pub fn explain(data: &TraceData) -> Vec<Finding> {
    explain_report(data).findings
}

/// The `n` most important findings (the live view's panel).
pub fn top_findings(data: &TraceData, n: usize) -> Vec<Finding> {
    let mut f = explain(data);
    f.truncate(n);
    f
}

/// Ranked findings and notes, culprits joined from the trace's waits.
pub fn explain_report(data: &TraceData) -> Explanation {
    explain_with(
        data,
        &crate::culprits::call_culprits(&data.calls, &data.waits),
    )
}

/// Ranked findings and notes given per-call culprits aligned with `data.calls`.
pub fn explain_with(data: &TraceData, per_call_culprits: &[Vec<Culprit>]) -> Explanation {
    let ctx = time::Context::new(data, per_call_culprits);
    let mut findings = Vec::new();
    if data.has_host_context {
        findings.extend(time::cpu_preemption(&ctx));
        findings.extend(time::gpu_wait(&ctx));
    }
    let stragglers = straggler::straggler(data, ctx.span_ns());
    // A collective's slow tail on the waiting ranks is the straggler's doing,
    // not NCCL's: the straggler finding explains it.
    let tails = time::tail_latency(&ctx).into_iter().filter(|f| {
        stragglers.is_empty()
            || crate::op_by_name(&f.op).map(|o| o.class) != Some(crate::OpClass::Collective)
    });
    findings.extend(tails);
    findings.extend(stragglers);
    let ledgers = crate::ledger::ledger(data, None);
    let span = ctx.span_ns();
    for l in &ledgers {
        findings.extend(memory::allocation_failure(l));
        findings.extend(memory::unfreed_memory(l));
        findings.extend(memory::allocation_churn(l, span));
    }
    let allocators = crate::allocator::allocator_views(data, None, &ledgers);
    for v in allocators.values() {
        findings.extend(fragmentation::fragmentation(data, v, &ledgers));
    }
    rank(&mut findings);
    let mut notes = notes(data);
    notes.extend(
        allocators
            .values()
            .filter_map(|v| v.refusal().map(|r| format!("pid {}: {r}", v.pid))),
    );
    Explanation { findings, notes }
}

/// Severity first, then kind (failures before slowdowns before information),
/// then impact, then op for a stable order.
fn rank(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        a.severity
            .cmp(&b.severity)
            .then(a.kind.cmp(&b.kind))
            .then(b.impact_ns.cmp(&a.impact_ns))
            .then(a.op.cmp(&b.op))
            .then(a.pids.cmp(&b.pids))
    });
}

fn notes(data: &TraceData) -> Vec<String> {
    let mut out = Vec::new();
    if !data.has_host_context {
        out.push(
            "This trace has no host scheduler context (imported): cpu_preemption and gpu_wait cannot be \
             evaluated, and tail_latency cannot say whether the CPU was taken."
                .to_string(),
        );
    }
    let drops = crate::stats::drop_counters(data);
    let lost = drops.get("total").copied().unwrap_or(0);
    if lost > 0 {
        out.push(format!(
            "{lost} events were dropped during capture: counts and findings may be incomplete."
        ));
    }
    out
}

/// Human name of common CUDA error codes (runtime and driver agree on these values).
pub fn error_name(code: i64) -> &'static str {
    match code {
        1 => "invalid value",
        2 => "out of memory",
        3 => "not initialized",
        4 => "deinitialized",
        100 => "no device",
        101 => "invalid device",
        _ => "error",
    }
}

#[cfg(test)]
mod tests;
