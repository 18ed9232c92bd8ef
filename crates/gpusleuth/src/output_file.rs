//! Where a command may write its `-o` file: `sleuth_store::outfile`'s
//! rules (never an input, only a regular file, an existing one only with
//! `--force`) and, here because the processes holding a file are this
//! crate's to find (`finishing::live_writer`), never over a trace that a
//! live tracer is still recording or completing (`report`, `export`,
//! `merge`; `trace --force` refuses any trace a live process holds).

use anyhow::Result;
use sleuth_store::outfile::Hint;
use std::io::Read as _;
use std::path::Path;

/// `sleuth_store::outfile::check_output`, and with `replace` never a trace
/// a live tracer has not completed: `report -o t.db --force` replaced a
/// trace its tracer was still recording (round 60's tester: the tracer
/// then failed to complete it and the recording was gone, exit 0).
pub fn check_output(dst: &Path, inputs: &[&Path], replace: bool, hint: Hint) -> Result<()> {
    sleuth_store::outfile::check_output(dst, inputs, replace, hint)?;
    if replace {
        refuse_live_trace(dst, "-o")?;
    }
    Ok(())
}

/// An error when `path` (named after the option `flag` that gave it) is a
/// trace not completed yet that some live process holds: its tracer,
/// still recording or completing it, would go on into a file no name
/// leads to. A complete trace (its rollups stored) that a reader holds,
/// and any file that is not a SQLite database (a report a viewer holds),
/// is replaced: the reader keeps the old file.
pub fn refuse_live_trace(path: &Path, flag: &str) -> Result<()> {
    if !is_sqlite_file(path) {
        return Ok(());
    }
    // Its rollups stored is not the end of a completion: the tracer still
    // folds the WAL and leaves WAL mode, and `report -o --force` went
    // through then (round 60's second tester): a file its own tracer
    // holds is refused whatever it holds.
    let (complete, tracer) = match sleuth_store::Trace::open(path) {
        Ok(t) => (t.has_rollups().unwrap_or(false), t.tracer_pid()),
        Err(_) => (false, None),
    };
    if !complete {
        return refuse_live_writer(path, flag);
    }
    let by_tracer = crate::finishing::holders(path)
        .unwrap_or_default()
        .into_iter()
        .find(|(pid, _)| Some(*pid) == tracer);
    match by_tracer {
        Some((pid, comm)) => Err(refusal(path, flag, pid, &comm)),
        None => Ok(()),
    }
}

/// An error when a live process holds the trace file `path` (named after
/// the option `flag` that gave it): `trace --force` never replaces a trace
/// while a tracer records or completes it (round 50).
pub fn refuse_live_writer(path: &Path, flag: &str) -> Result<()> {
    match crate::finishing::live_writer(path) {
        Some((pid, comm)) => Err(refusal(path, flag, pid, &comm)),
        None => Ok(()),
    }
}

/// The one line refusing to replace the live trace `path`, written by
/// process `pid` (`comm`).
fn refusal(path: &Path, flag: &str, pid: u32, comm: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{flag} {}: {} (pid {pid}) is writing it: refusing to replace a live trace, --force or not",
        path.display(),
        crate::term_text::terminal_safe(comm)
    )
}

/// Whether `path` begins with SQLite's header (a trace, or another
/// database): only such a file can be a live trace.
fn is_sqlite_file(path: &Path) -> bool {
    let mut head = [0u8; 16];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == b"SQLite format 3\0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::temp_dir::TempDir;

    /// A SQLite file that is no complete trace, held open by a live process
    /// (this test's child, as a tracer holds its file), is not replaced by
    /// `-o --force`; the same file with no holder, and a held file that is
    /// not a database, are.
    #[test]
    fn a_trace_a_live_process_writes_is_never_replaced() {
        let dir = TempDir::new("output-file-live");
        let db = dir.0.join("live.db");
        let html = dir.0.join("report.html");
        std::fs::write(&db, b"SQLite format 3\0and the rest of a database").unwrap();
        std::fs::write(&html, b"<!DOCTYPE html>").unwrap();
        // A process holding the file open for writing, as a tracer does.
        let mut holder = std::process::Command::new("sh")
            .arg("-c")
            .arg("exec 3>>\"$0\" 4>>\"$1\"; read line")
            .arg(&db)
            .arg(&html)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let held = |p: &Path| {
            crate::finishing::holders(p).is_ok_and(|h| h.iter().any(|(pid, _)| *pid == holder.id()))
        };
        while !held(&db) || !held(&html) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let e = check_output(&db, &[], true, None).unwrap_err().to_string();
        assert!(
            e.contains("refusing to replace a live trace") && e.contains(&holder.id().to_string()),
            "{e}"
        );
        // Not a database: a viewer holding a report does not stop `--force`.
        check_output(&html, &[], true, None).unwrap();
        // Without --force the usual refusal comes first.
        let e = check_output(&db, &[], false, None).unwrap_err().to_string();
        assert!(e.contains("already exists"), "{e}");
        drop(holder.stdin.take());
        holder.wait().unwrap();
        check_output(&db, &[], true, None).unwrap();
    }

    /// A complete trace (its rollups stored) held by a reader is replaced;
    /// held by its own tracer, still folding its WAL after the rollups
    /// were stored, it is not (round 60's second tester: `report -o
    /// --force` went through then and the recording was lost).
    #[test]
    fn a_complete_trace_its_own_tracer_holds_is_never_replaced() {
        let dir = TempDir::new("output-file-completing");
        let db = dir.0.join("done.db");
        // Written by this build's writer: complete, its rollups stored.
        crate::trace_fixture::rewrite(&crate::trace_fixture::two_processes(), &db);
        assert!(sleuth_store::Trace::open(&db)
            .unwrap()
            .has_rollups()
            .unwrap());
        let mut holder = std::process::Command::new("sh")
            .arg("-c")
            .arg("exec 3<\"$0\"; read line")
            .arg(&db)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        while !crate::finishing::holders(&db)
            .is_ok_and(|h| h.iter().any(|(p, _)| *p == holder.id()))
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // A reader: replaced.
        check_output(&db, &[], true, None).unwrap();
        // The same process named as the file's tracer: refused.
        rusqlite::Connection::open(&db)
            .unwrap()
            .execute_batch(&format!(
                "DELETE FROM stats WHERE name = '{0}'; INSERT INTO stats(name, value) VALUES ('{0}', {1})",
                sleuth_core::threads::TRACER_PID_STAT,
                holder.id()
            ))
            .unwrap();
        assert_eq!(
            sleuth_store::Trace::open(&db).unwrap().tracer_pid(),
            Some(holder.id())
        );
        let e = check_output(&db, &[], true, None).unwrap_err().to_string();
        assert!(e.contains("refusing to replace a live trace"), "{e}");
        drop(holder.stdin.take());
        holder.wait().unwrap();
    }
}
