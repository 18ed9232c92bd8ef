//! Finding rollups (issue 16): the aggregates that `explain`'s per-call
//! findings conclude from (`sleuth_core::findings::inputs`), computed once
//! when the trace ends and read back instead of every call.
//!
//! Fed by the writer's final per-thread pass (`finalize`), which computes
//! each call's culprits: one thread at a time, its non-nested calls in
//! start order with their culprits (one read of the calls serves both);
//! then [`write`] replays the host-memory and copy calls in end order (the
//! pinned-memory replay) and stores them. Memory is bounded by the
//! aggregates: histograms of the rollup kind, sums, top-3 examples. The op
//! aggregates are kept for the whole trace and for each process apart
//! (`finding_process_ops`); the others are per thread or per process
//! already, so one process (`--pid`) is answered from its own rows.
//! [`finding_inputs`] reads them back with the example calls (a few indexed
//! reads by row id). Tables and their meaning: docs/schema.md.

use crate::budget::{ReadBudget, DEFAULT_READ_TIMEOUT};
use crate::open::has_table;
use crate::reader::Trace;
use crate::rows::{call_from_row, calls_sql, calls_sql_from};
use crate::StoreError;
use rusqlite::types::FromSql;
use rusqlite::{params, Connection, OptionalExtension, Params};
use sleuth_core::decompose::Split;
use sleuth_core::findings::inputs::{
    FindingInputs, LatencyHist, OpInputs, PinnedState, ProcessInputs, Resolution, ThreadInputs,
};
use sleuth_core::ops::{op_by_id, op_by_name, OpClass, OPS};
use sleuth_core::threads::ThreadSplit;
use sleuth_core::CallEvent;
use std::collections::{BTreeMap, HashMap};

/// `meta.finding_rollups` once every table below is complete.
const COMPLETE: &str = "1";

