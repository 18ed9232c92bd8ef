//! `explain` from the stored finding rollups (the lean load) against the
//! full load, on traces written by the writer: the example traces written
//! again, and a hand-built trace with every finding kind a single process
//! without NCCL can give. JSON, text and Markdown must agree, percentiles
//! within the histogram's bound (docs/schema.md).

use super::*;
use sleuth_core::rollup::MAX_RELATIVE_ERROR;
use sleuth_core::{op_by_name, CallEvent, Event, ProcessInfo};
use sleuth_store::{SessionInfo, Trace, TraceWriter, WriterOptions};
use std::path::{Path, PathBuf};

const MS: u64 = 1_000_000;
const US: u64 = 1_000;

/// A folder removed when the test ends.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let p = std::env::temp_dir().join(format!(
            "gpusleuth-explain-lean-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn session() -> SessionInfo {
    SessionInfo {
        started_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 1_000,
        realtime_offset_ns: 1_699_999_999_000_000_000,
        hostname: "testhost".into(),
        kernel: "6.1.0".into(),
        command: "gpusleuth trace -- ./work".into(),
        target: "./work".into(),
        launch_mode: "launch".into(),
        tool_version: "0.1.0".into(),
    }
}

/// Writes `data` through a fresh writer (events in time order), which
/// stores the rollups and the finding rollups when it finishes.
fn rewrite(data: &TraceData, path: &Path) {
    let w = TraceWriter::create(path, session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    for p in &data.processes {
        h.set_process(p.clone()).unwrap();
    }
    for (k, v) in &data.stats {
        if !k.starts_with("events_") {
            h.set_stat(k.clone(), *v).unwrap();
        }
    }
    h.set_op_counts(data.counts.clone()).unwrap();
    let mut events: Vec<(u64, Event)> = data
        .calls
        .iter()
        .map(|c| (c.ts_ns, Event::Call(c.clone())))
        .chain(data.waits.iter().map(|w| (w.on_ns, Event::Wait(w.clone()))))
        .collect();
    events.sort_by_key(|e| e.0);
    for (_, e) in events {
        h.send(e).unwrap();
    }
    drop(h);
    w.finish().unwrap();
}

fn call(op: &str, ts: u64, dur: u64) -> CallEvent {
    CallEvent {
        ts_ns: ts,
        dur_ns: dur,
        pid: 100,
        tid: 100,
        op: op_by_name(op).unwrap().id,
        ..Default::default()
    }
}

fn alloc(ts: u64, size: u64, ptr: u64) -> CallEvent {
    let mut c = call("cudaMalloc", ts, 10 * US);
    c.size = Some(size);
    c.ptr = Some(ptr);
    c
}

fn free(ts: u64, ptr: u64) -> CallEvent {
    let mut c = call("cudaFree", ts, 10 * US);
    c.ptr = Some(ptr);
    c
}

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
    // Async copies with a tail 50× their median.
    for i in 0..19 {
        calls.push(call("cudaMemcpyAsync", 600 * MS + i * 100 * US, 100 * US));
    }
    calls.push(call("cudaMemcpyAsync", 610 * MS, 5 * MS));
    // 64 MiB leaked every 10 ms over the whole run.
    for i in 0..100u64 {
        calls.push(alloc(
            i * 10 * MS + 5 * US,
            64 << 20,
            0x1_0000_0000 + i * 0x1000_0000,
        ));
    }
    // A cache emptied and refilled 30 times.
    for i in 0..30u64 {
        calls.push(alloc(i * 20 * MS + 7 * US, 2 << 20, 0xa000));
        calls.push(free(i * 20 * MS + 9 * MS, 0xa000));
    }
    // A failed allocation of 1 GiB (cudaErrorMemoryAllocation).
    let mut failed = alloc(990 * MS, 1 << 30, 0);
    failed.ret = 2;
    failed.ptr = None;
    calls.push(failed);
    TraceData {
        calls,
        processes: vec![ProcessInfo {
            pid: 100,
            comm: "train".into(),
            ..Default::default()
        }],
        has_host_context: true,
        ..Default::default()
    }
}

fn close(got: Option<u64>, want: Option<u64>, what: &str) {
    match (got, want) {
        (Some(g), Some(w)) => assert!(
            g.abs_diff(w) as f64 <= w as f64 * MAX_RELATIVE_ERROR,
            "{what}: {g} vs {w}"
        ),
        (g, w) => assert_eq!(g, w, "{what}"),
    }
}

