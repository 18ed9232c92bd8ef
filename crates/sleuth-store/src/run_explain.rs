//! `explain --db DIR`: the explanation of a whole run of `trace --rotate`
//! (`crate::run`), as if its finished files were one trace, in memory
//! bounded like one file's lean load (`crate::lean`): no call, wait or
//! allocator event of any file is held.
//!
//! Files are read one at a time, oldest first:
//! - their finding aggregates are added (`FindingInputs::merge`: what a
//!   file boundary cuts is documented there and in docs/findings.md);
//! - the memory ledger is the run's, so an allocation made in one file and
//!   freed in a later one is neither unfreed nor an unmatched free: the one
//!   the tracer carried across the files and stored in the last one
//!   (`run_ledger`), when the chain of links is intact over the files read
//!   (no memory call is read); else the memory calls of every file are
//!   streamed, in return order, into one ledger builder (the replay), with
//!   a note saying why when the files carried a ledger that could not be
//!   used;
//! - their pinned host ranges are carried to the next file, whose copies
//!   are judged again when memory pinned earlier is live (`run_pinned`);
//! - their base data (processes, counters, kernel counts, GPU samples,
//!   call sites) is added to one `TraceData` for the GPU lines and the
//!   held-memory notes;
//! - the processes with allocator events are listed: their allocator
//!   views are rebuilt when asked ([`RunLean::allocator_views`],
//!   [`RunLean::explanation`]) by passes over the files' steps
//!   (`crate::run_steps`), none of them held.
//!
//! A file still being written is left out (the caller notes it, as `stats`
//! does). What the merge cannot answer is refused with a one-line error
//! naming the file: a file without finding rollups (an older gpusleuth),
//! and a run with NCCL collectives (the straggler finding reads every call
//! and wait of the ranks).

use crate::budget::ReadBudget;
use crate::checked::CheckMemo;
use crate::ledger_feed::visit_read_ahead;
use crate::problems::InputProblems;
use crate::reader::Trace;
use crate::run::{part_name, visit_finished};
use crate::run_ledger::Chain;
use crate::run_pinned::PinnedCarry;
use crate::run_steps::{Guesses, RunSteps};
use crate::stream::MemoryTrace;
use crate::StoreError;
use sleuth_core::allocator::{AllocatorView, KnownViews};
use sleuth_core::counted::CountSample;
use sleuth_core::findings::inputs::{FindingInputs, Resolution};
use sleuth_core::findings::Explanation;
use sleuth_core::ledger::{LedgerBuilder, ProcessLedger};
use sleuth_core::rollup::{merge_counters, merge_op_counts};
use sleuth_core::sites::SiteMemory;
use sleuth_core::{OpCount, TraceData};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

type EndViews = BTreeMap<u32, AllocatorView>;
type MomentViews = BTreeMap<(u32, u64), AllocatorView>;

/// What [`load`] read of a run: what `Lean` holds for one file, over all.
pub struct RunLean {
    /// The run's base data without calls, waits and allocator events,
    /// from the first finished file's start to the last one's end.
    pub data: TraceData,
    /// One ledger per process over every file in order: carried by the
    /// tracer, or replayed.
    pub ledgers: Vec<ProcessLedger>,
    /// Memory calls read to replay the ledgers: 0 when the tracer's
    /// carried ledger answered.
    pub replayed_memory_calls: u64,
    /// How the ledgers were had, when a reader should be told (they also
    /// cover files `--keep` deleted; or they were replayed, and why).
    pub ledger_note: Option<String>,
    pub inputs: FindingInputs,
    /// Files read, oldest first (with `pid`: those that do not hold it too).
    pub files: Vec<PathBuf>,
    /// Files without complete rollups (the one still being written, or one
    /// whose writer was killed): not in the answer.
    pub incomplete: Vec<PathBuf>,
    /// What the files' reads skipped, added up.
    pub problems: InputProblems,
    /// The moment the ledgers stand at ([`load_memory_at`]); None: the end.
    pub at_ns: Option<u64>,
    /// At a moment: the per-site table then (`memory --by-site --at`),
    /// bytes at each process's peak up to then included; empty at the end
    /// (`run_report::load_sites` reads the stored one).
    pub sites_at: Vec<SiteMemory>,
    /// What the answer over a run says about itself (see [`RunLean::explanation`]).
    notes: Vec<String>,
    /// The processes with allocator events in the files read (of `pid`)
    /// and the layouts their views guess (one pass over the run's steps
    /// each, not two).
    guesses: Guesses,
    /// The processes whose views the tracer carried to the end of a file
    /// read: with those of `guesses`, the ones whose carried views are
    /// looked for (a process whose allocator events were all in files
    /// `--keep` deleted has none in the files read), never replayed; each
    /// with the newest file read (its index in `step_files`) that lists it.
    carried: BTreeMap<u32, usize>,
    /// The newest file read (its index in `step_files`) with a call or an
    /// allocator event of each process.
    seen_in: BTreeMap<u32, usize>,
    /// The files whose steps the allocator views replay (those read; at a
    /// moment, those that began by then), oldest first.
    step_files: Vec<PathBuf>,
    /// How the files are read again for the allocator views.
    budget: ReadBudget,
    memo: CheckMemo,
    /// The file that stores the run's allocator views the tracer carried
    /// (`run_allocator`), on an intact chain: at the end the last file, at
    /// a moment the last one begun by then (the replays it began with).
    carried_in: Option<PathBuf>,
    /// The process asked for (all when None).
    pid: Option<u32>,
}

