//! Shared helpers of the end-to-end tests: each test gets its own sandbox
//! (a temp dir with its own copy of the simulated CUDA world, so its own
//! inodes), runs the real `gpusleuth` binary, and reads the trace database.
#![allow(dead_code)] // each test file uses a different subset

use rusqlite::types::Value as SqlValue;
use serde_json::Value;
use sleuth_sim::{materialize, parse_truth, SimPaths, Truth};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

mod skip;
#[allow(unused_imports)] // only the tests that need a tool from outside use it
pub use skip::skip_unless_ci;
pub use skip::skipped;

/// Whether this machine can run the eBPF tests. Without root or BTF: in CI
/// (`CI=true`) the test fails with the reason; elsewhere it prints the reason
/// and the caller returns early.
pub fn require_ebpf() -> bool {
    let reason = if unsafe_geteuid() != 0 {
        Some("not root (eBPF needs CAP_BPF/CAP_PERFMON; run as root)")
    } else if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        Some("no kernel BTF at /sys/kernel/btf/vmlinux")
    } else {
        None
    };
    match reason {
        None => true,
        Some(r) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("eBPF tests must run in CI but cannot: {r}")
        }
        Some(r) => {
            skipped(&format!("eBPF test: {r}"));
            false
        }
    }
}

fn unsafe_geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A temp dir holding a private copy of the simulated CUDA world; removed on drop.
pub struct Sandbox {
    pub dir: PathBuf,
    pub sim: SimPaths,
}

impl Sandbox {
    /// A sandbox for a test that traces: None (the skip already logged by
    /// [`require_ebpf`]) where eBPF cannot run.
    pub fn for_ebpf(tag: &str) -> Option<Sandbox> {
        require_ebpf().then(|| Sandbox::new(tag))
    }

    /// An eBPF sandbox in which `script` was traced with no extra options
    /// and exited 0 (as [`Sandbox::trace`] checks); None where eBPF is
    /// unavailable. The setup most end-to-end tests start from.
    pub fn traced(tag: &str, script: &str) -> Option<Sandbox> {
        Sandbox::traced_with(tag, &[], script)
    }

    /// [`Sandbox::traced`] with `trace` options `args` (`--launches full`,
    /// `--rotate 1s`, ...).
    pub fn traced_with(tag: &str, args: &[&str], script: &str) -> Option<Sandbox> {
        let sb = Sandbox::for_ebpf(tag)?;
        sb.trace(args, script, 0);
        Some(sb)
    }

