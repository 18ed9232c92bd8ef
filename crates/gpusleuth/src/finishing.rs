//! Completing the trace files a tracer left unfinished (killed before its
//! file's completion: SIGKILL, the OOM killer, a node that went down), so
//! that every command answers from the stored rollups instead of a pass
//! over every row, and a run's answers include the file again
//! (`sleuth_store::finish`). Used by `gpusleuth finish` and by
//! `trace --finish-killed`, which completes in the background what the
//! tracers before it left beside its own output.
//!
//! A path is a trace file, a `trace --rotate` run's directory (each of its
//! unfinished files, in order), or a directory of runs (the node agent's
//! working directory: every run under it, and the files `trace` names
//! itself, `gpusleuth-*.db`). A file some process has open is left alone:
//! a tracer still writing it, or completing it, owns it.

use anyhow::{bail, Context};
use sleuth_store::finish::Finished;
use sleuth_store::run_ledger::RunLink;
use sleuth_store::{StoreError, Trace};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One line of what finishing did, as it goes.
pub enum Said {
    /// A file finished now.
    Finished(String),
    /// Another outcome: already complete, left alone.
    Info(String),
    /// A file that could not be finished.
    Error(String),
}

/// What became of the files.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub finished: usize,
    pub complete: usize,
    pub in_use: usize,
    pub failed: usize,
    /// Hidden files of a file's start, and disk reserves, removed.
    pub removed: usize,
}

impl Tally {
    /// The one-line summary both `finish` and the tracer give.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} finished, {} already complete, {} in use (left as they are), {} failed",
            self.finished, self.complete, self.in_use, self.failed
        );
        if self.removed > 0 {
            s.push_str(&format!(
                "; {} hidden file(s) a killed tracer left (a file's start, disk space set aside) removed (they held nothing recorded)",
                self.removed
            ));
        }
        s
    }
}

/// How a file is opened with the readers' checks (the command keeps what
/// they passed in the user's checks cache; the tracer does not touch it).
pub type Opener = fn(&Path) -> Result<Trace, StoreError>;

/// Finishes the unfinished files under some paths, saying what it does.
pub struct Finisher<'a> {
    open: Opener,
    say: &'a mut dyn FnMut(Said),
    /// Files and directories left out wherever they are met (device, inode):
    /// the tracer's own output, which this process writes.
    skip: Vec<(u64, u64)>,
    pub tally: Tally,
}

impl<'a> Finisher<'a> {
    pub fn new(open: Opener, say: &'a mut dyn FnMut(Said)) -> Self {
        Finisher {
            open,
            say,
            skip: Vec::new(),
            tally: Tally::default(),
        }
    }

    /// Leaves `path` (a file or a run's directory) out.
    pub fn skip(&mut self, path: &Path) -> anyhow::Result<()> {
        self.skip.push(same_file_id(path)?);
        Ok(())
    }

    fn skipped(&self, path: &Path) -> bool {
        same_file_id(path).is_ok_and(|id| self.skip.contains(&id))
    }

    /// Finishes what `path` names: a trace file, a run's directory, or a
    /// directory of runs. An error when it is none of them.
    pub fn finish_path(&mut self, path: &Path) -> anyhow::Result<()> {
        let meta = std::fs::metadata(path).with_context(|| path.display().to_string())?;
        if meta.is_dir() {
            if self.finish_under(path)? == 0 {
                bail!(
                    "{}: neither a run of `trace --rotate` (part-NNNNNN.db files) nor a directory of runs or of the gpusleuth-*.db files `trace` names itself",
                    path.display()
                );
            }
        } else if let Some(dir) = run_of_file(path)? {
            // A run's file given alone is finished as a file of its run.
            if !self.skipped(&dir) {
                self.finish_run(&dir, Some(path))?;
            }
        } else if !self.skipped(path) {
            self.finish_file(path);
        }
        Ok(())
    }

    /// Finishes a trace file of its own (not a run's).
    fn finish_file(&mut self, file: &Path) {
        let opened = (self.open)(file);
        self.finish_one(file, opened, None);
    }

