//! The scoped explanation (`sleuth_store::scoped`, MCP `findings` with an
//! op or a window) and the writer's per-thread pass (`call_culprits`) on a
//! synthetic trace whose waits interleave the calls densely: several waits
//! inside one call, waits straddling a call's start or end, waits without
//! runnable time, nested calls, copies from pinned and pageable memory.
//! Each answer must equal the loaded trace's, filtered to the scope.

mod common;

use common::trace_fixture::{assert_close, rewrite};
use common::TempDir;
use sleuth_core::findings::inputs::{FindingInputs, PinnedState, Resolution};
use sleuth_core::rollup::MAX_RELATIVE_ERROR;
use sleuth_core::{
    op_by_name, CallEvent, Culprit, ProcessInfo, TraceData, WaitEvent, WaitKind, Waker,
};
use sleuth_store::{CallFilter, Trace};
use std::collections::BTreeSet;
use std::path::Path;

const PID: u32 = 40;

/// A small deterministic generator (the trace must not change between runs).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn call(tid: u32, op: &str, ts: u64, dur: u64) -> CallEvent {
    CallEvent {
        ts_ns: ts,
        dur_ns: dur,
        pid: PID,
        tid,
        op: op_by_name(op).unwrap().id,
        // A call site on most calls (their stacks are not stored: the
        // label says so), so that the examples' sites are compared too.
        stack_id: (!ts.is_multiple_of(4)).then_some(1 + ts % 3),
        ..Default::default()
    }
}

/// Thread `tid`'s calls and waits on one timeline, drawn independently so
/// that they interleave every way: calls back to back or apart (some with
/// a nested call inside, a long tail), waits of 0–40 µs (some without blocked or
/// without runnable time) with up to three culprits each.
fn thread(tid: u32, rng: &mut Lcg, calls: &mut Vec<CallEvent>, waits: &mut Vec<WaitEvent>) {
    const ORIGIN: u64 = 1_000_000;
    // Past `VERDICT_MIN_WINDOW_NS`: the thread verdicts (pageable copies) are judged.
    const END: u64 = 150_000_000;
    let ops = [
        "cudaLaunchKernel",
        "cudaMemcpy",
        "cudaStreamSynchronize",
        "cudaHostAlloc",
    ];
    let mut t = ORIGIN;
    let mut host = 0x7f00_0000_0000u64;
    while t < END {
        // A rare op too (under 1 in 32 calls: read through the op index).
        let op = match rng.below(60) {
            0 => "cudaMalloc",
            n => ops[n as usize % ops.len()],
        };
        // A long tail: one call in 30 is 30-100x the others.
        let dur = match (op, rng.below(30)) {
            (_, 0) => 300_000 + rng.below(100_000),
            // Enough staging time for the pageable-copy finding.
            ("cudaMemcpy", _) => 40_000 + rng.below(80_000),
            _ => 200 + rng.below(10_000),
        };
        let mut c = call(tid, op, t, dur);
        c.runnable_ns = rng.below(dur / 2);
        c.blocked_ns = rng.below(dur / 4);
        match op {
            "cudaHostAlloc" => {
                host += 0x10_0000;
                c.ptr = Some(host);
                c.size = Some(0x1000);
            }
            "cudaMalloc" => {
                c.ptr = Some(0x7000_0000 + rng.below(1 << 30));
                c.size = Some(1 << 20);
            }
            "cudaMemcpy" => {
                c.size = Some(4096 + rng.below(1 << 20));
                c.kind = Some(1);
                // A third from the last pinned buffer, the rest from elsewhere.
                c.host_ptr = Some(match rng.below(3) {
                    0 => host + 8,
                    _ => 0x5000_0000 + rng.below(1 << 20),
                });
            }
            _ => {}
        }
        if dur > 4_000 && rng.below(4) == 0 {
            let mut inner = call(tid, "cudaLaunchKernel", t + 1_000, dur / 3);
            inner.nested = true;
            calls.push(inner);
        }
        calls.push(c);
        t += dur + rng.below(3) * rng.below(20_000);
    }
    let mut u = ORIGIN - 50_000;
    while u < END + 50_000 {
        let off = u + rng.below(10_000);
        let wake = off + rng.below(3) * rng.below(20_000);
        let on = wake + rng.below(3) * rng.below(20_000) + 1;
        let culprits = (0..rng.below(4))
            .map(|k| Culprit {
                pid: 900 + k as u32,
                tid: 900 + k as u32,
                comm: format!("hog{k}"),
                ns: rng.below(on - wake + 1),
            })
            .collect();
        waits.push(WaitEvent {
            pid: PID,
            tid,
            kind: if wake > off {
                WaitKind::Blocked
            } else {
                WaitKind::Preempted
            },
            off_ns: off,
            wake_ns: wake,
            on_ns: on,
            prev_state: 1,
            cpu: 0,
            culprits,
            waker: (wake > off).then(|| Waker {
                pid: 700,
                tid: 700 + rng.below(3) as u32,
                comm: "loader".into(),
                irq: false,
            }),
        });
        u = on;
    }
}

fn synthetic() -> TraceData {
    let mut rng = Lcg(16);
    let (mut calls, mut waits) = (Vec::new(), Vec::new());
    for tid in [41, 42] {
        thread(tid, &mut rng, &mut calls, &mut waits);
    }
    TraceData {
        calls,
        waits,
        processes: vec![train()],
        has_host_context: true,
        ..Default::default()
    }
}

/// [`synthetic`]'s two threads in each of `n` processes (pids `PID`..,
/// tids 41.. and 42.. apart per process), all on one timeline: the same
/// host addresses pinned in one process and copied from in another, whose
/// copies they must not make pinned.
fn many_processes(n: u32) -> TraceData {
    let mut rng = Lcg(46);
    let (mut calls, mut waits, mut processes) = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..n {
        let (mut c, mut w) = (Vec::new(), Vec::new());
        for tid in [41 + 10 * k, 42 + 10 * k] {
            thread(tid, &mut rng, &mut c, &mut w);
        }
        c.iter_mut().for_each(|c| c.pid = PID + k);
        w.iter_mut().for_each(|w| w.pid = PID + k);
        calls.extend(c);
        waits.extend(w);
        processes.push(ProcessInfo {
            pid: PID + k,
            ..train()
        });
    }
    TraceData {
        calls,
        waits,
        processes,
        has_host_context: true,
        ..Default::default()
    }
}

/// The traced process of these traces.
fn train() -> ProcessInfo {
    ProcessInfo {
        pid: PID,
        comm: "train".into(),
        ..Default::default()
    }
}

