//! A window's `memory_growth` checked against the process's live device
//! bytes over the window.
//!
//! A window's memory findings replay its memory calls from an empty
//! ledger (docs/findings.md), so a buffer it allocates and frees only after
//! it ends is "never freed" there, and the frees of buffers allocated
//! before it match nothing: a program that keeps six 1-MiB buffers in
//! rotation, each freed 300 ms after it is made, read `memory_growth`
//! ("6 allocation(s), 6.0 MiB over 0.5 s ... never freed") in a 500-ms
//! window while its live bytes stayed at 6 MiB (round 60's tester). Growth
//! is live memory that rises: where the window holds such a finding, the
//! process's ledger is replayed to just before the first allocation it
//! calls growing and to the window's end (the
//! stored one where the window runs to the trace's end; a run's as
//! `memory --db DIR --at` replays it), and the finding stands only where
//! the live bytes rose by at least half the bytes it calls growing. Paid
//! only for a window that holds one (rare); exact.

use crate::run_explain;
use crate::run_window::RunLast;
use crate::stream::MemoryTrace;
use crate::{CallFilter, CheckMemo, StoreError, Trace};
use sleuth_core::findings::{Explanation, Kind};
use sleuth_core::ledger::ProcessLedger;

/// Share of the bytes a finding calls growing by which live memory must
/// have risen over the window for it to stand.
const RISE_SHARE: f64 = 0.5;

/// Drops the `memory_growth` findings of `e` (the explanation of window
/// `filter` of `trace`) whose process's live device bytes did not rise,
/// from just before the first allocation they call growing to the
/// window's end, by [`RISE_SHARE`] of their growing bytes; those that
/// stand get both in their evidence. Nothing for a scope without a
/// window.
pub(crate) fn settle(
    trace: &Trace,
    filter: &CallFilter,
    e: &mut Explanation,
) -> Result<(), StoreError> {
    if filter.since_ns.is_none() && filter.until_ns.is_none() {
        return Ok(());
    }
    settle_with(e, (filter.since_ns, filter.until_ns), |pid, at| {
        let mt = MemoryTrace::open(trace, Some(pid), trace.budget().clone())?;
        Ok(live_of(&mt.ledgers(at)?, pid))
    })
}

/// [`settle`] for a window over a run's files, from `since` to the run's
/// end: the run's ledger then, as `memory --db DIR [--at]` replays it.
/// Where the run cannot say (the moment before its oldest finished file),
/// the finding stands as the window's replay made it.
pub(crate) fn settle_run(
    run: &RunLast,
    memo: &CheckMemo,
    e: &mut Explanation,
) -> Result<(), StoreError> {
    settle_over_run(&run.dir, run.since, &run.budget, memo, e)
}

/// [`settle_run`] for `--last` of a run read from its newest file alone
/// (the window lies in it): that file's replay does not know what the
/// earlier files made, so its frees of their buffers matched nothing and
/// six buffers in rotation read as growth (round 60's second tester); the
/// run's ledger does.
pub fn settle_over_run(
    dir: &std::path::Path,
    since: u64,
    budget: &crate::ReadBudget,
    memo: &CheckMemo,
    e: &mut Explanation,
) -> Result<(), StoreError> {
    settle_with(e, (Some(since), None), |pid, at| {
        let lean = match at {
            Some(t) => run_explain::load_memory_at(
                dir,
                Some(pid),
                run_explain::Moment::At(t),
                budget.clone(),
                memo,
            ),
            None => run_explain::load_memory(dir, Some(pid), budget.clone(), memo),
        };
        Ok(lean.ok().map(|l| live_of(&l.ledgers, pid).unwrap_or(0)))
    })
}

/// Process `pid`'s live device bytes in `ledgers` (None: not there).
fn live_of(ledgers: &[ProcessLedger], pid: u32) -> Option<u64> {
    ledgers.iter().find(|l| l.pid == pid).map(|l| l.live_bytes)
}

