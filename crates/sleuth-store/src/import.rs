//! Import of Ingero trace databases (<https://github.com/ingero-io/ingero>).
//!
//! Ingero stores `events(timestamp unix-ns, pid, tid, source, op, duration,
//! arg0, arg1, ret_code, ...)` with `ops(source_id, op_id, name)` naming each
//! op. CUDA runtime (source 1) and driver (source 4) calls become `calls`;
//! process fork/exec/exit become `proc_events`; `sched_switch` carries only an
//! off-CPU duration (no state, so runnable and blocked cannot be told apart)
//! and is counted, not converted. Timestamps stay Unix ns: the imported
//! session's monotonic clock *is* the Unix clock (`realtime_offset_ns = 0`).

use crate::error::{SqlContext, StoreError};
use crate::open::{has_table, open_untrusted, short};
use crate::types::{NoteLevel, SessionInfo, TraceSource, WriterOptions};
use crate::writer::TraceWriter;
use rusqlite::{Connection, OptionalExtension};
use serde::Serialize;
use sleuth_core::{op_by_name, CallEvent, Event, Layer, OpClass, ProcEvent, ProcKind, ProcessInfo};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

const SRC_RUNTIME: i64 = 1;
const SRC_HOST: i64 = 3;
const SRC_DRIVER: i64 = 4;

/// Ingero op names that differ from the exact CUDA symbol we use.
const RENAMES: &[(&str, &str)] = &[
    ("cudaStreamSync", "cudaStreamSynchronize"),
    ("cudaDeviceSync", "cudaDeviceSynchronize"),
    ("cuMemAlloc", "cuMemAlloc_v2"),
    ("cuMemFree", "cuMemFree_v2"),
];

/// What an import did and what it could not carry over.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImportSummary {
    /// Calls imported per exact CUDA symbol.
    pub calls_by_op: BTreeMap<String, u64>,
    pub calls: u64,
    pub proc_events: u64,
    pub processes: u64,
    /// `sched_switch` events seen and not converted into waits.
    pub sched_switch_skipped: u64,
    /// Events of ops we do not map, by "SOURCE/op".
    pub skipped_unknown: BTreeMap<String, u64>,
    /// Calls Ingero saw but did not store (its `event_aggregates`), per op.
    pub not_stored_by_ingero: BTreeMap<String, u64>,
    /// The notes written into the trace, in order.
    pub notes: Vec<String>,
}

struct IngeroEvent {
    ts: i64,
    pid: u32,
    tid: u32,
    source: i64,
    op_name: Option<String>,
    op_id: i64,
    dur: i64,
    arg0: i64,
    arg1: i64,
    ret: i64,
}

/// Converts the Ingero database `src` into a new gpusleuth trace at `dst`
/// (refuses to overwrite). `src` is opened read-only as untrusted input.
pub fn import_ingero(src: &Path, dst: &Path) -> Result<ImportSummary, StoreError> {
    let conn = open_untrusted(src)?;
    for table in ["events", "ops"] {
        if !has_table(&conn, table).map_err(|e| StoreError::file(src, short(&e)))? {
            return Err(StoreError::file(
                src,
                format!("not an Ingero trace database (no `{table}` table)"),
            ));
        }
    }
    let events = read_events(&conn, src)?;
    let session = read_session(&conn, &events).at(src)?;
    let names = read_process_names(&conn).at(src)?;
    let not_stored = read_not_stored(&conn).at(src)?;

    let writer = TraceWriter::create(
        dst,
        session.0,
        WriterOptions {
            source: TraceSource::Ingero,
            ..Default::default()
        },
    )?;
    let h = writer.handle();
    let mut sum = ImportSummary::default();
    let calls = convert(&events, &mut sum);
    for c in calls {
        h.send(Event::Call(c))?;
    }
    for e in &events {
        if let Some(p) = proc_event(e, &names) {
            sum.proc_events += 1;
            h.send(Event::Proc(p))?;
        }
    }
    for (pid, comm) in &names {
        sum.processes += 1;
        h.set_process(ProcessInfo {
            pid: *pid,
            comm: comm.clone(),
            ..Default::default()
        })?;
    }
    for (op, n) in &not_stored {
        if sum.calls_by_op.contains_key(op) && *n > 0 {
            sum.not_stored_by_ingero.insert(op.clone(), *n);
        }
    }
    sum.notes = notes(&sum, &session.1);
    for n in &sum.notes {
        h.add_note(NoteLevel::Warn, n.clone())?;
    }
    h.set_stat("imported_sched_switch_skipped", sum.sched_switch_skipped)?;
    if let Some(end) = session.2 {
        h.set_session_end(end)?;
    }
    drop(h);
    writer.finish()?;
    Ok(sum)
}

