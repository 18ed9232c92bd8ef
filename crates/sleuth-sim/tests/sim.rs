//! The simulated CUDA world behaves as documented (no root needed): exact
//! counts per layer, the allocator rule, failures, scripted durations,
//! children, the dlopen'd copy, the hog's name, the versioned symbols.

mod common;

use common::{run_in_world, sim_world, wait_for, TempDir};
use sleuth_sim::{device_ptrs, materialize, parse_truth, DEVICE_BASE};
use std::process::Command;
use std::time::{Duration, Instant};

fn count(m: &std::collections::BTreeMap<String, u64>, k: &str) -> u64 {
    m.get(k).copied().unwrap_or(0)
}

#[test]
fn counts_pointers_and_failures_follow_the_script() {
    let (code, truth) = run_in_world(
        "counts",
        "malloc 4096 a; malloc 1000 b; free a; launch 7; cu_launch 2; launch_ex 3; \
         malloc 1e15; memcpy 10 d2h; memcpy_async 10 h2h; sync_device; vmm 100; exit 5",
        &[],
    );
    assert_eq!(code, 5);
    assert_eq!(truth.len(), 1);
    let t = &truth[0];
    assert_eq!(count(&t.runtime, "cudaMalloc"), 3);
    assert_eq!(count(&t.runtime, "cudaFree"), 1);
    assert_eq!(count(&t.runtime, "cudaLaunchKernel"), 7);
    assert_eq!(count(&t.driver, "cuMemAlloc_v2"), 3);
    assert_eq!(count(&t.driver, "cuMemFree_v2"), 1);
    assert_eq!(count(&t.driver, "cuLaunchKernel"), 9);
    assert_eq!(count(&t.driver, "cuLaunchKernelEx"), 3);
    assert_eq!(count(&t.driver, "cuMemcpyDtoH_v2"), 1);
    assert_eq!(count(&t.driver, "cuMemcpyAsync"), 1);
    assert_eq!(count(&t.driver, "cuCtxSynchronize"), 1);
    assert_eq!(count(&t.driver, "cuMemCreate"), 1);
    let expected = device_ptrs(&[4096, 1000, 100]);
    assert_eq!(expected[0], DEVICE_BASE);
    assert_eq!(expected[1], DEVICE_BASE + 4096);
    let got: Vec<_> = t
        .allocs
        .iter()
        .map(|a| (a.op.as_str(), a.size, a.ptr, a.ret))
        .collect();
    assert_eq!(got[0], ("cudaMalloc", 4096, expected[0], 0));
    assert_eq!(got[1], ("cudaMalloc", 1000, expected[1], 0));
    assert_eq!(got[2], ("cudaMalloc", 1_000_000_000_000_000, 0, 2));
    assert_eq!(got[4], ("cuMemCreate", 100, expected[2], 0));
}

#[test]
fn device_limit_comes_from_the_environment() {
    let (_, truth) = run_in_world(
        "limit",
        "malloc 600 a; malloc 600; free a; malloc 600",
        &[("SIM_DEVICE_BYTES", "1000")],
    );
    let rets: Vec<_> = truth[0].allocs.iter().map(|a| a.ret).collect();
    assert_eq!(rets, vec![0, 2, 0]);
    // Addresses are never reused: the third allocation follows the first.
    assert_eq!(truth[0].allocs[2].ptr, DEVICE_BASE + 1024);
}

#[test]
fn children_report_their_own_counts() {
    let (code, truth) = run_in_world(
        "children",
        "launch 2; fork { malloc 8; launch 1 }; spawn { repeat 3 { launch 1 } }",
        &[],
    );
    assert_eq!(code, 0);
    assert_eq!(truth.len(), 3);
    let parent = truth.last().unwrap();
    assert_eq!(count(&parent.runtime, "cudaLaunchKernel"), 2);
    for child in &truth[..2] {
        assert_eq!(child.ppid, parent.pid);
    }
    assert_eq!(count(&truth[0].runtime, "cudaMalloc"), 1);
    assert_eq!(count(&truth[0].runtime, "cudaLaunchKernel"), 1);
    assert_eq!(count(&truth[1].runtime, "cudaLaunchKernel"), 3);
    assert_eq!(count(&truth[1].driver, "cuLaunchKernel"), 3);
}

#[test]
fn scripted_durations_sleep_and_spin() {
    let (dir, sim) = sim_world("time");
    let t0 = Instant::now();
    common::run_script(&sim, &dir, "sync_sleep 100; spin 100", &[]);
    assert!(t0.elapsed() >= Duration::from_millis(200));
}

