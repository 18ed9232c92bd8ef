//! The export as it was built before it streamed (issue 16): one
//! `serde_json::Value` document of the whole trace. Kept, for tests only,
//! as the reference the streamed writer must match byte for byte. What
//! streaming changed (rows read one at a time and filtered by pid instead
//! of a loaded `TraceData`) is built here the old way; the per-record
//! builder that takes the same input either way (`finding_event`) is the
//! streamed writer's own; the off-CPU slices, typed records there, are
//! built here as `json!` documents.

use super::{dur_us, finding_event, us};
use serde_json::{json, Value};
use sleuth_core::analysis::Analysis;
use sleuth_core::{CallEvent, WaitEvent};
use sleuth_core::{Layer, TraceData};
use std::collections::BTreeSet;

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

/// The whole trace as a Chrome Trace Event document; the findings and
/// memory tracks are `analysis`'s (the same as `explain` and the report show).
pub fn perfetto(data: &TraceData, analysis: &Analysis) -> Value {
    // Every timestamp is relative to the extent's origin: a wait begun
    // before tracing started is drawn at its place, never at a negative time.
    let origin = analysis.span.origin_ns;
    let mut ev: Vec<Value> = Vec::new();
    metadata(data, &mut ev);
    for c in &data.calls {
        ev.push(call_slice(c, data, origin));
    }
    for w in &data.waits {
        ev.extend(off_cpu_slices(w, origin));
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
        // The driver frees a process's memory at its exit.
        if let Some(exit) = l.exit_ns.filter(|&e| e >= origin) {
            ev.push(
                json!({"ph": "C", "name": name, "pid": l.pid, "ts": us(exit, origin),
                           "args": {"live_bytes": 0}}),
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
pub fn off_cpu_slices(w: &WaitEvent, origin: u64) -> impl Iterator<Item = Value> {
    let blocked = (w.blocked_ns() > 0).then(|| {
        json!({
            "ph": "X", "name": "off-cpu: blocked", "cat": "sched.blocked",
            "ts": us(w.off_ns, origin), "dur": dur_us(w.blocked_ns()),
            "pid": w.pid, "tid": w.tid,
            "args": {"prev_state": w.prev_state, "kind": w.kind.as_str()},
        })
    });
    let runnable = (w.runnable_ns() > 0).then(|| {
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
        json!({
            "ph": "X", "name": "off-cpu: runnable", "cat": "sched.runnable",
            "ts": us(w.wake_ns.max(w.off_ns), origin), "dur": dur_us(w.runnable_ns()),
            "pid": w.pid, "tid": w.tid,
            "args": {"kind": w.kind.as_str(), "cpu": w.cpu,
                     "preemptors": preemptors.join(", "), "culprits": culprits},
        })
    });
    blocked.into_iter().chain(runnable)
}

/// A call's complete slice (`ph: X`), as the document held it.
pub fn call_slice(c: &CallEvent, data: &TraceData, origin: u64) -> Value {
    // Unknown without host context (imports): null, never 0.
    let host = |ns: u64| data.has_host_context.then(|| dur_us(ns));
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
    json!({
        "ph": "X",
        "name": c.op_name(),
        "cat": format!("cuda.{layer}"),
        "ts": us(c.ts_ns, origin),
        "dur": dur_us(c.dur_ns),
        "pid": c.pid,
        "tid": c.tid,
        "args": args,
    })
}
