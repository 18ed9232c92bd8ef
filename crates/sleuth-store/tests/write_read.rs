//! Write a trace, read it back: round trip, file mode, culprits, processes,
//! the size cap, and clear errors for files that are not traces.

mod common;
use common::*;
use sleuth_core::{Event, OpCount, ProcKind, ProcessInfo};
use sleuth_store::{
    CallFilter, CallOrder, LibraryInfo, NoteLevel, StoreError, Trace, TraceSource, TraceWriter,
    WaitFilter, WriterOptions,
};
use std::os::unix::fs::PermissionsExt;

/// The slowest call of the trace, as `calls_filtered` returns it (at most one).
fn slowest_call(t: &Trace) -> Vec<sleuth_store::StoredCall> {
    t.calls_filtered(&CallFilter {
        order: CallOrder::ByDurationDesc,
        limit: Some(1),
        ..Default::default()
    })
    .expect("the slowest call")
}

/// [`small_trace_in`], opened.
fn opened_small_trace(tag: &str) -> (TempDir, Trace) {
    let (dir, path) = small_trace_in(tag);
    let t = Trace::open(&path).expect("open the small trace");
    (dir, t)
}

#[test]
fn round_trip_preserves_every_field() {
    let (_dir, path, w) = new_trace("rt");
    let h = w.handle();
    let mut c = call("cudaMemcpyAsync", 10, 11, 5_000, 700);
    c.size = Some(1 << 20);
    c.ptr = Some(u64::MAX - 5); // above i64::MAX: stored bit for bit
    c.stream = Some(0xdead);
    c.kind = Some(1);
    c.ret = 2;
    c.runnable_ns = 100;
    c.blocked_ns = 300;
    c.nested = true;
    c.cpu = 3;
    let early = call("cudaFree", 10, 11, 1_500, 5);
    h.send(Event::Call(c.clone())).unwrap();
    h.send(Event::Call(early.clone())).unwrap();
    let wait = preempted(
        10,
        11,
        5_100,
        5_200,
        vec![culprit(99, "stress", 80), culprit(98, "x", 20)],
    );
    h.send(Event::Wait(wait.clone())).unwrap();
    h.add_library(LibraryInfo {
        path: "/usr/lib/libcudart.so.13".into(),
        layer: Some(sleuth_core::Layer::Runtime),
        dev: Some(2049),
        ino: Some(77),
        attached_mono_ns: Some(1_200),
        probes: 18,
        missing: vec!["cudaGraphLaunch".into()],
    })
    .unwrap();
    h.add_note(NoteLevel::Warn, "late attach: libcudart mapped after start")
        .unwrap();
    h.set_stat("drop_ring_full_call", 7).unwrap();
    h.set_op_counts(vec![OpCount {
        pid: 10,
        op: 13,
        count: 123_456,
    }])
    .unwrap();
    h.set_process(ProcessInfo {
        pid: 10,
        comm: "python3".into(),
        cmdline: "python3 train.py".into(),
        ..Default::default()
    })
    .unwrap();
    h.send(Event::Proc(proc_event(
        ProcKind::Exit,
        10,
        8_000,
        0,
        256,
        "python3",
    )))
    .unwrap();
    h.set_session_end(9_000).unwrap();
    drop(h);
    let sum = w.finish().unwrap();
    assert_eq!(
        (sum.calls_stored, sum.waits_stored, sum.proc_events_stored),
        (2, 1, 1)
    );

    let t = Trace::open(&path).unwrap();
    assert_eq!(t.source(), TraceSource::Gpusleuth);
    let s = t.session().unwrap();
    assert_eq!(s.info, session());
    assert_eq!(s.end_mono_ns, Some(9_000));
    let data = t.load(None).unwrap();
    assert!(data.has_host_context);
    assert_eq!(data.calls, vec![early, c], "sorted by ts, fields intact");
    assert_eq!(data.waits, vec![wait]);
    assert_eq!(
        data.counts,
        vec![OpCount {
            pid: 10,
            op: 13,
            count: 123_456
        }]
    );
    assert_eq!(data.stats["events_call"], 2);
    assert_eq!(data.stats["events_wait"], 1);
    assert_eq!(data.stats["drop_ring_full_call"], 7);
    assert_eq!(data.stats["drop_db_full"], 0);
    for i in 0..sleuth_core::record::stat::MAX {
        let name = sleuth_store::drop_stat_name(i).unwrap();
        assert!(data.stats.contains_key(&name), "{name}");
    }
    assert_eq!(
        data.stats["edge_return_without_entry"], 0,
        "an edge, not a drop"
    );
    assert!(!data.stats.contains_key("drop_unmatched_return"));
    assert_eq!(data.stats["edge_call_open_at_end"], 0);
    assert_eq!(data.start_ns, Some(1_000));
    assert_eq!(data.end_ns, Some(9_000));
    assert_eq!(data.realtime_offset_ns, session().realtime_offset_ns);
    let p = data.process(10).unwrap();
    assert_eq!(
        (p.comm.as_str(), p.cmdline.as_str()),
        ("python3", "python3 train.py")
    );
    assert_eq!((p.exit_ns, p.exit_code), (Some(8_000), Some(256)));
    assert_eq!(
        p.start_ns,
        Some(1_500),
        "first call of a process without fork/exec"
    );
    let libs = t.libraries().unwrap();
    assert_eq!(libs.len(), 1);
    assert_eq!(libs[0].missing, vec!["cudaGraphLaunch".to_string()]);
    assert_eq!(libs[0].ino, Some(77));
    let notes = t.notes().unwrap();
    assert!(notes
        .iter()
        .any(|n| n.level == "warn" && n.text.contains("late attach")));
}

