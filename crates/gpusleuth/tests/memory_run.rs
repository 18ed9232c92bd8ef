//! `memory --db DIR` of a `trace --rotate` run written by hand: what its
//! times count from.

mod common;
#[path = "common/synthetic_run.rs"]
mod synthetic_run;
#[path = "common/temp_dir.rs"]
mod temp_dir;

use sleuth_core::Event;
use std::path::Path;

/// `memory --db DIR ARGS`'s text, which must succeed.
fn memory_text(run: &Path, args: &[&str]) -> String {
    let out = common::run_ok(
        common::gpusleuth()
            .args(["memory", "--db"])
            .arg(run)
            .args(args),
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Round 55's tester: `memory --db DIR` listed a 20 MiB cudaMalloc at
/// +3.709s, `memory --db DIR --pid P` at +3.000s under the same header
/// ("times since the earliest allocation the run's ledger holds"): with
/// `--pid` the origin was P's first allocation. Both count from the run
/// ledger's earliest allocation, here one made in a file `--keep` deleted.
#[test]
fn memory_of_one_process_of_a_run_counts_from_the_runs_earliest_allocation() {
    const EARLY: u32 = 5100;
    const LATE: u32 = 5200;
    let dir = temp_dir::TempDir::new("memory_run_origin");
    let run = dir.join("run");
    let ms = 1_000_000u64;
    synthetic_run::write_three_files(&run, |n| match n {
        1 => vec![Event::Call(synthetic_run::malloc(
            EARLY,
            110 * ms,
            1 << 20,
            0xa000,
        ))],
        2 => vec![Event::Call(synthetic_run::malloc(
            LATE,
            210 * ms,
            20 << 20,
            0xb000,
        ))],
        _ => vec![],
    });
    std::fs::remove_file(run.join(sleuth_store::run::part_name(1))).unwrap();
    let whole = memory_text(&run, &[]);
    let one = memory_text(&run, &["--pid", &LATE.to_string()]);
    let header = |t: &str| t.lines().next().unwrap_or_default().to_string();
    assert!(
        header(&whole).contains("times since the earliest allocation the run's ledger holds"),
        "{whole}"
    );
    assert_eq!(header(&one), header(&whole), "{one}");
    // LATE's allocation, 100 ms after EARLY's.
    let line = |t: &str| {
        t.lines()
            .find(|l| l.contains("0xb000"))
            .map(str::split_whitespace)
            .and_then(|w| w.last())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(line(&whole), "+100.00ms", "{whole}");
    assert_eq!(line(&one), "+100.00ms", "{one}");
}
