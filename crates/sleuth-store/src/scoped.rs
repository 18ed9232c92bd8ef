//! The explanation of the calls in a scope (an op, a time window, of one
//! process or all: MCP `findings` with a filter) in bounded memory.
//!
//! The stored finding aggregates cover whole threads, so a scope is read
//! from its calls; loading them with every wait of their processes held a
//! 10M-call trace's 2.3M waits in memory (900 MB for `findings {op}`).
//! Here each thread of the scope is streamed instead, through the writer's
//! own per-thread pass (`thread_pass`): its calls in scope in start order
//! against its waits (read once, with their culprits), into the finding
//! accumulators (`FindingInputs`, the rollup histogram: percentiles within
//! `rollup::MAX_RELATIVE_ERROR`, as the lean load's); the scope's memory
//! calls, in return order, into the ledger. The calls are read thread by
//! thread, or an op's of every thread at once (`scope_feed`). The answer
//! is that of the loaded trace filtered to the scope
//! (`findings::explain_report`), percentiles within the bound; memory is
//! the overlapping waits of one thread (of up to
//! `scope_feed::ONE_READ_MAX_THREADS` read at once), the aggregates, and
//! the memory calls of processes with allocator blocks.
//!
//! The culprits of the calls are computed from the waits, as the loaded
//! trace computes them, not read from the file's `call_culprits` (the
//! writer's, from the same pass): the split needs the waits and their
//! culprits anyway, and reading both cost more (a join to `call_culprits`
//! added ~12% to the read of one thread's copies on the 10M trace, the
//! recomputation ~5% of the time in all); where a crafted file's
//! `call_culprits` disagree with its waits, the waits win.

use crate::packed_calls::PackedCalls;
use crate::problems::{valid_call, TOTALS_OVERFLOW};
use crate::reader::Trace;
use crate::report_reads::WindowTally;
use crate::rows::{calls_sql_from, calls_sql_from_with, OpColumn, OpIds};
use crate::scope_feed::{self, Feed};
use crate::stream::{CallQuery, Rows, StreamOrder};
use crate::types::CallFilter;
use crate::window::WindowCounts;
use crate::StoreError;
use rusqlite::types::Value;
use rusqlite::Connection;
use sleuth_core::findings::inputs::{FindingInputs, PinnedState, Resolution};
use sleuth_core::findings::Explanation;
use sleuth_core::ledger::LedgerBuilder;
use sleuth_core::threads::{sort_splits, tracer_pid};
use sleuth_core::{op_by_id, CallEvent, OpCount, OpSet, TraceData};
use std::collections::{BTreeMap, BTreeSet};

/// The explanation of the calls `filter` selects (its `pid`, `op`,
/// `since_ns`, `until_ns`; order and limit are not read), or None where the
/// caller must load the scope instead: a file without stored call groups
/// (older), or one with NCCL collectives (the straggler finding reads every
/// call and wait of the ranks). Errors are those of the load (a pid the
/// trace does not hold, totals that overflow, a damaged table).
pub fn explanation(trace: &Trace, filter: &CallFilter) -> Result<Option<Explanation>, StoreError> {
    explanation_keeping_at_most(trace, filter, scope_feed::KEPT_MAX)
}

/// The explanation of the calls `filter` selects: streamed
/// ([`explanation`]), or where that cannot be the scope's calls loaded (a
/// window's with its kernel-counted calls placed, `window::explain_loaded`).
pub fn explanation_or_loaded(
    trace: &Trace,
    filter: &CallFilter,
) -> Result<Explanation, StoreError> {
    explanation_or_loaded_after(trace, filter, PinnedState::default())
}

/// [`explanation_or_loaded`] of a file that began with the host ranges
/// `earlier` pinned (a run's newest file: those its earlier files left
/// live, `run::pinned_when_file_began`).
pub fn explanation_or_loaded_after(
    trace: &Trace,
    filter: &CallFilter,
    earlier: PinnedState,
) -> Result<Explanation, StoreError> {
    let pinned = pinned_at_start(trace, filter, earlier)?;
    let mut e = match explanation_seeded(trace, filter, scope_feed::KEPT_MAX, &pinned)? {
        Some(e) => e,
        None => loaded_explanation(trace, filter, pinned)?,
    };
    crate::window_growth::settle(trace, filter, &mut e)?;
    Ok(e)
}

/// The explanation of a scope that must be loaded (see [`explanation`]),
/// begun with the host ranges `pinned`.
fn loaded_explanation(
    trace: &Trace,
    filter: &CallFilter,
    pinned: PinnedState,
) -> Result<Explanation, StoreError> {
    let mut data = trace.load_calls_of(filter)?;
    keep_counts_of_op(&mut data.counts, filter.op.as_deref());
    match filter.since_ns.is_some() || filter.until_ns.is_some() {
        true => crate::window::explain_loaded(trace, data, filter, pinned),
        false => {
            let pinning = pinning_outside(trace, filter)?;
            Ok(sleuth_core::findings::explain_report_pinned(
                &data, pinned, &pinning,
            ))
        }
    }
}

/// [`explanation_or_loaded_after`] of a report's window, with the
/// window's calls as `report_reads::window_calls` reads them (keeping the
/// `n` slowest): from the explanation's own pass over the same calls where
/// the scope is streamed (one read of the window's rows, not two: ten
/// seconds of the bench's 10M-call trace were 1.6 s of a 4.3-s report),
/// read apart where it is loaded or the filter names an op.
pub fn explanation_and_calls_or_loaded_after(
    trace: &Trace,
    filter: &CallFilter,
    earlier: PinnedState,
    n: usize,
) -> Result<(Explanation, crate::report_reads::WindowCalls), StoreError> {
    let pinned = pinned_at_start(trace, filter, earlier)?;
    // A report's window has no op; the calls are every op's whatever the filter's.
    let tally = filter.op.is_none().then_some(n);
    let explained = parts_explained(trace, filter, scope_feed::KEPT_MAX, &pinned, tally)?;
    let (mut e, tally) = match explained {
        Some(parts) => parts,
        None => (loaded_explanation(trace, filter, pinned)?, None),
    };
    crate::window_growth::settle(trace, filter, &mut e)?;
    let calls = match tally {
        Some(tally) => crate::report_reads::window_calls_of(trace, filter, tally)?,
        None => crate::report_reads::window_calls(trace, filter, n)?,
    };
    Ok((e, calls))
}

/// Call rows past which a whole file without rollups is streamed, not
/// loaded ([`whole_streamed`]): loaded, 250,000 calls take ~40–60 MB.
pub const STREAMED_ABOVE_ROWS: i64 = 250_000;

/// A file's base data, ledgers and explanation: what `explain` renders.
pub type Explained = (
    TraceData,
    Vec<sleuth_core::ledger::ProcessLedger>,
    Explanation,
);

/// The explanation of a whole file (of process `pid`, all when None) that
/// has no rollups to answer from (the file a run's tracer is still
/// writing, one whose writer was killed) and more call rows than
/// `above_rows` (by row ids: no row is counted), streamed as a scope with
/// no op and no window is (one pass over its rows without call groups,
/// thread by thread with them), percentiles from the histograms as the
/// rollups give them. None for a file with rollups, a smaller one, and
/// where the scope must be loaded (NCCL collectives, more threads than one
/// pass holds, rows out of their threads' order): then `Trace::load`
/// answers, holding every call and wait.
pub fn whole_streamed(
    trace: &Trace,
    pid: Option<u32>,
    above_rows: i64,
) -> Result<Option<Explained>, StoreError> {
    let Some(parts) = whole_streamed_parts(trace, pid, above_rows)? else {
        return Ok(None);
    };
    let ledgers = parts.ledger.finish(&parts.data);
    let e = sleuth_core::findings::explain_inputs(&parts.data, &parts.inputs, &ledgers);
    Ok(Some((parts.data, ledgers, e)))
}

