//! `export --last D` of a run's directory (`trace --rotate`) when the
//! window spans several of its files (a node agent rotating every minute,
//! asked for its last ten): one document of the window over the files it
//! spans, each file's calls and waits of the window streamed in turn, the
//! file still being written included.
//!
//! `json`: the window's calls of each file, oldest file first, in one
//! array. `perfetto`: times count from the first spanned file's start, or
//! from the earliest wait, lifecycle event or call of any spanned file if
//! older (one begun in a file `--keep` deleted is drawn at its place); the
//! processes, threads, call sites and NVML samples are the spanned files'
//! (`run_explain::add_base` of their frames); each thread is named where
//! it first appears; the memory tracks are the run's ledgers (the one the
//! tracer carried across its finished files, as `report --last` draws
//! them) within the window; the findings are `explain --last`'s over the
//! same files. Every spanned file is checked before anything is written:
//! a damaged one is refused as the one-file export refuses it.

use super::{
    gpu_counters, halves_at, memory_tracks, pipelined, process_names, push_json_call, write_file,
    write_stdout, Args, ArrayWriter, Format, Items, Record, Sink,
};
use crate::load::FORCE_HINT;
use crate::window::Window;
use sleuth_core::findings::Finding;
use sleuth_core::ledger::ProcessLedger;
use sleuth_core::TraceData;
use sleuth_store::run_window::RunLast;
use sleuth_store::stream::Rows;
use sleuth_store::{ByStart, InputProblems};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes the window of `run` that `args` names (`--last`), in `args.format()`.
pub(super) fn export(args: &Args, run: &RunLast) -> anyhow::Result<()> {
    let pid = args.input.pid;
    let window = Window::of_run(run, args.window.last.unwrap_or_default());
    if let Some(path) = &args.output {
        // Before the work: a refused output is known at once.
        let files: Vec<&Path> = run.files.iter().map(|(_, p)| p.as_path()).collect();
        sleuth_store::run::refuse_output_in_run(path, &run.dir)?;
        crate::output_file::check_output(path, &files, args.force, Some(FORCE_HINT))?;
    }
    let (held, problems) = checked_files(run, pid)?;
    let format = args.format();
    let frame = match format {
        Format::Perfetto | Format::Pftrace => Some(RunFrame::of(run, &held, pid, window)?),
        Format::Json => None,
    };
    let write = |w: &mut (dyn Write + Send), how: ByStart| -> anyhow::Result<()> {
        match (&frame, format) {
            (Some(f), Format::Pftrace) => write_pftrace(w, f, &held, pid, window, how),
            (Some(f), _) => write_perfetto(w, f, &held, pid, window, how),
            (None, _) => write_calls_json(w, &held, pid, window, how),
        }
    };
    match &args.output {
        Some(path) => write_file(path, &run.dir, args.force, write)?,
        None => write_stdout(format, write)?,
    }
    // Said once the document is written: a failure stays one line.
    for (path, p) in &problems {
        crate::load::print_problems_at(path, p);
    }
    if let Some(f) = &frame {
        if let Some(note) = &f.ledger_note {
            eprintln!("gpusleuth: note: {note}");
        }
    }
    Ok(())
}

/// Whether a file `run` listed is gone (a running tracer's `--keep`
/// deleted it after the run was listed).
pub(super) fn lost_a_file(run: &RunLast) -> bool {
    run.files.iter().any(|(_, p)| !p.exists())
}

/// Whether `e` names a file that is gone (deleted after the run was listed).
pub(super) fn names_a_lost_file(e: &sleuth_store::StoreError) -> bool {
    use sleuth_store::StoreError;
    match e {
        StoreError::File { path, .. }
        | StoreError::Io { path, .. }
        | StoreError::Sqlite { path, .. } => !path.exists(),
        _ => false,
    }
}

/// The rows each file's reads skip, by file.
type Problems = Vec<(PathBuf, InputProblems)>;

/// The spanned files that hold process `pid` (each, without one), oldest
/// first, each checked (its skipped rows counted, its totals checked)
/// before anything is written; an error naming the run when none holds
/// `pid`.
fn checked_files(run: &RunLast, pid: Option<u32>) -> anyhow::Result<(Vec<PathBuf>, Problems)> {
    let (mut held, mut problems) = (Vec::new(), Vec::new());
    let mut others = std::collections::BTreeSet::new();
    for (_, path) in &run.files {
        let trace = crate::checks_memo::open(path)?;
        if let Some(p) = pid {
            if !trace.holds_pid(p)? {
                if held.is_empty() {
                    // Listed should no file hold it (an error's cost).
                    others.extend(trace.pids()?);
                }
                continue;
            }
        }
        let p = trace.input_problems()?;
        if !p.is_empty() {
            problems.push((path.clone(), p));
        }
        Rows::open(&trace)?.check_totals()?;
        held.push(path.clone());
    }
    if held.is_empty() {
        anyhow::bail!(
            "{}: no process {} in the {} file(s) read ({})",
            run.dir.display(),
            pid.unwrap_or_default(),
            run.files.len(),
            sleuth_store::pids_held(others)
        );
    }
    Ok((held, problems))
}

