//! The trace tools: thin calls into sleuth-store and sleuth-core, each
//! returning compact JSON. Blocking (SQLite); the server runs them on the
//! blocking pool. Every failure is an `anyhow` error with a one-line message.

use crate::args;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sleuth_core::decompose::Split;
use sleuth_core::ledger::ProcessLedger;
use sleuth_core::{findings, gpu_activity, held, ledger, op_by_name, stats, CallEvent, TraceData};
use sleuth_store::stream::{call_span, CallQuery, MemoryTrace, Rows, StreamOrder};
use sleuth_store::window;
use sleuth_store::{
    run_readonly_sql_remembered, CallFilter, CheckMemo, ReadBudget, SqlLimits, Trace, WaitFilter,
};
use std::path::{Path, PathBuf};

pub(crate) const SLOW_CALLS_DEFAULT: u32 = 10;
const SLOW_CALLS_MAX: u32 = 100;
const TIMELINE_WINDOW_DEFAULT_NS: u64 = 10_000_000;
pub(crate) const TIMELINE_DEFAULT: u32 = 200;
const TIMELINE_MAX: u32 = 2000;
const MEMORY_POINTS_DEFAULT: u32 = 50;
/// GPU samples returned by `gpu_activity` (the series is thinned to this).
const GPU_SAMPLES_MAX: usize = 2000;
/// Allocator segments (most free first) and live blocks per segment in `memory`.
const MEMORY_SEGMENTS: usize = 20;
/// Call sites listed by `memory` (largest unfreed first; `call_sites` lists more).
pub(crate) const MEMORY_SITES: usize = 10;
const MEMORY_SEGMENT_BLOCKS: usize = 10;
/// Unfreed and failed allocations listed per process in `memory` (oldest
/// first; the counts say how many there are): a leak of 39,000 allocations
/// made a 3 MB answer, more than an assistant can read.
const MEMORY_LIST_MAX: usize = 100;
const SQL_ROWS_DEFAULT: u32 = 200;
const SQL_ROWS_MAX: u32 = 1000;
/// Bytes of values one `sql` answer carries at most (a small request used to
/// return 2 GB of JSON).
const SQL_ANSWER_BYTES: usize = 1 << 20;

/// The traces a server may read: the one named at start (`--db`, a file
/// or a run's directory with its files) and any under one directory
/// (`--trace-dir`, runs' directories included). A tool's `db` argument must
/// resolve (symbolic links followed) to one of them; anything else gets the
/// same answer whether it exists or not, so a client learns nothing about
/// the machine's files.
#[derive(Debug, Clone, Default)]
pub struct Served {
    pub db: Option<PathBuf>,
    pub dir: Option<PathBuf>,
}

/// Which database a call reads: its own `db` argument, else the server's
/// `--db`. A directory is a run of `trace --rotate` (the tools that answer
/// over a run say so; the others ask for one of its files).
pub fn resolve_db(arg: Option<&str>, served: &Served) -> Result<PathBuf> {
    let Some(a) = arg else {
        return match &served.db {
            Some(d) => Ok(d.clone()),
            None => bail!(
                "no trace database: start the server with --db FILE (or a run's directory), or with --trace-dir DIR and pass `db`"
            ),
        };
    };
    let refused = || {
        anyhow::anyhow!(
            "trace database {a:?} is not served: this server reads only the trace (or run) given with --db \
             and existing traces under its --trace-dir"
        )
    };
    let want = std::fs::canonicalize(a).map_err(|_| refused())?;
    let db = served
        .db
        .as_ref()
        .and_then(|d| std::fs::canonicalize(d).ok());
    let is_db = db.as_ref().is_some_and(|d| *d == want);
    // A file of the run `--db` names.
    let in_run = db
        .as_ref()
        .is_some_and(|d| d.is_dir() && want.starts_with(d));
    let in_dir = served
        .dir
        .as_ref()
        .and_then(|d| std::fs::canonicalize(d).ok())
        .is_some_and(|d| want.starts_with(d));
    if !(is_db || in_run || in_dir) || !(want.is_file() || want.is_dir()) {
        return Err(refused());
    }
    Ok(want)
}

/// The checks each trace passed, kept for the life of the server process
/// and shared with the command line through the user's cache
/// (`sleuth_store::CheckMemo::on_disk`: until the file changes): an
/// assistant asks many questions about one trace, and on a 10M-call trace
/// the checks cost seconds before each answer. [`save_checks`] after each
/// tool call.
pub(crate) fn memo() -> &'static CheckMemo {
    static MEMO: std::sync::OnceLock<CheckMemo> = std::sync::OnceLock::new();
    MEMO.get_or_init(CheckMemo::on_disk)
}

/// Saves what the last tool call's checks passed into the user's cache
/// (nothing when they passed nothing new).
pub(crate) fn save_checks() {
    memo().save();
}

/// Opens a trace for a tool, without the checks it passed for an earlier
/// call. A run's directory is a one-line error for a tool that reads one
/// file (`run_tools::one_file`).
pub(crate) fn open(db: &Path, budget: &ReadBudget) -> Result<Trace> {
    crate::run_tools::one_file(db)?;
    Trace::open_remembered(db, budget.clone(), memo()).map_err(anyhow::Error::from)
}

pub(crate) fn check_op(op: Option<&str>) -> Result<()> {
    if let Some(name) = op {
        if op_by_name(name).is_none() {
            bail!("unknown op {name:?}: use a CUDA symbol name such as cudaMalloc, cudaStreamSynchronize or cuMemAlloc_v2");
        }
    }
    Ok(())
}

fn check_window(since: Option<u64>, until: Option<u64>) -> Result<()> {
    if let (Some(s), Some(u)) = (since, until) {
        if s >= u {
            bail!("empty time window: since_ns ({s}) must be below until_ns ({u})");
        }
    }
    Ok(())
}

