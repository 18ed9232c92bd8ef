//! `gpusleuth trace --metrics`: a real Prometheus (Debian's `prometheus`)
//! scrapes gpusleuth tracing a simulated workload; the counters read back
//! through Prometheus' HTTP query API must equal the workload's own account.
//! Needs root + eBPF and the prometheus binary: skips with a reason off CI,
//! fails in CI (`.ci/run` installs prometheus).

mod common;

use common::{require_ebpf, wait_child, Sandbox};
use serde_json::Value;
use sleuth_sim::Truth;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn prometheus_bin() -> Option<PathBuf> {
    let found = ["/usr/bin/prometheus"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    if found.is_none() {
        let why = "prometheus not installed (apt-get install prometheus)";
        common::skip_unless_ci("the Prometheus test", why);
    }
    found
}

/// A loopback port free right now.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// Kills a child when dropped (Prometheus must not outlive the test).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// HTTP/1.0 GET (no chunking, the server closes): status code and body.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(c, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut resp = String::new();
    c.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// An instant query: each series' labels and value.
fn query(prom: SocketAddr, q: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let (status, body) = http_get(prom, &format!("/api/v1/query?query={}", url_encode(q)))
        .unwrap_or_else(|e| panic!("query {q}: {e}"));
    assert_eq!(status, 200, "query {q}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{q}: {e}: {body}"));
    assert_eq!(v["status"], "success", "{body}");
    v["data"]["result"]
        .as_array()
        .expect("vector result")
        .iter()
        .map(|r| {
            let labels = r["metric"]
                .as_object()
                .expect("labels")
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect();
            let value = r["value"][1]
                .as_str()
                .and_then(|s| s.parse().ok())
                .expect("sample value");
            (labels, value)
        })
        .collect()
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn start_prometheus(bin: &Path, dir: &Path, target_port: u16) -> (KillOnDrop, SocketAddr) {
    let port = free_port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: gpusleuth\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    \
             static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
        ),
    )
    .expect("write prometheus.yml");
    let child = Command::new(bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("prometheus.log")).expect("log file"),
        ))
        .spawn()
        .expect("start prometheus");
    let guard = KillOnDrop(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http_get(addr, "/-/ready"), Ok((200, _))) {
        assert!(
            Instant::now() < deadline,
            "prometheus not ready in 30 s: {}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (guard, addr)
}

#[test]
fn prometheus_scrapes_counters_equal_to_the_workload_truth() {
    if !require_ebpf() {
        return;
    }
    let Some(bin) = prometheus_bin() else { return };
    let sb = Sandbox::new("prometheus");
    let metrics_port = free_port();
    let (_prom, prom) = start_prometheus(&bin, &sb.dir, metrics_port);

    let done = sb.path("done");
    let release = sb.path("release");
    // Ground truth by construction: 3 cudaMalloc (the 1e15 one fails),
    // 1 cudaFree, 5 cudaMemcpy, 30 cuLaunchKernel (counted in the kernel),
    // 2 MiB left live after a 3 MiB peak. The workload then waits, alive,
    // until the test has read Prometheus (bounded by the test's timeouts).
    let script = format!(
        "malloc 1048576 a; malloc 2097152 b; free a; repeat 5 {{ memcpy 4096 }}; malloc 1e15; \
         cu_launch 30; touch {}; await {}",
        done.display(),
        release.display()
    );
    let metrics_arg = format!("127.0.0.1:{metrics_port}");
    let mut tracer = sb.spawn_trace(&["--metrics", &metrics_arg], &script, None);
    // The workload's `done`, or why not: round 56's CI once waited 60 s for
    // it in vain, the tracer's words gone with the sandbox.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done.exists() {
        let exited = tracer.try_wait().ok().flatten();
        assert!(
            exited.is_none() && Instant::now() < deadline,
            "no {} (tracer {}); its stderr:\n{}",
            done.display(),
            exited.map_or("still running".into(), |s| s.to_string()),
            std::fs::read_to_string(sb.path("trace.stderr")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Wait for a scrape that began after the workload finished its calls and
    // after the tracer refreshed its kernel counters (every 200 ms).
    let after = now_s() + 0.5;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ts = query(prom, "timestamp(gpusleuth_labelled_processes)");
        if ts.first().is_some_and(|(_, t)| *t >= after) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape gpusleuth after the workload finished: {ts:?}; up = {:?}",
            query(prom, "up")
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let by_op = |q: &str| -> BTreeMap<String, (String, f64)> {
        query(prom, q)
            .into_iter()
            .map(|(l, v)| (l["op"].clone(), (l["pid"].clone(), v)))
            .collect()
    };
    let calls = by_op("gpusleuth_cuda_calls_total");
    let errors = by_op("gpusleuth_cuda_errors_total");
    let hist_count = by_op("gpusleuth_cuda_call_duration_seconds_count");
    let hist_sum = by_op("gpusleuth_cuda_call_duration_seconds_sum");
    let time_split = by_op("sum by (op, pid) (gpusleuth_cuda_call_time_seconds_total)");
    let live = query(prom, "gpusleuth_device_live_bytes");
    let peak = query(prom, "gpusleuth_device_peak_bytes");
    let drops = query(prom, "sum(gpusleuth_dropped_events_total)");

    // Let the workload exit; its truth file is written at exit.
    std::fs::write(&release, b"go").expect("release the workload");
    let status = wait_child(&mut tracer, 60);
    assert!(status.success(), "gpusleuth trace failed: {status:?}");
    let truth: Vec<Truth> = sb.truth();
    assert_eq!(truth.len(), 1, "one process in the scenario");
    let t = &truth[0];
    let pid = t.pid.to_string();

    // Every CUDA call the workload made (runtime) and the driver stand-in
    // served (driver) is counted exactly once, under the workload's pid.
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for (op, n) in t.runtime.iter().chain(t.driver.iter()) {
        if sleuth_core::op_by_name(op).is_some() {
            expected.insert(op.clone(), *n);
        }
    }
    let got: BTreeMap<String, u64> = calls
        .iter()
        .map(|(op, (p, v))| {
            assert_eq!(p, &pid, "{op} under pid {p}");
            (op.clone(), *v as u64)
        })
        .collect();
    assert_eq!(got, expected, "calls_total per op vs the workload's truth");
    assert_eq!(expected.get("cudaMalloc"), Some(&3));
    assert_eq!(expected.get("cuLaunchKernel"), Some(&30));
    assert_eq!(expected.get("cudaMemcpy"), Some(&5));

    // Errors: the 1e15 cudaMalloc and the cuMemAlloc_v2 it made.
    let failed: BTreeMap<String, u64> =
        t.allocs
            .iter()
            .filter(|a| a.ret != 0)
            .fold(BTreeMap::new(), |mut m, a| {
                *m.entry(a.op.clone()).or_default() += 1;
                m
            });
    assert_eq!(failed.get("cudaMalloc"), Some(&1), "{:?}", t.allocs);
    assert_eq!(errors["cudaMalloc"].1, 1.0);
    let total_errors: f64 = errors.values().map(|v| v.1).sum();
    assert!(
        (1.0..=2.0).contains(&total_errors),
        "errors: {errors:?} (the failed cudaMalloc, and its driver call if it made one)"
    );

    // Per-call ops: the histogram counts every call; the three-way split adds
    // up to the histogram's sum (same calls, same wall time).
    for op in ["cudaMalloc", "cudaFree", "cudaMemcpy"] {
        assert_eq!(
            hist_count[op].1 as u64, expected[op],
            "{op} histogram count"
        );
        let (s, split) = (hist_sum[op].1, time_split[op].1);
        assert!(
            (s - split).abs() <= 1e-6 * s.max(1.0),
            "{op}: sum {s} vs split {split}"
        );
    }
    // Kernel-counted launches have a count but no per-call histogram.
    assert!(!hist_count.contains_key("cuLaunchKernel"));

    // Device memory: 2 MiB live, 3 MiB peak, under the workload's pid.
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].0["pid"], pid);
    assert_eq!(live[0].1 as u64, 2 << 20);
    assert_eq!(peak[0].1 as u64, 3 << 20);
    // Drops: a quiet scenario of a few dozen calls loses nothing.
    assert_eq!(drops[0].1, 0.0, "dropped events: {drops:?}");
}