impl RunLean {
    /// The explanation of the run, with a note saying it spans several
    /// files and what that changes. Its allocator views (fragmentation)
    /// are rebuilt by passes over the files' steps.
    pub fn explanation(&self) -> Result<Explanation, StoreError> {
        let (end, moments, rest) = self.carried_views()?;
        let steps = self.steps();
        let replayed = KnownViews::of_pids_guessed(
            &steps,
            &self.data,
            &rest,
            &self.ledgers,
            &self.guesses.layouts,
        );
        steps.into_result()?;
        let known = KnownViews::from_parts(end, moments).join(replayed);
        let mut e = sleuth_core::findings::explain_inputs_with(
            &self.data,
            &self.inputs,
            &self.ledgers,
            &known,
        );
        e.notes.extend(self.notes.iter().cloned());
        Ok(e)
    }

    /// The allocator views of the processes with allocator events at the
    /// moment the ledgers stand at ([`Self::at_ns`]; the end when None),
    /// their reserved bytes from [`Self::ledgers`]: what
    /// `allocator::allocator_views` gives the files' events and memory
    /// calls loaded as one trace (across a rotation, in file order:
    /// `crate::run_steps`), read from the files at each pass.
    pub fn allocator_views(&self) -> Result<BTreeMap<u32, AllocatorView>, StoreError> {
        let (mut views, rest) = match (self.at_ns, &self.carried_in) {
            (Some(at), Some(file)) => {
                let pids = self.looked_for();
                let trace = Trace::open_remembered(file, self.budget.clone(), &self.memo)?;
                let rows = crate::stream::Rows::open_with(&trace, self.budget.clone())?;
                let mut views =
                    crate::run_allocator::views_at(&rows, at, &pids, &self.ledgers, &self.data)?;
                let mut rest: Vec<u32> = pids
                    .into_iter()
                    .filter(|p| !views.contains_key(p))
                    .collect();
                // Processes retired before the file began: their last views
                // (no step follows an exit), where they exited.
                if !rest.is_empty() {
                    let (exited, _) = self.views_where_they_exited(file, &rest)?;
                    rest.retain(|p| !exited.contains_key(p));
                    views.extend(exited);
                }
                rest.retain(|p| self.guesses.pids.contains(p));
                (views, rest)
            }
            _ => {
                let (views, _, rest) = self.carried_views()?;
                (views, rest)
            }
        };
        let steps = self.steps();
        let replayed = sleuth_core::allocator::allocator_views_guessed(
            &steps,
            &self.data,
            &rest,
            self.at_ns,
            &self.ledgers,
            &self.guesses.layouts,
        );
        steps.into_result()?;
        views.extend(replayed);
        Ok(views)
    }

    /// The views the tracer carried over the run (`run_allocator`), at the
    /// end and at their findings' moments, and the processes with
    /// allocator events that it did not carry (to be replayed). The
    /// carried views also cover files `--keep` deleted, processes whose
    /// allocator events were all in them included.
    fn carried_views(&self) -> Result<(EndViews, MomentViews, Vec<u32>), StoreError> {
        let (mut end, mut moments) = match (&self.carried_in, self.at_ns) {
            (Some(last), None) => {
                let trace = Trace::open_remembered(last, self.budget.clone(), &self.memo)?;
                let pid = self.pid;
                crate::run_allocator::stored(
                    &trace,
                    &|p| pid.is_none_or(|only| only == p),
                    &self.data,
                )?
            }
            _ => Default::default(),
        };
        let mut rest: Vec<u32> = self
            .looked_for()
            .into_iter()
            .filter(|p| !end.contains_key(p))
            .collect();
        if let (Some(last), None, false) = (&self.carried_in, self.at_ns, rest.is_empty()) {
            let (e, m) = self.views_where_they_exited(last, &rest)?;
            rest.retain(|p| !e.contains_key(p));
            end.extend(e);
            moments.extend(m);
        }
        if self.at_ns.is_none() {
            let silent: Vec<u32> = rest
                .iter()
                .copied()
                .filter(|p| !self.guesses.pids.contains(p))
                .collect();
            let (e, m) = self.views_where_last_carried(&silent)?;
            end.extend(e);
            moments.extend(m);
        }
        rest.retain(|p| self.guesses.pids.contains(p));
        Ok((end, moments, rest))
    }

    /// The processes whose carried views are looked for: those with
    /// allocator events in the files read, and those the tracer carried
    /// views of there (a replay of the files read has no event of the
    /// latter when all of theirs were in files `--keep` deleted: they are
    /// never replayed).
    fn looked_for(&self) -> Vec<u32> {
        let carried: BTreeSet<u32> = self.carried.keys().copied().collect();
        self.guesses.pids.union(&carried).copied().collect()
    }

    /// The views of processes `pids` without allocator events in the files
    /// read (none replays them) from the newest file read that carried
    /// them, where no later file read holds a call or event of theirs: no
    /// step came since, so the views stored there are those at the run's
    /// end. What answers for them where the run's chain broke (a killed
    /// tracer's files completed by `gpusleuth finish` start a chain of
    /// their own, which does not carry them: round 54), or where the
    /// tracer carried one no further.
    fn views_where_last_carried(
        &self,
        pids: &[u32],
    ) -> Result<(EndViews, MomentViews), StoreError> {
        let mut by_file: BTreeMap<usize, BTreeSet<u32>> = BTreeMap::new();
        for p in pids {
            let Some(&file) = self.carried.get(p) else {
                continue;
            };
            if self.seen_in.get(p).is_none_or(|&seen| seen <= file) {
                by_file.entry(file).or_default().insert(*p);
            }
        }
        let (mut end, mut moments) = (EndViews::new(), MomentViews::new());
        for (file, here) in by_file {
            let path = &self.step_files[file];
            let trace = Trace::open_remembered(path, self.budget.clone(), &self.memo)?;
            let (e, m) = crate::run_allocator::stored(&trace, &|p| here.contains(&p), &self.data)?;
            end.extend(e);
            moments.extend(m);
        }
        Ok((end, moments))
    }

