//! The answers about a time window of a finished trace (issue 16): MCP
//! `latency_stats` with `since_ns`/`until_ns`, `stats --from/--to`, and
//! the rule every window follows for the calls counted in the kernel.
//! The window's calls are streamed through the `(tid, ts_ns)` index into
//! per-op rollups (the writer's histogram: percentiles within
//! `rollup::MAX_RELATIVE_ERROR`, counts, sums and maxima exact); their
//! culprits are summed from `call_culprits` in one pass over the window's
//! id range. Memory holds the rollups, not the calls: a 10-second window
//! of a 10M-call trace held its 2M calls (457 MB) before. A finished trace
//! only (`meta.rollups = 1`): its `call_culprits` were filled from the
//! waits when it ended, as `sleuth_core::culprits::call_culprits` gives
//! them for the loaded trace.

use crate::problems::{valid_call, MAX_NS};
use crate::reader::Trace;
use crate::stream::{CallQuery, Rows, StreamOrder};
use crate::types::CallFilter;
use crate::StoreError;
use rusqlite::types::Value;
use sleuth_core::counted::{self, WindowCount};
use sleuth_core::decompose::CulpritTime;
use sleuth_core::findings::{self, Explanation};
use sleuth_core::rollup::{self, OpRollup, StoredRollups};
use sleuth_core::stats::{self, StatsReport};
use sleuth_core::threads::is_tracer;
use sleuth_core::{op_by_name, CallEvent, OpCount, TraceData, WaitEvent};
use std::collections::{BTreeMap, HashMap};

/// Rollups by (pid, op id).
pub(crate) type OpRollups = HashMap<(u32, u16), OpRollup>;

/// The per-(pid, op) rollups of the calls `q` selects (a window's), and
/// the lowest and highest row id among them.
fn window_rollups(
    trace: &Trace,
    q: &CallQuery,
) -> Result<(OpRollups, Option<(i64, i64)>), StoreError> {
    let mut ops = OpRollups::new();
    let mut ids: Option<(i64, i64)> = None;
    // The rollups do not depend on the order: the rows by id, which keeps
    // to the writer's blocks that hold the window, in chunks read side by
    // side on helper connections (`split_read`; round 43).
    let by_id = CallQuery {
        order: StreamOrder::ById,
        ..q.clone()
    };
    crate::split_read::for_each_call::<StoreError>(&Rows::open(trace)?, &by_id, |s| {
        ops.entry((s.call.pid, s.call.op)).or_default().add(&s.call);
        ids = Some(ids.map_or((s.id, s.id), |(lo, hi)| (lo.min(s.id), hi.max(s.id))));
        Ok(())
    })?;
    Ok((ops, ids))
}

