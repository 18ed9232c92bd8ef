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

use crate::reader::Trace;
use crate::scope_feed::{self, CallSink};
use crate::stream::Rows;
use crate::types::{CallFilter, StoredCall};
use crate::window::CallTally;
use crate::StoreError;
use sleuth_core::rollup::{self, StoredRollups};
use sleuth_core::stats::StatsReport;
use sleuth_core::threads::{sort_splits, tracer_pid, ThreadSplit};
use sleuth_core::{Culprit, TraceData};

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
    let held = crate::window::culprit_waits(&Rows::open(trace)?, pid, None)?;
    let base = TraceData {
        counts: trace.op_counts(pid)?,
        stats: trace.stats()?,
        has_host_context: trace.has_host_context(),
        ..trace.frame(pid)?
    };
    let waits_sql = scope_feed::thread_waits_after_sql(conn).map_err(read)?;
    let th = scope_feed::Threads {
        conn,
        threads: &pass.threads,
        waits_sql: &waits_sql,
        tracer: tracer_pid(&base),
        data: &base,
    };
    let mut sink = StatsSink {
        tally: CallTally::new(&held, tracer_pid(&base)),
        splits: Vec::new(),
    };
    if !scope_feed::one_read(&mut sink, &th, &pass.sql, &pass.args).map_err(read)? {
        return Ok(None);
    }
    let StatsSink { tally, mut splits } = sink;
    sort_splits(&mut splits);
    let (ops, culprits) = tally.finish();
    let rollups = StoredRollups {
        ops: ops.into_iter().map(|((p, o), r)| (p, o, r)).collect(),
        culprits,
        threads: splits,
    };
    Ok(Some(rollup::stats_report(&rollups, pid, &base)))
}

/// The accumulators of [`streamed`].
struct StatsSink<'w> {
    tally: CallTally<'w>,
    splits: Vec<ThreadSplit>,
}

impl CallSink for StatsSink<'_> {
    /// Every call, nested too, into its op's rollup and its culprits into
    /// the sums (a nested call's are its own: its thread's pass sees only
    /// the non-nested ones, which come after it in row order).
    fn note(&mut self, s: &StoredCall) {
        self.tally.add(&s.call);
    }

    /// The pass's culprits are those `note` took from the same waits.
    fn add(&mut self, _: &StoredCall, _: Vec<Culprit>) {}

    fn split(&mut self, split: ThreadSplit) {
        self.splits.push(split);
    }
}
