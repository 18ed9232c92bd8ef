//! Drives `gpusleuth mcp` with the official Python MCP client (`pip install
//! "mcp>=1.9"`) over stdio and HTTP, against a trace written by hand with
//! sleuth-store's `TraceWriter`, so the ground truth is known by construction.
//! The client script is tests/mcp/client_test.py at the repository root.
//!
//! Skips with a printed reason when python3 or the `mcp` package is missing,
//! except under CI=true, where it fails.

mod mcp_common;
use mcp_common::{assert_client_passed, client_ready, repo_root, run_client};
use serde_json::json;
use sleuth_core::{CallEvent, Culprit, Event, ProcessInfo, WaitEvent, WaitKind};
use sleuth_store::{SessionInfo, TraceWriter, WriterOptions};
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;
const PID: u32 = 4242;
const HOG_PID: u32 = 777;
const BIG_FAILED: u64 = 64 << 30;
const CUDA_ERROR_MEMORY_ALLOCATION: i64 = 2;
const SITE_STACK: u64 = 0xabc;

fn op_id(name: &str) -> u16 {
    sleuth_core::op_by_name(name)
        .map(|o| o.id)
        .unwrap_or_else(|| panic!("op {name} missing from the op table"))
}

fn call(op: &str, ts_ns: u64, dur_ns: u64) -> CallEvent {
    CallEvent {
        ts_ns,
        dur_ns,
        pid: PID,
        tid: PID,
        op: op_id(op),
        ..Default::default()
    }
}

/// Writes the trace and returns the ground truth the client checks.
fn write_trace(db: &Path) -> serde_json::Value {
    let info = SessionInfo {
        started_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 0,
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
    h.set_process(ProcessInfo {
        pid: PID,
        comm: "trainer".into(),
        cmdline: "python3 train.py".into(),
        start_ns: Some(500_000),
        ..Default::default()
    })
    .expect("process");

    // Five successful cudaMalloc of 1, 2, 4, 8, 16 MiB, all from one line;
    // then one that fails.
    h.add_stack(sleuth_core::sites::Stack {
        id: SITE_STACK,
        pid: PID,
        frames: vec![sleuth_core::sites::Frame {
            kind: Some(sleuth_core::sites::FrameKind::Python),
            function: Some("Model.forward".into()),
            file: Some("/w/train.py".into()),
            line: Some(42),
            ..Default::default()
        }],
        notes: Vec::new(),
    })
    .expect("stack");
    let sizes = [1, 2, 4, 8, 16].map(|m| m * MIB);
    let mut ptrs = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let mut c = call("cudaMalloc", (i as u64 + 1) * 1_000_000, 10_000);
        c.size = Some(size);
        c.ptr = Some(0x7f00_0000_0000 + (i as u64) * 0x1000_0000);
        c.stack_id = Some(SITE_STACK);
        ptrs.push(c.ptr);
        h.send(Event::Call(c)).expect("send");
    }
    let mut failed = call("cudaMalloc", 6_000_000, 20_000);
    failed.size = Some(BIG_FAILED);
    failed.ret = CUDA_ERROR_MEMORY_ALLOCATION;
    h.send(Event::Call(failed)).expect("send");
    // Free the first two (1 + 2 MiB): 28 MiB stay live, peak 31 MiB.
    for (i, ptr) in ptrs.iter().take(2).enumerate() {
        let mut c = call("cudaFree", 7_000_000 + i as u64 * 1_000_000, 5_000);
        c.ptr = *ptr;
        h.send(Event::Call(c)).expect("send");
    }
    // A copy that waited 3 ms runnable while "cpuhog" held the CPU.
    let mut copy = call("cudaMemcpy", 10_000_000, 5_000_000);
    copy.size = Some(MIB);
    copy.kind = Some(1);
    copy.runnable_ns = 3_000_000;
    h.send(Event::Call(copy)).expect("send");
    h.send(Event::Wait(WaitEvent {
        pid: PID,
        tid: PID,
        kind: WaitKind::Preempted,
        off_ns: 10_500_000,
        wake_ns: 10_500_000,
        on_ns: 13_500_000,
        prev_state: 0,
        cpu: 0,
        culprits: vec![Culprit {
            pid: HOG_PID,
            tid: HOG_PID,
            comm: "cpuhog".into(),
            ns: 3_000_000,
        }],
        waker: None,
    }))
    .expect("send");
    // A sync that slept 0.9 ms waiting for the GPU.
    let mut sync = call("cudaStreamSynchronize", 20_000_000, 1_000_000);
    sync.blocked_ns = 900_000;
    h.send(Event::Call(sync)).expect("send");
    h.set_session_end(30_000_000).expect("end");
    drop(h);
    w.finish().expect("finish trace");

    json!({
        "pid": PID, "comm": "trainer",
        "calls": 10, "malloc_calls": 6, "malloc_errors": 1,
        "live_bytes": 28 * MIB, "peak_bytes": 31 * MIB, "unfreed": 3,
        "live_at_5_5ms": 31 * MIB,
        "failed_bytes": BIG_FAILED, "failed_error": CUDA_ERROR_MEMORY_ALLOCATION,
        "site": "/w/train.py:42 Model.forward", "site_unfreed_bytes": 28 * MIB,
        "slow_copy": {"ts_ns": 10_000_000u64, "dur_ns": 5_000_000u64, "runnable_ns": 3_000_000u64,
                      "culprit_pid": HOG_PID, "culprit_comm": "cpuhog", "culprit_ns": 3_000_000u64},
        "sync_blocked_ns": 900_000u64,
    })
}

#[test]
fn python_mcp_client_over_stdio_and_http() {
    if !client_ready("the MCP client test") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("gpusleuth-mcp-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let db = dir.join("trace.db");
    let truth = write_trace(&db);
    let truth_path = dir.join("truth.json");
    std::fs::write(&truth_path, truth.to_string()).expect("truth file");

    let script = repo_root().join("tests/mcp/client_test.py");
    let mut cmd = Command::new("python3");
    // The server's checks cache: this test's own, not the user's.
    cmd.env("GPUSLEUTH_CACHE_DIR", mcp_common::test_cache_dir());
    // Regenerating the example session of docs/mcp.md: GPUSLEUTH_MCP_TRANSCRIPT=/path/out.json.
    if let Ok(t) = std::env::var("GPUSLEUTH_MCP_TRANSCRIPT") {
        cmd.arg(&script).arg("--transcript").arg(t);
    } else {
        cmd.arg(&script);
    }
    cmd.arg("--bin")
        .arg(env!("CARGO_BIN_EXE_gpusleuth"))
        .arg("--db")
        .arg(&db)
        .arg("--truth")
        .arg(&truth_path);
    let (out, stdout) = run_client(&mut cmd);
    assert_client_passed(&out, &stdout, "python MCP client checks");
    let _ = std::fs::remove_dir_all(&dir);
}