    /// The carried views of processes `pids` retired at their exit, from
    /// the files read before `last` (`run_allocator::stored_where_exited`).
    fn views_where_they_exited(
        &self,
        last: &Path,
        pids: &[u32],
    ) -> Result<(EndViews, MomentViews), StoreError> {
        let earlier = crate::run::before_newest_first(&self.step_files, last)
            .map(|p| Trace::open_remembered(p, self.budget.clone(), &self.memo));
        crate::run_allocator::stored_where_exited(earlier, pids, &self.data)
    }

    fn steps(&self) -> RunSteps<'_> {
        RunSteps::new(&self.step_files, &self.budget, &self.memo)
    }
}

/// The explanation's inputs over every finished file of the run directory
/// `dir` (of process `pid`: an error when no file holds it), reading under
/// `budget`. A directory with no finished file is an error naming it.
pub fn load(dir: &Path, pid: Option<u32>, budget: ReadBudget) -> Result<RunLean, StoreError> {
    load_remembered(dir, pid, budget, &CheckMemo::new())
}

/// [`load`], the checks each file passed taken from and kept in `memo`.
pub fn load_remembered(
    dir: &Path,
    pid: Option<u32>,
    budget: ReadBudget,
    memo: &CheckMemo,
) -> Result<RunLean, StoreError> {
    load_with(dir, pid, budget, memo, |_, _| Ok(()))
}

/// [`load_remembered`], each file added also handed to `also` with the
/// memory view it was read through (before its base data was taken):
/// what a reader of the run needs besides the explanation (`crate::run_report`)
/// is read from the same files in the same pass.
pub(crate) fn load_with(
    dir: &Path,
    pid: Option<u32>,
    budget: ReadBudget,
    memo: &CheckMemo,
    also: impl FnMut(&Trace, &MemoryTrace) -> Result<(), StoreError>,
) -> Result<RunLean, StoreError> {
    load_run(dir, pid, budget, memo, Read::Explain, also)
}

/// What a reader of the run reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// The explanation's inputs and the memory, at the end.
    Explain,
    /// The memory at the end.
    Memory,
    /// The memory at a moment: the files that began by then.
    At(Moment),
}

/// The run's memory as [`load_remembered`] reads it (the ledgers, carried
/// or replayed; the base data; the allocator views' calls), each file also
/// handed to `also`, without what only the explanation needs: no finding
/// aggregate is read, no copy judged again against memory pinned in an
/// earlier file (a pass over each file's copies), and a run with NCCL
/// collectives is read too. Its [`RunLean::inputs`] are empty: for
/// `memory --db DIR` and the per-site table, not for findings.
pub(crate) fn load_memory_with(
    dir: &Path,
    pid: Option<u32>,
    budget: ReadBudget,
    memo: &CheckMemo,
    also: impl FnMut(&Trace, &MemoryTrace) -> Result<(), StoreError>,
) -> Result<RunLean, StoreError> {
    load_run(dir, pid, budget, memo, Read::Memory, also)
}

/// [`load_memory_with`] with nothing else read.
pub fn load_memory(
    dir: &Path,
    pid: Option<u32>,
    budget: ReadBudget,
    memo: &CheckMemo,
) -> Result<RunLean, StoreError> {
    load_memory_with(dir, pid, budget, memo, |_, _| Ok(()))
}

/// A moment of a run, for [`load_memory_at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// This long after the oldest finished file began (`memory --at`).
    Since(u64),
    /// A monotonic timestamp in ns, the files' clock (MCP `at_ns`).
    At(u64),
}

/// The run's memory as it stood at `moment`, as [`load_memory`] reads it
/// for the end: the files that began by then (their base data, the
/// allocator views' calls) and one ledger replayed from their memory calls
/// in order, the calls that returned after the moment left out, as one
/// trace's `memory --at` replays its own. The carried ledger holds the
/// run's end only, so this reads every memory call up to the moment; what
/// files `--keep` deleted held is not known (a note says so).
/// [`RunLean::at_ns`] is the moment. A moment past the finished files'
/// end, or before the first one's start, is an error saying the run's
/// extent.
pub fn load_memory_at(
    dir: &Path,
    pid: Option<u32>,
    moment: Moment,
    budget: ReadBudget,
    memo: &CheckMemo,
) -> Result<RunLean, StoreError> {
    load_run(dir, pid, budget, memo, Read::At(moment), |_, _| Ok(()))
}

/// Refuses a moment `at` outside the run read (`run`: the files that began
/// by then, `late`: the first finished file begun after it, if any;
/// `extent`: the first start and last end of the files read, or, for one
/// process, of every finished file).
fn check_moment(
    dir: &Path,
    run: &Acc,
    extent: Option<(u64, u64)>,
    incomplete: &[PathBuf],
) -> Result<(), StoreError> {
    let (Some(at), Some((start, end))) = (run.at_ns, extent) else {
        return Ok(());
    };
    // Between two files (the time a rotation took) is inside the run.
    if at < start || (at > end && run.late.is_none()) {
        let mut msg = format!(
            "the moment is outside the run's finished files, which last {} from the oldest one's start (--at counts from it)",
            sleuth_core::units::fmt_ns(end.saturating_sub(start))
        );
        if let Some(live) = incomplete.last() {
            msg.push_str(&format!(
                "; {} is not finished (still being written: read it alone, --db that file; or its tracer was killed: `gpusleuth finish --db` it)",
                crate::run::file_name(live)
            ));
        }
        return Err(StoreError::file(dir, msg));
    }
    Ok(())
}

