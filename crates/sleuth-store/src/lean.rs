//! The lean load (issue 16): what the explanation of a whole trace or of
//! one process reads, without its calls and waits — the stored finding
//! aggregates, the call groups, the ledgers streamed from the memory calls,
//! and the allocator views rebuilt from the memory calls of processes with
//! allocator blocks, read from the file at each pass (round 25; before,
//! those calls were loaded). `explain`, the
//! Perfetto export and the MCP `findings` tool share it, so their memory
//! does not grow with the trace. The answer equals the full load's, percentiles within the
//! histogram's bound (docs/schema.md).

use crate::budget::ReadBudget;
use crate::reader::Trace;
use crate::stream::MemoryTrace;
use crate::StoreError;
use sleuth_core::findings::inputs::FindingInputs;
use sleuth_core::ledger::ProcessLedger;
use sleuth_core::TraceData;

/// What [`load`] reads: the explanation needs nothing more.
pub struct Lean {
    /// The trace without calls and waits (the memory view's base), with the
    /// op counts, the NCCL calls and the span's end.
    pub data: TraceData,
    pub ledgers: Vec<ProcessLedger>,
    pub inputs: FindingInputs,
    /// The allocator views the explanation reads (at the end, and at the
    /// moments their fragmentation findings describe).
    pub allocators: sleuth_core::allocator::KnownViews,
    /// The memory view the load read through (its call groups, its streamed reader).
    /// Its `base` was moved into `data`: what labels sites from the view's
    /// context (`MemoryTrace::stored_sites`) must be given `data` instead
    /// (`site_rollup::memory_by_site`, as the report does).
    pub view: MemoryTrace,
    /// The file's number in a `trace --rotate` run whose earlier files'
    /// pinned memory is not known here (None: not a later file of a run,
    /// or one whose copies were judged with the ranges its previous file
    /// stored, `run_pinned`, or by the tracer against the whole run's).
    pub run_file: Option<u64>,
}

impl Lean {
    /// The explanation, as `sleuth_core::findings::explain_report` gives it
    /// for the loaded trace; a later file of a run says what it cannot know.
    pub fn explanation(&self) -> sleuth_core::findings::Explanation {
        let mut e = sleuth_core::findings::explain_inputs_with(
            &self.data,
            &self.inputs,
            &self.ledgers,
            &self.allocators,
        );
        let pageable = e
            .findings
            .iter()
            .any(|f| f.kind == sleuth_core::findings::Kind::PageableCopy);
        if let (Some(n), true) = (self.run_file.filter(|&n| n > 1), pageable) {
            e.notes.push(format!(
                "This file is part {n} of a `trace --rotate` run: host memory pinned in the run's earlier files is \
                 not known here, so copies from it count as pageable; `explain --db` on the run's directory (or \
                 `--last` on it) judges them with it."
            ));
        }
        e
    }
}

/// The lean load of a large file without rollups (the one a run's tracer
/// is still writing, a killed writer's; more than `above_rows` call rows):
/// the finding inputs, ledgers and frame from one streamed pass over its
/// calls (`scoped::whole_streamed_parts`, as `explain` reads such a file),
/// the memory view beside them for the report's per-site reads. None where
/// that pass gives None (then the file is loaded).
pub fn streamed(
    trace: &Trace,
    pid: Option<u32>,
    budget: ReadBudget,
    above_rows: i64,
) -> Result<Option<Lean>, StoreError> {
    let Some(parts) = crate::scoped::whole_streamed_parts(trace, pid, above_rows)? else {
        return Ok(None);
    };
    let view = MemoryTrace::open(trace, pid, budget)?;
    let ledgers = parts.ledger.finish(&parts.data);
    // This pass's data holds the memory calls of processes with allocator
    // blocks: their views from it, as the full load gives them.
    let allocators = sleuth_core::allocator::KnownViews::of(&parts.data, &parts.data, &ledgers);
    Ok(Some(Lean {
        data: parts.data,
        ledgers,
        inputs: parts.inputs,
        allocators,
        view,
        run_file: None,
    }))
}

/// The lean load of the whole trace or of process `pid` (as `Trace::load`
/// reads it); None (load everything) for a trace without finding rollups,
/// with `pid` for one written before the per-process op rollups, or with
/// NCCL collectives (the straggler finding reads every call and wait of
/// the ranks). Errors are those of the full load (a pid the trace does not
/// hold; a file whose totals overflow is refused by the call groups' check).
pub fn load(
    trace: &Trace,
    pid: Option<u32>,
    budget: ReadBudget,
) -> Result<Option<Lean>, StoreError> {
    if let Some(pid) = pid {
        // Before any aggregate is read: the full load's error, not an empty answer.
        trace.require_pid(pid)?;
    }
    let Some(mut inputs) = crate::finding_rollups::finding_inputs(trace, pid)? else {
        return Ok(None);
    };
    let nccl = trace.nccl_calls(None)?;
    if nccl.iter().any(|e| e.is_collective()) {
        return Ok(None);
    }
    let mut view = MemoryTrace::open(trace, pid, budget)?;
    let ledgers = view.ledgers(None)?;
    // Of the explanation's readers only the allocator view reads calls (the
    // memory calls of processes with allocator blocks), at each of its
    // passes from the file: the others read the aggregates and the ledgers,
    // so no call is held.
    let allocators = view.known_allocator_views(&ledgers)?;
    let counts = trace.op_counts(pid)?;
    let mut data = std::mem::take(&mut view.base);
    data.counts = counts;
    (data.count_samples, data.count_ends) = trace.count_places(pid)?;
    data.nccl = nccl;
    // Without a stored end the span ends at the last call's end, which the
    // memory calls alone do not give: the span from the call groups (what
    // `TraceSpan::of` gives the full load) stands in. Of the explanation's
    // readers only the span reads `end_ns`.
    data.end_ns = Some(view.span.end_ns);
    // A file the tracer judged against the whole run's pinned ranges
    // (`run_pinned::judged_from`) is not judged again.
    let judged = crate::run_pinned::judged_from(trace, pid)?.is_some();
    let run_file = match crate::run_ledger::link(trace)?.map(|l| l.file()) {
        Some(n) if n > 1 && !judged && inputs.pageable_copies() > 0 => {
            match crate::run::pinned_before_file(trace, pid)? {
                Some(pinned) => {
                    // Judged again only where memory pinned earlier is live.
                    let mut carry = crate::run_pinned::PinnedCarry::starting(pinned);
                    carry.file(trace, view.rows(), pid, &mut inputs)?;
                    None
                }
                None => Some(n),
            }
        }
        _ => None,
    };
    Ok(Some(Lean {
        data,
        ledgers,
        inputs,
        allocators,
        view,
        run_file,
    }))
}
