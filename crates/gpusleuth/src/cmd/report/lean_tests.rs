//! The report from the stored aggregates (`Inputs::lean`) against the one
//! from the whole trace (`Inputs::full`), on traces written by the writer:
//! the example traces written again, and a hand-built two-process trace
//! with call sites, failed and nested allocations, ties among the slowest
//! calls, culprits, NVML samples and lifecycle events outside the session;
//! of the whole trace and of each process (`--pid`).
//!
//! What may differ, and only there: the percentiles of the latency
//! distributions (min, p25, p50, p75, p99 from the histogram: each within
//! `MAX_RELATIVE_ERROR` of the exact value, checked here) and the numbers
//! in the findings' texts (percentiles, within the same bound: the explain
//! tests check them on the JSON). Every other section is byte-identical.

use super::inputs::{Inputs, LatencyRow};
use super::{inputs_of, render, SLOWEST_CALLS};
use crate::render::explain::lean_tests::assert_same_words;
use crate::temp_dir::TempDir;
use crate::trace_fixture::{close, example, rewrite, rewrite_with_context, strip_as_being_written};
use sleuth_core::sites::Stack;
use sleuth_core::testing::{alloc, call, failed_alloc, free, py_frame, MS, US};
use sleuth_core::{
    CallEvent, Culprit, GpuSample, ProcEvent, ProcKind, ProcessInfo, TraceData, WaitEvent, WaitKind,
};
use sleuth_store::report_reads::LeanReport;
use sleuth_store::{ReadBudget, Trace, DEFAULT_READ_TIMEOUT};
use std::path::Path;

/// Two processes (a parent and its child) with call sites, allocations
/// (failed, nested, freed, leaked), copies slow enough for the histogram's
/// log buckets, ties among the slowest calls, preemptions with culprits,
/// NVML samples, and a wait and a lifecycle event outside the calls' span.
fn rich_trace() -> TraceData {
    let stack = |id: u64, pid: u32, line: u32| Stack {
        id,
        pid,
        frames: vec![
            py_frame("/home/u/model.py", line, "Model.forward"),
            py_frame("/home/u/train.py", 90, "main"),
        ],
        notes: vec![],
    };
    let mut calls = Vec::new();
    let mut waits = Vec::new();
    for (pid, base) in [(100u32, 0u64), (101, 7 * MS)] {
        let on = |mut c: CallEvent, tid: u32| {
            c.pid = pid;
            c.tid = tid;
            c
        };
        for i in 0..40u64 {
            let mut a = on(
                alloc(base + i * MS, (1 + i % 4) << 20, 0x10_0000 * (i + 1)),
                pid,
            );
            a.stack_id = Some(u64::from(pid) * 10 + i % 3);
            calls.push(a);
            if i % 3 != 0 {
                calls.push(on(free(base + i * MS + 500 * US, 0x10_0000 * (i + 1)), pid));
            }
            // Copies of 3..~40 µs (log buckets), every 8th of the same 90 µs: ties.
            let dur = if i % 8 == 0 {
                90 * US
            } else {
                3 * US + i * 937
            };
            let mut c = on(
                call("cudaMemcpy", base + i * MS + 100 * US, dur),
                pid + 1000,
            );
            if i % 4 == 0 {
                c.runnable_ns = dur / 2;
                waits.push(WaitEvent {
                    pid,
                    tid: pid + 1000,
                    kind: WaitKind::Preempted,
                    off_ns: c.ts_ns + US,
                    wake_ns: c.ts_ns + US,
                    on_ns: c.ts_ns + US + dur / 2,
                    prev_state: 0,
                    cpu: 1,
                    culprits: vec![
                        Culprit {
                            pid: 200,
                            tid: 200,
                            comm: "hog".into(),
                            ns: dur / 3,
                        },
                        Culprit {
                            pid: 300,
                            tid: 301,
                            comm: "other".into(),
                            ns: dur / 6,
                        },
                    ],
                    waker: None,
                });
            }
            calls.push(c);
        }
        // A failed allocation at a site, and a nested driver allocation
        // slower than every other call (left out of the slowest calls).
        let mut f = on(failed_alloc(base + 45 * MS, 1 << 34), pid);
        f.stack_id = Some(u64::from(pid) * 10);
        calls.push(f);
        let mut n = on(call("cuMemAlloc_v2", base + 46 * MS, 5 * MS), pid);
        n.nested = true;
        n.size = Some(1 << 20);
        calls.push(n);
    }
    calls.sort_by_key(|c| c.ts_ns);
    // A sleep that began before the first call (the extent's origin).
    waits.push(WaitEvent {
        pid: 100,
        tid: 100,
        kind: WaitKind::Blocked,
        off_ns: 0,
        wake_ns: 500,
        on_ns: 600,
        prev_state: 1,
        cpu: 0,
        culprits: vec![],
        waker: None,
    });
    let end = calls.iter().map(|c| c.end_ns()).max().unwrap_or(0);
    // A wait of the parent that ends after everything else (its extent's
    // end and the trace's: the latest wait is read).
    waits.push(WaitEvent {
        pid: 100,
        tid: 1100,
        kind: WaitKind::Blocked,
        off_ns: end + 4 * MS,
        wake_ns: end + 5 * MS,
        on_ns: end + 5 * MS + 10 * US,
        prev_state: 1,
        cpu: 0,
        culprits: vec![],
        waker: None,
    });
    let mut stacks = std::collections::BTreeMap::new();
    for pid in [100u32, 101] {
        for k in 0..3 {
            let id = u64::from(pid) * 10 + k;
            stacks.insert(id, stack(id, pid, 40 + k as u32 + (pid - 100) * 10));
        }
    }
    TraceData {
        calls,
        waits,
        stacks,
        processes: vec![
            ProcessInfo {
                pid: 100,
                comm: "train".into(),
                cmdline: "python train.py".into(),
                ..Default::default()
            },
            ProcessInfo {
                pid: 101,
                ppid: Some(100),
                comm: "worker".into(),
                ..Default::default()
            },
        ],
        // The child's exit after the last call (the extent's end).
        procs: vec![ProcEvent {
            kind: ProcKind::Exit,
            ts_ns: end + 3 * MS,
            pid: 101,
            tid: 101,
            ppid: 100,
            exit_code: 0,
            comm: "worker".into(),
        }],
        gpu_samples: Some(vec![GpuSample {
            ts_ns: 20 * MS,
            gpu: 0,
            busy_pct: 64.0,
            period_ns: 10 * MS,
        }]),
        has_host_context: true,
        ..Default::default()
    }
}

