//! Reading a trace's rows one at a time, in order, without holding them:
//! what `memory`, `export` and the MCP tools use on traces too long to load.
//!
//! A [`Rows`] is a second read-only connection to a trace that
//! [`Trace::open`] already checked (format, schema, integrity). It reads
//! the `calls` table (or view) through its column names only, with the same
//! row filters and the same order as [`Trace::load`], so a streamed answer
//! equals the loaded one.

use crate::budget::{ReadBudget, DEFAULT_READ_TIMEOUT};
use crate::checked::BulkCheck;
use crate::error::{SqlContext, StoreError};
use crate::open::has_index;
use crate::problems::{valid_call, valid_wait, MAX_NS, TOTALS_OVERFLOW};
use crate::reader::Trace;
use crate::return_order::{OutOfOrder, Reorder, REORDER_ROWS};
use crate::rows::{wait_from_row, waits_sql, OpColumn, OpIds, CALL_COLS};
use crate::stacks::has_column;
use crate::types::StoredCall;
use rusqlite::types::Value;
use rusqlite::Connection;
use sleuth_core::sites::AllocTally;
use sleuth_core::{ProcEvent, ProcKind, WaitEvent, WaitKind};
use std::path::PathBuf;

/// The order calls are visited in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StreamOrder {
    /// By start time, then row id: the order of [`Trace::load`]'s calls.
    #[default]
    ByStart,
    /// By return time (`ts_ns + dur_ns`), then start, then row id: the
    /// order the ledger replays calls in.
    ByReturn,
    /// Slowest first, then row id (the `calls(op, dur_ns)` index serves it).
    ByDurationDesc,
    /// By row id: the order the writer stored the calls in (a scan of
    /// the rows needs no sort). [`Rows::replay_by_return`] reads in it.
    ById,
    /// In the order SQLite finds them, no sort: for sums and histograms,
    /// whose result does not depend on it (a window's statistics: each of
    /// its threads in start order through the `(tid, ts_ns)` index).
    AsFound,
}

/// A read error of the file at `path` read under `budget`: why the budget
/// stopped it, else SQLite's.
pub(crate) fn read_error_of(
    path: &std::path::Path,
    budget: &ReadBudget,
    e: rusqlite::Error,
) -> StoreError {
    match budget.stop_reason() {
        Some(why) => StoreError::file(path, format!("reading stopped: {why}")),
        None => StoreError::Sqlite {
            path: path.to_path_buf(),
            source: e,
        },
    }
}

/// Which calls a stream visits. `None` fields do not filter.
#[derive(Debug, Clone, Default)]
pub struct CallQuery {
    pub pid: Option<u32>,
    /// Only calls of these ops (by name).
    pub ops: Option<Vec<&'static str>>,
    pub order: StreamOrder,
    pub limit: Option<usize>,
    /// Only calls that returned at or before this time (`ts_ns + dur_ns`):
    /// the ledger at a moment (`memory --at`) applies nothing later, so it
    /// reads nothing later (fewer rows sorted by return and decoded).
    pub returned_by: Option<u64>,
    /// Only calls that returned after this time, with a row id of at least
    /// `from_id`: the calls a replay taken up from a checkpoint still
    /// needs (`crate::allocator_checkpoints`), read from that id on.
    pub returned_after: Option<u64>,
    pub from_id: Option<i64>,
    /// Only calls that started in `[since_ns, until_ns)` (either bound may
    /// be absent): found per thread through the `(tid, ts_ns)` index, so a
    /// window reads its own calls, not the trace's.
    pub since_ns: Option<u64>,
    pub until_ns: Option<u64>,
    /// Only calls of these threads (the process's, from the stored call
    /// groups): found through the `(tid, ts_ns)` index, so one process
    /// of many reads its own calls, not every memory call of the file
    /// (the calls have no index by process; `crate::file_steps`). Not
    /// with a window (which finds its threads itself).
    pub tids: Option<Vec<u32>>,
}

/// Calls of one process, thread, op and return value, from one pass over
/// the `calls` rows (see [`Rows::call_groups`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallGroup {
    pub pid: u32,
    pub tid: u32,
    /// Op id (rows of ops this build does not know are not grouped).
    pub op: u16,
    pub ret: i64,
    pub count: u64,
    pub first_ts_ns: u64,
    pub last_end_ns: u64,
}

/// A second connection to an opened trace, for streamed reads.
pub struct Rows {
    conn: Connection,
    path: PathBuf,
    budget: ReadBudget,
    /// `calls.stack_id` exists (traces taken since call sites were captured).
    has_stacks: bool,
    /// The file's schema version (which table holds the call rows).
    version: i64,
    /// The per-call and per-wait tables' check and the call-row pass
    /// (totals, impossible rows), shared with the trace.
    bulk: BulkCheck,
}

impl Rows {
    /// Streams from `trace` under a fresh command-line budget.
    pub fn open(trace: &Trace) -> Result<Rows, StoreError> {
        Self::open_with(trace, ReadBudget::new(DEFAULT_READ_TIMEOUT))
    }

    /// Streams from `trace` under `budget` (the caller's deadline and cancellation).
    pub fn open_with(trace: &Trace, budget: ReadBudget) -> Result<Rows, StoreError> {
        // The per-call and per-wait tables of a large file are checked before
        // this stream's first read of them (`Rows::bulk`), not here: an
        // answer from the stored call groups reads none of them.
        let path = trace.path().to_path_buf();
        // A file replaced since the trace opened it gets its bulk tables
        // checked again before this stream reads them.
        let (conn, version, bulk) = trace.open_beside(&budget)?;
        let has_stacks = has_column(&conn, "calls", "stack_id").at(&path)?;
        Ok(Rows {
            conn,
            path,
            budget,
            has_stacks,
            version,
            bulk,
        })
    }

    /// The connection, once the per-call and per-wait tables are checked
    /// (`Trace::bulk`'s rule; the check runs once per opened trace).
    fn bulk(&self) -> Result<&Connection, StoreError> {
        self.bulk.ensure(&self.conn, &self.path, &self.budget)?;
        Ok(&self.conn)
    }

    /// The connection under the stream (its reads are the caller's to check).
    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    pub(crate) fn read_error(&self, e: rusqlite::Error) -> StoreError {
        read_error_of(&self.path, &self.budget, e)
    }

    /// The file's path, budget, schema and checks: what a read split over
    /// helper connections needs (`crate::split_read`).
    pub(crate) fn parts(&self) -> (&std::path::Path, &ReadBudget, CallSource, &BulkCheck) {
        (&self.path, &self.budget, self.call_source(), &self.bulk)
    }

    /// Where this stream's calls come from (every column it has).
    fn call_source(&self) -> CallSource {
        CallSource {
            version: self.version,
            has_stacks: self.has_stacks,
            host_ptrs: true,
        }
    }

    /// The connection after the checks a bulk read of the call rows makes
    /// ([`Self::for_each_call`]'s).
    pub(crate) fn checked_for_calls(&self) -> Result<&Connection, StoreError> {
        self.bulk()?;
        self.check_totals()?;
        Ok(&self.conn)
    }

    /// Visits the calls `q` selects, in its order, one at a time; stops at
    /// the first error `visit` returns. Rows [`Trace::load`] skips
    /// (impossible values, unknown ops) are skipped here too.
    pub fn for_each_call<E: From<StoreError>>(
        &self,
        q: &CallQuery,
        visit: impl FnMut(StoredCall) -> Result<(), E>,
    ) -> Result<(), E> {
        // Call rows are read in bulk: their table checked, their totals too (a
        // file whose durations add up past 2^62 is refused, as `Trace::load`
        // refuses it). A page of at most `KEYED_ROWS` calls (the slowest ones)
        // is a bounded read, as `Trace::keyed` reads.
        if q.limit.is_none_or(|n| n > crate::reader::KEYED_ROWS) {
            self.checked_for_calls()?;
        }
        let err = |e| self.read_error(e);
        visit_calls(&self.conn, self.call_source(), q, &err, visit)
    }

    /// Replays the calls `q` selects in return order (whatever `q.order`)
    /// into a state made by `init`, and returns it: the calls are read in
    /// the order they were stored and put in return order through a small
    /// buffer (`crate::return_order`), without SQLite sorting them; if the
    /// file's order is too far from it, the replay starts again from a
    /// fresh state on SQLite's sorted query. Either way `visit` sees
    /// exactly the calls and the order of a `StreamOrder::ByReturn` stream.
    pub fn replay_by_return<S, E: From<StoreError>>(
        &self,
        q: &CallQuery,
        init: impl Fn() -> S,
        mut visit: impl FnMut(&mut S, StoredCall) -> Result<(), E>,
    ) -> Result<S, E> {
        /// Why the buffered read stopped.
        enum Halt<E> {
            Visit(E),
            Disorder,
        }
        impl<E: From<StoreError>> From<StoreError> for Halt<E> {
            fn from(e: StoreError) -> Self {
                Halt::Visit(e.into())
            }
        }
        let by_id = CallQuery {
            order: StreamOrder::ById,
            ..q.clone()
        };
        let mut state = init();
        let mut buf = Reorder::new(REORDER_ROWS);
        // A large file's chunks read side by side (the same calls in order).
        let read = crate::split_read::for_each_call::<Halt<E>>(self, &by_id, |c| {
            let key = (c.call.end_ns(), c.call.ts_ns, c.id);
            match buf.push(key, c) {
                Ok(Some(ready)) => visit(&mut state, ready).map_err(Halt::Visit),
                Ok(None) => Ok(()),
                Err(OutOfOrder) => Err(Halt::Disorder),
            }
        });
        match read {
            Ok(()) => {
                while let Some(ready) = buf.pop() {
                    visit(&mut state, ready)?;
                }
                Ok(state)
            }
            Err(Halt::Visit(e)) => Err(e),
            Err(Halt::Disorder) => {
                drop(buf);
                let mut state = init();
                let sorted = CallQuery {
                    order: StreamOrder::ByReturn,
                    ..q.clone()
                };
                self.for_each_call::<E>(&sorted, |c| visit(&mut state, c))?;
                Ok(state)
            }
        }
    }