/// The culprits of the window's calls summed per (call pid, op, culprit
/// pid, comm): `call_culprits` read over the window's id range (its index)
/// and joined to the calls by row id, under the window's conditions and
/// the readers' validity bounds. Sums saturate.
fn window_culprits(
    trace: &Trace,
    q: &CallQuery,
    (lo, hi): (i64, i64),
) -> Result<Vec<(u32, u16, CulpritTime)>, StoreError> {
    let conn = trace.bulk()?;
    let err = |e| StoreError::file(trace.path(), format!("call culprits: {e}"));
    let mut args = vec![
        Value::Integer(lo),
        Value::Integer(hi),
        Value::Integer(MAX_NS),
    ];
    let mut conds = vec![
        "cc.call_id BETWEEN ?1 AND ?2".to_string(),
        "cc.runnable_ns BETWEEN 0 AND ?3".to_string(),
        valid_call("c."),
    ];
    let mut bound = |cond: &str, v: Value| {
        args.push(v);
        conds.push(format!("{cond} ?{}", args.len()));
    };
    if let Some(p) = q.pid {
        bound("c.pid =", Value::Integer(p.into()));
    }
    if let Some(op) = q.ops.as_ref().and_then(|o| o.first()) {
        bound("c.op =", Value::Text((*op).to_string()));
    }
    if let Some(t) = q.since_ns {
        bound(
            "c.ts_ns >=",
            Value::Integer(i64::try_from(t).unwrap_or(i64::MAX)),
        );
    }
    if let Some(t) = q.until_ns {
        bound(
            "c.ts_ns <",
            Value::Integer(i64::try_from(t).unwrap_or(i64::MAX)),
        );
    }
    let sql = format!(
        "SELECT c.pid, c.op, cc.pid, substr(cc.comm, 1, 64), cc.runnable_ns
         FROM call_culprits cc JOIN calls c ON c.id = cc.call_id WHERE {}",
        conds.join(" AND ")
    );
    let mut st = conn.prepare(&sql).map_err(err)?;
    let mut rows = st
        .query(rusqlite::params_from_iter(args.iter()))
        .map_err(err)?;
    let mut sums: HashMap<(u32, u16, u32, String), u64> = HashMap::new();
    // Files written before round 51 stored the tracer's threads as culprits.
    let tracer = trace.tracer_pid();
    while let Some(r) = rows.next().map_err(err)? {
        // Calls of an op this build does not know are not in the rollups either.
        let Some(op) = op_by_name(
            r.get_ref(1)
                .map_err(err)?
                .as_str()
                .map_err(|e| err(e.into()))?,
        ) else {
            continue;
        };
        let key: (u32, u16, u32, String) = (
            r.get(0).map_err(err)?,
            op.id,
            r.get(2).map_err(err)?,
            r.get(3).map_err(err)?,
        );
        if is_tracer(key.2, &key.3, tracer) {
            continue;
        }
        let ns = r.get::<_, i64>(4).map_err(err)?.max(0) as u64;
        let e = sums.entry(key).or_default();
        *e = e.saturating_add(ns);
    }
    Ok(sums
        .into_iter()
        .map(|((pid, op, cpid, comm), runnable_ns)| {
            (
                pid,
                op,
                CulpritTime {
                    pid: cpid,
                    comm,
                    runnable_ns,
                },
            )
        })
        .collect())
}

/// The kernel-counted calls of a window (launches under `trace --launches
/// driver` or `all`, the default): they have no record, so no time. The
/// tracer samples their running counts every 200 ms (`op_count_samples`):
/// a window is given those certainly counted inside it, those possibly
/// counted in it, and an estimate between (`sleuth_core::counted`). A
/// trace written before the samples cannot place them: they are left out
/// (the whole trace's count made a short window look launch-bound) and
/// the answer says so.
#[derive(Debug, Clone, Default)]
pub struct WindowCounts {
    /// Per (pid, op id), where the samples place the window's calls.
    pub placed: Vec<(u32, u16, WindowCount)>,
    /// Calls of the file that no sample places (an older trace).
    pub left_out: u64,
    /// The file is still being written: the calls counted after its
    /// latest sample are in no bound yet.
    pub open: bool,
    /// `placed` holds every counted call of a trace without samples, as
    /// the window holds the whole finished trace.
    pub unsampled_whole: bool,
}