#[test]
fn file_is_private_and_never_overwritten_by_default() {
    let (_dir, path) = small_trace_in("mode");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let before = std::fs::read(&path).unwrap();
    let err = TraceWriter::create(&path, session(), WriterOptions::default())
        .err()
        .expect("refused");
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let w = TraceWriter::create(
        &path,
        session(),
        WriterOptions {
            overwrite: true,
            ..Default::default()
        },
    )
    .unwrap();
    w.finish().unwrap();
    assert_eq!(
        Trace::open(&path).unwrap().load(None).unwrap().calls.len(),
        0
    );
    // The file is written under a hidden name first and then named (a
    // tracer killed as it starts a file leaves no file without its schema):
    // nothing else is left beside it, and the name is private too.
    let names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["t.db".to_string()]);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn wal_files_are_private_while_writing() {
    let (dir, _path, w) = new_trace("walmode");
    let h = w.handle();
    h.send(Event::Call(call("cudaMalloc", 1, 1, 10, 10)))
        .unwrap();
    assert_eq!(h.flush().unwrap(), 1);
    for suffix in ["-wal", "-shm"] {
        let p = dir.join(&format!("t.db{suffix}"));
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{suffix}");
    }
    drop(h);
    w.finish().unwrap();
    assert!(
        !dir.join("t.db-wal").exists(),
        "finish leaves one self-contained file"
    );
}

