//! The text exposition, encoded by `prometheus-client`: OpenMetrics 1.0
//! (`# EOF`, counters declared without `_total`), or Prometheus text 0.0.4
//! for scrapers that do not ask for OpenMetrics (the same samples; counter
//! families declared with `_total`, no `# EOF`: see [`prometheus_004_pieces`],
//! which the server sends from the OpenMetrics page itself).
//!
//! The values live in [`State`] (label budget, `other` folding, kernel
//! counters), so they are encoded by a [`Collector`] on each scrape rather
//! than kept in the crate's own metric types.

use super::state::{OpSeries, Proc, State, BUCKETS_S};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use sleuth_core::op_by_id;
use sleuth_core::record::stat;
use std::sync::{Arc, Mutex};

type Labels = Vec<(&'static str, String)>;
type Fmt = Result<(), std::fmt::Error>;

/// Encodes the shared state on each scrape.
#[derive(Debug)]
struct StateCollector(Arc<Mutex<State>>);

impl Collector for StateCollector {
    fn encode(&self, enc: DescriptorEncoder) -> Fmt {
        // A panic while holding the lock leaves plain counters behind: still usable.
        let s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        encode_state(&s, enc)
    }
}

/// The registry that encodes `state` (one per `Metrics`).
pub fn registry(state: Arc<Mutex<State>>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(StateCollector(state)));
    r
}

/// The OpenMetrics exposition text, in a buffer sized for `size` bytes
/// (the last page's); the 0.0.4 answer is made from it
/// ([`prometheus_004_pieces`]).
pub fn render(registry: &Registry, size: usize) -> String {
    // A little room over the last page's size: the counters' digits grow.
    let mut text = String::with_capacity(size + size / 16);
    // Writing into a String cannot fail; an encoder error would be a bug
    // in a label or name, and a scrape then gets what was written so far.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    text
}

/// Prometheus text 0.0.4 from OpenMetrics text, as one string (the tests'
/// view of what the server sends in pieces): a counter family is declared
/// under its sample name (`x_total`), and there is no `# EOF`.
#[cfg(test)]
pub(crate) fn to_prometheus_004(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    for piece in prometheus_004_pieces(om) {
        match piece {
            Piece::Same(r) => out.push_str(&om[r]),
            Piece::New(s) => out.push_str(&s),
        }
    }
    out
}

/// A part of a text made from another: a range of it, or new text.
#[derive(Debug, PartialEq)]
pub enum Piece {
    Same(std::ops::Range<usize>),
    New(String),
}

/// [`to_prometheus_004`] as pieces of the OpenMetrics text `om`: its lines
/// kept as ranges of it, the few that change (a counter's `# HELP` and
/// `# TYPE`, `# EOF` dropped) as new text. A scrape's 0.0.4 answer is sent
/// from the OpenMetrics page itself, never copied whole (round 55: the copy
/// beside the page was a second 22 MB at a scrape of 200 processes).
pub fn prometheus_004_pieces(om: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    // The unchanged lines since the last change, and the `# HELP` line
    // just before (a counter's is renamed with its `# TYPE`).
    let mut kept_from = 0;
    let mut help: Option<std::ops::Range<usize>> = None;
    let mut at = 0;
    while at < om.len() {
        let end = om[at..].find('\n').map_or(om.len(), |i| at + i);
        let next = (end + 1).min(om.len());
        let line = &om[at..end];
        let counter = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.strip_suffix(" counter"));
        if line == "# EOF" {
            if kept_from < at {
                out.push(Piece::Same(kept_from..at));
            }
            kept_from = next;
            help = None;
        } else if let Some(name) = counter {
            let from = help.as_ref().map_or(at, |h| h.start);
            if kept_from < from {
                out.push(Piece::Same(kept_from..from));
            }
            if let Some(h) = help.take() {
                let text = om[h.clone()]
                    .strip_prefix("# HELP ")
                    .and_then(|t| t.strip_prefix(name))
                    .unwrap_or("");
                out.push(Piece::New(format!("# HELP {name}_total{text}\n")));
            }
            out.push(Piece::New(format!("# TYPE {name}_total counter\n")));
            kept_from = next;
        } else {
            help = line.starts_with("# HELP ").then_some(at..end);
        }
        at = next;
    }
    if kept_from < om.len() {
        out.push(Piece::Same(kept_from..om.len()));
    }
    out
}

fn secs(ns: u128) -> f64 {
    ns as f64 / 1e9
}