/// The scopes compared: ops (copies alone, pinning alone) and windows
/// (with and without an op) across the trace.
fn scopes() -> Vec<CallFilter> {
    let f = |op: Option<&str>, w: Option<(u64, u64)>| CallFilter {
        pid: Some(PID),
        op: op.map(str::to_string),
        since_ns: w.map(|w| w.0),
        until_ns: w.map(|w| w.1),
        ..Default::default()
    };
    vec![
        f(Some("cudaMemcpy"), None),
        f(Some("cudaHostAlloc"), None),
        f(Some("cudaStreamSynchronize"), None),
        f(Some("cudaMalloc"), None),
        f(None, Some((3_000_000, 40_000_000))),
        f(Some("cudaMemcpy"), Some((8_000_000, 139_000_000))),
        f(None, Some((0, u64::MAX / 2))),
    ]
}

/// `scoped::explanation` against the loaded trace filtered to the scope
/// (findings, summary, thread splits; percentiles within the bound); the
/// kinds of the findings compared.
fn assert_scopes_equal_the_load(path: &Path) -> BTreeSet<&'static str> {
    let trace = Trace::open(path).unwrap();
    let mut kinds = BTreeSet::new();
    for f in scopes() {
        let got = sleuth_store::scoped::explanation(&trace, &f)
            .unwrap()
            .expect("streamed");
        let mut want = trace.load(f.pid).unwrap();
        // A window's copies are judged against the host memory pinned
        // before it too (every pinning call that began before it), and a
        // copy op's against the pinning calls of its time.
        let pinned = pinned_before(&want.calls, f.since_ns);
        let copy_scope =
            f.op.as_deref()
                .and_then(op_by_name)
                .is_some_and(|o| o.class == sleuth_core::ops::OpClass::Copy);
        let pinning: Vec<CallEvent> = want
            .calls
            .iter()
            .filter(|c| {
                copy_scope
                    && is_pinning(c)
                    && f.since_ns.is_none_or(|s| c.ts_ns >= s)
                    && f.until_ns.is_none_or(|u| c.ts_ns < u)
            })
            .cloned()
            .collect();
        want.calls.retain(|c| {
            f.op.as_deref().is_none_or(|o| c.op_name() == o)
                && f.since_ns.is_none_or(|s| c.ts_ns >= s)
                && f.until_ns.is_none_or(|u| c.ts_ns < u)
        });
        sleuth_store::scoped::keep_counts_of_op(&mut want.counts, f.op.as_deref());
        // A window's shares are of the window inside the trace (round 51).
        want.window_ns = (f.since_ns, f.until_ns);
        let want = sleuth_core::findings::explain_report_pinned(&want, pinned, &pinning);
        let at = format!("op {:?} window {:?}..{:?}", f.op, f.since_ns, f.until_ns);
        let (mut g, w) = (json(&got), json(&want));
        same_text_within_the_bound(&mut g, &w);
        for k in ["findings", "summary", "threads"] {
            assert_close(&g[k], &w[k], &format!("{at}: {k}"));
        }
        assert!(!got.threads.is_empty(), "{at}: a split");
        // A window's memory and pinning calls kept by the pass, or past the
        // cap read again in return order (none kept, or dropped mid-way):
        // the same answer.
        if f.since_ns.is_some() {
            for cap in [0, 7] {
                let again = sleuth_store::scoped::explanation_keeping_at_most(&trace, &f, cap)
                    .unwrap()
                    .expect("streamed");
                assert_eq!(json(&again), json(&got), "{at}: kept at most {cap}");
            }
        }
        kinds.extend(want.findings.iter().map(|x| x.kind.as_str()));
    }
    kinds
}

/// Whether a call pins or unpins host memory.
fn is_pinning(c: &CallEvent) -> bool {
    use sleuth_core::ops::OpClass;
    c.info().is_some_and(|i| {
        matches!(
            i.class,
            OpClass::HostAlloc
                | OpClass::HostRegister
                | OpClass::HostFree
                | OpClass::HostUnregister
        )
    })
}

/// The host ranges pinned when a window starting at `since` began: the
/// loaded pinning calls that started before it, in end order.
fn pinned_before(calls: &[CallEvent], since: Option<u64>) -> PinnedState {
    let mut replay = FindingInputs::new(Resolution::Exact, None);
    if let Some(since) = since {
        let mut before: Vec<&CallEvent> = calls.iter().filter(|c| c.ts_ns < since).collect();
        before.sort_by_key(|c| c.end_ns());
        for (i, c) in before.into_iter().enumerate() {
            // Copies before the window are fed too: they change no range.
            replay.add_in_end_order(i, c);
        }
    }
    replay.pinned_state()
}

/// Where a sentence of `got` differs from `want`'s only by numbers within
/// the percentiles' bound (or the last digit shown: "348.0us" against
/// "348.1us"), takes `want`'s: `assert_close` then compares the rest.
fn same_text_within_the_bound(got: &mut serde_json::Value, want: &serde_json::Value) {
    use serde_json::Value;
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                if let Some(gv) = g.get_mut(k) {
                    same_text_within_the_bound(gv, wv);
                }
            }
        }
        (Value::Array(g), Value::Array(w)) => {
            for (gv, wv) in g.iter_mut().zip(w) {
                same_text_within_the_bound(gv, wv);
            }
        }
        (Value::String(g), Value::String(w)) if g != w => {
            let split = |s: &str| -> (String, Vec<String>) {
                let (mut text, mut nums, mut cur) = (String::new(), Vec::new(), String::new());
                for ch in s.chars() {
                    if ch.is_ascii_digit() || (ch == '.' && !cur.is_empty()) {
                        cur.push(ch);
                    } else {
                        if !cur.is_empty() {
                            nums.push(std::mem::take(&mut cur));
                            text.push('#');
                        }
                        text.push(ch);
                    }
                }
                if !cur.is_empty() {
                    nums.push(cur);
                }
                (text, nums)
            };
            let ((gt, gn), (wt, wn)) = (split(g), split(w));
            let near = |a: &String, b: &String| {
                let (x, y): (f64, f64) = (a.parse().unwrap(), b.parse().unwrap());
                let last_digit = b
                    .split_once('.')
                    .map_or(1.0, |(_, f)| 10f64.powi(-(f.len() as i32)));
                (x - y).abs() <= (y.abs() * MAX_RELATIVE_ERROR).max(last_digit * 1.001)
            };
            if gt == wt && gn.len() == wn.len() && gn.iter().zip(&wn).all(|(a, b)| near(a, b)) {
                *g = w.clone();
            }
        }
        _ => {}
    }
}

/// Takes the writer's rollups of each op's scope out of the file (as in a
/// file written before them): an op's scope is then streamed from its calls
/// and waits, which the tests of crafted rows below exercise.
fn without_op_rollups(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let n = conn
        .execute("DELETE FROM meta WHERE key = 'finding_op_rollups'", [])
        .unwrap();
    assert_eq!(n, 1, "the writer stores the op scopes' rollups");
}

fn json(e: &sleuth_core::findings::Explanation) -> serde_json::Value {
    serde_json::to_value(e).unwrap()
}