/// The parts [`whole_streamed`] explains (the report's lean reads of such
/// a file take them: `lean::streamed`); None where it gives None.
pub(crate) fn whole_streamed_parts(
    trace: &Trace,
    pid: Option<u32>,
    above_rows: i64,
) -> Result<Option<ScopeParts>, StoreError> {
    if trace.has_rollups()? || !more_rows_than(trace, above_rows)? {
        return Ok(None);
    }
    let filter = CallFilter {
        pid,
        ..Default::default()
    };
    let pinned = pinned_at_start(trace, &filter, PinnedState::default())?;
    let start = LedgerBuilder::new(None);
    parts_seeded(
        trace,
        &filter,
        scope_feed::KEPT_MAX,
        &pinned,
        &start,
        true,
        None,
    )
}

/// Whether the file's call rows span more than `n` row ids (from its
/// first and last row id: no row is counted), where loading them all
/// would hold more than [`STREAMED_ABOVE_ROWS`] is meant to allow.
pub(crate) fn more_rows_than(trace: &Trace, n: i64) -> Result<bool, StoreError> {
    let table = match trace.version() >= 2 {
        true => "call_rows",
        false => "calls",
    };
    let span: Option<i64> = trace
        .keyed()
        .query_row(
            &format!("SELECT max(id) - min(id) + 1 FROM {table}"),
            [],
            |r| r.get(0),
        )
        .map_err(|e| trace.read_error(e))?;
    Ok(span.unwrap_or(0) > n)
}

/// For a loaded scope of one copy op: the pinning calls of its time (its
/// process's, other ops'), which the loaded explanation replays with its
/// copies (`FindingInputs::of_pinned`); none for any other scope.
pub(crate) fn pinning_outside(
    trace: &Trace,
    scope: &CallFilter,
) -> Result<Vec<CallEvent>, StoreError> {
    let mut pinning = Vec::new();
    if copy_op(scope.op.as_deref()).is_some() {
        let q = CallQuery {
            pid: scope.pid,
            ops: Some(crate::finding_rollups::pinned_replay_ops(false)),
            since_ns: scope.since_ns,
            until_ns: scope.until_ns,
            ..Default::default()
        };
        Rows::open(trace)?.for_each_call::<StoreError>(&q, |s| {
            pinning.push(s.call);
            Ok(())
        })?;
    }
    Ok(pinning)
}

/// The host ranges pinned when the scope `filter` begins: `earlier` (pinned
/// before the file began) and, for a window, the file's pinning calls that
/// began before it ([`pinned_before`]).
fn pinned_at_start(
    trace: &Trace,
    filter: &CallFilter,
    earlier: PinnedState,
) -> Result<PinnedState, StoreError> {
    match filter.since_ns {
        Some(since) => pinned_before(trace, filter.pid, Some(since), earlier),
        None => Ok(earlier),
    }
}

/// The host ranges process `pid` (or each) had pinned when the file
/// reached `until` (its end, without one), starting from `earlier`: its
/// pinning calls (host allocations and registrations, their frees) that
/// started before then, replayed in end order (their rows alone, through
/// the op index). A window's copies are judged against them and the
/// window's own pinning calls, so a copy from memory pinned earlier is
/// pinned, as the whole trace judges it.
pub fn pinned_before(
    trace: &Trace,
    pid: Option<u32>,
    until: Option<u64>,
    earlier: PinnedState,
) -> Result<PinnedState, StoreError> {
    // Every pinning call of the file, found by the op index, the bound
    // applied here: a bound in the query makes SQLite walk the threads'
    // `(tid, ts_ns)` ranges up to it instead (1.1 s on the 10M-call trace,
    // where the op index finds its few rows at once). A few rows are a
    // bounded read (`reader::KEYED_ROWS`: no check of the whole per-call
    // table first, which a run's earlier files would each pay); a file with
    // more is read again, checked.
    let rows = Rows::open(trace)?;
    let q = |limit| CallQuery {
        pid,
        ops: Some(crate::finding_rollups::pinned_replay_ops(false)),
        limit,
        ..Default::default()
    };
    let before = |c: &CallEvent| until.is_none_or(|u| c.ts_ns < u);
    let bounded = Some(crate::reader::KEYED_ROWS);
    let (mut done, read) = replay_pinning(&rows, q(bounded), earlier.clone(), before)?;
    if read >= crate::reader::KEYED_ROWS {
        done = replay_pinning(&rows, q(None), earlier, before)?.0;
    }
    Ok(done.pinned_state())
}

/// The pinned-range replay (`FindingInputs::add_in_end_order`) of the
/// calls `q` selects, read in return order, from the ranges `earlier`:
/// those `keep` accepts are fed (by their row id, the index the stored
/// aggregates' examples keep); with how many rows were read. The one
/// reader of pinning calls: a window's start, a copy op's scope, a run's
/// files (`run_pinned`).
pub(crate) fn replay_pinning(
    rows: &Rows,
    q: CallQuery,
    earlier: PinnedState,
    keep: impl Fn(&CallEvent) -> bool,
) -> Result<(FindingInputs, usize), StoreError> {
    let mut replay = FindingInputs::new(Resolution::Bucketed, None).with_pinned(earlier);
    let q = CallQuery {
        order: StreamOrder::ByReturn,
        ..q
    };
    let mut read = 0usize;
    rows.for_each_call::<StoreError>(&q, |s| {
        read += 1;
        if keep(&s.call) {
            replay.add_in_end_order(crate::finding_rollups::row_index(s.id), &s.call);
        }
        Ok(())
    })?;
    Ok((replay, read))
}

/// [`explanation`] with a window's memory and pinning calls kept by the
/// pass up to `kept_max` (then read again in return order): the tests
/// compare both ways on small traces.
#[doc(hidden)]
pub fn explanation_keeping_at_most(
    trace: &Trace,
    filter: &CallFilter,
    kept_max: usize,
) -> Result<Option<Explanation>, StoreError> {
    let pinned = pinned_at_start(trace, filter, PinnedState::default())?;
    explanation_seeded(trace, filter, kept_max, &pinned)
}

/// [`explanation_keeping_at_most`] with the host ranges `pinned_ranges`
/// live when the scope begins ([`pinned_at_start`]).
fn explanation_seeded(
    trace: &Trace,
    filter: &CallFilter,
    kept_max: usize,
    pinned_ranges: &PinnedState,
) -> Result<Option<Explanation>, StoreError> {
    Ok(parts_explained(trace, filter, kept_max, pinned_ranges, None)?.map(|(e, _)| e))
}

/// [`explanation_seeded`], with the scope's calls tallied as a report's
/// window reads them (keeping the `tally` slowest) where that is asked.
fn parts_explained(
    trace: &Trace,
    filter: &CallFilter,
    kept_max: usize,
    pinned_ranges: &PinnedState,
    tally: Option<usize>,
) -> Result<Option<(Explanation, Option<WindowTally>)>, StoreError> {
    // A window's allocator views are replayed from the file (its start
    // on): the scope then neither loads the file's allocator events nor
    // keeps the memory calls that a replay of its own would read. The
    // replay runs once the scope is streamed (a loaded scope makes its own).
    let replayed = window_replays_allocators(trace, filter)?;
    let parts = parts_seeded(
        trace,
        filter,
        kept_max,
        pinned_ranges,
        &LedgerBuilder::new(None),
        !replayed,
        tally,
    )?;
    let Some(mut parts) = parts else {
        return Ok(None);
    };
    if replayed {
        parts.allocators = replay_window_allocators(trace, filter)?;
    }
    let tally = parts.tally.take();
    Ok(Some((parts.explain(), tally)))
}

