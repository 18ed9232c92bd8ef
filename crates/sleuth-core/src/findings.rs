//! Ranked, evidence-backed findings from a trace (`gpusleuth explain`).
//!
//! Rigor rule: only runnable-waiting time (the CPU was given to another
//! task) is blamed on CPU contention, with the tasks that held the CPU named.
//! Time blocked in sync calls is the host waiting for the GPU: the healthy
//! state of a GPU-bound program, stated in the summary line, never a finding.
//! gpusleuth's own threads are never culprits. Every threshold is a constant
//! below, documented with its exact trigger in docs/findings.md.

mod bottleneck;
mod fragmentation;
pub mod inputs;
mod memory;
mod straggler;
mod time;
mod verdict;

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
/// ... and at least this share of the trace (or window): round 58's tester
/// saw 3.8 ms of runnable time in a GPU-bound loop's 800 launch calls, 10%
/// of their own time and 0.3% of the program's, graded medium. (Each of
/// these counts only runnable time some task was seen holding the CPU
/// through, since round 59: the tracer's threads, never a culprit, had
/// 2.56 ms of one call.)
pub const PREEMPTION_MIN_TRACE_SHARE: f64 = 0.01;
/// Runnable share of the op's wall time from which severity is high / medium.
pub const PREEMPTION_HIGH_SHARE: f64 = 0.25;
pub const PREEMPTION_MEDIUM_SHARE: f64 = 0.10;

// --- the bottleneck verdicts (per CUDA-issuing thread, see threads.rs) -------
/// A thread's window (first to last CUDA call) must last at least this long
/// to be judged: shorter runs say nothing about a steady state.
pub const VERDICT_MIN_WINDOW_NS: u64 = 100_000_000;
/// Share of the window a verdict explains from which severity is high / medium.
pub const VERDICT_HIGH_SHARE: f64 = 0.5;
pub const VERDICT_MEDIUM_SHARE: f64 = 0.2;
/// GPU-idle evidence: measured GPU busy below this ...
pub const GPU_IDLE_MAX_BUSY: f64 = 0.5;
/// ... or, not measured: time inside syncs at most this share of the
/// window (the syncs returned almost at once) ...
pub const SYNC_AT_ONCE_MAX_SHARE: f64 = 0.10;
/// ... from at least this many syncs, with no host stretch before one of
/// them longer than SYNC_AT_ONCE_MAX_GAP_SHARE of the window: syncs that
/// sampled the GPU's queue through the window. One sync at the end that
/// blocked 35 ms (7% of the window) was read as "returned at once" and the
/// GPU as idle (host_bound; round 51's false-positive hunt): it had seen a
/// GPU with work queued, once.
pub const SYNC_AT_ONCE_MIN_SYNCS: u64 = 3;
pub const SYNC_AT_ONCE_MAX_GAP_SHARE: f64 = 0.5;
/// host_bound: on-CPU time between calls at least this share of the window.
pub const HOST_BOUND_MIN_SHARE: f64 = 0.5;
/// launch_bound: at least this many kernel launches ...
pub const LAUNCH_BOUND_MIN_LAUNCHES: u64 = 1000;
/// ... at most this much host time per launch (on-CPU between calls plus
/// recorded launch calls, over the launches) ...
pub const LAUNCH_BOUND_MAX_HOST_NS: u64 = 50_000;
/// ... and that host time at least this share of the window.
pub const LAUNCH_BOUND_MIN_SHARE: f64 = 0.5;
/// input_wait: blocked time between calls at least this share of the window ...
pub const INPUT_WAIT_MIN_SHARE: f64 = 0.2;
/// ... and at least this long.
pub const INPUT_WAIT_MIN_NS: u64 = 10_000_000;
/// The verdicts judge a thread's steady steps: its longest stretch between
/// two calls in which its process launched nothing is left out where it is
/// at least this share of its window (`bottleneck::left_out_pause`):
/// `set_device`, then 1.5 s loading a dataset, then a GPU-bound loop read
/// as input_wait woken by timers 100% (round 51's false-positive hunt) ...
pub const PAUSE_MIN_SHARE: f64 = VERDICT_MEDIUM_SHARE;
/// ... when the thread made at least this many calls and what is left is
/// at least `VERDICT_MIN_WINDOW_NS` long: a stretch between a thread's only
/// two recorded calls is the program, not a pause in it ...
pub const PAUSE_MIN_CALLS: u64 = 10;
/// ... and when it is at least this many times the next longest stretch:
/// a one-off, where a loop's stretches are alike.
pub const PAUSE_OUTLIER_RATIO: f64 = 3.0;
/// The summary line names a thread's slowest sync where it is at least
/// this long ...
pub const SLOW_SYNC_MIN_NS: u64 = 100_000_000;
/// ... and this many times the median sync (`verdict::slowest_sync_note`).
pub const SLOW_SYNC_MIN_RATIO: f64 = 10.0;
/// sync_stall: at least this many syncs ...
pub const SYNC_STALL_MIN_SYNCS: u64 = 20;
/// ... at least this many per second of the window ...
pub const SYNC_STALL_MIN_RATE: f64 = 10.0;
/// ... and the overlappable time (sum over syncs of min(host time since the
/// previous sync, the sync's wall time)) at least this share of the window.
pub const SYNC_STALL_MIN_SHARE: f64 = 0.2;
/// pageable_copy: on-CPU time inside copies from pageable memory at least
/// this share of the thread's window ...
pub const PAGEABLE_MIN_SHARE: f64 = 0.05;
/// ... and at least this long.
pub const PAGEABLE_MIN_NS: u64 = 10_000_000;

