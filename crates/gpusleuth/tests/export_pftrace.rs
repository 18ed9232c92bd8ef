//! `export --format pftrace` (Perfetto's protobuf) holds what the
//! `perfetto` JSON export of the same trace holds: every slice with its
//! arguments, counter value, instant and name. The protobuf is read with
//! Perfetto's own Python classes and its slices rebuilt as trace_processor
//! builds them (tests/perfetto/pftrace_check.py); the JSON export is the
//! reference, itself checked against the database in report_export.rs.
//! Skips without python3's `perfetto` package, except under CI=true.

mod common;
#[path = "common/synthetic_run.rs"]
mod synthetic_run;
#[path = "common/temp_dir.rs"]
mod temp_dir;

use sleuth_core::sites::{Frame, FrameKind, Stack};
use sleuth_core::{
    CallEvent, Culprit, Event, GpuSample, ProcessGpuSample, ProcessInfo, SamplePhase, WaitEvent,
    WaitKind,
};
use sleuth_store::{SessionInfo, TraceWriter, WriterOptions};
use std::path::{Path, PathBuf};
use synthetic_run::{malloc, proc_event, write_three_files};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

/// Exports `db` (with `args`) as both formats into `dir` and checks that
/// they hold the same; the checker's summary, None when it cannot run.
fn both_formats(test: &str, db: &Path, args: &[&str], dir: &Path) -> Option<String> {
    let json = dir.join("trace.json");
    let proto = dir.join("trace.pftrace");
    for (format, out) in [("perfetto", &json), ("pftrace", &proto)] {
        common::run_ok(
            common::gpusleuth()
                .args(["export", "--force", "--format", format, "--db"])
                .arg(db)
                .args(args)
                .arg("-o")
                .arg(out),
        );
    }
    common::pftrace_matches_json(&format!("{test} {args:?}"), &json, &proto)
}

fn slices_in(summary: &str) -> u64 {
    summary
        .strip_prefix("ok: ")
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no slice count in {summary:?}"))
}

#[test]
fn the_example_traces_as_protobuf_hold_what_their_json_holds() {
    let dir = temp_dir::TempDir::new("pftrace-examples");
    let cases: [(&str, &[&[&str]]); 2] = [
        (
            "demo-sim.db",
            &[
                &[],
                &["--from", "100ms", "--to", "300ms"],
                &["--pid", "25707"],
            ],
        ),
        (
            "h200-contention.db",
            &[
                &[],
                &["--from", "2s", "--to", "6s"],
                &["--pid", "725", "--last", "3s"],
            ],
        ),
    ];
    for (name, variants) in cases {
        for args in variants {
            let Some(summary) =
                both_formats("example traces", &example(name), args, dir.0.as_path())
            else {
                return;
            };
            assert!(slices_in(&summary) > 0, "{name} {args:?}: {summary}");
        }
    }
}

const PID: u32 = 5100;
const OTHER: u32 = 5200;

fn call(op: &str, pid: u32, tid: u32, ts_ns: u64, dur_ns: u64) -> CallEvent {
    CallEvent {
        ts_ns,
        dur_ns,
        pid,
        tid,
        op: sleuth_core::op_by_name(op).map(|o| o.id).expect("known op"),
        ..Default::default()
    }
}

