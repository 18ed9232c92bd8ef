//! The read-only SQL sandbox: reads work, every way of writing or escaping fails,
//! and the database directory is left exactly as it was.

mod common;
use common::*;
use sleuth_store::{run_readonly_sql, SqlLimits};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

/// Every file in the directory with its bytes and mtime.
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, SystemTime)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                (std::fs::read(e.path()).unwrap(), m.modified().unwrap()),
            )
        })
        .collect()
}

#[test]
fn reads_return_columns_rows_and_respect_the_row_cap() {
    let (_dir, db) = small_trace_in("sqlok");
    let r = run_readonly_sql(
        &db,
        "SELECT op, count(*) AS n FROM calls GROUP BY op ORDER BY op",
        SqlLimits::default(),
    )
    .unwrap();
    assert_eq!(r.columns, vec!["op", "n"]);
    assert_eq!(r.rows.len(), 3);
    assert_eq!(
        r.rows[0],
        vec![serde_json::json!("cuMemAlloc_v2"), serde_json::json!(1)]
    );
    assert!(!r.truncated);
    let capped = run_readonly_sql(
        &db,
        "SELECT id FROM calls",
        SqlLimits {
            max_rows: 2,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(capped.rows.len(), 2);
    assert!(capped.truncated);
    // Views and schema introspection are allowed.
    let v = run_readonly_sql(
        &db,
        "SELECT ts_unix_ns FROM calls_wall ORDER BY ts_ns LIMIT 1",
        SqlLimits::default(),
    )
    .unwrap();
    assert_eq!(
        v.rows[0][0],
        serde_json::json!(2_000i64 + session().realtime_offset_ns)
    );
    let info = run_readonly_sql(
        &db,
        "SELECT name FROM pragma_table_info('calls')",
        SqlLimits::default(),
    )
    .unwrap();
    assert!(info.rows.iter().any(|r| r[0] == "runnable_ns"));
    let culprits = run_readonly_sql(
        &db,
        "SELECT culprit_comm, runnable_ns FROM call_culprits_named",
        SqlLimits::default(),
    )
    .unwrap();
    assert_eq!(
        culprits.rows,
        vec![vec![serde_json::json!("hog"), serde_json::json!(400)]]
    );
}

#[test]
fn writes_escapes_and_runaways_are_refused_and_nothing_changes() {
    let (dir, db) = small_trace_in("sqlbad");
    let other = dir.join("other.db");
    let other_s = other.display().to_string();
    let attacks: Vec<String> = vec![
        "PRAGMA query_only=0".into(),
        "PRAGMA journal_mode=DELETE".into(),
        "PRAGMA user_version=7".into(),
        "PRAGMA writable_schema=ON".into(),
        format!("ATTACH '{other_s}' AS o"),
        format!("ATTACH 'file:{other_s}?mode=rwc' AS o"),
        "DETACH main".into(),
        "SELECT 1; DELETE FROM calls".into(),
        "SELECT 1; SELECT 2".into(),
        "DELETE FROM calls".into(),
        "UPDATE calls SET dur_ns = 0".into(),
        "INSERT INTO notes VALUES (0, 'x', 'y')".into(),
        "DROP TABLE calls".into(),
        "CREATE TABLE evil(x)".into(),
        "CREATE TEMP TABLE evil(x)".into(),
        "BEGIN".into(),
        "SELECT load_extension('/tmp/evil.so')".into(),
        format!("VACUUM INTO '{other_s}'"),
        "WITH x AS (SELECT 1) DELETE FROM calls".into(),
        "WITH x AS (SELECT 1) INSERT INTO notes SELECT 0, 'x', 'y' FROM x".into(),
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"
            .into(),
        "REINDEX".into(),
        "ANALYZE".into(),
        "SELECT * FROM sqlite_dbpage".into(),
    ];
    let before = snapshot(&dir.0);
    for sql in &attacks {
        let got = run_readonly_sql(&db, sql, SqlLimits::default());
        assert!(got.is_err(), "must be refused: {sql} -> {got:?}");
        let msg = got.err().unwrap().to_string();
        assert!(!msg.contains('\n'), "one line: {msg}");
    }
    assert_eq!(
        snapshot(&dir.0),
        before,
        "db bytes, mtimes and directory listing unchanged"
    );
    assert!(!other.exists());
}

#[test]
fn runaway_query_is_stopped_by_the_time_limit() {
    let (_dir, db) = small_trace_in("sqlslow");
    let err = run_readonly_sql(
        &db,
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT max(n) FROM r",
        SqlLimits {
            timeout: std::time::Duration::from_millis(300),
            ..Default::default()
        },
    )
    .expect_err("interrupted");
    assert!(err.to_string().contains("time limit"), "{err}");
}

#[test]
fn missing_or_non_sqlite_files_are_clear_errors() {
    let dir = TempDir::new("sqlmissing");
    let e = run_readonly_sql(&dir.join("nope.db"), "SELECT 1", SqlLimits::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("no such file"), "{e}");
    assert!(!dir.join("nope.db").exists(), "nothing created");
    let text = dir.join("t.txt");
    std::fs::write(&text, vec![b'x'; 5000]).unwrap();
    let e = run_readonly_sql(&text, "SELECT 1", SqlLimits::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("t.txt"), "{e}");
}

/// Issue 18: the time limit is wall time. A single slow function call (here
/// a quadratic `instr` over long strings, 38.8 s and exit 0 before) is
/// stopped within the limit plus 1 s, whatever SQLite is doing.
#[test]
fn slow_functions_are_stopped_on_wall_time() {
    let (_dir, db) = small_trace_in("sqlslowfn");
    let limit = std::time::Duration::from_secs(2);
    let queries = [
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<10) \
         SELECT instr(printf('%.*c',999990+(x-x),'a'), printf('%.*c',300000+(x-x),'a')||'b') FROM c",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<100000) \
         SELECT instr(printf('%.*c',131000+(x-x),'a'), printf('%.*c',60000+(x-x),'a')||'b') FROM c",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
    ];
    for q in queries {
        let t0 = std::time::Instant::now();
        let r = run_readonly_sql(
            &db,
            q,
            SqlLimits {
                timeout: limit,
                ..Default::default()
            },
        );
        let took = t0.elapsed();
        eprintln!(
            "stopped after {took:?}: {}",
            r.as_ref().err().map(|e| e.to_string()).unwrap_or_default()
        );
        assert!(r.is_err(), "{q}: must not succeed");
        assert!(
            took < limit + std::time::Duration::from_secs(1),
            "{q}: took {took:?}"
        );
    }
}

/// Issue 18: one small request used to return 2 GB of JSON. The answer is
/// bounded in bytes and cells, and says why it stops.
#[test]
fn answers_are_bounded_in_bytes_and_cells() {
    let (_dir, db) = small_trace_in("sqlbig");
    let r = run_readonly_sql(
        &db,
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<1000) \
         SELECT printf('%.*c',99999+(x-x),'\"') FROM c",
        SqlLimits::default(),
    )
    .expect("a bounded answer");
    assert!(r.truncated);
    let bytes: usize = r
        .rows
        .iter()
        .map(|row| row[0].as_str().map_or(0, str::len))
        .sum();
    assert!(bytes <= SqlLimits::default().max_bytes, "{bytes}");
    assert!(
        r.truncated_reason
            .as_deref()
            .unwrap_or("")
            .contains("bytes"),
        "{:?}",
        r.truncated_reason
    );
    // A value above the 128 KiB cap is refused, not built.
    let e = run_readonly_sql(
        &db,
        "SELECT printf('%.*c', 999999, 'a')",
        SqlLimits::default(),
    )
    .expect_err("too big");
    assert!(e.to_string().contains("too big"), "{e}");
    // Cells.
    let r = run_readonly_sql(
        &db,
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<1000) SELECT x, x, x FROM c",
        SqlLimits {
            max_cells: 300,
            ..Default::default()
        },
    )
    .expect("capped");
    assert_eq!(r.rows.len(), 100);
    assert!(r
        .truncated_reason
        .as_deref()
        .unwrap_or("")
        .contains("cells"));
}

/// Issue 18: `sql` returned another application's `secrets` table. Only
/// gpusleuth traces are served.
#[test]
fn other_sqlite_files_are_refused() {
    let dir = TempDir::new("sqlforeign");
    let other = dir.join("other_app.db");
    let c = rusqlite::Connection::open(&other).unwrap();
    c.execute_batch("CREATE TABLE secrets(k TEXT); INSERT INTO secrets VALUES ('hunter2');")
        .unwrap();
    drop(c);
    let e = run_readonly_sql(&other, "SELECT * FROM secrets", SqlLimits::default())
        .expect_err("refused");
    assert!(e.to_string().contains("not a gpusleuth trace"), "{e}");
    assert!(!e.to_string().contains("hunter2"));
}
