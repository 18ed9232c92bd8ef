//! The trace tools over a run's directory (`trace --rotate`): a node agent
//! rotates every few minutes and keeps the last N files, and an assistant
//! asks about the run, not about one of its files. `overview` adds the
//! files up and lists each with its time range (a question about one
//! moment then goes to the file that holds it); `latency_stats` and
//! `findings` answer over the run's finished files, or with `last_ns` over
//! the files the window spans, as `gpusleuth stats`/`explain --db DIR
//! [--last D]` do (`sleuth_store::run`, `run_explain`, `run_window`);
//! `memory` gives the run's ledger as `memory --db DIR` does (with
//! `at_ns`, as it stood then: `memory --db DIR --at`), and
//! `gpu_activity` its NVML samples beside it; `slow_calls` the slowest calls
//! of all its files; `timeline` a window from the files it overlaps;
//! `call_sites` the run's per-site table and its files' calls by site
//! (`site_tools`). `sql` reads one file: on a directory it says so in one
//! line ([`one_file`]).

use crate::args;
use crate::trace_tools::{
    self, counts_json, memo, process_json, time_range_json, FileOverview, OverviewCounts,
};
use anyhow::{bail, Result};
use serde_json::{json, Value};
use sleuth_core::data::ProcessInfo;
use sleuth_core::rollup::merge_counters;
use sleuth_core::{gpu_activity, stats, TraceData};
use sleuth_store::run::{part_name, run_files};
use sleuth_store::run_window::{last_of_run, RunLast};
use sleuth_store::{InputProblems, ReadBudget};
use std::collections::BTreeMap;
use std::path::Path;

/// Distinct notes a run's `overview` lists (a run of a thousand files may
/// say a thousand things; an assistant reads the first ones and the count).
const RUN_NOTES_MAX: usize = 100;

/// An error for a tool that reads one file when `db` names a run's
/// directory: which files it holds, and what to do.
pub fn one_file(db: &Path) -> Result<()> {
    if !db.is_dir() {
        return Ok(());
    }
    let files = run_files(db)?;
    let parts: Vec<String> = files.iter().map(|(n, _)| part_name(*n)).collect();
    let named = sleuth_store::run::first_to_last(&parts);
    bail!(
        "db {} is a run's directory ({} files, {named}): this tool reads one file; pass one of them as db \
         (`overview` of the directory lists each with its time range); the other tools answer over the run",
        db.display(),
        files.len()
    )
}

