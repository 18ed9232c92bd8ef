//! `explain --db DIR` over a run (`sleuth_store::run_explain`) against one
//! trace: each example trace is cut at a quiet moment (no call and no wait
//! spans it) into two files of a run, written again through the writer, and
//! the run's answer is compared with the whole trace's lean load: the same
//! op aggregates (histograms, splits, culprits, example calls), the same
//! ledgers (allocations of the first file freed in the second are matched),
//! the same findings. Only what a file boundary cuts may differ (each
//! thread's window, documented in `FindingInputs::merge`).

mod common;

use common::run_cut::{cut_in_two, Cut};
use common::{rewrite, TempDir};
use sleuth_core::findings::inputs::{FindingInputs, OpInputs};
use sleuth_core::TraceData;
use sleuth_store::run_window::RunLast;
use sleuth_store::{ReadBudget, Trace, DEFAULT_READ_TIMEOUT};

/// An op aggregate without its row ids, its histogram buckets, its
/// example calls by (ts, tid).
type OpView = (
    String,
    Vec<(u64, u64, sleuth_core::decompose::Split)>,
    Vec<(u64, u32)>,
);

/// Everything an op aggregate concludes from (buckets are not serialized).
fn op_view(o: &OpInputs) -> OpView {
    let examples = o
        .by_runnable
        .examples()
        .chain(o.by_dur.examples())
        .map(|e| (e.call.ts_ns, e.call.tid))
        .collect();
    let mut json: serde_json::Value = serde_json::to_value(o).unwrap();
    // Row ids differ between the files and the whole: the calls are compared by (ts, tid).
    for k in ["by_runnable", "by_dur"] {
        json[k] = serde_json::Value::Null;
    }
    (json.to_string(), o.hist.buckets().collect(), examples)
}

fn assert_same_ops(got: &FindingInputs, want: &FindingInputs, at: &str) {
    assert_eq!(
        got.ops.keys().collect::<Vec<_>>(),
        want.ops.keys().collect::<Vec<_>>(),
        "{at}"
    );
    for (op, o) in &want.ops {
        assert_eq!(op_view(&got.ops[op]), op_view(o), "{at} op {op}");
        assert_eq!(got.ops[op].culprits(), o.culprits(), "{at} op {op}");
    }
    assert_eq!(got.spans, want.spans, "{at}");
}

/// The finding kinds, ops and processes, ranked.
fn findings(e: &sleuth_core::findings::Explanation) -> Vec<(String, String, Vec<u32>)> {
    e.findings
        .iter()
        .map(|f| (f.kind.as_str().to_string(), f.op.clone(), f.pids.clone()))
        .collect()
}

fn budget() -> ReadBudget {
    ReadBudget::new(DEFAULT_READ_TIMEOUT)
}

/// The explanation says it spans the run's two files.
fn assert_over_two_files(e: &sleuth_core::findings::Explanation, at: &str) {
    assert!(
        e.notes.iter().any(|n| n.contains("over 2 files of a run")),
        "{at}: {:?}",
        e.notes
    );
}

/// The whole trace written as one file and as a run of two; both loaded.
fn compare(name: &str, tag: &str) {
    let Cut {
        dir: _dir,
        whole: whole_trace,
        run,
        ..
    } = cut_in_two(name, tag);
    let mut pids: Vec<Option<u32>> = vec![None];
    pids.extend(whole_trace.pids().unwrap().into_iter().map(Some));
    for pid in pids {
        let at = format!("{name} pid {pid:?}");
        let one = sleuth_store::lean::load(&whole_trace, pid, budget())
            .unwrap()
            .expect("a lean load");
        let merged = sleuth_store::run_explain::load(&run, pid, budget()).unwrap();
        assert_eq!(merged.files.len(), 2, "{at}");
        assert!(merged.incomplete.is_empty(), "{at}");
        assert_same_ops(&merged.inputs, &one.inputs, &at);
        assert_eq!(merged.ledgers, one.ledgers, "{at}");
        let (got, want) = (merged.explanation().unwrap(), one.explanation());
        assert_eq!(findings(&got), findings(&want), "{at}");
        // The merged base: every process, the kernel counts and counters added once.
        assert_eq!(
            merged.data.processes.len(),
            one.data.processes.len(),
            "{at}"
        );
        let count = |d: &TraceData| d.counts.iter().map(|c| c.count).sum::<u64>();
        assert_eq!(count(&merged.data), count(&one.data), "{at}");
        assert_over_two_files(&got, &at);
    }
}

