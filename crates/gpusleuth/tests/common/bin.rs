//! The gpusleuth binary under test with the standard streams its caller
//! reads: included through `#[path]` by the tests (and the MCP stdio client)
//! that do not take all of `common/mod.rs`.

use std::process::{Command, Stdio};

/// `gpusleuth`, its stdin, stdout and stderr set as given.
pub fn gpusleuth_with(stdin: Stdio, stdout: Stdio, stderr: Stdio) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpusleuth"));
    c.stdin(stdin).stdout(stdout).stderr(stderr);
    c
}
