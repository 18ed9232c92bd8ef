//! A per-test scratch folder, removed when the test ends, and a scripted
//! workload run that returns its ground truth.

use sleuth_sim::{materialize, parse_truth, SimPaths, Truth};
use std::process::Command;

#[path = "../../../gpusleuth/tests/common/skip.rs"]
#[allow(dead_code)] // only some test files skip
mod skip;
#[allow(unused_imports)] // only some test files skip
pub use skip::skipped;

#[path = "../../../gpusleuth/tests/common/temp_dir.rs"]
#[allow(dead_code)] // not every test file joins paths
mod temp_dir;
pub use temp_dir::TempDir;

/// A scratch folder holding a fresh copy of the simulated CUDA world.
pub fn sim_world(tag: &str) -> (TempDir, SimPaths) {
    let dir = TempDir::new(tag);
    let sim = materialize(&dir.0).unwrap();
    (dir, sim)
}

/// Runs the simulated workload on `script` (with `env`) in `dir`; returns its
/// exit code and the truth it wrote. Anything on stderr fails the test.
pub fn run_script(
    sim: &SimPaths,
    dir: &TempDir,
    script: &str,
    env: &[(&str, &str)],
) -> (i32, Vec<Truth>) {
    let truth = dir.0.join("truth.jsonl");
    let _ = std::fs::remove_file(&truth);
    let out = Command::new(&sim.workload)
        .arg("--truth")
        .arg(&truth)
        .arg(script)
        .envs(env.iter().copied())
        .output()
        .expect("run workload");
    assert!(
        out.stderr.is_empty(),
        "workload stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&truth).expect("truth file");
    (
        out.status.code().unwrap_or(-1),
        parse_truth(&text).expect("parse truth"),
    )
}

/// [`run_script`] in a fresh [`sim_world`] of its own.
#[allow(dead_code)] // not every test file uses it
pub fn run_in_world(tag: &str, script: &str, env: &[(&str, &str)]) -> (i32, Vec<Truth>) {
    let (dir, sim) = sim_world(tag);
    run_script(&sim, &dir, script, env)
}

/// Waits until a helper process has created `path` (its ready signal); the
/// test harness's own timeout bounds a helper that never does.
#[allow(dead_code)] // not every test file uses it
pub fn wait_for(path: &std::path::Path) {
    while !path.exists() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