const CREATE: &str = "
CREATE TABLE IF NOT EXISTS finding_ops(op TEXT NOT NULL, inputs TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS finding_threads(pid INTEGER NOT NULL, tid INTEGER NOT NULL, inputs TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS finding_hist(kind TEXT NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL, op TEXT NOT NULL, bucket INTEGER NOT NULL, count INTEGER NOT NULL, on_cpu_ns INTEGER NOT NULL, runnable_ns INTEGER NOT NULL, blocked_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS finding_spans(pid INTEGER NOT NULL, first_ns INTEGER NOT NULL, last_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS finding_process_ops(pid INTEGER NOT NULL, op TEXT NOT NULL, inputs TEXT NOT NULL);
";

/// `meta.finding_process_rollups` once `finding_process_ops` (and its
/// histogram rows) is complete. A key of its own: files written before it
/// have complete finding rollups without it, and explain one process
/// through the full load.
const PROCESS_KEY: &str = "finding_process_rollups";

/// The per-process op table, its columns in order (checked as [`TABLES`]).
const PROCESS_TABLES: &[(&str, &[&str])] = &[("finding_process_ops", &["pid", "op", "inputs"])];

/// The tables above, their columns in order: a reader accepts nothing else.
const TABLES: &[(&str, &[&str])] = &[
    ("finding_ops", &["op", "inputs"]),
    ("finding_threads", &["pid", "tid", "inputs"]),
    (
        "finding_hist",
        &[
            "kind",
            "pid",
            "tid",
            "op",
            "bucket",
            "count",
            "on_cpu_ns",
            "runnable_ns",
            "blocked_ns",
        ],
    ),
    ("finding_spans", &["pid", "first_ns", "last_ns"]),
];

/// Histogram kinds of `finding_hist`.
const HIST_OP: &str = "op";
/// One process's op (`pid` set, `tid` 0).
const HIST_PROCESS_OP: &str = "process_op";
const HIST_LAUNCH: &str = "launch";
const HIST_GAP: &str = "sync_gap";

fn json_err(e: serde_json::Error) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(e))
}

/// Clamps a sum into SQLite's signed integers (a crafted huge sum must not fail the finish).
fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The accumulators the writer's per-thread pass feeds (`finalize`): each
/// non-nested call of a thread in start order with its culprits, as it
/// computes them; [`store_process`] and [`finish`] store them.
pub(crate) fn new_inputs(tracer: Option<u32>) -> FindingInputs {
    // Each call into its process's op aggregates only; the whole trace's
    // are their merge (taken process by process, the rest settled by `finish`).
    FindingInputs::new(Resolution::Bucketed, tracer).whole_from_processes()
}

/// The ops of the pinned-memory replay (`FindingInputs::add_in_end_order`):
/// what pins and unpins host memory, and with `copies` the copies judged
/// against it.
pub(crate) fn pinned_replay_ops(copies: bool) -> Vec<&'static str> {
    OPS.iter()
        .filter(|o| {
            matches!(
                o.class,
                OpClass::HostAlloc
                    | OpClass::HostRegister
                    | OpClass::HostFree
                    | OpClass::HostUnregister
            ) || (copies && o.class == OpClass::Copy)
        })
        .map(|o| o.name)
        .collect()
}

/// A call's example index: its row id (ids are positive).
pub(crate) fn row_index(id: i64) -> usize {
    usize::try_from(id).unwrap_or(0)
}

/// Starts the finding rollups' tables in the writer's final transaction,
/// before its per-thread pass stores each process's rows ([`store_process`]).
pub(crate) fn begin(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(CREATE)?;
    for (t, _) in TABLES.iter().chain(PROCESS_TABLES) {
        conn.execute(&format!("DELETE FROM {t}"), [])?;
    }
    Ok(())
}

/// The pinned-memory replay's calls (host allocations, registrations and
/// copies, non-nested) by process, then by end (ties by row id): the
/// writer's per-thread pass visits processes in pid order and feeds each
/// one's calls once its threads are done ([`EndOrderByProcess::feed_through`]).
/// Each process's pinned ranges are its own, so a process's calls in end
/// order give it what the whole file's end order gave it.
pub(crate) fn end_order_by_process_sql(conn: &Connection) -> rusqlite::Result<String> {
    let ops = pinned_replay_ops(true);
    let names = crate::stream::quoted_names(&ops);
    let source = crate::stream::calls_source_for_ops(conn, ops)?;
    calls_sql_from(
        conn,
        &source,
        &format!("WHERE nested = 0 AND op IN ({names}) ORDER BY pid, ts_ns + dur_ns, id"),
    )
}

/// A read of [`end_order_by_process_sql`]'s rows, one process at a time.
pub(crate) struct EndOrderByProcess<'s> {
    rows: rusqlite::Rows<'s>,
    /// The row read past the last process fed.
    pending: Option<(i64, sleuth_core::CallEvent)>,
}

