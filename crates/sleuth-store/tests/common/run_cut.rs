//! An example trace cut at a quiet moment into two files of a run, for
//! the tests that compare a run's answers with the whole trace's
//! (`run_explain.rs`, `run_report.rs`).

use super::{example, rewrite, TempDir};
use sleuth_core::TraceData;
use sleuth_store::Trace;

/// A moment near the middle of `data` that no call and no preemption spans
/// (calls `[ts, end)`, waits `[off, on)`), so both files see whole calls
/// with all their culprits (blocked waits feed the thread windows, which a
/// boundary cuts anyway).
pub fn quiet_moment(data: &TraceData) -> u64 {
    let mut spans: Vec<(u64, u64)> = data
        .calls
        .iter()
        .map(|c| (c.ts_ns, c.end_ns()))
        .chain(
            data.waits
                .iter()
                .filter(|w| w.kind == sleuth_core::WaitKind::Preempted)
                .map(|w| (w.off_ns, w.on_ns)),
        )
        .collect();
    spans.sort_unstable();
    let (first, last) = (spans[0].0, spans.iter().map(|s| s.1).max().unwrap());
    let mid = first + (last - first) / 2;
    let mut gaps = Vec::new();
    let mut reach = spans[0].1;
    for &(s, e) in &spans[1..] {
        if s > reach {
            gaps.push(reach + (s - reach) / 2);
        }
        reach = reach.max(e);
    }
    gaps.into_iter()
        .min_by_key(|g| g.abs_diff(mid))
        .expect("a quiet moment")
}

/// `data` cut at `at`: what starts before it, and the rest. Processes are
/// in both (each file of a run lists the known processes); counters and
/// kernel counts in the first (a run's files add up to the session's).
pub fn halves(data: &TraceData, at: u64) -> (TraceData, TraceData) {
    let part = |early: bool| TraceData {
        calls: data
            .calls
            .iter()
            .filter(|c| (c.ts_ns < at) == early)
            .cloned()
            .collect(),
        waits: data
            .waits
            .iter()
            .filter(|w| (w.off_ns < at) == early)
            .cloned()
            .collect(),
        processes: data.processes.clone(),
        counts: if early {
            data.counts.clone()
        } else {
            Vec::new()
        },
        stats: if early {
            data.stats.clone()
        } else {
            Default::default()
        },
        has_host_context: data.has_host_context,
        ..Default::default()
    };
    (part(true), part(false))
}

/// An example trace written whole (`whole.db`) and as a run of two files
/// cut at a quiet moment (`run/`), in `dir`.
pub struct Cut {
    pub dir: TempDir,
    pub data: TraceData,
    pub whole: Trace,
    pub run: std::path::PathBuf,
    pub at: u64,
    pub early: TraceData,
    pub late: TraceData,
}

pub fn cut_in_two(name: &str, tag: &str) -> Cut {
    let data = Trace::open(&example(name)).unwrap().load(None).unwrap();
    let dir = TempDir::new(tag);
    let whole = dir.join("whole.db");
    rewrite(&data, &whole);
    let run = dir.join("run");
    std::fs::create_dir(&run).unwrap();
    let at = quiet_moment(&data);
    let (early, late) = halves(&data, at);
    assert!(!early.calls.is_empty() && !late.calls.is_empty());
    rewrite(&early, &run.join(sleuth_store::run::part_name(1)));
    rewrite(&late, &run.join(sleuth_store::run::part_name(2)));
    Cut {
        dir,
        data,
        whole: Trace::open(&whole).unwrap(),
        run,
        at,
        early,
        late,
    }
}