/// The run's overview: its files, each with its time range, calls,
/// processes and whether the run's answers include it (finished), and
/// what `overview` gives of one file added up over them (counts, stored
/// counters and drops, processes with their calls, NVML samples, the rows
/// the reads skipped); session and libraries of its oldest and newest file.
pub fn overview(dir: &Path, budget: &ReadBudget) -> Result<Value> {
    let listed = run_files(dir)?;
    let mut files = Vec::new();
    let mut counts = OverviewCounts::default();
    let mut info = TraceData::default();
    let mut processes: BTreeMap<u32, (ProcessInfo, u64)> = BTreeMap::new();
    let mut problems = InputProblems::default();
    let mut notes: Vec<Value> = Vec::new();
    let mut seen_notes = std::collections::BTreeSet::new();
    let mut notes_left_out = 0u64;
    let mut host_context = true;
    let (mut run_start, mut run_end) = (u64::MAX, 0u64);
    let mut first: Option<FileOverview> = None;
    let mut last: Option<FileOverview> = None;
    for (n, path) in &listed {
        let trace = trace_tools::open(path, budget)?;
        let finished = trace.has_rollups()?;
        let mut o = FileOverview::read(&trace, budget)?;
        files.push(json!({
            "file": path.display().to_string(),
            "number": n,
            "start_ns": o.span.start_ns,
            "end_ns": o.span.end_ns,
            "finished": finished,
            "calls": o.counts.calls,
            "pids": o.processes.iter().map(|(p, _)| p.pid).collect::<Vec<_>>(),
        }));
        run_start = run_start.min(o.span.start_ns);
        run_end = run_end.max(o.span.end_ns);
        counts.add(&o.counts);
        merge_counters(&mut info.stats, &o.info.stats);
        if let Some(s) = o.info.gpu_samples.take() {
            info.gpu_samples.get_or_insert_with(Vec::new).extend(s);
        }
        info.process_gpu.append(&mut o.info.process_gpu);
        for (p, calls) in o.processes.drain(..) {
            add_process(&mut processes, p, calls);
        }
        problems.add(std::mem::take(&mut o.problems));
        // A note each file repeats (the same library missing) is said once;
        // past RUN_NOTES_MAX distinct notes, only counted.
        for note in o.notes.drain(..) {
            if seen_notes.insert(serde_json::to_string(&note)?) {
                match notes.len() < RUN_NOTES_MAX {
                    true => notes.push(json!({"file": part_name(*n), "note": note})),
                    false => notes_left_out += 1,
                }
            }
        }
        host_context &= o.host_context;
        match first {
            None => first = Some(o),
            Some(_) => last = Some(o),
        }
    }
    // `run_files` refused a directory without files.
    let Some(first) = first else {
        bail!("{}: no file of the run was read", dir.display());
    };
    let newest = last.as_ref().unwrap_or(&first);
    // From the earliest start to the latest end: files of one run follow
    // each other, but a file copied in from elsewhere need not.
    let span = sleuth_core::TraceSpan {
        start_ns: run_start,
        end_ns: run_end.max(run_start),
        origin_ns: run_start,
        extent_end_ns: run_end.max(run_start),
    };
    let finished = files.iter().filter(|f| f["finished"] == true).count();
    let processes: Vec<Value> = processes
        .values()
        .map(|(p, calls)| process_json(p, *calls))
        .collect();
    Ok(json!({
        "db": dir.display().to_string(),
        "run": {
            "files": files,
            "finished_files": finished,
            "about": "A run of `gpusleuth trace --rotate`: one file per period, oldest first. latency_stats, findings, memory \
                      and gpu_activity answer over its finished files, slow_calls and timeline over all of them (latency_stats and findings with last_ns over the files that \
                      window spans, the file still being written included), call_sites over its finished files; sql reads one \
                      file: pass its path as db.",
        },
        "session": first.session,
        "time_range": time_range_json(&span, first.session.info.realtime_offset_ns),
        "host_context": host_context,
        "counts": counts_json(&counts, processes.len()),
        "drops": stats::drop_counters(&info),
        "attach_edges": stats::attach_edges(&info),
        "events": stats::event_counters(&info),
        "gpu_activity": gpu_activity::of_trace(&info),
        "counters": info.stats,
        "processes": processes,
        "libraries": newest.libraries,
        "notes": notes,
        "notes_left_out": notes_left_out,
        "input_problems": problems,
        "gpus": trace_tools::GPUS_NOTE,
    }))
}

/// A process seen in several files: its calls added up; its start from
/// the first file that lists it, its exit from the last that saw one.
fn add_process(all: &mut BTreeMap<u32, (ProcessInfo, u64)>, p: ProcessInfo, calls: u64) {
    match all.get_mut(&p.pid) {
        None => {
            all.insert(p.pid, (p, calls));
        }
        Some((known, n)) => {
            *n = n.saturating_add(calls);
            if p.exit_ns.is_some() {
                known.exit_ns = p.exit_ns;
                known.exit_code = p.exit_code;
                known.oom_victim = p.oom_victim;
            }
        }
    }
}

/// What narrows a run's answer: pid, and last_ns for its last part.
/// since_ns/until_ns count on one file's clock range and are refused (as
/// `--from/--to` are on a directory).
fn check_run_scope(scope: &args::CallScope) -> Result<()> {
    if scope.since_ns.is_some() || scope.until_ns.is_some() {
        bail!(
            "since_ns/until_ns name a window of one file; db is a run's directory: use last_ns for its last part, \
             or pass the file that holds the window as db (`overview` lists each file's time range)"
        );
    }
    if scope.last_ns == Some(0) {
        bail!("empty time window: last_ns must be above 0");
    }
    Ok(())
}

/// The files `last_ns` of the run spans; None for the whole run.
fn window_of(dir: &Path, scope: &args::CallScope, budget: &ReadBudget) -> Result<Option<RunLast>> {
    Ok(match scope.last_ns {
        Some(last) => Some(last_of_run(dir, last, budget, memo())?),
        None => None,
    })
}