/// The rule of [`settle`], with `live_at(pid, moment)` the process's live
/// bytes at a moment (None: the end), or None where it cannot be known
/// (the finding then stands).
fn settle_with(
    e: &mut Explanation,
    (since, until): (Option<u64>, Option<u64>),
    mut live_at: impl FnMut(u32, Option<u64>) -> Result<Option<u64>, StoreError>,
) -> Result<(), StoreError> {
    let mut i = 0;
    while i < e.findings.len() {
        let f = &e.findings[i];
        let (Kind::MemoryGrowth, [pid]) = (f.kind, f.pids.as_slice()) else {
            i += 1;
            continue;
        };
        let pid = *pid;
        let growing = f.evidence["growing_bytes"].as_u64().unwrap_or(0);
        // From just before its first growing allocation: a window that
        // holds a program's start rose from nothing, its buffers in
        // rotation read as growth over it (three 1-MiB buffers: 0 to 3 MiB
        // in the first 200 ms, round 60).
        let first_growing = f.evidence["groups"]
            .as_array()
            .and_then(|g| g.iter().filter_map(|x| x["first_ts_ns"].as_u64()).min());
        let start = match first_growing.map(|t| t.saturating_sub(1)).or(since) {
            Some(t) => live_at(pid, Some(t))?,
            None => Some(0),
        };
        let end = live_at(pid, until)?;
        let (Some(start), Some(end)) = (start, end) else {
            i += 1;
            continue;
        };
        let rise = end.saturating_sub(start);
        if (rise as f64) < growing as f64 * RISE_SHARE {
            e.findings.remove(i);
            continue;
        }
        let ev = &mut e.findings[i].evidence;
        ev["live_bytes_before_growth"] = start.into();
        ev["live_bytes_at_window_end"] = end.into();
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::findings::{Finding, Severity};

    fn growth(first_ts: u64, growing: u64) -> Explanation {
        Explanation {
            findings: vec![Finding {
                kind: Kind::MemoryGrowth,
                severity: Severity::Low,
                op: "cudaMalloc".into(),
                pids: vec![7],
                summary: String::new(),
                evidence: serde_json::json!({
                    "growing_bytes": growing,
                    "groups": [{"first_ts_ns": first_ts + 50}, {"first_ts_ns": first_ts}],
                }),
                culprits: Vec::new(),
                recommendation: String::new(),
                impact_ns: growing,
                wall_share: None,
            }],
            summary: None,
            threads: Vec::new(),
            notes: Vec::new(),
            events_lost: 0,
        }
    }

    /// The rise is measured from just before the first growing allocation
    /// (not the window's start, where a program's start rose from nothing)
    /// to the window's end; under half the growing bytes, no finding.
    #[test]
    fn growth_stands_on_the_rise_from_its_first_allocation() {
        let mib = 1u64 << 20;
        let mut asked = Vec::new();
        // Three buffers in rotation after a start in the window: 2 MiB live
        // before the first re-allocation, 3 MiB at the end.
        let mut e = growth(1_000, 3 * mib);
        settle_with(&mut e, (Some(10), None), |_, at| {
            asked.push(at);
            Ok(Some(if at.is_some() { 2 * mib } else { 3 * mib }))
        })
        .unwrap();
        assert!(e.findings.is_empty());
        assert_eq!(asked, vec![Some(999), None]);
        // A leak: from 1 MiB to 4 MiB.
        let mut e = growth(1_000, 3 * mib);
        settle_with(&mut e, (Some(10), None), |_, at| {
            Ok(Some(if at.is_some() { mib } else { 4 * mib }))
        })
        .unwrap();
        assert_eq!(e.findings.len(), 1);
        assert_eq!(e.findings[0].evidence["live_bytes_before_growth"], mib);
        assert_eq!(e.findings[0].evidence["live_bytes_at_window_end"], 4 * mib);
        // Not known (a run that cannot say): it stands as the window made it.
        let mut e = growth(1_000, 3 * mib);
        settle_with(&mut e, (Some(10), None), |_, _| Ok(None)).unwrap();
        assert_eq!(e.findings.len(), 1);
    }
}
