//! Finding rollups of each op's scope (issue 16): what MCP `findings` with
//! an op (of the whole trace or one process, no window) concludes from,
//! kept by the writer's final per-thread pass so that the answer reads no
//! call or wait row of the op's.
//!
//! A scope of one op is the trace with that op's calls alone
//! (`scoped::explanation`'s meaning), so beside the op's own aggregates
//! (the trace's, `finding_ops` and `finding_process_ops`: a call's culprits
//! do not depend on the other calls) it differs from the whole trace in
//! what is per thread: each thread's split over the window of its calls of
//! the op, the other ops' calls being time between calls there
//! (`ThreadPass::with_op_splits`), and its launch and host-gap histograms
//! and pageable copies of that op alone (`FindingInputs::add_thread_call`).
//! Since round 16 a copy op's copies are judged against every pinning call
//! of the file, in the writer's end-order replay with them
//! ([`OpScopes::replay_in_end_order`], `meta.finding_op_copies = 1`), as the
//! reader judged them again before (`scoped::rejudge_copies`, still used for
//! older files and for a file begun with memory pinned earlier in its run).
//! Without those rows the op's calls span the trace, and
//! every wait of each thread was read for them: 4.6–4.9 s for
//! `findings {op: cudaMemcpy}` on a 10M-call trace.
//!
//! Tables and meaning: docs/schema.md, "Finding rollups of an op's scope".

use crate::finding_rollups::{
    check_hist, complete_tables, fill_example_calls, read_one_op, row_index,
};
use crate::reader::Trace;
use crate::thread_pass::OpSplits;
use rusqlite::{params, Connection};
use sleuth_core::decompose::Split;
use sleuth_core::findings::inputs::{
    FindingInputs, LatencyHist, PinnedState, Resolution, ThreadInputs,
};
use sleuth_core::ops::{op_by_id, OpClass};
use sleuth_core::threads::ThreadSplit;
use sleuth_core::CallEvent;
use std::collections::{BTreeMap, HashMap};

/// `meta.finding_op_rollups` once both tables below are complete. Absent
/// in files written before them: a scope of an op is then streamed from
/// its calls.
const KEY: &str = "finding_op_rollups";

