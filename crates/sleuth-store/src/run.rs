//! A run: the files one `trace --rotate` wrote, read as one trace for the
//! answers that add up (`stats`).
//!
//! A rotating trace writes into a directory, one complete trace per period:
//! `part-000001.db`, `part-000002.db`, ... (six digits, zero-padded, so names
//! sort in write order; more than 999,999 files still sort by number). Each
//! file is a complete trace with its own rollups, so any command reads any
//! one of them; [`Run::stats_report`] merges the rollups of every finished
//! file (per-op histograms, counts, totals, maxima, culprit sums, thread
//! splits, counters, kernel op counts) into one answer over the run.

use crate::budget::{ReadBudget, DEFAULT_READ_TIMEOUT};
use crate::checked::CheckMemo;
use crate::error::StoreError;
use crate::reader::Trace;
use sleuth_core::findings::inputs::PinnedState;
use sleuth_core::rollup::{merge_counters, merge_op_counts, StoredRollups};
use sleuth_core::stats::StatsReport;
use sleuth_core::TraceData;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const PART_PREFIX: &str = "part-";
const PART_SUFFIX: &str = ".db";

/// The file name of a run's `n`th file (1-based).
pub fn part_name(n: u64) -> String {
    format!("{PART_PREFIX}{n:06}{PART_SUFFIX}")
}

/// The number of a run's file from its name; None for any other name.
pub fn part_number(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PART_PREFIX)?.strip_suffix(PART_SUFFIX)?;
    if digits.len() < 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The note the tracer writes into file `n` (2 and later) of a run that
/// starts a new file every `every` (a duration as written for people).
pub fn rotation_note(n: u64, every: &str) -> String {
    format!(
        "{ROTATION_NOTE_HEAD}{n}{ROTATION_NOTE_TAIL}{every}: calls and waits are stored in the file open when they ended"
    )
}

const ROTATION_NOTE_HEAD: &str = "file ";
const ROTATION_NOTE_TAIL: &str = " of a run that starts a new file every ";

/// Whether `text` is a [`rotation_note`]: an answer over the run's files
/// names the files instead of repeating one such note per file.
pub fn is_rotation_note(text: &str) -> bool {
    let Some(rest) = text.strip_prefix(ROTATION_NOTE_HEAD) else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && rest[digits..].starts_with(ROTATION_NOTE_TAIL)
}

/// Refuses `output` when it is named like a run's file in the run's
/// directory `dir`: it would be taken for one of the run's files (or take
/// the name of the tracer's next one).
pub fn refuse_output_in_run(output: &Path, dir: &Path) -> Result<(), StoreError> {
    let parent = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let in_dir = match (parent.canonicalize(), dir.canonicalize()) {
        (Ok(p), Ok(d)) => p == d,
        _ => false,
    };
    let part = output
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(part_number)
        .is_some();
    if in_dir && part {
        return Err(StoreError::file(
            output,
            "a run's file name in the run's directory (refusing to write there)",
        ));
    }
    Ok(())
}

/// The file names of `paths` (a run's files), for an answer that names them.
/// The files of `files` (a run's, oldest first) before `last`, newest
/// first: where a reader of `last` looks for what the run's carried
/// ledger retired before it (`run_ledger`, round 47).
pub(crate) fn before_newest_first<'a>(
    files: &'a [PathBuf],
    last: &Path,
) -> impl Iterator<Item = &'a PathBuf> {
    let n = files.iter().position(|f| f == last).unwrap_or(files.len());
    files[..n].iter().rev()
}

pub fn file_names(paths: &[PathBuf]) -> Vec<String> {
    paths.iter().map(|p| file_name(p)).collect()
}

/// A run's file's name, for an answer that names it.
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// "part-000003.db to part-000005.db": the first and last of `names`
/// (the one name, or nothing).
pub fn first_to_last(names: &[String]) -> String {
    match (names.first(), names.last()) {
        (Some(a), Some(b)) if a != b => format!("{a} to {b}"),
        (Some(a), _) => a.clone(),
        _ => String::new(),
    }
}

