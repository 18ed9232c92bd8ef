//! The calls of a time window with their culprits (issue 16), for the
//! answers about a window (MCP `latency_stats` with `since_ns`/`until_ns`)
//! without loading the process or the trace: the calls are found through
//! the `(tid, ts_ns)` index (`Trace::calls_filtered`), their culprits read
//! from `call_culprits` by row id. Memory grows with the window, not with
//! the trace. A finished trace only (`meta.rollups = 1`): its
//! `call_culprits` were filled from the waits when it ended, as
//! `sleuth_core::culprits::call_culprits` gives them for the loaded trace.

use crate::problems::MAX_NS;
use crate::reader::Trace;
use crate::types::CallFilter;
use crate::StoreError;
use sleuth_core::findings::{self, Explanation};
use sleuth_core::stats::{self, StatsReport};
use sleuth_core::{CallEvent, Culprit, OpCount, TraceData};
use std::collections::{HashMap, HashSet};

/// The calls of a window in load order (start, then row id) and the
/// culprits of each (aligned with `calls`; largest first).
pub struct WindowCalls {
    pub calls: Vec<CallEvent>,
    pub culprits: Vec<Vec<Culprit>>,
}

/// The calls starting in `[since_ns, until_ns)` (either bound may be
/// absent) of process `pid` (or all) and op `op` (or all), with their
/// culprits; None for a trace that did not finish (no stored culprits:
/// load the calls and waits instead). A pid the trace does not hold is
/// the full load's error.
pub fn calls_in_window(
    trace: &Trace,
    pid: Option<u32>,
    op: Option<&str>,
    since_ns: Option<u64>,
    until_ns: Option<u64>,
) -> Result<Option<WindowCalls>, StoreError> {
    if let Some(pid) = pid {
        trace.require_pid(pid)?;
    }
    if !trace.has_rollups()? {
        return Ok(None);
    }
    let stored = trace.calls_filtered(&CallFilter {
        pid,
        op: op.map(str::to_string),
        since_ns,
        until_ns,
        ..Default::default()
    })?;
    let ids: Vec<i64> = stored.iter().map(|s| s.id).collect();
    let mut by_id = culprits_of(trace, &ids)?;
    let culprits = ids
        .iter()
        .map(|id| by_id.remove(id).unwrap_or_default())
        .collect();
    Ok(Some(WindowCalls {
        calls: stored.into_iter().map(|s| s.call).collect(),
        culprits,
    }))
}

/// The culprits of `ids` (largest first, as `Trace::call_culprits_of`
/// orders them), read as one range of the `call_culprits(call_id)` index:
/// the calls of a window have neighbouring row ids, and one range read
/// costs less than a lookup per call (a window can hold 10^5 calls).
fn culprits_of(trace: &Trace, ids: &[i64]) -> Result<HashMap<i64, Vec<Culprit>>, StoreError> {
    let (Some(&lo), Some(&hi)) = (ids.iter().min(), ids.iter().max()) else {
        return Ok(HashMap::new());
    };
    let wanted: HashSet<i64> = ids.iter().copied().collect();
    let conn = trace.bulk()?;
    let err = |e| StoreError::file(trace.path(), format!("call culprits: {e}"));
    let mut st = conn
        .prepare(
            "SELECT call_id, pid, tid, substr(comm, 1, 64), runnable_ns FROM call_culprits
             WHERE call_id BETWEEN ?1 AND ?2 AND runnable_ns BETWEEN 0 AND ?3
             ORDER BY call_id, runnable_ns DESC, pid, tid",
        )
        .map_err(err)?;
    let mut rows = st.query([lo, hi, MAX_NS]).map_err(err)?;
    let mut out: HashMap<i64, Vec<Culprit>> = HashMap::new();
    while let Some(r) = rows.next().map_err(err)? {
        let id: i64 = r.get(0).map_err(err)?;
        if !wanted.contains(&id) {
            continue;
        }
        out.entry(id).or_default().push(Culprit {
            pid: r.get(1).map_err(err)?,
            tid: r.get(2).map_err(err)?,
            comm: r.get(3).map_err(err)?,
            ns: r.get::<_, i64>(4).map_err(err)?.max(0) as u64,
        });
    }
    Ok(out)
}

/// Calls counted in the kernel (launches under `trace --launches driver`
/// or `all`, the default) carry no time: a window cannot say how many fell
/// inside it, and the whole trace's count would make a short window look
/// launch-bound. A window's answer leaves them out (this empties
/// `counts`) and says so with [`counted_note`]; returns how many calls
/// that was.
pub fn leave_out_counted(counts: &mut Vec<OpCount>) -> u64 {
    let n = counts.iter().fold(0u64, |n, c| n.saturating_add(c.count));
    counts.clear();
    n
}

/// The note of a window's answer that left `n` kernel-counted calls out.
pub fn counted_note(n: u64) -> Option<String> {
    (n > 0).then(|| {
        format!(
            "{n} call(s) of the whole trace were counted in the kernel without times (launches under \
             `trace --launches driver` or `all`): a window cannot place them, so this answer leaves \
             them out (no launch count or launch-rate verdict for the window; `--launches full` \
             records each launch's time)"
        )
    })
}

/// Per-op statistics of the calls of process `pid` (or all) and op `op`
/// (or all) that start in `[since_ns, until_ns)`, as `stats::op_stats`
/// gives them for those calls loaded, from the window's calls and their
/// stored culprits: memory grows with the window, not with the trace.
/// Without the per-thread splits (they would read every wait). Also the
/// kernel-counted calls left out ([`leave_out_counted`]). None for a
/// trace that did not finish (no stored culprits): then
/// [`stats_from_loaded`] over the loaded window.
pub fn stats_report(
    trace: &Trace,
    pid: Option<u32>,
    op: Option<&str>,
    since_ns: Option<u64>,
    until_ns: Option<u64>,
) -> Result<Option<(StatsReport, u64)>, StoreError> {
    let Some(w) = calls_in_window(trace, pid, op, since_ns, until_ns)? else {
        return Ok(None);
    };
    let mut counts = trace.op_counts(pid)?;
    crate::scoped::keep_counts_of_op(&mut counts, op);
    let left_out = leave_out_counted(&mut counts);
    let data = TraceData {
        calls: w.calls,
        stats: trace.stats()?,
        has_host_context: trace.has_host_context(),
        ..Default::default()
    };
    let mut report = stats::op_stats(&data, &w.culprits);
    report.threads.clear();
    Ok(Some((report, left_out)))
}

/// [`stats_report`]'s answer for a window's calls loaded with their
/// processes' waits (`Trace::load_calls_of`, counts already kept to the
/// scope's op), for a trace that did not finish: the same rows, the same
/// counted calls left out.
pub fn stats_from_loaded(mut data: TraceData) -> (StatsReport, u64) {
    let left_out = leave_out_counted(&mut data.counts);
    let mut report = stats::compute(&data);
    report.threads.clear();
    (report, left_out)
}

/// The explanation of a window's calls loaded with their processes' waits
/// (`Trace::load_calls_of`), for a file without stored call groups: the
/// kernel-counted calls left out and noted, as `scoped::explanation`
/// leaves them out of a window streamed.
pub fn explain_loaded(mut data: TraceData) -> Explanation {
    let left_out = leave_out_counted(&mut data.counts);
    let mut e = findings::explain_report(&data);
    e.notes.extend(counted_note(left_out));
    e
}
