//! What each section of the report draws, from one of two sources: the
//! whole trace in memory ([`Inputs::full`]: `Analysis::of` over every call
//! and wait), or the stored aggregates and the few rows the report shows
//! ([`Inputs::lean`]: `sleuth_store::report_reads`, memory bounded by the
//! aggregates, issue 16). Both give the same report, percentiles from the
//! histograms within their bound (docs/schema.md "Rollups").

use super::SLOWEST_CALLS;
use crate::window::Window;
use sleuth_core::analysis::Analysis;
use sleuth_core::findings::Explanation;
use sleuth_core::ledger::ProcessLedger;
use sleuth_core::rollup::OpRollup;
use sleuth_core::sites::{FlameNode, SiteMemory};
use sleuth_core::stats::nearest_rank;
use sleuth_core::{CallEvent, Culprit, TraceData, TraceSpan};
use sleuth_store::report_reads::{FileParts, LeanReport, WindowCalls};
use sleuth_store::run_report::RunReport;
use std::collections::{BTreeMap, HashMap};

/// One op's latency distribution (call durations, ns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyRow {
    pub op: &'static str,
    pub n: u64,
    pub total: u64,
    pub min: u64,
    pub p25: u64,
    pub p50: u64,
    pub p75: u64,
    pub p99: u64,
    pub max: u64,
}

/// Everything the report's sections read.
pub struct Inputs {
    /// The trace's processes, counters, kernel counts, stacks, NVML samples
    /// and session times (the lean source holds no wait and at most the
    /// memory calls of processes with allocator blocks).
    pub data: TraceData,
    pub ledgers: Vec<ProcessLedger>,
    pub explanation: Explanation,
    pub span: TraceSpan,
    /// Per-call records and waits the trace holds.
    pub calls: u64,
    pub waits: u64,
    /// Calls per process, kernel-counted ones included.
    pub calls_by_pid: HashMap<u32, u64>,
    /// Largest total time first, then by op name.
    pub latency: Vec<LatencyRow>,
    /// The slowest calls not nested in another, with the tasks that held the CPU.
    pub slowest: Vec<(CallEvent, Vec<Culprit>)>,
    /// Device memory by site and by call path; empty without call sites.
    pub sites: Vec<SiteMemory>,
    /// Whether the sites' bytes live at each process's peak are known (not
    /// over a run's files: `sleuth_store::run_report`).
    pub sites_at_peak: bool,
    pub flame: FlameNode,
    /// The window the call sections are narrowed to ([`Inputs::narrowed_to`]).
    pub window: Option<Window>,
    /// What the window's sections say about the kernel-counted calls.
    pub window_notes: Vec<String>,
}

/// What a window's summary and latency sections count of the
/// kernel-counted calls (`WindowCounts::notes`).
const WINDOW_COUNT: &str = "the estimate in its summary, latency and process sections, \
     and its findings only those certainly in the window";

impl Inputs {
    /// From the whole trace in memory.
    pub fn full(data: TraceData) -> Inputs {
        let analysis = Analysis::of(&data);
        let mut idx: Vec<usize> = (0..data.calls.len())
            .filter(|&i| !data.calls[i].nested)
            .collect();
        idx.sort_by_key(|&i| (std::cmp::Reverse(data.calls[i].dur_ns), i));
        idx.truncate(SLOWEST_CALLS);
        let slowest = idx
            .into_iter()
            .map(|i| {
                let culprits = analysis
                    .per_call_culprits
                    .get(i)
                    .cloned()
                    .unwrap_or_default();
                (data.calls[i].clone(), culprits)
            })
            .collect();
        let mut by_op: BTreeMap<&'static str, Vec<u64>> = BTreeMap::new();
        let mut per_pid: BTreeMap<u32, u64> = BTreeMap::new();
        for c in &data.calls {
            by_op.entry(c.op_name()).or_default().push(c.dur_ns);
            *per_pid.entry(c.pid).or_default() += 1;
        }
        let latency = by_op
            .into_iter()
            .map(|(op, mut d)| {
                d.sort_unstable();
                let p = |q: u32| nearest_rank(&d, q).unwrap_or(0);
                LatencyRow {
                    op,
                    n: d.len() as u64,
                    total: d.iter().sum(),
                    min: d[0],
                    p25: p(25),
                    p50: p(50),
                    p75: p(75),
                    p99: p(99),
                    max: *d.last().unwrap_or(&0),
                }
            })
            .collect();
        let (sites, flame) = if data.stacks.is_empty() {
            (Vec::new(), FlameNode::default())
        } else {
            (
                sleuth_core::sites::memory_by_site(&data, &analysis.ledgers),
                sleuth_core::sites::allocated_by_path(&data),
            )
        };
        Inputs {
            calls: data.calls.len() as u64,
            waits: data.waits.len() as u64,
            calls_by_pid: with_counts(per_pid, &data),
            latency: by_total(latency),
            slowest,
            sites,
            sites_at_peak: true,
            flame,
            window: None,
            window_notes: Vec::new(),
            ledgers: analysis.ledgers,
            explanation: analysis.explanation,
            span: analysis.span,
            data,
        }
    }

