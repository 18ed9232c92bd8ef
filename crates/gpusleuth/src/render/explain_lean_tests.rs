//! `explain` from the stored finding rollups (the lean load) against the
//! full load, of the whole trace and of each process (`--pid`), on traces
//! written by the writer: the example traces written again, the two of
//! them as one trace of two processes, and a hand-built trace with every
//! finding kind a single process without NCCL can give. JSON, text and Markdown must agree, percentiles
//! within the histogram's bound (docs/schema.md).

use super::*;
use sleuth_core::testing::{alloc, call, failed_alloc, free, trace, MS, US};
use sleuth_store::Trace;
use std::path::Path;

// The writer fixture and the JSON comparison sleuth-store's rollup tests use.
use crate::temp_dir::TempDir;
use crate::trace_fixture::{assert_close, example, rewrite, two_processes};

/// One process that is preempted in its copies, has a slow tail of async
/// copies, leaks memory through the run, empties and refills a cache and
/// finally fails an allocation.
fn every_kind() -> TraceData {
    let mut calls = Vec::new();
    // 400 copies of 1 ms, 5 of 3 ms that lost 2 ms each to runnable waiting.
    for i in 0..400 {
        calls.push(call("cudaMemcpy", i * MS, MS));
    }
    for i in 0..5u64 {
        let mut c = call("cudaMemcpy", 500 * MS + i * 4 * MS, 3 * MS);
        c.runnable_ns = 2 * MS;
        calls.push(c);
    }
    // Async copies with a tail (three calls) 50× their median.
    for i in 0..17 {
        calls.push(call("cudaMemcpyAsync", 600 * MS + i * 100 * US, 100 * US));
    }
    for i in 0..3 {
        calls.push(call("cudaMemcpyAsync", 610 * MS + i * 6 * MS, 5 * MS));
    }
    // 64 MiB leaked every 10 ms over the whole run.
    for i in 0..100u64 {
        calls.push(alloc(
            i * 10 * MS + 5 * US,
            64 << 20,
            0x1_0000_0000 + i * 0x1000_0000,
        ));
    }
    // A cache emptied and refilled 30 times, each cudaFree waiting 900 µs
    // for the device as a real one does: ~3% of the run, above the share
    // floor churn needs (CHURN_MIN_SHARE; 10 µs frees were ~0.2%).
    for i in 0..30u64 {
        calls.push(alloc(i * 20 * MS + 7 * US, 2 << 20, 0xa000));
        let mut f = free(i * 20 * MS + 9 * MS, 0xa000);
        f.dur_ns = 900 * US;
        calls.push(f);
    }
    // A failed allocation of 1 GiB (cudaErrorMemoryAllocation).
    calls.push(failed_alloc(990 * MS, 1 << 30));
    let mut d = trace(calls);
    // The 5 slow copies' runnable time: a neighbour held the CPU (runnable
    // time no task held is no cpu_preemption).
    d.waits = (0..5u64)
        .map(|i| {
            let t = 500 * MS + i * 4 * MS;
            sleuth_core::WaitEvent {
                pid: 100,
                tid: 100,
                kind: sleuth_core::WaitKind::Preempted,
                off_ns: t,
                wake_ns: t,
                on_ns: t + 2 * MS,
                prev_state: 0,
                cpu: 0,
                culprits: vec![sleuth_core::Culprit {
                    pid: 999,
                    tid: 999,
                    comm: "hog".into(),
                    ns: 2 * MS,
                }],
                waker: None,
            }
        })
        .collect();
    d
}

/// The same words in the same order; a word may differ only where both
/// hold a number (a percentile, within the bound the JSON check proves).
pub(crate) fn assert_same_words(got: &str, want: &str, at: &str) {
    if got == want {
        return;
    }
    let (g, w): (Vec<&str>, Vec<&str>) = (
        got.split_whitespace().collect(),
        want.split_whitespace().collect(),
    );
    assert_eq!(g.len(), w.len(), "{at}:\n{got}\nvs\n{want}");
    for (a, b) in g.iter().zip(&w) {
        let digits = |s: &str| s.chars().any(|c| c.is_ascii_digit());
        assert!(a == b || (digits(a) && digits(b)), "{at}: {a} vs {b}");
    }
}

/// Both paths in every style on the trace at `path`, of the whole trace
/// and of each of `pids`; returns the finding kinds of the whole trace.
fn compare(path: &Path, pids: &[u32], at: &str) -> Vec<String> {
    for &pid in pids {
        compare_scope(path, Some(pid), &format!("{at} pid {pid}"));
    }
    compare_scope(path, None, at)
}

