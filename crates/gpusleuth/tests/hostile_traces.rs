//! Hostile-input suite (issue 18): mutated traces through every reading
//! command, each run under a deadline.
//!
//! Mutations of the example traces: byte flips, truncations, schema changes
//! (a recursive view in place of `calls`, dropped and retyped columns,
//! generated columns, expression indexes, an index whose definition no
//! longer matches its content), huge strings, negative and far-future
//! values, unknown op names, terminal escape sequences in process names.
//! Every run must end within its deadline, never panic, and never succeed on
//! a file that SQLite's own `PRAGMA integrity_check` calls damaged (the
//! ground truth comes from SQLite, not from gpusleuth). Files that are
//! intact but hold unusable rows must say so, with counts.

#[path = "common/mcp_stdio.rs"]
mod mcp_stdio;

// The MCP client's way of starting the binary, for the plain runs too.
use mcp_stdio::bin::gpusleuth_with;

use mcp_stdio::McpStdio;
use rusqlite::Connection;
#[path = "common/skip.rs"]
mod skip;
#[path = "common/temp_dir.rs"]
#[allow(dead_code)] // join() is for the library crates' tests
mod temp_dir;
use temp_dir::TempDir;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Per run; a debug build on a busy 2-core CI machine reads the example in well under a second.
const DEADLINE: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Runs gpusleuth with a deadline; a run past it is killed and reported as a hang.
fn run(args: &[&str]) -> Run {
    run_into(args, None)
}

/// [`run`] with stdout redirected to the file `into` (created anew) where
/// given, its bytes read back as the run's stdout: an export's stdout
/// that is a regular file is written as `-o` writes (round 46).
fn run_into(args: &[&str], into: Option<&Path>) -> Run {
    let t0 = Instant::now();
    let stdout = match into {
        Some(path) => Stdio::from(std::fs::File::create(path).expect("stdout file")),
        None => Stdio::piped(),
    };
    let mut child = gpusleuth_with(Stdio::null(), stdout, Stdio::piped())
        .args(args)
        .spawn()
        .expect("spawn gpusleuth");
    // Drain both pipes on threads so a chatty run cannot block on a full pipe.
    let mut out: Box<dyn std::io::Read + Send> = match child.stdout.take() {
        Some(pipe) => Box::new(pipe),
        None => Box::new(std::io::empty()),
    };
    let mut err = child.stderr.take().expect("stderr");
    let to = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut s);
        s
    });
    let te = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut s);
        s
    });
    let code = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st.code();
        }
        if t0.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("HANG: gpusleuth {args:?} ran past {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let piped = to.join().expect("stdout thread");
    let written = match into {
        Some(p) => std::fs::read(p).expect("read stdout file"),
        None => piped,
    };
    Run {
        code,
        stdout: String::from_utf8_lossy(&written).into_owned(),
        stderr: String::from_utf8_lossy(&te.join().expect("stderr thread")).into_owned(),
        elapsed: t0.elapsed(),
    }
}

/// SQLite's own verdict on the file, independent of gpusleuth.
fn sqlite_says_intact(path: &Path) -> bool {
    let Ok(c) = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    ) else {
        return false;
    };
    c.query_row("PRAGMA integrity_check(1)", [], |r| r.get::<_, String>(0))
        .is_ok_and(|v| v == "ok")
}

/// Deterministic pseudo-random numbers (xorshift64*), so every CI run mutates the same bytes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Case {
    name: String,
    path: PathBuf,
    /// Rows the readers must skip and say so ("skipped" appears in the output).
    expect_skip_warning: bool,
}

fn copy_of(dir: &Path, src: &Path, name: &str) -> PathBuf {
    let p = dir.join(format!("{name}.db"));
    std::fs::copy(src, &p).expect("copy example");
    p
}

fn sql_edit(path: &Path, sql: &str) {
    let c = Connection::open(path).expect("open copy");
    c.execute_batch(sql)
        .unwrap_or_else(|e| panic!("mutation {sql:?}: {e}"));
}

