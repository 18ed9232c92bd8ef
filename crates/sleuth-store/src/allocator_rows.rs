//! The rows of `allocator_events` (PyTorch's caching-allocator events,
//! `trace --torch-allocator`) as `sleuth_core::BlockEvent`s: the one query
//! and row reading that the loaded trace, the streamed allocator views and
//! the writer's allocator rollup (`crate::allocator_rollup`) share.

use crate::problems::MAX_NS;
use rusqlite::{Connection, OptionalExtension, Row};
use sleuth_core::ops::op_by_name;

/// Which allocator events a [`query`] reads.
#[derive(Clone, Copy)]
pub(crate) enum Select {
    /// Those of process `?1`, or all when it is NULL.
    Any,
    /// Those of process `?1`, from the `(pid, end_ns)` index in completion
    /// order, unsorted.
    OnePid,
    /// [`Select::OnePid`] a page at a time: the rows after (`?2` end, `?3`
    /// id), at most `?4` of them.
    OnePidPage,
}

/// `meta` key saying the file's allocator rows are stored in completion
/// order (by row id, `end_ns` never decreasing): readers then read them by
/// id, and the file has no `(pid, end_ns)` index (`schema::ALLOCATOR_INDEX`).
pub(crate) const IN_END_ORDER: &str = "allocator_rows_in_end_order";

/// At the file's completion: says the allocator rows are in completion
/// order when they are, else builds the index that reads them in it. One
/// pass over the rows' ids and end times (SQLite's `lag` over the row-id
/// order); nothing for a file without allocator rows.
pub(crate) fn settle_order(conn: &Connection) -> rusqlite::Result<()> {
    let (rows, out_of_order): (i64, bool) = conn.query_row(
        "SELECT count(*), coalesce(sum(end_ns < prev), 0) > 0 FROM
           (SELECT end_ns, lag(end_ns) OVER (ORDER BY id) AS prev FROM allocator_rows)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if rows == 0 {
        return Ok(());
    }
    if out_of_order {
        return conn.execute_batch(crate::schema::ALLOCATOR_INDEX);
    }
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, '1')",
        [IN_END_ORDER],
    )?;
    Ok(())
}

/// Whether the file says its allocator rows are in completion order (files
/// written since round 28, versions 4 and 5).
pub(crate) fn in_end_order(conn: &Connection) -> rusqlite::Result<bool> {
    let value: Option<String> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = ?1",
            [IN_END_ORDER],
            |r| r.get(0),
        )
        .optional()?;
    Ok(value.as_deref() == Some("1") && crate::open::has_table(conn, "allocator_rows")?)
}

/// Checks, row after row of one [`query`], that the rows come in
/// completion order: those read by id because the file says they are in it
/// may not be (a file changed afterwards), and are refused rather than
/// replayed out of order; those SQLite ordered always pass.
#[derive(Default)]
pub(crate) struct EndOrder {
    last: u64,
}

impl EndOrder {
    pub(crate) fn check(&mut self, b: &sleuth_core::BlockEvent) -> rusqlite::Result<()> {
        if b.end_ns < self.last {
            return Err(crate::finding_rollups::damaged_table(
                "allocator_events",
                "is not in the completion order its meta says",
            ));
        }
        self.last = b.end_ns;
        Ok(())
    }
}

/// The query of the allocator events `select` names, in completion order
/// (ties in row order), each row's id at [`ID_COL`]; None when the file has no such
/// table (traces recorded before it existed). Rows with a time no trace
/// holds are left out. A file whose rows are in completion order by id
/// ([`IN_END_ORDER`]) is read by id (no index, no sort): its readers check
/// the order with [`EndOrder`].
pub(crate) fn query(conn: &Connection, select: Select) -> rusqlite::Result<Option<String>> {
    if !crate::open::has_table(conn, "allocator_events")? {
        return Ok(None);
    }
    let stack_col = if crate::stacks::has_column(conn, "allocator_events", "stack_id")? {
        "stack_id"
    } else {
        "NULL"
    };
    let by_id = in_end_order(conn)?;
    let (pid_cond, page) = match select {
        Select::Any => ("(?1 IS NULL OR pid = ?1)", ""),
        Select::OnePid => ("pid = ?1", ""),
        // In row order the id alone says where the page starts (the end,
        // ?2, is still bound by the caller: named so the parameters match).
        Select::OnePidPage if by_id => ("pid = ?1 AND ?2 IS NOT NULL AND id > ?3", " LIMIT ?4"),
        Select::OnePidPage => (
            "pid = ?1 AND (end_ns > ?2 OR (end_ns = ?2 AND id > ?3))",
            " LIMIT ?4",
        ),
    };
    let order = if by_id { "id" } else { "end_ns, id" };
    // Version 3 stores the words as 16 integers, earlier files as one BLOB.
    let words = if crate::stacks::has_column(conn, "allocator_events", "w0")? {
        WORD_COLS
    } else {
        "words"
    };
    Ok(Some(format!(
        "SELECT start_ns, end_ns, pid, tid, op, requested, block, {stack_col}, id, {words} FROM allocator_events
         WHERE {pid_cond} AND start_ns BETWEEN 0 AND {MAX_NS}
           AND end_ns BETWEEN 0 AND {MAX_NS} ORDER BY {order}{page}"
    )))
}