/// The files of a run directory, oldest first (by number).
pub fn run_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let entries = std::fs::read_dir(dir).map_err(|e| StoreError::io(dir, e))?;
    let mut files = Vec::new();
    for e in entries {
        let e = e.map_err(|e| StoreError::io(dir, e))?;
        let name = e.file_name();
        if let Some(n) = name.to_str().and_then(part_number) {
            files.push((n, e.path()));
        }
    }
    files.sort();
    Ok(files)
}

/// [`run_files`], an error naming `dir` when it holds none: every reader
/// of a run starts here.
pub(crate) fn listed_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let listed = run_files(dir)?;
    if listed.is_empty() {
        return Err(StoreError::file(
            dir,
            format!(
                "not a trace run: no {} files in this directory (written by `trace --rotate`)",
                part_name(1).replace("000001", "NNNNNN")
            ),
        ));
    }
    Ok(listed)
}

/// After a reader went through a run's files: an error when none was
/// finished (`files` empty), or when none held process `pid` (`pid_seen`).
/// `run_pids`: the pids of the finished files read (listed when none held
/// `pid`).
fn check_answered(
    dir: &Path,
    files: &[PathBuf],
    pid: Option<u32>,
    pid_seen: bool,
    (run_pids, pruned): (&BTreeSet<u32>, bool),
) -> Result<(), StoreError> {
    if files.is_empty() {
        return Err(StoreError::file(
            dir,
            "no finished file in this run yet (the first file is still being written, or its tracer was killed: `gpusleuth finish --db` the directory completes it)",
        ));
    }
    if !pid_seen {
        return Err(StoreError::file(
            dir,
            format!(
                "no process {} in this run ({}{})",
                pid.unwrap_or_default(),
                crate::reader::pids_held(run_pids.iter().copied()),
                if pruned {
                    "; a process that exited in a file --keep deleted is no longer listed"
                } else {
                    ""
                }
            ),
        ));
    }
    Ok(())
}

/// The files a reader went through: read, and left out as unfinished.
pub(crate) struct Visited {
    /// Finished files, oldest first (with a pid: those without it too).
    pub files: Vec<PathBuf>,
    /// Files without complete rollups (the one still being written, or one
    /// whose writer was killed): not in the answer.
    pub incomplete: Vec<PathBuf>,
    /// Each finished file's number and link to the run's carried ledger
    /// (`run_ledger`), as `files`.
    pub links: Vec<(u64, Option<crate::run_ledger::Link>)>,
}

/// Opens the run's files one at a time, oldest first, and hands each
/// finished file that holds process `pid` (each finished file, without
/// one; with `carried_too`, also each whose carried run ledger lists it)
/// to `visit`. Errors as [`check_answered`]: no finished file, or none
/// holding `pid`.
/// The checks each file passed are taken from and kept in `memo` (the
/// finished files of a run do not change: a later read of the run skips
/// them).
pub(crate) fn visit_finished(
    dir: &Path,
    (pid, carried_too): (Option<u32>, bool),
    budget: &ReadBudget,
    memo: &CheckMemo,
    mut visit: impl FnMut(&Trace) -> Result<(), StoreError>,
) -> Result<Visited, StoreError> {
    let (mut files, mut incomplete, mut links) = (Vec::new(), Vec::new(), Vec::new());
    let mut pid_seen = pid.is_none();
    let mut run_pids = BTreeSet::new();
    let listed = listed_files(dir)?;
    // File 1 gone: `--keep` deleted the oldest files.
    let pruned = listed.first().is_some_and(|(n, _)| *n > 1);
    for (n, path) in listed {
        let trace = open_in_run(&path, budget, memo)?;
        if !trace.has_rollups()? {
            incomplete.push(path);
            continue;
        }
        let holds = match pid {
            Some(p) => {
                let pids = trace.pids()?;
                // With `carried_too`, a process silent in the file that the
                // run's carried ledger lists (an idle server holding what
                // it allocated in files `--keep` deleted) is the file's too.
                let holds = pids.contains(&p)
                    || (carried_too
                        && !crate::run_ledger::listed_pids(&trace, Some(p))?.is_empty());
                if !holds && !pid_seen {
                    run_pids.extend(pids);
                }
                holds
            }
            None => true,
        };
        if holds {
            pid_seen = true;
            visit(&trace)?;
        }
        links.push((n, crate::run_ledger::link(&trace)?));
        files.push(path);
    }
    check_answered(dir, &files, pid, pid_seen, (&run_pids, pruned))?;
    Ok(Visited {
        files,
        incomplete,
        links,
    })
}