impl<'s> EndOrderByProcess<'s> {
    pub(crate) fn new(rows: rusqlite::Rows<'s>) -> EndOrderByProcess<'s> {
        EndOrderByProcess {
            rows,
            pending: None,
        }
    }

    /// Every call of the processes up to `pid` (all with None) to `each`,
    /// with its row id.
    pub(crate) fn feed_through(
        &mut self,
        pid: Option<u32>,
        mut each: impl FnMut(i64, &sleuth_core::CallEvent),
    ) -> rusqlite::Result<()> {
        loop {
            let (id, c) = match self.pending.take() {
                Some(next) => next,
                None => match self.rows.next()? {
                    None => return Ok(()),
                    Some(row) => match call_from_row(row)? {
                        Some(s) => (s.id, s.call),
                        // An op this build does not know: not replayed.
                        None => continue,
                    },
                },
            };
            if pid.is_some_and(|p| c.pid > p) {
                self.pending = Some((id, c));
                return Ok(());
            }
            each(id, &c);
        }
    }
}

/// Stores process `pid`'s finding rows (its ops', its threads', its span),
/// taken out of the aggregates once its calls are all in.
pub(crate) fn store_process(
    conn: &Connection,
    pid: u32,
    p: &ProcessInputs,
) -> rusqlite::Result<()> {
    for (op, o) in &p.ops {
        store_process_op(conn, pid, *op, o)?;
    }
    for (tid, t) in &p.threads {
        store_thread(conn, pid, *tid, t)?;
    }
    if let Some(span) = p.span {
        store_span(conn, pid, span)?;
    }
    Ok(())
}

/// Completes the finding rollups fed by the per-thread pass (the rest of
/// the pinned-memory replay from `replay`, which also judges the copies of
/// each copy op's scope: `scopes`) and stores what no process took; returns
/// the host ranges live at the file's end. The writer's final transaction
/// calls it, after [`begin`].
pub(crate) fn finish(
    conn: &Connection,
    mut f: FindingInputs,
    scopes: &mut crate::scope_rollups::OpScopes,
    replay: &mut EndOrderByProcess<'_>,
) -> rusqlite::Result<PinnedState> {
    replay.feed_through(None, |id, c| {
        f.add_in_end_order(row_index(id), c);
        scopes.replay_in_end_order(id, c);
    })?;
    f.settle();
    store(conn, &f)?;
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('finding_rollups', ?1)",
        [COMPLETE],
    )?;
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)",
        [PROCESS_KEY, COMPLETE],
    )?;
    Ok(f.pinned_state())
}

/// A histogram's rows in `finding_hist`.
fn put_hist(
    conn: &Connection,
    kind: &str,
    pid: u32,
    tid: u32,
    op: &str,
    h: &LatencyHist,
) -> rusqlite::Result<()> {
    let mut hist = conn.prepare_cached(
        "INSERT INTO finding_hist(kind, pid, tid, op, bucket, count, on_cpu_ns, runnable_ns, blocked_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    for (k, n, s) in h.buckets() {
        hist.execute(params![
            kind,
            pid,
            tid,
            op,
            clamp(k),
            clamp(n),
            clamp(s.on_cpu_ns),
            clamp(s.runnable_ns),
            clamp(s.blocked_ns)
        ])?;
    }
    Ok(())
}

/// One process's aggregates of op `op` (`finding_process_ops`, its histogram).
fn store_process_op(conn: &Connection, pid: u32, op: u16, o: &OpInputs) -> rusqlite::Result<()> {
    let Some(info) = op_by_id(op) else {
        return Ok(());
    };
    conn.prepare_cached("INSERT INTO finding_process_ops(pid, op, inputs) VALUES (?1, ?2, ?3)")?
        .execute(params![
            pid,
            info.name,
            serde_json::to_string(o).map_err(json_err)?
        ])?;
    put_hist(conn, HIST_PROCESS_OP, pid, 0, info.name, &o.hist)
}

fn store_thread(conn: &Connection, pid: u32, tid: u32, t: &ThreadInputs) -> rusqlite::Result<()> {
    conn.prepare_cached("INSERT INTO finding_threads(pid, tid, inputs) VALUES (?1, ?2, ?3)")?
        .execute(params![
            pid,
            tid,
            serde_json::to_string(t).map_err(json_err)?
        ])?;
    put_hist(conn, HIST_LAUNCH, pid, tid, "", &t.launches)?;
    put_hist(conn, HIST_GAP, pid, tid, "", &t.host_gaps)
}

fn store_span(conn: &Connection, pid: u32, (a, b): (u64, u64)) -> rusqlite::Result<()> {
    conn.prepare_cached("INSERT INTO finding_spans(pid, first_ns, last_ns) VALUES (?1, ?2, ?3)")?
        .execute(params![pid, clamp(a), clamp(b)])?;
    Ok(())
}

