//! `explain --db DIR` over a `trace --rotate` run end to end (real eBPF,
//! simulated CUDA): the run is explained as one trace. Memory allocated in
//! one file and freed in a later one is matched; a healthy run says
//! nothing; a run with real findings gives what one unrotated trace of the
//! same workload gives; `--pid` and a run still being written.
//!
//! These machines are shared: other processes may take the CPU from the
//! workload. That is real `cpu_preemption` (verdicts.rs), so the checks
//! judge the other kinds.

mod common;

use common::Sandbox;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// A new file every 300 ms: the workloads below last 0.7 to 2 s.
const ROTATE: [&str; 2] = ["--rotate", "300ms"];

/// `explain --db DB --json ARGS`, which must succeed.
fn explain(db: &Path, args: &[&str]) -> Value {
    let out = common::run_ok(
        common::gpusleuth()
            .args(["explain", "--json", "--db"])
            .arg(db)
            .args(args),
    );
    serde_json::from_slice(&out.stdout).expect("explain --json prints JSON")
}

/// How many findings of each kind, CPU contention from other processes aside.
fn kinds(v: &Value) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for f in v["findings"].as_array().expect("findings") {
        let k = f["kind"].as_str().expect("kind");
        if k != "cpu_preemption" {
            *out.entry(k.to_string()).or_default() += 1;
        }
    }
    out
}

/// [`kinds`] of the findings the script below makes on purpose: the memory
/// ones (exact counts). A loaded machine can slow other calls enough for a
/// tail of their own, differently in two runs. (Its one slow sync among 24
/// quick ones was a `tail_latency` until round 51: a sync blocked waiting
/// for the GPU is the GPU's work, never a finding.)
fn scripted_kinds(v: &Value) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for f in v["findings"].as_array().expect("findings") {
        let k = f["kind"].as_str().expect("kind");
        let scripted = match k {
            "allocation_failure" | "memory_growth" | "allocation_churn" => true,
            // Never one of the syncs, blocked on the GPU (round 51).
            "tail_latency" => f["op"] == "cudaStreamSynchronize",
            _ => false,
        };
        if scripted {
            *out.entry(k.to_string()).or_default() += 1;
        }
    }
    out
}

/// `explain --db DB ARGS`, which must fail with a one-line error: its stderr.
fn explain_refused(db: &Path, args: &[&str]) -> String {
    let out = common::gpusleuth()
        .args(["explain", "--db"])
        .arg(db)
        .args(args)
        .output()
        .expect("run explain");
    common::assert_no_panic(&out);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    err
}

fn finding<'a>(v: &'a Value, kind: &str) -> &'a Value {
    v["findings"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["kind"] == kind))
        .unwrap_or_else(|| panic!("no {kind}: {v}"))
}

/// The run's files, oldest first.
fn parts(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("run directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("part-") && n.ends_with(".db"))
        })
        .collect();
    v.sort();
    v
}

fn count_in(file: &Path, op: &str) -> u64 {
    common::stats_count(&common::stats_json(file), "runtime", op)
}

/// 12 buffers of 1 MiB made one every 60 ms (syncs in between: GPU-bound,
/// healthy), all freed at the end, then 12 of the same size made and freed
/// again: 12 re-allocations of freed memory (allocation_churn), nothing left.
/// Each free waits 5 ms for the device, as a real cudaFree does: churn must
/// cost CHURN_MIN_SHARE of the run to be a finding (round 56), and instant
/// frees cost next to nothing. All alike, so cudaFree has no tail.
fn late_free_script() -> String {
    let mut s = String::new();
    for i in 0..12 {
        s.push_str(&format!("malloc 1048576 a{i}; sync_sleep 60; "));
    }
    for i in 0..12 {
        s.push_str(&format!("free a{i} 5; "));
    }
    for i in 0..12 {
        s.push_str(&format!("malloc 1048576 b{i}; "));
    }
    let frees: Vec<String> = (0..12).map(|i| format!("free b{i} 5")).collect();
    s + &frees.join("; ")
}

#[test]
fn memory_freed_in_a_later_file_is_not_left_unfreed() {
    let Some(sb) = Sandbox::for_ebpf("rotx-late-free") else {
        return;
    };
    sb.trace(&ROTATE, &late_free_script(), 0);
    let files = parts(&sb.db());
    assert!(files.len() >= 3, "{files:?}");
    // The first file with allocations holds none of their frees, which come later.
    let first = files
        .iter()
        .position(|f| count_in(f, "cudaMalloc") > 0)
        .expect("a file with allocations");
    assert_eq!(count_in(&files[first], "cudaFree"), 0, "{files:?}");
    assert!(first + 1 < files.len(), "{files:?}");
    let v = explain(&sb.db(), &[]);
    // Each file alone would leave allocations unfreed (memory_growth) and
    // count unmatched frees (no churn): over the run, all are matched.
    assert_eq!(
        kinds(&v),
        BTreeMap::from([("allocation_churn".to_string(), 1)]),
        "{v}"
    );
    assert_eq!(finding(&v, "allocation_churn")["evidence"]["reallocs"], 12);
    assert!(
        v["notes"].as_array().is_some_and(|n| n
            .iter()
            .any(|n| n.as_str().unwrap_or("").contains("files of a run"))),
        "{v}"
    );
}

