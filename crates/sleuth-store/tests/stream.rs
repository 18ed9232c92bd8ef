//! The streamed readers (issue 16) against the loaded trace: on the example
//! traces and on a simulated one with every kind of memory call, the calls,
//! waits, ledgers (at the end and at moments), the span, the allocator view
//! and the by-site table (stored, and streamed at moments) read through
//! `stream` equal what the whole trace loaded gives.

mod common;

use common::{call, culprit, example, preempted, TempDir};
use serde_json::{to_value, Value};
use sleuth_core::allocator::allocator_views;
use sleuth_core::ledger::ledger;
use sleuth_core::sites::{memory_by_site, Stack};
use sleuth_core::testing::{block_event, py_frame, torch_block, torch_blocks};
use sleuth_core::{op_by_name, CallEvent, Event, OpCount, ProcessInfo, TraceSpan};
use sleuth_store::stream::{CallQuery, MemoryTrace, Rows, StreamOrder};
use sleuth_store::{CallFilter, CallOrder, ReadBudget, Trace, TraceWriter, WriterOptions};
use std::path::Path;

/// A stack id at or above 2^63 (ids are hashes): stored as its bits, a
/// negative integer, and read back whole.
const HIGH_STACK: u64 = (1 << 63) + 12_345;

fn budget() -> ReadBudget {
    ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT)
}

fn mem(op: &str, pid: u32, tid: u32, ts: u64, dur: u64, size: Option<u64>, ptr: u64) -> CallEvent {
    CallEvent {
        size,
        ptr: Some(ptr),
        ..call(op, pid, tid, ts, dur)
    }
}

/// A trace with allocations of every pool, nested driver calls, a failed
/// allocation, device switches, the virtual memory API, equal start times,
/// call sites, allocator blocks, a process with launches only and one with
/// counted calls only, and waits.
/// A trace of `events` (the session ending at 10 µs) written at `path`.
fn write_trace(path: &Path, events: Vec<Event>) {
    write_trace_with(path, Vec::new(), events, 10_000);
}