impl WindowCounts {
    /// The calls of `counts` (the file's, kept to the scope's process and
    /// op) that `scope` (its pid, op and window) selects. A file still being
    /// written has no counts stored yet (they are stored when it ends): its
    /// samples alone place the calls counted so far.
    pub fn of(
        trace: &Trace,
        counts: &[OpCount],
        scope: &CallFilter,
    ) -> Result<WindowCounts, StoreError> {
        let session = trace.session()?;
        let open = session.end_mono_ns.is_none();
        if counts.is_empty() && !open {
            return Ok(WindowCounts::default());
        }
        let start = session.info.start_mono_ns;
        let Some(samples) = trace.count_samples(scope.pid)? else {
            // Without samples a window that holds the whole finished trace
            // still holds every counted call (`--from 0 --to 1000h` left
            // them out, round 50).
            let whole = session.end_mono_ns.is_some_and(|end| {
                scope.since_ns.is_none_or(|s| s <= start) && scope.until_ns.is_none_or(|u| u > end)
            });
            if whole {
                let all = |c: &OpCount| WindowCount {
                    at_least: c.count,
                    at_most: c.count,
                    estimate: c.count,
                };
                return Ok(WindowCounts {
                    placed: counts.iter().map(|c| (c.pid, c.op, all(c))).collect(),
                    left_out: 0,
                    open,
                    unsampled_whole: true,
                });
            }
            return Ok(WindowCounts {
                placed: Vec::new(),
                left_out: counts.iter().fold(0u64, |n, c| n.saturating_add(c.count)),
                open,
                unsampled_whole: false,
            });
        };
        let op = scope.op.as_deref();
        let mut by_key: BTreeMap<(u32, u16), Vec<(u64, u64)>> = BTreeMap::new();
        for s in samples {
            if crate::scoped::id_in_scope(op, s.op) {
                by_key
                    .entry((s.pid, s.op))
                    .or_default()
                    .push((s.ts_ns, s.count));
            }
        }
        // The stored totals, or (a file still being written) the sampled ops.
        let mut totals: Vec<(u32, u16, Option<u64>)> = counts
            .iter()
            .map(|c| (c.pid, c.op, Some(c.count)))
            .collect();
        if open {
            for &(pid, op) in by_key.keys() {
                if !totals.iter().any(|t| (t.0, t.1) == (pid, op)) {
                    totals.push((pid, op, None));
                }
            }
        }
        let since = scope.since_ns.unwrap_or(start);
        let until = scope.until_ns.unwrap_or(u64::MAX);
        // Where each process exited in the file: it launched nothing after.
        let exits = trace.exits_between(start, session.end_mono_ns.unwrap_or(u64::MAX))?;
        let placed = totals
            .into_iter()
            .map(|(pid, op, total)| {
                let mut points = by_key.remove(&(pid, op)).unwrap_or_default();
                // It ended at the stored total, by its process's exit.
                let exit = exits.get(&pid).copied();
                if let (Some(end), Some(total)) = (session.end_mono_ns, total) {
                    points.push((exit.map_or(end, |x| x.min(end)), total));
                }
                // A crafted file's samples in any order still give bounds.
                points.sort_unstable();
                // A read after the exit counted calls made before it (round
                // 59's third tester: a child's last 971 launches, read 198
                // ms after its exit, were counted in a later window).
                if let Some(x) = exit {
                    let mut before = start;
                    for p in &mut points {
                        if before < x && x < p.0 {
                            p.0 = x;
                        }
                        before = p.0;
                    }
                }
                // Each point counts the calls since the read before it, at
                // most a read interval before (reads come late under load:
                // half a period more), not since the file began (the third
                // tester: 4,953 launches of a process that started 335 ms
                // into the file were spread over a window before it).
                let first = points.first().map_or(start, |p| p.0);
                let slack = counted::SAMPLE_PERIOD_NS + counted::SAMPLE_PERIOD_NS / 2;
                points.insert(0, (first.saturating_sub(slack).max(start), 0));
                (pid, op, counted::in_window(&points, since, until))
            })
            .collect();
        Ok(WindowCounts {
            placed,
            left_out: 0,
            open,
            unsampled_whole: false,
        })
    }

    /// Adds a later file's counts (a window over several files of a run):
    /// the bounds of the same (pid, op) add up, as do the calls no sample
    /// places; the later file's being written is the window's.
    pub fn merge(&mut self, later: WindowCounts) {
        for (pid, op, w) in later.placed {
            match self
                .placed
                .iter_mut()
                .find(|(p, o, _)| (*p, *o) == (pid, op))
            {
                Some((_, _, mine)) => {
                    mine.at_least = mine.at_least.saturating_add(w.at_least);
                    mine.at_most = mine.at_most.saturating_add(w.at_most);
                    mine.estimate = mine.estimate.saturating_add(w.estimate);
                }
                None => self.placed.push((pid, op, w)),
            }
        }
        self.left_out = self.left_out.saturating_add(later.left_out);
        self.open |= later.open;
        self.unsampled_whole &= later.unsampled_whole;
    }

    /// The counts as `stats` rows show them: the estimates (zeros left out).
    pub fn estimates(&self) -> Vec<OpCount> {
        self.as_counts(|w| w.estimate)
    }