/// Refuses a window `[since, until)` that holds no moment of `trace`: one
/// ending at or before its start, or (of a finished trace) beginning after
/// its end. Such a window selects nothing, and an empty answer would read as
/// a clean bill of health; the CLI refuses it too (`--from` past the end:
/// "the trace lasts only ..."). The error gives the trace's range in the
/// same absolute ns as the arguments. A trace still being written may yet
/// get calls past its latest one: only a window before its start is refused.
pub(crate) fn check_window_in_trace(
    trace: &Trace,
    since: Option<u64>,
    until: Option<u64>,
) -> Result<()> {
    if since.is_none() && until.is_none() {
        return Ok(());
    }
    let finished = trace.session()?.end_mono_ns.is_some();
    let (start, end) = trace.start_and_end()?;
    let before = until.is_some_and(|u| u <= start);
    let after = finished && since.is_some_and(|s| s > end);
    if before || after {
        let show = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        bail!(
            "the window [{}, {}) ns holds no moment of the trace: it runs from {start} to {end} ns \
             (monotonic clock, as `overview` gives its time_range{})",
            show(since),
            show(until),
            if finished { "" } else { "; still being written: its latest call so far" }
        );
    }
    Ok(())
}

/// Loads the trace (one process or all) and keeps the calls in the scope.
fn load_scoped(trace: &Trace, scope: &args::CallScope) -> Result<TraceData> {
    check_op(scope.op.as_deref())?;
    check_window(scope.since_ns, scope.until_ns)?;
    // Only the calls in scope are read (an op or a window through the
    // indexes), not every call of the process loaded and then dropped.
    let mut data = trace.load_calls_of(&scope.filter())?;
    keep_counts_in_scope(&mut data.counts, scope);
    Ok(data)
}

/// The statistics of a whole large file without rollups (still being
/// written, or its writer was killed), streamed (`whole_stats`), when the
/// scope has no op (an op's scope loads its calls alone); None otherwise.
fn streamed_whole(trace: &Trace, scope: &args::CallScope) -> Result<Option<stats::StatsReport>> {
    if scope.op.is_some() {
        return Ok(None);
    }
    let above = sleuth_store::scoped::STREAMED_ABOVE_ROWS;
    Ok(sleuth_store::whole_stats::streamed(
        trace, scope.pid, above,
    )?)
}

/// Keeps the kernel-counted calls of the scope's op (all without one).
fn keep_counts_in_scope(counts: &mut Vec<sleuth_core::OpCount>, scope: &args::CallScope) {
    sleuth_store::scoped::keep_counts_of_op(counts, scope.op.as_deref());
}

/// What `overview` reads from one trace file: from one pass over its call
/// groups and SQL counts, nothing held per call. A run's overview adds up
/// its files' (`run_tools::overview`).
pub(crate) struct FileOverview {
    pub session: sleuth_store::Session,
    pub span: sleuth_core::TraceSpan,
    /// The stored counters, the NVML samples (`gpu_activity`, drops).
    pub info: TraceData,
    /// Each process with its calls.
    pub processes: Vec<(sleuth_core::data::ProcessInfo, u64)>,
    pub counts: OverviewCounts,
    pub host_context: bool,
    pub libraries: Vec<sleuth_store::LibraryInfo>,
    pub notes: Vec<sleuth_store::Note>,
    /// The rows the reads skipped.
    pub problems: sleuth_store::InputProblems,
}

/// The event counts of an overview.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub(crate) struct OverviewCounts {
    pub calls: u64,
    pub failed_calls: u64,
    pub waits: u64,
    pub lifecycle_events: u64,
    pub kernel_counted_calls: u64,
}

impl OverviewCounts {
    /// Adds another file's (saturating: a crafted file's counts are not trusted).
    pub fn add(&mut self, o: &OverviewCounts) {
        self.calls = self.calls.saturating_add(o.calls);
        self.failed_calls = self.failed_calls.saturating_add(o.failed_calls);
        self.waits = self.waits.saturating_add(o.waits);
        self.lifecycle_events = self.lifecycle_events.saturating_add(o.lifecycle_events);
        self.kernel_counted_calls = self
            .kernel_counted_calls
            .saturating_add(o.kernel_counted_calls);
    }
}

impl FileOverview {
    pub fn read(trace: &Trace, budget: &ReadBudget) -> Result<FileOverview> {
        let session = trace.session()?;
        let rows = Rows::open_with(trace, budget.clone())?;
        let groups = rows.call_groups()?;
        let (waits, lifecycle) = rows.event_counts(None)?;
        let info = TraceData {
            stats: trace.stats()?,
            gpu_samples: trace.gpu_samples()?,
            process_gpu: trace.process_gpu_samples(None)?,
            ..Default::default()
        };
        let calls_of = |pid: u32| -> u64 {
            groups
                .iter()
                .filter(|g| g.pid == pid)
                .map(|g| g.count)
                .sum()
        };
        let processes = trace
            .processes()?
            .into_iter()
            .map(|p| {
                let calls = calls_of(p.pid);
                (p, calls)
            })
            .collect();
        // A stored trace always says when it started, so its span is known.
        let span = call_span(
            Some(session.info.start_mono_ns),
            session.end_mono_ns,
            &groups,
            None,
        );
        let failed_calls = groups
            .iter()
            .filter(|g| {
                CallEvent {
                    op: g.op,
                    ret: g.ret,
                    ..Default::default()
                }
                .failed()
            })
            .map(|g| g.count)
            .sum();
        let counts = OverviewCounts {
            calls: groups.iter().map(|g| g.count).sum(),
            failed_calls,
            waits,
            lifecycle_events: lifecycle,
            kernel_counted_calls: trace.op_counts(None)?.iter().map(|c| c.count).sum(),
        };
        Ok(FileOverview {
            session,
            span,
            info,
            processes,
            counts,
            host_context: trace.has_host_context(),
            libraries: trace.libraries()?,
            notes: trace.notes()?,
            // After the reads: the rows they skipped (a large finished trace
            // is answered from its stored groups without reading a call or
            // wait row).
            problems: trace.input_problems_of_reads()?.unwrap_or_default(),
        })
    }
}