/// A trace with every kind of event the export draws: nested calls, two
/// calls of one thread that overlap without nesting (a damaged file), an
/// op the table does not know, calls with sites (Python and native
/// frames), pointers and streams, a failed allocation, blocked and
/// preempted waits with culprits, NVML samples of the GPU and of a
/// process, two processes and several threads.
fn write_every_kind(db: &Path) {
    let info = SessionInfo {
        started_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 1_000_000,
        hostname: "testhost".into(),
        kernel: "6.1.0".into(),
        command: "gpusleuth trace -- python3 train.py".into(),
        target: "python3 train.py".into(),
        launch_mode: "launch".into(),
        tool_version: "test".into(),
        clock_base_ns: 0,
        ..Default::default()
    };
    let w = TraceWriter::create(db, info, WriterOptions::default()).expect("create trace");
    let h = w.handle();
    for (pid, comm) in [(PID, "trainer"), (OTHER, "loader")] {
        h.set_process(ProcessInfo {
            pid,
            comm: comm.into(),
            cmdline: format!("python3 {comm}.py"),
            start_ns: Some(1_000_000),
            ..Default::default()
        })
        .expect("process");
    }
    h.add_stack(Stack {
        id: 7,
        pid: PID,
        frames: vec![
            Frame {
                kind: Some(FrameKind::Native),
                function: Some("cudaMalloc".into()),
                module: Some("/usr/lib/libcudart.so.13".into()),
                addr: Some(0x7f00_1234),
                ..Default::default()
            },
            Frame {
                kind: Some(FrameKind::Python),
                function: Some("Model.forward".into()),
                file: Some("/w/train.py".into()),
                line: Some(42),
                ..Default::default()
            },
        ],
        notes: Vec::new(),
    })
    .expect("stack");
    let ms = 1_000_000u64;
    let mut calls = Vec::new();
    // A runtime malloc with its driver call nested inside, from a site.
    let mut malloc = call("cudaMalloc", PID, PID, 2 * ms, ms);
    (malloc.size, malloc.ptr, malloc.stack_id) = (Some(1 << 20), Some(0x7f00_0000_0000), Some(7));
    malloc.runnable_ns = 100_000;
    malloc.blocked_ns = 200_000;
    malloc.cpu = 3;
    let mut inner = call("cuMemAlloc_v2", PID, PID, 2 * ms + 100_000, 500_000);
    (inner.size, inner.ptr, inner.nested) = (Some(1 << 20), Some(0x7f00_0000_0000), true);
    calls.extend([malloc, inner]);
    // A failed allocation, then a copy on a stream.
    let mut failed = call("cudaMalloc", PID, PID, 4 * ms, 10_000);
    (failed.size, failed.ret) = (Some(1 << 40), 2);
    let mut copy = call("cudaMemcpyAsync", PID, PID, 5 * ms, 2 * ms);
    (copy.size, copy.kind, copy.stream) = (Some(4096), Some(1), Some(0x5555_0000));
    calls.extend([failed, copy]);
    // Calls of one thread that overlap without nesting (lanes): [3, 7) ms,
    // [5, 9) across its end (lane 1), [6, 7) inside the first (lane 0),
    // [6.5, 10) across both (lane 2), [10, 11) after them all (lane 0).
    calls.push(call("cudaLaunchKernel", PID, PID + 1, 3 * ms, 4 * ms));
    calls.push(call("cudaStreamSynchronize", PID, PID + 1, 5 * ms, 4 * ms));
    calls.push(call("cudaLaunchKernel", PID, PID + 1, 6 * ms, ms));
    calls.push(call(
        "cudaDeviceSynchronize",
        PID,
        PID + 1,
        6 * ms + ms / 2,
        3 * ms + ms / 2,
    ));
    calls.push(call("cudaLaunchKernel", PID, PID + 1, 10 * ms, ms));
    // A call and one nested in it starting at the same nanosecond, the
    // inner one first (it returned first): both on the thread's own track.
    let mut outer = call("cudaMalloc", OTHER, OTHER, 2 * ms, 2 * ms);
    outer.size = Some(4096);
    let mut nested = call("cuMemAlloc_v2", OTHER, OTHER, 2 * ms, ms);
    (nested.size, nested.nested) = (Some(4096), true);
    calls.extend([nested, outer]);
    // An op the table does not know, on another process's thread.
    let mut unknown = call("cudaFree", OTHER, OTHER + 3, 9 * ms, ms);
    unknown.op = 9_999;
    unknown.ret = -1;
    calls.push(unknown);
    for c in calls {
        h.send(Event::Call(c)).expect("send");
    }
    // A blocked wait woken then kept waiting for a CPU, and a preemption.
    h.send(Event::Wait(WaitEvent {
        pid: PID,
        tid: PID,
        kind: WaitKind::Blocked,
        off_ns: 5 * ms + 200_000,
        wake_ns: 6 * ms,
        on_ns: 6 * ms + 300_000,
        prev_state: 1,
        cpu: 2,
        culprits: vec![Culprit {
            pid: OTHER,
            tid: OTHER + 3,
            comm: "loader".into(),
            ns: 300_000,
        }],
        waker: None,
    }))
    .expect("wait");
    h.send(Event::Wait(WaitEvent {
        pid: OTHER,
        tid: OTHER,
        kind: WaitKind::Preempted,
        off_ns: 10 * ms,
        wake_ns: 10 * ms,
        on_ns: 11 * ms,
        prev_state: 0,
        cpu: 1,
        culprits: Vec::new(),
        waker: None,
    }))
    .expect("wait");
    h.add_gpu_samples(
        (0..3)
            .map(|i| GpuSample {
                ts_ns: (4 + 4 * i) * ms,
                gpu: i as u32 % 2,
                busy_pct: 12.5 * (i + 1) as f64,
                period_ns: 4 * ms,
            })
            .collect(),
    )
    .expect("gpu samples");
    h.add_process_gpu_samples(vec![ProcessGpuSample {
        ts_ns: 6 * ms,
        gpu: 1,
        pid: PID,
        used_bytes: Some(3 << 30),
        sm_pct: Some(40.0),
        phase: SamplePhase::Sample,
    }])
    .expect("process samples");
    h.set_session_end(20 * ms).expect("end");
    drop(h);
    w.finish().expect("finish trace");
}