/// The run read file by file, for `read`.
fn load_run(
    dir: &Path,
    pid: Option<u32>,
    budget: ReadBudget,
    memo: &CheckMemo,
    read: Read,
    mut also: impl FnMut(&Trace, &MemoryTrace) -> Result<(), StoreError>,
) -> Result<RunLean, StoreError> {
    let mut moment = match read {
        Read::At(m) => Some(m),
        _ => None,
    };
    // One process's moment counts from, and is bounded by, every finished
    // file, not only those holding it.
    let extent = match (pid, moment) {
        (Some(_), Some(_)) => finished_extent(dir, &budget, memo)?,
        _ => None,
    };
    if let (Some((start, _)), Some(Moment::Since(d))) = (extent, moment) {
        moment = Some(Moment::At(start.saturating_add(d)));
    }
    let mut run = Acc {
        explain: read == Read::Explain,
        moment,
        ..Acc::default()
    };
    // A process silent in the files kept is the run's while the carried
    // ledger lists it (round 54: `memory --pid P` of an idle server).
    let visited = visit_finished(dir, (pid, true), &budget, memo, |trace| {
        run.add(trace, pid, &budget, &mut also)
    })?;
    let mut data = run.data.take().unwrap_or_default();
    // The sites of the calls drained late into the first file begun after
    // the moment (`Acc::late`).
    for (id, stack) in std::mem::take(&mut run.late_stacks) {
        data.stacks.entry(id).or_insert(stack);
    }
    // NVML's readings when tracing began are stored in the run's first file.
    let first = visited.links.first().map(|(n, _)| *n);
    data.process_gpu_start_lost = first != Some(1);
    check_moment(
        dir,
        &run,
        extent.or(data.start_ns.zip(data.end_ns)),
        &visited.incomplete,
    )?;
    let ledger = match run.at_ns {
        Some(at) => match ledger_at_from_begin(&run, at, &visited, &data, pid, &budget, memo)? {
            Some(l) => l,
            None => ledger_at(&run, at, first, &data, pid, &budget, memo)?,
        },
        None => run_ledger(&visited, &run, &data, pid, &budget, memo)?,
    };
    // The file whose carried allocator views answer: at the end the last
    // one (where the run's ledger was the carried one), at a moment the
    // last one begun by then, on an intact chain (its begin states).
    let carried_in = match run.at_ns {
        None => ledger.carried_in.clone(),
        Some(_) => run
            .held
            .last()
            .filter(|last| matches!(chain_to(&visited, last), Chain::Intact { .. }))
            .cloned(),
    };
    run.files = match read {
        // The files that began by the moment.
        Read::At(_) => run.held.clone(),
        _ => visited.files,
    };
    let reads = (budget, memo.clone());
    Ok(run.finish(data, ledger, visited.incomplete, reads, (pid, carried_in)))
}

/// The first start and last end of a run's finished files (None when
/// none is finished): for one process, a moment counts from the oldest
/// finished file and is refused outside them, whichever files hold the
/// process (round 54's tester: `memory --pid P --at T` counted from the
/// first file holding P and measured the run by those files).
fn finished_extent(
    dir: &Path,
    budget: &ReadBudget,
    memo: &CheckMemo,
) -> Result<Option<(u64, u64)>, StoreError> {
    let files = crate::run::listed_files(dir)?;
    let finished = |p: &PathBuf| -> Result<Option<(Trace, crate::types::Session)>, StoreError> {
        let t = crate::run::open_in_run(p, budget, memo)?;
        Ok(match t.has_rollups()? {
            true => {
                let s = t.session()?;
                Some((t, s))
            }
            false => None,
        })
    };
    let mut first = None;
    for (_, p) in &files {
        if let Some((_, s)) = finished(p)? {
            first = Some(s.info.start_mono_ns);
            break;
        }
    }
    let Some(start) = first else {
        return Ok(None);
    };
    for (_, p) in files.iter().rev() {
        if let Some((t, s)) = finished(p)? {
            // A session without an end (a writer that set none) ends with
            // its last call, as a reader's span of the file does.
            let groups = crate::stream::Rows::open_with(&t, budget.clone())?.call_groups()?;
            let span =
                crate::stream::call_span(Some(s.info.start_mono_ns), s.end_mono_ns, &groups, None);
            return Ok(Some((start, span.end_ns.max(start))));
        }
    }
    Ok(None)
}

/// How the links of the finished files up to `last` (one of them) chain.
fn chain_to(visited: &crate::run::Visited, last: &Path) -> Chain {
    match visited.files.iter().position(|f| f == last) {
        Some(i) => crate::run_ledger::judge(&visited.links[..=i]),
        None => Chain::Broken(format!("{} was not read", last.display())),
    }
}

