//! Row <-> event mapping shared by the reader and `finish`.
//!
//! Integers are stored as SQLite's signed 64-bit; unsigned values (pointers,
//! streams) are stored bit for bit and cast back.

use crate::types::StoredCall;
use rusqlite::types::Value;
use rusqlite::{Connection, Row};
use sleuth_core::{op_by_name, CallEvent, Culprit, OpInfo, WaitEvent, WaitKind, Waker};

/// Columns `call_from_row` expects, in order (prefix with a table alias if needed).
pub(crate) const CALL_COLS: &str =
    "id, ts_ns, dur_ns, pid, tid, op, ret, size, ptr, stream, kind, nested, runnable_ns, blocked_ns, cpu";

fn opt_u64(row: &Row, i: usize) -> rusqlite::Result<Option<u64>> {
    Ok(row.get::<_, Option<i64>>(i)?.map(|v| v as u64))
}

/// A call row; `None` when its op name is not in this build's op table.
pub(crate) fn call_from_row(row: &Row) -> rusqlite::Result<Option<StoredCall>> {
    // Borrowed, not copied: one allocation per row less (10M rows in some reads).
    let Some(info) = op_by_name(text(row, 5)?) else {
        return Ok(None);
    };
    call_of_op(row, info).map(Some)
}

/// A call row whose column 5 is its op's id in the file's `ops`
/// (`stream::call_statement` reads them so where it can); `None` when `ops`
/// has no row of that id (the `calls` view's join leaves such a row out)
/// or names an op this build does not know.
pub(crate) fn call_from_row_by_op_id(
    row: &Row,
    ops: &OpIds,
) -> rusqlite::Result<Option<StoredCall>> {
    match ops.get(row.get_ref(5)?) {
        Some(info) => call_of_op(row, info).map(Some),
        None => Ok(None),
    }
}

/// The ops of a file that this build knows, by their ids in its `ops`
/// table: read once per statement, so that its rows need no join of `ops`
/// and no lookup of a name each (the bench's 10M-call trace read whole:
/// 5.8 -> 3.9 s in the sqlite3 shell, round 41).
#[derive(Debug, Default)]
pub(crate) struct OpIds {
    /// Ids below [`OpIds::DENSE`] (every id a gpusleuth writer gives).
    dense: Vec<Option<&'static OpInfo>>,
    /// Any other id a file's `ops` holds.
    sparse: std::collections::BTreeMap<i64, &'static OpInfo>,
}

impl OpIds {
    const DENSE: i64 = 1024;

    pub(crate) fn of(conn: &Connection) -> rusqlite::Result<OpIds> {
        let mut ids = OpIds::default();
        let mut st = conn.prepare("SELECT id, op FROM ops")?;
        let mut rows = st.query([])?;
        while let Some(row) = rows.next()? {
            let (id, name) = (row.get_ref(0)?, row.get_ref(1)?);
            let (Ok(id), Some(info)) = (id.as_i64(), name.as_str().ok().and_then(op_by_name))
            else {
                continue;
            };
            match usize::try_from(id) {
                Ok(i) if id < Self::DENSE => {
                    if ids.dense.len() <= i {
                        ids.dense.resize(i + 1, None);
                    }
                    ids.dense[i] = Some(info);
                }
                _ => {
                    ids.sparse.insert(id, info);
                }
            }
        }
        Ok(ids)
    }

    /// The op of a row's op id: none for a value that is no integer (the
    /// join compares it with `ops`' integer ids and finds none either).
    pub(crate) fn get(&self, v: rusqlite::types::ValueRef) -> Option<&'static OpInfo> {
        let id = v.as_i64().ok()?;
        match usize::try_from(id) {
            Ok(i) if id < Self::DENSE => self.dense.get(i).copied().flatten(),
            _ => self.sparse.get(&id).copied(),
        }
    }
}

/// A call row's fields, its op known.
fn call_of_op(row: &Row, info: &'static OpInfo) -> rusqlite::Result<StoredCall> {
    Ok(StoredCall {
        id: row.get(0)?,
        call: CallEvent {
            ts_ns: row.get::<_, i64>(1)? as u64,
            dur_ns: row.get::<_, i64>(2)? as u64,
            pid: row.get(3)?,
            tid: row.get(4)?,
            op: info.id,
            ret: row.get(6)?,
            size: opt_u64(row, 7)?,
            ptr: opt_u64(row, 8)?,
            stream: opt_u64(row, 9)?,
            kind: opt_u64(row, 10)?,
            nested: row.get(11)?,
            runnable_ns: row.get::<_, i64>(12)? as u64,
            blocked_ns: row.get::<_, i64>(13)? as u64,
            cpu: row.get(14)?,
            host_ptr: opt_u64(row, 15)?,
            // Filled by the reader from `calls.stack_id` where the trace has it.
            stack_id: None,
        },
    })
}