/// Stores the whole trace's op aggregates and whatever per-process
/// aggregates no [`store_process`] took.
fn store(conn: &Connection, f: &FindingInputs) -> rusqlite::Result<()> {
    let mut ins = conn.prepare("INSERT INTO finding_ops(op, inputs) VALUES (?1, ?2)")?;
    for (&op, o) in &f.ops {
        let Some(info) = op_by_id(op) else { continue };
        ins.execute(params![
            info.name,
            serde_json::to_string(o).map_err(json_err)?
        ])?;
        put_hist(conn, HIST_OP, 0, 0, info.name, &o.hist)?;
    }
    for (&(pid, op), o) in f.process_ops.iter().flatten() {
        store_process_op(conn, pid, op, o)?;
    }
    for (&(pid, tid), t) in &f.threads {
        store_thread(conn, pid, tid, t)?;
    }
    for (&pid, &span) in &f.spans {
        store_span(conn, pid, span)?;
    }
    Ok(())
}

/// More calls than any file holds (a trace of 2^56 rows would take
/// petabytes): a stored histogram whose counts add up past it is damaged.
/// Below it its percentiles' arithmetic (a rank is up to 100 x the count)
/// cannot overflow.
const MAX_HIST_CALLS: u64 = 1 << 56;

/// Refuses a stored histogram (of `table`) whose counts add up past
/// [`MAX_HIST_CALLS`]: a crafted file must get a one-line error, not a
/// panic or a percentile computed on wrapped sums.
pub(crate) fn check_hist(h: &LatencyHist, table: &str) -> rusqlite::Result<()> {
    let total = h
        .buckets()
        .try_fold(0u64, |sum, (_, n, _)| sum.checked_add(n));
    check_count(total.unwrap_or(u64::MAX), table)
}

/// Refuses a stored histogram's total count (saturated) past
/// [`MAX_HIST_CALLS`], as [`check_hist`] does.
pub(crate) fn check_count(total: u64, table: &str) -> rusqlite::Result<()> {
    if total <= MAX_HIST_CALLS {
        return Ok(());
    }
    Err(damaged_table(
        table,
        "counts more calls than a file can hold",
    ))
}

/// The first column of the one row `sql` finds, or None when it finds none.
fn value<T: FromSql>(conn: &Connection, sql: &str, p: impl Params) -> rusqlite::Result<Option<T>> {
    conn.query_row(sql, p, |r| r.get(0)).optional()
}

/// Whether the aggregate tables that `meta.<key> = 1` marks complete can
/// be read (call groups, wait groups, the ledger and site rollups): false
/// when the mark or a table is absent (the reader then computes the answer
/// from the rows), an error naming the table when one is not the plain
/// table gpusleuth writes.
pub(crate) fn complete_tables(
    conn: &Connection,
    key: &str,
    tables: &[(&str, &[&str])],
) -> rusqlite::Result<bool> {
    if crate::open::meta_value(conn, key)?.as_deref() != Some("1") {
        return Ok(false);
    }
    for (t, _) in tables {
        if !has_table(conn, t)? {
            return Ok(false);
        }
    }
    for (t, cols) in tables {
        if !plain_table(conn, t, cols)? {
            return Err(damaged_table(t, "is not the table gpusleuth writes"));
        }
    }
    Ok(true)
}

/// The error of a stored aggregate table that no writer could have made.
pub(crate) fn damaged_table(table: &str, what: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Integer,
        format!("damaged trace: {table} {what}").into(),
    )
}

/// Whether `table` is a plain table with exactly `cols` and no index or
/// trigger hung on it (a crafted file must not run anything on a read).
pub(crate) fn plain_table(conn: &Connection, table: &str, cols: &[&str]) -> rusqlite::Result<bool> {
    let kind: Option<String> = value(
        conn,
        "SELECT type FROM sqlite_master WHERE name = ?1",
        [table],
    )?;
    if kind.as_deref() != Some("table") {
        return Ok(false);
    }
    let mut st = conn.prepare("SELECT name, hidden FROM pragma_table_xinfo(?1)")?;
    let got: Vec<(String, i64)> = st
        .query_map([table], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let attached: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type IN ('index', 'trigger') AND tbl_name = ?1",
        [table],
        |r| r.get(0),
    )?;
    Ok(attached == 0
        && got.len() == cols.len()
        && got.iter().zip(cols).all(|((n, h), c)| n == c && *h == 0))
}

