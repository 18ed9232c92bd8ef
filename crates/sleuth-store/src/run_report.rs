//! `report --db DIR`: what the report of a whole run of `trace --rotate`
//! draws, read file by file in the pass that explains the run
//! (`crate::run_explain::load_with`), in memory bounded like one file's
//! report (`crate::report_reads`): no call or wait is held but the slowest
//! few and the memory calls of processes with allocator blocks.
//!
//! Of each finished file (oldest first): its per-op rollups (merged: the
//! latency rows over the run, percentiles within the histograms' bound),
//! its calls per process and waits (added up), its extent (the run's span
//! runs from the first file's origin to the last one's extent end), its
//! slowest calls with their culprits (the run keeps the slowest of all),
//! its device allocations tallied per stack (added up: stack ids hash the
//! frames, so one id names one site in every file), its session and its
//! notes. The findings, the memory ledgers (the run's, carried by the
//! tracer or replayed) and the base data are the run's explanation's.
//!
//! What a run cannot give: the bytes each site held at a process's peak
//! (the peak may fall in any file, and no file holds the run's live
//! allocations by site at that moment): [`RunReport::sites`] leaves them
//! at zero and says so with `at_peak_known = false`.

use crate::budget::ReadBudget;
use crate::checked::CheckMemo;
use crate::report_reads::{alloc_tallies, file_parts, FileParts};
use crate::run_explain::RunLean;
use crate::types::{Note, Session};
use crate::StoreError;
use sleuth_core::sites::{AllocTally, SiteMemory};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Distinct notes of the run's files a report lists (a run of a thousand
/// files says "file N of a run" a thousand times); the rest are counted.
pub const RUN_NOTES_MAX: usize = 20;

/// Everything the report of a run shows.
pub struct RunReport {
    /// The run's explanation's inputs: base data, ledgers, findings, the
    /// files read and left out, what their reads skipped.
    pub run: RunLean,
    /// The files' rollups, counts, span and slowest calls added up
    /// (`FileParts::add`).
    pub parts: FileParts,
    /// The device allocations tallied per stack over the files (failed
    /// ones apart); None when no file holds call sites.
    pub allocs: Option<Vec<AllocTally>>,
    /// The first file's session, ending where the last one ends.
    pub session: Session,
    /// The files' notes, each text once, at most [`RUN_NOTES_MAX`], but the
    /// tracer's "file N of a run" in each (`run::is_rotation_note`).
    pub notes: Vec<Note>,
    /// Distinct notes past [`RUN_NOTES_MAX`], counted.
    pub notes_left_out: usize,
}

impl RunReport {
    /// Device memory by site over the run ([`sites_of`]).
    pub fn sites(&self) -> Vec<SiteMemory> {
        sites_of(&self.run, self.allocs.iter().flatten().copied())
    }
}

/// What a run's per-site table counts, for the answers that show one.
pub const SITES_NOTE: &str = "over a run's files: allocations added up over the files, unfreed from the run's \
     memory ledger; what each site held at a process's peak is not known over several files (at_peak_bytes 0; \
     one of its files read alone gives it)";

/// Device memory by site over a run: `allocs` (the files' allocations and
/// failed ones, tallied per stack) added up, unfreed from the run's
/// ledger; the bytes live at each process's peak are not known over a run
/// (left at zero: say so where they are shown).
pub fn sites_of(run: &RunLean, allocs: impl IntoIterator<Item = AllocTally>) -> Vec<SiteMemory> {
    sleuth_core::sites::memory_by_site_of(&run.data, allocs, &run.ledgers, &BTreeMap::new())
}

/// The run's memory as `explain --db DIR` reads it (`run_explain::load_memory_with`:
/// no finding aggregate), with its per-site table
/// ([`sites_of`]; empty when no file holds call sites): what `memory
/// --by-site --db DIR` and MCP `memory` of a run's directory show.
pub fn load_sites(
    dir: &Path,
    pid: Option<u32>,
    budget: ReadBudget,
    memo: &CheckMemo,
) -> Result<(RunLean, Vec<SiteMemory>), StoreError> {
    load_sites_with(dir, pid, budget, memo, |_, _| Ok(()))
}

/// [`load_sites`], each file read also handed to `also` with its memory
/// view (MCP `call_sites` of a run adds up each file's calls by site).
pub fn load_sites_with(
    dir: &Path,
    pid: Option<u32>,
    budget: ReadBudget,
    memo: &CheckMemo,
    mut also: impl FnMut(&crate::Trace, &crate::stream::MemoryTrace) -> Result<(), StoreError>,
) -> Result<(RunLean, Vec<SiteMemory>), StoreError> {
    let mut allocs = Vec::new();
    let run = crate::run_explain::load_memory_with(dir, pid, budget, memo, |trace, view| {
        add_tallies(&mut allocs, trace, view, pid)?;
        also(trace, view)
    })?;
    let sites = match run.data.stacks.is_empty() {
        true => Vec::new(),
        false => sites_of(&run, allocs),
    };
    Ok((run, sites))
}