/// The run's ledgers at `at` from the state the last file read stored
/// when it began (`run_ledger::begin_state`: the tracer's carried ledger
/// over every earlier file of the run, those `--keep` deleted included),
/// with that file's memory calls replayed up to the moment: one file read
/// however late the moment. None (then [`ledger_at`] replays every file)
/// when the file stored no such state, the files read are not one intact
/// chain of links, or the state holds a call that returned after the moment.
fn ledger_at_from_begin(
    run: &Acc,
    at: u64,
    visited: &crate::run::Visited,
    data: &TraceData,
    pid: Option<u32>,
    budget: &ReadBudget,
    memo: &CheckMemo,
) -> Result<Option<RunLedger>, StoreError> {
    let Some(last) = run.held.last() else {
        return Ok(None);
    };
    let Chain::Intact { pruned } = chain_to(visited, last) else {
        return Ok(None);
    };
    let trace = Trace::open_remembered(last, budget.clone(), memo)?;
    // The last file's start state, and the final states of processes
    // retired before it began, from the chain's earlier files (all read,
    // those without `pid` too).
    let earlier = crate::run::before_newest_first(&visited.files, last)
        .map(|p| Trace::open_remembered(p, budget.clone(), memo));
    let Some(begin) = crate::run_ledger::begin_state_over(&trace, earlier, pid)? else {
        return Ok(None);
    };
    if begin.until.is_some_and(|u| u > at) {
        return Ok(None);
    }
    let mut b = LedgerBuilder::from_states(begin.states, Some(at), true)
        .map_err(|e| StoreError::file(last, format!("damaged trace: run_ledger_begin {e}")))?;
    let mut tally = begin.tally;
    let view = MemoryTrace::open_unchecked(&trace, pid, budget.clone())?;
    let mut replayed = view.replay_ledger_and_sites(&mut b, &mut tally, Some(at))?;
    if let Some(next) = &run.late {
        let trace = Trace::open_remembered(next, budget.clone(), memo)?;
        let view = MemoryTrace::open_unchecked(&trace, pid, budget.clone())?;
        replayed += view.replay_ledger_and_sites(&mut b, &mut tally, Some(at))?;
    }
    let (ledgers, sites) = ledgers_and_sites(b, tally, data);
    let note = (pruned > 0).then(|| {
        format!(
            "The ledger at the moment continues the one the tracer carried to {}: it also covers the {pruned} \
             earlier file(s) no longer in the directory (deleted by --keep), so what they allocated and had not \
             freed by then counts.",
            crate::run::file_name(last)
        )
    });
    Ok(Some(RunLedger {
        ledgers,
        replayed,
        note,
        sites,
        carried_in: None,
    }))
}

/// The run's ledgers at `at`: the memory calls of the files read, oldest
/// first, replayed into one builder up to the moment; `first` is the
/// oldest finished file's number (past 1: earlier files are gone).
fn ledger_at(
    run: &Acc,
    at: u64,
    first: Option<u64>,
    data: &TraceData,
    pid: Option<u32>,
    budget: &ReadBudget,
    memo: &CheckMemo,
) -> Result<RunLedger, StoreError> {
    let mut b = LedgerBuilder::new(Some(at)).with_peak_sites();
    let mut tally = crate::stream::SiteTally::default();
    let mut replayed = 0u64;
    // Each next file's memory calls up to the moment read on a second
    // thread while one is replayed; the first file begun after the moment
    // holds those drained late.
    let files: Vec<PathBuf> = run.held.iter().chain(&run.late).cloned().collect();
    visit_read_ahead(&files, (pid, Some(at)), budget, memo, |path, feed| {
        let trace = Trace::open_remembered(path, budget.clone(), memo)?;
        let view = MemoryTrace::open_unchecked(&trace, pid, budget.clone())?;
        let read = view.replay_ledger_and_sites_fed(&mut b, &mut tally, Some(at), feed)?;
        replayed = replayed.saturating_add(read);
        Ok(())
    })?;
    let (ledgers, sites) = ledgers_and_sites(b, tally, data);
    let note = first.filter(|&n| n > 1).map(|n| {
        format!(
            "The ledger at a moment is replayed from the memory calls of the files in the directory: the run's first {} \
             file(s) are gone (deleted by --keep), so what they allocated and had not freed by then is not in it \
             (at the run's end, memory --db DIR without --at counts it: the tracer carried it).",
            n - 1
        )
    });
    Ok(RunLedger {
        ledgers,
        replayed,
        note,
        sites,
        carried_in: None,
    })
}

/// The ledgers of a replay at a moment and the per-site table then.
fn ledgers_and_sites(
    b: LedgerBuilder,
    tally: crate::stream::SiteTally,
    data: &TraceData,
) -> (Vec<ProcessLedger>, Vec<SiteMemory>) {
    let (ledgers, at_peak) = b.finish_with_peak_sites(data);
    let sites =
        sleuth_core::sites::memory_by_site_of(data, tally.in_start_order(), &ledgers, &at_peak);
    (ledgers, sites)
}

/// The run's ledgers and how they were had.
struct RunLedger {
    ledgers: Vec<ProcessLedger>,
    replayed: u64,
    note: Option<String>,
    /// At a moment: the per-site table then (the replay tallies it).
    sites: Vec<SiteMemory>,
    /// The file whose run ledger answered (the last of an intact chain):
    /// it also stores the run's allocator views (`run_allocator`).
    carried_in: Option<PathBuf>,
}

/// The run's ledgers of the processes the files read list: the one the
/// tracer carried, stored in the last finished file, when the chain is
/// intact over the files read; else replayed from their memory calls.
fn run_ledger(
    visited: &crate::run::Visited,
    run: &Acc,
    data: &TraceData,
    pid: Option<u32>,
    budget: &ReadBudget,
    memo: &CheckMemo,
) -> Result<RunLedger, StoreError> {
    let why = match crate::run_ledger::judge(&visited.links) {
        Chain::Intact { pruned } => {
            // `visit_finished` refused a run with no finished file.
            let last = visited.files.last().expect("a finished file");
            let open = |p: &Path| Trace::open_remembered(p, budget.clone(), memo);
            if let Some(ledgers) =
                crate::run_ledger::stored_over(&visited.files, open, &run.pids, data)?
            {
                let note = (pruned > 0).then(|| {
                    format!(
                        "The memory ledger is the one the tracer carried across the run's files: it also covers the \
                         {pruned} earlier file(s) no longer in the directory (deleted by --keep), so their allocations \
                         still live count as unfreed, their frees match, and the memory findings measure what it holds \
                         (allocation churn against the time since each process's first allocation); the other \
                         findings and the counts cover only the {} file(s) read.",
                        // Those added (with a pid, the files holding it), as
                        // the explanation's own note counts them.
                        run.held.len()
                    )
                });
                return Ok(RunLedger {
                    ledgers,
                    replayed: 0,
                    note,
                    sites: Vec::new(),
                    carried_in: Some(last.clone()),
                });
            }
            "the last file's run ledger lacks a process the files list".to_string()
        }
        Chain::Broken(why) => {
            if let Some(l) = continued_from_begin(visited, run, data, pid, budget, memo, &why)? {
                return Ok(l);
            }
            why
        }
    };
    let mut b = LedgerBuilder::new(None);
    let replayed = replay_files(&mut b, &run.held, pid, budget, memo)?;
    // Runs written before the tracer carried a ledger say nothing, as before.
    let carried_some = visited.links.iter().any(|(_, l)| l.is_some());
    Ok(RunLedger {
        ledgers: b.finish(data),
        replayed,
        note: carried_some.then(|| {
            format!(
                "The memory ledger was replayed from the files' memory calls: the one the tracer carried could not be \
                 used ({why})."
            )
        }),
        sites: Vec::new(),
        carried_in: None,
    })
}