/// The window's calls of each file as one JSON array.
fn write_calls_json(
    w: &mut (dyn Write + Send),
    held: &[PathBuf],
    pid: Option<u32>,
    window: Window,
    how: ByStart,
) -> anyhow::Result<()> {
    let mut a = ArrayWriter::open(w)?;
    pipelined(
        &mut a,
        |sink| {
            for path in held {
                let trace = crate::checks_memo::open(path)?;
                let host = trace.has_host_context();
                Rows::open(&trace)?.for_each_call_by_start_from::<anyhow::Error>(
                    &Window::calls(Some(window), pid),
                    super::EXPORT_SIDE_BY_SIDE_FROM_CPUS,
                    how,
                    |c| sink.push((c.call, host)),
                )?;
            }
            Ok(())
        },
        |(c, host), el| el.raw(|b| push_json_call(b, c, *host)),
    )?;
    a.close()?;
    Ok(())
}

/// What the Perfetto document of a run's window holds besides its calls
/// and waits.
struct RunFrame {
    /// The spanned files' frames added up: processes, stacks, NVML samples.
    ctx: TraceData,
    origin: u64,
    ledgers: Vec<ProcessLedger>,
    /// Why there are no memory tracks, when there are none to draw.
    ledger_note: Option<String>,
    findings: Vec<Finding>,
}

impl RunFrame {
    fn of(
        run: &RunLast,
        held: &[PathBuf],
        pid: Option<u32>,
        window: Window,
    ) -> anyhow::Result<RunFrame> {
        let mut ctx: Option<TraceData> = None;
        let mut origin = u64::MAX;
        for path in held {
            let trace = crate::checks_memo::open(path)?;
            let frame = trace.frame(pid)?;
            // Times count from the first file's start, or from a wait, a
            // lifecycle event or a call of any file spanned that began
            // before it: a later file's wait or call begun in a file
            // `--keep` deleted is drawn at its place too (round 54's
            // tester: a sleep begun in a deleted file was drawn from 0 with
            // its whole length, past its process's exit).
            let rows = Rows::open(&trace)?;
            let first_call = rows
                .call_groups()?
                .iter()
                .filter(|g| pid.is_none_or(|p| g.pid == p))
                .map(|g| g.first_ts_ns)
                .min();
            let earliest = rows.earliest_wait_or_event(pid)?;
            let start = ctx.is_none().then_some(frame.start_ns).flatten();
            origin = [start, earliest, first_call]
                .into_iter()
                .flatten()
                .fold(origin, u64::min);
            ctx = Some(match ctx.take() {
                None => frame,
                Some(mut c) => {
                    sleuth_store::run_explain::add_base(&mut c, frame);
                    c
                }
            });
        }
        let memo = crate::checks_memo::memo();
        // The run's ledgers come from its finished files (the carried one,
        // or replayed): a run with none holding the process has none.
        let (ledgers, ledger_note) = match any_finished(run, pid)? {
            true => {
                let budget = crate::checks_memo::budget();
                let lean = sleuth_store::run_explain::load_memory(&run.dir, pid, budget, memo)?;
                (lean.ledgers, None)
            }
            false => (
                Vec::new(),
                Some(format!(
                    "{}: no memory track: {} (the run's memory ledger is that of its finished files)",
                    run.dir.display(),
                    match pid {
                        Some(p) => format!("no finished file of the run holds process {p}"),
                        None => "the run has no finished file".to_string(),
                    }
                )),
            ),
        };
        let (explanation, _) = run.explanation(pid, memo)?;
        let mut ctx = ctx.unwrap_or_default();
        let origin = if origin == u64::MAX { 0 } else { origin };
        let drawn = super::drawn_ledgers(&ledgers, origin, Some(window)).map(|(l, _)| l);
        name_ledger_processes(&mut ctx, drawn);
        Ok(RunFrame {
            ctx,
            origin,
            ledgers,
            ledger_note,
            findings: explanation.findings,
        })
    }
}

