//! A fresh empty folder under the system temp dir, removed on drop. Shared by
//! the library crates' tests through `#[path]`; the folder is named after the
//! crate that includes this file, the test's tag, the process and a counter,
//! so parallel tests never share one.

use std::path::PathBuf;

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!(
            "{}-{tag}-{}-{n}",
            env!("CARGO_PKG_NAME"),
            std::process::id()
        );
        let p = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
