//! `trace --precheck`: the tracer checks the files it finished as their
//! first reader would and saves what passed in the checks cache (real eBPF,
//! simulated CUDA). Observed as `checks_cache.rs` observes a run that paid
//! the checks: the cache holds an entry for the file's identity with every
//! check a first read pays (the check at open, the call-row pass, the
//! skipped-row counts), which a reader then skips
//! (`sleuth-store` `checked::tests::checks_saved_on_disk_are_not_run_again_by_a_later_run`).

mod common;

use common::{assert_no_panic, gpusleuth, run_ok, Sandbox};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

const SCRIPT: &str = "repeat 20 { malloc 4096 a; free a; memcpy 4096 }";

/// The checks cache of one sandbox: the tests' runs must not share one (two
/// runs saving at once may lose one's news, by design).
fn cache(sb: &Sandbox) -> PathBuf {
    sb.path("cache")
}

/// `Sandbox::trace` on the sandbox's own cache: exit 0, no panic.
fn trace(sb: &Sandbox, args: &[&str], script: &str) -> Output {
    let out = sb
        .trace_command(args, script)
        .env("GPUSLEUTH_CACHE_DIR", cache(sb))
        .output()
        .expect("run gpusleuth trace");
    assert_no_panic(&out);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every check a first read pays passed: nothing is left for the reader.
fn assert_every_check(entry: &Value) {
    let p = &entry["passed"];
    assert_eq!(p["whole"], true, "{entry}");
    assert!(
        p["call_scan"].is_object() && p["problems"].is_object(),
        "{entry}"
    );
}

#[test]
fn a_traced_file_is_read_without_checks_and_checked_again_once_changed() {
    let Some(sb) = Sandbox::for_ebpf("precheck") else {
        return;
    };
    let t = Instant::now();
    trace(&sb, &["--precheck", "0"], SCRIPT);
    assert!(
        t.elapsed() >= Duration::from_secs(2),
        "the check waited for the file to settle"
    );
    let db = sb.db();
    let entry = common::checks_entry_of(&cache(&sb), &db).expect("the tracer saved its checks");
    assert_every_check(&entry);
    // The first read answers as one that checks everything itself.
    let memory = |cache: &Path| {
        let out = run_ok(
            gpusleuth()
                .env("GPUSLEUTH_CACHE_DIR", cache)
                .args(["memory", "--json", "--db"])
                .arg(&db),
        );
        String::from_utf8(out.stdout).expect("utf8")
    };
    assert_eq!(memory(&cache(&sb)), memory(Path::new("")));

    // One byte of the calls table's root page, in place, same size: the
    // file is another identity, checked again, refused.
    common::damage_in_place(&db);
    assert!(common::checks_entry_of(&cache(&sb), &db).is_none());
    common::assert_refused_as_damaged(
        gpusleuth()
            .env("GPUSLEUTH_CACHE_DIR", cache(&sb))
            .args(["memory", "--json", "--db"])
            .arg(&db),
    );
}

/// `--precheck off`, a file under the threshold (the default 32M: every
/// test trace) and a cache turned off check nothing and save nothing.
#[test]
fn off_small_files_and_no_cache_check_nothing() {
    let Some(sb) = Sandbox::for_ebpf("precheck-off") else {
        return;
    };
    trace(&sb, &["--precheck", "off"], SCRIPT);
    assert!(
        common::checks_entry_of(&cache(&sb), &sb.db()).is_none(),
        "off"
    );
    std::fs::remove_file(sb.db()).expect("rm");
    let t = Instant::now();
    trace(&sb, &[], SCRIPT);
    assert!(
        common::checks_entry_of(&cache(&sb), &sb.db()).is_none(),
        "under the default threshold"
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "sanity: the run ended"
    );
    std::fs::remove_file(sb.db()).expect("rm");
    // No cache: nothing to save into, so nothing is checked or written.
    let home = sb.path("home");
    std::fs::create_dir_all(&home).expect("home");
    let out = sb
        .trace_command(&["--precheck", "0"], SCRIPT)
        .env("GPUSLEUTH_CACHE_DIR", "")
        .env("HOME", &home)
        .env_remove("XDG_CACHE_HOME")
        .output()
        .expect("trace");
    assert_no_panic(&out);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_dir(&home).expect("home").count(),
        0,
        "nothing written in HOME"
    );
}