/// The HTML's sections (split before each `<h2>`).
fn sections(html: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(i) = rest[1..].find("<h2>") {
        out.push(&rest[..=i]);
        rest = &rest[i + 1..];
    }
    out.push(rest);
    out
}

/// Exact counts, totals and maxima; the other percentiles within the bound.
fn latency_close(lean: &[LatencyRow], full: &[LatencyRow], at: &str) {
    assert_eq!(lean.len(), full.len(), "{at}");
    for (l, f) in lean.iter().zip(full) {
        let here = format!("{at} {}", f.op);
        assert_eq!(
            (l.op, l.n, l.total, l.max),
            (f.op, f.n, f.total, f.max),
            "{here}"
        );
        for (what, g, w) in [
            ("min", l.min, f.min),
            ("p25", l.p25, f.p25),
            ("p50", l.p50, f.p50),
            ("p75", l.p75, f.p75),
            ("p99", l.p99, f.p99),
        ] {
            close(Some(g), Some(w), &format!("{here} {what}"));
        }
    }
}

/// Both sources on the trace at `path`, of the whole trace or of process
/// `pid`: equal inputs (latency within the bound) and equal HTML outside
/// the findings' and latency sections. Returns whether any percentile
/// differed (the lean path is then visible).
fn compare(path: &Path, pid: Option<u32>, at: &str) -> bool {
    let stored = |t: &Trace, pid| {
        let budget = ReadBudget::new(DEFAULT_READ_TIMEOUT);
        sleuth_store::report_reads::load(t, pid, budget, SLOWEST_CALLS).unwrap()
    };
    compare_read(path, pid, at, stored, true)
}

