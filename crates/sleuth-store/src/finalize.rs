//! What `TraceWriter::finish` computes once all events are in: call
//! culprits, the final `processes` table, and the rollups `stats` answers
//! from (see `sleuth_core::rollup` and docs/schema.md).

use crate::finding_rollups::row_index;
use crate::rows::{call_from_row_by_op_id, OpIds};
use crate::run_ledger::RunLink;
use crate::thread_pass::{sort_culprits, ThreadPass};
use crate::writer::upsert_process;
use rusqlite::{params, Connection};
use sleuth_core::findings::inputs::PinnedState;
use sleuth_core::rollup::{OpRollup, Rollup};
use sleuth_core::threads::{ThreadStream, TRACER_PID_STAT};
use sleuth_core::{ProcKind, ProcessInfo};
use std::collections::BTreeMap;

/// Value of `meta.rollups` once every rollup table is complete. Readers use
/// the rollups only then; a trace cut short (killed writer), merged or
/// imported has no such row and is answered from its raw rows.
pub(crate) const ROLLUPS_COMPLETE: &str = "1";

/// The `stats` counter of the CPU time the writer's thread spent completing
/// the file (culprits, rollups, late indexes), in ns.
pub const COMPLETION_CPU_STAT: &str = "tracer_cpu_ns_completion";

/// Fills `call_culprits`, completes `processes` and writes the rollups;
/// returns the culprit rows written. A file of a rotating trace (`run`)
/// also stores the run's ledger carried from the previous file
/// (`run_ledger`), and hands it to the next one only once committed.
pub(crate) fn complete(
    conn: &mut Connection,
    rollup: &Rollup,
    run: Option<&RunLink>,
) -> rusqlite::Result<u64> {
    complete_after(conn, rollup, run, |_| Ok(true)).map(Option::unwrap_or_default)
}

/// [`complete`], with `first` run in the same transaction before it, which
/// says whether to complete the file (`gpusleuth finish` checks that no one
/// completed it since it looked, then drops the windows it made again and
/// notes who completed it); None, nothing written, when it says not to.
pub(crate) fn complete_after(
    conn: &mut Connection,
    rollup: &Rollup,
    run: Option<&RunLink>,
    first: impl FnOnce(&Connection) -> rusqlite::Result<bool>,
) -> rusqlite::Result<Option<u64>> {
    let cpu_at_start = crate::writer::thread_cpu_ns();
    // The write lock from the start: what `first` reads to decide stays
    // so until the commit (no other writer may come between).
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    if !first(&tx)? {
        return Ok(None);
    }
    complete_processes(&tx, rollup)?;
    // The run's state when this file began: the copies are judged against
    // the host ranges pinned in its earlier files (`run_pinned`).
    let carried = run
        .map(|link| crate::run_ledger::begin(&tx, link))
        .transpose()?;
    let earlier = carried
        .as_ref()
        .map(|c| c.pinned().clone())
        .unwrap_or_default();
    let judged_with_run = carried
        .as_ref()
        .is_some_and(crate::run_ledger::Carried::covers_whole_run);
    if judged_with_run {
        crate::run_pinned::store_judged_from(&tx, &earlier)?;
    }
    // First: the per-thread pass reads each thread's calls by (tid, ts_ns).
    tx.execute_batch(crate::schema::LATE_INDEXES)?;
    // Before the allocator views' passes: how they read the allocator rows.
    crate::allocator_rows::settle_order(&tx)?;
    let (rows, pinned_at_end) = per_thread_pass(&tx, rollup, earlier)?;
    // After the call groups: the ledger lists the processes they name. Its
    // replay of the memory calls also tallies what each site allocated.
    let sites = std::cell::RefCell::new(crate::site_rollup::Tallies::default());
    // The same replay calibrates the allocator views (traces with allocator events).
    // The processes with allocator events, read once (a pass over the
    // allocator rows when they are in completion order).
    let allocator_pids = crate::allocator_rows::pids(&tx)?;
    let calibrating = std::cell::RefCell::new(crate::allocator_rollup::calibration_feed(
        &tx,
        &allocator_pids,
    )?);
    let chain = run
        .zip(carried)
        .map(|(link, c)| (link, c, pinned_at_end, allocator_pids.as_slice()));
    let carry = crate::run_ledger::write(
        &tx,
        chain,
        |c, id| {
            sites.borrow_mut().add(c, id);
            if let Some(feed) = calibrating.borrow_mut().as_mut() {
                feed.push_call(c);
            }
        },
        // After the file's ledgers: the sites' unfreed bytes and peaks come
        // from them, and the allocator views' reserved bytes.
        |own| {
            crate::site_rollup::write(&tx, sites.take(), &own.ends, &own.at_peak)?;
            let calibrations = match calibrating.take() {
                Some(feed) => crate::allocator_rollup::calibrations(feed.finish(None)?),
                None => Default::default(),
            };
            crate::allocator_rollup::write(&tx, &own, calibrations)
        },
    )?;
    crate::wait_groups::write(&tx)?;
    tx.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('rollups', ?1)",
        [ROLLUPS_COMPLETE],
    )?;
    // What completing the file cost (the commit after this aside): the
    // tracer's CPU per event while tracing leaves it out, `bench` reports it.
    crate::writer::set_stat(
        &tx,
        COMPLETION_CPU_STAT,
        crate::writer::thread_cpu_ns().saturating_sub(cpu_at_start),
    )?;
    tx.commit()?;
    if let (Some(link), Some(carry)) = (run, carry) {
        link.settle(carry);
    }
    Ok(Some(rows))
}