#[test]
fn every_kind_of_event_as_protobuf_holds_what_the_json_holds() {
    let dir = temp_dir::TempDir::new("pftrace-kinds");
    let db = dir.join("kinds.db");
    write_every_kind(&db);
    for args in [
        &[][..],
        &["--pid", &PID.to_string()],
        &["--from", "4ms", "--to", "9ms"],
    ] {
        let Some(summary) = both_formats("every kind", &db, args, dir.0.as_path()) else {
            return;
        };
        assert!(slices_in(&summary) > 0, "{args:?}: {summary}");
    }
    // The overlapping calls went to lanes: the thread has child tracks.
    let proto = std::fs::read(dir.join("trace.pftrace")).expect("written");
    let whole = {
        common::run_ok(
            common::gpusleuth()
                .args(["export", "--force", "--format", "pftrace", "--db"])
                .arg(&db)
                .arg("-o")
                .arg(dir.join("whole.pftrace")),
        );
        std::fs::read(dir.join("whole.pftrace")).expect("written")
    };
    let has = |bytes: &[u8], s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
    let count = |bytes: &[u8], s: &str| {
        bytes
            .windows(s.len())
            .filter(|w| *w == s.as_bytes())
            .count()
    };
    // One thread's lanes only: the calls of one start went longest first.
    assert_eq!(count(&whole, "overlapping calls 1"), 1, "a lane");
    assert_eq!(count(&whole, "overlapping calls 2"), 1, "a second lane");
    assert!(!has(&whole, "overlapping calls 3"));
    assert!(has(&proto, "off-cpu"));
}

#[test]
fn pftrace_to_a_pipe_is_the_file_byte_for_byte() {
    let dir = temp_dir::TempDir::new("pftrace-pipe");
    let file = dir.join("t.pftrace");
    let db = example("demo-sim.db");
    common::run_ok(
        common::gpusleuth()
            .args(["export", "--format", "pftrace", "--db"])
            .arg(&db)
            .arg("-o")
            .arg(&file),
    );
    let piped = common::run_ok(
        common::gpusleuth()
            .args(["export", "--format", "pftrace", "--db"])
            .arg(&db),
    );
    let written = std::fs::read(&file).expect("written");
    assert!(written.len() > 1000);
    // No newline after the last packet: it would be read as a field.
    assert_eq!(piped.stdout, written);
}

#[test]
fn the_output_name_chooses_the_format_unless_one_is_given() {
    let dir = temp_dir::TempDir::new("pftrace-name");
    let db = example("demo-sim.db");
    let export = |name: &str, format: Option<&str>| -> Vec<u8> {
        let out = dir.join(name);
        let mut cmd = common::gpusleuth();
        cmd.args(["export", "--force", "--db"])
            .arg(&db)
            .arg("-o")
            .arg(&out);
        if let Some(f) = format {
            cmd.args(["--format", f]);
        }
        common::run_ok(&mut cmd);
        std::fs::read(&out).expect("written")
    };
    let proto = export("a.pftrace", Some("pftrace"));
    assert_eq!(export("b.pftrace", None), proto);
    assert_eq!(export("c.perfetto-trace", None), proto);
    let json = export("d.json", Some("perfetto"));
    assert_eq!(export("e.json", None), json);
    assert_eq!(export("f.trace", None), json, "any other name: the JSON");
    assert_eq!(export("g.pftrace", Some("perfetto")), json, "--format wins");
    assert_eq!(proto[0], 0x0a, "a protobuf's first packet");
    assert_eq!(json[0], b'{');
}

