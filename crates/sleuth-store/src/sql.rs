//! Read-only SQL over a trace, safe for untrusted callers (MCP `sql`,
//! `gpusleuth query`).
//!
//! `mode=ro` plus `query_only` is not read-only (`PRAGMA query_only=0` and
//! `ATTACH` both write). What holds, in layers: the connection is opened
//! with SQLITE_OPEN_READONLY; SQLite's limits for untrusted SQL are lowered
//! (no attached databases at all); an authorizer allows only reads, a few
//! introspection pragmas, and functions other than extension loading; one
//! statement per call, which SQLite itself must classify as read-only; the
//! time limit is wall-clock (a watchdog interrupts SQLite, so one slow
//! function call cannot run on), and values are at most 128 KiB, which bounds
//! what one function call can do; the answer is capped in rows, cells and
//! bytes (a small query must not turn into gigabytes of JSON); the SQLite
//! heap is capped; SQLITE_DBCONFIG_DEFENSIVE is on. Only gpusleuth traces
//! are served (the `meta` table says so).

use crate::budget::ReadBudget;
use crate::checked::{CheckMemo, Checks, FileIdentity};
use crate::error::StoreError;
use crate::open::{file_size, full_check_bytes, integrity_check, open_untrusted_unchecked, short};
use rusqlite::ffi;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::types::ValueRef;
use rusqlite::Connection;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

/// Bounds on one read-only query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlLimits {
    /// Rows returned at most; more set `truncated`. Default 1000.
    pub max_rows: usize,
    /// Wall-clock budget of the statement. Default 2 s.
    pub timeout: Duration,
    /// Cells (rows × columns) returned at most. Default 100,000.
    pub max_cells: usize,
    /// Bytes of values returned at most (text and hex-encoded blobs, plus 8
    /// per number). Default 4 MiB.
    pub max_bytes: usize,
    /// Hard limit on SQLite's heap, in bytes. SQLite's heap limit is
    /// process-wide: it is lowered to this value if it is unset or higher,
    /// never raised. Default 256 MiB.
    pub heap_bytes: i64,
}

impl Default for SqlLimits {
    fn default() -> Self {
        SqlLimits {
            max_rows: 1000,
            timeout: Duration::from_secs(2),
            max_cells: 100_000,
            max_bytes: 4 << 20,
            heap_bytes: 256 << 20,
        }
    }
}

/// Result of a read-only query: column names and JSON values.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SqlResult {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<serde_json::Value>>,
    /// The answer stops before the end of what the query produced.
    pub truncated: bool,
    /// Why it stops (row, cell or byte cap), when `truncated`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated_reason: Option<String>,
}

/// Longest string or blob a query may build or read (SQLITE_LIMIT_LENGTH):
/// enough for a 71k-character command line, small enough that the worst
/// quadratic built-in (`instr` of two maximal strings) stays well under a second.
pub const MAX_VALUE_BYTES: i32 = 128 << 10;

/// Pragmas that only describe the schema; their argument is a table or index name.
const READ_PRAGMAS: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
];

/// Functions that reach outside the database or change the connection.
const DENIED_FUNCTIONS: &[&str] = &[
    "load_extension",
    "fts3_tokenizer",
    "readfile",
    "writefile",
    "edit",
    "sqlite_dbpage",
];

/// Runs one read-only statement against `db` under `limits`. The file's
/// checks run under a command's budget (`DEFAULT_READ_TIMEOUT`), the
/// statement under `limits.timeout` from its first step: the `quick_check`
/// of a large table (3.7 s for the calls of a 10M-call trace) used to spend
/// the statement's 2 s and fail every `query` of such a file.
pub fn run_readonly_sql(db: &Path, sql: &str, limits: SqlLimits) -> Result<SqlResult, StoreError> {
    let budget = ReadBudget::new(crate::budget::DEFAULT_READ_TIMEOUT);
    run_readonly_sql_with(db, sql, &limits, &budget)
}

/// [`run_readonly_sql`] under a caller's budget (whichever stops first:
/// `limits.timeout` or the budget's deadline and cancellation).
pub fn run_readonly_sql_with(
    db: &Path,
    sql: &str,
    limits: &SqlLimits,
    outer: &ReadBudget,
) -> Result<SqlResult, StoreError> {
    run_checked_above(db, sql, limits, outer, full_check_bytes(), None)
}