/// The SQL-mutated copies of the large example, in order: case name, file
/// stem, the mutation, and whether readers must skip rows and say so.
const SQL_MUTATIONS: &[(&str, &str, &str, bool)] = &[
    // Schema changes.
    (
        "recursive_view",
        "view",
        "DROP VIEW calls_wall; DROP VIEW op_summary; DROP VIEW call_culprits_named;
         ALTER TABLE calls RENAME TO calls_real;
         CREATE VIEW calls AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r)
           SELECT c.* FROM calls_real c, r;",
        false,
    ),
    (
        "dropped_column",
        "dropcol",
        "ALTER TABLE notes DROP COLUMN level;",
        false,
    ),
    (
        "generated_column",
        "generated",
        "ALTER TABLE processes ADD COLUMN g TEXT GENERATED ALWAYS AS (printf('%.*c', 100000, 'x')) VIRTUAL;",
        false,
    ),
    (
        "expression_index",
        "exprindex",
        "CREATE INDEX evil ON calls(instr(op, 'x'));",
        false,
    ),
    (
        "foreign_tool",
        "foreign",
        "UPDATE meta SET value = 'other' WHERE key = 'tool';",
        false,
    ),
    // An index whose declared columns no longer match what it holds:
    // structurally sound (quick_check passes), wrong content.
    (
        "index_mismatch",
        "badindex",
        "PRAGMA writable_schema = ON;
         UPDATE sqlite_master SET sql = 'CREATE INDEX calls_pid_op ON calls(tid, op)' WHERE name = 'calls_pid_op';",
        false,
    ),

    // Values.
    (
        "negative_duration",
        "negdur",
        "UPDATE calls SET dur_ns = -5 WHERE id = (SELECT min(id) FROM calls);",
        true,
    ),
    (
        "far_future",
        "future",
        "UPDATE calls SET ts_ns = 9223372036854775807, dur_ns = 9223372036854775807
           WHERE id IN (SELECT id FROM calls ORDER BY id LIMIT 3);
         UPDATE waits SET on_ns = 9223372036854775807 WHERE id = (SELECT min(id) FROM waits);
         UPDATE processes SET start_ns = -1, exit_ns = 9223372036854775807;",
        true,
    ),
    (
        "negative_size",
        "negsize",
        "UPDATE calls SET size = -1 WHERE size IS NOT NULL;",
        true,
    ),
    (
        "unknown_ops",
        "unknownop",
        "UPDATE calls SET op = 'cudaFrobnicate' WHERE id IN (SELECT id FROM calls ORDER BY id LIMIT 5);
         UPDATE calls SET op = printf('%.*c', 1000000, 'Z') WHERE id = (SELECT max(id) FROM calls);",
        true,
    ),
    (
        "huge_strings",
        "huge",
        "UPDATE processes SET comm = printf('%.*c', 70000, 'c'), cmdline = printf('%.*c', 1000000, 'a');
         UPDATE call_culprits SET comm = printf('%.*c', 70000, 'k');
         UPDATE wait_culprits SET comm = printf('%.*c', 70000, 'k');
         INSERT INTO notes(ts_ns, level, text) VALUES (0, 'warn', printf('%.*c', 1000000, 'n'));",
        false,
    ),
    (
        "escape_sequences",
        "escapes",
        "UPDATE processes SET comm = char(27) || '[2J' || char(27) || ']0;pwned' || char(7) || 'x';
         UPDATE call_culprits SET comm = char(27) || '[31mred';
         UPDATE wait_culprits SET comm = char(27) || '[31mred';",
        false,
    ),
    // The launch-count samples a window places counted launches by: out
    // of range, decreasing, unknown ops, text where numbers go, out of order.
    (
        "crafted_count_samples",
        "countsamples",
        "CREATE TABLE op_count_samples(ts_ns INTEGER NOT NULL, pid INTEGER NOT NULL, op TEXT NOT NULL, count INTEGER NOT NULL);
         CREATE INDEX op_count_samples_pid ON op_count_samples(pid, ts_ns);
         INSERT INTO op_count_samples SELECT s.start_mono_ns + 2000000000, o.pid, o.op, 9223372036854775807 FROM op_counts o, session s;
         INSERT INTO op_count_samples SELECT s.start_mono_ns + 1000000000, o.pid, o.op, 5 FROM op_counts o, session s;
         INSERT INTO op_count_samples SELECT s.start_mono_ns + 1500000000, o.pid, o.op, 3 FROM op_counts o, session s;
         INSERT INTO op_count_samples SELECT -1, o.pid, o.op, -7 FROM op_counts o;
         INSERT INTO op_count_samples SELECT 9223372036854775807, o.pid, 'cudaFrobnicate', 1 FROM op_counts o;
         INSERT INTO op_count_samples SELECT 'x', -3, o.op, 'y' FROM op_counts o;",
        false,
    ),
    (
        "wrong_type",
        "wrongtype",
        "UPDATE calls SET pid = 'x' WHERE id = (SELECT min(id) FROM calls);",
        false,
    ),
];

fn cases(dir: &Path) -> Vec<Case> {
    let small = repo().join("examples/demo-sim.db");
    let big = repo().join("examples/h200-contention.db");
    let mut out = Vec::new();
    let mut add = |name: &str, path: PathBuf, warn: bool| {
        out.push(Case {
            name: name.to_string(),
            path,
            expect_skip_warning: warn,
        })
    };

    // Byte flips anywhere past the 100-byte header, and a few in it.
    let bytes = std::fs::read(&small).expect("read example");
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for i in 0..30 {
        let mut b = bytes.clone();
        let flips = 1 + rng.below(8);
        for _ in 0..flips {
            let at = if i % 10 == 9 {
                rng.below(100)
            } else {
                100 + rng.below(b.len() as u64 - 100)
            } as usize;
            b[at] ^= 1 << rng.below(8);
        }
        let p = dir.join(format!("flip{i}.db"));
        std::fs::write(&p, &b).expect("write flipped");
        add(&format!("flip{i}"), p, false);
    }
    // Truncations.
    for (i, len) in [0usize, 100, 4096, bytes.len() / 2, bytes.len() - 4096]
        .into_iter()
        .enumerate()
    {
        let p = dir.join(format!("trunc{i}.db"));
        std::fs::write(&p, &bytes[..len]).expect("write truncated");
        add(&format!("trunc{i}"), p, false);
    }

    for &(name, file, sql, warn) in SQL_MUTATIONS {
        let p = copy_of(dir, &big, file);
        sql_edit(&p, sql);
        add(name, p, warn);
    }
    out
}