/// The allocator views a window of one file reads: each process's at the
/// window's end, replayed from the file's start (a segment, like a pinned
/// buffer, outlives the window that uses it: replayed from the window's
/// start, the segments made before it were unknown and the view refused),
/// its reserved bytes the file's then. None for a scope without a window
/// (its own calls are the whole file's) or a file without allocator
/// events.
pub(crate) fn window_allocators(
    trace: &Trace,
    filter: &CallFilter,
) -> Result<Option<sleuth_core::allocator::KnownViews>, StoreError> {
    if !window_replays_allocators(trace, filter)? {
        return Ok(None);
    }
    replay_window_allocators(trace, filter)
}

/// [`window_allocators`] of a window known to replay them.
fn replay_window_allocators(
    trace: &Trace,
    filter: &CallFilter,
) -> Result<Option<sleuth_core::allocator::KnownViews>, StoreError> {
    let view = crate::stream::MemoryTrace::open(trace, filter.pid, trace.budget().clone())?;
    view.allocator_views_until(filter.until_ns)
}

/// Whether [`window_allocators`] replays views for `filter`: a window over
/// processes with allocator events. Most traces have none: nothing more is
/// opened for them.
fn window_replays_allocators(trace: &Trace, filter: &CallFilter) -> Result<bool, StoreError> {
    if filter.since_ns.is_none() && filter.until_ns.is_none() {
        return Ok(false);
    }
    let pids = trace.allocator_pids()?;
    Ok(pids
        .iter()
        .any(|&p| filter.pid.is_none_or(|only| only == p)))
}

/// What one file's scope gives its explanation before it is made: the
/// base data (with the allocator views' memory calls), the finding
/// aggregates, the ledger fed up to the scope's last memory call, a
/// window's kernel-counted calls placed. A window over several files of a
/// run adds them up (`run_window`).
pub struct ScopeParts {
    pub data: TraceData,
    pub inputs: FindingInputs,
    pub ledger: LedgerBuilder,
    pub window_counts: Option<WindowCounts>,
    /// The allocator views of a window of one file, at its end and
    /// replayed from the file's start ([`window_allocators`]); None: those
    /// of `data` (its allocator events and memory calls).
    pub allocators: Option<sleuth_core::allocator::KnownViews>,
    /// The scope's calls tallied as a report's window reads them, where
    /// the pass was asked to ([`explanation_and_calls_or_loaded_after`]).
    pub(crate) tally: Option<WindowTally>,
}

impl ScopeParts {
    /// The explanation of the scope.
    pub fn explain(self) -> Explanation {
        let ledgers = self.ledger.finish(&self.data);
        let mut e = match &self.allocators {
            Some(known) => sleuth_core::findings::explain_inputs_with(
                &self.data,
                &self.inputs,
                &ledgers,
                known,
            ),
            None => sleuth_core::findings::explain_inputs(&self.data, &self.inputs, &ledgers),
        };
        if let Some(w) = &self.window_counts {
            e.notes.extend(w.notes(crate::window::FINDINGS_COUNT));
        }
        e
    }
}

/// The parts of the window `filter` names (no op) of one file of a run,
/// the file begun with the host ranges `earlier` pinned and the ledger
/// `ledger` (the run's earlier files' parts of the window fed it):
/// streamed, or for a file without stored call groups (the one a run is
/// still writing) its window's calls loaded. Without the allocator events
/// and their memory calls: the window's allocator views are replayed from
/// the run's files (`run_window`).
pub fn window_parts_after(
    trace: &Trace,
    filter: &CallFilter,
    earlier: PinnedState,
    ledger: LedgerBuilder,
) -> Result<ScopeParts, StoreError> {
    let pinned = pinned_at_start(trace, filter, earlier)?;
    if let Some(p) = parts_seeded(
        trace,
        filter,
        scope_feed::KEPT_MAX,
        &pinned,
        &ledger,
        false,
        None,
    )? {
        return Ok(p);
    }
    loaded_parts(trace, filter, pinned, ledger)
}

/// [`window_parts_after`] of a file without stored call groups: the
/// window's calls loaded with their processes' waits, aggregated as the
/// streamed pass aggregates them (the rollup histogram), the memory calls
/// fed to `ledger` in return order; no call, wait or allocator event kept.
fn loaded_parts(
    trace: &Trace,
    filter: &CallFilter,
    pinned: PinnedState,
    mut ledger: LedgerBuilder,
) -> Result<ScopeParts, StoreError> {
    let mut data = trace.load_calls_of(filter)?;
    keep_counts_of_op(&mut data.counts, filter.op.as_deref());
    scope_to_window(&mut data, filter.since_ns, filter.until_ns);
    let window_counts = WindowCounts::of(trace, &data.counts, filter)?;
    data.counts = window_counts.at_least();
    // Where they fell: a stretch that held launches is no pause.
    (data.count_samples, data.count_ends) = trace.count_places(filter.pid)?;
    let culprits =
        sleuth_core::culprits::call_culprits(&data.calls, &data.waits, trace.tracer_pid());
    let pinning = pinning_outside(trace, filter)?;
    let inputs =
        FindingInputs::of_pinned_at(Resolution::Bucketed, &data, &culprits, pinned, &pinning);
    ledger.feed(&data);
    data.calls = Vec::new();
    data.waits = Vec::new();
    data.blocks = Vec::new();
    Ok(ScopeParts {
        data,
        inputs,
        ledger,
        window_counts: Some(window_counts),
        allocators: None,
        tally: None,
    })
}

