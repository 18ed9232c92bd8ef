//! Times each check of the first read of a trace nobody checked yet
//! (issue 16, round 11): the `quick_check` at open of the tables other than
//! the per-call ones, the `quick_check` of each per-call/per-wait table, the
//! pass over the call rows, and each query of the skipped-row counts. Runs
//! them one after the other on one connection opened as readers open it
//! (read-only, immutable, defensive), then all of them through
//! `Trace::input_problems` (what a first read pays, however it is split).
//!
//! `cargo run --release -p sleuth-store --example check_phases -- TRACE.db`

use rusqlite::{Connection, OpenFlags};
use std::time::Instant;

const BULK: &[&str] = &[
    "calls",
    "call_rows",
    "call_host_ptrs",
    "call_culprits",
    "waits",
    "wait_culprits",
    "wait_wakers",
];

fn open(path: &str) -> rusqlite::Result<Connection> {
    let abs = std::path::absolute(path).expect("path");
    let uri = format!("file:{}?immutable=1", abs.display());
    let c = Connection::open_with_flags(
        uri,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )?;
    c.execute_batch("PRAGMA trusted_schema=OFF; PRAGMA cell_size_check=ON; PRAGMA mmap_size=0;")?;
    Ok(c)
}

fn timed(label: &str, f: impl FnOnce() -> rusqlite::Result<String>) -> rusqlite::Result<f64> {
    let t = Instant::now();
    let out = f()?;
    let s = t.elapsed().as_secs_f64();
    println!("{label:<44} {s:>7.3} s  {out}");
    Ok(s)
}

fn one(c: &Connection, sql: &str) -> rusqlite::Result<String> {
    c.query_row(sql, [], |r| {
        let v: rusqlite::types::Value = r.get(0)?;
        Ok(format!("{v:?}"))
    })
}

fn all(c: &Connection, sql: &str) -> rusqlite::Result<String> {
    let mut st = c.prepare(sql)?;
    let mut rows = st.query([])?;
    let mut n = 0;
    while rows.next()?.is_some() {
        n += 1;
    }
    Ok(format!("{n} rows"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: check_phases TRACE.db")?;
    let c = open(&path)?;
    let tables: Vec<String> = {
        let mut st = c.prepare("SELECT name FROM sqlite_master WHERE type = 'table'")?;
        let names = st.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?;
        names
    };
    let mut total = 0.0;
    let t = Instant::now();
    for name in tables.iter().filter(|t| !BULK.contains(&t.as_str())) {
        one(&c, &format!("PRAGMA quick_check('{name}')"))?;
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "{:<44} {s:>7.3} s",
        "quick_check of the other tables (at open)"
    );
    total += s;
    for name in tables.iter().filter(|t| BULK.contains(&t.as_str())) {
        total += timed(&format!("quick_check({name})"), || {
            one(&c, &format!("PRAGMA quick_check('{name}')"))
        })?;
    }
    let max_ns = 1i64 << 62;
    let max_size = 1i64 << 50;
    let valid = format!(
        "(ts_ns BETWEEN 0 AND {max_ns} AND dur_ns BETWEEN 0 AND {max_ns} \
         AND runnable_ns BETWEEN 0 AND {max_ns} AND blocked_ns BETWEEN 0 AND {max_ns} \
         AND (size IS NULL OR size BETWEEN 0 AND {max_size}))"
    );
    total += timed("call_scan", || {
        one(
            &c,
            &format!(
                "SELECT (SELECT count(*) FROM call_rows) - count(*), total(dur_ns), total(size) \
                 FROM call_rows WHERE {valid}"
            ),
        )
    })?;
    timed("  count(*) FROM call_rows alone", || {
        one(&c, "SELECT count(*) FROM call_rows")
    })?;
    total += timed("scan: op ids of call_rows", || {
        all(
            &c,
            "SELECT coalesce(substr(o.op, 1, 200), 'op id ' || g.op_id), g.n
             FROM (SELECT op_id, count(*) AS n FROM call_rows GROUP BY op_id) g
             LEFT JOIN ops o ON o.id = g.op_id",
        )
    })?;
    total += timed("scan: op_counts", || {
        all(
            &c,
            "SELECT substr(op, 1, 200), count(*) FROM op_counts GROUP BY op",
        )
    })?;
    total += timed("scan: allocator_events", || {
        all(
            &c,
            "SELECT substr(op, 1, 200), count(*) FROM allocator_events GROUP BY op",
        )
    })?;
    total += timed("scan: waits", || {
        one(
            &c,
            &format!(
                "SELECT (SELECT count(*) FROM waits) - count(*) FROM waits WHERE \
                 off_ns BETWEEN 0 AND {max_ns} AND wake_ns BETWEEN 0 AND {max_ns} \
                 AND on_ns BETWEEN 0 AND {max_ns} AND kind IN ('preempted', 'blocked')"
            ),
        )
    })?;
    println!("{:<44} {total:>7.3} s", "sum of the parts");
    drop(c);
    let t = Instant::now();
    let trace = sleuth_store::Trace::open(std::path::Path::new(&path))?;
    let p = trace.input_problems()?;
    println!(
        "{:<44} {:>7.3} s  {} problems",
        "Trace::open + input_problems (as readers)",
        t.elapsed().as_secs_f64(),
        p.lines().len()
    );
    Ok(())
}
