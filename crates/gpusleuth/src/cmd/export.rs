//! `gpusleuth export`: a trace in another tool's format.
//!
//! `perfetto` writes Chrome Trace Event JSON (read by ui.perfetto.dev and
//! chrome://tracing): one track per process and thread, CUDA calls as
//! complete slices with their arguments, each off-CPU interval of a traced
//! thread as slices on that thread (`off-cpu: blocked` then `off-cpu:
//! runnable`, with the tasks that held the CPU), device memory per process
//! as a counter track, findings as instant events. `json` writes the calls
//! as a plain JSON array.
//!
//! Timestamps are microseconds (fractional, so nanoseconds survive) since
//! the trace's origin: the session start, or the earliest event if one is
//! older (a wait that began before tracing started).

use crate::args::TraceInput;
use crate::load::{emit, load_trace, FORCE_HINT};
use serde_json::{json, Value};
use sleuth_core::analysis::Analysis;
use sleuth_core::findings::Finding;
use sleuth_core::{Layer, TraceData, WaitEvent};
use std::collections::BTreeSet;
use std::path::PathBuf;

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Chrome Trace Event JSON for ui.perfetto.dev and chrome://tracing.
    Perfetto,
    /// The calls as a plain JSON array (the `CallEvent` fields, `op` by name).
    Json,
}

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  gpusleuth export --db trace.db --format perfetto -o trace.json   (open in ui.perfetto.dev)\n  gpusleuth export --db trace.db --format json | jq length"
)]
pub struct Args {
    #[command(flatten)]
    pub input: TraceInput,
    #[arg(long, value_enum, default_value = "perfetto")]
    pub format: Format,
    /// Output file (default: stdout). Written atomically; never the input trace.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Replace the output file if it exists.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let db = &args.input.db;
    if let Some(path) = &args.output {
        // Before the work: a refused output is known at once.
        sleuth_store::outfile::check_output(path, &[db], args.force, Some(FORCE_HINT))?;
    }
    let data = load_trace(db, args.input.pid)?;
    let doc = match args.format {
        Format::Perfetto => perfetto(&data, &Analysis::of(&data)),
        Format::Json => calls_json(&data),
    };
    match &args.output {
        Some(path) => {
            let bytes = serde_json::to_vec(&doc)?;
            sleuth_store::outfile::write_atomic(path, &bytes, &[db], args.force, Some(FORCE_HINT))?;
        }
        None => {
            let mut text = serde_json::to_string(&doc)?;
            text.push('\n');
            emit(&text)?;
        }
    }
    Ok(0)
}

/// `--format json`: the calls as every other output names them — `op` and
/// `layer` by name — and the on-CPU/runnable/blocked split null when the
/// trace has no host context (imports), never 0.
pub fn calls_json(data: &TraceData) -> Value {
    let host = data.has_host_context;
    Value::Array(
        data.calls
            .iter()
            .map(|c| {
                json!({
                    "ts_ns": c.ts_ns,
                    "dur_ns": c.dur_ns,
                    "pid": c.pid,
                    "tid": c.tid,
                    "layer": c.layer().map(Layer::as_str),
                    "op": c.op_name(),
                    "ret": c.has_status().then_some(c.ret),
                    "failed": c.failed(),
                    "size": c.size,
                    "ptr": c.ptr,
                    "stream": c.stream,
                    "kind": c.kind,
                    "nested": c.nested,
                    "on_cpu_ns": host.then(|| c.on_cpu_ns()),
                    "runnable_ns": host.then_some(c.runnable_ns),
                    "blocked_ns": host.then_some(c.blocked_ns),
                    "cpu": host.then_some(c.cpu),
                })
            })
            .collect(),
    )
}

/// Nanoseconds since `origin` as fractional microseconds.
fn us(ns: u64, origin: u64) -> f64 {
    ns.saturating_sub(origin) as f64 / 1e3
}