// --- allocation_failure -------------------------------------------------------
/// Any failed allocation is a finding (high severity).
pub const ALLOC_FAILURE_MIN_COUNT: usize = 1;

// --- memory_growth ----------------------------------------------------------
/// A (size, op) group of never-freed allocations needs at least this many ...
pub const GROWTH_MIN_ALLOCS: u64 = 3;
/// ... made in at least GROWTH_MIN_QUARTERS of the GROWTH_QUARTERS equal
/// parts of the process's CUDA activity (a steady rise, not a load at start).
pub const GROWTH_QUARTERS: usize = 4;
pub const GROWTH_MIN_QUARTERS: usize = 3;
/// ... over CUDA activity of at least this long: allocations made once in
/// a program whose CUDA work lasts 60 ms fall in every quarter of it, a
/// setup rather than a rise (round 51's false-positive hunt). The same
/// floor as the time verdicts' window.
pub const GROWTH_MIN_SPAN_NS: u64 = VERDICT_MIN_WINDOW_NS;
/// Growing bytes from which severity is high / medium (else low).
pub const GROWTH_HIGH_BYTES: u64 = 1 << 30;
pub const GROWTH_MEDIUM_BYTES: u64 = 64 << 20;

// --- allocation_churn ---------------------------------------------------------
/// A process must have re-allocated freed sizes at least this many times.
pub const CHURN_MIN_REALLOCS: u64 = 10;
/// ... that cost at least this share of the trace (time in the counted
/// allocation and free calls): churn worth fixing is paid for in time.
/// Round 56's tester: a healthy program re-allocating one buffer once per
/// epoch (11 epochs) was churn, low, on the count alone; such calls cost
/// ~0.01% of a run, while an emptied cache refilled every step costs far
/// more (each `cudaFree` waits for the device). Below 1% removing the
/// churn could not save enough to be a finding.
pub const CHURN_MIN_SHARE: f64 = 0.01;
/// Share of the trace duration spent in alloc/free calls from which severity is medium.
pub const CHURN_MEDIUM_SHARE: f64 = 0.05;

