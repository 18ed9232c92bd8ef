//! A run of `trace --rotate` written by hand: files of 100 ms from 100 ms,
//! linked as the tracer links them (the carried ledger included), holding
//! the calls and lifecycle events a test gives each.

#![allow(dead_code)]

use sleuth_core::{CallEvent, Event};
use sleuth_store::{SessionInfo, TraceWriter, WriterOptions};
use std::path::Path;

/// A call of `op` by `pid` (its main thread) at `ts_ns`, 1 µs long.
pub fn call(op: &str, pid: u32, ts_ns: u64) -> CallEvent {
    CallEvent {
        ts_ns,
        dur_ns: 1_000,
        pid,
        tid: pid,
        op: sleuth_core::op_by_name(op).map(|o| o.id).expect("known op"),
        ..Default::default()
    }
}

/// A cudaFree of `ptr`.
pub fn free(pid: u32, ts_ns: u64, ptr: u64) -> CallEvent {
    CallEvent {
        ptr: Some(ptr),
        ..call("cudaFree", pid, ts_ns)
    }
}

/// A cudaMalloc of `bytes` at `ptr`.
pub fn malloc(pid: u32, ts_ns: u64, bytes: u64, ptr: u64) -> CallEvent {
    CallEvent {
        size: Some(bytes),
        ptr: Some(ptr),
        ..call("cudaMalloc", pid, ts_ns)
    }
}

/// A sleep of `pid`'s main thread from `off_ns` to `on_ns`, all of it blocked.
pub fn blocked(pid: u32, off_ns: u64, on_ns: u64) -> Event {
    Event::Wait(sleuth_core::WaitEvent {
        pid,
        tid: pid,
        kind: sleuth_core::WaitKind::Blocked,
        off_ns,
        wake_ns: on_ns,
        on_ns,
        prev_state: 1,
        cpu: 0,
        culprits: vec![],
        waker: None,
    })
}

/// A lifecycle event of `pid` (named `comm`) at `ts_ns`.
pub fn proc_event(kind: sleuth_core::ProcKind, pid: u32, ts_ns: u64, comm: &str) -> Event {
    Event::Proc(sleuth_core::ProcEvent {
        kind,
        ts_ns,
        pid,
        tid: pid,
        ppid: 1,
        exit_code: 0,
        comm: comm.into(),
    })
}

/// Files 1 to 3 of a run in `run`, 100 ms each from 100 ms, file n
/// holding `events(n)`.
pub fn write_three_files(run: &Path, events: impl Fn(u64) -> Vec<Event>) {
    std::fs::create_dir_all(run).unwrap();
    let link = sleuth_store::run_ledger::RunLink::new_run();
    let ms = 1_000_000u64;
    for n in 1..=3u64 {
        let start = 100 * ms * n;
        let info = SessionInfo {
            started_unix_ns: 1_700_000_000_000_000_000,
            start_mono_ns: start,
            hostname: "testhost".into(),
            tool_version: "test".into(),
            ..Default::default()
        };
        let opts = WriterOptions {
            run: Some(link.for_file(n)),
            ..Default::default()
        };
        let path = run.join(sleuth_store::run::part_name(n));
        let w = TraceWriter::create(&path, info, opts).expect("create");
        let h = w.handle();
        for e in events(n) {
            h.send(e).unwrap();
        }
        h.set_session_end(start + 100 * ms).unwrap();
        drop(h);
        w.finish().expect("finish");
    }
}