    /// The counts the verdicts judge a window on: only the calls certainly
    /// in it (a launch rate is never overstated, so a window is never
    /// called launch-bound on calls that may lie outside it).
    pub fn at_least(&self) -> Vec<OpCount> {
        self.as_counts(|w| w.at_least)
    }

    fn as_counts(&self, pick: impl Fn(&WindowCount) -> u64) -> Vec<OpCount> {
        self.placed
            .iter()
            .map(|(pid, op, w)| OpCount {
                pid: *pid,
                op: *op,
                count: pick(w),
            })
            .filter(|c| c.count > 0)
            .collect()
    }

    /// What the answer says about them: `used` names the figure it
    /// counted ([`STATS_COUNT`] or [`FINDINGS_COUNT`]).
    pub fn notes(&self, used: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.unsampled_whole {
            let n = self
                .placed
                .iter()
                .fold(0u64, |n, (_, _, w)| n.saturating_add(w.at_least));
            out.push(format!(
                "Calls counted in the kernel (launches under `trace --launches driver` or `all`) have \
                 no time and this trace holds no samples of their counts, but the window holds the whole \
                 trace: all {n} of them are in it, and this answer counts them"
            ));
        } else if !self.placed.is_empty() {
            let sum = |f: fn(&WindowCount) -> u64| {
                self.placed
                    .iter()
                    .fold(0u64, |n, (_, _, w)| n.saturating_add(f(w)))
            };
            out.push(format!(
                "Calls counted in the kernel (launches under `trace --launches driver` or `all`) have \
                 no time: by the tracer's samples of their counts (every 200 ms), {} to {} of them fell \
                 in this window, about {} at a steady rate between samples; this answer counts {used}{}",
                sum(|w| w.at_least),
                sum(|w| w.at_most),
                sum(|w| w.estimate),
                match self.open {
                    true => " (the file has no end yet, being written or its writer killed: those counted since its latest sample are in no bound)",
                    false => "",
                },
            ));
        }
        if self.left_out > 0 {
            out.push(format!(
                "{} call(s) of the whole trace were counted in the kernel without times (launches under \
                 `trace --launches driver` or `all`) and this trace holds no samples of their counts: a \
                 window cannot place them, so this answer leaves them out (no launch count or launch-rate \
                 verdict for the window)",
                self.left_out
            ));
        }
        out
    }

    /// Each op's bounds, for a JSON answer.
    pub fn json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.placed
                .iter()
                .map(|(pid, op, w)| {
                    serde_json::json!({
                        "pid": pid,
                        "op": sleuth_core::op_by_id(*op).map(|o| o.name),
                        "at_least": w.at_least,
                        "estimate": w.estimate,
                        "at_most": w.at_most,
                    })
                })
                .collect(),
        )
    }
}

/// What a window's statistics say about the kernel-counted calls.
pub const STATS_COUNT: &str = "the estimate in its COUNT column";
/// What a window's findings say about them.
pub const FINDINGS_COUNT: &str =
    "only those certainly in the window (the launch-rate verdict never overstates the launches)";

/// Per-op statistics of the calls `scope` selects (its process, op and
/// window), as the whole trace's `stats` gives them from its rollups
/// (percentiles within the histogram's bound), streamed: memory grows with
/// the ops, not the window. Without
/// the per-thread splits (they would read every wait). The kernel-counted
/// calls are placed by their samples ([`WindowCounts`]; rows show the
/// estimate). None for a trace that did not finish (no stored culprits):
/// then [`stats_from_loaded`] over the loaded window.
pub fn stats_report(
    trace: &Trace,
    scope: &CallFilter,
) -> Result<Option<(StatsReport, WindowCounts)>, StoreError> {
    let Some(parts) = stored_parts(trace, scope)? else {
        return Ok(None);
    };
    Ok(Some(parts.report(scope.pid)))
}