#[test]
fn dlopen_uses_the_copy() {
    let (dir, sim) = sim_world("dlopen");
    let copy = dir.0.join("elsewhere/libcudart.so.13");
    sleuth_sim::copy_runtime_to(&copy).unwrap();
    let maps = dir.0.join("maps");
    // The workload touches a file once the copy is loaded, then lingers.
    let script = format!(
        "malloc 1; dlopen {}; malloc 2; touch {}; sleep 300",
        copy.display(),
        maps.display()
    );
    let truth = dir.0.join("truth.jsonl");
    let mut child = Command::new(&sim.workload)
        .arg("--truth")
        .arg(&truth)
        .arg(&script)
        .spawn()
        .unwrap();
    wait_for(&maps);
    let text = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    assert!(
        text.contains(&copy.display().to_string()),
        "copy not mapped:\n{text}"
    );
    assert!(text.contains(&sim.libcudart.display().to_string()));
    assert!(child.wait().unwrap().success());
    let truth = parse_truth(&std::fs::read_to_string(&truth).unwrap()).unwrap();
    assert_eq!(count(&truth.last().unwrap().runtime, "cudaMalloc"), 2);
    assert_eq!(count(&truth.last().unwrap().driver, "cuMemAlloc_v2"), 2);
}

#[test]
fn libraries_on_ld_library_path_do_not_replace_the_stand_ins() {
    // A GPU machine's LD_LIBRARY_PATH often holds the real driver (NVIDIA's
    // containers: /usr/local/nvidia/lib64). The workload must still load
    // the stand-ins beside it: round 40's device found it loading the real
    // libcuda.so.1 (rpath written as DT_RUNPATH, searched after
    // LD_LIBRARY_PATH), `demo` failing and the bench timing failed launches.
    let (dir, sim) = sim_world("ldpath");
    let other = dir.0.join("other");
    std::fs::create_dir_all(&other).unwrap();
    for lib in [&sim.libcuda, &sim.libcudart] {
        std::fs::copy(lib, other.join(lib.file_name().unwrap())).unwrap();
    }
    let maps = dir.0.join("maps");
    let script = format!("launch 1; touch {}; sleep 300", maps.display());
    let mut child = Command::new(&sim.workload)
        .arg(&script)
        .env("LD_LIBRARY_PATH", &other)
        .spawn()
        .unwrap();
    wait_for(&maps);
    let text = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    assert!(child.wait().unwrap().success());
    for lib in [&sim.libcuda, &sim.libcudart] {
        assert!(
            text.contains(&lib.display().to_string()),
            "{} not mapped:\n{text}",
            lib.display()
        );
    }
    assert!(
        !text.contains(&other.display().to_string()),
        "a library from LD_LIBRARY_PATH was loaded:\n{text}"
    );
}

#[test]
fn hog_names_itself_and_signals_ready() {
    let (dir, sim) = sim_world("hog");
    let ready = dir.0.join("ready");
    let mut hog = Command::new(&sim.hog)
        .arg("0")
        .arg("2000")
        .arg(&ready)
        .spawn()
        .unwrap();
    wait_for(&ready);
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", hog.id())).unwrap();
    hog.kill().unwrap();
    hog.wait().unwrap();
    assert_eq!(comm.trim(), sleuth_sim::HOG_COMM);
}

#[test]
fn runtime_symbols_are_versioned_like_the_real_one() {
    let (_dir, sim) = sim_world("nm");
    let out = match Command::new("nm").arg("-D").arg(&sim.libcudart).output() {
        Ok(o) => o,
        Err(e) => {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "nm missing in CI: {e}"
            );
            common::skipped(&format!("nm not available: {e}"));
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    for sym in [
        "cudaMalloc",
        "cudaLaunchKernel",
        "cudaStreamSynchronize",
        "cudaSetDevice",
    ] {
        assert!(
            text.contains(&format!(" T {sym}@@libcudart.so.13")),
            "{sym} not versioned:\n{text}"
        );
    }
    assert!(
        !text.contains("simSetNextDurationNs"),
        "runtime must not export sim controls"
    );
}

#[test]
fn bad_scripts_fail_with_a_message() {
    let (_dir, sim) = sim_world("bad");
    let out = Command::new(&sim.workload)
        .arg("frobnicate 3")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(120));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown step 'frobnicate'"));
}

#[test]
fn materialize_makes_new_inodes() {
    use std::os::unix::fs::MetadataExt;
    let dir = TempDir::new("inode");
    let a = materialize(&dir.0).unwrap();
    let ino = std::fs::metadata(&a.libcudart).unwrap().ino();
    let keep = dir.0.join("keep");
    std::fs::hard_link(&a.libcudart, &keep).unwrap(); // keep the old inode alive
    let b = materialize(&dir.0).unwrap();
    assert_ne!(std::fs::metadata(&b.libcudart).unwrap().ino(), ino);
}