/// One thread at a time (`thread_pass`), streaming its calls and its waits
/// once each (ordered reads), so memory stays bounded by the calls and
/// waits overlapping one another, not by the thread or the trace: its call culprits
/// (`call_culprits`, summed per op into `rollup_culprits`), the finding
/// rollups of its non-nested calls (fed with the culprits just computed:
/// the calls are read once for both, not again with their culprit rows),
/// its whole-thread split (`rollup_threads`), its call groups and its
/// process's per-op rollups (`rollup_ops`, `rollup_hist`). Threads come in
/// (pid, tid) order: once a process's threads are done, its pinned-memory
/// replay is fed and everything of its own is stored and forgotten
/// ([`ProcessEnd`]), so what the pass holds is one process's aggregates
/// and the whole file's, not every process's (a file of 2,000 short-lived
/// processes: ~27 KB held per process to the end before, round 46).
fn per_thread_pass(
    conn: &Connection,
    rollup: &Rollup,
    earlier: PinnedState,
) -> rusqlite::Result<(u64, PinnedState)> {
    conn.execute("DELETE FROM call_culprits", [])?;
    let tracer: Option<i64> = conn
        .query_row(
            "SELECT value FROM stats WHERE name = ?1",
            [TRACER_PID_STAT],
            |r| r.get(0),
        )
        .ok();
    let tracer = tracer
        .and_then(|t| u32::try_from(t).ok())
        .filter(|&t| t != 0);
    let comms: BTreeMap<u32, String> = all_processes(conn)?
        .into_iter()
        .map(|p| (p.pid, p.comm))
        .collect();
    let mut ins = conn.prepare(
        "INSERT INTO call_culprits(call_id, pid, tid, comm, runnable_ns) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    let mut ins_thread =
        conn.prepare("INSERT INTO rollup_threads(pid, tid, split) VALUES (?1, ?2, ?3)")?;
    // Ties in start order by row id: the order the finding rollups' examples
    // need. The op as its id, named once (no join of `ops` per row).
    let all_calls_sql =
        crate::stream::own_calls_sql_by_op_id("WHERE pid = ?1 AND tid = ?2 ORDER BY ts_ns, id");
    let op_ids = OpIds::of(conn)?;
    let waits_sql = crate::wait_stream::thread_waits_sql(conn, "1")?;
    crate::finding_rollups::begin(conn)?;
    crate::scope_rollups::OpScopes::begin(conn)?;
    crate::call_groups::begin(conn)?;
    let mut end = ProcessEnd {
        inputs: crate::finding_rollups::new_inputs(tracer).with_pinned(earlier.clone()),
        scopes: crate::scope_rollups::OpScopes::new(tracer, earlier),
        groups: crate::call_groups::Groups::default(),
        ops: BTreeMap::new(),
        tids: Vec::new(),
    };
    let replay_sql = crate::finding_rollups::end_order_by_process_sql(conn)?;
    let mut replay_st = conn.prepare(&replay_sql)?;
    let mut replay = crate::finding_rollups::EndOrderByProcess::new(replay_st.query([])?);
    let mut written = 0u64;
    let mut current: Option<u32> = None;
    let mut set_aside = crate::thread_windows::statement(conn)?;
    let mut threads = crate::thread_windows::Merged::new(rollup, set_aside.as_mut())?;
    while let Some(((pid, tid), windows)) = threads.next()? {
        if let Some(done) = current.filter(|&p| p != pid) {
            end.store(conn, done, &mut replay)?;
        }
        current = Some(pid);
        end.tids.push(tid);
        let window = windows.whole;
        // Every call (nested too) against the waits that overlap it; the
        // split of its non-nested calls and all its waits from the same
        // read (none for a thread with nested calls only).
        let mut cst = conn.prepare_cached(&all_calls_sql)?;
        let mut calls = cst.query(params![pid, tid])?;
        let mut wst = conn.prepare_cached(&waits_sql)?;
        let split = window.map(|w| ThreadStream::new(pid, tid, w, tracer));
        let mut pass = ThreadPass::new(wst.query(params![pid, tid])?, split, tracer)
            .with_op_splits(&windows.ops, pid, tid, tracer);
        while let Some(row) = calls.next()? {
            let Some(s) = call_from_row_by_op_id(row, &op_ids)? else {
                continue;
            };
            end.groups.add_call(&s.call);
            end.ops.entry(s.call.op).or_default().add(&s.call);
            let mut culprits = pass.call(&s.call)?;
            for c in &culprits {
                ins.execute(params![s.id, c.pid, c.tid, c.comm, c.ns as i64])?;
                written += 1;
            }
            if !s.call.nested {
                sort_culprits(&mut culprits);
                end.inputs.add_call(row_index(s.id), &s.call, &culprits);
                end.scopes.add_call(&s.call);
            }
        }
        drop(calls);
        let comm = comms.get(&pid).map(String::as_str).unwrap_or("?");
        let (split, op_splits) = pass.finish_with_ops(comm)?;
        end.scopes.add_splits(pid, tid, op_splits);
        if let Some(split) = split {
            let json = serde_json::to_string(&split)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
            ins_thread.execute(params![pid, tid, json])?;
        }
    }
    if let Some(done) = current {
        end.store(conn, done, &mut replay)?;
    }
    drop(threads);
    drop(set_aside);
    crate::thread_windows::drop_table(conn)?;
    let ProcessEnd {
        inputs,
        mut scopes,
        groups,
        ..
    } = end;
    let pinned_at_end = crate::finding_rollups::finish(conn, inputs, &mut scopes, &mut replay)?;
    drop(replay);
    scopes.write(conn)?;
    crate::call_groups::finish(conn, groups)?;
    // Per-op culprit sums; a float total and a clamp so a crafted huge sum
    // cannot fail the finish with an integer overflow.
    conn.execute(
        "INSERT INTO rollup_culprits(pid, op, culprit_pid, comm, runnable_ns)
         SELECT c.pid, c.op, k.pid, k.comm, CAST(min(total(k.runnable_ns), 9.2e18) AS INTEGER)
         FROM call_culprits k JOIN calls c ON c.id = k.call_id
         GROUP BY c.pid, c.op, k.pid, k.comm",
        [],
    )?;
    Ok((written, pinned_at_end))
}

/// What the per-thread pass holds of the process whose threads it is
/// reading, beside the whole file's aggregates; stored and forgotten once
/// its threads are done ([`ProcessEnd::store`]).
struct ProcessEnd {
    inputs: sleuth_core::findings::inputs::FindingInputs,
    scopes: crate::scope_rollups::OpScopes,
    groups: crate::call_groups::Groups,
    /// The process's per-op rollups (`rollup_ops`, `rollup_hist`), every
    /// call of it, nested ones too.
    ops: BTreeMap<u16, OpRollup>,
    /// Its threads read so far.
    tids: Vec<u32>,
}

impl ProcessEnd {
    /// Process `pid`'s threads are all read: its pinned-memory replay is
    /// fed, and its rows are stored and its aggregates forgotten.
    fn store(
        &mut self,
        conn: &Connection,
        pid: u32,
        replay: &mut crate::finding_rollups::EndOrderByProcess<'_>,
    ) -> rusqlite::Result<()> {
        let (inputs, scopes) = (&mut self.inputs, &mut self.scopes);
        replay.feed_through(Some(pid), |id, c| {
            inputs.add_in_end_order(row_index(id), c);
            scopes.replay_in_end_order(id, c);
        })?;
        let taken = self.inputs.take_process(pid, &self.tids);
        crate::finding_rollups::store_process(conn, pid, &taken)?;
        self.scopes.store_process(conn, pid, &self.tids)?;
        self.groups.store_through(conn, pid)?;
        write_op_rollups(conn, pid, &std::mem::take(&mut self.ops))?;
        self.tids.clear();
        Ok(())
    }
}

fn all_processes(conn: &Connection) -> rusqlite::Result<Vec<ProcessInfo>> {
    let mut st = conn.prepare(
        "SELECT pid, ppid, comm, cmdline, start_ns, exit_ns, exit_code, oom_victim FROM processes",
    )?;
    let rows = st.query_map([], |r| {
        Ok(ProcessInfo {
            pid: r.get(0)?,
            ppid: r.get(1)?,
            comm: r.get(2)?,
            cmdline: r.get(3)?,
            start_ns: r.get::<_, Option<i64>>(4)?.map(|v| v as u64),
            exit_ns: r.get::<_, Option<i64>>(5)?.map(|v| v as u64),
            exit_code: r.get(6)?,
            oom_victim: r.get(7)?,
        })
    })?;
    rows.collect()
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Process `pid`'s `rollup_ops` and `rollup_hist` rows.
fn write_op_rollups(
    conn: &Connection,
    pid: u32,
    ops: &BTreeMap<u16, OpRollup>,
) -> rusqlite::Result<()> {
    let mut op_st = conn.prepare_cached(
        "INSERT INTO rollup_ops(pid, op, count, errors, total_ns, max_ns, on_cpu_ns, runnable_ns, blocked_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?;
    let mut h_st = conn.prepare_cached(
        "INSERT INTO rollup_hist(pid, op, bucket, count, on_cpu_ns, runnable_ns, blocked_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for (&op, r) in ops {
        let Some(info) = sleuth_core::op_by_id(op) else {
            continue;
        };
        op_st.execute(params![
            pid,
            info.name,
            clamp(r.count),
            clamp(r.errors),
            clamp(r.total_ns),
            clamp(r.max_ns),
            clamp(r.split.on_cpu_ns),
            clamp(r.split.runnable_ns),
            clamp(r.split.blocked_ns)
        ])?;
        for (b, v) in r.buckets.iter() {
            h_st.execute(params![
                pid,
                info.name,
                b,
                clamp(v.count),
                clamp(v.split.on_cpu_ns),
                clamp(v.split.runnable_ns),
                clamp(v.split.blocked_ns)
            ])?;
        }
    }
    Ok(())
}

/// Merges lifecycle events into `processes`: fork parents and times, exec
/// names, exit times and codes, OOM victims; adds processes seen only in calls.
fn complete_processes(conn: &Connection, rollup: &Rollup) -> rusqlite::Result<()> {
    let mut procs: BTreeMap<u32, ProcessInfo> = all_processes(conn)?
        .into_iter()
        .map(|p| (p.pid, p))
        .collect();
    let mut st = conn.prepare(
        "SELECT ts_ns, kind, pid, ppid, exit_code, comm FROM proc_events ORDER BY ts_ns, id",
    )?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let ts = r.get::<_, i64>(0)? as u64;
        let kind: String = r.get(1)?;
        let pid: u32 = r.get(2)?;
        let ppid: Option<u32> = r.get(3)?;
        let code: Option<i32> = r.get(4)?;
        let comm: String = r.get(5)?;
        let p = procs.entry(pid).or_insert_with(|| ProcessInfo {
            pid,
            ..Default::default()
        });
        if p.comm.is_empty() {
            p.comm = comm.clone();
        }
        match ProcKind::parse(&kind) {
            Some(ProcKind::Fork) => {
                p.ppid = p.ppid.or(ppid);
                p.start_ns = Some(p.start_ns.map_or(ts, |s| s.min(ts)));
            }
            Some(ProcKind::Exec) => {
                if !comm.is_empty() {
                    p.comm = comm;
                }
                // The earliest sign of the process: a launched command's
                // row was written when the tracer read /proc, after its
                // exec (2-8 ms: often after its first call, for a short
                // program after its exit; round 51's tester).
                p.start_ns = Some(p.start_ns.map_or(ts, |s| s.min(ts)));
            }
            Some(ProcKind::Exit) => {
                p.exit_ns = Some(ts);
                if code.is_some() {
                    p.exit_code = code;
                }
            }
            Some(ProcKind::OomVictim) => p.oom_victim = true,
            None => {}
        }
    }
    drop(rows);
    // Processes seen only through their calls, from their threads' first
    // calls as the writer stored them (a `GROUP BY pid` over the call rows
    // sorted every row: 0.15-0.24 s of a 1M-call file's completion).
    let mut first: BTreeMap<u32, u64> = BTreeMap::new();
    let mut set_aside = crate::thread_windows::statement(conn)?;
    let mut threads = crate::thread_windows::Merged::new(rollup, set_aside.as_mut())?;
    while let Some(((pid, _), w)) = threads.next()? {
        if let Some(f) = w.first_ns {
            let e = first.entry(pid).or_insert(f);
            *e = (*e).min(f);
        }
    }
    drop(threads);
    for (pid, first) in first {
        let p = procs.entry(pid).or_insert_with(|| ProcessInfo {
            pid,
            ..Default::default()
        });
        // The earliest sign of the process, as a fork or exec gives it: a
        // row read from /proc after a late event of the process (a call
        // drained after its exit) started it after its calls.
        p.start_ns = Some(p.start_ns.map_or(first, |s| s.min(first)));
    }
    for p in procs.values_mut() {
        // Never started after it exited (round 54's tester: a row read as
        // a new file began, after an exit early in the file).
        if let (Some(s), Some(x)) = (p.start_ns, p.exit_ns) {
            p.start_ns = Some(s.min(x));
        }
        upsert_process(conn, p)?;
    }
    Ok(())
}
