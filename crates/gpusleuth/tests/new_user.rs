//! Issue 14, "found by a new user": every command on the example traces and
//! on broken input, checked for data loss, leftovers and answers that
//! mislead. Ground truth comes from the example traces' own tables, from the
//! Ingero fixtures built here, or from how each test builds its input.

mod common;
#[path = "../../sleuth-store/tests/common/ingero.rs"]
mod ingero;

use common::{assert_no_panic, command_json, gpusleuth, Db, Sandbox};
use serde_json::Value;
use sleuth_core::{op_by_name, CallEvent, Event};
use sleuth_store::{SessionInfo, TraceWriter, WriterOptions};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
/// The only traced process of examples/demo-sim.db.
const DEMO_PID: u32 = 25707;

/// A private copy of an example trace (tests never write into examples/).
fn example(sb: &Sandbox, name: &str) -> PathBuf {
    let dst = sb.path(name);
    std::fs::copy(Path::new(EXAMPLES).join(name), &dst).expect("copy example trace");
    dst
}

fn run(args: &[&str]) -> Output {
    let out = gpusleuth().args(args).output().expect("run gpusleuth");
    assert_no_panic(&out);
    out
}

/// The first element of the array `doc[list]` that `pred` accepts; a panic
/// showing the document when there is none.
fn entry<'a>(doc: &'a Value, list: &str, pred: impl Fn(&Value) -> bool) -> &'a Value {
    doc[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list} array: {doc}"))
        .iter()
        .find(|v| pred(v))
        .unwrap_or_else(|| panic!("no matching entry in {list}: {doc}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Files in a folder, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn outputs_never_overwrite_an_input_or_an_existing_file() {
    let sb = Sandbox::new("outputs");
    let db = example(&sb, "demo-sim.db");
    let original = std::fs::read(&db).unwrap();
    for cmd in [
        vec!["report", "--db", s(&db), "-o", s(&db)],
        vec!["report", "--db", s(&db), "-o", s(&db), "--force"],
        vec!["export", "--db", s(&db), "-o", s(&db), "--force"],
        vec!["export", "--db", s(&db), "--format", "json", "-o", s(&db)],
    ] {
        let out = run(&cmd);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}");
        let err = text(&out.stderr);
        assert!(err.contains("is the input"), "{cmd:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one-line error: {err}");
    }
    assert_eq!(std::fs::read(&db).unwrap(), original, "the trace is intact");

    // An existing output is kept unless --force.
    let html = sb.path("report.html");
    let json = sb.path("calls.json");
    for (cmd, path) in [
        (vec!["report", "--db", s(&db), "-o", s(&html)], &html),
        (
            vec!["export", "--db", s(&db), "--format", "json", "-o", s(&json)],
            &json,
        ),
    ] {
        std::fs::write(path, b"mine").unwrap();
        let out = run(&cmd);
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(
            err.contains("already exists") && err.contains("--force"),
            "{err}"
        );
        assert_eq!(std::fs::read(path).unwrap(), b"mine");
        let mut forced = cmd.clone();
        forced.push("--force");
        let out = run(&forced);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_ne!(std::fs::read(path).unwrap(), b"mine");
        let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "outputs are private like traces");
    }
    // Written atomically: no temporary file is left beside the outputs.
    let left = listing(&sb.dir);
    assert!(!left.iter().any(|n| n.contains(".partial-")), "{left:?}");
}

/// A negative moment or window is refused as one, not as an unknown
/// flag (round 54's tester: `--at -1s` got "unexpected argument '-1'").
#[test]
fn a_negative_duration_is_refused_as_not_a_non_negative_duration() {
    let sb = Sandbox::new("negative");
    let db = example(&sb, "demo-sim.db");
    for cmd in [
        vec!["memory", "--db", s(&db), "--at", "-1s"],
        vec!["stats", "--db", s(&db), "--last", "-5s"],
        vec!["explain", "--db", s(&db), "--from", "-2ms"],
        vec!["explain", "--db", s(&db), "--to", "-2ms"],
    ] {
        let out = run(&cmd);
        // An argument error is one line and exit 1, as every error.
        assert_eq!(out.status.code(), Some(1), "{cmd:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains("is not a non-negative duration"),
            "{cmd:?}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{cmd:?}: {err}");
        assert!(err.starts_with("gpusleuth: error: "), "{cmd:?}: {err}");
    }
}

