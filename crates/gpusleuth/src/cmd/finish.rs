//! `gpusleuth finish --db PATH`: completes the trace files a tracer left
//! unfinished (killed before its file's completion: SIGKILL, the OOM
//! killer, a node that went down), so that every command answers from the
//! stored rollups instead of a pass over every row, and a run's answers
//! include the file again (`sleuth_store::finish`).
//!
//! PATH is a trace file, a `trace --rotate` run's directory (each of its
//! unfinished files, in order), or a directory of runs (the node agent's
//! working directory: every run under it). A file some process has open is
//! left alone: a tracer still writing it, or completing it, owns it.

use anyhow::{bail, Context};
use sleuth_store::finish::Finished;
use sleuth_store::run_ledger::RunLink;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// A trace file, a `trace --rotate` run's directory, or a directory of
    /// runs (every run under it); may be given several times.
    #[arg(long, required = true)]
    db: Vec<PathBuf>,
}

/// What became of the files: the exit code is 1 when one could not be
/// finished (its error printed), 0 otherwise.
#[derive(Default)]
struct Tally {
    finished: usize,
    complete: usize,
    in_use: usize,
    failed: usize,
    /// Hidden files of a file's start removed.
    removed: usize,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let mut tally = Tally::default();
    for path in &args.db {
        let meta = std::fs::metadata(path).with_context(|| path.display().to_string())?;
        if meta.is_dir() {
            let runs = runs_under(path)?;
            if runs.is_empty() {
                bail!(
                    "{}: neither a run of `trace --rotate` (part-NNNNNN.db files) nor a directory of runs",
                    path.display()
                );
            }
            for run in runs {
                finish_run(&run, None, &mut tally)?;
            }
        } else if let Some(dir) = run_of_file(path)? {
            // A run's file given alone is finished as a file of its run.
            finish_run(&dir, Some(path), &mut tally)?;
        } else {
            finish_one(path, crate::checks_memo::open(path), None, &mut tally);
        }
    }
    println!(
        "{} finished, {} already complete, {} in use (left as they are), {} failed",
        tally.finished, tally.complete, tally.in_use, tally.failed
    );
    if tally.removed > 0 {
        println!(
            "{} hidden file(s) of a killed tracer's file start removed (they held nothing recorded)",
            tally.removed
        );
    }
    Ok(if tally.failed > 0 { 1 } else { 0 })
}

/// `dir` itself when it holds a run's files, else the runs directly under
/// it (sorted by name).
fn runs_under(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !sleuth_store::run::run_files(dir)?.is_empty() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut runs = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let p = e?.path();
        // Symbolic links are not followed: a directory of runs lists its own.
        let is_dir = std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir());
        if is_dir && !sleuth_store::run::run_files(&p)?.is_empty() {
            runs.push(p);
        }
    }
    runs.sort();
    Ok(runs)
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

/// Finishes the unfinished files of run `dir` in order (only `only` when
/// given): the first starts a new chain of the run's ledger (the one its
/// tracer carried died with it) and the next ones continue it.
fn finish_run(dir: &Path, only: Option<&Path>, tally: &mut Tally) -> anyhow::Result<()> {
    let files = sleuth_store::run::run_files(dir)?;
    let only = only.map(same_file_id).transpose()?;
    let mut run_id: Option<String> = None;
    let mut link: Option<RunLink> = None;
    for (n, path) in files {
        let opened = crate::checks_memo::open(&path);
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
            tally.complete += 1;
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
        if finish_one(&path, opened, Some(&l), tally) {
            link = Some(l);
        }
    }
    if only.is_none() {
        remove_started_files(dir, tally);
    }
    Ok(())
}

/// Removes the hidden files a tracer killed as it started a file left in
/// run `dir` (`.part-N.db.creating-PID`: a file is written there first,
/// then named; nothing recorded is ever in one), unless a process has one
/// open (a tracer starting a file now).
fn remove_started_files(dir: &Path, tally: &mut Tally) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with(".part-") && name.contains(".db.creating-")) {
            continue;
        }
        let path = e.path();
        if holders(&path).is_ok_and(|h| h.is_empty()) && std::fs::remove_file(&path).is_ok() {
            tally.removed += 1;
        }
    }
}

