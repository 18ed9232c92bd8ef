//! `reclaim_plan` executing for real through the official Python MCP client:
//! `gpusleuth mcp --allow-reclaim` over stdio, against the simulated
//! libnvidia-ml.so.1 and real holder processes of tests/vram_reclaim.rs. The
//! scene: a crashed CUDA parent (dead, still listed by NVML) whose forked
//! worker keeps its memory, and a bystander holder that must survive. The
//! client script is tests/mcp/reclaim_test.py at the repository root.
//!
//! Skips with a printed reason when python3 or the `mcp` package is missing,
//! except under CI=true, where it fails.

mod mcp_common;
#[path = "../../sleuth-gpu/tests/support/mod.rs"]
mod support;

use mcp_common::{assert_client_passed, client_ready, repo_root, run_client};
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{alive, fixtures, Scene};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const BASE_BYTES: u64 = 500 * MIB;
const BYSTANDER_BYTES: u64 = GIB;
const DEAD_BYTES: u64 = 2 * GIB;

/// The crash: parent and worker share the device files, NVML lists the
/// parent's context with both as holders; the parent is SIGKILLed and reaped.
struct World {
    scene: Scene,
    dead: u32,
    worker: u32,
    bystander: u32,
}

fn world() -> World {
    let mut scene = Scene::new("mcp-reclaim");
    let devs = scene.devices();
    let bystander = scene.spawn("hold", &devs)[0];
    let pw = scene.spawn("fork-worker", &devs);
    let (dead, worker) = (pw[0], pw[1]);
    scene.write_scenario(&format!(
        "driver 580.0-sim\n\
         device Sim-H200 GPU-sim-0 {total} {BASE_BYTES}\n\
         compute 0 {bystander} {BYSTANDER_BYTES}\n\
         compute 0 {dead} {DEAD_BYTES} {dead} {worker}\n",
        total = 140 * GIB,
    ));
    scene.kill_and_reap(dead);
    assert!(alive(worker) && alive(bystander), "scene set up");
    World {
        scene,
        dead,
        worker,
        bystander,
    }
}

/// Pids of processes (other than this one) whose environment names this
/// scene's scenario file: only an MCP server started for this test has it.
fn servers_of(scenario: &Path) -> Vec<u32> {
    let needle = format!("SIM_NVML_SCENARIO={}", scenario.display());
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && alive(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|kv| kv == needle.as_bytes()))
        })
        .collect()
}

/// Waits (bounded) for the servers of this scene to exit; SIGKILLs and
/// returns those that did not.
fn end_leftover_servers(scenario: &Path) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = servers_of(scenario);
        if left.is_empty() {
            return left;
        }
        if Instant::now() >= deadline {
            for &pid in &left {
                // SAFETY: plain kill(2) on a pid whose environment names this test's own scenario file.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn python_mcp_client_reclaims_the_orphaned_worker() {
    if !client_ready("the MCP reclaim test") {
        return;
    }
    let w = world();
    let truth = json!({
        "dead": w.dead, "worker": w.worker, "bystander": w.bystander,
        "base_bytes": BASE_BYTES, "bystander_bytes": BYSTANDER_BYTES, "dead_bytes": DEAD_BYTES,
        // The SDK starts the server with a trimmed environment plus exactly these.
        "env": {
            "GPUSLEUTH_NVML_LIB": fixtures().sim_nvml,
            "SIM_NVML_SCENARIO": w.scene.scenario,
            "GPUSLEUTH_DEV_PREFIX": w.scene.dev_prefix,
        },
    });
    let truth_path = w.scene.dir.join("truth.json");
    std::fs::write(&truth_path, truth.to_string()).expect("truth file");

    let (out, stdout) = run_client(
        Command::new("python3")
            .arg(repo_root().join("tests/mcp/reclaim_test.py"))
            .arg("--bin")
            .arg(env!("CARGO_BIN_EXE_gpusleuth"))
            .arg("--truth")
            .arg(&truth_path),
    );

    // The client closes the server when it leaves; a leftover one is a bug,
    // ended here before failing so the test leaves nothing running.
    let leftover = end_leftover_servers(&w.scene.scenario);
    assert!(
        leftover.is_empty(),
        "MCP server(s) {leftover:?} outlived the client"
    );

    assert_client_passed(&out, &stdout, "python MCP reclaim checks");
    // Ground truth from this side too: the worker is gone, the bystander is not.
    assert!(!alive(w.worker), "worker {} was ended", w.worker);
    assert!(alive(w.bystander), "bystander {} survived", w.bystander);
}