/// The overview's time range.
pub(crate) fn time_range_json(span: &sleuth_core::TraceSpan, realtime_offset_ns: i64) -> Value {
    json!({
        "clock": "the trace's clock, ns (CLOCK_MONOTONIC minus meta.clock_base_ns); wall-clock ns = value + realtime_offset_ns",
        "start_ns": span.start_ns, "end_ns": span.end_ns,
        "duration_ns": span.duration_ns(),
        "realtime_offset_ns": realtime_offset_ns,
    })
}

/// Sessions, processes, time range, counts, drops, libraries, notes: from
/// one pass over the call rows and SQL counts, nothing held per call. A
/// run's directory: its files added up (`run_tools::overview`).
pub fn overview(db: &Path, budget: &ReadBudget) -> Result<Value> {
    if db.is_dir() {
        return crate::run_tools::overview(db, budget);
    }
    let trace = open(db, budget)?;
    let o = FileOverview::read(&trace, budget)?;
    let processes: Vec<Value> = o
        .processes
        .iter()
        .map(|(p, calls)| process_json(p, *calls))
        .collect();
    Ok(json!({
        "db": db.display().to_string(),
        "session": o.session,
        "time_range": time_range_json(&o.span, o.session.info.realtime_offset_ns),
        "host_context": o.host_context,
        "counts": counts_json(&o.counts, o.processes.len()),
        "drops": stats::drop_counters(&o.info),
        "attach_edges": stats::attach_edges(&o.info),
        "events": stats::event_counters(&o.info),
        "gpu_activity": gpu_activity::of_trace(&o.info),
        "counters": o.info.stats,
        "processes": processes,
        "libraries": o.libraries,
        "notes": o.notes,
        "input_problems": o.problems,
        "gpus": GPUS_NOTE,
    }))
}

/// What `gpu_activity` in an overview is, and where the GPUs of now are.
pub(crate) const GPUS_NOTE: &str = "gpu_activity: NVML busy samples taken during the trace (measured: false when NVML was not available); \
                 use the gpu_holders tool for the GPUs of this machine now";

/// One process of an overview, with its calls.
pub(crate) fn process_json(p: &sleuth_core::data::ProcessInfo, calls: u64) -> Value {
    json!({
        "pid": p.pid, "ppid": p.ppid, "comm": p.comm, "cmdline": p.cmdline,
        "start_ns": p.start_ns, "exit_ns": p.exit_ns, "exit_code": p.exit_code,
        "oom_victim": p.oom_victim, "calls": calls,
    })
}

/// An overview's counts, with its processes' number.
pub(crate) fn counts_json(c: &OverviewCounts, processes: usize) -> Value {
    json!({
        "calls": c.calls, "failed_calls": c.failed_calls,
        "waits": c.waits, "lifecycle_events": c.lifecycle_events,
        "kernel_counted_calls": c.kernel_counted_calls,
        "processes": processes,
    })
}

/// Per-op latency statistics with the on-CPU / runnable / blocked split:
/// from the rollups when the trace has them and no time window is asked
/// for (as `stats` answers); for a window of a finished trace from the
/// window's calls and their stored culprits (`sleuth_store::window`, as
/// `stats --from/--to`); else from the calls in the scope, loaded. A
/// window places the kernel-counted calls, which carry no time, by the
/// tracer's samples of their counts (`counted_in_window`, `notes`).
pub fn latency_stats(db: &Path, scope: &args::CallScope, budget: &ReadBudget) -> Result<Value> {
    if db.is_dir() {
        return crate::run_tools::latency_stats(db, scope, budget);
    }
    let trace = open(db, budget)?;
    let scope = &scope.resolved(&trace)?;
    check_op(scope.op.as_deref())?;
    check_window(scope.since_ns, scope.until_ns)?;
    check_window_in_trace(&trace, scope.since_ns, scope.until_ns)?;
    let windowed = scope.since_ns.is_some() || scope.until_ns.is_some();
    let (mut report, counted) = match windowed {
        true => window::stats_of(&trace, &scope.filter())?,
        false => {
            let report = match trace.stats_report(scope.pid)? {
                Some(r) => r,
                None => match streamed_whole(&trace, scope)? {
                    Some(r) => r,
                    None => stats::compute(&load_scoped(&trace, scope)?),
                },
            };
            (report, window::WindowCounts::default())
        }
    };
    let host_context = trace.has_host_context();
    // Each op's figures are its own: an op filter keeps its row.
    if let Some(op) = scope.op.as_deref() {
        report.ops.retain(|o| o.op == op);
    }
    Ok(json!({
        "units": STATS_UNITS,
        "filter": {"pid": scope.pid, "op": scope.op, "since_ns": scope.since_ns, "until_ns": scope.until_ns,
                   "last_ns": scope.last_ns},
        "host_context": host_context,
        "ops": report.ops,
        "drops": report.drops,
        "notes": counted.notes(window::STATS_COUNT),
        "counted_in_window": counted.json(),
    }))
}

/// What `latency_stats`' figures are.
pub(crate) const STATS_UNITS: &str =
    "ns; on_cpu + runnable + blocked = total; runnable = waiting for a CPU held by `culprits`";