fn read_events(conn: &Connection, src: &Path) -> Result<Vec<IngeroEvent>, StoreError> {
    let mut st = conn
        .prepare(
            "SELECT e.timestamp, e.pid, e.tid, e.source, o.name, e.op, e.duration, e.arg0, e.arg1, e.ret_code
             FROM events e LEFT JOIN ops o ON o.source_id = e.source AND o.op_id = e.op
             ORDER BY e.timestamp, e.id",
        )
        .map_err(|e| StoreError::file(src, format!("unexpected Ingero schema: {}", short(&e))))?;
    let rows = st
        .query_map([], |r| {
            Ok(IngeroEvent {
                ts: r.get(0)?,
                pid: r.get::<_, i64>(1)? as u32,
                tid: r.get::<_, i64>(2)? as u32,
                source: r.get(3)?,
                op_name: r.get(4)?,
                op_id: r.get(5)?,
                dur: r.get(6)?,
                arg0: r.get(7)?,
                arg1: r.get(8)?,
                ret: r.get(9)?,
            })
        })
        .at(src)?;
    rows.collect::<rusqlite::Result<_>>()
        .map_err(|e| StoreError::file(src, format!("unreadable Ingero event: {}", short(&e))))
}

/// Session info, a description of the recording machine, and the end time.
fn read_session(
    conn: &Connection,
    events: &[IngeroEvent],
) -> rusqlite::Result<(SessionInfo, String, Option<u64>)> {
    let first = events.iter().map(|e| e.ts).min().unwrap_or(0);
    let last = events.iter().map(|e| e.ts + e.dur.max(0)).max();
    let mut info = SessionInfo {
        started_unix_ns: first,
        start_mono_ns: first.max(0) as u64,
        realtime_offset_ns: 0,
        launch_mode: "import".into(),
        command: "ingero".into(),
        ..Default::default()
    };
    let mut machine = String::new();
    let mut end = last.map(|v| v.max(0) as u64);
    if has_table(conn, "sessions")? {
        let row = conn
            .query_row(
                "SELECT started_at, stopped_at, gpu_model, gpu_driver, kernel, cuda_ver, ingero_ver, pid_filter
                 FROM sessions ORDER BY id LIMIT 1",
                [],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, String>(5)?,
                        r.get::<_, String>(6)?,
                        r.get::<_, String>(7)?,
                    ))
                },
            )
            .optional()?;
        if let Some((start, stop, gpu, driver, kernel, cuda, ver, pids)) = row {
            if start > 0 {
                info.started_unix_ns = start;
                info.start_mono_ns = start as u64;
            }
            if stop > 0 {
                end = Some(stop as u64);
            }
            info.kernel = kernel;
            info.tool_version = format!("ingero {ver}");
            info.target = if pids.is_empty() { "all".into() } else { pids };
            machine = format!("GPU {gpu}, driver {driver}, CUDA {cuda}");
        }
    }
    Ok((info, machine, end))
}

