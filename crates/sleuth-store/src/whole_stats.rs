//! `stats` of a whole file that has no rollups (the file a run's tracer is
//! still writing, one whose writer was killed), streamed instead of loaded.
//!
//! Loading such a file held every call and wait (721 MB for `stats` of a
//! 3.5M-call file). Here the calls are read once, in row order: each into
//! its op's rollup (the histogram a finished file's rollups keep:
//! percentiles within `rollup::MAX_RELATIVE_ERROR`), its culprits from its
//! thread's waits that can name any (held per thread, as a window's
//! streamed statistics hold them: `window::streamed_parts`), and each
//! thread's non-nested calls through its own pass against its waits
//! (`scope_feed::one_read`, `thread_pass`) for the per-thread split that a
//! loaded file's `threads::thread_splits` gives. Memory is those waits,
//! the rollups and one pass per thread; not the calls.

use crate::problems::valid_wait;
use crate::reader::Trace;
use crate::scope_feed::{self, CallSink};
use crate::stream::Rows;
use crate::types::{CallFilter, StoredCall};
use crate::StoreError;
use sleuth_core::culprits::{culprit_waits_by_thread, culprits_of_call, names_culprits};
use sleuth_core::rollup::{self, OpRollup, StoredRollups};
use sleuth_core::stats::StatsReport;
use sleuth_core::threads::{sort_splits, tracer_pid, ThreadSplit};
use sleuth_core::{Culprit, TraceData, WaitEvent};
use std::collections::{BTreeMap, HashMap};

/// The statistics of the whole file (of process `pid`, all when None), as
/// `stats` gives them, streamed; None where the caller loads the file
/// instead: a file with rollups (they answer), one of at most
/// `above_rows` call rows (loaded exactly, in little memory), more
/// threads than one pass holds, or a thread's calls out of their order (a
/// crafted or merged file).
pub fn streamed(
    trace: &Trace,
    pid: Option<u32>,
    above_rows: i64,
) -> Result<Option<StatsReport>, StoreError> {
    if trace.has_rollups()? || !crate::scoped::more_rows_than(trace, above_rows)? {
        return Ok(None);
    }
    if let Some(pid) = pid {
        trace.require_pid(pid)?;
    }
    let read = |e| trace.read_error(e);
    let conn = trace.bulk()?;
    let filter = CallFilter {
        pid,
        ..Default::default()
    };
    let Some(pass) = crate::scoped::unthreaded(conn, trace.version(), &filter).map_err(read)?
    else {
        return Ok(None);
    };
    let mut held = Vec::new();
    Rows::open(trace)?.for_each_wait::<StoreError>(pid, |w| {
        if names_culprits(&w) {
            held.push(w);
        }
        Ok(())
    })?;
    let base = TraceData {
        counts: trace.op_counts(pid)?,
        stats: trace.stats()?,
        has_host_context: trace.has_host_context(),
        ..trace.frame(pid)?
    };
    // A thread's waits back on CPU after its first non-nested call's start
    // (`?3`), as a scope's pass reads them (`scoped::parts_seeded`).
    let waits_sql = crate::wait_stream::thread_waits_sql(
        conn,
        &format!("{} AND w.on_ns > ?3", valid_wait("w.")),
    )
    .map_err(read)?;
    let th = scope_feed::Threads {
        conn,
        threads: &pass.threads,
        waits_sql: &waits_sql,
        tracer: tracer_pid(&base),
        data: &base,
    };
    let mut sink = StatsSink {
        waits: culprit_waits_by_thread(&held),
        ops: HashMap::new(),
        sums: BTreeMap::new(),
        splits: Vec::new(),
    };
    if !scope_feed::one_read(&mut sink, &th, &pass.sql, &pass.args).map_err(read)? {
        return Ok(None);
    }
    let StatsSink {
        ops,
        sums,
        mut splits,
        ..
    } = sink;
    sort_splits(&mut splits);
    let rollups = StoredRollups {
        ops: ops.into_iter().map(|((p, o), r)| (p, o, r)).collect(),
        culprits: crate::window::culprit_rows(sums),
        threads: splits,
    };
    Ok(Some(rollup::stats_report(&rollups, pid, &base)))
}

/// The accumulators of [`streamed`].
struct StatsSink<'w> {
    /// Each thread's waits that can name culprits, sorted as
    /// `culprits_of_call` takes them.
    waits: HashMap<(u32, u32), Vec<&'w WaitEvent>>,
    ops: HashMap<(u32, u16), OpRollup>,
    /// Runnable time per (process, op, culprit's process, culprit's name).
    sums: BTreeMap<(u32, u16, u32, String), u64>,
    splits: Vec<ThreadSplit>,
}

impl CallSink for StatsSink<'_> {
    /// Every call, nested too, into its op's rollup and its culprits into
    /// the sums (a nested call's are its own: its thread's pass sees only
    /// the non-nested ones, which come after it in row order).
    fn note(&mut self, s: &StoredCall) {
        let c = &s.call;
        self.ops.entry((c.pid, c.op)).or_default().add(c);
        if let Some(waits) = self.waits.get(&(c.pid, c.tid)) {
            for k in culprits_of_call(c, waits) {
                let e = self.sums.entry((c.pid, c.op, k.pid, k.comm)).or_default();
                *e = e.saturating_add(k.ns);
            }
        }
    }

    /// The pass's culprits are those `note` took from the same waits.
    fn add(&mut self, _: &StoredCall, _: Vec<Culprit>) {}

    fn split(&mut self, split: ThreadSplit) {
        self.splits.push(split);
    }
}
