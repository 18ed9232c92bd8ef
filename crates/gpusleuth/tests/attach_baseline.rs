//! Attaching to a running job (issue 19) and GPU activity (issue 12), end to
//! end on the simulated world: the workload allocates 150 MiB before the
//! trace attaches with `--pid`, the simulated NVML (driven by the workload's
//! own activity file) reports what it holds and when "the GPU" is busy.
//! Ground truth: the workload's script (sizes, which frees hit pre-trace
//! memory) and its activity file (busy intervals in CLOCK_REALTIME µs,
//! converted here with an offset this test measures itself).

mod common;
#[path = "common/mcp_stdio.rs"]
mod mcp_stdio;
#[path = "../../sleuth-gpu/tests/support/mod.rs"]
mod support;

use common::{gpusleuth, wait_child, wait_for_file, Sandbox};
use mcp_stdio::McpStdio;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// A child killed and reaped when dropped: a failed assertion leaves no
/// workload waiting forever for its `fin` file.
struct Guard(std::process::Child);

impl std::ops::Deref for Guard {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const MIB: u64 = 1 << 20;
/// Allocated before the trace: A (freed during it) and B (kept).
const A: u64 = 100 * MIB;
const B: u64 = 50 * MIB;
/// Allocated during the trace: C (freed during it) and D (kept).
const C: u64 = 30 * MIB;
const D: u64 = 20 * MIB;
/// NVML sample period of the simulated driver in this test.
const PERIOD_NS: u64 = 100_000_000;

/// Where the simulated workload logs its GPU activity in the sandbox (the
/// busy time the simulated NVML reports).
fn activity_log(sb: &Sandbox) -> PathBuf {
    sb.path("activity.txt")
}

/// Files in the sandbox named as a workload script names them (the
/// `touch`/`await`/`stamp` steps the tests synchronise on).
fn script_paths<const N: usize>(sb: &Sandbox, names: [&str; N]) -> [String; N] {
    names.map(|n| sb.path(n).display().to_string())
}

/// The simulated workload running `script`, logging its GPU activity to
/// [`activity_log`].
fn sim_workload(sb: &Sandbox, script: &str) -> Guard {
    Guard(
        Command::new(&sb.sim.workload)
            .arg(script)
            .env("SIM_GPU_ACTIVITY", activity_log(sb))
            .spawn()
            .expect("start workload"),
    )
}

/// `gpusleuth trace --quiet <args>` into the sandbox's database, against a
/// simulated NVML of one 80 GiB GPU (its scenario plus the `extra` lines)
/// and the workload's [`activity_log`], writing `go` once it is attached.
fn sim_nvml_trace(sb: &Sandbox, args: &[&str], go: &str, extra: &str) -> Command {
    let scenario = sb.path("scenario.txt");
    let device = format!("device SimGPU GPU-sim-0 {} 0\n", 80u64 << 30);
    std::fs::write(&scenario, device + extra).unwrap();
    let mut cmd = gpusleuth();
    cmd.args(["trace", "--quiet"])
        .args(args)
        .arg("--db")
        .arg(sb.db())
        .arg("--ready-file")
        .arg(go)
        .env("GPUSLEUTH_NVML_LIB", &support::fixtures().sim_nvml)
        .env("SIM_NVML_SCENARIO", scenario)
        .env("SIM_GPU_ACTIVITY", activity_log(sb));
    cmd
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn run(args: &[&str], db: &Path) -> Output {
    common::run_ok(gpusleuth().args(args).arg("--db").arg(db))
}

/// wall-clock ns − monotonic ns, measured by this test (not by the tool).
fn realtime_offset_ns() -> i128 {
    let read = common::clock_ns;
    let m0 = read(libc::CLOCK_MONOTONIC);
    let r = read(libc::CLOCK_REALTIME);
    let m1 = read(libc::CLOCK_MONOTONIC);
    r - (m0 + m1) / 2
}

/// The busy intervals the simulated driver logged, on the monotonic clock.
fn busy_intervals(activity: &Path, offset: i128) -> Vec<(u64, u64)> {
    std::fs::read_to_string(activity)
        .expect("activity file")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"busy")).then(|| {
                let us = |s: &str| s.parse::<i128>().expect("µs") * 1000 - offset;
                (us(f[2]) as u64, us(f[3]) as u64)
            })
        })
        .collect()
}

