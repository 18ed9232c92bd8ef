//! Opening a trace and writing a command's output: the one place every
//! command that reads a trace database loads it and prints to stdout.

use crate::term_text::terminal_safe;
use sleuth_store::InputProblems;
use std::path::Path;

/// What an existing output path needs (`report`, `export`).
pub const FORCE_HINT: &str = "--force replaces it";

/// The stats answer of a trace: from its rollups when it has them (no call
/// row is read), else from the whole trace loaded (older, merged, imported
/// or cut-short traces). A directory is a run of `trace --rotate`: the
/// answer merges the rollups of its finished files (`sleuth_store::run`).
pub fn stats_of(db: &Path, pid: Option<u32>) -> anyhow::Result<sleuth_core::stats::StatsReport> {
    if db.is_dir() {
        let run = sleuth_store::run::run_stats_remembered(
            db,
            pid,
            &crate::checks_memo::budget(),
            crate::checks_memo::memo(),
        )?;
        note_unfinished(&run.incomplete);
        note_finished_files(&run.files);
        note_pruned(db, &run.files);
        return Ok(run.report);
    }
    let trace = crate::checks_memo::open(db)?;
    note_if_unfinished(&trace)?;
    if let Some(r) = trace.stats_report(pid)? {
        return Ok(r);
    }
    warn_input_problems(&trace)?;
    // A large file without rollups (still being written, or its writer
    // was killed) is streamed, not loaded.
    let above = sleuth_store::scoped::STREAMED_ABOVE_ROWS;
    if let Some(r) = sleuth_store::whole_stats::streamed(&trace, pid, above)? {
        return Ok(r);
    }
    Ok(sleuth_core::stats::compute(&trace.load(pid)?))
}

/// One note on stderr when the run's oldest file read is not its first
/// (`--keep` deleted the ones before, or someone did): the counts cover
/// the files read alone (`explain` and `memory` said so; `stats` did not:
/// round 51's tester).
fn note_pruned(dir: &Path, files: &[std::path::PathBuf]) {
    if let Some(note) = pruned_note(dir, files) {
        eprintln!("gpusleuth: note: {note}");
    }
}

/// The note [`note_pruned`] prints, None when the run's first file is read.
fn pruned_note(dir: &Path, files: &[std::path::PathBuf]) -> Option<String> {
    let number = |p: &std::path::PathBuf| {
        p.file_name()
            .and_then(|n| n.to_str())
            .and_then(sleuth_store::run::part_number)
    };
    let (first, last) = (number(files.first()?)?, number(files.last()?)?);
    (first > 1).then(|| {
        format!(
            "{}: files 1 to {} of the run are no longer in the directory (deleted by --keep): these counts cover files {first} to {last}",
            terminal_safe(&dir.display().to_string()),
            first - 1
        )
    })
}

/// One note on stderr per file of a run read that `gpusleuth finish`
/// completed after its tracer was killed: what it lacks (single files say
/// it through [`note_if_unfinished`]; a run's answers said nothing: round
/// 53's tester). A file that cannot be opened again says nothing here (the
/// answer read it a moment ago; its error, if any, is the answer's).
pub fn note_finished_files(files: &[std::path::PathBuf]) {
    for f in files {
        let Ok(trace) = crate::checks_memo::open(f) else {
            continue;
        };
        if let Ok(Some(note)) = sleuth_store::finish::finished_note(&trace) {
            eprintln!(
                "gpusleuth: note: {}: {}",
                terminal_safe(&f.display().to_string()),
                terminal_safe(&note)
            );
        }
    }
}

/// One note on stderr per file of a run that an answer over the run left
/// out because it is not finished (`stats --db DIR`, `explain --db DIR`).
pub fn note_unfinished(files: &[std::path::PathBuf]) {
    for f in files {
        eprintln!(
            "gpusleuth: note: {}: not finished (still being written, or its tracer was killed: `gpusleuth finish --db` it): not in this answer",
            terminal_safe(&f.display().to_string())
        );
    }
}

/// One note on stderr when the file `trace` is not finished: still being
/// written (the answer holds what its tracer recorded so far), or left by
/// a tracer that was killed (`gpusleuth finish` completes it). A run's
/// readers said so; a single file was read without a word (round 51's
/// tester).
pub fn note_if_unfinished(trace: &sleuth_store::Trace) -> anyhow::Result<()> {
    if let Some(note) = unfinished_note(trace)? {
        NOTES_AFTER_SUCCESS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(note);
    }
    Ok(())
}

/// Notes said once the command succeeded: a command that fails says one
/// line, its error (a damaged unfinished file's note came before it).
static NOTES_AFTER_SUCCESS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Prints the notes kept for a command that succeeded, on stderr.
pub fn say_notes_after_success() {
    for note in NOTES_AFTER_SUCCESS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain(..)
    {
        eprintln!("gpusleuth: note: {note}");
    }
}

