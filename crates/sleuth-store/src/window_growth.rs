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
//! process's ledger is replayed to the window's start and to its end (the
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
/// `filter` of `trace`) whose process's live device bytes did not rise
/// over the window by [`RISE_SHARE`] of their growing bytes; those that
/// stand get the rise in their evidence. Nothing for a scope without a
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
    settle_with(e, (Some(run.since), None), |pid, at| {
        let lean = match at {
            Some(t) => run_explain::load_memory_at(
                &run.dir,
                Some(pid),
                run_explain::Moment::At(t),
                run.budget.clone(),
                memo,
            ),
            None => run_explain::load_memory(&run.dir, Some(pid), run.budget.clone(), memo),
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
        let start = match since {
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
        ev["live_bytes_at_window_start"] = start.into();
        ev["live_bytes_at_window_end"] = end.into();
        i += 1;
    }
    Ok(())
}