/// [`compare`] with the lean reads `read` gives; `chosen`: the command's
/// own choice (`inputs_of`) is checked to be them.
fn compare_read(
    path: &Path,
    pid: Option<u32>,
    at: &str,
    read: impl Fn(&Trace, Option<u32>) -> Option<LeanReport>,
    chosen: bool,
) -> bool {
    let t = Trace::open(path).unwrap();
    let report = read(&t, pid).unwrap_or_else(|| panic!("{at}: the lean reads answer"));
    assert!(report.lean.data.waits.is_empty(), "{at}: no wait held");
    let lean = Inputs::lean(report);
    let full = inputs_of(&t, pid, false, SLOWEST_CALLS).unwrap();
    assert_eq!(lean.span, full.span, "{at}");
    assert_eq!((lean.calls, lean.waits), (full.calls, full.waits), "{at}");
    assert_eq!(lean.calls_by_pid, full.calls_by_pid, "{at}");
    assert_eq!(lean.ledgers, full.ledgers, "{at}");
    assert_eq!(lean.slowest, full.slowest, "{at}");
    assert_eq!(lean.flame, full.flame, "{at}");
    let strip = |v: &[sleuth_core::sites::SiteMemory]| -> Vec<_> {
        // The example stack is not drawn (the lean tallies are by stack id).
        v.iter()
            .map(|s| sleuth_core::sites::SiteMemory {
                example_stack: None,
                ..s.clone()
            })
            .collect()
    };
    assert_eq!(strip(&lean.sites), strip(&full.sites), "{at}");
    latency_close(&lean.latency, &full.latency, at);
    // The command's own choice is the lean source.
    if chosen {
        let chosen = inputs_of(&t, pid, true, SLOWEST_CALLS).unwrap();
        assert_eq!(chosen.latency, lean.latency, "{at}: the lean path is taken");
    }

    let session = t.session().unwrap();
    let notes = t.notes().unwrap();
    let (l, f) = (
        render(&lean, &session, &notes, "t.db"),
        render(&full, &session, &notes, "t.db"),
    );
    let (ls, fs) = (sections(&l), sections(&f));
    assert_eq!(ls.len(), fs.len(), "{at}");
    assert!(fs.len() >= 8, "{at}: every section compared");
    for (a, b) in ls.iter().zip(&fs) {
        if b.starts_with("<h2>Findings") || b.starts_with("<h2>Latency per op") {
            assert_same_words(a, b, at);
        } else {
            assert_eq!(a, b, "{at}");
        }
    }
    lean.latency != full.latency
}

#[test]
fn the_lean_report_equals_the_full_one_on_the_examples() {
    for name in ["h200-contention.db", "demo-sim.db"] {
        let dir = TempDir::new(name);
        let data = Trace::open(&example(name)).unwrap().load(None).unwrap();
        let path = dir.join("again.db");
        rewrite(&data, &path);
        compare(&path, None, name);
        let pids = Trace::open(&path).unwrap().pids().unwrap();
        assert!(!pids.is_empty(), "{name}");
        for pid in pids {
            compare(&path, Some(pid), &format!("{name} pid {pid}"));
        }
    }
}

