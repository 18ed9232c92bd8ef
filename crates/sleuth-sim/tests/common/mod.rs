//! A per-test scratch folder, removed when the test ends.

use std::path::PathBuf;

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