/// The host ranges process `pid` (or each) had pinned when the run's file
/// number `n` began: as file `n` stored them (round 19), else as file
/// `n - 1` stored them at its end, else every earlier file's pinning calls
/// replayed in end order, file after file (their rows alone, through the
/// op index). A
/// window of that file judges its copies against them (a buffer pinned
/// at the program's start is pinned in a file written hours later).
pub fn pinned_when_file_began(
    dir: &Path,
    n: u64,
    pid: Option<u32>,
    budget: &ReadBudget,
    memo: &CheckMemo,
) -> Result<PinnedState, StoreError> {
    let file = open_in_run(&dir.join(part_name(n)), budget, memo)?;
    if let Some(judged) = crate::run_pinned::judged_from(&file, pid)? {
        return Ok(judged);
    }
    let link = crate::run_ledger::link(&file)?;
    if let Some(carried) = carried_pinned(dir, n, link.as_ref(), pid, budget, memo)? {
        return Ok(carried);
    }
    let mut pinned = PinnedState::default();
    for (k, path) in run_files(dir)? {
        if k >= n {
            break;
        }
        let trace = open_in_run(&path, budget, memo)?;
        pinned = crate::scoped::pinned_before(&trace, pid, None, pinned)?;
    }
    Ok(pinned)
}

/// A file of a run opened as its readers open it, read under `budget`
/// (one for the whole answer: an MCP tool's time limit and cancellation
/// stop a read of many files), its checks kept in `memo`.
pub(crate) fn open_in_run(
    path: &Path,
    budget: &ReadBudget,
    memo: &CheckMemo,
) -> Result<Trace, StoreError> {
    Trace::open_remembered(path, budget.clone(), memo)
}

/// What the tracer stored as pinned at the end of file `n - 1` of the run
/// in `dir`, when `n - 1` and `n` (its link `next`) are consecutive files
/// of one run whose carried chain starts at file 1
/// (`run_ledger::continues_from_start`): the whole run's pinned ranges
/// when `n` began, files `--keep` deleted included, read from one file.
/// None: replay the earlier files.
fn carried_pinned(
    dir: &Path,
    n: u64,
    next: Option<&crate::run_ledger::Link>,
    pid: Option<u32>,
    budget: &ReadBudget,
    memo: &CheckMemo,
) -> Result<Option<PinnedState>, StoreError> {
    let Some(before) = n.checked_sub(1).filter(|&b| b >= 1) else {
        return Ok(None);
    };
    let prev_path = dir.join(part_name(before));
    if !prev_path.is_file() {
        return Ok(None);
    }
    let prev = open_in_run(&prev_path, budget, memo)?;
    let Some(prev_link) = crate::run_ledger::link(&prev)? else {
        return Ok(None);
    };
    if !crate::run_ledger::continues_from_start(&prev_link, next, n) {
        return Ok(None);
    }
    crate::run_pinned::stored(&prev, pid)
}