fn dur_us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// The whole trace as a Chrome Trace Event document; the findings and
/// memory tracks are `analysis`'s (the same as `explain` and the report show).
pub fn perfetto(data: &TraceData, analysis: &Analysis) -> Value {
    // Every timestamp is relative to the extent's origin: a wait begun
    // before tracing started is drawn at its place, never at a negative time.
    let origin = analysis.span.origin_ns;
    let mut ev: Vec<Value> = Vec::new();
    metadata(data, &mut ev);
    // Unknown without host context (imports): null, never 0.
    let host = |ns: u64| data.has_host_context.then(|| dur_us(ns));
    for c in &data.calls {
        let layer = c.layer().map(Layer::as_str).unwrap_or("unknown");
        let mut args = json!({
            "op": c.op_name(),
            "layer": layer,
            "ret": c.has_status().then_some(c.ret),
            "on_cpu_us": host(c.on_cpu_ns()),
            "runnable_us": host(c.runnable_ns),
            "blocked_us": host(c.blocked_ns),
            "cpu": data.has_host_context.then_some(c.cpu),
        });
        let extra = [
            ("size", c.size.map(Value::from)),
            ("ptr", c.ptr.map(|p| Value::from(format!("{p:#x}")))),
            ("stream", c.stream.map(|s| Value::from(format!("{s:#x}")))),
            ("kind", c.kind.map(Value::from)),
        ];
        for (k, v) in extra {
            if let Some(v) = v {
                args[k] = v;
            }
        }
        if c.nested {
            args["nested"] = Value::Bool(true);
        }
        // The call site and its stack (innermost first) on the slice.
        if let Some(st) = c.stack_id.and_then(|id| data.stacks.get(&id)) {
            args["site"] = Value::from(st.site_label());
            args["stack"] = Value::from(st.frames.iter().map(|f| f.label()).collect::<Vec<_>>());
        }
        ev.push(json!({
            "ph": "X",
            "name": c.op_name(),
            "cat": format!("cuda.{layer}"),
            "ts": us(c.ts_ns, origin),
            "dur": dur_us(c.dur_ns),
            "pid": c.pid,
            "tid": c.tid,
            "args": args,
        }));
    }
    for w in &data.waits {
        off_cpu_slices(w, origin, &mut ev);
    }
    for l in &analysis.ledgers {
        let name = "device memory (bytes)";
        // Start at zero so the track begins with the trace, not the first allocation.
        ev.push(json!({"ph": "C", "name": name, "pid": l.pid, "ts": 0.0,
                       "args": {"live_bytes": 0}}));
        for p in &l.timeline {
            ev.push(
                json!({"ph": "C", "name": name, "pid": l.pid, "ts": us(p.ts_ns, origin),
                           "args": {"live_bytes": p.live_bytes}}),
            );
        }
        for f in &l.failed_allocs {
            ev.push(json!({"ph": "i", "s": "p", "name": format!("failed {}", f.op),
                           "cat": "memory", "pid": l.pid, "tid": l.pid, "ts": us(f.ts_ns, origin),
                           "args": {"bytes": f.bytes, "error": f.error, "live_bytes_at": f.live_bytes_at}}));
        }
    }
    gpu_counters(data, origin, &mut ev);
    for f in &analysis.explanation.findings {
        ev.push(finding_event(f, data, origin));
    }
    json!({
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "otherData": {
            "tool": "gpusleuth",
            "version": env!("CARGO_PKG_VERSION"),
            "origin_mono_ns": origin,
            "origin_unix_ns": origin as i128 + data.realtime_offset_ns as i128,
        },
    })
}

/// Pseudo-process holding the GPU busy tracks (no real pid is 0 in a trace).
const GPU_TRACK_PID: u32 = 0;

/// NVML figures as counter tracks: GPU busy per GPU (a step at the start
/// of each sample period) on a "GPUs (NVML)" track, and per process the
/// device memory the driver attributed to it (pre-trace memory included).
fn gpu_counters(data: &TraceData, origin: u64, ev: &mut Vec<Value>) {
    if let Some(samples) = &data.gpu_samples {
        ev.push(
            json!({"ph": "M", "name": "process_name", "pid": GPU_TRACK_PID, "tid": 0,
                       "args": {"name": "GPUs (NVML)"}}),
        );
        for g in samples {
            let at = g.ts_ns.saturating_sub(g.period_ns).max(origin);
            ev.push(json!({"ph": "C", "name": format!("GPU {} busy (%)", g.gpu),
                           "pid": GPU_TRACK_PID, "ts": us(at, origin),
                           "args": {"busy_pct": g.busy_pct}}));
        }
    }
    for p in &data.process_gpu {
        if let Some(b) = p.used_bytes {
            ev.push(
                json!({"ph": "C", "name": format!("GPU {} memory held, NVML (bytes)", p.gpu),
                           "pid": p.pid, "ts": us(p.ts_ns, origin),
                           "args": {"used_bytes": b}}),
            );
        }
    }
}

