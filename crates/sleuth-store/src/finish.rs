//! Completing a file whose tracer stopped before completing it
//! (`gpusleuth finish`, issue 16 round 48).
//!
//! A tracer killed (SIGKILL, the OOM killer, a node that went down) leaves
//! its file with every committed batch but none of what the completion
//! writes: no rollups, call groups, finding aggregates, ledger or allocator
//! views. Every reader then streams the whole file (a 3.5M-call file: 12 s
//! per `explain`), and a reader of a `--rotate` run leaves it out of the
//! run's answers altogether. The completion needs one thing the file does
//! not hold: the windows the writer kept in memory for each calling thread
//! (`Rollup`). They are made again here from the call rows in the order the
//! writer stored them (row ids follow the order calls reached it, and it
//! added each stored call to its windows as it stored it), so the windows,
//! and with them every answer, are the ones the tracer's own completion
//! would have given; the windows it had set aside at processes' exits
//! (`thread_windows`) are dropped first, as they are part of the same rows.
//! Then the tracer's own completion runs ([`crate::finalize::complete`]) in
//! one transaction: a failure leaves the file as it was.
//!
//! What the killed tracer held otherwise is not in the file and stays
//! missing: the counters of its last uncommitted batch, its end time
//! (`session.end_mono_ns` stays NULL) and, for a file of a run, the run's
//! ledger it carried from the previous file: the file starts a new chain
//! (noted; readers replay the memory calls of a run read across it), and
//! the run's next unfinished files finished with the same [`RunLink`]
//! continue it.

use crate::finalize;
use crate::open::short;
use crate::reader::Trace;
use crate::rows::{call_from_row_by_op_id, OpIds};
use crate::run_ledger::RunLink;
use crate::{StoreError, TraceSource, SCHEMA_VERSION};
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use sleuth_core::rollup::Rollup;
use std::path::Path;

/// What [`finish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// The file was completed: its call rows and the culprit rows written.
    Completed { calls: u64, culprit_rows: u64 },
    /// The file already holds what its completion writes (nothing done).
    AlreadyComplete,
}

/// Why a file cannot be finished, before anything is written: a one-line
/// reason, or None when it can.
fn refusal(trace: &Trace) -> Result<Option<String>, StoreError> {
    if trace.source() != TraceSource::Gpusleuth {
        return Ok(Some(
            "imported from another tool: it is read from its rows (finish completes gpusleuth's own traces)"
                .into(),
        ));
    }
    if !trace.merge_nodes()?.is_empty() {
        return Ok(Some(
            "a merged trace: it is read from its rows (finish completes the files a tracer wrote)"
                .into(),
        ));
    }
    if trace.version() != SCHEMA_VERSION {
        return Ok(Some(format!(
            "written by an older gpusleuth (schema version {}; this build completes version {SCHEMA_VERSION}): it is read from its rows",
            trace.version()
        )));
    }
    Ok(None)
}

/// Whether `trace` is a file its tracer did not complete that [`finish`]
/// can complete: a gpusleuth trace of this schema without its rollups
/// (still being written, or its tracer was killed). Not an imported, a
/// merged or an older file, which are read from their rows by design.
pub fn unfinished(trace: &Trace) -> Result<bool, StoreError> {
    Ok(!trace.has_rollups()? && refusal(trace)?.is_none())
}

/// Completes the trace file `trace` was opened on (as every reader opens
/// one, with its checks), left unfinished by its tracer, as that tracer's
/// completion would have (`link`: the file's place in a `--rotate` run,
/// None for a file of its own). The caller makes sure no process has the
/// file open: a tracer still writing it, or completing it, would find it
/// changed under it.
pub fn finish(trace: Trace, link: Option<&RunLink>) -> Result<Finished, StoreError> {
    let path = &trace.path().to_path_buf();
    if trace.has_rollups()? {
        drop(trace);
        fold_wal(path)?;
        return Ok(Finished::AlreadyComplete);
    }
    if let Some(why) = refusal(&trace)? {
        return Err(StoreError::file(path, why));
    }
    // The call and wait tables' checks too: the completion reads every
    // row, so it reads only what they passed.
    trace.bulk()?;
    // Readers skip rows no tracer writes (damage, crafting) and say so; the
    // completion trusts its tracer's rows, and rollups made of such rows
    // would be refused by every reader: the file stays read from its rows.
    let problems = trace.input_problems()?;
    if !problems.is_empty() {
        return Err(StoreError::file(
            path,
            format!(
                "holds rows no tracer writes ({}): left as it is, read from its rows",
                problems.lines().join("; ")
            ),
        ));
    }
    drop(trace);
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::file(path, format!("cannot open to write: {}", short(&e))))?;
    crate::open::harden(&conn).map_err(|e| sqlite(path, e))?;
    // Another `finish` (a user's, or a restarted tracer's `--finish-killed`)
    // may be completing the file: its transaction is waited for, then the
    // file is found complete.
    conn.busy_timeout(WAIT_FOR_ANOTHER)
        .map_err(|e| sqlite(path, e))?;
    let (rollup, calls) = windows_from_rows(&conn).map_err(|e| sqlite(path, e))?;
    // One transaction: a failure leaves the file as the tracer left it.
    let done = finalize::complete_after(&mut conn, &rollup, link, |tx| {
        // Under the write lock: completed since it was opened above, the
        // file is left as it is (completed twice, its rollups would count
        // every call twice).
        if crate::reader::rollups_complete(tx)? {
            return Ok(false);
        }
        crate::thread_windows::drop_table(tx)?;
        let counted = counts_from_samples(tx)?;
        note_finished(tx, counted)?;
        Ok(true)
    })
    .map_err(|e| sqlite(path, e))?;
    let Some(culprit_rows) = done else {
        return Ok(Finished::AlreadyComplete);
    };
    // One self-contained file, as the tracer leaves it (where a reader
    // holds it, complete in WAL mode: the next finish folds it).
    crate::writer::leave_wal(&conn).map_err(|e| sqlite(path, e))?;
    Ok(Finished::Completed {
        calls,
        culprit_rows,
    })
}