/// Adds to `ctx` the processes of `drawn` (the ledgers whose memory track
/// the window draws) that no spanned file lists (one of an earlier file
/// still holding memory, with no row in the window), with
/// the name and exit the ledger knows: every process drawn is named, in
/// both formats, as in one file's export.
fn name_ledger_processes<'a>(ctx: &mut TraceData, drawn: impl Iterator<Item = &'a ProcessLedger>) {
    let listed: BTreeSet<u32> = ctx.processes.iter().map(|p| p.pid).collect();
    for l in drawn.filter(|l| !listed.contains(&l.pid)) {
        ctx.processes.push(sleuth_core::ProcessInfo {
            pid: l.pid,
            comm: l.comm.clone(),
            exit_ns: l.exit_ns,
            ..Default::default()
        });
    }
}

/// Whether a finished file of the run (one with its rollups: not the file
/// being written) holds process `pid` (any, without one).
fn any_finished(run: &RunLast, pid: Option<u32>) -> anyhow::Result<bool> {
    for (_, path) in sleuth_store::run::run_files(&run.dir)? {
        let trace = crate::checks_memo::open(&path)?;
        if trace.has_rollups()? && pid.map_or(Ok(true), |p| trace.holds_pid(p))? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The names given so far: a process or thread is named where it first
/// appears (the files of a run list their own).
#[derive(Default)]
struct Named {
    pids: BTreeSet<u32>,
    threads: BTreeSet<(u32, u32)>,
}

impl Named {
    /// Hands on `record`, after its thread's name (and its process's) if
    /// they were not given yet.
    fn push(&mut self, sink: &mut Sink<Record>, record: Record) -> anyhow::Result<()> {
        let (pid, tid) = record.thread();
        if self.threads.insert((pid, tid)) {
            let process = self.pids.insert(pid);
            sink.push(Record::Name { pid, tid, process })?;
        }
        sink.push(record)
    }
}

/// The window over the files as one Chrome Trace Event document.
fn write_perfetto(
    w: &mut (dyn Write + Send),
    f: &RunFrame,
    held: &[PathBuf],
    pid: Option<u32>,
    window: Window,
    how: ByStart,
) -> anyhow::Result<()> {
    let (origin, ctx) = (f.origin, &f.ctx);
    let (head, tail) = halves_at(origin, ctx.realtime_offset_ns)?;
    w.write_all(head.as_bytes())?;
    let mut ev = ArrayWriter::after_open(&mut *w);
    let mut named = Named::default();
    for p in &ctx.processes {
        named.pids.insert(p.pid);
    }
    process_names(ctx, &named.pids, &mut ev)?;
    pipelined(
        &mut ev,
        |sink| {
            for path in held {
                let trace = crate::checks_memo::open(path)?;
                let rows = Rows::open(&trace)?;
                rows.for_each_call_by_start_from::<anyhow::Error>(
                    &Window::calls(Some(window), pid),
                    super::EXPORT_SIDE_BY_SIDE_FROM_CPUS,
                    how,
                    |c| named.push(sink, Record::Call(c.call)),
                )?;
                rows.for_each_wait_in::<anyhow::Error>(pid, window.since, window.until, |wt| {
                    named.push(sink, Record::Wait(wt))
                })?;
            }
            Ok(())
        },
        |record, el| record.write(el, ctx, origin),
    )?;
    memory_tracks(&f.ledgers, origin, Some(window), &mut ev)?;
    gpu_counters(ctx, origin, Some(window), &mut ev)?;
    for finding in &f.findings {
        ev.item(&super::finding_event(finding, ctx, origin))?;
    }
    ev.finish()?;
    w.write_all(tail.as_bytes())?;
    Ok(())
}

/// The window over the files as Perfetto's protobuf (pftrace.rs): each
/// file's calls in start order, then its waits; every track declared where
/// it first appears.
fn write_pftrace(
    w: &mut (dyn Write + Send),
    f: &RunFrame,
    held: &[PathBuf],
    pid: Option<u32>,
    window: Window,
    how: ByStart,
) -> anyhow::Result<()> {
    let frame = super::pftrace::Frame {
        ctx: &f.ctx,
        origin: f.origin,
        ledgers: &f.ledgers,
        findings: &f.findings,
    };
    super::pftrace::write(w, frame, Some(window), |tracks, sink| {
        for path in held {
            let trace = crate::checks_memo::open(path)?;
            let rows = Rows::open(&trace)?;
            let q = Window::calls(Some(window), pid);
            let from_cpus = super::EXPORT_SIDE_BY_SIDE_FROM_CPUS;
            rows.for_each_call_by_start_from::<anyhow::Error>(&q, from_cpus, how, |c| {
                tracks.call(sink, c.call)
            })?;
            rows.for_each_wait_in::<anyhow::Error>(pid, window.since, window.until, |wt| {
                tracks.wait(sink, wt)
            })?;
        }
        Ok(())
    })
}