#[test]
fn the_lean_report_equals_the_full_one_with_sites_ties_and_culprits() {
    let dir = TempDir::new("report-rich");
    let path = dir.join("t.db");
    let data = rich_trace();
    rewrite_with_context(&data, &path);
    let differs = compare(&path, None, "rich");
    assert!(differs, "some percentile comes from the histogram");
    for pid in [100, 101] {
        let differs = compare(&path, Some(pid), &format!("rich pid {pid}"));
        assert!(
            differs,
            "pid {pid}: some percentile comes from the histogram"
        );
    }
    // Without a stored aggregate the answer comes from the rows: the sites
    // from the memory calls; the latest wait by an aggregate, or through a
    // `(pid, on_ns)` index where a file has one (written before round 27).
    for (tag, mark, then) in [
        ("no-site-rollup", "site_rollup", ""),
        ("no-wait-ends", "wait_ends", ""),
        (
            "pid-index",
            "wait_ends",
            "CREATE INDEX waits_pid_on ON waits(pid, on_ns)",
        ),
    ] {
        let again = dir.join(&format!("{tag}.db"));
        std::fs::copy(&path, &again).unwrap();
        let c = rusqlite::Connection::open(&again).unwrap();
        let n = c
            .execute("DELETE FROM meta WHERE key = ?1", [mark])
            .unwrap();
        assert_eq!(n, 1, "the writer stored {mark}");
        c.execute_batch(then).unwrap();
        drop(c);
        compare(&again, None, &format!("rich {tag}"));
        for pid in [100, 101] {
            compare(&again, Some(pid), &format!("rich pid {pid} {tag}"));
        }
    }
    let full = inputs_of(&Trace::open(&path).unwrap(), None, false, SLOWEST_CALLS).unwrap();
    // What the comparison covered: sites, a flame graph, ties, culprits.
    assert!(full.sites.len() >= 4, "{:?}", full.sites);
    assert!(full.sites.iter().any(|s| s.failed > 0));
    assert!(full.flame.bytes > 0);
    assert!(full.slowest.iter().any(|(_, k)| !k.is_empty()));
    let ties = full
        .slowest
        .iter()
        .filter(|(c, _)| c.dur_ns == 90 * US)
        .count();
    assert!(ties > 2, "{ties} tied calls");
    assert!(full.span.origin_ns < full.span.start_ns || full.span.extent_end_ns > full.span.end_ns);
    let last_wait = data.waits.iter().map(|w| w.on_ns).max();
    assert_eq!(
        Some(full.span.extent_end_ns),
        last_wait,
        "a wait ends the trace"
    );
}

/// What each process's report holds that the other's does not: its own
/// calls, slowest calls, allocations by call path, and extent (the sleep
/// before the first call and the wait after everything are the parent's;
/// the child's ends at its exit). A pid filter left out of any of these reads fails the
/// comparisons above; this says they were there to fail.
#[test]
fn each_process_report_differs_from_the_whole_trace_where_the_pid_filters() {
    let dir = TempDir::new("report-pid-parts");
    let path = dir.join("t.db");
    rewrite_with_context(&rich_trace(), &path);
    let t = Trace::open(&path).unwrap();
    let whole = inputs_of(&t, None, false, SLOWEST_CALLS).unwrap();
    let parent = inputs_of(&t, Some(100), false, SLOWEST_CALLS).unwrap();
    let child = inputs_of(&t, Some(101), false, SLOWEST_CALLS).unwrap();
    for one in [&parent, &child] {
        assert!(one.calls < whole.calls);
        assert_eq!(one.calls_by_pid.len(), 1);
        assert!(one.flame.bytes < whole.flame.bytes);
        assert!(one.sites.len() < whole.sites.len());
    }
    let pids = |i: &Inputs| -> Vec<u32> { i.slowest.iter().map(|(c, _)| c.pid).collect() };
    assert!(pids(&whole).contains(&100) && pids(&whole).contains(&101));
    assert!(pids(&parent).iter().all(|&p| p == 100));
    assert!(pids(&child).iter().all(|&p| p == 101));
    assert_eq!(parent.span.origin_ns, whole.span.origin_ns);
    assert!(child.span.origin_ns > whole.span.origin_ns);
    assert_eq!(parent.span.extent_end_ns, whole.span.extent_end_ns);
    assert!(child.span.extent_end_ns < whole.span.extent_end_ns);
    assert!(child.waits < whole.waits);
}

/// A process the trace lists that made no call: its empty report from the
/// aggregates equals the full load's.
#[test]
fn the_report_of_a_process_without_calls_equals_the_full_one() {
    let dir = TempDir::new("report-pid-idle");
    let path = dir.join("t.db");
    let mut data = rich_trace();
    data.processes.push(ProcessInfo {
        pid: 4243,
        comm: "idle".into(),
        ..Default::default()
    });
    rewrite_with_context(&data, &path);
    compare(&path, Some(4243), "process without calls");
    let t = Trace::open(&path).unwrap();
    let idle = inputs_of(&t, Some(4243), true, SLOWEST_CALLS).unwrap();
    assert_eq!((idle.calls, idle.waits), (0, 0));
    assert!(idle.slowest.is_empty() && idle.latency.is_empty());
}