/// `GET /metrics` on `addr`.
fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read metrics");
    body
}

/// Calls MCP tools (no arguments) over stdio with plain JSON-RPC lines; each
/// tool's JSON answer.
fn mcp_calls(db: &Path, tools: &[&str]) -> Vec<Value> {
    let mut server = McpStdio::start(&["--db".as_ref(), db.as_os_str()], Duration::from_secs(60));
    tools
        .iter()
        .map(|t| {
            let reply = server.call(
                "tools/call",
                serde_json::json!({"name": t, "arguments": {}}),
            );
            let text = reply["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or_else(|| panic!("{t}: {reply}"));
            serde_json::from_str(text).expect("tool JSON")
        })
        .collect()
}

#[test]
fn attach_shows_memory_held_before_the_trace_and_gpu_busy_samples() {
    let Some(sb) = Sandbox::for_ebpf("attach") else {
        return;
    };
    let [pre, go, done, fin] = script_paths(&sb, ["pre", "go", "done", "fin"]);
    let [s0, s1] = script_paths(&sb, ["busy_start", "busy_end"]);
    let script = format!(
        "malloc {A} A; malloc {B} B; touch {pre}; await {go}; \
         free A; malloc {C} C; free C; malloc {D} D; \
         stamp {s0}; sync_sleep 400; stamp {s1}; touch {done}; \
         sync_sleep 3000; await {fin}"
    );
    let mut workload = sim_workload(&sb, &script);
    let pid = workload.id();
    wait_for_file(Path::new(&pre), 20);

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut tracer = Guard(
        sim_nvml_trace(
            &sb,
            &["--pid", &pid.to_string(), "--metrics", &addr],
            &go,
            "sample_period_ms 100\n",
        )
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trace"),
    );
    wait_for_file(Path::new(&done), 30);
    // Past one sampler poll after the busy second: the gauges are set.
    std::thread::sleep(Duration::from_millis(1300));
    let metrics = scrape(&addr);
    // SAFETY: SIGINT to the tracer we started (Ctrl-C stops a --pid trace).
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let status = wait_child(&mut tracer, 30);
    let mut err = String::new();
    tracer.stderr.take().unwrap().read_to_string(&mut err).ok();
    assert!(status.success(), "trace failed: {err}");
    assert!(!err.contains("panicked"), "{err}");
    std::fs::write(&fin, b"").unwrap();
    assert!(wait_child(&mut workload, 30).success());

    // --- metrics, scraped while tracing
    let line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in:\n{metrics}"))
            .to_string()
    };
    assert!(line("gpusleuth_gpu_activity_measured").ends_with(" 1"));
    line("gpusleuth_gpu_busy_percent{gpu=\"0\"}");
    assert!(line(&format!(
        "gpusleuth_process_gpu_memory_before_trace_bytes{{pid=\"{pid}\""
    ))
    .ends_with(&format!(" {}", A + B)));
    assert!(line(&format!(
        "gpusleuth_process_gpu_memory_bytes{{pid=\"{pid}\""
    ))
    .ends_with(&format!(" {}", B + D)));

    // --- memory: the baseline from NVML and the in-trace changes, exactly
    let mem = json_of(&run(&["memory", "--json"], &sb.db()));
    let proc_ = mem["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in {mem}"));
    let held = &proc_["held"];
    assert_eq!(held["measured"], true, "{held}");
    assert_eq!(held["before_trace_bytes"], A + B, "{held}");
    assert_eq!(held["allocated_during_bytes"], C + D);
    assert_eq!(held["freed_during_bytes"], C);
    assert_eq!(held["pre_trace_frees"], 1, "free A hit pre-trace memory");
    assert_eq!(held["at_end_bytes"], B + D);
    assert_eq!(
        held["unexplained_change_bytes"],
        -(A as i64),
        "A's size, freed unseen"
    );
    assert_eq!(proc_["live_bytes"], D);
    assert_eq!(proc_["unmatched_frees"], 1);
    let text = String::from_utf8_lossy(&run(&["memory"], &sb.db()).stdout).into_owned();
    assert!(
        text.contains("held before tracing: 150.0 MiB (NVML)"),
        "{text}"
    );
    assert!(
        text.contains("during the trace: +50.0 MiB / -30.0 MiB"),
        "{text}"
    );
    assert!(
        text.contains("NVML at trace end: 70.0 MiB; 100.0 MiB less than the ledger explains"),
        "{text}"
    );
    assert!(
        text.contains("(allocations made during the trace): 20.0 MiB"),
        "{text}"
    );

    // --- attach edges are not drops; the open sync at the end is counted as an edge
    let stats = json_of(&run(&["stats", "--json"], &sb.db()));
    assert_eq!(stats["drops"]["total"], 0, "{}", stats["drops"]);
    assert_eq!(
        stats["attach_edges"]["call_open_at_end"], 2,
        "cudaStreamSynchronize and its cuStreamSynchronize were open: {}",
        stats["attach_edges"]
    );
    let explain = String::from_utf8_lossy(&run(&["explain"], &sb.db()).stdout).into_owned();
    assert!(!explain.contains("may be incomplete"), "{explain}");
    assert!(explain.contains("Attach edges, not losses"), "{explain}");
    assert!(
        explain.contains("held before tracing: 150.0 MiB (NVML)"),
        "{explain}"
    );
    assert!(explain.contains("GPU 0 busy"), "{explain}");

    // --- GPU busy samples: stored on the trace clock, right where the workload was busy
    let db = sb.open_db();
    let samples = db
        // Back on CLOCK_MONOTONIC (the file's clock plus its base) to
        // compare with the simulated driver's log.
        .ints("SELECT ts_ns + (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'clock_base_ns'), \
               period_ns, CAST(busy_pct AS INTEGER) FROM gpu_samples WHERE gpu = 0");
    assert!(samples.len() >= 10, "about one per 100 ms: {samples:?}");
    let busy = busy_intervals(&activity_log(&sb), realtime_offset_ns());
    assert_eq!(busy.len(), 2, "two scripted syncs");
    let margin = 5_000_000u64; // clock reading skew is µs; 5 ms is ample
    let (mut inside, mut outside) = (0, 0);
    for s in &samples {
        let (end, period, pct) = (s[0] as u64, s[1] as u64, s[2]);
        assert_eq!(period, PERIOD_NS, "{s:?}");
        let start = end - period;
        if busy
            .iter()
            .any(|&(b0, b1)| start >= b0 + margin && end + margin <= b1)
        {
            assert_eq!(
                pct, 100,
                "window ({start}, {end}] lies inside a busy interval {busy:?}"
            );
            inside += 1;
        } else if busy
            .iter()
            .all(|&(b0, b1)| end + margin <= b0 || start >= b1 + margin)
        {
            assert_eq!(
                pct, 0,
                "window ({start}, {end}] lies outside every busy interval {busy:?}"
            );
            outside += 1;
        }
    }
    assert!(
        inside >= 2 && outside >= 1,
        "inside {inside}, outside {outside}: {samples:?}"
    );
    // The stamps around the first sync bracket its busy interval (clock conversion agrees).
    let stamp = |f: &str| -> u64 { std::fs::read_to_string(f).unwrap().trim().parse().unwrap() };
    assert!(stamp(&s0) <= busy[0].0 + margin && busy[0].1 <= stamp(&s1) + margin);
    let phases = db.text_ints(&format!(
        "SELECT phase, used_bytes FROM process_gpu_samples WHERE pid = {pid} AND phase != 'sample' ORDER BY ts_ns"
    ));
    assert_eq!(
        phases,
        vec![
            ("start".to_string(), (A + B) as i64),
            ("end".to_string(), (B + D) as i64)
        ]
    );
    let sm = db.int(&format!(
        "SELECT count(*) FROM process_gpu_samples WHERE pid = {pid} AND sm_pct > 0"
    ));
    assert!(sm >= 1, "per-process SM use reported while the sync ran");

    // --- report: the GPU timeline and the baseline
    let html = sb.path("r.html");
    let out = gpusleuth()
        .args(["report", "--db"])
        .arg(sb.db())
        .arg("-o")
        .arg(&html)
        .output()
        .unwrap();
    assert!(out.status.success());
    let html = std::fs::read_to_string(&html).unwrap();
    assert!(html.contains("<h2>GPU activity</h2>"));
    assert!(html.contains("GPU 0 busy over time"), "the chart is drawn");
    assert!(html.contains("held before tracing: 150.0 MiB (NVML)"));

    // --- MCP
    let r = mcp_calls(&sb.db(), &["gpu_activity", "memory"]);
    assert_eq!(r[0]["summary"]["measured"], true);
    assert!(r[0]["samples_total"].as_u64().unwrap() >= 10);
    let held = r[1]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .map(|p| p["held"]["before_trace_bytes"].clone());
    assert_eq!(held, Some(Value::from(A + B)));
}