#[test]
fn culprits_are_joined_at_finish_and_queryable_by_call_id() {
    let (_dir, t) = opened_small_trace("culprits");
    let slow = slowest_call(&t);
    assert_eq!(slow.len(), 1);
    assert_eq!(slow[0].call.op_name(), "cudaMalloc");
    let map = t.call_culprits_of(&[slow[0].id]).unwrap();
    // The wait's runnable part [2100, 2500) lies inside the call [2000, 3000): all 400 ns go to "hog".
    assert_eq!(map[&slow[0].id], vec![culprit(300, "hog", 400)]);
    let other = t
        .calls_filtered(&CallFilter {
            pid: Some(200),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(other.len(), 1);
    assert!(t.call_culprits_of(&[other[0].id]).unwrap().is_empty());
}

#[test]
fn a_pid_not_in_the_trace_is_an_error_naming_the_pids_it_holds() {
    let (_dir, t) = opened_small_trace("nopid");
    // Calls of 100 and 200; 300 appears only as a culprit, not as a traced process.
    assert_eq!(t.pids().unwrap(), vec![100, 200]);
    let e = t.load(Some(424242)).expect_err("absent pid").to_string();
    assert!(
        e.contains("pid 424242 is not in this trace (it holds pid 100, 200)"),
        "{e}"
    );
    assert!(e.contains("t.db") && !e.contains('\n'), "{e}");
    assert!(t.load(Some(200)).is_ok());
}

#[test]
fn filters_select_by_pid_op_and_window() {
    let (_dir, t) = opened_small_trace("filter");
    let by_op = t
        .calls_filtered(&CallFilter {
            op: Some("cuMemAlloc_v2".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        by_op.iter().map(|c| c.call.pid).collect::<Vec<_>>(),
        vec![200]
    );
    let window = t
        .calls_filtered(&CallFilter {
            since_ns: Some(2_500),
            until_ns: Some(5_000),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        window.iter().map(|c| c.call.ts_ns).collect::<Vec<_>>(),
        vec![3_000]
    );
    assert_eq!(t.load(Some(100)).unwrap().calls.len(), 2);
    assert_eq!(
        t.waits_filtered(&WaitFilter {
            pid: Some(200),
            ..Default::default()
        })
        .unwrap()
        .len(),
        0
    );
    assert_eq!(
        t.waits_filtered(&WaitFilter {
            tid: Some(100),
            ..Default::default()
        })
        .unwrap()
        .len(),
        1
    );
}

#[test]
fn lifecycle_events_complete_processes() {
    let (_dir, path, w) = new_trace("procs");
    let h = w.handle();
    h.send(Event::Proc(proc_event(
        ProcKind::Fork,
        51,
        100,
        50,
        0,
        "python3",
    )))
    .unwrap();
    h.send(Event::Proc(proc_event(
        ProcKind::Exec,
        51,
        200,
        0,
        0,
        "worker",
    )))
    .unwrap();
    h.send(Event::Proc(proc_event(
        ProcKind::OomVictim,
        51,
        250,
        0,
        0,
        "worker",
    )))
    .unwrap();
    h.send(Event::Proc(proc_event(
        ProcKind::Exit,
        51,
        300,
        0,
        9,
        "worker",
    )))
    .unwrap();
    drop(h);
    w.finish().unwrap();
    let t = Trace::open(&path).unwrap();
    let p = t
        .processes()
        .unwrap()
        .into_iter()
        .find(|p| p.pid == 51)
        .unwrap();
    assert_eq!(p.ppid, Some(50));
    assert_eq!(p.comm, "worker");
    assert_eq!(
        (p.start_ns, p.exit_ns, p.exit_code, p.oom_victim),
        (Some(100), Some(300), Some(9), true)
    );
    assert_eq!(t.load(Some(51)).unwrap().procs.len(), 4);
}

#[test]
fn size_cap_counts_instead_of_storing_and_keeps_aggregates() {
    let (_dir, path) = scratch_db("cap");
    let opts = WriterOptions {
        max_db_bytes: 64 * 1024,
        batch_events: 100,
        ..Default::default()
    };
    let w = TraceWriter::create(&path, session(), opts).unwrap();
    let h = w.handle();
    let total = 5_000u64;
    for i in 0..total {
        h.send(Event::Call(call("cudaMalloc", 1, 1, i * 10, 5)))
            .unwrap();
        if i % 100 == 99 {
            h.flush().unwrap();
        }
    }
    h.set_op_counts(vec![OpCount {
        pid: 1,
        op: 13,
        count: 42,
    }])
    .unwrap();
    // Call sites past the cap are not events: counted apart (round 51:
    // they were in `drop_db_full`, which then exceeded the events lost).
    for id in 1..=3 {
        h.add_stack(sleuth_core::sites::Stack {
            id,
            pid: 1,
            frames: vec![sleuth_core::testing::py_frame("/w/a.py", id as u32, "f")],
            notes: vec![],
        })
        .unwrap();
    }
    drop(h);
    let sum = w.finish().unwrap();
    assert!(
        sum.dropped_db_full > 0,
        "cap must be reached by 5000 calls in 64 KiB"
    );
    assert_eq!(sum.calls_stored + sum.dropped_db_full, total);
    let t = Trace::open(&path).unwrap();
    let data = t.load(None).unwrap();
    assert_eq!(data.calls.len() as u64, sum.calls_stored);
    assert_eq!(data.stats["drop_db_full"], sum.dropped_db_full);
    assert_eq!(data.stats["stacks_db_full"], 3);
    assert_eq!(data.stats["events_call"], total);
    assert_eq!(data.counts.len(), 1, "aggregates still stored past the cap");
    assert!(has_note(&t, "size cap"));
}

#[test]
fn handles_fail_cleanly_after_finish() {
    let (_dir, _path, w) = new_trace("gone");
    let h = w.handle();
    w.finish().unwrap();
    let err = h
        .send(Event::Call(call("cudaMalloc", 1, 1, 1, 1)))
        .expect_err("closed");
    assert!(matches!(err, StoreError::WriterGone(_)));
}

fn open_err(path: &std::path::Path) -> String {
    let e = Trace::open(path).err().expect("must fail").to_string();
    assert!(!e.contains('\n'), "one line: {e}");
    assert!(
        e.contains(&path.display().to_string()),
        "names the path: {e}"
    );
    e
}

#[test]
fn bad_files_give_one_line_errors_naming_the_path() {
    let dir = TempDir::new("bad");
    assert!(open_err(&dir.join("missing.db")).contains("no such file"));

    let text = dir.join("text.db");
    std::fs::write(
        &text,
        b"hello, I am not a database at all, just some text\n".repeat(100),
    )
    .unwrap();
    open_err(&text);

    let foreign = dir.join("foreign.db");
    {
        let c = rusqlite::Connection::open(&foreign).unwrap();
        c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
    }
    assert!(open_err(&foreign).contains("not a gpusleuth trace"));

    // A real trace with its b-tree pages overwritten in the middle.
    let corrupt = dir.join("corrupt.db");
    small_trace(&corrupt);
    let mut bytes = std::fs::read(&corrupt).unwrap();
    assert!(bytes.len() > 8192);
    let page = 4096;
    let end = bytes.len() - page;
    for b in &mut bytes[page..end] {
        *b = 0xA5;
    }
    std::fs::write(&corrupt, &bytes).unwrap();
    open_err(&corrupt);

    let truncated = dir.join("truncated.db");
    small_trace(&truncated);
    let bytes = std::fs::read(&truncated).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    open_err(&truncated);
}

#[test]
fn gpu_samples_round_trip_and_absent_means_not_captured() {
    use sleuth_core::{GpuSample, ProcessGpuSample, SamplePhase};
    let dir = TempDir::new("gpu");
    let none = dir.join("none.db");
    let w = TraceWriter::create(&none, session(), WriterOptions::default()).unwrap();
    w.finish().unwrap();
    let t = Trace::open(&none).unwrap();
    assert_eq!(t.gpu_samples().unwrap(), None, "no samples: not captured");
    assert!(t.process_gpu_samples(None).unwrap().is_empty());

    let path = dir.join("t.db");
    let w = TraceWriter::create(&path, session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    let g = vec![
        GpuSample {
            ts_ns: 2_000,
            gpu: 0,
            busy_pct: 9.5,
            period_ns: 200_000_000,
        },
        GpuSample {
            ts_ns: 1_000,
            gpu: 1,
            busy_pct: 100.0,
            period_ns: 200_000_000,
        },
    ];
    h.add_gpu_samples(g.clone()).unwrap();
    let p = vec![
        ProcessGpuSample {
            ts_ns: 1_500,
            gpu: 0,
            pid: 10,
            used_bytes: Some(1 << 30),
            sm_pct: None,
            phase: SamplePhase::Start,
        },
        ProcessGpuSample {
            ts_ns: 2_500,
            gpu: 0,
            pid: 11,
            used_bytes: None,
            sm_pct: Some(42.0),
            phase: SamplePhase::End,
        },
    ];
    h.add_process_gpu_samples(p.clone()).unwrap();
    w.finish().unwrap();
    let t = Trace::open(&path).unwrap();
    assert_eq!(
        t.gpu_samples().unwrap(),
        Some(vec![g[1], g[0]]),
        "sorted by time"
    );
    assert_eq!(t.process_gpu_samples(None).unwrap(), p);
    assert_eq!(t.process_gpu_samples(Some(11)).unwrap(), vec![p[1]]);
    let d = t.load(Some(10)).unwrap();
    assert_eq!(
        d.gpu_samples.map(|s| s.len()),
        Some(2),
        "device samples are not per process"
    );
    assert_eq!(d.process_gpu, vec![p[0]]);
}

#[test]
fn call_sites_round_trip_and_older_traces_have_none() {
    use sleuth_core::sites::{Frame, FrameKind, Stack};
    use sleuth_core::testing::py_frame;
    let (_dir, path, w) = new_trace("sites");
    let h = w.handle();
    let id = u64::MAX - 7; // a 64-bit hash: stored bit for bit
    let stack = Stack {
        id,
        pid: 10,
        frames: vec![
            py_frame("/w/train.py", 42, "Model.forward"),
            Frame {
                kind: Some(FrameKind::Native),
                function: Some("cudaMalloc".into()),
                module: Some("/x/libcudart.so.13".into()),
                addr: Some(0x7f00_0000_1234),
                ..Default::default()
            },
        ],
        notes: vec!["native frames truncated at 32".into()],
    };
    h.add_stack(stack.clone()).unwrap();
    h.add_stack(stack.clone()).unwrap(); // sent again after an LRU eviction: stored once
    let mut c = call("cudaMalloc", 10, 11, 1_000, 50);
    c.size = Some(4096);
    c.ptr = Some(0xabc);
    c.stack_id = Some(id);
    h.send(Event::Call(c.clone())).unwrap();
    h.send(Event::Call(call("cudaFree", 10, 11, 2_000, 5)))
        .unwrap();
    drop(h);
    w.finish().unwrap();

    let t = Trace::open(&path).unwrap();
    let data = t.load(None).unwrap();
    assert_eq!(data.stacks.len(), 1);
    assert_eq!(data.stacks[&id], stack);
    assert_eq!(
        data.stacks[&id].site_label(),
        "/w/train.py:42 Model.forward"
    );
    assert_eq!(data.calls[0].stack_id, Some(id));
    assert_eq!(data.calls[1].stack_id, None);
    let slow = slowest_call(&t);
    assert_eq!(slow[0].call.stack_id, Some(id));

    // A trace written before call sites existed loads, with none.
    let old =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/h200-contention.db");
    let data = Trace::open(&old).unwrap().load(None).unwrap();
    assert!(data.stacks.is_empty());
    assert!(!data.calls.is_empty() && data.calls.iter().all(|c| c.stack_id.is_none()));
}

/// Issue 15: ring-buffer decode failures reported by the capture side reach
/// `stats.decode_errors`; the writer's own per-batch counters never
/// overwrite them (they used to, in the same and every later batch).
#[test]
fn decode_failures_reported_by_the_capture_side_are_kept() {
    let (_dir, path, w) = new_trace("decode");
    let h = w.handle();
    h.set_stat("decode_errors", 3).unwrap();
    h.send(Event::Call(call("cudaMalloc", 10, 11, 2_000, 50)))
        .unwrap();
    h.flush().unwrap();
    // A later batch with events: the writer rewrites its counters.
    h.send(Event::Call(call("cudaFree", 10, 11, 3_000, 50)))
        .unwrap();
    h.flush().unwrap();
    w.finish().unwrap();
    let t = Trace::open(&path).unwrap();
    assert_eq!(t.stats().unwrap()["decode_errors"], 3);
    assert_eq!(t.stats().unwrap()["events_call"], 2);
}

/// Batches through `send_batch`: plain calls are stored many rows per
/// statement, calls whose row id is needed (a host pointer, NCCL arguments)
/// one by one in between. Every row must come back in the order sent, with
/// its own host pointer and NCCL arguments, and an unknown op stored nowhere.
#[test]
fn batched_events_keep_their_order_ids_host_pointers_and_nccl_rows() {
    let (_dir, path, w) = new_trace("batch");
    let h = w.handle();
    let mut evs = Vec::new();
    // 3 batches; 100 events each: runs of plain calls longer and shorter
    // than one multi-row INSERT, split by calls with host pointers and NCCL.
    for b in 0..3u64 {
        let mut batch = Vec::new();
        for i in 0..100u64 {
            let n = b * 100 + i;
            let ts = 1_000 + n * 10;
            let ev = if n % 37 == 5 {
                Event::Nccl(sleuth_core::nccl::NcclEvent {
                    call: call("ncclAllReduce", 10, 11, ts, 5),
                    count: Some(n),
                    ..Default::default()
                })
            } else {
                let mut c = call("cudaMemcpy", 10, 11, ts, 5);
                c.size = Some(n);
                if n % 11 == 3 {
                    c.host_ptr = Some(0x7000_0000 + n);
                }
                Event::Call(c)
            };
            evs.push(ev.clone());
            batch.push(ev);
        }
        if b == 1 {
            // Not an op: counted as a decode error, stored nowhere.
            batch.insert(
                50,
                Event::Call(sleuth_core::CallEvent {
                    op: 60_000,
                    ..call("cudaFree", 10, 11, 1, 1)
                }),
            );
        }
        h.send_batch(batch).unwrap();
    }
    h.send_batch(Vec::new()).unwrap();
    drop(h);
    let summary = w.finish().unwrap();
    assert_eq!(summary.calls_stored, 300);
    let db = rusqlite::Connection::open(&path).unwrap();
    let rows: Vec<(i64, i64, Option<i64>)> = db
        .prepare("SELECT id, ts_ns, size FROM call_rows ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), 300);
    let host: std::collections::HashMap<i64, i64> = db
        .prepare("SELECT call_id, host_ptr FROM call_host_ptrs")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let nccl: std::collections::HashMap<i64, i64> = db
        .prepare("SELECT call_id, count FROM nccl_calls")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (k, ((id, ts, size), ev)) in rows.iter().zip(&evs).enumerate() {
        let n = k as u64;
        assert_eq!(*id, k as i64 + 1, "row ids follow the order sent");
        assert_eq!(*ts as u64, 1_000 + n * 10, "row {k}");
        match ev {
            Event::Nccl(e) => {
                assert_eq!(nccl.get(id).copied(), e.count.map(|c| c as i64), "row {k}");
                assert_eq!(*size, None);
            }
            Event::Call(c) => {
                assert_eq!(*size, Some(n as i64), "row {k}");
                assert_eq!(
                    host.get(id).copied(),
                    c.host_ptr.map(|p| p as i64),
                    "row {k}"
                );
                assert!(!nccl.contains_key(id), "row {k}");
            }
            _ => unreachable!(),
        }
    }
    assert_eq!(
        host.len(),
        evs.iter()
            .filter(|e| matches!(e, Event::Call(c) if c.host_ptr.is_some()))
            .count()
    );
    assert_eq!(
        nccl.len(),
        evs.iter().filter(|e| matches!(e, Event::Nccl(_))).count()
    );
    let t = Trace::open(&path).unwrap();
    let stats = t.stats().unwrap();
    assert_eq!(stats.get("events_call"), Some(&301));
    assert_eq!(stats.get("decode_errors"), Some(&1));
}

/// The writer binds a call's parameters only where they changed since the
/// statement's previous row in that place (SQLite keeps bindings across a
/// reset): calls whose every field changes, appears or disappears from one
/// row to the next, in batches of uneven sizes (multi-row INSERTs, the
/// single-row rest, calls stored alone for their host pointer) and across
/// transactions, read back exactly as sent.
#[test]
fn calls_whose_fields_change_row_to_row_read_back_exactly() {
    let (_dir, path, w) = new_trace("binds");
    let h = w.handle();
    let ops = [
        "cudaLaunchKernel",
        "cuLaunchKernel",
        "cudaMemcpy",
        "cudaMalloc",
        "cudaFree",
    ];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut sent = Vec::new();
    for i in 0..300u64 {
        let r = next();
        let pick = |shift: u32, n: u64| (r >> shift) % n;
        let op = ops[pick(0, 5) as usize];
        let mut c = call(
            op,
            10 + pick(3, 2) as u32,
            1 + pick(5, 3) as u32,
            1_000 + i * 10,
            1 + pick(7, 9),
        );
        let some = |bit: u32, v: u64| (r >> bit & 1 == 1).then_some(v);
        c.ret = if pick(9, 4) == 0 { 2 } else { 0 };
        c.size = some(11, 4096 << pick(12, 4));
        c.ptr = some(14, u64::MAX - pick(15, 3));
        c.stream = some(17, pick(18, 2));
        c.kind = some(19, pick(20, 3));
        c.nested = r >> 22 & 1 == 1;
        c.runnable_ns = pick(23, 3) * 7;
        c.blocked_ns = pick(25, 2) * 11;
        c.cpu = pick(27, 4) as u32;
        c.stack_id = some(29, pick(30, 3) + 1);
        if op == "cudaMemcpy" {
            c.host_ptr = some(32, 0x7000 + pick(33, 4));
        }
        sent.push(c);
    }
    let mut at = 0;
    for (k, n) in [1usize, 31, 32, 33, 64, 5, 70, 64].into_iter().enumerate() {
        let batch: Vec<Event> = sent[at..at + n].iter().cloned().map(Event::Call).collect();
        h.send_batch(batch).unwrap();
        if k % 2 == 1 {
            h.flush().unwrap();
        }
        at += n;
    }
    assert_eq!(at, sent.len());
    drop(h);
    assert_eq!(w.finish().unwrap().calls_stored, sent.len() as u64);
    let data = Trace::open(&path).unwrap().load(None).unwrap();
    assert_eq!(data.calls.len(), sent.len());
    for (got, want) in data.calls.iter().zip(&sent) {
        assert_eq!(got, want);
    }
}

/// Version 6 stores a wait's wake-up and return as the time blocked and
/// runnable before them and its pid as its thread's distance to it: every
/// time, pid and kind reads back exactly, times out of order included
/// (their blocked and runnable parts then 0, as `WaitEvent` says).
#[test]
fn a_waits_times_pid_and_kind_read_back_exactly() {
    let (_dir, path, w) = new_trace("waits_v6");
    let h = w.handle();
    let blocked = sleuth_core::WaitEvent {
        kind: sleuth_core::WaitKind::Blocked,
        wake_ns: 1_500,
        prev_state: 1,
        ..preempted(3_000_000, 3_000_007, 1_000, 1_600, vec![])
    };
    // A switch-in settled from the thread's CPU time can date the wake-up
    // before the switch-out: kept as it was measured.
    let odd = sleuth_core::WaitEvent {
        wake_ns: 1_990,
        ..preempted(3_000_000, 2_999_990, 2_000, 1_980, vec![])
    };
    for w in [&blocked, &odd] {
        h.send(Event::Wait(w.clone())).unwrap();
    }
    drop(h);
    w.finish().unwrap();
    let t = Trace::open(&path).unwrap();
    let mut got = t.load(None).unwrap().waits;
    got.sort_by_key(|w| w.off_ns);
    assert_eq!(got, vec![blocked.clone(), odd.clone()]);
    let c = rusqlite::Connection::open(&path).unwrap();
    let parts: Vec<(i64, i64, i64, i64, String)> = c
        .prepare("SELECT pid, pid_gap, blocked_ns, runnable_ns, kind FROM waits ORDER BY off_ns")
        .unwrap()
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        parts,
        vec![
            (3_000_000, 7, 500, 100, "blocked".to_string()),
            (3_000_000, -10, 0, 0, "preempted".to_string()),
        ]
    );
    // Crafted differences that overflow give floating-point times: outside
    // every valid range, so the wait is skipped and counted.
    c.execute_batch(
        "UPDATE waits SET off_ns = 1 << 62, blocked_for = 1 << 62 WHERE kind_id = 1;
         UPDATE waits SET runnable_for = 9223372036854775807 WHERE kind_id = 0;",
    )
    .unwrap();
    drop(c);
    let t = Trace::open(&path).unwrap();
    assert!(t.load(None).unwrap().waits.is_empty());
    assert_eq!(t.input_problems().unwrap().impossible_waits, 2);
}

/// A launched command's row is written when the tracer reads /proc, after
/// its exec: the exec's time is its start (it was left at the later read,
/// often after the first call, for a short program after its exit; round
/// 51's tester).
#[test]
fn an_exec_before_the_row_was_written_is_the_start() {
    let (_dir, path, w) = new_trace("exec-start");
    let h = w.handle();
    h.set_process(ProcessInfo {
        pid: 61,
        comm: "workload".into(),
        start_ns: Some(5_000),
        ..Default::default()
    })
    .unwrap();
    h.send(Event::Proc(proc_event(
        ProcKind::Exec,
        61,
        1_000,
        0,
        0,
        "workload",
    )))
    .unwrap();
    h.send(Event::Proc(proc_event(
        ProcKind::Exit,
        61,
        3_000,
        0,
        0,
        "workload",
    )))
    .unwrap();
    drop(h);
    w.finish().unwrap();
    let p = Trace::open(&path)
        .unwrap()
        .processes()
        .unwrap()
        .into_iter()
        .find(|p| p.pid == 61)
        .unwrap();
    assert_eq!((p.start_ns, p.exit_ns), (Some(1_000), Some(3_000)));
}