/// [`run_readonly_sql_with`] for a reader that runs many statements on the
/// same files (MCP `sql`): the checks a file passed since it last changed,
/// kept in `memo`, are not run again (`checked`). The statement's own
/// limits are the same.
pub fn run_readonly_sql_remembered(
    db: &Path,
    sql: &str,
    limits: &SqlLimits,
    outer: &ReadBudget,
    memo: &CheckMemo,
) -> Result<SqlResult, StoreError> {
    run_checked_above(db, sql, limits, outer, full_check_bytes(), Some(memo))
}

/// [`run_readonly_sql_with`], the whole file checked when it is at most
/// `whole_check_bytes` long (tests lower it), else only the tables the
/// statement reads.
fn run_checked_above(
    db: &Path,
    sql: &str,
    limits: &SqlLimits,
    outer: &ReadBudget,
    whole_check_bytes: u64,
    memo: Option<&CheckMemo>,
) -> Result<SqlResult, StoreError> {
    if !crate::sqlite_config::memory_statistics_on() {
        // Without them SQLite does not enforce the heap limit below.
        return Err(StoreError::Query(
            "this process turned SQLite's memory statistics off: no caller's SQL runs without its heap limit".into(),
        ));
    }
    let before = memo.and_then(|_| FileIdentity::of(db));
    let mut conn = open_untrusted_unchecked(db)?;
    // The file checks run under the caller's budget, not the query's time limit.
    outer
        .watch(&mut conn)
        .map_err(|e| StoreError::Query(format!("cannot set up the time limit: {}", short(&e))))?;
    let (_, version) = crate::reader::check_is_trace(&conn, db)?;
    crate::reader::check_schema(&conn, db, version)?;
    // The identity once the connection has the file open (see `Trace::open_remembered`).
    let checks = match memo {
        Some(m) => m.checks_for(before, FileIdentity::of(db)),
        None => Checks::default(),
    };
    let whole = file_size(db) <= whole_check_bytes;
    if whole && !checks.lock().whole {
        integrity_check(&conn, db, outer)?;
        checks.lock().whole = true;
    }
    lower_heap_limit(limits.heap_bytes);
    sandbox(&mut conn)
        .map_err(|e| StoreError::Query(format!("cannot set up the sandbox: {}", short(&e))))?;
    if !whole {
        // A large file: `quick_check` of the tables this statement reads
        // (the authorizer names them while it is prepared; a view's tables
        // included), not of the whole file, which took 2.6-4.9 s on a
        // 10M-call trace before a one-row answer (issue 16).
        check_tables_read(&mut conn, db, sql, outer, &checks)?;
    }
    // The query's own clock starts now, after the file was opened and checked.
    let budget = outer.narrowed(limits.timeout);
    budget
        .watch(&mut conn)
        .map_err(|e| StoreError::Query(format!("cannot set up the time limit: {}", short(&e))))?;
    let mut stmt = conn.prepare(sql).map_err(|e| match e {
        rusqlite::Error::MultipleStatement => {
            StoreError::Query("exactly one statement per query (found more after the first)".into())
        }
        e => query_error(&e, &budget),
    })?;
    if !stmt.readonly() {
        return Err(StoreError::Query(
            "only read-only statements are allowed".into(),
        ));
    }
    let columns: Vec<String> = stmt.column_names().map(|s| s.to_string()).collect();
    let ncols = columns.len();
    let mut rows_out = Vec::new();
    let mut truncated_reason = None;
    let (mut cells, mut bytes) = (0usize, 0usize);
    let mut rows = stmt.query([]).map_err(|e| query_error(&e, &budget))?;
    'rows: loop {
        match rows.next() {
            Ok(Some(row)) => {
                if rows_out.len() == limits.max_rows {
                    truncated_reason = Some(format!("more than {} rows", limits.max_rows));
                    break;
                }
                if cells + ncols > limits.max_cells {
                    truncated_reason = Some(format!("more than {} cells", limits.max_cells));
                    break;
                }
                let mut vals = Vec::with_capacity(ncols);
                for i in 0..ncols {
                    let v = row.get_ref(i).map_err(|e| query_error(&e, &budget))?;
                    bytes += answer_bytes(v);
                    if bytes > limits.max_bytes {
                        truncated_reason =
                            Some(format!("more than {} bytes of values", limits.max_bytes));
                        break 'rows;
                    }
                    vals.push(to_json(v));
                }
                cells += ncols;
                rows_out.push(vals);
            }
            Ok(None) => break,
            Err(e) => return Err(query_error(&e, &budget)),
        }
    }
    Ok(SqlResult {
        columns,
        rows: rows_out,
        truncated: truncated_reason.is_some(),
        truncated_reason,
    })
}

