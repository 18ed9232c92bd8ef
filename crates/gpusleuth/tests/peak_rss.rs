//! `bench`'s per-command peak RSS: a command asked for it (GPUSLEUTH_PEAK_RSS_FILE)
//! reports its own, not the resident set of the process that spawned it.

use std::process::Command;

#[test]
fn a_command_reports_its_own_peak_not_its_parents() {
    // Make this (parent) process hold 256 MiB, touched, before spawning:
    // the kernel's ru_maxrss of the child would start from it.
    let ballast: Vec<u8> = vec![1u8; 256 << 20];
    let touched: u64 = ballast.iter().step_by(4096).map(|&b| u64::from(b)).sum();
    assert_eq!(touched, (256u64 << 20) / 4096);

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let db = root.join("examples/demo-sim.db");
    let out = std::env::temp_dir().join(format!("gs-peak-rss-test-{}", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let status = Command::new(env!("CARGO_BIN_EXE_gpusleuth"))
        .args(["stats", "--json", "--db"])
        .arg(&db)
        .env("GPUSLEUTH_PEAK_RSS_FILE", &out)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&out).expect("the command wrote its peak RSS");
    let _ = std::fs::remove_file(&out);
    let kb: u64 = text.trim().parse().expect("a number of kB");
    assert!(kb > 1000, "{kb} kB: implausibly small");
    assert!(
        kb < 128 * 1024,
        "{kb} kB: the parent's 256 MiB leaked into the figure"
    );
    drop(ballast);
}