    /// The sections about calls narrowed to a window (`report --from/--to`):
    /// its findings, latency per op, slowest calls, calls per process and
    /// kernel-counted calls (the estimate placed by the tracer's samples);
    /// the charts over time, the call sites and the process tree stay the
    /// whole trace's (the report draws the window on the charts).
    pub fn narrowed_to(
        self,
        window: Window,
        part: WindowCalls,
        mut explanation: Explanation,
    ) -> Inputs {
        let mut data = self.data;
        data.counts = part.counts.estimates();
        // One note on the kernel-counted calls, in the summary, for every
        // section (the findings' own says what they judged on).
        let findings_notes = part.counts.notes(sleuth_store::window::FINDINGS_COUNT);
        explanation.notes.retain(|n| !findings_notes.contains(n));
        let window_notes = part.counts.notes(WINDOW_COUNT);
        Inputs {
            calls: part.calls,
            // Not counted per window (the summary leaves them out).
            waits: 0,
            calls_by_pid: with_counts(part.calls_by_pid, &data),
            latency: by_total(latency_of(&part.ops)),
            slowest: part
                .slowest
                .into_iter()
                .map(|s| (s.call, s.culprits))
                .collect(),
            explanation,
            data,
            window: Some(window),
            window_notes,
            ..self
        }
    }

    /// From the stored aggregates and the slowest calls.
    pub fn lean(r: LeanReport) -> Inputs {
        let explanation = r.lean.explanation();
        let data = r.lean.data;
        let (sites, flame) = match &r.sites {
            Some(s) => (
                s.sites.clone(),
                sleuth_core::sites::allocated_by_path_of(&data, s.allocs.iter().copied()),
            ),
            None => (Vec::new(), FlameNode::default()),
        };
        let sites = Sites {
            table: sites,
            at_peak: true,
            flame,
        };
        Inputs::of_parts(r.parts, data, r.lean.ledgers, explanation, sites)
    }

    /// From a run's files added up (`report --db DIR`) and `explanation`
    /// (the run's, or its window's).
    pub fn run(r: RunReport, explanation: Explanation) -> Inputs {
        let sites = Sites {
            table: r.sites(),
            // Not known over several files (`sleuth_store::run_report`).
            at_peak: false,
            flame: match &r.allocs {
                Some(a) => sleuth_core::sites::allocated_by_path_of(&r.run.data, a.iter().copied()),
                None => FlameNode::default(),
            },
        };
        Inputs::of_parts(r.parts, r.run.data, r.run.ledgers, explanation, sites)
    }

    /// From what the report reads of a trace or a run besides its base data,
    /// ledgers, explanation and sites.
    fn of_parts(
        parts: FileParts,
        data: TraceData,
        ledgers: Vec<ProcessLedger>,
        explanation: Explanation,
        sites: Sites,
    ) -> Inputs {
        Inputs {
            calls: parts.calls,
            waits: parts.waits,
            calls_by_pid: with_counts(parts.calls_by_pid, &data),
            latency: by_total(latency_of(&parts.ops)),
            slowest: parts
                .slowest
                .into_iter()
                .map(|s| (s.call, s.culprits))
                .collect(),
            sites: sites.table,
            sites_at_peak: sites.at_peak,
            flame: sites.flame,
            window: None,
            window_notes: Vec::new(),
            ledgers,
            explanation,
            span: parts.span,
            data,
        }
    }
}

/// The call-site sections' inputs.
struct Sites {
    table: Vec<SiteMemory>,
    /// Whether the bytes at each process's peak are known.
    at_peak: bool,
    flame: FlameNode,
}

/// The latency rows of per-op rollups (percentiles within the histogram's
/// bound; the maximum exact).
fn latency_of(ops: &BTreeMap<u16, OpRollup>) -> Vec<LatencyRow> {
    ops.iter()
        .filter(|(_, o)| o.count > 0)
        .filter_map(|(&op, o)| {
            let info = sleuth_core::op_by_id(op)?;
            let p = |q: u32| o.percentile_ns(q).unwrap_or(0);
            Some(LatencyRow {
                op: info.name,
                n: o.count,
                total: o.total_ns,
                min: o.min_ns().unwrap_or(0),
                p25: p(25),
                p50: p(50),
                p75: p(75),
                p99: p(99),
                max: o.max_ns,
            })
        })
        .collect()
}

/// Per-call records per process plus the kernel-counted calls.
fn with_counts(per_pid: BTreeMap<u32, u64>, data: &TraceData) -> HashMap<u32, u64> {
    let mut calls: HashMap<u32, u64> = per_pid.into_iter().collect();
    for c in &data.counts {
        *calls.entry(c.pid).or_default() += c.count;
    }
    calls
}

/// Largest total time first, like `gpusleuth stats`.
fn by_total(mut rows: Vec<LatencyRow>) -> Vec<LatencyRow> {
    rows.sort_by_key(|r| (std::cmp::Reverse(r.total), r.op));
    rows
}