/// A complete file its tracer left in WAL mode (a reader held it as the
/// trace ended) made one file again; one without a `-wal` is not opened.
fn fold_wal(path: &Path) -> Result<(), StoreError> {
    if !crate::open::wal_has_content(path) {
        return Ok(());
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::file(path, format!("cannot open to write: {}", short(&e))))?;
    crate::open::harden(&conn).map_err(|e| sqlite(path, e))?;
    crate::writer::leave_wal(&conn).map_err(|e| sqlite(path, e))?;
    Ok(())
}

/// How long a `finish` waits for another one's transaction on the same
/// file: a tracer's completion of a 512 MiB file takes tens of seconds.
const WAIT_FOR_ANOTHER: std::time::Duration = std::time::Duration::from_secs(600);

fn sqlite(path: &Path, e: rusqlite::Error) -> StoreError {
    StoreError::Sqlite {
        path: path.to_path_buf(),
        source: e,
    }
}

/// Every calling thread's windows, as the writer made them: each stored
/// call added in row-id order (the order the writer stored them); and the
/// number of call rows.
fn windows_from_rows(conn: &Connection) -> rusqlite::Result<(Rollup, u64)> {
    let op_ids = OpIds::of(conn)?;
    let sql = crate::stream::own_calls_sql_by_op_id("ORDER BY id");
    let mut st = conn.prepare(&sql)?;
    let mut rows = st.query([])?;
    let mut rollup = Rollup::default();
    let mut n = 0u64;
    while let Some(row) = rows.next()? {
        n += 1;
        // A row of an op this build does not know was not stored by it.
        if let Some(s) = call_from_row_by_op_id(row, &op_ids)? {
            rollup.add_call(&s.call);
        }
    }
    Ok((rollup, n))
}

/// How the note [`note_finished`] stores begins.
const FINISHED_NOTE: &str = "finished by `gpusleuth finish`";

/// The note [`finish`] stored in `trace` (who completed it and what it
/// lacks), None for a file its tracer completed: every answer over the
/// file says it (round 53's tester: only `stats` did).
pub fn finished_note(trace: &Trace) -> Result<Option<String>, StoreError> {
    let sql = "SELECT text FROM notes WHERE level = 'warn' AND substr(text, 1, ?1) = ?2 LIMIT 1";
    trace
        .keyed()
        .query_row(
            sql,
            rusqlite::params![FINISHED_NOTE.len() as i64, FINISHED_NOTE],
            |r| r.get::<_, String>(0),
        )
        .optional()
        .map_err(|e| trace.read_error(e))
}

/// The note that says who completed the file and what it lacks.
fn note_finished(conn: &Connection, counted: bool) -> rusqlite::Result<()> {
    let mut text = format!(
        "{FINISHED_NOTE}: its tracer stopped before completing it (killed?); \
         what it had not committed is not here, and its end time is not known"
    );
    if counted {
        text.push_str(
            "; the calls counted in the kernel (launches) are their counts at its last sample \
             (every 200 ms): those counted after it are not here",
        );
    }
    crate::writer::insert_note(
        conn,
        crate::file_clock::now_on_file_clock(conn)?,
        crate::NoteLevel::Warn.as_str(),
        &text,
    )
}

/// The kernel-counted calls of a killed tracer's file: their totals
/// (`op_counts`) are stored at the file's end, which it never reached, but
/// the running count of each (process, op) was sampled every 200 ms since
/// the file began (`op_count_samples`): the latest sample of each is its
/// total up to then. Before round 50 a finished file counted no launch at
/// all (0 in `stats`, no `launch_bound`). Whether any was taken.
fn counts_from_samples(tx: &Connection) -> rusqlite::Result<bool> {
    let stored: i64 = tx.query_row("SELECT count(*) FROM op_counts", [], |r| r.get(0))?;
    if stored > 0 || !crate::open::has_table(tx, "op_count_samples")? {
        return Ok(false);
    }
    let n = tx.execute(
        "INSERT OR IGNORE INTO op_counts(pid, layer, op, count)
         SELECT s.pid, o.layer, s.op, max(s.count)
         FROM op_count_samples s JOIN ops o ON o.op = s.op
         WHERE s.count > 0
         GROUP BY s.pid, s.op",
        [],
    )?;
    Ok(n > 0)
}
