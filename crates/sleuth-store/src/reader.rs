//! The read side: a trace database opened read-only as untrusted input.

use crate::budget::{ReadBudget, DEFAULT_READ_TIMEOUT};
use crate::checked::{BulkCheck, CheckMemo, Checks, FileIdentity};
use crate::error::{SqlContext, StoreError};
use crate::open::{check_at_open, has_table, open_trace_file, short};
use crate::problems::{self, InputProblems, COMM_CHARS, MAX_NS};
use crate::rows::{query_calls, query_waits};
use crate::schema::{READABLE_VERSIONS, SCHEMA_VERSION, TOOL};
use crate::types::{
    CallFilter, CallOrder, LibraryInfo, Note, Session, SessionInfo, StoredCall, TraceSource,
    WaitFilter,
};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension};
use sleuth_core::threads::is_tracer;
use sleuth_core::{
    op_by_name, Culprit, Layer, OpCount, ProcEvent, ProcessInfo, TraceData, WaitEvent,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The most rows a read may take without the `quick_check` of their
/// table (see [`Trace::keyed`]): a tool's page of calls or waits.
pub(crate) const KEYED_ROWS: usize = 10_000;

/// An open trace database.
pub struct Trace {
    conn: Connection,
    path: PathBuf,
    source: TraceSource,
    /// `meta.schema_version`, one of [`READABLE_VERSIONS`].
    version: i64,
    /// Every read of this trace stops when it is spent.
    budget: ReadBudget,
    /// The memo it was opened with, for the files a reader opens beside it
    /// (a run's previous file): their checks are remembered as this one's.
    memo: Option<CheckMemo>,
    /// The per-call and per-wait tables (`open::BULK_TABLES`) of a large
    /// file are checked on first use, not at open. Shared with the streamed
    /// readers opened on this trace (`stream::Rows`), so the check runs once
    /// whichever reads first; it also holds the file's checks and the pass
    /// over its call rows (`checked::Checks`), remembered across opens when
    /// the trace was opened with a [`CheckMemo`].
    bulk: BulkCheck,
    /// [`Self::allocator_pids`], read once: each command asks several
    /// times (the window, each streamed view), and the look reads every
    /// allocator row of a file stored in completion order (no index).
    allocator_pids: std::sync::OnceLock<Vec<u32>>,
}

impl Trace {
    /// Opens a gpusleuth trace read-only; a missing, non-SQLite, corrupt,
    /// foreign or oddly shaped file is a one-line error naming the path.
    /// Reads stop after [`DEFAULT_READ_TIMEOUT`].
    pub fn open(path: &Path) -> Result<Trace, StoreError> {
        Self::open_with(path, ReadBudget::new(DEFAULT_READ_TIMEOUT))
    }

    /// [`Trace::open`] with every read (the checks included) under `budget`:
    /// it stops at the budget's deadline or when the caller cancels it.
    pub fn open_with(path: &Path, budget: ReadBudget) -> Result<Trace, StoreError> {
        Self::open_checked(path, budget, None)
    }

    /// [`Trace::open_with`] for a reader that opens the same files again
    /// and again (the MCP server): the checks this file passed since it
    /// last changed, kept in `memo`, are not run again (`checked`).
    pub fn open_remembered(
        path: &Path,
        budget: ReadBudget,
        memo: &CheckMemo,
    ) -> Result<Trace, StoreError> {
        Self::open_checked(path, budget, Some(memo))
    }

    fn open_checked(
        path: &Path,
        budget: ReadBudget,
        memo: Option<&CheckMemo>,
    ) -> Result<Trace, StoreError> {
        let before = FileIdentity::of(path);
        let conn = open_trace_file(path, &budget)?;
        let (source, version) = check_is_trace(&conn, path)?;
        // The identity once the connection has the file open: a file
        // replaced or written meanwhile gets checks of its own.
        let after = FileIdentity::of(path);
        let checks = match memo {
            Some(m) => m.checks_for(before, after),
            None => Checks::default(),
        };
        check_schema_once(&conn, path, version, Some(&checks))?;
        let id = before.filter(|b| Some(*b) == after);
        let opened = {
            let p = checks.lock();
            p.whole || p.others
        };
        if !opened {
            // Only now, with plain tables and plain indexes, is a full check safe.
            let deferred = check_at_open(&conn, path, &budget)?;
            let mut p = checks.lock();
            if deferred {
                p.others = true;
            } else {
                p.whole = true;
            }
        }
        Ok(Trace {
            conn,
            path: path.to_path_buf(),
            source,
            version,
            budget,
            memo: memo.cloned(),
            bulk: BulkCheck::new(checks, id),
            allocator_pids: std::sync::OnceLock::new(),
        })
    }

    /// The connection, once the per-call and per-wait tables are checked:
    /// every read of those tables goes through here (see
    /// `open::check_at_open`); the first such read of a large file pays a
    /// `quick_check` of them.
    pub(crate) fn bulk(&self) -> Result<&Connection, StoreError> {
        self.bulk.ensure(&self.conn, &self.path, &self.budget)?;
        Ok(&self.conn)
    }

    /// The connection for reads of a few rows of the per-call and per-wait
    /// tables by row id (the example calls of the finding rollups and their
    /// culprits): no `quick_check` first. A lookup by id descends one
    /// b-tree path (SQLite bounds its depth and reports a damaged page as
    /// an error), reads a number of rows the caller bounds, and every value
    /// read is range-checked like any other row; a check of the whole table
    /// (3.7 s on a 10M-call file) would cost more than the answer.
    pub(crate) fn keyed(&self) -> &Connection {
        &self.conn
    }

    /// Where helper threads get connections to this trace's file, as
    /// checked as this one (`checked::Helpers`).
    pub(crate) fn helpers(&self) -> crate::checked::Helpers<'_> {
        crate::checked::Helpers::new(&self.path, &self.budget, self.bulk.identity())
    }

    /// The check state shared with streamed readers of this trace.
    #[cfg(test)]
    pub(crate) fn bulk_check(&self) -> BulkCheck {
        self.bulk.clone()
    }

    /// A second connection to this trace's file under `budget`, checked as
    /// this trace's: the file, replaced since, must still be a trace of our
    /// schema (the cheap checks; the schema skipped while the file keeps the
    /// identity that passed), and the check state for it (`for_stream`,
    /// taken once this connection has the file open). With the file's
    /// schema version.
    pub(crate) fn open_beside(
        &self,
        budget: &ReadBudget,
    ) -> Result<(Connection, i64, BulkCheck), StoreError> {
        let conn = open_trace_file(&self.path, budget)?;
        let (_, version) = check_is_trace(&conn, &self.path)?;
        let bulk = self.bulk.for_stream(&self.path);
        check_schema_once(&conn, &self.path, version, bulk.checks_of_identity())?;
        Ok((conn, version, bulk))
    }

    /// [`Trace::input_problems`] when the answer read the per-call or
    /// per-wait tables, or when the file is small enough to be checked whole
    /// at open (then counting costs little); None for a large file answered
    /// from its stored aggregates alone (no call or wait row was read, so
    /// none was skipped: the rows are neither read nor counted, as `stats`
    /// answers from its rollups). Call it after the command's reads.
    pub fn input_problems_of_reads(&self) -> Result<Option<InputProblems>, StoreError> {
        let whole = self.bulk.checks().lock().whole;
        if !whole && !self.bulk.read() {
            return Ok(None);
        }
        self.input_problems().map(Some)
    }

    /// Rows the readers skip (unknown ops, impossible values), with counts;
    /// empty for every trace gpusleuth wrote itself. The same pass checks
    /// the totals: a file whose valid durations or sizes add up past 2^62
    /// is refused here, as every read of its call rows refuses it. Counted
    /// once per file (per open, or while it stays the same with a memo).
    pub fn input_problems(&self) -> Result<InputProblems, StoreError> {
        let (calls, problems) =
            self.bulk
                .ensure_counts(&self.conn, &self.path, &self.budget, self.version)?;
        match problems {
            Some(p) if !calls.totals_overflow => Ok(p),
            _ => Err(StoreError::file(&self.path, problems::TOTALS_OVERFLOW)),
        }
    }

    /// The pass over the call rows (impossible rows, totals), made once per
    /// file with the skipped-row counts (`BulkCheck::ensure_counts`): later
    /// readers reuse it.
    pub(crate) fn call_scan(&self) -> Result<problems::CallScan, StoreError> {
        let (calls, _) =
            self.bulk
                .ensure_counts(&self.conn, &self.path, &self.budget, self.version)?;
        Ok(calls)
    }

    /// A failed read, naming the budget when it stopped the read.
    pub(crate) fn read_error(&self, e: rusqlite::Error) -> StoreError {
        match self.budget.stop_reason() {
            Some(why) => StoreError::file(&self.path, format!("reading stopped: {why}")),
            None => StoreError::Sqlite {
                path: self.path.clone(),
                source: e,
            },
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The memo this trace was opened with (a fresh one when none was): a
    /// reader that opens other files for it opens them with it.
    pub fn memo(&self) -> CheckMemo {
        self.memo.clone().unwrap_or_default()
    }

    /// The budget this trace's reads run under (a reader that opens other
    /// files for it, such as a run's previous file, reads them under it too).
    pub fn budget(&self) -> &ReadBudget {
        &self.budget
    }

    /// `meta.schema_version` (which table holds the call rows).
    pub(crate) fn version(&self) -> i64 {
        self.version
    }

    pub fn source(&self) -> TraceSource {
        self.source
    }

    /// Whether calls carry the runnable/blocked split (false for imports).
    pub fn has_host_context(&self) -> bool {
        self.source == TraceSource::Gpusleuth
    }

    pub fn session(&self) -> Result<Session, StoreError> {
        let clock_base_ns = crate::file_clock::stored_clock_base_of(&self.conn, &self.path)?;
        self.conn
            .query_row(
                "SELECT started_unix_ns, start_mono_ns, end_mono_ns, realtime_offset_ns, hostname,
                    kernel, command, target, launch_mode, tool_version FROM session WHERE id = 1",
                [],
                |r| {
                    Ok(Session {
                        info: SessionInfo {
                            started_unix_ns: r.get(0)?,
                            start_mono_ns: valid_ns(r.get(1)?).ok_or_else(|| {
                                rusqlite::Error::IntegralValueOutOfRange(1, r.get(1).unwrap_or(-1))
                            })?,
                            realtime_offset_ns: r.get(3)?,
                            hostname: r.get(4)?,
                            kernel: r.get(5)?,
                            command: r.get(6)?,
                            target: r.get(7)?,
                            launch_mode: r.get(8)?,
                            tool_version: r.get(9)?,
                            clock_base_ns,
                        },
                        end_mono_ns: r.get::<_, Option<i64>>(2)?.and_then(valid_ns),
                        source: self.source,
                    })
                },
            )
            .at(&self.path)
    }

    /// The pid of the tracer that wrote the file (`stats.tracer_pid`):
    /// its threads are never culprits, and `gpusleuth finish` leaves a file
    /// alone while it runs. None when the file names none.
    pub fn tracer_pid(&self) -> Option<u32> {
        self.stats()
            .ok()
            .and_then(|s| s.get(sleuth_core::threads::TRACER_PID_STAT).copied())
            .and_then(|p| u32::try_from(p).ok())
            .filter(|&p| p != 0)
    }

    pub fn stats(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let mut st = self
            .conn
            .prepare("SELECT name, value FROM stats ORDER BY name")
            .at(&self.path)?;
        let rows = st
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
            })
            .at(&self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(&self.path)
    }

    pub fn libraries(&self) -> Result<Vec<LibraryInfo>, StoreError> {
        let mut st = self
            .conn
            .prepare("SELECT path, layer, dev, ino, attached_mono_ns, probes, missing FROM libraries ORDER BY id")
            .at(&self.path)?;
        let rows = st
            .query_map([], |r| {
                let layer: Option<String> = r.get(1)?;
                let missing: String = r.get(6)?;
                Ok(LibraryInfo {
                    path: r.get(0)?,
                    layer: layer.as_deref().and_then(Layer::parse),
                    dev: r.get::<_, Option<i64>>(2)?.map(|v| v as u64),
                    ino: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
                    attached_mono_ns: r.get::<_, Option<i64>>(4)?.map(|v| v as u64),
                    probes: r.get(5)?,
                    missing: serde_json::from_str(&missing).unwrap_or_default(),
                })
            })
            .at(&self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(&self.path)
    }

    pub fn notes(&self) -> Result<Vec<Note>, StoreError> {
        let mut st = self
            .conn
            .prepare("SELECT ts_ns, level, text FROM notes ORDER BY ts_ns, rowid")
            .at(&self.path)?;
        let rows = st
            .query_map([], |r| {
                Ok(Note {
                    ts_ns: r.get::<_, i64>(0)? as u64,
                    level: r.get(1)?,
                    text: r.get(2)?,
                })
            })
            .at(&self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(&self.path)
    }

    pub fn processes(&self) -> Result<Vec<ProcessInfo>, StoreError> {
        let mut st = self
            .conn
            .prepare(&format!("SELECT pid, ppid, substr(comm, 1, {COMM_CHARS}), cmdline, start_ns, exit_ns, exit_code, oom_victim FROM processes ORDER BY pid"))
            .at(&self.path)?;
        let rows = st
            .query_map([], |r| {
                Ok(ProcessInfo {
                    pid: r.get(0)?,
                    ppid: r.get(1)?,
                    comm: r.get(2)?,
                    cmdline: r.get(3)?,
                    start_ns: r.get::<_, Option<i64>>(4)?.and_then(valid_ns),
                    exit_ns: r.get::<_, Option<i64>>(5)?.and_then(valid_ns),
                    exit_code: r.get(6)?,
                    oom_victim: r.get(7)?,
                })
            })
            .at(&self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(&self.path)
    }

    /// Calls matching the filter, each with its row id.
    /// Rows with impossible values are skipped (counted by `input_problems`).
    pub fn calls_filtered(&self, f: &CallFilter) -> Result<Vec<StoredCall>, StoreError> {
        let mut conds = vec![problems::valid_call("")];
        let mut args = Vec::new();
        if let Some(pid) = f.pid {
            args.push(Value::Integer(pid as i64));
            conds.push(format!("pid = ?{}", args.len()));
        }
        if let Some(op) = &f.op {
            args.push(Value::Text(op.clone()));
            conds.push(format!("op = ?{}", args.len()));
        }
        if f.since_ns.is_some() || f.until_ns.is_some() {
            // The calls in a window (of a process or all): named by their
            // threads (from the stored call groups), the `(tid, ts_ns)`
            // index finds them without reading the calls outside the window.
            if let Some(tids) =
                crate::stream::window_tids(&self.conn, f.pid, "").map_err(|e| self.read_error(e))?
            {
                conds.push(tids);
            }
        }
        if let Some(s) = f.since_ns {
            args.push(Value::Integer(s as i64));
            conds.push(format!("ts_ns >= ?{}", args.len()));
        }
        if let Some(u) = f.until_ns {
            args.push(Value::Integer(u as i64));
            conds.push(format!("ts_ns < ?{}", args.len()));
        }
        let mut tail = where_clause(&conds);
        tail.push_str(match f.order {
            CallOrder::ByTime => " ORDER BY ts_ns, id",
            CallOrder::ByDurationDesc => " ORDER BY dur_ns DESC, id",
        });
        if let Some(limit) = f.limit {
            tail.push_str(&format!(" LIMIT {}", limit.min(i64::MAX as usize)));
        }
        // Every call (of one process or all) in time order: read in row order
        // and sorted, not through the `(op_id, dur_ns)` index SQLite would
        // drive the join to `ops` with (a random page read per row; see
        // `stream::scan_table`).
        let every_call = f.op.is_none()
            && f.since_ns.is_none()
            && f.until_ns.is_none()
            && f.order == CallOrder::ByTime
            && self.version >= 2;
        let source = crate::stream::calls_source(every_call);
        let mut calls = query_calls(self.rows_conn(f.limit)?, &source, &tail, &args)
            .map_err(|e| self.read_error(e))?;
        let sites =
            crate::stacks::call_stack_ids(&self.conn, f.pid).map_err(|e| self.read_error(e))?;
        if !sites.is_empty() {
            for c in &mut calls {
                c.call.stack_id = sites.get(&c.id).copied();
            }
        }
        Ok(calls)
    }

    /// Call sites (of one process or all) by stack id; none for traces
    /// taken before sites were captured.
    pub fn stacks(
        &self,
        pid: Option<u32>,
    ) -> Result<BTreeMap<u64, sleuth_core::sites::Stack>, StoreError> {
        crate::stacks::read_all(&self.conn, pid).map_err(|e| self.read_error(e))
    }

    /// Culprits of the given calls (by row id), largest first; calls without any are absent.
    pub fn call_culprits_of(
        &self,
        call_ids: &[i64],
    ) -> Result<HashMap<i64, Vec<Culprit>>, StoreError> {
        // Reads by key, as many lists as the caller asks for (see `keyed`).
        let mut st = self
            .keyed()
            .prepare_cached(
                "SELECT pid, tid, substr(comm, 1, 64), runnable_ns FROM call_culprits
                 WHERE call_id = ?1 AND runnable_ns BETWEEN 0 AND ?2 ORDER BY runnable_ns DESC, pid, tid",
            )
            .at(&self.path)?;
        let mut out = HashMap::new();
        // Files written before round 51 stored the tracer's threads as culprits.
        let tracer = self.tracer_pid();
        for &id in call_ids {
            let mut list = st
                .query_map([id, MAX_NS], |r| {
                    Ok(Culprit {
                        pid: r.get(0)?,
                        tid: r.get(1)?,
                        comm: r.get(2)?,
                        ns: r.get::<_, i64>(3)? as u64,
                    })
                })
                .at(&self.path)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .at(&self.path)?;
            list.retain(|k| !is_tracer(k.pid, &k.comm, tracer));
            if !list.is_empty() {
                out.insert(id, list);
            }
        }
        Ok(out)
    }

    /// Waits matching the filter, by `on_ns`.
    pub fn waits_filtered(&self, f: &WaitFilter) -> Result<Vec<WaitEvent>, StoreError> {
        let mut conds = vec![problems::valid_wait("w.")];
        let mut args = Vec::new();
        if let Some(pid) = f.pid {
            args.push(Value::Integer(pid as i64));
            conds.push(format!("w.pid = ?{}", args.len()));
        }
        if let Some(tid) = f.tid {
            args.push(Value::Integer(tid as i64));
            conds.push(format!("w.tid = ?{}", args.len()));
        }
        if let Some(s) = f.since_ns {
            args.push(Value::Integer(s as i64));
            conds.push(format!("w.on_ns >= ?{}", args.len()));
        }
        if let Some(u) = f.until_ns {
            args.push(Value::Integer(u as i64));
            conds.push(format!("w.off_ns < ?{}", args.len()));
        }
        let mut tail = where_clause(&conds);
        tail.push_str(" ORDER BY w.on_ns, w.id");
        if let Some(limit) = f.limit {
            tail.push_str(&format!(" LIMIT {}", limit.min(i64::MAX as usize)));
        }
        query_waits(self.rows_conn(f.limit)?, &tail, &args).map_err(|e| self.read_error(e))
    }

    pub(crate) fn proc_events(&self, pid: Option<u32>) -> Result<Vec<ProcEvent>, StoreError> {
        let mut st = self
            .conn
            .prepare(&format!(
                "SELECT {} FROM proc_events
                 WHERE (?1 IS NULL OR pid = ?1) AND ts_ns BETWEEN 0 AND {MAX_NS} ORDER BY ts_ns, id",
                crate::rows::proc_event_cols()
            ))
            .at(&self.path)?;
        let rows = st
            .query_map([pid], crate::rows::proc_event_from_row)
            .at(&self.path)?;
        let mut out = Vec::new();
        for r in rows {
            out.extend(r.at(&self.path)?);
        }
        Ok(out)
    }

    /// Kernel-counted calls of known ops (the `op_counts` table), of one
    /// process or all, ordered by pid and op.
    pub fn op_counts(&self, pid: Option<u32>) -> Result<Vec<OpCount>, StoreError> {
        let mut st = self
            .conn
            .prepare("SELECT pid, op, count FROM op_counts WHERE ?1 IS NULL OR pid = ?1 ORDER BY pid, op")
            .at(&self.path)?;
        let rows = st
            .query_map([pid], |r| {
                let name: String = r.get(1)?;
                Ok(op_by_name(&name).map(|info| OpCount {
                    pid: r.get(0).unwrap_or(0),
                    op: info.id,
                    count: r.get::<_, i64>(2).unwrap_or(0).max(0) as u64,
                }))
            })
            .at(&self.path)?;
        let mut out = Vec::new();
        for r in rows {
            if let Some(c) = r.at(&self.path)? {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// The latest end of the last calls stored (the writer stores calls as
    /// they return, so the last 1,000 rows by id hold it), for a trace
    /// still being written (no session end yet); None without a call. Read
    /// through the row id: a few pages, whatever the file's size.
    pub fn latest_call_end(&self) -> Result<Option<u64>, StoreError> {
        let sql = format!(
            "SELECT max(ts_ns + dur_ns) FROM \
             (SELECT ts_ns, dur_ns FROM calls WHERE {} ORDER BY id DESC LIMIT 1000)",
            problems::valid_call("")
        );
        let v: Option<i64> = self.conn.query_row(&sql, [], |r| r.get(0)).at(&self.path)?;
        Ok(v.map(|v| v.max(0) as u64))
    }

    /// Where the trace begins and ends, monotonic ns: its session's start,
    /// and its session end or, for a file still being written (or whose
    /// writer was killed), [`Self::latest_call_end`] (never before the
    /// start). What "the last D of the trace" counts back from.
    pub fn start_and_end(&self) -> Result<(u64, u64), StoreError> {
        let session = self.session()?;
        let start = session.info.start_mono_ns;
        let end = match session.end_mono_ns {
            Some(end) => end,
            None => self.latest_call_end()?.unwrap_or(start),
        };
        Ok((start, end.max(start)))
    }

    /// Where "the last `last` ns of the trace" begins, never before its
    /// start ([`Self::start_and_end`]); with the start.
    pub fn start_and_since_last(&self, last: u64) -> Result<(u64, u64), StoreError> {
        let (start, end) = self.start_and_end()?;
        Ok((start, end.saturating_sub(last).max(start)))
    }

    /// The running counts of the kernel-counted ops that `trace` sampled
    /// (calls since the file began; `sleuth_core::counted`), of process
    /// `pid` (or all), by time; None for a trace written before they were
    /// (then a window cannot place those calls). Rows out of range (a
    /// crafted file) or of an op this build does not know are left out.
    pub fn count_samples(
        &self,
        pid: Option<u32>,
    ) -> Result<Option<Vec<sleuth_core::counted::CountSample>>, StoreError> {
        if !crate::open::has_table(&self.conn, "op_count_samples").at(&self.path)? {
            return Ok(None);
        }
        let mut st = self
            .conn
            .prepare(
                "SELECT ts_ns, pid, op, count FROM op_count_samples
                 WHERE (?1 IS NULL OR pid = ?1) AND ts_ns BETWEEN 0 AND ?2 AND count BETWEEN 0 AND ?2
                   AND pid BETWEEN 0 AND 4294967295
                 ORDER BY pid, op, ts_ns",
            )
            .at(&self.path)?;
        let rows = st
            .query_map(rusqlite::params![pid, problems::MAX_NS], |r| {
                let name = r.get_ref(2)?.as_str().ok().and_then(op_by_name);
                Ok(name.map(|info| sleuth_core::counted::CountSample {
                    ts_ns: r.get::<_, i64>(0).unwrap_or(0).max(0) as u64,
                    pid: r.get(1).unwrap_or(0),
                    op: info.id,
                    count: r.get::<_, i64>(3).unwrap_or(0).max(0) as u64,
                }))
            })
            .at(&self.path)?;
        let mut out = Vec::new();
        for r in rows {
            if let Some(c) = r.at(&self.path)? {
                out.push(c);
            }
        }
        Ok(Some(out))
    }

    /// Where the file's kernel-counted calls fell: their samples
    /// ([`Self::count_samples`]) and where their counts ended
    /// ([`Self::count_ends`]), read together: a read that places counted
    /// calls needs both (a window's read without the ends left a file's
    /// launches after its last sample out, round 59).
    pub fn count_places(
        &self,
        pid: Option<u32>,
    ) -> Result<
        (
            Option<Vec<sleuth_core::counted::CountSample>>,
            Vec<sleuth_core::counted::CountSample>,
        ),
        StoreError,
    > {
        Ok((self.count_samples(pid)?, self.count_ends(pid)?))
    }

    /// Each process's exit in `[start, end]` (the file's life): it made
    /// no call after it.
    pub(crate) fn exits_between(
        &self,
        start: u64,
        end: u64,
    ) -> Result<std::collections::HashMap<u32, u64>, StoreError> {
        Ok(self
            .processes()?
            .into_iter()
            .filter_map(|p| Some((p.pid, p.exit_ns?)))
            .filter(|&(_, x)| (start..=end).contains(&x))
            .collect())
    }

    /// Where the file's running counts of kernel-counted calls ended
    /// (`TraceData::count_ends`): each op's total (of process `pid`, or
    /// all) at its process's exit in the file, else at the file's end;
    /// none for a file still being written.
    pub fn count_ends(
        &self,
        pid: Option<u32>,
    ) -> Result<Vec<sleuth_core::counted::CountSample>, StoreError> {
        let session = self.session()?;
        let Some(end) = session.end_mono_ns else {
            return Ok(Vec::new());
        };
        let counts = self.op_counts(pid)?;
        if counts.iter().all(|c| c.count == 0) {
            return Ok(Vec::new());
        }
        let exits = self.exits_between(session.info.start_mono_ns, end)?;
        Ok(counts
            .into_iter()
            .filter(|c| c.count > 0)
            .map(|c| sleuth_core::counted::CountSample {
                ts_ns: exits.get(&c.pid).copied().unwrap_or(end),
                pid: c.pid,
                op: c.op,
                count: c.count,
            })
            .collect())
    }

    /// The processes with caching-allocator events, from their index
    /// (`allocator_rows::pids`): none for most traces.
    pub(crate) fn allocator_pids(&self) -> Result<Vec<u32>, StoreError> {
        if let Some(p) = self.allocator_pids.get() {
            return Ok(p.clone());
        }
        let pids = crate::allocator_rows::pids(&self.conn).at(&self.path)?;
        Ok(self.allocator_pids.get_or_init(|| pids).clone())
    }

    /// Caching-allocator events (`trace --torch-allocator`), by end time.
    /// Traces recorded before the table existed simply have none.
    pub fn allocator_events(
        &self,
        pid: Option<u32>,
    ) -> Result<Vec<sleuth_core::BlockEvent>, StoreError> {
        crate::allocator_rows::load(&self.conn, pid).at(&self.path)
    }

    /// GPU busy samples by time, or `None` when the trace has none (GPU
    /// activity not captured: no NVML, an imported or older trace).
    pub fn gpu_samples(&self) -> Result<Option<Vec<sleuth_core::GpuSample>>, StoreError> {
        if !crate::open::has_table(&self.conn, "gpu_samples").at(&self.path)? {
            return Ok(None);
        }
        let mut st = self
            .conn
            .prepare("SELECT ts_ns, gpu, busy_pct, period_ns FROM gpu_samples ORDER BY ts_ns, gpu")
            .at(&self.path)?;
        let rows = st
            .query_map([], |r| {
                Ok(sleuth_core::GpuSample {
                    ts_ns: r.get::<_, i64>(0)?.max(0) as u64,
                    gpu: r.get(1)?,
                    busy_pct: r.get::<_, f64>(2)?.clamp(0.0, 100.0),
                    period_ns: r.get::<_, i64>(3)?.max(0) as u64,
                })
            })
            .at(&self.path)?;
        let out = rows.collect::<Result<Vec<_>, _>>().at(&self.path)?;
        Ok(if out.is_empty() { None } else { Some(out) })
    }

    /// Per-process driver samples (memory held, SM use), by time.
    pub fn process_gpu_samples(
        &self,
        pid: Option<u32>,
    ) -> Result<Vec<sleuth_core::ProcessGpuSample>, StoreError> {
        if !crate::open::has_table(&self.conn, "process_gpu_samples").at(&self.path)? {
            return Ok(Vec::new());
        }
        let mut st = self
            .conn
            .prepare(
                "SELECT ts_ns, gpu, pid, used_bytes, sm_pct, phase FROM process_gpu_samples
                 WHERE ?1 IS NULL OR pid = ?1 ORDER BY ts_ns, gpu, pid",
            )
            .at(&self.path)?;
        let rows = st
            .query_map([pid], |r| {
                let phase: String = r.get(5)?;
                Ok(sleuth_core::SamplePhase::parse(&phase).map(|phase| {
                    sleuth_core::ProcessGpuSample {
                        ts_ns: r.get::<_, i64>(0).unwrap_or(0).max(0) as u64,
                        gpu: r.get(1).unwrap_or(0),
                        pid: r.get(2).unwrap_or(0),
                        used_bytes: r
                            .get::<_, Option<i64>>(3)
                            .unwrap_or(None)
                            .map(|v| v.max(0) as u64),
                        sm_pct: r.get::<_, Option<f64>>(4).unwrap_or(None),
                        phase,
                    }
                }))
            })
            .at(&self.path)?;
        let mut out = Vec::new();
        for r in rows {
            if let Some(s) = r.at(&self.path)? {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// Every pid the trace holds anything of (processes, calls, waits,
    /// lifecycle events, kernel counts, GPU samples), ascending.
    pub fn pids(&self) -> Result<Vec<u32>, StoreError> {
        Ok(pids_of(self.bulk()?).at(&self.path)?.into_iter().collect())
    }

    /// Whether the trace holds anything of `pid` (as [`Trace::pids`] lists
    /// it): one indexed existence test per table, not the list of every pid
    /// (which reads every wait's pid). The calls are tested in the rollups of
    /// a finished trace, else in the rows (then checked first, see `bulk`).
    pub fn holds_pid(&self, pid: u32) -> Result<bool, StoreError> {
        let (conn, calls) = if self.version == 1 {
            (self.bulk()?, "calls")
        } else if self.has_rollups()? {
            (self.keyed(), "rollup_ops")
        } else {
            (self.bulk()?, "call_rows")
        };
        let mut tables = vec!["processes", calls, "waits", "proc_events", "op_counts"];
        if has_table(conn, "process_gpu_samples").at(&self.path)? {
            tables.push("process_gpu_samples");
        }
        for t in tables {
            let found: bool = conn
                .query_row(
                    &format!("SELECT EXISTS (SELECT 1 FROM {t} WHERE pid = ?1)"),
                    [pid],
                    |r| r.get(0),
                )
                .map_err(|e| self.read_error(e))?;
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The connection for a read of at most `limit` rows of the per-call or
    /// per-wait tables: [`Trace::keyed`] for a bounded read (a tool's page of
    /// calls or waits), [`Trace::bulk`] for an unbounded one.
    fn rows_conn(&self, limit: Option<usize>) -> Result<&Connection, StoreError> {
        match limit {
            Some(n) if n <= KEYED_ROWS => Ok(self.keyed()),
            _ => self.bulk(),
        }
    }

    /// NCCL calls with their arguments, by start time. Traces recorded before
    /// the table existed simply have none.
    pub fn nccl_calls(
        &self,
        pid: Option<u32>,
    ) -> Result<Vec<sleuth_core::nccl::NcclEvent>, StoreError> {
        if !has_table(&self.conn, "nccl_calls").at(&self.path)? {
            return Ok(Vec::new());
        }
        // Most traces have no NCCL call: they need no check of the call rows.
        let any: bool = self
            .conn
            .query_row("SELECT EXISTS (SELECT 1 FROM nccl_calls)", [], |r| r.get(0))
            .at(&self.path)?;
        if !any {
            return Ok(Vec::new());
        }
        let cols: String = crate::rows::CALL_COLS
            .split(", ")
            .map(|c| format!("c.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "SELECT {cols}, n.comm, n.new_comm, n.count, n.datatype, n.redop, n.peer, n.rank,
                n.nranks, n.color, n.unique_id
             FROM nccl_calls n JOIN calls c ON c.id = n.call_id
             WHERE ?1 IS NULL OR c.pid = ?1 ORDER BY c.ts_ns, c.id"
        );
        let mut st = self.bulk()?.prepare(&sql).at(&self.path)?;
        let rows = st
            .query_map([pid], |r| {
                let Some(stored) = crate::rows::call_from_row(r)? else {
                    return Ok(None);
                };
                let u = |i: usize| -> rusqlite::Result<Option<u64>> {
                    Ok(r.get::<_, Option<i64>>(i)?.map(|v| v as u64))
                };
                Ok(Some(sleuth_core::nccl::NcclEvent {
                    call: stored.call,
                    comm: u(15)?,
                    new_comm: u(16)?,
                    count: u(17)?,
                    datatype: r.get(18)?,
                    redop: r.get(19)?,
                    peer: r.get(20)?,
                    rank: r.get(21)?,
                    nranks: r.get(22)?,
                    color: r.get(23)?,
                    unique_id: r.get(24)?,
                }))
            })
            .at(&self.path)?;
        let mut out = Vec::new();
        for r in rows {
            if let Some(e) = r.at(&self.path)? {
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Fails when `pid` is not in the trace, naming the pids it holds: an
    /// absent process must not read as a clean bill of health.
    pub fn require_pid(&self, pid: u32) -> Result<(), StoreError> {
        if self.holds_pid(pid)? {
            return Ok(());
        }
        let pids = self.pids()?;
        if pids.contains(&pid) {
            return Ok(());
        }
        Err(StoreError::file(
            &self.path,
            format!("pid {pid} is not in this trace ({})", pids_held(pids)),
        ))
    }

    /// Host and host pid of each process of a merged trace (empty otherwise).
    pub fn process_hosts(&self) -> Result<BTreeMap<u32, sleuth_core::NodeProcess>, StoreError> {
        if !has_table(&self.conn, "process_nodes").at(&self.path)? {
            return Ok(BTreeMap::new());
        }
        let mut st = self
            .conn
            .prepare("SELECT pid, host, host_pid FROM process_nodes ORDER BY pid")
            .at(&self.path)?;
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get::<_, u32>(0)?,
                    sleuth_core::NodeProcess {
                        host: r.get(1)?,
                        pid: r.get(2)?,
                    },
                ))
            })
            .at(&self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(&self.path)
    }

    /// The nodes a merged trace was made from (empty for a single-node trace).
    pub fn merge_nodes(&self) -> Result<Vec<crate::types::MergeNode>, StoreError> {
        if !has_table(&self.conn, "merge_nodes").at(&self.path)? {
            return Ok(Vec::new());
        }
        let mut st = self
            .conn
            .prepare(
                "SELECT node, hostname, source, realtime_offset_ns, shift_ns, skew_ns, skew_applied,
                    skew_samples, skew_spread_ns, pid_offset FROM merge_nodes ORDER BY node",
            )
            .at(&self.path)?;
        let rows = st
            .query_map([], |r| {
                Ok(crate::types::MergeNode {
                    node: r.get(0)?,
                    hostname: r.get(1)?,
                    source: r.get(2)?,
                    realtime_offset_ns: r.get(3)?,
                    shift_ns: r.get(4)?,
                    skew_ns: r.get(5)?,
                    skew_applied: r.get(6)?,
                    skew_samples: r.get(7)?,
                    skew_spread_ns: r.get(8)?,
                    pid_offset: r.get(9)?,
                })
            })
            .at(&self.path)?;
        rows.collect::<rusqlite::Result<_>>().at(&self.path)
    }

    /// Whether the trace holds complete rollups (written by a writer that
    /// finished; merged, imported, cut-short and older traces do not).
    pub fn has_rollups(&self) -> Result<bool, StoreError> {
        rollups_complete(&self.conn).map_err(|e| self.read_error(e))
    }

    /// The stats answer from the rollups, without reading a call row: None
    /// when the trace has no complete rollups (see [`Trace::has_rollups`]);
    /// then `sleuth_core::stats::compute` over [`Trace::load`] answers.
    /// Percentiles carry the histogram's bound (`sleuth_core::rollup`).
    pub fn stats_report(
        &self,
        pid: Option<u32>,
    ) -> Result<Option<sleuth_core::stats::StatsReport>, StoreError> {
        if !self.has_rollups()? {
            return Ok(None);
        }
        if let Some(pid) = pid {
            self.require_pid(pid)?;
        }
        let rollups = self.stored_rollups(pid).map_err(|e| self.read_error(e))?;
        let base = TraceData {
            counts: self.op_counts(pid)?,
            stats: self.stats()?,
            has_host_context: self.has_host_context(),
            ..Default::default()
        };
        Ok(Some(sleuth_core::rollup::stats_report(
            &rollups, pid, &base,
        )))
    }

    pub(crate) fn stored_rollups(
        &self,
        pid: Option<u32>,
    ) -> rusqlite::Result<sleuth_core::rollup::StoredRollups> {
        use sleuth_core::decompose::{CulpritTime, Split};
        use sleuth_core::rollup::{Bucket, OpRollup, StoredRollups};
        // Every stored count, time and sum is the writer's and at most 2^62
        // (the bound of every time a reader accepts): past it, or negative,
        // the file was crafted or damaged, and sums of such values would
        // overflow the answer's arithmetic.
        let checked = |table: &'static str| {
            move |r: &rusqlite::Row, i: usize| -> rusqlite::Result<u64> {
                let v: i64 = r.get(i)?;
                u64::try_from(v)
                    .ok()
                    .filter(|&v| v <= crate::problems::MAX_NS as u64)
                    .ok_or_else(|| {
                        crate::finding_rollups::damaged_table(
                            table,
                            &format!("holds a value no trace holds ({v})"),
                        )
                    })
            }
        };
        let u = checked("rollup_ops");
        let mut ops: BTreeMap<(u32, u16), OpRollup> = BTreeMap::new();
        let mut st = self.conn.prepare(
            "SELECT pid, op, count, errors, total_ns, max_ns, on_cpu_ns, runnable_ns, blocked_ns
             FROM rollup_ops WHERE ?1 IS NULL OR pid = ?1",
        )?;
        let mut rows = st.query([pid])?;
        while let Some(r) = rows.next()? {
            let Some(info) = op_by_name(&r.get::<_, String>(1)?) else {
                continue;
            };
            let o = ops.entry((r.get(0)?, info.id)).or_default();
            o.count = u(r, 2)?;
            o.errors = u(r, 3)?;
            o.total_ns = u(r, 4)?;
            o.max_ns = u(r, 5)?;
            o.split = Split {
                on_cpu_ns: u(r, 6)?,
                runnable_ns: u(r, 7)?,
                blocked_ns: u(r, 8)?,
            };
        }
        let mut st = self.conn.prepare(
            "SELECT pid, op, bucket, count, on_cpu_ns, runnable_ns, blocked_ns
             FROM rollup_hist WHERE ?1 IS NULL OR pid = ?1",
        )?;
        let h = checked("rollup_hist");
        let mut rows = st.query([pid])?;
        while let Some(r) = rows.next()? {
            let Some(info) = op_by_name(&r.get::<_, String>(1)?) else {
                continue;
            };
            // A histogram row without its op row is not from our writer: skipped.
            let Some(o) = ops.get_mut(&(r.get(0)?, info.id)) else {
                continue;
            };
            let Ok(bucket) = u32::try_from(r.get::<_, i64>(2)?) else {
                continue;
            };
            o.buckets.insert(
                bucket,
                Bucket {
                    count: h(r, 3)?,
                    split: Split {
                        on_cpu_ns: h(r, 4)?,
                        runnable_ns: h(r, 5)?,
                        blocked_ns: h(r, 6)?,
                    },
                },
            );
        }
        for o in ops.values() {
            crate::finding_rollups::check_count(o.buckets.count(), "rollup_hist")?;
        }
        let mut culprits = Vec::new();
        let mut st = self.conn.prepare(
            "SELECT pid, op, culprit_pid, comm, runnable_ns FROM rollup_culprits
             WHERE ?1 IS NULL OR pid = ?1",
        )?;
        let mut rows = st.query([pid])?;
        // Files written before round 51 stored the tracer's threads as culprits.
        let tracer = self.tracer_pid();
        while let Some(r) = rows.next()? {
            let Some(info) = op_by_name(&r.get::<_, String>(1)?) else {
                continue;
            };
            if is_tracer(r.get(2)?, r.get_ref(3)?.as_str().unwrap_or(""), tracer) {
                continue;
            }
            culprits.push((
                r.get(0)?,
                info.id,
                CulpritTime {
                    pid: r.get(2)?,
                    comm: r.get(3)?,
                    runnable_ns: checked("rollup_culprits")(r, 4)?,
                },
            ));
        }
        let mut threads = Vec::new();
        let mut st = self
            .conn
            .prepare("SELECT split FROM rollup_threads WHERE ?1 IS NULL OR pid = ?1")?;
        let mut rows = st.query([pid])?;
        while let Some(r) = rows.next()? {
            let text: String = r.get(0)?;
            let mut t: sleuth_core::threads::ThreadSplit = crate::stored_json::parse(&text)
                .map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        0,
                        rusqlite::types::Type::Text,
                        format!("rollup_threads: {e}").into(),
                    )
                })?;
            // Shares are recomputed as the analysis computes them, so the
            // answer does not depend on how floats survive JSON.
            sleuth_core::rollup::waker_shares(&mut t.wakers);
            threads.push(t);
        }
        Ok(StoredRollups {
            ops: ops.into_iter().map(|((p, op), o)| (p, op, o)).collect(),
            culprits,
            threads,
        })
    }

    /// The whole trace (or one process of it) in memory, as analyses consume it.
    /// A `pid` the trace does not hold is an error (see [`Trace::require_pid`]).
    /// Unusable rows are skipped (see [`Trace::input_problems`]); a file whose
    /// valid durations or sizes still add up past 2^62 is refused as damaged.
    pub fn load(&self, pid: Option<u32>) -> Result<TraceData, StoreError> {
        self.load_calls_of(&CallFilter {
            pid,
            ..Default::default()
        })
    }

    /// [`Trace::load`] of `calls.pid` with only the calls `calls` selects
    /// (an op, a window: read through the indexes, not loaded then
    /// dropped); everything else as `load` reads it. The order and limit
    /// of `calls` are ignored: calls come in time order, all of them.
    pub fn load_calls_of(&self, calls: &CallFilter) -> Result<TraceData, StoreError> {
        let pid = calls.pid;
        if let Some(pid) = pid {
            self.require_pid(pid)?;
        }
        if self.call_scan()?.totals_overflow {
            return Err(StoreError::file(&self.path, problems::TOTALS_OVERFLOW));
        }
        let calls = self
            .calls_filtered(&CallFilter {
                order: CallOrder::ByTime,
                limit: None,
                ..calls.clone()
            })?
            .into_iter()
            .map(|s| s.call)
            .collect();
        let waits = self.waits_filtered(&WaitFilter {
            pid,
            ..Default::default()
        })?;
        let (count_samples, count_ends) = self.count_places(pid)?;
        Ok(TraceData {
            calls,
            waits,
            procs: self.proc_events(pid)?,
            counts: self.op_counts(pid)?,
            count_samples,
            count_ends,
            // Matching collectives needs every rank, whatever the pid filter.
            nccl: self.nccl_calls(None)?,
            ..self.frame(pid)?
        })
    }

    /// What [`Trace::load`] reads besides the per-event rows (calls, waits,
    /// lifecycle events, kernel counts, NCCL calls): the session's times,
    /// processes, counters, GPU samples, allocator blocks and stacks, of one
    /// process or all. The streamed views start from it.
    pub fn frame(&self, pid: Option<u32>) -> Result<TraceData, StoreError> {
        Ok(TraceData {
            blocks: self.allocator_events(pid)?,
            ..self.frame_without_blocks(pid)?
        })
    }

    /// [`Trace::frame`] without the allocator events: a view that streams
    /// them from the file (`stream::MemoryTrace`) does not hold them.
    pub(crate) fn frame_without_blocks(&self, pid: Option<u32>) -> Result<TraceData, StoreError> {
        let session = self.session()?;
        let mut processes = self.processes()?;
        if let Some(pid) = pid {
            processes.retain(|p| p.pid == pid);
        }
        Ok(TraceData {
            processes,
            stats: self.stats()?,
            start_ns: Some(session.info.start_mono_ns),
            end_ns: session.end_mono_ns,
            realtime_offset_ns: session.info.realtime_offset_ns,
            has_host_context: self.has_host_context(),
            copy_host_ptrs_unknown: self.has_host_context()
                && !crate::open::has_table(&self.conn, "call_host_ptrs")
                    .map_err(|e| self.read_error(e))?,
            gpu_samples: self.gpu_samples()?,
            process_gpu: self.process_gpu_samples(pid)?,
            hosts: self.process_hosts()?,
            hostname: session.info.hostname.clone(),
            stacks: self.stacks(pid)?,
            ..Default::default()
        })
    }
}

/// "it holds pid 7, 9" (the first 20, then how many more), or "it holds no
/// process": what an error about a pid not in a trace or a run says.
pub fn pids_held(pids: impl IntoIterator<Item = u32>) -> String {
    const SHOWN: usize = 20;
    let pids: Vec<u32> = pids.into_iter().collect();
    let mut list: Vec<String> = pids.iter().take(SHOWN).map(u32::to_string).collect();
    if pids.len() > SHOWN {
        list.push(format!("... {} more", pids.len() - SHOWN));
    }
    match pids.is_empty() {
        true => "it holds no process".to_string(),
        false => format!("it holds pid {}", list.join(", ")),
    }
}

/// Every pid a trace holds anything of: processes, calls, waits, lifecycle
/// events, kernel counts and (where the table exists) NVML samples. Values
/// that are no pid (negative, too large) are left out.
pub(crate) fn pids_of(conn: &Connection) -> rusqlite::Result<std::collections::BTreeSet<u32>> {
    // The pids of the calls: version 1 reads them from its `(pid, op)`
    // index; version 2 has no such index, and a finished trace's rollups
    // count every stored call per pid, so it reads those (else every row).
    let version: Option<String> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    let calls = if version.as_deref() == Some("1") {
        "calls"
    } else if rollups_complete(conn)? {
        "rollup_ops"
    } else {
        "call_rows"
    };
    let mut sql = format!(
        "SELECT pid FROM processes UNION SELECT pid FROM {calls} UNION SELECT pid FROM waits
         UNION SELECT pid FROM proc_events UNION SELECT pid FROM op_counts",
    );
    // Traces written before GPU sampling existed have no such table.
    if has_table(conn, "process_gpu_samples")? {
        sql.push_str(" UNION SELECT pid FROM process_gpu_samples");
    }
    let mut st = conn.prepare(&sql)?;
    let rows = st.query_map([], |r| r.get::<_, i64>(0))?;
    let mut out = std::collections::BTreeSet::new();
    for r in rows {
        if let Ok(pid) = u32::try_from(r?) {
            out.insert(pid);
        }
    }
    Ok(out)
}

/// Whether the trace holds complete rollups (see [`Trace::has_rollups`]).
pub(crate) fn rollups_complete(conn: &Connection) -> rusqlite::Result<bool> {
    for t in [
        "rollup_ops",
        "rollup_hist",
        "rollup_culprits",
        "rollup_threads",
    ] {
        if !has_table(conn, t)? {
            return Ok(false);
        }
    }
    let v = crate::open::meta_value(conn, "rollups")?;
    Ok(v.as_deref() == Some(crate::finalize::ROLLUPS_COMPLETE))
}

fn where_clause(conds: &[String]) -> String {
    if conds.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conds.join(" AND "))
    }
}

/// [`check_schema`], unless `checks` (the file's, for the bytes `conn`
/// opened) say its schema passed for `version` in this process; recorded
/// there when it passes.
fn check_schema_once(
    conn: &Connection,
    path: &Path,
    version: i64,
    checks: Option<&Checks>,
) -> Result<(), StoreError> {
    if checks.is_some_and(|c| c.lock().schema == Some(version)) {
        return Ok(());
    }
    check_schema(conn, path, version)?;
    if let Some(c) = checks {
        c.lock().schema = Some(version);
    }
    Ok(())
}

/// The file's tables, columns and indexes are the ones gpusleuth writes.
pub(crate) fn check_schema(conn: &Connection, path: &Path, version: i64) -> Result<(), StoreError> {
    #[cfg(test)]
    SCHEMA_CHECKS.with(|n| n.set(n.get() + 1));
    match crate::schema_check::check(conn, version) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(why)) => Err(StoreError::file(
            path,
            format!("not a schema gpusleuth writes: {why}"),
        )),
        Err(e) => Err(StoreError::file(path, short(&e))),
    }
}

#[cfg(test)]
thread_local! {
    /// Schema checks run on this thread (the tests count them).
    pub(crate) static SCHEMA_CHECKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A stored time (ns) when it is one a trace can hold.
fn valid_ns(v: i64) -> Option<u64> {
    (0..=MAX_NS).contains(&v).then_some(v as u64)
}

/// Checks `meta` says this is a gpusleuth trace of a schema we read: its
/// source and schema version.
/// Whether SQLite's error says the file is damaged (a page that does not
/// parse), not that it holds something else.
fn damage(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

pub(crate) fn check_is_trace(
    conn: &Connection,
    path: &Path,
) -> Result<(TraceSource, i64), StoreError> {
    let not_ours = || {
        StoreError::file(
            path,
            "not a gpusleuth trace database (no gpusleuth meta table)",
        )
    };
    let meta_is_table: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)
        .map_err(|e| StoreError::file(path, short(&e)))?;
    if !meta_is_table {
        return Err(not_ours());
    }
    let get = |key: &str| -> Result<Option<String>, StoreError> {
        conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| match damage(&e) {
                // Random bytes over the meta table's page read "not a
                // gpusleuth trace" (round 60's tester): it is one, damaged.
                true => StoreError::file(
                    path,
                    format!("SQLite database is damaged: {}", crate::open::short(&e)),
                ),
                false => not_ours(),
            })
    };
    if get("tool")?.as_deref() != Some(TOOL) {
        return Err(not_ours());
    }
    let version = get("schema_version")?.unwrap_or_default();
    let Some(version) = READABLE_VERSIONS
        .iter()
        .copied()
        .find(|v| v.to_string() == version)
    else {
        return Err(StoreError::file(
            path,
            format!("trace schema version {version:?} is not supported (this build reads 1 to {SCHEMA_VERSION})"),
        ));
    };
    let source = get("source")?.unwrap_or_default();
    let source = TraceSource::parse(&source)
        .ok_or_else(|| StoreError::file(path, format!("unknown trace source {source:?}")))?;
    Ok((source, version))
}
