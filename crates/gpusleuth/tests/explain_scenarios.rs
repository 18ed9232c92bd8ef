//! `explain` and `memory` end to end on the simulated CUDA world (real eBPF):
//! the scenarios issue 4 names, ground truth from the scripts.

mod common;

use common::Sandbox;
use serde_json::Value;

fn explain_json(sb: &Sandbox) -> Vec<Value> {
    common::explain_json(&sb.db())["findings"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn kinds(f: &[Value]) -> Vec<&str> {
    f.iter().filter_map(|x| x["kind"].as_str()).collect()
}

/// Traces `script` while no other test of this binary traces: on a 2-CPU
/// machine the tests' workloads and tracers would otherwise take the CPU
/// from each other, which is real `cpu_preemption`.
fn traced(tag: &str, script: &str) -> Option<Sandbox> {
    let _alone = common::serial();
    Sandbox::traced(tag, script)
}

#[test]
fn a_clean_run_has_zero_findings() {
    let Some(sb) = traced("clean", "malloc 4096 a; launch 10; memcpy 4096; free a") else {
        return;
    };
    let f = explain_json(&sb);
    // Processes outside the test (this machine is shared) may still take the
    // CPU from the workload: that is real cpu_preemption, allowed only with
    // its culprits named and neither the workload nor the tracer among them
    // (as in verdicts.rs). Nothing else may be reported.
    let pid = sb.truth()[0].pid;
    for x in &f {
        assert_eq!(x["kind"], "cpu_preemption", "false finding: {x}");
        let culprits = x["culprits"].as_array().expect("culprits");
        assert!(!culprits.is_empty(), "preemption without a culprit: {x}");
        for c in culprits {
            assert_ne!(c["pid"], pid, "the workload blamed itself: {x}");
            let comm = c["comm"].as_str().unwrap_or("");
            assert!(!comm.starts_with("gpusleuth"), "the tracer was blamed: {x}");
        }
    }
    let out = common::gpusleuth()
        .args(["explain", "--db"])
        .arg(sb.db())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.contains("No abnormal behaviour found"),
        f.is_empty(),
        "{text}"
    );
}

#[test]
fn an_emptied_and_refilled_cache_is_churn() {
    // 30 × (allocate 1 MiB, free it): 29 re-allocations of the same size,
    // each free waiting 2 ms for the device as a real cudaFree does. Churn
    // must cost CHURN_MIN_SHARE of the trace (round 56): with instant frees
    // this one cost about that and came and went run to run.
    let Some(sb) = traced("churn", "repeat 30 { malloc 1048576 a; free a 2 }") else {
        return;
    };
    let f = explain_json(&sb);
    let churn: Vec<&Value> = f
        .iter()
        .filter(|x| x["kind"] == "allocation_churn")
        .collect();
    assert_eq!(churn.len(), 1, "{:?}", kinds(&f));
    assert_eq!(
        churn[0]["evidence"]["reallocs"], 29,
        "{}",
        churn[0]["evidence"]
    );
    // Nothing leaked, nothing failed.
    assert!(!kinds(&f).contains(&"memory_growth"), "{:?}", kinds(&f));
    assert!(
        !kinds(&f).contains(&"allocation_failure"),
        "{:?}",
        kinds(&f)
    );
}

#[test]
fn leak_and_failure_with_the_ledger_exact_to_the_byte() {
    // Live at the end: 1 MiB + 3000 B (the ledger counts the bytes asked for); one failed
    // 1e15-byte request while 1 MiB + 3000 B + 512 B were live.
    let Some(sb) = traced(
        "leak",
        "malloc 1048576 a; malloc 3000 b; malloc 512 c; malloc 1e15; free c",
    ) else {
        return;
    };
    let m = common::command_json("memory", &sb.db());
    let p = &m["processes"][0];
    assert_eq!(p["live_bytes"], 1048576 + 3000);
    assert_eq!(p["peak_bytes"], 1048576 + 3000 + 512);
    let unfreed = p["unfreed"].as_array().unwrap();
    assert_eq!(unfreed.len(), 2);
    let failed = p["failed_allocs"].as_array().unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["bytes"], 1_000_000_000_000_000u64);
    assert_eq!(failed[0]["error"], 2);
    assert_eq!(failed[0]["live_bytes_at"], 1048576 + 3000 + 512);
    let f = explain_json(&sb);
    assert!(kinds(&f).contains(&"allocation_failure"), "{:?}", kinds(&f));
    // Held once until exit is not a leak: the driver frees it with the context.
    assert!(!kinds(&f).contains(&"memory_growth"), "{:?}", kinds(&f));
}

#[test]
fn a_leak_in_a_loop_is_memory_growth() {
    // Every step allocates 64 KiB it never frees, and a 1 MiB scratch buffer it does.
    let Some(sb) = traced("growth", "malloc 1048576 w; repeat 8 { malloc 65536; malloc 1048576 s; sync_sleep 20; free s }; free w") else {
        return;
    };
    let f = explain_json(&sb);
    let g: Vec<&Value> = f.iter().filter(|x| x["kind"] == "memory_growth").collect();
    assert_eq!(g.len(), 1, "{:?}", kinds(&f));
    assert_eq!(g[0]["evidence"]["growing_allocations"], 8);
    assert_eq!(g[0]["evidence"]["growing_bytes"], 8 * 65536);
    assert_eq!(g[0]["evidence"]["groups"][0]["bytes"], 65536);
    assert_eq!(g[0]["op"], "cudaMalloc");
}