// --- tail_latency ---------------------------------------------------------------
/// An op needs at least this many per-call records ...
pub const TAIL_MIN_CALLS: u64 = 20;
/// ... a tail at least this many times its p50 ...
pub const TAIL_MIN_RATIO: f64 = 10.0;
/// ... tail - p50 at least this long (ignores tails of a few microseconds) ...
pub const TAIL_MIN_EXCESS_NS: u64 = 100_000;
/// ... where the tail is judged on p99, or on the call this many places from
/// the slowest when that is faster: below 200 calls p99 is one of the last
/// two calls, and one hiccup of the machine is not a tail.
pub const TAIL_MIN_SLOW_CALLS: u64 = 3;
/// ... and a tail whose runnable share stays below this (else the host explains it).
pub const TAIL_HOST_EXPLAINED_SHARE: f64 = PREEMPTION_MIN_TAIL_SHARE;
/// ... and, for a sync op, a tail whose blocked share stays below this: its
/// slow calls blocked waited for the GPU, the healthy state of a GPU-bound
/// program (syncs of uneven GPU work, one short and one long each step,
/// were a "tail" 410x its p50 until round 51).
pub const TAIL_SYNC_BLOCKED_SHARE: f64 = 0.5;
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
    HostBound,
    InputWait,
    LaunchBound,
    SyncStall,
    PageableCopy,
    CpuPreemption,
    MemoryGrowth,
    Fragmentation,
    AllocationChurn,
    TailLatency,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::AllocationFailure => "allocation_failure",
            Kind::Straggler => "straggler",
            Kind::HostBound => "host_bound",
            Kind::InputWait => "input_wait",
            Kind::LaunchBound => "launch_bound",
            Kind::SyncStall => "sync_stall",
            Kind::PageableCopy => "pageable_copy",
            Kind::CpuPreemption => "cpu_preemption",
            Kind::MemoryGrowth => "memory_growth",
            Kind::Fragmentation => "fragmentation",
            Kind::AllocationChurn => "allocation_churn",
            Kind::TailLatency => "tail_latency",
        }
    }

    /// The kinds ranked ahead of every other by rule, not by the share of
    /// time they explain: a failed allocation (the program is broken, not
    /// slow) and a straggling rank (it explains the others' verdicts).
    pub fn ranks_ahead_by_rule(self) -> bool {
        matches!(self, Kind::AllocationFailure | Kind::Straggler)
    }

    /// The kinds that say where a thread's wall time went (ranked by the share they explain).
    pub fn is_time_verdict(self) -> bool {
        matches!(
            self,
            Kind::HostBound
                | Kind::InputWait
                | Kind::LaunchBound
                | Kind::SyncStall
                | Kind::PageableCopy
                | Kind::CpuPreemption
        )
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
    /// The thread, where culprits are threads of one process (`input_wait`'s
    /// wakers: two loader workers of a process were two entries that read
    /// the same: round 55's docs tester).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
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
    /// concerned (memory_growth: bytes; allocation_failure: 0).
    #[serde(skip)]
    pub impact_ns: u64,
    /// Share of the wall time this finding explains (the issuing thread's
    /// window for the verdicts, the trace for cpu_preemption), 0.0..=1.0;
    /// findings are ranked by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_share: Option<f64>,
}

/// Findings plus what could not be evaluated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// One line on top: GPU busy and where the main issuing thread's time
    /// went ("GPU busy 9%; the main thread ... spent 88% computing on the CPU
    /// between CUDA calls: host-bound"). None when no thread issued CUDA calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    pub findings: Vec<Finding>,
    /// Where each CUDA-issuing thread's time went, largest window first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<crate::threads::ThreadSplit>,
    /// Limits of this trace (no host context, dropped events), in plain words.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Events lost during capture (`stats.drops`' total; a note says their
    /// share): without findings, the answer is "nothing abnormal in what
    /// was recorded", never a clean trace.
    #[serde(skip_serializing_if = "crate::ledger::is_zero")]
    pub events_lost: u64,
}

/// The moment whose allocator state a fragmentation finding of `end`
/// describes, when not the end (see `allocator::KnownViews`).
pub fn fragmentation_moment(end: &crate::allocator::AllocatorState) -> Option<u64> {
    fragmentation::moment_of(end)
}

/// The moments whose state the fragmentation finding of a later state of
/// the same replay may describe (the reserved peak so far, the first
/// failed request the gap could have served): [`fragmentation_moment`]
/// of any later state is one of them, or one after `end`.
pub fn fragmentation_moments_kept(end: &crate::allocator::AllocatorState) -> Vec<u64> {
    fragmentation::moments_kept(end)
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
    explain_report_pinned(data, inputs::PinnedState::default(), &[])
}

/// [`explain_report`] of a scope's calls (a window, an op), with the host
/// ranges `pinned` live when it began and the pinning calls of other ops
/// in it, `pinning` (`FindingInputs::of_pinned`): a copy from memory
/// pinned before the window, or by another op, is pinned, not pageable.
pub fn explain_report_pinned(
    data: &TraceData,
    pinned: inputs::PinnedState,
    pinning: &[crate::CallEvent],
) -> Explanation {
    explain_report_pinned_with(data, pinned, pinning, data)
}

/// [`explain_report_pinned`], the allocator views from `allocator_reads`
/// (a window's, replayed from the file's start: `sleuth_store`).
pub fn explain_report_pinned_with(
    data: &TraceData,
    pinned: inputs::PinnedState,
    pinning: &[crate::CallEvent],
    allocator_reads: &dyn crate::allocator::AllocatorReads,
) -> Explanation {
    let culprits =
        crate::culprits::call_culprits(&data.calls, &data.waits, crate::threads::tracer_pid(data));
    let inputs = inputs::FindingInputs::of_pinned(data, &culprits, pinned, pinning);
    let ledgers = crate::ledger::ledger(data, None);
    explain_inputs_with(data, &inputs, &ledgers, allocator_reads)
}