/// Column `i` as text, borrowed from the row (an error for another type,
/// as `row.get::<_, String>` gives).
fn text<'r>(row: &'r Row, i: usize) -> rusqlite::Result<&'r str> {
    row.get_ref(i)?.as_str().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// Whether the database has `table` (tables added after the first schema
/// are optional: traces written before them must still load).
fn has(conn: &Connection, table: &str) -> rusqlite::Result<bool> {
    crate::open::has_table(conn, table)
}

/// `SELECT <call columns, host pointer> FROM calls ... <tail>`, rows for
/// [`call_from_row`].
pub(crate) fn calls_sql(conn: &Connection, tail: &str) -> rusqlite::Result<String> {
    calls_sql_from(conn, "calls", tail)
}

/// [`calls_sql`] over `source`: the `calls` view, or a subquery with its
/// rows and columns (`crate::stream::calls_source`).
pub(crate) fn calls_sql_from(
    conn: &Connection,
    source: &str,
    tail: &str,
) -> rusqlite::Result<String> {
    calls_sql_from_with(conn, source, tail, false)
}

/// [`calls_sql_from`], with `stacks` the calls' `stack_id` as column 16
/// (a source that has it: the `calls` view of a file that captured sites).
pub(crate) fn calls_sql_from_with(
    conn: &Connection,
    source: &str,
    tail: &str,
    stacks: bool,
) -> rusqlite::Result<String> {
    let (host, join) = host_ptr_join(conn)?;
    let stack = if stacks { ", calls.stack_id" } else { "" };
    Ok(format!(
        "SELECT {CALL_COLS}, {host}{stack} FROM {source} {join} {tail}"
    ))
}

/// The copies' host pointer as a column of a read of `calls` and the join
/// that gives it: `NULL` and none in a file without `call_host_ptrs`.
pub(crate) fn host_ptr_join(conn: &Connection) -> rusqlite::Result<(&'static str, &'static str)> {
    Ok(match has(conn, "call_host_ptrs")? {
        true => (
            "h.host_ptr",
            "LEFT JOIN call_host_ptrs h ON h.call_id = calls.id",
        ),
        false => ("NULL", ""),
    })
}

/// How the rows of a calls statement name their op (column 5): by name
/// (the `calls` view) or by its id in the file's `ops` (`call_rows` read
/// without the view's join).
#[derive(Clone, Copy)]
pub(crate) enum OpColumn<'o> {
    Name,
    Id(&'o OpIds),
}

impl OpColumn<'_> {
    /// The call of a row of such a statement: [`call_from_row`] or
    /// [`call_from_row_by_op_id`].
    pub(crate) fn call(self, row: &Row) -> rusqlite::Result<Option<StoredCall>> {
        match self {
            OpColumn::Name => call_from_row(row),
            OpColumn::Id(ops) => call_from_row_by_op_id(row, ops),
        }
    }
}

/// Runs `SELECT <CALL_COLS> FROM <source> <tail>` and maps known ops.
pub(crate) fn query_calls(
    conn: &Connection,
    source: &str,
    tail: &str,
    args: &[Value],
) -> rusqlite::Result<Vec<StoredCall>> {
    let mut st = conn.prepare(&calls_sql_from(conn, source, tail)?)?;
    let rows = st.query_map(rusqlite::params_from_iter(args.iter()), call_from_row)?;
    let mut out = Vec::new();
    for r in rows {
        if let Some(c) = r? {
            out.push(c);
        }
    }
    Ok(out)
}

/// `SELECT <wait columns, waker> FROM waits w ... <tail>` (tail filters and
/// orders on `w.`), rows for [`wait_from_row`].
pub(crate) fn waits_sql(conn: &Connection, tail: &str) -> rusqlite::Result<String> {
    waits_sql_with(conn, "", tail)
}

/// [`waits_sql`] with `more` columns after the waker's (`", a, b"`), read
/// from index [`WAIT_COLS`] on; `tail` may start with joins.
pub(crate) fn waits_sql_with(
    conn: &Connection,
    more: &str,
    tail: &str,
) -> rusqlite::Result<String> {
    let (waker, join) = if has(conn, "wait_wakers")? {
        (
            "k.pid, k.tid, k.comm, k.irq",
            "LEFT JOIN wait_wakers k ON k.wait_id = w.id",
        )
    } else {
        ("NULL, NULL, NULL, NULL", "")
    };
    Ok(format!(
        "SELECT w.id, w.pid, w.tid, w.kind, w.off_ns, w.wake_ns, w.on_ns, w.prev_state, w.cpu, {waker}{more} \
         FROM waits w {join} {tail}"
    ))
}

