//! What `gpusleuth report` reads of a trace without loading its calls and
//! waits (issue 16): the lean load (`crate::lean`: findings, ledgers, the
//! trace's frame), the per-op rollups for the latency distributions, the
//! call groups for the counts and the span, the extent from two aggregates
//! over the waits and lifecycle events, the slowest calls through the
//! `(op_id, dur_ns)` index with the culprits of those calls alone, and for
//! traces with call sites the device allocations tallied per stack in one
//! streamed pass over the memory calls. The report built from it equals the
//! one built from [`Trace::load`], percentiles within the histogram's bound
//! (docs/schema.md "Rollups").
//!
//! Reads of the call and wait tables follow the store's rule (SECURITY.md):
//! the few rows the report shows are read by index through
//! [`Trace::keyed`], and past `reader::KEYED_ROWS` rows only after the
//! tables were checked ([`Trace::bulk`]); the streamed pass over the memory
//! calls goes through the lean view's [`crate::stream::Rows`].

use crate::budget::ReadBudget;
use crate::error::{SqlContext, StoreError};
use crate::lean::Lean;
use crate::problems::{valid_call, valid_wait, MAX_NS};
use crate::reader::{Trace, KEYED_ROWS};
use crate::rows::{call_from_row, wait_from_row, waits_sql, CALL_COLS, WAIT_CULPRITS_SQL};
use crate::stacks::has_column;
use crate::stream::{CallQuery, MemoryTrace, StreamOrder};
use rusqlite::Connection;
use sleuth_core::culprits::culprits_of_call;
use sleuth_core::rollup::OpRollup;
use sleuth_core::sites::{AllocTally, SiteMemory};
use sleuth_core::{CallEvent, Culprit, ProcKind, TraceSpan, WaitEvent, WaitKind};
use std::collections::BTreeMap;

/// One of the slowest calls, with the tasks that held the CPU while it was
/// runnable-waiting (`sleuth_core::culprits::call_culprits` for this call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowCall {
    /// The call's row id.
    pub id: i64,
    pub call: CallEvent,
    pub culprits: Vec<Culprit>,
}

/// What the by-site table and the flame graph draw.
#[derive(Debug, Clone, Default)]
pub struct SiteReads {
    /// `sleuth_core::sites::memory_by_site` at the end of the trace (the
    /// example stacks may differ: the report does not draw them).
    pub sites: Vec<SiteMemory>,
    /// The device allocations tallied per stack id (the successful ones at
    /// least: what `sites::allocated_by_path_of` reads).
    pub allocs: Vec<AllocTally>,
}

/// Everything the report shows, read without the calls and waits.
pub struct LeanReport {
    pub lean: Lean,
    /// Rollups, counts, span and slowest calls ([`FileParts`]).
    pub parts: FileParts,
    /// None when the trace has no call sites (the sections are not drawn).
    pub sites: Option<SiteReads>,
}

/// The report's reads for the whole trace or for process `pid` (what
/// [`Trace::load`] of that pid holds); None (load everything) where
/// [`crate::lean::load`] gives None (with `pid`: a trace written before the
/// per-process finding rollups) or the trace has no complete rollups.
pub fn load(
    trace: &Trace,
    pid: Option<u32>,
    budget: ReadBudget,
    n_slowest: usize,
) -> Result<Option<LeanReport>, StoreError> {
    if !trace.has_rollups()? {
        return Ok(None);
    }
    let Some(lean) = crate::lean::load(trace, pid, budget)? else {
        return Ok(None);
    };
    let parts = file_parts(
        trace,
        &lean.view,
        lean.data.start_ns.is_some(),
        pid,
        n_slowest,
    )?;
    let sites = sites_of(trace, &lean, pid)?;
    Ok(Some(LeanReport { lean, parts, sites }))
}

/// [`load`] of a large file without rollups (the one a run's tracer is
/// still writing, a killed writer's; more than `above_rows` call rows):
/// the lean load from one streamed pass over its calls
/// ([`crate::lean::streamed`]), its calls' per-op rollups and slowest from
/// another ([`window_calls`] of no window), the rest as [`file_parts`]
/// reads it. None where the file has rollups, is smaller, or must be
/// loaded (`scoped::whole_streamed`).
pub fn streamed(
    trace: &Trace,
    pid: Option<u32>,
    budget: ReadBudget,
    n_slowest: usize,
    above_rows: i64,
) -> Result<Option<LeanReport>, StoreError> {
    let Some(lean) = crate::lean::streamed(trace, pid, budget, above_rows)? else {
        return Ok(None);
    };
    let whole = crate::CallFilter {
        pid,
        ..Default::default()
    };
    let calls = window_calls(trace, &whole, n_slowest)?;
    let started = lean.view.base.start_ns.is_some();
    let mut reads = KeyedReads::new(trace);
    let parts = parts_around(
        &mut reads,
        &lean.view,
        started,
        pid,
        calls.ops,
        calls.slowest,
    )?;
    let sites = sites_of(trace, &lean, pid)?;
    Ok(Some(LeanReport { lean, parts, sites }))
}