fn read_process_names(conn: &Connection) -> rusqlite::Result<BTreeMap<u32, String>> {
    if !has_table(conn, "process_names")? {
        return Ok(BTreeMap::new());
    }
    let mut st = conn.prepare("SELECT pid, name FROM process_names")?;
    let rows = st.query_map([], |r| {
        Ok((r.get::<_, i64>(0)? as u32, r.get::<_, String>(1)?))
    })?;
    rows.collect()
}

/// Per mapped op name: calls Ingero counted but discarded (`count - stored`).
fn read_not_stored(conn: &Connection) -> rusqlite::Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    if !has_table(conn, "event_aggregates")? {
        return Ok(out);
    }
    let mut st = conn.prepare(
        "SELECT a.source, o.name, sum(a.count) - sum(a.stored) FROM event_aggregates a
         JOIN ops o ON o.source_id = a.source AND o.op_id = a.op GROUP BY a.source, a.op",
    )?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let source: i64 = r.get(0)?;
        let name: String = r.get(1)?;
        let n: i64 = r.get::<_, Option<i64>>(2)?.unwrap_or(0);
        if let Some(op) = map_op(source, &name) {
            *out.entry(op.to_string()).or_insert(0) += n.max(0) as u64;
        }
    }
    Ok(out)
}

/// Our exact symbol for an Ingero CUDA op, if we have it in the op table.
fn map_op(source: i64, name: &str) -> Option<&'static str> {
    let want = match source {
        SRC_RUNTIME => Layer::Runtime,
        SRC_DRIVER => Layer::Driver,
        _ => return None,
    };
    let ours = RENAMES
        .iter()
        .find(|(from, _)| *from == name)
        .map_or(name, |(_, to)| to);
    op_by_name(ours).filter(|o| o.layer == want).map(|o| o.name)
}

fn source_name(source: i64) -> &'static str {
    match source {
        1 => "CUDA",
        2 => "NVIDIA",
        3 => "HOST",
        4 => "DRIVER",
        5 => "IO",
        6 => "TCP",
        7 => "NET",
        _ => "UNKNOWN",
    }
}

/// CUDA events to calls (sorted by start), counting everything else.
fn convert(events: &[IngeroEvent], sum: &mut ImportSummary) -> Vec<CallEvent> {
    let mut calls = Vec::new();
    for e in events {
        let name = e
            .op_name
            .clone()
            .unwrap_or_else(|| format!("op{}", e.op_id));
        if e.source == SRC_HOST && name == "sched_switch" {
            sum.sched_switch_skipped += 1;
            continue;
        }
        if e.source == SRC_HOST
            && matches!(
                name.as_str(),
                "process_fork" | "process_exec" | "process_exit"
            )
        {
            continue; // converted by proc_event
        }
        let Some(info) = map_op(e.source, &name).and_then(op_by_name) else {
            *sum.skipped_unknown
                .entry(format!("{}/{}", source_name(e.source), name))
                .or_insert(0) += 1;
            continue;
        };
        let (a0, a1) = (e.arg0 as u64, e.arg1 as u64);
        let (size, ptr, kind) = match info.class {
            OpClass::DeviceAlloc | OpClass::ManagedAlloc | OpClass::HostAlloc => {
                (Some(a0), None, None)
            }
            OpClass::DeviceFree | OpClass::HostFree | OpClass::Launch => (None, Some(a0), None),
            OpClass::Copy => (Some(a0), None, (info.layer == Layer::Runtime).then_some(a1)),
            _ => (None, None, None),
        };
        calls.push(CallEvent {
            ts_ns: e.ts.max(0) as u64,
            dur_ns: e.dur.max(0) as u64,
            pid: e.pid,
            tid: e.tid,
            op: info.id,
            ret: e.ret,
            size,
            ptr,
            kind,
            ..Default::default()
        });
        *sum.calls_by_op.entry(info.name.to_string()).or_insert(0) += 1;
        sum.calls += 1;
    }
    mark_nested(&mut calls);
    calls
}

