//! Schema version 2 (issue 16): calls stored with the op as an id behind a
//! `calls` view. The example traces (version 1) still read, a version 2
//! rewrite of them reads back identically through the readers and through
//! SQL on `calls`, and a crafted version 2 file is refused or counted.

mod common;

use common::*;
use rusqlite::Connection;
use sleuth_store::{run_readonly_sql, SqlLimits, Trace, SCHEMA_VERSION};
use std::path::{Path, PathBuf};

fn version_of(path: &Path) -> String {
    Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

/// Every column of `calls` version 1 had, for every row, in one order.
fn calls_sql_rows(path: &Path) -> Vec<Vec<rusqlite::types::Value>> {
    let c = Connection::open(path).unwrap();
    let mut st = c
        .prepare(
            "SELECT ts_ns, dur_ns, pid, tid, layer, op, ret, size, ptr, stream, kind, nested,
                    on_cpu_ns, runnable_ns, blocked_ns, cpu
             FROM calls ORDER BY ts_ns, tid, op, dur_ns",
        )
        .unwrap();
    let rows = st
        .query_map([], |r| {
            (0..16)
                .map(|i| r.get::<_, rusqlite::types::Value>(i))
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

#[test]
fn old_examples_and_their_rewrite_read_the_same() {
    for name in ["demo-sim.db", "h200-contention.db"] {
        assert_eq!(
            version_of(&example(name)),
            "1",
            "{name} is a version 1 trace"
        );
        let (_dir, path) = rewritten(name, "schema-v2");
        assert_eq!(version_of(&path), SCHEMA_VERSION.to_string());
        let old = Trace::open(&example(name)).unwrap();
        let new = Trace::open(&path).unwrap();
        let (a, b) = (old.load(None).unwrap(), new.load(None).unwrap());
        assert_eq!(a.calls, b.calls, "{name}: calls");
        assert_eq!(a.waits, b.waits, "{name}: waits");
        assert_eq!(old.pids().unwrap(), new.pids().unwrap(), "{name}: pids");
        assert!(new.input_problems().unwrap().is_empty(), "{name}");
        // SQL written for version 1 sees the same rows, on_cpu_ns included.
        let rows = calls_sql_rows(&path);
        assert!(!rows.is_empty());
        assert_eq!(calls_sql_rows(&example(name)), rows, "{name}: SQL on calls");
    }
}

#[test]
fn the_sandbox_reads_the_view_and_its_derived_columns() {
    let dir = TempDir::new("schema-v2-sql");
    let db = dir.join("t.db");
    small_trace(&db);
    let r = run_readonly_sql(
        &db,
        "SELECT layer, op, on_cpu_ns, dur_ns - runnable_ns - blocked_ns FROM calls WHERE op = 'cudaMalloc'",
        SqlLimits::default(),
    )
    .unwrap();
    assert_eq!(
        r.rows,
        vec![vec![
            serde_json::json!("runtime"),
            serde_json::json!("cudaMalloc"),
            serde_json::json!(600),
            serde_json::json!(600),
        ]]
    );
    let s = run_readonly_sql(
        &db,
        "SELECT op, calls, on_cpu_ns FROM op_summary WHERE op = 'cudaMalloc'",
        SqlLimits::default(),
    )
    .unwrap();
    assert_eq!(s.rows.len(), 1);
    // The view is read-only like every table.
    for sql in [
        "INSERT INTO calls(id) VALUES (99)",
        "UPDATE ops SET op = 'x'",
        "DROP VIEW calls",
    ] {
        assert!(
            run_readonly_sql(&db, sql, SqlLimits::default()).is_err(),
            "{sql}"
        );
    }
}

/// [`small_trace_in`], then changed by `sql` the way a damaged or crafted
/// file would be.
fn altered_small_trace(tag: &str, sql: &str) -> (TempDir, PathBuf) {
    let (dir, db) = small_trace_in(tag);
    Connection::open(&db).unwrap().execute_batch(sql).unwrap();
    (dir, db)
}

#[test]
fn an_op_id_without_a_name_is_counted_as_an_unknown_op() {
    let (_dir, db) = altered_small_trace(
        "schema-v2-orphan",
        "UPDATE call_rows SET op_id = 60000 WHERE id = 1",
    );
    let t = Trace::open(&db).unwrap();
    let p = t.input_problems().unwrap();
    assert_eq!(p.unknown_op_rows(), 1, "{p:?}");
    assert!(p.unknown_ops.contains_key("op id 60000"), "{p:?}");
    assert_eq!(t.load(None).unwrap().calls.len(), 2);
}

#[test]
fn a_crafted_calls_view_or_long_op_name_is_refused() {
    let (_dir, db) = altered_small_trace(
        "schema-v2-hostile",
        "DROP VIEW call_sites; DROP VIEW calls_wall; DROP VIEW op_summary;
         DROP VIEW call_culprits_named; DROP VIEW calls;
         CREATE VIEW calls AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r)
         SELECT c.*, 'runtime' AS layer, 'cudaMalloc' AS op FROM call_rows c, r",
    );
    let e = Trace::open(&db).err().expect("refused").to_string();
    assert!(e.contains("not the view gpusleuth writes"), "{e}");
    assert!(run_readonly_sql(&db, "SELECT 1", SqlLimits::default()).is_err());

    let (_long_dir, db) = altered_small_trace(
        "schema-v2-long",
        "UPDATE ops SET op = printf('%.*c', 1000000, 'Z') WHERE op = 'cudaMalloc'",
    );
    let e = Trace::open(&db).err().expect("refused").to_string();
    assert!(e.contains("longer than"), "{e}");
}
