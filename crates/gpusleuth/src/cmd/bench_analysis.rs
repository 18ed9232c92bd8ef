//! The storage and analysis half of `gpusleuth bench`: how fast the writer
//! stores events (the pipeline's ceiling behind the ring buffer) and how long
//! `stats` and `explain` take on a large stored trace. No eBPF: the events are
//! synthetic, shaped like a contended CUDA program.

use anyhow::{Context, Result};
use serde::Serialize;
use sleuth_core::{CallEvent, Culprit, Event, WaitEvent, WaitKind};
use sleuth_store::{SessionInfo, Trace, TraceWriter, WriterOptions};
use std::path::Path;
use std::time::Instant;

#[derive(Serialize)]
pub struct AnalysisBench {
    pub calls: u64,
    pub waits: u64,
    /// Events handed to the writer until `finish()` returned (culprit join included).
    pub write_ms: f64,
    pub write_events_per_s: f64,
    pub db_mb: f64,
    pub load_ms: f64,
    pub stats_ms: f64,
    pub explain_ms: f64,
    pub findings: usize,
}

/// One op mix: copies that spin (some preempted by a "hog"), syncs that sleep,
/// allocations and frees; a wait record for every tenth call.
fn events(n_calls: u64) -> impl Iterator<Item = Event> {
    const OPS: [u16; 4] = [9, 14, 1, 2]; // cudaMemcpy, cudaStreamSynchronize, cudaMalloc, cudaFree
    (0..n_calls).flat_map(|i| {
        let ts = 1_000_000 + i * 20_000;
        let op = OPS[(i % 4) as usize];
        let (runnable, blocked) = match op {
            9 if i % 40 == 0 => (8_000, 0),
            14 => (0, 9_000),
            _ => (0, 0),
        };
        let call = CallEvent {
            ts_ns: ts,
            dur_ns: 10_000,
            pid: 100,
            tid: 100,
            op,
            size: Some(4096),
            ptr: Some(0x7f00_0000_0000 + (i / 4) * 4096),
            runnable_ns: runnable,
            blocked_ns: blocked,
            ..Default::default()
        };
        let mut out = vec![Event::Call(call)];
        if i % 10 == 0 {
            out.push(Event::Wait(WaitEvent {
                pid: 100,
                tid: 100,
                kind: if runnable > 0 {
                    WaitKind::Preempted
                } else {
                    WaitKind::Blocked
                },
                off_ns: ts + 1_000,
                wake_ns: ts + 1_000 + blocked,
                on_ns: ts + 1_000 + blocked + runnable,
                prev_state: if runnable > 0 { 0 } else { 2 },
                cpu: 0,
                culprits: if runnable > 0 {
                    vec![Culprit {
                        pid: 200,
                        tid: 200,
                        comm: "hog".into(),
                        ns: runnable,
                    }]
                } else {
                    Vec::new()
                },
                waker: None,
            }));
        }
        out
    })
}

pub fn run(dir: &Path, n_calls: u64) -> Result<AnalysisBench> {
    let db = dir.join("analysis.db");
    let _ = std::fs::remove_file(&db);
    let t = Instant::now();
    let writer = TraceWriter::create(
        &db,
        SessionInfo {
            start_mono_ns: 0,
            ..Default::default()
        },
        WriterOptions {
            max_db_bytes: 16 << 30,
            ..Default::default()
        },
    )
    .with_context(|| format!("cannot create {}", db.display()))?;
    let h = writer.handle();
    let mut n_events = 0u64;
    let mut waits = 0u64;
    for ev in events(n_calls) {
        waits += matches!(ev, Event::Wait(_)) as u64;
        n_events += 1;
        h.send(ev)?;
    }
    h.set_session_end(1_000_000 + n_calls * 20_000)?;
    drop(h);
    writer.finish()?;
    let write_ms = t.elapsed().as_secs_f64() * 1e3;
    let db_mb = std::fs::metadata(&db)
        .map(|m| m.len() as f64 / 1048576.0)
        .unwrap_or(0.0);

    let t = Instant::now();
    let data = Trace::open(&db)?.load(None)?;
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let stats = sleuth_core::stats::compute(&data);
    let stats_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let findings = sleuth_core::findings::explain(&data);
    let explain_ms = t.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(
        !stats.ops.is_empty(),
        "the synthetic trace produced no stats"
    );
    let _ = std::fs::remove_file(&db);
    Ok(AnalysisBench {
        calls: n_calls,
        waits,
        write_ms,
        write_events_per_s: n_events as f64 / (write_ms / 1e3),
        db_mb,
        load_ms,
        stats_ms,
        explain_ms,
        findings: findings.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthetic_trace_round_trips_and_names_the_hog() {
        let dir = std::env::temp_dir().join(format!("gs-bench-analysis-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = run(&dir, 4_000).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(r.calls, 4_000);
        assert_eq!(r.waits, 400);
        // Copies preempted by the hog every 40th call, syncs blocked: both findings appear.
        assert!(r.findings >= 1);
    }
}