#[test]
fn a_run_cut_in_two_explains_as_the_whole_trace_h200() {
    compare("h200-contention.db", "run-explain-h200");
}

#[test]
fn a_run_cut_in_two_explains_as_the_whole_trace_demo() {
    compare("demo-sim.db", "run-explain-demo");
}

/// An allocation in the first file freed in the second: neither unfreed
/// nor an unmatched free over the run (each file alone says both).
#[test]
fn the_ledger_runs_across_files() {
    use sleuth_core::testing::{alloc, call, free, trace, MS};
    let dir = TempDir::new("run-explain-ledger");
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    let first = trace(vec![
        alloc(0, 1 << 20, 0xa000),
        call("cudaLaunchKernel", 10 * MS, MS),
    ]);
    let second = trace(vec![
        call("cudaLaunchKernel", 100 * MS, MS),
        free(110 * MS, 0xa000),
    ]);
    rewrite(&first, &run.join(sleuth_store::run::part_name(1)));
    rewrite(&second, &run.join(sleuth_store::run::part_name(2)));
    let merged = sleuth_store::run_explain::load(&run, None, budget()).unwrap();
    let l = &merged.ledgers[0];
    assert_eq!((l.allocs, l.frees, l.unmatched_frees), (1, 1, 0));
    assert!(l.unfreed.is_empty(), "{:?}", l.unfreed);
    assert_eq!((l.live_bytes, l.peak_bytes), (0, 1 << 20));
    // Each file alone: an unfreed allocation, an unmatched free.
    let alone = |n| {
        let t = Trace::open(&run.join(sleuth_store::run::part_name(n))).unwrap();
        sleuth_store::lean::load(&t, None, budget())
            .unwrap()
            .unwrap()
            .ledgers
    };
    assert_eq!(alone(1)[0].unfreed.len(), 1);
    assert_eq!(alone(2)[0].unmatched_frees, 1);
}

/// The same when a file's calls were stored far from the order they
/// returned in (here its one free returns before 40,000 allocations that
/// started before it, so it is stored after them): the file's replay
/// starts again on SQLite's sorted query (`Rows::replay_by_return`) from
/// the state the first file left, not from nothing.
#[test]
fn the_ledger_runs_across_files_whatever_order_a_file_stored_its_calls() {
    use sleuth_core::testing::{alloc, free, trace, MS};
    let dir = TempDir::new("run-explain-ledger-order");
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    let first = trace(vec![alloc(0, 1 << 20, 0xa000)]);
    let n = 40_000u64;
    let mut calls: Vec<_> = (0..n)
        .map(|i| sleuth_core::CallEvent {
            dur_ns: 1000 * MS,
            ..alloc(100 * MS + i, 4096, 0x1_0000_0000 + i * 4096)
        })
        .collect();
    calls.push(free(100 * MS + n, 0xa000));
    rewrite(&first, &run.join(sleuth_store::run::part_name(1)));
    rewrite(&trace(calls), &run.join(sleuth_store::run::part_name(2)));
    let merged = sleuth_store::run_explain::load(&run, None, budget()).unwrap();
    let l = &merged.ledgers[0];
    assert_eq!((l.allocs, l.frees, l.unmatched_frees), (n + 1, 1, 0));
    assert_eq!(l.live_bytes, n * 4096);
    // The peak: every allocation of the second file live, 0xa000 freed first.
    assert_eq!(l.peak_bytes, n * 4096);
}