/// The run's ledgers where its chain of carried ledgers broke after file
/// k (a killed tracer's file, completed by `gpusleuth finish`, starts a
/// chain of its own; so does a chain past the carried bound): the state
/// the tracer carried into the last finished file of the intact chain from
/// file 1 (its `run_ledger_begin`, over every earlier file, those `--keep`
/// deleted included), with the memory calls of that file and every later
/// one replayed on it. Before round 50 the replay began empty at the first
/// file read: a killed run's files finished by `finish` lost what files
/// `--keep` had deleted still held (its answer worse than before the
/// finish). None where no such file stored its begin state, or where no
/// earlier file was deleted (every file read replayed is the same).
fn continued_from_begin(
    visited: &crate::run::Visited,
    run: &Acc,
    data: &TraceData,
    pid: Option<u32>,
    budget: &ReadBudget,
    memo: &CheckMemo,
    why: &str,
) -> Result<Option<RunLedger>, StoreError> {
    let intact = (0..visited.files.len()).rev().find_map(|i| {
        match crate::run_ledger::judge(&visited.links[..=i]) {
            Chain::Intact { pruned } => Some((i, pruned)),
            Chain::Broken(_) => None,
        }
    });
    // Where no file was deleted, a replay of every file read gives the
    // same ledger (and says so as before).
    let Some((k, pruned)) = intact.filter(|&(_, pruned)| pruned > 0) else {
        return Ok(None);
    };
    let seed = &visited.files[k];
    let open = |p: &Path| Trace::open_remembered(p, budget.clone(), memo);
    let trace = open(seed)?;
    let earlier = crate::run::before_newest_first(&visited.files, seed).map(|p| open(p));
    let Some(begin) = crate::run_ledger::begin_state_over(&trace, earlier, pid)? else {
        return Ok(None);
    };
    drop(trace);
    let mut b = LedgerBuilder::from_states(begin.states, None, false)
        .map_err(|e| StoreError::file(seed, format!("damaged trace: run_ledger_begin {e}")))?;
    // The files read from the seed on (with `pid`: those holding it).
    let from_seed: Vec<PathBuf> = run
        .held
        .iter()
        .filter(|p| visited.files[k..].contains(p))
        .cloned()
        .collect();
    let replayed = replay_files(&mut b, &from_seed, pid, budget, memo)?;
    Ok(Some(RunLedger {
        ledgers: b.finish(data),
        replayed,
        note: Some(format!(
            "The memory ledger continues the one the tracer carried into {}, over the files before it and the \
             {pruned} earlier file(s) no longer in the directory (deleted by --keep), with the memory calls from \
             that file on replayed: the carried chain broke after it ({why}).",
            crate::run::file_name(seed)
        )),
        sites: Vec::new(),
        carried_in: None,
    }))
}

/// The memory calls of `files` (of process `pid`, or all), oldest first,
/// replayed into `b`; how many. Each next file's calls are read on a
/// second thread while one is replayed.
fn replay_files(
    b: &mut LedgerBuilder,
    files: &[PathBuf],
    pid: Option<u32>,
    budget: &ReadBudget,
    memo: &CheckMemo,
) -> Result<u64, StoreError> {
    let mut replayed = 0u64;
    visit_read_ahead(files, (pid, None), budget, memo, |path, feed| {
        let trace = Trace::open_remembered(path, budget.clone(), memo)?;
        let view = MemoryTrace::open_unchecked(&trace, pid, budget.clone())?;
        replayed = replayed.saturating_add(view.replay_ledger_fed(b, feed)?);
        Ok(())
    })?;
    Ok(replayed)
}

/// The run as read so far.
#[derive(Default)]
struct Acc {
    /// Whether the explanation's inputs are read (else the memory alone).
    explain: bool,
    data: Option<TraceData>,
    inputs: Option<FindingInputs>,
    /// The processes the ledgers list: those each file added lists.
    pids: BTreeSet<u32>,
    /// The processes with allocator events in the files added, and the
    /// layouts their views guess.
    guesses: Guesses,
    /// The processes whose allocator views the tracer carried to the end
    /// of a file added (`run_allocator::carried_pids`), each with the
    /// newest such file (its index in `held`).
    carried: BTreeMap<u32, usize>,
    /// The newest file added (its index in `held`) with a call or an
    /// allocator event of each process.
    seen_in: BTreeMap<u32, usize>,
    /// The files added, for a replay of their memory calls.
    held: Vec<PathBuf>,
    files: Vec<PathBuf>,
    /// Files whose aggregates were added.
    added: usize,
    problems: InputProblems,
    /// Host ranges pinned in the files added, for the next file's copies.
    pinned: PinnedCarry,
    /// The moment asked for, when the memory is read at one.
    moment: Option<Moment>,
    /// That moment as a timestamp, once the first file added resolved it.
    at_ns: Option<u64>,
    /// The first finished file that began after the moment (which is then
    /// inside the run): the calls that returned in the last milliseconds
    /// before it began are drained into it (a record belongs to the file
    /// open when it is drained), so a ledger at the moment also replays its
    /// calls returned by then (round 55's tester: a moment in those
    /// milliseconds missed them), with their sites (`late_stacks`, taken
    /// as it was opened here).
    late: Option<PathBuf>,
    late_stacks: BTreeMap<u64, sleuth_core::sites::Stack>,
}