/// The statement [`wait_from_row`] reads a wait's culprits with.
pub(crate) const WAIT_CULPRITS_SQL: &str =
    "SELECT pid, tid, substr(comm, 1, 64), ns FROM wait_culprits WHERE wait_id = ?1 AND ns BETWEEN 0 AND ?2 ORDER BY rowid";

/// The columns of a [`waits_sql`] row before any `more` of [`waits_sql_with`].
pub(crate) const WAIT_COLS: usize = 13;

/// A wait row of [`waits_sql`] with its culprits; None for an unknown kind.
/// Culprits are the tasks that held the CPU while the thread was runnable:
/// a wait that never was (woken and back at once, or a blocked wait whose
/// runnable part is empty) has none to read. The writer stores none there,
/// `wait_stream` joins none there, and every use of them scales by the
/// runnable time; not looking them up saved a query per wait (2.3M on the
/// bench's 10M-call trace, of which 250,000 runnable: round 35).
pub(crate) fn wait_from_row(
    row: &Row,
    culprits_st: &mut rusqlite::CachedStatement,
) -> rusqlite::Result<Option<WaitEvent>> {
    let id: i64 = row.get(0)?;
    let Some(mut w) = wait_fields(row)? else {
        return Ok(None);
    };
    if w.on_ns <= w.wake_ns {
        return Ok(Some(w));
    }
    w.culprits = culprits_st
        .query_map([id, crate::problems::MAX_NS], |c| {
            Ok(Culprit {
                pid: c.get(0)?,
                tid: c.get(1)?,
                comm: c.get(2)?,
                ns: c.get::<_, i64>(3)? as u64,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Some(w))
}

/// A wait row of [`waits_sql`] without its culprits; None for an unknown kind.
pub(crate) fn wait_fields(row: &Row) -> rusqlite::Result<Option<WaitEvent>> {
    let Some(kind) = WaitKind::parse(text(row, 3)?) else {
        return Ok(None);
    };
    Ok(Some(WaitEvent {
        pid: row.get(1)?,
        tid: row.get(2)?,
        kind,
        off_ns: row.get::<_, i64>(4)? as u64,
        wake_ns: row.get::<_, i64>(5)? as u64,
        on_ns: row.get::<_, i64>(6)? as u64,
        prev_state: row.get(7)?,
        cpu: row.get(8)?,
        culprits: Vec::new(),
        waker: match row.get::<_, Option<u32>>(9)? {
            Some(pid) => Some(Waker {
                pid,
                tid: row.get(10)?,
                comm: row.get(11)?,
                irq: row.get(12)?,
            }),
            None => None,
        },
    }))
}

/// Runs `SELECT ... FROM waits w <tail>` (tail filters/orders on `w.`) and
/// attaches each wait's culprits.
pub(crate) fn query_waits(
    conn: &Connection,
    tail: &str,
    args: &[Value],
) -> rusqlite::Result<Vec<WaitEvent>> {
    let mut st = conn.prepare(&waits_sql(conn, tail)?)?;
    let mut rows = st.query(rusqlite::params_from_iter(args.iter()))?;
    let mut cst = conn.prepare_cached(WAIT_CULPRITS_SQL)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        if let Some(w) = wait_from_row(row, &mut cst)? {
            out.push(w);
        }
    }
    Ok(out)
}

/// The columns [`proc_event_from_row`] reads, in order (a process name is
/// read at most `COMM_CHARS` characters).
pub(crate) fn proc_event_cols() -> String {
    format!(
        "ts_ns, kind, pid, tid, ppid, exit_code, substr(comm, 1, {})",
        crate::problems::COMM_CHARS
    )
}

/// A lifecycle event row (columns of [`proc_event_cols`]); None for a kind
/// this build does not know.
pub(crate) fn proc_event_from_row(r: &Row) -> rusqlite::Result<Option<sleuth_core::ProcEvent>> {
    let kind: String = r.get(1)?;
    let Some(kind) = sleuth_core::ProcKind::parse(&kind) else {
        return Ok(None);
    };
    Ok(Some(sleuth_core::ProcEvent {
        kind,
        ts_ns: r.get::<_, i64>(0)? as u64,
        pid: r.get(2)?,
        tid: r.get(3)?,
        ppid: r.get::<_, Option<u32>>(4)?.unwrap_or(0),
        // NULL (unknown, e.g. imported) reads as 0.
        exit_code: r.get::<_, Option<i32>>(5)?.unwrap_or(0),
        comm: r.get(6)?,
    }))
}