/// The report of every finished file of the run directory `dir` (of
/// process `pid`: an error when no file holds it), with its `n_slowest`
/// slowest calls, read under `budget`; the checks each file passed taken
/// from and kept in `memo`. Errors are `run_explain`'s (no finished file, a
/// file without finding rollups, NCCL collectives).
pub fn load(
    dir: &Path,
    pid: Option<u32>,
    budget: ReadBudget,
    memo: &CheckMemo,
    n_slowest: usize,
) -> Result<RunReport, StoreError> {
    let mut acc = Acc::default();
    let run = crate::run_explain::load_with(dir, pid, budget, memo, |trace, view| {
        acc.add(trace, view, pid, n_slowest)
    })?;
    acc.finish(dir, run)
}

/// What the report of a window of the run (`report --last`) draws from
/// the whole run: [`load`] without what the window's own reads replace.
/// No finding aggregate is read and no copy judged again (the findings
/// are the window's: `run_window::RunLast::explanation`), no slowest call
/// (the window's), so its [`RunReport::run`] has empty finding inputs and
/// its [`RunReport::parts`] no slowest calls. A run with NCCL collectives
/// is read too (the window's explanation refuses it, naming the file).
pub fn load_outside_window(
    dir: &Path,
    pid: Option<u32>,
    budget: ReadBudget,
    memo: &CheckMemo,
) -> Result<RunReport, StoreError> {
    let mut acc = Acc::default();
    let run = crate::run_explain::load_memory_with(dir, pid, budget, memo, |trace, view| {
        acc.add(trace, view, pid, 0)
    })?;
    acc.finish(dir, run)
}

impl Acc {
    /// The report of the run read into `self`.
    fn finish(self, dir: &Path, run: RunLean) -> Result<RunReport, StoreError> {
        let has_sites = !run.data.stacks.is_empty();
        let (Some(session), Some(parts)) = (self.session, self.parts) else {
            // The run's reads refused a run with no file added.
            return Err(StoreError::file(dir, "no finished file in this run"));
        };
        Ok(RunReport {
            run,
            parts,
            allocs: has_sites.then_some(self.allocs),
            session,
            notes: self.notes,
            notes_left_out: self.notes_left_out,
        })
    }
}

/// Adds one file's allocations tallied per stack, when it holds call sites.
fn add_tallies(
    allocs: &mut Vec<AllocTally>,
    trace: &crate::Trace,
    view: &crate::stream::MemoryTrace,
    pid: Option<u32>,
) -> Result<(), StoreError> {
    if !view.base.stacks.is_empty() {
        allocs.extend(alloc_tallies(trace, view, pid)?);
    }
    Ok(())
}

/// The run as read so far.
#[derive(Default)]
struct Acc {
    /// The files' parts added up so far.
    parts: Option<FileParts>,
    allocs: Vec<AllocTally>,
    session: Option<Session>,
    notes: Vec<Note>,
    seen_notes: BTreeSet<String>,
    notes_left_out: usize,
}

impl Acc {
    fn add(
        &mut self,
        trace: &crate::Trace,
        view: &crate::stream::MemoryTrace,
        pid: Option<u32>,
        n: usize,
    ) -> Result<(), StoreError> {
        let parts = file_parts(trace, view, view.base.start_ns.is_some(), pid, n)?;
        // The slowest `n` so far: memory stays `n` calls however many files.
        match &mut self.parts {
            Some(run) => run.add(parts, n),
            None => self.parts = Some(parts),
        }
        add_tallies(&mut self.allocs, trace, view, pid)?;
        let session = trace.session()?;
        self.session = Some(match self.session.take() {
            None => session,
            Some(mut first) => {
                first.end_mono_ns = session.end_mono_ns.or(first.end_mono_ns);
                first
            }
        });
        // The report names the run's files: not "file N of a run" per file.
        for note in trace.notes()? {
            if crate::run::is_rotation_note(&note.text) {
                continue;
            }
            if self.seen_notes.insert(note.text.clone()) {
                match self.notes.len() < RUN_NOTES_MAX {
                    true => self.notes.push(note),
                    false => self.notes_left_out += 1,
                }
            }
        }
        Ok(())
    }
}