impl Acc {
    /// Adds one finished file holding what is asked (`pid` or all).
    fn add(
        &mut self,
        trace: &Trace,
        pid: Option<u32>,
        budget: &ReadBudget,
        also: &mut impl FnMut(&Trace, &MemoryTrace) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let path = trace.path();
        let inputs = match self.explain {
            true => Some(explanation_inputs(trace, pid)?),
            false => None,
        };
        // Unchecked: a file that holds `pid` only in its carried ledger
        // (`visit_finished`) has nothing of it to read but its span.
        let mut view = MemoryTrace::open_unchecked(trace, pid, budget.clone())?;
        if let Some(moment) = self.moment {
            let at = *self.at_ns.get_or_insert(match moment {
                Moment::Since(d) => view.span.start_ns.saturating_add(d),
                Moment::At(t) => t,
            });
            if view.span.start_ns > at && self.data.is_some() {
                // Began after the moment: nothing of it had happened yet
                // but the calls drained into it late (`late`).
                if self.late.is_none() {
                    self.late = Some(path.to_path_buf());
                    self.late_stacks = std::mem::take(&mut view.base.stacks);
                }
                return Ok(());
            }
        }
        self.pids.extend(view.pids());
        // At the end, also those the tracer carried without a call here.
        if self.moment.is_none() {
            self.pids
                .extend(crate::run_ledger::listed_pids(trace, pid)?);
        }
        self.guesses.add(&view, true)?;
        let here = self.held.len();
        for p in crate::run_allocator::carried_pids(trace, pid)? {
            self.carried.insert(p, here);
        }
        for &p in view.pids().iter().chain(view.block_pids().iter()) {
            self.seen_in.insert(p, here);
        }
        self.held.push(path.to_path_buf());
        also(trace, &view)?;
        if let Some(mut inputs) = inputs {
            self.pinned.file(trace, view.rows(), pid, &mut inputs)?;
            self.inputs = Some(match self.inputs.take() {
                None => inputs,
                Some(mut run) => {
                    run.merge(inputs)
                        .map_err(|e| StoreError::file(path, e.to_string()))?;
                    run
                }
            });
        }
        let mut base = std::mem::take(&mut view.base);
        base.counts = trace.op_counts(pid)?;
        let before = self.data.as_ref().map_or(&[][..], |run| &run.counts[..]);
        (base.count_samples, base.count_ends) = samples_on_run_counts(trace, pid, before)?;
        base.end_ns = Some(view.span.end_ns);
        self.data = Some(match self.data.take() {
            None => base,
            Some(mut run) => {
                add_base(&mut run, base);
                run
            }
        });
        if let Some(p) = trace.input_problems_of_reads()? {
            self.problems.add(p);
        }
        self.added += 1;
        Ok(())
    }

    fn finish(
        self,
        data: TraceData,
        ledger: RunLedger,
        incomplete: Vec<PathBuf>,
        (budget, memo): (ReadBudget, CheckMemo),
        (pid, carried_in): (Option<u32>, Option<PathBuf>),
    ) -> RunLean {
        let mut notes = Vec::new();
        if self.explain && self.added > 1 {
            notes.push(format!(
                "Explained over {} files of a run (trace --rotate): counts, sums, histograms and culprits add up \
                 those files, and the memory ledger runs across them; each thread's window adds its windows in the files (the time \
                 between its last call in one file and its first in the next is in none).",
                self.added
            ));
        }
        notes.extend(ledger.note.clone());
        RunLean {
            ledger_note: ledger.note,
            // None only when no file was added, which `check_answered` refused.
            inputs: self
                .inputs
                .unwrap_or_else(|| FindingInputs::new(Resolution::Bucketed, None)),
            data,
            ledgers: ledger.ledgers,
            replayed_memory_calls: ledger.replayed,
            files: self.files,
            incomplete,
            problems: self.problems,
            at_ns: self.at_ns,
            sites_at: ledger.sites,
            notes,
            guesses: self.guesses,
            carried: self.carried,
            seen_in: self.seen_in,
            step_files: self.held,
            budget,
            memo,
            carried_in,
            pid,
        }
    }
}

/// One file's finding aggregates, for the explanation of the run; a file
/// without them (an older gpusleuth), or with NCCL collectives, is refused.
fn explanation_inputs(trace: &Trace, pid: Option<u32>) -> Result<FindingInputs, StoreError> {
    let path = trace.path();
    let Some(inputs) = crate::finding_rollups::finding_inputs(trace, pid)? else {
        let what = if pid.is_some() {
            "has no per-process finding rollups"
        } else {
            "has no finding rollups"
        };
        return Err(StoreError::file(
            path,
            format!(
                "{what} (written by an older gpusleuth): the run cannot be explained as one trace; \
                 explain its files one at a time"
            ),
        ));
    };
    if trace.nccl_calls(None)?.iter().any(|e| e.is_collective()) {
        return Err(StoreError::file(
            path,
            format!(
                "holds NCCL collectives: the straggler finding reads every call and wait of the ranks, \
                 which a run is not loaded whole for; explain its files one at a time (--db DIR/{})",
                part_name(1).replace("000001", "NNNNNN")
            ),
        ));
    }
    Ok(inputs)
}