/// The call-site sections' reads; None for a file without call sites
/// (the sections are not drawn).
fn sites_of(trace: &Trace, lean: &Lean, pid: Option<u32>) -> Result<Option<SiteReads>, StoreError> {
    match lean.data.stacks.is_empty() {
        true => Ok(None),
        false => site_reads(trace, lean, pid).map(Some),
    }
}

/// What the report reads of one file besides its lean load, and what a
/// run's report adds up file by file (`crate::run_report`, [`FileParts::add`]).
#[derive(Debug, Clone)]
pub struct FileParts {
    /// Per op (all processes merged, or `pid`'s), as `stats` reads them.
    pub ops: BTreeMap<u16, OpRollup>,
    /// `TraceSpan::of` of the loaded file, extent included.
    pub span: TraceSpan,
    /// How many calls and waits [`Trace::load`] would give.
    pub calls: u64,
    pub waits: u64,
    /// Calls per process (per-call records only; kernel counts are apart).
    pub calls_by_pid: BTreeMap<u32, u64>,
    /// The `n` slowest calls not nested in another, slowest first, ties in
    /// load order (start time, then row id; over files, the earlier file).
    pub slowest: Vec<SlowCall>,
}

impl FileParts {
    /// Adds a later file's parts (a run's report): rollups merged, counts
    /// added, the span from this one's start to the later one's end (the
    /// origin and extent widened), the `n` slowest of both kept.
    pub fn add(&mut self, later: FileParts, n: usize) {
        merge_ops(&mut self.ops, &later.ops);
        let (a, b) = (self.span, later.span);
        self.span = TraceSpan {
            start_ns: a.start_ns,
            end_ns: b.end_ns.max(a.end_ns),
            origin_ns: a.origin_ns.min(b.origin_ns),
            extent_end_ns: a.extent_end_ns.max(b.extent_end_ns),
        };
        self.calls = self.calls.saturating_add(later.calls);
        self.waits = self.waits.saturating_add(later.waits);
        add_counts(&mut self.calls_by_pid, later.calls_by_pid);
        keep_slowest(&mut self.slowest, later.slowest, n);
    }
}

/// Merges a later file's per-op rollups into `ops`.
fn merge_ops(ops: &mut BTreeMap<u16, OpRollup>, later: &BTreeMap<u16, OpRollup>) {
    for (op, r) in later {
        ops.entry(*op).or_default().merge(r);
    }
}

/// Adds a later file's calls per process to `calls_by_pid`.
fn add_counts(calls_by_pid: &mut BTreeMap<u32, u64>, later: BTreeMap<u32, u64>) {
    for (p, c) in later {
        let e = calls_by_pid.entry(p).or_default();
        *e = e.saturating_add(c);
    }
}

/// [`FileParts`] of `trace` read through its memory view `view` (of
/// process `pid` or all); `started`: the file stores its session start
/// (the span's origin is then never after it).
pub fn file_parts(
    trace: &Trace,
    view: &MemoryTrace,
    started: bool,
    pid: Option<u32>,
    n_slowest: usize,
) -> Result<FileParts, StoreError> {
    let ops = op_rollups(trace, pid)?;
    let mut reads = KeyedReads::new(trace);
    let slowest = slowest_of(&mut reads, &ops, pid, n_slowest)?;
    parts_around(&mut reads, view, started, pid, ops, slowest)
}

/// A file's parts from its calls' per-op rollups and slowest calls: the
/// calls per process from the view's call groups, the waits and the span
/// from the waits and lifecycle events.
fn parts_around(
    reads: &mut KeyedReads,
    view: &MemoryTrace,
    started: bool,
    pid: Option<u32>,
    ops: BTreeMap<u16, OpRollup>,
    slowest: Vec<SlowCall>,
) -> Result<FileParts, StoreError> {
    let calls_by_pid = calls_by_pid(view);
    let calls = calls_by_pid
        .values()
        .fold(0u64, |a, &b| a.saturating_add(b));
    let rows = view.rows();
    let events = EventAggregates {
        waits: rows.event_counts(pid)?.0,
        earliest: rows.earliest_wait_or_event(pid)?,
        latest: latest_wait_or_event(reads, rows, pid)?,
    };
    let span = extent(view, started, &events);
    Ok(FileParts {
        ops,
        span,
        calls,
        waits: events.waits,
        calls_by_pid,
        slowest,
    })
}