#[test]
fn a_trace_without_nvml_says_not_measured() {
    let Some(sb) = Sandbox::for_ebpf("nonvml") else {
        return;
    };
    let mut cmd = sb.trace_command(&[], "malloc 4096 X; sync_sleep 50; free X");
    cmd.env("GPUSLEUTH_NVML_LIB", sb.path("no-such-libnvidia-ml.so.1"));
    common::run_ok(&mut cmd);
    let db = sb.open_db();
    assert_eq!(db.int("SELECT count(*) FROM gpu_samples"), 0);
    let notes = db.rows("SELECT text FROM notes");
    assert!(
        format!("{notes:?}").contains("were not measured: NVML unavailable"),
        "{notes:?}"
    );
    let mem = String::from_utf8_lossy(&run(&["memory"], &sb.db()).stdout).into_owned();
    assert!(mem.contains("held before tracing: not measured"), "{mem}");
    let explain = String::from_utf8_lossy(&run(&["explain"], &sb.db()).stdout).into_owned();
    assert!(explain.contains("GPU busy: not measured"), "{explain}");
    let j = json_of(&run(&["memory", "--json"], &sb.db()));
    assert_eq!(j["gpu_activity"]["measured"], false);
}

#[test]
fn all_processes_mode_gets_the_same_baseline() {
    let Some(sb) = Sandbox::for_ebpf("attach-all") else {
        return;
    };
    let [pre, go, done, fin] = script_paths(&sb, ["pre", "go", "done", "fin"]);
    let script = format!(
        "malloc {A} X; touch {pre}; await {go}; free X; malloc {D} Y; touch {done}; await {fin}"
    );
    let mut workload = sim_workload(&sb, &script);
    let pid = workload.id();
    wait_for_file(Path::new(&pre), 20);
    let mut tracer = Guard(
        sim_nvml_trace(&sb, &[], &go, "")
            .stderr(Stdio::null())
            .spawn()
            .expect("start trace"),
    );
    wait_for_file(Path::new(&done), 30);
    // SAFETY: SIGINT to the tracer we started (it stops the all-processes mode).
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    assert!(wait_child(&mut tracer, 30).success());
    std::fs::write(&fin, b"").unwrap();
    assert!(wait_child(&mut workload, 30).success());
    let mem = json_of(&run(
        &["memory", "--json", "--pid", &pid.to_string()],
        &sb.db(),
    ));
    let held = &mem["processes"][0]["held"];
    assert_eq!(mem["processes"][0]["pid"], pid);
    assert_eq!(held["before_trace_bytes"], A, "{held}");
    assert_eq!(held["pre_trace_frees"], 1);
    assert_eq!(held["allocated_during_bytes"], D);
    assert_eq!(held["at_end_bytes"], D);
}