/// The memory_growth findings of `explain --db DB ARGS --json`.
fn growth_in(sb: &Sandbox, args: &[&str]) -> Vec<Value> {
    let out = common::run_ok(
        common::gpusleuth()
            .args(["explain", "--json", "--db"])
            .arg(sb.db())
            .args(args),
    );
    let e: Value = serde_json::from_slice(&out.stdout).unwrap();
    e["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "memory_growth")
        .cloned()
        .collect()
}

/// Round 60's tester: six 1-MiB buffers kept in rotation (each freed 300
/// ms after it is made, live memory flat at 6 MiB) read `memory_growth` in
/// a 500-ms window ("never freed"): the window's ledger starts empty, so
/// what it allocates and frees after it ends is unfreed there, and its
/// frees of older buffers match nothing. A window's growth now needs the
/// process's live bytes to rise over it; a real leak in a window is
/// still found.
#[test]
fn buffers_in_rotation_are_no_growth_in_a_window_and_a_leak_is() {
    let step: String = (0..6)
        .map(|i| format!("free b{i}; malloc 1048576 b{i}; launch 1; sync_sleep 50; "))
        .collect();
    let first: String = (0..6).map(|i| format!("malloc 1048576 b{i}; ")).collect();
    let script = format!("{first}repeat 6 {{ {step}}}");
    let Some(sb) = traced("rotation", &script) else {
        return;
    };
    for window in [
        &["--from", "1s", "--to", "1.5s"][..],
        &["--last", "500ms"][..],
    ] {
        let g = growth_in(&sb, window);
        assert!(g.is_empty(), "{window:?}: {g:?}");
    }
    assert!(growth_in(&sb, &[]).is_empty(), "the whole trace");
    // The same over a run's files (`--last` of its directory).
    let run = {
        let _alone = common::serial();
        Sandbox::traced_with("rotation-run", &["--rotate", "300ms"], &script)
    };
    let Some(run) = run else {
        return;
    };
    let g = growth_in(&run, &["--last", "500ms"]);
    assert!(g.is_empty(), "a run's --last 500ms: {g:?}");
    // A window inside the run's newest file, read from it alone: checked
    // against the run's ledger (the file's own did not know the buffers
    // its frees gave back; round 60's second tester).
    let g = growth_in(&run, &["--last", "250ms"]);
    assert!(g.is_empty(), "a run's --last 250ms: {g:?}");
    // A leak: 1 MiB a step never freed, a window over its later steps.
    let Some(leak) = traced(
        "window-leak",
        "repeat 12 { malloc 1048576 a; launch 1; sync_sleep 50 }",
    ) else {
        return;
    };
    let g = growth_in(&leak, &["--last", "400ms"]);
    assert_eq!(g.len(), 1, "{g:?}");
    let ev = &g[0]["evidence"];
    let rise = ev["live_bytes_at_window_end"].as_u64().unwrap()
        - ev["live_bytes_before_growth"].as_u64().unwrap();
    assert!(rise >= 6 << 20, "{ev}");
}

#[test]
fn memory_is_split_per_device_by_cuda_set_device() {
    let Some(sb) = Sandbox::for_ebpf("devices") else {
        return;
    };
    // Two simulated GPUs. Device 1 keeps 1 MiB (a second one freed again: peak
    // 2 MiB), device 0 keeps 4096 B; cudaSetDevice(7) fails, so the 256 B go to device 1.
    common::run_ok(
        sb.trace_command(
            &[],
            "malloc 4096 a; set_device 1; malloc 1048576 b; malloc 1048576 c; free c; \
             set_device 7; malloc 256 e; free e; set_device 0; malloc 512 d; free d",
        )
        .env("SIM_DEVICE_COUNT", "2"),
    );
    let m = common::command_json("memory", &sb.db());
    let devs = m["processes"][0]["devices"].as_array().unwrap().clone();
    assert_eq!(devs.len(), 2, "{devs:?}");
    assert_eq!(
        (
            devs[0]["device"].as_u64(),
            devs[0]["live_bytes"].as_u64(),
            devs[0]["peak_bytes"].as_u64()
        ),
        (Some(0), Some(4096), Some(4096 + 512))
    );
    assert_eq!(
        (
            devs[1]["device"].as_u64(),
            devs[1]["live_bytes"].as_u64(),
            devs[1]["peak_bytes"].as_u64()
        ),
        (Some(1), Some(1048576), Some(2 * 1048576))
    );
    let text = common::gpusleuth()
        .args(["memory", "--db"])
        .arg(sb.db())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("GPU 1: live 1.0 MiB, peak 2.0 MiB"), "{text}");
}