/// [`explanation_seeded`]'s parts, the ledger started from `start` (empty
/// for one file); None where the scope must be loaded instead (see
/// [`explanation`]). `with_blocks`: the parts hold the allocator events
/// and their processes' memory calls, what the data's own allocator views
/// replay (false where the views come from elsewhere).
fn parts_seeded(
    trace: &Trace,
    filter: &CallFilter,
    kept_max: usize,
    pinned_ranges: &PinnedState,
    start: &LedgerBuilder,
    with_blocks: bool,
    tally: Option<usize>,
) -> Result<Option<ScopeParts>, StoreError> {
    let pid = filter.pid;
    if let Some(pid) = pid {
        trace.require_pid(pid)?;
    }
    let nccl = trace.nccl_calls(None)?;
    if nccl.iter().any(|e| e.is_collective()) {
        return Ok(None);
    }
    let windowed = filter.since_ns.is_some() || filter.until_ns.is_some();
    // An op's scope over the whole trace starts from no ledger (no run adds it up).
    if let (Some(op), false) = (filter.op.as_deref(), windowed) {
        if let Some(p) = from_op_rollups(trace, op, pid, nccl.clone(), pinned_ranges)? {
            return Ok(Some(p));
        }
    }
    if trace.call_scan()?.totals_overflow {
        return Err(StoreError::file(trace.path(), TOTALS_OVERFLOW));
    }
    let conn = trace.bulk()?;
    let read = |e| trace.read_error(e);
    let op = filter.op.as_deref();
    // The threads with calls of the scope's process and op (the window is
    // applied by the reads), from the stored call groups. A file without
    // them (the one a run's tracer is still writing: its `(tid, ts_ns)`
    // index is not built yet either) is read in one pass over its rows
    // ([`unthreaded`]); None (loaded) where that cannot be.
    // Each thread's calls in scope, about (for sharing the threads out
    // between readers: `scope_feed::per_thread_side_by_side`).
    let mut weights: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    // Whether the scope may hold a call that pins or unpins host memory
    // (from the call groups' spans: none in most traces).
    let pinning = crate::finding_rollups::pinned_replay_ops(false);
    let mut may_pin = true;
    let (threads, one_pass) = match crate::call_groups::stored(conn).map_err(read)? {
        Some(groups) => {
            let in_scope = groups
                .iter()
                .filter(|g| pid.is_none_or(|p| g.pid == p) && id_in_scope(op, g.op));
            may_pin = false;
            for g in in_scope {
                let calls = calls_in_window(g, filter);
                let w = weights.entry((g.pid, g.tid)).or_default();
                *w = w.saturating_add(calls);
                if op_by_id(g.op).is_some_and(|o| pinning.contains(&o.name))
                    && spans_window(g, filter)
                {
                    may_pin = true;
                }
            }
            (weights.keys().copied().collect::<BTreeSet<_>>(), None)
        }
        None => match unthreaded(conn, trace.version(), filter).map_err(read)? {
            Some(mut pass) => (std::mem::take(&mut pass.threads), Some(pass)),
            None => return Ok(None),
        },
    };

    let frame = match with_blocks {
        true => trace.frame(pid)?,
        false => trace.frame_without_blocks(pid)?,
    };
    // Where they fell: a stretch that held launches is no pause.
    let (count_samples, count_ends) = trace.count_places(pid)?;
    let mut data = TraceData {
        procs: trace.proc_events(pid)?,
        counts: trace.op_counts(pid)?,
        count_samples,
        count_ends,
        nccl,
        ..frame
    };
    keep_counts_of_op(&mut data.counts, op);
    // The kernel-counted calls have no times: a window's are placed by
    // their samples, and judged on those certainly inside it.
    let window_counts = match windowed {
        true => {
            let w = WindowCounts::of(trace, &data.counts, filter)?;
            data.counts = w.at_least();
            Some(w)
        }
        false => None,
    };
    let tracer = tracer_pid(&data);
    // The scope as SQL: ?1 pid, ?2 tid, then the op and the window.
    let mut conds = vec![
        "pid = ?1".to_string(),
        "tid = ?2".to_string(),
        valid_call(""),
    ];
    let mut args: Vec<Value> = Vec::new();
    push_op_and_window(filter, 2, &mut conds, &mut args);
    let scope = conds.join(" AND ");
    // With an op, the rows of that op are picked by their op id before the
    // join to `ops` (on the view SQLite joins every call of the thread to
    // its op name first: 1.5 s against 0.8 s for one thread of the 10M
    // trace); the view's own condition stays.
    // Without an op, from `call_rows` with the op's id (version 2 on): no
    // join of `ops` per row, and no op name looked up per row (ten
    // seconds of the bench's 10M-call trace: round 43).
    let tail = format!("WHERE {scope} ORDER BY ts_ns, id");
    let op_ids = match filter.op.is_none() && trace.version() >= 2 {
        true => Some(OpIds::of(conn).map_err(read)?),
        false => None,
    };
    let stacks = crate::stacks::has_column(conn, "calls", "stack_id").map_err(read)?;
    let calls_q = match (&op_ids, &filter.op) {
        (Some(_), _) => crate::stream::calls_sql_by_op_id(conn, &tail, stacks),
        (None, Some(_)) => {
            let source = crate::stream::ops_searched_calls("?3");
            calls_sql_from_with(conn, source.as_deref().unwrap_or("calls"), &tail, stacks)
        }
        (None, None) => calls_sql_from_with(conn, "calls", &tail, stacks),
    }
    .map_err(read)?;
    let thread_calls = scope_feed::ThreadCalls {
        sql: &calls_q,
        args: &args,
        ops: op_ids.as_ref().map_or(OpColumn::Name, OpColumn::Id),
        stacks,
    };
    // A thread's waits that went back on CPU after its window's start (?3:
    // the first start of its non-nested calls in scope): one before adds
    // nothing to the split (`ThreadStream` clamps each wait to the window)
    // and overlaps no call. In the `(tid, on_ns)` index's order, so SQLite
    // hands them out as it finds them (no sort of the rest of the thread
    // first) and the pass stops reading past the window's end
    // (`ThreadPass::finish`): no bound on the end in SQL, where SQLite would
    // read the rest of the thread to find that no later wait matches it.
    let waits_q = scope_feed::thread_waits_after_sql(conn).map_err(read)?;
    // The ops replayed in return order afterwards, within the scope's op.
    let scoped_ops = |ops: Vec<&'static str>| -> BTreeSet<&'static str> {
        ops.into_iter().filter(|o| name_in_scope(op, o)).collect()
    };
    let mut pinned = scoped_ops(crate::finding_rollups::pinned_replay_ops(true));
    let memory = scoped_ops(sleuth_core::ledger::memory_op_names());
    // Without an op that pins or unpins host memory in scope (or without
    // a call of one in the window: ten seconds of the bench's trace kept
    // its 375,000 copies for nothing), no copy is judged against pinned
    // memory and the order of the replay does not matter (its sums and top
    // examples are order-free): the copies join it as the pass reads them,
    // not read again in return order (for `findings {op: cudaMemcpy}` on a
    // 10M-call trace, 1.9M calls and a third of the time).
    let copies_in_pass = !may_pin || !pinned.iter().any(|o| pinning.contains(o));
    let copies: BTreeSet<&'static str> = match copies_in_pass {
        true => std::mem::take(&mut pinned),
        false => BTreeSet::new(),
    };
    // With a window, those calls are kept as the pass reads them. Both
    // sets by op id: the pass tests each call against them.
    let keep = OpSet::of_names(pinned.union(&memory).copied());
    let copies = OpSet::of_names(copies);
    // A feed from the scope's start: the ledger `ledger` (a reader of
    // other threads lists its processes in a ledger of its own, the pass
    // only lists them), at most `kept_max` calls kept.
    let feed_of = |ledger: LedgerBuilder, kept_max: usize| Feed {
        // Memory pinned before the scope began is pinned inside it.
        inputs: FindingInputs::new(Resolution::Bucketed, tracer).with_pinned(pinned_ranges.clone()),
        ledger,
        kept: windowed.then(PackedCalls::default),
        kept_max,
        keep: &keep,
        tally: tally.map(WindowTally::new),
        copies: &copies,
        extent: None,
        splits: Vec::new(),
    };
    let new_feed = || {
        let mut ledger = start.clone();
        for oc in &data.counts {
            ledger.track(oc.pid);
        }
        feed_of(ledger, kept_max)
    };
    let th = scope_feed::Threads {
        conn,
        threads: &threads,
        waits_sql: &waits_q,
        tracer,
        data: &data,
    };
    // An op's calls over the whole trace: one read of every thread's (see
    // `scope_feed`), thread by thread if it hands a thread's calls out of
    // order. A window's: thread by thread, each a range of the index.
    let mut feed = new_feed();
    if let Some(pass) = &one_pass {
        // In row order, each thread's calls in its order: else loaded.
        if !scope_feed::one_read(&mut feed, &th, &pass.sql, &pass.args).map_err(read)? {
            return Ok(None);
        }
    }
    let one_read = match (op.and_then(sleuth_core::op_by_name), windowed) {
        _ if one_pass.is_some() => true,
        (Some(info), false) if threads.len() <= scope_feed::ONE_READ_MAX_THREADS => {
            let (source, scanned) =
                crate::stream::calls_source_for_ops_scanned(conn, vec![info.name]).map_err(read)?;
            let mut args = vec![Value::Text(info.name.into())];
            let mut conds = vec![valid_call(""), "op = ?1".to_string()];
            if let Some(p) = pid {
                args.push(Value::Integer(p.into()));
                conds.push("pid = ?2".into());
            }
            // In row order when the table is scanned; through the op index,
            // sorted by thread and start (the rows of one op only).
            let order = if scanned {
                ""
            } else {
                " ORDER BY pid, tid, ts_ns, id"
            };
            let sql = calls_sql_from(
                conn,
                &source,
                &format!("WHERE {}{order}", conds.join(" AND ")),
            )
            .map_err(read)?;
            scope_feed::one_read(&mut feed, &th, &sql, &args).map_err(read)?
        }
        _ => false,
    };
    if !one_read {
        feed = new_feed();
        let side = side_readers(trace, &threads);
        if side.is_empty() {
            scope_feed::per_thread(&mut feed, &th, thread_calls).map_err(read)?;
        } else {
            // The kept calls bounded over all readers.
            let share = kept_max / (side.len() + 1);
            feed.kept_max = share;
            let weight = |t: &(u32, u32)| weights.get(t).copied().unwrap_or(0);
            let side_feed = || feed_of(LedgerBuilder::new(None), share);
            let others = scope_feed::SideReaders {
                side,
                weight: &weight,
                side_feed: &side_feed,
            };
            scope_feed::per_thread_side_by_side(&mut feed, &th, others, thread_calls, |m, t| {
                m.absorb(t, kept_max)
            })
            .map_err(read)?;
            feed.kept_max = kept_max;
        }
    }
    let Feed {
        mut inputs,
        ledger,
        kept,
        extent,
        mut splits,
        tally,
        ..
    } = feed;
    sort_splits(&mut splits);
    inputs.splits = splits;
    crate::finding_rollups::fill_example_sites(conn, &mut inputs).map_err(read)?;
    scope_to_window(&mut data, filter.since_ns, filter.until_ns);
    span_from_calls(&mut data, extent);

    let mut parts = replay(
        trace,
        pid,
        Replay {
            data,
            inputs,
            ledger,
            pinned,
            memory,
            kept,
            since_ns: filter.since_ns,
            until_ns: filter.until_ns,
            copies_of: copy_op(op).map(|o| (o, pinned_ranges.clone())),
        },
    )?;
    parts.window_counts = window_counts;
    parts.tally = tally;
    Ok(Some(parts))
}

