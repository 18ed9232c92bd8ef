//! `--last D` of a run's directory (`trace --rotate`) when the window
//! reaches back past its newest file: the window's part of each file it
//! spans, added up as one window (issue 16: a node agent rotating every
//! minute is asked about its last ten).
//!
//! Each file gives what one file's window gives before the answer is made
//! (`window::StatsParts` for `stats`, `scoped::ScopeParts` for `explain`),
//! read the way that file's window is read alone: streamed from a finished
//! file, loaded from one that did not finish (the file the tracer is still
//! writing). Those add up as a whole run's do (`run`, `run_explain`): per-op
//! histograms, counts, culprit sums and kernel-counted calls; the finding
//! aggregates by `FindingInputs::merge` (what a file boundary cuts is
//! documented there); one ledger fed every file's memory calls of the
//! window in order; the host ranges pinned when the window began (the
//! earlier files' pinning calls and the first file's before the window)
//! carried from file to file.

use crate::checked::CheckMemo;
use crate::ledger_feed::{Fed, ReadAhead};
use crate::problems::InputProblems;
use crate::reader::Trace;
use crate::report_reads::WindowCalls;
use crate::run::{open_in_run, pinned_when_file_began, run_files};
use crate::run_ledger::Chain;
use crate::run_pinned::PinnedCarry;
use crate::scoped::ScopeParts;
use crate::stream::MemoryTrace;
use crate::types::CallFilter;
use crate::window::{StatsParts, WindowCounts};
use crate::{ReadBudget, StoreError};
use sleuth_core::findings::inputs::PinnedState;
use sleuth_core::findings::Explanation;
use sleuth_core::ledger::LedgerBuilder;
use sleuth_core::rollup::merge_op_counts;
use sleuth_core::stats::StatsReport;
use sleuth_core::{GpuSample, OpCount};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

/// The files of a run that `--last D` spans, and the window's start.
#[derive(Debug, Clone)]
pub struct RunLast {
    pub dir: PathBuf,
    /// The files the window spans, oldest first: the newest, and back to
    /// the one that began at or before the window's start (or the oldest
    /// kept). Each with its number.
    pub files: Vec<(u64, PathBuf)>,
    /// The window's start (monotonic ns): D before the newest file's end
    /// (its session end, or its latest call while it is written).
    pub since: u64,
    /// The newest file's end (its session end, or its latest call while
    /// it is written): where the window ends.
    pub end: u64,
    /// When the run's oldest file still in the directory began.
    pub run_start: u64,
    /// That file's number: past 1, `--keep` removed the run's earlier
    /// files, and `run_start` is not when the run began.
    pub oldest_kept: u64,
    /// Every read of the window's files runs under it (an MCP tool's time
    /// limit and cancellation stop the whole answer).
    pub budget: ReadBudget,
}

/// The files `--last last` of the run in `dir` spans ([`RunLast`]), read
/// (now and by its answers) under `budget`. An error naming `dir` when it
/// holds no file of a run.
pub fn last_of_run(
    dir: &Path,
    last: u64,
    budget: &ReadBudget,
    memo: &CheckMemo,
) -> Result<RunLast, StoreError> {
    let open = |path: &Path| open_in_run(path, budget, memo);
    let listed = crate::run::listed_files(dir)?;
    let (_, newest) = listed.last().expect("listed_files refuses an empty run");
    let (newest_start, end) = open(newest)?.start_and_end()?;
    let since = end.saturating_sub(last);
    let mut files = Vec::new();
    let mut began = newest_start;
    for (n, path) in listed.iter().rev() {
        if !files.is_empty() {
            began = open(path)?.session()?.info.start_mono_ns;
        }
        files.push((*n, path.clone()));
        if began <= since {
            break;
        }
    }
    files.reverse();
    let run_start = match listed.first() {
        Some((n, path)) if *n != files[0].0 => open(path)?.session()?.info.start_mono_ns,
        _ => began,
    };
    Ok(RunLast {
        dir: dir.to_path_buf(),
        oldest_kept: listed.first().map_or(files[0].0, |(n, _)| *n),
        files,
        since,
        end,
        run_start,
        budget: budget.clone(),
    })
}