/// A driver call inside a runtime call of the same thread (cudaMalloc ->
/// cuMemAlloc_v2) is nested, so the ledger counts the allocation once.
fn mark_nested(calls: &mut [CallEvent]) {
    let mut runtime: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
    for c in calls.iter().filter(|c| c.layer() == Some(Layer::Runtime)) {
        runtime
            .entry(c.tid)
            .or_default()
            .push((c.ts_ns, c.end_ns()));
    }
    for list in runtime.values_mut() {
        list.sort_unstable();
    }
    for c in calls
        .iter_mut()
        .filter(|c| c.layer() == Some(Layer::Driver))
    {
        if let Some(list) = runtime.get(&c.tid) {
            let i = list.partition_point(|&(s, _)| s <= c.ts_ns);
            c.nested = i > 0 && list[i - 1].1 >= c.end_ns();
        }
    }
}

/// Process lifecycle events. Ingero's exit fires per thread; only the main
/// thread's (tid == pid) is taken as the process's exit. Exit codes are unknown.
fn proc_event(e: &IngeroEvent, names: &BTreeMap<u32, String>) -> Option<ProcEvent> {
    if e.source != SRC_HOST {
        return None;
    }
    let comm = |pid: u32| names.get(&pid).cloned().unwrap_or_default();
    let ts = e.ts.max(0) as u64;
    match e.op_name.as_deref()? {
        "process_fork" if e.arg1 > 0 => {
            let child = e.arg1 as u32;
            Some(ProcEvent {
                kind: ProcKind::Fork,
                ts_ns: ts,
                pid: child,
                tid: child,
                ppid: e.pid,
                exit_code: 0,
                comm: comm(child),
            })
        }
        "process_exec" => Some(ProcEvent {
            kind: ProcKind::Exec,
            ts_ns: ts,
            pid: e.pid,
            tid: e.tid,
            ppid: 0,
            exit_code: 0,
            comm: comm(e.pid),
        }),
        "process_exit" if e.tid == e.pid => Some(ProcEvent {
            kind: ProcKind::Exit,
            ts_ns: ts,
            pid: e.pid,
            tid: e.tid,
            ppid: 0,
            exit_code: 0,
            comm: comm(e.pid),
        }),
        _ => None,
    }
}

/// Plain statements of what the Ingero format lacks, written into the trace.
fn notes(sum: &ImportSummary, machine: &str) -> Vec<String> {
    let mut out = vec![
        "imported from Ingero: calls have no on-CPU/runnable/blocked split (Ingero does not record per-call scheduler state), so CPU-contention findings and culprits are unavailable".to_string(),
        "imported from Ingero: storage is selective (not every call was recorded), so counts and percentiles cover the stored subset only".to_string(),
        "imported from Ingero: allocations lack the returned device pointer, so frees cannot be matched to allocations; exit codes of processes are unknown".to_string(),
    ];
    if !machine.is_empty() {
        out.push(format!("recorded by Ingero on: {machine}"));
    }
    if sum.sched_switch_skipped > 0 {
        out.push(format!(
            "{} sched_switch events not converted into waits (Ingero records no task state, so runnable and blocked time cannot be separated)",
            sum.sched_switch_skipped
        ));
    }
    if !sum.not_stored_by_ingero.is_empty() {
        let list: Vec<String> = sum
            .not_stored_by_ingero
            .iter()
            .map(|(op, n)| format!("{op} {n}"))
            .collect();
        out.push(format!(
            "calls Ingero counted but did not store: {}",
            list.join(", ")
        ));
    }
    if !sum.skipped_unknown.is_empty() {
        let list: Vec<String> = sum
            .skipped_unknown
            .iter()
            .map(|(op, n)| format!("{op} {n}"))
            .collect();
        out.push(format!(
            "events of ops gpusleuth does not map, skipped: {}",
            list.join(", ")
        ));
    }
    out
}
