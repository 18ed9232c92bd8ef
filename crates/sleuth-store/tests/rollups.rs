//! The rollup path of `stats` (issue 16) against the raw path: the example
//! traces are written again through the writer (which keeps rollups), then
//! both answers are compared: counts, errors, totals, maxima, splits,
//! culprits, thread splits and counters equal; percentiles within the
//! histogram's bound; the tail never counts more calls than the raw path.

mod common;

use common::trace_fixture::{assert_close, close};
use common::{example, rewritten};
use sleuth_core::stats::{self, StatsReport};
use sleuth_store::Trace;

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
    compare_at(&path)
}

/// [`compare`] of the trace at `path`: the whole trace and each process.
fn compare_at(path: &std::path::Path) -> StatsReport {
    let t = Trace::open(path).unwrap();
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

/// `explain` from the stored finding rollups against `explain` from every
/// call in memory, on an example trace written again through the writer.
fn explain_both(name: &str) -> (serde_json::Value, serde_json::Value) {
    let (_dir, path) = rewritten(name, "finding-rollups");
    explain_both_at(&path, None)
}

/// [`explain_both`] of the trace at `path`, of process `pid` or all: the
/// stored aggregates against `FindingInputs::of` the trace loaded with `pid`.
fn explain_both_at(
    path: &std::path::Path,
    pid: Option<u32>,
) -> (serde_json::Value, serde_json::Value) {
    use sleuth_core::findings::{explain_from, explain_inputs, inputs::FindingInputs};
    let t = Trace::open(path).unwrap();
    let data = t.load(pid).unwrap();
    let culprits = sleuth_core::culprits::call_culprits(
        &data.calls,
        &data.waits,
        sleuth_core::threads::tracer_pid(&data),
    );
    let ledgers = sleuth_core::ledger::ledger(&data, None);
    let stored = sleuth_store::finding_rollups::finding_inputs(&t, pid)
        .unwrap()
        .expect("finding rollups present");
    // The stored aggregates hold what the in-memory ones hold.
    let mem = FindingInputs::of(&data, &culprits);
    assert_eq!(
        stored.ops.keys().collect::<Vec<_>>(),
        mem.ops.keys().collect::<Vec<_>>()
    );
    for (op, m) in &mem.ops {
        let s = &stored.ops[op];
        assert_eq!(
            (s.count(), s.split, &s.pids, s.slowed),
            (m.count(), m.split, &m.pids, m.slowed)
        );
        assert_eq!(s.culprits(), m.culprits(), "op {op}");
    }
    assert_eq!(stored.splits, mem.splits);
    assert_eq!(stored.spans, mem.spans);
    let a = explain_from(&data, &culprits, &ledgers);
    let b = explain_inputs(&data, &stored, &ledgers);
    (
        serde_json::to_value(&a).unwrap(),
        serde_json::to_value(&b).unwrap(),
    )
}

#[test]
fn explain_from_finding_rollups_matches_the_in_memory_path() {
    for name in ["h200-contention.db", "demo-sim.db"] {
        let (mem, stored) = explain_both(name);
        assert!(
            mem["findings"].as_array().is_some_and(|f| !f.is_empty()),
            "{name}"
        );
        assert_close(&stored, &mem, name);
    }
}

/// Each process of a two-process trace from its own stored aggregates
/// (`finding_process_ops` and its rows of the per-thread tables), against
/// the trace loaded with its pid; and the whole trace as before.
#[test]
fn explain_of_one_process_from_finding_rollups_matches_its_load() {
    let dir = common::TempDir::new("finding-rollups-pid");
    let path = dir.join("two.db");
    common::rewrite(&common::trace_fixture::two_processes(), &path);
    for pid in [Some(25707), Some(725), None] {
        let (mem, stored) = explain_both_at(&path, pid);
        assert!(
            mem["findings"].as_array().is_some_and(|f| !f.is_empty()),
            "{pid:?}"
        );
        assert_close(&stored, &mem, &format!("{pid:?}"));
    }
}

/// `two_processes` six times over, each copy's processes and threads
/// renumbered (pids and tids + 100,000 per copy) and its times shifted by
/// a few µs, so that the copies' calls interleave: a file of twelve
/// processes, for the writer's completion, which stores each process's
/// rows once its threads are done (pids in an order other than time's).
fn many_processes() -> sleuth_core::TraceData {
    let one = common::trace_fixture::two_processes();
    let mut data = sleuth_core::TraceData {
        calls: Vec::new(),
        waits: Vec::new(),
        processes: Vec::new(),
        counts: Vec::new(),
        ..one.clone()
    };
    for k in 0..6u32 {
        let (id, dt) = (|v: u32| v + 100_000 * k, 3_000 * u64::from(k));
        data.calls.extend(one.calls.iter().map(|c| {
            let mut c = c.clone();
            (c.pid, c.tid, c.ts_ns) = (id(c.pid), id(c.tid), c.ts_ns + dt);
            c
        }));
        data.waits.extend(one.waits.iter().map(|w| {
            let mut w = w.clone();
            (w.pid, w.tid) = (id(w.pid), id(w.tid));
            (w.off_ns, w.wake_ns, w.on_ns) = (w.off_ns + dt, w.wake_ns + dt, w.on_ns + dt);
            w
        }));
        data.processes.extend(one.processes.iter().map(|p| {
            let mut p = p.clone();
            p.pid = id(p.pid);
            p
        }));
        data.counts.extend(one.counts.iter().map(|c| {
            let mut c = c.clone();
            c.pid = id(c.pid);
            c
        }));
    }
    data
}

/// A file of twelve processes whose calls interleave: the completion stores
/// each process's rollups (`rollup_ops`, the finding rollups, the call
/// groups) once its threads are done and forgets them; every process and
/// the whole trace answer as their loads do.
#[test]
fn a_file_of_many_processes_answers_each_and_all_as_their_loads() {
    let dir = common::TempDir::new("rollups-many-processes");
    let path = dir.join("many.db");
    let data = many_processes();
    common::rewrite(&data, &path);
    let pids = Trace::open(&path).unwrap().pids().unwrap();
    assert_eq!(pids.len(), 12, "{pids:?}");
    compare_at(&path);
    for pid in pids.iter().map(|&p| Some(p)).chain([None]) {
        let (mem, stored) = explain_both_at(&path, pid);
        assert!(
            mem["findings"].as_array().is_some_and(|f| !f.is_empty()),
            "{pid:?}"
        );
        assert_close(&stored, &mem, &format!("{pid:?}"));
    }
    // Every call is in one group, each thread's once.
    let c = rusqlite::Connection::open(&path).unwrap();
    let grouped: i64 = c
        .query_row("SELECT sum(count) FROM call_groups", [], |r| r.get(0))
        .unwrap();
    let threads: i64 = c
        .query_row(
            "SELECT count(*) FROM (SELECT DISTINCT pid, tid FROM call_groups)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let calls: i64 = c
        .query_row("SELECT count(*) FROM calls", [], |r| r.get(0))
        .unwrap();
    assert_eq!(grouped, calls);
    assert!(threads >= 12, "{threads}");
}

#[test]
fn traces_without_finding_rollups_give_none() {
    let t = Trace::open(&example("demo-sim.db")).unwrap();
    for pid in [None, Some(725)] {
        assert!(sleuth_store::finding_rollups::finding_inputs(&t, pid)
            .unwrap()
            .is_none());
    }
}

/// A file written before the per-process op rollups (no
/// `meta.finding_process_rollups`, no `finding_process_ops`) still answers
/// the whole trace from its rollups; one process takes the full load.
#[test]
fn traces_before_the_process_rollups_answer_one_process_from_its_load() {
    let (_dir, path) = rewritten("demo-sim.db", "finding-rollups-old");
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch(
        "DELETE FROM meta WHERE key = 'finding_process_rollups';
         DROP TABLE finding_process_ops;
         DELETE FROM finding_hist WHERE kind = 'process_op';",
    )
    .unwrap();
    drop(c);
    let t = Trace::open(&path).unwrap();
    let f = sleuth_store::finding_rollups::finding_inputs;
    assert!(f(&t, None).unwrap().is_some());
    assert!(f(&t, Some(725)).unwrap().is_none());
}

/// A per-process table that is not the one gpusleuth writes is refused
/// with one line, never read.
#[test]
fn a_damaged_process_table_is_refused() {
    let (_dir, path) = rewritten("demo-sim.db", "finding-rollups-damaged");
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch(
        "DROP TABLE finding_process_ops;
         CREATE TABLE finding_process_ops(pid INTEGER, op TEXT, inputs TEXT, extra TEXT);",
    )
    .unwrap();
    drop(c);
    let t = Trace::open(&path).unwrap();
    let e = sleuth_store::finding_rollups::finding_inputs(&t, Some(725))
        .unwrap_err()
        .to_string();
    assert!(e.contains("damaged trace: finding_process_ops"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

/// Histogram counts no file can hold (a crafted file: summed, they would
/// overflow a percentile's rank) are refused with one line, never summed.
#[test]
fn finding_histogram_counts_past_any_file_are_refused() {
    let (_dir, path) = rewritten("demo-sim.db", "finding-rollups-huge-counts");
    let c = rusqlite::Connection::open(&path).unwrap();
    let n = c
        .execute("UPDATE finding_hist SET count = 4611686018427387904", [])
        .unwrap();
    assert!(n > 4, "{n} rows");
    drop(c);
    let t = Trace::open(&path).unwrap();
    // The whole trace's op histograms, and its process's (its only one).
    let pid: u32 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT pid FROM call_rows LIMIT 1", [], |r| r.get(0))
        .unwrap();
    for pid in [None, Some(pid)] {
        let e = sleuth_store::finding_rollups::finding_inputs(&t, pid)
            .unwrap_err()
            .to_string();
        assert!(e.contains("damaged trace: finding_hist"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

/// `stats`' rollups hold the writer's counts and sums, each at most 2^62
/// (the bound of every time a reader accepts). A crafted file with values
/// past it, or histogram counts no file can hold, is refused in one line
/// naming the table; values at the bound are answered without any sum
/// overflowing (a panic in this debug build).
#[test]
fn stats_rollups_past_any_file_are_refused_and_at_the_bound_answered() {
    const BOUND: i64 = 1 << 62;
    let refused = |table: &str, sql: &str, why: &str| {
        let (_dir, path) = rewritten("h200-contention.db", "rollups-crafted");
        let n = rusqlite::Connection::open(&path)
            .unwrap()
            .execute(sql, [])
            .unwrap();
        assert!(n > 0, "{sql}");
        let t = Trace::open(&path).unwrap();
        let e = t.stats_report(None).unwrap_err().to_string();
        assert!(e.contains(&format!("damaged trace: {table}")), "{sql}: {e}");
        assert!(e.contains(why), "{sql}: {e}");
        assert!(!e.contains('\n'), "{e}");
    };
    for (table, col) in [
        ("rollup_ops", "count"),
        ("rollup_ops", "total_ns"),
        ("rollup_ops", "blocked_ns"),
        ("rollup_hist", "count"),
        ("rollup_hist", "on_cpu_ns"),
        ("rollup_culprits", "runnable_ns"),
    ] {
        for v in [BOUND + 1, i64::MAX, -1] {
            let sql = format!("UPDATE {table} SET {col} = {v}");
            refused(table, &sql, "no trace holds");
        }
    }
    // Each count at the bound, but together past any file.
    refused(
        "rollup_hist",
        &format!("UPDATE rollup_hist SET count = {BOUND}"),
        "more calls than a file can hold",
    );

    // Every value at the bound, and a thread blocked by five wakers each
    // at the bound: answered, sums saturated.
    let (_dir, path) = rewritten("h200-contention.db", "rollups-at-bound");
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch(&format!(
        "UPDATE rollup_ops SET count = {BOUND}, errors = {BOUND}, total_ns = {BOUND}, max_ns = {BOUND},
             on_cpu_ns = {BOUND}, runnable_ns = {BOUND}, blocked_ns = {BOUND};
         UPDATE rollup_culprits SET runnable_ns = {BOUND};
         UPDATE rollup_hist SET on_cpu_ns = {BOUND}, runnable_ns = {BOUND}, blocked_ns = {BOUND};"
    ))
    .unwrap();
    let wakers = c
        .execute(
            &format!(
                "UPDATE rollup_threads SET split = json_set(split, '$.wakers', json_array(
                     json_set(json_extract(split, '$.wakers[0]'), '$.blocked_ns', {BOUND}),
                     json_set(json_extract(split, '$.wakers[0]'), '$.blocked_ns', {BOUND}),
                     json_set(json_extract(split, '$.wakers[0]'), '$.blocked_ns', {BOUND}),
                     json_set(json_extract(split, '$.wakers[0]'), '$.blocked_ns', {BOUND}),
                     json_set(json_extract(split, '$.wakers[0]'), '$.blocked_ns', {BOUND})))
                 WHERE json_array_length(split, '$.wakers') > 0"
            ),
            [],
        )
        .unwrap();
    assert!(wakers > 0, "the example has a thread with wakers");
    drop(c);
    let t = Trace::open(&path).unwrap();
    let r = t.stats_report(None).unwrap().expect("rollups present");
    let per_call: Vec<_> = r
        .ops
        .iter()
        .filter(|o| o.measured == sleuth_core::stats::Measured::PerCall)
        .collect();
    assert!(!per_call.is_empty());
    for o in per_call {
        assert_eq!(o.count, BOUND as u64, "{o:?}");
        assert!(o.p99_ns.is_some() && o.tail.is_some(), "{o:?}");
    }
    for pid in t.pids().unwrap() {
        t.stats_report(Some(pid)).unwrap().unwrap();
    }
}

/// `stats` of a whole file without rollups (the one a run's tracer is still
/// writing, a killed writer's), streamed (`whole_stats`), gives what loading
/// it gives: counts, totals, culprits (nested calls' too), thread splits
/// and counters equal, percentiles within the histogram's bound; a file
/// with rollups, or at most the row bound, is left to them and the load.
#[test]
fn a_file_being_written_gives_its_stats_streamed_as_loaded() {
    use sleuth_store::whole_stats::streamed;
    for name in ["h200-contention.db", "demo-sim.db"] {
        let (_dir, path) = rewritten(name, "whole-stats");
        let finished = Trace::open(&path).unwrap();
        assert!(streamed(&finished, None, 0).unwrap().is_none(), "{name}");
        drop(finished);
        common::trace_fixture::strip_as_being_written(&path);
        let t = Trace::open(&path).unwrap();
        assert!(t.stats_report(None).unwrap().is_none(), "{name}");
        let all = t.load(None).unwrap();
        assert!(
            all.calls.iter().any(|c| c.nested),
            "{name} has nested calls"
        );
        let rows = all.calls.len() as i64;
        assert!(streamed(&t, None, rows).unwrap().is_none(), "{name}: small");
        let mut scopes = vec![None];
        scopes.extend(t.pids().unwrap().into_iter().map(Some));
        for pid in scopes {
            let raw = stats::compute(&t.load(pid).unwrap());
            let got = streamed(&t, pid, 0).unwrap().expect("streamed");
            assert!(!raw.ops.is_empty(), "{name} {pid:?}");
            assert_same(&got, &raw);
            if name == "h200-contention.db" && pid.is_none() {
                assert!(raw.ops.iter().any(|o| !o.culprits.is_empty()));
                assert!(!raw.threads.is_empty());
            }
        }
    }
}

/// Every culprit pid the stored and computed answers of `path` name:
/// the rollups' stats, a window's stats, the in-memory stats, and the
/// culprits read back per call (the report's and MCP `slow_calls`' path).
fn culprit_pids_named(path: &std::path::Path) -> std::collections::BTreeSet<u32> {
    let t = Trace::open(path).unwrap();
    let mut named = std::collections::BTreeSet::new();
    let rolled = t.stats_report(None).unwrap().expect("rollups present");
    let data = t.load(None).unwrap();
    let raw = stats::compute(&data);
    let end = data.calls.iter().map(|c| c.end_ns()).max().unwrap() + 1;
    let scope = sleuth_store::CallFilter {
        since_ns: Some(1),
        until_ns: Some(end),
        ..Default::default()
    };
    let (window, _) = sleuth_store::window::stats_of(&t, &scope).unwrap();
    for r in [&rolled, &raw, &window] {
        named.extend(r.ops.iter().flat_map(|o| o.culprits.iter().map(|c| c.pid)));
    }
    let ids: Vec<i64> = (1..=data.calls.len() as i64).collect();
    for list in t.call_culprits_of(&ids).unwrap().values() {
        named.extend(list.iter().map(|k| k.pid));
    }
    for c in data.calls.iter().filter(|c| c.dur_ns > 1_000_000).take(50) {
        let list = sleuth_store::report_reads::culprits_of(&t, c).unwrap();
        named.extend(list.iter().map(|k| k.pid));
    }
    named
}

/// Round 51's tester: `stats`, `report` and MCP named the tracer as a
/// culprit (`explain` did not). The contention example rewritten with its
/// CPU hog's pid as the tracer's: no answer names it, and no stored row
/// holds it; a file written before round 51 that stored it as a culprit
/// (the hog's pid set as the tracer's afterwards) is read without it.
#[test]
fn the_tracer_is_never_named_a_culprit_stored_or_read() {
    let (_dir, plain) = rewritten("h200-contention.db", "rollups-tracer");
    let named = culprit_pids_named(&plain);
    let hog = {
        let t = Trace::open(&plain).unwrap();
        let r = t.stats_report(None).unwrap().unwrap();
        r.ops
            .iter()
            .flat_map(|o| o.culprits.iter())
            .max_by_key(|c| c.runnable_ns)
            .expect("the contention example names a culprit")
            .pid
    };
    assert!(named.contains(&hog), "{named:?}");
    // Written by a tracer whose pid is the hog's.
    let dir = common::TempDir::new("rollups-tracer-pid");
    let path = dir.join("traced.db");
    let data = Trace::open(&example("h200-contention.db"))
        .unwrap()
        .load(None)
        .unwrap();
    common::trace_fixture::rewrite_with_options(
        &data,
        &path,
        sleuth_store::WriterOptions {
            tracer_pid: Some(hog),
            ..Default::default()
        },
    );
    let named = culprit_pids_named(&path);
    assert!(!named.contains(&hog), "{named:?}");
    assert!(!named.is_empty(), "the other culprits stay named");
    let c = rusqlite::Connection::open(&path).unwrap();
    let stored: i64 = c
        .query_row(
            "SELECT (SELECT count(*) FROM call_culprits WHERE pid = ?1)
                  + (SELECT count(*) FROM rollup_culprits WHERE culprit_pid = ?1)",
            [hog],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored, 0);
    // Its waits keep it (`explain`'s measure of the tracer's interference).
    let kept: i64 = c
        .query_row(
            "SELECT count(*) FROM wait_culprits WHERE pid = ?1",
            [hog],
            |r| r.get(0),
        )
        .unwrap();
    assert!(kept > 0);
    // An older file: the tracer stored as a culprit.
    let c = rusqlite::Connection::open(&plain).unwrap();
    c.execute(
        "INSERT OR REPLACE INTO stats(name, value) VALUES ('tracer_pid', ?1)",
        [hog],
    )
    .unwrap();
    drop(c);
    let named = culprit_pids_named(&plain);
    assert!(!named.contains(&hog), "{named:?}");
}