/// `process_name` / `thread_name` records: every process and thread that appears.
fn metadata(data: &TraceData, ev: &mut Vec<Value>) {
    let mut pids: BTreeSet<u32> = data.processes.iter().map(|p| p.pid).collect();
    let mut threads: BTreeSet<(u32, u32)> = BTreeSet::new();
    for c in &data.calls {
        threads.insert((c.pid, c.tid));
    }
    for w in &data.waits {
        threads.insert((w.pid, w.tid));
    }
    pids.extend(threads.iter().map(|t| t.0));
    for pid in &pids {
        ev.push(
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": format!("{} ({pid})", data.comm_of(*pid))}}),
        );
    }
    for (pid, tid) in threads {
        let name = if pid == tid {
            format!("{} (main {tid})", data.comm_of(pid))
        } else {
            format!("thread {tid}")
        };
        ev.push(
            json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": name}}),
        );
    }
}

/// A wait as up to two adjacent slices on its thread: blocked `[off, wake)`
/// and runnable `[wake, on)` (the latter names the tasks that held the CPU).
fn off_cpu_slices(w: &WaitEvent, origin: u64, ev: &mut Vec<Value>) {
    if w.blocked_ns() > 0 {
        ev.push(json!({
            "ph": "X", "name": "off-cpu: blocked", "cat": "sched.blocked",
            "ts": us(w.off_ns, origin), "dur": dur_us(w.blocked_ns()),
            "pid": w.pid, "tid": w.tid,
            "args": {"prev_state": w.prev_state, "kind": w.kind.as_str()},
        }));
    }
    if w.runnable_ns() > 0 {
        let culprits: Vec<Value> = w
            .culprits
            .iter()
            .map(|c| json!({"pid": c.pid, "tid": c.tid, "comm": c.comm, "us": dur_us(c.ns)}))
            .collect();
        let preemptors: Vec<String> = w
            .culprits
            .iter()
            .map(|c| format!("{} ({})", c.comm, c.pid))
            .collect();
        ev.push(json!({
            "ph": "X", "name": "off-cpu: runnable", "cat": "sched.runnable",
            "ts": us(w.wake_ns.max(w.off_ns), origin), "dur": dur_us(w.runnable_ns()),
            "pid": w.pid, "tid": w.tid,
            "args": {"kind": w.kind.as_str(), "cpu": w.cpu,
                     "preemptors": preemptors.join(", "), "culprits": culprits},
        }));
    }
}

/// A finding as a global instant event at its first example call, else at
/// the earliest moment its evidence names (any `*ts_ns` field), else at the
/// session start.
fn finding_event(f: &Finding, data: &TraceData, origin: u64) -> Value {
    let ts = earliest_ts(&f.evidence["examples"])
        .or_else(|| earliest_ts(&f.evidence))
        .or(data.start_ns)
        .unwrap_or(origin);
    json!({
        "ph": "i", "s": "g", "cat": "finding",
        "name": format!("{}: {}", f.kind.as_str(), f.op),
        "ts": us(ts, origin), "pid": f.pids.first().copied().unwrap_or(0), "tid": 0,
        "args": {
            "severity": f.severity.as_str(),
            "summary": f.summary,
            "recommendation": f.recommendation,
            "pids": f.pids,
            "culprits": f.culprits,
            "evidence": f.evidence,
        },
    })
}