/// Ranked findings and notes given per-call culprits aligned with `data.calls`.
pub fn explain_with(data: &TraceData, per_call_culprits: &[Vec<Culprit>]) -> Explanation {
    explain_from(data, per_call_culprits, &crate::ledger::ledger(data, None))
}

/// [`explain_with`] given the trace's ledgers too (`ledger(data, None)`), so
/// a caller that also shows the ledger (the report, the export) computes it once.
pub fn explain_from(
    data: &TraceData,
    per_call_culprits: &[Vec<Culprit>],
    ledgers: &[crate::ledger::ProcessLedger],
) -> Explanation {
    // gpusleuth's own threads are never culprits: the accumulators drop them.
    let inputs = inputs::FindingInputs::of(data, per_call_culprits);
    explain_inputs(data, &inputs, ledgers)
}

/// The conclusions from the per-call aggregates (`inputs`, from
/// [`inputs::FindingInputs::of`] or read from a trace's finding rollups).
/// Of `data`, only what is small is read for them (counts, stats, GPU samples,
/// stacks, the span), plus what the memory and straggler findings need: the
/// memory-op calls and allocator events, the collectives.
pub fn explain_inputs(
    data: &TraceData,
    inputs: &inputs::FindingInputs,
    ledgers: &[crate::ledger::ProcessLedger],
) -> Explanation {
    explain_inputs_with(data, inputs, ledgers, data)
}

/// [`explain_inputs`], the allocator views from `allocator_reads` (a
/// loaded trace rebuilds them from its calls, a file's reader gives those
/// it rebuilt without holding them: `allocator::KnownViews`).
pub fn explain_inputs_with(
    data: &TraceData,
    inputs: &inputs::FindingInputs,
    ledgers: &[crate::ledger::ProcessLedger],
    allocator_reads: &dyn crate::allocator::AllocatorReads,
) -> Explanation {
    let site = |id: Option<u64>| crate::sites::label_of(data, id);
    let ctx = time::Context::new(
        inputs,
        data.has_host_context,
        crate::TraceSpan::of(data),
        data.window_ns,
        &site,
    );
    let threads = if data.has_host_context {
        inputs.splits.clone()
    } else {
        Vec::new()
    };
    let gpu = |a: u64, b: u64| crate::gpu_busy::gpu_busy(data, a, b);
    let places = bottleneck::LaunchPlaces::of(data);
    let stat = |name: &str| data.stats.get(name).copied().unwrap_or(0);
    let trap_ns = stat(crate::threads::PROBE_TRAP_STAT);
    let call_trap_ns = stat(crate::threads::PROBE_CALL_TRAP_STAT);
    let views = bottleneck::views(
        &data.counts,
        &threads,
        inputs,
        &places,
        (trap_ns, call_trap_ns),
        gpu,
    );
    let mut findings = Vec::new();
    // The processes that issue CUDA calls: a thread woken by one of them
    // waited on its GPU work (input_wait, the summary line).
    let cuda_pids: std::collections::BTreeSet<u32> = threads.iter().map(|t| t.pid).collect();
    if data.has_host_context {
        findings.extend(time::cpu_preemption(&ctx));
        for v in views.iter().filter(|v| !v.too_short) {
            // host_bound and launch_bound count the runnable time between
            // calls as host time and name its holders: the thread's
            // contention is a finding of its own only where neither fires
            // (round 56's tester: launch_bound 99.9% and contention 50.2%
            // claimed one 591 ms).
            let host = bottleneck::host_bound(v);
            let launch = bottleneck::launch_bound(v);
            if host.is_none() && launch.is_none() {
                findings.extend(bottleneck::contention_between_calls(v));
            }
            findings.extend(host);
            findings.extend(bottleneck::input_wait(v, &cuda_pids));
            findings.extend(launch);
            findings.extend(bottleneck::sync_stall(v));
        }
        findings.extend(bottleneck::pageable_copy(&views));
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
    let mut memory_notes = Vec::new();
    for l in ledgers {
        findings.extend(memory::allocation_failure(l));
        findings.extend(memory::memory_growth(l, inputs.cuda_span(l.pid)));
        let trap_each = bottleneck::call_trap_each(&threads, l.pid, call_trap_ns);
        findings.extend(memory::allocation_churn(l, ctx.bounds(), trap_each));
        memory_notes.extend(memory::held_at_end_note(l));
    }
    let allocators = allocator_reads.views(ledgers);
    for v in allocators.values() {
        findings.extend(fragmentation::fragmentation(v, ledgers, allocator_reads));
    }
    rank(&mut findings);
    let summary = verdict::summary_line(
        data.has_host_context,
        &threads,
        &cuda_pids,
        &views,
        &findings,
        &places,
        &gpu,
    );
    let drops = crate::stats::drop_counters(data);
    let mut notes = notes(data, &drops);
    notes.extend(verdict::tracer_note(&threads));
    notes.extend(verdict::probe_note(&views, trap_ns, call_trap_ns));
    notes.extend(verdict::unknown_without_host_context(
        data.has_host_context,
        inputs,
        &gpu,
    ));
    notes.extend(memory_notes);
    notes.extend(
        allocators
            .values()
            .filter_map(|v| v.refusal().map(|r| format!("pid {}: {r}", v.pid))),
    );
    Explanation {
        summary,
        findings,
        threads,
        notes,
        events_lost: drops.get("total").copied().unwrap_or(0),
    }
}

/// A share as a whole percentage: `0.873` reads `87%`.
fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// `part / whole`, 0 for an empty whole (a share of nothing is nothing).
fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Failed allocations first (the program is broken, not slow), then a
/// straggling rank (docs/nccl.md); then the
/// findings that explain a share of the wall time, largest share first (the
/// verdict that explains most of the lost time leads); then the rest by
/// severity, kind (slowdowns before information) and impact; op and pids
/// keep the order stable.
fn rank(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        let group = |f: &Finding| match (f.kind, f.wall_share) {
            (Kind::AllocationFailure, _) => 0,
            // One rank that makes every other rank wait explains the others' verdicts.
            (Kind::Straggler, _) => 1,
            (_, Some(_)) => 2,
            _ => 3,
        };
        let share = |f: &Finding| f.wall_share.unwrap_or(0.0);
        group(a)
            .cmp(&group(b))
            .then(share(b).total_cmp(&share(a)))
            .then(a.severity.cmp(&b.severity))
            .then(a.kind.cmp(&b.kind))
            .then(b.impact_ns.cmp(&a.impact_ns))
            .then(a.op.cmp(&b.op))
            .then(a.pids.cmp(&b.pids))
    });
}