/// `trace --pid PID` into `db`, without NVML, touching `ready` once attached.
fn pid_tracer(sb: &Sandbox, pid: u32, db: &Path, ready: &str) -> Guard {
    Guard(
        gpusleuth()
            .args(["trace", "--quiet", "--pid", &pid.to_string()])
            .arg("--db")
            .arg(db)
            .arg("--ready-file")
            .arg(ready)
            .env("GPUSLEUTH_NVML_LIB", sb.path("no-nvml"))
            .stderr(Stdio::null())
            .spawn()
            .expect("start a tracer"),
    )
}

/// A call that began before its process was traced returns during the
/// trace: an attach edge, not a drop. To make the edge certain, a first
/// tracer (`--pid` of an idle bystander, the same library files probed)
/// has uretprobes on the workload's libraries when the workload enters a
/// sync that only returns once a second tracer, `trace --pid WORKLOAD`, is
/// attached: the return fires in the second tracer, whose entry never ran.
#[test]
fn a_return_whose_call_began_before_the_attach_is_an_edge_not_a_drop() {
    let Some(sb) = Sandbox::for_ebpf("edge") else {
        return;
    };
    let [a_ready, b_ready, done, fin] = script_paths(&sb, ["a_ready", "b_ready", "done", "fin"]);
    // The bystander only maps the libraries (one call), then waits.
    let mut bystander = Guard(
        Command::new(&sb.sim.workload)
            .arg(format!("malloc 512 X; await {fin}"))
            .spawn()
            .expect("start bystander"),
    );
    let mut first = pid_tracer(&sb, bystander.id(), &sb.path("first.db"), &a_ready);
    let mut workload = Guard(
        Command::new(&sb.sim.workload)
            .arg(format!(
                "await {a_ready}; sync_until {b_ready}; malloc 4096 Y; touch {done}; await {fin}"
            ))
            .spawn()
            .expect("start workload"),
    );
    let pid = workload.id();
    wait_for_file(Path::new(&a_ready), 30);
    // The workload is (or soon will be) inside its sync; give it time to enter.
    std::thread::sleep(Duration::from_millis(300));
    let mut second = pid_tracer(&sb, pid, &sb.db(), &b_ready);
    wait_for_file(Path::new(&done), 30);
    for t in [&mut second, &mut first] {
        // SAFETY: SIGINT to a tracer this test started.
        unsafe { libc::kill(t.id() as i32, libc::SIGINT) };
        assert!(wait_child(t, 30).success());
    }
    std::fs::write(&fin, b"").unwrap();
    assert!(wait_child(&mut workload, 30).success());
    assert!(wait_child(&mut bystander, 30).success());

    let stats = json_of(&run(&["stats", "--json"], &sb.db()));
    assert_eq!(
        stats["attach_edges"]["return_without_entry"], 2,
        "cudaStreamSynchronize and its cuStreamSynchronize began before the attach: {}",
        stats["attach_edges"]
    );
    assert_eq!(stats["drops"]["total"], 0, "{}", stats["drops"]);
    let count = |layer: &str, op: &str| common::stats_count(&stats, layer, op);
    assert_eq!(
        count("runtime", "cudaStreamSynchronize"),
        0,
        "its return is not recorded"
    );
    assert_eq!(count("runtime", "cudaMalloc"), 1, "the call after it is");
    let explain = String::from_utf8_lossy(&run(&["explain"], &sb.db()).stdout).into_owned();
    assert!(!explain.contains("may be incomplete"), "{explain}");
    assert!(
        explain.contains("2 call(s) began before tracing and returned during it"),
        "{explain}"
    );
}

