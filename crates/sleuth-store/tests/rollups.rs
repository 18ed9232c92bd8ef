//! The rollup path of `stats` (issue 16) against the raw path: the example
//! traces are written again through the writer (which keeps rollups), then
//! both answers are compared: counts, errors, totals, maxima, splits,
//! culprits, thread splits and counters equal; percentiles within the
//! histogram's bound; the tail never counts more calls than the raw path.

mod common;

use common::{example, rewritten};
use sleuth_core::rollup::MAX_RELATIVE_ERROR;
use sleuth_core::stats::{self, StatsReport};
use sleuth_store::Trace;

fn close(got: Option<u64>, want: Option<u64>, what: &str) {
    match (got, want) {
        (Some(g), Some(w)) => assert!(
            g.abs_diff(w) as f64 <= w as f64 * MAX_RELATIVE_ERROR,
            "{what}: {g} vs {w}"
        ),
        (g, w) => assert_eq!(g, w, "{what}"),
    }
}

fn assert_same(got: &StatsReport, want: &StatsReport) {
    assert_eq!(got.ops.len(), want.ops.len());
    for (g, w) in got.ops.iter().zip(&want.ops) {
        assert_eq!((g.layer, g.op, g.measured), (w.layer, w.op, w.measured));
        assert_eq!(
            (g.count, g.errors, g.total_ns, g.max_ns, g.also_counted),
            (w.count, w.errors, w.total_ns, w.max_ns, w.also_counted),
            "{}",
            w.op
        );
        assert_eq!(
            (g.on_cpu_ns, g.runnable_ns, g.blocked_ns),
            (w.on_cpu_ns, w.runnable_ns, w.blocked_ns),
            "{}",
            w.op
        );
        assert_eq!(g.culprits, w.culprits, "{}", w.op);
        close(g.p50_ns, w.p50_ns, &format!("{} p50", w.op));
        close(g.p95_ns, w.p95_ns, &format!("{} p95", w.op));
        close(g.p99_ns, w.p99_ns, &format!("{} p99", w.op));
        match (&g.tail, &w.tail) {
            (Some(gt), Some(wt)) => {
                assert!(gt.calls <= wt.calls, "{}: tail {gt:?} vs {wt:?}", w.op);
                if gt.calls == wt.calls {
                    assert_eq!(gt, wt);
                }
            }
            (g, w) => assert_eq!(g, w),
        }
    }
    assert_eq!(got.threads, want.threads);
    assert_eq!(
        (&got.drops, &got.attach_edges, &got.events),
        (&want.drops, &want.attach_edges, &want.events)
    );
}

fn compare(name: &str) -> StatsReport {
    let (_dir, path) = rewritten(name, "rollups");
    let t = Trace::open(&path).unwrap();
    assert!(t.has_rollups().unwrap());
    let raw = stats::compute(&t.load(None).unwrap());
    let rolled = t.stats_report(None).unwrap().expect("rollups present");
    assert!(!raw.ops.is_empty());
    assert_same(&rolled, &raw);
    for pid in t.pids().unwrap() {
        let raw = stats::compute(&t.load(Some(pid)).unwrap());
        let rolled = t.stats_report(Some(pid)).unwrap().unwrap();
        assert_same(&rolled, &raw);
    }
    rolled
}

#[test]
fn the_contention_example_gives_the_same_answer_from_rollups() {
    let r = compare("h200-contention.db");
    // The comparison covered culprits, thread splits and histogram buckets.
    assert!(r.ops.iter().any(|o| !o.culprits.is_empty()));
    assert!(!r.threads.is_empty());
    assert!(r.ops.iter().any(|o| o.p50_ns.unwrap_or(0) > 2048));
}

#[test]
fn the_demo_example_gives_the_same_answer_from_rollups() {
    assert!(!compare("demo-sim.db").ops.is_empty());
}

#[test]
fn traces_without_rollups_are_answered_by_the_raw_path() {
    // Written before rollups existed: no tables, so no rollup answer.
    let t = Trace::open(&example("h200-contention.db")).unwrap();
    assert!(!t.has_rollups().unwrap());
    assert!(t.stats_report(None).unwrap().is_none());
}

#[test]
fn a_pid_not_in_the_trace_is_an_error_on_the_rollup_path_too() {
    let (_dir, path) = rewritten("demo-sim.db", "rollups-pid");
    let t = Trace::open(&path).unwrap();
    assert!(t.stats_report(Some(999_999)).is_err());
}

#[test]
fn the_duration_index_is_built_when_the_trace_ends() {
    // Built at finish, in one sorted pass, instead of row by row (issue 16).
    let (_dir, path) = rewritten("demo-sim.db", "rollups-index");
    let c = rusqlite::Connection::open(&path).unwrap();
    let n: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'call_rows_op_dur'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 1);
}