/// `explain`'s ranked findings with evidence.
pub fn findings(db: &Path, scope: &args::CallScope, budget: &ReadBudget) -> Result<Value> {
    if db.is_dir() {
        return crate::run_tools::findings(db, scope, budget);
    }
    let trace = open(db, budget)?;
    let scope = &scope.resolved(&trace)?;
    // The whole trace or one process (no op, no window) is explained from
    // the stored aggregates when it has them (`sleuth_store::lean`): memory
    // bounded by the aggregates, not the calls; a large file without them
    // streamed in one pass. A scope (an op or a window) from its calls
    // streamed thread by thread (`sleuth_store::scoped`).
    // Else the scope is loaded (`load_scoped` checks the op and the window).
    let unfiltered = scope.op.is_none() && scope.since_ns.is_none() && scope.until_ns.is_none();
    let report = if unfiltered {
        match sleuth_store::lean::load(&trace, scope.pid, budget.clone())? {
            Some(l) => l.explanation(),
            // A large file without rollups (still being written, or its
            // writer was killed): streamed as `explain` streams it.
            None => match sleuth_store::scoped::whole_streamed(
                &trace,
                scope.pid,
                sleuth_store::scoped::STREAMED_ABOVE_ROWS,
            )? {
                Some((_, _, e)) => e,
                None => findings::explain_report(&load_scoped(&trace, scope)?),
            },
        }
    } else {
        check_op(scope.op.as_deref())?;
        check_window(scope.since_ns, scope.until_ns)?;
        check_window_in_trace(&trace, scope.since_ns, scope.until_ns)?;
        sleuth_store::scoped::explanation_or_loaded(&trace, &scope.filter())?
    };
    // After the reads: rows skipped by what was read (a large trace answered
    // from its aggregates alone read no call or wait row, none was skipped).
    let problems = trace.input_problems_of_reads()?;
    let rows_read = problems.is_some();
    let problems = problems.unwrap_or_default();
    Ok(json!({
        "summary": report.summary,
        "findings": report.findings,
        "threads": report.threads,
        "notes": report.notes,
        // Rows the reader had to skip were not examined: not clean.
        "input_problems": problems,
        // False when the answer came from the stored aggregates of a large
        // trace without reading its call and wait rows (then not counted).
        "call_rows_read": rows_read,
        // Events lost during capture were not examined either.
        "events_lost": report.events_lost,
        "clean": report.findings.is_empty() && problems.is_empty() && report.events_lost == 0,
    }))
}

/// The slowest calls (of one op), each with its time split and culprits.
pub fn slow_calls(db: &Path, a: &args::SlowCalls, budget: &ReadBudget) -> Result<Value> {
    check_op(a.op.as_deref())?;
    let limit = a.limit.unwrap_or(SLOW_CALLS_DEFAULT);
    if limit == 0 || limit > SLOW_CALLS_MAX {
        bail!("limit must be between 1 and {SLOW_CALLS_MAX} (got {limit})");
    }
    if db.is_dir() {
        return crate::run_tools::slow_calls(db, a, budget);
    }
    let trace = open(db, budget)?;
    // An absent process is an error, as in every other tool: no calls must
    // not read as "nothing slow".
    if let Some(pid) = a.pid {
        trace.require_pid(pid)?;
    }
    slow_calls_in(&trace, a, budget)
}

/// [`slow_calls`] of one open trace (`a` checked by the caller; a run's
/// files are each read with it, the pid required of the run, not of each).
pub(crate) fn slow_calls_in(
    trace: &Trace,
    a: &args::SlowCalls,
    budget: &ReadBudget,
) -> Result<Value> {
    let limit = a.limit.unwrap_or(SLOW_CALLS_DEFAULT);
    // Through the calls(op, dur_ns) index: only `limit` rows are read.
    let mut calls = Vec::new();
    Rows::open_with(trace, budget.clone())?.for_each_call::<sleuth_store::StoreError>(
        &CallQuery {
            pid: a.pid,
            ops: a.op.as_deref().and_then(op_by_name).map(|o| vec![o.name]),
            order: StreamOrder::ByDurationDesc,
            limit: Some(limit as usize),
            ..Default::default()
        },
        |c| {
            calls.push(c);
            Ok(())
        },
    )?;
    let ids: Vec<i64> = calls.iter().map(|c| c.id).collect();
    let culprits = trace.call_culprits_of(&ids)?;
    let stacks = trace.stacks(a.pid)?;
    let rows: Vec<Value> = calls
        .iter()
        .map(|s| {
            let mut v = call_json(&s.call);
            v["id"] = json!(s.id);
            v["culprits"] = json!(culprits.get(&s.id).cloned().unwrap_or_default());
            // The line that made the call (captured for calls over `trace --site-slow`).
            v["site"] = json!(s
                .call
                .stack_id
                .map(|id| stacks.get(&id).map(|st| st.site_label())));
            v
        })
        .collect();
    Ok(json!({
        "units": "ns; culprits: tasks that held the CPU while the call waited runnable (ns of that wait)",
        "op": a.op, "pid": a.pid,
        "calls": rows,
    }))
}

fn call_json(c: &CallEvent) -> Value {
    let split = Split::of(c);
    json!({
        "ts_ns": c.ts_ns, "dur_ns": c.dur_ns, "pid": c.pid, "tid": c.tid,
        "op": c.op_name(), "ret": c.ret,
        "error": if c.failed() { Some(findings::error_name(c.ret)) } else { None },
        "size": c.size, "ptr": c.ptr.map(|p| format!("{p:#x}")),
        "nested": c.nested,
        "on_cpu_ns": split.on_cpu_ns, "runnable_ns": split.runnable_ns, "blocked_ns": split.blocked_ns,
    })
}

/// The GPU memory ledger, at the end or at `at_ns`.
pub fn memory(db: &Path, a: &args::Memory, budget: &ReadBudget) -> Result<Value> {
    let points = a.timeline_points.unwrap_or(MEMORY_POINTS_DEFAULT) as usize;
    if points > ledger::MAX_TIMELINE_POINTS {
        bail!(
            "timeline_points must be at most {}",
            ledger::MAX_TIMELINE_POINTS
        );
    }
    if db.is_dir() {
        return crate::run_tools::memory(db, a, points, budget);
    }
    let trace = open(db, budget)?;
    // The ledger is replayed from the memory calls streamed from the store.
    let mt = MemoryTrace::open(&trace, a.pid, budget.clone())?;
    let procs = mt.ledgers(a.at_ns)?;
    // What the driver said each process held before the trace (whole trace).
    let end = match a.at_ns {
        Some(_) => mt.ledgers(None)?,
        None => procs.clone(),
    };
    // The sites at the end come from the site rollup of a finished trace;
    // else (at a moment, or an older trace) they are streamed from the
    // memory calls (`MemoryTrace::sites_streamed`), never all held. So is
    // the allocator view: it reads the memory calls of the processes with
    // allocator blocks at each of its passes.
    let stored_sites = match a.at_ns {
        None => mt.stored_sites()?,
        Some(_) => None,
    };
    // PyTorch's caching allocator rebuilt from `--torch-allocator` events
    // (reserved from the ledger, so before the timeline is thinned).
    let allocators = mt.allocator_views(a.at_ns, &procs)?;
    let data = &mt.base;
    let helds = held::held(data, &end);
    let sites = match stored_sites {
        Some(s) => s,
        None => {
            let mut listed = procs.clone();
            held::list_held_only(&mut listed, &helds, data);
            mt.sites_streamed(&listed, a.at_ns)?
        }
    };
    let mut v = memory_json(procs, &allocators, &helds, data, points)?;
    v["at_ns"] = json!(a.at_ns);
    v["sites"] = json!(sites.into_iter().take(MEMORY_SITES).collect::<Vec<_>>());
    Ok(v)
}

