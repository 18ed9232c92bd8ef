//! Call sites end to end: Python scripts (every CPython on the machine) and a
//! C program built with frame pointers call the simulated CUDA libraries
//! from known lines; every recorded allocation, free and failure must be
//! attributed to its exact file, function and line (Python) or function
//! chain (native). Ground truth comes from the workloads themselves: the
//! Python script writes the line and function of each call as it makes it.

mod common;

use common::{assert_no_panic, gpusleuth, require_ebpf, Sandbox};
use rusqlite::types::Value as SqlValue;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The traced script. Each CUDA call records, on its own line, the line
/// number and function it is made from (`here()` reads the caller's frame).
const SCRIPT: &str = r#"
import ctypes, json, sys, threading, time
lib = ctypes.CDLL(sys.argv[1])
lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
lib.cudaFree.argtypes = [ctypes.c_void_p]
truth = open(sys.argv[2], "w")
lock = threading.Lock()

def here(depth=1):
    f = sys._getframe(depth)
    return f.f_lineno, getattr(f.f_code, "co_qualname", f.f_code.co_name)

def record(op, size, ptr, rc, where):
    with lock:
        truth.write(json.dumps({"op": op, "size": size, "ptr": ptr, "rc": rc, "line": where[0], "func": where[1]}) + "\n")

def malloc(size):
    p = ctypes.c_void_p()
    rc = lib.cudaMalloc(ctypes.byref(p), size); where = here()
    record("cudaMalloc", size, p.value or 0, rc, where)
    return p.value

def free(ptr):
    rc = lib.cudaFree(ptr); where = here()
    record("cudaFree", 0, ptr, rc, where)

def outer():
    return inner(1 << 20)

def inner(n):
    p = ctypes.c_void_p()
    rc = lib.cudaMalloc(ctypes.byref(p), n); where = here()
    record("cudaMalloc", n, p.value or 0, rc, where)
    return p.value

class Model:
    def weights(self, n):
        p = ctypes.c_void_p()
        rc = lib.cudaMalloc(ctypes.byref(p), n); where = here()
        record("cudaMalloc", n, p.value or 0, rc, where)
        return p.value

def deep(n):
    if n == 0:
        free(malloc(333))
        return
    deep(n - 1)

def worker():
    for i in range(3):
        p = ctypes.c_void_p()
        rc = lib.cudaMalloc(ctypes.byref(p), 4096 * (i + 1)); where = here()
        record("cudaMalloc", 4096 * (i + 1), p.value or 0, rc, where)

def main():
    time.sleep(float(sys.argv[3]))  # the tracer finds the interpreter meanwhile
    kept = [outer()]
    for i in range(5):
        p = ctypes.c_void_p()
        rc = lib.cudaMalloc(ctypes.byref(p), 65536); where = here()
        record("cudaMalloc", 65536, p.value or 0, rc, where)
        if i % 2 == 0:
            free(p.value)
    kept.append(Model().weights(3 << 20))
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    p = ctypes.c_void_p()
    rc = lib.cudaMalloc(ctypes.byref(p), 1 << 50); where = here()
    record("cudaMalloc", 1 << 50, 0, rc, where)
    free(malloc(777))
    deep(70)  # deeper than the kernel's 64-frame cap
    truth.close()
    time.sleep(0.3)  # sites are resolved from the live process

main()
"#;

/// CPython interpreters to test: pyenv's, and the default `python3`.
fn interpreters() -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    let mut candidates: Vec<PathBuf> = ["3.10.13", "3.11.7", "3.12.1", "3.13.0"]
        .iter()
        .map(|v| {
            let minor = v.rsplit_once('.').map(|x| x.0).unwrap_or(v);
            PathBuf::from(format!("/root/.pyenv/versions/{v}/bin/python{minor}"))
        })
        .collect();
    for name in ["python3", "python3.12", "python3.11"] {
        if let Ok(out) = Command::new(name)
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
        {
            let exe = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !exe.is_empty() {
                candidates.push(PathBuf::from(exe));
            }
        }
    }
    for exe in candidates {
        if !exe.exists() {
            continue;
        }
        let Ok(out) = Command::new(&exe)
            .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
            .output()
        else {
            continue;
        };
        let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let minor: u32 = v
            .strip_prefix("3.")
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if (10..=13).contains(&minor) && !found.iter().any(|(fv, _)| *fv == v) {
            found.push((v, exe));
        }
    }
    found
}