/// One family: its descriptor, then one sample per label set (no labels:
/// one plain sample), each written by `put`.
fn family<V>(
    enc: &mut DescriptorEncoder,
    (name, help, ty): (&str, &str, MetricType),
    samples: impl IntoIterator<Item = (Labels, V)>,
    put: impl Fn(&mut MetricEncoder, &V) -> Fmt,
) -> Fmt {
    let mut m = enc.encode_descriptor(name, help, None, ty)?;
    for (l, v) in samples {
        if l.is_empty() {
            put(&mut m, &v)?;
        } else {
            put(&mut m.encode_family(&l)?, &v)?;
        }
    }
    Ok(())
}

fn counter<V: EncodeCounterValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, V)>,
) -> Fmt {
    family(enc, (name, help, MetricType::Counter), samples, |m, v| {
        m.encode_counter::<NoLabelSet, V, u64>(v, None)
    })
}

fn gauge<V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, V)>,
) -> Fmt {
    family(enc, (name, help, MetricType::Gauge), samples, |m, v| {
        m.encode_gauge(v)
    })
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

fn op_labels(op: u16, pid: &str, comm: &str) -> Option<Labels> {
    let info = op_by_id(op)?;
    Some(vec![
        ("op", info.name.to_string()),
        ("layer", info.layer.as_str().to_string()),
        ("pid", pid.to_string()),
        ("comm", comm.to_string()),
    ])
}

fn with(mut l: Labels, key: &'static str, v: impl ToString) -> Labels {
    l.push((key, v.to_string()));
    l
}

fn encode_state(s: &State, mut enc: DescriptorEncoder) -> Fmt {
    let procs = processes(s);
    let kernel = s.kernel_counts_by_label();
    let enc = &mut enc;

    let mut calls = Vec::new();
    for (pid, comm, p) in &procs {
        let key = pid.parse::<u32>().ok();
        let mut ops: std::collections::BTreeMap<u16, u64> =
            p.ops.iter().map(|(op, st)| (*op, st.calls)).collect();
        for ((kpid, op), count) in &kernel {
            if *kpid == key {
                *ops.entry(*op).or_default() += count;
            }
        }
        for (op, n) in ops {
            if let Some(l) = op_labels(op, pid, comm) {
                calls.push((l, n));
            }
        }
    }
    counter(
        enc,
        "gpusleuth_cuda_calls",
        "CUDA calls completed, per-call records plus calls counted in the kernel (launch hot paths).",
        calls,
    )?;

    let per_call = || {
        procs.iter().flat_map(|(pid, comm, p)| {
            p.ops
                .iter()
                .filter_map(move |(op, st)| Some((op_labels(*op, pid, comm)?, st)))
        })
    };
    counter(
        enc,
        "gpusleuth_cuda_errors",
        "CUDA calls that returned an error (per-call records only).",
        per_call().map(|(l, st)| (l, st.errors)),
    )?;

    {
        let mut m = enc.encode_descriptor(
            "gpusleuth_cuda_call_duration_seconds",
            "Wall time of CUDA calls (per-call records only).",
            None,
            MetricType::Histogram,
        )?;
        for (l, st) in per_call() {
            let b = buckets(st);
            m.encode_family(&l)?.encode_histogram::<NoLabelSet>(
                secs(st.sum_ns),
                st.calls,
                &b,
                None,
            )?;
        }
    }

    counter(
        enc,
        "gpusleuth_cuda_call_time_seconds",
        "Wall time inside CUDA calls split by thread state: on_cpu, runnable (CPU taken by another task), blocked (sleeping).",
        per_call().flat_map(|(l, st)| {
            ["on_cpu", "runnable", "blocked"]
                .iter()
                .enumerate()
                .map(move |(i, state)| (with(l.clone(), "state", state), secs(st.split[i])))
        }),
    )?;

    let named = || procs.iter().filter(|(pid, _, _)| pid != "other");
    let pid_comm =
        |pid: &str, comm: &str| vec![("pid", pid.to_string()), ("comm", comm.to_string())];
    gauge(
        enc,
        "gpusleuth_device_live_bytes",
        "Device memory allocated and not yet freed by the process (cudaMalloc-family and cuMemCreate, each allocation once).",
        named().map(|(pid, comm, p)| (pid_comm(pid, comm), p.live_bytes)),
    )?;
    gauge(
        enc,
        "gpusleuth_device_peak_bytes",
        "Highest device_live_bytes of the process since tracing started.",
        named().map(|(pid, comm, p)| (pid_comm(pid, comm), p.peak_bytes)),
    )?;

    counter(
        enc,
        "gpusleuth_dropped_events",
        "Events lost before reaching user space, by cause.",
        stat::losses().map(|i| (vec![("cause", stat::NAMES[i].to_string())], s.drops[i])),
    )?;
    counter(
        enc,
        "gpusleuth_attach_edge_events",
        "Expected edges of attaching to running processes, not losses: returns whose call began before the process was traced.",
        (0..stat::MAX)
            .filter(|&i| stat::is_attach_edge(i))
            .map(|i| (vec![("kind", stat::edge_name(i).to_string())], s.drops[i])),
    )?;

    gpu_families(enc, &s.gpu)?;

    counter(
        enc,
        "gpusleuth_events",
        "Events decoded from the kernel, by kind.",
        ["call", "wait", "proc"]
            .iter()
            .enumerate()
            .map(|(i, kind)| (vec![("kind", kind.to_string())], s.events[i])),
    )?;
    gauge(
        enc,
        "gpusleuth_labelled_processes",
        "Processes with their own pid/comm labels now (the rest count under pid=\"other\").",
        [(Labels::new(), s.procs.len() as u64)],
    )?;

    encode_nccl(enc, s)
}

/// Per-bucket (non-cumulative) counts at each bound, then `+Inf`.
fn buckets(st: &OpSeries) -> Vec<(f64, u64)> {
    let cum = st.cumulative_buckets();
    let mut out = Vec::with_capacity(cum.len());
    let mut prev = 0;
    for (i, c) in cum.iter().enumerate() {
        let bound = BUCKETS_S.get(i).copied().unwrap_or(f64::INFINITY);
        out.push((bound, c.saturating_sub(prev)));
        prev = prev.max(*c);
    }
    out
}

/// NVML figures: measured or not, busy per GPU, per-process memory and SM use.
fn gpu_families(enc: &mut DescriptorEncoder, g: &super::gpu::GpuState) -> Fmt {
    gauge(
        enc,
        "gpusleuth_gpu_activity_measured",
        "1 when NVML GPU activity is sampled during this trace, 0 when it is not available (then no gpu_* figure is exported).",
        [(Labels::new(), u32::from(g.measured == Some(true)))],
    )?;
    gauge(
        enc,
        "gpusleuth_gpu_busy_percent",
        "Latest NVML device utilization sample: percent of the sample period some kernel was running (not SM occupancy).",
        g.busy_pct
            .iter()
            .map(|(gpu, pct)| (vec![("gpu", gpu.to_string())], *pct)),
    )?;
    let pid_gpu = |pid: &u32, comm: &str, gpu: &u32| {
        vec![
            ("pid", pid.to_string()),
            ("comm", comm.to_string()),
            ("gpu", gpu.to_string()),
        ]
    };
    gauge(
        enc,
        "gpusleuth_process_gpu_memory_bytes",
        "Device memory NVML attributes to the traced process now (includes memory allocated before tracing and the CUDA context).",
        g.procs.iter().flat_map(|(pid, p)| {
            p.used_bytes
                .iter()
                .map(move |(gpu, b)| (pid_gpu(pid, &p.comm, gpu), *b))
        }),
    )?;
    gauge(
        enc,
        "gpusleuth_process_gpu_memory_before_trace_bytes",
        "Device memory NVML attributed to the process when its tracing began (0: not listed then); allocations made before the trace are not itemized.",
        g.procs.iter().filter_map(|(pid, p)| {
            Some((
                vec![("pid", pid.to_string()), ("comm", p.comm.clone())],
                p.before_trace_bytes()?,
            ))
        }),
    )?;
    gauge(
        enc,
        "gpusleuth_process_sm_percent",
        "Latest per-process SM utilization from NVML, where the driver reports it.",
        g.procs.iter().flat_map(|(pid, p)| {
            p.sm_pct
                .iter()
                .map(move |(gpu, v)| (pid_gpu(pid, &p.comm, gpu), *v))
        }),
    )
}

/// Per-rank NCCL collective series (only when NCCL communicators were seen).
fn encode_nccl(enc: &mut DescriptorEncoder, s: &State) -> Fmt {
    if s.nccl.ranks.is_empty() {
        return Ok(());
    }
    let host = local_hostname();
    let ranks: Vec<(Labels, &super::nccl::RankSeries)> = s
        .nccl
        .ranks
        .iter()
        .map(|((comm, rank), r)| {
            (
                vec![
                    ("comm", comm.clone()),
                    ("rank", rank.to_string()),
                    ("nranks", r.nranks.to_string()),
                    ("pid", r.pid.to_string()),
                    ("host", host.clone()),
                ],
                r,
            )
        })
        .collect();
    counter(
        enc,
        "gpusleuth_nccl_collectives",
        "NCCL collectives issued, per communicator rank.",
        ranks.iter().map(|(l, r)| (l.clone(), r.collectives)),
    )?;
    counter(
        enc,
        "gpusleuth_nccl_collective_seconds",
        "Wall time inside NCCL collective calls, per communicator rank.",
        ranks.iter().map(|(l, r)| (l.clone(), secs(r.time_ns))),
    )?;
    counter(
        enc,
        "gpusleuth_nccl_lateness_seconds",
        "Sum over matched collectives of the rank's entry minus the first rank's entry (ranks traced by this agent).",
        ranks.iter().map(|(l, r)| (l.clone(), secs(r.lateness_ns))),
    )?;
    counter(
        enc,
        "gpusleuth_nccl_last_arrivals",
        "Matched collectives the rank entered last, at least 1 ms after the first rank: the one the others waited for.",
        ranks.iter().map(|(l, r)| (l.clone(), r.last)),
    )
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

    /// The value of the sample `name` whose labels are exactly `labels`
    /// (in any order: label order and number spelling are the encoder's).
    fn value(t: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        want.sort();
        t.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
            let (head, v) = l.rsplit_once(' ')?;
            let (n, rest) = head.split_once('{').unwrap_or((head, "}"));
            if n != name {
                return None;
            }
            let mut got = Vec::new();
            let mut rest = rest.strip_suffix('}')?;
            while let Some((k, after)) = rest.split_once("=\"") {
                // The value ends at the first quote not escaped by a backslash.
                let mut end = 0;
                let b = after.as_bytes();
                while end < b.len() && !(b[end] == b'"' && (end == 0 || b[end - 1] != b'\\')) {
                    end += 1;
                }
                let raw = &after[..end];
                got.push((
                    k.trim_start_matches(',').to_string(),
                    raw.replace("\\\"", "\""),
                ));
                rest = after.get(end + 1..).unwrap_or("");
            }
            got.sort();
            (got == want).then(|| v.parse().ok())?
        })
    }

    /// The exposition of `s`, through a registry like `Metrics` builds.
    fn text(s: State, openmetrics: bool) -> String {
        let om = render(&registry(Arc::new(Mutex::new(s))), 0);
        match openmetrics {
            true => om,
            false => to_prometheus_004(&om),
        }
    }

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
            |_| Some("launcher".into()),
        );
        s
    }

    /// The pieces make what a line-by-line rewrite makes (the one used
    /// before round 55, kept here as the reference): counters renamed with
    /// their help, other families and samples as they were, `# EOF` gone.
    #[test]
    fn the_004_pieces_are_the_line_by_line_rewrite() {
        fn by_lines(om: &str) -> String {
            let mut out = String::new();
            let mut help: Option<&str> = None;
            for line in om.lines() {
                if line == "# EOF" {
                    continue;
                }
                if line.starts_with("# HELP ") {
                    if let Some(h) = help.replace(line) {
                        out.push_str(&format!("{h}\n"));
                    }
                    continue;
                }
                let h = help.take();
                match line
                    .strip_prefix("# TYPE ")
                    .and_then(|r| r.strip_suffix(" counter"))
                {
                    Some(name) => {
                        if let Some(h) = h {
                            let text = h.strip_prefix("# HELP ").and_then(|t| t.strip_prefix(name));
                            out.push_str(&format!("# HELP {name}_total{}\n", text.unwrap_or("")));
                        }
                        out.push_str(&format!("# TYPE {name}_total counter\n"));
                    }
                    None => {
                        if let Some(h) = h {
                            out.push_str(&format!("{h}\n"));
                        }
                        out.push_str(&format!("{line}\n"));
                    }
                }
            }
            if let Some(h) = help {
                out.push_str(&format!("{h}\n"));
            }
            out
        }
        let page = text(state(), true);
        let crafted = [
            page.as_str(),
            "# HELP a_b one\n# HELP c counts\n# TYPE c counter\nc_total 1\n# EOF\n",
            "# TYPE d counter\nd_total 2\n# HELP e g\n# TYPE e gauge\ne 3\n",
            "# HELP f help of f\nf 1\n# HELP g x\n",
            "",
        ];
        for om in crafted {
            assert_eq!(to_prometheus_004(om), by_lines(om), "{om}");
        }
    }

    #[test]
    fn openmetrics_text() {
        let t = text(state(), true);
        let l = r#"op="cudaMalloc",layer="runtime",pid="7",comm="a\"b""#;
        assert!(t.contains("# TYPE gpusleuth_cuda_calls counter\n"), "{t}");
        assert!(
            t.contains(&format!("gpusleuth_cuda_calls_total{{{l}}} 1\n")),
            "{t}"
        );
        assert!(t.contains(r#"gpusleuth_cuda_calls_total{op="cuLaunchKernel",layer="driver",pid="7",comm="a\"b"} 40"#));
        // A process that only launched has labels of its own.
        assert!(t.contains(r#"gpusleuth_cuda_calls_total{op="cuLaunchKernel",layer="driver",pid="8",comm="launcher"} 2"#));
        let ml = [
            ("op", "cudaMalloc"),
            ("layer", "runtime"),
            ("pid", "7"),
            ("comm", "a\"b"),
        ];
        let bucket = |le: &str| {
            let mut l = ml.to_vec();
            l.push(("le", le));
            value(&t, "gpusleuth_cuda_call_duration_seconds_bucket", &l)
        };
        // The 3 µs call: above the 1 µs bound, within 5 µs.
        assert_eq!(bucket("0.000001"), Some(0.0), "{t}");
        assert_eq!(bucket("0.000005"), Some(1.0), "{t}");
        assert_eq!(bucket("+Inf"), Some(1.0), "{t}");
        assert_eq!(
            value(&t, "gpusleuth_cuda_call_duration_seconds_count", &ml),
            Some(1.0)
        );
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
        let t = text(s, true);
        assert!(t.contains("gpusleuth_gpu_activity_measured 1\n"), "{t}");
        assert!(
            value(&t, "gpusleuth_gpu_busy_percent", &[("gpu", "0")]) == Some(37.0),
            "{t}"
        );
        assert!(t.contains(
            "gpusleuth_process_gpu_memory_bytes{pid=\"7\",comm=\"py\",gpu=\"0\"} 1073741824\n"
        ));
        assert!(t.contains(
            "gpusleuth_process_gpu_memory_before_trace_bytes{pid=\"7\",comm=\"py\"} 1073741824\n"
        ));
        assert_eq!(
            value(
                &t,
                "gpusleuth_process_sm_percent",
                &[("pid", "7"), ("comm", "py"), ("gpu", "0")]
            ),
            Some(12.0),
            "{t}"
        );
    }

    #[test]
    fn prometheus_text_declares_counters_with_total() {
        let t = text(state(), false);
        assert!(t.contains("# TYPE gpusleuth_cuda_calls_total counter\n"));
        assert!(!t.contains("# EOF"));
    }

    #[test]
    fn nccl_rank_series_appear_once_a_communicator_is_seen() {
        let t = text(state(), true);
        assert!(!t.contains("gpusleuth_nccl"), "no NCCL, no NCCL families");
        let mut s = state();
        use crate::metrics::nccl::tests::ev;
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
        let t = text(s, true);
        assert!(
            t.contains("# TYPE gpusleuth_nccl_last_arrivals counter\n"),
            "{t}"
        );
        let host = local_hostname();
        let l1 = format!(r#"comm="ab",rank="1",nranks="2",pid="20",host="{host}""#);
        let l0 = format!(r#"comm="ab",rank="0",nranks="2",pid="10",host="{host}""#);
        assert!(
            t.contains(&format!("gpusleuth_nccl_collectives_total{{{l1}}} 2\n")),
            "{t}"
        );
        let rank = |r: &'static str, pid: &'static str| {
            [
                ("comm", "ab"),
                ("rank", r),
                ("nranks", "2"),
                ("pid", pid),
                ("host", host.as_str()),
            ]
        };
        assert_eq!(
            value(
                &t,
                "gpusleuth_nccl_collective_seconds_total",
                &rank("0", "10")
            ),
            Some(4.0),
            "{t}"
        );
        assert_eq!(
            value(
                &t,
                "gpusleuth_nccl_lateness_seconds_total",
                &rank("1", "20")
            ),
            Some(1.0),
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