/// What `report --from/--to` draws of a window's calls (its other sections
/// are the whole trace's, from [`load`] or the loaded trace): per op, per
/// process, and the slowest, from one streamed pass over the calls that
/// start in the window (memory: the ops' histograms and `n` calls), the
/// kernel-counted calls placed by the tracer's samples.
pub struct WindowCalls {
    /// Per op (all processes of the scope merged), as `stats --from/--to`
    /// reads them.
    pub ops: BTreeMap<u16, OpRollup>,
    /// Per-call records in the window.
    pub calls: u64,
    pub calls_by_pid: BTreeMap<u32, u64>,
    /// The `n` slowest calls in the window not nested in another, slowest
    /// first, ties by start time then row id, each with its culprits.
    pub slowest: Vec<SlowCall>,
    /// The kernel-counted calls placed in the window.
    pub counts: crate::window::WindowCounts,
}

/// [`WindowCalls`] of the calls `scope` selects (its process and window;
/// its op, order and limit are not read).
pub fn window_calls(
    trace: &Trace,
    scope: &crate::CallFilter,
    n: usize,
) -> Result<WindowCalls, StoreError> {
    if let Some(pid) = scope.pid {
        trace.require_pid(pid)?;
    }
    let q = CallQuery {
        pid: scope.pid,
        order: StreamOrder::AsFound,
        since_ns: scope.since_ns,
        until_ns: scope.until_ns,
        ..Default::default()
    };
    let mut tally = WindowTally::new(n);
    crate::stream::Rows::open(trace)?.for_each_call::<StoreError>(&q, |s| {
        tally.add(s.id, &s.call);
        Ok(())
    })?;
    window_calls_of(trace, scope, tally)
}

/// [`WindowCalls`] of the calls `scope` selects from their `tally` (the
/// slowest ones' culprits read by id).
pub(crate) fn window_calls_of(
    trace: &Trace,
    scope: &crate::CallFilter,
    tally: WindowTally,
) -> Result<WindowCalls, StoreError> {
    let mut reads = KeyedReads::new(trace);
    let slowest = tally
        .best
        .kept
        .into_iter()
        .map(|(id, call)| {
            let culprits = culprits_with(&mut reads, &call)?;
            Ok(SlowCall { id, call, culprits })
        })
        .collect::<Result<_, StoreError>>()?;
    WindowCalls::of(trace, scope, tally.ops, tally.calls_by_pid, slowest)
}

/// What [`WindowCalls`] adds up over a window's calls, each call given
/// once in any order: [`window_calls`]' read, or the explanation's pass
/// over the same calls (`scoped::explanation_and_calls_or_loaded_after`).
pub(crate) struct WindowTally {
    ops: BTreeMap<u16, OpRollup>,
    calls_by_pid: BTreeMap<u32, u64>,
    best: SlowestKept,
}

impl WindowTally {
    /// Keeping the `n` slowest calls not nested in another.
    pub(crate) fn new(n: usize) -> WindowTally {
        WindowTally {
            ops: BTreeMap::new(),
            calls_by_pid: BTreeMap::new(),
            best: SlowestKept::new(n),
        }
    }

    /// Call `c` of row `id`.
    pub(crate) fn add(&mut self, id: i64, c: &CallEvent) {
        self.ops.entry(c.op).or_default().add(c);
        *self.calls_by_pid.entry(c.pid).or_default() += 1;
        if !c.nested {
            self.best.offer(id, c);
        }
    }

    /// Adds the tally of other calls of the same file (another reader's
    /// threads): as if they had been added here (the slowest calls' order
    /// is total: duration, start, row id).
    pub(crate) fn absorb(&mut self, other: WindowTally) {
        merge_ops(&mut self.ops, &other.ops);
        add_counts(&mut self.calls_by_pid, other.calls_by_pid);
        for (id, c) in other.best.kept {
            self.best.offer(id, &c);
        }
    }
}

/// [`WindowCalls`] of a finished file whose every call starts in the
/// window `scope` names (`window::wholly_inside`): from its stored rollups
/// and by index, as the whole file's report reads them (no call streamed);
/// None when the file is not wholly inside.
pub fn whole_file_calls(
    trace: &Trace,
    scope: &crate::CallFilter,
    n: usize,
) -> Result<Option<WindowCalls>, StoreError> {
    if !crate::window::wholly_inside(trace, scope)? {
        return Ok(None);
    }
    if let Some(pid) = scope.pid {
        trace.require_pid(pid)?;
    }
    let rollups = trace.stored_rollups(scope.pid).at(trace.path())?;
    let mut ops: BTreeMap<u16, OpRollup> = BTreeMap::new();
    let mut calls_by_pid: BTreeMap<u32, u64> = BTreeMap::new();
    for (pid, op, r) in &rollups.ops {
        ops.entry(*op).or_default().merge(r);
        let e = calls_by_pid.entry(*pid).or_default();
        *e = e.saturating_add(r.count);
    }
    let slowest = slowest_calls(trace, &ops, scope.pid, n)?;
    WindowCalls::of(trace, scope, ops, calls_by_pid, slowest).map(Some)
}

