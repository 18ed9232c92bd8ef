//! `bench --analysis-only` times every analysis command on the synthetic
//! trace, moments and windows early and late in it included (each replays
//! from the file's start, so a late one is what grows with the file), and
//! each of those on a file whose checks a first read paid.

use std::process::Command;

#[test]
fn the_analysis_bench_times_moments_and_windows_early_and_late() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpusleuth"))
        .args([
            "bench",
            "--analysis-only",
            "--analysis-calls",
            "6400",
            "--analysis-allocator",
        ])
        .output()
        .expect("run bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "stats ",
        "explain ",
        "memory ",
        "report ",
        "export ",
        "memory --at, first read ",
        "memory --at 6% ",
        "memory --at 92% ",
        "explain 6-8% ",
        "explain 90-92% ",
        "report 90-92% ",
        "stats 90-92% ",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(row))
            .unwrap_or_else(|| panic!("no {row:?} row: {stdout}"));
        assert!(
            line.contains(" ms wall ") && line.ends_with(" MB peak RSS"),
            "{line}"
        );
    }
}
