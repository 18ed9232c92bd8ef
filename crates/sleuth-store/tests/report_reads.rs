//! The report's reads without the calls and waits (`report_reads`): the
//! slowest calls through the `(op_id, dur_ns)` index read no call row below
//! the slowest ones, and equal (ties included) what the full report picks
//! from every loaded call, with the same culprits.

mod common;

use common::{call, culprit, preempted, rewrite, scratch_db};
use sleuth_core::culprits::call_culprits;
use sleuth_core::testing::xorshift;
use sleuth_core::{CallEvent, Culprit, TraceData, WaitEvent};
use sleuth_store::report_reads::{op_rollups, slowest_calls};
use sleuth_store::Trace;

const N: usize = 15;

/// 6,000 calls of three ops on three threads, durations drawn from 500
/// values, every 7th a nested driver call slower than any other call, and
/// every 50th preempted (culprits) and among the slowest, four values for
/// 120 calls: ties at the top.
fn busy_trace() -> TraceData {
    let mut next = xorshift(7);
    let ops = ["cudaLaunchKernel", "cudaMemcpy", "cudaStreamSynchronize"];
    let mut calls: Vec<CallEvent> = Vec::new();
    let mut waits: Vec<WaitEvent> = Vec::new();
    for i in 0..6_000u64 {
        let tid = 100 + (i % 3) as u32;
        let ts = 1_000_000 + i * 100_000;
        let dur = 3_000 + (next() % 500) * 97;
        let mut c = call(ops[(i % 3) as usize], 100, tid, ts, dur);
        if i % 7 == 0 {
            // A driver call nested in a runtime one, slower than any other call.
            c = call("cuLaunchKernel", 100, tid, ts, 90_000);
            c.nested = true;
        }
        if i % 50 == 0 {
            // The slowest plain calls (four values: ties at the top) were preempted.
            let dur = 52_000 + (next() % 4) * 1_000;
            c = call(ops[(i % 3) as usize], 100, tid, ts, dur);
            c.runnable_ns = dur / 2;
            waits.push(preempted(
                100,
                tid,
                ts + 10,
                ts + 10 + dur / 2,
                vec![culprit(200, "hog", dur / 3), culprit(300, "other", dur / 6)],
            ));
        }
        calls.push(c);
    }
    TraceData {
        waits,
        ..sleuth_core::testing::trace(calls)
    }
}

/// The full report's pick: not nested, slowest first, ties in load order.
fn full_pick(data: &TraceData) -> Vec<(CallEvent, Vec<Culprit>)> {
    let per_call = call_culprits(
        &data.calls,
        &data.waits,
        sleuth_core::threads::tracer_pid(data),
    );
    let mut idx: Vec<usize> = (0..data.calls.len())
        .filter(|&i| !data.calls[i].nested)
        .collect();
    idx.sort_by_key(|&i| (std::cmp::Reverse(data.calls[i].dur_ns), i));
    idx.truncate(N);
    idx.into_iter()
        .map(|i| (data.calls[i].clone(), per_call[i].clone()))
        .collect()
}

#[test]
fn the_slowest_calls_equal_the_full_pick_and_read_no_row_below_them() {
    let (_dir, path) = scratch_db("report-slowest");
    rewrite(&busy_trace(), &path);
    let loaded = Trace::open(&path).unwrap().load(None).unwrap();
    let want = full_pick(&loaded);
    assert_eq!(want.len(), N);
    let floor = want[N - 1].0.dur_ns;
    // Ties at the floor beyond the N picked: the tie-break matters.
    let tied = loaded
        .calls
        .iter()
        .filter(|c| !c.nested && c.dur_ns == floor)
        .count();
    assert!(tied > 1, "{tied} calls at {floor} ns");
    assert!(want.iter().any(|(_, k)| !k.is_empty()), "some culprits");

    // Per op, every row below the op's own N-th slowest plain call now
    // fails to read as a call: the full load refuses the file, the index
    // read (per op, slowest first, down to the best N so far) never meets one.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut below = 0;
    for op in ["cudaLaunchKernel", "cudaMemcpy", "cudaStreamSynchronize"] {
        let id = sleuth_core::op_by_name(op).unwrap().id;
        let mut durs: Vec<u64> = loaded
            .calls
            .iter()
            .filter(|c| c.op == id && !c.nested)
            .map(|c| c.dur_ns)
            .collect();
        durs.sort_unstable_by(|a, b| b.cmp(a));
        below += conn
            .execute(
                "UPDATE call_rows SET ret = 'not a number' WHERE dur_ns < ?2 \
                 AND op_id = (SELECT id FROM ops WHERE op = ?1)",
                rusqlite::params![op, durs[N - 1] as i64],
            )
            .unwrap();
    }
    assert!(below > 4_000, "{below} rows");
    drop(conn);
    let t = Trace::open(&path).unwrap();
    assert!(t.load(None).is_err(), "the full load reads every row");
    let got = slowest_calls(&t, &op_rollups(&t, None).unwrap(), None, N).unwrap();
    let got: Vec<(CallEvent, Vec<Culprit>)> =
        got.into_iter().map(|s| (s.call, s.culprits)).collect();
    assert_eq!(got, want);
    assert!(slowest_calls(&t, &op_rollups(&t, None).unwrap(), None, 0)
        .unwrap()
        .is_empty());
}

#[test]
fn the_slowest_calls_of_a_version_1_trace_read_its_calls_table() {
    // The examples are version 1 (`calls` a table, no rollups): the per-op
    // maxima come from the loaded calls here.
    for name in ["h200-contention.db", "demo-sim.db"] {
        let t = Trace::open(&common::example(name)).unwrap();
        let loaded = t.load(None).unwrap();
        let mut ops: std::collections::BTreeMap<u16, sleuth_core::rollup::OpRollup> =
            Default::default();
        for c in &loaded.calls {
            ops.entry(c.op).or_default().add(c);
        }
        let got = slowest_calls(&t, &ops, None, N).unwrap();
        let got: Vec<(CallEvent, Vec<Culprit>)> =
            got.into_iter().map(|s| (s.call, s.culprits)).collect();
        let want = full_pick(&loaded);
        assert!(!want.is_empty(), "{name}");
        assert_eq!(got, want, "{name}");
    }
}