impl WindowCalls {
    /// The window's calls of `trace` (`scope`'s window and process) from
    /// what was read of them, with their count and the kernel-counted calls
    /// the file's samples place in the window.
    fn of(
        trace: &Trace,
        scope: &crate::CallFilter,
        ops: BTreeMap<u16, OpRollup>,
        calls_by_pid: BTreeMap<u32, u64>,
        slowest: Vec<SlowCall>,
    ) -> Result<WindowCalls, StoreError> {
        let counts = crate::window::WindowCounts::of(trace, &trace.op_counts(scope.pid)?, scope)?;
        Ok(WindowCalls {
            calls: calls_by_pid
                .values()
                .fold(0u64, |a, &b| a.saturating_add(b)),
            ops,
            calls_by_pid,
            slowest,
            counts,
        })
    }

    /// Adds a later file's part of the same window (a run's `report
    /// --last`): per op, per process and the kernel-counted calls added
    /// up; the `n` slowest of both kept (this part's first on a tie of
    /// duration and start: the earlier file).
    pub fn merge(&mut self, later: WindowCalls, n: usize) {
        merge_ops(&mut self.ops, &later.ops);
        self.calls = self.calls.saturating_add(later.calls);
        add_counts(&mut self.calls_by_pid, later.calls_by_pid);
        keep_slowest(&mut self.slowest, later.slowest, n);
        self.counts.merge(later.counts);
    }
}

/// Adds a later file's slowest calls to `kept` (an earlier file's, or
/// several files'), keeping the `n` slowest: slowest first, ties by start
/// time, then the earlier file, then the row id (a stable sort of the
/// files' own orders).
fn keep_slowest(kept: &mut Vec<SlowCall>, later: Vec<SlowCall>, n: usize) {
    kept.extend(later);
    kept.sort_by_key(|s| (std::cmp::Reverse(s.call.dur_ns), s.call.ts_ns));
    kept.truncate(n);
}

/// The order of the report's slowest calls (row id, call): slowest first,
/// ties by start time then row id (the whole trace's load order).
fn slowest_first((id, c): &(i64, CallEvent)) -> (std::cmp::Reverse<u64>, u64, i64) {
    (std::cmp::Reverse(c.dur_ns), c.ts_ns, *id)
}

/// The `n` slowest calls offered so far, in [`slowest_first`] order.
struct SlowestKept {
    n: usize,
    kept: Vec<(i64, CallEvent)>,
}

impl SlowestKept {
    fn new(n: usize) -> SlowestKept {
        SlowestKept {
            n,
            kept: Vec::new(),
        }
    }

    /// Offers call `call` of row `id` (copied only when it is kept).
    fn offer(&mut self, id: i64, call: &CallEvent) {
        if self.n == 0 {
            return;
        }
        let new = (std::cmp::Reverse(call.dur_ns), call.ts_ns, id);
        if self.kept.len() == self.n {
            // Full: only a call ahead of the last kept one enters.
            if new >= slowest_first(&self.kept[self.n - 1]) {
                return;
            }
            self.kept.pop();
        }
        let at = self.kept.partition_point(|k| slowest_first(k) < new);
        self.kept.insert(at, (id, call.clone()));
    }
}

/// Per-call records per process (of the view's process alone where it
/// has one), from the call groups.
fn calls_by_pid(view: &MemoryTrace) -> BTreeMap<u32, u64> {
    let mut calls_by_pid: BTreeMap<u32, u64> = BTreeMap::new();
    for g in view.own_groups() {
        let e = calls_by_pid.entry(g.pid).or_default();
        *e = e.saturating_add(g.count);
    }
    calls_by_pid
}

/// The stored rollups per op of process `pid`, or of every process merged
/// (`stats` merges them the same way).
pub fn op_rollups(trace: &Trace, pid: Option<u32>) -> Result<BTreeMap<u16, OpRollup>, StoreError> {
    let rollups = trace.stored_rollups(pid).at(trace.path())?;
    let mut ops: BTreeMap<u16, OpRollup> = BTreeMap::new();
    for (_, op, r) in &rollups.ops {
        ops.entry(*op).or_default().merge(r);
    }
    Ok(ops)
}