/// A process killed inside a call: the call never returns, and its entry
/// stays in the kernel's in-flight map. It was counted as open when the
/// trace stopped (round 51's tester); its thread is gone, so it is a call
/// cut short by its thread's exit, and said so.
#[test]
fn a_call_cut_short_by_a_kill_is_not_open_at_the_end() {
    let Some(sb) = Sandbox::for_ebpf("killed-mid-call") else {
        return;
    };
    let [ready, never] = script_paths(&sb, ["ready", "never"]);
    let mut workload = Guard(
        Command::new(&sb.sim.workload)
            .arg(format!("malloc 512 X; await {ready}; sync_until {never}"))
            .spawn()
            .expect("start workload"),
    );
    let mut tracer = pid_tracer(&sb, workload.id(), &sb.db(), &ready);
    wait_for_file(Path::new(&ready), 30);
    // Inside its sync (runtime and driver) well before this.
    std::thread::sleep(Duration::from_millis(500));
    workload.kill().unwrap();
    let _ = workload.wait();
    // The traced process is gone: the tracer ends by itself.
    assert!(wait_child(&mut tracer, 30).success());
    let stats = json_of(&run(&["stats", "--json"], &sb.db()));
    let edges = &stats["attach_edges"];
    assert_eq!(edges["call_cut_by_exit"], 2, "{edges}");
    assert_eq!(edges["call_open_at_end"], 0, "{edges}");
    assert_eq!(stats["drops"]["total"], 0, "{}", stats["drops"]);
    let explain = String::from_utf8_lossy(&run(&["explain"], &sb.db()).stdout).into_owned();
    assert!(
        explain.contains("2 call(s) never returned: their thread exited mid-call"),
        "{explain}"
    );
    assert!(!explain.contains("still in progress"), "{explain}");
}
