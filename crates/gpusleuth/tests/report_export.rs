//! `gpusleuth export` and `gpusleuth report` on the bundled recorded trace
//! (examples/demo-sim.db, recorded with real eBPF; no root needed here).
//! Ground truth comes from the demo scenario (crates/gpusleuth/src/cmd/demo.rs)
//! and from the database rows themselves, never from the tool's output.

mod common;

use common::{assert_no_panic, gpusleuth, Db};
use rusqlite::types::Value as SqlValue;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The demo leaks 1 MiB + 2 MiB and asks once for 1e15 bytes.
const DEMO_LEAK_BYTES: u64 = 3 << 20;
const DEMO_FAILED_BYTES: u64 = 1_000_000_000_000_000;

fn demo_db() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-sim.db")
}

fn out_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpusleuth-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}

fn export(db: &Path, format: &str, out: &Path) -> Value {
    common::run_ok(
        gpusleuth()
            .args(["export", "--format", format, "--db"])
            .arg(db)
            .arg("-o")
            .arg(out),
    );
    let text = std::fs::read_to_string(out).expect("read export");
    serde_json::from_str(&text).expect("export writes valid JSON")
}

fn ns(us: &Value) -> i64 {
    (us.as_f64().expect("number") * 1e3).round() as i64
}

#[test]
fn perfetto_export_is_well_formed() {
    let dir = out_dir("perfetto-shape");
    let doc = export(&demo_db(), "perfetto", &dir.join("trace.json"));
    let ev = doc["traceEvents"].as_array().expect("traceEvents array");
    assert!(!ev.is_empty());
    let mut named_pids = Vec::new();
    let mut named_threads = Vec::new();
    for e in ev {
        let ph = e["ph"].as_str().expect("every event has ph");
        assert!(e["name"].as_str().is_some_and(|n| !n.is_empty()), "{e}");
        assert!(e["pid"].is_u64(), "{e}");
        match ph {
            "X" => {
                for k in ["ts", "dur"] {
                    assert!(e[k].as_f64().is_some_and(|v| v >= 0.0), "{k} in {e}");
                }
                assert!(e["tid"].is_u64(), "{e}");
            }
            "M" => match e["name"].as_str() {
                Some("process_name") => named_pids.push(e["pid"].as_u64().unwrap()),
                Some("thread_name") => {
                    named_threads.push((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
                }
                other => panic!("unexpected metadata {other:?}"),
            },
            "C" => assert!(e["args"]["live_bytes"].is_u64(), "{e}"),
            "i" => assert!(matches!(e["s"].as_str(), Some("g" | "p" | "t")), "{e}"),
            other => panic!("unexpected phase {other}"),
        }
    }
    // Every slice's process and thread has a name.
    for e in ev.iter().filter(|e| e["ph"] == "X") {
        let (p, t) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        assert!(named_pids.contains(&p), "pid {p} unnamed");
        assert!(named_threads.contains(&(p, t)), "thread {p}/{t} unnamed");
    }
    // Counters move forward in time per process.
    let mut last: HashMap<u64, f64> = HashMap::new();
    for e in ev.iter().filter(|e| e["ph"] == "C") {
        let ts = e["ts"].as_f64().unwrap();
        let prev = last.insert(e["pid"].as_u64().unwrap(), ts);
        assert!(
            prev.is_none_or(|p| p <= ts),
            "counter goes back in time: {e}"
        );
    }
    // Slices of a thread nest or are disjoint (what Perfetto requires of one track).
    let mut by_thread: BTreeMap<(u64, u64), Vec<(i64, i64)>> = BTreeMap::new();
    for e in ev.iter().filter(|e| e["ph"] == "X") {
        let s = ns(&e["ts"]);
        by_thread
            .entry((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
            .or_default()
            .push((s, s + ns(&e["dur"])));
    }
    for (thread, mut slices) in by_thread {
        slices.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut open: Vec<i64> = Vec::new();
        for (s, e) in slices {
            while open.last().is_some_and(|&end| end <= s) {
                open.pop();
            }
            if let Some(&end) = open.last() {
                assert!(
                    e <= end,
                    "thread {thread:?}: slice [{s},{e}) crosses one ending at {end}"
                );
            }
            open.push(e);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perfetto_export_numbers_match_the_database() {
    let dir = out_dir("perfetto-numbers");
    let doc = export(&demo_db(), "perfetto", &dir.join("trace.json"));
    let ev = doc["traceEvents"].as_array().unwrap();
    let db = Db::open(&demo_db());

    let cuda: Vec<&Value> = ev
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"].as_str().unwrap().starts_with("cuda."))
        .collect();
    assert_eq!(cuda.len() as i64, db.int("SELECT count(*) FROM calls"));
    let sum_dur: i64 = cuda.iter().map(|e| ns(&e["dur"])).sum();
    let db_dur = db.int("SELECT sum(dur_ns) FROM calls");
    assert!(
        (sum_dur - db_dur).abs() <= cuda.len() as i64,
        "{sum_dur} vs {db_dur}"
    );
    // Per op counts.
    let mut per_op: BTreeMap<String, i64> = BTreeMap::new();
    for e in &cuda {
        *per_op
            .entry(e["name"].as_str().unwrap().into())
            .or_default() += 1;
        assert_eq!(e["args"]["op"], e["name"]);
        let split = ns(&e["args"]["on_cpu_us"])
            + ns(&e["args"]["runnable_us"])
            + ns(&e["args"]["blocked_us"]);
        assert!((split - ns(&e["dur"])).abs() <= 3, "split != wall in {e}");
    }
    let db_per_op: BTreeMap<String, i64> = db
        .text_ints("SELECT op, count(*) FROM calls GROUP BY op")
        .into_iter()
        .collect();
    assert_eq!(per_op, db_per_op);

    // Off-CPU slices: one blocked slice per wait with a blocked part, one
    // runnable slice per wait with a runnable part.
    let count = |cat: &str| ev.iter().filter(|e| e["cat"] == cat).count() as i64;
    assert_eq!(
        count("sched.blocked"),
        db.int("SELECT count(*) FROM waits WHERE blocked_ns > 0")
    );
    assert_eq!(
        count("sched.runnable"),
        db.int("SELECT count(*) FROM waits WHERE runnable_ns > 0")
    );
    // The hog held the CPU: it is named as a preemptor.
    assert!(
        ev.iter().any(|e| e["cat"] == "sched.runnable"
            && e["args"]["preemptors"].as_str().unwrap().contains("gs-hog")),
        "gs-hog never named as a preemptor"
    );

    // Device memory ends at the scenario's leak, then falls to 0 at the
    // process's exit (the driver frees it); the failed allocation is marked.
    let pid = db.int("SELECT pid FROM calls WHERE op = 'cudaMalloc' LIMIT 1") as u64;
    let memory: Vec<(f64, u64)> = ev
        .iter()
        .filter(|e| e["ph"] == "C" && e["pid"] == pid)
        .map(|e| {
            (
                e["ts"].as_f64().unwrap(),
                e["args"]["live_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    let exit_ns = db.int(&format!("SELECT exit_ns FROM processes WHERE pid = {pid}"));
    assert!(exit_ns > 0, "the demo's workload exits");
    let [.., (_, at_exit), (drop_ts, 0)] = memory[..] else {
        panic!("no fall to 0 at the exit: {memory:?}");
    };
    assert_eq!(at_exit, DEMO_LEAK_BYTES);
    assert!(memory.iter().all(|&(ts, _)| ts <= drop_ts), "{memory:?}");
    let peak = ev
        .iter()
        .filter(|e| e["ph"] == "C" && e["pid"] == pid)
        .map(|e| e["args"]["live_bytes"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(peak, 64_000_000 + DEMO_LEAK_BYTES);
    assert!(ev.iter().any(|e| e["ph"] == "i"
        && e["name"] == "failed cudaMalloc"
        && e["args"]["bytes"] == DEMO_FAILED_BYTES));
    // The 3 MiB held until exit is released by the driver: no finding (issue 12).
    for kind in ["allocation_failure", "cpu_preemption"] {
        assert!(
            ev.iter()
                .any(|e| e["cat"] == "finding" && e["name"].as_str().unwrap().starts_with(kind)),
            "finding {kind} missing"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_export_lists_every_call() {
    let dir = out_dir("json-export");
    let doc = export(&demo_db(), "json", &dir.join("calls.json"));
    let calls = doc.as_array().expect("an array of calls");
    let db = Db::open(&demo_db());
    assert_eq!(calls.len() as i64, db.int("SELECT count(*) FROM calls"));
    assert_eq!(
        calls.iter().filter(|c| c["ret"] != 0).count() as i64,
        db.int("SELECT count(*) FROM calls WHERE ret != 0")
    );
    // The launches counted in the kernel have no row: said on stderr (round 51).
    let counted = db.int("SELECT sum(count) FROM op_counts");
    assert!(counted > 0);
    let out = gpusleuth()
        .args(["export", "--format", "json", "--db"])
        .arg(demo_db())
        .arg("-o")
        .arg(dir.join("again.json"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{counted} call(s) of the trace were counted in the kernel"
        )),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stdout redirected to a file (`>>`: after what it held; stderr elsewhere
/// or the same file) gets what `-o` writes, a newline after JSON: since
/// round 46 such a stdout is read as `-o` reads (straight through the
/// reorder buffer), a pipe as before.
#[test]
fn an_export_to_stdout_redirected_to_a_file_is_what_o_writes() {
    let dir = out_dir("stdout-file");
    for format in ["json", "perfetto", "pftrace"] {
        let want_path = dir.join(format!("want.{format}"));
        common::run_ok(
            gpusleuth()
                .args(["export", "--format", format, "--db"])
                .arg(demo_db())
                .arg("-o")
                .arg(&want_path),
        );
        let mut want = std::fs::read(&want_path).unwrap();
        if format != "pftrace" {
            want.push(b'\n');
        }
        for same_stderr in [false, true] {
            let out = dir.join(format!("out-{format}-{same_stderr}"));
            std::fs::write(&out, b"before\n").unwrap();
            let open = || std::fs::OpenOptions::new().append(true).open(&out).unwrap();
            let err = match same_stderr {
                true => open(),
                false => std::fs::File::create(dir.join("stderr")).unwrap(),
            };
            let status = gpusleuth()
                .args(["export", "--format", format, "--db"])
                .arg(demo_db())
                .stdout(open())
                .stderr(err)
                .status()
                .unwrap();
            assert!(status.success(), "{format} {same_stderr}");
            let got = std::fs::read(&out).unwrap();
            assert!(got.starts_with(b"before\n"), "{format} {same_stderr}");
            assert!(got[7..] == want[..], "{format} {same_stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_export_of_a_window_lists_the_calls_that_start_in_it() {
    let dir = out_dir("json-window");
    let db = Db::open(&demo_db());
    let start = db.int("SELECT start_mono_ns FROM session");
    let out = dir.join("calls.json");
    common::run_ok(
        gpusleuth()
            .args([
                "export", "--format", "json", "--from", "100ms", "--to", "300ms", "--db",
            ])
            .arg(demo_db())
            .arg("-o")
            .arg(&out),
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let calls = doc.as_array().expect("an array of calls");
    let (lo, hi) = (start + 100_000_000, start + 300_000_000);
    let want = db.int(&format!(
        "SELECT count(*) FROM calls WHERE ts_ns >= {lo} AND ts_ns < {hi}"
    ));
    assert!(want > 0 && want < db.int("SELECT count(*) FROM calls"));
    assert_eq!(calls.len() as i64, want);
    assert!(calls.iter().all(|c| {
        let ts = c["ts_ns"].as_i64().unwrap();
        (lo..hi).contains(&ts)
    }));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_empty_or_late_window_is_refused() {
    let duration_ms = {
        let db = Db::open(&demo_db());
        db.int("SELECT (end_mono_ns - start_mono_ns) / 1000000 FROM session")
    };
    for (args, says) in [
        (vec!["--from", "2s", "--to", "1s"], "is not after --from"),
        (vec!["--from", "1s", "--to", "1s"], "is not after --from"),
        (
            vec!["--from", &format!("{}ms", duration_ms + 1000)],
            "the trace lasts only",
        ),
        (vec!["--from", "soon"], "soon"),
    ] {
        for cmd in ["export", "stats", "explain"] {
            let o = gpusleuth()
                .args([cmd, "--db"])
                .arg(demo_db())
                .args(&args)
                .output()
                .expect("run");
            assert_no_panic(&o);
            assert_ne!(o.status.code(), Some(0), "{cmd} {args:?}");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(says), "{cmd} {args:?}: {err}");
            // Ours are one line; clap's (a bad duration) add its usage.
            assert!(
                err.lines().next().unwrap_or("").contains(says),
                "{cmd}: {err}"
            );
            assert!(o.stdout.is_empty(), "{cmd} {args:?}: nothing written");
        }
    }
}

/// `stats` and `explain` of a window: the calls that start in it, counted
/// from the rows themselves; the window in the answer; the kernel-counted
/// launches (no times) left out and said so; a run's directory refused.
#[test]
fn stats_and_explain_of_a_window_answer_for_its_calls() {
    let db = Db::open(&demo_db());
    let start = db.int("SELECT start_mono_ns FROM session");
    let (lo, hi) = (start + 100_000_000, start + 300_000_000);
    let run = |cmd: &str, extra: &[&str]| -> Value {
        let out = common::run_ok(
            gpusleuth()
                .args([cmd, "--json", "--from", "100ms", "--to", "300ms", "--db"])
                .arg(demo_db())
                .args(extra),
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let stats = run("stats", &[]);
    assert_eq!(stats["window"]["from_ns"], 100_000_000);
    assert_eq!(stats["window"]["to_ns"], 300_000_000);
    assert_eq!(stats["window"]["since_mono_ns"], lo);
    let per_op: BTreeMap<String, i64> = stats["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["op"].as_str().unwrap().to_string(),
                o["count"].as_i64().unwrap(),
            )
        })
        .collect();
    let want: BTreeMap<String, i64> = db
        .rows(&format!(
            "SELECT op, count(*) FROM calls WHERE ts_ns >= {lo} AND ts_ns < {hi} GROUP BY op"
        ))
        .into_iter()
        .map(|r| match (&r[0], &r[1]) {
            (SqlValue::Text(op), SqlValue::Integer(n)) => (op.clone(), *n),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(!want.is_empty(), "the window holds calls");
    assert_eq!(per_op, want, "the window's calls, no counted-only row");
    let counted = db.int("SELECT coalesce(sum(count), 0) FROM op_counts");
    let notes = stats["notes"].as_array().unwrap();
    assert_eq!(notes.len(), usize::from(counted > 0), "{notes:?}");
    if counted > 0 {
        assert!(notes[0]
            .as_str()
            .unwrap()
            .starts_with(&format!("{counted} call(s)")));
    }

    let explain = run("explain", &[]);
    assert_eq!(explain["window"], stats["window"]);
    assert!(explain["findings"].is_array() && explain["gpu_activity"].is_object());
    assert!(explain.get("held_memory").is_none(), "a whole-trace fact");
    let text = String::from_utf8(
        common::run_ok(
            gpusleuth()
                .args(["explain", "--from", "100ms", "--to", "300ms", "--db"])
                .arg(demo_db()),
        )
        .stdout,
    )
    .unwrap();
    assert!(
        text.starts_with("Window: the calls that started from 100.00ms to 300.00ms"),
        "{text}"
    );

    // A run's directory: one line, nothing written.
    let dir = out_dir("window-dir");
    for cmd in ["stats", "explain"] {
        let o = gpusleuth()
            .args([cmd, "--from", "1s", "--db"])
            .arg(&dir)
            .output()
            .expect("run");
        assert_no_panic(&o);
        assert_ne!(o.status.code(), Some(0));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("one trace file"), "{cmd}: {err}");
        assert!(o.stdout.is_empty());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn export_of_a_missing_database_is_one_line_error() {
    let o = gpusleuth()
        .args([
            "export",
            "--db",
            "/nonexistent/x.db",
            "-o",
            "/tmp/never.json",
        ])
        .output()
        .expect("run export");
    assert_no_panic(&o);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/x.db"), "{err}");
}

fn report(db: &Path, out: &Path) -> String {
    common::run_ok(
        gpusleuth()
            .args(["report", "--db"])
            .arg(db)
            .arg("-o")
            .arg(out),
    );
    std::fs::read_to_string(out).expect("read report")
}

#[test]
fn report_is_one_self_contained_html_file_with_every_section() {
    let dir = out_dir("report-shape");
    let html = report(&demo_db(), &dir.join("report.html"));
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.trim_end().ends_with("</html>"));
    // Nothing fetched from anywhere: no scripts, stylesheets, images or fonts by URL.
    for bad in [
        "<script", "<link", "<img", "src=", "@import", "url(", "https://",
    ] {
        assert!(!html.contains(bad), "report references {bad}");
    }
    // The only URL is the SVG namespace.
    assert_eq!(
        html.matches("http://").count(),
        html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count()
    );
    for h in [
        "Findings",
        "Device memory per process",
        "Latency per op",
        "Slowest calls",
        "Processes",
    ] {
        assert!(html.contains(&format!("<h2>{h}")), "section {h} missing");
    }
    // Charts: memory, latency, slowest calls.
    assert!(html.matches("<svg").count() >= 3);
    // Ground truth of the demo scenario shows up where it belongs.
    assert!(html.contains("peak 64.0 MiB"), "peak not marked");
    assert!(html.contains("live at end 3.0 MiB"), "leak not shown");
    assert!(
        html.contains("✕ cudaMalloc of"),
        "failed allocation not marked"
    );
    assert!(html.contains("CPU held by gs-hog"), "culprit not named");
    for kind in ["allocation_failure", "cpu_preemption"] {
        assert!(html.contains(kind), "finding {kind} missing");
    }
    // One box row per op with per-call records.
    let db = Db::open(&demo_db());
    for (op, n) in db.text_ints("SELECT op, count(*) FROM calls GROUP BY op") {
        assert!(
            html.contains(&format!("{op}: n={n} ")),
            "no latency row for {op}"
        );
    }
    // The slowest calls: as many bars rows as the cap (the trace has more calls).
    assert_eq!(html.matches("<title>on-CPU ").count(), 15);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `report --from/--to`: the call sections are the window's (its findings
/// as `explain` of the window gives them, one latency row per op with the
/// window's count from the rows, its slowest calls), the charts the whole
/// trace's with the window shaded; a bad window and a run's directory are
/// refused in one line with nothing written.
#[test]
fn report_of_a_window_narrows_its_call_sections() {
    let dir = out_dir("report-window");
    let out = dir.join("w.html");
    common::run_ok(
        gpusleuth()
            .args(["report", "--from", "100ms", "--to", "300ms", "--db"])
            .arg(demo_db())
            .arg("-o")
            .arg(&out),
    );
    let html = std::fs::read_to_string(&out).expect("read report");
    let db = Db::open(&demo_db());
    let start = db.int("SELECT start_mono_ns FROM session");
    let (lo, hi) = (start + 100_000_000, start + 300_000_000);
    let in_window = format!("ts_ns >= {lo} AND ts_ns < {hi}");
    assert!(
        html.contains("<th>Window</th><td>the calls that started from 100.00ms to 300.00ms"),
        "window row missing"
    );
    let window_ops = db.text_ints(&format!(
        "SELECT op, count(*) FROM calls WHERE {in_window} GROUP BY op"
    ));
    assert!(!window_ops.is_empty(), "the window holds calls");
    for (op, n) in &window_ops {
        assert!(
            html.contains(&format!("{op}: n={n} ")),
            "no window row for {op} n={n}"
        );
    }
    for (op, _) in db.text_ints("SELECT op, count(*) FROM calls GROUP BY op") {
        if !window_ops.iter().any(|(o, _)| *o == op) {
            assert!(
                !html.contains(&format!("{op}: n=")),
                "{op} has no call in the window"
            );
        }
    }
    let calls: i64 = window_ops.iter().map(|(_, n)| n).sum();
    assert!(html.contains(&format!("<th>In the window</th><td>{calls} calls,")));
    // The slowest calls: the window's calls not nested in another, up to the cap.
    let top = db.int(&format!(
        "SELECT count(*) FROM calls WHERE {in_window} AND nested = 0"
    ));
    assert_eq!(html.matches("<title>on-CPU ").count() as i64, top.min(15));
    // 100 to 200 ms holds fewer than the cap.
    let narrow = dir.join("narrow.html");
    common::run_ok(
        gpusleuth()
            .args(["report", "--from", "100ms", "--to", "200ms", "--db"])
            .arg(demo_db())
            .arg("-o")
            .arg(&narrow),
    );
    let narrow = std::fs::read_to_string(&narrow).expect("read report");
    let few = db.int(&format!(
        "SELECT count(*) FROM calls WHERE ts_ns >= {lo} AND ts_ns < {} AND nested = 0",
        start + 200_000_000
    ));
    assert!((1..15).contains(&few), "{few}");
    assert_eq!(narrow.matches("<title>on-CPU ").count() as i64, few);
    // The findings are those of `explain` of the same window.
    let explain: Value = serde_json::from_slice(
        &common::run_ok(
            gpusleuth()
                .args([
                    "explain", "--json", "--from", "100ms", "--to", "300ms", "--db",
                ])
                .arg(demo_db()),
        )
        .stdout,
    )
    .expect("JSON");
    let kinds: Vec<&str> = explain["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert!(!kinds.is_empty(), "the window has a finding");
    let findings =
        &html[html.find("<h2>Findings").unwrap()..html.find("<h2>GPU activity").unwrap()];
    for kind in ["allocation_failure", "sync_stall", "cpu_preemption"] {
        assert_eq!(
            findings.contains(kind),
            kinds.contains(&kind),
            "{kind}: {kinds:?}"
        );
    }
    assert!(findings.starts_with("<h2>Findings <span class=\"dim\">(the window)</span></h2>"));
    // The memory chart is the whole trace's (its peak), the window shaded.
    assert!(html.contains("peak 64.0 MiB"));
    assert!(
        html.contains("<title>the report&#39;s window</title>"),
        "no band"
    );
    // The kernel-counted launches: this trace holds no samples, said once.
    let counted = db.int("SELECT coalesce(sum(count), 0) FROM op_counts");
    assert_eq!(
        html.matches("a window cannot place them").count(),
        usize::from(counted > 0)
    );

    // Refusals: one line, nothing written.
    let run_dir = out_dir("report-window-dir");
    let refused = [
        (
            vec!["--from", "2s", "--to", "1s"],
            demo_db(),
            "is not after --from",
        ),
        (vec!["--from", "1h"], demo_db(), "the trace lasts only"),
        (vec!["--from", "1s"], run_dir.clone(), "one trace file"),
    ];
    for (args, input, says) in refused {
        let target = dir.join("refused.html");
        let o = gpusleuth()
            .args(["report", "--db"])
            .arg(&input)
            .args(&args)
            .arg("-o")
            .arg(&target)
            .output()
            .expect("run");
        assert_no_panic(&o);
        assert_ne!(o.status.code(), Some(0), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!target.exists(), "{args:?}: nothing written");
    }
    let _ = std::fs::remove_dir_all(&run_dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Chromium binary, or None (skip with a reason; a failure when CI=true).
fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .filter_map(|name| {
            std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(name))
                    .find(|f| f.is_file())
            })
        })
        .next();
    if found.is_none() {
        let why = "chromium not installed (apt-get install chromium)";
        common::skip_unless_ci("the Chromium test", why);
    }
    found
}

/// Runs headless Chromium (its own `profile`) with `args` on `url`; fails the
/// test with Chromium's stderr unless it exits 0.
fn run_headless(chromium: &Path, profile: &Path, args: &[&str], url: &str) -> std::process::Output {
    let out = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("run chromium {}: {e}", args[0]));
    assert!(
        out.status.success(),
        "chromium {} failed: {}",
        args[0],
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(
        png.len() > 24 && png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG"
    );
    assert_eq!(&png[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&png[16..20]), be(&png[20..24]))
}

#[test]
fn report_renders_in_headless_chromium() {
    let Some(chromium) = chromium() else { return };
    let dir = out_dir("report-chromium");
    let page = dir.join("report.html");
    report(&demo_db(), &page);
    let url = format!("file://{}", page.display());

    // The browser's DOM after parsing: the charts are SVG elements with content.
    let dom = run_headless(&chromium, &dir.join("profile-dom"), &["--dump-dom"], &url);
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.matches("<svg").count() >= 3,
        "charts missing from the DOM"
    );
    assert!(
        dom.matches("<rect").count() >= 15 * 3,
        "bars missing from the DOM"
    );
    assert!(dom.contains("<path"), "memory line missing from the DOM");

    // A screenshot: exists, has the asked size and is far from blank (a
    // near-blank page of this size is about 14 KB; this report about 290 KB).
    let png = dir.join("report.png");
    run_headless(
        &chromium,
        &dir.join("profile-shot"),
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1280,2400",
        ],
        &url,
    );
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert_eq!(png_size(&bytes), (1280, 2400));
    assert!(
        bytes.len() > 60_000,
        "screenshot is nearly blank: {} bytes",
        bytes.len()
    );
    if std::env::var_os("GPUSLEUTH_KEEP_TEST_DIRS").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `--last D`: the window from D before the trace's end, the same as the
/// `--from` that names that moment; for a trace still being written (no
/// session end) from D before its latest call's end. Conflicts and an
/// empty `--last` are refused.
#[test]
fn last_names_the_end_of_the_trace() {
    let stats = |db: &Path, args: &[&str]| -> Value {
        let out = common::run_ok(
            gpusleuth()
                .args(["stats", "--json", "--db"])
                .arg(db)
                .args(args),
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let db = Db::open(&demo_db());
    let (start, end) = (
        db.int("SELECT start_mono_ns FROM session"),
        db.int("SELECT end_mono_ns FROM session"),
    );
    let from = end - 200_000_000 - start;
    let last = stats(&demo_db(), &["--last", "200ms"]);
    let same = stats(&demo_db(), &["--from", &format!("{from}ns")]);
    assert_eq!(last["window"]["from_ns"], from);
    assert_eq!(last["window"]["last_ns"], 200_000_000);
    assert_eq!(last["ops"], same["ops"]);
    assert!(
        !last["ops"].as_array().unwrap().is_empty(),
        "calls in the last 200 ms"
    );

    // Still being written: no session end; the latest call's end stands for it.
    let dir = out_dir("window-last");
    let open = dir.join("open.db");
    std::fs::copy(demo_db(), &open).unwrap();
    rusqlite::Connection::open(&open)
        .unwrap()
        .execute("UPDATE session SET end_mono_ns = NULL", [])
        .unwrap();
    let latest = db.int("SELECT max(ts_ns + dur_ns) FROM calls");
    let w = stats(&open, &["--last", "200ms"]);
    assert_eq!(w["window"]["since_mono_ns"], latest - 200_000_000);

    for (args, says) in [
        (vec!["--last", "0"], "--last 0"),
        (vec!["--last", "1s", "--from", "0"], "cannot be used with"),
    ] {
        let o = gpusleuth()
            .args(["explain", "--db"])
            .arg(demo_db())
            .args(&args)
            .output()
            .expect("run");
        assert_no_panic(&o);
        assert_ne!(o.status.code(), Some(0), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.lines().next().unwrap_or("").contains(says),
            "{args:?}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