/// On a terminal (a pseudo-terminal from util-linux's `script`), the
/// binary format is a one-line error before anything is written.
#[test]
fn pftrace_is_refused_on_a_terminal() {
    let bin = env!("CARGO_BIN_EXE_gpusleuth");
    let db = example("demo-sim.db");
    let line = format!("'{bin}' export --db '{}' --format pftrace", db.display());
    let out = match std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            common::skip_unless_ci(
                "pftrace on a terminal",
                &format!("no `script` (util-linux): {e}"),
            );
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert_eq!(
        text.trim(),
        "gpusleuth: error: --format pftrace is binary: write it to a file (-o trace.pftrace) or a pipe"
    );
}

/// Round 54's tester: the export of a `--keep` run drew a sleep begun in a
/// file `--keep` deleted from the document's origin (0) with its whole
/// length, past its process's exit. A wait (or call) of any file that
/// began before the first file kept now moves the origin back, as one
/// file's export does: every slice ends where it ended.
#[test]
fn a_wait_begun_in_a_deleted_file_ends_where_it_ended() {
    let dir = temp_dir::TempDir::new("export_deleted_wait");
    let run = dir.join("run");
    let ms = 1_000_000u64;
    // Files 2 and 3 of a run (file 1 deleted), 100 ms each from 200 ms; a
    // sleep begun in file 1 ended in file 3: all of it blocked.
    let (sleep_off, sleep_on) = (140 * ms, 350 * ms);
    write_three_files(&run, |n| {
        let start = 100 * ms * n;
        let mut events = vec![Event::Call(call(
            "cudaMalloc",
            PID,
            PID,
            start + 10 * ms,
            ms,
        ))];
        if n == 3 {
            events.push(synthetic_run::blocked(PID, sleep_off, sleep_on));
        }
        events
    });
    std::fs::remove_file(run.join(sleuth_store::run::part_name(1))).unwrap();
    let out = dir.join("run.json");
    common::run_ok(
        common::gpusleuth()
            .args(["export", "--format", "perfetto", "--db"])
            .arg(&run)
            .arg("-o")
            .arg(&out),
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let origin = doc["otherData"]["origin_mono_ns"]
        .as_u64()
        .expect("the document's origin");
    assert_eq!(origin, sleep_off, "the origin moves back to the wait");
    let blocked: Vec<&serde_json::Value> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "sched.blocked")
        .collect();
    assert_eq!(blocked.len(), 1);
    let (ts, dur) = (
        blocked[0]["ts"].as_f64().unwrap(),
        blocked[0]["dur"].as_f64().unwrap(),
    );
    assert_eq!(ts, 0.0);
    assert_eq!(
        ts + dur,
        (sleep_on - origin) as f64 / 1e3,
        "ends where it ended"
    );
    // The protobuf export draws the same.
    std::fs::create_dir_all(dir.join("both")).unwrap();
    let _ = both_formats("deleted_wait", &run, &[], &dir.join("both"));
}

/// The `perfetto` JSON export of `db` with `args`, parsed.
fn perfetto_of(db: &Path, args: &[&str], out: &Path) -> serde_json::Value {
    common::run_ok(
        common::gpusleuth()
            .args(["export", "--force", "--format", "perfetto", "--db"])
            .arg(db)
            .args(args)
            .arg("-o")
            .arg(out),
    );
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

/// The `live_bytes` samples of `pid`'s memory track: (ts µs, bytes).
fn memory_samples(doc: &serde_json::Value, pid: u32) -> Vec<(f64, u64)> {
    doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "device memory (bytes)" && e["pid"] == pid)
        .map(|e| {
            let bytes = e["args"]["live_bytes"].as_u64().unwrap();
            (e["ts"].as_f64().unwrap(), bytes)
        })
        .collect()
}

