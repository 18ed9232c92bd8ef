//! What `TraceWriter::finish` computes once all events are in: call culprits
//! and the final `processes` table.

use crate::rows::{query_calls, query_waits};
use crate::writer::upsert_process;
use rusqlite::types::Value;
use rusqlite::{params, Connection};
use sleuth_core::culprits::call_culprits;
use sleuth_core::{ProcKind, ProcessInfo};
use std::collections::BTreeMap;

/// Fills `call_culprits` and completes `processes`; returns the culprit rows written.
pub(crate) fn complete(conn: &mut Connection) -> rusqlite::Result<u64> {
    let tx = conn.transaction()?;
    let rows = fill_call_culprits(&tx)?;
    complete_processes(&tx)?;
    tx.commit()?;
    Ok(rows)
}

/// One thread at a time, so memory is bounded by the busiest thread, not the trace.
fn fill_call_culprits(conn: &Connection) -> rusqlite::Result<u64> {
    conn.execute("DELETE FROM call_culprits", [])?;
    let threads: Vec<(i64, i64)> = conn
        .prepare("SELECT DISTINCT pid, tid FROM waits WHERE runnable_ns > 0")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut ins = conn.prepare(
        "INSERT INTO call_culprits(call_id, pid, tid, comm, runnable_ns) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    let mut written = 0u64;
    for (pid, tid) in threads {
        let args = [Value::Integer(pid), Value::Integer(tid)];
        let stored = query_calls(conn, "WHERE pid = ?1 AND tid = ?2 ORDER BY ts_ns", &args)?;
        if stored.is_empty() {
            continue;
        }
        let waits = query_waits(
            conn,
            "WHERE w.pid = ?1 AND w.tid = ?2 AND w.runnable_ns > 0 ORDER BY w.on_ns",
            &args,
        )?;
        let calls: Vec<_> = stored.iter().map(|s| s.call.clone()).collect();
        for (s, culprits) in stored.iter().zip(call_culprits(&calls, &waits)) {
            for c in culprits {
                ins.execute(params![s.id, c.pid, c.tid, c.comm, c.ns as i64])?;
                written += 1;
            }
        }
    }
    Ok(written)
}

/// Merges lifecycle events into `processes`: fork parents and times, exec
/// names, exit times and codes, OOM victims; adds processes seen only in calls.
fn complete_processes(conn: &Connection) -> rusqlite::Result<()> {
    let mut procs: BTreeMap<u32, ProcessInfo> = BTreeMap::new();
    {
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
        for p in rows {
            let p = p?;
            procs.insert(p.pid, p);
        }
    }
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
                p.start_ns.get_or_insert(ts);
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
    // Processes seen only through their calls.
    let mut st = conn.prepare("SELECT pid, min(ts_ns) FROM calls GROUP BY pid")?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let pid: u32 = r.get(0)?;
        let first = r.get::<_, i64>(1)? as u64;
        let p = procs.entry(pid).or_insert_with(|| ProcessInfo {
            pid,
            ..Default::default()
        });
        p.start_ns.get_or_insert(first);
    }
    drop(rows);
    for p in procs.values() {
        upsert_process(conn, p)?;
    }
    Ok(())
}