/// The `memory` answer's processes (ledgers with their lists capped, the
/// timeline thinned to `points`, allocator view and the driver's view) and
/// what its fields mean; the caller adds `at_ns` and `sites`.
pub(crate) fn memory_json(
    mut procs: Vec<ProcessLedger>,
    allocators: &std::collections::BTreeMap<u32, sleuth_core::allocator::AllocatorView>,
    helds: &[held::HeldMemory],
    data: &TraceData,
    points: usize,
) -> Result<Value> {
    held::list_held_only(&mut procs, helds, data);
    let total = procs.len();
    let omitted = keep_notable(&mut procs);
    for p in &mut procs {
        let full = std::mem::take(&mut p.timeline);
        if points > 0 {
            p.timeline = ledger::thin_timeline(full, points);
        }
    }
    let mut processes = Vec::with_capacity(procs.len());
    for p in &procs {
        let mut v = serde_json::to_value(p)?;
        // Failures past the ledger's list are counted, not listed.
        for (list, count, n) in [
            ("unfreed", "unfreed_count", p.unfreed.len() as u64),
            (
                "failed_allocs",
                "failed_alloc_count",
                p.failed_alloc_count(),
            ),
        ] {
            if let Some(items) = v[list].as_array_mut() {
                items.truncate(MEMORY_LIST_MAX);
                v[count] = json!(n);
            }
        }
        v["allocator"] = match allocators.get(&p.pid) {
            Some(view) => {
                serde_json::to_value(view.trimmed(MEMORY_SEGMENTS, MEMORY_SEGMENT_BLOCKS))?
            }
            None => Value::Null,
        };
        v["held"] = match helds.iter().find(|h| h.pid == p.pid) {
            Some(h) => serde_json::to_value(h)?,
            None => Value::Null,
        };
        processes.push(v);
    }
    Ok(json!({
        "units": "bytes; ts in monotonic ns; live_bytes/unfreed are device memory (pinned and managed apart)",
        "held": "per process: NVML's per-process used memory when its tracing began (before_trace_bytes; \
                 0 = not listed then), at the end and its maximum, beside the ledger's allocations/frees \
                 during the trace; allocations made before the trace are not itemized; \
                 pre_trace_frees counts frees of them (sizes not seen); measured: false = no NVML reading",
        "allocator": "per process: PyTorch's caching allocator (allocated = memory_allocated(), gap = reserved - allocated, \
                      segments with the most free bytes first, their largest live blocks); null without allocator events",
        "processes": processes,
        "processes_total": total,
        "processes_omitted": omitted.as_ref().map_or(0, |o| o.count),
        "processes_omitted_note": omitted.map(|o| format!(
            "{} more process(es) not listed ({} of them exited: the driver frees a process's device \
             memory when it exits; {} bytes unfreed in all). Listed: the processes still running or with \
             a failed allocation (most live bytes first, at most {MEMORY_PROCESSES}), then the \
             {MEMORY_EXITED_LISTED} others with the highest peaks; pass pid for one",
            o.count, o.exited, o.unfreed_bytes
        )),
    }))
}

/// Past this many processes `memory` lists those still running and those
/// with a failed allocation (at most this many), then the exited ones with
/// the highest peaks ([`MEMORY_EXITED_LISTED`]), and counts the rest: a
/// node agent's run of 6,000 short-lived processes answered 6,000 of them.
const MEMORY_PROCESSES: usize = 32;
/// Exited processes listed past [`MEMORY_PROCESSES`], highest peak first.
const MEMORY_EXITED_LISTED: usize = 10;

/// What [`keep_notable`] left out.
struct Omitted {
    count: usize,
    exited: usize,
    unfreed_bytes: u64,
}

/// Keeps in `procs` the processes `memory` lists (see [`MEMORY_PROCESSES`];
/// by pid, then the exited ones by peak), returning what it left out.
fn keep_notable(procs: &mut Vec<ProcessLedger>) -> Option<Omitted> {
    if procs.len() <= MEMORY_PROCESSES {
        return None;
    }
    let (full, brief) = ledger::notable_first(procs, MEMORY_PROCESSES);
    let listed = full.len() + brief.len().min(MEMORY_EXITED_LISTED);
    let omitted = &brief[brief.len().min(MEMORY_EXITED_LISTED)..];
    let out = Omitted {
        count: omitted.len(),
        exited: omitted.iter().filter(|p| p.exit_ns.is_some()).count(),
        unfreed_bytes: omitted.iter().map(|p| p.live_bytes).sum(),
    };
    let order: Vec<u32> = full
        .iter()
        .chain(brief.iter().take(MEMORY_EXITED_LISTED))
        .map(|p| p.pid)
        .collect();
    let mut by_pid: std::collections::HashMap<u32, ProcessLedger> =
        procs.drain(..).map(|p| (p.pid, p)).collect();
    procs.extend(order.iter().filter_map(|pid| by_pid.remove(pid)));
    debug_assert_eq!(procs.len(), listed);
    (out.count > 0).then_some(out)
}