fn earliest_ts(v: &Value) -> Option<u64> {
    match v {
        Value::Object(m) => m
            .iter()
            .filter_map(|(k, v)| {
                if k.ends_with("ts_ns") {
                    v.as_u64()
                } else {
                    earliest_ts(v)
                }
            })
            .min(),
        Value::Array(a) => a.iter().filter_map(earliest_ts).min(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::{CallEvent, Culprit, WaitKind};

    fn call(ts: u64, dur: u64, op: u16, size: Option<u64>, ptr: Option<u64>) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: dur,
            pid: 10,
            tid: 11,
            op,
            size,
            ptr,
            ..Default::default()
        }
    }

    #[test]
    fn json_names_ops_and_leaves_unknown_split_null() {
        let malloc = sleuth_core::op_by_name("cudaMalloc").unwrap().id;
        let mut data = TraceData {
            calls: vec![call(2_000, 500, malloc, Some(4096), Some(0x7f00))],
            has_host_context: true,
            ..Default::default()
        };
        let doc = calls_json(&data);
        assert_eq!(doc[0]["op"], "cudaMalloc");
        assert_eq!(doc[0]["layer"], "runtime");
        assert_eq!(doc[0]["size"], 4096);
        assert_eq!(doc[0]["on_cpu_ns"], 500);
        data.has_host_context = false;
        let doc = calls_json(&data);
        assert!(doc[0]["on_cpu_ns"].is_null() && doc[0]["runnable_ns"].is_null());
        assert_eq!(doc[0]["dur_ns"], 500);
    }

    #[test]
    fn slices_counters_and_waits() {
        let malloc = sleuth_core::op_by_name("cudaMalloc").unwrap().id;
        let free = sleuth_core::op_by_name("cudaFree").unwrap().id;
        let data = TraceData {
            calls: vec![
                call(2_000, 500, malloc, Some(4096), Some(0x7f00)),
                call(5_000, 700, free, None, Some(0x7f00)),
            ],
            waits: vec![WaitEvent {
                pid: 10,
                tid: 11,
                kind: WaitKind::Preempted,
                off_ns: 3_000,
                wake_ns: 3_000,
                on_ns: 4_000,
                prev_state: 0,
                cpu: 0,
                culprits: vec![Culprit {
                    pid: 99,
                    tid: 99,
                    comm: "hog".into(),
                    ns: 1_000,
                }],
                waker: None,
            }],
            start_ns: Some(1_000),
            has_host_context: true,
            ..Default::default()
        };
        let doc = perfetto(&data, &Analysis::of(&data));
        let ev = doc["traceEvents"].as_array().unwrap();
        let x: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 3);
        assert_eq!(x[0]["ts"], 1.0);
        assert_eq!(x[0]["dur"], 0.5);
        assert_eq!(x[0]["args"]["ptr"], "0x7f00");
        let run = x.iter().find(|e| e["cat"] == "sched.runnable").unwrap();
        assert_eq!(run["args"]["preemptors"], "hog (99)");
        let counters: Vec<u64> = ev
            .iter()
            .filter(|e| e["ph"] == "C")
            .map(|e| e["args"]["live_bytes"].as_u64().unwrap())
            .collect();
        assert_eq!(counters, vec![0, 4096, 0]);
    }

    #[test]
    fn gpu_samples_and_nvml_memory_become_counter_tracks() {
        use sleuth_core::{GpuSample, ProcessGpuSample, SamplePhase};
        let data = TraceData {
            start_ns: Some(1_000_000),
            gpu_samples: Some(vec![GpuSample {
                ts_ns: 3_000_000,
                gpu: 0,
                busy_pct: 40.0,
                period_ns: 1_000_000,
            }]),
            process_gpu: vec![ProcessGpuSample {
                ts_ns: 1_000_000,
                gpu: 0,
                pid: 7,
                used_bytes: Some(1 << 30),
                sm_pct: None,
                phase: SamplePhase::Start,
            }],
            ..Default::default()
        };
        let doc = perfetto(&data, &Analysis::of(&data));
        let ev = doc["traceEvents"].as_array().unwrap();
        let busy = ev.iter().find(|e| e["name"] == "GPU 0 busy (%)").unwrap();
        assert_eq!(
            (busy["ts"].as_f64(), busy["args"]["busy_pct"].as_f64()),
            (Some(1000.0), Some(40.0))
        );
        let held = ev
            .iter()
            .find(|e| e["name"] == "GPU 0 memory held, NVML (bytes)")
            .unwrap();
        assert_eq!(
            (held["pid"].as_u64(), held["args"]["used_bytes"].as_u64()),
            (Some(7), Some(1 << 30))
        );
        let none = perfetto(&TraceData::default(), &Analysis::of(&TraceData::default()));
        assert!(
            !none.to_string().contains("GPUs (NVML)"),
            "no samples: no GPU track"
        );
    }

    #[test]
    fn earliest_ts_searches_nested_evidence() {
        let v = json!({"a": {"first_ts_ns": 30}, "examples": [{"ts_ns": 20}, {"ts_ns": 40}]});
        assert_eq!(earliest_ts(&v), Some(20));
        assert_eq!(earliest_ts(&json!({"n": 1})), None);
    }
}
