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
use std::collections::VecDeque;

/// `SELECT` of a thread's waits (`?1` pid, `?2` tid, `cond` on `w.`, e.g.
/// a lower bound of `on_ns`), one row per culprit of each (one with NULL
/// culprit columns for a wait without), in `(on_ns, wake_ns)` order: the
/// loaded trace's order for call culprits (`culprits::call_culprits`); the
/// split adds ties of `on_ns` in any order (its sums do not depend on it).
/// Then row id, and each wait's culprits in row order, as
/// `rows::WAIT_CULPRITS_SQL` reads them. The statement orders by
/// `(on_ns, id)` alone, the `(tid, on_ns)` index's own order: `wake_ns`
/// between them made SQLite sort each run of equal `on_ns` in a temporary
/// b-tree (a quarter of the read: 0.37 -> 0.27 s for 150,000 waits of the
/// bench's 10M-call trace in the sqlite3 shell, round 43); [`WaitStream`]
/// puts such a run in `wake_ns` order itself.
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
             ORDER BY w.on_ns, w.id, u.rowid"
        ),
    )
}

/// Waits back on CPU at one time held at most to be put in wake order
/// (about 10 MB; a file the tracer wrote has few such waits).
const MAX_TIES: usize = 65_536;

/// One row of [`thread_waits_sql`]: its wait's id, the wait (None for a
/// kind this build does not know, or for a row after its wait's first)
/// and the row's culprit.
type WaitRow = (i64, Option<WaitEvent>, Option<Culprit>);

/// The waits of a [`thread_waits_sql`] read, each with all its culprits,
/// in `(on_ns, wake_ns, id)` order.
pub(crate) struct WaitStream<'s> {
    rows: Rows<'s>,
    /// The first row of the next wait (read to find the current one's end).
    carry: Option<WaitRow>,
    /// The rest of the current run of waits of one `on_ns`, in `wake_ns`
    /// order (then id: the statement's order, kept by a stable sort).
    ties: VecDeque<WaitEvent>,
    /// The wait read after that run (read to find the run's end).
    next: Option<WaitEvent>,
}

impl<'s> WaitStream<'s> {
    pub(crate) fn new(rows: Rows<'s>) -> WaitStream<'s> {
        WaitStream {
            rows,
            carry: None,
            ties: VecDeque::new(),
            next: None,
        }
    }

    /// The next wait of a known kind, with its culprits; None at the end.
    pub(crate) fn next_wait(&mut self) -> rusqlite::Result<Option<WaitEvent>> {
        if let Some(w) = self.ties.pop_front() {
            return Ok(Some(w));
        }
        let first = match self.next.take() {
            Some(w) => w,
            None => match self.next_in_row_order()? {
                Some(w) => w,
                None => return Ok(None),
            },
        };
        // Another wait back on CPU at the same time is rare (a thread is
        // off CPU once at a time: zero-length waits, or a malformed file's
        // rows): those are read into `ties` and ordered by wake time, up to
        // `MAX_TIES` of them (a crafted file's run past it is handed out in
        // pieces, each in wake order: memory stays bounded).
        while self.ties.len() + 1 < MAX_TIES {
            match self.next_in_row_order()? {
                Some(w) if w.on_ns == first.on_ns => self.ties.push_back(w),
                other => {
                    self.next = other;
                    break;
                }
            }
        }
        if self.ties.is_empty() {
            return Ok(Some(first));
        }
        self.ties.push_front(first);
        self.ties.make_contiguous().sort_by_key(|w| w.wake_ns);
        Ok(self.ties.pop_front())
    }

    /// The next wait of a known kind in the statement's order.
    fn next_in_row_order(&mut self) -> rusqlite::Result<Option<WaitEvent>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait to store: off, blocked for, runnable for, culprits (pid, ns).
    type Stored<'a> = (i64, i64, i64, &'a [(i64, i64)]);
    /// A wait read: on, wake, culprits (pid, ns).
    type Read = (u64, u64, Vec<(u32, u64)>);