/// The one file a window of the run spans, as a db path for the one-file tools.
fn only_file(run: &RunLast) -> Option<&Path> {
    match run.files.as_slice() {
        [(_, path)] => Some(path),
        _ => None,
    }
}

/// The notes naming the files an answer over the whole run left out
/// (`last_hint`: the tool's `last_ns` would include them).
pub(crate) fn unfinished_notes(files: &[std::path::PathBuf], last_hint: bool) -> Vec<String> {
    let hint = match last_hint {
        true => " (last_ns includes the file being written)",
        false => "",
    };
    sleuth_store::run::file_names(files)
        .into_iter()
        .map(|f| {
            format!(
                "{f}: not finished (still being written, or its tracer was killed: `gpusleuth finish --db` it): not in this answer{hint}"
            )
        })
        .collect()
}

/// Adds the names of the files read to a one-file answer.
fn with_files(mut v: Value, files: Vec<String>) -> Value {
    v["files"] = json!(files);
    v
}

/// `latency_stats` over a run: every finished file's rollups added up, or
/// with `last_ns` the window's part of each file it spans (a window the
/// newest file holds alone is that file's answer).
pub fn latency_stats(dir: &Path, scope: &args::CallScope, budget: &ReadBudget) -> Result<Value> {
    check_run_scope(scope)?;
    trace_tools::check_op(scope.op.as_deref())?;
    let (mut report, counted, files, host_context, notes) = match window_of(dir, scope, budget)? {
        Some(run) => {
            if let Some(file) = only_file(&run) {
                let v = trace_tools::latency_stats(file, scope, budget)?;
                return Ok(with_files(v, run.file_names()));
            }
            let (report, counted, read) = run.stats(scope.pid, memo())?;
            let mut notes = counted.notes(sleuth_store::window::STATS_COUNT);
            notes.extend(problem_notes(&read.problems));
            (
                report,
                Some(counted),
                run.file_names(),
                read.host_context,
                notes,
            )
        }
        None => {
            let run = sleuth_store::run::run_stats_remembered(dir, scope.pid, budget, memo())?;
            let notes = unfinished_notes(&run.incomplete, true);
            (
                run.report,
                None,
                sleuth_store::run::file_names(&run.files),
                run.host_context,
                notes,
            )
        }
    };
    if let Some(op) = scope.op.as_deref() {
        report.ops.retain(|o| o.op == op);
    }
    Ok(json!({
        "units": trace_tools::STATS_UNITS,
        "filter": {"pid": scope.pid, "op": scope.op, "last_ns": scope.last_ns},
        "files": files,
        "host_context": host_context,
        "ops": report.ops,
        "drops": report.drops,
        "notes": notes,
        "counted_in_window": counted.map(|c| c.json()),
    }))
}

/// `findings` over a run: the finished files' stored aggregates and the
/// run's ledger, or with `last_ns` the window's parts of the files it spans
/// (a window the newest file holds alone is that file's answer). `op`
/// narrows one file's findings only.
pub fn findings(dir: &Path, scope: &args::CallScope, budget: &ReadBudget) -> Result<Value> {
    check_run_scope(scope)?;
    if scope.op.is_some() {
        bail!(
            "op narrows the findings of one file; db is a run's directory: findings over the run take pid and last_ns \
             (or pass one of its files as db with op)"
        );
    }
    let (report, problems, files, left_out) = match window_of(dir, scope, budget)? {
        Some(run) => {
            // A window in the newest file whose allocator views need the
            // run's earlier files is explained over the run.
            let file = match run.views_need_earlier_files(scope.pid, memo())? {
                true => None,
                false => only_file(&run),
            };
            if let Some(file) = file {
                let v = trace_tools::findings(file, scope, budget)?;
                return Ok(with_files(v, run.file_names()));
            }
            let (e, read) = run.explanation(scope.pid, memo())?;
            (e, read.problems, run.file_names(), Vec::new())
        }
        None => {
            let run =
                sleuth_store::run_explain::load_remembered(dir, scope.pid, budget.clone(), memo())?;
            let e = run.explanation()?;
            (
                e,
                run.problems,
                sleuth_store::run::file_names(&run.files),
                unfinished_notes(&run.incomplete, true),
            )
        }
    };
    let mut notes = report.notes;
    notes.extend(left_out);
    Ok(json!({
        "files": files,
        "summary": report.summary,
        "findings": report.findings,
        "threads": report.threads,
        "notes": notes,
        "input_problems": problems,
        // Events lost during capture were not examined either.
        "events_lost": report.events_lost,
        "clean": report.findings.is_empty() && problems.is_empty() && report.events_lost == 0,
    }))
}