/// The finding aggregates stored in `trace` (of process `pid`, or of the
/// whole trace), with their example calls read back by id; None when the
/// trace has none (older, imported, merged or cut short:
/// `FindingInputs::of` over the loaded trace answers then), or with `pid`
/// when it was written before the per-process op aggregates.
pub fn finding_inputs(
    trace: &Trace,
    pid: Option<u32>,
) -> Result<Option<FindingInputs>, StoreError> {
    let path = trace.path();
    // The example calls (at most a few per op and thread) are read by row id
    // without a check of the whole per-call table (see `Trace::keyed`).
    let (conn, _, _) = trace.open_beside(&ReadBudget::new(DEFAULT_READ_TIMEOUT))?;
    let err = |e: rusqlite::Error| StoreError::file(path, format!("finding rollups: {e}"));
    let done = crate::open::meta_value(&conn, "finding_rollups").map_err(err)?;
    if done.as_deref() != Some(COMPLETE) || !trace.has_rollups()? {
        return Ok(None);
    }
    for (t, cols) in TABLES {
        if !has_table(&conn, t).map_err(err)? || !plain_table(&conn, t, cols).map_err(err)? {
            return Err(StoreError::file(
                path,
                format!("damaged trace: {t} is not the table gpusleuth writes"),
            ));
        }
    }
    if pid.is_some() && !complete_tables(&conn, PROCESS_KEY, PROCESS_TABLES).map_err(err)? {
        return Ok(None);
    }
    read(&conn, trace, pid).map_err(err)
}

/// Whether the finding rollups (of the whole trace, and with `pid` the
/// per-process op aggregates) are complete and plain tables (the file's
/// rollups as a whole are `reader::rollups_complete`'s); an error names one
/// that is not the table gpusleuth writes.
pub(crate) fn has_complete(conn: &Connection, pid: Option<u32>) -> rusqlite::Result<bool> {
    if !complete_tables(conn, "finding_rollups", TABLES)? {
        return Ok(false);
    }
    Ok(pid.is_none() || complete_tables(conn, PROCESS_KEY, PROCESS_TABLES)?)
}

/// The op aggregates of the whole trace (`finding_ops`) or of one process
/// (`finding_process_ops`), without their histograms.
fn read_ops(conn: &Connection, pid: Option<u32>) -> rusqlite::Result<BTreeMap<u16, OpInputs>> {
    let bad = |what: String| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, what.into())
    };
    // `finding_ops` has no pid: the whole trace's rows (the binding is unused).
    let (table, only) = match pid {
        None => ("finding_ops", "?1 IS NULL"),
        Some(_) => ("finding_process_ops", "pid = ?1"),
    };
    let mut ops = BTreeMap::new();
    let mut st = conn.prepare(&format!("SELECT op, inputs FROM {table} WHERE {only}"))?;
    let mut rows = st.query([pid])?;
    while let Some(r) = rows.next()? {
        let name: String = r.get(0)?;
        let Some(info) = op_by_name(&name) else {
            continue; // an op this build does not know
        };
        let o: OpInputs = crate::stored_json::parse(&r.get::<_, String>(1)?)
            .map_err(|e| bad(format!("{table} {name}: {e}")))?;
        ops.insert(info.id, o);
    }
    Ok(ops)
}

