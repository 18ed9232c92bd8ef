//! Call sites in the database: `stacks` (one row per distinct stack) and
//! `stack_frames` (its frames), referenced by `calls.stack_id` and
//! `allocator_events.stack_id`. Traces written before these existed have
//! neither: readers treat that as "no site captured".

use rusqlite::{params, Connection};
use sleuth_core::sites::{Frame, FrameKind, Stack};
use std::collections::BTreeMap;

/// Tables and columns added for call sites (documented in docs/schema.md);
/// `call_rows.stack_id` and its index are part of `schema::CREATE`.
pub(crate) const CREATE: &str = r#"
CREATE TABLE stacks(
    id INTEGER PRIMARY KEY,
    pid INTEGER NOT NULL,
    site TEXT NOT NULL,
    notes TEXT NOT NULL
);
CREATE TABLE stack_frames(
    stack_id INTEGER NOT NULL,
    depth INTEGER NOT NULL,
    kind TEXT NOT NULL,
    function TEXT,
    file TEXT,
    line INTEGER,
    module TEXT,
    addr INTEGER,
    PRIMARY KEY(stack_id, depth)
);
CREATE VIEW call_sites AS
    SELECT c.id AS call_id, c.pid, c.tid, c.op, c.ts_ns, c.dur_ns, c.ret, c.size, s.site, c.stack_id
    FROM calls c JOIN stacks s ON s.id = c.stack_id;
"#;

/// Stores a stack once (a stack id seen again is ignored).
pub(crate) fn insert(tx: &Connection, s: &Stack) -> rusqlite::Result<()> {
    let id = s.id as i64; // bit pattern: ids are 64-bit hashes
    let n = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO stacks(id, pid, site, notes) VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(params![id, s.pid, s.site_label(), s.notes.join("; ")])?;
    if n == 0 {
        return Ok(());
    }
    let mut st = tx.prepare_cached(
        "INSERT INTO stack_frames(stack_id, depth, kind, function, file, line, module, addr)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (depth, f) in s.frames.iter().enumerate() {
        st.execute(params![
            id,
            depth as i64,
            f.kind.unwrap_or(FrameKind::Native).as_str(),
            f.function,
            f.file,
            f.line,
            f.module,
            f.addr.map(|a| a as i64)
        ])?;
    }
    Ok(())
}

/// Whether `table` has `column` (older traces lack the site columns).
pub(crate) fn has_column(conn: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    let mut st = conn.prepare("SELECT name FROM pragma_table_info(?1)")?;
    let names = st.query_map([table], |r| r.get::<_, String>(0))?;
    for n in names {
        if n? == column {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Every stored stack (of one process or all), by id.
pub(crate) fn read_all(
    conn: &Connection,
    pid: Option<u32>,
) -> rusqlite::Result<BTreeMap<u64, Stack>> {
    let mut out = BTreeMap::new();
    if !crate::open::has_table(conn, "stacks")? {
        return Ok(out);
    }
    let mut st = conn.prepare("SELECT id, pid, notes FROM stacks WHERE ?1 IS NULL OR pid = ?1")?;
    let rows = st.query_map([pid], |r| {
        let notes: String = r.get(2)?;
        Ok(Stack {
            id: r.get::<_, i64>(0)? as u64,
            pid: r.get(1)?,
            frames: Vec::new(),
            notes: notes
                .split("; ")
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect(),
        })
    })?;
    for s in rows {
        let s = s?;
        out.insert(s.id, s);
    }
    let mut fr = conn.prepare(
        "SELECT f.stack_id, f.kind, f.function, f.file, f.line, f.module, f.addr
         FROM stack_frames f JOIN stacks s ON s.id = f.stack_id
         WHERE ?1 IS NULL OR s.pid = ?1 ORDER BY f.stack_id, f.depth",
    )?;
    let frames = fr.query_map([pid], |r| {
        let kind: String = r.get(1)?;
        Ok((
            r.get::<_, i64>(0)? as u64,
            Frame {
                kind: FrameKind::parse(&kind),
                function: r.get(2)?,
                file: r.get(3)?,
                line: r.get(4)?,
                module: r.get(5)?,
                addr: r.get::<_, Option<i64>>(6)?.map(|a| a as u64),
            },
        ))
    })?;
    for f in frames {
        let (id, frame) = f?;
        if let Some(s) = out.get_mut(&id) {
            s.frames.push(frame);
        }
    }
    Ok(out)
}

/// Stack ids of calls (by call row id) and of allocator events (by row order
/// key `(pid, end_ns, block)`), for traces that have the columns.
pub(crate) fn call_stack_ids(
    conn: &Connection,
    pid: Option<u32>,
) -> rusqlite::Result<std::collections::HashMap<i64, u64>> {
    let mut out = std::collections::HashMap::new();
    if !has_column(conn, "calls", "stack_id")? {
        return Ok(out);
    }
    let mut st = conn.prepare(
        "SELECT id, stack_id FROM calls WHERE stack_id IS NOT NULL AND (?1 IS NULL OR pid = ?1)",
    )?;
    let rows = st.query_map([pid], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)? as u64))
    })?;
    for r in rows {
        let (id, s) = r?;
        out.insert(id, s);
    }
    Ok(out)
}
