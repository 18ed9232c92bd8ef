//! `gpusleuth finish --db PATH`: completes the trace files a tracer left
//! unfinished (killed before its file's completion: SIGKILL, the OOM
//! killer, a node that went down); the work is `crate::finishing`'s, which
//! `trace --finish-killed` shares.
//!
//! PATH is a trace file, a `trace --rotate` run's directory (each of its
//! unfinished files, in order), or a directory of runs (the node agent's
//! working directory: every run under it, and the files `trace` named
//! itself there). A file some process has open is left alone: a tracer
//! still writing it, or completing it, owns it.

use crate::finishing::{Finisher, Said};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// A trace file, a `trace --rotate` run's directory, or a directory of
    /// runs (every run under it, and the `gpusleuth-*.db` files `trace`
    /// named itself there); may be given several times.
    #[arg(long, required = true)]
    db: Vec<PathBuf>,
}

/// The exit code is 1 when a file could not be finished (its error
/// printed), 0 otherwise.
pub fn run(args: Args) -> anyhow::Result<i32> {
    // A stdout that cannot be written stops no finish (the files are the
    // work); its first error is the command's once they are done.
    let mut unwritten: Option<anyhow::Error> = None;
    let mut say = |s: Said| match s {
        Said::Finished(line) | Said::Info(line) => {
            if let Err(e) = outln!("{line}") {
                unwritten.get_or_insert(e);
            }
        }
        Said::Error(line) => eprintln!("gpusleuth: error: {line}"),
    };
    let mut finisher = Finisher::new(crate::checks_memo::open, &mut say);
    for path in &args.db {
        finisher.finish_path(path)?;
    }
    let tally = finisher.tally;
    if let Some(e) = unwritten {
        return Err(e);
    }
    outln!("{}", tally.summary())?;
    Ok(if tally.failed > 0 { 1 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finishing::holders;
    use crate::temp_dir::TempDir;
    use crate::trace_fixture::{rewrite_leaving_unfinished, two_processes};
    use std::path::Path;

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
        rewrite_leaving_unfinished(&two_processes(), &done, opts.clone(), &killed);
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
        // The disk space its killed tracer set aside (`disk_reserve`) goes
        // with the finish; a live tracer's stays.
        let reserve = dir.join(".killed.db.reserve-4194303");
        let live_reserve = dir.join(&format!(".killed.db.reserve-{}", std::process::id()));
        std::fs::write(&reserve, b"x").unwrap();
        std::fs::write(&live_reserve, b"x").unwrap();
        // Let go of, it is finished; a second run finds it complete.
        assert_eq!(run(args()).unwrap(), 0);
        assert!(finished(&killed));
        assert!(!reserve.exists() && live_reserve.exists());
        std::fs::remove_file(&live_reserve).unwrap();
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
        // A directory of runs: its runs and the files `trace` named itself
        // there; other files are not taken for traces.
        let runs = dir.join("runs");
        std::fs::create_dir(&runs).unwrap();
        let named = runs.join("gpusleuth-20261206-010203.db");
        rewrite_leaving_unfinished(&two_processes(), &dir.join("done2.db"), opts, &named);
        std::fs::write(runs.join("other.db"), b"not a trace").unwrap();
        std::fs::rename(&run_dir, runs.join("run")).unwrap();
        assert!(!finished(&named));
        assert_eq!(
            run(Args {
                db: vec![runs.clone()]
            })
            .unwrap(),
            0
        );
        assert!(finished(&named));
        assert_eq!(
            std::fs::read(runs.join("other.db")).unwrap(),
            b"not a trace"
        );
    }
}
