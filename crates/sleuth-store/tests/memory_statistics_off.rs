//! A process that turned SQLite's memory statistics off (as `trace` does)
//! still writes and reads traces, and its SQL sandbox refuses to run: the
//! heap limit it sets is only enforced while SQLite counts its allocations.
//! A test binary of its own: the setting is process-wide and must come
//! before SQLite's first connection.

mod common;
use common::*;
use sleuth_store::{run_readonly_sql, turn_off_memory_statistics, SqlLimits, Trace};

#[test]
fn without_memory_statistics_traces_work_and_the_sql_sandbox_refuses() {
    assert!(turn_off_memory_statistics(), "before the first connection");
    let (_dir, db) = small_trace_in("memstat-off");
    // SAFETY: a read of SQLite's global counter.
    let used = unsafe { rusqlite::ffi::sqlite3_memory_used() };
    assert_eq!(used, 0, "SQLite no longer counts its allocations");
    assert!(!turn_off_memory_statistics(), "SQLite is initialized now");
    let t = Trace::open(&db).unwrap();
    assert!(!t.load(None).unwrap().calls.is_empty());
    let err = run_readonly_sql(&db, "SELECT count(*) FROM calls", SqlLimits::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("memory statistics"), "{err}");
    assert!(!err.contains('\n'), "one line: {err}");
}
