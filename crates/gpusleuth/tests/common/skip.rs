//! One way for a test to say it did not run. `cargo test` hides what a
//! passing test prints, so a skip is also appended to the file named by
//! `GPUSLEUTH_SKIP_LOG`; `scripts/test.sh` (the README's test command) sets
//! it and lists every skip at the end of the run. Shared by every test crate
//! through `#[path]`.

/// Records that the running test did not run, and why. The caller returns
/// right after. The test's name is its thread's (libtest names test threads
/// after their test).
pub fn skipped(reason: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(log) = std::env::var_os("GPUSLEUTH_SKIP_LOG") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log)
        {
            // One line per skip; short appends to a file opened with
            // O_APPEND do not interleave between test processes.
            let _ = writeln!(f, "{} {test}: {reason}", env!("CARGO_CRATE_NAME"));
        }
    }
}

/// The running test cannot run here, because of `reason`. Under `CI=true`
/// that fails it (a skip there would hide a check CI is meant to make;
/// `what` names the test in the failure); elsewhere it is recorded as
/// skipped. The caller returns right after.
pub fn skip_unless_ci(what: &str, reason: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{what} must run in CI but cannot: {reason}"
    );
    skipped(reason);
}