/// What a value adds to the answer: its text (blobs in hex), 8 bytes per number.
fn answer_bytes(v: ValueRef<'_>) -> usize {
    match v {
        ValueRef::Null | ValueRef::Integer(_) | ValueRef::Real(_) => 8,
        ValueRef::Text(t) => t.len() + 2,
        ValueRef::Blob(b) => 2 * b.len() + 3,
    }
}

fn query_error(e: &rusqlite::Error, budget: &ReadBudget) -> StoreError {
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::OperationInterrupted) {
        StoreError::Query(
            budget
                .stop_reason()
                .unwrap_or_else(|| "interrupted".to_string()),
        )
    } else {
        StoreError::Query(short(e))
    }
}

/// Prepares `sql` once under an authorizer that makes the sandbox's
/// decisions and records every table read, then runs `quick_check` of those
/// tables (the authorizer is lifted for the check: it denies that pragma)
/// and puts the sandbox's authorizer back. A statement that does not
/// prepare is left to the real prepare, which reports it. Tables whose
/// check passed (`checks`) are not checked again; those checked here are
/// recorded there.
fn check_tables_read(
    conn: &mut Connection,
    db: &Path,
    sql: &str,
    budget: &ReadBudget,
    checks: &Checks,
) -> Result<(), StoreError> {
    let setup =
        |e: rusqlite::Error| StoreError::Query(format!("cannot set up the sandbox: {}", short(&e)));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let record = seen.clone();
    conn.authorizer(Some(move |ctx: AuthContext<'_>| {
        if let AuthAction::Read { table_name, .. } = ctx.action {
            if let Ok(mut s) = record.lock() {
                s.insert(table_name.to_string());
            }
        }
        authorize(ctx)
    }))
    .map_err(setup)?;
    drop(conn.prepare(sql));
    conn.authorizer(None::<fn(AuthContext<'_>) -> Authorization>)
        .map_err(setup)?;
    let read = seen.lock().map(|s| s.clone()).unwrap_or_default();
    let names: Vec<String> = crate::open::tables(conn)
        .map_err(setup)?
        .into_iter()
        .filter(|t| read.contains(t) && !checks.lock().table(t))
        .collect();
    crate::open::check_tables(conn, db, budget, &names)?;
    let mut passed = checks.lock();
    for n in &names {
        passed.pass_table(n);
    }
    drop(passed);
    conn.authorizer(Some(authorize)).map_err(setup)?;
    Ok(())
}

fn sandbox(conn: &mut Connection) -> rusqlite::Result<()> {
    conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)?;
    conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)?;
    conn.set_limit(Limit::SQLITE_LIMIT_SQL_LENGTH, 100_000)?;
    conn.set_limit(Limit::SQLITE_LIMIT_COLUMN, 200)?;
    conn.set_limit(Limit::SQLITE_LIMIT_EXPR_DEPTH, 100)?;
    conn.set_limit(Limit::SQLITE_LIMIT_COMPOUND_SELECT, 20)?;
    conn.set_limit(Limit::SQLITE_LIMIT_VDBE_OP, 100_000)?;
    conn.set_limit(Limit::SQLITE_LIMIT_FUNCTION_ARG, 16)?;
    conn.set_limit(Limit::SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 1_000)?;
    conn.set_limit(Limit::SQLITE_LIMIT_VARIABLE_NUMBER, 0)?;
    conn.set_limit(Limit::SQLITE_LIMIT_TRIGGER_DEPTH, 1)?;
    // Temporary b-trees (sorts, DISTINCT) stay in memory, under the heap limit.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.authorizer(Some(authorize))?;
    Ok(())
}

fn authorize(ctx: AuthContext<'_>) -> Authorization {
    match ctx.action {
        AuthAction::Select | AuthAction::Read { .. } | AuthAction::Recursive => {
            Authorization::Allow
        }
        AuthAction::Function { function_name } if !listed(DENIED_FUNCTIONS, function_name) => {
            Authorization::Allow
        }
        AuthAction::Pragma { pragma_name, .. } if listed(READ_PRAGMAS, pragma_name) => {
            Authorization::Allow
        }
        _ => Authorization::Deny,
    }
}