/// What a window over several files read, besides its answer.
#[derive(Debug, Default)]
pub struct Read {
    /// The rows the files' reads skipped, added up.
    pub problems: InputProblems,
    /// The GPU's busy samples of the files, in order.
    pub gpu_samples: Option<Vec<GpuSample>>,
    /// Every file that answered holds the scheduler's context (the
    /// on-CPU / runnable / blocked split).
    pub host_context: bool,
    /// The explanation's ledger started from the run's state the tracer
    /// stored when this file (its number) began: no memory call of the
    /// files before it was read ([`RunLast::explanation`]).
    pub ledger_from_file: Option<u64>,
}

impl RunLast {
    /// The spanned files' names, oldest first.
    pub fn file_names(&self) -> Vec<String> {
        self.files
            .iter()
            .map(|(n, _)| crate::run::part_name(*n))
            .collect()
    }

    /// The spanned file after `path`, if any.
    fn file_after(&self, path: &Path) -> Option<PathBuf> {
        let i = self.files.iter().position(|(_, p)| p == path)?;
        self.files.get(i + 1).map(|(_, p)| p.clone())
    }

    /// The number of the spanned file `path` (0 if it is none of them).
    fn number_of(&self, path: &Path) -> u64 {
        self.files
            .iter()
            .find(|(_, p)| p == path)
            .map_or(0, |(n, _)| *n)
    }

    /// Where the window's ledger can start from a state the tracer stored
    /// instead of from nothing. A window that holds the whole of the run's
    /// file 1 starts before anything the run allocated: its ledger, started
    /// empty, is the run's from its start, which the tracer carried from
    /// file to file and stored as each file began (`run_ledger_begin`). So
    /// the ledger takes up the state of the last finished file that stored
    /// one, on a chain of links from file 1 with none missing, every file
    /// before it wholly in the window (each then answered from its stored
    /// aggregates); only the memory calls from that file on are replayed.
    /// None otherwise (a window that starts later, files `--keep` deleted,
    /// older files): every file's are.
    fn carried_start(
        &self,
        scope: &CallFilter,
        memo: &CheckMemo,
    ) -> Result<Option<CarriedStart>, StoreError> {
        if self.files.first().map(|(n, _)| *n) != Some(1) {
            return Ok(None);
        }
        let mut links = Vec::new();
        let mut last = None;
        for (n, path) in &self.files {
            let trace = open_in_run(path, &self.budget, memo)?;
            // A file being written has no link: the chain ends before it.
            let Some(link) = crate::run_ledger::link(&trace)? else {
                break;
            };
            links.push((*n, Some(link)));
            if crate::run_ledger::judge(&links) != (Chain::Intact { pruned: 0 }) {
                break;
            }
            // The files before the state's must be answered whole; its own need not.
            let whole = whole_file(&trace, scope)?;
            if *n > 1 && crate::run_ledger::stores_begin_state(&trace)? {
                last = Some((*n, trace));
            }
            if !whole {
                break;
            }
        }
        let Some((file, trace)) = last else {
            return Ok(None);
        };
        // The final states of processes retired before it began are in
        // the chain's earlier files (each one, from file 1).
        let before = self.files.partition_point(|(n, _)| *n < file);
        let earlier = self.files[..before]
            .iter()
            .rev()
            .map(|(_, path)| open_in_run(path, &self.budget, memo));
        let Some(begin) = crate::run_ledger::begin_state_over(&trace, earlier, scope.pid)? else {
            return Ok(None);
        };
        let ledger = LedgerBuilder::from_states(begin.states, None, false).map_err(|e| {
            StoreError::file(trace.path(), format!("damaged trace: run_ledger_begin {e}"))
        })?;
        Ok(Some(CarriedStart { file, ledger }))
    }

    /// The window as a store filter, of process `pid` or all.
    pub fn filter(&self, pid: Option<u32>) -> CallFilter {
        CallFilter {
            pid,
            since_ns: Some(self.since),
            ..Default::default()
        }
    }

