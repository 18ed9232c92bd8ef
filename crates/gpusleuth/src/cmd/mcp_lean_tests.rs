//! MCP trace tools with a filter (issue 16) against the full load, on the
//! two example traces written again as one trace of two processes: the
//! answers from the stored aggregates (`findings` with a pid) and from the
//! window's calls streamed with their stored culprits (`latency_stats`
//! with a window) equal those of the same file without its aggregates.

use crate::temp_dir::TempDir;
use crate::trace_fixture::{assert_close, rewrite, two_processes};
use sleuth_mcp::args::CallScope;
use sleuth_mcp::trace_tools;
use sleuth_store::{ReadBudget, DEFAULT_READ_TIMEOUT};
use std::path::{Path, PathBuf};

/// The two-process trace, and a copy without the meta key `key` (the
/// readers then take the full load).
fn both(tag: &str, key: &str) -> (TempDir, PathBuf, PathBuf) {
    let dir = TempDir::new(tag);
    let lean = dir.join("lean.db");
    rewrite(&two_processes(), &lean);
    let full = dir.join("full.db");
    std::fs::copy(&lean, &full).unwrap();
    let conn = rusqlite::Connection::open(&full).unwrap();
    conn.execute("DELETE FROM meta WHERE key = ?1", [key])
        .unwrap();
    drop(conn);
    (dir, lean, full)
}

fn scope(pid: Option<u32>, op: Option<&str>, window: Option<(u64, u64)>) -> CallScope {
    CallScope {
        db: None,
        pid,
        op: op.map(str::to_string),
        since_ns: window.map(|w| w.0),
        until_ns: window.map(|w| w.1),
        last_ns: None,
    }
}

/// The first, middle and last call start of process `pid` (or of all).
fn starts(data: &sleuth_core::TraceData, pid: Option<u32>) -> (u64, u64, u64) {
    let mine = data.calls.iter().filter(|c| pid.is_none_or(|p| c.pid == p));
    let first = mine.clone().map(|c| c.ts_ns).min().unwrap();
    let last = mine.map(|c| c.ts_ns).max().unwrap();
    (first, first + (last - first) / 2, last)
}

/// `findings` with a pid (its only filter) answers from the lean load.
#[test]
fn mcp_findings_of_one_process_equal_the_full_load() {
    let (_dir, lean, full) = both("mcp-findings-pid", "finding_rollups");
    let budget = ReadBudget::new(DEFAULT_READ_TIMEOUT);
    for pid in [25707, 725] {
        let s = scope(Some(pid), None, None);
        let tool = |db: &Path| trace_tools::findings(db, &s, &budget).unwrap();
        let (l, f) = (tool(&lean), tool(&full));
        assert!(!f["findings"].as_array().unwrap().is_empty(), "pid {pid}");
        assert_close(&l, &f, &format!("mcp findings pid {pid}"));
    }
}

/// `latency_stats` over windows (with and without a process and an op):
/// the window's calls streamed into rollups and their stored culprits
/// summed give the loaded trace's answer, percentiles within the rollup
/// histogram's bound, everything else exact.
#[test]
fn mcp_latency_stats_of_a_window_equal_the_full_load() {
    let (_dir, lean, full) = both("mcp-latency-window", "rollups");
    let data = two_processes();
    let budget = ReadBudget::new(DEFAULT_READ_TIMEOUT);
    let mut checked_culprits = false;
    for pid in [Some(25707), Some(725), None] {
        let (first, mid, last) = starts(&data, pid);
        for (window, op) in [
            ((first, last + 1), None),
            ((first, mid), None),
            ((mid, last + 1), Some("cudaMemcpy")),
            ((0, first), None),
        ] {
            let s = scope(pid, op, Some(window));
            let tool = |db: &Path| trace_tools::latency_stats(db, &s, &budget).unwrap();
            let (l, f) = (tool(&lean), tool(&full));
            let at = format!("pid {pid:?} window {window:?} op {op:?}");
            assert_close(&l, &f, &at);
            checked_culprits |= f["ops"]
                .as_array()
                .unwrap()
                .iter()
                .any(|o| o["culprits"].as_array().is_some_and(|c| !c.is_empty()));
        }
    }
    assert!(checked_culprits, "some window has culprits");
}