/// A file of the run as its writer leaves it while still writing: no rollups yet.
fn unfinished(path: &std::path::Path) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute("DELETE FROM meta WHERE key = 'rollups'", [])
        .unwrap();
}

/// NVML's readings when tracing began are stored in a run's first file:
/// without it (deleted by `--keep`), what a process held before the trace
/// is unknown, not 0.
#[test]
fn a_run_without_its_first_file_says_the_start_readings_are_lost() {
    let cut = cut_in_two("demo-sim.db", "start-lost");
    let load = |dir: &std::path::Path| {
        sleuth_store::run_explain::load(dir, None, budget())
            .expect("load the run")
            .data
    };
    assert!(!load(&cut.run).process_gpu_start_lost);
    std::fs::remove_file(cut.run.join(sleuth_store::run::part_name(1))).unwrap();
    assert!(load(&cut.run).process_gpu_start_lost);
}

#[test]
fn a_directory_without_a_finished_file_is_one_error() {
    use sleuth_core::testing::{call, trace, MS};
    let dir = TempDir::new("run-explain-empty");
    let one_line =
        |run: &std::path::Path| match sleuth_store::run_explain::load(run, None, budget()) {
            Err(e) => {
                let msg = e.to_string();
                assert_eq!(msg.lines().count(), 1, "{msg}");
                msg
            }
            Ok(r) => panic!("answered over {:?}", r.files),
        };
    assert!(one_line(&dir.0).contains("not a trace run"));
    // A window of it (`--last`) says the same words.
    let memo = sleuth_store::CheckMemo::new();
    match sleuth_store::run_window::last_of_run(&dir.0, MS, &budget(), &memo) {
        Err(e) => assert!(e.to_string().contains("not a trace run"), "{e}"),
        Ok(r) => panic!("a window over {:?}", r.files),
    }
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    let part = |n| run.join(sleuth_store::run::part_name(n));
    rewrite(&trace(vec![call("cudaLaunchKernel", MS, MS)]), &part(1));
    unfinished(&part(1));
    let msg = one_line(&run);
    assert!(msg.contains("no finished file in this run yet"), "{msg}");
    // A finished file before it: answered, the unfinished one left out.
    std::fs::rename(part(1), part(2)).unwrap();
    rewrite(&trace(vec![call("cudaLaunchKernel", MS, MS)]), &part(1));
    let r = sleuth_store::run_explain::load(&run, None, budget()).unwrap();
    assert_eq!((r.files, r.incomplete), (vec![part(1)], vec![part(2)]));
    let msg = match sleuth_store::run_explain::load(&run, Some(4242), budget()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("pid 4242 answered"),
    };
    assert!(
        msg.contains("no process 4242 in this run (it holds pid "),
        "{msg}"
    );
}