const CREATE: &str = "
CREATE TABLE IF NOT EXISTS finding_op_threads(op TEXT NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL, inputs TEXT NOT NULL, split TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS finding_op_hist(op TEXT NOT NULL, kind TEXT NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL, bucket INTEGER NOT NULL, count INTEGER NOT NULL);
";

/// The tables, their columns in order: a reader accepts nothing else.
const TABLES: &[(&str, &[&str])] = &[
    (
        "finding_op_threads",
        &["op", "pid", "tid", "inputs", "split"],
    ),
    (
        "finding_op_hist",
        &["op", "kind", "pid", "tid", "bucket", "count"],
    ),
];

/// `meta.finding_op_copies` once a copy op's scope judged its copies
/// against the file's pinning calls (absent: judged with none).
const COPIES_KEY: &str = "finding_op_copies";

/// Histogram kinds of `finding_op_hist` (`ThreadInputs`' two).
const HIST_LAUNCH: &str = "launch";
const HIST_GAP: &str = "sync_gap";

/// What the writer's per-thread pass feeds for every op's scope.
pub(crate) struct OpScopes {
    tracer: Option<u32>,
    /// Host ranges pinned before the file began (a run's earlier files):
    /// each scope's copies are judged from them.
    earlier: PinnedState,
    /// Per op id: the thread parts of a scope of that op alone.
    inputs: BTreeMap<u16, FindingInputs>,
    /// Per (op id, pid, tid): the thread's split over its calls of the op.
    splits: BTreeMap<(u16, u32, u32), ThreadSplit>,
    /// Whether every thread stored so far with calls of an op had its split.
    complete: bool,
}

impl OpScopes {
    pub(crate) fn new(tracer: Option<u32>, earlier: PinnedState) -> OpScopes {
        OpScopes {
            tracer,
            earlier,
            inputs: BTreeMap::new(),
            splits: BTreeMap::new(),
            complete: true,
        }
    }

    /// Starts the tables in the writer's final transaction, before its
    /// per-thread pass stores each process's rows ([`OpScopes::store_process`]).
    pub(crate) fn begin(conn: &Connection) -> rusqlite::Result<()> {
        conn.execute_batch(CREATE)?;
        for (t, _) in TABLES {
            conn.execute(&format!("DELETE FROM {t}"), [])?;
        }
        for key in [KEY, COPIES_KEY] {
            conn.execute("DELETE FROM meta WHERE key = ?1", [key])?;
        }
        Ok(())
    }

    /// A non-nested call of its thread, in start order.
    pub(crate) fn add_call(&mut self, c: &CallEvent) {
        let (tracer, earlier) = (self.tracer, &self.earlier);
        let f = self.inputs.entry(c.op).or_insert_with(|| {
            FindingInputs::new(Resolution::Bucketed, tracer).with_pinned(earlier.clone())
        });
        f.add_thread_call(c);
    }

    /// The next call of the file's pinned-memory replay (pinning calls and
    /// copies by end, `finding_rollups::write`): a copy joins its op's
    /// scope, judged against the pinning calls fed before it; a pinning
    /// call changes the pinned ranges of every copy op's scope.
    pub(crate) fn replay_in_end_order(&mut self, id: i64, c: &CallEvent) {
        let Some(info) = c.info() else { return };
        if info.class == OpClass::Copy {
            if let Some(f) = self.inputs.get_mut(&c.op) {
                f.add_in_end_order(row_index(id), c);
            }
            return;
        }
        for (op, f) in &mut self.inputs {
            if op_by_id(*op).is_some_and(|o| o.class == OpClass::Copy) {
                f.add_in_end_order(row_index(id), c);
            }
        }
    }

    /// The splits of one thread's ops (`ThreadPass::finish_with_ops`).
    pub(crate) fn add_splits(&mut self, pid: u32, tid: u32, splits: OpSplits) {
        for (op, s) in splits {
            self.splits.insert((op, pid, tid), s);
        }
    }

    /// Stores the rows of process `pid`'s threads `tids` once its calls are
    /// all in (its threads' and its pinned-memory replay's), and forgets
    /// them: what is held is one process's, not the file's.
    pub(crate) fn store_process(
        &mut self,
        conn: &Connection,
        pid: u32,
        tids: &[u32],
    ) -> rusqlite::Result<()> {
        for (&op, f) in &mut self.inputs {
            let taken = f.take_process(pid, tids);
            f.forget_pinned(pid);
            for (tid, t) in &taken.threads {
                let split = self.splits.remove(&(op, pid, *tid));
                self.complete &= store_thread(conn, op, pid, *tid, t, split.as_ref())?;
            }
        }
        Ok(())
    }

    /// Stores what no [`OpScopes::store_process`] took (the writer's final
    /// transaction, after [`OpScopes::begin`]). Marked complete only when
    /// every thread with calls of an op had its split (both come from the
    /// same calls; a reader streams the scope otherwise).
    pub(crate) fn write(self, conn: &Connection) -> rusqlite::Result<()> {
        let mut complete = self.complete;
        for (op, f) in &self.inputs {
            for (&(pid, tid), t) in &f.threads {
                let split = self.splits.get(&(*op, pid, tid));
                complete &= store_thread(conn, *op, pid, tid, t, split)?;
            }
        }
        if complete {
            for key in [KEY, COPIES_KEY] {
                conn.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, '1')",
                    [key],
                )?;
            }
        }
        Ok(())
    }
}