#[test]
fn scopes_of_densely_interleaved_waits_equal_the_loaded_trace() {
    let dir = TempDir::new("scoped-dense");
    let path = dir.join("t.db");
    let data = synthetic();
    rewrite(&data, &path);
    let kinds = assert_scopes_equal_the_load(&path);
    // Copies judged against pinned memory (in the pass or replayed in
    // return order), culprits of preempted calls, a tail.
    for k in ["pageable_copy", "cpu_preemption", "tail_latency"] {
        assert!(kinds.contains(k), "{k} among {kinds:?}");
    }

    // The writer's culprits of every call are the recomputation's (the
    // same pass, one read of the waits for culprits and split).
    let trace = Trace::open(&path).unwrap();
    let loaded = trace.load(Some(PID)).unwrap();
    let want = sleuth_core::culprits::call_culprits(
        &loaded.calls,
        &loaded.waits,
        sleuth_core::threads::tracer_pid(&loaded),
    );
    let mut stored = trace.calls_filtered(&CallFilter::default()).unwrap();
    stored.sort_by_key(|s| (s.call.ts_ns, s.id));
    assert_eq!(stored.len(), loaded.calls.len());
    let ids: Vec<i64> = stored.iter().map(|s| s.id).collect();
    let by_id = trace.call_culprits_of(&ids).unwrap();
    let mut with_culprits = 0;
    for ((s, call), want) in stored.iter().zip(&loaded.calls).zip(&want) {
        assert_eq!(&s.call, call, "the load's order");
        let got = by_id.get(&s.id).cloned().unwrap_or_default();
        assert_eq!(&got, want, "call {}", s.id);
        with_culprits += usize::from(!got.is_empty());
    }
    assert!(with_culprits > 50, "{with_culprits} calls with culprits");
}

/// Waits of a kind this build does not know are skipped by every reader:
/// the scoped answer stays the loaded trace's without them.
#[test]
fn waits_of_an_unknown_kind_are_skipped_as_the_load_skips_them() {
    let dir = TempDir::new("scoped-unknown-kind");
    let path = dir.join("t.db");
    rewrite(&synthetic(), &path);
    without_op_rollups(&path);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let changed = conn
        .execute("UPDATE waits SET kind_id = 7 WHERE id % 5 = 0", [])
        .unwrap();
    assert!(changed > 100);
    drop(conn);
    assert_scopes_equal_the_load(&path);
}

