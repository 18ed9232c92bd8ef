//! One thread's waits with their wakers and culprits, in one ordered read:
//! what the per-thread pass (`thread_pass`) feeds both the call culprits
//! and the thread's split from.
//!
//! The culprits come from the same statement (a join to `wait_culprits`),
//! not from a lookup per wait: on a 10M-call trace the scoped explanation
//! made one lookup per wait in each of two streams (2.3M + 250k statement
//! runs). Only waits with runnable time (`on_ns > wake_ns`) get them: no
//! reader of the stream uses the culprits of a wait without (a call's share
//! and the split's holders are proportional to runnable time).

use crate::problems::MAX_NS;
use crate::rows::{wait_fields, waits_sql_with, WAIT_COLS};
use rusqlite::{Connection, Row, Rows};
use sleuth_core::{Culprit, WaitEvent};

/// `SELECT` of a thread's waits (`?1` pid, `?2` tid, `cond` on `w.`, e.g.
/// a lower bound of `on_ns`), one row per culprit of each (one with NULL
/// culprit columns for a wait without), in `(on_ns, wake_ns)` order: the
/// loaded trace's order for call culprits (`culprits::call_culprits`); the
/// split adds ties of `on_ns` in any order (its sums do not depend on it).
/// Then row id, and each wait's culprits in row order, as
/// `rows::WAIT_CULPRITS_SQL` reads them.
pub(crate) fn thread_waits_sql(conn: &Connection, cond: &str) -> rusqlite::Result<String> {
    // `+w.pid`: the `(tid, on_ns)` index, not `(pid, on_ns)`, which would
    // read every thread of the process's waits to find this one's.
    waits_sql_with(
        conn,
        ", u.rowid, substr(u.comm, 1, 64), u.pid, u.tid, u.ns",
        &format!(
            "LEFT JOIN wait_culprits u ON w.on_ns > w.wake_ns AND u.wait_id = w.id \
             AND u.ns BETWEEN 0 AND {MAX_NS} \
             WHERE +w.pid = ?1 AND w.tid = ?2 AND {cond} \
             ORDER BY w.on_ns, w.wake_ns, w.id, u.rowid"
        ),
    )
}

/// One row of [`thread_waits_sql`]: its wait's id, the wait (None for a
/// kind this build does not know, or for a row after its wait's first)
/// and the row's culprit.
type WaitRow = (i64, Option<WaitEvent>, Option<Culprit>);

/// The waits of a [`thread_waits_sql`] read, each with all its culprits.
pub(crate) struct WaitStream<'s> {
    rows: Rows<'s>,
    /// The first row of the next wait (read to find the current one's end).
    carry: Option<WaitRow>,
}

impl<'s> WaitStream<'s> {
    pub(crate) fn new(rows: Rows<'s>) -> WaitStream<'s> {
        WaitStream { rows, carry: None }
    }

    /// The next wait of a known kind, with its culprits; None at the end.
    pub(crate) fn next_wait(&mut self) -> rusqlite::Result<Option<WaitEvent>> {
        loop {
            let first = match self.carry.take() {
                Some(r) => r,
                None => match self.read(None)? {
                    Some(r) => r,
                    None => return Ok(None),
                },
            };
            let (id, wait, culprit) = first;
            let mut culprits: Vec<Culprit> = culprit.into_iter().collect();
            // The wait's other culprit rows follow it (wait ids are unique).
            loop {
                match self.read(Some(id))? {
                    Some((next, _, c)) if next == id => culprits.extend(c),
                    other => {
                        self.carry = other;
                        break;
                    }
                }
            }
            if let Some(mut w) = wait {
                w.culprits = culprits;
                return Ok(Some(w));
            }
            // An unknown kind: skipped, as `rows::wait_from_row` skips it.
        }
    }

    /// The next row; its wait's columns are decoded unless it is another
    /// row of wait `current`.
    fn read(&mut self, current: Option<i64>) -> rusqlite::Result<Option<WaitRow>> {
        let Some(row) = self.rows.next()? else {
            return Ok(None);
        };
        let id: i64 = row.get(0)?;
        let wait = match current == Some(id) {
            true => None,
            false => wait_fields(row)?,
        };
        Ok(Some((id, wait, culprit(row)?)))
    }
}

/// The culprit columns of a row, after the wait's: the culprit's row id
/// (NULL: the wait has none), then its fields.
fn culprit(row: &Row) -> rusqlite::Result<Option<Culprit>> {
    if row.get::<_, Option<i64>>(WAIT_COLS)?.is_none() {
        return Ok(None);
    }
    Ok(Some(Culprit {
        comm: row.get(WAIT_COLS + 1)?,
        pid: row.get(WAIT_COLS + 2)?,
        tid: row.get(WAIT_COLS + 3)?,
        ns: row.get::<_, i64>(WAIT_COLS + 4)? as u64,
    }))
}