    pub fn new(tag: &str) -> Sandbox {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("gpusleuth-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create sandbox");
        let sim = materialize(&dir).expect("materialize the simulated CUDA world");
        Sandbox { dir, sim }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn db(&self) -> PathBuf {
        self.path("trace.db")
    }

    pub fn truth_path(&self) -> PathBuf {
        self.path("truth.jsonl")
    }

    /// The workload's own account of the processes it ran (one per process).
    pub fn truth(&self) -> Vec<Truth> {
        let text = std::fs::read_to_string(self.truth_path()).expect("truth file");
        parse_truth(&text).expect("parse truth")
    }

    /// `gpusleuth trace --db <db> --quiet ARGS -- workload --truth <truth> SCRIPT`,
    /// with LD_LIBRARY_PATH naming the sim's libraries (how a user's env finds CUDA).
    pub fn trace_command(&self, args: &[&str], script: &str) -> Command {
        self.trace_command_into(&self.db(), args, script)
    }

    /// [`Sandbox::trace_command`] writing the trace at `db`.
    pub fn trace_command_into(&self, db: &Path, args: &[&str], script: &str) -> Command {
        let mut cmd = gpusleuth();
        cmd.arg("trace").arg("--db").arg(db).arg("--quiet");
        cmd.args(args);
        cmd.arg("--")
            .arg(&self.sim.workload)
            .arg("--truth")
            .arg(self.truth_path())
            .arg(script);
        cmd.env("LD_LIBRARY_PATH", &self.sim.lib_dir);
        cmd
    }

    /// Runs a traced workload to completion and checks the tool exited with `code`.
    pub fn trace(&self, args: &[&str], script: &str, code: i32) -> Output {
        let out = self
            .trace_command(args, script)
            .output()
            .expect("run gpusleuth trace");
        assert_eq!(
            out.status.code(),
            Some(code),
            "gpusleuth trace exited {:?}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_no_panic(&out);
        out
    }

    /// Starts a traced workload without waiting; output goes to files in the
    /// sandbox. With `tracer_cpu`, gpusleuth itself runs on that CPU (the
    /// workload may pin itself elsewhere), so its own work does not contend
    /// with a workload measured for contention.
    pub fn spawn_trace(&self, args: &[&str], script: &str, tracer_cpu: Option<usize>) -> Child {
        let mut cmd = self.trace_command(args, script);
        if let Some(cpu) = tracer_cpu {
            use std::os::unix::process::CommandExt;
            // SAFETY: runs in the forked child before exec; sched_setaffinity is
            // async-signal-safe and the cpu_set_t lives on this stack frame.
            unsafe {
                cmd.pre_exec(move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd.stdout(file_stdio(&self.path("trace.stdout")));
        cmd.stderr(file_stdio(&self.path("trace.stderr")));
        cmd.spawn().expect("spawn gpusleuth trace")
    }

    pub fn open_db(&self) -> Db {
        Db::open(&self.db())
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if std::env::var_os("GPUSLEUTH_KEEP_TEST_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn file_stdio(path: &Path) -> Stdio {
    Stdio::from(std::fs::File::create(path).expect("create output file"))
}

pub fn gpusleuth() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpusleuth"));
    c.env("GPUSLEUTH_CACHE_DIR", test_cache_dir());
    c
}

/// The checks cache of this test process's runs (not the user's own: the
/// runs share it, so the tests exercise it), in cargo's scratch folder
/// for integration tests (`target/tmp`): a test run leaves nothing in the
/// system's temporary folder. The same as `bin.rs`'s: a
/// test file may take both this module and `mcp_stdio.rs` (which takes
/// `bin.rs`), so neither can take the other's file.
pub fn test_cache_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gpusleuth-test-cache-{}", std::process::id()))
}

/// Runs a gpusleuth command to completion; fails the test (with its
/// arguments and stderr) on a panic or a non-zero exit.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run gpusleuth");
    assert_no_panic(&out);
    let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
    assert!(
        out.status.success(),
        "gpusleuth {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Fails the test with the command's stderr unless it exited 0.
pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn assert_no_panic(out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked at"), "gpusleuth panicked:\n{err}");
}

/// Holds the tests of one test binary that measure CPU time apart from each
/// other (each binary has its own lock: cargo runs binaries one at a time).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits for a path to exist, failing the test after `secs` seconds.
pub fn wait_for_file(path: &Path, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for a child, killing it and failing the test after `secs` seconds.
pub fn wait_child(child: &mut Child, secs: u64) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().expect("wait child") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child {} did not finish within {secs} s", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `gpusleuth CMD --json --db DB`, which must succeed without a panic and print JSON.
pub fn command_json(cmd: &str, db: &Path) -> Value {
    let out = gpusleuth()
        .args([cmd, "--json", "--db"])
        .arg(db)
        .output()
        .unwrap_or_else(|e| panic!("run gpusleuth {cmd}: {e}"));
    assert_no_panic(&out);
    assert!(
        out.status.success(),
        "gpusleuth {cmd} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{cmd} --json prints JSON: {e}"))
}

/// `gpusleuth stats --db DB --json`.
pub fn stats_json(db: &Path) -> Value {
    command_json("stats", db)
}

/// `gpusleuth explain --db DB --json`.
pub fn explain_json(db: &Path) -> Value {
    command_json("explain", db)
}

/// The `ops` entry of `stats --json` for (layer, op), if present.
pub fn stats_op<'a>(stats: &'a Value, layer: &str, op: &str) -> Option<&'a Value> {
    stats["ops"]
        .as_array()
        .expect("stats has an 'ops' array")
        .iter()
        .find(|o| o["layer"] == layer && o["op"] == op)
}

/// The count `stats --json` reports for (layer, op); 0 when absent.
pub fn stats_count(stats: &Value, layer: &str, op: &str) -> u64 {
    stats_op(stats, layer, op)
        .map(|o| o["count"].as_u64().expect("count"))
        .unwrap_or(0)
}

/// Read-only access to a trace database.
pub struct Db(rusqlite::Connection);

impl Db {
    pub fn open(path: &Path) -> Db {
        let conn =
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        Db(conn)
    }

    /// Every row of a query, each column as i64 (NULL as 0, text parsed or 0).
    pub fn ints(&self, sql: &str) -> Vec<Vec<i64>> {
        self.rows(sql)
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|v| match v {
                        SqlValue::Integer(i) => i,
                        SqlValue::Real(f) => f as i64,
                        SqlValue::Text(t) => t.parse().unwrap_or(0),
                        _ => 0,
                    })
                    .collect()
            })
            .collect()
    }

    /// The first column of every row of a query, as text (other values
    /// and NULL as "").
    pub fn strings(&self, sql: &str) -> Vec<String> {
        self.rows(sql)
            .into_iter()
            .map(|r| match r.into_iter().next() {
                Some(SqlValue::Text(t)) => t,
                _ => String::new(),
            })
            .collect()
    }

    /// A query expected to yield one integer.
    pub fn int(&self, sql: &str) -> i64 {
        let rows = self.ints(sql);
        assert_eq!(rows.len(), 1, "expected one row from: {sql}");
        rows[0][0]
    }

    pub fn rows(&self, sql: &str) -> Vec<Vec<SqlValue>> {
        let mut stmt = self
            .0
            .prepare(sql)
            .unwrap_or_else(|e| panic!("prepare {sql}: {e}"));
        let n = stmt.column_count();
        let rows = stmt
            .query_map([], |row| {
                (0..n)
                    .map(|i| row.get::<_, SqlValue>(i))
                    .collect::<Result<Vec<_>, _>>()
            })
            .unwrap_or_else(|e| panic!("query {sql}: {e}"));
        rows.collect::<Result<Vec<_>, _>>()
            .unwrap_or_else(|e| panic!("rows of {sql}: {e}"))
    }

    /// A query yielding (text, integer) pairs.
    pub fn text_ints(&self, sql: &str) -> Vec<(String, i64)> {
        self.rows(sql)
            .into_iter()
            .map(|r| {
                let t = match &r[0] {
                    SqlValue::Text(t) => t.clone(),
                    other => format!("{other:?}"),
                };
                let i = match r.get(1) {
                    Some(SqlValue::Integer(i)) => *i,
                    _ => 0,
                };
                (t, i)
            })
            .collect()
    }
}

pub const MS: i64 = 1_000_000;

/// The entry the checks cache in `cache` holds for the trace at `db` as it
/// is now, if any: matched by inode and change time, as the cache keys it
/// (an inode alone may be another test's deleted file's).
pub fn checks_entry_of(cache: &Path, db: &Path) -> Option<Value> {
    use std::os::unix::fs::MetadataExt;
    let text = std::fs::read_to_string(cache.join("checks.json")).ok()?;
    let saved: Value = serde_json::from_str(&text).expect("json");
    let m = std::fs::metadata(db).expect("stat");
    let ctime_ns = i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec());
    saved["files"]
        .as_array()?
        .iter()
        .find(|e| {
            let id = &e["id"]["db"];
            id["ino"] == m.ino() && id["ctime_ns"].as_i64().map(i128::from) == Some(ctime_ns)
        })
        .cloned()
}

