//! Wait groups (issue 16): how many scheduler waits each process has of
//! each kind, and the earliest one's start — what `overview` and the
//! Perfetto export need of every wait (its count and the trace's origin) —
//! computed once when the trace ends and read back instead of a pass over
//! every wait row (2.3 million of a 10M-call trace). Table and meaning:
//! docs/schema.md, "Wait groups".
//!
//! With them, each group's latest end (`wait_ends`, a table of its own so
//! that builds reading `wait_groups`' four columns still read it): the
//! report's extent, which read it per process through a `(pid, on_ns)`
//! index that the waits no longer carry (3.5 bytes per event of a 10M-call
//! trace, docs/benchmarks.md).

use crate::finding_rollups::{complete_tables, damaged_table};
use crate::problems::{valid_wait, MAX_NS};
use rusqlite::Connection;
use sleuth_core::WaitKind;

/// `meta.wait_groups` once the table below is complete.
const COMPLETE: &str = "1";

const CREATE: &str = "CREATE TABLE IF NOT EXISTS wait_groups(pid INTEGER NOT NULL, kind TEXT NOT NULL, count INTEGER NOT NULL, first_off_ns INTEGER NOT NULL)";

/// The table's columns in order: a reader accepts nothing else.
const COLS: &[&str] = &["pid", "kind", "count", "first_off_ns"];

const CREATE_ENDS: &str = "CREATE TABLE IF NOT EXISTS wait_ends(pid INTEGER NOT NULL, kind TEXT NOT NULL, last_on_ns INTEGER NOT NULL)";

/// `wait_ends`' columns in order.
const ENDS_COLS: &[&str] = &["pid", "kind", "last_on_ns"];

/// The valid waits of one process and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WaitGroup {
    pub pid: u32,
    pub count: u64,
    pub first_off_ns: u64,
}

/// Groups the valid waits of known kinds and stores them (`wait_groups`,
/// `wait_ends`); the writer's final transaction calls it. One aggregate
/// over the wait rows, in a sort of its own (no index orders them by
/// process).
pub(crate) fn write(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(CREATE)?;
    conn.execute_batch(CREATE_ENDS)?;
    conn.execute("DELETE FROM wait_groups", [])?;
    conn.execute("DELETE FROM wait_ends", [])?;
    let groups: Vec<(i64, String, i64, i64, i64)> = {
        let mut st = conn.prepare(&format!(
            "SELECT w.pid, w.kind, count(*), min(w.off_ns), max(w.on_ns) FROM waits w \
             WHERE {} GROUP BY w.pid, w.kind",
            valid_wait("w.")
        ))?;
        let rows = st.query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut groups_st = conn.prepare(
        "INSERT INTO wait_groups(pid, kind, count, first_off_ns) VALUES (?1, ?2, ?3, ?4)",
    )?;
    let mut ends_st =
        conn.prepare("INSERT INTO wait_ends(pid, kind, last_on_ns) VALUES (?1, ?2, ?3)")?;
    for (pid, kind, count, first, last) in groups {
        // Kinds this build does not know are not read as waits: not grouped.
        if WaitKind::parse(&kind).is_none() {
            continue;
        }
        groups_st.execute(rusqlite::params![pid, kind, count, first])?;
        ends_st.execute(rusqlite::params![pid, kind, last])?;
    }
    for key in ["wait_groups", "wait_ends"] {
        conn.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)",
            [key, COMPLETE],
        )?;
    }
    Ok(())
}

/// The latest end (`on_ns`) of each stored group of one process or all;
/// None when the trace has no complete `wait_ends` (written before it
/// existed, or still being written). Kinds this build does not know are
/// left out; an end outside 0..2^62 makes the table damaged: an error.
pub(crate) fn stored_ends(
    conn: &Connection,
    pid: Option<u32>,
) -> rusqlite::Result<Option<Vec<u64>>> {
    if !complete_tables(conn, "wait_ends", &[("wait_ends", ENDS_COLS)])? {
        return Ok(None);
    }
    let mut st =
        conn.prepare("SELECT kind, last_on_ns FROM wait_ends WHERE ?1 IS NULL OR pid = ?1")?;
    let mut rows = st.query([pid])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let kind: String = r.get(0)?;
        if WaitKind::parse(&kind).is_none() {
            continue;
        }
        let last: i64 = r.get(1)?;
        if !(0..=MAX_NS).contains(&last) {
            return Err(damaged_table("wait_ends", "holds a row no wait can give"));
        }
        out.push(last as u64);
    }
    Ok(Some(out))
}

/// The stored groups of one process or all; None when the trace has no
/// complete table (then the readers count the rows). Rows of kinds this
/// build does not know are left out, as readers leave out such waits; a
/// row with a negative count or a start outside 0..2^62 makes the table
/// damaged: an error.
pub(crate) fn stored(
    conn: &Connection,
    pid: Option<u32>,
) -> rusqlite::Result<Option<Vec<WaitGroup>>> {
    if !complete_tables(conn, "wait_groups", &[("wait_groups", COLS)])? {
        return Ok(None);
    }
    let bad = |what: &str| damaged_table("wait_groups", what);
    let mut st = conn.prepare(
        "SELECT pid, kind, count, first_off_ns FROM wait_groups WHERE ?1 IS NULL OR pid = ?1",
    )?;
    let mut rows = st.query([pid])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let kind: String = r.get(1)?;
        if WaitKind::parse(&kind).is_none() {
            continue;
        }
        let (count, first): (i64, i64) = (r.get(2)?, r.get(3)?);
        if count < 0 || !(0..=MAX_NS).contains(&first) {
            return Err(bad("holds a row no wait can give"));
        }
        out.push(WaitGroup {
            pid: r.get(0)?,
            count: count as u64,
            first_off_ns: first as u64,
        });
    }
    Ok(Some(out))
}