/// A pid the trace does not hold: the full load's one-line error on the lean path too.
#[test]
fn an_absent_pid_is_the_same_error_on_either_path() {
    let dir = TempDir::new("report-pid-absent");
    let path = dir.join("t.db");
    rewrite_with_context(&rich_trace(), &path);
    let t = Trace::open(&path).unwrap();
    let budget = ReadBudget::new(DEFAULT_READ_TIMEOUT);
    let lean = sleuth_store::report_reads::load(&t, Some(4242), budget, SLOWEST_CALLS)
        .err()
        .expect("an absent pid is refused")
        .to_string();
    let full = inputs_of(&t, Some(4242), false, SLOWEST_CALLS)
        .err()
        .expect("the full load refuses it")
        .to_string();
    assert_eq!(lean, full);
    assert!(lean.contains("pid 4242 is not in this trace"), "{lean}");
    assert!(!lean.contains('\n'), "{lean}");
}

#[test]
fn traces_without_rollups_or_process_rollups_take_the_full_path() {
    // Whether the report of `pid` (or of the whole trace) is read lean.
    let lean = |t: &Trace, pid: Option<u32>| {
        sleuth_store::report_reads::load(
            t,
            pid,
            ReadBudget::new(DEFAULT_READ_TIMEOUT),
            SLOWEST_CALLS,
        )
        .unwrap()
        .is_some()
    };
    // The examples were written before the rollups.
    let t = Trace::open(&example("demo-sim.db")).unwrap();
    for pid in [None, Some(t.pids().unwrap()[0])] {
        assert!(!lean(&t, pid));
    }
    // A file written before the per-process finding rollups: a process's
    // report is read from its load, the whole trace's still from the rollups.
    let dir = TempDir::new("report-pid-before");
    let path = dir.join("t.db");
    rewrite_with_context(&rich_trace(), &path);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let n = conn
        .execute("DELETE FROM meta WHERE key = 'finding_process_rollups'", [])
        .unwrap();
    assert_eq!(n, 1, "the writer stored the per-process rollups");
    drop(conn);
    let t = Trace::open(&path).unwrap();
    assert!(!lean(&t, Some(100)));
    assert!(lean(&t, None));
    // With --pid the report is the loaded process's.
    let one = inputs_of(&t, Some(101), true, SLOWEST_CALLS).unwrap();
    assert_eq!(one.calls_by_pid.keys().collect::<Vec<_>>(), vec![&101]);
}

/// A file without rollups (the one a run's tracer is still writing, a
/// killed writer's) past the row bound is read streamed
/// (`report_reads::streamed`), not loaded: the same report as its full
/// load, of the whole file and of each process; a smaller one, or one
/// with rollups, is left to the load and the stored reads.
#[test]
fn the_report_of_a_file_being_written_is_streamed_as_the_full_one() {
    let streamed = |above: i64| {
        move |t: &Trace, pid| {
            let budget = ReadBudget::new(DEFAULT_READ_TIMEOUT);
            sleuth_store::report_reads::streamed(t, pid, budget, SLOWEST_CALLS, above).unwrap()
        }
    };
    let cases = [
        ("h200-contention.db", None),
        ("demo-sim.db", None),
        ("rich", Some(rich_trace())),
    ];
    for (name, built) in cases {
        let dir = TempDir::new(&format!("report-streamed-{name}"));
        let path = dir.join("live.db");
        match built {
            Some(d) => rewrite_with_context(&d, &path),
            None => rewrite(
                &Trace::open(&example(name)).unwrap().load(None).unwrap(),
                &path,
            ),
        }
        assert!(
            streamed(0)(&Trace::open(&path).unwrap(), None).is_none(),
            "{name}: rollups"
        );
        strip_as_being_written(&path);
        let t = Trace::open(&path).unwrap();
        let rows = t.load(None).unwrap().calls.len() as i64;
        assert!(streamed(rows)(&t, None).is_none(), "{name}: small");
        let mut scopes = vec![None];
        scopes.extend(t.pids().unwrap().into_iter().map(Some));
        for pid in scopes {
            compare_read(
                &path,
                pid,
                &format!("{name} being written, pid {pid:?}"),
                streamed(0),
                false,
            );
        }
    }
}