/// `findings` with an op or a window streams the calls in scope thread by
/// thread (`sleuth_store::scoped`): the answer equals the explanation of the
/// whole process loaded and then filtered (what the tool did before),
/// percentiles within the rollup histogram's bound.
#[test]
fn mcp_findings_of_an_op_or_a_window_equal_the_loaded_and_filtered_trace() {
    let (_dir, lean, _full) = both("mcp-findings-scope", "finding_rollups");
    let data = two_processes();
    let budget = ReadBudget::new(DEFAULT_READ_TIMEOUT);
    let trace = sleuth_store::Trace::open(&lean).unwrap();
    let mut compared_findings = false;
    for pid in [Some(25707), Some(725), None] {
        let (first, mid, last) = starts(&data, pid);
        for (window, op) in [
            (None, Some("cudaMalloc")),
            (None, Some("cudaMemcpy")),
            (Some((first, mid)), None),
            (Some((mid, last + 1)), Some("cudaLaunchKernel")),
        ] {
            let s = scope(pid, op, window);
            let got = trace_tools::findings(&lean, &s, &budget).unwrap();
            // Answered by the stream, not by a fallback to the load.
            let filter = sleuth_store::CallFilter {
                pid,
                op: op.map(str::to_string),
                since_ns: window.map(|w| w.0),
                until_ns: window.map(|w| w.1),
                ..Default::default()
            };
            assert!(sleuth_store::scoped::explanation(&trace, &filter)
                .unwrap()
                .is_some());
            // The old reading: everything loaded, then filtered.
            let mut want = trace.load(pid).unwrap();
            want.calls.retain(|c| {
                op.is_none_or(|o| c.op_name() == o)
                    && window.is_none_or(|(a, b)| c.ts_ns >= a && c.ts_ns < b)
            });
            if op.is_some() {
                want.counts
                    .retain(|oc| sleuth_core::op_by_id(oc.op).map(|o| o.name) == op);
            }
            // A window's shares are of the window inside the trace (round 51).
            want.window_ns = (window.map(|w| w.0), window.map(|w| w.1));
            let report = sleuth_core::findings::explain_report(&want);
            let at = format!("pid {pid:?} window {window:?} op {op:?}");
            assert_close(
                &got["findings"],
                &serde_json::to_value(&report.findings).unwrap(),
                &at,
            );
            assert_close(
                &got["summary"],
                &serde_json::to_value(&report.summary).unwrap(),
                &at,
            );
            assert_close(
                &got["threads"],
                &serde_json::to_value(&report.threads).unwrap(),
                &at,
            );
            compared_findings |= !report.findings.is_empty();
        }
    }
    assert!(compared_findings, "some scope has findings");
}

/// `last_ns`: the last part of the trace, the same answer as `since_ns`
/// at that many ns before its end (never before its start); refused with
/// `since_ns`/`until_ns` and as 0.
#[test]
fn mcp_last_ns_is_the_window_up_to_the_end_of_the_trace() {
    let (_dir, lean, _full) = both("mcp-last", "finding_rollups");
    let budget = ReadBudget::new(DEFAULT_READ_TIMEOUT);
    let trace = sleuth_store::Trace::open(&lean).unwrap();
    let (start, end) = trace.start_and_end().unwrap();
    assert!(end > start);
    for last in [(end - start) / 3, end - start + 1_000_000_000] {
        let by_last = CallScope {
            last_ns: Some(last),
            ..scope(None, None, None)
        };
        let since = end.saturating_sub(last).max(start);
        let by_since = CallScope {
            since_ns: Some(since),
            ..scope(None, None, None)
        };
        let f = |s: &CallScope| trace_tools::findings(&lean, s, &budget).unwrap();
        assert_eq!(f(&by_last), f(&by_since), "findings, last {last}");
        let l = trace_tools::latency_stats(&lean, &by_last, &budget).unwrap();
        let mut want = trace_tools::latency_stats(&lean, &by_since, &budget).unwrap();
        assert_eq!(l["filter"]["since_ns"], since, "last {last}");
        assert_eq!(l["filter"]["last_ns"], last);
        want["filter"]["last_ns"] = last.into();
        assert_eq!(l, want, "latency_stats, last {last}");
    }
    // A third of the trace holds fewer calls than the whole.
    let third = CallScope {
        last_ns: Some((end - start) / 3),
        ..scope(None, None, None)
    };
    let whole = trace_tools::latency_stats(&lean, &scope(None, None, None), &budget).unwrap();
    let part = trace_tools::latency_stats(&lean, &third, &budget).unwrap();
    let calls = |v: &serde_json::Value| -> u64 {
        v["ops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["count"].as_u64().unwrap())
            .sum()
    };
    assert!(0 < calls(&part) && calls(&part) < calls(&whole));
    for (bad, says) in [
        (
            CallScope {
                last_ns: Some(1_000),
                since_ns: Some(start),
                ..scope(None, None, None)
            },
            "without since_ns/until_ns",
        ),
        (
            CallScope {
                last_ns: Some(0),
                ..scope(None, None, None)
            },
            "above 0",
        ),
    ] {
        for err in [
            trace_tools::findings(&lean, &bad, &budget).unwrap_err(),
            trace_tools::latency_stats(&lean, &bad, &budget).unwrap_err(),
        ] {
            assert!(err.to_string().contains(says), "{err}");
        }
    }
}
