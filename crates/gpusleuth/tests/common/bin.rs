//! The gpusleuth binary under test with the standard streams its caller
//! reads: included through `#[path]` by the tests (and the MCP stdio client)
//! that do not take all of `common/mod.rs`.

use std::process::{Command, Stdio};

/// `gpusleuth`, its stdin, stdout and stderr set as given.
pub fn gpusleuth_with(stdin: Stdio, stdout: Stdio, stderr: Stdio) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpusleuth"));
    c.stdin(stdin).stdout(stdout).stderr(stderr);
    c.env("GPUSLEUTH_CACHE_DIR", test_cache_dir());
    c
}

/// The checks cache of this test process's runs (not the user's own: the
/// runs share it, so the tests exercise it), in cargo's scratch folder
/// for integration tests (`target/tmp`): a test run leaves nothing in the
/// system's temporary folder.
pub fn test_cache_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gpusleuth-test-cache-{}", std::process::id()))
}