/// Finishes the file at `path` (`opened`: the trace opened on it with the
/// readers' checks, or why it could not be); whether it was completed
/// now. Its outcome is printed and counted.
fn finish_one(
    path: &Path,
    opened: Result<sleuth_store::Trace, sleuth_store::StoreError>,
    link: Option<&RunLink>,
    tally: &mut Tally,
) -> bool {
    let path_text = path.display().to_string();
    let shown = crate::term_text::terminal_safe(&path_text);
    match holders(path) {
        Ok(h) if h.is_empty() => {}
        Ok(h) => {
            let who: Vec<String> = h
                .iter()
                .map(|(pid, comm)| format!("{comm} ({pid})"))
                .collect();
            let who = who.join(", ");
            println!(
                "{shown}: open in {}: left as it is (a tracer still writing or completing it finishes it itself)",
                crate::term_text::terminal_safe(&who)
            );
            tally.in_use += 1;
            return false;
        }
        Err(why) => {
            eprintln!("gpusleuth: error: {shown}: {why}");
            tally.failed += 1;
            return false;
        }
    }
    let start = Instant::now();
    match opened.and_then(|t| sleuth_store::finish::finish(t, link)) {
        Ok(Finished::Completed {
            calls,
            culprit_rows,
        }) => {
            println!(
                "{shown}: finished ({calls} calls, {culprit_rows} culprit rows) in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            tally.finished += 1;
            true
        }
        Ok(Finished::AlreadyComplete) => {
            println!("{shown}: already complete");
            tally.complete += 1;
            false
        }
        Err(e) => {
            let msg = e.to_string();
            eprintln!(
                "gpusleuth: error: {}",
                crate::term_text::terminal_safe(&msg)
            );
            tally.failed += 1;
            false
        }
    }
}

/// The processes (pid, comm) that have the trace file, its `-wal` or its
/// `-shm` open, this one aside; an error when some processes' open files
/// cannot be read (then whether a tracer still writes it is not known).
fn holders(path: &Path) -> Result<Vec<(u32, String)>, String> {
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
    use crate::temp_dir::TempDir;
    use crate::trace_fixture::{rewrite_leaving_unfinished, two_processes};

    fn finished(p: &Path) -> bool {
        sleuth_store::Trace::open(p).unwrap().has_rollups().unwrap()
    }

    #[test]
    fn a_file_is_finished_unless_a_process_has_it_open() {
        // Whether another process holds the file is known only to root
        // (other users' open files are not readable): CI runs as root.
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            crate::skip::skip_unless_ci(
                "finish's command test",
                "not root (other processes' open files are not readable)",
            );
            return;
        }
        let dir = TempDir::new("finish_cmd");
        let (done, killed) = (dir.join("done.db"), dir.join("killed.db"));
        let opts = sleuth_store::WriterOptions::default();
        rewrite_leaving_unfinished(&two_processes(), &done, opts, &killed);
        assert!(!finished(&killed));
        // Another process holds it (as a tracer still writing it would):
        // left as it is, and not a failure.
        let mut holder = std::process::Command::new("sleep")
            .arg("60")
            .stdin(std::fs::File::open(&killed).unwrap())
            .spawn()
            .unwrap();
        assert_eq!(
            holders(&killed).unwrap(),
            vec![(holder.id(), "sleep".to_string())]
        );
        let before = std::fs::read(&killed).unwrap();
        let args = || Args {
            db: vec![killed.clone()],
        };
        assert_eq!(run(args()).unwrap(), 0);
        assert_eq!(std::fs::read(&killed).unwrap(), before, "untouched");
        holder.kill().unwrap();
        holder.wait().unwrap();
        // Let go of, it is finished; a second run finds it complete.
        assert_eq!(run(args()).unwrap(), 0);
        assert!(finished(&killed));
        let again = std::fs::read(&killed).unwrap();
        assert_eq!(run(args()).unwrap(), 0);
        assert_eq!(std::fs::read(&killed).unwrap(), again);
        // What cannot be finished is a failure (exit 1), the rest still done.
        let junk = dir.join("junk.db");
        std::fs::write(&junk, b"not a trace").unwrap();
        assert_eq!(
            run(Args {
                db: vec![junk, done.clone()]
            })
            .unwrap(),
            1
        );
        assert!(run(Args {
            db: vec![dir.join("missing.db")]
        })
        .is_err());
        // A run whose tracer was killed as it started its second file: the
        // hidden file it was writing is removed, the run's file is kept.
        let run_dir = dir.join("run");
        std::fs::create_dir(&run_dir).unwrap();
        std::fs::copy(&done, run_dir.join("part-000001.db")).unwrap();
        let started = run_dir.join(".part-000002.db.creating-4242");
        std::fs::write(&started, b"schema only").unwrap();
        assert_eq!(
            run(Args {
                db: vec![run_dir.clone()]
            })
            .unwrap(),
            0
        );
        assert!(!started.exists());
        assert!(run_dir.join("part-000001.db").exists());
    }
}