    /// Visits the waits (of one process or all) by `on_ns`, then row id,
    /// with their culprits and waker: the order of [`Trace::load`]'s waits.
    pub fn for_each_wait<E: From<StoreError>>(
        &self,
        pid: Option<u32>,
        visit: impl FnMut(WaitEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        self.for_each_wait_after(pid, None, visit)
    }

    /// [`Rows::for_each_wait`] in row order: no sort, for a caller to whom
    /// the order does not matter (`export --format pftrace`: trace_processor
    /// orders the events itself). SQLite's sort of the bench's 2.3M waits
    /// by `on_ns` is most of their read (1.9 s against 0.35 s in the sqlite3
    /// shell on the 2-vCPU development VM, round 37).
    pub fn for_each_wait_by_id<E: From<StoreError>>(
        &self,
        pid: Option<u32>,
        visit: impl FnMut(WaitEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        self.waits_where(pid, None, "w.id", visit)
    }

    /// [`Rows::for_each_wait`] of the waits back on CPU after `after_ns`
    /// (all without it): those that can overlap a call starting at or
    /// after it (a window's calls' culprits need no earlier wait).
    pub fn for_each_wait_after<E: From<StoreError>>(
        &self,
        pid: Option<u32>,
        after_ns: Option<u64>,
        visit: impl FnMut(WaitEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        self.waits_where(pid, after_ns, "w.on_ns, w.id", visit)
    }

    /// The valid waits of `pid` (all without it) back on CPU after
    /// `after_ns` (all without it), in `order`.
    fn waits_where<E: From<StoreError>>(
        &self,
        pid: Option<u32>,
        after_ns: Option<u64>,
        order: &str,
        mut visit: impl FnMut(WaitEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut tail = format!("WHERE {}", valid_wait("w."));
        let mut args: Vec<Value> = Vec::new();
        if let Some(p) = pid {
            args.push(Value::Integer(p.into()));
            tail.push_str(&format!(" AND w.pid = ?{}", args.len()));
        }
        if let Some(t) = after_ns {
            args.push(Value::Integer(i64::try_from(t).unwrap_or(i64::MAX)));
            tail.push_str(&format!(" AND w.on_ns > ?{}", args.len()));
        }
        tail.push_str(&format!(" ORDER BY {order}"));
        let conn = self.bulk()?;
        let sql = waits_sql(conn, &tail).map_err(|e| self.read_error(e))?;
        let mut st = conn.prepare(&sql).map_err(|e| self.read_error(e))?;
        let mut rows = st
            .query(rusqlite::params_from_iter(args.iter()))
            .map_err(|e| self.read_error(e))?;
        let mut culprits = self
            .conn
            .prepare_cached(crate::rows::WAIT_CULPRITS_SQL)
            .map_err(|e| self.read_error(e))?;
        while let Some(row) = rows.next().map_err(|e| self.read_error(e))? {
            if let Some(w) = wait_from_row(row, &mut culprits).map_err(|e| self.read_error(e))? {
                visit(w)?;
            }
        }
        Ok(())
    }

    /// The waits of process `pid` (or all) that overlap `[since_ns,
    /// until_ns)`, thread by thread (each in `on_ns` order): those that
    /// ended in the window, read as one range of the `(tid, on_ns)` index,
    /// and the one that began before its end and ended after it (a
    /// thread's waits do not overlap: the first to end after the window).
    /// The threads are listed by skipping through that index, one search
    /// per thread: a window reads its own waits, not the trace's.
    pub fn for_each_wait_in<E: From<StoreError>>(
        &self,
        pid: Option<u32>,
        since_ns: u64,
        until_ns: u64,
        mut visit: impl FnMut(WaitEvent) -> Result<(), E>,
    ) -> Result<(), E> {
        let conn = self.bulk()?;
        let tids: Vec<i64> = {
            let mut st = conn
                .prepare(
                    "WITH RECURSIVE t(tid) AS (SELECT min(tid) FROM waits \
                     UNION ALL SELECT (SELECT min(tid) FROM waits WHERE tid > t.tid) FROM t \
                     WHERE t.tid IS NOT NULL) SELECT tid FROM t WHERE tid IS NOT NULL",
                )
                .map_err(|e| self.read_error(e))?;
            let rows = st
                .query_map([], |r| r.get::<_, rusqlite::types::Value>(0))
                .map_err(|e| self.read_error(e))?;
            let mut tids = Vec::new();
            for v in rows {
                // A tid that is no integer (a damaged file) is no thread of ours.
                if let rusqlite::types::Value::Integer(t) = v.map_err(|e| self.read_error(e))? {
                    tids.push(t);
                }
            }
            tids
        };
        // `+w.pid`: the pid is checked, not searched, so SQLite reads the
        // thread's own index range.
        let base = format!(
            "WHERE {} AND (?1 IS NULL OR +w.pid = ?1) AND w.tid = ?2",
            valid_wait("w.")
        );
        let ended_in = waits_sql(
            conn,
            &format!("{base} AND w.on_ns >= ?3 AND w.on_ns < ?4 ORDER BY w.on_ns, w.id"),
        )
        .map_err(|e| self.read_error(e))?;
        let ends_after = waits_sql(
            conn,
            &format!("{base} AND w.on_ns >= ?3 ORDER BY w.on_ns, w.id LIMIT 1"),
        )
        .map_err(|e| self.read_error(e))?;
        let mut culprits = self
            .conn
            .prepare_cached(crate::rows::WAIT_CULPRITS_SQL)
            .map_err(|e| self.read_error(e))?;
        let (since, until) = (
            i64::try_from(since_ns).unwrap_or(i64::MAX),
            i64::try_from(until_ns).unwrap_or(i64::MAX),
        );
        for t in tids {
            for (sql, args) in [
                (&ended_in, rusqlite::params![pid, t, since, until]),
                (&ends_after, rusqlite::params![pid, t, until]),
            ] {
                let mut st = conn.prepare_cached(sql).map_err(|e| self.read_error(e))?;
                let mut rows = st.query(args).map_err(|e| self.read_error(e))?;
                while let Some(row) = rows.next().map_err(|e| self.read_error(e))? {
                    let w = wait_from_row(row, &mut culprits).map_err(|e| self.read_error(e))?;
                    if let Some(w) = w.filter(|w| w.off_ns < until_ns) {
                        visit(w)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Counts, first start and last end per process, thread, op and return
    /// value of every valid call row (all processes), by those keys: from
    /// the groups the writer stored when the trace ended
    /// (`crate::call_groups`), else from one pass over the call rows.
    /// Memory grows with the number of groups, not with the calls. A file
    /// whose valid durations or sizes add up past 2^62 is refused as
    /// damaged, as [`Trace::load`] refuses it (checked on the rows either
    /// way: a file changed after it was written must not slip past).
    pub fn call_groups(&self) -> Result<Vec<CallGroup>, StoreError> {
        if let Some(groups) =
            crate::call_groups::stored(&self.conn).map_err(|e| self.read_error(e))?
        {
            return Ok(groups);
        }
        let pass = crate::call_groups::compute(self.bulk()?).map_err(|e| self.read_error(e))?;
        if pass.dur_total > MAX_NS as f64 || pass.size_total > MAX_NS as f64 {
            return Err(StoreError::file(&self.path, TOTALS_OVERFLOW));
        }
        Ok(pass.groups)
    }

    /// Refuses a file whose valid calls' durations or sizes add up past
    /// 2^62, as [`Trace::load`] does (one pass inside SQLite, nothing held).
    pub fn check_totals(&self) -> Result<(), StoreError> {
        let (scan, _) =
            self.bulk
                .ensure_counts(&self.conn, &self.path, &self.budget, self.version)?;
        if scan.totals_overflow {
            return Err(StoreError::file(&self.path, TOTALS_OVERFLOW));
        }
        Ok(())
    }

    /// The (pid, tid) of every wait [`Trace::load`] reads (of one process or all).
    pub fn wait_threads(
        &self,
        pid: Option<u32>,
    ) -> Result<std::collections::BTreeSet<(u32, u32)>, StoreError> {
        let mut st = self
            .bulk()?
            .prepare(&format!(
                "SELECT DISTINCT w.pid, w.tid, w.kind FROM waits w WHERE {} AND (?1 IS NULL OR w.pid = ?1)",
                valid_wait("w.")
            ))
            .map_err(|e| self.read_error(e))?;
        let rows = st
            .query_map([pid], |r| {
                let kind: String = r.get(2)?;
                Ok(WaitKind::parse(&kind)
                    .map(|_| -> rusqlite::Result<(u32, u32)> { Ok((r.get(0)?, r.get(1)?)) }))
            })
            .map_err(|e| self.read_error(e))?;
        let mut out = std::collections::BTreeSet::new();
        for r in rows {
            if let Some(t) = r.map_err(|e| self.read_error(e))? {
                out.insert(t.map_err(|e| self.read_error(e))?);
            }
        }
        Ok(out)
    }

    /// How many waits and process lifecycle events [`Trace::load`] reads
    /// (of one process or all): the waits from the groups the writer stored
    /// when the trace ended (`crate::wait_groups`), else counted inside SQLite.
    pub fn event_counts(&self, pid: Option<u32>) -> Result<(u64, u64), StoreError> {
        let sum = |v: Vec<i64>| v.into_iter().map(|c| c.max(0) as u64).sum::<u64>();
        let procs = sum(self.per_known_proc_kind("count(*)", pid)?);
        let waits = match self.wait_groups(pid)? {
            Some(groups) => groups.iter().fold(0u64, |n, g| n.saturating_add(g.count)),
            None => sum(self.per_known_wait_kind("count(*)", pid)?),
        };
        Ok((waits, procs))
    }

    /// The earliest start of a wait (`off_ns`) or lifecycle event that
    /// [`Trace::load`] reads (of one process or all): with the calls' first
    /// start, what `TraceSpan::of` takes the origin of the extent from.
    /// Aggregates (or the stored wait groups); nothing held per row.
    pub fn earliest_wait_or_event(&self, pid: Option<u32>) -> Result<Option<u64>, StoreError> {
        let procs = self.per_known_proc_kind("min(ts_ns)", pid)?;
        let waits: Vec<i64> = match self.wait_groups(pid)? {
            Some(groups) => groups.iter().map(|g| g.first_off_ns as i64).collect(),
            None => self.per_known_wait_kind("min(w.off_ns)", pid)?,
        };
        Ok(waits
            .into_iter()
            .chain(procs)
            .map(|v| v.max(0) as u64)
            .min())
    }

    /// The latest end of each stored wait group (of one process or all),
    /// when the trace has them (`crate::wait_groups`).
    pub(crate) fn stored_wait_ends(
        &self,
        pid: Option<u32>,
    ) -> Result<Option<Vec<u64>>, StoreError> {
        crate::wait_groups::stored_ends(&self.conn, pid).map_err(|e| self.read_error(e))
    }

    /// The latest end (`on_ns`) of a wait [`Trace::load`] reads (of one
    /// process or all), by an aggregate over every wait row: for a file
    /// without stored ends nor a `(pid, on_ns)` index.
    pub(crate) fn latest_wait_by_scan(&self, pid: Option<u32>) -> Result<Option<u64>, StoreError> {
        let ends = self.per_known_wait_kind("max(w.on_ns)", pid)?;
        Ok(ends.into_iter().map(|v| v.max(0) as u64).max())
    }

    /// The stored wait groups (of one process or all), when the trace has them.
    fn wait_groups(
        &self,
        pid: Option<u32>,
    ) -> Result<Option<Vec<crate::wait_groups::WaitGroup>>, StoreError> {
        crate::wait_groups::stored(&self.conn, pid).map_err(|e| self.read_error(e))
    }

    /// `agg` over the valid waits [`Trace::load`] reads (of one process or
    /// all), one value per kind this build knows; NULL aggregates left out.
    fn per_known_wait_kind(&self, agg: &str, pid: Option<u32>) -> Result<Vec<i64>, StoreError> {
        let sql = format!(
            "SELECT w.kind, {agg} FROM waits w WHERE {} AND (?1 IS NULL OR w.pid = ?1) GROUP BY w.kind",
            valid_wait("w.")
        );
        self.per_kind(self.bulk()?, &sql, pid, &|k| WaitKind::parse(k).is_some())
    }

    /// `agg` over the lifecycle events [`Trace::load`] reads, one value per kind.
    fn per_known_proc_kind(&self, agg: &str, pid: Option<u32>) -> Result<Vec<i64>, StoreError> {
        let sql = format!(
            "SELECT kind, {agg} FROM proc_events WHERE (?1 IS NULL OR pid = ?1) \
             AND ts_ns BETWEEN 0 AND {MAX_NS} GROUP BY kind"
        );
        self.per_kind(&self.conn, &sql, pid, &|k| ProcKind::parse(k).is_some())
    }

    /// The values of a `SELECT kind, aggregate ... GROUP BY kind` of the kinds `known` accepts.
    fn per_kind(
        &self,
        conn: &Connection,
        sql: &str,
        pid: Option<u32>,
        known: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<i64>, StoreError> {
        let mut st = conn.prepare(sql).map_err(|e| self.read_error(e))?;
        let rows = st
            .query_map([pid], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?))
            })
            .map_err(|e| self.read_error(e))?;
        let mut out = Vec::new();
        for r in rows {
            let (kind, v) = r.map_err(|e| self.read_error(e))?;
            if let (true, Some(v)) = (known(&kind), v) {
                out.push(v);
            }
        }
        Ok(out)
    }

    /// Lifecycle events of one process in `[since, until)`, by time, as
    /// [`Trace::load`] reads them.
    pub fn proc_events_in(
        &self,
        pid: u32,
        since_ns: u64,
        until_ns: u64,
    ) -> Result<Vec<ProcEvent>, StoreError> {
        let mut st = self
            .conn
            .prepare(&format!(
                "SELECT {} FROM proc_events
                 WHERE pid = ?1 AND ts_ns BETWEEN 0 AND {MAX_NS} AND ts_ns >= ?2 AND ts_ns < ?3 ORDER BY ts_ns, id",
                crate::rows::proc_event_cols()
            ))
            .map_err(|e| self.read_error(e))?;
        let window = |v: u64| v.min(MAX_NS as u64 + 1) as i64;
        let rows = st
            .query_map(
                rusqlite::params![pid, window(since_ns), window(until_ns)],
                crate::rows::proc_event_from_row,
            )
            .map_err(|e| self.read_error(e))?;
        let mut out = Vec::new();
        for r in rows {
            out.extend(r.map_err(|e| self.read_error(e))?);
        }
        Ok(out)
    }
}

/// What [`visit_calls`] needs to know of the file it reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallSource {
    /// The schema version (which table holds the call rows).
    pub version: i64,
    /// `calls.stack_id` exists.
    pub has_stacks: bool,
    /// The copies' host pointers are read (`call_host_ptrs` is joined):
    /// not for a read of ops that copy nothing (only a copy has one), a
    /// join less per row (a fifth of a ledger replay's SQLite time).
    pub host_ptrs: bool,
}

/// Whether op `name` is a copy (its calls may carry a host pointer).
fn copies(name: &str) -> bool {
    sleuth_core::op_by_name(name).is_none_or(|i| i.class == sleuth_core::ops::OpClass::Copy)
}

impl CallSource {
    /// This source for query `q`: without the copies' host pointers when
    /// it reads no op that copies.
    fn for_query(self, q: &CallQuery) -> CallSource {
        CallSource {
            host_ptrs: self.host_ptrs
                && q.ops
                    .as_ref()
                    .is_none_or(|ops| ops.iter().any(|o| copies(o))),
            ..self
        }
    }

    /// The source of a file whose `calls` exist (the writer's own file at its end).
    pub(crate) fn of(conn: &Connection) -> rusqlite::Result<CallSource> {
        let version = crate::open::meta_value(conn, "schema_version")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        Ok(CallSource {
            version,
            has_stacks: has_column(conn, "calls", "stack_id")?,
            host_ptrs: true,
        })
    }
}

/// [`Rows::for_each_call`] on any connection, without the checks (the
/// caller made them, or reads the file it wrote itself): the one query
/// that streams calls, so the writer's end-of-trace rollups replay calls
/// exactly as the readers would.
pub(crate) fn visit_calls<E: From<StoreError>>(
    conn: &Connection,
    src: CallSource,
    q: &CallQuery,
    err: &dyn Fn(rusqlite::Error) -> StoreError,
    visit: impl FnMut(StoredCall) -> Result<(), E>,
) -> Result<(), E> {
    let src = src.for_query(q);
    if let Some(ids) = slowest_ids(conn, src, q).map_err(err)? {
        // The slowest calls, fetched by id, in the same order.
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        let cond = format!("calls.id IN ({})", list.join(", "));
        let sql = select_sql(conn, src, &[cond], q.order, None, "calls", "op").map_err(err)?;
        return run_select(conn, &sql, &[], None, err, visit);
    }
    let st = call_statement(conn, src, q, false).map_err(err)?;
    run_select(conn, &st.sql, &st.args, st.op_ids.as_ref(), err, visit)
}

/// A call query as one statement (any but the slowest calls' page,
/// `slowest_ids`): what [`visit_calls`] runs.
pub(crate) struct CallStatement {
    pub(crate) sql: String,
    /// The same rows as `(id, ts_ns, op)` in the same order, without the
    /// statement's limit.
    pub(crate) keys_sql: String,
    /// With the ops of the file by id where both statements read a row's
    /// op as its id in `ops`, not its name (rows whose id `ops` lacks are
    /// among them: skip them, as the `calls` view's join leaves them out).
    pub(crate) op_ids: Option<OpIds>,
    /// Whether the rows are kept to the writer's blocks that can hold them
    /// (`call_blocks`), read by id without an index.
    pub(crate) in_blocks: bool,
    args: Vec<Value>,
    /// With an id range to set (`call_statement`'s `ranged`): the
    /// positions in `args` of its first and last id.
    range: Option<(usize, usize)>,
}

impl CallStatement {
    pub(crate) fn args(&self) -> &[Value] {
        &self.args
    }

    /// The statement's arguments with its id range set to `[first, last]`.
    pub(crate) fn args_for(&self, first: i64, last: i64) -> Vec<Value> {
        let mut args = self.args.clone();
        if let Some((a, b)) = self.range {
            args[a] = Value::Integer(first);
            args[b] = Value::Integer(last);
        }
        args
    }
}

/// The statement of query `q` (not a slowest-calls page); with `ranged`,
/// its rows also keep to an id range set per run ([`CallStatement::args_for`]).
pub(crate) fn call_statement(
    conn: &Connection,
    src: CallSource,
    q: &CallQuery,
    ranged: bool,
) -> rusqlite::Result<CallStatement> {
    let src = src.for_query(q);
    let mut conds = vec![valid_call("calls.")];
    let mut args: Vec<Value> = Vec::new();
    if let Some(pid) = q.pid {
        args.push(Value::Integer(pid as i64));
        conds.push(format!("calls.pid = ?{}", args.len()));
    }
    // Version 2 on: the rows straight from `call_rows` with their op's id,
    // no join of `ops` per row (the bench's 10M-call trace read whole:
    // 5.7-6.0 -> 4.1 s in the sqlite3 shell; `stats` of 10 s of it 2.1-2.3
    // -> 1.9-2.0 s, round 41); the ids are named once from `ops` (`OpIds`),
    // the rows whose id it lacks skipped as the join leaves them out. Ops
    // asked for by name keep to their ids in the source itself
    // (`rows_source`).
    let by_op_id = src.version >= 2;
    let mut op_marks = None;
    if let Some(ops) = &q.ops {
        let mut marks = Vec::with_capacity(ops.len());
        for op in ops {
            args.push(Value::Text((*op).to_string()));
            marks.push(format!("?{}", args.len()));
        }
        let marks = marks.join(", ");
        if !by_op_id {
            conds.push(format!("calls.op IN ({marks})"));
        }
        op_marks = Some(marks);
    }
    if let Some(t) = q.returned_by {
        // Valid rows' times and durations are at most 2^62: the sum cannot overflow.
        args.push(Value::Integer(i64::try_from(t).unwrap_or(i64::MAX)));
        conds.push(format!("calls.ts_ns + calls.dur_ns <= ?{}", args.len()));
    }
    if let Some(t) = q.returned_after {
        args.push(Value::Integer(i64::try_from(t).unwrap_or(i64::MAX)));
        conds.push(format!("calls.ts_ns + calls.dur_ns > ?{}", args.len()));
    }
    if let Some(id) = q.from_id {
        args.push(Value::Integer(id));
        conds.push(format!("calls.id >= ?{}", args.len()));
    }
    let windowed = q.since_ns.is_some() || q.until_ns.is_some();
    // A file still being written (no call groups, no call-row index yet):
    // a window or a few ops read the ids of the writer's blocks that can
    // hold their calls (`call_blocks`), not every row.
    // A window read by row id (in chunks side by side: `split_read`) keeps
    // to the writer's blocks too, in a finished file as well: through the
    // `(tid, ts_ns)` index SQLite would sort each chunk's rows by id (and
    // seek each row from the index: ten seconds of the bench's 10M-call
    // trace, its 2M calls counted in the sqlite3 shell, 0.95 s through the
    // index, 0.47 s from the blocks' id range: round 43).
    let window_by_id = windowed && q.order == StreamOrder::ById;
    let tids = match (windowed, &q.tids) {
        (true, _) => window_tids(conn, q.pid, "calls.")?,
        (false, Some(tids)) => Some(tids_in(tids, "calls.")),
        (false, None) => None,
    };
    // A process's threads: their index, never a scan of every row, nor the
    // ops' index (SQLite weighs an op list above a thread list).
    let by_tids = !windowed && q.tids.is_some();
    let unindexed = match windowed {
        // The threads (from the stored call groups) name the index ranges.
        true => tids.is_none() || window_by_id,
        // The op index finds a few ops' rows where the file has it (the
        // writer's completion builds it before its own reads of them).
        false => q.ops.is_some() && !has_index(conn, "call_rows_op_dur")?,
    };
    let mut in_blocks = false;
    if unindexed {
        let window = (q.since_ns, q.until_ns);
        let ops = q.ops.as_deref();
        let blocks = crate::call_blocks::restrict(conn, ops, window, "calls.id", &mut args);
        if let Some(c) = blocks? {
            conds.push(c);
            in_blocks = true;
        }
    }
    // Where the blocks cannot say, the threads' index ranges.
    if let (false, Some(tids)) = (in_blocks, tids) {
        conds.push(tids);
    }
    // A moment (the ledger at `--at`): a call that returned by it started
    // by it, so only the blocks that start by then can hold one. Without
    // this a moment early in a 10M-call file scanned every row after it.
    if let (Some(t), false, false) = (q.returned_by, windowed, in_blocks) {
        let (ops, until) = (q.ops.as_deref(), Some(t.saturating_add(1)));
        let window = (None, until);
        let blocks =
            crate::call_blocks::restrict_from(conn, ops, window, q.from_id, "calls.id", &mut args);
        if let Some(c) = blocks? {
            conds.push(c);
        }
    }
    for (bound, op) in [(q.since_ns, ">="), (q.until_ns, "<")] {
        if let Some(t) = bound {
            args.push(Value::Integer(i64::try_from(t).unwrap_or(i64::MAX)));
            conds.push(format!("calls.ts_ns {op} ?{}", args.len()));
        }
    }
    // In blocks: the rows by id, in row order (`scan_table`'s count of an
    // op's rows would itself read every row without the op index).
    // From a first id: the rows from it on, by id (an index of the ops
    // would read the file's every memory call to keep those past it).
    let by_id = in_blocks || q.from_id.is_some();
    let scan_rows =
        !windowed && !by_tids && src.version >= 2 && (by_id || scan_table(conn, src.version, q)?);
    let source = match by_op_id {
        true => rows_source(scan_rows, by_tids, src.has_stacks, op_marks.as_deref()),
        false => source_of(src.version, scan_rows, op_marks.as_deref()),
    };
    let op_col = if by_op_id { "op_id" } else { "op" };
    let range = ranged.then(|| {
        args.push(Value::Integer(i64::MIN));
        args.push(Value::Integer(i64::MAX));
        let (a, b) = (args.len() - 2, args.len() - 1);
        conds.push(format!("calls.id BETWEEN ?{} AND ?{}", a + 1, b + 1));
        (a, b)
    });
    let sql = select_sql(conn, src, &conds, q.order, q.limit, &source, op_col)?;
    // The same rows, their id, start and op alone (no limit here: a keys
    // pass reads whole streams, `crate::start_order`).
    let keys_sql = format!(
        "SELECT calls.id, calls.ts_ns, calls.{op_col} FROM {source} WHERE {}{}",
        conds.join(" AND "),
        order_sql(q.order)
    );
    let op_ids = match by_op_id {
        true => Some(OpIds::of(conn)?),
        false => None,
    };
    Ok(CallStatement {
        sql,
        keys_sql,
        op_ids,
        in_blocks,
        args,
        range,
    })
}

/// `{prefix}tid IN (...)`: the threads of process `pid` (or all) that have
/// calls, from the stored call groups; None without them.
pub(crate) fn window_tids(
    conn: &Connection,
    pid: Option<u32>,
    prefix: &str,
) -> rusqlite::Result<Option<String>> {
    let Some(groups) = crate::call_groups::stored(conn)? else {
        return Ok(None);
    };
    let mut tids: Vec<u32> = groups
        .iter()
        .filter(|g| pid.is_none_or(|p| g.pid == p))
        .map(|g| g.tid)
        .collect();
    tids.sort_unstable();
    tids.dedup();
    Ok(Some(tids_in(&tids, prefix)))
}

/// `{prefix}tid IN (...)` of `tids`.
fn tids_in(tids: &[u32], prefix: &str) -> String {
    let list: Vec<String> = tids.iter().map(u32::to_string).collect();
    format!("{prefix}tid IN ({})", list.join(", "))
}

/// The memory calls of the file the writer is finishing (of process
/// `pid`, all when None), in `order`: the readers' own stream (so the
/// end-of-trace rollups replay calls as readers would), with SQLite's
/// errors as they are.
pub(crate) fn visit_own_memory_calls(
    conn: &Connection,
    pid: Option<u32>,
    order: StreamOrder,
    mut visit: impl FnMut(&sleuth_core::CallEvent, i64),
) -> rusqlite::Result<()> {
    let q = memory_calls_of(pid, order, None);
    let sqlite = |source| StoreError::Sqlite {
        path: PathBuf::new(),
        source,
    };
    visit_calls::<StoreError>(conn, CallSource::of(conn)?, &q, &sqlite, |c| {
        visit(&c.call, c.id);
        Ok(())
    })
    .map_err(own_error)
}

/// A read error of the file the writer is finishing, as SQLite's error its
/// completion returns: SQLite's own as it is, any other in words.
pub(crate) fn own_error(e: StoreError) -> rusqlite::Error {
    match e {
        StoreError::Sqlite { source, .. } => source,
        other => rusqlite::Error::ToSqlConversionFailure(other.to_string().into()),
    }
}

/// Visits the calls of `source` (the `calls` view or its row-order twin)
/// The statement that selects the calls of `source` (the `calls` view or
/// its row-order twin) meeting every condition, in `order`, at most
/// `limit` of them: the columns [`run_select`] reads.
fn select_sql(
    conn: &Connection,
    src: CallSource,
    conds: &[String],
    order: StreamOrder,
    limit: Option<usize>,
    source: &str,
    op_col: &str,
) -> rusqlite::Result<String> {
    let order = order_sql(order);
    let limit = limit
        .map(|l| format!(" LIMIT {}", l.min(i64::MAX as usize)))
        .unwrap_or_default();
    let (host, join) = match src.host_ptrs {
        true => crate::rows::host_ptr_join(conn)?,
        false => ("NULL", ""),
    };
    let stack = if src.has_stacks {
        "calls.stack_id"
    } else {
        "NULL"
    };
    Ok(format!(
        "SELECT {}, {host}, {stack} FROM {source} {join} WHERE {}{order}{limit}",
        call_columns(op_col),
        conds.join(" AND ")
    ))
}

/// The `ORDER BY` of `order` (empty for [`StreamOrder::AsFound`]).
fn order_sql(order: StreamOrder) -> &'static str {
    match order {
        StreamOrder::ByStart => " ORDER BY calls.ts_ns, calls.id",
        StreamOrder::ByReturn => " ORDER BY calls.ts_ns + calls.dur_ns, calls.ts_ns, calls.id",
        StreamOrder::ByDurationDesc => " ORDER BY calls.dur_ns DESC, calls.id",
        StreamOrder::ById => " ORDER BY calls.id",
        StreamOrder::AsFound => "",
    }
}

/// Visits the calls statement `sql` (of [`select_sql`]) selects with
/// `args`; `op_ids` where it reads ops by id ([`CallStatement::op_ids`]).
pub(crate) fn run_select<E: From<StoreError>>(
    conn: &Connection,
    sql: &str,
    args: &[Value],
    op_ids: Option<&OpIds>,
    err: &dyn Fn(rusqlite::Error) -> StoreError,
    mut visit: impl FnMut(StoredCall) -> Result<(), E>,
) -> Result<(), E> {
    let mut st = conn.prepare_cached(sql).map_err(err)?;
    let mut rows = st
        .query(rusqlite::params_from_iter(args.iter()))
        .map_err(err)?;
    let op_column = op_ids.map_or(OpColumn::Name, OpColumn::Id);
    while let Some(row) = rows.next().map_err(err)? {
        let Some(mut c) = op_column.call(row).map_err(err)? else {
            continue;
        };
        c.call.stack_id = row
            .get::<_, Option<i64>>(16)
            .map_err(err)?
            .map(|v| v as u64);
        visit(c)?;
    }
    Ok(())
}

/// The ids of the slowest `q.limit` calls (version 2), read through the
/// `(op_id, dur_ns)` index one op at a time and merged: the calls of one
/// query over the `calls` view in the same order (duration, then row id).
/// That query joins each row to its op name first, so SQLite sorts every
/// row of the ops it reads (5 s for one op of 625,000 calls, over 30 s for
/// all ops of a 10M-call file); the index read stops after `limit` rows per
/// op. None for other orders, without a limit, and for version 1.
fn slowest_ids(
    conn: &Connection,
    src: CallSource,
    q: &CallQuery,
) -> rusqlite::Result<Option<Vec<i64>>> {
    let Some(limit) = q.limit else {
        return Ok(None);
    };
    if q.order != StreamOrder::ByDurationDesc || src.version < 2 || q.returned_by.is_some() {
        return Ok(None);
    }
    // The op ids of the ops asked for (all this build knows when None).
    let mut ids: Vec<i64> = Vec::new();
    let mut st = conn.prepare("SELECT id, op FROM ops")?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let name = r.get_ref(1)?.as_str()?;
        let wanted = match &q.ops {
            Some(ops) => ops.contains(&name),
            None => sleuth_core::op_by_name(name).is_some(),
        };
        if wanted {
            ids.push(r.get(0)?);
        }
    }
    let pid = q.pid.map(|p| format!(" AND pid = {p}")).unwrap_or_default();
    let n = limit.min(i64::MAX as usize);
    let mut st = conn.prepare(&format!(
        "SELECT dur_ns, id FROM call_rows WHERE op_id = ?1 AND {}{pid} \
         ORDER BY dur_ns DESC, id LIMIT {n}",
        valid_call("")
    ))?;
    let mut found: Vec<(i64, i64)> = Vec::new();
    for op in ids {
        let rows = st.query_map([op], |r| Ok((r.get(0)?, r.get(1)?)))?;
        for r in rows {
            found.push(r?);
        }
    }
    found.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    found.truncate(limit);
    Ok(Some(found.into_iter().map(|(_, id)| id).collect()))
}

/// Whether `q` reads faster by scanning the call rows in row order than
/// through the `(op_id, dur_ns)` index. SQLite picks the index for any op
/// filter; for ops with many calls (the memory calls of a long trace:
/// 1.5 million of 10 million) that fetches every row by id in duration
/// order, one random page read each, and a command spends most of its
/// time copying pages in (issue 16: 15 s CPU against 3 s for the scan on
/// a 10M-call trace). Version 2 only (version 1 reads `calls` as
/// before); the slowest-first order keeps the index (it reads `limit`
/// rows). The index counts the matching rows (covering: no row read):
/// above 1 in 32 of all rows, the scan wins. Without an op filter every
/// row is read, and SQLite still drove the join to `ops` through that
/// index (one random page read per row, then the sort): the scan read a
/// 1M-call file in 1.6 s against 2.8–3.7 s.
fn scan_table(conn: &Connection, version: i64, q: &CallQuery) -> rusqlite::Result<bool> {
    if version < 2 || q.order == StreamOrder::ByDurationDesc {
        return Ok(false);
    }
    let Some(ops) = &q.ops else {
        return Ok(true);
    };
    if ops.is_empty() {
        return Ok(false);
    }
    let marks: Vec<String> = (1..=ops.len()).map(|i| format!("?{i}")).collect();
    let sql = format!(
        "SELECT (SELECT count(*) FROM call_rows WHERE op_id IN (SELECT id FROM ops WHERE op IN ({}))), \
                (SELECT coalesce(max(id), 0) FROM call_rows)",
        marks.join(", ")
    );
    let (matching, last): (i64, i64) =
        conn.query_row(&sql, rusqlite::params_from_iter(ops.iter()), |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    Ok(matching.saturating_mul(32) > last)
}

/// What to read the calls of `ops` from (every process, in any order but
/// slowest-first): the view's rows of those ops through the op index
/// ([`ops_searched_calls`]), or its row-order twin when many rows match
/// ([`scan_table`]). For queries of their own over the calls of
/// some ops (the end-of-trace finding rollups).
pub(crate) fn calls_source_for_ops(
    conn: &Connection,
    ops: Vec<&'static str>,
) -> rusqlite::Result<String> {
    Ok(calls_source_for_ops_scanned(conn, ops)?.0)
}

/// [`calls_source_for_ops`], and whether it scans the rows in row order
/// (else their order is the op index's).
pub(crate) fn calls_source_for_ops_scanned(
    conn: &Connection,
    ops: Vec<&'static str>,
) -> rusqlite::Result<(String, bool)> {
    let names = quoted_names(&ops);
    let q = CallQuery {
        ops: Some(ops),
        order: StreamOrder::ByReturn,
        ..Default::default()
    };
    let version = CallSource::of(conn)?.version;
    let scan_rows = scan_table(conn, version, &q)?;
    let source = source_of(version, scan_rows, Some(&names));
    Ok((source, scan_rows))
}

/// Op names as a list of SQL string literals ("'a', 'b'").
pub(crate) fn quoted_names(ops: &[&str]) -> String {
    let names: Vec<String> = ops
        .iter()
        .map(|n| format!("'{}'", n.replace('\'', "''")))
        .collect();
    names.join(", ")
}

/// What a read of the calls (of the ops in `marks`, SQL parameters or
/// quoted names, when given) reads from: in version 2 the rows of those
/// ops, through the op index ([`ops_searched_calls`]) or with `scan_rows`
/// in row order ([`ops_scanned_calls`]); else the row-order twin with
/// `scan_rows`, else the `calls` view.
fn source_of(version: i64, scan_rows: bool, marks: Option<&str>) -> String {
    match marks {
        Some(marks) if version >= 2 => {
            let of_ops = match scan_rows {
                true => ops_scanned_calls(marks),
                false => ops_searched_calls(marks),
            };
            of_ops.unwrap_or_else(|| calls_source(scan_rows))
        }
        _ => calls_source(scan_rows),
    }
}

/// The `calls` view, or with `scan_rows` its row-order twin
/// ([`table_scan_calls`]; the view when its text is not the expected shape).
pub(crate) fn calls_source(scan_rows: bool) -> String {
    match scan_rows.then(table_scan_calls).flatten() {
        Some(subquery) => subquery,
        None => "calls".to_string(),
    }
}

/// `SELECT <call columns, the op as its id, the copy's host pointer> FROM
/// <the calls of `call_rows`> <tail>`: the rows of `rows::calls_sql_from` over
/// the `calls` view, for [`OpColumn::Id`], without the view's join of
/// `ops` per row (a window's threads read for its explanation: round 43).
/// With `stacks`, the calls' `stack_id` as column 16 (a file whose rows have it).
pub(crate) fn calls_sql_by_op_id(
    conn: &Connection,
    tail: &str,
    stacks: bool,
) -> rusqlite::Result<String> {
    let (host, join) = crate::rows::host_ptr_join(conn)?;
    Ok(rows_by_op_id_sql(host, &format!("{join} {tail}"), stacks))
}

/// `SELECT <call columns, the op as its id>, <host>[, stack_id] FROM <the
/// calls of `call_rows`> <tail>`.
fn rows_by_op_id_sql(host: &str, tail: &str, stacks: bool) -> String {
    let stack = if stacks { ", calls.stack_id" } else { "" };
    format!(
        "SELECT {}, {host}{stack} FROM {} {tail}",
        call_columns("op_id"),
        rows_source(false, false, stacks, None)
    )
}

/// `SELECT <call columns, the op as its id> FROM <the calls of `call_rows`>
/// <tail>`: rows for `rows::call_from_row_by_op_id` of a file of this
/// build's schema (the completion's pass over each thread's calls), without
/// the `calls` view's join of `ops` per row, and without the copies' host
/// pointers (`host_ptr` None): a join less per row, for a pass that judges
/// no copy (the finding rollups' replay judges them, and their example
/// calls are read again by id).
pub(crate) fn own_calls_sql_by_op_id(tail: &str) -> String {
    rows_by_op_id_sql("NULL", tail, false)
}

/// [`CALL_COLS`] of the source `calls`, its op read as `op_col` (`op`, the
/// view's name, or `op_id`).
fn call_columns(op_col: &str) -> String {
    let cols: Vec<String> = CALL_COLS
        .split(", ")
        .map(|c| match c {
            "op" => format!("calls.{op_col}"),
            c => format!("calls.{c}"),
        })
        .collect();
    cols.join(", ")
}

/// The `calls` view's columns without the join of `ops` (no `layer`, no
/// `op`) and the op's id, straight from `call_rows`: the source of a read
/// that names ops by id (`call_statement`). With `scan_rows`, in row order,
/// as [`table_scan_calls`]; with `marks` (SQL parameters naming ops), the
/// rows of those ops alone, by their ids in `ops` (through the `(op_id,
/// dur_ns)` index where SQLite takes it, as [`ops_searched_calls`]).
fn rows_source(scan_rows: bool, by_tids: bool, has_stacks: bool, marks: Option<&str>) -> String {
    let not_indexed = if scan_rows { " NOT INDEXED" } else { "" };
    // `+`: the op filter takes no index, the threads' does.
    let op_id = if by_tids { "+c.op_id" } else { "c.op_id" };
    let stack = if has_stacks {
        ", c.stack_id AS stack_id"
    } else {
        ""
    };
    let of_ops = marks
        .map(|m| format!(" WHERE {op_id} IN (SELECT id FROM ops WHERE op IN ({m}))"))
        .unwrap_or_default();
    format!(
        "(SELECT c.id AS id, c.ts_ns AS ts_ns, c.dur_ns AS dur_ns, c.pid AS pid, c.tid AS tid, \
         c.op_id AS op_id, c.ret AS ret, c.size AS size, c.ptr AS ptr, c.stream AS stream, \
         c.kind AS kind, c.nested AS nested, c.runnable_ns AS runnable_ns, \
         c.blocked_ns AS blocked_ns, c.cpu AS cpu{stack} FROM call_rows c{not_indexed}{of_ops}) \
         AS calls"
    )
}

/// The `calls` view of version 2 as a subquery whose `call_rows` is read
/// in row order, never through an index (see [`Rows::scan_table`]): the
/// same rows and columns as the view (`schema::CALLS_VIEW`), so the same
/// answers. None if the view's text is not the expected shape.
fn table_scan_calls() -> Option<String> {
    let select = crate::schema::CALLS_VIEW.strip_prefix("CREATE VIEW calls AS")?;
    let from = "FROM call_rows c JOIN ops o";
    if !select.contains(from) {
        return None;
    }
    Some(format!(
        "({}) AS calls",
        select.replace(from, "FROM call_rows c NOT INDEXED JOIN ops o")
    ))
}

/// The `calls` view of version 2 as a subquery that reads only the rows
/// of the ops named by `marks` (SQL parameters "?1, ?2" or quoted names), each op's
/// rows found through the `(op_id, dur_ns)` index. On the view itself
/// SQLite filters by the name of the joined op, so it walks that whole
/// index and joins every entry to `ops` (0.7–2 s per stream of a
/// 1.6M-call trace without a single matching row: the end-of-trace ledger
/// and site rollups of a launch flood paid it five times). With the ids
/// asked for first it searches the index op by op. The same rows and
/// columns as the view; None if the view's text is not the expected shape.
pub(crate) fn ops_searched_calls(marks: &str) -> Option<String> {
    let select = crate::schema::CALLS_VIEW.strip_prefix("CREATE VIEW calls AS")?;
    let from = "FROM call_rows c JOIN ops o ON o.id = c.op_id";
    if !select.trim_end().ends_with(from) {
        return None;
    }
    Some(format!(
        "({} WHERE c.op_id IN (SELECT id FROM ops WHERE op IN ({marks}))) AS calls",
        select.trim_end()
    ))
}

/// The row-order twin of the `calls` view ([`table_scan_calls`]) that
/// keeps only the rows of the ops named by `marks` (as for
/// [`ops_searched_calls`]) by their op id, before each row is joined to
/// its op: on the twin itself SQLite joins every row to `ops` and compares
/// its op's name with each asked for (a 10M-call file: 1.0–1.1 s against
/// 0.7–0.8 s for the memory calls, counted through Python's `sqlite3`
/// under load). The same rows and columns as the view; None if the
/// view's text is not the expected shape.
fn ops_scanned_calls(marks: &str) -> Option<String> {
    let twin = table_scan_calls()?;
    let inner = twin.strip_suffix(") AS calls")?;
    Some(format!(
        "{inner} WHERE c.op_id IN (SELECT id FROM ops WHERE op IN ({marks}))) AS calls"
    ))
}

/// The span `TraceSpan::of` gives a loaded trace (of `pid`, or all), from
/// the session times and the calls' groups: start and end only (the extent
/// equals them; no answer built on this reads it).
pub fn call_span(
    start_ns: Option<u64>,
    end_ns: Option<u64>,
    groups: &[CallGroup],
    pid: Option<u32>,
) -> sleuth_core::TraceSpan {
    let mine = groups.iter().filter(|g| pid.is_none_or(|p| g.pid == p));
    let first = mine.clone().map(|g| g.first_ts_ns).min();
    let last = mine.map(|g| g.last_end_ns).max();
    let start_ns = start_ns.or(first).unwrap_or(0);
    let end_ns = end_ns.or(last).unwrap_or(start_ns).max(start_ns);
    sleuth_core::TraceSpan {
        start_ns,
        end_ns,
        origin_ns: start_ns,
        extent_end_ns: end_ns,
    }
}

/// The calibration of each view the writer stored at the end (none when
/// it stored none): every moment's, as the calibration reads every step.
fn calibrations_of(
    stored: Option<&sleuth_core::allocator::KnownViews>,
) -> std::collections::BTreeMap<u32, sleuth_core::allocator::Calibration> {
    stored.map_or_else(Default::default, |known| {
        known
            .end()
            .iter()
            .map(|(&pid, v)| (pid, v.calibration.clone()))
            .collect()
    })
}

/// What a ledger pass at a moment feeds the allocator views with
/// ([`MemoryTrace::rebuild_plan`]).
struct RebuildPlan {
    /// The allocator events' page query (`crate::step_feed::page_query`).
    pages: crate::allocator_raw::RowsQuery,
    calibrations: std::collections::BTreeMap<u32, sleuth_core::allocator::Calibration>,
}

impl RebuildPlan {
    /// A fresh feed of a replay per process whose calibration has a layout
    /// (a pass that starts again starts from one too).
    fn feed<'a>(
        &self,
        conn: &'a Connection,
    ) -> crate::step_feed::StepFeed<'a, sleuth_core::allocator::Rebuilder> {
        self.feed_from(conn, &std::collections::BTreeMap::new())
    }

    /// [`Self::feed`], the processes of `taken_up` continuing the replays
    /// taken up from checkpoints (each from its allocator rows after the
    /// position given).
    fn feed_from<'a>(
        &self,
        conn: &'a Connection,
        taken_up: &std::collections::BTreeMap<
            u32,
            (sleuth_core::allocator::Rebuilder, crate::step_feed::RowPos),
        >,
    ) -> crate::step_feed::StepFeed<'a, sleuth_core::allocator::Rebuilder> {
        let sinks = self
            .calibrations
            .iter()
            .filter_map(|(&pid, cal)| {
                let layout = cal.layout()?;
                let fresh = || {
                    (
                        sleuth_core::allocator::Rebuilder::new(layout),
                        crate::step_feed::START,
                    )
                };
                Some((pid, taken_up.get(&pid).cloned().unwrap_or_else(fresh)))
            })
            .collect();
        crate::step_feed::StepFeed::resumed(conn, self.pages.clone(), sinks)
    }
}

/// What a pass at a moment takes up from the file's allocator checkpoints
/// (`crate::allocator_checkpoints`): the ledger of the processes taken up,
/// each one's replay and allocator row position, and the calls still to
/// read ([`Resumed::fresh`]: every process from the file's start).
struct Resumed {
    ledger: sleuth_core::ledger::LedgerBuilder,
    replays: std::collections::BTreeMap<
        u32,
        (sleuth_core::allocator::Rebuilder, crate::step_feed::RowPos),
    >,
    /// Each process taken up: its checkpoint's time (its calls that
    /// returned by then are in the state).
    after: std::collections::BTreeMap<u32, u64>,
    /// The read's bounds: calls that returned after the earliest
    /// checkpoint's time, from the lowest first id (None: from the start).
    returned_after: Option<u64>,
    from_id: Option<i64>,
}

impl Resumed {
    /// Every process from the file's start, its ledger at `at_ns` (the
    /// end when None).
    fn fresh(at_ns: Option<u64>) -> Resumed {
        Resumed {
            ledger: sleuth_core::ledger::LedgerBuilder::new(Some(at_ns.unwrap_or(u64::MAX))),
            replays: Default::default(),
            after: Default::default(),
            returned_after: None,
            from_id: None,
        }
    }
}

/// A trace opened for memory answers without loading its calls: the ledger
/// is replayed from the memory calls streamed from the store in return
/// order, so memory grows with what is live, not with the trace.
pub struct MemoryTrace {
    /// The trace without calls, waits and allocator events: session times,
    /// processes, NVML samples, counters and stacks, as [`Trace::load`]
    /// would give them for `pid` ([`Self::load_allocator_calls`] adds the
    /// allocator events).
    pub base: sleuth_core::TraceData,
    /// The span `TraceSpan::of` gives the loaded trace.
    pub span: sleuth_core::TraceSpan,
    /// The call groups of every process (see [`Rows::call_groups`]).
    pub groups: Vec<CallGroup>,
    /// Every process the loaded trace has a call or a counted call of.
    pids: std::collections::BTreeSet<u32>,
    /// The processes with allocator events (`trace --torch-allocator`), of
    /// `pid` when given: the events themselves stay in the file.
    block_pids: Vec<u32>,
    pid: Option<u32>,
    rows: Rows,
    /// What the last streamed ledger pass kept for the by-site table:
    /// `sites_streamed` at the same moment takes it instead of a pass.
    site_pass: std::cell::RefCell<Option<SitePass>>,
    /// The allocator replays the last ledger pass at a moment fed:
    /// `allocator_views` at the same moment takes them instead of a pass.
    rebuilt: std::cell::RefCell<Option<Rebuilt>>,
}

/// The allocator replays of one ledger pass at a moment (`at_ns`), with
/// the calibrations (the writer's) they were fed by.
struct Rebuilt {
    at_ns: u64,
    calibrations: std::collections::BTreeMap<u32, sleuth_core::allocator::Calibration>,
    /// The replays, or why the feed failed (the allocator views' answer:
    /// the ledgers read no allocator event and stand).
    replays: Result<std::collections::BTreeMap<u32, sleuth_core::allocator::Rebuilder>, StoreError>,
}

/// The memory calls of process `pid` (all without one) in `order`, those
/// that returned by `returned_by` when given: what a ledger replays.
pub(crate) fn memory_calls_of(
    pid: Option<u32>,
    order: StreamOrder,
    returned_by: Option<u64>,
) -> CallQuery {
    CallQuery {
        pid,
        ops: Some(sleuth_core::ledger::memory_op_names()),
        order,
        returned_by,
        ..Default::default()
    }
}

/// What one replay of the memory calls up to a moment (all when None)
/// gives the by-site table besides the ledgers: the allocations tallied by
/// site, and what each process had live per site at its peak.
struct SitePass {
    at_ns: Option<u64>,
    tally: SiteTally,
    at_peak: std::collections::BTreeMap<u32, sleuth_core::ledger::LiveByStack>,
}

/// Device allocations summed per (stack, failed), each key remembering the
/// first call (start time, row id) that made it: the order
/// `sites::memory_by_site_of` needs (the first stack of a label is its
/// example) whatever order the calls come in, so the ledger's pass in
/// return order can tally them too.
#[derive(Debug, Default, Clone)]
pub struct SiteTally(std::collections::HashMap<(Option<u64>, bool), (FirstCall, AllocTally)>);

/// A call's start time and row id: the order of the start-order pass.
type FirstCall = (u64, i64);

/// One stored [`SiteTally`] entry (`SiteTally::entries`).
pub(crate) type TallyEntry = (Option<u64>, bool, u64, i64, u64, u64);

impl SiteTally {
    pub(crate) fn add(&mut self, c: &sleuth_core::CallEvent, id: i64) {
        let Some(t) = AllocTally::of(c) else {
            return;
        };
        self.merge((c.ts_ns, id), t);
    }

