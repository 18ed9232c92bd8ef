//! The windows of the threads of processes that exited, set aside in the
//! file until its completion (issue 16, round 46).
//!
//! The writer keeps each calling thread's windows (`rollup::ThreadWindows`:
//! first start, last end, and each op's) for the completion's per-thread
//! pass, which needs them before it reads the thread's waits. A node agent
//! tracing into one file sees thousands of short-lived processes: their
//! windows were held to the end (~0.23 KB a process of live heap). At a
//! process's exit the writer now stores its threads' windows here, one row
//! each, and the completion reads them back merged with those it still
//! holds, in (pid, tid) order ([`Merged`]), then drops the table. A pid
//! seen again after its exit (reused) has a row and an entry in memory (or
//! several rows): they are added up, earlier calls first, as one thread's
//! windows were. Readers never read this table (the schema check lists
//! only the tables it knows); a file cut short keeps it, unread.

use rusqlite::{params, Connection};
use sleuth_core::rollup::{Rollup, ThreadWindows};
use std::collections::btree_map;
use std::iter::Peekable;

const CREATE: &str = "CREATE TABLE IF NOT EXISTS thread_windows(pid INTEGER NOT NULL, tid INTEGER NOT NULL, windows TEXT NOT NULL)";

/// The writer's INSERT of one thread's windows (after [`create`]).
pub(crate) const INSERT: &str = "INSERT INTO thread_windows(pid, tid, windows) VALUES (?1, ?2, ?3)";

/// Creates the table (the writer, before its first row).
pub(crate) fn create(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(CREATE)
}

/// One thread's windows as a row's text.
pub(crate) fn encode(w: &ThreadWindows) -> rusqlite::Result<String> {
    serde_json::to_string(w).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// The rows in (pid, tid) order, earlier rows of a thread first; None when
/// no process exited (no table).
pub(crate) fn statement(conn: &Connection) -> rusqlite::Result<Option<rusqlite::Statement<'_>>> {
    if !crate::open::has_table(conn, "thread_windows")? {
        return Ok(None);
    }
    conn.prepare("SELECT pid, tid, windows FROM thread_windows ORDER BY pid, tid, rowid")
        .map(Some)
}

/// Drops the table once the completion read it.
pub(crate) fn drop_table(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute("DROP TABLE IF EXISTS thread_windows", params![])
        .map(|_| ())
}

/// Every calling thread's windows in (pid, tid) order: those set aside in
/// the file and those the writer holds, each thread's added up.
pub(crate) struct Merged<'a, 's> {
    held: Peekable<btree_map::Iter<'a, (u32, u32), ThreadWindows>>,
    rows: Option<rusqlite::Rows<'s>>,
    /// The row read past the last thread given.
    pending: Option<((u32, u32), ThreadWindows)>,
}

impl<'a, 's> Merged<'a, 's> {
    /// Over `rollup`'s windows and the rows of `set_aside` (a
    /// [`statement`]'s, None without the table).
    pub(crate) fn new(
        rollup: &'a Rollup,
        set_aside: Option<&'s mut rusqlite::Statement<'_>>,
    ) -> rusqlite::Result<Merged<'a, 's>> {
        Ok(Merged {
            held: rollup.threads.iter().peekable(),
            rows: set_aside.map(|st| st.query([])).transpose()?,
            pending: None,
        })
    }

    /// The next row set aside into `pending`, if any is left.
    fn fill(&mut self) -> rusqlite::Result<()> {
        if self.pending.is_some() {
            return Ok(());
        }
        let Some(rows) = self.rows.as_mut() else {
            return Ok(());
        };
        let Some(r) = rows.next()? else {
            self.rows = None;
            return Ok(());
        };
        let (pid, tid, text): (u32, u32, String) = (r.get(0)?, r.get(1)?, r.get(2)?);
        let w: ThreadWindows = serde_json::from_str(&text).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, Box::new(e))
        })?;
        self.pending = Some(((pid, tid), w));
        Ok(())
    }

    /// The next thread and its windows; None after the last.
    pub(crate) fn next(&mut self) -> rusqlite::Result<Option<((u32, u32), ThreadWindows)>> {
        self.fill()?;
        let held = self.held.peek().map(|(&k, _)| k);
        let aside = self.pending.as_ref().map(|(k, _)| *k);
        let key = match (held, aside) {
            (None, None) => return Ok(None),
            (Some(k), None) | (None, Some(k)) => k,
            (Some(a), Some(b)) => a.min(b),
        };
        // Rows set aside hold a thread's earlier calls: first.
        let mut out = ThreadWindows::default();
        while let Some((k, w)) = self.pending.take() {
            if k != key {
                self.pending = Some((k, w));
                break;
            }
            out.merge(&w);
            self.fill()?;
        }
        if let Some((_, w)) = self.held.next_if(|(&k, _)| k == key) {
            out.merge(w);
        }
        Ok(Some((key, out)))
    }
}