/// For a file of a run read alone (`DIR/part-NNNNNN.db`, opened as
/// `trace`): the host ranges the run had pinned when it began, as the file
/// itself stored them (round 19, `run_pinned::judged_from`: wherever the
/// file lies), or as its previous file beside it stored them
/// ([`carried_pinned`]: one more file read, no replay, under the trace's
/// budget and memo). None otherwise: not a later file of a run, or an
/// older one whose previous file is gone, older or of another chain.
pub fn pinned_before_file(
    trace: &Trace,
    pid: Option<u32>,
) -> Result<Option<PinnedState>, StoreError> {
    if let Some(judged) = crate::run_pinned::judged_from(trace, pid)? {
        return Ok(Some(judged));
    }
    let path = trace.path();
    let (Some(dir), Some(n)) = (
        path.parent(),
        path.file_name()
            .and_then(|n| n.to_str())
            .and_then(part_number),
    ) else {
        return Ok(None);
    };
    let link = crate::run_ledger::link(trace)?;
    carried_pinned(dir, n, link.as_ref(), pid, trace.budget(), &trace.memo())
}

/// The merged stats of a run, and the files it could not use.
#[derive(Debug)]
pub struct RunStats {
    pub report: StatsReport,
    /// Files read, oldest first.
    pub files: Vec<PathBuf>,
    /// Files without complete rollups (the one still being written, or one
    /// whose writer was killed): not in the answer.
    pub incomplete: Vec<PathBuf>,
    /// Every file that answered holds the scheduler's context (the
    /// on-CPU / runnable / blocked split).
    pub host_context: bool,
}

/// The stats answer over every finished file of the run directory `dir`
/// (one process with `pid`: an error when no file holds it). A directory
/// with no finished file is an error naming it.
pub fn run_stats(dir: &Path, pid: Option<u32>) -> Result<RunStats, StoreError> {
    run_stats_remembered(
        dir,
        pid,
        &ReadBudget::new(DEFAULT_READ_TIMEOUT),
        &CheckMemo::new(),
    )
}

/// [`run_stats`], read under `budget`, the checks each file passed taken
/// from and kept in `memo`.
pub fn run_stats_remembered(
    dir: &Path,
    pid: Option<u32>,
    budget: &ReadBudget,
    memo: &CheckMemo,
) -> Result<RunStats, StoreError> {
    let mut rollups = StoredRollups::default();
    let mut base = TraceData {
        has_host_context: true,
        ..Default::default()
    };
    let visited = visit_finished(dir, (pid, false), budget, memo, |trace| {
        let read = |e| StoreError::Sqlite {
            path: trace.path().to_path_buf(),
            source: e,
        };
        rollups.merge(trace.stored_rollups(pid).map_err(read)?);
        merge_counters(&mut base.stats, &trace.stats()?);
        merge_op_counts(&mut base.counts, &trace.op_counts(pid)?);
        base.has_host_context &= trace.has_host_context();
        Ok(())
    })?;
    Ok(RunStats {
        report: sleuth_core::rollup::stats_report(&rollups, pid, &base),
        files: visited.files,
        incomplete: visited.incomplete,
        host_context: base.has_host_context,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_round_trip_and_nothing_else_matches() {
        assert_eq!(part_name(1), "part-000001.db");
        assert!(is_rotation_note(&rotation_note(12, "1m")));
        assert!(!is_rotation_note(
            "file of a run that starts a new file every 1m"
        ));
        assert!(!is_rotation_note(
            "the file 2 of a run that starts a new file every 1m"
        ));
        assert_eq!(part_name(1_234_567), "part-1234567.db");
        for n in [1, 42, 999_999, 1_000_000] {
            assert_eq!(part_number(&part_name(n)), Some(n));
        }
        for other in [
            "part-1.db",
            "part-00000a.db",
            "trace.db",
            "part-000001.db-wal",
        ] {
            assert_eq!(part_number(other), None, "{other}");
        }
    }
}
