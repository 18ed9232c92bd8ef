//! The report's GPU activity timeline: NVML busy samples per GPU as bars on
//! the trace's time axis, and per process the memory the driver said it held
//! before the trace began beside the ledger.

use super::svg::{esc, time_scale, value_scale, Band, Svg};
use super::WIDTH;
use crate::output::fmt_ns;
use crate::render::gpu_context;
use sleuth_core::gpu_activity;
use sleuth_core::ledger::ProcessLedger;
use sleuth_core::TraceData;
use std::collections::BTreeMap;
use std::fmt::Write as _;

const BUSY: &str = "#59a14f";

/// The section's HTML: a chart per GPU, or a line saying it was not measured.
pub fn section(
    data: &TraceData,
    ledgers: &[ProcessLedger],
    origin: u64,
    end: u64,
    band: Option<Band>,
) -> String {
    let mut h = String::new();
    let activity = gpu_activity::of_trace(data);
    for line in gpu_context::busy_lines(&activity) {
        let _ = write!(h, "<p>{}</p>", esc(&line));
    }
    // A window's own busy time, as `explain --from/--to` gives it.
    if let (Some(b), true) = (band, activity.measured) {
        let window = gpu_activity::busy(data.gpu_samples.as_deref(), Some((b.since, b.until)));
        for line in gpu_context::busy_lines(&window) {
            let _ = write!(h, "<p>In the window: {}</p>", esc(&line));
        }
    }
    if let Some(samples) = &data.gpu_samples {
        let mut by_gpu: BTreeMap<u32, Vec<&sleuth_core::GpuSample>> = BTreeMap::new();
        for s in samples {
            by_gpu.entry(s.gpu).or_default().push(s);
        }
        for (gpu, list) in by_gpu {
            h.push_str(&chart(gpu, &list, origin, end, band));
        }
    }
    let helds = sleuth_core::held::held(data, ledgers);
    for line in gpu_context::held_lines(data, &helds) {
        let _ = write!(h, "<p>{}</p>", esc(&line));
    }
    h
}

fn chart(
    gpu: u32,
    samples: &[&sleuth_core::GpuSample],
    origin: u64,
    end: u64,
    band: Option<Band>,
) -> String {
    let (left, right, top, bottom, height) = (80.0, 20.0, 30.0, 30.0, 160.0);
    let (x, span_s) = time_scale(origin, end, left, right);
    let y = value_scale(100.0, height - bottom, top);
    let t = |ns: u64| x.at(ns.saturating_sub(origin) as f64 / 1e9);
    let mut s = Svg::new(WIDTH, height, &format!("GPU {gpu} busy over time"));
    s.text(
        left,
        16.0,
        &format!("GPU {gpu} busy (NVML device utilization, % of each sample period)"),
        "start",
        "t",
    );
    s.band(band, &x, origin, top, height - bottom);
    for v in [0.0, 50.0, 100.0] {
        let yy = y.at(v);
        s.line(left, yy, WIDTH - right, yy, "#eee", "");
        s.text(left - 6.0, yy + 4.0, &format!("{v:.0}%"), "end", "");
    }
    s.time_axis(&x, span_s, height - bottom);
    for g in samples {
        let x1 = t(g.ts_ns).min(WIDTH - right);
        let x0 = t(g.ts_ns.saturating_sub(g.period_ns)).max(left);
        let (y0, y1) = (y.at(g.busy_pct), y.at(0.0));
        if x1 > x0 {
            s.rect(
                x0,
                y0,
                x1 - x0,
                (y1 - y0).max(0.0),
                BUSY,
                Some(&format!(
                    "+{}: {:.0}% busy",
                    fmt_ns(g.ts_ns.saturating_sub(origin)),
                    g.busy_pct
                )),
            );
        }
    }
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::GpuSample;

    /// Ten 100 ms NVML samples: 20% busy for the first half second, 80%
    /// after (sample ends at 0.1 s ... 1.0 s).
    fn two_phases() -> TraceData {
        TraceData {
            gpu_samples: Some(
                (1..=10u64)
                    .map(|k| GpuSample {
                        ts_ns: k * 100_000_000,
                        gpu: 0,
                        busy_pct: if k <= 5 { 20.0 } else { 80.0 },
                        period_ns: 100_000_000,
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_window_adds_its_own_busy_line_and_is_shaded() {
        let data = two_phases();
        let whole = section(&data, &[], 0, 1_000_000_000, None);
        assert!(whole.contains("GPU 0 busy 50%"), "{whole}");
        assert!(!whole.contains("In the window"));
        assert!(!whole.contains("the report&#39;s window"));
        let band = Band {
            since: 500_000_000,
            until: 1_000_000_000,
        };
        let windowed = section(&data, &[], 0, 1_000_000_000, Some(band));
        assert!(windowed.contains("<p>GPU 0 busy 50%"), "{windowed}");
        assert!(
            windowed.contains("<p>In the window: GPU 0 busy 80%"),
            "{windowed}"
        );
        assert_eq!(
            windowed
                .matches("<title>the report&#39;s window</title>")
                .count(),
            1
        );
    }

    #[test]
    fn without_samples_no_window_line() {
        let band = Band {
            since: 0,
            until: u64::MAX,
        };
        let h = section(&TraceData::default(), &[], 0, 1, Some(band));
        assert!(
            h.contains("not measured") && !h.contains("In the window"),
            "{h}"
        );
    }
}