/// Every command that reads a trace, with fresh output paths.
fn commands(db: &str, out_dir: &Path, tag: &str) -> Vec<Vec<String>> {
    let o = |ext: &str| out_dir.join(format!("{tag}.{ext}")).display().to_string();
    [
        vec!["stats", "--db", db],
        vec!["stats", "--db", db, "--json"],
        vec!["explain", "--db", db],
        vec!["explain", "--db", db, "--json"],
        // A window: its calls through the indexes, its threads' waits.
        vec!["stats", "--db", db, "--from", "1ms", "--to", "2s"],
        vec![
            "explain", "--db", db, "--from", "1ms", "--to", "2s", "--json",
        ],
        vec!["memory", "--db", db],
        vec!["memory", "--db", db, "--json"],
        vec!["report", "--db", db, "-o", &o("html")],
        // A window: its calls streamed, its slowest calls' waits by index.
        vec![
            "report",
            "--db",
            db,
            "--from",
            "1ms",
            "--to",
            "2s",
            "-o",
            &o("w.html"),
        ],
        vec![
            "export",
            "--db",
            db,
            "--format",
            "perfetto",
            "-o",
            &o("json"),
        ],
        // Perfetto's protobuf: the same frame, its calls read side by side.
        vec![
            "export",
            "--db",
            db,
            "--format",
            "pftrace",
            "-o",
            &o("pftrace"),
        ],
        // To stdout: the calls' order proved by a pass over their keys
        // before the first is written (into a file, straight through the
        // buffer and written again where it cannot place one; round 45).
        vec!["export", "--db", db, "--format", "json"],
        // A window: calls and waits read per thread through the indexes.
        vec![
            "export",
            "--db",
            db,
            "--from",
            "1ms",
            "--to",
            "2s",
            "-o",
            &o("w.json"),
        ],
        vec!["query", "--db", db, "SELECT * FROM processes"],
    ]
    .into_iter()
    .map(|v| v.into_iter().map(String::from).collect())
    .collect()
}

/// A run's directory in `dir` whose first part is a good trace and whose
/// second is `case`'s file; its path.
fn run_after_a_good_part(dir: &Path, case: &Case) -> String {
    let run_dir = dir.join(format!("run-{}", case.name));
    std::fs::create_dir_all(&run_dir).expect("run dir");
    std::fs::copy(
        repo().join("examples/demo-sim.db"),
        run_dir.join("part-000001.db"),
    )
    .expect("first part");
    let _ = std::fs::copy(&case.path, run_dir.join("part-000002.db"));
    run_dir.display().to_string()
}

/// A run's directory in `dir` whose only part is `case`'s file (the first
/// file of a run is read by every moment of it); its path.
fn run_of_the_file_alone(dir: &Path, case: &Case) -> String {
    let run_dir = dir.join(format!("alone-{}", case.name));
    std::fs::create_dir_all(&run_dir).expect("run dir");
    let _ = std::fs::copy(&case.path, run_dir.join("part-000001.db"));
    run_dir.display().to_string()
}