    /// Each spanned file that holds process `pid` (each, without one),
    /// opened, to `visit`, oldest first; what the reads skipped and the GPU
    /// samples gathered. An error when none holds `pid`.
    fn visit(
        &self,
        pid: Option<u32>,
        memo: &CheckMemo,
        mut visit: impl FnMut(&Trace) -> Result<(), StoreError>,
    ) -> Result<Read, StoreError> {
        let mut read = Read {
            host_context: true,
            ..Read::default()
        };
        let mut seen = false;
        let mut others = std::collections::BTreeSet::new();
        for (_, path) in &self.files {
            let trace = open_in_run(path, &self.budget, memo)?;
            // By the aggregates where the file has them: no per-call table
            // is checked for a file answered from its rollups.
            if let Some(p) = pid {
                if !trace.holds_pid(p)? {
                    if !seen {
                        // Listed should no file hold it (an error's cost).
                        others.extend(trace.pids()?);
                    }
                    continue;
                }
            }
            seen = true;
            read.host_context &= trace.has_host_context();
            visit(&trace)?;
            if let Some(p) = trace.input_problems_of_reads()? {
                read.problems.add(p);
            }
            if let Some(s) = trace.gpu_samples()? {
                read.gpu_samples.get_or_insert_with(Vec::new).extend(s);
            }
        }
        if !seen {
            return Err(StoreError::file(
                &self.dir,
                format!(
                    "no process {} in the {} file(s) read ({})",
                    pid.unwrap_or_default(),
                    self.files.len(),
                    crate::reader::pids_held(others)
                ),
            ));
        }
        Ok(read)
    }

    /// The window's statistics (`stats --last` of the run), with where its
    /// kernel-counted calls fall: each file's part (a finished file wholly
    /// inside the window from its rollups, `window::whole_file_parts`; else
    /// its window streamed, `stored_parts`, or for a file that did not
    /// finish its calls streamed with their culprits from the waits,
    /// `streamed_parts`), added up.
    pub fn stats(
        &self,
        pid: Option<u32>,
        memo: &CheckMemo,
    ) -> Result<(StatsReport, WindowCounts, Read), StoreError> {
        let scope = self.filter(pid);
        let mut sum: Option<StatsParts> = None;
        let read = self.visit(pid, memo, |trace| {
            let part = match crate::window::whole_file_parts(trace, &scope)? {
                Some(p) => p,
                None => match crate::window::stored_parts(trace, &scope)? {
                    Some(p) => p,
                    None => crate::window::streamed_parts(trace, &scope)?,
                },
            };
            match &mut sum {
                Some(s) => s.merge(part),
                None => sum = Some(part),
            }
            Ok(())
        })?;
        // `visit` refused a window where no file held the process.
        let (report, counts) = sum.unwrap_or_default().report(pid);
        Ok((report, counts, read))
    }

    /// The window's calls as the report draws them (`report --last` of
    /// the run): each file's part (a finished file wholly inside the
    /// window from its rollups and by index,
    /// `report_reads::whole_file_calls`; else its window streamed,
    /// `report_reads::window_calls`), added up, the `n` slowest of all kept.
    pub fn report_calls(
        &self,
        pid: Option<u32>,
        memo: &CheckMemo,
        n: usize,
    ) -> Result<(WindowCalls, Read), StoreError> {
        let scope = self.filter(pid);
        let mut sum: Option<WindowCalls> = None;
        let read = self.visit(pid, memo, |trace| {
            let part = match crate::report_reads::whole_file_calls(trace, &scope, n)? {
                Some(p) => p,
                None => crate::report_reads::window_calls(trace, &scope, n)?,
            };
            match &mut sum {
                Some(s) => s.merge(part, n),
                None => sum = Some(part),
            }
            Ok(())
        })?;
        // `visit` refused a window where no file held the process.
        let calls =
            sum.ok_or_else(|| StoreError::file(&self.dir, "no file of the window was read"))?;
        Ok((calls, read))
    }