    /// Adds `t` to its site's entry: the earlier first call, the sums.
    fn merge(&mut self, first: FirstCall, t: AllocTally) {
        match self.0.get_mut(&(t.stack_id, t.failed)) {
            Some((at, sum)) => {
                *at = (*at).min(first);
                sum.count = sum.count.saturating_add(t.count);
                sum.bytes = sum.bytes.saturating_add(t.bytes);
            }
            None => {
                self.0.insert((t.stack_id, t.failed), (first, t));
            }
        }
    }

    /// The entries, to be stored: stack, failed, the first call's start
    /// and row id, count, bytes (in key order).
    pub(crate) fn entries(&self) -> Vec<TallyEntry> {
        let mut v: Vec<TallyEntry> = self
            .0
            .iter()
            .map(|(&(stack, failed), &((ts, id), t))| (stack, failed, ts, id, t.count, t.bytes))
            .collect();
        v.sort_unstable();
        v
    }

    /// Adds stored entries (another process's, or the same keys again):
    /// the earlier first call, the sums. Counts past 2^62 are refused (no
    /// trace holds them; the sums below must not overflow).
    pub(crate) fn add_entries(&mut self, entries: Vec<TallyEntry>) -> Result<(), String> {
        for (stack, failed, ts, id, count, bytes) in entries {
            if count > 1 << 62 {
                return Err(format!("a count no trace holds ({count})"));
            }
            let t = AllocTally {
                stack_id: stack,
                failed,
                count,
                bytes,
            };
            self.merge((ts, id), t);
        }
        Ok(())
    }

