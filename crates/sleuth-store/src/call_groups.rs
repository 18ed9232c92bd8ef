//! Call groups (issue 16): counts, first start and last end per process,
//! thread, op and return value — what `memory`, the lean `explain` and the
//! MCP tools need of every call (the pids and the span) — computed once when
//! the trace ends and read back instead of a pass over every call row.
//!
//! [`compute`] is the pass itself (the readers' fallback for traces without
//! the stored table: older, merged, imported or cut-short ones); [`write`]
//! stores its result at the end of the writer's final pass; [`stored`] reads
//! it back when `meta.call_groups` says it is complete. Table and meaning:
//! docs/schema.md, "Call groups".

use crate::finding_rollups::{complete_tables, damaged_table};
use crate::problems::valid_call;
use crate::stream::CallGroup;
use rusqlite::{params, Connection};
use sleuth_core::op_by_name;
use std::collections::{BTreeMap, HashMap};

/// `meta.call_groups` once the table below is complete.
const COMPLETE: &str = "1";

const CREATE: &str = "CREATE TABLE IF NOT EXISTS call_groups(pid INTEGER NOT NULL, tid INTEGER NOT NULL, op TEXT NOT NULL, ret INTEGER NOT NULL, count INTEGER NOT NULL, first_ts_ns INTEGER NOT NULL, last_end_ns INTEGER NOT NULL)";

/// The table's columns in order: a reader accepts nothing else.
const COLS: &[&str] = &[
    "pid",
    "tid",
    "op",
    "ret",
    "count",
    "first_ts_ns",
    "last_end_ns",
];

/// What one pass over the valid call rows gives: the groups (rows of ops
/// this build does not know are not grouped) and the sums of every valid
/// row's duration and size (as floats: a crafted file must not overflow them).
pub(crate) struct Pass {
    pub groups: Vec<CallGroup>,
    pub dur_total: f64,
    pub size_total: f64,
}

/// One pass over every valid call row (all processes), through the `calls`
/// table or view. Memory grows with the number of groups, not with the calls.
pub(crate) fn compute(conn: &Connection) -> rusqlite::Result<Pass> {
    let sql = format!(
        "SELECT pid, tid, op, ret, ts_ns, dur_ns, size FROM calls WHERE {}",
        valid_call("")
    );
    let mut st = conn.prepare(&sql)?;
    let mut rows = st.query([])?;
    // Op names are looked up once each, not once per row.
    let mut ops: HashMap<String, Option<u16>> = HashMap::new();
    let mut groups: BTreeMap<(u32, u32, u16, i64), CallGroup> = BTreeMap::new();
    let (mut dur_total, mut size_total) = (0f64, 0f64);
    while let Some(r) = rows.next()? {
        let (ts, dur): (i64, i64) = (r.get(4)?, r.get(5)?);
        let size: Option<i64> = r.get(6)?;
        dur_total += dur as f64;
        size_total += size.unwrap_or(0) as f64;
        let name = r.get_ref(2)?.as_str()?;
        let op = match ops.get(name) {
            Some(op) => *op,
            None => {
                let op = op_by_name(name).map(|o| o.id);
                ops.insert(name.to_string(), op);
                op
            }
        };
        let Some(op) = op else { continue };
        let (pid, tid, ret): (u32, u32, i64) = (r.get(0)?, r.get(1)?, r.get(3)?);
        add(
            &mut groups,
            pid,
            tid,
            op,
            ret,
            1,
            ts as u64,
            (ts as u64).saturating_add(dur as u64),
        );
    }
    Ok(Pass {
        groups: groups.into_values().collect(),
        dur_total,
        size_total,
    })
}

#[allow(clippy::too_many_arguments)]
fn add(
    groups: &mut BTreeMap<(u32, u32, u16, i64), CallGroup>,
    pid: u32,
    tid: u32,
    op: u16,
    ret: i64,
    count: u64,
    first: u64,
    last: u64,
) {
    let g = groups.entry((pid, tid, op, ret)).or_insert(CallGroup {
        pid,
        tid,
        op,
        ret,
        count: 0,
        first_ts_ns: first,
        last_end_ns: last,
    });
    g.count = g.count.saturating_add(count);
    g.first_ts_ns = g.first_ts_ns.min(first);
    g.last_end_ns = g.last_end_ns.max(last);
}

