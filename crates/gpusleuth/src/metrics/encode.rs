//! The text exposition: OpenMetrics 1.0 (`# EOF`, counters declared without
//! `_total`) or Prometheus text 0.0.4 (counters declared with it).

use super::state::{OpSeries, Proc, State, BUCKETS_S};
use sleuth_core::op_by_id;
use sleuth_core::record::stat;
use std::fmt::Write as _;

/// Escapes a label value (backslash, quote, newline).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out {
    text: String,
    openmetrics: bool,
}

impl Out {
    /// `# HELP` / `# TYPE` of a family; returns the sample name prefix.
    fn family(&mut self, name: &str, kind: &str, help: &str) -> String {
        let declared = if kind == "counter" && !self.openmetrics {
            format!("{name}_total")
        } else {
            name.to_string()
        };
        let _ = writeln!(self.text, "# HELP {declared} {help}");
        let _ = writeln!(self.text, "# TYPE {declared} {kind}");
        name.to_string()
    }

    fn sample(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.text, "{name} {value}");
        } else {
            let _ = writeln!(self.text, "{name}{{{labels}}} {value}");
        }
    }
}

fn secs(ns: u128) -> f64 {
    ns as f64 / 1e9
}

/// Every labelled process, then `other` when it holds anything.
fn processes(s: &State) -> Vec<(String, &str, &Proc)> {
    let mut v: Vec<(String, &str, &Proc)> = s
        .procs
        .iter()
        .map(|(pid, p)| (pid.to_string(), p.comm.as_str(), p))
        .collect();
    let other_used =
        !s.other.ops.is_empty() || s.kernel_counts_by_label().keys().any(|k| k.0.is_none());
    if other_used {
        v.push(("other".into(), "other", &s.other));
    }
    v
}

fn op_labels(op: u16, pid: &str, comm: &str) -> Option<String> {
    let info = op_by_id(op)?;
    Some(format!(
        "op=\"{}\",layer=\"{}\",pid=\"{}\",comm=\"{}\"",
        info.name,
        info.layer.as_str(),
        pid,
        label(comm)
    ))
}

pub fn render(s: &State, openmetrics: bool) -> String {
    let mut o = Out {
        text: String::new(),
        openmetrics,
    };
    let procs = processes(s);
    let kernel = s.kernel_counts_by_label();

    let n = o.family(
        "gpusleuth_cuda_calls",
        "counter",
        "CUDA calls completed, per-call records plus calls counted in the kernel (launch hot paths).",
    );
    for (pid, comm, p) in &procs {
        let key = pid.parse::<u32>().ok();
        let mut ops: std::collections::BTreeMap<u16, u64> =
            p.ops.iter().map(|(op, st)| (*op, st.calls)).collect();
        for ((kpid, op), count) in &kernel {
            if *kpid == key {
                *ops.entry(*op).or_default() += count;
            }
        }
        for (op, calls) in ops {
            if let Some(l) = op_labels(op, pid, comm) {
                o.sample(&format!("{n}_total"), &l, calls);
            }
        }
    }

    let per_call = |o: &mut Out, f: &mut dyn FnMut(&mut Out, &str, &OpSeries)| {
        for (pid, comm, p) in &procs {
            for (op, st) in &p.ops {
                if let Some(l) = op_labels(*op, pid, comm) {
                    f(o, &l, st);
                }
            }
        }
    };

    let n = o.family(
        "gpusleuth_cuda_errors",
        "counter",
        "CUDA calls that returned an error (per-call records only).",
    );
    per_call(&mut o, &mut |o, l, st| {
        o.sample(&format!("{n}_total"), l, st.errors)
    });

    let n = o.family(
        "gpusleuth_cuda_call_duration_seconds",
        "histogram",
        "Wall time of CUDA calls (per-call records only).",
    );
    per_call(&mut o, &mut |o, l, st| {
        let cum = st.cumulative_buckets();
        for (b, c) in BUCKETS_S.iter().zip(cum) {
            o.sample(&format!("{n}_bucket"), &format!("{l},le=\"{b}\""), c);
        }
        o.sample(
            &format!("{n}_bucket"),
            &format!("{l},le=\"+Inf\""),
            st.calls,
        );
        o.sample(&format!("{n}_sum"), l, secs(st.sum_ns));
        o.sample(&format!("{n}_count"), l, st.calls);
    });

    let n = o.family(
        "gpusleuth_cuda_call_time_seconds",
        "counter",
        "Wall time inside CUDA calls split by thread state: on_cpu, runnable (CPU taken by another task), blocked (sleeping).",
    );
    per_call(&mut o, &mut |o, l, st| {
        for (i, state) in ["on_cpu", "runnable", "blocked"].iter().enumerate() {
            o.sample(
                &format!("{n}_total"),
                &format!("{l},state=\"{state}\""),
                secs(st.split[i]),
            );
        }
    });

    for (name, help, get) in [
        (
            "gpusleuth_device_live_bytes",
            "Device memory allocated and not yet freed by the process (cudaMalloc-family and cuMemCreate, each allocation once).",
            (|p: &Proc| p.live_bytes) as fn(&Proc) -> u64,
        ),
        (
            "gpusleuth_device_peak_bytes",
            "Highest device_live_bytes of the process since tracing started.",
            |p: &Proc| p.peak_bytes,
        ),
    ] {
        let n = o.family(name, "gauge", help);
        for (pid, comm, p) in &procs {
            if *pid != "other" {
                o.sample(&n, &format!("pid=\"{pid}\",comm=\"{}\"", label(comm)), get(p));
            }
        }
    }

    let n = o.family(
        "gpusleuth_dropped_events",
        "counter",
        "Events lost before reaching user space, by cause.",
    );
    for (i, cause) in stat::NAMES.iter().enumerate() {
        if !stat::is_attach_edge(i) {
            o.sample(
                &format!("{n}_total"),
                &format!("cause=\"{cause}\""),
                s.drops[i],
            );
        }
    }

    let n = o.family(
        "gpusleuth_attach_edge_events",
        "counter",
        "Expected edges of attaching to running processes, not losses: returns whose call began before the process was traced.",
    );
    for i in (0..stat::MAX).filter(|&i| stat::is_attach_edge(i)) {
        o.sample(
            &format!("{n}_total"),
            &format!("kind=\"{}\"", stat::edge_name(i)),
            s.drops[i],
        );
    }

    gpu_families(&mut o, &s.gpu);

    let n = o.family(
        "gpusleuth_events",
        "counter",
        "Events decoded from the kernel, by kind.",
    );
    for (i, kind) in ["call", "wait", "proc"].iter().enumerate() {
        o.sample(
            &format!("{n}_total"),
            &format!("kind=\"{kind}\""),
            s.events[i],
        );
    }

    let n = o.family(
        "gpusleuth_labelled_processes",
        "gauge",
        "Processes with their own pid/comm labels now (the rest count under pid=\"other\").",
    );
    o.sample(&n, "", s.procs.len());

    render_nccl(&mut o, s);

    if openmetrics {
        o.text.push_str("# EOF\n");
    }
    o.text
}