/// Whether `name` is in `list`: SQLite's function and pragma names are
/// case-insensitive, so the lists must be too.
fn listed(list: &[&str], name: &str) -> bool {
    list.iter().any(|l| l.eq_ignore_ascii_case(name))
}

/// Lowers SQLite's process-wide hard heap limit to `bytes` (never raises it).
fn lower_heap_limit(bytes: i64) {
    if bytes <= 0 {
        return;
    }
    // SAFETY: sqlite3_hard_heap_limit64 only reads/writes SQLite's global
    // limit under its own mutex; a negative argument queries without change.
    let current = unsafe { ffi::sqlite3_hard_heap_limit64(-1) };
    if current == 0 || current > bytes {
        // SAFETY: as above.
        unsafe { ffi::sqlite3_hard_heap_limit64(bytes) };
    }
}

/// The one key of the JSON object a BLOB cell becomes: its bytes in lowercase hex.
pub const BLOB_HEX_KEY: &str = "blob_hex";

fn to_json(v: ValueRef<'_>) -> serde_json::Value {
    match v {
        ValueRef::Null => serde_json::Value::Null,
        ValueRef::Integer(i) => serde_json::Value::from(i),
        ValueRef::Real(f) => serde_json::Number::from_f64(f)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null),
        ValueRef::Text(t) => serde_json::Value::String(String::from_utf8_lossy(t).into_owned()),
        // An object, so that a blob never reads as a text that happens to
        // spell `x'..'` (a consumer tells the two apart by the JSON type).
        ValueRef::Blob(b) => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            serde_json::json!({ BLOB_HEX_KEY: hex })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy of the demo trace whose `waits` b-tree root page is damaged.
    fn damaged_waits(dir: &Path) -> std::path::PathBuf {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-sim.db");
        let path = dir.join("t.db");
        std::fs::copy(src, &path).expect("copy");
        let (root, page): (i64, i64) = {
            let c = Connection::open(&path).expect("open");
            (
                c.query_row(
                    "SELECT rootpage FROM sqlite_master WHERE name = 'waits'",
                    [],
                    |r| r.get(0),
                )
                .expect("root"),
                c.query_row("PRAGMA page_size", [], |r| r.get(0))
                    .expect("page size"),
            )
        };
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[((root - 1) * page) as usize] = 0x42;
        std::fs::write(&path, bytes).expect("write");
        path
    }

    /// A BLOB and a TEXT that spells its literal were the same JSON string.
    #[test]
    fn a_blob_is_an_object_a_text_stays_a_string() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-sim.db");
        let r = run_readonly_sql(
            &src,
            "SELECT x'00ff10' AS b, 'x''00ff10''' AS t, zeroblob(0) AS e",
            SqlLimits::default(),
        )
        .expect("query");
        assert_eq!(r.rows[0][0], serde_json::json!({ "blob_hex": "00ff10" }));
        assert_eq!(r.rows[0][1], serde_json::json!("x'00ff10'"));
        assert_eq!(r.rows[0][2], serde_json::json!({ "blob_hex": "" }));
    }

    /// Above the whole-file threshold only the tables a statement reads are
    /// checked: damage elsewhere does not stop it, damage in a table it
    /// reads (directly or through a view's join) does; below, the whole file.
    #[test]
    fn large_files_check_the_tables_a_statement_reads() {
        let dir = std::env::temp_dir().join(format!("gs-sql-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = damaged_waits(&dir);
        let limits = SqlLimits::default();
        let budget = ReadBudget::new(Duration::from_secs(30));
        let run =
            |sql: &str, whole: u64| run_checked_above(&path, sql, &limits, &budget, whole, None);
        let ok = run("SELECT count(*) FROM processes", 0).expect("waits not read");
        assert_eq!(ok.rows.len(), 1);
        for sql in [
            "SELECT count(*) FROM waits",
            "SELECT p.pid FROM processes p JOIN waits w ON w.pid = p.pid LIMIT 1",
            "SELECT (SELECT count(*) FROM waits)",
        ] {
            let e = run(sql, 0).expect_err(sql).to_string();
            assert!(e.contains("damaged"), "{sql}: {e}");
        }
        let e = run("SELECT count(*) FROM processes", u64::MAX)
            .expect_err("whole file checked")
            .to_string();
        assert!(e.contains("damaged"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