/// Memory pinned in the first file, copied from in both: each file
/// stored its own judgement (the second file's copy pageable: it saw no
/// pinning), the run carries the pinned ranges and judges it pinned, as
/// one trace does; a copy from memory freed before is pageable again.
#[test]
fn memory_pinned_in_an_earlier_file_stays_pinned() {
    use sleuth_core::testing::{call, trace, MS};
    let dir = TempDir::new("run-explain-pinned");
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    let (a, b) = (0x7000_0000u64, 0x9000_0000u64);
    let pin = |ts, ptr| {
        let mut c = call("cudaHostAlloc", ts, MS);
        (c.ptr, c.size) = (Some(ptr), Some(1 << 20));
        c
    };
    let unpin = |ts, ptr| {
        let mut c = call("cudaFreeHost", ts, MS);
        c.ptr = Some(ptr);
        c
    };
    let copy = |ts, ptr| {
        let mut c = call("cudaMemcpy", ts, MS);
        (c.host_ptr, c.size, c.kind) = (Some(ptr + 64), Some(4096), Some(1));
        c
    };
    let counts = |i: &FindingInputs| -> (u64, u64) {
        i.threads.values().fold((0, 0), |(p, k), t| {
            (p + t.pageable.count, k + t.pageable.pinned_copies)
        })
    };
    let early = trace(vec![pin(MS, a), pin(2 * MS, b), copy(5 * MS, a)]);
    let late = trace(vec![
        unpin(90 * MS, b),
        copy(100 * MS, a),
        copy(110 * MS, a),
        copy(120 * MS, b),
    ]);
    rewrite(&early, &run.join(sleuth_store::run::part_name(1)));
    rewrite(&late, &run.join(sleuth_store::run::part_name(2)));
    let second = Trace::open(&run.join(sleuth_store::run::part_name(2))).unwrap();
    let alone = sleuth_store::lean::load(&second, None, budget())
        .unwrap()
        .unwrap();
    assert_eq!(counts(&alone.inputs), (3, 0), "the second file alone");
    let r = sleuth_store::run_explain::load(&run, None, budget()).unwrap();
    // One trace: 3 copies from pinned `a`, one from `b` after it was freed.
    assert_eq!(counts(&r.inputs), (1, 3));
    let mut both = early.clone();
    both.calls.extend(late.calls.clone());
    let whole = dir.join("whole.db");
    rewrite(&both, &whole);
    let one = sleuth_store::lean::load(&Trace::open(&whole).unwrap(), None, budget())
        .unwrap()
        .unwrap();
    assert_eq!(counts(&one.inputs), counts(&r.inputs));
    let examples = |i: &FindingInputs| -> Vec<u64> {
        i.threads
            .values()
            .flat_map(|t| t.pageable.examples.examples().map(|e| e.call.ts_ns))
            .collect()
    };
    assert_eq!(examples(&r.inputs), examples(&one.inputs));
}