/// NVML figures: measured or not, busy per GPU, per-process memory and SM use.
fn gpu_families(o: &mut Out, g: &super::gpu::GpuState) {
    let n = o.family(
        "gpusleuth_gpu_activity_measured",
        "gauge",
        "1 when NVML GPU activity is sampled during this trace, 0 when it is not available (then no gpu_* figure is exported).",
    );
    o.sample(&n, "", u8::from(g.measured == Some(true)));
    let n = o.family(
        "gpusleuth_gpu_busy_percent",
        "gauge",
        "Latest NVML device utilization sample: percent of the sample period some kernel was running (not SM occupancy).",
    );
    for (gpu, pct) in &g.busy_pct {
        o.sample(&n, &format!("gpu=\"{gpu}\""), pct);
    }
    let n = o.family(
        "gpusleuth_process_gpu_memory_bytes",
        "gauge",
        "Device memory NVML attributes to the traced process now (includes memory allocated before tracing and the CUDA context).",
    );
    for (pid, p) in &g.procs {
        for (gpu, b) in &p.used_bytes {
            o.sample(
                &n,
                &format!("pid=\"{pid}\",comm=\"{}\",gpu=\"{gpu}\"", label(&p.comm)),
                b,
            );
        }
    }
    let n = o.family(
        "gpusleuth_process_gpu_memory_before_trace_bytes",
        "gauge",
        "Device memory NVML attributed to the process when its tracing began (0: not listed then); allocations made before the trace are not itemized.",
    );
    for (pid, p) in &g.procs {
        if let Some(b) = p.before_trace_bytes() {
            o.sample(&n, &format!("pid=\"{pid}\",comm=\"{}\"", label(&p.comm)), b);
        }
    }
    let n = o.family(
        "gpusleuth_process_sm_percent",
        "gauge",
        "Latest per-process SM utilization from NVML, where the driver reports it.",
    );
    for (pid, p) in &g.procs {
        for (gpu, v) in &p.sm_pct {
            o.sample(
                &n,
                &format!("pid=\"{pid}\",comm=\"{}\",gpu=\"{gpu}\"", label(&p.comm)),
                v,
            );
        }
    }
}