#[test]
fn mutated_traces_through_every_command() {
    let tmp = TempDir::new("hostile");
    let dir = tmp.0.as_path();
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).expect("out dir");
    let cases = cases(dir);
    let mut failures = Vec::new();
    let mut runs = 0;
    let mut slowest = Duration::ZERO;
    for case in &cases {
        let intact = sqlite_says_intact(&case.path);
        let db = case.path.display().to_string();
        let before = std::fs::read(&case.path).unwrap_or_default();
        // The file as the newest part of a run (`--last` of the directory
        // reads it, after the earlier part's pinning calls; `--last 1h`
        // spans both parts: each file's part of the window added up).
        let run_db = run_after_a_good_part(dir, case);
        let mut all = commands(&db, &out_dir, &format!("{}-{i}", case.name, i = runs));
        // The run's memory ledger and per-site table over both parts; its
        // report, whole and of a window over both.
        all.push(
            ["memory", "--db", &run_db, "--json"]
                .map(String::from)
                .to_vec(),
        );
        all.push(
            ["memory", "--by-site", "--db", &run_db, "--json"]
                .map(String::from)
                .to_vec(),
        );
        // The run's ledger and per-site table at a moment of its first
        // file (the file alone in a run: a moment always reads it).
        let alone = run_of_the_file_alone(dir, case);
        for by_site in [None, Some("--by-site")] {
            let mut args = vec!["memory", "--db", &alone, "--at", "1ms", "--json"];
            args.extend(by_site);
            all.push(args.into_iter().map(String::from).collect());
        }
        let html = out_dir.join(format!("{}-run.html", case.name));
        let html = html.display().to_string();
        for last in [None, Some("1h")] {
            let mut args = vec!["report", "--force", "--db", &run_db, "-o", &html];
            args.extend(last.map(|l| ["--last", l]).into_iter().flatten());
            all.push(args.into_iter().map(String::from).collect());
        }
        // Its export of a window over both parts, in both formats, and whole.
        let exported = out_dir.join(format!("{}-run.json", case.name));
        let exported = exported.display().to_string();
        for format in ["perfetto", "json", "pftrace"] {
            all.push(
                [
                    "export", "--force", "--format", format, "--last", "1h", "--db", &run_db, "-o",
                    &exported,
                ]
                .map(String::from)
                .to_vec(),
            );
        }
        all.push(
            ["export", "--force", "--db", &run_db, "-o", &exported]
                .map(String::from)
                .to_vec(),
        );
        for cmd in ["stats", "explain"] {
            for last in ["100ms", "1h"] {
                all.push(
                    [cmd, "--db", &run_db, "--last", last, "--json"]
                        .map(String::from)
                        .to_vec(),
                );
            }
        }
        for (i, args) in all.iter().enumerate() {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let r = run(&args);
            runs += 1;
            slowest = slowest.max(r.elapsed);
            let what = format!("{} {:?} (cmd {i})", case.name, &args[..1]);
            if args[0] == "export" && !args.contains(&"-o") {
                // Stdout a regular file: read straight through the reorder
                // buffer, taken back and written again where it cannot
                // place a call (round 46): what the pipe got, or the same
                // failure.
                let file = dir.join("stdout");
                let f = run_into(&args, Some(&file));
                runs += 1;
                slowest = slowest.max(f.elapsed);
                if (f.code, f.code == Some(0) && f.stdout != r.stdout) != (r.code, false) {
                    failures.push(format!(
                        "{what}: stdout to a file (exit {:?}) differs from stdout to a pipe (exit {:?}): {}",
                        f.code,
                        r.code,
                        f.stderr.trim().chars().take(300).collect::<String>()
                    ));
                }
            }
            if r.code == Some(101) || r.stderr.contains("panicked") {
                failures.push(format!("PANIC {what}: {}", r.stderr.trim()));
            } else if r.code.is_none() {
                failures.push(format!("KILLED BY SIGNAL {what}"));
            } else if !intact && r.code == Some(0) {
                failures.push(format!(
                    "WRONG SUCCESS {what}: SQLite says the file is damaged, gpusleuth exited 0"
                ));
            }
            if r.code != Some(0) {
                let lines = r.stderr.trim().lines().count();
                if lines != 1 {
                    failures.push(format!(
                        "{what}: a failure must be one line on stderr, got {lines}: {}",
                        r.stderr.chars().take(400).collect::<String>()
                    ));
                }
            }
            // `query` answers with the rows as stored (a -5 stays -5): raw
            // SQL shows the damage itself instead of skipping it.
            if case.expect_skip_warning
                && args[0] != "query"
                && r.code == Some(0)
                && !(r.stderr.contains("skipped") || r.stdout.contains("skipped"))
            {
                failures.push(format!("{what}: unusable rows not reported"));
            }
            if args[0] != "query" && !args.contains(&"--json") {
                // Human output carries no raw escape character from the file.
                if r.stdout.contains('\x1b') || r.stderr.contains('\x1b') {
                    failures.push(format!("{what}: raw ESC reached the terminal"));
                }
            }
        }
        // Reading never writes the input nor leaves -wal/-shm beside it.
        let after = std::fs::read(&case.path).unwrap_or_default();
        if before != after {
            failures.push(format!("{}: the input file changed", case.name));
        }
        for side in ["-wal", "-shm"] {
            let p = PathBuf::from(format!("{db}{side}"));
            if p.exists() {
                failures.push(format!("{}: {side} created beside the input", case.name));
            }
        }
    }
    eprintln!(
        "hostile traces: {} files, {runs} runs, slowest {slowest:?}, {} failures",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same mutated traces through every trace tool of the MCP server.
#[test]
fn mutated_traces_through_every_mcp_tool() {
    let tmp = TempDir::new("hostile-mcp");
    let dir = tmp.0.as_path();
    let cases = cases(dir);
    let mut server = McpStdio::start(&["--trace-dir".as_ref(), dir.as_os_str()], DEADLINE);
    let mut failures = Vec::new();
    let mut calls = 0;
    for case in &cases {
        let intact = sqlite_says_intact(&case.path);
        let db = case.path.display().to_string();
        // The file as the newest part of a run under the served directory:
        // the tools that answer over a run read it after a good part.
        let run = run_after_a_good_part(dir, case);
        let hour = 3_600_000_000_000u64;
        // The file alone in a run, at a moment 1 ms after its start (as
        // stored, when SQLite can read it: else a moment outside it).
        let alone = run_of_the_file_alone(dir, case);
        let start: i64 = rusqlite::Connection::open_with_flags(
            &case.path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .and_then(|c| c.query_row("SELECT start_mono_ns FROM session", [], |r| r.get(0)))
        .unwrap_or(0);
        let moment = start.saturating_add(1_000_000).max(0);
        let tools = [
            ("memory", serde_json::json!({"db": alone, "at_ns": moment})),
            ("overview", serde_json::json!({"db": run})),
            ("latency_stats", serde_json::json!({"db": run})),
            (
                "latency_stats",
                serde_json::json!({"db": run, "last_ns": hour}),
            ),
            ("findings", serde_json::json!({"db": run})),
            ("findings", serde_json::json!({"db": run, "last_ns": hour})),
            ("memory", serde_json::json!({"db": run})),
            ("slow_calls", serde_json::json!({"db": run})),
            ("gpu_activity", serde_json::json!({"db": run})),
            ("call_sites", serde_json::json!({"db": run})),
            (
                "timeline",
                serde_json::json!({"db": run, "pid": 1, "at_ns": 0}),
            ),
            ("overview", serde_json::json!({"db": db})),
            ("latency_stats", serde_json::json!({"db": db})),
            ("findings", serde_json::json!({"db": db})),
            ("slow_calls", serde_json::json!({"db": db})),
            ("memory", serde_json::json!({"db": db})),
            (
                "timeline",
                serde_json::json!({"db": db, "pid": 1, "at_ns": 0}),
            ),
            (
                "sql",
                serde_json::json!({"db": db, "query": "SELECT * FROM processes"}),
            ),
        ];
        for (tool, args) in tools {
            let r = server.call(
                "tools/call",
                serde_json::json!({"name": tool, "arguments": args}),
            );
            calls += 1;
            let is_error = r["result"]["isError"] == true || r.get("error").is_some();
            let text = r["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if text.contains("internal error in the tool") {
                failures.push(format!("PANIC {} {tool}: {text}", case.name));
            } else if !intact && !is_error {
                failures.push(format!(
                    "WRONG SUCCESS {} {tool}: SQLite says the file is damaged",
                    case.name
                ));
            }
            if case.expect_skip_warning && tool == "findings" && !is_error {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                if v["clean"] == true || v["input_problems"].is_null() {
                    failures.push(format!(
                        "{} findings: skipped rows not reported: {text:.300}",
                        case.name
                    ));
                }
            }
        }
    }
    // Still answering after all of it.
    let r = server.call("tools/list", serde_json::json!({}));
    assert!(r["result"]["tools"].is_array(), "{r}");
    eprintln!(
        "hostile traces over MCP: {} files, {calls} tool calls, {} failures",
        cases.len(),
        failures.len()
    );
    drop(server);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The repros of issue 18, one by one, with their exact expectations.
#[test]
fn damaged_values_are_reported_with_counts() {
    let tmp = TempDir::new("hostile-repro");
    let dir = tmp.0.as_path();
    let big = repo().join("examples/h200-contention.db");

    let p = copy_of(dir, &big, "neg");
    sql_edit(
        &p,
        "UPDATE calls SET dur_ns = -5 WHERE id IN (SELECT id FROM calls ORDER BY id LIMIT 2);",
    );
    let r = run(&["stats", "--db", p.to_str().expect("utf8")]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(!r.stdout.contains("18446744073"), "{}", r.stdout);
    assert!(r.stderr.contains("2 calls skipped"), "{}", r.stderr);

    let p = copy_of(dir, &big, "unk");
    sql_edit(&p, "UPDATE calls SET op = 'cudaFrobnicate';");
    let r = run(&["explain", "--db", p.to_str().expect("utf8")]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        !r.stdout.contains("No abnormal behaviour found"),
        "a trace whose every call was skipped is not clean: {}",
        r.stdout
    );
    assert!(r.stdout.contains("cudaFrobnicate"), "{}", r.stdout);

    let p = copy_of(dir, &big, "esc");
    sql_edit(
        &p,
        "UPDATE processes SET comm = char(27) || '[2J' || char(27) || ']0;title' || char(7);
         UPDATE call_culprits SET comm = char(27) || '[2J';",
    );
    for cmd in ["explain", "memory", "stats"] {
        let r = run(&[cmd, "--db", p.to_str().expect("utf8")]);
        assert_eq!(r.code, Some(0), "{cmd}: {}", r.stderr);
        assert!(!r.stdout.contains('\x1b'), "{cmd}: {:?}", r.stdout);
    }

    let r = run(&[
        "query",
        "--db",
        big.to_str().expect("utf8"),
        "SELECT printf('%.*c', 65536, 'a') AS wide",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
}

/// A WAL-mode trace is read without creating `-wal`/`-shm` beside it.
#[test]
fn reading_a_wal_trace_leaves_no_files_beside_it() {
    let tmp = TempDir::new("hostile-wal");
    let dir = tmp.0.as_path();
    let p = copy_of(dir, &repo().join("examples/h200-contention.db"), "wal");
    sql_edit(&p, "PRAGMA journal_mode = WAL;");
    for side in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{side}", p.display()));
    }
    let db = p.to_str().expect("utf8");
    for args in [
        vec!["stats", "--db", db],
        vec!["query", "--db", db, "SELECT count(*) FROM calls"],
    ] {
        let r = run(&args);
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        for side in ["-wal", "-shm"] {
            assert!(
                !Path::new(&format!("{db}{side}")).exists(),
                "{args:?} created {side}"
            );
        }
    }
}

/// The MCP server remembers the checks a file passed (docs/mcp.md), so a
/// file damaged after a clean answer must be checked again: written in
/// place, or replaced by a rename. The damage (an index whose definition
/// no longer matches its content) is one only the check finds: reading
/// the rows alone answers, wrongly.
#[test]
fn mcp_server_checks_a_file_again_after_it_changes() {
    let tmp = TempDir::new("hostile-mcp-changed");
    let dir = tmp.0.as_path();
    let big = repo().join("examples/h200-contention.db");
    let in_place = copy_of(dir, &big, "inplace");
    let replaced = copy_of(dir, &big, "replaced");
    // (`calls_pid_op` on `(tid, op)`, the suite's own case, holds the same
    // entries in this single-threaded trace: SQLite calls that intact.)
    let damage = "PRAGMA writable_schema = ON;
         UPDATE sqlite_master SET sql = 'CREATE INDEX calls_op_dur ON calls(op, ts_ns)' WHERE name = 'calls_op_dur';";
    let bad = copy_of(dir, &big, "bad");
    sql_edit(&bad, damage);
    assert!(!sqlite_says_intact(&bad));
    // Files written within 2 s of a check are not remembered: let them settle.
    std::thread::sleep(Duration::from_millis(2200));
    let mut server = McpStdio::start(&["--trace-dir".as_ref(), dir.as_os_str()], DEADLINE);
    let mut ask = |path: &Path| {
        let db = path.display().to_string();
        let mut errors = Vec::new();
        for (tool, args) in [
            ("findings", serde_json::json!({"db": db})),
            (
                "sql",
                serde_json::json!({"db": db, "query": "SELECT count(*) FROM calls"}),
            ),
        ] {
            let r = server.call(
                "tools/call",
                serde_json::json!({"name": tool, "arguments": args}),
            );
            errors.push(r["result"]["isError"] == true);
        }
        errors
    };
    for p in [&in_place, &replaced] {
        assert_eq!(ask(p), [false, false], "{} intact", p.display());
        assert_eq!(
            ask(p),
            [false, false],
            "{} intact, asked again",
            p.display()
        );
    }
    sql_edit(&in_place, damage);
    assert!(!sqlite_says_intact(&in_place));
    assert_eq!(ask(&in_place), [true, true], "written in place");
    std::fs::rename(&bad, &replaced).expect("rename");
    assert_eq!(ask(&replaced), [true, true], "renamed over");
}

/// Mutations of a version 5 trace with PyTorch allocator events (the
/// allocator rows behind the `allocator_events` view, words as integers,
/// a row's left-out words in the row `base_back` rows before it, the start
/// from the end and `dur_ns`, the rows read by id as its meta says they
/// are in completion order),
/// each with the stored views removed so that every reader rebuilds them
/// from the rows: no panic, no hang, no success on a file SQLite calls
/// damaged, a failure in one line.
const ALLOCATOR_MUTATIONS: &[(&str, &str)] = &[
    ("text_word", "UPDATE allocator_rows SET w3 = 'x' WHERE id = 5;"),
    (
        "huge_words",
        "UPDATE allocator_rows SET w7 = -1, w8 = 9223372036854775807, w10 = -2;",
    ),
    (
        "unknown_op_id",
        "UPDATE allocator_rows SET op_id = 9999 WHERE id % 3 = 0;",
    ),
    (
        "bad_times",
        "UPDATE allocator_rows SET end_ns = -1 WHERE id = 2;
         UPDATE allocator_rows SET dur_ns = -9223372036854775807 WHERE id = 3;
         UPDATE allocator_rows SET end_ns = 0 WHERE id = 9;",
    ),
    (
        "base_is_itself",
        "UPDATE allocator_rows SET base_back = 0, w3 = NULL WHERE id % 2 = 0;",
    ),
    (
        "base_is_gone",
        "UPDATE allocator_rows SET base_back = id + 5, w1 = NULL WHERE id = 4;",
    ),
    (
        "base_is_later_or_text",
        "UPDATE allocator_rows SET base_back = -1, w5 = NULL WHERE id % 5 = 0;
         UPDATE allocator_rows SET base_back = 'x' WHERE id % 5 = 1;
         UPDATE allocator_rows SET base_back = -9223372036854775807, w2 = NULL WHERE id = 7;",
    ),
    (
        "odd_durations_and_threads",
        "UPDATE allocator_rows SET dur_ns = -5000000000 WHERE id % 4 = 1;
         UPDATE allocator_rows SET dur_ns = -9223372036854775807 WHERE id % 4 = 2;
         UPDATE allocator_rows SET dur_ns = 'x', tid = 'y' WHERE id % 4 = 3;
         UPDATE allocator_rows SET tid = -1 WHERE id % 9 = 0;",
    ),
    (
        "out_of_the_order_meta_says",
        "UPDATE allocator_rows SET end_ns = end_ns + 1000000 WHERE id % 7 = 3;",
    ),
    (
        "order_unsaid",
        "DELETE FROM meta WHERE key = 'allocator_rows_in_end_order';
         UPDATE allocator_rows SET end_ns = end_ns + 1000000 WHERE id % 7 = 3;",
    ),
    (
        "base_leaves_it_out_too",
        "UPDATE allocator_rows SET base_back = -1, w2 = NULL, w6 = NULL WHERE id % 3 = 0;
         UPDATE allocator_rows SET w6 = NULL WHERE id % 3 = 1;",
    ),
    (
        "recursive_view",
        "DROP VIEW allocator_events;
         CREATE VIEW allocator_events AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r)
           SELECT a.id AS id, a.end_ns - a.dur_ns AS start_ns, a.end_ns AS end_ns, a.pid AS pid, a.tid AS tid,
                  'DeviceCachingAllocator::malloc' AS op, a.requested AS requested, a.block AS block,
                  a.stack_id AS stack_id, a.w0 AS w0, a.w1 AS w1, a.w2 AS w2, a.w3 AS w3, a.w4 AS w4,
                  a.w5 AS w5, a.w6 AS w6, a.w7 AS w7, a.w8 AS w8, a.w9 AS w9, a.w10 AS w10,
                  a.w11 AS w11, a.w12 AS w12, a.w13 AS w13, a.w14 AS w14, a.w15 AS w15
           FROM allocator_rows a, r;",
    ),
    (
        "table_for_view",
        "DROP VIEW allocator_events;
         CREATE TABLE allocator_events AS SELECT * FROM allocator_rows;",
    ),
];

/// Six copies of `src` in `dir` (`PREFIX-flipN.db`), each with 1 to 8
/// bits flipped past the 100-byte header; with their case names.
fn byte_flips(dir: &Path, src: &Path, seed: u64, prefix: &str) -> Vec<(String, PathBuf)> {
    let bytes = std::fs::read(src).expect("read the trace");
    let mut rng = Rng(seed);
    (0..6)
        .map(|i| {
            let mut b = bytes.clone();
            for _ in 0..1 + rng.below(8) {
                let at = 100 + rng.below(b.len() as u64 - 100) as usize;
                b[at] ^= 1 << rng.below(8);
            }
            let p = dir.join(format!("{prefix}-flip{i}.db"));
            std::fs::write(&p, &b).expect("write flipped");
            (format!("flip{i}"), p)
        })
        .collect()
}

/// What is wrong with run `r` of `what` on a file SQLite calls `intact` or
/// not: a panic, a signal, a success on a damaged file, a failure in more
/// than one line.
fn faults(r: &Run, what: &str, intact: bool) -> Vec<String> {
    let mut out = Vec::new();
    if r.code == Some(101) || r.stderr.contains("panicked") {
        out.push(format!("PANIC {what}: {}", r.stderr.trim()));
    } else if r.code.is_none() {
        out.push(format!("KILLED BY SIGNAL {what}"));
    } else if !intact && r.code == Some(0) {
        out.push(format!("WRONG SUCCESS {what}: the file is damaged"));
    }
    if r.code != Some(0) && r.stderr.trim().lines().count() != 1 {
        out.push(format!("{what}: not one line: {}", r.stderr.trim()));
    }
    out
}

/// A small synthetic trace with allocator events, written by this build
/// (the bench's), at `dir/alloc.db`.
fn allocator_trace(dir: &Path) -> PathBuf {
    let good = dir.join("alloc.db");
    let r = run(&[
        "bench",
        "--analysis-only",
        "--analysis-calls",
        "6400",
        "--analysis-allocator",
        "--keep-trace",
        good.to_str().expect("utf8"),
    ]);
    assert_eq!(r.code, Some(0), "bench: {}", r.stderr);
    good
}

#[test]
fn mutated_allocator_traces_through_the_allocator_readers() {
    let tmp = TempDir::new("hostile-alloc");
    let dir = tmp.0.as_path();
    let good = allocator_trace(dir);
    // Each mutation twice: without the stored views (every reader rebuilds
    // them from the rows) and with them (a moment's and a window's views are
    // then fed by the ledger's pass, `step_feed`: only those commands run).
    let mut cases: Vec<(String, PathBuf, bool)> = Vec::new();
    for (name, sql) in ALLOCATOR_MUTATIONS {
        let p = copy_of(dir, &good, name);
        sql_edit(
            &p,
            &format!("DELETE FROM meta WHERE key = 'allocator_rollup'; {sql}"),
        );
        cases.push((name.to_string(), p, false));
        let fed = format!("{name}-fed");
        let p = copy_of(dir, &good, &fed);
        sql_edit(&p, sql);
        cases.push((fed, p, true));
    }
    for (name, p) in byte_flips(dir, &good, 0x5eed_a110_c000_0001, "alloc") {
        cases.push((name, p, false));
    }
    let out = dir.join("out.html").display().to_string();
    let mut failures = Vec::new();
    let mut runs = 0;
    for (name, path, fed) in &cases {
        let intact = sqlite_says_intact(path);
        let db = path.display().to_string();
        let all: Vec<Vec<&str>> = vec![
            vec!["memory", "--db", &db, "--json"],
            vec!["memory", "--db", &db, "--segments"],
            vec!["memory", "--db", &db, "--at", "1ms", "--json"],
            vec!["explain", "--db", &db, "--json"],
            vec!["explain", "--db", &db, "--from", "1ms", "--to", "20ms"],
            vec!["report", "--force", "--db", &db, "-o", &out],
            vec![
                "query",
                "--db",
                &db,
                "SELECT * FROM allocator_events LIMIT 3",
            ],
        ];
        let rebuilt = |args: &Vec<&str>| args.contains(&"--at") || args.contains(&"--from");
        for args in all.into_iter().filter(|a| !fed || rebuilt(a)) {
            let r = run(&args);
            runs += 1;
            failures.extend(faults(&r, &format!("{name} {:?}", &args[..1]), intact));
        }
    }
    eprintln!(
        "hostile allocator traces: {} files, {runs} runs, {} failures",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What a tracer's completion adds to a file (round 48), taken away:
/// `scripts/unfinish.sql`.
const UNFINISH: &str = include_str!("../../../scripts/unfinish.sql");

/// Crafted rows of an unfinished file: the completion reads every one.
const UNFINISHED_MUTATIONS: &[(&str, &str)] = &[
    (
        "call_times",
        "UPDATE call_rows SET dur_ns = -5 WHERE id = (SELECT min(id) FROM call_rows);
         UPDATE call_rows SET ts_ns = 9223372036854775807, dur_ns = 9223372036854775807
           WHERE id IN (SELECT id FROM call_rows ORDER BY id LIMIT 3 OFFSET 10);",
    ),
    (
        "call_ids_and_types",
        "UPDATE call_rows SET op_id = 9999 WHERE id % 5 = 0;
         UPDATE call_rows SET tid = 'x' WHERE id = 3;
         UPDATE call_rows SET pid_gap = -9223372036854775807 WHERE id = 4;
         UPDATE call_rows SET nested = 7, runnable_ns = -1, blocked_ns = 9223372036854775807 WHERE id % 7 = 0;",
    ),
    (
        "call_sizes",
        "UPDATE call_rows SET size = -1, ptr = -9223372036854775807 WHERE size IS NOT NULL AND id % 3 = 0;",
    ),
    (
        "waits",
        "UPDATE waits SET blocked_for = -1 WHERE id % 3 = 0;
         UPDATE waits SET runnable_for = 9223372036854775807, kind_id = 9 WHERE id % 3 = 1;",
    ),
    (
        "proc_events",
        "UPDATE proc_events SET ts_ns = -1, kind = 'bogus' WHERE rowid % 2 = 0;
         UPDATE proc_events SET comm = printf('%.*c', 70000, 'c');",
    ),
    (
        "crafted_windows",
        // Never read by the completion of `finish` (made again from the rows).
        "CREATE TABLE thread_windows(pid INTEGER NOT NULL, tid INTEGER NOT NULL, windows TEXT NOT NULL);
         INSERT INTO thread_windows VALUES (100, 100, 'not json'), (-1, 'x', '{\"whole\":[9,1]}');",
    ),
    (
        "tracer_pid",
        "UPDATE stats SET value = -1 WHERE name = 'tracer_pid';
         INSERT OR REPLACE INTO stats(name, value) VALUES ('tracer_pid', 'x');",
    ),
];

#[test]
fn mutated_unfinished_traces_through_finish() {
    // `finish` reads every process's open files first: only root can.
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        skip::skip_unless_ci(
            "finish's hostile test",
            "not root (finish reads /proc/*/fd)",
        );
        return;
    }
    let tmp = TempDir::new("hostile-finish");
    let dir = tmp.0.as_path();
    let good = allocator_trace(dir);
    let base = copy_of(dir, &good, "unfinished");
    sql_edit(&base, UNFINISH);
    // The unmutated file finishes, and answers as the complete one.
    let sane = copy_of(dir, &base, "sane");
    let r = run(&["finish", "--db", sane.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("1 finished"), "{}", r.stdout);
    let answer = |p: &Path| run(&["explain", "--db", p.to_str().unwrap(), "--json"]).stdout;
    assert_eq!(answer(&sane), answer(&good));
    // Every answer over the finished file says what it lacks (round 53:
    // only `stats` did, and only for some files); the complete one none.
    for cmd in ["stats", "explain", "memory", "export"] {
        let said = |p: &Path| {
            let r = run(&[cmd, "--db", p.to_str().unwrap()]);
            assert_eq!(r.code, Some(0), "{cmd}: {}", r.stderr);
            r.stderr.contains("finished by `gpusleuth finish`")
        };
        assert!(said(&sane), "{cmd} of the finished file");
        assert!(!said(&good), "{cmd} of the complete file");
    }

    let mut cases: Vec<(String, PathBuf)> = Vec::new();
    for (name, sql) in UNFINISHED_MUTATIONS.iter().chain(ALLOCATOR_MUTATIONS) {
        let p = copy_of(dir, &base, &format!("u-{name}"));
        sql_edit(&p, sql);
        cases.push((name.to_string(), p));
    }
    // The same rows crafted in a complete file (its rollups then disagree
    // with its rows: the readers of rows skip them as those of a file without).
    for (name, sql) in UNFINISHED_MUTATIONS {
        let p = copy_of(dir, &good, &format!("c-{name}"));
        sql_edit(&p, sql);
        cases.push((format!("complete-{name}"), p));
    }
    cases.extend(byte_flips(dir, &base, 0x5eed_f1a1_54ed_0001, "u"));
    let mut failures = Vec::new();
    let mut runs = 0;
    let html = dir.join("out.html").display().to_string();
    let exported = dir.join("out.json").display().to_string();
    for (name, path) in &cases {
        let intact = sqlite_says_intact(path);
        let db = path.display().to_string();
        let all: Vec<Vec<&str>> = vec![
            vec!["finish", "--db", &db],
            // What the file answers once finished (or as it was left).
            vec!["stats", "--db", &db, "--json"],
            vec!["explain", "--db", &db, "--json"],
            vec!["memory", "--db", &db, "--json"],
            vec!["stats", "--db", &db, "--from", "1ms", "--to", "2s"],
            vec!["report", "--force", "--db", &db, "-o", &html],
            vec!["export", "--force", "--db", &db, "-o", &exported],
        ];
        for args in all {
            let r = run(&args);
            runs += 1;
            failures.extend(faults(&r, &format!("{name} {:?}", &args[..1]), intact));
        }
    }
    eprintln!(
        "hostile unfinished traces through finish: {} files, {runs} runs, {} failures",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