/// What one file gives a window's statistics before they are computed:
/// its per-op rollups and culprit sums, the kernel-counted calls placed,
/// its counters. A window over several files of a run adds them up
/// ([`StatsParts::merge`]); one file's is [`StatsParts::report`]ed.
#[derive(Debug, Default)]
pub struct StatsParts {
    pub rollups: StoredRollups,
    pub counts: WindowCounts,
    /// The file's counters (the whole file's: a window does not split them).
    pub stats: BTreeMap<String, u64>,
    pub has_host_context: bool,
}

impl StatsParts {
    /// Adds a later file's parts (`trace --rotate`): rollups and counts add
    /// up, counters as a run's `stats` adds them.
    pub fn merge(&mut self, later: StatsParts) {
        self.rollups.merge(later.rollups);
        self.counts.merge(later.counts);
        rollup::merge_counters(&mut self.stats, &later.stats);
        self.has_host_context &= later.has_host_context;
    }

    /// The statistics (of process `pid` or all) and the counted calls'
    /// bounds; rows show the estimate.
    pub fn report(self, pid: Option<u32>) -> (StatsReport, WindowCounts) {
        let base = TraceData {
            counts: self.counts.estimates(),
            stats: self.stats,
            has_host_context: self.has_host_context,
            ..Default::default()
        };
        (rollup::stats_report(&self.rollups, pid, &base), self.counts)
    }
}

/// [`stats_report`]'s parts of a finished file (None otherwise): the
/// window's calls streamed into rollups, their stored culprits summed.
pub fn stored_parts(trace: &Trace, scope: &CallFilter) -> Result<Option<StatsParts>, StoreError> {
    if let Some(pid) = scope.pid {
        trace.require_pid(pid)?;
    }
    if !trace.has_rollups()? {
        return Ok(None);
    }
    let (mut ops, mut culprits) = (HashMap::new(), Vec::new());
    if let Some(q) = window_query(scope) {
        let ids;
        (ops, ids) = window_rollups(trace, &q)?;
        if let Some(range) = ids {
            culprits = window_culprits(trace, &q, range)?;
        }
    }
    parts_of(trace, scope, ops, culprits).map(Some)
}

/// The read of the calls `scope` selects (its process, op and window), in
/// the order they are found; None for an op this build does not know (no
/// call of it is read).
fn window_query(scope: &CallFilter) -> Option<CallQuery> {
    let ops = match scope.op.as_deref() {
        Some(op) => Some(vec![op_by_name(op)?.name]),
        None => None,
    };
    Some(CallQuery {
        pid: scope.pid,
        ops,
        order: StreamOrder::AsFound,
        since_ns: scope.since_ns,
        until_ns: scope.until_ns,
        ..Default::default()
    })
}

/// A window's parts from its per-op rollups and culprit rows: the file's
/// kernel-counted calls of the scope's op placed, its counters.
fn parts_of(
    trace: &Trace,
    scope: &CallFilter,
    ops: OpRollups,
    culprits: Vec<(u32, u16, CulpritTime)>,
) -> Result<StatsParts, StoreError> {
    let mut counts = trace.op_counts(scope.pid)?;
    crate::scoped::keep_counts_of_op(&mut counts, scope.op.as_deref());
    Ok(StatsParts {
        rollups: StoredRollups {
            ops: ops.into_iter().map(|((p, o), r)| (p, o, r)).collect(),
            culprits,
            threads: Vec::new(),
        },
        counts: WindowCounts::of(trace, &counts, scope)?,
        stats: trace.stats()?,
        has_host_context: trace.has_host_context(),
    })
}

/// [`stored_parts`] of a finished file whose every call starts inside the
/// open-ended window `scope` (no op, no end; its call groups' first start
/// at or after the window's): the writer's rollups without the thread
/// splits, the same sums as the window's calls streamed, no call row read
/// (a run's files after the first one `--last` spans). None otherwise.
pub fn whole_file_parts(
    trace: &Trace,
    scope: &CallFilter,
) -> Result<Option<StatsParts>, StoreError> {
    if !wholly_inside(trace, scope)? {
        return Ok(None);
    }
    if let Some(pid) = scope.pid {
        trace.require_pid(pid)?;
    }
    let mut rollups = trace
        .stored_rollups(scope.pid)
        .map_err(|e| trace.read_error(e))?;
    rollups.threads.clear();
    let counts = trace.op_counts(scope.pid)?;
    Ok(Some(StatsParts {
        rollups,
        counts: WindowCounts::of(trace, &counts, scope)?,
        stats: trace.stats()?,
        has_host_context: trace.has_host_context(),
    }))
}