/// Equal, except what the histogram bounds: percentiles within
/// MAX_RELATIVE_ERROR, a tail that may leave out calls within one bucket of
/// p95 (as in sleuth-store's tests/rollups.rs).
fn assert_close(got: &serde_json::Value, want: &serde_json::Value, at: &str) {
    use serde_json::Value;
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            assert_eq!(
                g.keys().collect::<Vec<_>>(),
                w.keys().collect::<Vec<_>>(),
                "{at}"
            );
            for (k, wv) in w {
                let gv = &g[k];
                let here = format!("{at}.{k}");
                if k.ends_with("p50_ns") || k.ends_with("p95_ns") || k.ends_with("p99_ns") {
                    close(gv.as_u64(), wv.as_u64(), &here);
                } else if k == "p99_over_p50" {
                    let (a, b) = (gv.as_f64().unwrap_or(0.0), wv.as_f64().unwrap_or(0.0));
                    assert!(
                        (a - b).abs() <= b * 3.0 * MAX_RELATIVE_ERROR,
                        "{here}: {a} vs {b}"
                    );
                } else if k == "tail" && gv["calls"] != wv["calls"] {
                    assert!(gv["calls"].as_u64() < wv["calls"].as_u64(), "{here}");
                } else {
                    assert_close(gv, wv, &here);
                }
            }
        }
        (Value::Array(g), Value::Array(w)) => {
            assert_eq!(g.len(), w.len(), "{at}");
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                assert_close(a, b, &format!("{at}[{i}]"));
            }
        }
        (g, w) => assert_eq!(g, w, "{at}"),
    }
}

/// The same words in the same order; a word may differ only where both
/// hold a number (a percentile, within the bound the JSON check proves).
fn assert_same_words(got: &str, want: &str, at: &str) {
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

/// Both paths in every style on the trace at `path`; returns the finding kinds.
fn compare(path: &Path, at: &str) -> Vec<String> {
    let t = Trace::open(path).unwrap();
    let lean = lean_load(&t, None)
        .unwrap()
        .unwrap_or_else(|| panic!("{at}: the lean load answers"));
    // The lean load holds no wait and only memory calls.
    assert!(lean.data.waits.is_empty(), "{at}");
    assert!(
        lean.data
            .calls
            .iter()
            .all(|c| c.info().is_some_and(sleuth_core::ledger::is_memory_op)),
        "{at}"
    );
    // With --pid the full load answers.
    assert!(lean_load(&t, Some(100)).unwrap().is_none(), "{at}");
    let input = TraceInput {
        db: path.to_path_buf(),
        pid: None,
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
        let dir = Dir::new(name);
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(name);
        let data = Trace::open(&src).unwrap().load(None).unwrap();
        let path = dir.0.join("again.db");
        rewrite(&data, &path);
        let kinds = compare(&path, name);
        assert!(!kinds.is_empty(), "{name}");
    }
}

#[test]
fn every_finding_kind_explains_the_same_from_the_finding_rollups() {
    let dir = Dir::new("every-kind");
    let path = dir.0.join("t.db");
    rewrite(&every_kind(), &path);
    let kinds = compare(&path, "every kind");
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
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-sim.db");
    let t = Trace::open(&src).unwrap();
    assert!(lean_load(&t, None).unwrap().is_none());
}

#[test]
fn the_lean_load_refuses_durations_adding_up_past_2_62_like_the_full_load() {
    let dir = Dir::new("lean-overflow");
    let path = dir.0.join("t.db");
    rewrite(&every_kind(), &path);
    // Each duration stays valid (≤ 2^62); together they add up past it.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let n = conn
        .execute("UPDATE call_rows SET dur_ns = 1 << 61", [])
        .unwrap();
    assert!(n > 2, "{n} calls");
    drop(conn);
    let t = Trace::open(&path).unwrap();
    let lean = match lean_load(&t, None) {
        Ok(_) => panic!("the lean load read a trace whose totals overflow"),
        Err(e) => e.to_string(),
    };
    let full = t.load(None).unwrap_err().to_string();
    assert!(lean.contains("add up past 2^62"), "{lean}");
    assert!(full.contains("add up past 2^62"), "{full}");
}