    /// Distinct entries held.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The tallies in the order of their first calls' starts.
    pub(crate) fn in_start_order(self) -> Vec<AllocTally> {
        let mut v: Vec<_> = self.0.into_values().collect();
        v.sort_by_key(|(first, _)| *first);
        v.into_iter().map(|(_, t)| t).collect()
    }
}

impl MemoryTrace {
    /// The call groups of the process this view was opened for (all when
    /// none): [`MemoryTrace::groups`] holds every process's.
    pub fn own_groups(&self) -> impl Iterator<Item = &CallGroup> + Clone {
        let pid = self.pid;
        self.groups
            .iter()
            .filter(move |g| pid.is_none_or(|p| g.pid == p))
    }

    /// Opens the memory view of one process (`pid`) or all, reading under
    /// `budget`. Errors are those of [`Trace::load`].
    pub fn open(
        trace: &Trace,
        pid: Option<u32>,
        budget: ReadBudget,
    ) -> Result<MemoryTrace, StoreError> {
        if let Some(pid) = pid {
            trace.require_pid(pid)?;
        }
        Self::open_unchecked(trace, pid, budget)
    }

    /// [`MemoryTrace::open`] without the check that the trace holds `pid`:
    /// for the files of a run whose reader checked that the run holds it
    /// (`run::visit_finished`), some holding it only in the ledger the
    /// tracer carried (an idle process silent in them: round 54).
    pub(crate) fn open_unchecked(
        trace: &Trace,
        pid: Option<u32>,
        budget: ReadBudget,
    ) -> Result<MemoryTrace, StoreError> {
        let rows = Rows::open_with(trace, budget)?;
        let groups = rows.call_groups()?;
        let mut pids: std::collections::BTreeSet<u32> =
            trace.op_counts(pid)?.iter().map(|c| c.pid).collect();
        pids.extend(
            groups
                .iter()
                .filter(|g| pid.is_none_or(|p| g.pid == p))
                .map(|g| g.pid),
        );
        let base = trace.frame_without_blocks(pid)?;
        let span = call_span(base.start_ns, base.end_ns, &groups, pid);
        let mut block_pids = trace.allocator_pids()?;
        block_pids.retain(|&p| pid.is_none_or(|only| only == p));
        Ok(MemoryTrace {
            base,
            span,
            groups,
            pids,
            block_pids,
            pid,
            rows,
            site_pass: Default::default(),
            rebuilt: Default::default(),
        })
    }