#[test]
fn a_healthy_rotated_run_has_zero_findings() {
    let Some(sb) = Sandbox::for_ebpf("rotx-clean") else {
        return;
    };
    sb.trace(
        &ROTATE,
        "malloc 4096 a; repeat 15 { launch 10; memcpy 4096; sync_sleep 80 }; free a",
        0,
    );
    assert!(parts(&sb.db()).len() >= 3);
    let v = explain(&sb.db(), &[]);
    assert!(kinds(&v).is_empty(), "{v}");
    let out = common::run_ok(common::gpusleuth().args(["explain", "--db"]).arg(sb.db()));
    let text = String::from_utf8_lossy(&out.stdout);
    if v["findings"].as_array().is_some_and(|f| f.is_empty()) {
        assert!(text.contains("No abnormal behaviour found"), "{text}");
    }
}

/// A leak every step, a cache emptied and refilled (each free waiting 2 ms
/// for the device, as a real cudaFree does: ~3% of the run, above
/// CHURN_MIN_SHARE), one slow sync (no tail: blocked on the GPU) among 24
/// quick ones, a failed allocation.
const FINDINGS_SCRIPT: &str = "malloc 1048576 w; \
     repeat 8 { malloc 65536; malloc 1048576 s; free s 2; sync_sleep 20 }; sync_sleep 300; \
     repeat 8 { malloc 65536; malloc 1048576 s; free s 2; sync_sleep 20 }; sync_sleep 300; \
     repeat 8 { malloc 65536; malloc 1048576 s; free s 2; sync_sleep 20 }; sync_sleep 300; \
     malloc 1e15; free w";

#[test]
fn a_rotated_run_finds_what_one_trace_finds_with_and_without_pid() {
    let Some(whole) = Sandbox::traced("rotx-whole", FINDINGS_SCRIPT) else {
        return;
    };
    let rotated = Sandbox::for_ebpf("rotx-run").expect("eBPF as above");
    rotated.trace(&ROTATE, FINDINGS_SCRIPT, 0);
    assert!(parts(&rotated.db()).len() >= 3);
    let (one, run) = (explain(&whole.db(), &[]), explain(&rotated.db(), &[]));
    let want = scripted_kinds(&one);
    for k in ["allocation_failure", "memory_growth", "allocation_churn"] {
        assert_eq!(want.get(k), Some(&1), "{k} in one trace: {one}");
    }
    assert_eq!(want.get("tail_latency"), None, "the slow sync: {one}");
    assert_eq!(scripted_kinds(&run), want, "run:\n{run}\none trace:\n{one}");
    for (kind, key) in [
        ("memory_growth", "growing_allocations"),
        ("allocation_churn", "reallocs"),
        ("allocation_failure", "failures"),
    ] {
        assert_eq!(
            finding(&run, kind)["evidence"][key],
            finding(&one, kind)["evidence"][key],
            "{kind}"
        );
    }

    // The same over the run's one process; a process it does not hold is one line.
    let pid = rotated.truth()[0].pid.to_string();
    assert_eq!(
        scripted_kinds(&explain(&rotated.db(), &["--pid", &pid])),
        want
    );
    let err = explain_refused(&rotated.db(), &["--pid", "4242424"]);
    assert!(
        err.contains(&format!(
            "no process 4242424 in this run (it holds pid {pid})"
        )),
        "{err}"
    );
    // Text and Markdown read the same run.
    for style in [None, Some("--markdown")] {
        let out = common::run_ok(
            common::gpusleuth()
                .args(["explain", "--db"])
                .arg(rotated.db())
                .args(style),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("memory_growth"), "{text}");
    }
}

#[test]
fn a_run_still_in_its_first_file_is_one_line_then_answers() {
    let Some(sb) = Sandbox::for_ebpf("rotx-writing") else {
        return;
    };
    let mut child = sb.spawn_trace(
        &["--rotate", "30s"],
        "launch 1; sync_sleep 2500; launch 1",
        None,
    );
    let run = |db: &Path| {
        let out = common::gpusleuth()
            .args(["explain", "--db"])
            .arg(db)
            .output()
            .expect("run explain");
        common::assert_no_panic(&out);
        out
    };
    // While the first file is written: refused in one line.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut last = String::new();
    while std::time::Instant::now() < deadline {
        let out = run(&sb.db());
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        if last.contains("no finished file in this run yet") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let status = child.wait().expect("trace ends");
    assert!(status.success(), "trace failed");
    assert!(last.contains("no finished file in this run yet"), "{last}");
    assert_eq!(last.trim().lines().count(), 1, "{last}");
    // Once the trace ended, its one file answers.
    assert!(run(&sb.db()).status.success());
}

#[test]
fn explain_of_a_directory_that_is_no_run_is_one_line() {
    let sb = Sandbox::new("rotx-no-run");
    let empty = sb.path("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let err = explain_refused(&empty, &[]);
    assert!(err.contains("not a trace run"), "{err}");
}