    /// Finishes the run `dir` is, or the runs and trace files directly
    /// under it; how many it found (those left out included).
    pub fn finish_under(&mut self, dir: &Path) -> anyhow::Result<usize> {
        let found = traces_under(dir)?;
        for t in &found {
            match t {
                Found::Run(run) if !self.skipped(run) => self.finish_run(run, None)?,
                Found::File(file) if !self.skipped(file) => self.finish_file(file),
                _ => {}
            }
        }
        Ok(found.len())
    }

    /// Finishes the unfinished files of run `dir` in order (only `only` when
    /// given): the first starts a new chain of the run's ledger (the one its
    /// tracer carried died with it) and the next ones continue it.
    fn finish_run(&mut self, dir: &Path, only: Option<&Path>) -> anyhow::Result<()> {
        let files = sleuth_store::run::run_files(dir)?;
        let only = only.map(same_file_id).transpose()?;
        let mut run_id: Option<String> = None;
        let mut link: Option<RunLink> = None;
        for (n, path) in files {
            let opened = (self.open)(&path);
            if let Ok(t) = &opened {
                if let Ok(Some(id)) = sleuth_store::run_ledger::run_id_of(t) {
                    run_id = Some(id);
                }
            }
            if only.is_some_and(|id| same_file_id(&path).ok() != Some(id)) {
                continue;
            }
            if opened
                .as_ref()
                .is_ok_and(|t| t.has_rollups().unwrap_or(false))
            {
                // Complete, but left in WAL mode (a reader held it as its
                // tracer completed it): made one file where no one holds it.
                match sleuth_store::wal_has_content(&path) {
                    true => {
                        self.finish_one(&path, opened, None);
                    }
                    false => self.tally.complete += 1,
                }
                continue;
            }
            let l = match &link {
                Some(l) => l.for_file(n),
                None => RunLink::for_unfinished(
                    run_id.as_deref(),
                    n,
                    "the tracer that wrote it stopped before completing it: finished by `gpusleuth finish`",
                ),
            };
            if self.finish_one(&path, opened, Some(&l)) {
                link = Some(l);
            }
        }
        if only.is_none() {
            self.remove_started_files(dir);
        }
        Ok(())
    }

    /// Removes the hidden files a tracer killed as it started a file left in
    /// run `dir` (`.part-N.db.creating-PID`: a file is written there first,
    /// then named; nothing recorded is ever in one), unless a process has one
    /// open (a tracer starting a file now).
    fn remove_started_files(&mut self, dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with(".part-") && name.contains(".db.creating-")) {
                continue;
            }
            let path = e.path();
            // Its creator's pid ends its name (`.creating-PID`).
            let creator = name
                .rsplit_once(".db.creating-")
                .and_then(|(_, pid)| pid.parse::<u32>().ok());
            let unheld =
                writer_check(holders(&path), creator, pid_alive).is_ok_and(|h| h.is_empty());
            if unheld && std::fs::remove_file(&path).is_ok() {
                self.tally.removed += 1;
            }
        }
    }

    /// Finishes the file at `path` (`opened`: the trace opened on it with the
    /// readers' checks, or why it could not be); whether it was completed
    /// now. Its outcome is said and counted.
    fn finish_one(
        &mut self,
        path: &Path,
        opened: Result<Trace, StoreError>,
        link: Option<&RunLink>,
    ) -> bool {
        let path_text = path.display().to_string();
        let shown = crate::term_text::terminal_safe(&path_text);
        let tracer = opened.as_ref().ok().and_then(Trace::tracer_pid);
        match writer_check(holders(path), tracer, pid_alive) {
            Ok(h) if h.is_empty() => {}
            Ok(h) => {
                let who: Vec<String> = h
                    .iter()
                    .map(|(pid, comm)| format!("{comm} ({pid})"))
                    .collect();
                let who = who.join(", ");
                (self.say)(Said::Info(format!(
                    "{shown}: open in {}: left as it is (a tracer still writing or completing it finishes it itself)",
                    crate::term_text::terminal_safe(&who)
                )));
                self.tally.in_use += 1;
                return false;
            }
            Err(why) => {
                (self.say)(Said::Error(format!("{shown}: {why}")));
                self.tally.failed += 1;
                return false;
            }
        }
        // The disk space a killed tracer set aside beside it
        // (`sleuth_store::disk_reserve`): nothing recorded is in it.
        self.tally.removed += sleuth_store::disk_reserve::remove_stale(path);
        let start = Instant::now();
        match opened.and_then(|t| sleuth_store::finish::finish(t, link)) {
            Ok(Finished::Completed {
                calls,
                culprit_rows,
            }) => {
                (self.say)(Said::Finished(format!(
                    "{shown}: finished ({calls} calls, {culprit_rows} culprit rows) in {:.1} s",
                    start.elapsed().as_secs_f64()
                )));
                self.tally.finished += 1;
                true
            }
            Ok(Finished::AlreadyComplete) => {
                (self.say)(Said::Info(format!("{shown}: already complete")));
                self.tally.complete += 1;
                false
            }
            Err(e) => {
                let msg = e.to_string();
                (self.say)(Said::Error(
                    crate::term_text::terminal_safe(&msg).into_owned(),
                ));
                self.tally.failed += 1;
                false
            }
        }
    }
}