/// The calls of group `g` in `filter`'s window, about: its count times
/// the share of its span (first start to last end) inside the window.
fn calls_in_window(g: &crate::stream::CallGroup, filter: &CallFilter) -> u64 {
    let (first, last) = (g.first_ts_ns, g.last_end_ns.max(g.first_ts_ns));
    let from = filter.since_ns.unwrap_or(0).max(first);
    let to = filter.until_ns.unwrap_or(u64::MAX).min(last);
    if last == first {
        return if (from..=to).contains(&first) {
            g.count
        } else {
            0
        };
    }
    if to <= from {
        return 0;
    }
    let share = (to - from) as f64 / (last - first) as f64;
    (g.count as f64 * share).round() as u64
}

/// Whether group `g`'s calls (started from its first start to its last
/// end) may start in `filter`'s window.
fn spans_window(g: &crate::stream::CallGroup, filter: &CallFilter) -> bool {
    filter.since_ns.is_none_or(|s| g.last_end_ns >= s)
        && filter.until_ns.is_none_or(|u| g.first_ts_ns < u)
}

/// Connections for reading a scope's threads side by side: one fewer than
/// the readers the file allows (`checked::Helpers`: the machine's CPUs, the
/// file unchanged since the trace opened it), at most one per thread
/// beyond the first; none where the helpers cannot open the file.
fn side_readers(trace: &Trace, threads: &BTreeSet<(u32, u32)>) -> Vec<Connection> {
    let helpers = trace.helpers();
    let n = helpers.workers().min(threads.len()).saturating_sub(1);
    (0..n).map_while(|_| helpers.open()).collect()
}

/// Adds `filter`'s op and window to a read of the calls as conditions on
/// numbered parameters, their values to `args`; `before`: parameters the
/// read numbers ahead of `args` (the thread's pid and tid).
fn push_op_and_window(
    filter: &CallFilter,
    before: usize,
    conds: &mut Vec<String>,
    args: &mut Vec<Value>,
) {
    let time = |t: u64| Value::Integer(i64::try_from(t).unwrap_or(i64::MAX));
    let parts = [
        (filter.op.clone().map(Value::Text), "op ="),
        (filter.since_ns.map(time), "ts_ns >="),
        (filter.until_ns.map(time), "ts_ns <"),
    ];
    for (value, cond) in parts {
        if let Some(v) = value {
            args.push(v);
            conds.push(format!("{cond} ?{}", args.len() + before));
        }
    }
}

/// One read of a scope's calls in a file without call groups: the
/// threads it holds, its SQL and parameters.
pub(crate) struct OnePass {
    pub(crate) threads: BTreeSet<(u32, u32)>,
    pub(crate) sql: String,
    pub(crate) args: Vec<Value>,
}

/// The threads of `filter`'s scope in a file without stored call groups,
/// and the one read of its calls `scope_feed::one_read` takes (SQL and
/// parameters): a pass over the rows in row order, which is each thread's
/// call order in a file the tracer writes (the file a run's tracer is
/// still writing has neither call groups nor the `(tid, ts_ns)` index, and
/// loading its window held every call of it and every wait of the file:
/// gigabytes for `explain --last 10m` an hour into `--rotate 1h`). The
/// threads come from a first pass (`SELECT DISTINCT`); None over
/// [`scope_feed::ONE_READ_MAX_THREADS`] (each open thread holds a
/// statement), when the scope is then loaded as before.
pub(crate) fn unthreaded(
    conn: &rusqlite::Connection,
    version: i64,
    filter: &CallFilter,
) -> rusqlite::Result<Option<OnePass>> {
    let mut conds = vec![valid_call("")];
    let mut args: Vec<Value> = Vec::new();
    if let Some(p) = filter.pid {
        args.push(Value::Integer(p.into()));
        conds.push(format!("pid = ?{}", args.len()));
    }
    push_op_and_window(filter, 0, &mut conds, &mut args);
    // The ids of the writer's blocks that can hold the scope's calls
    // (`call_blocks`: its window, its op), not every row.
    let ops = filter.op.as_deref().map(|o| vec![o]);
    let window = (filter.since_ns, filter.until_ns);
    if let Some(c) = crate::call_blocks::restrict(conn, ops.as_deref(), window, "id", &mut args)? {
        conds.push(c);
    }
    let source = crate::stream::calls_source(version >= 2);
    let scope = conds.join(" AND ");
    let mut threads = BTreeSet::new();
    let mut st = conn.prepare(&format!(
        "SELECT DISTINCT pid, tid FROM {source} WHERE {scope} LIMIT {}",
        scope_feed::ONE_READ_MAX_THREADS + 1
    ))?;
    let mut rows = st.query(rusqlite::params_from_iter(args.iter()))?;
    while let Some(r) = rows.next()? {
        threads.insert((r.get(0)?, r.get(1)?));
    }
    if threads.len() > scope_feed::ONE_READ_MAX_THREADS {
        return Ok(None);
    }
    let sql = calls_sql_from(conn, &source, &format!("WHERE {scope}"))?;
    Ok(Some(OnePass { threads, sql, args }))
}

