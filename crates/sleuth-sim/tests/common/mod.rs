//! A per-test scratch folder, removed when the test ends, and a scripted
//! workload run that returns its ground truth.

use sleuth_sim::{materialize, parse_truth, SimPaths, Truth};
use std::path::PathBuf;
use std::process::Command;

#[path = "../../../gpusleuth/tests/common/skip.rs"]
#[allow(dead_code)] // only some test files skip
mod skip;
#[allow(unused_imports)] // only some test files skip
pub use skip::skipped;

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("sleuth-sim-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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
