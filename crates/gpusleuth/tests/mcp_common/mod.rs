//! What the real-MCP-client tests share: where the Python client scripts
//! live and whether the official `mcp` package can run here.
#![allow(dead_code)] // each test file uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../common/skip.rs"]
mod skip;
pub use skip::skipped;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Why the client cannot run here, if it cannot.
pub fn client_missing() -> Option<String> {
    match Command::new("python3").args(["-c", "import mcp"]).output() {
        Err(e) => Some(format!("python3 not runnable: {e}")),
        Ok(o) if !o.status.success() => Some(format!(
            "python package `mcp` missing (python3 -m pip install \"mcp>=1.9\"): {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )),
        Ok(_) => None,
    }
}