/// Round 55's tester: `export --db DIR --last 2s` spanning files 7 and 8
/// drew a memory counter of a forked child that allocated and exited in
/// file 6 (a kept file the window does not span), and named it nowhere
/// (the protobuf: "? (pid)"). A process that exited before the window
/// holds nothing in it (the driver frees its memory at its exit): no
/// counter; one still holding memory with no row in the spanned files is
/// named from the run's ledger.
#[test]
fn a_run_window_draws_no_memory_of_a_process_gone_before_it_and_names_what_it_draws() {
    use sleuth_core::ProcKind;
    let dir = temp_dir::TempDir::new("export_run_window_exited");
    let run = dir.join("run");
    let ms = 1_000_000u64;
    const HOLDER: u32 = 5300;
    write_three_files(&run, |n| {
        let start = 100 * ms * n;
        let mut events = vec![Event::Call(malloc(
            PID,
            start + 10 * ms,
            1 << 20,
            0x1000 * n,
        ))];
        if n == 1 {
            // A child that allocates and exits; one that allocates and
            // sleeps through the later files without a row in them.
            events.push(proc_event(ProcKind::Fork, OTHER, start + ms, "workload"));
            events.push(Event::Call(malloc(OTHER, start + 5 * ms, 3 << 20, 0x9000)));
            events.push(proc_event(
                ProcKind::Exit,
                OTHER,
                start + 20 * ms,
                "workload",
            ));
            events.push(proc_event(ProcKind::Fork, HOLDER, start + ms, "holder"));
            events.push(Event::Call(malloc(HOLDER, start + 5 * ms, 5 << 20, 0xa000)));
        }
        events
    });
    // From 250 ms: files 2 and 3.
    let doc = perfetto_of(&run, &["--last", "150ms"], &dir.join("w.json"));
    assert_eq!(
        memory_samples(&doc, OTHER),
        vec![],
        "exited before the window"
    );
    let names: Vec<(u64, String)> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].to_string()))
        .collect();
    for pid in [PID, HOLDER] {
        assert!(!memory_samples(&doc, pid).is_empty(), "{pid} drawn");
        assert!(
            names.iter().any(|(p, _)| *p == u64::from(pid)),
            "{pid} drawn but not named: {names:?}"
        );
    }
    assert!(
        names.contains(&(u64::from(HOLDER), "\"holder (5300)\"".into())),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|(p, _)| *p == u64::from(OTHER)),
        "{names:?}"
    );
    // The protobuf draws and names the same.
    std::fs::create_dir_all(dir.join("both")).unwrap();
    let _ = both_formats(
        "run_window_exited",
        &run,
        &["--last", "150ms"],
        &dir.join("both"),
    );
}

/// Round 55's tester: `export --db DIR` of a run whose origin is a wait
/// begun in a file `--keep` deleted drew four samples of a process at 0
/// (0, 1 MiB, 3 MiB, 2 MiB: its points from before the origin), then the
/// later ones. The whole run is a window from its start: one sample at the
/// origin with what was live then, then the points after it.
#[test]
fn a_whole_run_export_draws_memory_from_its_origin_with_what_was_live_then() {
    let dir = temp_dir::TempDir::new("export_run_memory_origin");
    let run = dir.join("run");
    let ms = 1_000_000u64;
    let (sleep_off, sleep_on) = (150 * ms, 250 * ms);
    let free = |ts_ns, ptr| synthetic_run::free(PID, ts_ns, ptr);
    write_three_files(&run, |n| match n {
        1 => vec![
            Event::Call(malloc(PID, 110 * ms, 1 << 20, 0xa000)),
            Event::Call(malloc(PID, 120 * ms, 2 << 20, 0xb000)),
            Event::Call(free(130 * ms, 0xa000)),
        ],
        2 => vec![
            Event::Call(malloc(PID, 210 * ms, 4 << 20, 0xc000)),
            synthetic_run::blocked(PID, sleep_off, sleep_on),
        ],
        _ => vec![Event::Call(free(310 * ms, 0xc000))],
    });
    std::fs::remove_file(run.join(sleuth_store::run::part_name(1))).unwrap();
    let doc = perfetto_of(&run, &[], &dir.join("run.json"));
    assert_eq!(doc["otherData"]["origin_mono_ns"].as_u64(), Some(sleep_off));
    // Each later point at its call's return (1 µs after its start).
    assert_eq!(
        memory_samples(&doc, PID),
        vec![(0.0, 2 << 20), (60_001.0, 6 << 20), (160_001.0, 2 << 20)]
    );
    std::fs::create_dir_all(dir.join("both")).unwrap();
    let _ = both_formats("run_memory_origin", &run, &[], &dir.join("both"));
}
