//! The GPU side of a trace in a few lines, for `explain` and the report:
//! NVML busy per GPU (or "not measured") and, per process, the memory the
//! driver said it held before the trace began beside what the trace saw.

use crate::output::fmt_bytes;
use sleuth_core::gpu_activity::{self, GpuActivity};
use sleuth_core::held::{held, HeldMemory};
use sleuth_core::ledger::ProcessLedger;
use sleuth_core::TraceData;

/// "GPU busy ..." lines: one per GPU, or one saying it was not measured.
pub fn busy_lines(a: &GpuActivity) -> Vec<String> {
    if !a.measured {
        return vec![
            "GPU busy: not measured (no NVML utilization samples in this trace: no driver, an imported or older trace, or a trace shorter than one sample)"
                .into(),
        ];
    }
    a.gpus
        .iter()
        .map(|g| {
            format!(
                "GPU {} busy {:.0}% of the sampled time ({} NVML samples over {:.1}s, min {:.0}%, max {:.0}%; \
                 busy = some kernel was running, not SM occupancy)",
                g.gpu,
                g.busy_pct,
                g.samples,
                g.covered_ns as f64 / 1e9,
                g.min_pct,
                g.max_pct
            )
        })
        .collect()
}

/// One line per process: "comm (pid N): held before tracing: ...".
pub fn held_lines(data: &TraceData, helds: &[HeldMemory]) -> Vec<String> {
    if helds.iter().all(|h| !h.measured) {
        return if helds.is_empty() {
            Vec::new()
        } else {
            vec!["Memory held before tracing: not measured (no NVML per-process memory in this trace); \
                  allocations made before the trace are not itemized."
                .into()]
        };
    }
    helds
        .iter()
        .map(|h| {
            format!(
                "{} (pid {}): {}",
                data.comm_of(h.pid),
                h.pid,
                h.line(fmt_bytes)
            )
        })
        .collect()
}

/// Busy lines then held lines; `ledgers` is the trace's ledger (`Analysis::ledgers`).
pub fn lines(data: &TraceData, ledgers: &[ProcessLedger]) -> Vec<String> {
    let mut out = busy_lines(&gpu_activity::of_trace(data));
    out.extend(held_lines(data, &held(data, ledgers)));
    out
}
