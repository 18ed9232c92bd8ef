//! Wait groups (issue 16): how many scheduler waits each process has of
//! each kind, and the earliest one's start — what `overview` and the
//! Perfetto export need of every wait (its count and the trace's origin) —
//! computed once when the trace ends and read back instead of a pass over
//! every wait row (2.3 million of a 10M-call trace). Table and meaning:
//! docs/schema.md, "Wait groups".

use crate::finding_rollups::{complete_tables, damaged_table};
use crate::problems::{valid_wait, MAX_NS};
use rusqlite::Connection;
use sleuth_core::WaitKind;

/// `meta.wait_groups` once the table below is complete.
const COMPLETE: &str = "1";

const CREATE: &str = "CREATE TABLE IF NOT EXISTS wait_groups(pid INTEGER NOT NULL, kind TEXT NOT NULL, count INTEGER NOT NULL, first_off_ns INTEGER NOT NULL)";

/// The table's columns in order: a reader accepts nothing else.
const COLS: &[&str] = &["pid", "kind", "count", "first_off_ns"];

/// The valid waits of one process and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WaitGroup {
    pub pid: u32,
    pub count: u64,
    pub first_off_ns: u64,
}

/// Groups the valid waits of known kinds and stores them; the writer's final
/// transaction calls it.
pub(crate) fn write(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(CREATE)?;
    conn.execute("DELETE FROM wait_groups", [])?;
    conn.execute(
        &format!(
            "INSERT INTO wait_groups(pid, kind, count, first_off_ns)
             SELECT w.pid, w.kind, count(*), min(w.off_ns) FROM waits w WHERE {} GROUP BY w.pid, w.kind",
            valid_wait("w.")
        ),
        [],
    )?;
    // Kinds this build does not know are not read as waits: not grouped.
    let mut st = conn.prepare("SELECT DISTINCT kind FROM wait_groups")?;
    let kinds: Vec<String> = st
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for k in kinds {
        if WaitKind::parse(&k).is_none() {
            conn.execute("DELETE FROM wait_groups WHERE kind = ?1", [&k])?;
        }
    }
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('wait_groups', ?1)",
        [COMPLETE],
    )?;
    Ok(())
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