/// The note [`note_if_unfinished`] prints, None for a file its tracer
/// completed (or one read from its rows by design: imported, merged,
/// older); for one `gpusleuth finish` completed, what it lacks.
fn unfinished_note(trace: &sleuth_store::Trace) -> anyhow::Result<Option<String>> {
    let path = terminal_safe(&trace.path().display().to_string()).into_owned();
    if !sleuth_store::finish::unfinished(trace)? {
        // Completed by `finish` after its tracer was killed: what it lacks.
        let finished = sleuth_store::finish::finished_note(trace)?;
        return Ok(finished.map(|n| format!("{path}: {}", terminal_safe(&n))));
    }
    Ok(Some(match crate::finishing::live_writer(trace.path()) {
        Some((pid, comm)) => format!(
            "{path}: still being written by {} (pid {pid}): this answer holds what it recorded so far",
            terminal_safe(&comm)
        ),
        None => format!(
            "{path}: not finished (its tracer was killed: what it had not committed is lost; `gpusleuth finish --db` it to complete it): read from its rows"
        ),
    }))
}

/// Prints one warning per kind of skipped row on stderr; returns them.
pub fn warn_input_problems(trace: &sleuth_store::Trace) -> anyhow::Result<InputProblems> {
    let problems = trace.input_problems()?;
    print_problems(trace, &problems);
    Ok(problems)
}

fn print_problems(trace: &sleuth_store::Trace, problems: &InputProblems) {
    print_problems_at(trace.path(), problems);
}

/// One warning per kind of skipped row of the trace (or run) at `path`, on stderr.
pub fn print_problems_at(path: &Path, problems: &InputProblems) {
    for line in problems.lines() {
        eprintln!(
            "gpusleuth: warning: {}: {}",
            terminal_safe(&path.display().to_string()),
            terminal_safe(&line)
        );
    }
}

/// [`warn_input_problems`] for a command that answers from the stored
/// aggregates where it can: called after its reads, it counts the skipped
/// rows only when call or wait rows were read or the file is small
/// (`Trace::input_problems_of_reads`); else nothing was skipped.
pub fn warn_input_problems_of_reads(trace: &sleuth_store::Trace) -> anyhow::Result<InputProblems> {
    let problems = trace.input_problems_of_reads()?.unwrap_or_default();
    print_problems(trace, &problems);
    Ok(problems)
}

/// Writes a command's output to stdout. A closed pipe (`| head`) ends the
/// output quietly instead of panicking like `println!` would.
pub fn emit(text: &str) -> anyhow::Result<()> {
    emit_open(text).map(|_| ())
}

/// [`emit`], saying whether stdout is still open (false: the pipe was
/// closed), for output that repeats until then (`vram --watch`).
pub fn emit_open(text: &str) -> anyhow::Result<bool> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(anyhow::Error::new(e).context("writing to stdout")),
    }
}

/// [`emit`] for human text: names and notes from the trace are escaped so
/// the terminal shows control sequences instead of obeying them.
pub fn emit_text(text: &str) -> anyhow::Result<()> {
    emit(&terminal_safe(text))
}

/// [`emit`] for a JSON document: pretty, one trailing newline.
pub fn emit_json<T: serde::Serialize>(doc: &T) -> anyhow::Result<()> {
    emit(&json_text(doc)?)
}

/// The text [`emit_json`] writes.
pub fn json_text<T: serde::Serialize>(doc: &T) -> anyhow::Result<String> {
    Ok(format!("{}\n", serde_json::to_string_pretty(doc)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::temp_dir::TempDir;
    use crate::trace_fixture::{rewrite_leaving_unfinished, two_processes};

    #[test]
    fn a_run_whose_first_files_are_gone_says_so() {
        let dir = Path::new("/r");
        let files = |ns: &[u64]| -> Vec<std::path::PathBuf> {
            ns.iter()
                .map(|&n| dir.join(sleuth_store::run::part_name(n)))
                .collect()
        };
        assert_eq!(pruned_note(dir, &files(&[1, 2, 3])), None);
        let note = pruned_note(dir, &files(&[4, 5])).expect("a note");
        assert!(
            note.contains("files 1 to 3 of the run are no longer") && note.contains("files 4 to 5"),
            "{note}"
        );
        assert_eq!(pruned_note(dir, &[]), None);
    }

    /// A single file a killed tracer left was read without a word (a run's
    /// readers said so; round 51's tester); one being written is named as
    /// such; a finished one says nothing.
    #[test]
    fn an_unfinished_file_is_said_to_be() {
        let dir = TempDir::new("load_unfinished");
        let (done, killed) = (dir.join("done.db"), dir.join("killed.db"));
        let opts = sleuth_store::WriterOptions::default();
        rewrite_leaving_unfinished(&two_processes(), &done, opts, &killed);
        let note = |p: &Path| unfinished_note(&sleuth_store::Trace::open(p).unwrap()).unwrap();
        assert_eq!(note(&done), None);
        // Whether a process holds the file is known for all of them only
        // to root; another user's tracer would read as killed.
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            crate::skip::skip_unless_ci("the unfinished-file note", "not root");
            return;
        }
        let killed_note = note(&killed).expect("a note");
        assert!(
            killed_note.contains("not finished") && killed_note.contains("gpusleuth finish"),
            "{killed_note}"
        );
        let mut holder = std::process::Command::new("sleep")
            .arg("60")
            .stdin(std::fs::File::open(&killed).unwrap())
            .spawn()
            .unwrap();
        let live = note(&killed);
        holder.kill().unwrap();
        holder.wait().unwrap();
        let live = live.expect("a note");
        assert!(
            live.contains(&format!(
                "still being written by sleep (pid {})",
                holder.id()
            )),
            "{live}"
        );
    }
}