fn trace_python(sb: &Sandbox, python: &Path, script: &Path, truth: &Path) -> std::process::Output {
    let out = gpusleuth()
        .arg("trace")
        .arg("--db")
        .arg(sb.db())
        .arg("--quiet")
        .arg("--cuda-lib")
        .arg(&sb.sim.libcudart)
        .arg("--cuda-lib")
        .arg(&sb.sim.libcuda)
        .arg("--")
        .arg(python)
        .arg(script)
        .arg(&sb.sim.libcudart)
        .arg(truth)
        .arg("0.5")
        .env("LD_LIBRARY_PATH", &sb.sim.lib_dir)
        .output()
        .expect("run gpusleuth trace");
    assert_no_panic(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "trace failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// (op, size, ptr, ret, innermost Python frame (file, function, line)) of
/// every runtime-layer call, plus the number of calls without a stack.
type Site = (String, String, i64);

fn python_site(db: &common::Db, stack_id: i64) -> Option<Site> {
    let rows = db.rows(&format!(
        "SELECT file, function, line FROM stack_frames WHERE stack_id = {stack_id} AND kind = 'python' ORDER BY depth LIMIT 1"
    ));
    let r = rows.first()?;
    let text = |v: &SqlValue| match v {
        SqlValue::Text(t) => t.clone(),
        _ => String::new(),
    };
    let line = match r[2] {
        SqlValue::Integer(i) => i,
        _ => -1,
    };
    Some((text(&r[0]), text(&r[1]), line))
}

#[test]
fn python_allocations_frees_and_failures_have_their_exact_line() {
    if !require_ebpf() {
        return;
    }
    let pythons = interpreters();
    let versions: BTreeSet<&str> = pythons.iter().map(|(v, _)| v.as_str()).collect();
    eprintln!("CPython versions tested: {versions:?}");
    if std::env::var("CI").as_deref() == Ok("true") {
        assert!(
            versions.len() >= 2,
            "CI must prove two CPython layouts; found only {versions:?}"
        );
    } else if pythons.is_empty() {
        eprintln!("skipped: no CPython 3.10-3.13 on this machine");
        return;
    }
    for (version, python) in &pythons {
        let sb = Sandbox::new(&format!("sites-py{version}"));
        let script = sb.path("workload_sites.py");
        std::fs::write(&script, SCRIPT).expect("write script");
        let truth_path = sb.path("py_truth.jsonl");
        trace_python(&sb, python, &script, &truth_path);
        let truth: Vec<Value> = std::fs::read_to_string(&truth_path)
            .expect("truth")
            .lines()
            .map(|l| serde_json::from_str(l).expect("truth line"))
            .collect();
        assert_eq!(truth.len(), 18, "{version}: the script made 18 calls");
        let db = sb.open_db();
        let calls = db.rows(
            "SELECT op, size, ptr, ret, stack_id FROM calls WHERE layer = 'runtime' AND op IN ('cudaMalloc', 'cudaFree') ORDER BY ts_ns",
        );
        assert_eq!(
            calls.len(),
            truth.len(),
            "{version}: one recorded call per call made"
        );
        let script_s = script.display().to_string();
        for (row, t) in calls.iter().zip(&truth) {
            let int = |v: &SqlValue| match v {
                SqlValue::Integer(i) => *i,
                _ => 0,
            };
            let SqlValue::Text(op) = &row[0] else {
                panic!("op")
            };
            assert_eq!(op, t["op"].as_str().unwrap(), "{version}: same order");
            if op == "cudaMalloc" {
                assert_eq!(int(&row[1]) as u64, t["size"].as_u64().unwrap());
            }
            assert_eq!(
                int(&row[3]),
                t["rc"].as_i64().unwrap(),
                "{version}: return code"
            );
            let stack = match row[4] {
                SqlValue::Integer(s) => s,
                _ => panic!("{version}: {op} {t} has no stack"),
            };
            let site = python_site(&db, stack)
                .unwrap_or_else(|| panic!("{version}: {op} {t}: no Python frame in its stack"));
            let want: Site = (
                script_s.clone(),
                t["func"].as_str().unwrap().to_string(),
                t["line"].as_i64().unwrap(),
            );
            assert_eq!(site, want, "{version}: site of {op} {t}");
        }
        // The failure (1 << 50 bytes) and its nested driver call both name the line.
        let failed = db.ints("SELECT stack_id FROM calls WHERE ret != 0 AND stack_id IS NOT NULL");
        assert_eq!(
            failed.len(),
            2,
            "{version}: cudaMalloc and cuMemAlloc_v2 failed, both with a site"
        );
        // The deep call's stack says it was cut, and still names the innermost line.
        assert!(
            db.int(
                "SELECT count(*) FROM stacks WHERE notes LIKE '%Python frames truncated at 64%'"
            ) >= 1,
            "{version}: truncation not said"
        );
        // ... and keeps all 64 innermost frames, each read.
        assert_eq!(
            db.int(
                "SELECT max(n) FROM (SELECT count(*) AS n FROM stack_frames WHERE kind = 'python' \
                 AND stack_id IN (SELECT id FROM stacks WHERE notes LIKE '%truncated at 64%') \
                 GROUP BY stack_id)"
            ),
            64,
            "{version}: a truncated stack keeps 64 Python frames"
        );
        // Every stack a call names is stored, once.
        let named = db.int("SELECT count(DISTINCT stack_id) FROM calls WHERE stack_id IS NOT NULL");
        let stored = db.int("SELECT count(*) FROM stacks WHERE id IN (SELECT stack_id FROM calls)");
        assert_eq!(named, stored, "{version}: every named stack is stored");
        assert_eq!(
            db.int("SELECT value FROM stats WHERE name = 'drop_ring_full_stack'"),
            0
        );
        // memory --by-site names the line of the largest unfreed allocation first.
        let out = common::run_ok(
            gpusleuth()
                .args(["memory", "--by-site", "--json", "--db"])
                .arg(sb.db()),
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        let first = &v["sites"][0];
        let weights_line = truth
            .iter()
            .find(|t| t["size"].as_u64() == Some(3 << 20))
            .and_then(|t| t["line"].as_i64())
            .unwrap();
        let weights_func = truth
            .iter()
            .find(|t| t["size"].as_u64() == Some(3 << 20))
            .and_then(|t| t["func"].as_str())
            .unwrap();
        assert_eq!(
            first["site"].as_str().unwrap(),
            format!("{script_s}:{weights_line} {weights_func}"),
            "{version}: {v}"
        );
        assert_eq!(first["unfreed_bytes"].as_u64(), Some(3 << 20));
        // explain names the line of the failure. The 3 MiB held until exit
        // is no finding (the driver frees it with the context: issue 12's
        // rule), so explain does not call it a leak; `memory --by-site`
        // above names its line.
        let out = gpusleuth()
            .args(["explain", "--json", "--db"])
            .arg(sb.db())
            .output()
            .expect("explain");
        let text = String::from_utf8_lossy(&out.stdout);
        let site = format!("{script_s}:{weights_line} {weights_func}");
        assert!(
            !text.contains(&format!("allocated at {site}")),
            "{version}: memory held at exit is not a finding: {text}"
        );
        let fail_line = truth
            .iter()
            .find(|t| t["rc"].as_i64() != Some(0))
            .and_then(|t| t["line"].as_i64())
            .unwrap();
        assert!(
            text.contains(&format!("{script_s}:{fail_line} main")),
            "{version}: failure site missing: {text}"
        );
    }
}

/// A C program built with frame pointers: native sites name its functions.
/// It lives 1 s after its last call: a stack is resolved from the live
/// process's memory map, and a tracer starved of CPU (CI, 2026-12-04: the
/// program then lived 300 ms) read a stack after the process was gone.
#[test]
fn native_sites_of_a_frame_pointer_program() {
    let Some(sb) = Sandbox::for_ebpf("sites-native") else {
        return;
    };
    let src = sb.path("fp.c");
    std::fs::write(
        &src,
        r#"
#include <stddef.h>
#include <unistd.h>
int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
int cudaStreamSynchronize(void *stream);
int cudaMemset(void *p, int v, size_t n);
void simSetNextDurationNs(unsigned long long ns);
__attribute__((noinline)) void slow_sync(void) { simSetNextDurationNs(5000000); cudaStreamSynchronize(0); }
__attribute__((noinline)) void quick_memset(void *p) { cudaMemset(p, 0, 64); }
__attribute__((noinline)) void *alloc_weights(size_t n) { void *p = 0; cudaMalloc(&p, n); return p; }
__attribute__((noinline)) void leak_loop(int k) { for (int i = 0; i < k; i++) alloc_weights(1 << 20); }
__attribute__((noinline)) void fail_big(void) { void *p = 0; cudaMalloc(&p, (size_t)1 << 50); }
int main(void) { usleep(200000); leak_loop(3); void *w = alloc_weights(4096); quick_memset(w); cudaFree(w); fail_big(); slow_sync(); usleep(1000000); return 0; }
"#,
    )
    .expect("write fp.c");
    let exe = sb.path("fp");
    let cc = Command::new("gcc")
        .args(["-O1", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", sb.sim.lib_dir.display()))
        .arg(format!("-Wl,-rpath,{}", sb.sim.lib_dir.display()))
        .arg("-l:libcudart.so.13")
        .arg("-l:libcuda.so.1")
        .output()
        .expect("gcc");
    common::assert_success(&cc);
    common::run_ok(
        gpusleuth()
            .arg("trace")
            .arg("--db")
            .arg(sb.db())
            .arg("--quiet")
            .arg("--")
            .arg(&exe),
    );
    let db = sb.open_db();
    // What a failure needs to be understood (seen once under CI load, 2026-12-04:
    // a call whose stack had no frames): the calls' stack ids, the stacks
    // stored, the counters and notes of what was lost.
    let context = || {
        let q = |sql: &str| format!("{sql}: {:?}", db.rows(sql));
        [
            q("SELECT op, size, stack_id FROM calls WHERE layer = 'runtime' ORDER BY ts_ns"),
            q("SELECT stack_id, count(*) FROM stack_frames GROUP BY stack_id"),
            q("SELECT name, value FROM stats WHERE value != 0"),
            q("SELECT * FROM notes"),
        ]
        .join("\n")
    };
    // A call's frames, innermost first, at most `n` of them.
    let chain = |call_filter: &str, n: usize| -> Vec<String> {
        let stack = db.int(&format!(
            "SELECT stack_id FROM calls WHERE layer = 'runtime' AND {call_filter} ORDER BY ts_ns LIMIT 1"
        ));
        let frames: Vec<String> = db
            .rows(&format!(
                "SELECT function FROM stack_frames WHERE stack_id = {stack} ORDER BY depth"
            ))
            .into_iter()
            .map(|r| match &r[0] {
                SqlValue::Text(t) => t.clone(),
                _ => "?".into(),
            })
            .collect();
        assert!(
            frames.len() >= n,
            "{call_filter}: frames {frames:?}\n{}",
            context()
        );
        frames.into_iter().take(n).collect()
    };
    let leak = chain("op = 'cudaMalloc' AND size = 1048576", 3);
    assert_eq!(leak, ["alloc_weights", "leak_loop", "main"]);
    let direct = chain("op = 'cudaMalloc' AND size = 4096", 2);
    assert_eq!(direct, ["alloc_weights", "main"]);
    let free = chain("op = 'cudaFree'", 1);
    assert_eq!(free, ["main"]);
    // A call over --site-slow (1 ms) takes a site; a quick one does not.
    let slow = chain("op = 'cudaStreamSynchronize'", 2);
    assert_eq!(slow, ["slow_sync", "main"]);
    assert_eq!(
        db.int("SELECT count(*) FROM calls WHERE op = 'cudaMemset' AND stack_id IS NULL"),
        1,
        "a quick cudaMemset takes no site"
    );
    let failed = chain("op = 'cudaMalloc' AND ret != 0", 2);
    assert_eq!(failed, ["fail_big", "main"]);
    // The failed driver call inside the runtime has its own site: the
    // stand-in's cudaMalloc tail-calls cuMemAlloc_v2 (a `jmp`, no frame of
    // its own), so the driver call returns straight into fail_big.
    let inner =
        db.int("SELECT stack_id FROM calls WHERE op = 'cuMemAlloc_v2' AND ret != 0 LIMIT 1");
    let first = db.rows(&format!(
        "SELECT function, module FROM stack_frames WHERE stack_id = {inner} ORDER BY depth LIMIT 1"
    ));
    assert_eq!(first[0][0], SqlValue::Text("fail_big".into()), "{first:?}");
    assert_eq!(
        first[0][1],
        SqlValue::Text(exe.display().to_string()),
        "{first:?}"
    );
    // Three leaked 1 MiB allocations from one site: named first by --by-site.
    let out = gpusleuth()
        .args(["memory", "--by-site", "--json", "--db"])
        .arg(sb.db())
        .output()
        .expect("memory --by-site");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        v["sites"][0]["site"].as_str(),
        Some("alloc_weights (fp)"),
        "{v}"
    );
    assert_eq!(v["sites"][0]["unfreed_bytes"].as_u64(), Some(3 << 20));
    // The report's call-site table and the Perfetto slices carry the site.
    let html = sb.path("report.html");
    common::run_ok(
        gpusleuth()
            .args(["report", "--db"])
            .arg(sb.db())
            .arg("--output")
            .arg(&html),
    );
    let text = std::fs::read_to_string(&html).expect("report.html");
    assert!(
        text.contains("Call sites of device memory")
            && text.contains("<code>alloc_weights (fp)</code>")
    );
    let out = gpusleuth()
        .args(["export", "--db"])
        .arg(sb.db())
        .output()
        .expect("export");
    let trace: Value = serde_json::from_slice(&out.stdout).expect("perfetto json");
    let events = trace["traceEvents"]
        .as_array()
        .or(trace.as_array())
        .expect("events");
    let slice = events
        .iter()
        .find(|e| e["name"] == "cudaMalloc" && e["args"]["size"] == 4096)
        .expect("the 4 KiB cudaMalloc slice");
    assert_eq!(slice["args"]["site"], "alloc_weights (fp)", "{slice}");
    assert_eq!(slice["args"]["stack"][1], "main (fp)", "{slice}");
}