/// Both paths in every style, of process `pid` or all; returns the finding kinds.
fn compare_scope(path: &Path, pid: Option<u32>, at: &str) -> Vec<String> {
    let t = Trace::open(path).unwrap();
    let lean = lean_load(&t, pid)
        .unwrap()
        .unwrap_or_else(|| panic!("{at}: the lean load answers"));
    // The lean load holds no wait and only memory calls (of the process).
    assert!(lean.data.waits.is_empty(), "{at}");
    assert!(
        lean.data.calls.iter().all(|c| {
            c.info().is_some_and(sleuth_core::ledger::is_memory_op)
                && pid.is_none_or(|p| c.pid == p)
        }),
        "{at}"
    );
    let input = TraceInput {
        db: path.to_path_buf(),
        pid,
    };
    let full = output(&input, Style::Json, false).unwrap();
    let fast = output(&input, Style::Json, true).unwrap();
    let full: serde_json::Value = serde_json::from_str(&full).unwrap();
    let fast: serde_json::Value = serde_json::from_str(&fast).unwrap();
    assert_close(&fast, &full, at);
    for style in [Style::Text, Style::Markdown] {
        assert_same_words(
            &output(&input, style, true).unwrap(),
            &output(&input, style, false).unwrap(),
            &format!("{at} {style:?}"),
        );
    }
    full["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_examples_explain_the_same_from_their_finding_rollups() {
    for name in ["h200-contention.db", "demo-sim.db"] {
        let dir = TempDir::new(name);
        let data = Trace::open(&example(name)).unwrap().load(None).unwrap();
        let path = dir.join("again.db");
        rewrite(&data, &path);
        let pids: Vec<u32> = data.processes.iter().map(|p| p.pid).collect();
        assert!(!pids.is_empty(), "{name}");
        let kinds = compare(&path, &pids, name);
        assert!(!kinds.is_empty(), "{name}");
    }
}

#[test]
fn each_process_of_a_two_process_trace_explains_the_same_from_its_rollups() {
    let dir = TempDir::new("two-processes");
    let path = dir.join("two.db");
    rewrite(&two_processes(), &path);
    let kinds = compare(&path, &[25707, 725], "two processes");
    assert!(!kinds.is_empty());
    // Each process's answer is its own: another's findings are not in it.
    let t = Trace::open(&path).unwrap();
    for (pid, other) in [(25707, 725), (725, 25707)] {
        let e = lean_load(&t, Some(pid)).unwrap().unwrap().explanation();
        let pids = serde_json::to_string(&e).unwrap();
        assert!(!pids.contains(&format!("\"pid\":{other}")), "pid {pid}");
    }
}

/// A process the trace lists but that made no call: its (empty) aggregates
/// give the full load's answer too.
#[test]
fn a_process_without_calls_explains_the_same_from_the_rollups() {
    let dir = TempDir::new("process-without-calls");
    let path = dir.join("t.db");
    let mut data = every_kind();
    data.processes.push(sleuth_core::ProcessInfo {
        pid: 4243,
        comm: "idle".into(),
        ..Default::default()
    });
    rewrite(&data, &path);
    compare_scope(&path, Some(4243), "process without calls");
}

/// A file written before the per-process rollups: `--pid` takes the full
/// load (the same answer as before), the whole trace still the lean one.
#[test]
fn a_trace_before_the_process_rollups_explains_a_process_from_its_load() {
    let dir = TempDir::new("before-process-rollups");
    let path = dir.join("t.db");
    rewrite(&every_kind(), &path);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("DELETE FROM meta WHERE key = 'finding_process_rollups'", [])
        .unwrap();
    drop(conn);
    let t = Trace::open(&path).unwrap();
    assert!(lean_load(&t, Some(100)).unwrap().is_none());
    assert!(lean_load(&t, None).unwrap().is_some());
    let input = TraceInput {
        db: path.clone(),
        pid: Some(100),
    };
    assert_eq!(
        output(&input, Style::Json, true).unwrap(),
        output(&input, Style::Json, false).unwrap()
    );
}

/// A pid the trace does not hold: the full load's one-line error on the lean path too.
#[test]
fn an_absent_pid_is_the_same_error_on_either_path() {
    let dir = TempDir::new("absent-pid");
    let path = dir.join("t.db");
    rewrite(&every_kind(), &path);
    let input = TraceInput {
        db: path.clone(),
        pid: Some(4242),
    };
    let lean = output(&input, Style::Text, true).unwrap_err().to_string();
    let full = output(&input, Style::Text, false).unwrap_err().to_string();
    assert_eq!(lean, full);
    assert!(lean.contains("pid 4242 is not in this trace"), "{lean}");
}

#[test]
fn every_finding_kind_explains_the_same_from_the_finding_rollups() {
    let dir = TempDir::new("every-kind");
    let path = dir.join("t.db");
    rewrite(&every_kind(), &path);
    let kinds = compare(&path, &[100], "every kind");
    for k in [
        "allocation_failure",
        "memory_growth",
        "allocation_churn",
        "cpu_preemption",
        "tail_latency",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} in {kinds:?}");
    }
}