/// `drops`: the trace's [`crate::stats::drop_counters`].
fn notes(data: &TraceData, drops: &std::collections::BTreeMap<String, u64>) -> Vec<String> {
    let mut out = Vec::new();
    if !data.has_host_context {
        out.push(
            "This trace has no host scheduler context (imported): cpu_preemption, host_bound, input_wait, \
             launch_bound, sync_stall and pageable_copy cannot be evaluated, and tail_latency cannot say whether \
             the CPU was taken."
                .to_string(),
        );
    }
    if data.has_host_context && data.copy_host_ptrs_unknown {
        out.push(
            "This trace records no host pointer for its copies (written before they were recorded): \
             pageable_copy cannot be evaluated, whether the copies' host memory was pinned is unknown."
                .to_string(),
        );
    }
    let lost = drops.get("total").copied().unwrap_or(0);
    if let Some(share) = crate::stats::lost_share_of(drops, &crate::stats::event_counters(data)) {
        out.push(format!(
            "{lost} events ({share}) were dropped during capture: counts and findings may be incomplete."
        ));
    }
    let edges = crate::stats::attach_edges(data);
    let before = edges.get("return_without_entry").copied().unwrap_or(0);
    let open = edges
        .get(crate::stats::EDGE_OPEN_AT_END)
        .copied()
        .unwrap_or(0);
    let cut = edges
        .get(crate::stats::EDGE_CUT_BY_EXIT)
        .copied()
        .unwrap_or(0);
    if before + open > 0 {
        out.push(format!(
            "Attach edges, not losses: {before} call(s) began before tracing and returned during it \
             (not recorded), {open} call(s) were still in progress when the trace stopped."
        ));
    }
    if cut > 0 {
        out.push(format!(
            "{cut} call(s) never returned: their thread exited mid-call (a process killed or \
             exiting while inside CUDA); not recorded."
        ));
    }
    let unseen = crate::record::stat::NAMES[crate::record::stat::SWITCH_IN_UNSEEN];
    let settled = data.stats.get(unseen).copied().unwrap_or(0);
    if settled > 0 {
        out.push(format!(
            "{settled} wait(s) were closed by the capture itself: the kernel ran no scheduler probe \
             for the switch back to the thread, so their runnable part is estimated from its CPU time \
             (switch_in_unseen)."
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
#[cfg(test)]
mod verdict_tests;