    /// The processes with allocator events (of this view's pid).
    pub fn block_pids(&self) -> &[u32] {
        &self.block_pids
    }

    /// The streamed reader under this view.
    pub fn rows(&self) -> &Rows {
        &self.rows
    }

    /// The memory calls (`ledger::is_memory_op`) of this view, those that
    /// returned by `returned_by` when given.
    fn memory_calls(&self, order: StreamOrder, returned_by: Option<u64>) -> CallQuery {
        memory_calls_of(self.pid, order, returned_by)
    }

    /// Visits the memory calls in `order`, those that returned by
    /// `returned_by` when given.
    fn for_each_memory_call(
        &self,
        order: StreamOrder,
        returned_by: Option<u64>,
        mut visit: impl FnMut(sleuth_core::CallEvent),
    ) -> Result<(), StoreError> {
        let q = self.memory_calls(order, returned_by);
        self.rows.for_each_call::<StoreError>(&q, |c| {
            visit(c.call);
            Ok(())
        })?;
        Ok(())
    }

    /// The ledgers at the end or at `at_ns`: `ledger::ledger` of the loaded trace.
    pub fn ledgers(
        &self,
        at_ns: Option<u64>,
    ) -> Result<Vec<sleuth_core::ledger::ProcessLedger>, StoreError> {
        // At the end: the ledgers the writer replayed when the trace ended
        // (`crate::ledger_rollup`), without reading a call row.
        if at_ns.is_none() {
            let stored = crate::ledger_rollup::stored(&self.rows.conn, &self.pids, &self.base)
                .map_err(|e| self.rows.read_error(e))?;
            if let Some(ledgers) = stored {
                return Ok(ledgers);
            }
        }
        let (ledgers, pass) = self.replay(at_ns)?;
        *self.site_pass.borrow_mut() = Some(pass);
        Ok(ledgers)
    }

