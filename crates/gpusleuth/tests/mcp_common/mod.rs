//! What the real-MCP-client tests share: where the Python client scripts
//! live and whether the official `mcp` package can run here.
#![allow(dead_code)] // each test file uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "../common/bin.rs"]
mod bin;
#[allow(unused_imports)] // only the tests that start the server themselves use it
pub use bin::test_cache_dir;
#[path = "../common/skip.rs"]
mod skip;
use skip::skip_unless_ci;

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

/// Whether the client can run here. When it cannot, the test is recorded as
/// skipped, or fails under CI=true (see `skip_unless_ci`).
pub fn client_ready(test: &str) -> bool {
    let Some(why) = client_missing() else {
        return true;
    };
    skip_unless_ci(test, &why);
    false
}

/// Runs a Python client script to its end and echoes what it printed, so a
/// failing test shows the client's own account. Returns its output and stdout.
pub fn run_client(cmd: &mut Command) -> (Output, String) {
    let out = cmd.output().expect("run the python client");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    (out, stdout)
}

/// The client's checks passed: it exited 0 and printed its last line (a
/// client that stopped early without an error would not have).
pub fn assert_client_passed(out: &Output, stdout: &str, checks: &str) {
    assert!(out.status.success(), "{checks} failed ({})", out.status);
    assert!(
        stdout.contains("ALL CHECKS PASSED"),
        "client did not report completion"
    );
}