/// Per-rank NCCL collective series (only when NCCL communicators were seen).
fn render_nccl(o: &mut Out, s: &State) {
    if s.nccl.ranks.is_empty() {
        return;
    }
    let host = label(&local_hostname());
    let labels: Vec<(String, &super::nccl::RankSeries)> = s
        .nccl
        .ranks
        .iter()
        .map(|((comm, rank), r)| {
            (
                format!(
                    "comm=\"{}\",rank=\"{rank}\",nranks=\"{}\",pid=\"{}\",host=\"{host}\"",
                    label(comm),
                    r.nranks,
                    r.pid
                ),
                r,
            )
        })
        .collect();
    let n = o.family(
        "gpusleuth_nccl_collectives",
        "counter",
        "NCCL collectives issued, per communicator rank.",
    );
    for (l, r) in &labels {
        o.sample(&format!("{n}_total"), l, r.collectives);
    }
    let n = o.family(
        "gpusleuth_nccl_collective_seconds",
        "counter",
        "Wall time inside NCCL collective calls, per communicator rank.",
    );
    for (l, r) in &labels {
        o.sample(&format!("{n}_total"), l, secs(r.time_ns));
    }
    let n = o.family(
        "gpusleuth_nccl_lateness_seconds",
        "counter",
        "Sum over matched collectives of the rank's entry minus the first rank's entry (ranks traced by this agent).",
    );
    for (l, r) in &labels {
        o.sample(&format!("{n}_total"), l, secs(r.lateness_ns));
    }
    let n = o.family(
        "gpusleuth_nccl_last_arrivals",
        "counter",
        "Matched collectives the rank entered last, at least 1 ms after the first rank: the one the others waited for.",
    );
    for (l, r) in &labels {
        o.sample(&format!("{n}_total"), l, r.last);
    }
}

fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::{op_by_name, CallEvent, Event, OpCount};

    fn state() -> State {
        let mut s = State::default();
        s.observe(
            &Event::Call(CallEvent {
                ts_ns: 0,
                dur_ns: 3_000,
                pid: 7,
                tid: 7,
                op: op_by_name("cudaMalloc").unwrap().id,
                size: Some(4096),
                ptr: Some(0x10),
                runnable_ns: 1_000,
                ..Default::default()
            }),
            |_| "a\"b".to_string(),
        );
        let launch = op_by_name("cuLaunchKernel").unwrap().id;
        s.set_kernel_counters(
            &[0, 0, 0, 0, 0, 0, 5, 0],
            &[
                OpCount {
                    pid: 7,
                    op: launch,
                    count: 40,
                },
                OpCount {
                    pid: 8,
                    op: launch,
                    count: 2,
                },
            ],
        );
        s
    }

    #[test]
    fn openmetrics_text() {
        let t = render(&state(), true);
        let l = r#"op="cudaMalloc",layer="runtime",pid="7",comm="a\"b""#;
        assert!(t.contains("# TYPE gpusleuth_cuda_calls counter\n"), "{t}");
        assert!(
            t.contains(&format!("gpusleuth_cuda_calls_total{{{l}}} 1\n")),
            "{t}"
        );
        assert!(t.contains(r#"gpusleuth_cuda_calls_total{op="cuLaunchKernel",layer="driver",pid="7",comm="a\"b"} 40"#));
        assert!(t.contains(r#"gpusleuth_cuda_calls_total{op="cuLaunchKernel",layer="driver",pid="other",comm="other"} 2"#));
        assert!(t.contains(&format!(
            "gpusleuth_cuda_call_duration_seconds_bucket{{{l},le=\"0.000001\"}} 0\n"
        )));
        assert!(t.contains(&format!(
            "gpusleuth_cuda_call_duration_seconds_bucket{{{l},le=\"0.000005\"}} 1\n"
        )));
        assert!(t.contains(&format!(
            "gpusleuth_cuda_call_duration_seconds_bucket{{{l},le=\"+Inf\"}} 1\n"
        )));
        assert!(t.contains(&format!(
            "gpusleuth_cuda_call_time_seconds_total{{{l},state=\"runnable\"}} 0.000001\n"
        )));
        assert!(t.contains("gpusleuth_device_live_bytes{pid=\"7\",comm=\"a\\\"b\"} 4096\n"));
        assert!(t.contains("gpusleuth_attach_edge_events_total{kind=\"return_without_entry\"} 5\n"));
        assert!(
            !t.contains("cause=\"unmatched_return\""),
            "an attach edge is not a drop"
        );
        assert!(t.contains("gpusleuth_gpu_activity_measured 0\n"), "{t}");
        assert!(!t.contains("gpusleuth_gpu_busy_percent{"));
        assert!(t.ends_with("# EOF\n"));
    }

    #[test]
    fn gpu_figures_when_nvml_is_sampled() {
        use sleuth_core::{GpuSample, ProcessGpuSample, SamplePhase};
        let mut s = state();
        s.gpu.measured = Some(true);
        s.gpu.observe(
            &[GpuSample {
                ts_ns: 5,
                gpu: 0,
                busy_pct: 37.0,
                period_ns: 100,
            }],
            &[ProcessGpuSample {
                ts_ns: 5,
                gpu: 0,
                pid: 7,
                used_bytes: Some(1 << 30),
                sm_pct: Some(12.0),
                phase: SamplePhase::Start,
            }],
            |_| "py".to_string(),
        );
        let t = render(&s, true);
        assert!(t.contains("gpusleuth_gpu_activity_measured 1\n"), "{t}");
        assert!(
            t.contains("gpusleuth_gpu_busy_percent{gpu=\"0\"} 37\n"),
            "{t}"
        );
        assert!(t.contains(
            "gpusleuth_process_gpu_memory_bytes{pid=\"7\",comm=\"py\",gpu=\"0\"} 1073741824\n"
        ));
        assert!(t.contains(
            "gpusleuth_process_gpu_memory_before_trace_bytes{pid=\"7\",comm=\"py\"} 1073741824\n"
        ));
        assert!(t.contains("gpusleuth_process_sm_percent{pid=\"7\",comm=\"py\",gpu=\"0\"} 12\n"));
    }

    #[test]
    fn prometheus_text_declares_counters_with_total() {
        let t = render(&state(), false);
        assert!(t.contains("# TYPE gpusleuth_cuda_calls_total counter\n"));
        assert!(!t.contains("# EOF"));
    }

    #[test]
    fn nccl_rank_series_appear_once_a_communicator_is_seen() {
        let t = render(&state(), true);
        assert!(!t.contains("gpusleuth_nccl"), "no NCCL, no NCCL families");
        let mut s = state();
        let ev = |op: &str, pid: u32, ts: u64, dur: u64| sleuth_core::nccl::NcclEvent {
            call: CallEvent {
                op: op_by_name(op).unwrap().id,
                pid,
                tid: pid,
                ts_ns: ts,
                dur_ns: dur,
                ..Default::default()
            },
            ..Default::default()
        };
        for (pid, rank) in [(10, 0), (20, 1)] {
            let mut e = ev("ncclCommInitRank", pid, 0, 10);
            e.new_comm = Some(pid as u64);
            e.rank = Some(rank);
            e.nranks = Some(2);
            e.unique_id = Some("ab".into());
            s.observe(&Event::Nccl(e), |_| "train".into());
        }
        for k in 1..=2u64 {
            let mut a = ev("ncclAllReduce", 10, k * 1_000_000_000, 2_000_000_000);
            a.comm = Some(10);
            let mut b = ev("ncclAllReduce", 20, k * 1_000_000_000 + 500_000_000, 1_000);
            b.comm = Some(20);
            s.observe(&Event::Nccl(a), |_| "train".into());
            s.observe(&Event::Nccl(b), |_| "train".into());
        }
        let t = render(&s, true);
        assert!(
            t.contains("# TYPE gpusleuth_nccl_last_arrivals counter\n"),
            "{t}"
        );
        let host = label(&local_hostname());
        let l1 = format!(r#"comm="ab",rank="1",nranks="2",pid="20",host="{host}""#);
        let l0 = format!(r#"comm="ab",rank="0",nranks="2",pid="10",host="{host}""#);
        assert!(
            t.contains(&format!("gpusleuth_nccl_collectives_total{{{l1}}} 2\n")),
            "{t}"
        );
        assert!(
            t.contains(&format!(
                "gpusleuth_nccl_collective_seconds_total{{{l0}}} 4\n"
            )),
            "{t}"
        );
        assert!(
            t.contains(&format!(
                "gpusleuth_nccl_lateness_seconds_total{{{l1}}} 1\n"
            )),
            "{t}"
        );
        assert!(
            t.contains(&format!("gpusleuth_nccl_last_arrivals_total{{{l1}}} 2\n")),
            "{t}"
        );
        assert!(
            t.contains(&format!("gpusleuth_nccl_last_arrivals_total{{{l0}}} 0\n")),
            "{t}"
        );
        // The calls are CUDA-level series too.
        assert!(t.contains(r#"gpusleuth_cuda_calls_total{op="ncclAllReduce",layer="nccl",pid="20",comm="train"} 2"#), "{t}");
    }
}