/// `TraceSpan::of` of the loaded trace: the span from the session times and
/// the call groups, widened to the earliest and latest wait and lifecycle
/// event (`events`), of the view's process where it has one; `started`:
/// the trace stores its session start.
fn extent(view: &MemoryTrace, started: bool, events: &EventAggregates) -> TraceSpan {
    let first_call = view.own_groups().map(|g| g.first_ts_ns).min();
    let last_call = view.own_groups().map(|g| g.last_end_ns).max();
    let earliest = first_call.into_iter().chain(events.earliest).min();
    let latest = last_call.into_iter().chain(events.latest).max();
    let span = view.span;
    let origin_ns = match started {
        true => earliest.map_or(span.start_ns, |e| e.min(span.start_ns)),
        false => earliest.unwrap_or(span.start_ns),
    };
    TraceSpan {
        start_ns: span.start_ns,
        end_ns: span.end_ns,
        origin_ns,
        extent_end_ns: latest.map_or(span.end_ns, |l| l.max(span.end_ns)),
    }
}

/// What the report needs of every wait and lifecycle event that
/// [`Trace::load`] reads (kinds this build does not know are left out, as
/// the load leaves their rows out): how many waits, and the earliest start
/// (`off_ns`, `ts_ns`) and latest end (`on_ns`, `ts_ns`) of any of them.
#[derive(Debug, Default)]
struct EventAggregates {
    waits: u64,
    earliest: Option<u64>,
    latest: Option<u64>,
}

/// The per-call and per-wait tables read a few rows at a time, by index:
/// through [`Trace::keyed`] (no `quick_check` of the whole tables first,
/// the policy of a bounded read: `reader::KEYED_ROWS`) until more than
/// that many rows were read, then checked ([`Trace::bulk`]) before the next.
struct KeyedReads<'a> {
    trace: &'a Trace,
    read: usize,
    /// The trace's tracer pid, read once: never a culprit.
    tracer: Option<u32>,
}

impl<'a> KeyedReads<'a> {
    fn new(trace: &'a Trace) -> KeyedReads<'a> {
        KeyedReads {
            trace,
            read: 0,
            tracer: trace.tracer_pid(),
        }
    }

    /// The connection for the next rows.
    fn conn(&self) -> Result<&'a Connection, StoreError> {
        if self.read > KEYED_ROWS {
            return self.trace.bulk();
        }
        Ok(self.trace.keyed())
    }

    /// Counts one row read; past the bound the tables are checked first.
    fn row(&mut self) -> Result<(), StoreError> {
        self.read += 1;
        if self.read == KEYED_ROWS + 1 {
            self.trace.bulk()?;
        }
        Ok(())
    }
}

/// The latest end of a wait (`on_ns`) or lifecycle event that
/// [`Trace::load`] reads (kinds this build does not know are left out, as
/// the load leaves their rows out), of process `pid` or all: the waits'
/// from the ends stored when the file was completed (`wait_ends`); in a
/// file without them, by seeking a `(pid, on_ns)` index where the file has
/// one (written before round 27), else by one aggregate over the wait rows
/// (a file still being written); the lifecycle events' by an aggregate.
fn latest_wait_or_event(
    reads: &mut KeyedReads,
    rows: &crate::stream::Rows,
    pid: Option<u32>,
) -> Result<Option<u64>, StoreError> {
    let path = reads.trace.path();
    let waits = match rows.stored_wait_ends(pid)? {
        Some(ends) => ends.into_iter().max(),
        None if crate::open::has_index(reads.conn()?, "waits_pid_on").at(path)? => {
            latest_wait_by_pid_index(reads, pid)?
        }
        None => rows.latest_wait_by_scan(pid)?,
    };
    let mut latest = waits;
    let mut take = |v: u64| latest = Some(latest.map_or(v, |l: u64| l.max(v)));
    let mut st = reads
        .conn()?
        .prepare(&format!(
            "SELECT kind, max(ts_ns) FROM proc_events WHERE (?1 IS NULL OR pid = ?1) \
             AND ts_ns BETWEEN 0 AND {MAX_NS} GROUP BY kind"
        ))
        .at(path)?;
    let mut events = st.query([pid]).at(path)?;
    while let Some(r) = events.next().at(path)? {
        let kind: String = r.get(0).at(path)?;
        if let (Some(_), Some(v)) = (ProcKind::parse(&kind), r.get::<_, Option<i64>>(1).at(path)?) {
            take(v.max(0) as u64);
        }
    }
    Ok(latest)
}