#[test]
fn a_pid_not_in_the_trace_is_an_error_listing_the_pids_it_holds() {
    let sb = Sandbox::new("nopid");
    let db = example(&sb, "demo-sim.db");
    let html = sb.path("r.html");
    for cmd in [
        vec!["explain", "--db", s(&db), "--pid", "424242"],
        vec!["stats", "--db", s(&db), "--pid", "424242"],
        vec!["memory", "--db", s(&db), "--pid", "424242"],
        vec!["report", "--db", s(&db), "--pid", "424242", "-o", s(&html)],
        vec!["export", "--db", s(&db), "--pid", "424242"],
    ] {
        let out = run(&cmd);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {}", text(&out.stdout));
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!(
                "pid 424242 is not in this trace (it holds pid {DEMO_PID})"
            )),
            "{cmd:?}: {err}"
        );
        assert!(!text(&out.stdout).contains("No abnormal behaviour"));
    }
    assert!(!html.exists());
    // The pid it does hold still works.
    let out = run(&["stats", "--db", s(&db), "--pid", &DEMO_PID.to_string()]);
    assert!(out.status.success());
}

#[test]
fn export_json_names_ops_like_every_other_output() {
    let sb = Sandbox::new("exportjson");
    let db = example(&sb, "demo-sim.db");
    let out = run(&["export", "--db", s(&db), "--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let calls: Value = serde_json::from_slice(&out.stdout).unwrap();
    let calls = calls.as_array().unwrap();
    let rows = Db::open(&db).int("SELECT count(*) FROM calls");
    assert_eq!(calls.len() as i64, rows);
    assert!(calls.iter().all(|c| c["op"].is_string()), "{:?}", calls[0]);
    let mallocs = calls.iter().filter(|c| c["op"] == "cudaMalloc").count() as i64;
    assert_eq!(
        mallocs,
        Db::open(&db).int("SELECT count(*) FROM calls WHERE op = 'cudaMalloc'")
    );
}

#[test]
fn bytes_and_durations_read_the_same_in_every_command() {
    let sb = Sandbox::new("units");
    let db = example(&sb, "demo-sim.db");
    let explain = text(&run(&["explain", "--db", s(&db)]).stdout);
    let memory = text(&run(&["memory", "--db", s(&db)]).stdout);
    // The failed 1e15-byte cudaMalloc of the demo scenario, and what was live.
    for (out, want) in [
        (
            &explain,
            "cudaMalloc of 909.5 TiB returned 2 (out of memory) with 64.0 MiB live",
        ),
        (&memory, "FAILED: cudaMalloc of 909.5 TiB returned 2"),
        (&memory, "with 64.0 MiB live"),
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}");
    }
    assert!(
        !explain.contains("GiB") || !explain.contains("931322"),
        "{explain}"
    );

    // A failure with nothing live: "0 B" in both, never "0.0 MiB".
    let zero = sb.path("zero.db");
    write_trace(&zero, vec![failed_tib_malloc(2_000)]);
    let explain = text(&run(&["explain", "--db", s(&zero)]).stdout);
    let memory = text(&run(&["memory", "--db", s(&zero)]).stdout);
    assert!(explain.contains("cudaMalloc of 1.0 TiB"), "{explain}");
    assert!(explain.contains("with 0 B live"), "{explain}");
    assert!(memory.contains("with 0 B live"), "{memory}");
    assert!(!explain.contains("0.0 MiB"), "{explain}");
}

/// A finished trace at `path` holding `calls` (pid 7).
fn write_trace(path: &Path, calls: Vec<CallEvent>) {
    let info = SessionInfo {
        started_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 1_000,
        command: "test".into(),
        target: "test".into(),
        launch_mode: "driver".into(),
        tool_version: "test".into(),
        clock_base_ns: 0,
        ..Default::default()
    };
    let w = TraceWriter::create(path, info, WriterOptions::default()).unwrap();
    let h = w.handle();
    for c in calls {
        h.send(Event::Call(c)).unwrap();
    }
    drop(h);
    w.finish().unwrap();
}

/// A cudaMalloc of 1 TiB that failed with out of memory (2).
fn failed_tib_malloc(ts_ns: u64) -> CallEvent {
    CallEvent {
        ts_ns,
        dur_ns: 500,
        pid: 7,
        tid: 7,
        op: op_by_name("cudaMalloc").unwrap().id,
        ret: 2,
        size: Some(1 << 40),
        ..Default::default()
    }
}

#[test]
fn stats_shows_no_errors_for_a_function_that_returns_nothing() {
    let sb = Sandbox::new("void");
    let db = sb.path("void.db");
    let empty_cache = op_by_name("NativeCachingAllocator::emptyCache").unwrap().id;
    // What the return register held after the void function (older traces stored it).
    let mut calls: Vec<CallEvent> = (0..4u64)
        .map(|i| CallEvent {
            ts_ns: 2_000 + i * 1_000,
            dur_ns: 100,
            pid: 7,
            tid: 7,
            op: empty_cache,
            ret: 0x5571_0000 + i as i64,
            ..Default::default()
        })
        .collect();
    calls.push(failed_tib_malloc(9_000));
    write_trace(&db, calls);
    let stats = common::stats_json(&db);
    let ec = common::stats_op(&stats, "torch", "NativeCachingAllocator::emptyCache").unwrap();
    assert_eq!(ec["count"], 4);
    assert!(ec["errors"].is_null(), "{ec}");
    let m = common::stats_op(&stats, "runtime", "cudaMalloc").unwrap();
    assert_eq!(m["errors"], 1);
    let table = text(&run(&["stats", "--db", s(&db)]).stdout);
    let row = table
        .lines()
        .find(|l| l.contains("emptyCache"))
        .expect("emptyCache row");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[2..4], ["4", "-"], "COUNT 4, ERR -: {row}");
    let explain = text(&run(&["explain", "--db", s(&db), "--json"]).stdout);
    assert!(!explain.contains("emptyCache"), "{explain}");
}