    /// One replay of the memory calls that returned by `at_ns` (all when
    /// None), in return order: the ledgers then, and what the by-site table
    /// needs of the same calls (`SitePass`), so `memory --by-site --at` and
    /// MCP `memory` at a moment read the calls once.
    fn replay(
        &self,
        at_ns: Option<u64>,
    ) -> Result<(Vec<sleuth_core::ledger::ProcessLedger>, SitePass), StoreError> {
        // At a moment, the allocator views then are fed by the same pass.
        let rebuild = match at_ns {
            Some(_) => self.rebuild_plan()?,
            None => None,
        };
        let init = || {
            let mut b = sleuth_core::ledger::LedgerBuilder::new(at_ns).with_peak_sites();
            // Every process is listed up front, so a call that returned after
            // `at_ns` (which the builder would only list) need not be read.
            for &pid in &self.pids {
                b.track(pid);
            }
            let feed = rebuild.as_ref().map(|plan| plan.feed(&self.rows.conn));
            (b, SiteTally::default(), feed)
        };
        // Nothing that returned after `at_ns` takes effect: it is not read.
        let q = self.memory_calls(StreamOrder::ByReturn, at_ns);
        let (b, tally, feed) =
            self.rows
                .replay_by_return::<_, StoreError>(&q, init, |(b, tally, feed), c| {
                    b.push(&c.call);
                    tally.add(&c.call, c.id);
                    if let Some(feed) = feed {
                        feed.push_call(&c.call);
                    }
                    Ok(())
                })?;
        if let (Some(feed), Some(plan), Some(at)) = (feed, rebuild, at_ns) {
            let replays = feed.finish(at_ns).map_err(|e| self.rows.read_error(e));
            *self.rebuilt.borrow_mut() = Some(Rebuilt {
                at_ns: at,
                calibrations: plan.calibrations,
                replays,
            });
        }
        let (ledgers, at_peak) = b.finish_with_peak_sites(&self.base);
        Ok((
            ledgers,
            SitePass {
                at_ns,
                tally,
                at_peak,
            },
        ))
    }

