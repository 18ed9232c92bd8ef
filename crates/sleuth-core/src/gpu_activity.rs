//! GPU activity as NVML sampled it during a trace: clock conversion of
//! NVML's timestamps and the busy summary every view shows.
//!
//! NVML stamps its samples with a CPU wall-clock time in microseconds since
//! the Unix epoch; a trace's events use CLOCK_MONOTONIC nanoseconds. The
//! session stores `realtime_offset_ns` (wall-clock ns = monotonic ns +
//! offset), so a sample's trace time is `ts_us × 1000 − offset`.

use crate::data::{GpuSample, ProcessGpuSample, TraceData};
use serde::Serialize;
use std::collections::BTreeMap;

/// An NVML timestamp (µs since the epoch, wall clock) on the trace's
/// monotonic clock, or `None` when it falls before the monotonic epoch
/// (a sample older than the machine's boot cannot belong to the trace).
pub fn nvml_us_to_trace_ns(ts_us: u64, realtime_offset_ns: i64) -> Option<u64> {
    let wall_ns = i128::from(ts_us) * 1000;
    let mono = wall_ns - i128::from(realtime_offset_ns);
    u64::try_from(mono).ok()
}

/// Busy figures of one GPU over the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuBusy {
    pub gpu: u32,
    pub samples: usize,
    /// Time-weighted mean of the samples' busy share (each sample weighs its period).
    pub busy_pct: f64,
    /// Time the samples cover (sum of their periods), ns.
    pub covered_ns: u64,
    /// Highest and lowest sample.
    pub max_pct: f64,
    pub min_pct: f64,
}

/// What the views say about GPU activity: measured (per GPU) or not, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuActivity {
    /// False when the trace holds no GPU sample (no NVML, an imported or older trace).
    pub measured: bool,
    pub gpus: Vec<GpuBusy>,
    /// What the figure means, in words.
    pub meaning: &'static str,
}

/// The meaning of NVML's device utilization, said wherever it is shown.
pub const BUSY_MEANING: &str =
    "NVML device utilization: the share of each sample period during which \
     some kernel was running on the GPU (not SM occupancy)";

/// Per-GPU busy summary of `samples` (with `window`, `[since, until)`: those
/// whose period ends after its start and not after its end; one ending at
/// the start lies wholly before the window).
pub fn busy(samples: Option<&[GpuSample]>, window: Option<(u64, u64)>) -> GpuActivity {
    let Some(samples) = samples else {
        return GpuActivity {
            measured: false,
            gpus: Vec::new(),
            meaning: BUSY_MEANING,
        };
    };
    let mut by_gpu: BTreeMap<u32, Vec<&GpuSample>> = BTreeMap::new();
    for s in samples
        .iter()
        .filter(|s| window.is_none_or(|(lo, hi)| s.ts_ns > lo && s.ts_ns <= hi))
    {
        by_gpu.entry(s.gpu).or_default().push(s);
    }
    let gpus = by_gpu
        .into_iter()
        .map(|(gpu, list)| {
            let covered: u64 = list.iter().map(|s| s.period_ns).sum();
            let weighted: f64 = list.iter().map(|s| s.busy_pct * s.period_ns as f64).sum();
            let busy_pct = if covered > 0 {
                weighted / covered as f64
            } else {
                list.iter().map(|s| s.busy_pct).sum::<f64>() / list.len() as f64
            };
            GpuBusy {
                gpu,
                samples: list.len(),
                busy_pct,
                covered_ns: covered,
                max_pct: list.iter().map(|s| s.busy_pct).fold(0.0, f64::max),
                min_pct: list.iter().map(|s| s.busy_pct).fold(100.0, f64::min),
            }
        })
        .collect();
    GpuActivity {
        measured: true,
        gpus,
        meaning: BUSY_MEANING,
    }
}

/// The trace's GPU activity over its whole span.
pub fn of_trace(data: &TraceData) -> GpuActivity {
    busy(data.gpu_samples.as_deref(), None)
}

/// Per-process SM utilization samples of `pid` (where the driver gave them).
pub fn process_sm(data: &TraceData, pid: u32) -> Vec<&ProcessGpuSample> {
    data.process_gpu
        .iter()
        .filter(|s| s.pid == pid && s.sm_pct.is_some())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_wall_clock_microseconds_become_trace_nanoseconds() {
        // Monotonic 5 s after boot is wall clock 1_700_000_000.000_000 s: offset = wall − mono.
        let offset: i64 = 1_700_000_000_000_000_000 - 5_000_000_000;
        // A sample stamped 250 ms later than that wall time is 5.25 s on the trace clock.
        assert_eq!(
            nvml_us_to_trace_ns(1_700_000_000_250_000, offset),
            Some(5_250_000_000)
        );
        // Exactly the monotonic epoch, and before it.
        assert_eq!(nvml_us_to_trace_ns(1_699_999_995_000_000, offset), Some(0));
        assert_eq!(nvml_us_to_trace_ns(1_699_999_994_999_999, offset), None);
        // A negative offset (wall clock behind monotonic) is valid too.
        assert_eq!(nvml_us_to_trace_ns(1, -5_000), Some(6_000));
        assert!(nvml_us_to_trace_ns(u64::MAX, i64::MIN).is_none());
    }

    fn s(ts_ns: u64, gpu: u32, busy_pct: f64, period_ns: u64) -> GpuSample {
        GpuSample {
            ts_ns,
            gpu,
            busy_pct,
            period_ns,
        }
    }

    #[test]
    fn busy_is_time_weighted_per_gpu_and_absent_is_not_measured() {
        let none = busy(None, None);
        assert!(!none.measured);
        assert!(none.gpus.is_empty());
        let samples = vec![
            s(100, 0, 100.0, 100),
            s(400, 0, 0.0, 300),
            s(200, 1, 50.0, 200),
        ];
        let a = busy(Some(&samples), None);
        assert!(a.measured);
        assert_eq!(a.gpus.len(), 2);
        assert_eq!(a.gpus[0].gpu, 0);
        assert!((a.gpus[0].busy_pct - 25.0).abs() < 1e-9, "{:?}", a.gpus[0]);
        assert_eq!(a.gpus[0].covered_ns, 400);
        assert_eq!((a.gpus[0].min_pct, a.gpus[0].max_pct), (0.0, 100.0));
        assert!((a.gpus[1].busy_pct - 50.0).abs() < 1e-9);
        let w = busy(Some(&samples), Some((150, 1000)));
        assert_eq!(w.gpus[0].samples, 1);
        assert_eq!(w.gpus[0].busy_pct, 0.0);
        // A sample ending at the window's start is before it; one ending at
        // its end is inside.
        let w = busy(Some(&samples), Some((100, 400)));
        assert_eq!((w.gpus[0].samples, w.gpus[0].busy_pct), (1, 0.0));
        assert_eq!(w.gpus[1].samples, 1);
    }
}