/// A `call_culprits` row that disagrees with the waits (a damaged or
/// crafted file): the scoped explanation computes the culprits from the
/// waits, as the loaded trace does, so the stored rows change nothing.
#[test]
fn stored_call_culprits_that_disagree_with_the_waits_are_not_read() {
    let dir = TempDir::new("scoped-crafted-culprits");
    let path = dir.join("t.db");
    rewrite(&synthetic(), &path);
    without_op_rollups(&path);
    let answer = |path: &Path| {
        let trace = Trace::open(path).unwrap();
        scopes()
            .iter()
            .map(|f| {
                json(
                    &sleuth_store::scoped::explanation(&trace, f)
                        .unwrap()
                        .unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    let before = answer(&path);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "UPDATE call_culprits SET runnable_ns = runnable_ns * 1000 + 7, comm = 'crafted';
         INSERT INTO call_culprits(call_id, pid, tid, comm, runnable_ns)
             SELECT id, 1, 1, 'invented', 5000 FROM call_rows WHERE id % 3 = 0;",
    )
    .unwrap();
    drop(conn);
    assert_eq!(answer(&path), before);
    assert_scopes_equal_the_load(&path);
}

/// Row ids that do not follow the start order of a thread's calls (a
/// crafted or merged file): an op's calls, read in row order, come out of
/// order, and the scope is read thread by thread instead (same answer).
#[test]
fn calls_stored_out_of_start_order_give_the_same_answer() {
    let dir = TempDir::new("scoped-row-order");
    let path = dir.join("t.db");
    rewrite(&synthetic(), &path);
    without_op_rollups(&path);
    let conn = rusqlite::Connection::open(&path).unwrap();
    // Every other call (and what names it) moves past the last row id; not
    // far past: the copies stay many enough of the rows to be read in row
    // order (`stream::scan_table`), not sorted through the op index.
    let last: i64 = conn
        .query_row("SELECT max(id) FROM call_rows", [], |r| r.get(0))
        .unwrap();
    for table in [
        "call_rows SET id = id",
        "call_host_ptrs SET call_id = call_id",
        "call_culprits SET call_id = call_id",
    ] {
        let col = if table.starts_with("call_rows") {
            "id"
        } else {
            "call_id"
        };
        conn.execute(&format!("UPDATE {table} + ?1 WHERE {col} % 2 = 0"), [last])
            .unwrap();
    }
    drop(conn);
    assert_scopes_equal_the_load(&path);
}

/// Every op's scope, of the process and of the whole trace, answered from
/// the writer's rollups of it equals the answer streamed from the calls
/// and waits (and so the loaded trace's, above), and reads no wait: with
/// the waits gone from the file the stored answer stays, the streamed one
/// changes.
#[test]
fn op_scopes_from_the_writers_rollups_equal_the_streamed_answer() {
    let dir = TempDir::new("scoped-op-rollups");
    let stored = dir.join("stored.db");
    rewrite(&synthetic(), &stored);
    let streamed = dir.join("streamed.db");
    std::fs::copy(&stored, &streamed).unwrap();
    without_op_rollups(&streamed);
    let answers = |path: &Path| op_scope_answers(path, &[Some(PID), None]);
    let want = answers(&streamed);
    let got = answers(&stored);
    let kinds = assert_answers_close(&got, &want);
    for k in ["pageable_copy", "cpu_preemption", "tail_latency"] {
        assert!(kinds.contains(k), "{k} among {kinds:?}");
    }
    // No wait is read: the answer from the rollups stays without them.
    for path in [&stored, &streamed] {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute("DELETE FROM waits", []).unwrap();
    }
    let after = answers(&stored);
    for ((at, g), (_, a)) in got.iter().zip(&after) {
        assert_eq!(g, a, "{at}");
    }
    assert_ne!(
        answers(&streamed),
        want,
        "the streamed answer reads the waits"
    );
}

/// Five processes on one timeline, pinning the same host addresses: the
/// writer's completion stores each process's op scopes once its threads
/// and its pinned-memory replay are done (round 46); each process's and
/// the whole trace's scope of every op equal the streamed answer, which
/// judges every copy against its own process's pinned ranges.
#[test]
fn op_scopes_of_many_processes_from_the_writers_rollups_equal_the_streamed_answer() {
    let dir = TempDir::new("scoped-op-rollups-many");
    let stored = dir.join("stored.db");
    rewrite(&many_processes(5), &stored);
    let streamed = dir.join("streamed.db");
    std::fs::copy(&stored, &streamed).unwrap();
    without_op_rollups(&streamed);
    let pids: Vec<Option<u32>> = (0..5).map(|k| Some(PID + k)).chain([None]).collect();
    let got = op_scope_answers(&stored, &pids);
    let kinds = assert_answers_close(&got, &op_scope_answers(&streamed, &pids));
    assert!(kinds.contains("pageable_copy"), "{kinds:?}");
}

/// Whether two lists of answers agree within the histograms' bound; the
/// kinds of the findings.
fn assert_answers_close(
    got: &[(String, serde_json::Value)],
    want: &[(String, serde_json::Value)],
) -> BTreeSet<String> {
    assert_eq!(got.len(), want.len());
    let mut kinds = BTreeSet::new();
    for ((at, g), (_, w)) in got.iter().zip(want) {
        for k in ["findings", "summary", "threads", "notes"] {
            assert_close(&g[k], &w[k], &format!("{at}: {k}"));
        }
        for f in w["findings"].as_array().unwrap() {
            kinds.insert(f["kind"].as_str().unwrap().to_string());
        }
    }
    kinds
}

/// The scope of every op of the file (and of one it never called) of each
/// of `pids` (None: the whole trace), labelled.
fn op_scope_answers(path: &Path, pids: &[Option<u32>]) -> Vec<(String, serde_json::Value)> {
    let trace = Trace::open(path).unwrap();
    let ops: BTreeSet<String> = trace
        .load(None)
        .unwrap()
        .calls
        .iter()
        .map(|c| c.op_name().to_string())
        .collect();
    assert!(ops.len() >= 5, "{ops:?}");
    // And an op the trace never called: an empty scope either way.
    assert!(!ops.contains("cuMemUnmap"));
    let mut out = Vec::new();
    for op in ops.into_iter().chain(["cuMemUnmap".to_string()]) {
        for &pid in pids {
            let f = CallFilter {
                pid,
                op: Some(op.clone()),
                ..Default::default()
            };
            let e = sleuth_store::scoped::explanation(&trace, &f)
                .unwrap()
                .expect("explained");
            out.push((format!("{op} {pid:?}"), json(&e)));
        }
    }
    out
}

/// An op scope's rollup table that is not the one gpusleuth writes (a
/// trigger hung on it, a row that does not parse) is refused with one
/// line, never read or run.
#[test]
fn damaged_op_scope_rollups_are_refused() {
    let dir = TempDir::new("scoped-op-rollups-damaged");
    let f = CallFilter {
        pid: Some(PID),
        op: Some("cudaMemcpy".into()),
        ..Default::default()
    };
    for (i, damage) in [
        "CREATE TRIGGER t AFTER INSERT ON finding_op_threads BEGIN SELECT 1; END;",
        "DROP TABLE finding_op_hist;
         CREATE TABLE finding_op_hist(op TEXT, kind TEXT, pid INTEGER, tid INTEGER, bucket INTEGER, count INTEGER, extra TEXT);",
        "UPDATE finding_op_threads SET split = '{\"pid\": 1' WHERE op = 'cudaMemcpy';",
    ]
    .iter()
    .enumerate()
    {
        let path = dir.join(&format!("t{i}.db"));
        rewrite(&synthetic(), &path);
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(damage).unwrap();
        drop(conn);
        let trace = Trace::open(&path).unwrap();
        let e = sleuth_store::scoped::explanation(&trace, &f)
            .unwrap_err()
            .to_string();
        assert!(e.contains("finding_op_"), "{damage}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

/// Histogram counts no file can hold (a crafted file: their sum would
/// overflow the percentiles' arithmetic) are refused in one line, in the
/// op scopes' rollups and in the trace's own op histograms they read.
#[test]
fn histogram_counts_past_any_file_are_refused() {
    let dir = TempDir::new("scoped-huge-counts");
    for (i, (table, op)) in [
        ("finding_op_hist", "cudaStreamSynchronize"),
        ("finding_op_hist", "cudaLaunchKernel"),
        ("finding_hist", "cudaMemcpy"),
    ]
    .iter()
    .enumerate()
    {
        let path = dir.join(&format!("t{i}.db"));
        rewrite(&synthetic(), &path);
        let conn = rusqlite::Connection::open(&path).unwrap();
        let n = conn
            .execute(
                &format!("UPDATE {table} SET count = 4611686018427387904"),
                [],
            )
            .unwrap();
        assert!(n > 4, "{table}: {n} rows");
        drop(conn);
        let trace = Trace::open(&path).unwrap();
        let f = CallFilter {
            pid: Some(PID),
            op: Some(op.to_string()),
            ..Default::default()
        };
        let e = sleuth_store::scoped::explanation(&trace, &f)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("damaged trace: {table}")), "{op}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

/// Every number of the stored aggregates (the finding rollups, the op
/// scopes', the threads' splits) set to the largest a reader accepts
/// (2^62) is answered, past it refused in one line: never a panic (this
/// test runs in a debug build, where an overflow panics) nor a wrapped sum.
#[test]
fn stored_aggregates_at_and_past_the_largest_value_never_panic() {
    fn set_numbers(v: &mut serde_json::Value, n: u64) {
        use serde_json::Value;
        match v {
            Value::Number(_) => *v = serde_json::json!(n),
            // Culprit triples ([pid, comm, ns]) keep their pids.
            Value::Array(a) if !a.iter().any(Value::is_string) => {
                a.iter_mut().for_each(|x| set_numbers(x, n))
            }
            Value::Object(o) => o
                .iter_mut()
                .filter(|(k, _)| {
                    !["pid", "tid", "index", "k", "kept", "pids", "slowed_pids"]
                        .contains(&k.as_str())
                })
                .for_each(|(_, x)| set_numbers(x, n)),
            _ => {}
        }
    }
    let dir = TempDir::new("scoped-extreme-aggregates");
    for (i, n) in [1u64 << 62, u64::MAX].into_iter().enumerate() {
        let path = dir.join(&format!("t{i}.db"));
        rewrite(&synthetic(), &path);
        let conn = rusqlite::Connection::open(&path).unwrap();
        for (table, col) in [
            ("finding_ops", "inputs"),
            ("finding_process_ops", "inputs"),
            ("finding_threads", "inputs"),
            ("rollup_threads", "split"),
            ("finding_op_threads", "inputs"),
            ("finding_op_threads", "split"),
        ] {
            let rows: Vec<(i64, String)> = conn
                .prepare(&format!("SELECT rowid, {col} FROM {table}"))
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert!(!rows.is_empty(), "{table}");
            for (id, text) in rows {
                let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
                set_numbers(&mut v, n);
                conn.execute(
                    &format!("UPDATE {table} SET {col} = ?1 WHERE rowid = ?2"),
                    rusqlite::params![v.to_string(), id],
                )
                .unwrap();
            }
        }
        drop(conn);
        let trace = Trace::open(&path).unwrap();
        let budget = sleuth_store::ReadBudget::new(std::time::Duration::from_secs(60));
        let mut answers = vec![sleuth_store::lean::load(&trace, None, budget)
            .map(|l| l.map(|l| l.explanation()).is_some())];
        for op in [
            "cudaMemcpy",
            "cudaStreamSynchronize",
            "cudaMalloc",
            "cudaHostAlloc",
        ] {
            let f = CallFilter {
                pid: Some(PID),
                op: Some(op.into()),
                ..Default::default()
            };
            answers.push(sleuth_store::scoped::explanation(&trace, &f).map(|e| e.is_some()));
        }
        for a in answers {
            match (n, a) {
                (n, Ok(true)) if n == 1 << 62 => {}
                (n, Err(e)) if n == u64::MAX => {
                    let e = e.to_string();
                    assert!(e.contains("no trace holds") && !e.contains('\n'), "{e}");
                }
                (n, other) => panic!("{n}: {:?}", other.map_err(|e| e.to_string())),
            }
        }
    }
}

const MS: u64 = 1_000_000;

/// A 10-second trace of one thread: a 1 ms sync every 100 ms, on the CPU
/// between them, and 100,000 launches counted in the kernel, all in the
/// last 5 s (20,000 a second). `samples`: their running count sampled
/// every 200 ms, as `trace` stores it. The whole trace is not
/// launch-bound (99 us of host time per launch); its last seconds are.
fn counted_trace(path: &Path, samples: bool) -> u64 {
    let origin = common::trace_fixture::session().start_mono_ns;
    let calls: Vec<CallEvent> = (0..=100)
        .map(|i| {
            let mut c = call(41, "cudaStreamSynchronize", origin + i * 100 * MS, MS);
            c.stack_id = None;
            c
        })
        .collect();
    let launches = 100_000;
    let op = op_by_name("cuLaunchKernel").unwrap().id;
    let w = sleuth_store::TraceWriter::create(
        path,
        common::trace_fixture::session(),
        Default::default(),
    )
    .unwrap();
    let h = w.handle();
    h.set_process(train()).unwrap();
    for c in calls {
        h.send(sleuth_core::Event::Call(c)).unwrap();
    }
    if samples {
        let per_sample = launches / 25; // 25 samples of 200 ms in the last 5 s
        let rows = (1..=50)
            .map(|k| sleuth_core::counted::CountSample {
                ts_ns: origin + k * 200 * MS,
                pid: PID,
                op,
                count: k.saturating_sub(25) * per_sample,
            })
            .collect();
        h.add_count_samples(rows).unwrap();
    }
    h.set_op_counts(vec![sleuth_core::OpCount {
        pid: PID,
        op,
        count: launches,
    }])
    .unwrap();
    h.set_session_end(origin + 10_000 * MS).unwrap();
    drop(h);
    w.finish().unwrap();
    if !samples {
        // A trace written before the samples: no table at all.
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch("DROP TABLE op_count_samples").unwrap();
    }
    launches
}

fn kinds(e: &sleuth_core::findings::Explanation) -> Vec<&'static str> {
    e.findings.iter().map(|f| f.kind.as_str()).collect()
}

/// The window `[from, to)` of the counted trace (ms since it began).
fn counted_window(from: u64, to: u64) -> CallFilter {
    let origin = common::trace_fixture::session().start_mono_ns;
    CallFilter {
        pid: Some(PID),
        since_ns: Some(origin + from * MS),
        until_ns: Some(origin + to * MS),
        ..Default::default()
    }
}

/// The explanation of a window, streamed and loaded (the same answer).
fn window_explained(trace: &Trace, w: &CallFilter) -> sleuth_core::findings::Explanation {
    let streamed = sleuth_store::scoped::explanation(trace, w)
        .unwrap()
        .expect("streamed");
    let pinned =
        sleuth_store::scoped::pinned_before(trace, w.pid, w.since_ns, PinnedState::default())
            .unwrap();
    let loaded =
        sleuth_store::window::explain_loaded(trace, trace.load_calls_of(w).unwrap(), w, pinned)
            .unwrap();
    let (mut g, l) = (json(&streamed), json(&loaded));
    same_text_within_the_bound(&mut g, &l);
    assert_close(&g["findings"], &l["findings"], "window findings");
    assert_eq!(streamed.notes, loaded.notes);
    streamed
}

/// Launches counted in the kernel (`--launches driver`, the default) have
/// no time; the tracer's samples of their count place them in a window.
/// A healthy GPU-bound loop after `set_device` and 1.5 s asleep, its
/// launches counted in the kernel and sampled: the pause is left out of a
/// window's explanation as of the whole file's (a window had not read the
/// samples, so its counted launches could not be placed and the pause was
/// judged: input_wait woken by a timer; round 52's tester).
#[test]
fn a_pause_is_left_out_of_a_window_as_of_the_whole_file() {
    let dir = TempDir::new("scoped-window-pause");
    let path = dir.join("t.db");
    let origin = common::trace_fixture::session().start_mono_ns;
    let op = op_by_name("cuLaunchKernel").unwrap().id;
    let w = sleuth_store::TraceWriter::create(
        &path,
        common::trace_fixture::session(),
        Default::default(),
    )
    .unwrap();
    let h = w.handle();
    h.set_process(train()).unwrap();
    let mut set = call(PID, "cudaSetDevice", origin, 10_000);
    set.stack_id = None;
    h.send(sleuth_core::Event::Call(set)).unwrap();
    h.send(sleuth_core::Event::Wait(WaitEvent {
        pid: PID,
        tid: PID,
        kind: WaitKind::Blocked,
        off_ns: origin + 10_000,
        wake_ns: origin + 1_500 * MS,
        on_ns: origin + 1_500 * MS,
        prev_state: 1,
        cpu: 0,
        culprits: Vec::new(),
        waker: Some(Waker {
            pid: 0,
            tid: 0,
            comm: "swapper/0".into(),
            irq: true,
        }),
    }))
    .unwrap();
    for i in 0..50 {
        let mut c = call(
            PID,
            "cudaStreamSynchronize",
            origin + 1_500 * MS + i * 20 * MS,
            19 * MS,
        );
        (c.blocked_ns, c.stack_id) = (19 * MS, None);
        h.send(sleuth_core::Event::Call(c)).unwrap();
    }
    // 50 launches during the loop, sampled every 200 ms.
    let rows = (1..=5)
        .map(|k| sleuth_core::counted::CountSample {
            ts_ns: origin + 1_500 * MS + k * 200 * MS,
            pid: PID,
            op,
            count: k * 10,
        })
        .collect();
    h.add_count_samples(rows).unwrap();
    h.set_op_counts(vec![sleuth_core::OpCount {
        pid: PID,
        op,
        count: 50,
    }])
    .unwrap();
    h.set_session_end(origin + 2_600 * MS).unwrap();
    drop(h);
    w.finish().unwrap();
    let trace = Trace::open(&path).unwrap();
    let whole = sleuth_core::findings::explain_report(&trace.load(None).unwrap());
    assert!(whole.findings.is_empty(), "{:?}", kinds(&whole));
    assert!(
        whole
            .summary
            .as_ref()
            .unwrap()
            .contains("one pause of 1.5 s"),
        "{:?}",
        whole.summary
    );
    let e = window_explained(&trace, &counted_window(0, 3_000));
    assert!(e.findings.is_empty(), "{:?}", kinds(&e));
}

/// Given the whole trace's count, a window of the quiet first seconds was
/// launch-bound (what MCP windows said before): placed, only the window of
/// the launch storm is, judged on the launches certainly inside it.
#[test]
fn a_window_places_the_kernel_counted_launches_by_their_samples() {
    let dir = TempDir::new("scoped-window-counted");
    let path = dir.join("t.db");
    let launches = counted_trace(&path, true);
    let trace = Trace::open(&path).unwrap();
    let whole = sleuth_core::findings::explain_report(&trace.load(None).unwrap());
    assert!(
        !kinds(&whole).contains(&"launch_bound"),
        "{:?}",
        kinds(&whole)
    );

    // The quiet seconds with the whole trace's count: launch-bound (wrong)
    // until round 57; the verdicts now place a thread's counted launches
    // by the samples themselves, so even given the whole count they are
    // not its.
    let quiet = counted_window(1_000, 3_000);
    let with_counts = trace.load_calls_of(&quiet).unwrap();
    assert_eq!(with_counts.counts[0].count, launches);
    let before = sleuth_core::findings::explain_report(&with_counts);
    assert!(
        !kinds(&before).contains(&"launch_bound"),
        "{:?}",
        kinds(&before)
    );
    let mut unplaced = with_counts.clone();
    unplaced.count_samples = None;
    let before = sleuth_core::findings::explain_report(&unplaced);
    assert!(
        kinds(&before).contains(&"launch_bound"),
        "without samples: {:?}",
        kinds(&before)
    );
    // Placed: none of them there.
    let e = window_explained(&trace, &quiet);
    assert!(!kinds(&e).contains(&"launch_bound"), "{:?}", kinds(&e));
    assert!(e.notes[0].contains("0 to 0 of them"), "{:?}", e.notes);

    // The storm: 40,000 launches certainly in [6 s, 8 s) (samples on both
    // edges), ~49.5 us of host time each: launch-bound.
    let storm = counted_window(6_000, 8_000);
    let e = window_explained(&trace, &storm);
    let f = e
        .findings
        .iter()
        .find(|f| f.kind.as_str() == "launch_bound")
        .unwrap_or_else(|| panic!("{:?} {:?}", kinds(&e), e.notes));
    // The verdict's are those of its thread's window, [6.0 s, 7.901 s]: the
    // nine sample periods inside it and, of the one across its end, 101 ms
    // at their rate (round 57; the query window's 40,000 before).
    assert_eq!(f.evidence["launches"], 38_020);
    assert!(
        e.notes[0].contains("40000 to 40000 of them"),
        "{:?}",
        e.notes
    );
    // Off the sample times: judged on the certain ones only.
    let e = window_explained(&trace, &counted_window(6_100, 8_100));
    assert!(
        e.notes[0].contains("36000 to 44000 of them") && e.notes[0].contains("about 40000"),
        "{:?}",
        e.notes
    );

    // Statistics: the window's syncs and the estimate of its launches.
    let (r, counted) = sleuth_store::window::stats_report(&trace, &storm)
        .unwrap()
        .expect("a finished trace");
    let ops: Vec<(&str, u64)> = r.ops.iter().map(|o| (o.op, o.count)).collect();
    assert_eq!(
        ops,
        vec![("cudaStreamSynchronize", 20), ("cuLaunchKernel", 40_000)]
    );
    assert_eq!(counted.json()[0]["at_most"], 40_000);
    let (loaded, _) = sleuth_store::window::stats_from_loaded(
        &trace,
        trace.load_calls_of(&storm).unwrap(),
        &storm,
    )
    .unwrap();
    let lops: Vec<(&str, u64)> = loaded.ops.iter().map(|o| (o.op, o.count)).collect();
    assert_eq!(lops, ops);

    // A file still being written: no session end and no stored counts yet
    // (they are stored when it ends); its samples alone place the calls.
    let open = dir.join("open.db");
    std::fs::copy(&path, &open).unwrap();
    rusqlite::Connection::open(&open)
        .unwrap()
        .execute_batch("UPDATE session SET end_mono_ns = NULL; DELETE FROM op_counts;")
        .unwrap();
    let live = Trace::open(&open).unwrap();
    let e = window_explained(&live, &storm);
    assert!(
        kinds(&e).contains(&"launch_bound"),
        "{:?} {:?}",
        kinds(&e),
        e.notes
    );
    assert!(
        e.notes[0].contains("40000 to 40000 of them"),
        "{:?}",
        e.notes
    );
    assert!(e.notes[0].contains("no end yet"), "{:?}", e.notes);
    let (_, counted) = sleuth_store::window::stats_report(&live, &storm)
        .unwrap()
        .unwrap();
    assert_eq!(counted.estimates()[0].count, 40_000);

    // No window: the whole trace's count, no note.
    let all = sleuth_store::scoped::explanation(
        &trace,
        &CallFilter {
            pid: Some(PID),
            op: Some("cudaStreamSynchronize".into()),
            ..Default::default()
        },
    )
    .unwrap()
    .expect("streamed");
    assert!(
        all.notes
            .iter()
            .all(|n| !n.contains("counted in the kernel")),
        "{:?}",
        all.notes
    );
}

/// A trace written before the samples cannot place its counted launches:
/// a window leaves them out and says so, never the whole trace's count.
#[test]
fn a_window_of_a_trace_without_count_samples_leaves_the_launches_out() {
    let dir = TempDir::new("scoped-window-unsampled");
    let path = dir.join("t.db");
    let launches = counted_trace(&path, false);
    let trace = Trace::open(&path).unwrap();
    for w in [counted_window(1_000, 3_000), counted_window(6_000, 8_000)] {
        let e = window_explained(&trace, &w);
        assert!(!kinds(&e).contains(&"launch_bound"), "{:?}", kinds(&e));
        assert!(
            e.notes
                .iter()
                .any(|n| n.starts_with(&format!("{launches} call(s) of the whole trace"))),
            "{:?}",
            e.notes
        );
        let (r, _) = sleuth_store::window::stats_report(&trace, &w)
            .unwrap()
            .unwrap();
        assert!(
            r.ops.iter().all(|o| o.op != "cuLaunchKernel"),
            "{:?}",
            r.ops
        );
    }
}

/// A host allocation of thread 41 pinning `size` bytes at `ptr`.
fn host_alloc(ts: u64, ptr: u64, size: u64) -> CallEvent {
    let mut a = call(41, "cudaHostAlloc", ts, 100);
    a.stack_id = None;
    a.ptr = Some(ptr);
    a.size = Some(size);
    a
}

/// 30 copies of 5 ms on the CPU from 20 ms on, by thread 41 from `pinned`
/// and thread 42 from pageable memory: enough staging for pageable_copy.
fn copies_from(pinned: u64) -> Vec<CallEvent> {
    let mut calls = Vec::new();
    for (tid, host) in [(41, pinned), (42, 0x5000_0000)] {
        for k in 0..30 {
            let mut c = call(tid, "cudaMemcpy", 20 * MS + k * 11 * MS / 2, 5 * MS);
            c.stack_id = None;
            c.size = Some(4096);
            c.kind = Some(1);
            c.host_ptr = Some(host);
            calls.push(c);
        }
    }
    calls
}

/// `calls` as a trace of the one process, written to `path`.
fn written(mut calls: Vec<CallEvent>, path: &Path) {
    calls.sort_by_key(|c| c.ts_ns);
    let data = TraceData {
        calls,
        processes: vec![train()],
        has_host_context: true,
        ..Default::default()
    };
    rewrite(&data, path);
}

/// Each pageable_copy finding's (tid, copies, pinned_copies).
fn pageable(e: &sleuth_core::findings::Explanation) -> Vec<(u64, u64, u64)> {
    e.findings
        .iter()
        .filter(|f| f.kind.as_str() == "pageable_copy")
        .map(|f| {
            let n = |k: &str| f.evidence[k].as_u64().unwrap();
            (n("tid"), n("copies"), n("pinned_copies"))
        })
        .collect()
}

/// A window's copies from host memory pinned before the window began are
/// pinned, as the whole trace judges them (they were counted pageable: a
/// false `pageable_copy` for any program that pins its buffers early),
/// streamed and through the loaded window alike; copies from pageable
/// memory stay pageable.
#[test]
fn a_window_judges_copies_against_memory_pinned_before_it() {
    let pinned_at = 0x7f00_0010_0000u64;
    let mut calls = vec![host_alloc(MS, pinned_at, 1 << 20)];
    calls.extend(copies_from(pinned_at + 8));
    let dir = TempDir::new("scoped-pinned-before");
    let path = dir.join("t.db");
    written(calls, &path);
    let trace = Trace::open(&path).unwrap();
    let whole = sleuth_store::scoped::explanation(&trace, &CallFilter::default())
        .unwrap()
        .expect("streamed");
    assert_eq!(pageable(&whole), vec![(42, 30, 0)], "the whole trace");
    let window = CallFilter {
        since_ns: Some(10 * MS),
        ..Default::default()
    };
    let streamed = sleuth_store::scoped::explanation(&trace, &window)
        .unwrap()
        .expect("streamed");
    assert_eq!(
        pageable(&streamed),
        vec![(42, 30, 0)],
        "the window, streamed"
    );
    // The loaded window, as `scoped::explanation_or_loaded` falls back to it.
    let pinned =
        sleuth_store::scoped::pinned_before(&trace, None, Some(10 * MS), PinnedState::default())
            .unwrap();
    let loaded = sleuth_store::window::explain_loaded(
        &trace,
        trace.load_calls_of(&window).unwrap(),
        &window,
        pinned,
    )
    .unwrap();
    assert_eq!(pageable(&loaded), vec![(42, 30, 0)], "the window, loaded");
    // A scope of the copy op alone (MCP `findings {op}`), with and without
    // the window, from the writer's op rollups or streamed: the copies are
    // judged against the pinning calls it does not hold.
    let streamed_copy = dir.join("streamed.db");
    std::fs::copy(&path, &streamed_copy).unwrap();
    without_op_rollups(&streamed_copy);
    let streamed_copy = Trace::open(&streamed_copy).unwrap();
    // From before the pinning call (inside the scope's time, another op's)
    // and from after it (pinned before the window).
    for since_ns in [None, Some(MS / 2), Some(10 * MS)] {
        let f = CallFilter {
            op: Some("cudaMemcpy".into()),
            since_ns,
            ..Default::default()
        };
        for (t, how) in [(&trace, "rollups"), (&streamed_copy, "streamed")] {
            let e = sleuth_store::scoped::explanation(t, &f)
                .unwrap()
                .expect("explained");
            assert_eq!(
                pageable(&e),
                vec![(42, 30, 0)],
                "copies alone, {how}, since {since_ns:?}"
            );
        }
        // A window of the copies loaded (a file without stored call groups).
        if since_ns.is_some() {
            let mut data = trace.load_calls_of(&f).unwrap();
            sleuth_store::scoped::keep_counts_of_op(&mut data.counts, f.op.as_deref());
            let seed =
                sleuth_store::scoped::pinned_before(&trace, None, since_ns, PinnedState::default())
                    .unwrap();
            let loaded = sleuth_store::window::explain_loaded(&trace, data, &f, seed).unwrap();
            assert_eq!(
                pageable(&loaded),
                vec![(42, 30, 0)],
                "copies alone, loaded window"
            );
        }
    }
    // The pinning call itself is not in the window.
    let before = |t: u64| {
        sleuth_store::scoped::pinned_before(&trace, None, Some(t), PinnedState::default()).unwrap()
    };
    assert!(!before(10 * MS).is_empty());
    assert!(before(MS).is_empty());
}

/// A run's newest file: a window of it judges its copies against what the
/// run's earlier files left pinned (`run::pinned_when_file_began`), so a
/// buffer pinned when the program started is pinned in a file written
/// long after; without it, every copy of the file is pageable.
#[test]
fn a_runs_newest_file_knows_memory_pinned_in_earlier_files() {
    let pinned_at = 0x7f00_0010_0000u64;
    let dir = TempDir::new("scoped-pinned-run");
    written(
        vec![host_alloc(MS, pinned_at, 1 << 20)],
        &dir.join("part-000001.db"),
    );
    written(copies_from(pinned_at + 8), &dir.join("part-000002.db"));
    let newest = Trace::open(&dir.join("part-000002.db")).unwrap();
    let window = CallFilter {
        since_ns: Some(10 * MS),
        ..Default::default()
    };
    let earlier = sleuth_store::run::pinned_when_file_began(
        &dir.0,
        2,
        None,
        &sleuth_store::ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT),
        &sleuth_store::CheckMemo::new(),
    )
    .unwrap();
    assert!(!earlier.is_empty(), "the first file pinned a buffer");
    let carried =
        sleuth_store::scoped::explanation_or_loaded_after(&newest, &window, earlier).unwrap();
    assert_eq!(
        pageable(&carried),
        vec![(42, 30, 0)],
        "carried from the first file"
    );
    let alone = sleuth_store::scoped::explanation_or_loaded(&newest, &window).unwrap();
    assert_eq!(
        pageable(&alone),
        vec![(41, 30, 0), (42, 30, 0)],
        "the file alone knows no pinning"
    );
}

/// More pinning calls before a window than a bounded read takes: the
/// replay reads them all (checked), so the last one's range is known.
#[test]
fn pinning_calls_past_the_bounded_read_are_all_replayed() {
    let base = 0x7f00_0000_0000u64;
    let mut calls: Vec<CallEvent> = (0..10_001u64)
        .map(|k| host_alloc(1_000 + k * 500, base + k * 0x10_0000, 0x1000))
        .collect();
    calls.extend(copies_from(base + 10_000 * 0x10_0000 + 8));
    let dir = TempDir::new("scoped-many-pinning");
    let path = dir.join("t.db");
    written(calls, &path);
    let trace = Trace::open(&path).unwrap();
    let window = CallFilter {
        since_ns: Some(10 * MS),
        ..Default::default()
    };
    let e = sleuth_store::scoped::explanation(&trace, &window)
        .unwrap()
        .expect("streamed");
    assert_eq!(pageable(&e), vec![(42, 30, 0)]);
}

/// Round 51's tester: a window of a finished file measured its findings'
/// shares against the whole session (churn in 1 s of a 3.4-s trace read
/// 3.3%, low, where it took 11% of the window, medium); a file still
/// being written took the window's calls. A window's wall shares are of
/// the window now, streamed and loaded alike.
#[test]
fn a_windows_shares_are_of_the_window() {
    let dir = TempDir::new("scoped-window-share");
    let path = dir.join("t.db");
    let data = synthetic();
    rewrite(&data, &path);
    // A session end as the tracer stores it (the fixture's writer is never told one).
    let end = data.calls.iter().map(|c| c.end_ns()).max().unwrap() + 1_000_000;
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("UPDATE session SET end_mono_ns = ?1", [end as i64])
        .unwrap();
    let trace = Trace::open(&path).unwrap();
    let (since, until) = (3_000_000u64, 40_000_000u64);
    assert!(until < end);
    let filter = CallFilter {
        pid: Some(PID),
        since_ns: Some(since),
        until_ns: Some(until),
        ..Default::default()
    };
    let got = sleuth_store::scoped::explanation(&trace, &filter)
        .unwrap()
        .expect("streamed");
    let shared: Vec<_> = got
        .findings
        .iter()
        .filter_map(|f| Some((f.wall_share?, f.impact_ns)))
        .collect();
    assert!(!shared.is_empty(), "{:?}", got.findings);
    for (share, impact) in shared {
        let want = (impact as f64 / (until - since) as f64).min(1.0);
        assert!((share - want).abs() < 1e-9, "{share} vs {want}");
    }
}

/// Round 51's tester: a window's memory findings named no call site
/// (`allocation_failure`'s "at step (workload)" and `memory_growth`'s
/// site were gone from `explain --from 0`): the window's pass read its
/// calls without their stack ids. The failure's site is the whole
/// trace's, in a window and alone.
#[test]
fn a_windows_memory_findings_name_their_sites() {
    use sleuth_store::{TraceWriter, WriterOptions};
    let dir = TempDir::new("scoped-window-sites");
    let path = dir.join("t.db");
    let w = TraceWriter::create(&path, common::session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    h.add_stack(sleuth_core::sites::Stack {
        id: 7,
        pid: PID,
        frames: vec![sleuth_core::testing::py_frame("/w/train.py", 42, "step")],
        notes: vec![],
    })
    .unwrap();
    let mut calls = Vec::new();
    for i in 0..50u64 {
        let mut c = call(1, "cudaLaunchKernel", 1_000_000 + i * 100_000, 20_000);
        c.stack_id = None;
        calls.push(c);
    }
    let mut failed = call(1, "cudaMalloc", 3_000_000, 50_000);
    (failed.ret, failed.size, failed.stack_id) = (2, Some(1 << 40), Some(7));
    calls.push(failed);
    calls.sort_by_key(|c| c.ts_ns);
    for c in calls {
        h.send(sleuth_core::Event::Call(c)).unwrap();
    }
    h.set_session_end(7_000_000).unwrap();
    drop(h);
    w.finish().unwrap();
    let trace = Trace::open(&path).unwrap();
    let failure = |e: &sleuth_core::findings::Explanation| {
        e.findings
            .iter()
            .find(|f| f.kind.as_str() == "allocation_failure")
            .map(|f| f.summary.clone())
            .expect("the failed allocation")
    };
    let whole = failure(&sleuth_core::findings::explain_report(
        &trace.load(None).unwrap(),
    ));
    assert!(whole.contains("train.py"), "{whole}");
    for window in [(0, 7_000_000), (2_000_000, 4_000_000)] {
        let f = CallFilter {
            since_ns: Some(window.0),
            until_ns: Some(window.1),
            ..Default::default()
        };
        let got = sleuth_store::scoped::explanation(&trace, &f)
            .unwrap()
            .expect("streamed");
        assert_eq!(failure(&got), whole, "{window:?}");
    }
}

/// Round 59's third tester: a window's counts spread a process's first
/// sample over everything since the file began (4,953 launches of a process
/// that started 335 ms into the file, "about 1790" in a window before it),
/// and counted a child's last launches, read 198 ms after its exit, in a
/// later window. A sample counts what came since the read before it, at
/// most a read interval (and a half) before; a process launches nothing
/// after its exit.
#[test]
fn a_windows_counts_keep_to_a_read_interval_and_the_process_life() {
    let dir = TempDir::new("scoped-window-counts-life");
    let path = dir.join("t.db");
    let origin = common::trace_fixture::session().start_mono_ns;
    let op = op_by_name("cuLaunchKernel").unwrap().id;
    let w = sleuth_store::TraceWriter::create(
        &path,
        common::trace_fixture::session(),
        Default::default(),
    )
    .unwrap();
    let h = w.handle();
    h.set_process(ProcessInfo {
        exit_ns: Some(origin + 5_000 * MS),
        ..train()
    })
    .unwrap();
    let mut c = call(41, "cudaStreamSynchronize", origin + 3_000 * MS, MS);
    c.stack_id = None;
    h.send(sleuth_core::Event::Call(c)).unwrap();
    let sample = |ms: u64, count: u64| sleuth_core::counted::CountSample {
        ts_ns: origin + ms * MS,
        pid: PID,
        op,
        count,
    };
    h.add_count_samples(vec![sample(3_000, 1_000), sample(5_200, 2_000)])
        .unwrap();
    h.set_op_counts(vec![sleuth_core::OpCount {
        pid: PID,
        op,
        count: 2_000,
    }])
    .unwrap();
    h.set_session_end(origin + 10_000 * MS).unwrap();
    drop(h);
    w.finish().unwrap();
    let trace = Trace::open(&path).unwrap();
    let counts = trace.op_counts(Some(PID)).unwrap();
    let placed = |from: u64, to: u64| {
        let w = sleuth_store::window::WindowCounts::of(&trace, &counts, &counted_window(from, to))
            .unwrap();
        let c = w.placed[0].2;
        (c.at_least, c.estimate, c.at_most)
    };
    // Before the first sample's read interval: none (the first sample's
    // 1,000 were spread from the file's start: 333 of them here).
    assert_eq!(placed(0, 1_000), (0, 0, 0));
    // After the exit: none (the read at 5.2 s had put up to 1,000 here).
    assert_eq!(placed(5_000, 5_200), (0, 0, 0));
    // Its life: all of them.
    assert_eq!(placed(2_000, 6_000), (2_000, 2_000, 2_000));
}