/// One thread's rows of op `op`'s scope; false (nothing stored) without
/// its split.
fn store_thread(
    conn: &Connection,
    op: u16,
    pid: u32,
    tid: u32,
    t: &ThreadInputs,
    split: Option<&ThreadSplit>,
) -> rusqlite::Result<bool> {
    let Some(info) = op_by_id(op) else {
        return Ok(true);
    };
    let Some(split) = split else {
        return Ok(false);
    };
    conn.prepare_cached(
        "INSERT INTO finding_op_threads(op, pid, tid, inputs, split) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![info.name, pid, tid, to_json(t)?, to_json(split)?])?;
    let mut hist = conn.prepare_cached(
        "INSERT INTO finding_op_hist(op, kind, pid, tid, bucket, count) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for (kind, h) in [(HIST_LAUNCH, &t.launches), (HIST_GAP, &t.host_gaps)] {
        for (k, n, _) in h.buckets() {
            hist.execute(params![info.name, kind, pid, tid, clamp(k), clamp(n)])?;
        }
    }
    Ok(true)
}

/// Whether the file's op scopes judged their copies against its pinning
/// calls ([`OpScopes::replay_in_end_order`]).
pub(crate) fn copies_judged(conn: &Connection) -> rusqlite::Result<bool> {
    Ok(crate::open::meta_value(conn, COPIES_KEY)?.as_deref() == Some("1"))
}

/// A stored value's JSON, as a SQL error where it fails.
fn to_json<T: serde::Serialize>(v: &T) -> rusqlite::Result<String> {
    serde_json::to_string(v).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// Clamps a value into SQLite's signed integers.
fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The finding aggregates of a scope of op `op` alone (of process `pid`,
/// or of the whole trace), with their example calls; None where the file
/// has no such rollups (written before them, cut short, merged, imported)
/// or, with `pid`, no per-process op aggregates. An error names a table
/// that is not the plain table gpusleuth writes, or a row that does not
/// parse.
pub(crate) fn read(
    conn: &Connection,
    trace: &Trace,
    op: &str,
    pid: Option<u32>,
) -> rusqlite::Result<Option<FindingInputs>> {
    if !crate::reader::rollups_complete(conn)?
        || !crate::finding_rollups::has_complete(conn, pid)?
        || !complete_tables(conn, KEY, TABLES)?
    {
        return Ok(None);
    }
    let bad = |what: String| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, what.into())
    };
    let mut ops = BTreeMap::new();
    if let (Some(info), Some(o)) = (sleuth_core::op_by_name(op), read_one_op(conn, pid, op)?) {
        ops.insert(info.id, o);
    }
    let mut threads: HashMap<(u32, u32), ThreadInputs> = HashMap::new();
    let mut splits: Vec<ThreadSplit> = Vec::new();
    let mut spans: HashMap<u32, (u64, u64)> = HashMap::new();
    let mut st = conn.prepare(
        "SELECT pid, tid, inputs, split FROM finding_op_threads
         WHERE op = ?1 AND (?2 IS NULL OR pid = ?2)",
    )?;
    let mut rows = st.query(params![op, pid])?;
    while let Some(r) = rows.next()? {
        let key: (u32, u32) = (r.get(0)?, r.get(1)?);
        let t: ThreadInputs = crate::stored_json::parse(&r.get::<_, String>(2)?)
            .map_err(|e| bad(format!("finding_op_threads {op} {key:?}: {e}")))?;
        let s: ThreadSplit = crate::stored_json::parse(&r.get::<_, String>(3)?)
            .map_err(|e| bad(format!("finding_op_threads {op} {key:?}: {e}")))?;
        // The process's span: its threads' windows of the op's calls.
        let (a, b) = spans.entry(key.0).or_insert((s.start_ns, s.end_ns));
        *a = (*a).min(s.start_ns);
        *b = (*b).max(s.end_ns);
        threads.insert(key, t);
        splits.push(s);
    }
    let mut st = conn.prepare(
        "SELECT kind, pid, tid, bucket, count FROM finding_op_hist
         WHERE op = ?1 AND (?2 IS NULL OR pid = ?2)",
    )?;
    let mut rows = st.query(params![op, pid])?;
    while let Some(r) = rows.next()? {
        let kind: String = r.get(0)?;
        let key: (u32, u32) = (r.get(1)?, r.get(2)?);
        let num = |i: usize| -> rusqlite::Result<u64> { Ok(r.get::<_, i64>(i)?.max(0) as u64) };
        let Some(t) = threads.get_mut(&key) else {
            continue;
        };
        let h: &mut LatencyHist = match kind.as_str() {
            HIST_LAUNCH => &mut t.launches,
            HIST_GAP => &mut t.host_gaps,
            _ => continue,
        };
        h.set_bucket(num(3)?, num(4)?, Split::default());
    }
    for t in threads.values() {
        check_hist(&t.launches, "finding_op_hist")?;
        check_hist(&t.host_gaps, "finding_op_hist")?;
    }
    let mut f = FindingInputs::from_parts(trace.tracer_pid(), ops, threads, spans, splits);
    fill_example_calls(conn, trace, &mut f)?;
    Ok(Some(f))
}

#[cfg(test)]
mod tests {
    /// Shares stored as JSON (a split's wakers, a finding's culprits) read
    /// back as the same f64: an answer from the stored aggregates equals the
    /// one computed from the rows to the last bit. serde_json parses floats
    /// exactly only with `float_roundtrip` (without it these values, seen on
    /// the H200's traces, came back one unit in the last place off).
    #[test]
    fn stored_shares_read_back_to_the_bit() {
        for v in [
            0.9182519530457779f64,
            0.23869088886800519,
            0.09422054945850575,
            0.9996892260657023,
            1.0 / 3.0,
        ] {
            let back: f64 = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
            assert_eq!(back.to_bits(), v.to_bits(), "{v}");
        }
    }
}
