//! `write_merged`: two node traces whose pids collide become one trace with
//! moved timestamps, renumbered pids, ids that do not clash, references
//! (culprits, NCCL arguments) that still point at their own rows, and each
//! process's host and real pid kept.

mod common;
use common::*;
use sleuth_core::nccl::NcclEvent;
use sleuth_core::{op_by_name, Event, ProcessInfo};
use sleuth_store::{input_facts, write_merged, MergeInput, Trace, TraceWriter, WriterOptions};

/// One node: pid 10 makes a cudaMalloc at `ts` (preempted by pid 99) and an all-reduce.
fn node(path: &std::path::Path, host: &str, ts: u64) {
    let mut info = session();
    info.hostname = host.into();
    let w = TraceWriter::create(path, info, WriterOptions::default()).unwrap();
    let h = w.handle();
    let mut c = call("cudaMalloc", 10, 11, ts, 1_000);
    c.runnable_ns = 400;
    h.send(Event::Call(c)).unwrap();
    h.send(Event::Wait(preempted(
        10,
        11,
        ts + 100,
        ts + 500,
        vec![culprit(99, "hog", 400)],
    )))
    .unwrap();
    h.send(Event::Nccl(NcclEvent {
        call: call("ncclAllReduce", 10, 11, ts + 2_000, 50),
        comm: Some(0xc0),
        count: Some(8),
        datatype: Some(7),
        ..Default::default()
    }))
    .unwrap();
    h.set_process(ProcessInfo {
        pid: 10,
        comm: "train".into(),
        ..Default::default()
    })
    .unwrap();
    w.finish().unwrap();
}

fn input(path: std::path::PathBuf, shift_ns: i64, pid_offset: u32) -> MergeInput {
    MergeInput {
        path,
        shift_ns,
        pid_offset,
        skew_ns: 0,
        skew_applied: false,
        skew_samples: 0,
        skew_spread_ns: None,
    }
}

#[test]
fn colliding_pids_are_renumbered_and_every_row_keeps_its_references() {
    let dir = TempDir::new("merge");
    let (a, b, out) = (dir.join("a.db"), dir.join("b.db"), dir.join("job.db"));
    node(&a, "node-a", 1_000_000);
    node(&b, "node-b", 5_000_000);
    let fa = input_facts(&a).unwrap();
    let fb = input_facts(&b).unwrap();
    assert!(
        fa.pids.contains(&10) && fb.pids.contains(&10),
        "{:?}",
        fb.pids
    );
    let off = 1 << 22;
    write_merged(
        &[input(a.clone(), 0, 0), input(b.clone(), -3_000_000, off)],
        &out,
        false,
        "t",
    )
    .unwrap();

    let t = Trace::open(&out).unwrap();
    let d = t.load(None).unwrap();
    let mut calls: Vec<(u32, u64, &str)> = d
        .calls
        .iter()
        .map(|c| (c.pid, c.ts_ns, c.op_name()))
        .collect();
    calls.sort();
    assert_eq!(
        calls,
        vec![
            (10, 1_000_000, "cudaMalloc"),
            (10, 1_002_000, "ncclAllReduce"),
            (10 + off, 2_000_000, "cudaMalloc"),
            (10 + off, 2_002_000, "ncclAllReduce"),
        ]
    );
    // NCCL arguments still belong to their own node's call.
    let mut nccl: Vec<(u32, u64)> = d.nccl.iter().map(|e| (e.call.pid, e.call.ts_ns)).collect();
    nccl.sort();
    assert_eq!(nccl, vec![(10, 1_002_000), (10 + off, 2_002_000)]);
    // Waits moved with their node, culprits renumbered like the node's pids.
    let mut waits: Vec<(u32, u64, u32)> = d
        .waits
        .iter()
        .map(|w| (w.pid, w.off_ns, w.culprits[0].pid))
        .collect();
    waits.sort();
    assert_eq!(
        waits,
        vec![(10, 1_000_100, 99), (10 + off, 2_000_100, 99 + off)]
    );
    // Hosts and real pids.
    assert_eq!(d.node_of(10).host, "node-a");
    let nb = d.node_of(10 + off);
    assert_eq!((nb.host.as_str(), nb.pid), ("node-b", 10));
    let nodes = t.merge_nodes().unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(
        (nodes[1].shift_ns, nodes[1].pid_offset),
        (-3_000_000, off as i64)
    );
    // Call culprits follow their calls (ids moved past node a's rows).
    let ids: Vec<i64> = t
        .calls_filtered(&Default::default())
        .unwrap()
        .into_iter()
        .filter(|s| s.call.op == op_by_name("cudaMalloc").unwrap().id)
        .map(|s| s.id)
        .collect();
    let cul = t.call_culprits_of(&ids).unwrap();
    let pids: Vec<u32> = ids.iter().map(|i| cul[i][0].pid).collect();
    assert_eq!(pids.len(), 2);
    assert!(pids.contains(&99) && pids.contains(&(99 + off)), "{pids:?}");

    // Never over an existing file unless asked; a merged trace is not an input.
    let again = write_merged(&[input(a.clone(), 0, 0)], &out, false, "t").unwrap_err();
    assert!(again.to_string().contains("already exists"), "{again}");
    let err = input_facts(&out).unwrap_err();
    assert!(err.to_string().contains("already a merged trace"), "{err}");
}

/// A version 5 input (every column of `call_rows` and `waits` stored)
/// merges into a version 6 trace as the same trace written by this build
/// does: the thread's distance to its process and the wait's kind number
/// are computed from its columns.
#[test]
fn a_version_5_input_merges_as_a_version_6_one() {
    let dir = TempDir::new("merge_v5");
    let (a, b, old_b) = (dir.join("a.db"), dir.join("b.db"), dir.join("b5.db"));
    node(&a, "node-a", 1_000_000);
    node(&b, "node-b", 5_000_000);
    // A blocked wait too (node's is a preemption).
    rusqlite::Connection::open(&b)
        .unwrap()
        .execute("UPDATE waits SET kind_id = 1", [])
        .unwrap();
    std::fs::copy(&b, &old_b).unwrap();
    let c = rusqlite::Connection::open(&old_b).unwrap();
    c.execute_batch(&rows_as_version_5()).unwrap();
    c.execute_batch("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
        .unwrap();
    drop(c);
    let merged = |b: &std::path::Path, name: &str| {
        let out = dir.join(name);
        let off = 1 << 22;
        write_merged(
            &[
                input(a.clone(), 0, 0),
                input(b.to_path_buf(), -3_000_000, off),
            ],
            &out,
            false,
            "t",
        )
        .unwrap();
        let d = Trace::open(&out).unwrap().load(None).unwrap();
        let mut calls: Vec<(u32, u32, u64, String)> = d
            .calls
            .iter()
            .map(|c| (c.pid, c.tid, c.ts_ns, c.op_name().to_string()))
            .collect();
        calls.sort();
        let mut waits: Vec<String> = d.waits.iter().map(|w| format!("{w:?}")).collect();
        waits.sort();
        (calls, waits)
    };
    let (calls, waits) = merged(&b, "v6.db");
    assert_eq!(calls.len(), 4);
    assert!(
        waits
            .iter()
            .any(|w| w.contains("pid: 4194314") && w.contains("Blocked")),
        "{waits:?}"
    );
    assert_eq!(merged(&old_b, "v5.db"), (calls, waits));
}