/// Every row [`query`] reads of process `pid` (all when None), in
/// completion order; none without the table.
pub(crate) fn load(
    conn: &Connection,
    pid: Option<u32>,
) -> rusqlite::Result<Vec<sleuth_core::BlockEvent>> {
    let Some(sql) = query(conn, Select::Any)? else {
        return Ok(Vec::new());
    };
    let mut st = conn.prepare(&sql)?;
    let mut rows = st.query([pid])?;
    let mut out = Vec::new();
    let mut order = EndOrder::default();
    while let Some(r) = rows.next()? {
        if let Some(b) = block_of(r)? {
            order.check(&b)?;
            out.push(b);
        }
    }
    Ok(out)
}

/// The column of a [`query`] row that holds its id.
pub(crate) const ID_COL: usize = 8;

/// Version 3's word columns, in order.
const WORD_COLS: &str = "w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15";

/// One row of [`query`] (its id, column [`ID_COL`], aside); None for an op
/// this build does not know. The words are the 16 integer columns after
/// the id (version 3, each a word's bit pattern) or one little-endian BLOB
/// there (earlier files).
pub(crate) fn block_of(r: &Row<'_>) -> rusqlite::Result<Option<sleuth_core::BlockEvent>> {
    let name: String = r.get(4)?;
    let first = ID_COL + 1;
    let mut words = [0u64; sleuth_core::event::BLOCK_WORDS];
    if r.as_ref().column_count() > first + 1 {
        for (i, w) in words.iter_mut().enumerate() {
            *w = match r.get_ref(first + i)? {
                rusqlite::types::ValueRef::Integer(v) => v as u64,
                _ => {
                    return Err(crate::finding_rollups::damaged_table(
                        "allocator_events",
                        "holds a word that is no integer",
                    ))
                }
            };
        }
    } else {
        let blob: Vec<u8> = r.get(first)?;
        for (w, chunk) in words.iter_mut().zip(blob.chunks_exact(8)) {
            *w = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        }
    }
    Ok(op_by_name(&name).map(|info| event_of(r, info.id, words)))
}

/// The event of op `op` with `words` whose other fields are the columns of
/// row `r` before the op's and after it up to the stack (what [`query`]
/// reads and `crate::allocator_raw` reads the same way); a value out of
/// its field's range reads as 0 (or none).
pub(crate) fn event_of(
    r: &Row<'_>,
    op: u16,
    words: [u64; sleuth_core::event::BLOCK_WORDS],
) -> sleuth_core::BlockEvent {
    sleuth_core::BlockEvent {
        op,
        start_ns: r.get::<_, i64>(0).unwrap_or(0) as u64,
        end_ns: r.get::<_, i64>(1).unwrap_or(0) as u64,
        pid: r.get(2).unwrap_or(0),
        tid: r.get(3).unwrap_or(0),
        requested: r.get::<_, Option<i64>>(5).unwrap_or(None).map(|v| v as u64),
        block: r.get::<_, i64>(6).unwrap_or(0) as u64,
        words,
        stack_id: r.get::<_, Option<i64>>(7).unwrap_or(None).map(|v| v as u64),
    }
}

/// The processes with an allocator event that [`query`] reads (a valid
/// time, an op this build knows), each once, in order: one look into the
/// `(pid, end_ns)` index per process, not a read of every row; none when
/// the file has no such table.
pub(crate) fn pids(conn: &Connection) -> rusqlite::Result<Vec<u32>> {
    if !crate::open::has_table(conn, "allocator_events")? {
        return Ok(Vec::new());
    }
    let known: Vec<String> = sleuth_core::ops::OPS
        .iter()
        .map(|o| format!("'{}'", o.name))
        .collect();
    let mut st = conn.prepare(&format!(
        "SELECT p.pid FROM (SELECT DISTINCT pid FROM allocator_events) p
         WHERE EXISTS (SELECT 1 FROM allocator_events a WHERE a.pid = p.pid
           AND a.start_ns BETWEEN 0 AND {MAX_NS} AND a.end_ns BETWEEN 0 AND {MAX_NS}
           AND a.op IN ({}))
         ORDER BY p.pid",
        known.join(", ")
    ))?;
    let pids = st.query_map([], |r| r.get::<_, i64>(0))?;
    let mut out = Vec::new();
    for p in pids {
        if let Ok(p) = u32::try_from(p?) {
            out.push(p);
        }
    }
    Ok(out)
}