/// The latest valid wait of a known kind of `pid` or all, through the
/// `(pid, on_ns)` index of a file that has one: per process with waits, its
/// waits latest first up to the first valid one of a known kind.
fn latest_wait_by_pid_index(
    reads: &mut KeyedReads,
    pid: Option<u32>,
) -> Result<Option<u64>, StoreError> {
    let path = reads.trace.path();
    let pids = match pid {
        Some(p) => vec![i64::from(p)],
        None => pids_with_waits(reads.conn()?, path)?,
    };
    let sql = format!(
        "SELECT w.on_ns, w.kind FROM waits w WHERE w.pid = ?1 AND {} ORDER BY w.on_ns DESC",
        valid_wait("w.")
    );
    let mut latest: Option<u64> = None;
    for pid in pids {
        reads.row()?;
        let mut st = reads.conn()?.prepare_cached(&sql).at(path)?;
        let mut rows = st.query([pid]).at(path)?;
        while let Some(r) = rows.next().at(path)? {
            reads.row()?;
            let kind: String = r.get(1).at(path)?;
            if WaitKind::parse(&kind).is_some() {
                let v = r.get::<_, i64>(0).at(path)?.max(0) as u64;
                latest = Some(latest.map_or(v, |l| l.max(v)));
                break;
            }
        }
    }
    Ok(latest)
}

/// Every pid with a wait row, each found by one seek of the `(pid, on_ns)`
/// index (the next pid after the last).
fn pids_with_waits(conn: &Connection, path: &std::path::Path) -> Result<Vec<i64>, StoreError> {
    let mut st = conn
        .prepare(
            "WITH RECURSIVE p(pid) AS (SELECT min(pid) FROM waits \
             UNION ALL SELECT (SELECT min(pid) FROM waits WHERE pid > p.pid) FROM p \
             WHERE p.pid IS NOT NULL) SELECT pid FROM p WHERE pid IS NOT NULL",
        )
        .at(path)?;
    let pids = st
        .query_map([], |r| r.get(0))
        .at(path)?
        .collect::<rusqlite::Result<_>>()
        .at(path)?;
    Ok(pids)
}

/// The `n` slowest calls not nested in another, of process `pid` or all,
/// as the full report picks them from every loaded call (slowest first,
/// ties in load order), each with its culprits. Per op, slowest first
/// through the `(op_id, dur_ns)` index, ops with the slowest maximum first
/// (`ops`: the rollups of `pid`, or of all); an op is read only down to the
/// `n`-th slowest duration found so far (rows of that duration are all
/// read: they may come first in load order), and an op whose maximum is
/// below it not at all. With `pid`, the index holds every process's rows:
/// those of other processes at or above that duration are read and
/// skipped. Memory: `n` calls.
pub fn slowest_calls(
    trace: &Trace,
    ops: &BTreeMap<u16, OpRollup>,
    pid: Option<u32>,
    n: usize,
) -> Result<Vec<SlowCall>, StoreError> {
    slowest_of(&mut KeyedReads::new(trace), ops, pid, n)
}

/// [`slowest_calls`] counting the rows it reads in `reads`.
fn slowest_of(
    reads: &mut KeyedReads,
    ops: &BTreeMap<u16, OpRollup>,
    pid: Option<u32>,
    n: usize,
) -> Result<Vec<SlowCall>, StoreError> {
    let trace = reads.trace;
    let mut order: Vec<(u16, u64)> = ops
        .iter()
        .filter(|(_, r)| r.count > 0)
        .map(|(&op, r)| (op, r.max_ns))
        .collect();
    order.sort_by_key(|&(op, max)| (std::cmp::Reverse(max), op));
    let conn = reads.conn()?;
    let path = trace.path();
    let sql = slowest_sql(conn, trace.version() >= 2).at(path)?;
    let mut st = conn.prepare(&sql.query).at(path)?;
    let mut ids_st = match sql.op_ids {
        true => Some(
            conn.prepare("SELECT id FROM ops WHERE op = ?1 ORDER BY id")
                .at(path)?,
        ),
        false => None,
    };
    // The best `n` so far by (slowest, earliest start, lowest id).
    let mut best: Vec<(i64, CallEvent)> = Vec::new();
    let key = slowest_first;
    let threshold = |best: &[(i64, CallEvent)]| -> u64 {
        if n > 0 && best.len() >= n {
            best[n - 1].1.dur_ns
        } else {
            0
        }
    };
    for (op, max) in order {
        let Some(info) = sleuth_core::op_by_id(op) else {
            continue;
        };
        if n == 0 || max < threshold(&best) {
            // Ops come by their maximum, slowest first: none later can enter.
            break;
        }
        // The op's ids in `ops` (one, unless the file was altered); version
        // 1 filters by name (the id is unused).
        let ids: Vec<i64> = match ids_st.as_mut() {
            Some(ids) => ids
                .query_map([info.name], |r| r.get(0))
                .at(path)?
                .collect::<rusqlite::Result<_>>()
                .at(path)?,
            None => vec![0],
        };
        for id in ids {
            let floor = threshold(&best).min(MAX_NS as u64) as i64;
            let mut rows = st
                .query(rusqlite::params![id, floor, info.name, pid])
                .at(path)?;
            while let Some(row) = rows.next().at(path)? {
                reads.row()?;
                // The duration first: the row that ends the op is read no further.
                let dur = row.get::<_, i64>(2).at(path)? as u64;
                if best.len() >= n && dur < threshold(&best) {
                    break;
                }
                let Some(mut c) = call_from_row(row).at(path)? else {
                    continue;
                };
                if c.call.nested {
                    continue;
                }
                c.call.stack_id = row.get::<_, Option<i64>>(16).at(path)?.map(|v| v as u64);
                best.push((c.id, c.call));
                best.sort_by_key(key);
                best.truncate(n);
            }
        }
    }
    best.into_iter()
        .map(|(id, call)| {
            let culprits = culprits_with(reads, &call)?;
            Ok(SlowCall { id, call, culprits })
        })
        .collect()
}