/// A note when the reads skipped rows (a stats answer has no other place for them).
fn problem_notes(p: &InputProblems) -> Vec<String> {
    if p.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "rows skipped by the reads (not in this answer): {}",
        serde_json::to_string(p).unwrap_or_default()
    )]
}

/// `memory` over a run: the run's ledger (the one the tracer carried
/// across its files, which also covers files `--keep` deleted; else
/// replayed), the allocator views over the files' block events, the
/// driver's view, as `gpusleuth memory --db DIR`, and the run's per-site
/// table (`memory --by-site --db DIR`: allocations added up over the
/// files, unfreed from the run's ledger, no bytes at the peak). At
/// `at_ns`: the ledger replayed from the memory calls of the files that
/// began by then (`run_explain::load_memory_at`), without sites.
pub fn memory(dir: &Path, a: &args::Memory, points: usize, budget: &ReadBudget) -> Result<Value> {
    if let Some(at) = a.at_ns {
        return memory_at(dir, a, at, points, budget);
    }
    let (run, sites) = sleuth_store::run_report::load_sites(dir, a.pid, budget.clone(), memo())?;
    let data = &run.data;
    let allocators = run.allocator_views()?;
    let helds = sleuth_core::held::held(data, &run.ledgers);
    let mut v = trace_tools::memory_json(run.ledgers.clone(), &allocators, &helds, data, points)?;
    let mut notes: Vec<String> = run.ledger_note.iter().cloned().collect();
    notes.extend(unfinished_notes(&run.incomplete, false));
    if !sites.is_empty() {
        notes.push(format!("sites: {}", sleuth_store::run_report::SITES_NOTE));
    }
    v["at_ns"] = Value::Null;
    v["sites"] = json!(sites
        .into_iter()
        .take(trace_tools::MEMORY_SITES)
        .collect::<Vec<_>>());
    v["files"] = json!(sleuth_store::run::file_names(&run.files));
    v["notes"] = json!(notes);
    v["input_problems"] = json!(run.problems);
    Ok(v)
}

/// `memory` of a run at `at` (a timestamp of the files' clock, as
/// `overview` gives each file's range): the ledger and the per-site table
/// as they stood then, the allocator views up to then, the driver's view.
fn memory_at(
    dir: &Path,
    a: &args::Memory,
    at: u64,
    points: usize,
    budget: &ReadBudget,
) -> Result<Value> {
    let run = sleuth_store::run_explain::load_memory_at(
        dir,
        a.pid,
        sleuth_store::run_explain::Moment::At(at),
        budget.clone(),
        memo(),
    )?;
    let data = &run.data;
    let allocators = run.allocator_views()?;
    let helds = sleuth_core::held::held(data, &run.ledgers);
    let mut v = trace_tools::memory_json(run.ledgers.clone(), &allocators, &helds, data, points)?;
    let mut notes: Vec<String> = run.ledger_note.iter().cloned().collect();
    notes.extend(unfinished_notes(&run.incomplete, false));
    v["at_ns"] = json!(at);
    v["sites"] = json!(run
        .sites_at
        .into_iter()
        .take(trace_tools::MEMORY_SITES)
        .collect::<Vec<_>>());
    v["files"] = json!(sleuth_store::run::file_names(&run.files));
    v["notes"] = json!(notes);
    v["input_problems"] = json!(run.problems);
    Ok(v)
}

