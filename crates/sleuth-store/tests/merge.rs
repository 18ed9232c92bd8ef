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
    node_with(path, host, ts, WriterOptions::default())
}

/// [`node`] written with `opts`.
fn node_with(path: &std::path::Path, host: &str, ts: u64, opts: WriterOptions) {
    let mut info = session();
    info.hostname = host.into();
    let w = TraceWriter::create(path, info, opts).unwrap();
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

/// A node whose pid 10 stores `stacks` (id, Python function), makes one
/// call per entry of `calls` (the stack id it names: stored or not) and
/// one PyTorch allocation at its first stack.
fn node_with_stacks(path: &std::path::Path, host: &str, stacks: &[(u64, &str)], calls: &[u64]) {
    use sleuth_core::sites::{Frame, FrameKind, Stack};
    let mut info = session();
    info.hostname = host.into();
    let w = TraceWriter::create(path, info, WriterOptions::default()).unwrap();
    let h = w.handle();
    for &(id, function) in stacks {
        h.add_stack(Stack {
            id,
            pid: 10,
            frames: vec![Frame {
                kind: Some(FrameKind::Python),
                function: Some(function.into()),
                file: Some(format!("/w/{function}.py")),
                line: Some(7),
                ..Default::default()
            }],
            notes: Vec::new(),
        })
        .unwrap();
    }
    for (n, &stack) in calls.iter().enumerate() {
        let mut c = call("cudaMalloc", 10, 10, 1_000_000 + n as u64 * 1_000, 100);
        c.size = Some(4096);
        c.stack_id = Some(stack);
        h.send(Event::Call(c)).unwrap();
    }
    let malloc = "DeviceCachingAllocator::malloc";
    let mut b = sleuth_core::testing::torch_block(10, 2_000_000, malloc, 0xa, 0x7f00, 512, None);
    b.stack_id = Some(stacks[0].0);
    h.send(Event::Block(b)).unwrap();
    w.finish().unwrap();
}

/// Each call's (pid, site label) in the merged trace, sorted.
fn call_sites(t: &Trace) -> Vec<(u32, String)> {
    let d = t.load(None).unwrap();
    let mut got: Vec<(u32, String)> = d
        .calls
        .iter()
        .map(|c| (c.pid, sleuth_core::sites::label_of(&d, c.stack_id)))
        .collect();
    got.sort();
    got
}

/// Found by round 51's tester: stack ids (the kernel's 64-bit hashes) were
/// moved like row ids, saturating at i64::MAX while the calls kept the
/// old ones: every node after the first lost its sites, and two nodes
/// with one stack id could not be merged at all (UNIQUE constraint failed:
/// stacks.id). Each call must keep its own node's site: an id another node
/// uses for another stack (or names without a stored stack) moves, with
/// every reference to it.
#[test]
fn stack_ids_keep_each_nodes_sites() {
    let dir = TempDir::new("merge_stacks");
    let (a, b, c, out) = (
        dir.join("a.db"),
        dir.join("b.db"),
        dir.join("c.db"),
        dir.join("job.db"),
    );
    // Node a: stacks 111 and 222, and a call naming 333, a stack lost.
    node_with_stacks(
        &a,
        "node-a",
        &[(111, "alloc_a"), (222, "step_a")],
        &[111, 222, 333],
    );
    // Node b: its own stack 111, a stack 333 (node a's lost id), and a call
    // naming 222 (stored by node a) that b lost.
    node_with_stacks(
        &b,
        "node-b",
        &[(111, "alloc_b"), (333, "step_b")],
        &[111, 333, 222],
    );
    // Node c: node b's file again (the same ids and frames, another process).
    std::fs::copy(&b, &c).unwrap();
    write_merged(
        &[
            input(a.clone(), 0, 0),
            input(b.clone(), 0, 1 << 22),
            input(c.clone(), 0, 2 << 22),
        ],
        &out,
        false,
        "t",
    )
    .unwrap();
    let label = |f: &str| format!("/w/{f}.py:7 {f}");
    let lost = sleuth_core::sites::LOST.to_string();
    let t = Trace::open(&out).unwrap();
    let got = call_sites(&t);
    let mut want = vec![
        (10, label("alloc_a")),
        (10, label("step_a")),
        (10, lost.clone()),
    ];
    for pid in [10 + (1 << 22), 10 + (2 << 22)] {
        want.extend([
            (pid, label("alloc_b")),
            (pid, label("step_b")),
            (pid, lost.clone()),
        ]);
    }
    want.sort();
    assert_eq!(got, want);
    // Every stack is stored once with its frames, and no call names a
    // stack of another process.
    let db = rusqlite::Connection::open(&out).unwrap();
    let n = |sql: &str| -> i64 { db.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(n("SELECT count(*) FROM stacks"), 6);
    assert_eq!(n("SELECT count(DISTINCT stack_id) FROM stack_frames"), 6);
    assert_eq!(
        n("SELECT count(*) FROM calls c JOIN stacks s ON s.id = c.stack_id WHERE s.pid != c.pid"),
        0
    );
    assert_eq!(n("SELECT count(*) FROM call_sites"), 6);
    assert_eq!(
        n(
            "SELECT count(*) FROM allocator_events a JOIN stacks s ON s.id = a.stack_id
           WHERE s.pid = a.pid AND s.site LIKE '%alloc_%'"
        ),
        3
    );
}

/// Found by round 51's tester: a killed tracer's file (no session end, no
/// rollups, its kernel-counted launches only in its samples) merged as it
/// was: the merged session ended with the other nodes' (its later calls
/// outside every window) and its launches were lost. It is refused with
/// what completes it; once `gpusleuth finish` completed it, it merges, its
/// calls inside the merged session and its launches counted.
#[test]
fn an_unfinished_input_is_refused_until_finished() {
    use sleuth_core::counted::CountSample;
    use sleuth_store::finish::{finish, Finished};
    let dir = TempDir::new("merge_unfinished");
    let (a, b, killed, out) = (
        dir.join("a.db"),
        dir.join("b.db"),
        dir.join("killed.db"),
        dir.join("job.db"),
    );
    let w = TraceWriter::create(&a, session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    h.send(Event::Call(call("cudaMalloc", 10, 10, 1_000_000, 1_000)))
        .unwrap();
    h.set_session_end(3_000_000).unwrap();
    w.finish().unwrap();
    // Node b runs longer, launches counted in the kernel; killed.
    let w = TraceWriter::create(&b, session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    h.send(Event::Call(call("cudaMalloc", 20, 20, 9_000_000, 100)))
        .unwrap();
    let launch = op_by_name("cuLaunchKernel").unwrap().id;
    h.add_count_samples(vec![CountSample {
        ts_ns: 8_000_000,
        pid: 20,
        op: launch,
        count: 5_300,
    }])
    .unwrap();
    common::trace_fixture::copy_as_killed(&h, &b, &killed);
    drop(h);
    w.finish().unwrap();

    let why = input_facts(&killed)
        .unwrap()
        .unfinished
        .expect("unfinished");
    assert!(why.contains("`gpusleuth finish --db"), "{why}");
    let err = write_merged(
        &[input(a.clone(), 0, 0), input(killed.clone(), 0, 0)],
        &out,
        false,
        "t",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("not finished") && err.contains("gpusleuth finish") && !err.contains('\n'),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");

    let done = finish(Trace::open(&killed).unwrap(), None).unwrap();
    assert!(matches!(done, Finished::Completed { .. }), "{done:?}");
    assert_eq!(input_facts(&killed).unwrap().unfinished, None);
    write_merged(&[input(a, 0, 0), input(killed, 0, 0)], &out, false, "t").unwrap();
    let t = Trace::open(&out).unwrap();
    let end = t.session().unwrap().end_mono_ns;
    assert!(end >= Some(9_000_100), "{end:?}");
    let counts = t.op_counts(None).unwrap();
    assert!(
        counts
            .iter()
            .any(|c| c.pid == 20 && c.op == launch && c.count == 5_300),
        "{counts:?}"
    );
}

/// Found by round 51's tester: with `overwrite` (`merge --force`) the old
/// output was removed before the merge, and a merge that then failed (an
/// input it cannot read) lost it. The merge is written beside the output
/// and renamed over it once complete: a failure leaves the old output and
/// nothing of its own; a success leaves none of the old output's SQLite
/// side files, which the new file's readers would apply to it.
#[test]
fn a_failed_merge_over_an_existing_output_keeps_it() {
    let dir = TempDir::new("merge_force");
    let (a, b, out) = (dir.join("a.db"), dir.join("b.db"), dir.join("job.db"));
    node(&a, "node-a", 1_000_000);
    node(&b, "node-b", 5_000_000);
    std::fs::write(&out, "the old output").unwrap();
    let listing = || {
        let mut names: Vec<String> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let before = listing();
    // The second input fails once the first is merged.
    let err = write_merged(
        &[
            input(a.clone(), 0, 0),
            input(dir.join("gone.db"), 0, 1 << 22),
        ],
        &out,
        true,
        "t",
    )
    .unwrap_err();
    assert!(err.to_string().contains("gone.db"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "the old output");
    assert_eq!(listing(), before, "nothing of the failed merge is left");

    // A success replaces it, and the old output's side files go.
    let wal = dir.join("job.db-wal");
    std::fs::write(&wal, vec![0x37u8; 4096]).unwrap();
    write_merged(&[input(a, 0, 0), input(b, 0, 1 << 22)], &out, true, "t").unwrap();
    assert!(!wal.exists());
    assert_eq!(Trace::open(&out).unwrap().merge_nodes().unwrap().len(), 2);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&out).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
}

/// Found by round 51's tester: a shift that moved an input's times below 0
/// (its trace recorded before the first trace's clock began: another job's,
/// or a wrong wall clock) wrote them so, and every reader then skipped
/// those rows as damage; one past 2^62 likewise. Refused in one line naming
/// the input, the shift and a time it moves out; nothing is written.
#[test]
fn a_shift_that_moves_times_out_of_range_is_refused() {
    let dir = TempDir::new("merge_range");
    let (a, b, out) = (dir.join("a.db"), dir.join("b.db"), dir.join("job.db"));
    node(&a, "node-a", 1_000_000);
    node(&b, "node-b", 5_000_000);
    for shift in [-6_000_000i64, (1 << 62) - 5_000_000] {
        let err = write_merged(
            &[input(a.clone(), 0, 0), input(b.clone(), shift, 1 << 22)],
            &out,
            false,
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("b.db")
                && err.contains(&format!("(by {shift} ns"))
                && err.contains("leave the readers' range 0..2^62 ns")
                && !err.contains('\n'),
            "{err}"
        );
        assert!(!out.exists());
    }
    // Just inside: merged, the earliest call at 0.
    write_merged(
        &[input(a, 0, 0), input(b, -5_000_000, 1 << 22)],
        &out,
        false,
        "t",
    )
    .unwrap();
    let d = Trace::open(&out).unwrap().load(None).unwrap();
    assert_eq!(d.calls.iter().map(|c| c.ts_ns).min(), Some(0));
}

/// `call_blocks` (each writer transaction's call-row id range and earliest
/// and latest start, which reads of a file without call indexes keep to)
/// were copied as the node wrote them: the second node's blocks named the
/// first node's rows and its own clock's times. They move with the calls:
/// every call lies in a block that names its id and its (moved) start, and
/// the blocks cover the rows without a gap, as the readers require.
#[test]
fn call_blocks_move_with_their_calls() {
    let dir = TempDir::new("merge_blocks");
    let (a, b, out) = (dir.join("a.db"), dir.join("b.db"), dir.join("job.db"));
    node(&a, "node-a", 1_000_000);
    node(&b, "node-b", 5_000_000);
    write_merged(
        &[input(a, 0, 0), input(b, -3_000_000, 1 << 22)],
        &out,
        false,
        "t",
    )
    .unwrap();
    let db = rusqlite::Connection::open(&out).unwrap();
    let n = |sql: &str| -> i64 { db.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert!(n("SELECT count(*) FROM call_blocks") >= 2);
    assert_eq!(n("SELECT count(*) FROM call_rows"), 4);
    assert_eq!(
        n("SELECT count(*) FROM call_rows c WHERE NOT EXISTS (
             SELECT 1 FROM call_blocks b WHERE c.id BETWEEN b.first_id AND b.last_id
               AND c.ts_ns BETWEEN b.min_ts_ns AND b.max_ts_ns)"),
        0
    );
    // Contiguous from the first row to the last.
    assert_eq!(
        n(
            "SELECT count(*) FROM call_blocks b WHERE b.first_id > (SELECT min(id) FROM call_rows)
             AND NOT EXISTS (SELECT 1 FROM call_blocks p WHERE p.last_id + 1 = b.first_id)"
        ),
        0
    );
    assert_eq!(
        n("SELECT max(last_id) FROM call_blocks"),
        n("SELECT max(id) FROM call_rows")
    );
}

/// Each node had its own tracer: a merged trace names none (the sum of
/// their pids named some other process, or none, as the tracer), so its
/// readers know the tracers by name; the room left in the kernel maps is
/// the tightest node's, not a sum.
#[test]
fn a_merged_trace_names_no_tracer_pid() {
    let dir = TempDir::new("merge-tracer");
    let (a, b, out) = (dir.join("a.db"), dir.join("b.db"), dir.join("job.db"));
    let with = |pid| WriterOptions {
        tracer_pid: Some(pid),
        ..Default::default()
    };
    node_with(&a, "node-a", 1_000_000, with(4_000));
    node_with(&b, "node-b", 5_000_000, with(5_000));
    for (p, left) in [(&a, 70), (&b, 30)] {
        rusqlite::Connection::open(p)
            .unwrap()
            .execute(
                "INSERT OR REPLACE INTO stats(name, value) VALUES ('map_traced_left', ?1)",
                [left],
            )
            .unwrap();
    }
    write_merged(&[input(a, 0, 0), input(b, 0, 1 << 22)], &out, false, "t").unwrap();
    let t = Trace::open(&out).unwrap();
    let stats = t.stats().unwrap();
    assert_eq!(t.tracer_pid(), None, "{stats:?}");
    assert_eq!(stats.get("map_traced_left"), Some(&30));
}