/// A scope of op `op` alone (no window) from the writer's rollups of it
/// (`scope_rollups`): no call or wait row is read, except the op's calls
/// where it is a memory op (the ledger replays them in return order). None
/// where the file has no such rollups (then its calls are streamed).
fn from_op_rollups(
    trace: &Trace,
    op: &str,
    pid: Option<u32>,
    nccl: Vec<sleuth_core::nccl::NcclEvent>,
    pinned_ranges: &PinnedState,
) -> Result<Option<ScopeParts>, StoreError> {
    // Aggregate tables and a few example rows by id: no check of the whole
    // per-call table (`Trace::keyed`), as the lean whole-trace answer.
    let conn = trace.keyed();
    let read = |e| trace.read_error(e);
    let Some(groups) = crate::call_groups::stored(conn).map_err(read)? else {
        return Ok(None);
    };
    let Some(inputs) = crate::scope_rollups::read(conn, trace, op, pid).map_err(read)? else {
        return Ok(None);
    };
    let mut data = TraceData {
        procs: trace.proc_events(pid)?,
        counts: trace.op_counts(pid)?,
        nccl,
        ..trace.frame(pid)?
    };
    keep_counts_of_op(&mut data.counts, Some(op));
    // The ledger's processes and the extent: every call of the op, nested
    // too, as the streamed pass notes them (`scope_feed`).
    let mut ledger = LedgerBuilder::new(None);
    for oc in &data.counts {
        ledger.track(oc.pid);
    }
    let mut extent: Option<(u64, u64)> = None;
    for g in groups
        .iter()
        .filter(|g| pid.is_none_or(|p| g.pid == p) && id_in_scope(Some(op), g.op))
    {
        ledger.track(g.pid);
        scope_feed::widen(&mut extent, (g.first_ts_ns, g.last_end_ns));
    }
    span_from_calls(&mut data, extent);
    // The pinned-memory replay has nothing to judge: a copy op's copies are
    // in the rollups, judged against the file's pinning calls (a file
    // written before round 16: with none), and a pinning op's scope has no
    // copy. They are judged again where the rollups could not know all:
    // an older file, or memory pinned before the file began that the
    // tracer did not judge them against (`run_pinned::judged_from`).
    let judged = crate::scope_rollups::copies_judged(conn).map_err(read)?;
    let rejudge = !judged
        || (!pinned_ranges.is_empty() && crate::run_pinned::judged_from(trace, pid)?.is_none());
    let memory: BTreeSet<&'static str> = sleuth_core::ledger::memory_op_names()
        .into_iter()
        .filter(|o| *o == op)
        .collect();
    replay(
        trace,
        pid,
        Replay {
            data,
            inputs,
            ledger,
            pinned: BTreeSet::new(),
            memory,
            kept: None,
            since_ns: None,
            until_ns: None,
            copies_of: copy_op(Some(op))
                .filter(|_| rejudge)
                .map(|o| (o, pinned_ranges.clone())),
        },
    )
    .map(Some)
}

/// The scope's op when it copies (its copies are judged against pinning
/// calls the scope does not hold).
pub(crate) fn copy_op(op: Option<&str>) -> Option<&'static str> {
    let info = sleuth_core::op_by_name(op?)?;
    (info.class == sleuth_core::ops::OpClass::Copy).then_some(info.name)
}

/// A scope of one copy op holds no pinning call, so its copies were judged
/// with no pinned memory (a window's pass; the op-scope rollups of a file
/// written before round 16) or without what was pinned before the file
/// began: judged again here against every pinning call of the scope's time, from
/// `earlier` (pinned before it began), replayed with the copies in end
/// order, as the whole trace judges them. Nothing pinned at all (the usual
/// program without pinned buffers): nothing read but one bounded look for a
/// pinning call.
fn rejudge_copies(
    trace: &Trace,
    pid: Option<u32>,
    op: &'static str,
    (since_ns, until_ns): (Option<u64>, Option<u64>),
    earlier: PinnedState,
    inputs: &mut FindingInputs,
) -> Result<(), StoreError> {
    let pinning = crate::finding_rollups::pinned_replay_ops(false);
    let rows = Rows::open(trace)?;
    let some_pinning = |limit| CallQuery {
        pid,
        ops: Some(pinning.clone()),
        since_ns,
        until_ns,
        limit,
        ..Default::default()
    };
    let mut found = false;
    rows.for_each_call::<StoreError>(&some_pinning(Some(1)), |_| {
        found = true;
        Ok(())
    })?;
    if !found && earlier.is_empty() {
        return Ok(());
    }
    let mut ops = pinning.clone();
    ops.push(op);
    let q = CallQuery {
        ops: Some(ops),
        ..some_pinning(None)
    };
    let (replay, _) = replay_pinning(&rows, q, earlier, |_| true)?;
    inputs.replace_pageable(replay);
    Ok(())
}