    /// Feeds this view's processes and memory calls, in return order, into
    /// `b`: one builder fed by every file of a run in write order replays
    /// the run's ledger, so an allocation freed in a later file is neither
    /// unfreed nor an unmatched free (`crate::run_explain`).
    /// Returns how many memory calls it read (a restarted read counts
    /// twice): `explain --db DIR` reports it, its tests check the run's
    /// carried ledger spares it (`crate::run_ledger`).
    pub fn replay_ledger(
        &self,
        b: &mut sleuth_core::ledger::LedgerBuilder,
    ) -> Result<u64, StoreError> {
        for &pid in &self.pids {
            b.track(pid);
        }
        let mut read = 0u64;
        // Read in stored order (`Rows::replay_by_return`); should the file's
        // order force the sorted read, the replay restarts from the state
        // the earlier files left.
        let before = b.clone();
        let q = self.memory_calls(StreamOrder::ByReturn, None);
        *b = self.rows.replay_by_return::<_, StoreError>(
            &q,
            || before.clone(),
            |b, c| {
                read += 1;
                b.push(&c.call);
                Ok(())
            },
        )?;
        Ok(read)
    }

    /// [`Self::replay_ledger`] from the calls another thread read from the
    /// same file (`crate::ledger_feed::ReadAhead`): the same calls in the
    /// same order, so the same state. Without a feed, or should it fail or
    /// end without saying it is complete, the file is replayed here
    /// instead, from the state `b` had.
    pub(crate) fn replay_ledger_fed(
        &self,
        b: &mut sleuth_core::ledger::LedgerBuilder,
        feed: Option<impl IntoIterator<Item = crate::ledger_feed::Fed>>,
    ) -> Result<u64, StoreError> {
        if let Some(feed) = feed {
            for &pid in &self.pids {
                b.track(pid);
            }
            if let Some(read) = crate::ledger_feed::apply(b, feed, |b, c| b.push(&c.call)) {
                return Ok(read);
            }
        }
        self.replay_ledger(b)
    }

    /// [`Self::replay_ledger`] of the memory calls that returned by
    /// `at_ns`, each also tallied by site in `tally`: a run's ledger and
    /// per-site table at a moment, file after file
    /// (`crate::run_explain::load_memory_at`). A file's row ids order
    /// allocations of the same start time only within the file: the files
    /// of a run cover disjoint times.
    pub(crate) fn replay_ledger_and_sites(
        &self,
        b: &mut sleuth_core::ledger::LedgerBuilder,
        tally: &mut SiteTally,
        at_ns: Option<u64>,
    ) -> Result<u64, StoreError> {
        for &pid in &self.pids {
            b.track(pid);
        }
        let mut read = 0u64;
        let before = (b.clone(), tally.clone());
        let q = self.memory_calls(StreamOrder::ByReturn, at_ns);
        (*b, *tally) = self.rows.replay_by_return::<_, StoreError>(
            &q,
            || before.clone(),
            |(b, tally), c| {
                read += 1;
                b.push(&c.call);
                tally.add(&c.call, c.id);
                Ok(())
            },
        )?;
        Ok(read)
    }

    /// [`Self::replay_ledger_and_sites`] from the calls another thread read
    /// from the same file up to the same moment
    /// (`crate::ledger_feed::ReadAhead::until`), as
    /// [`Self::replay_ledger_fed`] is to [`Self::replay_ledger`]: without a
    /// feed, or should it fail or end short, the file is replayed here.
    pub(crate) fn replay_ledger_and_sites_fed(
        &self,
        b: &mut sleuth_core::ledger::LedgerBuilder,
        tally: &mut SiteTally,
        at_ns: Option<u64>,
        feed: Option<impl IntoIterator<Item = crate::ledger_feed::Fed>>,
    ) -> Result<u64, StoreError> {
        if let Some(feed) = feed {
            for &pid in &self.pids {
                b.track(pid);
            }
            let mut both = (std::mem::take(b), std::mem::take(tally));
            let applied = crate::ledger_feed::apply(&mut both, feed, |(b, tally), c| {
                b.push(&c.call);
                tally.add(&c.call, c.id);
            });
            (*b, *tally) = both;
            if let Some(read) = applied {
                return Ok(read);
            }
        }
        self.replay_ledger_and_sites(b, tally, at_ns)
    }

    /// Every process the loaded trace has a call or a counted call of
    /// (with a pid: that one, if it has), as the ledger lists them.
    pub fn pids(&self) -> &std::collections::BTreeSet<u32> {
        &self.pids
    }

    /// `sleuth_core::sites::memory_by_site` at the end of the trace, from
    /// the site rollup the writer stored (`crate::site_rollup`), without
    /// reading a call row; None when the trace has none (then load the
    /// memory calls and compute it).
    pub fn stored_sites(&self) -> Result<Option<Vec<sleuth_core::sites::SiteMemory>>, StoreError> {
        crate::site_rollup::memory_by_site(&self.rows.conn, &self.pids, &self.base)
            .map_err(|e| self.rows.read_error(e))
    }

    /// `sleuth_core::sites::memory_by_site` of this view's memory calls
    /// that returned by `at_ns` (all when None) with `ledgers` (the ledgers
    /// then), without holding the calls: the allocations summed per stack
    /// and ordered by their first start (the first stack of a label stays
    /// its example), and what each process had live per site at its peak,
    /// both kept by the replay that gave the ledgers (`Self::replay`; made
    /// here when `ledgers` came from elsewhere, the ledger rollup). At a
    /// moment, an allocation counts once it returned (docs/stats.md,
    /// `--at`). Memory grows with the sites and what is live.
    pub fn sites_streamed(
        &self,
        ledgers: &[sleuth_core::ledger::ProcessLedger],
        at_ns: Option<u64>,
    ) -> Result<Vec<sleuth_core::sites::SiteMemory>, StoreError> {
        let kept = self.site_pass.borrow_mut().take();
        let pass = match kept {
            Some(p) if p.at_ns == at_ns => p,
            _ => self.replay(at_ns)?.1,
        };
        Ok(sleuth_core::sites::memory_by_site_of(
            &self.base,
            pass.tally.in_start_order(),
            ledgers,
            &pass.at_peak,
        ))
    }