/// Whether every call of a finished file starts inside the open-ended
/// window `scope` (no op, no end): its stored call groups' first starts
/// are all at or after the window's. Then its part of the window is the
/// whole file, answered from what the writer stored.
pub(crate) fn wholly_inside(trace: &Trace, scope: &CallFilter) -> Result<bool, StoreError> {
    let (Some(since), None, None) = (scope.since_ns, scope.until_ns, scope.op.as_deref()) else {
        return Ok(false);
    };
    if !trace.has_rollups()? {
        return Ok(false);
    }
    let groups = crate::call_groups::stored(trace.keyed()).map_err(|e| trace.read_error(e))?;
    Ok(groups.is_some_and(|g| g.iter().all(|g| g.first_ts_ns >= since)))
}

/// The parts of a window of a file that did not finish (no stored
/// culprits: the one a run is still writing, or one whose writer was
/// killed): its window's calls loaded with their processes' waits, into
/// the same rollups, culprits computed from the waits as the writer
/// computes them when a file ends. The reference [`streamed_parts`] is
/// tested against (readers stream).
#[cfg(test)]
fn loaded_parts(trace: &Trace, scope: &CallFilter) -> Result<StatsParts, StoreError> {
    let mut data = trace.load_calls_of(scope)?;
    crate::scoped::keep_counts_of_op(&mut data.counts, scope.op.as_deref());
    let per_call = sleuth_core::culprits::call_culprits(
        &data.calls,
        &data.waits,
        sleuth_core::threads::tracer_pid(&data),
    );
    let mut ops = OpRollups::new();
    let mut sums: BTreeMap<(u32, u16, u32, String), u64> = BTreeMap::new();
    for (i, c) in data.calls.iter().enumerate() {
        ops.entry((c.pid, c.op)).or_default().add(c);
        for k in sleuth_core::decompose::culprits_of(&per_call, i) {
            let e = sums
                .entry((c.pid, c.op, k.pid, k.comm.clone()))
                .or_default();
            *e = e.saturating_add(k.ns);
        }
    }
    Ok(StatsParts {
        rollups: StoredRollups {
            ops: ops.into_iter().map(|((p, o), r)| (p, o, r)).collect(),
            culprits: culprit_rows(sums),
            threads: Vec::new(),
        },
        counts: WindowCounts::of(trace, &data.counts, scope)?,
        stats: trace.stats()?,
        has_host_context: trace.has_host_context(),
    })
}

/// [`loaded_parts`] without holding the window's calls: they are streamed
/// into the same rollups (row order: the rollups do not depend on it),
/// each call's culprits taken from its thread's waits that can name any
/// (runnable time and culprits: the only ones `culprits::call_culprits`
/// uses), held per thread and sorted as it sorts them. The same parts,
/// from memory that grows with those waits, not with the calls (the file
/// a run's tracer is still writing holds up to a whole rotation period).
pub fn streamed_parts(trace: &Trace, scope: &CallFilter) -> Result<StatsParts, StoreError> {
    let pid = scope.pid;
    if let Some(pid) = pid {
        trace.require_pid(pid)?;
    }
    let rows = Rows::open(trace)?;
    // A wait back on CPU by the window's start overlaps none of its calls.
    let held = culprit_waits(&rows, pid, scope.since_ns)?;
    let mut tally = CallTally::new(&held, trace.tracer_pid());
    if let Some(q) = window_query(scope) {
        rows.for_each_call::<StoreError>(&q, |s| {
            tally.add(&s.call);
            Ok(())
        })?;
    }
    let (ops, culprits) = tally.finish();
    parts_of(trace, scope, ops, culprits)
}