/// A run whose files hold collectives is refused in one line naming the
/// file: the straggler finding reads every call and wait of the ranks.
#[test]
fn a_run_with_collectives_is_one_line_error() {
    use sleuth_core::nccl::NcclEvent;
    use sleuth_core::testing::{call, trace, MS};
    use sleuth_core::Event;
    let dir = TempDir::new("run-explain-nccl");
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    rewrite(
        &trace(vec![call("cudaLaunchKernel", MS, MS)]),
        &run.join(sleuth_store::run::part_name(1)),
    );
    let second = run.join(sleuth_store::run::part_name(2));
    let w =
        sleuth_store::TraceWriter::create(&second, common::session(), Default::default()).unwrap();
    let h = w.handle();
    h.send(Event::Nccl(NcclEvent {
        call: common::call("ncclAllReduce", 1, 1, 100 * MS, 50),
        comm: Some(0xc0),
        count: Some(8),
        datatype: Some(7),
        ..Default::default()
    }))
    .unwrap();
    drop(h);
    w.finish().unwrap();
    let msg = match sleuth_store::run_explain::load(&run, None, budget()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a run with collectives was answered"),
    };
    assert!(msg.contains("holds NCCL collectives"), "{msg}");
    assert!(msg.contains("part-000002.db"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
}

// --- A window over several files (`--last` of a run's directory) ---

/// The example cut in two at a quiet moment (a run, the second file left
/// unfinished when `live`: no rollups, no call groups, as the tracer
/// leaves the file it is writing) and written whole; the window from a
/// moment in the first file to the end.
fn window_over_two_files(name: &str, tag: &str, live: bool) -> (TempDir, Trace, RunLast, u64) {
    let Cut {
        dir,
        data,
        whole,
        run,
        at: cut,
        early,
        late,
    } = cut_in_two(name, tag);
    let parts: Vec<(u64, std::path::PathBuf)> = (1..=2)
        .map(|n| (n, run.join(sleuth_store::run::part_name(n))))
        .collect();
    if live {
        unfinished(&parts[1].1);
        let c = rusqlite::Connection::open(&parts[1].1).unwrap();
        c.execute("DROP TABLE call_groups", []).unwrap();
    }
    let first = data.calls.iter().map(|c| c.ts_ns).min().unwrap();
    let since = first + (cut - first) / 2;
    assert!(
        early.calls.iter().any(|c| c.ts_ns >= since) && !late.calls.is_empty(),
        "{name}: the window must hold calls of both files"
    );
    let last = RunLast {
        dir: run,
        files: parts,
        since,
        end: u64::MAX,
        run_start: common::session().start_mono_ns,
        oldest_kept: 1,
        budget: budget(),
    };
    (dir, whole, last, since)
}

/// Stats and findings of the window over the files equal the same window
/// of the whole trace, for each process and all.
fn compare_window(name: &str, tag: &str, live: bool) {
    let (_dir, whole, run, since) = window_over_two_files(name, tag, live);
    let memo = sleuth_store::CheckMemo::new();
    let mut pids: Vec<Option<u32>> = vec![None];
    pids.extend(whole.pids().unwrap().into_iter().map(Some));
    for pid in pids {
        let at = format!("{name} live {live} pid {pid:?}");
        let filter = sleuth_store::CallFilter {
            pid,
            since_ns: Some(since),
            ..Default::default()
        };
        let (want, want_counts) = sleuth_store::window::stats_of(&whole, &filter).unwrap();
        let (got, got_counts, _) = run.stats(pid, &memo).unwrap();
        assert!(!want.ops.is_empty(), "{at}");
        assert_eq!(
            serde_json::to_value(&got).unwrap(),
            serde_json::to_value(&want).unwrap(),
            "{at}"
        );
        assert_eq!(got_counts.json(), want_counts.json(), "{at}");
        // What `report --last` draws of the window's calls.
        let want = sleuth_store::report_reads::window_calls(&whole, &filter, 15).unwrap();
        let (got, _) = run.report_calls(pid, &memo, 15).unwrap();
        assert_eq!(got.ops, want.ops, "{at}");
        assert_eq!(
            (got.calls, &got.calls_by_pid),
            (want.calls, &want.calls_by_pid),
            "{at}"
        );
        let slow = |s: &[sleuth_store::report_reads::SlowCall]| {
            s.iter()
                .map(|s| (s.call.clone(), s.culprits.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(slow(&got.slowest), slow(&want.slowest), "{at}");
        assert_eq!(got.counts.json(), want.counts.json(), "{at}");
        let want = sleuth_store::scoped::explanation_or_loaded(&whole, &filter).unwrap();
        let (got, _) = run.explanation(pid, &memo).unwrap();
        assert_eq!(findings(&got), findings(&want), "{at}");
        let (g, w) = (
            serde_json::to_value(&got.findings).unwrap(),
            serde_json::to_value(&want.findings).unwrap(),
        );
        let mut d = Vec::new();
        json_diff(&g, &w, String::new(), &mut d);
        // A finding's share of the wall time is of the trace's span: here
        // the test's two files span less than the whole trace they were cut
        // from (a real run's files follow each other).
        d.retain(|l| !l.contains(".wall_share:"));
        assert!(d.is_empty(), "{at}: the evidence differs: {d:#?}");
        assert_over_two_files(&got, &at);
    }
}

#[test]
fn a_window_over_two_files_answers_as_the_whole_traces_h200() {
    compare_window("h200-contention.db", "run-window-h200", false);
}

#[test]
fn a_window_over_two_files_answers_as_the_whole_traces_demo() {
    compare_window("demo-sim.db", "run-window-demo", false);
}

/// The newest file still being written (no rollups, no call groups): its
/// part of the window is loaded, aggregated the same way.
#[test]
fn a_window_over_a_finished_file_and_a_live_one_answers_as_the_whole_traces() {
    compare_window("h200-contention.db", "run-window-h200-live", true);
    compare_window("demo-sim.db", "run-window-demo-live", true);
}

/// Allocated in the window's first file, freed in its second: not
/// held at the end (the one not freed is); memory pinned before the window in the first file and copied
/// from in the second: not pageable.
#[test]
fn a_window_over_two_files_carries_its_ledger_and_pinned_memory() {
    use sleuth_core::testing::{alloc, call, free, trace, MS};
    let dir = TempDir::new("run-window-carry");
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    let host = 0x7000_0000u64;
    let mut pin = call("cudaHostAlloc", MS, MS);
    (pin.ptr, pin.size) = (Some(host), Some(1 << 20));
    let copies = |from: u64| -> Vec<sleuth_core::CallEvent> {
        (0..50)
            .map(|i| {
                let mut c = call("cudaMemcpy", from + i * MS, MS / 2);
                (c.host_ptr, c.size, c.kind) = (Some(host + 64), Some(64 << 20), Some(1));
                c
            })
            .collect()
    };
    let mut first = vec![
        pin,
        alloc(20 * MS, 1 << 30, 0xa000),
        alloc(21 * MS, 256 << 20, 0xb000),
    ];
    first.extend(copies(30 * MS));
    let mut second = copies(200 * MS);
    second.push(free(300 * MS, 0xa000));
    let parts: Vec<(u64, std::path::PathBuf)> = (1..=2)
        .map(|n| (n, run.join(sleuth_store::run::part_name(n))))
        .collect();
    rewrite(&trace(first), &parts[0].1);
    rewrite(&trace(second), &parts[1].1);
    let last = RunLast {
        dir: run.clone(),
        files: parts.clone(),
        since: 10 * MS,
        end: u64::MAX,
        run_start: 0,
        oldest_kept: 1,
        budget: budget(),
    };
    let memo = sleuth_store::CheckMemo::new();
    let (e, _) = last.explanation(None, &memo).unwrap();
    let kinds: Vec<&str> = e.findings.iter().map(|f| f.kind.as_str()).collect();
    assert!(!kinds.contains(&"unfreed_memory"), "{kinds:?}");
    assert!(!kinds.contains(&"pageable_copy"), "{kinds:?}");
    // What stays held is the one allocation the second file did not free.
    assert!(
        e.notes
            .iter()
            .any(|n| n.contains("held 256.0 MiB of device memory in 1 allocation(s)")),
        "{:?}",
        e.notes
    );
    // The second file alone: the copies look pageable, the free unmatched.
    let alone = RunLast {
        files: parts[1..].to_vec(),
        ..last.clone()
    };
    let (e, _) = alone.explanation(None, &memo).unwrap();
    let kinds: Vec<&str> = e.findings.iter().map(|f| f.kind.as_str()).collect();
    assert!(
        !kinds.contains(&"pageable_copy"),
        "the run's earlier file pinned it: {kinds:?}"
    );
    let fresh = dir.join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    let moved = fresh.join(sleuth_store::run::part_name(2));
    std::fs::copy(&parts[1].1, &moved).unwrap();
    let orphan = RunLast {
        dir: fresh,
        files: vec![(2, moved)],
        since: 10 * MS,
        end: u64::MAX,
        run_start: 0,
        oldest_kept: 2,
        budget: budget(),
    };
    let (e, _) = orphan.explanation(None, &memo).unwrap();
    let kinds: Vec<&str> = e.findings.iter().map(|f| f.kind.as_str()).collect();
    assert!(
        kinds.contains(&"pageable_copy"),
        "nothing pinned: {kinds:?}"
    );
}

/// The leaves where two JSON values differ, by path.
fn json_diff(a: &serde_json::Value, b: &serde_json::Value, at: String, out: &mut Vec<String>) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                let n = Value::Null;
                json_diff(
                    x.get(k).unwrap_or(&n),
                    y.get(k).unwrap_or(&n),
                    format!("{at}.{k}"),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                json_diff(p, q, format!("{at}[{i}]"), out);
            }
        }
        _ if a != b => out.push(format!("{at}: {a} vs {b}")),
        _ => {}
    }
}