/// Writes one byte over the root page of the per-call table, in place,
/// keeping the size: the same identity to a size check, a damaged file to
/// SQLite's (the checks cache must not take it for the file it checked).
pub fn damage_in_place(db: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let (root, page): (i64, i64) = {
        let c =
            rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .expect("open");
        let root = c
            .query_row(
                "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name IN ('call_rows', 'calls')",
                [],
                |r| r.get(0),
            )
            .expect("root");
        let page = c
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .expect("page size");
        (root, page)
    };
    let len = std::fs::metadata(db).expect("stat").len();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(db)
        .expect("open for writing");
    f.seek(SeekFrom::Start(((root - 1) * page) as u64))
        .expect("seek");
    f.write_all(&[0x42]).expect("write");
    drop(f);
    assert_eq!(std::fs::metadata(db).expect("stat").len(), len);
}

/// Runs `cmd` (a read of a damaged trace) and asserts it failed, without a
/// panic, saying the file is damaged.
pub fn assert_refused_as_damaged(cmd: &mut Command) {
    let out = cmd.output().expect("run");
    assert_no_panic(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("damaged"), "{err}");
}

/// A clock's reading now, in ns (`CLOCK_MONOTONIC` is the tracer's clock).
pub fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// Checks `pftrace` (`export --format pftrace`) against `json` (the
/// `perfetto` export of the same trace and window) with
/// tests/perfetto/pftrace_check.py, which reads the protobuf with
/// Perfetto's own Python classes. Returns the checker's summary line, or
/// None when python3 or its `perfetto` package is missing (a skip, a
/// failure under CI=true; `test` names the test).
pub fn pftrace_matches_json(test: &str, json: &Path, pftrace: &Path) -> Option<String> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/perfetto/pftrace_check.py");
    let out = match Command::new("python3")
        .arg(&script)
        .arg(json)
        .arg(pftrace)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            skip_unless_ci(test, &format!("python3 cannot run: {e}"));
            return None;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.code() == Some(2) {
        skip_unless_ci(test, &format!("{} (pip install perfetto)", stdout.trim()));
        return None;
    }
    assert!(
        out.status.success(),
        "{test}: the protobuf differs from the JSON:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("ok: "), "{test}: {stdout}");
    Some(stdout.trim().to_string())
}