/// `slow_calls` over a run: each file's slowest calls (through its
/// `(op, dur_ns)` index: `limit` rows a file), the slowest `limit` of them
/// all, each with the file it is in (`id` is a row of that file). The
/// file still being written is read too: its calls are on disk.
pub fn slow_calls(dir: &Path, a: &args::SlowCalls, budget: &ReadBudget) -> Result<Value> {
    let limit = a.limit.unwrap_or(trace_tools::SLOW_CALLS_DEFAULT) as usize;
    let files = run_files(dir)?;
    let mut head: Option<Value> = None;
    let mut rows: Vec<Value> = Vec::new();
    let mut held = a.pid.is_none();
    for (n, path) in &files {
        let trace = trace_tools::open(path, budget)?;
        if let Some(pid) = a.pid {
            if !trace.holds_pid(pid)? {
                continue;
            }
            held = true;
        }
        let mut v = trace_tools::slow_calls_in(&trace, a, budget)?;
        if let Some(calls) = v["calls"].as_array_mut() {
            for mut c in calls.drain(..) {
                c["file"] = json!(part_name(*n));
                rows.push(c);
            }
        }
        head.get_or_insert(v);
    }
    if !held {
        bail!(
            "no process {} in the run in {}",
            a.pid.unwrap_or(0),
            dir.display()
        );
    }
    // Slowest first; a tie keeps the files' order (a stable sort).
    rows.sort_by_key(|c| std::cmp::Reverse(c["dur_ns"].as_u64().unwrap_or(0)));
    rows.truncate(limit);
    // `run_files` refused a directory without files.
    let mut v = head.unwrap_or_else(|| json!({}));
    v["calls"] = json!(rows);
    v["files"] = json!(files.iter().map(|(n, _)| part_name(*n)).collect::<Vec<_>>());
    Ok(v)
}

/// `gpu_activity` over a run: the NVML samples of its finished files in
/// order, the driver's view beside the run's ledger (as `memory` of the
/// run reads them).
pub fn gpu_activity(dir: &Path, budget: &ReadBudget) -> Result<Value> {
    let run = sleuth_store::run_explain::load_memory(dir, None, budget.clone(), memo())?;
    let mut v = trace_tools::gpu_activity_json(&run.data, &run.ledgers)?;
    v["files"] = json!(sleuth_store::run::file_names(&run.files));
    v["notes"] = json!(unfinished_notes(&run.incomplete, false));
    Ok(v)
}

/// `timeline` over a run: the window `[at_ns - window_ns, at_ns +
/// window_ns)` read from each file that holds the process and overlaps it
/// (a window across a rotation reads both files), merged oldest first and
/// capped; each event names its file. An error when no file holds the
/// process.
pub fn timeline(dir: &Path, a: &args::Timeline, budget: &ReadBudget) -> Result<Value> {
    let limit = a.limit.unwrap_or(trace_tools::TIMELINE_DEFAULT) as usize;
    let (since, until) = trace_tools::timeline_window(a);
    let mut held = false;
    let mut read = Vec::new();
    let mut events: Vec<Value> = Vec::new();
    let mut truncated = false;
    // The range of the files that hold the process, for a window outside them.
    let (mut first, mut last) = (u64::MAX, 0u64);
    for (n, path) in run_files(dir)? {
        let trace = trace_tools::open(&path, budget)?;
        if !trace.pids()?.contains(&a.pid) {
            continue;
        }
        held = true;
        let (start, end) = trace.start_and_end()?;
        (first, last) = (first.min(start), last.max(end));
        if end < since || start >= until {
            continue;
        }
        let mut v = trace_tools::timeline_in(&trace, a, budget)?;
        truncated |= v["truncated"] == true;
        if let Some(list) = v["events"].as_array_mut() {
            for mut e in list.drain(..) {
                e["file"] = json!(part_name(n));
                events.push(e);
            }
        }
        read.push(part_name(n));
    }
    if !held {
        bail!("no process {} in the run in {}", a.pid, dir.display());
    }
    if read.is_empty() {
        // As for one file (`trace_tools::check_window_in_trace`): an empty
        // answer must not read as "nothing happened then".
        bail!(
            "the window [{since}, {until}) ns holds no moment of the run's files that hold process {}: \
             they run from {first} to {last} ns (monotonic clock, as `overview` gives each file's range)",
            a.pid
        );
    }
    // Oldest first; a tie keeps the files' order (a stable sort).
    events.sort_by_key(|e| e["ts_ns"].as_u64().unwrap_or(0));
    truncated |= events.len() > limit;
    events.truncate(limit);
    Ok(json!({
        "pid": a.pid, "since_ns": since, "until_ns": until,
        "files": read,
        "truncated": truncated,
        "events": events,
    }))
}