/// The call groups the writer's per-thread pass (`finalize`) adds up as it
/// reads every call of every thread: [`compute`]'s groups without a pass
/// of their own over the call rows (0.3-0.46 s of a 1M-call file's
/// completion on the development VM).
#[derive(Default)]
pub(crate) struct Groups(BTreeMap<(u32, u32, u16, i64), CallGroup>);

impl Groups {
    /// One call row as read (`rows::call_from_row`): grouped when
    /// [`compute`]'s `valid_call` condition would read it.
    pub(crate) fn add_call(&mut self, c: &sleuth_core::CallEvent) {
        if !crate::problems::call_is_valid(c) {
            return;
        }
        add(
            &mut self.0,
            c.pid,
            c.tid,
            c.op,
            c.ret,
            1,
            c.ts_ns,
            c.ts_ns.saturating_add(c.dur_ns),
        );
    }
}

impl Groups {
    /// Stores the groups of the processes up to `pid` and forgets them:
    /// the writer's per-thread pass visits processes in pid order, so what
    /// it holds is one process's groups, not the file's.
    pub(crate) fn store_through(&mut self, conn: &Connection, pid: u32) -> rusqlite::Result<()> {
        let rest = match pid.checked_add(1) {
            Some(next) => self.0.split_off(&(next, 0, 0, i64::MIN)),
            None => BTreeMap::new(),
        };
        let done = std::mem::replace(&mut self.0, rest);
        insert(conn, done.values())
    }
}

/// Starts the table in the writer's final transaction, before its
/// per-thread pass stores each process's groups ([`Groups::store_through`]).
pub(crate) fn begin(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(CREATE)?;
    conn.execute("DELETE FROM call_groups", [])?;
    Ok(())
}

/// Stores the groups no [`Groups::store_through`] took and marks the table
/// complete; the writer's final transaction calls it, after [`begin`].
pub(crate) fn finish(conn: &Connection, groups: Groups) -> rusqlite::Result<()> {
    insert(conn, groups.0.values())?;
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('call_groups', ?1)",
        [COMPLETE],
    )?;
    Ok(())
}

fn insert<'g>(
    conn: &Connection,
    groups: impl Iterator<Item = &'g CallGroup>,
) -> rusqlite::Result<()> {
    let mut ins = conn.prepare_cached(
        "INSERT INTO call_groups(pid, tid, op, ret, count, first_ts_ns, last_end_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    for g in groups {
        let Some(info) = sleuth_core::ops::op_by_id(g.op) else {
            continue;
        };
        ins.execute(params![
            g.pid,
            g.tid,
            info.name,
            g.ret,
            clamp(g.count),
            clamp(g.first_ts_ns),
            clamp(g.last_end_ns)
        ])?;
    }
    Ok(())
}

/// The stored call groups, by (pid, tid, op, ret) as [`compute`] gives
/// them; None when the trace has no complete table (then [`compute`]
/// answers). Rows of ops this build does not know are left out, as
/// [`compute`] leaves them out; a row with values no call can have (times
/// outside 0..2^62 ns, a negative count) makes the table damaged: an error.
pub(crate) fn stored(conn: &Connection) -> rusqlite::Result<Option<Vec<CallGroup>>> {
    if !complete_tables(conn, "call_groups", &[("call_groups", COLS)])? {
        return Ok(None);
    }
    let bad = |what: &str| damaged_table("call_groups", what);
    let mut st =
        conn.prepare("SELECT pid, tid, op, ret, count, first_ts_ns, last_end_ns FROM call_groups")?;
    let mut rows = st.query([])?;
    let mut groups = BTreeMap::new();
    let max = crate::problems::MAX_NS;
    while let Some(r) = rows.next()? {
        let name: String = r.get(2)?;
        let Some(info) = op_by_name(&name) else {
            continue;
        };
        let (count, first, last): (i64, i64, i64) = (r.get(4)?, r.get(5)?, r.get(6)?);
        if count < 0 || !(0..=max).contains(&first) || !(0..=max.saturating_mul(2)).contains(&last)
        {
            return Err(bad("holds a row no call can give"));
        }
        add(
            &mut groups,
            r.get(0)?,
            r.get(1)?,
            info.id,
            r.get(3)?,
            count as u64,
            first as u64,
            last as u64,
        );
    }
    Ok(Some(groups.into_values().collect()))
}