/// The run's files, each checked as it was completed (the last at the end).
#[test]
fn a_rotated_runs_files_are_each_checked() {
    let Some(sb) = Sandbox::for_ebpf("precheck-rotate") else {
        return;
    };
    let script = "repeat 20 { malloc 4096 a; free a; memcpy 4096; sleep 80 }";
    let out = trace(&sb, &["--rotate", "300ms", "--precheck", "0"], script);
    let files: Vec<PathBuf> = std::fs::read_dir(sb.db())
        .expect("run directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "db"))
        .collect();
    assert!(files.len() >= 3, "{files:?}");
    for f in &files {
        let entry = common::checks_entry_of(&cache(&sb), f)
            .unwrap_or_else(|| panic!("{} not checked", f.display()));
        assert_every_check(&entry);
    }
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Under the default threshold (32M: every file here is smaller) a run's
/// rotated files are checked while the trace runs (its readers open all of
/// them); the last one is not, and the end waits for none.
#[test]
fn a_rotated_runs_small_files_are_checked_while_it_runs() {
    let Some(sb) = Sandbox::for_ebpf("precheck-rotate-small") else {
        return;
    };
    // ~6 s: the first files settle (2 s) and are checked long before the end.
    let script = "repeat 60 { malloc 4096 a; free a; memcpy 4096; sleep 100 }";
    let out = trace(&sb, &["--rotate", "500ms"], script);
    let mut files: Vec<PathBuf> = std::fs::read_dir(sb.db())
        .expect("run directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "db"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    let last = files.pop().expect("a last file");
    assert!(
        common::checks_entry_of(&cache(&sb), &last).is_none(),
        "the last file is under the threshold"
    );
    assert_every_check(
        &common::checks_entry_of(&cache(&sb), &files[0])
            .unwrap_or_else(|| panic!("{} not checked", files[0].display())),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("warning") && !err.contains("for later reads"),
        "{err}"
    );
}

/// `--keep` deletes files that may still wait for their check: skipped
/// without a word, the kept ones checked.
#[test]
fn files_deleted_by_keep_are_skipped_quietly() {
    let Some(sb) = Sandbox::for_ebpf("precheck-keep") else {
        return;
    };
    let script = "repeat 20 { malloc 4096 a; free a; memcpy 4096; sleep 80 }";
    let out = trace(
        &sb,
        &["--rotate", "300ms", "--keep", "1", "--precheck", "0"],
        script,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("warning"), "{err}");
    let kept: Vec<PathBuf> = std::fs::read_dir(sb.db())
        .expect("run directory")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_every_check(
        &common::checks_entry_of(&cache(&sb), &kept[0]).expect("the last file checked"),
    );
}

/// An interrupt while the tracer waits for its file to settle ends the run
/// at once: the file is complete, nothing is remembered.
#[test]
fn an_interrupt_ends_the_wait_at_once() {
    let Some(sb) = Sandbox::for_ebpf("precheck-int") else {
        return;
    };
    let mut cmd = gpusleuth();
    cmd.env("GPUSLEUTH_CACHE_DIR", cache(&sb))
        .arg("trace")
        .arg("--db")
        .arg(sb.db())
        .args(["--precheck", "0", "--"])
        .arg(&sb.sim.workload)
        .arg(SCRIPT)
        .env("LD_LIBRARY_PATH", &sb.sim.lib_dir);
    let log = sb.path("trace.stderr");
    cmd.stderr(std::fs::File::create(&log).expect("log"));
    cmd.stdout(std::process::Stdio::null());
    let mut child = cmd.spawn().expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("for later reads (")
    {
        assert!(Instant::now() < deadline, "no wait announced");
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = Instant::now();
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = common::wait_child(&mut child, 30);
    let took = t.elapsed();
    let err = std::fs::read_to_string(&log).expect("log");
    assert!(status.success(), "{err}");
    assert!(err.contains("was interrupted"), "{err}");
    assert!(took < Duration::from_millis(1500), "{took:?}\n{err}");
    assert!(common::checks_entry_of(&cache(&sb), &sb.db()).is_none());
}

/// The checking thread is one of the tracer's helpers: nice +10 and, when
/// the traced program is pinned and we have another CPU, off its CPU.
#[test]
fn the_checking_thread_is_placed_like_the_other_helpers() {
    let Some(sb) = Sandbox::for_ebpf("precheck-place") else {
        return;
    };
    let mut child = sb.spawn_trace(
        &["--precheck", "0"],
        "pin 0; repeat 40 { launch 1; sleep 50 }",
        None,
    );
    let task = format!("/proc/{}/task", child.id());
    let other_cpu = std::fs::read_to_string("/proc/self/status")
        .expect("status")
        .lines()
        .any(|l| l.starts_with("Cpus_allowed_list:") && l.trim_end() != "Cpus_allowed_list:\t0");
    // (nice, CPUs allowed) of the checking thread, once placed.
    let placed = || -> Option<(i64, String)> {
        std::fs::read_dir(&task).ok()?.flatten().find_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            if comm.trim_end() != "gpusleuth-check" {
                return None;
            }
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            // Field 19 (nice) after the command name in parentheses.
            let nice = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(16)?
                .parse()
                .ok()?;
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            let cpus = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
                .trim()
                .to_string();
            Some((nice, cpus))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let got = loop {
        match placed() {
            Some((10, cpus)) if !other_cpu || !cpus.split(',').any(|r| r.starts_with('0')) => {
                break Some(cpus)
            }
            _ if Instant::now() > deadline => break None,
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let status = common::wait_child(&mut child, 60);
    assert!(status.success());
    assert!(
        got.is_some(),
        "the checking thread was not lowered or moved off CPU 0: {:?}",
        placed()
    );
}