/// One op's aggregates, of the whole trace or of process `pid`, with its
/// histogram (its `finding_hist` rows alone); None where the file has none
/// (no non-nested call of it in that scope).
pub(crate) fn read_one_op(
    conn: &Connection,
    pid: Option<u32>,
    name: &str,
) -> rusqlite::Result<Option<OpInputs>> {
    let Some(info) = op_by_name(name) else {
        return Ok(None);
    };
    let Some(mut o) = read_ops(conn, pid)?.remove(&info.id) else {
        return Ok(None);
    };
    let kind = match pid {
        None => HIST_OP,
        Some(_) => HIST_PROCESS_OP,
    };
    let mut st = conn.prepare(
        "SELECT bucket, count, on_cpu_ns, runnable_ns, blocked_ns FROM finding_hist
         WHERE kind = ?1 AND op = ?2 AND pid = ?3 AND tid = 0",
    )?;
    let mut rows = st.query(params![kind, name, pid.unwrap_or(0)])?;
    while let Some(r) = rows.next()? {
        let num = |i: usize| -> rusqlite::Result<u64> { Ok(r.get::<_, i64>(i)?.max(0) as u64) };
        let split = Split {
            on_cpu_ns: num(2)?,
            runnable_ns: num(3)?,
            blocked_ns: num(4)?,
        };
        o.hist.set_bucket(num(0)?, num(1)?, split);
    }
    check_hist(&o.hist, "finding_hist")?;
    Ok(Some(o))
}

/// The aggregates of the whole trace, or of process `pid`: its ops
/// (`finding_process_ops`), and of the per-thread and per-process rows
/// only its own. Each is what `FindingInputs::of` gives the trace loaded
/// with that pid: every aggregate but the ops' is per thread or per process.
fn read(
    conn: &Connection,
    trace: &Trace,
    pid: Option<u32>,
) -> rusqlite::Result<Option<FindingInputs>> {
    let bad = |what: String| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, what.into())
    };
    let mut ops = read_ops(conn, pid)?;
    let mut threads: HashMap<(u32, u32), ThreadInputs> = HashMap::new();
    let mut st =
        conn.prepare("SELECT pid, tid, inputs FROM finding_threads WHERE ?1 IS NULL OR pid = ?1")?;
    let mut rows = st.query([pid])?;
    while let Some(r) = rows.next()? {
        let key: (u32, u32) = (r.get(0)?, r.get(1)?);
        let t: ThreadInputs = crate::stored_json::parse(&r.get::<_, String>(2)?)
            .map_err(|e| bad(format!("finding_threads {key:?}: {e}")))?;
        threads.insert(key, t);
    }
    // The op histograms of the scope read: the whole trace's (pid 0) or the process's.
    let op_kind = if pid.is_some() {
        HIST_PROCESS_OP
    } else {
        HIST_OP
    };
    let mut st = conn.prepare(
        "SELECT kind, pid, tid, op, bucket, count, on_cpu_ns, runnable_ns, blocked_ns FROM finding_hist
         WHERE ?1 IS NULL OR pid = ?1",
    )?;
    let mut rows = st.query([pid])?;
    while let Some(r) = rows.next()? {
        let kind: String = r.get(0)?;
        let num = |i: usize| -> rusqlite::Result<u64> { Ok(r.get::<_, i64>(i)?.max(0) as u64) };
        let split = Split {
            on_cpu_ns: num(6)?,
            runnable_ns: num(7)?,
            blocked_ns: num(8)?,
        };
        let key = (r.get::<_, u32>(1)?, r.get::<_, u32>(2)?);
        let h = match kind.as_str() {
            k if k == op_kind => op_by_name(&r.get::<_, String>(3)?)
                .and_then(|i| ops.get_mut(&i.id))
                .map(|o| &mut o.hist),
            HIST_LAUNCH => threads.get_mut(&key).map(|t| &mut t.launches),
            HIST_GAP => threads.get_mut(&key).map(|t| &mut t.host_gaps),
            _ => None,
        };
        if let Some(h) = h {
            h.set_bucket(num(4)?, num(5)?, split);
        }
    }
    for o in ops.values() {
        check_hist(&o.hist, "finding_hist")?;
    }
    for t in threads.values() {
        check_hist(&t.launches, "finding_hist")?;
        check_hist(&t.host_gaps, "finding_hist")?;
    }
    let mut spans = HashMap::new();
    let mut st = conn
        .prepare("SELECT pid, first_ns, last_ns FROM finding_spans WHERE ?1 IS NULL OR pid = ?1")?;
    let mut rows = st.query([pid])?;
    while let Some(r) = rows.next()? {
        spans.insert(
            r.get::<_, u32>(0)?,
            (
                r.get::<_, i64>(1)?.max(0) as u64,
                r.get::<_, i64>(2)?.max(0) as u64,
            ),
        );
    }
    let mut splits: Vec<ThreadSplit> = Vec::new();
    let mut st = conn.prepare("SELECT split FROM rollup_threads WHERE ?1 IS NULL OR pid = ?1")?;
    let mut rows = st.query([pid])?;
    while let Some(r) = rows.next()? {
        splits.push(
            crate::stored_json::parse(&r.get::<_, String>(0)?)
                .map_err(|e| bad(format!("rollup_threads: {e}")))?,
        );
    }
    let mut f = FindingInputs::from_parts(trace.tracer_pid(), ops, threads, spans, splits);
    fill_example_calls(conn, trace, &mut f)?;
    Ok(Some(f))
}