    /// The window's explanation (`explain --last` of the run): each file's
    /// parts (`scoped::window_parts_after`), the pinned ranges and the
    /// ledger carried from each to the next, added up. A run with NCCL
    /// collectives is refused (the straggler finding reads every call and
    /// wait of the ranks), naming the file.
    pub fn explanation(
        &self,
        pid: Option<u32>,
        memo: &CheckMemo,
    ) -> Result<(Explanation, Read), StoreError> {
        let scope = self.filter(pid);
        let mut pinned =
            pinned_when_file_began(&self.dir, self.files[0].0, pid, &self.budget, memo)?;
        let mut ledger = LedgerBuilder::new(None);
        // From the run's start, the ledger the tracer carried into a later
        // file: the files before it replay nothing.
        let mut carried = self.carried_start(&scope, memo)?;
        let ledger_from_file = carried.as_ref().map(|c| c.file);
        let mut sum: Option<ScopeParts> = None;
        let mut added = 0usize;
        // The visited files' kernel-counted calls: the next file's samples
        // count on from them (`samples_on_run_counts`).
        let mut counted_before: Vec<OpCount> = Vec::new();
        let read = std::thread::scope(|threads| {
            // The next file's memory calls, read on a second thread while this
            // one is answered (`ledger_feed`).
            let mut ahead = ReadAhead::new(threads, pid, &self.budget, memo);
            let read = self.visit(pid, memo, |trace| {
                let n = self.number_of(trace.path());
                if carried.as_ref().is_some_and(|c| n >= c.file) {
                    ledger = carried.take().map(|c| c.ledger).unwrap_or_default();
                }
                let replay = carried.is_none();
                // Read ahead only what is replayed.
                let next = self
                    .file_after(trace.path())
                    .filter(|p| carried.as_ref().is_none_or(|c| self.number_of(p) >= c.file));
                let feed = ahead.take(trace.path(), next.as_deref());
                if trace.nccl_calls(None)?.iter().any(|e| e.is_collective()) {
                    return Err(StoreError::file(trace.path(), NCCL_OVER_FILES));
                }
                let mut part = match whole_file(trace, &scope)? {
                    true => whole_file_parts(
                        trace,
                        &scope,
                        pinned.clone(),
                        replay.then(|| std::mem::take(&mut ledger)),
                        feed,
                    )?,
                    false => crate::scoped::window_parts_after(
                        trace,
                        &scope,
                        pinned.clone(),
                        std::mem::take(&mut ledger),
                    )?,
                };
                pinned = part.inputs.pinned_state();
                // Where its counted launches fell, on the run's counts (a
                // file wholly inside read none, a later file's first
                // period had lost its launches), and where each file's
                // counts ended (its launches after its last sample).
                (part.data.count_samples, part.data.count_ends) =
                    crate::run_explain::samples_on_run_counts(trace, pid, &counted_before)?;
                merge_op_counts(&mut counted_before, &trace.op_counts(pid)?);
                if replay {
                    ledger = std::mem::take(&mut part.ledger);
                }
                added += 1;
                sum = Some(match sum.take() {
                    None => part,
                    Some(mut s) => {
                        crate::run_explain::add_base(&mut s.data, part.data);
                        s.inputs
                            .merge(part.inputs)
                            .map_err(|e| StoreError::file(trace.path(), e.to_string()))?;
                        match (&mut s.window_counts, part.window_counts) {
                            (Some(mine), Some(later)) => mine.merge(later),
                            (mine, later) => *mine = mine.take().or(later),
                        }
                        s
                    }
                });
                Ok(())
            });
            // A read ahead nobody takes stops at its next message.
            drop(ahead);
            read
        })?;
        // No file from the state's on held the process: the state is its ledger.
        if let Some(c) = carried {
            ledger = c.ledger;
        }
        let read = Read {
            ledger_from_file,
            ..read
        };
        // `visit` refused a window where no file held the process.
        let mut parts =
            sum.ok_or_else(|| StoreError::file(&self.dir, "no file of the window was read"))?;
        if let Some(w) = &parts.window_counts {
            parts.data.counts = w.at_least();
        }
        parts.ledger = ledger;
        parts.data.process_gpu_start_lost = self.files[0].0 != 1;
        parts.allocators = Some(self.allocator_views(pid, memo, &parts.data)?);
        let mut e = parts.explain();
        crate::window_growth::settle_run(self, memo, &mut e)?;
        if added > 1 {
            e.notes.push(format!(
                "Explained over {added} files of a run (trace --rotate): counts, sums, histograms, culprits and the \
                 memory ledger of the window cover its part of each file; each thread's window adds its windows in \
                 the files (the time between its last call in one file and its first in the next is in none)."
            ));
        }
        Ok((e, read))
    }
}

