//! Helpers shared by the integration tests.
#![allow(dead_code)]

use sleuth_core::{
    op_by_name, CallEvent, Culprit, Event, ProcEvent, ProcKind, WaitEvent, WaitKind,
};
use sleuth_store::{Trace, TraceWriter, WriterOptions};
use std::path::{Path, PathBuf};

pub mod allocator_workload;
pub mod ingero;
#[path = "../../../gpusleuth/tests/common/skip.rs"]
mod skip;
#[allow(unused_imports)] // only some test files skip
pub use skip::skipped;

#[path = "../../../gpusleuth/tests/common/temp_dir.rs"]
mod temp_dir;
pub use temp_dir::TempDir;

pub mod run_cut;
pub mod trace_fixture;
pub use trace_fixture::{example, rewrite, session};

pub fn call(op: &str, pid: u32, tid: u32, ts: u64, dur: u64) -> CallEvent {
    CallEvent {
        ts_ns: ts,
        dur_ns: dur,
        pid,
        tid,
        op: op_by_name(op).expect("known op").id,
        cpu: 1,
        ..Default::default()
    }
}

pub fn preempted(pid: u32, tid: u32, off: u64, on: u64, culprits: Vec<Culprit>) -> WaitEvent {
    WaitEvent {
        pid,
        tid,
        kind: WaitKind::Preempted,
        off_ns: off,
        wake_ns: off,
        on_ns: on,
        prev_state: 0,
        cpu: 1,
        culprits,
        waker: None,
    }
}

pub fn culprit(pid: u32, comm: &str, ns: u64) -> Culprit {
    Culprit {
        pid,
        tid: pid,
        comm: comm.into(),
        ns,
    }
}

pub fn proc_event(
    kind: ProcKind,
    pid: u32,
    ts: u64,
    ppid: u32,
    code: i32,
    comm: &str,
) -> ProcEvent {
    ProcEvent {
        kind,
        ts_ns: ts,
        pid,
        tid: pid,
        ppid,
        exit_code: code,
        comm: comm.into(),
    }
}

/// A fresh folder and the path of `t.db` in it (the folder goes when the
/// `TempDir` is dropped, so the caller keeps it).
pub fn scratch_db(tag: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(tag);
    let path = dir.join("t.db");
    (dir, path)
}

/// A writer with default options on a fresh folder's `t.db`.
pub fn new_trace(tag: &str) -> (TempDir, PathBuf, TraceWriter) {
    let (dir, path) = scratch_db(tag);
    let w = TraceWriter::create(&path, session(), WriterOptions::default()).expect("create");
    (dir, path, w)
}

/// [`small_trace`] written to a fresh folder's `t.db`.
pub fn small_trace_in(tag: &str) -> (TempDir, PathBuf) {
    let (dir, path) = scratch_db(tag);
    small_trace(&path);
    (dir, path)
}

/// Writes a small finished trace: calls of two processes, a wait with a culprit.
pub fn small_trace(path: &Path) {
    let w = TraceWriter::create(path, session(), WriterOptions::default()).expect("create");
    let h = w.handle();
    let mut malloc = call("cudaMalloc", 100, 100, 2_000, 1_000);
    malloc.size = Some(4096);
    malloc.ptr = Some(0x7f00_0000_1000);
    malloc.runnable_ns = 400;
    h.send(Event::Call(malloc)).unwrap();
    h.send(Event::Call(call("cudaLaunchKernel", 100, 101, 5_000, 10)))
        .unwrap();
    h.send(Event::Call(call("cuMemAlloc_v2", 200, 200, 3_000, 50)))
        .unwrap();
    h.send(Event::Wait(preempted(
        100,
        100,
        2_100,
        2_500,
        vec![culprit(300, "hog", 400)],
    )))
    .unwrap();
    h.set_session_end(9_000).unwrap();
    drop(h);
    w.finish().expect("finish");
}

/// Whether the trace carries a note whose text contains `text`.
pub fn has_note(t: &sleuth_store::Trace, text: &str) -> bool {
    t.notes()
        .expect("read notes")
        .iter()
        .any(|n| n.text.contains(text))
}

/// Calls per op as stored in the trace at `db`, read back through the SQL sandbox.
pub fn stored_counts(db: &Path) -> std::collections::BTreeMap<String, u64> {
    let stored = sleuth_store::run_readonly_sql(
        db,
        "SELECT op, count(*) FROM calls GROUP BY op",
        sleuth_store::SqlLimits::default(),
    )
    .expect("count the stored calls");
    stored
        .rows
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_u64().unwrap()))
        .collect()
}

/// An example trace written again through today's writer (so with rollups,
/// in today's schema version), in a temporary folder kept alive by the
/// returned guard.
pub fn rewritten(name: &str, tag: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(tag);
    let data = Trace::open(&example(name)).unwrap().load(None).unwrap();
    assert!(!data.calls.is_empty(), "{name} has calls");
    let path = dir.join("again.db");
    rewrite(&data, &path);
    (dir, path)
}

/// SQL that turns a file's `call_rows` and `waits` into version 5's, every
/// column stored (version 6 computes `pid`, a wait's `kind` and its blocked
/// and runnable parts), the tables as that version wrote them
/// (`older_tables`), for the tests that make an older file out of a fresh
/// one.
pub fn rows_as_version_5() -> String {
    use sleuth_store::older_tables::{CALL_ROWS_V5, WAITS_V5};
    format!(
        "CREATE TABLE call_rows_v6 AS SELECT id, ts_ns, dur_ns, pid, tid, op_id, ret, size, ptr,
            stream, kind, nested, runnable_ns, blocked_ns, cpu, stack_id FROM call_rows;
        DROP TABLE call_rows;
        {CALL_ROWS_V5};
        INSERT INTO call_rows SELECT * FROM call_rows_v6;
        DROP TABLE call_rows_v6;
        CREATE INDEX call_rows_stack ON call_rows(stack_id) WHERE stack_id IS NOT NULL;
        CREATE INDEX call_rows_op_dur ON call_rows(op_id, dur_ns);
        CREATE INDEX call_rows_tid_ts ON call_rows(tid, ts_ns);
        CREATE TABLE waits_v6 AS SELECT id, pid, tid, kind, off_ns, wake_ns, on_ns, prev_state,
            cpu, blocked_ns, runnable_ns FROM waits;
        DROP TABLE waits;
        {WAITS_V5};
        INSERT INTO waits SELECT * FROM waits_v6;
        DROP TABLE waits_v6;
        CREATE INDEX waits_tid_on ON waits(tid, on_ns);"
    )
}