/// A file's samples of its kernel-counted calls (`Trace::count_samples`)
/// and where its counts ended (`Trace::count_ends`), on the run's running
/// counts: each file samples its own share, so the counts of the run's
/// files before it (`before`) are added. Round 58's tester: a run's
/// directory read no samples, placed no counted launch, took none of their
/// traps out and read host-bound where its one-file trace read
/// launch-bound; round 59: a window over a run's files (`--last`) the same.
pub(crate) fn samples_on_run_counts(
    trace: &Trace,
    pid: Option<u32>,
    before: &[OpCount],
) -> Result<(Option<Vec<CountSample>>, Vec<CountSample>), StoreError> {
    let before: HashMap<(u32, u16), u64> =
        before.iter().map(|c| ((c.pid, c.op), c.count)).collect();
    let on_run = |mut samples: Vec<CountSample>| {
        for s in &mut samples {
            s.count = s
                .count
                .saturating_add(before.get(&(s.pid, s.op)).copied().unwrap_or(0));
        }
        samples
    };
    let (samples, ends) = trace.count_places(pid)?;
    Ok((samples.map(on_run), on_run(ends)))
}

/// Adds a later file's base data to the run's. The session (start, clock
/// offset, host) is the first file's; the end is the later file's.
/// Processes are listed once: the later file's row (its name after an
/// exec) with the first start and any exit either file saw (a file lists
/// the known processes when it starts, so an exit may be in an earlier
/// one); counters and kernel counts add up as `stats` adds them.
pub fn add_base(run: &mut TraceData, later: TraceData) {
    for mut p in later.processes {
        match run.processes.iter_mut().find(|x| x.pid == p.pid) {
            Some(x) => {
                p.start_ns = x.start_ns.or(p.start_ns);
                p.exit_ns = p.exit_ns.or(x.exit_ns);
                p.exit_code = p.exit_code.or(x.exit_code);
                p.oom_victim |= x.oom_victim;
                *x = p;
            }
            None => run.processes.push(p),
        }
    }
    run.procs.extend(later.procs);
    merge_op_counts(&mut run.counts, &later.counts);
    // Samples place counted calls only where every file has them (a file
    // written before them leaves the run's unplaced).
    run.count_samples = match (run.count_samples.take(), later.count_samples) {
        (Some(mut a), Some(b)) => {
            a.extend(b);
            Some(a)
        }
        _ => None,
    };
    run.count_ends.extend(later.count_ends);
    run.blocks.extend(later.blocks);
    run.calls.extend(later.calls);
    merge_counters(&mut run.stats, &later.stats);
    run.end_ns = later.end_ns.or(run.end_ns);
    // Every file of a run's window is scoped to the same window; a file
    // wholly inside it is read whole (no window of its own).
    run.window_ns = (
        run.window_ns.0.or(later.window_ns.0),
        run.window_ns.1.or(later.window_ns.1),
    );
    run.has_host_context &= later.has_host_context;
    // Stack ids hash the frames: the same id names the same site in every file.
    run.stacks.extend(later.stacks);
    run.gpu_samples = match (run.gpu_samples.take(), later.gpu_samples) {
        (Some(mut a), Some(b)) => {
            a.extend(b);
            Some(a)
        }
        (a, b) => a.or(b),
    };
    run.process_gpu.extend(later.process_gpu);
    run.hosts.extend(later.hosts);
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::data::ProcessInfo;
    use sleuth_core::event::OpCount;

    fn proc(pid: u32, comm: &str, start: Option<u64>, exit: Option<u64>) -> ProcessInfo {
        ProcessInfo {
            pid,
            ppid: None,
            comm: comm.into(),
            cmdline: String::new(),
            start_ns: start,
            exit_ns: exit,
            exit_code: exit.map(|_| 0),
            oom_victim: false,
        }
    }

    /// A process that exited in the first file and is listed again by the
    /// second keeps its exit; one that exec'd takes its later name; counts
    /// and counters add up; the end is the later file's.
    #[test]
    fn base_data_adds_up_and_keeps_what_an_earlier_file_saw() {
        let op = sleuth_core::op_by_name("cudaLaunchKernel").unwrap().id;
        let mut run = TraceData {
            processes: vec![
                proc(1, "a", Some(5), Some(50)),
                proc(2, "sh", Some(6), None),
            ],
            counts: vec![OpCount {
                pid: 2,
                op,
                count: 3,
            }],
            stats: [("drop_ringbuf".to_string(), 4)].into(),
            start_ns: Some(1),
            end_ns: Some(100),
            has_host_context: true,
            ..Default::default()
        };
        let later = TraceData {
            processes: vec![
                proc(1, "a", None, None),
                proc(2, "python3", None, Some(180)),
            ],
            counts: vec![OpCount {
                pid: 2,
                op,
                count: 7,
            }],
            stats: [("drop_ringbuf".to_string(), 1)].into(),
            start_ns: Some(100),
            end_ns: Some(200),
            has_host_context: true,
            ..Default::default()
        };
        add_base(&mut run, later);
        assert_eq!(
            run.processes,
            vec![
                proc(1, "a", Some(5), Some(50)),
                proc(2, "python3", Some(6), Some(180))
            ]
        );
        assert_eq!(run.counts[0].count, 10);
        assert_eq!(run.stats["drop_ringbuf"], 5);
        assert_eq!((run.start_ns, run.end_ns), (Some(1), Some(200)));
    }
}
