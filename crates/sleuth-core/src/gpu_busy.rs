//! GPU busy over a time window, from the device utilization samples NVML
//! keeps (`TraceData::gpu_samples`). NVML's figure is "some kernel was running
//! during the sample period", not SM occupancy: it is used as GPU busy.
//!
//! A sample at `ts_ns` covers `(ts_ns - period_ns, ts_ns]`. Busy over a window
//! is the mean of the samples weighted by their overlap with it, per GPU; the
//! busiest GPU is reported (a process drives its own device; the others idle).

use crate::data::TraceData;
use serde::Serialize;
use std::collections::BTreeMap;

/// Samples must cover at least this share of a window to give its busy figure.
pub const MIN_COVERAGE: f64 = 0.5;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuBusy {
    /// Device index of the busiest GPU.
    pub gpu: u32,
    /// Busy share of the window, 0.0..=1.0.
    pub busy: f64,
    /// Samples that overlapped the window.
    pub samples: u64,
    /// Share of the window the samples cover, 0.0..=1.0.
    pub coverage: f64,
}

/// GPU busy over `[start_ns, end_ns)`; None when not measured (no samples
/// captured, or they cover less than [`MIN_COVERAGE`] of the window).
pub fn gpu_busy(data: &TraceData, start_ns: u64, end_ns: u64) -> Option<GpuBusy> {
    let samples = data.gpu_samples.as_ref()?;
    if end_ns <= start_ns {
        return None;
    }
    // gpu -> (busy-weighted ns, covered ns, samples)
    let mut acc: BTreeMap<u32, (f64, u64, u64)> = BTreeMap::new();
    for s in samples {
        let from = s.ts_ns.saturating_sub(s.period_ns).max(start_ns);
        let to = s.ts_ns.min(end_ns);
        if to <= from {
            continue;
        }
        let e = acc.entry(s.gpu).or_default();
        let busy = (s.busy_pct / 100.0).clamp(0.0, 1.0);
        e.0 += busy * (to - from) as f64;
        e.1 += to - from;
        e.2 += 1;
    }
    let window = (end_ns - start_ns) as f64;
    acc.into_iter()
        .filter(|(_, (_, covered, _))| *covered as f64 / window >= MIN_COVERAGE)
        .map(|(gpu, (weighted, covered, n))| GpuBusy {
            gpu,
            busy: weighted / covered as f64,
            samples: n,
            coverage: (covered as f64 / window).min(1.0),
        })
        .max_by(|a, b| a.busy.total_cmp(&b.busy).then(b.gpu.cmp(&a.gpu)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuSample;

    use crate::testing::MS;

    fn sample(ts: u64, gpu: u32, busy: u32) -> GpuSample {
        GpuSample {
            ts_ns: ts,
            gpu,
            busy_pct: busy as f64,
            period_ns: 200 * MS,
        }
    }

    fn data(samples: Option<Vec<GpuSample>>) -> TraceData {
        TraceData {
            gpu_samples: samples,
            ..Default::default()
        }
    }

    #[test]
    fn weighted_by_overlap_and_busiest_gpu_reported() {
        // GPU 0: 10% over (0, 200], 50% over (200, 400]; GPU 1 idle.
        let d = data(Some(vec![
            sample(200 * MS, 0, 10),
            sample(400 * MS, 0, 50),
            sample(200 * MS, 1, 0),
            sample(400 * MS, 1, 0),
        ]));
        let g = gpu_busy(&d, 100 * MS, 400 * MS).unwrap();
        assert_eq!((g.gpu, g.samples), (0, 2));
        // 100 ms at 10% and 200 ms at 50%.
        assert!((g.busy - (0.1 * 100.0 + 0.5 * 200.0) / 300.0).abs() < 1e-9);
        assert!((g.coverage - 1.0).abs() < 1e-9);
    }

    #[test]
    fn not_measured_is_none() {
        assert!(gpu_busy(&data(None), 0, 100 * MS).is_none());
        // Samples exist but cover 100 of 400 ms: below the coverage floor.
        let d = data(Some(vec![sample(200 * MS, 0, 90)]));
        assert!(gpu_busy(&d, 100 * MS, 500 * MS).is_none());
        // Exactly half covered: measured.
        assert!(gpu_busy(&d, 100 * MS, 300 * MS).is_some());
        assert!(gpu_busy(&d, 5, 5).is_none());
    }
}