/// What the replay in return order completes (`replay`).
struct Replay {
    data: TraceData,
    inputs: FindingInputs,
    ledger: LedgerBuilder,
    /// Ops of the pinned-memory replay, and of the ledger, in scope.
    pinned: BTreeSet<&'static str>,
    memory: BTreeSet<&'static str>,
    /// A window's calls of those ops, kept by the pass; None: read them.
    kept: Option<PackedCalls>,
    /// The window's bounds (of the read when nothing was kept).
    since_ns: Option<u64>,
    until_ns: Option<u64>,
    /// A scope of one copy op: its copies judged again against every
    /// pinning call ([`rejudge_copies`]), from these ranges (pinned before
    /// the scope began).
    copies_of: Option<(&'static str, PinnedState)>,
}

/// The pinned-memory replay and the ledger in return order, from the
/// scope's calls of those ops only: the scope's parts. A window's were
/// kept by the pass (up to `scope_feed::KEPT_MAX`; past it they are read
/// again, the window's rows sorted by SQLite in bounded memory); an op's
/// over the whole trace are read again through the op index, the other
/// ops never.
fn replay(trace: &Trace, pid: Option<u32>, r: Replay) -> Result<ScopeParts, StoreError> {
    let Replay {
        mut data,
        mut inputs,
        mut ledger,
        pinned,
        memory,
        kept,
        since_ns,
        until_ns,
        copies_of,
    } = r;
    if let Some((op, earlier)) = copies_of {
        rejudge_copies(trace, pid, op, (since_ns, until_ns), earlier, &mut inputs)?;
    }
    let with_blocks: BTreeSet<u32> = data.blocks.iter().map(|b| b.pid).collect();
    let mut allocator_calls: Vec<(u64, i64, CallEvent)> = Vec::new();
    let mut by_return = |id: i64, c: &CallEvent| {
        if pinned.contains(c.op_name()) {
            inputs.add_in_end_order(crate::finding_rollups::row_index(id), c);
        }
        if memory.contains(c.op_name()) {
            ledger.push(c);
            // The allocator views read the memory calls of processes with blocks.
            if with_blocks.contains(&c.pid) {
                allocator_calls.push((c.ts_ns, id, c.clone()));
            }
        }
    };
    match kept {
        Some(kept) => {
            for (id, c) in kept.into_return_order() {
                by_return(id, &c);
            }
        }
        None => {
            let ops: Vec<&'static str> = pinned.union(&memory).copied().collect();
            if !ops.is_empty() {
                Rows::open(trace)?.for_each_call::<StoreError>(
                    &CallQuery {
                        pid,
                        ops: Some(ops),
                        order: StreamOrder::ByReturn,
                        since_ns,
                        until_ns,
                        ..Default::default()
                    },
                    |s| {
                        by_return(s.id, &s.call);
                        Ok(())
                    },
                )?;
            }
        }
    }
    allocator_calls.sort_by_key(|&(ts, id, _)| (ts, id));
    data.calls = allocator_calls.into_iter().map(|(_, _, c)| c).collect();
    Ok(ScopeParts {
        data,
        inputs,
        ledger,
        window_counts: None,
        allocators: None,
        tally: None,
    })
}

/// A trace without a stored start or end spans the scope's calls (first
/// start, last end), as the loaded scope does.
fn span_from_calls(data: &mut TraceData, extent: Option<(u64, u64)>) {
    if data.start_ns.is_none() {
        data.start_ns = extent.map(|e| e.0);
    }
    if data.end_ns.is_none() {
        data.end_ns = extent.map(|e| e.1);
    }
}

/// Scopes `data` to the window: a finding's share of "the trace"
/// (`allocation_churn`'s, `tail_latency`'s, a straggler's) is of the time
/// the window covers inside the trace (`TraceData::window_ns`). Until round
/// 51 a finished file's window was measured against the whole session:
/// churn in a 1-s window of a 3.4-s trace read 3.3% (low) where it took
/// 11% of the window (medium).
pub(crate) fn scope_to_window(data: &mut TraceData, since: Option<u64>, until: Option<u64>) {
    data.window_ns = (since, until);
}

/// Whether an op named `name` is in a scope of op `op` (every op without one).
fn name_in_scope(op: Option<&str>, name: &str) -> bool {
    op.is_none_or(|want| want == name)
}

/// [`name_in_scope`] for an op id (an id this build does not know is in
/// no op's scope).
pub(crate) fn id_in_scope(op: Option<&str>, id: u16) -> bool {
    op.is_none() || op_by_id(id).is_some_and(|o| name_in_scope(op, o.name))
}

/// Keeps the kernel-counted calls of op `op` (all without one): the
/// counts of a scope, here and in MCP tools that load it.
pub fn keep_counts_of_op(counts: &mut Vec<OpCount>, op: Option<&str>) {
    if op.is_some() {
        counts.retain(|oc| id_in_scope(op, oc.op));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::{op_by_name, Event};
    use std::path::Path;

    fn call(op: &str, (pid, tid): (u32, u32), ts: u64, dur: u64) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: dur,
            pid,
            tid,
            op: op_by_name(op).unwrap().id,
            ..Default::default()
        }
    }

    /// A file the tracer wrote, left as it is while still being written:
    /// no call groups, no rollups, no `(tid, ts_ns)` index. `threads`
    /// threads of two processes each launch, allocate and free, and sync.
    fn being_written(path: &Path, threads: u32) {
        let w =
            crate::TraceWriter::create(path, crate::SessionInfo::for_tests(), Default::default())
                .unwrap();
        let h = w.handle();
        for i in 0..400u64 {
            for t in 0..threads {
                let who = (100 + t % 2, 1000 + t);
                let ts = 1_000_000 + i * 10_000 + u64::from(t) * 100;
                let c = match i % 4 {
                    0 => {
                        let mut c = call("cudaMalloc", who, ts, 50);
                        let size = 4096 * (1 + u64::from(t % 8));
                        (c.size, c.ptr) = (Some(size), Some(0x10_0000 + u64::from(t) * 0x1000));
                        c
                    }
                    1 => {
                        let mut c = call("cudaFree", who, ts, 40);
                        c.ptr = Some(0x10_0000 + u64::from(t) * 0x1000);
                        c
                    }
                    2 => call("cudaStreamSynchronize", who, ts, 3_000 + i),
                    _ => call("cudaLaunchKernel", who, ts, 5 + i % 7),
                };
                h.send(Event::Call(c)).unwrap();
            }
        }
        drop(h);
        w.finish().unwrap();
        let c = rusqlite::Connection::open(path).unwrap();
        c.execute_batch(
            "DROP TABLE call_groups; DELETE FROM meta WHERE key = 'rollups';
             DROP INDEX IF EXISTS call_rows_tid_ts; DROP INDEX IF EXISTS call_rows_op_dur;",
        )
        .unwrap();
    }

    /// The explanation as JSON, without what depends on the trace's span:
    /// a file still being written has no end, which the loaded scope
    /// leaves unknown (a share of 0) and the streamed one takes from the
    /// calls it read (`span_from_calls`).
    fn explanation_json(p: ScopeParts) -> serde_json::Value {
        let mut v = serde_json::to_value(p.explain()).unwrap();
        for f in v["findings"].as_array_mut().unwrap() {
            f["evidence"]
                .as_object_mut()
                .unwrap()
                .remove("share_of_trace");
            f["summary"] = serde_json::Value::Null;
        }
        v
    }