#[test]
fn traces_without_finding_rollups_take_the_full_load() {
    let t = Trace::open(&example("demo-sim.db")).unwrap();
    assert!(lean_load(&t, None).unwrap().is_none());
}

/// Rows changed after the trace was written so that their durations add
/// up past 2^62: the lean load answers from the aggregates (which the change
/// did not touch), yet `explain` refuses the file on either path, because a
/// file this small has its rows counted, and that pass checks the totals.
#[test]
fn explain_refuses_durations_adding_up_past_2_62_on_either_path() {
    let dir = TempDir::new("lean-overflow");
    let path = dir.join("t.db");
    rewrite(&every_kind(), &path);
    // Each duration stays valid (≤ 2^62); together they add up past it.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let n = conn
        .execute("UPDATE call_rows SET dur_ns = 1 << 61", [])
        .unwrap();
    assert!(n > 2, "{n} calls");
    drop(conn);
    let t = Trace::open(&path).unwrap();
    assert!(lean_load(&t, None).unwrap().is_some());
    let full = t.load(None).unwrap_err().to_string();
    assert!(full.contains("add up past 2^62"), "{full}");
    let input = TraceInput {
        db: path.clone(),
        pid: None,
    };
    for lean in [true, false] {
        let e = output(&input, Style::Json, lean).unwrap_err().to_string();
        assert!(e.contains("add up past 2^62"), "lean {lean}: {e}");
    }
}

/// A file without rollups or call groups, as the tracer leaves the file it
/// is still writing (or one whose writer was killed): past
/// `STREAMED_ABOVE_ROWS` call rows `explain` streams it in one pass
/// (`scoped::whole_streamed`, here with a bound of 0 rows) and answers as
/// the full load, percentiles within the histogram's bound, of the whole
/// trace and of each process; a file with rollups, or no more rows than
/// the bound, is not streamed (the lean or the full load answers).
#[test]
fn a_file_being_written_explains_streamed_as_the_full_load() {
    use sleuth_store::scoped::whole_streamed;
    let cases = [
        ("h200-contention.db", None),
        ("demo-sim.db", None),
        ("every kind", Some(every_kind())),
    ];
    for (name, built) in cases {
        let dir = TempDir::new(&format!("streamed-{}", name.replace(' ', "-")));
        let data = match built {
            Some(d) => d,
            None => Trace::open(&example(name)).unwrap().load(None).unwrap(),
        };
        let path = dir.join("live.db");
        rewrite(&data, &path);
        let finished = Trace::open(&path).unwrap();
        assert!(
            whole_streamed(&finished, None, 0).unwrap().is_none(),
            "{name}: rollups"
        );
        drop(finished);
        crate::trace_fixture::strip_as_being_written(&path);
        let t = Trace::open(&path).unwrap();
        assert!(lean_load(&t, None).unwrap().is_none(), "{name}");
        let rows = data.calls.len() as i64;
        assert!(
            whole_streamed(&t, None, rows).unwrap().is_none(),
            "{name}: small"
        );
        let mut scopes: Vec<Option<u32>> = vec![None];
        scopes.extend(data.processes.iter().map(|p| Some(p.pid)));
        for pid in scopes {
            let at = format!("{name} pid {pid:?}");
            let (d, ledgers, e) = whole_streamed(&t, pid, 0)
                .unwrap()
                .unwrap_or_else(|| panic!("{at}: streamed"));
            let input = TraceInput {
                db: path.clone(),
                pid,
            };
            let none = InputProblems::default();
            let streamed = render(&d, &ledgers, &e, &none, Style::Json).unwrap();
            let full = output(&input, Style::Json, false).unwrap();
            let full: serde_json::Value = serde_json::from_str(&full).unwrap();
            let streamed: serde_json::Value = serde_json::from_str(&streamed).unwrap();
            assert!(
                !full["findings"].as_array().unwrap().is_empty() || pid.is_some(),
                "{at}"
            );
            assert_close(&streamed, &full, &at);
        }
    }
}