/// The waits of process `pid` (all without) back on CPU after `after_ns`
/// (all without) that can name culprits (`culprits::names_culprits`): what
/// a streamed read of calls holds to find their culprits ([`CallTally`]).
pub(crate) fn culprit_waits(
    rows: &Rows,
    pid: Option<u32>,
    after_ns: Option<u64>,
) -> Result<Vec<WaitEvent>, StoreError> {
    let mut held = Vec::new();
    rows.for_each_wait_after::<StoreError>(pid, after_ns, |w| {
        if sleuth_core::culprits::names_culprits(&w) {
            held.push(w);
        }
        Ok(())
    })?;
    Ok(held)
}

/// Calls streamed in any order into their ops' rollups and their culprit
/// sums, each call's culprits from its thread's waits that can name any
/// (held: [`culprit_waits`]), as `culprits::call_culprits` takes them from
/// a loaded trace.
pub(crate) struct CallTally<'w> {
    waits: HashMap<(u32, u32), Vec<&'w WaitEvent>>,
    ops: OpRollups,
    /// Runnable time per (process, op, culprit's process, culprit's name).
    sums: BTreeMap<(u32, u16, u32, String), u64>,
    /// The trace's tracer pid: never a culprit.
    tracer: Option<u32>,
}

impl<'w> CallTally<'w> {
    pub(crate) fn new(held: &'w [WaitEvent], tracer: Option<u32>) -> CallTally<'w> {
        CallTally {
            waits: sleuth_core::culprits::culprit_waits_by_thread(held),
            ops: OpRollups::new(),
            sums: BTreeMap::new(),
            tracer,
        }
    }

    /// One call, nested too.
    pub(crate) fn add(&mut self, c: &CallEvent) {
        self.ops.entry((c.pid, c.op)).or_default().add(c);
        if let Some(waits) = self.waits.get(&(c.pid, c.tid)) {
            for k in sleuth_core::culprits::culprits_of_call(c, waits, self.tracer) {
                let e = self.sums.entry((c.pid, c.op, k.pid, k.comm)).or_default();
                *e = e.saturating_add(k.ns);
            }
        }
    }

    /// The rollups by (process, op) and the culprit sums as rollup rows.
    pub(crate) fn finish(self) -> (OpRollups, Vec<(u32, u16, CulpritTime)>) {
        (self.ops, culprit_rows(self.sums))
    }
}

/// Culprit sums per (process, op, culprit process, name) as rollup rows.
fn culprit_rows(sums: BTreeMap<(u32, u16, u32, String), u64>) -> Vec<(u32, u16, CulpritTime)> {
    sums.into_iter()
        .map(|((pid, op, cpid, comm), runnable_ns)| {
            let who = CulpritTime {
                pid: cpid,
                comm,
                runnable_ns,
            };
            (pid, op, who)
        })
        .collect()
}

/// The statistics of the calls `scope` selects in a window: from the
/// stored culprits ([`stats_report`]), or for a trace that did not finish
/// from its window's calls loaded ([`stats_from_loaded`]).
pub fn stats_of(
    trace: &Trace,
    scope: &CallFilter,
) -> Result<(StatsReport, WindowCounts), StoreError> {
    if let Some(r) = stats_report(trace, scope)? {
        return Ok(r);
    }
    // A large file that did not finish: streamed, not loaded.
    if crate::scoped::more_rows_than(trace, crate::scoped::STREAMED_ABOVE_ROWS)? {
        return Ok(streamed_parts(trace, scope)?.report(scope.pid));
    }
    let mut data = trace.load_calls_of(scope)?;
    crate::scoped::keep_counts_of_op(&mut data.counts, scope.op.as_deref());
    stats_from_loaded(trace, data, scope)
}

/// [`stats_report`]'s answer for a window's calls loaded with their
/// processes' waits (`Trace::load_calls_of`, counts already kept to the
/// scope's op), for a trace that did not finish: the same rows, the
/// kernel-counted calls placed the same way.
pub fn stats_from_loaded(
    trace: &Trace,
    mut data: TraceData,
    scope: &CallFilter,
) -> Result<(StatsReport, WindowCounts), StoreError> {
    let window_counts = WindowCounts::of(trace, &data.counts, scope)?;
    data.counts = window_counts.estimates();
    let mut report = stats::compute(&data);
    report.threads.clear();
    Ok((report, window_counts))
}

/// The explanation of a window's calls loaded with their processes' waits
/// (`Trace::load_calls_of`), for a file without stored call groups: the
/// kernel-counted calls placed as `scoped::explanation` places them.
pub fn explain_loaded(
    trace: &Trace,
    mut data: TraceData,
    scope: &CallFilter,
    pinned: sleuth_core::findings::inputs::PinnedState,
) -> Result<Explanation, StoreError> {
    crate::scoped::scope_to_window(&mut data, scope.since_ns, scope.until_ns);
    let window_counts = WindowCounts::of(trace, &data.counts, scope)?;
    data.counts = window_counts.at_least();
    // Where they fell: a stretch that held launches is no pause.
    (data.count_samples, data.count_ends) = trace.count_places(scope.pid)?;
    let pinning = crate::scoped::pinning_outside(trace, scope)?;
    let mut e = match crate::scoped::window_allocators(trace, scope)? {
        Some(known) => findings::explain_report_pinned_with(&data, pinned, &pinning, &known),
        None => findings::explain_report_pinned(&data, pinned, &pinning),
    };
    e.notes.extend(window_counts.notes(FINDINGS_COUNT));
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_files::example;

    /// The rollups and culprit sums of a window of a file that did not
    /// finish, streamed, equal those of its calls loaded with their
    /// waits: the whole file, a window, a process, an op, an unknown op.
    #[test]
    fn a_window_of_an_unfinished_file_streams_to_the_loaded_parts() {
        let trace = Trace::open(&example("h200-contention.db")).unwrap();
        assert!(!trace.has_rollups().unwrap());
        let data = trace.load(None).unwrap();
        let first = data.calls.iter().map(|c| c.ts_ns).min().unwrap();
        let last = data.calls.iter().map(|c| c.ts_ns).max().unwrap();
        let pid = data.calls[0].pid;
        // A window that starts at a call whose culprits come from a wait
        // back on CPU inside it: the waits read for the window must reach it.
        let per_call = sleuth_core::culprits::call_culprits(
            &data.calls,
            &data.waits,
            sleuth_core::threads::tracer_pid(&data),
        );
        let blamed = (0..data.calls.len())
            .find(|&i| !per_call[i].is_empty())
            .map(|i| data.calls[i].ts_ns)
            .expect("the contention trace names culprits");
        let scopes = [
            CallFilter {
                since_ns: Some(blamed),
                ..Default::default()
            },
            CallFilter::default(),
            CallFilter {
                since_ns: Some(first + (last - first) / 3),
                until_ns: Some(first + 2 * (last - first) / 3),
                ..Default::default()
            },
            CallFilter {
                pid: Some(pid),
                since_ns: Some(first + (last - first) / 2),
                ..Default::default()
            },
            CallFilter {
                op: Some(data.calls[0].op_name().into()),
                ..Default::default()
            },
            CallFilter {
                op: Some("noSuchOp".into()),
                ..Default::default()
            },
        ];
        let mut with_culprits = 0;
        for scope in scopes {
            let (s, l) = (
                streamed_parts(&trace, &scope).unwrap(),
                loaded_parts(&trace, &scope).unwrap(),
            );
            let sorted = |r: &StoredRollups| {
                let mut ops = r.ops.clone();
                ops.sort_by_key(|(p, o, _)| (*p, *o));
                let mut c: Vec<String> = r.culprits.iter().map(|x| format!("{x:?}")).collect();
                c.sort();
                (ops, c)
            };
            assert_eq!(sorted(&s.rollups), sorted(&l.rollups), "{scope:?}");
            assert_eq!(s.counts.json(), l.counts.json(), "{scope:?}");
            assert_eq!(s.stats, l.stats, "{scope:?}");
            with_culprits += usize::from(!s.rollups.culprits.is_empty());
            if scope.op.as_deref() != Some("noSuchOp") {
                assert!(!s.rollups.ops.is_empty(), "{scope:?}");
            }
        }
        assert!(with_culprits >= 3, "the contention trace names culprits");
    }
}