/// Each example call's site (its `stack_id`, read by row id), for
/// aggregates fed by calls read without it (`scoped`'s stream): the loaded
/// trace's calls carry it, and the example names its site.
pub(crate) fn fill_example_sites(conn: &Connection, f: &mut FindingInputs) -> rusqlite::Result<()> {
    let ids = f
        .example_indices()
        .into_iter()
        .filter_map(|i| i64::try_from(i).ok());
    let sites = sites_by_id(conn, ids)?;
    f.set_example_sites(|i| sites.get(&i64::try_from(i).ok()?).copied());
    Ok(())
}

/// The call site (`stack_id`) of each of the calls `ids` that has one, read
/// by row id; none in a file without the column.
fn sites_by_id(
    conn: &Connection,
    ids: impl IntoIterator<Item = i64>,
) -> rusqlite::Result<HashMap<i64, u64>> {
    let mut sites = HashMap::new();
    if !crate::stacks::has_column(conn, "calls", "stack_id")? {
        return Ok(sites);
    }
    let mut st = conn.prepare("SELECT stack_id FROM calls WHERE id = ?1")?;
    for id in ids {
        let site: Option<i64> = st.query_row([id], |r| r.get(0)).optional()?.flatten();
        if let Some(s) = site {
            sites.insert(id, s as u64);
        }
    }
    Ok(sites)
}

/// Puts back the example calls of aggregates read from storage (a few
/// reads by row id) with their culprits (`call_culprits`).
pub(crate) fn fill_example_calls(
    conn: &Connection,
    trace: &Trace,
    f: &mut FindingInputs,
) -> rusqlite::Result<()> {
    let bad = |what: String| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, what.into())
    };
    let ids: Vec<i64> = f
        .example_indices()
        .into_iter()
        .filter_map(|i| i64::try_from(i).ok())
        .collect();
    let mut calls: HashMap<i64, CallEvent> = HashMap::new();
    // A row damaged since the rollups were written is no example (as any
    // reader skips it).
    let valid = crate::problems::valid_call("");
    let mut st = conn.prepare(&calls_sql(conn, &format!("WHERE id = ?1 AND {valid}"))?)?;
    let sites = sites_by_id(conn, ids.iter().copied())?;
    for &id in &ids {
        let Some(mut c) = st
            .query_row([id], call_from_row)
            .optional()?
            .flatten()
            .map(|s| s.call)
        else {
            continue;
        };
        c.stack_id = sites.get(&id).copied();
        calls.insert(id, c);
    }
    let culprits = trace
        .call_culprits_of(&ids)
        .map_err(|e| bad(format!("call culprits: {e}")))?;
    f.fill_examples(|i| {
        let id = i64::try_from(i).ok()?;
        let c = calls.get(&id)?.clone();
        Some((c, culprits.get(&id).cloned().unwrap_or_default()))
    });
    Ok(())
}
