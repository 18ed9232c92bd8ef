//! GPU activity metrics (NVML, from `trace`'s sampler thread): whether it is
//! measured at all, each GPU's latest busy sample, and per traced process the
//! device memory the driver attributes to it, what it held when its tracing
//! began, and its SM use where the driver reports it.

use sleuth_core::{GpuSample, ProcessGpuSample, SamplePhase};
use std::collections::BTreeMap;

/// Processes with NVML series at a time; past it, new ones get none (the
/// sampler only reads traced processes, so this is a backstop).
pub const MAX_GPU_PROCESSES: usize = 200;

#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcGpu {
    pub comm: String,
    /// NVML used memory per GPU when the process's tracing began.
    pub start_bytes: BTreeMap<u32, Option<u64>>,
    /// Latest NVML used memory per GPU.
    pub used_bytes: BTreeMap<u32, u64>,
    /// Latest per-process SM utilization per GPU (percent).
    pub sm_pct: BTreeMap<u32, f64>,
}

impl ProcGpu {
    /// What NVML said the process held when its tracing began (Σ over GPUs):
    /// 0 when it was not listed then (no context yet), None when listed without a figure.
    pub fn before_trace_bytes(&self) -> Option<u64> {
        self.start_bytes
            .values()
            .try_fold(0u64, |a, b| Some(a + (*b)?))
    }
}

#[derive(Debug, Default)]
pub struct GpuState {
    /// None until the sampler started; false when NVML was not available.
    pub measured: Option<bool>,
    /// Latest busy sample per GPU (percent) and its period end (trace ns).
    pub busy_pct: BTreeMap<u32, f64>,
    pub procs: BTreeMap<u32, ProcGpu>,
}

impl GpuState {
    pub fn observe(
        &mut self,
        dev: &[GpuSample],
        rows: &[ProcessGpuSample],
        comm_of: impl Fn(u32) -> String,
    ) {
        for s in dev {
            self.busy_pct.insert(s.gpu, s.busy_pct);
        }
        for r in rows {
            if r.phase == SamplePhase::End && r.used_bytes == Some(0) {
                // Gone from the driver's list: its series end.
                if let Some(p) = self.procs.get_mut(&r.pid) {
                    p.used_bytes.remove(&r.gpu);
                    p.sm_pct.remove(&r.gpu);
                    if p.used_bytes.is_empty() {
                        self.procs.remove(&r.pid);
                    }
                }
                continue;
            }
            if !self.procs.contains_key(&r.pid) && self.procs.len() >= MAX_GPU_PROCESSES {
                continue;
            }
            let p = self.procs.entry(r.pid).or_insert_with(|| ProcGpu {
                comm: comm_of(r.pid),
                ..Default::default()
            });
            if r.phase == SamplePhase::Start {
                p.start_bytes.insert(r.gpu, r.used_bytes);
            }
            if let Some(b) = r.used_bytes {
                p.used_bytes.insert(r.gpu, b);
            }
            if let Some(sm) = r.sm_pct {
                p.sm_pct.insert(r.gpu, sm);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u32, gpu: u32, b: u64, phase: SamplePhase) -> ProcessGpuSample {
        ProcessGpuSample {
            ts_ns: 0,
            gpu,
            pid,
            used_bytes: Some(b),
            sm_pct: Some(12.0),
            phase,
        }
    }

    #[test]
    fn baseline_latest_use_and_exit() {
        let mut g = GpuState::default();
        let comm = |_| "python3".to_string();
        g.observe(
            &[GpuSample {
                ts_ns: 1,
                gpu: 0,
                busy_pct: 40.0,
                period_ns: 1,
            }],
            &[
                row(7, 0, 100, SamplePhase::Start),
                row(7, 1, 20, SamplePhase::Start),
            ],
            comm,
        );
        assert_eq!(g.busy_pct[&0], 40.0);
        assert_eq!(g.procs[&7].before_trace_bytes(), Some(120));
        g.observe(
            &[],
            &[
                row(7, 0, 150, SamplePhase::Sample),
                row(8, 0, 5, SamplePhase::Sample),
            ],
            comm,
        );
        assert_eq!(g.procs[&7].used_bytes[&0], 150);
        assert_eq!(g.procs[&7].before_trace_bytes(), Some(120));
        assert_eq!(
            g.procs[&8].before_trace_bytes(),
            Some(0),
            "appeared during the trace"
        );
        g.observe(&[], &[row(8, 0, 0, SamplePhase::End)], comm);
        assert!(!g.procs.contains_key(&8));
    }
}