/// The per-op read of the slowest calls: `?1` the op's id in `ops`, `?2`
/// the floor (ns), `?3` the op's name, `?4` the pid (NULL: every process);
/// rows of [`call_from_row`] plus the stack id (column 16), slowest first.
struct SlowestSql {
    query: String,
    /// Whether `?1` is used (the op's ids must be looked up).
    op_ids: bool,
}

fn slowest_sql(conn: &Connection, v2: bool) -> rusqlite::Result<SlowestSql> {
    let (host, join) = crate::rows::host_ptr_join(conn)?;
    let stack = if has_column(conn, "calls", "stack_id")? {
        "calls.stack_id"
    } else {
        "NULL"
    };
    // Version 2 keeps the calls in `call_rows` under the `calls` view. A
    // query on the view loops over `ops` first and sorts every call of the
    // op (a pass over all of them), so it reads `call_rows` by the op's id
    // through the `(op_id, dur_ns)` index: the view's columns, the name
    // for `op`. Version 1's `calls` table has its `(op, dur_ns)` index.
    // (By the checked version: a version 1 file's stray `call_rows` table
    // is no table its structure check covers.)
    let (source, op_cond) = if v2 {
        ("call_rows calls", "calls.op_id = ?1")
    } else {
        ("calls", "calls.op = ?3 AND ?1 IS NOT NULL")
    };
    let cols: Vec<String> = CALL_COLS
        .split(", ")
        .map(|c| match (c, v2) {
            ("op", true) => "?3".to_string(),
            (c, _) => format!("calls.{c}"),
        })
        .collect();
    Ok(SlowestSql {
        query: format!(
            "SELECT {}, {host}, {stack} FROM {source} {join} WHERE {op_cond} \
             AND calls.dur_ns >= ?2 AND (?4 IS NULL OR calls.pid = ?4) AND {} \
             ORDER BY calls.dur_ns DESC",
            cols.join(", "),
            valid_call("calls.")
        ),
        op_ids: v2,
    })
}

/// The culprits of one call as `sleuth_core::culprits::call_culprits`
/// gives them from every wait: from its thread's waits that end after it
/// starts, read by end time (the `(tid, on_ns)` index) up to the first that
/// begins after it ends — a thread's waits do not overlap, so no later one
/// can overlap the call (the assumption `culprits_of_call` makes too).
pub fn culprits_of(trace: &Trace, call: &CallEvent) -> Result<Vec<Culprit>, StoreError> {
    culprits_with(&mut KeyedReads::new(trace), call)
}

/// [`culprits_of`] counting the rows it reads in `reads`.
fn culprits_with(reads: &mut KeyedReads, call: &CallEvent) -> Result<Vec<Culprit>, StoreError> {
    let trace = reads.trace;
    let (start, end) = (call.ts_ns, call.end_ns());
    if end <= start {
        return Ok(Vec::new());
    }
    // `+w.pid`: the `(tid, on_ns)` index, not `(pid, on_ns)`, whose range
    // holds every thread's waits (a thread without a later wait would read
    // the rest of its process's waits before the read stops).
    let conn = reads.conn()?;
    let path = trace.path();
    let tail = format!(
        "WHERE w.tid = ?1 AND +w.pid = ?2 AND w.on_ns > ?3 AND {} ORDER BY w.on_ns, w.id",
        valid_wait("w.")
    );
    let mut st = conn.prepare(&waits_sql(conn, &tail).at(path)?).at(path)?;
    let mut culprits_st = conn.prepare_cached(WAIT_CULPRITS_SQL).at(path)?;
    let mut rows = st
        .query(rusqlite::params![
            call.tid,
            call.pid,
            start.min(MAX_NS as u64) as i64
        ])
        .at(path)?;
    let mut waits: Vec<WaitEvent> = Vec::new();
    while let Some(row) = rows.next().at(path)? {
        reads.row()?;
        let off_ns: i64 = row.get(4).at(path)?;
        if off_ns as u64 >= end {
            break;
        }
        if let Some(w) = wait_from_row(row, &mut culprits_st).at(path)? {
            for _ in &w.culprits {
                reads.row()?;
            }
            if w.on_ns > w.wake_ns && !w.culprits.is_empty() {
                waits.push(w);
            }
        }
    }
    // The order `call_culprits` sorts a thread's waits in (stable from load order).
    waits.sort_by_key(|w| (w.on_ns, w.wake_ns));
    let refs: Vec<&WaitEvent> = waits.iter().collect();
    Ok(culprits_of_call(call, &refs, reads.tracer))
}