#[test]
fn check_says_what_the_verdict_means_for_each_failing_line() {
    let out = run(&["check"]);
    let t = text(&out.stdout);
    let lines: Vec<&str> = t.lines().collect();
    let mut fails = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let tag = l.split_whitespace().next().unwrap_or("");
        if tag == "WARN" || tag == "FAIL" {
            let next = lines.get(i + 1).copied().unwrap_or("");
            let want = if tag == "WARN" {
                "-> warn:"
            } else {
                "-> fail:"
            };
            assert!(next.contains(want), "{l}\n{next}");
            if tag == "FAIL" {
                fails.push(l.split_whitespace().nth(1).unwrap_or(""));
            }
        }
    }
    let verdict = lines.last().copied().unwrap_or("");
    assert!(verdict.starts_with("verdict: "), "{t}");
    // This machine runs the eBPF tests, so it can trace: a WARN (no NVML,
    // no CUDA library installed) never turns into "NOT ready".
    assert!(
        !verdict.contains("NOT ready") || !fails.is_empty(),
        "{verdict}"
    );
    if t.contains("\nWARN") {
        assert!(verdict.contains("only limits what is seen"), "{verdict}");
    }
    let json: Value = serde_json::from_slice(&run(&["check", "--json"]).stdout).unwrap();
    for c in json["checks"].as_array().unwrap() {
        let st = c["status"].as_str().unwrap();
        assert!(["ok", "warn", "fail"].contains(&st), "{c}");
        assert_eq!(c["impact"].is_null(), st == "ok", "{c}");
    }
}

#[test]
fn the_schema_doc_query_counts_stolen_time_once() {
    let sb = Sandbox::new("schemadoc");
    let db = example(&sb, "demo-sim.db");
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/schema.md"))
        .unwrap();
    // The query printed under the "-- who stole CPU" comment, as a user copies it.
    let lines: Vec<&str> = doc.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("-- who stole CPU"))
        .expect("the example query is documented");
    let sql: String = lines[at + 1..]
        .iter()
        .take_while(|l| !l.starts_with("--") && !l.starts_with("```"))
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    let out = run(&["query", "--db", s(&db), "--json", &sql]);
    assert!(out.status.success(), "{sql}: {}", text(&out.stderr));
    let res: Value = serde_json::from_slice(&out.stdout).unwrap();
    let hog = res["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "gs-hog")
        .expect("the hog is named");
    let hog_ns = hog[2].as_i64().unwrap();
    // Physical bound: the culprits cannot have taken more than the runnable
    // time of the calls, each call counted once (nested driver calls are the
    // same time as their runtime caller).
    let runnable = Db::open(&db).int("SELECT sum(runnable_ns) FROM calls WHERE nested = 0");
    assert!(hog_ns <= runnable, "{hog_ns} > {runnable}: double-counted");
    // And explain's figure for the copies is part of it.
    let ex = command_json("explain", &db);
    let copies = entry(&ex, "findings", |f| {
        f["kind"] == "cpu_preemption" && f["op"] == "cudaMemcpy"
    });
    let explained = copies["culprits"][0]["runnable_ns"].as_i64().unwrap();
    assert!(explained <= hog_ns, "{explained} > {hog_ns}");
}