    /// A window (or an op) of a file without call groups is read in one
    /// pass over its rows, not loaded: the same explanation as loading it;
    /// more threads than one pass holds statements for are loaded.
    #[test]
    fn a_file_without_call_groups_is_streamed_in_one_pass() {
        let dir = std::env::temp_dir().join(format!("gs-unthreaded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("live.db");
        being_written(&path, 4);
        let trace = Trace::open(&path).unwrap();
        let start = LedgerBuilder::new(None);
        let pinned = PinnedState::default();
        let seeded = |trace: &Trace, filter: &CallFilter| {
            parts_seeded(
                trace,
                filter,
                scope_feed::KEPT_MAX,
                &pinned,
                &start,
                true,
                None,
            )
        };
        for filter in [
            CallFilter {
                since_ns: Some(2_000_000),
                ..Default::default()
            },
            CallFilter {
                pid: Some(101),
                since_ns: Some(1_500_000),
                until_ns: Some(3_000_000),
                ..Default::default()
            },
            CallFilter {
                op: Some("cudaMalloc".into()),
                ..Default::default()
            },
        ] {
            let streamed = seeded(&trace, &filter)
                .unwrap()
                .expect("streamed in one pass");
            let loaded = loaded_parts(&trace, &filter, pinned.clone(), start.clone()).unwrap();
            let (s, l) = (explanation_json(streamed), explanation_json(loaded));
            // Something to compare: the windows' threads (their churn cost
            // under 1% of the window: no finding since round 56), memory
            // held in the op's scope.
            let said = |k: &str| s[k].as_array().is_some_and(|a| !a.is_empty());
            assert!(said("findings") || said("notes") || said("threads"), "{s}");
            assert_eq!(s, l, "{filter:?}");
        }
        let many = dir.join("many.db");
        being_written(&many, scope_feed::ONE_READ_MAX_THREADS as u32 + 1);
        let trace = Trace::open(&many).unwrap();
        let filter = CallFilter {
            since_ns: Some(2_000_000),
            ..Default::default()
        };
        let parts = seeded(&trace, &filter).unwrap();
        assert!(parts.is_none(), "loaded past one pass's threads");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A finished file of five threads in two processes, of unequal
    /// weight: launches, syncs, allocations and frees, copies from pinned
    /// and pageable memory, waits inside calls with culprits. Many calls
    /// of equal duration: the examples' ties are broken by row id.
    fn threads_of_unequal_weight(path: &Path) {
        let w =
            crate::TraceWriter::create(path, crate::SessionInfo::for_tests(), Default::default())
                .unwrap();
        let h = w.handle();
        // The heaviest thread written last: its calls have the largest
        // row ids, though the reader of the heaviest share reads it first.
        let threads = [
            (100, 1001, 1),
            (101, 1010, 3),
            (101, 1011, 1),
            (101, 1012, 2),
            (100, 1000, 5),
        ];
        for (pid, tid, weight) in threads {
            let mut events: Vec<(u64, Event)> = Vec::new();
            let mut t = 1_000_000 + u64::from(tid % 7) * 333;
            for i in 0..2_000 * weight {
                let who = (pid, tid);
                let c = match i % 6 {
                    0 => {
                        let mut c = call("cudaMalloc", who, t, 2_000);
                        (c.size, c.ptr) = (Some(4096), Some(0x10_0000 + u64::from(tid) * 0x1000));
                        c
                    }
                    1 => {
                        let mut c = call("cudaFree", who, t, 2_000);
                        c.ptr = Some(0x10_0000 + u64::from(tid) * 0x1000);
                        c
                    }
                    2 if i % 60 == 2 => {
                        let mut c = call("cudaHostAlloc", who, t, 3_000);
                        (c.size, c.ptr) = (
                            Some(1 << 20),
                            Some(0x7f00_0000_0000 + (u64::from(tid) << 24)),
                        );
                        c
                    }
                    2 => {
                        let mut c = call("cudaMemcpy", who, t, 40_000);
                        (c.size, c.kind) = (Some(1 << 16), Some(1));
                        c.host_ptr = Some(match i % 4 {
                            0 => 0x7f00_0000_0000 + (u64::from(tid) << 24) + 64,
                            _ => 0x5000_0000,
                        });
                        c
                    }
                    3 => call("cudaStreamSynchronize", who, t, 20_000),
                    _ => call("cudaLaunchKernel", who, t, 5_000),
                };
                let mut c = c;
                if i % 5 == 0 {
                    // Preempted inside the call by a hog, then back on CPU.
                    c.runnable_ns = c.dur_ns / 2;
                    let off = t + 100;
                    events.push((
                        off,
                        Event::Wait(sleuth_core::WaitEvent {
                            pid,
                            tid,
                            kind: sleuth_core::WaitKind::Preempted,
                            off_ns: off,
                            wake_ns: off,
                            on_ns: off + c.runnable_ns,
                            prev_state: 0,
                            cpu: 0,
                            culprits: vec![sleuth_core::Culprit {
                                pid: 900 + i as u32 % 2,
                                tid: 900 + i as u32 % 2,
                                comm: format!("hog{}", i % 2),
                                ns: c.runnable_ns,
                            }],
                            waker: None,
                        }),
                    ));
                }
                t += c.dur_ns + 1_000;
                events.push((c.ts_ns, Event::Call(c)));
            }
            for (_, e) in events {
                h.send(e).unwrap();
            }
        }
        drop(h);
        w.finish().unwrap();
    }

    /// A window's threads read side by side (shared out among helper
    /// connections) give exactly the explanation of one reader: findings,
    /// examples (ties by row id), splits, the ledger; the kept memory
    /// calls bounded over all readers, or read again past the bound.
    #[test]
    fn a_windows_threads_read_side_by_side_explain_as_one_reader() {
        use crate::check_plan::test_seams::WORKERS;
        let dir = std::env::temp_dir().join(format!("gs-side-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.db");
        threads_of_unequal_weight(&path);
        let trace = Trace::open(&path).unwrap();
        let threads: BTreeSet<(u32, u32)> = trace
            .load(None)
            .unwrap()
            .calls
            .iter()
            .map(|c| (c.pid, c.tid))
            .collect();
        assert_eq!(threads.len(), 5);
        let explained = |workers: usize, filter: &CallFilter, kept_max: usize| {
            WORKERS.with(|w| w.set(Some(workers)));
            let side = side_readers(&trace, &threads).len();
            let e = explanation_keeping_at_most(&trace, filter, kept_max)
                .unwrap()
                .expect("streamed");
            WORKERS.with(|w| w.set(None));
            (side, serde_json::to_value(e).unwrap())
        };
        for filter in [
            CallFilter {
                since_ns: Some(20_000_000),
                until_ns: Some(200_000_000),
                ..Default::default()
            },
            CallFilter {
                pid: Some(101),
                since_ns: Some(15_000_000),
                ..Default::default()
            },
            CallFilter {
                op: Some("cudaMemcpy".into()),
                since_ns: Some(1_000_000),
                ..Default::default()
            },
        ] {
            let (none, one) = explained(1, &filter, scope_feed::KEPT_MAX);
            assert_eq!(none, 0);
            let said = |k: &str| one[k].as_array().is_some_and(|a| !a.is_empty());
            assert!(said("findings") && said("threads"), "{one}");
            // Examples of the preemption ranked across threads (ties of
            // equal runnable time broken by row id).
            let kinds: Vec<&str> = one["findings"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|f| f["kind"].as_str())
                .collect();
            assert!(kinds.contains(&"cpu_preemption"), "{kinds:?}");
            for (workers, kept_max) in [(3, scope_feed::KEPT_MAX), (3, 0), (3, 40), (8, 7)] {
                let (side, many) = explained(workers, &filter, kept_max);
                assert!(side >= 2, "read side by side: {side} helper connections");
                assert_eq!(
                    many, one,
                    "{filter:?}, {workers} readers, kept at most {kept_max}"
                );
            }
            // A report's window: the calls tallied by the explanation's
            // pass, one reader or several, are those of their own read
            // (the slowest among many of equal duration: ties by start, id).
            if filter.op.is_none() {
                let want = crate::report_reads::window_calls(&trace, &filter, 5).unwrap();
                for workers in [1, 3] {
                    WORKERS.with(|w| w.set(Some(workers)));
                    let (e, got) = explanation_and_calls_or_loaded_after(
                        &trace,
                        &filter,
                        PinnedState::default(),
                        5,
                    )
                    .unwrap();
                    WORKERS.with(|w| w.set(None));
                    assert_eq!(serde_json::to_value(e).unwrap(), one);
                    assert_eq!(got.ops, want.ops, "{filter:?}");
                    assert_eq!(got.calls_by_pid, want.calls_by_pid);
                    assert_eq!(got.calls, want.calls);
                    assert_eq!(got.slowest, want.slowest);
                    assert_eq!(got.slowest.len(), 5);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn threads_are_shared_out_heaviest_first_to_the_lightest_share() {
        let threads: BTreeSet<(u32, u32)> = [(1, 1), (1, 2), (1, 3), (2, 4), (2, 5)].into();
        let w = |t: &(u32, u32)| [0, 50, 30, 20, 20, 0][t.1 as usize];
        let shares = scope_feed::share_out(&threads, 2, &w);
        assert_eq!(shares[0], [(1, 1), (2, 4)].into());
        assert_eq!(shares[1], [(1, 2), (1, 3), (2, 5)].into());
        // More shares than threads: the rest stay empty.
        let shares = scope_feed::share_out(&threads, 7, &w);
        assert_eq!(shares.iter().filter(|s| s.is_empty()).count(), 2);
        assert_eq!(shares.iter().map(BTreeSet::len).sum::<usize>(), 5);
    }
}