/// The by-site table and the allocations per stack: from the site rollup
/// the writer stored (`crate::site_rollup`, no call row read), else from
/// [`streamed_site_reads`]; of process `pid` or all.
fn site_reads(trace: &Trace, lean: &Lean, pid: Option<u32>) -> Result<SiteReads, StoreError> {
    let (conn, path) = (trace.keyed(), trace.path());
    // Every process with a call or a counted call, as the view lists them
    // (the lean load took the view's context: the stacks are in `lean.data`;
    // its counts are those of `pid` already).
    let mut pids: std::collections::BTreeSet<u32> = lean.view.own_groups().map(|g| g.pid).collect();
    pids.extend(lean.data.counts.iter().map(|c| c.pid));
    let sites = crate::site_rollup::memory_by_site(conn, &pids, &lean.data).at(path)?;
    let stored = crate::site_rollup::allocated_by_stack(conn, pid).at(path)?;
    if let (Some(sites), Some(allocs)) = (sites, stored) {
        return Ok(SiteReads { sites, allocs });
    }
    streamed_site_reads(lean, pid)
}

/// The device allocations tallied per stack and each process's ledger at
/// its own peak, from one pass over the memory calls in return order (the
/// order the ledger replays them in), of process `pid` or all: memory
/// bounded by what is live.
fn streamed_site_reads(lean: &Lean, pid: Option<u32>) -> Result<SiteReads, StoreError> {
    let mut peaks = sleuth_core::ledger::PeakSnapshots::new(&lean.ledgers);
    let allocs = streamed_tallies(&lean.view, pid, |c| peaks.push(c))?;
    // By pid; bare (the table reads only what was live, by stack).
    let at_peak: BTreeMap<u32, sleuth_core::ledger::LiveByStack> = peaks
        .finish()
        .iter()
        .map(|(&pid, l)| (pid, sleuth_core::ledger::live_by_stack(l)))
        .collect();
    Ok(SiteReads {
        sites: sleuth_core::sites::memory_by_site_of(
            &lean.data,
            allocs.iter().copied(),
            &lean.ledgers,
            &at_peak,
        ),
        allocs,
    })
}

/// The device allocations of one file tallied per stack, failed ones
/// apart, of process `pid` or all: from its site rollup, else from one pass
/// over its memory calls (`view`'s rows).
pub fn alloc_tallies(
    trace: &Trace,
    view: &MemoryTrace,
    pid: Option<u32>,
) -> Result<Vec<AllocTally>, StoreError> {
    let stored = crate::site_rollup::allocated_by_stack(trace.keyed(), pid).at(trace.path())?;
    match stored {
        Some(allocs) => Ok(allocs),
        None => streamed_tallies(view, pid, |_| {}),
    }
}

/// The device allocations tallied per stack (failed ones apart) from one
/// pass over the memory calls in return order, each call also handed to
/// `each`; of process `pid` or all.
fn streamed_tallies(
    view: &MemoryTrace,
    pid: Option<u32>,
    mut each: impl FnMut(&CallEvent),
) -> Result<Vec<AllocTally>, StoreError> {
    let mut tallies: BTreeMap<(Option<u64>, bool), AllocTally> = BTreeMap::new();
    let q = CallQuery {
        pid,
        ops: Some(sleuth_core::ledger::memory_op_names()),
        order: StreamOrder::ByReturn,
        ..Default::default()
    };
    view.rows().for_each_call::<StoreError>(&q, |s| {
        let c = s.call;
        each(&c);
        if let Some(a) = AllocTally::of(&c) {
            let t = tallies.entry((a.stack_id, a.failed)).or_insert(AllocTally {
                count: 0,
                bytes: 0,
                ..a
            });
            t.count = t.count.saturating_add(a.count);
            t.bytes = t.bytes.saturating_add(a.bytes);
        }
        Ok(())
    })?;
    Ok(tallies.into_values().collect())
}