/// Writes the Ingero DataLoader-shaped fixture and imports it with the CLI.
fn imported(sb: &Sandbox) -> PathBuf {
    let src = sb.path("ingero.db");
    ingero::write_ingero(&src, &ingero::dataloader_rows());
    let dst = sb.path("imported.db");
    let out = run(&["import", "--from", "ingero", s(&src), "--db", s(&dst)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    dst
}

#[test]
fn imported_traces_show_unknown_as_unknown_and_feed_the_ledger() {
    let sb = Sandbox::new("imported");
    let db = imported(&sb);
    let total: i64 = ingero::MALLOC_SIZES
        .iter()
        .chain(&ingero::DIRECT_DRIVER_SIZES)
        .sum();
    let mem = command_json("memory", &db);
    let p = entry(&mem, "processes", |p| p["pid"] == 2233);
    assert_eq!(p["allocs"], 10);
    assert_eq!(p["live_bytes"].as_i64(), Some(total));
    assert_eq!(p["peak_bytes"].as_i64(), Some(total));
    assert!(p["unfreed"][0]["ptr"].is_null());
    let memory = text(&run(&["memory", "--db", s(&db)]).stdout);
    assert!(memory.contains("allocations: 10"), "{memory}");
    assert!(
        memory.contains("10 allocation(s) with an unknown pointer"),
        "{memory}"
    );

    let stats = common::stats_json(&db);
    for op in stats["ops"].as_array().unwrap() {
        if op["measured"] == "per_call" {
            for k in ["on_cpu_ns", "runnable_ns", "blocked_ns"] {
                assert!(op[k].is_null(), "{k} of {}: {op}", op["op"]);
            }
        }
    }
    let table = text(&run(&["stats", "--db", s(&db)]).stdout);
    let row = table.lines().find(|l| l.contains(" cudaMalloc ")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    // ON-CPU, RUNNABLE, BLOCKED, TAIL: unknown.
    assert_eq!(&cells[9..13], ["-", "-", "-", "-"], "{row}");

    let export: Value =
        serde_json::from_slice(&run(&["export", "--db", s(&db), "--format", "json"]).stdout)
            .unwrap();
    assert!(export[0]["runnable_ns"].is_null() && export[0]["dur_ns"].as_u64().is_some());
}

#[test]
fn explain_examples_of_an_imported_trace_print_unknown_split_as_unknown() {
    let sb = Sandbox::new("imported-explain");
    let src = sb.path("ingero.db");
    // 37 launches of 10 us and three of 2 ms: a tail_latency finding with examples.
    let mut rows = Vec::new();
    for i in 0..40 {
        rows.push(ingero::row(
            1_774_015_573_000_000_000 + i * 1_000_000,
            2233,
            1,
            3,
            if i % 13 == 12 { 2_000_000 } else { 10_000 },
            0x7f00,
            0,
        ));
    }
    ingero::write_ingero(&src, &rows);
    let db = sb.path("imported.db");
    let out = run(&["import", "--from", "ingero", s(&src), "--db", s(&db)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ex = command_json("explain", &db);
    let examples = entry(&ex, "findings", |f| f["evidence"]["examples"].is_array())["evidence"]
        ["examples"]
        .as_array()
        .expect("examples");
    assert!(examples
        .iter()
        .all(|e| e["on_cpu_ns"].is_null() && e["runnable_ns"].is_null()));
    let t = text(&run(&["explain", "--db", s(&db)]).stdout);
    let line = t
        .lines()
        .find(|l| l.contains("example:") && l.contains("took"))
        .unwrap_or_else(|| panic!("{t}"));
    assert!(line.contains("(on-CPU -, runnable -, blocked -)"), "{line}");
}

#[test]
fn importing_a_huge_op_name_stays_small_and_leaves_one_file() {
    let sb = Sandbox::new("import-mem");
    let dir = sb.path("work");
    std::fs::create_dir(&dir).unwrap();
    let src = dir.join("ingero.db");
    let c = ingero::write_ingero(&src, &ingero::dataloader_rows());
    // 1,500 events naming a 1 MB op: 1.5 GB if the name is copied per event.
    ingero::add_huge_op(&c, 1500);
    drop(c);
    let dst = dir.join("out.db");
    let mut cmd = gpusleuth();
    cmd.args(["import", "--from", "ingero", s(&src), "--db", s(&dst)]);
    // A 1 GiB address-space cap: what the hostile file would need is refused
    // by the kernel, so the test cannot harm the machine.
    let (status, max_rss_kib) = run_capped(cmd, 1 << 30);
    assert!(status.success(), "import failed under a 1 GiB cap");
    assert!(
        max_rss_kib < 256 * 1024,
        "peak RSS {max_rss_kib} KiB for a {} KiB file",
        std::fs::metadata(&src).unwrap().len() / 1024
    );
    assert_eq!(listing(&dir), ["ingero.db", "out.db"]);
}

/// Runs `cmd` with RLIMIT_AS set to `bytes`; returns its status and peak RSS (KiB).
fn run_capped(mut cmd: std::process::Command, bytes: u64) -> (std::process::ExitStatus, i64) {
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: runs in the forked child before exec; setrlimit is
    // async-signal-safe and `lim` lives on this stack frame.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Reaped by wait4 below (std's wait cannot give the child's rusage).
    #[allow(clippy::zombie_processes)]
    let child = cmd.spawn().expect("spawn");
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 on our own child fills both.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(r, child.id() as i32, "wait4");
    (std::process::ExitStatus::from_raw(status), usage.ru_maxrss)
}

#[test]
fn demo_offline_interrupted_leaves_no_temporary_copy() {
    let sb = Sandbox::new("demo-int");
    let tmp = sb.path("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut child = gpusleuth()
        .args(["demo", "--offline"])
        .env("TMPDIR", &tmp)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // As soon as its temporary folder exists, interrupt it (Ctrl-C).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut interrupted = false;
    while Instant::now() < deadline {
        if !listing(&tmp).is_empty() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            interrupted = true;
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let status = common::wait_child(&mut child, 30);
    assert!(interrupted, "the demo's temporary folder was never seen");
    assert!(listing(&tmp).is_empty(), "left behind: {:?}", listing(&tmp));
    assert!(matches!(status.code(), Some(0) | Some(130)), "{status:?}");
}

// ---- the following need root and eBPF (they trace) ----

#[test]
fn a_command_that_never_starts_leaves_no_trace_behind() {
    let Some(sb) = Sandbox::for_ebpf("nostart") else {
        return;
    };
    let db = sb.path("t2.db");
    for _ in 0..2 {
        // The second run must fail the same way, not with "already exists".
        let out = run(&["trace", "--quiet", "--db", s(&db), "--", "/nonexistent/cmd"]);
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(err.contains("cannot run '/nonexistent/cmd'"), "{err}");
        assert!(!err.contains("already exists"), "{err}");
        assert!(
            !listing(&sb.dir).iter().any(|n| n.starts_with("t2.db")),
            "{:?}",
            listing(&sb.dir)
        );
    }
    // A file that exists but cannot be executed: the probes are loaded and
    // the database created before exec fails, then both are undone.
    let not_exec = sb.path("notes.txt");
    std::fs::write(&not_exec, b"not a program\n").unwrap();
    std::fs::set_permissions(&not_exec, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(&["trace", "--quiet", "--db", s(&db), "--", s(&not_exec)]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot run") && err.contains("ermission denied"),
        "{err}"
    );
    assert!(
        !listing(&sb.dir).iter().any(|n| n.starts_with("t2.db")),
        "{:?}",
        listing(&sb.dir)
    );
    // --force never loses the old trace to a command that does not exist.
    std::fs::write(&db, b"old trace").unwrap();
    let out = run(&[
        "trace",
        "--quiet",
        "--force",
        "--db",
        s(&db),
        "--",
        "/nonexistent/cmd",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read(&db).unwrap(), b"old trace");
    std::fs::remove_file(&db).unwrap();
    // The default name too (in the working directory).
    let work = sb.path("cwd");
    std::fs::create_dir(&work).unwrap();
    let out = gpusleuth()
        .args(["trace", "--quiet", "--", "/nonexistent/cmd"])
        .current_dir(&work)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(listing(&work).is_empty(), "{:?}", listing(&work));
}

fn pid_in(err: &str) -> u32 {
    let at = err.find("(pid ").expect("the command's pid is named") + 5;
    err[at..]
        .split(')')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a pid")
}

#[test]
fn duration_says_what_happens_to_the_command_and_can_end_it() {
    let Some(sb) = Sandbox::for_ebpf("duration") else {
        return;
    };
    // stderr to a file: the command left running keeps a pipe open.
    let err_file = sb.path("a.stderr");
    let t0 = Instant::now();
    let status = gpusleuth()
        .args([
            "trace",
            "--quiet",
            "--db",
            s(&sb.path("a.db")),
            "--duration",
            "1s",
        ])
        .args(["--", "sleep", "30"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .status()
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    let err = std::fs::read_to_string(&err_file).unwrap();
    assert!(err.contains("`sleep 30` (pid "), "{err}");
    assert!(err.contains("keeps running"), "{err}");
    assert!(err.contains("--on-duration kill"), "{err}");
    let left = pid_in(&err);
    let alive = Path::new(&format!("/proc/{left}")).exists();
    // SAFETY: kill(2) of the sleep this test started (through gpusleuth).
    unsafe { libc::kill(left as i32, libc::SIGKILL) };
    assert!(
        alive,
        "--on-duration leave (the default) leaves the command running"
    );

    let t0 = Instant::now();
    let out = run(&[
        "trace",
        "--quiet",
        "--db",
        s(&sb.path("b.db")),
        "--duration",
        "1s",
        "--on-duration",
        "kill",
        "--",
        "sleep",
        "30",
    ]);
    assert!(t0.elapsed() < Duration::from_secs(20));
    let err = text(&out.stderr);
    assert!(err.contains("ended `sleep 30` (pid "), "{err}");
    assert!(err.contains("with SIGTERM"), "{err}");
    let ended = pid_in(&err);
    assert!(
        !Path::new(&format!("/proc/{ended}")).exists() || {
            let st = std::fs::read_to_string(format!("/proc/{ended}/stat")).unwrap_or_default();
            !st.contains("(sleep)")
        }
    );
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{err}");
    let notes = Db::open(&sb.path("b.db")).text_ints("SELECT text, 0 FROM notes");
    assert!(
        notes.iter().any(|(t, _)| t.contains("ended `sleep 30`")),
        "{notes:?}"
    );

    let out = run(&[
        "trace",
        "--on-duration",
        "kill",
        "--pid",
        "1",
        "--duration",
        "1s",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "kill applies to launched commands only"
    );
}

#[test]
fn a_trace_without_cuda_libraries_refers_only_to_warnings_it_printed() {
    let Some(sb) = Sandbox::for_ebpf("notprobed") else {
        return;
    };
    let out = run(&["trace", "--db", s(&sb.path("t.db")), "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    if err.contains("warnings above") {
        assert!(err.contains("warning: not probed:"), "{err}");
    }
    assert!(
        err.contains("no CUDA library was found")
            || err.contains("no CUDA library was probed")
            || err.contains("CUDA libraries were probed"),
        "{err}"
    );
}

/// Found in round 50: with `--force`, an output was renamed over whatever
/// had its name, and as root `export -o /dev/null --force` put a 0600 file
/// in the place of the system's `/dev/null`. Only a regular file is ever
/// replaced; a device, a pipe or a link is refused, `--force` or not,
/// without naming `--force` as the way out.
#[test]
fn outputs_never_replace_a_device_a_pipe_or_a_link() {
    use std::os::unix::fs::FileTypeExt as _;
    let sb = Sandbox::new("special-outputs");
    let db = example(&sb, "demo-sim.db");
    let other = example(&sb, "h200-contention.db");
    let fifo = sb.path("pipe");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: a valid NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let link = sb.path("link.json");
    std::os::unix::fs::symlink(sb.path("target.json"), &link).unwrap();
    let mut dests = vec![fifo.clone(), link.clone()];
    // A device node of our own (the null device's numbers) where root may
    // make one: never the system's /dev/null, should this regress.
    let dev = sb.path("null-device");
    let d = std::ffi::CString::new(s(&dev)).unwrap();
    // SAFETY: a valid NUL-terminated path; mknod only reads it.
    if unsafe { libc::mknod(d.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0 {
        dests.push(dev.clone());
    } else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root and must make the device node"
        );
    }
    for dst in &dests {
        for force in [false, true] {
            let mut cmds = vec![
                vec!["export", "--db", s(&db), "-o", s(dst)],
                vec!["report", "--db", s(&db), "-o", s(dst)],
                vec!["merge", s(&db), s(&other), "-o", s(dst)],
            ];
            for c in &mut cmds {
                if force {
                    c.push("--force");
                }
            }
            for cmd in cmds {
                let out = run(&cmd);
                assert_eq!(out.status.code(), Some(1), "{cmd:?}");
                let err = text(&out.stderr);
                assert!(err.contains("not a regular file"), "{cmd:?}: {err}");
                assert!(!err.contains("--force replaces"), "{cmd:?}: {err}");
                assert_eq!(err.trim_end().lines().count(), 1, "{err}");
            }
        }
    }
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(
        !sb.path("target.json").exists(),
        "the link is never followed"
    );
    if dests.contains(&dev) {
        assert!(std::fs::symlink_metadata(&dev)
            .unwrap()
            .file_type()
            .is_char_device());
    }
    let left = listing(&sb.dir);
    assert!(!left.iter().any(|n| n.contains(".partial-")), "{left:?}");
}

/// Found in round 50: `query`, `check`, `merge`, `import`, `finish` and
/// `reclaim` printed with `println!`, which panics (exit 101, a backtrace)
/// where stdout cannot be written. Every command says it in one line and
/// exits 1, as `stats` did.
#[test]
fn a_stdout_that_cannot_be_written_is_one_line_and_exit_1() {
    let sb = Sandbox::new("dev-full");
    let db = example(&sb, "demo-sim.db");
    let other = example(&sb, "h200-contention.db");
    let merged = sb.path("merged.db");
    let src = sb.path("ingero.db");
    ingero::write_ingero(&src, &ingero::dataloader_rows());
    let imported = sb.path("imported.db");
    let complete = sb.path("complete.db");
    write_trace(&complete, vec![failed_tib_malloc(5_000)]);
    let full = || std::fs::OpenOptions::new().write(true).open("/dev/full");
    if full().is_err() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "no /dev/full");
        return;
    }
    for cmd in [
        vec!["stats", "--db", s(&db)],
        vec!["query", "--db", s(&db), "SELECT 1"],
        vec!["query", "--db", s(&db), "--json", "SELECT 1"],
        vec!["check"],
        vec!["check", "--json"],
        vec!["merge", s(&db), s(&other), "-o", s(&merged)],
        vec!["import", "--from", "ingero", s(&src), "--db", s(&imported)],
        vec!["finish", "--db", s(&complete)],
        vec!["reclaim", "--orphans"],
        vec!["vram"],
    ] {
        let out = gpusleuth()
            .args(&cmd)
            .stdout(full().unwrap())
            .output()
            .expect("run gpusleuth");
        assert_no_panic(&out);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {err}");
        assert!(err.contains("writing to stdout"), "{cmd:?}: {err}");
        assert_eq!(
            err.lines()
                .filter(|l| l.starts_with("gpusleuth: error"))
                .count(),
            1,
            "{cmd:?}: {err}"
        );
    }
    // What the commands wrote besides their stdout is whole.
    assert!(run(&["stats", "--db", s(&merged)]).status.success());
    assert!(run(&["stats", "--db", s(&imported)]).status.success());
}

/// Found in round 50: one node's trace given twice merged as two nodes,
/// every call counted twice.
#[test]
fn merge_refuses_a_file_given_twice() {
    let sb = Sandbox::new("merge-twice");
    let db = example(&sb, "demo-sim.db");
    let alias = sb.path("alias.db");
    std::fs::hard_link(&db, &alias).unwrap();
    let out_db = sb.path("job.db");
    for second in [&db, &alias] {
        let out = run(&["merge", s(&db), s(second), "-o", s(&out_db)]);
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(err.contains("are the same file"), "{err}");
        assert!(!out_db.exists());
    }
}

/// Found in round 50 on the bundled example (a schema-1 trace with no host
/// pointers): its copies could not be judged and `explain` said nothing of
/// it. (Its failed allocation, ranked first by rule, then hid a 38%
/// `sync_stall` from the summary line; since round 56 that was no stall:
/// the "host stretch" before each sync was a 9-ms synchronous `cudaMemcpy`,
/// time inside a copy, and the host's own work after each sync is 0.8 ms
/// of a 16-ms step. The summary says where the time went instead.)
#[test]
fn the_example_trace_says_what_it_cannot_judge_and_names_its_verdict() {
    let sb = Sandbox::new("example-notes");
    let db = example(&sb, "demo-sim.db");
    let v = command_json("explain", &db);
    let summary = v["summary"].as_str().unwrap();
    assert!(
        summary.ends_with("spent 95% inside CUDA calls, 5% on the CPU between them, 0% blocked, 0% runnable: no bottleneck verdict"),
        "{summary}"
    );
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("pageable_copy cannot be evaluated"),
        "{notes}"
    );
    let md = text(&run(&["explain", "--db", s(&db), "--markdown"]).stdout);
    assert!(!md.contains("sync_stall"), "{md}");
    assert!(!md.contains(", ``)"), "no empty op: {md}");
    // A window that holds the whole trace holds its kernel-counted
    // launches too, samples or not (left out before).
    let out = run(&[
        "stats",
        "--db",
        s(&db),
        "--from",
        "0",
        "--to",
        "1000h",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let w: Value = serde_json::from_slice(&out.stdout).unwrap();
    let launches = w["ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["op"] == "cuLaunchKernel")
        .unwrap_or_else(|| panic!("no launches in the whole window: {w}"));
    assert_eq!(launches["count"], 1000, "{launches}");
}

/// Found in round 50: `--limit 0` printed an empty answer with a note that
/// it stopped; a refused statement said "query failed: query refused".
#[test]
fn query_limits_and_refusals_read_plainly() {
    let sb = Sandbox::new("query-plain");
    let db = example(&sb, "demo-sim.db");
    let out = run(&["query", "--db", s(&db), "--limit", "0", "SELECT 1"]);
    assert_eq!(out.status.code(), Some(1));
    let out = run(&["query", "--db", s(&db), "DELETE FROM calls"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(
        err.trim_end(),
        "gpusleuth: error: query refused: not authorized"
    );
    // An output named .PFTRACE is Perfetto's protobuf, as .pftrace is.
    let pf = sb.path("t.PFTRACE");
    assert!(run(&["export", "--db", s(&db), "-o", s(&pf)])
        .status
        .success());
    let bytes = std::fs::read(&pf).unwrap();
    assert_ne!(bytes.first(), Some(&b'{'), "protobuf, not JSON");
}

/// Found in round 50: a `sessions.started_at` of another type was the
/// library's "Invalid column type Text at index: 0".
#[test]
fn an_ingero_session_of_other_types_is_named() {
    let sb = Sandbox::new("ingero-session");
    let src = sb.path("ingero.db");
    let conn = ingero::write_ingero(&src, &ingero::dataloader_rows());
    conn.execute("UPDATE sessions SET started_at = 'yesterday'", [])
        .unwrap();
    drop(conn);
    let dst = sb.path("imported.db");
    let out = run(&["import", "--from", "ingero", s(&src), "--db", s(&dst)]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("unexpected Ingero sessions row"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!dst.exists());
}

/// An environment variable that is not UTF-8 (a Latin-1 path inherited
/// from a shell) never takes `check` or `trace` down: `std::env::vars`
/// panicked on it, `trace` after its capture had started, leaving its file
/// unfinished and the command never run (round 55's tester).
#[test]
fn an_environment_that_is_not_utf8_is_no_panic() {
    use std::os::unix::ffi::OsStrExt as _;
    let latin1 = std::ffi::OsStr::from_bytes(b"/opt/caf\xe9/lib");
    let out = gpusleuth()
        .arg("check")
        .env("X_LATIN1", latin1)
        .output()
        .expect("run gpusleuth check");
    assert_no_panic(&out);
    assert_ne!(out.status.code(), Some(101), "{out:?}");
    let Some(sb) = Sandbox::for_ebpf("env_latin1") else {
        return;
    };
    let out = sb
        .trace_command(&[], "malloc 4096 a; free a")
        .env("X_LATIN1", latin1)
        .output()
        .expect("run gpusleuth trace");
    assert_no_panic(&out);
    assert!(out.status.success(), "{out:?}");
    let stats = run(&["stats", "--json", "--db", s(&sb.db())]);
    assert!(
        stats.status.success() && stats.stderr.is_empty(),
        "{stats:?}"
    );
    assert_eq!(
        common::stats_count(
            &serde_json::from_slice(&stats.stdout).unwrap(),
            "runtime",
            "cudaMalloc"
        ),
        1
    );
}

/// The paths `report` and `trace` print are escaped like every other
/// terminal output: an OSC 52 clipboard write or a bidirectional override
/// in an output path reached the terminal raw (round 55's tester).
#[test]
fn printed_output_paths_never_reach_the_terminal_raw() {
    let sb = Sandbox::new("raw_paths");
    let db = example(&sb, "demo-sim.db");
    let hostile = "x\u{1b}]52;c;QkFE\u{7}\u{202e}";
    let html = sb.path(&format!("{hostile}.html"));
    let out = run(&["report", "--db", s(&db), "-o", s(&html)]);
    assert!(out.status.success(), "{out:?}");
    let err = text(&out.stderr);
    assert!(err.contains("\\x1b]52;c;QkFE\\x07\\u{202e}.html"), "{err}");
    assert!(!err.contains(['\u{1b}', '\u{7}', '\u{202e}']), "{err:?}");
    let Some(sb) = Sandbox::for_ebpf("raw_paths_trace") else {
        return;
    };
    let trace_db = sb.path(&format!("{hostile}.db"));
    let out = gpusleuth()
        .args([
            "trace",
            "--db",
            s(&trace_db),
            "--",
            s(&sb.sim.workload),
            "malloc 64 a",
        ])
        .env("LD_LIBRARY_PATH", &sb.sim.lib_dir)
        .output()
        .expect("run gpusleuth trace");
    assert_no_panic(&out);
    assert!(out.status.success(), "{out:?}");
    let err = text(&out.stderr);
    assert!(
        err.contains("trace saved to") && err.contains("\\x1b]52"),
        "{err}"
    );
    assert!(!err.contains(['\u{1b}', '\u{7}', '\u{202e}']), "{err:?}");
}