    /// Waits of one thread, several back on CPU at the same time with their
    /// wake times against their row order, some with culprits: the stream
    /// hands them out in the order the statement ordered them before round
    /// 43 (`on_ns, wake_ns, id` in SQL, each wait's culprits in row order).
    #[test]
    fn waits_back_at_the_same_time_come_in_wake_order_with_their_culprits() {
        let conn = Connection::open_in_memory().expect("db");
        crate::schema::create(&conn, "test", "test").expect("schema");
        // (off, blocked_for, runnable_for, culprits as (pid, ns)); on = off + both.
        #[rustfmt::skip]
        let waits: &[Stored] = &[
            (10, 50, 40, &[(7, 30), (8, 10)]), // on 100, wake 60
            (20, 60, 20, &[(9, 20)]),          // on 100, wake 80
            (30, 10, 60, &[]),                 // on 100, wake 40 (culprits none stored)
            (5, 0, 95, &[(7, 95)]),            // on 100, wake 5
            (150, 20, 0, &[]),                 // on 170
            (100, 90, 0, &[]),                 // on 190, wake 190
            (120, 10, 60, &[(9, 60)]),         // on 190, wake 130
            (300, 0, 0, &[]),                  // on 300
        ];
        let (pid, tid) = (40_i64, 41_i64);
        for (i, (off, blocked, runnable, culprits)) in waits.iter().enumerate() {
            let id = i as i64 + 1;
            conn.execute(
                "INSERT INTO waits(id, tid, pid_gap, off_ns, prev_state, cpu, kind_id, \
                 blocked_for, runnable_for) VALUES (?1, ?2, ?3, ?4, 0, 0, 0, ?5, ?6)",
                rusqlite::params![id, tid, tid - pid, off, blocked, runnable],
            )
            .expect("wait");
            for (cpid, ns) in culprits.iter() {
                conn.execute(
                    "INSERT INTO wait_culprits(wait_id, pid, tid, comm, ns) VALUES (?1, ?2, ?2, 'c', ?3)",
                    rusqlite::params![id, cpid, ns],
                )
                .expect("culprit");
            }
        }
        let read = |sql: &str| -> Vec<Read> {
            let mut st = conn.prepare(sql).expect("prepare");
            let mut stream = WaitStream::new(st.query([pid, tid]).expect("query"));
            let mut out = Vec::new();
            while let Some(w) = stream.next_wait().expect("wait") {
                let culprits = w.culprits.iter().map(|c| (c.pid, c.ns)).collect();
                out.push((w.on_ns, w.wake_ns, culprits));
            }
            out
        };
        let sql = thread_waits_sql(&conn, "1").expect("sql");
        let got = read(&sql);
        let before_round_43 = sql.replace(
            "ORDER BY w.on_ns, w.id",
            "ORDER BY w.on_ns, w.wake_ns, w.id",
        );
        assert_ne!(sql, before_round_43);
        assert_eq!(got, read(&before_round_43));
        let order: Vec<(u64, u64)> = got.iter().map(|w| (w.0, w.1)).collect();
        #[rustfmt::skip]
        assert_eq!(order, [(100, 5), (100, 40), (100, 60), (100, 80), (170, 170), (190, 130), (190, 190), (300, 300)]);
        assert_eq!(got[0].2, [(7, 95)]);
        assert_eq!(got[2].2, [(7, 30), (8, 10)]);
        assert_eq!(got[5].2, [(9, 60)]);
    }

    /// A crafted thread whose waits all went back on CPU at one time, more
    /// of them than `MAX_TIES`: every wait comes out once, each piece of
    /// the run in wake order, and no more than `MAX_TIES` are held.
    #[test]
    fn a_crafted_run_of_waits_back_at_one_time_is_held_in_bounded_pieces() {
        let conn = Connection::open_in_memory().expect("db");
        crate::schema::create(&conn, "test", "test").expect("schema");
        let n = MAX_TIES as i64 + 4_464;
        let on = 10_000_000_i64;
        conn.execute_batch("BEGIN").expect("begin");
        for i in 0..n {
            // Wake times falling with the row id: the statement's order
            // is the reverse of wake order.
            let (blocked, runnable) = (n - i, i + 1);
            conn.execute(
                "INSERT INTO waits(id, tid, pid_gap, off_ns, prev_state, cpu, kind_id, \
                 blocked_for, runnable_for) VALUES (?1, 41, 1, ?2, 0, 0, 0, ?3, ?4)",
                rusqlite::params![i + 1, on - blocked - runnable, blocked, runnable],
            )
            .expect("wait");
        }
        conn.execute_batch("COMMIT").expect("commit");
        let sql = thread_waits_sql(&conn, "1").expect("sql");
        let mut st = conn.prepare(&sql).expect("prepare");
        let mut stream = WaitStream::new(st.query([40, 41]).expect("query"));
        let mut wakes = Vec::new();
        while let Some(w) = stream.next_wait().expect("wait") {
            assert_eq!(w.on_ns, on as u64);
            assert!(stream.ties.len() < MAX_TIES, "held {}", stream.ties.len());
            wakes.push(w.wake_ns);
        }
        assert_eq!(wakes.len(), n as usize);
        let (first, rest) = wakes.split_at(MAX_TIES);
        assert!(
            first.windows(2).all(|p| p[0] <= p[1]),
            "the first piece in wake order"
        );
        assert!(
            rest.windows(2).all(|p| p[0] <= p[1]),
            "the second piece in wake order"
        );
        let mut all = wakes.clone();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n as usize, "each wait once");
    }
}