/// NVML samples of the trace: summary, busy series (thinned), per-process readings (capped).
pub fn gpu_activity(db: &Path, budget: &ReadBudget) -> Result<Value> {
    if db.is_dir() {
        return crate::run_tools::gpu_activity(db, budget);
    }
    let trace = open(db, budget)?;
    let mt = MemoryTrace::open(&trace, None, budget.clone())?;
    let ledgers = mt.ledgers(None)?;
    gpu_activity_json(&mt.base, &ledgers)
}

/// `gpu_activity`'s answer from the samples in `data` and the ledgers
/// beside the driver's view (a file's, or a run's).
pub(crate) fn gpu_activity_json(data: &TraceData, ledgers: &[ProcessLedger]) -> Result<Value> {
    let summary = gpu_activity::of_trace(data);
    let samples = data.gpu_samples.as_deref().unwrap_or(&[]);
    let step = samples.len().div_ceil(GPU_SAMPLES_MAX).max(1);
    let series: Vec<&sleuth_core::GpuSample> = samples.iter().step_by(step).collect();
    let per_process: Vec<&sleuth_core::ProcessGpuSample> =
        data.process_gpu.iter().take(GPU_SAMPLES_MAX).collect();
    Ok(json!({
        "units": "ts_ns monotonic ns (end of each sample period); busy_pct and sm_pct 0..100; bytes",
        "meaning": summary.meaning,
        "summary": summary,
        "samples": series,
        "samples_total": samples.len(),
        "samples_step": step,
        "process_samples": per_process,
        "process_samples_total": data.process_gpu.len(),
        "held": held::held(data, ledgers),
    }))
}

/// Every event of one process in `[at - window, at + window)`, oldest first, capped.
pub fn timeline(db: &Path, a: &args::Timeline, budget: &ReadBudget) -> Result<Value> {
    let limit = a.limit.unwrap_or(TIMELINE_DEFAULT);
    if limit == 0 || limit > TIMELINE_MAX {
        bail!("limit must be between 1 and {TIMELINE_MAX} (got {limit})");
    }
    if db.is_dir() {
        return crate::run_tools::timeline(db, a, budget);
    }
    timeline_in(&open(db, budget)?, a, budget)
}

/// The window `[at_ns - window_ns, at_ns + window_ns)` of `a`, its end
/// saturated to the largest time a trace holds (`args::clamp_ns`).
pub(crate) fn timeline_window(a: &args::Timeline) -> (u64, u64) {
    let window = a.window_ns.unwrap_or(TIMELINE_WINDOW_DEFAULT_NS);
    (
        a.at_ns.saturating_sub(window),
        args::clamp_ns(a.at_ns.saturating_add(window)),
    )
}

/// [`timeline`] of one open trace (`a.limit` checked by the caller).
pub(crate) fn timeline_in(trace: &Trace, a: &args::Timeline, budget: &ReadBudget) -> Result<Value> {
    let limit = a.limit.unwrap_or(TIMELINE_DEFAULT);
    let (since, until) = timeline_window(a);
    check_window_in_trace(trace, Some(since), Some(until))?;
    // One more than the cap of each kind tells whether anything was cut.
    let fetch = limit as usize + 1;
    let calls = trace.calls_filtered(&CallFilter {
        pid: Some(a.pid),
        since_ns: Some(since),
        until_ns: Some(until),
        limit: Some(fetch),
        ..Default::default()
    })?;
    let waits = trace.waits_filtered(&WaitFilter {
        pid: Some(a.pid),
        since_ns: Some(since),
        until_ns: Some(until),
        limit: Some(fetch),
        ..Default::default()
    })?;
    // An absent pid is an error, as loading the process would make it. The
    // page of calls and waits is a bounded read (`limit`): the whole-file
    // checks of a full load are not made for it (docs/schema.md).
    trace.require_pid(a.pid)?;
    let rows = Rows::open_with(trace, budget.clone())?;
    let lifecycle = rows.proc_events_in(a.pid, since, until)?;
    let mut events: Vec<(u64, Value)> = Vec::new();
    for s in &calls {
        let mut v = call_json(&s.call);
        v["event"] = json!("call");
        v["id"] = json!(s.id);
        events.push((s.call.ts_ns, v));
    }
    for w in &waits {
        events.push((
            w.off_ns,
            json!({
                "event": "wait", "ts_ns": w.off_ns, "tid": w.tid, "kind": w.kind,
                "blocked_ns": w.blocked_ns(), "runnable_ns": w.runnable_ns(),
                "wake_ns": w.wake_ns, "on_ns": w.on_ns, "cpu": w.cpu, "culprits": w.culprits,
            }),
        ));
    }
    for p in &lifecycle {
        events.push((
            p.ts_ns,
            json!({"event": p.kind.as_str(), "ts_ns": p.ts_ns, "tid": p.tid, "ppid": p.ppid,
                   "exit_code": p.exit_code, "comm": p.comm}),
        ));
    }
    events.sort_by_key(|(ts, _)| *ts);
    let truncated = events.len() > limit as usize;
    events.truncate(limit as usize);
    Ok(json!({
        "pid": a.pid, "since_ns": since, "until_ns": until,
        "truncated": truncated,
        "events": events.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
    }))
}