impl RunLast {
    /// Whether the window's allocator views need files of the run it does
    /// not span: it spans one file, a file of the run older than it is in
    /// the directory, and the spanned file has allocator events (of `pid`).
    /// That file's own window replays its views from its start, where a
    /// segment made in an earlier file is unknown: read it as a window over
    /// the run ([`Self::explanation`]) instead.
    pub fn views_need_earlier_files(
        &self,
        pid: Option<u32>,
        memo: &CheckMemo,
    ) -> Result<bool, StoreError> {
        let [(n, _)] = self.files.as_slice() else {
            return Ok(false);
        };
        let oldest = run_files(&self.dir)?.first().map_or(*n, |(k, _)| *k);
        Ok(oldest < *n && self.spans_allocator_events(pid, memo)?)
    }

    /// Whether a file the window spans has allocator events (of `pid`):
    /// without, the window has no allocator view and no earlier file is
    /// opened for one.
    fn spans_allocator_events(
        &self,
        pid: Option<u32>,
        memo: &CheckMemo,
    ) -> Result<bool, StoreError> {
        for (_, path) in &self.files {
            let pids = open_in_run(path, &self.budget, memo)?.allocator_pids()?;
            if pids.iter().any(|&p| pid.is_none_or(|only| only == p)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The allocator views the window's explanation reads: those of the
    /// processes (of `pid`) with allocator events in the files the window
    /// spans, each at the window's end replayed from the start of the
    /// run's oldest file in the directory (a segment outlives the window,
    /// and the file, that use it: PyTorch's are made early), its steps
    /// read file after file (`crate::run_steps`, none held), its reserved
    /// bytes counted by the same pass, its layout guessed from the files'
    /// stored views; and the views at their fragmentation findings'
    /// moments. `data` names the blocks' sites. Since round 32 the views
    /// the tracer carried to the newest file answer for the processes
    /// they hold when the files up to it form an intact chain (the window
    /// ends with that file); the others cost a pass over the run's
    /// allocator events up to the window's end, whatever the window's
    /// length.
    pub fn allocator_views(
        &self,
        pid: Option<u32>,
        memo: &CheckMemo,
        data: &sleuth_core::TraceData,
    ) -> Result<sleuth_core::allocator::KnownViews, StoreError> {
        if !self.spans_allocator_events(pid, memo)? {
            return Ok(Default::default());
        }
        let newest = self.files.last().map_or(0, |(n, _)| *n);
        let first_spanned = self.files.first().map_or(0, |(n, _)| *n);
        let files: Vec<(u64, PathBuf)> = run_files(&self.dir)?
            .into_iter()
            .filter(|(n, _)| *n <= newest)
            .collect();
        // The processes the window lists (those of the files it spans) and
        // every file's link: on an intact chain the views the tracer
        // carried to the newest file's end, which the window ends with,
        // answer for them (`run_allocator`), and no earlier file is read.
        let mut listed = crate::run_steps::Guesses::default();
        let mut links = Vec::new();
        for (n, path) in &files {
            let trace = open_in_run(path, &self.budget, memo)?;
            links.push((*n, crate::run_ledger::link(&trace)?));
            if *n < first_spanned {
                continue;
            }
            if let Some(p) = pid {
                if !trace.holds_pid(p)? {
                    continue;
                }
            }
            listed.add(&MemoryTrace::open(&trace, pid, self.budget.clone())?, true)?;
        }
        let (mut end, mut moments) = match (crate::run_ledger::judge(&links), files.last()) {
            (Chain::Intact { .. }, Some((_, newest))) => {
                let trace = open_in_run(newest, &self.budget, memo)?;
                let pids = &listed.pids;
                crate::run_allocator::stored(&trace, &|p| pids.contains(&p), data)?
            }
            _ => Default::default(),
        };
        let mut rest: Vec<u32> = listed
            .pids()
            .into_iter()
            .filter(|p| !end.contains_key(p))
            .collect();
        // Processes retired at their exit: their views where they exited.
        if matches!(crate::run_ledger::judge(&links), Chain::Intact { .. }) && !rest.is_empty() {
            let earlier = files.iter().rev().skip(1);
            let earlier = earlier.map(|(_, path)| open_in_run(path, &self.budget, memo));
            let (e, m) = crate::run_allocator::stored_where_exited(earlier, &rest, data)?;
            rest.retain(|p| !e.contains_key(p));
            end.extend(e);
            moments.extend(m);
        }
        if rest.is_empty() {
            return Ok(sleuth_core::allocator::KnownViews::from_parts(end, moments));
        }
        // The others are replayed from the run's oldest file, their layouts
        // guessed from the files' stored views, oldest first.
        let mut guesses = crate::run_steps::Guesses::default();
        for (n, path) in &files {
            let trace = open_in_run(path, &self.budget, memo)?;
            if let Some(p) = pid {
                if !trace.holds_pid(p)? {
                    continue;
                }
            }
            let view = MemoryTrace::open(&trace, pid, self.budget.clone())?;
            guesses.add(&view, *n >= first_spanned)?;
        }
        let files: Vec<PathBuf> = files.into_iter().map(|(_, p)| p).collect();
        let steps = crate::run_steps::RunSteps::new(&files, &self.budget, memo);
        let replayed = sleuth_core::allocator::KnownViews::until_guessed(
            &steps,
            data,
            &rest,
            None,
            &guesses.layouts,
        );
        steps.into_result()?;
        Ok(sleuth_core::allocator::KnownViews::from_parts(end, moments).join(replayed))
    }
}

/// The window's ledger as the tracer carried it into file `file` of the
/// run ([`RunLast::carried_start`]).
struct CarriedStart {
    file: u64,
    ledger: LedgerBuilder,
}

/// Why a window over several files of a run with NCCL collectives is refused.
const NCCL_OVER_FILES: &str = "holds NCCL collectives: the straggler finding reads every call and wait of the ranks, \
     which a window over several files of a run does not load; ask this file alone (--db FILE --from/--to)";

/// Whether every call of a finished file with stored finding aggregates
/// starts inside the window (`window::wholly_inside`): then its part of
/// the window is the whole file's ([`whole_file_parts`]).
fn whole_file(trace: &Trace, scope: &CallFilter) -> Result<bool, StoreError> {
    Ok(crate::window::wholly_inside(trace, scope)?
        && crate::finding_rollups::has_complete(trace.keyed(), scope.pid)
            .map_err(|e| trace.read_error(e))?)
}

/// A file wholly inside the window ([`whole_file`]), read as a whole run's
/// explanation reads each file (`run_explain`): its stored finding
/// aggregates, its copies judged again when memory pinned before it
/// (`earlier`) is live, its memory calls replayed into the window's
/// `ledger` (none read without one: a later file's stored state holds
/// them, [`RunLast::carried_start`]), its base data; no other call or
/// wait row is read, and no allocator event (the window's views are
/// replayed from the files: [`RunLast::allocator_views`]).
fn whole_file_parts(
    trace: &Trace,
    scope: &CallFilter,
    earlier: PinnedState,
    ledger: Option<LedgerBuilder>,
    feed: Option<Receiver<Fed>>,
) -> Result<ScopeParts, StoreError> {
    let pid = scope.pid;
    let Some(mut inputs) = crate::finding_rollups::finding_inputs(trace, pid)? else {
        // `whole_file` saw them complete.
        return Err(StoreError::file(
            trace.path(),
            "finding rollups vanished while read",
        ));
    };
    let mut view = MemoryTrace::open(trace, pid, trace.budget().clone())?;
    let mut carry = PinnedCarry::starting(earlier);
    carry.file(trace, view.rows(), pid, &mut inputs)?;
    let inputs = inputs.with_pinned(carry.into_state());
    let mut ledger = ledger;
    if let Some(ledger) = &mut ledger {
        view.replay_ledger_fed(ledger, feed)?;
    }
    let mut data = std::mem::take(&mut view.base);
    let counts = trace.op_counts(pid)?;
    let window_counts = WindowCounts::of(trace, &counts, scope)?;
    data.counts = window_counts.at_least();
    Ok(ScopeParts {
        data,
        inputs,
        ledger: ledger.unwrap_or_default(),
        window_counts: Some(window_counts),
        allocators: None,
        tally: None,
    })
}