    /// The recorded calls that carry a site, by (site label, op), from the
    /// site rollup; None when the trace has none (then stream the calls).
    #[allow(clippy::type_complexity)]
    pub fn stored_calls_by_site(
        &self,
    ) -> Result<
        Option<std::collections::BTreeMap<(String, &'static str), crate::site_rollup::SiteCalls>>,
        StoreError,
    > {
        crate::site_rollup::calls_by_site(&self.rows.conn, &self.pids, &self.base)
            .map_err(|e| self.rows.read_error(e))
    }

    /// The allocator views (`sleuth_core::allocator`) of the processes with
    /// allocator events (only traces taken with `--torch-allocator` have
    /// any), at the end or at `at_ns`; `ledgers` are those of the same
    /// moment. Each of a view's passes reads the process's memory calls
    /// from the file beside its allocator events (`FileSteps`): they are
    /// never all held, where [`Self::load_allocator_calls`] holds them (1.3M
    /// calls and 400 MB in the bench's 10M-call trace with allocator events).
    pub fn allocator_views(
        &self,
        at_ns: Option<u64>,
        ledgers: &[sleuth_core::ledger::ProcessLedger],
    ) -> Result<std::collections::BTreeMap<u32, sleuth_core::allocator::AllocatorView>, StoreError>
    {
        // At a moment the ledgers' pass fed: the views from its replays.
        if let Some(views) = self.views_rebuilt(at_ns, ledgers) {
            return views;
        }
        let pids = &self.block_pids;
        let stored = self.stored_allocator_views(pids)?;
        // At the end: the views the writer rebuilt when the trace ended.
        if let (None, Some(known)) = (at_ns, &stored) {
            return Ok(known.end().clone());
        }
        // At a moment: replayed up to it with their calibration (a pass
        // over every step of the file) taken from them.
        let calibrations = calibrations_of(stored.as_ref());
        let source = crate::file_steps::FileSteps::read(&self.rows);
        let views = sleuth_core::allocator::allocator_views_of(
            &source,
            &self.base,
            pids,
            at_ns,
            ledgers,
            &calibrations,
        );
        source.into_result().map(|()| views)
    }

    /// What the ledgers' pass at a moment feeds the allocator views with:
    /// each process's calibration (the writer's, from its stored views)
    /// and, where it has a layout, a replay. None when no process has
    /// allocator events, or the writer stored no views of some (their
    /// calibration then takes a pass of its own).
    fn rebuild_plan(&self) -> Result<Option<RebuildPlan>, StoreError> {
        if self.block_pids.is_empty() {
            return Ok(None);
        }
        let stored = self.stored_allocator_views(&self.block_pids)?;
        self.plan_for(&calibrations_of(stored.as_ref()))
    }

    /// The plan that feeds the views of the processes with allocator
    /// events calibrated by `calibrations`; None when one has none there
    /// (or no process has allocator events).
    fn plan_for(
        &self,
        calibrations: &std::collections::BTreeMap<u32, sleuth_core::allocator::Calibration>,
    ) -> Result<Option<RebuildPlan>, StoreError> {
        let pids = &self.block_pids;
        if pids.is_empty() || !pids.iter().all(|p| calibrations.contains_key(p)) {
            return Ok(None);
        }
        let pages =
            crate::step_feed::page_query(&self.rows.conn).map_err(|e| self.rows.read_error(e))?;
        Ok(pages.map(|pages| RebuildPlan {
            pages,
            calibrations: calibrations
                .iter()
                .filter(|(p, _)| pids.contains(p))
                .map(|(&p, c)| (p, c.clone()))
                .collect(),
        }))
    }

    /// What a pass at `at_ns` takes up from the file's allocator checkpoints
    /// (`crate::allocator_checkpoints`): each process with a layout, from
    /// its latest checkpoint at or before the moment where it has one.
    /// When every such process has one, the pass reads only the calls
    /// that returned after the earliest checkpoint's time, from the lowest
    /// first id on; otherwise every call, each process taken up skipping
    /// those in its state. A process without a layout is left out: its
    /// view reads neither a replay nor its reserved bytes. A state no
    /// writer stores is an error naming the table.
    fn checkpoints_at(&self, plan: &RebuildPlan, at_ns: u64) -> Result<Resumed, StoreError> {
        use crate::allocator_checkpoints::{latest, refused};
        let mut r = Resumed::fresh(Some(at_ns));
        let err = |e| self.rows.read_error(e);
        let (mut states, mut every) = (Vec::new(), true);
        let (mut from_id, mut returned_after) = (i64::MAX, u64::MAX);
        for &pid in &self.block_pids {
            let Some(layout) = plan.calibrations.get(&pid).and_then(|c| c.layout()) else {
                continue;
            };
            let Some(cp) = latest(&self.rows.conn, pid, at_ns).map_err(err)? else {
                every = false;
                continue;
            };
            let replay = sleuth_core::allocator::Rebuilder::resume(cp.replay, layout)
                .map_err(|e| err(refused(pid, &e)))?;
            states.push(cp.ledger);
            r.replays.insert(pid, (replay, cp.rows_after));
            r.after.insert(pid, cp.at_ns);
            // No call returned after it: none to read for this process.
            from_id = from_id.min(cp.from_id.unwrap_or(i64::MAX));
            returned_after = returned_after.min(cp.at_ns);
        }
        if states.is_empty() {
            return Ok(r);
        }
        crate::allocator_checkpoints::note_taken_up();
        let pid = states[0].pid;
        r.ledger =
            sleuth_core::ledger::LedgerBuilder::from_states_without_history(states, Some(at_ns))
                .map_err(|e| err(refused(pid, &e)))?;
        if every {
            (r.from_id, r.returned_after) = (Some(from_id), Some(returned_after));
        }
        Ok(r)
    }

    /// Each process's view from the replay fed for it (`replays`), by its
    /// calibration; its reserved bytes its ledger's live bytes (`ledgers`,
    /// of the same moment).
    fn views_of(
        &self,
        calibrations: std::collections::BTreeMap<u32, sleuth_core::allocator::Calibration>,
        mut replays: std::collections::BTreeMap<u32, sleuth_core::allocator::Rebuilder>,
        ledgers: &[sleuth_core::ledger::ProcessLedger],
    ) -> std::collections::BTreeMap<u32, sleuth_core::allocator::AllocatorView> {
        calibrations
            .into_iter()
            .map(|(pid, cal)| {
                let reserved = sleuth_core::ledger::live_bytes_of(ledgers, pid);
                let replay = replays.remove(&pid);
                let view =
                    sleuth_core::allocator::view_rebuilt(pid, cal, replay, reserved, &self.base);
                (pid, view)
            })
            .collect()
    }

    /// The views of the processes with allocator events at `at_ns` (the
    /// end when None), each calibrated by `calibrations`, their reserved
    /// bytes by the ledger's rules from their memory calls then
    /// (`KnownViews::until`'s): one pass over those calls in stored order
    /// (no sort, `Rows::replay_by_return`) feeding a ledger and each
    /// process's allocator replay. None when a process's calibration is
    /// not known.
    #[allow(clippy::type_complexity)]
    fn views_fed(
        &self,
        at_ns: Option<u64>,
        calibrations: &std::collections::BTreeMap<u32, sleuth_core::allocator::Calibration>,
    ) -> Result<
        Option<std::collections::BTreeMap<u32, sleuth_core::allocator::AllocatorView>>,
        StoreError,
    > {
        let Some(plan) = self.plan_for(calibrations)? else {
            return Ok(None);
        };
        let pids = &self.block_pids;
        // At a moment: each process's replay taken up from the file's
        // latest checkpoint before it, where it stores one.
        let resumed = match at_ns {
            Some(at) => self.checkpoints_at(&plan, at)?,
            None => Resumed::fresh(None),
        };
        let init = || {
            let mut ledger = resumed.ledger.clone();
            for &pid in pids {
                ledger.track(pid);
            }
            (ledger, plan.feed_from(&self.rows.conn, &resumed.replays))
        };
        // One process: only its calls are read.
        let pid = match pids[..] {
            [only] => Some(only),
            _ => self.pid,
        };
        let q = CallQuery {
            returned_after: resumed.returned_after,
            from_id: resumed.from_id,
            ..memory_calls_of(pid, StreamOrder::ByReturn, at_ns)
        };
        let after = &resumed.after;
        let (ledger, feed) =
            self.rows
                .replay_by_return::<_, StoreError>(&q, init, |(ledger, feed), c| {
                    // In the state already.
                    if after
                        .get(&c.call.pid)
                        .is_some_and(|&t| c.call.end_ns() <= t)
                    {
                        return Ok(());
                    }
                    if pids.contains(&c.call.pid) {
                        ledger.push(&c.call);
                    }
                    feed.push_call(&c.call);
                    Ok(())
                })?;
        let replays = feed.finish(at_ns).map_err(|e| self.rows.read_error(e))?;
        let ledgers = ledger.finish_bare();
        Ok(Some(self.views_of(plan.calibrations, replays, &ledgers)))
    }

    /// The views at `at_ns` from the replays the ledgers' pass at that
    /// moment fed (`ledgers`, that moment's, give their reserved bytes),
    /// or the error that ended its feed; None when that pass fed none.
    #[allow(clippy::type_complexity)]
    fn views_rebuilt(
        &self,
        at_ns: Option<u64>,
        ledgers: &[sleuth_core::ledger::ProcessLedger],
    ) -> Option<
        Result<std::collections::BTreeMap<u32, sleuth_core::allocator::AllocatorView>, StoreError>,
    > {
        let at_ns = at_ns?;
        let mut slot = self.rebuilt.borrow_mut();
        if slot.as_ref().is_none_or(|r| r.at_ns != at_ns) {
            return None;
        }
        let Rebuilt {
            calibrations,
            replays,
            ..
        } = slot.take()?;
        // Every process's calibration is there, and only theirs (`plan_for`).
        Some(replays.map(|r| self.views_of(calibrations, r, ledgers)))
    }

    /// The allocator views of `pids` the writer stored when the trace ended
    /// (`crate::allocator_rollup`); None when it stored none of some.
    fn stored_allocator_views(
        &self,
        pids: &[u32],
    ) -> Result<Option<sleuth_core::allocator::KnownViews>, StoreError> {
        crate::allocator_rollup::stored_views(&self.rows.conn, pids, &self.base)
            .map_err(|e| self.rows.read_error(e))
    }

    /// The layout each process's stored views were calibrated to (those
    /// the writer rebuilt and found one for): a guess for a view over more
    /// than this file (`allocator::allocator_views_guessed`).
    pub(crate) fn stored_layouts(
        &self,
    ) -> Result<std::collections::BTreeMap<u32, sleuth_core::allocator::Layout>, StoreError> {
        let stored = self.stored_allocator_views(&self.block_pids)?;
        Ok(calibrations_of(stored.as_ref())
            .into_iter()
            .filter_map(|(pid, cal)| Some((pid, cal.layout()?)))
            .collect())
    }

    /// What an explanation of this view reads of the allocator: the views
    /// at the end (`ledgers`) and at the moments their fragmentation
    /// findings describe, rebuilt from the file without holding its
    /// calls (`sleuth_core::allocator::KnownViews`).
    pub fn known_allocator_views(
        &self,
        ledgers: &[sleuth_core::ledger::ProcessLedger],
    ) -> Result<sleuth_core::allocator::KnownViews, StoreError> {
        if let Some(known) = self.stored_allocator_views(&self.block_pids)? {
            return Ok(known);
        }
        let source = crate::file_steps::FileSteps::read(&self.rows);
        let known = sleuth_core::allocator::KnownViews::of_pids(
            &source,
            &self.base,
            &self.block_pids,
            ledgers,
        );
        source.into_result().map(|()| known)
    }

    /// The allocator views a window ending at `until_ns` (the end when
    /// None) reads: each process's view then, replayed from the file's
    /// start (`sleuth_core::allocator::KnownViews::until`), and at its
    /// fragmentation finding's moment; None when no process has
    /// allocator events.
    pub fn allocator_views_until(
        &self,
        until_ns: Option<u64>,
    ) -> Result<Option<sleuth_core::allocator::KnownViews>, StoreError> {
        if self.block_pids.is_empty() {
            return Ok(None);
        }
        // The calibration of the views the writer stored, when it did.
        let calibrations = calibrations_of(self.stored_allocator_views(&self.block_pids)?.as_ref());
        let source = crate::file_steps::FileSteps::read(&self.rows);
        // Every calibration known: the views then in one pass for all.
        if let Some(end) = self.views_fed(until_ns, &calibrations)? {
            let known = sleuth_core::allocator::KnownViews::with_moments(&source, &self.base, end);
            return source.into_result().map(|()| Some(known));
        }
        let known = sleuth_core::allocator::KnownViews::until(
            &source,
            &self.base,
            &self.block_pids,
            until_ns,
            &calibrations,
        );
        source.into_result().map(|()| Some(known))
    }

    /// Puts the allocator events (only traces taken with
    /// `--torch-allocator` have any) into `base.blocks` and the memory calls
    /// of their processes into `base.calls`: what the allocator view of the
    /// loaded trace replays. Reads nothing when there are none.
    pub fn load_allocator_calls(&mut self) -> Result<(), StoreError> {
        if self.block_pids.is_empty() {
            return Ok(());
        }
        self.load_allocator_events()?;
        let pids = self.block_pids.clone();
        self.load_memory_calls(Some(&pids))
    }

    /// Puts the allocator events of this view into `base.blocks`, as
    /// [`Trace::load`] gives them.
    pub fn load_allocator_events(&mut self) -> Result<(), StoreError> {
        self.base.blocks = crate::allocator_rows::load(&self.rows.conn, self.pid)
            .map_err(|e| self.rows.read_error(e))?;
        Ok(())
    }

    /// Puts the memory calls of `pids` (all when None) into `base.calls`,
    /// in the loaded trace's order: what the allocator view and the by-site
    /// table read. Those hold the memory calls; the ledger alone does not.
    pub fn load_memory_calls(&mut self, pids: Option<&[u32]>) -> Result<(), StoreError> {
        let mut calls = Vec::new();
        self.for_each_memory_call(StreamOrder::ByStart, None, |c| {
            if pids.is_none_or(|p| p.contains(&c.pid)) {
                calls.push(c);
            }
        })?;
        self.base.calls = calls;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::CallEvent;

    fn malloc(ts_ns: u64, stack: u64, size: u64) -> CallEvent {
        CallEvent {
            ts_ns,
            op: sleuth_core::op_by_name("cudaMalloc").expect("op").id,
            size: Some(size),
            stack_id: Some(stack),
            ..Default::default()
        }
    }

    /// Calls met in return order are tallied as the start-order pass
    /// tallied them: each (stack, failed) once, summed, ordered by its
    /// first call's start (then row id), which picks a label's example.
    #[test]
    fn site_tallies_come_out_in_first_start_order_whatever_order_calls_come_in() {
        let mut t = SiteTally::default();
        // (call, row id), in return order: stack 8 is met first at ts 30
        // but started earlier (ts 10) by a call that returned later.
        t.add(&malloc(20, 9, 100), 3);
        t.add(&malloc(30, 8, 1), 5);
        t.add(&malloc(5, 7, 10), 1);
        t.add(&malloc(10, 8, 2), 2);
        t.add(&malloc(40, 7, 10), 6);
        t.add(&malloc(20, 6, 4), 4);
        let got: Vec<(Option<u64>, u64, u64)> = t
            .in_start_order()
            .into_iter()
            .map(|a| (a.stack_id, a.count, a.bytes))
            .collect();
        // Stacks 9 and 6 both first start at 20: row id 3 before 4.
        assert_eq!(
            got,
            [
                (Some(7), 2, 20),
                (Some(8), 2, 3),
                (Some(9), 1, 100),
                (Some(6), 1, 4)
            ]
        );
    }
}