/// A live process writing the trace file `path` (a tracer recording or
/// completing it), if one is known: by the processes holding it open, or,
/// where their open files cannot be read, by the tracer pid the file
/// stores. `trace --force` never removes such a file (round 50: a second
/// tracer's `--force` removed a live run's files and the first tracer
/// recorded into nothing).
pub fn live_writer(path: &Path) -> Option<(u32, String)> {
    let held = match holders(path) {
        Ok(h) => Ok(h),
        Err(e) => {
            let tracer = Trace::open(path).ok().and_then(|t| t.tracer_pid());
            writer_check(Err(e), tracer, pid_alive)
        }
    };
    held.ok()?.into_iter().next()
}

/// The processes that hold the file (`holders`), or, where other
/// processes' open files cannot be read (a tracer holding the deploy
/// files' capabilities but not root's `CAP_DAC_READ_SEARCH`: every other
/// user's `/proc/PID/fd` is closed to it), the file's own tracer (`tracer`,
/// its stored pid) while `alive` says it runs: the process that may still
/// write or complete it. A file that names no tracer stays an error there.
fn writer_check(
    holders: Result<Vec<(u32, String)>, String>,
    tracer: Option<u32>,
    alive: impl Fn(u32) -> bool,
) -> Result<Vec<(u32, String)>, String> {
    match (holders, tracer) {
        (Err(_), Some(pid)) if alive(pid) => Ok(vec![(pid, "its tracer".to_string())]),
        (Err(_), Some(_)) => Ok(Vec::new()),
        (h, _) => h,
    }
}

/// Whether process `pid` runs (this one aside: a stored pid equal to ours
/// was an earlier process's, in another pid namespace or before a reuse;
/// a zombie, killed and not yet reaped, writes nothing: `procinfo::alive`).
/// Any other process with that pid counts: a reused pid only delays the
/// finish.
fn pid_alive(pid: u32) -> bool {
    pid != std::process::id() && crate::procinfo::alive(pid)
}

/// What a directory given to finish holds.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Run(PathBuf),
    File(PathBuf),
}

/// `dir` itself when it holds a run's files, else the runs directly under
/// it and the trace files `trace` named itself there (`gpusleuth-*.db`),
/// sorted by name.
fn traces_under(dir: &Path) -> anyhow::Result<Vec<Found>> {
    if !sleuth_store::run::run_files(dir)?.is_empty() {
        return Ok(vec![Found::Run(dir.to_path_buf())]);
    }
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let e = e?;
        let p = e.path();
        // Symbolic links are not followed: a directory of runs lists its own.
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.is_dir() && !sleuth_store::run::run_files(&p)?.is_empty() {
            found.push(Found::Run(p));
        } else if m.is_file() && is_default_trace_name(&e.file_name().to_string_lossy()) {
            found.push(Found::File(p));
        }
    }
    found.sort_by(|a, b| found_path(a).cmp(found_path(b)));
    Ok(found)
}

fn found_path(f: &Found) -> &Path {
    match f {
        Found::Run(p) | Found::File(p) => p,
    }
}

/// A name `trace` gives a file of its own without `--db`
/// (`gpusleuth-YYYYMMDD-HHMMSS.db`, `-2.db`, ...): other files in a
/// directory of runs are not taken for traces.
fn is_default_trace_name(name: &str) -> bool {
    name.strip_prefix("gpusleuth-")
        .and_then(|rest| rest.strip_suffix(".db"))
        .is_some_and(|stamp| {
            !stamp.is_empty() && stamp.bytes().all(|b| b.is_ascii_digit() || b == b'-')
        })
}