/// [`write_trace`] with call sites `stacks` stored first and the session
/// ending at `end_ns`.
fn write_trace_with(path: &Path, stacks: Vec<Stack>, events: Vec<Event>, end_ns: u64) {
    let w = TraceWriter::create(path, common::session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    for s in stacks {
        h.add_stack(s).unwrap();
    }
    for e in events {
        h.send(e).unwrap();
    }
    h.set_session_end(end_ns).unwrap();
    drop(h);
    w.finish().unwrap();
}

/// A copy of the trace at `from` at `to`, changed by `sql`.
fn changed_copy(from: &Path, to: &Path, sql: &str) {
    std::fs::copy(from, to).unwrap();
    rusqlite::Connection::open(to)
        .unwrap()
        .execute_batch(sql)
        .unwrap();
}

/// [`changed_copy`] as a version 5 file first (`call_rows` and `waits`
/// with every column stored), then `sql` making it older.
fn older_copy(from: &Path, to: &Path, sql: &str) {
    changed_copy(from, to, &format!("{}{sql}", common::rows_as_version_5()));
}

fn simulated(path: &Path) {
    let w = TraceWriter::create(path, common::session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    for (pid, comm) in [(100, "train"), (300, "launcher")] {
        h.set_process(ProcessInfo {
            pid,
            ppid: Some(1),
            comm: comm.into(),
            cmdline: comm.into(),
            start_ns: Some(1_000),
            exit_ns: (pid == 300).then_some(90_000),
            exit_code: None,
            oom_victim: false,
        })
        .unwrap();
    }
    h.set_op_counts(vec![OpCount {
        pid: 400,
        op: op_by_name("cudaLaunchKernel").unwrap().id,
        count: 7,
    }])
    .unwrap();
    for (id, f, line) in [(1u64, "alloc_a", 10), (HIGH_STACK, "alloc_b", 20)] {
        h.add_stack(Stack {
            id,
            pid: 100,
            frames: vec![py_frame("/w/train.py", line, f)],
            notes: vec![],
        })
        .unwrap();
    }
    let base = 0x7f00_0000_0000u64;
    // A memory call of the training process's main thread.
    let main = |op, ts, dur, size, ptr| mem(op, 100, 100, ts, dur, size, ptr);
    let mut calls = vec![
        mem("cudaSetDevice", 100, 101, 1_500, 10, None, 1),
        // A runtime allocation with its nested driver call, same start.
        main("cudaMalloc", 2_000, 900, Some(20 << 20), base),
        CallEvent {
            nested: true,
            ..main("cuMemAlloc_v2", 2_000, 800, Some(20 << 20), base)
        },
        mem(
            "cudaMalloc",
            100,
            101,
            2_000,
            100,
            Some(4096),
            base + (64 << 20),
        ),
        main("cudaMalloc", 3_000, 50, Some(1 << 20), base + (128 << 20)),
        CallEvent {
            ret: 2,
            ptr: None,
            ..main("cudaMalloc", 4_000, 50, Some(1 << 40), 0)
        },
        main("cudaFree", 5_000, 70, None, base + (128 << 20)),
        main("cudaMalloc", 6_000, 60, Some(1 << 20), base + (256 << 20)),
        main("cuMemCreate", 7_000, 30, Some(2 << 20), 0x55),
        main("cuMemMap", 7_100, 30, Some(2 << 20), base + (512 << 20)),
        main("cudaHostAlloc", 7_500, 30, Some(8192), 0x9000),
        main("cudaFreeHost", 7_600, 30, None, 0x9000),
        main("cuMemRelease", 8_000, 30, None, 0x55),
        main("cudaFree", 8_500, 30, None, 0xdead),
        mem(
            "cudaMalloc",
            300,
            300,
            9_000,
            30,
            Some(512),
            base + (1 << 30),
        ),
    ];
    calls[1].stack_id = Some(1);
    calls[4].stack_id = Some(HIGH_STACK);
    calls[5].stack_id = Some(HIGH_STACK);
    calls[7].stack_id = Some(1);
    for i in 0..40u64 {
        let mut c = call(
            "cudaLaunchKernel",
            100 + 200 * (i % 2) as u32,
            102,
            1_200 + i * 300,
            40 + i,
        );
        c.runnable_ns = i;
        calls.push(c);
    }
    let mut blocks = torch_blocks(100, base, [3_500, 3_600, 4_500]);
    // The block still live at the end was asked for at a known line.
    blocks[1].stack_id = Some(1);
    let mut events: Vec<(u64, Event)> = calls
        .into_iter()
        .map(|c| (c.ts_ns, Event::Call(c)))
        .chain(blocks.into_iter().map(|b| (b.end_ns, Event::Block(b))))
        .chain([
            (
                2_600,
                Event::Wait(preempted(
                    100,
                    100,
                    2_100,
                    2_600,
                    vec![culprit(9, "hog", 500)],
                )),
            ),
            (
                3_100,
                Event::Wait(preempted(300, 300, 2_900, 3_100, vec![])),
            ),
        ])
        .collect();
    events.sort_by_key(|e| e.0);
    for (_, e) in events {
        h.send(e).unwrap();
    }
    h.set_session_end(100_000).unwrap();
    drop(h);
    w.finish().unwrap();
}

fn json<T: serde::Serialize>(v: &T) -> Value {
    to_value(v).unwrap()
}

/// Every streamed answer of `path` (for `pid`) equals the loaded one.
fn assert_streamed_equals_loaded(path: &Path, pid: Option<u32>) {
    let trace = Trace::open(path).unwrap();
    let data = trace.load(pid).unwrap();
    let rows = Rows::open(&trace).unwrap();

    let mut calls = Vec::new();
    rows.for_each_call::<sleuth_store::StoreError>(
        &CallQuery {
            pid,
            ..Default::default()
        },
        |c| {
            calls.push(c.call);
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(json(&calls), json(&data.calls), "calls of {path:?}");
    let mut waits = Vec::new();
    rows.for_each_wait::<sleuth_store::StoreError>(pid, |w| {
        waits.push(w);
        Ok(())
    })
    .unwrap();
    assert_eq!(json(&waits), json(&data.waits), "waits of {path:?}");
    // In row order: the same waits, in the order the rows were written.
    let mut by_id = Vec::new();
    rows.for_each_wait_by_id::<sleuth_store::StoreError>(pid, |w| {
        by_id.push(w);
        Ok(())
    })
    .unwrap();
    let in_rows: Vec<i64> = {
        let db = rusqlite::Connection::open(path).unwrap();
        let sql = match pid {
            Some(p) => format!("SELECT on_ns FROM waits WHERE pid = {p} ORDER BY id"),
            None => "SELECT on_ns FROM waits ORDER BY id".to_string(),
        };
        let mut st = db.prepare(&sql).unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let ends: Vec<i64> = by_id.iter().map(|w| w.on_ns as i64).collect();
    assert_eq!(ends, in_rows, "waits by id of {path:?}");
    let mut sorted = by_id.clone();
    sorted.sort_by_key(|w| w.on_ns);
    assert_eq!(json(&sorted), json(&waits), "the same waits of {path:?}");

    // The slowest calls through the duration index, as `calls_filtered` gives them.
    let mut slow = Vec::new();
    rows.for_each_call::<sleuth_store::StoreError>(
        &CallQuery {
            pid,
            order: StreamOrder::ByDurationDesc,
            limit: Some(5),
            ..Default::default()
        },
        |c| {
            slow.push(c.id);
            Ok(())
        },
    )
    .unwrap();
    let want: Vec<i64> = trace
        .calls_filtered(&CallFilter {
            pid,
            order: CallOrder::ByDurationDesc,
            limit: Some(5),
            ..Default::default()
        })
        .unwrap()
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(slow, want);

    let mut mt = MemoryTrace::open(&trace, pid, budget()).unwrap();
    let span = TraceSpan::of(&data);
    assert_eq!(
        (mt.span.start_ns, mt.span.end_ns),
        (span.start_ns, span.end_ns)
    );
    let end = ledger(&data, None);
    assert!(!end.is_empty() || data.calls.is_empty());
    assert_eq!(
        json(&mt.ledgers(None).unwrap()),
        json(&end),
        "ledger of {path:?}"
    );
    // Moments: before anything, at every memory call's return, at the end.
    let mut moments: Vec<u64> = data.calls.iter().map(|c| c.end_ns()).collect();
    moments.sort_unstable();
    moments.dedup();
    let step = moments.len().div_ceil(25).max(1);
    for at in moments
        .iter()
        .step_by(step)
        .copied()
        .chain([0, span.end_ns])
    {
        assert_memory_at(&mt, &data, at, &format!("{path:?}"));
    }
    assert_eq!(
        json(&mt.sites_streamed(&end, None).unwrap()),
        json(&memory_by_site(&data, &end)),
        "sites of {path:?} at the end, streamed"
    );
    // The site rollup (traces the writer finished) equals the by-site table
    // of the loaded trace, and so do the calls by site.
    if let Some(sites) = mt.stored_sites().unwrap() {
        assert_eq!(
            json(&sites),
            json(&memory_by_site(&data, &end)),
            "sites of {path:?}"
        );
        let mut want: std::collections::BTreeMap<(String, &str), (u64, u64, u64)> =
            Default::default();
        for c in data.calls.iter().filter(|c| c.stack_id.is_some()) {
            let e = want
                .entry((sleuth_core::sites::label_of(&data, c.stack_id), c.op_name()))
                .or_default();
            e.0 += 1;
            e.1 += c.failed() as u64;
            e.2 += c.dur_ns;
        }
        let got: std::collections::BTreeMap<(String, &str), (u64, u64, u64)> = mt
            .stored_calls_by_site()
            .unwrap()
            .expect("both site tables")
            .into_iter()
            .map(|(k, v)| (k, (v.calls, v.errors, v.total_ns)))
            .collect();
        assert_eq!(got, want, "calls by site of {path:?}");
    }
    for at in [None, Some(4_000), Some(span.end_ns)] {
        // Read from the file at each pass, the memory calls never held.
        let l = ledger(&data, at);
        assert_eq!(
            json(&mt.allocator_views(at, &l).unwrap()),
            json(&allocator_views(&data, at, &l)),
            "allocator views of {path:?} at {at:?}, streamed"
        );
    }
    mt.load_memory_calls(None).unwrap();
    assert!(
        mt.base.blocks.is_empty(),
        "the view holds no allocator event"
    );
    mt.load_allocator_events().unwrap();
    assert_eq!(json(&mt.base.blocks), json(&data.blocks));
    assert_eq!(
        json(&memory_by_site(&mt.base, &end)),
        json(&memory_by_site(&data, &end))
    );
    for at in [None, Some(4_000), Some(span.end_ns)] {
        let l = ledger(&data, at);
        assert_eq!(
            json(&allocator_views(&mt.base, at, &l)),
            json(&allocator_views(&data, at, &l))
        );
    }
}

#[test]
fn streamed_answers_equal_loaded_ones_on_the_examples() {
    for name in ["demo-sim.db", "h200-contention.db"] {
        let path = example(name);
        assert_streamed_equals_loaded(&path, None);
        let trace = Trace::open(&path).unwrap();
        for pid in trace.pids().unwrap() {
            assert_streamed_equals_loaded(&path, Some(pid));
        }
    }
}

#[test]
fn streamed_answers_equal_loaded_ones_on_a_simulated_trace() {
    let dir = TempDir::new("stream");
    let path = dir.join("sim.db");
    simulated(&path);
    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    // The trace exercises what it claims to.
    let l = ledger(&data, None);
    let p100 = l.iter().find(|p| p.pid == 100).unwrap();
    assert_eq!(p100.failed_allocs.len(), 1);
    assert!(p100.unmatched_frees == 1 && p100.vmm_bytes == 0 && p100.devices.len() == 2);
    assert!(
        l.iter().any(|p| p.pid == 400),
        "counted-only process listed"
    );
    assert!(!data.blocks.is_empty() && !data.stacks.is_empty());
    // The writer stored the site rollup: the by-site answers below read it.
    let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
    let sites = mt.stored_sites().unwrap().expect("site rollup");
    assert!(
        sites
            .iter()
            .any(|s| s.example_stack.is_some() && s.at_peak_bytes > 0),
        "{sites:?}"
    );
    assert_streamed_equals_loaded(&path, None);
    for pid in [100, 300, 400] {
        assert_streamed_equals_loaded(&path, Some(pid));
    }
    // A pid the trace does not hold is refused like `load` refuses it.
    let err = MemoryTrace::open(&trace, Some(4242), budget())
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("pid 4242 is not in this trace"),
        "{err}"
    );
}

/// Processes that come and go in one file (a node agent without
/// `--rotate`): the completion finishes each process's ledger once the
/// return-order replay passes its exit (round 46), and the stored ledgers
/// and by-site table equal those of the loaded trace; so do a pid reused
/// after its exit (calls after it: finished at the end), a process that
/// exited without a memory call, and one still running.
#[test]
fn processes_finished_at_their_exit_answer_as_the_loaded_trace() {
    use sleuth_core::ProcKind;
    let dir = TempDir::new("stream-exits");
    let path = dir.join("exits.db");
    let mut events = Vec::new();
    for k in 0..40u32 {
        let (pid, t0) = (1_000 + k, 1_000 + u64::from(k) * 1_000);
        let base = 0x7f00_0000_0000u64 + (u64::from(k) << 32);
        let stack = 1 + u64::from(k % 4);
        let mut at = |i: u64, op: &str, size: Option<u64>, ptr: u64| {
            let mut c = mem(op, pid, pid, t0 + i * 300, 200, size, ptr);
            c.stack_id = Some(stack);
            events.push(Event::Call(c));
        };
        at(0, "cudaMalloc", Some(4096 << (k % 5)), base);
        at(1, "cudaMalloc", Some(1 << 20), base + 0x10_0000);
        match k % 3 {
            0 => at(2, "cudaFree", None, base),
            1 => at(2, "cudaMalloc", Some(1 << 50), 0),
            _ => at(2, "cudaLaunchKernel", None, 0),
        }
        // Exits overlap the next processes' calls; the last runs on.
        if k < 39 {
            let exit = common::proc_event(ProcKind::Exit, pid, t0 + 2_500, 1, 0, "job");
            events.push(Event::Proc(exit));
        }
    }
    let stacks: Vec<Stack> = (1..=4)
        .map(|id| Stack {
            id,
            pid: 1_000,
            frames: vec![py_frame("/w/job.py", id as u32, "step")],
            notes: vec![],
        })
        .collect();
    // Pid 1_005 again after its exit: a reused pid, finished at the end.
    events.push(Event::Call(mem(
        "cudaMalloc",
        1_005,
        1_005,
        60_000,
        100,
        Some(512),
        0xabc0,
    )));
    // A process that exited with launches only.
    events.push(Event::Call(call(
        "cudaLaunchKernel",
        2_000,
        2_000,
        3_000,
        50,
    )));
    events.push(Event::Proc(common::proc_event(
        ProcKind::Exit,
        2_000,
        3_500,
        1,
        0,
        "l",
    )));
    events.sort_by_key(|e| match e {
        Event::Call(c) => c.ts_ns,
        Event::Proc(p) => p.ts_ns,
        _ => 0,
    });
    write_trace_with(&path, stacks, events, 70_000);
    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    let exited = data
        .processes
        .iter()
        .filter(|p| p.exit_ns.is_some())
        .count();
    assert_eq!(exited, 40, "{:?}", data.processes);
    assert_streamed_equals_loaded(&path, None);
    for pid in [1_000, 1_005, 1_039, 2_000] {
        assert_streamed_equals_loaded(&path, Some(pid));
    }
    let l = ledger(&data, None);
    let reused = l.iter().find(|p| p.pid == 1_005).unwrap();
    assert_eq!(reused.allocs, 3, "{reused:?}");
    // The writer set each exited process's thread windows aside in the file
    // (round 46): the stored rollups' thread splits and per-op sums are the
    // loaded trace's, the reused pid's thread included, and the table is
    // gone once the file is complete.
    let raw = sleuth_core::stats::compute(&data);
    let rolled = trace.stats_report(None).unwrap().expect("rollups");
    assert_eq!(json(&rolled.threads), json(&raw.threads));
    assert!(rolled.threads.iter().any(|t| t.pid == 1_005));
    let sums = |r: &sleuth_core::stats::StatsReport| {
        let v: Vec<_> = r
            .ops
            .iter()
            .map(|o| (o.op, o.count, o.total_ns, o.max_ns))
            .collect();
        format!("{v:?}")
    };
    assert_eq!(sums(&rolled), sums(&raw));
    let c = rusqlite::Connection::open(&path).unwrap();
    let left: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'thread_windows'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0);
}

/// A trace cut short after processes exited (the writer never completed
/// the file) keeps the thread windows it set aside (round 46) in a table
/// no reader reads: the file opens, and its calls answer from the rows as
/// any file cut short does.
#[test]
fn a_file_cut_short_keeps_the_windows_set_aside_unread() {
    use sleuth_core::ProcKind;
    let dir = TempDir::new("stream-cut-windows");
    let path = dir.join("cut.db");
    let w = TraceWriter::create(&path, common::session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    for pid in [10u32, 11, 12] {
        let t0 = u64::from(pid) * 1_000;
        h.send(Event::Call(mem(
            "cudaMalloc",
            pid,
            pid,
            t0,
            100,
            Some(4096),
            0xa000,
        )))
        .unwrap();
        h.send(Event::Proc(common::proc_event(
            ProcKind::Exit,
            pid,
            t0 + 500,
            1,
            0,
            "j",
        )))
        .unwrap();
    }
    h.flush().unwrap();
    // No finish(): what was committed stays, uncompleted.
    drop(h);
    drop(w);
    let c = rusqlite::Connection::open(&path).unwrap();
    let set_aside: i64 = c
        .query_row("SELECT count(*) FROM thread_windows", [], |r| r.get(0))
        .unwrap();
    assert_eq!(set_aside, 3);
    drop(c);
    let trace = Trace::open(&path).unwrap();
    assert!(!trace.has_rollups().unwrap());
    let data = trace.load(None).unwrap();
    assert_eq!(data.calls.len(), 3);
    assert_eq!(ledger(&data, None).len(), 3);
}

/// The ledgers at the end come from the ledger rollup the writer stored:
/// equal to the replay (above), read without a call row (the memory calls
/// deleted after the trace ended leave the answer unchanged), the replay
/// again when the rollup is not marked complete, and a damaged rollup is an
/// error naming it.
#[test]
fn ledgers_at_the_end_are_read_from_the_stored_rollup() {
    let dir = TempDir::new("ledger_rollup");
    let path = dir.join("sim.db");
    simulated(&path);
    let ledgers = |p: &Path| {
        let trace = Trace::open(p).unwrap();
        let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
        json(&mt.ledgers(None).unwrap())
    };
    let whole = ledgers(&path);
    let p100 = &whole.as_array().unwrap()[0];
    assert!(p100["peak_bytes"].as_u64().unwrap() > 0, "{p100}");

    let c = rusqlite::Connection::open(&path).unwrap();
    let memory_ops: Vec<String> = sleuth_core::ledger::memory_op_names()
        .iter()
        .map(|n| format!("'{n}'"))
        .collect();
    let deleted = c
        .execute(
            &format!(
                "DELETE FROM call_rows WHERE op_id IN (SELECT id FROM ops WHERE op IN ({}))",
                memory_ops.join(", ")
            ),
            [],
        )
        .unwrap();
    assert!(deleted > 5, "{deleted}");
    drop(c);
    assert_eq!(ledgers(&path), whole, "answered from the rollup");

    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute("DELETE FROM meta WHERE key = 'ledger_rollup'", [])
        .unwrap();
    drop(c);
    let replayed = ledgers(&path);
    assert_ne!(
        replayed, whole,
        "without the rollup, the replay of what is left"
    );
    assert_eq!(replayed[0]["peak_bytes"], 0);

    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute(
        "INSERT INTO meta(key, value) VALUES ('ledger_rollup', '1')",
        [],
    )
    .unwrap();
    c.execute(
        "UPDATE ledger_rollup SET ledger = '{\"pid\": 1' WHERE pid = 100",
        [],
    )
    .unwrap();
    drop(c);
    let trace = Trace::open(&path).unwrap();
    let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
    let err = mt.ledgers(None).unwrap_err().to_string();
    assert!(err.contains("damaged trace: ledger_rollup"), "{err}");
}

/// A ledger too long to hold twice (many live allocations, failures past
/// the kept list) is stored as a BLOB of its JSON text, written in pieces
/// (`json_column`), and reads back as the replay's ledger; one listing a
/// few allocations stays TEXT.
#[test]
fn a_long_ledger_is_stored_in_pieces_and_reads_back_as_the_replay() {
    let dir = TempDir::new("long_ledger");
    let path = dir.join("long.db");
    let w = TraceWriter::create(&path, common::session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    let base = 0x7f00_0000_0000u64;
    // 15,000 live allocations (~100 bytes of JSON each) in pid 100, and
    // 1,200 failures; pid 300 allocates one buffer.
    for i in 0..15_000u64 {
        h.send(Event::Call(mem(
            "cudaMalloc",
            100,
            100,
            1_000 + i * 10,
            5,
            Some(4096),
            base + i * 4096,
        )))
        .unwrap();
    }
    for i in 0..1_200u64 {
        h.send(Event::Call(CallEvent {
            ret: 2,
            ptr: None,
            ..mem(
                "cudaMalloc",
                100,
                100,
                200_000 + i * 10,
                5,
                Some(1 << 40),
                0,
            )
        }))
        .unwrap();
    }
    h.send(Event::Call(mem(
        "cudaMalloc",
        300,
        300,
        300_000,
        5,
        Some(512),
        base - 4096,
    )))
    .unwrap();
    h.set_session_end(400_000).unwrap();
    drop(h);
    w.finish().unwrap();

    let c = rusqlite::Connection::open(&path).unwrap();
    let types: Vec<(i64, String, i64)> = c
        .prepare("SELECT pid, typeof(ledger), length(CAST(ledger AS BLOB)) FROM ledger_rollup ORDER BY pid")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(types.len(), 2, "{types:?}");
    assert_eq!(
        (types[0].0, types[0].1.as_str()),
        (100, "blob"),
        "{types:?}"
    );
    assert!(types[0].2 > 1 << 20, "{types:?}");
    assert_eq!(
        (types[1].0, types[1].1.as_str()),
        (300, "text"),
        "{types:?}"
    );
    drop(c);

    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    let replayed = ledger(&data, None);
    assert_eq!(replayed[0].unfreed.len(), 15_000);
    assert_eq!(replayed[0].failed_alloc_count(), 1_200);
    let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
    assert_eq!(json(&mt.ledgers(None).unwrap()), json(&replayed));
    drop((mt, trace));
    // Answered from the stored ledgers: the calls deleted change nothing.
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute("DELETE FROM call_rows", []).unwrap();
    drop(c);
    let trace = Trace::open(&path).unwrap();
    let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
    assert_eq!(json(&mt.ledgers(None).unwrap()), json(&replayed));
}

/// The ledger at a moment reads only the calls that returned by then, and
/// the pass over the call rows its stream makes (the totals check) is the
/// one the count of skipped rows reuses after the reads: the counts equal
/// those of a trace that made the pass itself, the ledgers those of the load.
#[test]
fn a_ledger_at_a_moment_and_the_skipped_rows_after_it_match_the_load() {
    let dir = TempDir::new("stream-at-problems");
    let path = dir.join("t.db");
    simulated(&path);
    // Two rows made impossible (a negative duration): skipped and counted.
    let c = rusqlite::Connection::open(&path).unwrap();
    let n = c
        .execute(
            "UPDATE call_rows SET dur_ns = -5 WHERE id IN (SELECT id FROM call_rows ORDER BY id LIMIT 2)",
            [],
        )
        .unwrap();
    assert_eq!(n, 2);
    drop(c);
    let fresh = Trace::open(&path).unwrap().input_problems().unwrap();
    assert_eq!(fresh.impossible_calls, 2);
    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    let streamed = Trace::open(&path).unwrap();
    let mt = MemoryTrace::open(&streamed, None, budget()).unwrap();
    let mut ends: Vec<u64> = data.calls.iter().map(|c| c.end_ns()).collect();
    ends.sort_unstable();
    let at = ends[ends.len() / 2];
    assert_eq!(
        json(&mt.ledgers(Some(at)).unwrap()),
        json(&ledger(&data, Some(at)))
    );
    assert_eq!(streamed.input_problems().unwrap(), fresh);
}

/// A stream of the calls of a few ops that match few rows (under 1 in 32:
/// read through the op index, not in row order) gives exactly the calls of
/// those ops the load gives, in each order, with a pid and a moment too.
#[test]
fn calls_of_rare_ops_read_through_the_op_index_equal_the_loaded_ones() {
    let (_dir, path, w) = common::new_trace("stream-rare-ops");
    let h = w.handle();
    let mut events = Vec::new();
    for i in 0..400u64 {
        let pid = if i % 2 == 0 { 100 } else { 200 };
        events.push(Event::Call(call(
            "cudaLaunchKernel",
            pid,
            pid,
            10_000 + i * 100,
            40,
        )));
    }
    // Six memory calls among 400 launches: 1.5% of the rows.
    for (i, op) in [
        "cudaMalloc",
        "cudaFree",
        "cudaMalloc",
        "cudaFree",
        "cudaMalloc",
        "cudaMallocHost",
    ]
    .iter()
    .enumerate()
    {
        let pid = if i < 3 { 100 } else { 200 };
        let ts = 20_000 + i as u64 * 3_000;
        events.push(Event::Call(mem(
            op,
            pid,
            pid,
            ts,
            500 - i as u64 * 50,
            Some(4096),
            0x1000 * (i as u64 % 2 + 1),
        )));
    }
    h.send_batch(events).unwrap();
    w.finish().unwrap();

    let trace = Trace::open(&path).unwrap();
    let rows = Rows::open(&trace).unwrap();
    let ops = vec!["cudaMalloc", "cudaFree"];
    for pid in [None, Some(200)] {
        for order in [StreamOrder::ByStart, StreamOrder::ByReturn] {
            for returned_by in [None, Some(30_000)] {
                let mut want: Vec<CallEvent> = trace
                    .load(pid)
                    .unwrap()
                    .calls
                    .into_iter()
                    .filter(|c| ops.contains(&sleuth_core::op_by_id(c.op).unwrap().name))
                    .filter(|c| returned_by.is_none_or(|t| c.end_ns() <= t))
                    .collect();
                if order == StreamOrder::ByReturn {
                    want.sort_by_key(|c| (c.end_ns(), c.ts_ns));
                }
                let mut got = Vec::new();
                rows.for_each_call::<sleuth_store::StoreError>(
                    &CallQuery {
                        pid,
                        ops: Some(ops.clone()),
                        order,
                        returned_by,
                        ..Default::default()
                    },
                    |c| {
                        got.push(c.call);
                        Ok(())
                    },
                )
                .unwrap();
                assert!(!want.is_empty(), "{pid:?} {order:?} {returned_by:?}");
                assert_eq!(json(&got), json(&want), "{pid:?} {order:?} {returned_by:?}");
            }
        }
    }
}

/// The ledger at a moment replays calls in return order from rows read in
/// the order they were stored, put back in order through a bounded buffer
/// (`replay_by_return`); a call stored far later than calls that returned
/// after it (here after 40,000 of them) cannot be put back in that space,
/// and the replay starts again on SQLite's sorted query: the ledgers and
/// the by-site table still equal the loaded trace's.
#[test]
fn a_call_stored_far_out_of_return_order_still_replays_in_order() {
    let dir = TempDir::new("stream-disorder");
    let path = dir.join("t.db");
    let w = TraceWriter::create(&path, common::session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    h.add_stack(Stack {
        id: 5,
        pid: 100,
        frames: vec![py_frame("/w/train.py", 5, "early")],
        notes: vec![],
    })
    .unwrap();
    let base = 0x7f00_0000_0000u64;
    for i in 0..20_000u64 {
        let ptr = base + (i % 64) * 4096;
        let ts = 1_000_000 + i * 100;
        h.send(Event::Call(mem(
            "cudaMalloc",
            100,
            100,
            ts,
            20,
            Some(4096),
            ptr,
        )))
        .unwrap();
        h.send(Event::Call(mem(
            "cudaFree",
            100,
            100,
            ts + 50,
            20,
            None,
            ptr,
        )))
        .unwrap();
    }
    // Returned before every call above, stored after them all: the
    // process's first allocation, and the free of a pointer it never had.
    let mut early = mem("cudaMalloc", 100, 101, 10, 5, Some(1 << 20), 0xe000);
    early.stack_id = Some(5);
    h.send(Event::Call(early)).unwrap();
    h.send(Event::Call(mem("cudaFree", 100, 101, 20, 5, None, 0xbad)))
        .unwrap();
    h.set_session_end(4_000_000).unwrap();
    drop(h);
    w.finish().unwrap();

    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    assert_eq!(data.calls.len(), 40_002);
    let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
    for at in [15, 1_000_070, 2_000_000, 4_000_000] {
        assert_memory_at(&mt, &data, at, "late rows");
    }
    let l = &mt.ledgers(Some(4_000_000)).unwrap()[0];
    assert_eq!((l.unmatched_frees, l.live_bytes), (1, 1 << 20), "{l:?}");
}

/// The streamed ledgers at moment `at` equal the loaded trace's, and so
/// does the by-site table then (`memory --by-site --at`): of the calls that
/// returned by `at`, as the ledger counts them.
fn assert_memory_at(mt: &MemoryTrace, data: &sleuth_core::TraceData, at: u64, what: &str) {
    let at_moment = mt.ledgers(Some(at)).unwrap();
    assert_eq!(
        json(&at_moment),
        json(&ledger(data, Some(at))),
        "ledger of {what} at {at}"
    );
    let by_then = sleuth_core::TraceData {
        calls: data
            .calls
            .iter()
            .filter(|c| c.end_ns() <= at)
            .cloned()
            .collect(),
        ..data.clone()
    };
    assert_eq!(
        json(&mt.sites_streamed(&at_moment, Some(at)).unwrap()),
        json(&memory_by_site(&by_then, &at_moment)),
        "sites of {what} at {at}"
    );
}

/// One label (same line) reached by two call paths (two stack ids): the
/// site's example stack is that of its first allocation in start order,
/// as `memory_by_site` of the loaded trace picks it, though the writer's
/// replay meets the allocations in return order (here the late path's,
/// then the early path's second, then its first), and the live bytes at
/// the peak come from that same replay.
#[test]
fn a_sites_example_is_its_first_allocation_in_start_order() {
    use sleuth_core::testing::{alloc, trace, MS};
    let dir = TempDir::new("stream-first-site");
    let path = dir.join("t.db");
    let (early, late) = (0xa1u64, HIGH_STACK);
    let mut slow = alloc(0, 1 << 20, 0xa000);
    slow.dur_ns = 100 * MS;
    slow.stack_id = Some(early);
    let mut quick = alloc(10 * MS, 2 << 20, 0xb000);
    quick.stack_id = Some(late);
    // The early path again, after the late one: its row returns before
    // the slow first one.
    let mut again = alloc(50 * MS, 1 << 20, 0xc000);
    again.stack_id = Some(early);
    let mut data = trace(vec![slow, quick, again]);
    for id in [early, late] {
        let mut frames = vec![py_frame("/train.py", 42, "step")];
        // A different caller: another stack, the same site label.
        frames.push(py_frame(
            "/train.py",
            if id == early { 7 } else { 8 },
            "main",
        ));
        data.stacks.insert(
            id,
            Stack {
                id,
                pid: data.calls[0].pid,
                frames,
                notes: Vec::new(),
            },
        );
    }
    common::trace_fixture::rewrite_with_context(&data, &path);
    let trace = Trace::open(&path).unwrap();
    let loaded = trace.load(None).unwrap();
    let want = memory_by_site(&loaded, &ledger(&loaded, None));
    let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
    let got = mt.stored_sites().unwrap().expect("site rollup");
    assert_eq!(want.len(), 1, "{want:?}");
    assert_eq!(want[0].example_stack, Some(early));
    assert_eq!(
        (got[0].example_stack, got[0].at_peak_bytes, got[0].allocs),
        (Some(early), 4 << 20, 3)
    );
}

/// A fragmentation finding of a failure the allocator's gap could have
/// served describes the state at the failure, not the end: the lean
/// explanation (`lean::load`), which rebuilds the allocator views from the
/// file without holding a call, gives the full load's finding, that
/// moment's evidence included.
/// The fragmentation findings of `e`, as JSON.
fn fragmentation_findings(e: &sleuth_core::findings::Explanation) -> Vec<Value> {
    e.findings
        .iter()
        .filter(|f| f.kind == sleuth_core::findings::Kind::Fragmentation)
        .map(json)
        .collect()
}

/// A trace at `path` whose PyTorch allocator fails to grow at 4 µs
/// (`cudaMalloc` of 32 MiB refused) while its 64 MiB segment, made at 1 µs,
/// caches 63 MiB: a fragmentation finding at the failure.
fn fragmentation_at_a_failure(path: &Path) {
    use sleuth_core::testing::torch_block;
    const MIB: u64 = 1 << 20;
    let (base, base2) = (0x7f00_0000_0000u64, 0x7f10_0000_0000u64);
    let (malloc, free) = (
        "DeviceCachingAllocator::malloc",
        "DeviceCachingAllocator::free",
    );
    let mut failed = mem("cudaMalloc", 100, 100, 4_000, 10, Some(32 * MIB), 0);
    failed.ret = 2;
    let events = vec![
        Event::Call(mem("cudaMalloc", 100, 100, 1_000, 10, Some(64 * MIB), base)),
        Event::Block(torch_block(
            100,
            2_000,
            malloc,
            0xa,
            base,
            40 * MIB,
            Some(40 * MIB - 100),
        )),
        Event::Block(torch_block(
            100,
            2_100,
            malloc,
            0xb,
            base + 40 * MIB,
            MIB,
            Some(MIB - 100),
        )),
        // The 40 MiB block back in the cache: 63 MiB reserved, not allocated.
        Event::Block(torch_block(100, 3_000, free, 0xa, base, 40 * MIB, None)),
        // cudaMalloc fails for 32 MiB the cache holds twice over.
        Event::Call(failed),
        Event::Call(mem(
            "cudaMalloc",
            100,
            100,
            5_000,
            10,
            Some(64 * MIB),
            base2,
        )),
        Event::Block(torch_block(
            100,
            5_100,
            malloc,
            0xc,
            base2,
            32 * MIB,
            Some(32 * MIB - 100),
        )),
        Event::Block(torch_block(
            100,
            6_000,
            free,
            0xb,
            base + 40 * MIB,
            MIB,
            None,
        )),
    ];
    write_trace(path, events);
}

#[test]
fn a_fragmentation_finding_at_a_failure_reads_its_moment_from_the_file() {
    use sleuth_core::findings::explain_report;
    const MIB: u64 = 1 << 20;
    let dir = TempDir::new("gs-frag-moment");
    let path = dir.0.join("t.db");
    fragmentation_at_a_failure(&path);

    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    let want = explain_report(&data);
    let want_frag = fragmentation_findings(&want);
    assert_eq!(want_frag.len(), 1, "{want_frag:?}");
    assert!(
        want_frag[0].to_string().contains("failure"),
        "the failure's moment: {}",
        want_frag[0]
    );
    let lean = sleuth_store::lean::load(&trace, None, budget())
        .unwrap()
        .expect("a finished trace has finding rollups");
    assert!(lean.data.calls.is_empty(), "no call held");
    let got = lean.explanation();
    assert_eq!(fragmentation_findings(&got), want_frag);
    let allocator_notes = |e: &sleuth_core::findings::Explanation| -> Vec<String> {
        e.notes
            .iter()
            .filter(|n| n.contains("allocator"))
            .cloned()
            .collect()
    };
    assert_eq!(allocator_notes(&got), allocator_notes(&want));
    // The moment's view itself, reserved bytes (from the ledger then) included.
    use sleuth_core::allocator::AllocatorReads;
    let end = allocator_views(&data, None, &ledger(&data, None));
    let ts = sleuth_core::findings::fragmentation_moment(end[&100].state.as_ref().unwrap())
        .expect("the failure's moment");
    let at_failure = data.view_at(100, ts).unwrap();
    assert_eq!(
        at_failure.state.as_ref().map(|s| s.reserved_bytes),
        Some(64 * MIB)
    );
    assert_eq!(
        json(&lean.allocators.view_at(100, ts)),
        json(&Some(at_failure))
    );
    // Above, the views the writer stored (the moment's among them); without
    // them, the views rebuilt from the file give the same.
    let stored: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM allocator_rollup WHERE pid = 100 AND at_ns = ?1",
            [ts as i64],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored, 1, "the moment's view is stored");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("DELETE FROM meta WHERE key = 'allocator_rollup'", [])
        .unwrap();
    let trace = Trace::open(&path).unwrap();
    let streamed = sleuth_store::lean::load(&trace, None, budget())
        .unwrap()
        .unwrap();
    assert_eq!(fragmentation_findings(&streamed.explanation()), want_frag);
    assert_eq!(
        json(&streamed.allocators.view_at(100, ts)),
        json(&lean.allocators.view_at(100, ts))
    );
}

/// The allocator views at the end come from the allocator rollup the
/// writer stored: equal to the views rebuilt from the file (with sites
/// named), read without a memory call (deleting them leaves the answer
/// unchanged), rebuilt again when the rollup is not marked complete or
/// lacks a process, and a damaged rollup is an error naming it.
#[test]
fn allocator_views_at_the_end_are_read_from_the_stored_rollup() {
    let dir = TempDir::new("allocator_rollup");
    let path = dir.join("sim.db");
    simulated(&path);
    let views = |p: &Path| -> Result<Value, String> {
        let trace = Trace::open(p).unwrap();
        let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
        let l = mt.ledgers(None).unwrap();
        let end = mt.allocator_views(None, &l).map_err(|e| e.to_string())?;
        let known = mt.known_allocator_views(&l).map_err(|e| e.to_string())?;
        assert_eq!(json(known.end()), json(&end));
        Ok(json(&end))
    };
    let sql = |p: &Path, q: &str| {
        rusqlite::Connection::open(p)
            .unwrap()
            .execute(q, [])
            .unwrap()
    };
    let whole = views(&path).unwrap();
    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    assert_eq!(
        whole,
        json(&allocator_views(&data, None, &ledger(&data, None)))
    );
    assert!(
        whole[&"100"]["segments"][0]["live_blocks"][0]["site"].is_string(),
        "sites named: {whole}"
    );
    let rebuilt_path = dir.join("rebuilt.db");
    std::fs::copy(&path, &rebuilt_path).unwrap();
    sql(
        &rebuilt_path,
        "DELETE FROM meta WHERE key = 'allocator_rollup'",
    );
    assert_eq!(
        views(&rebuilt_path).unwrap(),
        whole,
        "rebuilt from the file"
    );

    // Read from the table: the memory calls gone, the answer stays.
    let memory_ops: Vec<String> = sleuth_core::ledger::memory_op_names()
        .iter()
        .map(|n| format!("'{n}'"))
        .collect();
    let deleted = sql(
        &path,
        &format!(
            "DELETE FROM call_rows WHERE pid = 100 AND op_id IN (SELECT id FROM ops WHERE op IN ({}))",
            memory_ops.join(", ")
        ),
    );
    assert!(deleted > 5, "{deleted}");
    assert_eq!(views(&path).unwrap(), whole, "answered from the rollup");
    // A process without its view at the end: rebuilt from what is left.
    let stored_copy = dir.join("stored.db");
    std::fs::copy(&path, &stored_copy).unwrap();
    sql(
        &path,
        "DELETE FROM allocator_rollup WHERE pid = 100 AND at_ns IS NULL",
    );
    assert_ne!(
        views(&path).unwrap(),
        whole,
        "rebuilt without the memory calls"
    );

    for (change, what) in [
        ("UPDATE allocator_rollup SET view = '{\"pid\": 1' WHERE pid = 100", "of pid 100"),
        (
            "UPDATE allocator_rollup SET view = replace(view, '\"allocated_bytes\":', '\"allocated_bytes\":9223372036854775807') WHERE pid = 100",
            "no trace holds",
        ),
        (
            "UPDATE allocator_rollup SET view = replace(view, '\"pid\":100', '\"pid\":7')",
            "foreign",
        ),
        ("INSERT INTO allocator_rollup SELECT * FROM allocator_rollup", "second view"),
        ("UPDATE allocator_rollup SET at_ns = -1", "time no trace holds"),
    ] {
        let damaged = dir.join("damaged.db");
        std::fs::copy(&stored_copy, &damaged).unwrap();
        assert_eq!(views(&damaged).unwrap(), whole);
        sql(&damaged, change);
        let err = views(&damaged).unwrap_err();
        assert!(err.contains("damaged trace: allocator_rollup"), "{change}: {err}");
        assert!(err.contains(what), "{change}: {err}");
    }
}

/// Version 3 stores an allocator event's op as an id and its 16 words as
/// integer columns (`allocator_rows`, behind the `allocator_events` view);
/// a version 2 file (a table: the op's name, the words one little-endian
/// BLOB) holding the same events reads the same events and views. A word
/// that is no integer is a one-line error.
#[test]
fn version_2_allocator_words_read_as_version_3_ones() {
    let dir = TempDir::new("allocator_v2");
    let path = dir.join("sim.db");
    simulated(&path);
    let old = dir.join("v2.db");
    std::fs::copy(&path, &old).unwrap();
    let c = rusqlite::Connection::open(&old).unwrap();
    let cols = "id, start_ns, end_ns, pid, tid, op, requested, block, stack_id";
    let rows: Vec<(Vec<rusqlite::types::Value>, Vec<u8>)> = {
        let words: Vec<String> = (0..16).map(|i| format!("w{i}")).collect();
        let mut st = c
            .prepare(&format!(
                "SELECT {cols}, {} FROM allocator_events",
                words.join(", ")
            ))
            .unwrap();
        let rows = st.query_map([], |r| {
            let head = (0..9)
                .map(|i| r.get(i))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut blob = Vec::new();
            for i in 0..16 {
                blob.extend_from_slice(&r.get::<_, i64>(9 + i)?.to_le_bytes());
            }
            Ok((head, blob))
        });
        rows.unwrap().collect::<rusqlite::Result<_>>().unwrap()
    };
    assert!(rows.len() >= 3, "the trace has allocator events");
    c.execute_batch(&common::rows_as_version_5()).unwrap();
    c.execute_batch(
        "DROP VIEW allocator_events; DROP TABLE allocator_rows;
         CREATE TABLE allocator_events(id INTEGER PRIMARY KEY, start_ns INTEGER NOT NULL,
           end_ns INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL, op TEXT NOT NULL,
           requested INTEGER, block INTEGER NOT NULL, words BLOB NOT NULL, stack_id INTEGER);
         CREATE INDEX allocator_events_pid ON allocator_events(pid, end_ns);
         UPDATE meta SET value = '2' WHERE key = 'schema_version';
         DELETE FROM meta WHERE key = 'allocator_rollup';",
    )
    .unwrap();
    for (head, blob) in rows {
        let mut values = head;
        values.push(rusqlite::types::Value::Blob(blob));
        c.execute(
            &format!("INSERT INTO allocator_events({cols}, words) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
            rusqlite::params_from_iter(values),
        )
        .unwrap();
    }
    drop(c);
    let views = |p: &Path| -> Result<(Value, Value), String> {
        let trace = Trace::open(p).map_err(|e| e.to_string())?;
        let blocks = json(&trace.load(None).map_err(|e| e.to_string())?.blocks);
        let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
        let l = mt.ledgers(None).unwrap();
        let end = mt.allocator_views(None, &l).map_err(|e| e.to_string())?;
        Ok((blocks, json(&end)))
    };
    let (blocks, end) = views(&path).unwrap();
    assert!(blocks.as_array().is_some_and(|b| b.len() >= 3), "{blocks}");
    assert!(
        end[&"100"]["segments"][0]["live_blocks"].is_array(),
        "{end}"
    );
    assert_eq!(views(&old).unwrap(), (blocks, end));

    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute("UPDATE allocator_rows SET w3 = 'x' WHERE id = 1", [])
        .unwrap();
    drop(c);
    let err = views(&path).unwrap_err();
    assert!(
        err.contains("damaged trace: allocator_events holds a word that is no integer")
            && !err.contains('\n'),
        "{err}"
    );
}

/// Version 4 leaves out (NULL) each word of an allocator row that equals
/// the same word of its block's base row, an earlier row of that block
/// storing all 16 (`block_bases`): a row with more than 2 changed words is
/// stored whole and becomes the base. Version 5 names the base by how many
/// rows back it lies, and stores the duration instead of the start and the
/// main thread as NULL. Readers get every event back through the view, as
/// from a version 4 or 3 file holding the same events; a left-out word the
/// base does not hold either is a one-line error.
#[test]
fn allocator_rows_leave_out_the_words_their_blocks_base_row_holds() {
    let dir = TempDir::new("allocator_bases");
    let path = dir.join("bases.db");
    let (malloc, free) = (
        "DeviceCachingAllocator::malloc",
        "DeviceCachingAllocator::free",
    );
    let mut sent = Vec::new();
    let mut t = 1_000;
    let mut at = || {
        t += 100;
        t
    };
    // Two blocks, each allocated and freed three times; each malloc asks
    // for another size, each free flips the allocated flag.
    for round in 0..3u64 {
        for block in [0xa000u64, 0xb000] {
            let mut w: [u64; 16] =
                std::array::from_fn(|i| 0x3f80_3f80_0000_0000 + block * 16 + i as u64);
            w[7] = 1 << 20;
            w[8] = (1 << 20) - 100 - round;
            sent.push(block_event(100, at(), malloc, block, Some(w[8]), w));
            w[11] ^= 0x100;
            sent.push(block_event(100, at(), free, block, None, w));
        }
    }
    // Three more words changed (and the request): stored whole, the base.
    let mut w = sent[0].words;
    w[0..3].copy_from_slice(&[1, 2, 3]);
    w[8] = 5;
    sent.push(block_event(100, at(), malloc, 0xa000, Some(5), w));
    w[11] ^= 0x100;
    // Freed by another thread than the process's main one.
    let mut other_thread = block_event(100, at(), free, 0xa000, None, w);
    other_thread.tid = 101;
    sent.push(other_thread);
    write_trace(&path, sent.iter().cloned().map(Event::Block).collect());

    let blocks = |p: &Path| -> Result<Vec<sleuth_core::BlockEvent>, String> {
        let trace = Trace::open(p).map_err(|e| e.to_string())?;
        Ok(trace.load(None).map_err(|e| e.to_string())?.blocks)
    };
    assert_eq!(blocks(&path).unwrap(), sent);
    let c = rusqlite::Connection::open(&path).unwrap();
    let nulls: Vec<String> = (0..16).map(|i| format!("(w{i} IS NULL)")).collect();
    let stored: Vec<(i64, Option<i64>, i64)> = c
        .prepare(&format!(
            "SELECT id, id - base_back, {} FROM allocator_rows ORDER BY id",
            nulls.join(" + ")
        ))
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let (a, b) = (Some(1), Some(3));
    #[rustfmt::skip]
    let want = vec![
        (1, None, 0), (2, a, 15), (3, None, 0), (4, b, 15),
        (5, a, 15), (6, a, 14), (7, b, 15), (8, b, 14),
        (9, a, 15), (10, a, 14), (11, b, 15), (12, b, 14),
        (13, None, 0), (14, Some(13), 15),
    ];
    assert_eq!(stored, want);
    // Version 5 stores the duration, and the main thread as no thread.
    let (durations, threads): (String, String) = c
        .query_row(
            "SELECT group_concat(DISTINCT dur_ns), group_concat(tid) FROM allocator_rows",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((durations.as_str(), threads.as_str()), ("5", "101"));
    drop(c);

    // The same rows in a version 4 file: the start, the thread and the
    // base row's id as they are.
    let v4 = dir.join("v4.db");
    older_copy(
        &path,
        &v4,
        "DROP VIEW allocator_events; ALTER TABLE allocator_rows RENAME TO v5;
         CREATE TABLE allocator_rows(id INTEGER PRIMARY KEY, start_ns INTEGER NOT NULL,
           end_ns INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL,
           op_id INTEGER NOT NULL, requested INTEGER, block INTEGER NOT NULL, stack_id INTEGER,
           base_id INTEGER, w0 INTEGER, w1 INTEGER, w2 INTEGER, w3 INTEGER, w4 INTEGER,
           w5 INTEGER, w6 INTEGER, w7 INTEGER, w8 INTEGER, w9 INTEGER, w10 INTEGER,
           w11 INTEGER, w12 INTEGER, w13 INTEGER, w14 INTEGER, w15 INTEGER);
         INSERT INTO allocator_rows SELECT id, end_ns - dur_ns, end_ns, pid, coalesce(tid, pid),
           op_id, requested, block, stack_id, id - base_back, w0, w1, w2, w3, w4, w5, w6, w7,
           w8, w9, w10, w11, w12, w13, w14, w15 FROM v5;
         DROP TABLE v5;
         CREATE VIEW allocator_events AS
    SELECT a.id AS id, a.start_ns AS start_ns, a.end_ns AS end_ns, a.pid AS pid, a.tid AS tid,
           o.op AS op, a.requested AS requested, a.block AS block, a.stack_id AS stack_id,
           coalesce(a.w0, b.w0) AS w0, coalesce(a.w1, b.w1) AS w1, coalesce(a.w2, b.w2) AS w2,
           coalesce(a.w3, b.w3) AS w3, coalesce(a.w4, b.w4) AS w4, coalesce(a.w5, b.w5) AS w5,
           coalesce(a.w6, b.w6) AS w6, coalesce(a.w7, b.w7) AS w7, coalesce(a.w8, b.w8) AS w8,
           coalesce(a.w9, b.w9) AS w9, coalesce(a.w10, b.w10) AS w10, coalesce(a.w11, b.w11) AS w11,
           coalesce(a.w12, b.w12) AS w12, coalesce(a.w13, b.w13) AS w13, coalesce(a.w14, b.w14) AS w14,
           coalesce(a.w15, b.w15) AS w15
    FROM allocator_rows a JOIN ops o ON o.id = a.op_id LEFT JOIN allocator_rows b ON b.id = a.base_id;
         UPDATE meta SET value = '4' WHERE key = 'schema_version';",
    );
    assert_eq!(blocks(&v4).unwrap(), sent);

    // The same events in a version 3 file: every word in its row.
    let old = dir.join("v3.db");
    older_copy(
        &path,
        &old,
        "CREATE TABLE resolved AS SELECT * FROM allocator_events;
         DROP VIEW allocator_events; DROP TABLE allocator_rows;
         CREATE TABLE allocator_rows(id INTEGER PRIMARY KEY, start_ns INTEGER NOT NULL,
           end_ns INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL,
           op_id INTEGER NOT NULL, requested INTEGER, block INTEGER NOT NULL, stack_id INTEGER,
           w0 INTEGER NOT NULL, w1 INTEGER NOT NULL, w2 INTEGER NOT NULL, w3 INTEGER NOT NULL,
           w4 INTEGER NOT NULL, w5 INTEGER NOT NULL, w6 INTEGER NOT NULL, w7 INTEGER NOT NULL,
           w8 INTEGER NOT NULL, w9 INTEGER NOT NULL, w10 INTEGER NOT NULL, w11 INTEGER NOT NULL,
           w12 INTEGER NOT NULL, w13 INTEGER NOT NULL, w14 INTEGER NOT NULL, w15 INTEGER NOT NULL);
         INSERT INTO allocator_rows SELECT r.id, r.start_ns, r.end_ns, r.pid, r.tid, o.id,
           r.requested, r.block, r.stack_id, r.w0, r.w1, r.w2, r.w3, r.w4, r.w5, r.w6, r.w7,
           r.w8, r.w9, r.w10, r.w11, r.w12, r.w13, r.w14, r.w15
           FROM resolved r JOIN ops o ON o.op = r.op;
         DROP TABLE resolved;
         CREATE INDEX allocator_rows_pid ON allocator_rows(pid, end_ns);
         CREATE VIEW allocator_events AS
    SELECT a.id AS id, a.start_ns AS start_ns, a.end_ns AS end_ns, a.pid AS pid, a.tid AS tid,
           o.op AS op, a.requested AS requested, a.block AS block, a.stack_id AS stack_id,
           a.w0 AS w0, a.w1 AS w1, a.w2 AS w2, a.w3 AS w3, a.w4 AS w4, a.w5 AS w5, a.w6 AS w6,
           a.w7 AS w7, a.w8 AS w8, a.w9 AS w9, a.w10 AS w10, a.w11 AS w11, a.w12 AS w12,
           a.w13 AS w13, a.w14 AS w14, a.w15 AS w15
    FROM allocator_rows a JOIN ops o ON o.id = a.op_id;
         UPDATE meta SET value = '3' WHERE key = 'schema_version';",
    );
    assert_eq!(blocks(&old).unwrap(), sent);

    // A base row that is gone, or that leaves the word out too.
    for change in [
        "UPDATE allocator_rows SET base_back = id - 99 WHERE id = 2",
        "UPDATE allocator_rows SET base_back = 3 WHERE id = 5",
        "UPDATE allocator_rows SET base_back = NULL WHERE id = 14",
    ] {
        let damaged = dir.join("damaged.db");
        changed_copy(&path, &damaged, change);
        let err = blocks(&damaged).unwrap_err();
        assert!(
            err.contains("damaged trace: allocator_events holds a word that is no integer")
                && !err.contains('\n'),
            "{change}: {err}"
        );
    }
}

/// Allocator rows stored in completion order (as captured: real PyTorch
/// traces are) are read by row id: the completed file says so
/// (`meta.allocator_rows_in_end_order`) and has no `(pid, end_ns)` index;
/// rows stored out of that order get the index instead. Both read the
/// events in completion order; a file whose rows left that order after it
/// said so is refused in one line, by the loaded trace and by the streamed
/// allocator view.
#[test]
fn allocator_rows_in_completion_order_are_read_by_id() {
    let dir = TempDir::new("allocator_order");
    let malloc = "DeviceCachingAllocator::malloc";
    // Blocks carved from one 64 MiB segment: the layout is recognised, so
    // the streamed view replays the rows.
    let base = 0x7f00_0000_0000u64;
    let segment = mem("cudaMalloc", 100, 100, 500, 10, Some(64 << 20), base);
    let event = |i: u64| {
        let ptr = base + i * 4096;
        torch_block(100, 1_000 * i, malloc, 0xa0 + i, ptr, 4096, Some(4000))
    };
    let in_order: Vec<_> = (1..=6).map(event).collect();
    let mut out_of_order = in_order.clone();
    out_of_order.swap(2, 3);
    let events = |blocks: &[sleuth_core::BlockEvent]| -> Vec<Event> {
        std::iter::once(Event::Call(segment.clone()))
            .chain(blocks.iter().cloned().map(Event::Block))
            .collect()
    };
    let facts = |p: &Path| -> (Option<String>, bool) {
        let c = rusqlite::Connection::open(p).unwrap();
        let meta = c
            .query_row(
                "SELECT value FROM meta WHERE key = 'allocator_rows_in_end_order'",
                [],
                |r| r.get(0),
            )
            .ok();
        let index: i64 = c
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'allocator_rows_pid'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        (meta, index == 1)
    };
    let read = |p: &Path| -> Result<(Vec<sleuth_core::BlockEvent>, Value), String> {
        let trace = Trace::open(p).map_err(|e| e.to_string())?;
        let blocks = trace.load(None).map_err(|e| e.to_string())?.blocks;
        let mt = MemoryTrace::open(&trace, None, budget()).map_err(|e| e.to_string())?;
        let l = mt.ledgers(Some(5_500)).map_err(|e| e.to_string())?;
        let views = mt
            .allocator_views(Some(5_500), &l)
            .map_err(|e| e.to_string())?;
        Ok((blocks, json(&views)))
    };
    let a = dir.join("in_order.db");
    write_trace(&a, events(&in_order));
    assert_eq!(facts(&a), (Some("1".into()), false));
    let b = dir.join("out_of_order.db");
    write_trace(&b, events(&out_of_order));
    assert_eq!(facts(&b), (None, true));
    let (blocks_a, views_a) = read(&a).unwrap();
    assert_eq!(blocks_a, in_order);
    assert_eq!(views_a["100"]["live_blocks"], 5, "{views_a}");
    assert_eq!(read(&b).unwrap(), (in_order.clone(), views_a));

    // Row 3 moved past row 4 after the file said they were in order.
    let damaged = dir.join("damaged.db");
    changed_copy(
        &a,
        &damaged,
        "UPDATE allocator_rows SET end_ns = 4500 WHERE id = 3",
    );
    let trace = Trace::open(&damaged).unwrap();
    let err = trace.load(None).unwrap_err().to_string();
    let want = "damaged trace: allocator_events is not in the completion order its meta says";
    assert!(err.contains(want) && !err.contains('\n'), "{err}");
    let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
    let l = mt.ledgers(Some(5_500)).unwrap();
    let err = mt.allocator_views(Some(5_500), &l).unwrap_err().to_string();
    assert!(err.contains(want) && !err.contains('\n'), "{err}");
}

/// `memory --at`'s allocator views are rebuilt by its ledger pass (the
/// writer's calibration, each process's allocator events merged with its
/// memory calls): the loaded trace's views at every moment, a block
/// completing at the very time of the `cudaMalloc` that made its segment
/// included (calls go first), and of the process asked for only; a
/// window's views (`allocator_views_until`) are rebuilt by one such pass
/// too, with their reserved bytes by the ledger's rules.
#[test]
fn views_at_a_moment_from_the_ledger_pass_are_the_loaded_traces() {
    let dir = TempDir::new("allocator_fed");
    let malloc = "DeviceCachingAllocator::malloc";
    let free = "DeviceCachingAllocator::free";
    let (a, b) = (0x7f00_0000_0000u64, 0x7f10_0000_0000u64);
    let mut events = vec![
        Event::Call(mem("cudaMalloc", 100, 100, 100, 400, Some(64 << 20), a)),
        // Segment B returns at 9_000, with a block carved from it.
        Event::Call(mem("cudaMalloc", 100, 100, 8_500, 500, Some(20 << 20), b)),
        Event::Block(torch_block(
            100,
            9_000,
            malloc,
            0xb0,
            b,
            1 << 20,
            Some(1000),
        )),
        // Another process's events, left out when one process is asked for.
        Event::Call(mem("cudaMalloc", 200, 200, 100, 400, Some(64 << 20), a)),
    ];
    for i in 1..=6u64 {
        let ptr = a + i * 4096;
        events.push(Event::Block(torch_block(
            100,
            1_000 * i,
            malloc,
            0xa0 + i,
            ptr,
            4096,
            Some(4000),
        )));
        events.push(Event::Block(torch_block(
            200,
            1_000 * i + 1,
            malloc,
            0xc0 + i,
            ptr,
            4096,
            Some(4000),
        )));
    }
    events.push(Event::Block(torch_block(
        100,
        7_500,
        free,
        0xa2,
        a + 2 * 4096,
        4096,
        None,
    )));
    let path = dir.join("t.db");
    write_trace(&path, events);
    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    for pid in [None, Some(100)] {
        for at in [900, 3_500, 7_500, 8_999, 9_000, 9_500] {
            let mt = MemoryTrace::open(&trace, pid, budget()).unwrap();
            let l = mt.ledgers(Some(at)).unwrap();
            let got = mt.allocator_views(Some(at), &l).unwrap();
            let whole = allocator_views(&data, Some(at), &ledger(&data, Some(at)));
            let want: std::collections::BTreeMap<_, _> = whole
                .into_iter()
                .filter(|(p, _)| pid.is_none_or(|want| *p == want))
                .collect();
            assert_eq!(json(&got), json(&want), "{pid:?} at {at}");
            let fed = &got[&100];
            assert!(fed.state.is_some(), "{pid:?} at {at}: {}", json(fed));
            // A window ending then: its views (reserved bytes by the
            // ledger's rules from the process's own calls) in one pass.
            let until = mt.allocator_views_until(Some(at)).unwrap().expect("views");
            let pids: Vec<u32> = want.keys().copied().collect();
            let none = std::collections::BTreeMap::new();
            let loaded =
                sleuth_core::allocator::KnownViews::until(&data, &data, &pids, Some(at), &none);
            assert_eq!(json(until.end()), json(loaded.end()), "{pid:?} until {at}");
            assert_eq!(
                json(until.moments()),
                json(loaded.moments()),
                "{pid:?} until {at}"
            );
        }
    }
}

/// A view holding a number no reader accepts (a request of 2^63 bytes the
/// allocator refused) is not stored: the reader rebuilds it from the file,
/// with the same answer as the loaded trace's, rather than refusing the
/// file as damaged.
#[test]
fn a_view_a_reader_would_refuse_is_rebuilt_rather_than_stored() {
    use sleuth_core::testing::torch_block;
    const MIB: u64 = 1 << 20;
    let dir = TempDir::new("gs-allocator-huge");
    let path = dir.0.join("t.db");
    let base = 0x7f00_0000_0000u64;
    let malloc = "DeviceCachingAllocator::malloc";
    let mut refused = torch_block(100, 3_000, malloc, 0, 0, 512, Some(1 << 63));
    refused.block = 0;
    let events = vec![
        Event::Call(mem("cudaMalloc", 100, 100, 1_000, 10, Some(20 * MIB), base)),
        Event::Block(torch_block(
            100,
            2_000,
            malloc,
            0xa,
            base,
            MIB,
            Some(MIB - 100),
        )),
        Event::Block(refused),
    ];
    write_trace(&path, events);

    let rows: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT count(*) FROM allocator_rollup", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 0, "not stored");
    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    let want = allocator_views(&data, None, &ledger(&data, None));
    let failures = &want[&100].state.as_ref().unwrap().failures;
    assert_eq!(failures[0].bytes, 1 << 63, "{failures:?}");
    let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
    let l = mt.ledgers(None).unwrap();
    assert_eq!(mt.allocator_views(None, &l).unwrap(), want);
}

/// The writer calibrates the allocator views from its ledger replay, each
/// allocator event merged in among the memory calls where it completed:
/// the stored views equal the loaded trace's where the order decides
/// (a block of a segment freed right after it, another in the segment
/// that replaced it at another address).
#[test]
fn the_stored_calibration_sees_each_block_among_the_calls_where_it_completed() {
    use sleuth_core::testing::torch_block;
    const MIB: u64 = 1 << 20;
    let dir = TempDir::new("gs-allocator-order");
    let path = dir.0.join("t.db");
    let (a, b, c) = (
        0x7f00_0000_0000u64,
        0x7f10_0000_0000u64,
        0x7f20_0000_0000u64,
    );
    let (malloc, free) = (
        "DeviceCachingAllocator::malloc",
        "DeviceCachingAllocator::free",
    );
    let mut events = vec![Event::Call(mem(
        "cudaMalloc",
        100,
        100,
        1_000,
        10,
        Some(20 * MIB),
        a,
    ))];
    // Blocks of segment `a`, which is freed right after each is given back.
    for i in 0..4u64 {
        let t = 2_000 + i * 10;
        events.push(Event::Block(torch_block(
            100,
            t,
            malloc,
            0xa + i,
            a + i * MIB,
            MIB,
            Some(MIB - 100),
        )));
        events.push(Event::Block(torch_block(
            100,
            t + 5,
            free,
            0xa + i,
            a + i * MIB,
            MIB,
            None,
        )));
    }
    events.push(Event::Call(mem("cudaFree", 100, 100, 3_000, 10, None, a)));
    events.push(Event::Call(mem(
        "cudaMalloc",
        100,
        100,
        4_000,
        10,
        Some(20 * MIB),
        b,
    )));
    events.push(Event::Block(torch_block(
        100,
        5_000,
        malloc,
        0xe,
        b,
        MIB,
        Some(MIB - 100),
    )));
    events.push(Event::Call(mem(
        "cudaMalloc",
        100,
        100,
        6_000,
        10,
        Some(20 * MIB),
        c,
    )));
    write_trace(&path, events);

    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    let want = allocator_views(&data, None, &ledger(&data, None));
    assert_eq!(
        want[&100].calibration.ptr_agree, 5,
        "{:?}",
        want[&100].calibration
    );
    let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
    let l = mt.ledgers(None).unwrap();
    let stored: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT count(*) FROM allocator_rollup", [], |r| r.get(0))
        .unwrap();
    assert_eq!(stored, 1);
    assert_eq!(json(&mt.allocator_views(None, &l).unwrap()), json(&want));
}

/// A window's allocator view is the file's at the window's end, replayed
/// from the file's start: the segment made before the window is known, so
/// the window holding the failure gets the whole file's fragmentation
/// finding, streamed and loaded (it was refused as "layout not
/// recognised": the window's own memory calls lacked the segment).
#[test]
fn a_windows_allocator_view_is_the_files_at_its_end() {
    use sleuth_core::findings::explain_report;
    let dir = TempDir::new("gs-frag-window");
    let path = dir.0.join("t.db");
    fragmentation_at_a_failure(&path);
    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    let whole = fragmentation_findings(&explain_report(&data));
    assert_eq!(whole.len(), 1);
    let window = |since: u64, until: u64| {
        let filter = CallFilter {
            since_ns: Some(since),
            until_ns: Some(until),
            ..Default::default()
        };
        let streamed = sleuth_store::scoped::explanation(&trace, &filter)
            .unwrap()
            .expect("streamed");
        let loaded = sleuth_store::scoped::explanation_or_loaded(&trace, &filter).unwrap();
        for e in [&streamed, &loaded] {
            assert!(
                !e.notes.iter().any(|n| n.contains("not recognised")),
                "{:?}",
                e.notes
            );
        }
        streamed
    };
    assert_eq!(fragmentation_findings(&window(3_500, 10_000)), whole);
    let loaded_window = {
        let filter = CallFilter {
            since_ns: Some(3_500),
            until_ns: Some(10_000),
            ..Default::default()
        };
        let data = trace.load_calls_of(&filter).unwrap();
        sleuth_store::window::explain_loaded(&trace, data, &filter, Default::default()).unwrap()
    };
    assert_eq!(
        fragmentation_findings(&loaded_window),
        whole,
        "the loaded window's too"
    );
}

/// `common::allocator_workload`'s random workload written at `path` with a checkpoint every
/// 97 steps; its session end.
fn checkpointed_trace(path: &Path) -> u64 {
    sleuth_store::allocator_checkpoints::set_steps_for_tests(97);
    let (events, end) =
        common::allocator_workload::random_allocator_workload(0x9e37_79b9_7f4a_7c15);
    let w = TraceWriter::create(path, common::session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    for e in events {
        h.send(e).unwrap();
    }
    h.set_session_end(end).unwrap();
    drop(h);
    w.finish().unwrap();
    end
}

/// A checkpoint no writer stores (a foreign or second state, a number past
/// 2^62, another layout, a negative first id, a table announced complete
/// but missing or of other columns, a state that does not parse) makes a
/// window's views a one-line error naming the table; a crafted first id
/// past every call gives views, never a panic.
#[test]
fn a_damaged_allocator_checkpoint_is_refused_in_one_line() {
    let dir = TempDir::new("allocator_checkpoints_damaged");
    let good = dir.join("good.db");
    let end = checkpointed_trace(&good);
    let at = end * 9 / 10;
    let t = "allocator_checkpoints";
    let latest = format!("(SELECT max(at_ns) FROM {t} WHERE pid = 100 AND at_ns <= {at})");
    let damaged = [
        format!("UPDATE {t} SET ledger = replace(ledger, '\"pid\":100', '\"pid\":7') WHERE at_ns = {latest}"),
        format!("UPDATE {t} SET replay = replace(replay, '\"allocated\":', '\"allocated\":9223372036854775807,\"x\":') WHERE at_ns = {latest}"),
        format!("UPDATE {t} SET replay = replace(replay, '\"layout\":[7,9,6]', '\"layout\":[7,8,6]') WHERE at_ns = {latest}"),
        format!("INSERT INTO {t} SELECT * FROM {t} WHERE pid = 100 AND at_ns = {latest}"),
        format!("UPDATE {t} SET from_id = -5 WHERE at_ns = {latest}"),
        format!("UPDATE {t} SET replay = '{{' WHERE at_ns = {latest}"),
        format!("DROP TABLE {t}"),
        format!("ALTER TABLE {t} ADD COLUMN extra INTEGER"),
    ];
    for (i, sql) in damaged.iter().enumerate() {
        let path = dir.join(&format!("d{i}.db"));
        changed_copy(&good, &path, sql);
        let trace = Trace::open(&path).unwrap();
        let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
        let err = match mt.allocator_views_until(Some(at)) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{sql}: views given"),
        };
        assert!(err.contains(t) && !err.contains('\n'), "{sql}: {err}");
    }
    let path = dir.join("past.db");
    changed_copy(&good, &path, &format!("UPDATE {t} SET from_id = 1 << 61"));
    let trace = Trace::open(&path).unwrap();
    let mt = MemoryTrace::open(&trace, None, budget()).unwrap();
    assert!(mt.allocator_views_until(Some(at)).unwrap().is_some());
}

/// Allocator views at a moment (a window's end) taken up from the file's
/// allocator checkpoints equal the loaded trace's replayed from its start:
/// at every checkpoint's time, just before and after it, and between, for
/// both processes and each alone. The checkpoints were taken up.
#[test]
fn views_taken_up_from_checkpoints_are_those_replayed_from_the_start() {
    let dir = TempDir::new("allocator_checkpoints");
    let path = dir.join("t.db");
    let end = checkpointed_trace(&path);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut st = conn
        .prepare("SELECT at_ns, from_id FROM allocator_checkpoints ORDER BY at_ns")
        .unwrap();
    let stored: Vec<(u64, Option<i64>)> = st
        .query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(stored.len() >= 20, "{} checkpoints", stored.len());
    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    let mut moments: Vec<u64> = (0..=10).map(|i| end * i / 10).collect();
    for (at, _) in stored.iter().step_by(4) {
        moments.extend([at - 1, *at, at + 1]);
    }
    let before = sleuth_store::allocator_checkpoints::taken_up_for_tests();
    let none = std::collections::BTreeMap::new();
    for pid in [None, Some(100), Some(200)] {
        for &at in &moments {
            let mt = MemoryTrace::open(&trace, pid, budget()).unwrap();
            let got = mt.allocator_views_until(Some(at)).unwrap().expect("views");
            let pids: Vec<u32> = [100, 200]
                .into_iter()
                .filter(|p| pid.is_none_or(|only| only == *p))
                .collect();
            let want =
                sleuth_core::allocator::KnownViews::until(&data, &data, &pids, Some(at), &none);
            assert_eq!(json(got.end()), json(want.end()), "{pid:?} until {at}");
            let listed = |k: &sleuth_core::allocator::KnownViews| {
                json(&k.moments().iter().collect::<Vec<_>>())
            };
            assert_eq!(listed(&got), listed(&want), "{pid:?} until {at}");
        }
    }
    let taken = sleuth_store::allocator_checkpoints::taken_up_for_tests() - before;
    assert!(taken as usize >= moments.len(), "{taken} reads took one up");
}

/// A wait's culprits are the tasks that held the CPU while it was
/// runnable: a wait with no runnable part has none, and a culprit row a
/// crafted file gives it is not read, by the loaded trace and by the
/// streams alike (as the per-thread wait stream never joined one); a
/// runnable wait's culprits are read as stored.
#[test]
fn a_wait_without_runnable_time_has_no_culprits_read() {
    let dir = TempDir::new("stream-culprits");
    let path = dir.join("t.db");
    let blocked = sleuth_core::WaitEvent {
        kind: sleuth_core::WaitKind::Blocked,
        wake_ns: 3_000,
        on_ns: 3_000,
        prev_state: 1,
        ..preempted(100, 100, 1_000, 3_000, vec![])
    };
    let runnable = preempted(100, 100, 5_000, 6_000, vec![culprit(7, "hog", 1_000)]);
    write_trace(
        &path,
        vec![
            Event::Call(call("cudaLaunchKernel", 100, 100, 500, 100)),
            Event::Wait(blocked),
            Event::Wait(runnable),
        ],
    );
    // The crafted row: a culprit of the blocked wait (the first stored).
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "INSERT INTO wait_culprits(wait_id, pid, tid, comm, ns) \
         SELECT min(id), 9, 9, 'crafted', 500 FROM waits",
    )
    .unwrap();
    drop(conn);
    let trace = Trace::open(&path).unwrap();
    let culprits = |waits: &[sleuth_core::WaitEvent]| -> Vec<(u64, Vec<String>)> {
        waits
            .iter()
            .map(|w| {
                (
                    w.off_ns,
                    w.culprits.iter().map(|c| c.comm.clone()).collect(),
                )
            })
            .collect()
    };
    let want = vec![(1_000, vec![]), (5_000, vec!["hog".to_string()])];
    assert_eq!(culprits(&trace.load(None).unwrap().waits), want, "loaded");
    let rows = Rows::open(&trace).unwrap();
    let mut streamed = Vec::new();
    rows.for_each_wait::<sleuth_store::StoreError>(None, |w| {
        streamed.push(w);
        Ok(())
    })
    .unwrap();
    assert_eq!(culprits(&streamed), want, "streamed");
    let mut windowed = Vec::new();
    rows.for_each_wait_in::<sleuth_store::StoreError>(None, 0, 10_000, |w| {
        windowed.push(w);
        Ok(())
    })
    .unwrap();
    assert_eq!(culprits(&windowed), want, "a window's");
}

/// `for_each_wait_by_id` reads the waits in the order they were written,
/// without a sort: here not their `on_ns` order, which `for_each_wait`
/// gives; the same waits, culprits included.
#[test]
fn waits_by_id_are_the_waits_in_written_order() {
    let dir = TempDir::new("waits-by-id");
    let path = dir.join("w.db");
    let ends = [9_000u64, 3_000, 7_000, 3_000, 5_000];
    let events = ends
        .iter()
        .enumerate()
        .map(|(i, &on)| {
            let culprits = vec![culprit(900 + i as u32, "hog", 100)];
            Event::Wait(common::preempted(
                7,
                7 + (i as u32 % 2),
                on - 1_000,
                on,
                culprits,
            ))
        })
        .collect();
    write_trace(&path, events);
    let rows = Rows::open(&Trace::open(&path).unwrap()).unwrap();
    let read = |by_id: bool| {
        let mut got = Vec::new();
        let push = |w: sleuth_core::WaitEvent| {
            got.push(w);
            Ok::<(), sleuth_store::StoreError>(())
        };
        match by_id {
            true => rows.for_each_wait_by_id(None, push).unwrap(),
            false => rows.for_each_wait(None, push).unwrap(),
        }
        got
    };
    let by_id = read(true);
    let culprit_pids: Vec<u32> = by_id.iter().map(|w| w.culprits[0].pid).collect();
    assert_eq!(culprit_pids, [900, 901, 902, 903, 904], "written order");
    let mut sorted = by_id.clone();
    sorted.sort_by_key(|w| w.on_ns);
    assert_eq!(json(&sorted), json(&read(false)));
    assert_ne!(json(&by_id), json(&read(false)), "not sorted by on_ns");
}