/// One read-only SQL statement in the store's sandbox.
pub fn sql(db: &Path, a: &args::Sql, budget: &ReadBudget) -> Result<Value> {
    let max_rows = a.max_rows.unwrap_or(SQL_ROWS_DEFAULT);
    if max_rows == 0 || max_rows > SQL_ROWS_MAX {
        bail!("max_rows must be between 1 and {SQL_ROWS_MAX} (got {max_rows})");
    }
    crate::run_tools::one_file(db)?;
    let limits = SqlLimits {
        max_rows: max_rows as usize,
        max_bytes: SQL_ANSWER_BYTES,
        ..SqlLimits::default()
    };
    let result = run_readonly_sql_remembered(db, &a.query, &limits, budget, memo())
        .context("query refused or failed")?;
    Ok(serde_json::to_value(result)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many processes: those still running or with a failed allocation by
    /// pid, then the ten exited ones with the highest peaks; the rest
    /// counted, with what they left unfreed. Up to 32: all, as before.
    #[test]
    fn memory_of_many_processes_lists_the_notable_and_counts_the_rest() {
        let ledger = |pid: u32, peak: u64, exit: Option<u64>, failed: u64| {
            let mut l = ledger::empty_ledger(pid, "job".into(), exit);
            (l.live_bytes, l.peak_bytes, l.allocs) = (4096, peak, 1);
            l.failed_allocs_not_kept = failed;
            l
        };
        let mut procs: Vec<ProcessLedger> = (0..100u32)
            .map(|i| ledger(1000 + i, u64::from(i + 1) << 12, Some(9), 0))
            .collect();
        procs.push(ledger(5, 1 << 30, None, 0));
        procs.push(ledger(6, 0, Some(9), 2));
        let data = TraceData::default();
        let v = memory_json(procs.clone(), &Default::default(), &[], &data, 0).unwrap();
        let pids: Vec<u64> = v["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pid"].as_u64().unwrap())
            .collect();
        assert_eq!(pids[..2], [5, 6]);
        assert_eq!(pids[2..], (1090..1100).rev().collect::<Vec<u64>>()[..]);
        assert_eq!(v["processes_total"], 102);
        assert_eq!(v["processes_omitted"], 90);
        let note = v["processes_omitted_note"].as_str().unwrap();
        assert!(
            note.starts_with("90 more process(es) not listed (90 of them exited: the driver frees a process's device memory when it exits; 368640 bytes unfreed in all)"),
            "{note}"
        );
        let few = memory_json(procs[..32].to_vec(), &Default::default(), &[], &data, 0).unwrap();
        assert_eq!(few["processes"].as_array().unwrap().len(), 32);
        assert_eq!(
            (
                few["processes_omitted"].as_u64(),
                few["processes_omitted_note"].is_null()
            ),
            (Some(0), true)
        );
    }

    /// A directory of its own under the system's temporary one, removed on drop.
    struct Scratch(PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The lists are capped; their counts are of every entry, failures
    /// the ledger only counted included.
    #[test]
    fn memory_counts_failures_past_the_ledgers_list() {
        let fail = |ts: u64| sleuth_core::CallEvent {
            ts_ns: ts,
            dur_ns: 1,
            pid: 5,
            tid: 5,
            op: sleuth_core::op_by_name("cudaMalloc").unwrap().id,
            ret: 2,
            size: Some(1 << 40),
            ..Default::default()
        };
        let n = ledger::MAX_FAILED_KEPT as u64 + 7;
        let data = TraceData {
            calls: (0..n).map(|i| fail(10 + i)).collect(),
            ..Default::default()
        };
        let procs = ledger::ledger(&data, None);
        let v = memory_json(procs, &Default::default(), &[], &data, 0).unwrap();
        let p = &v["processes"][0];
        assert_eq!(p["failed_alloc_count"], n, "{p}");
        assert_eq!(
            p["failed_allocs"].as_array().unwrap().len(),
            MEMORY_LIST_MAX
        );
    }

    /// A trace that lost events is never `clean`: what was lost was not
    /// examined (as rows a reader skipped are not).
    #[test]
    fn findings_of_a_trace_that_lost_events_are_not_clean() {
        let top = Scratch(std::env::temp_dir().join(format!("sleuth-lost-{}", std::process::id())));
        std::fs::create_dir_all(&top.0).unwrap();
        let write = |name: &str, lost: u64| {
            let db = top.0.join(name);
            let w = sleuth_store::TraceWriter::create(
                &db,
                sleuth_store::SessionInfo::default(),
                sleuth_store::WriterOptions::default(),
            )
            .unwrap();
            let h = w.handle();
            h.send(sleuth_core::Event::Call(CallEvent {
                ts_ns: 1_000,
                dur_ns: 500,
                pid: 5,
                tid: 5,
                op: op_by_name("cudaLaunchKernel").unwrap().id,
                ..Default::default()
            }))
            .unwrap();
            if lost > 0 {
                h.set_stat("drop_ring_full_call", lost).unwrap();
            }
            w.finish().unwrap();
            db
        };
        let budget = ReadBudget::new(std::time::Duration::from_secs(60));
        let scope = args::CallScope::default();
        let whole = findings(&write("whole.db", 0), &scope, &budget).unwrap();
        assert_eq!(whole["clean"], true, "{whole}");
        assert_eq!(whole["events_lost"], 0, "{whole}");
        let lossy = findings(&write("lossy.db", 3), &scope, &budget).unwrap();
        assert_eq!(
            lossy["findings"].as_array().map(Vec::len),
            Some(0),
            "{lossy}"
        );
        assert_eq!(lossy["events_lost"], 3, "{lossy}");
        assert_eq!(lossy["clean"], false, "{lossy}");
    }

    #[test]
    fn a_served_run_serves_its_files_and_nothing_beside_it() {
        let top =
            Scratch(std::env::temp_dir().join(format!("sleuth-served-{}", std::process::id())));
        let run = top.0.join("run");
        std::fs::create_dir_all(&run).unwrap();
        let part = run.join("part-000001.db");
        let beside = top.0.join("other.db");
        std::fs::write(&part, b"").unwrap();
        std::fs::write(&beside, b"").unwrap();
        let s = |p: &Path| Some(p.to_str().unwrap().to_string());
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap();

        let by_db = Served {
            db: Some(run.clone()),
            dir: None,
        };
        assert_eq!(resolve_db(None, &by_db).unwrap(), run);
        assert_eq!(resolve_db(s(&run).as_deref(), &by_db).unwrap(), canon(&run));
        assert_eq!(
            resolve_db(s(&part).as_deref(), &by_db).unwrap(),
            canon(&part)
        );
        for refused in [&beside, &top.0] {
            let e = resolve_db(s(refused).as_deref(), &by_db).unwrap_err();
            assert!(e.to_string().contains("is not served"), "{refused:?}: {e}");
        }

        let by_dir = Served {
            db: None,
            dir: Some(top.0.clone()),
        };
        for served in [&run, &part, &beside] {
            assert_eq!(
                resolve_db(s(served).as_deref(), &by_dir).unwrap(),
                canon(served)
            );
        }
        assert!(resolve_db(Some("/etc/passwd"), &by_dir).is_err());

        // A file named with --db serves no path below it.
        let by_file = Served {
            db: Some(beside.clone()),
            dir: None,
        };
        assert!(resolve_db(s(&part).as_deref(), &by_file).is_err());
        assert_eq!(
            resolve_db(s(&beside).as_deref(), &by_file).unwrap(),
            canon(&beside)
        );
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;

    fn example() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/h200-contention.db")
    }

    fn budget() -> ReadBudget {
        ReadBudget::new(std::time::Duration::from_secs(120))
    }

    /// Arguments as a client sends them (JSON numbers up to 2^64 - 1).
    fn parse<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).expect("arguments")
    }

    fn calls(v: &Value) -> u64 {
        v["ops"]
            .as_array()
            .expect("ops")
            .iter()
            .map(|o| o["count"].as_u64().expect("count"))
            .sum()
    }

    /// Bounds of 2^63 and more (the schema says uint64) saturate to the
    /// largest time a trace holds: `until_ns: 2^63` counted no call,
    /// `findings {pid, until_ns: 2^63}` said clean, a timeline window past
    /// i64::MAX lost its events.
    #[test]
    fn window_bounds_past_the_largest_time_saturate() {
        let (db, b) = (example(), budget());
        let whole = calls(&latency_stats(&db, &parse(json!({})), &b).expect("whole"));
        assert!(whole > 0);
        for until in [i64::MAX as u64, 1u64 << 63, u64::MAX] {
            let v = latency_stats(&db, &parse(json!({ "until_ns": until })), &b).expect("until");
            assert_eq!(calls(&v), whole, "until_ns {until}");
            assert_eq!(v["filter"]["until_ns"], json!(i64::MAX));
        }
        let pid = 725;
        let all = findings(&db, &parse(json!({ "pid": pid })), &b).expect("findings");
        let wide = findings(&db, &parse(json!({"pid": pid, "until_ns": 1u64 << 63})), &b)
            .expect("findings until 2^63");
        assert!(!all["findings"].as_array().expect("list").is_empty());
        assert_eq!(
            wide["findings"].as_array().map(Vec::len),
            all["findings"].as_array().map(Vec::len)
        );
        assert_eq!(wide["clean"], all["clean"]);
        // since_ns past the end is refused, not read as "every call".
        let err = latency_stats(&db, &parse(json!({ "since_ns": 1u64 << 63 })), &b)
            .expect_err("since 2^63");
        assert!(err.to_string().contains("holds no moment"), "{err}");
        // A timeline window reaching past i64::MAX keeps every event.
        let (start, end) = open(&db, &b)
            .and_then(|t| Ok(t.start_and_end()?))
            .expect("range");
        let at = start + (end - start) / 2;
        let events = |w: u64| {
            let a: args::Timeline =
                parse(json!({"pid": pid, "at_ns": at, "window_ns": w, "limit": 2000}));
            let v = timeline(&db, &a, &b).expect("timeline");
            (v["events"].as_array().map(Vec::len), v["until_ns"].clone())
        };
        let covering = events(end - start + 1).0;
        assert!(covering.unwrap_or(0) > 0);
        for w in [1u64 << 62, i64::MAX as u64, u64::MAX] {
            let (n, until) = events(w);
            assert_eq!(n, covering, "window_ns {w}");
            if w > 1 << 62 {
                assert_eq!(until, json!(i64::MAX));
            }
        }
    }

    /// A window entirely outside the trace is refused with the trace's
    /// range (as the CLI's `--from` past the end), not answered empty/clean.
    #[test]
    fn a_window_outside_the_trace_is_refused_with_its_range() {
        let (db, b) = (example(), budget());
        let (start, end) = open(&db, &b)
            .and_then(|t| Ok(t.start_and_end()?))
            .expect("range");
        let range = format!("from {start} to {end} ns");
        let after = json!({"since_ns": end + 1, "until_ns": end + 1_000_000_000});
        let before = json!({"since_ns": 0, "until_ns": start});
        for scope in [after, before, json!({ "until_ns": 1 })] {
            let e = latency_stats(&db, &parse(scope.clone()), &b).expect_err("latency_stats");
            assert!(e.to_string().contains(&range), "{scope}: {e}");
            let e = findings(&db, &parse(scope.clone()), &b).expect_err("findings");
            assert!(e.to_string().contains(&range), "{scope}: {e}");
        }
        let a: args::Timeline = parse(json!({"pid": 725, "at_ns": end + 1_000_000_000}));
        let e = timeline(&db, &a, &b).expect_err("timeline");
        assert!(e.to_string().contains(&range), "{e}");
        // A window that touches the trace is answered.
        let edge = json!({"since_ns": 0, "until_ns": start + 1});
        latency_stats(&db, &parse(edge.clone()), &b).expect("edge");
        findings(
            &db,
            &parse(json!({"since_ns": end, "until_ns": u64::MAX})),
            &b,
        )
        .expect("end");
    }

    /// `slow_calls` of an absent pid says so, as every other tool does
    /// (it answered no calls); `gpu_holders` refuses arguments it lacks.
    #[test]
    fn absent_pids_and_unknown_arguments_are_refused() {
        let (db, b) = (example(), budget());
        let e = slow_calls(&db, &parse(json!({"pid": 4242})), &b).expect_err("absent pid");
        assert!(
            e.to_string().contains("pid 4242 is not in this trace"),
            "{e}"
        );
        slow_calls(&db, &parse(json!({"pid": 725})), &b).expect("present pid");
        assert!(serde_json::from_value::<args::NoArgs>(json!({"x": 1})).is_err());
        serde_json::from_value::<args::NoArgs>(json!({})).expect("no arguments");
    }
}