/// The run directory `file` is one of the files of, if any.
fn run_of_file(file: &Path) -> anyhow::Result<Option<PathBuf>> {
    let Some(dir) = file.parent().map(|d| {
        if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        }
    }) else {
        return Ok(None);
    };
    let me = same_file_id(file)?;
    for (_, p) in sleuth_store::run::run_files(dir).unwrap_or_default() {
        if same_file_id(&p).ok() == Some(me) {
            return Ok(Some(dir.to_path_buf()));
        }
    }
    Ok(None)
}

fn same_file_id(p: &Path) -> anyhow::Result<(u64, u64)> {
    let m = std::fs::metadata(p).with_context(|| p.display().to_string())?;
    Ok((m.dev(), m.ino()))
}

/// The processes (pid, comm) that have the trace file, its `-wal` or its
/// `-shm` open, this one aside; an error when some processes' open files
/// cannot be read (then whether a tracer still writes it is not known).
pub fn holders(path: &Path) -> Result<Vec<(u32, String)>, String> {
    let mut ids = Vec::new();
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        if let Ok(m) = std::fs::metadata(&p) {
            ids.push((m.dev(), m.ino()));
        }
    }
    let me = std::process::id();
    let mut found = Vec::new();
    let mut unreadable = 0usize;
    let procs = std::fs::read_dir("/proc").map_err(|e| format!("cannot list /proc: {e}"))?;
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let fds = match std::fs::read_dir(e.path().join("fd")) {
            Ok(fds) => fds,
            Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
                unreadable += 1;
                continue;
            }
            // Exited meanwhile, or a kernel thread.
            Err(_) => continue,
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::metadata(fd.path()).is_ok_and(|m| ids.contains(&(m.dev(), m.ino())))
        });
        if holds {
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            found.push((pid, comm.trim().to_string()));
        }
    }
    if unreadable > 0 && found.is_empty() {
        return Err(format!(
            "the open files of {unreadable} processes are not readable, so whether a tracer still writes this file is not known (run as root)"
        ));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn where_open_files_cannot_be_read_the_files_own_tracer_decides() {
        let alive = |pid: u32| pid == 42;
        let unreadable = || Err::<Vec<(u32, String)>, String>("not readable".into());
        // Readable: the processes found decide, whatever the tracer.
        assert_eq!(writer_check(Ok(vec![]), Some(42), alive), Ok(vec![]));
        let held = vec![(7, "gpusleuth".to_string())];
        assert_eq!(writer_check(Ok(held.clone()), Some(9), alive), Ok(held));
        // Not readable: the file's tracer, alive, holds it; gone, no one does.
        assert_eq!(
            writer_check(unreadable(), Some(42), alive),
            Ok(vec![(42, "its tracer".to_string())])
        );
        assert_eq!(writer_check(unreadable(), Some(9), alive), Ok(vec![]));
        // A file that names no tracer: not known.
        assert!(writer_check(unreadable(), None, alive).is_err());
        // This process's pid is never "alive" as another's tracer.
        assert!(!pid_alive(std::process::id()));
        // A running process is; once it exited (a zombie until reaped), not.
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        assert!(pid_alive(child.id()));
        let zombie = || {
            procfs::process::Process::new(child.id() as i32)
                .and_then(|p| p.stat())
                .is_ok_and(|s| s.state == 'Z')
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !zombie() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(zombie(), "the child exited and is not reaped yet");
        assert!(!pid_alive(child.id()));
        child.wait().unwrap();
    }

    #[test]
    fn only_the_names_trace_gives_are_taken_for_traces_in_a_directory_of_runs() {
        for yes in [
            "gpusleuth-20261206-171500.db",
            "gpusleuth-20261206-171500-2.db",
        ] {
            assert!(is_default_trace_name(yes), "{yes}");
        }
        for no in [
            "gpusleuth-.db",
            "gpusleuth-x.db",
            "other.db",
            "gpusleuth-20261206.db-wal",
            "gpusleuth-20261206-171500.db.creating-4",
        ] {
            assert!(!is_default_trace_name(no), "{no}");
        }
    }
}
