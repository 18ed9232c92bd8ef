//! Import of Ingero trace databases (<https://github.com/ingero-io/ingero>).
//!
//! Ingero stores `events(timestamp unix-ns, pid, tid, source, op, duration,
//! arg0, arg1, ret_code, ...)` with `ops(source_id, op_id, name)` naming each
//! op. CUDA runtime (source 1) and driver (source 4) calls become `calls`;
//! process fork/exec/exit become `proc_events`; `sched_switch` carries only an
//! off-CPU duration (no state, so runnable and blocked cannot be told apart)
//! and is counted, not converted. Timestamps stay Unix ns: the imported
//! session's monotonic clock *is* the Unix clock (`realtime_offset_ns = 0`).
//!
//! The file is untrusted: only real tables are read (a view may recurse
//! forever), names are looked up rather than copied per event and capped in
//! length, rows with impossible values (pid −1, negative durations) are
//! skipped and counted, and the trace is written under a temporary name and
//! renamed into place only when complete.

use crate::error::{SqlContext, StoreError};
use crate::open::{open_untrusted, short};
use crate::outfile;
use crate::problems::{MAX_NS, MAX_SIZE};
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

/// Longest op or process name taken from an Ingero file; a longer op name
/// makes its events "unknown", a longer process name is cut (Linux names
/// are 16 bytes; anything this long is damage or hostility).
const MAX_NAME_BYTES: usize = 256;
/// Highest pid Linux can give (`PID_MAX_LIMIT`, 2^22).
const PID_MAX_LIMIT: i64 = 1 << 22;

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
    /// Rows skipped because a value is impossible (pid −1, negative
    /// duration, ...), by reason.
    pub invalid_events: BTreeMap<String, u64>,
    /// Process names longer than 256 bytes, cut to that length.
    pub names_cut: u64,
    /// The notes written into the trace, in order.
    pub notes: Vec<String>,
}

/// One event, compact: names are looked up in the `ops` map, never copied
/// per event (a 1 MB op name must not become 1 MB per row).
struct IngeroEvent {
    ts: i64,
    pid: u32,
    tid: u32,
    source: i64,
    op_id: i64,
    dur: i64,
    arg0: i64,
    arg1: i64,
    ret: i64,
}

/// Ingero's op names by (source, op id); None for a name too long to take.
type OpNames = HashMap<(i64, i64), Option<String>>;

/// Session info, a description of the recording machine, and the end time.
type SessionParts = (SessionInfo, String, Option<u64>);

/// Converts the Ingero database `src` into a new gpusleuth trace at `dst`.
/// `src` is opened read-only as untrusted input; `dst` must not exist and is
/// never `src`. The trace is written under a temporary name beside `dst` and
/// renamed into place when complete: a failed import leaves nothing behind.
pub fn import_ingero(src: &Path, dst: &Path) -> Result<ImportSummary, StoreError> {
    outfile::check_output(dst, &[src], false, None)?;
    let conn = open_untrusted(src)?;
    for table in ["events", "ops"] {
        if !is_plain_table(&conn, src, table)? {
            return Err(StoreError::file(
                src,
                format!("not an Ingero trace database (no `{table}` table)"),
            ));
        }
    }
    let ops = read_ops(&conn, src)?;
    let mut sum = ImportSummary::default();
    let events = read_events(&conn, src, &mut sum)?;
    let session = read_session(&conn, src, &events)?;
    let names = read_process_names(&conn, src, &mut sum)?;
    let not_stored = read_not_stored(&conn, src, &ops)?;
    drop(conn);
    let calls = convert(&events, &ops, &mut sum);
    refuse_totals_past_bound(src, &calls)?;

    let tmp = outfile::temp_path_for(dst);
    let input = Converted {
        session,
        calls,
        events: &events,
        ops: &ops,
        names: &names,
        not_stored: &not_stored,
    };
    let written = write_trace(&tmp, input, sum)
        .and_then(|sum| outfile::publish(&tmp, dst, false, None).map(|()| sum));
    if written.is_err() {
        outfile::remove_database(&tmp);
    }
    written
}

/// Everything read from the source, ready to be written.
struct Converted<'a> {
    session: SessionParts,
    calls: Vec<CallEvent>,
    events: &'a [IngeroEvent],
    ops: &'a OpNames,
    names: &'a BTreeMap<u32, String>,
    not_stored: &'a BTreeMap<String, u64>,
}

/// Writes the converted trace to `path` (a new file).
fn write_trace(
    path: &Path,
    input: Converted,
    mut sum: ImportSummary,
) -> Result<ImportSummary, StoreError> {
    let (info, machine, end) = input.session;
    let writer = TraceWriter::create(
        path,
        info,
        WriterOptions {
            source: TraceSource::Ingero,
            ..Default::default()
        },
    )?;
    let h = writer.handle();
    for c in input.calls {
        h.send(Event::Call(c))?;
    }
    for e in input.events {
        if let Some(p) = proc_event(e, op_name(input.ops, e), input.names) {
            sum.proc_events += 1;
            h.send(Event::Proc(p))?;
        }
    }
    for (pid, comm) in input.names {
        sum.processes += 1;
        h.set_process(ProcessInfo {
            pid: *pid,
            comm: comm.clone(),
            ..Default::default()
        })?;
    }
    for (op, n) in input.not_stored {
        if sum.calls_by_op.contains_key(op) && *n > 0 {
            sum.not_stored_by_ingero.insert(op.clone(), *n);
        }
    }
    sum.notes = notes(&sum, &machine);
    for n in &sum.notes {
        h.add_note(NoteLevel::Warn, n.clone())?;
    }
    h.set_stat("imported_sched_switch_skipped", sum.sched_switch_skipped)?;
    if let Some(end) = end {
        h.set_session_end(end)?;
    }
    drop(h);
    writer.finish()?;
    forget_exit_codes(path)?;
    Ok(sum)
}

/// Leaves the exit codes of the imported processes unknown (NULL), as
/// docs/import.md says: Ingero records none, but a `ProcEvent` carries a
/// wait status (a tracer always has one), so the writer stored 0 for
/// every exit and the report said "exit 0" (round 51). Done on the
/// complete file before it is renamed into place; no stored aggregate
/// holds an exit code (readers take it from `processes` and `proc_events`).
fn forget_exit_codes(path: &Path) -> Result<(), StoreError> {
    let conn = Connection::open(path).at(path)?;
    conn.execute_batch(
        "BEGIN;
         UPDATE proc_events SET exit_code = NULL WHERE exit_code IS NOT NULL;
         UPDATE processes SET exit_code = NULL WHERE exit_code IS NOT NULL;
         COMMIT;",
    )
    .at(path)
}

/// Refuses calls whose durations or sizes add up past 2^62: every reader
/// refuses such a file as damaged (`problems::TOTALS_OVERFLOW`), so the
/// import would write a trace nothing can read (each value within the
/// bound, as `invalid` and `invalid_size` checked them).
fn refuse_totals_past_bound(src: &Path, calls: &[CallEvent]) -> Result<(), StoreError> {
    let (mut dur, mut size) = (0u128, 0u128);
    for c in calls {
        dur += u128::from(c.dur_ns);
        size += u128::from(c.size.unwrap_or(0));
    }
    let bound = MAX_NS as u128;
    if dur > bound || size > bound {
        let what = if dur > bound { "durations" } else { "sizes" };
        return Err(StoreError::file(
            src,
            format!(
                "the CUDA calls' {what} add up past 2^62 (no trace can hold them: every reader would refuse it)"
            ),
        ));
    }
    Ok(())
}

/// Whether `name` is an ordinary table. A view (which may recurse forever)
/// or a virtual table under a name we read is refused: an Ingero file has
/// neither.
fn is_plain_table(conn: &Connection, src: &Path, name: &str) -> Result<bool, StoreError> {
    let row: Option<(String, Option<String>)> = conn
        .query_row(
            "SELECT type, sql FROM sqlite_master WHERE name = ?1 AND type IN ('table', 'view')",
            [name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(|e| StoreError::file(src, short(&e)))?;
    let Some((kind, sql)) = row else {
        return Ok(false);
    };
    let virtual_table = sql.as_deref().is_some_and(|s| {
        s.trim_start()
            .to_ascii_uppercase()
            .starts_with("CREATE VIRTUAL")
    });
    if kind != "table" || virtual_table {
        let what = if virtual_table {
            "virtual table"
        } else {
            "view"
        };
        return Err(StoreError::file(
            src,
            format!("not an Ingero trace database (`{name}` is a {what}, not a table)"),
        ));
    }
    Ok(true)
}

fn read_ops(conn: &Connection, src: &Path) -> Result<OpNames, StoreError> {
    let mut st = conn
        .prepare("SELECT source_id, op_id, name FROM ops")
        .map_err(|e| StoreError::file(src, format!("unexpected Ingero schema: {}", short(&e))))?;
    let rows = st
        .query_map([], |r| {
            let name: String = r.get(2)?;
            Ok((
                (r.get::<_, i64>(0)?, r.get::<_, i64>(1)?),
                (name.len() <= MAX_NAME_BYTES).then_some(name),
            ))
        })
        .at(src)?;
    rows.collect::<rusqlite::Result<_>>()
        .map_err(|e| StoreError::file(src, format!("unreadable Ingero op: {}", short(&e))))
}

fn op_name<'a>(ops: &'a OpNames, e: &IngeroEvent) -> Option<&'a str> {
    ops.get(&(e.source, e.op_id))?.as_deref()
}

/// Why an event cannot be taken as it is, if it cannot. Times are bound
/// as every reader bounds them (`problems::MAX_NS`, 2^62 ns, the year
/// 2116 in Unix ns): a time within i64 but past it imported with exit 0,
/// then `stats`, `explain`, `report` and the pftrace export refused the
/// trace with a conversion error naming no row (round 51).
fn invalid(ts: i64, pid: i64, tid: i64, dur: i64) -> Option<&'static str> {
    if !(0..=PID_MAX_LIMIT).contains(&pid) || !(0..=PID_MAX_LIMIT).contains(&tid) {
        Some("pid or tid outside 0..=4194304")
    } else if ts < 0 {
        Some("negative timestamp")
    } else if dur < 0 {
        Some("negative duration")
    } else if ts > MAX_NS {
        Some("timestamp past 2^62 ns")
    } else if dur > MAX_NS {
        Some("duration past 2^62 ns")
    } else if ts.checked_add(dur).is_none_or(|end| end > MAX_NS) {
        Some("timestamp + duration past 2^62 ns")
    } else {
        None
    }
}

/// Why a call's size (`arg0` of an allocation or a copy) cannot be taken,
/// if it cannot: readers skip a size outside `0..=problems::MAX_SIZE`
/// (1 PiB), and a negative one was stored as 2^64 − 1 (`stats` counted the
/// call, `memory` skipped it with a warning; round 51).
fn invalid_size(size: i64) -> Option<&'static str> {
    if size < 0 {
        Some("negative size")
    } else if size > MAX_SIZE {
        Some("size past 2^50 bytes (1 PiB)")
    } else {
        None
    }
}

fn read_events(
    conn: &Connection,
    src: &Path,
    sum: &mut ImportSummary,
) -> Result<Vec<IngeroEvent>, StoreError> {
    let mut st = conn
        .prepare(
            "SELECT timestamp, pid, tid, source, op, duration, arg0, arg1, ret_code
             FROM events ORDER BY timestamp, id",
        )
        .map_err(|e| StoreError::file(src, format!("unexpected Ingero schema: {}", short(&e))))?;
    let unreadable = |e: rusqlite::Error| {
        StoreError::file(src, format!("unreadable Ingero event: {}", short(&e)))
    };
    let mut rows = st.query([]).map_err(unreadable)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(unreadable)? {
        let get = |i: usize| r.get::<_, i64>(i).map_err(unreadable);
        let (ts, pid, tid, dur) = (get(0)?, get(1)?, get(2)?, get(5)?);
        if let Some(why) = invalid(ts, pid, tid, dur) {
            *sum.invalid_events.entry(why.to_string()).or_insert(0) += 1;
            continue;
        }
        out.push(IngeroEvent {
            ts,
            pid: pid as u32,
            tid: tid as u32,
            source: get(3)?,
            op_id: get(4)?,
            dur,
            arg0: get(6)?,
            arg1: get(7)?,
            ret: get(8)?,
        });
    }
    Ok(out)
}

/// At most `MAX_NAME_BYTES` of `s`, cut on a character boundary.
fn clip(mut s: String) -> String {
    if s.len() > MAX_NAME_BYTES {
        let mut end = MAX_NAME_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn read_session(
    conn: &Connection,
    src: &Path,
    events: &[IngeroEvent],
) -> Result<SessionParts, StoreError> {
    let first = events.iter().map(|e| e.ts).min().unwrap_or(0);
    let last = events.iter().map(|e| e.ts.saturating_add(e.dur)).max();
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
    if is_plain_table(conn, src, "sessions")? {
        let row = conn
            .query_row(
                "SELECT started_at, stopped_at, gpu_model, gpu_driver, kernel, cuda_ver, ingero_ver, pid_filter
                 FROM sessions ORDER BY id LIMIT 1",
                [],
                |r| {
                    let text = |i: usize| r.get::<_, String>(i).map(clip);
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        text(2)?,
                        text(3)?,
                        text(4)?,
                        text(5)?,
                        text(6)?,
                        text(7)?,
                    ))
                },
            )
            .optional()
            .map_err(|e| {
                StoreError::file(
                    src,
                    format!(
                        "unexpected Ingero sessions row (started_at and stopped_at are integers, the rest text): {}",
                        short(&e)
                    ),
                )
            })?;
        if let Some((start, stop, gpu, driver, kernel, cuda, ver, pids)) = row {
            // Refused, not skipped: every time of the trace counts from the
            // start (a start of 2^63 - 1 imported with exit 0, then `memory`,
            // `explain` and `report` failed; round 51). 0 is "not known".
            for (column, v) in [("started_at", start), ("stopped_at", stop)] {
                if !(0..=MAX_NS).contains(&v) {
                    return Err(StoreError::file(
                        src,
                        format!(
                            "sessions.{column} {v} is not a time in Unix ns a trace can hold (0 to 2^62, the year 2116)"
                        ),
                    ));
                }
            }
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

fn read_process_names(
    conn: &Connection,
    src: &Path,
    sum: &mut ImportSummary,
) -> Result<BTreeMap<u32, String>, StoreError> {
    let mut out = BTreeMap::new();
    if !is_plain_table(conn, src, "process_names")? {
        return Ok(out);
    }
    let mut st = conn
        .prepare("SELECT pid, name FROM process_names")
        .at(src)?;
    let mut rows = st.query([]).at(src)?;
    while let Some(r) = rows.next().at(src)? {
        let pid: i64 = r.get(0).at(src)?;
        let name: String = r.get(1).at(src)?;
        if !(0..=PID_MAX_LIMIT).contains(&pid) {
            *sum.invalid_events
                .entry("process name of a pid outside 0..=4194304".into())
                .or_insert(0) += 1;
            continue;
        }
        if name.len() > MAX_NAME_BYTES {
            sum.names_cut += 1;
        }
        out.insert(pid as u32, clip(name));
    }
    Ok(out)
}

/// Per mapped op name: calls Ingero counted but discarded (`count - stored`).
fn read_not_stored(
    conn: &Connection,
    src: &Path,
    ops: &OpNames,
) -> Result<BTreeMap<String, u64>, StoreError> {
    let mut out = BTreeMap::new();
    if !is_plain_table(conn, src, "event_aggregates")? {
        return Ok(out);
    }
    // total() sums in floating point: no overflow error on hostile counts.
    let mut st = conn
        .prepare(
            "SELECT source, op, total(count) - total(stored) FROM event_aggregates GROUP BY source, op",
        )
        .at(src)?;
    let mut rows = st.query([]).at(src)?;
    while let Some(r) = rows.next().at(src)? {
        let key: (i64, i64) = (r.get(0).at(src)?, r.get(1).at(src)?);
        let n: f64 = r.get(2).at(src)?;
        let Some(name) = ops.get(&key).and_then(|n| n.as_deref()) else {
            continue;
        };
        if let Some(op) = map_op(key.0, name) {
            let e = out.entry(op.to_string()).or_insert(0u64);
            *e = e.saturating_add(n.max(0.0) as u64);
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
fn convert(events: &[IngeroEvent], ops: &OpNames, sum: &mut ImportSummary) -> Vec<CallEvent> {
    let mut calls = Vec::new();
    for e in events {
        let name = match ops.get(&(e.source, e.op_id)) {
            Some(Some(n)) => n.clone(),
            Some(None) => format!("op{} (name longer than {MAX_NAME_BYTES} bytes)", e.op_id),
            None => format!("op{}", e.op_id),
        };
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
                (Some(e.arg0), None, None)
            }
            OpClass::DeviceFree | OpClass::HostFree | OpClass::Launch => (None, Some(a0), None),
            OpClass::Copy => (
                Some(e.arg0),
                None,
                (info.layer == Layer::Runtime).then_some(a1),
            ),
            _ => (None, None, None),
        };
        if let Some(why) = size.and_then(invalid_size) {
            *sum.invalid_events.entry(why.to_string()).or_insert(0) += 1;
            continue;
        }
        calls.push(CallEvent {
            // Both checked non-negative when read.
            ts_ns: e.ts as u64,
            dur_ns: e.dur as u64,
            pid: e.pid,
            tid: e.tid,
            op: info.id,
            ret: e.ret,
            // Checked within 0..=MAX_SIZE above.
            size: size.map(|s| s as u64),
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
/// thread's (tid == pid) is taken as the process's exit. Exit codes are
/// unknown: written as 0, then NULL (`forget_exit_codes`).
fn proc_event(
    e: &IngeroEvent,
    name: Option<&str>,
    names: &BTreeMap<u32, String>,
) -> Option<ProcEvent> {
    if e.source != SRC_HOST {
        return None;
    }
    let ts = e.ts as u64;
    // Exit codes are unknown: 0 here, NULL once the trace is complete
    // (`forget_exit_codes`). The name is the one known for the process.
    let event = |kind, pid: u32, tid, ppid| {
        Some(ProcEvent {
            kind,
            ts_ns: ts,
            pid,
            tid,
            ppid,
            exit_code: 0,
            comm: names.get(&pid).cloned().unwrap_or_default(),
        })
    };
    match name? {
        "process_fork" if e.arg1 > 0 && e.arg1 <= PID_MAX_LIMIT => {
            let child = e.arg1 as u32;
            event(ProcKind::Fork, child, child, e.pid)
        }
        "process_exec" => event(ProcKind::Exec, e.pid, e.tid, 0),
        "process_exit" if e.tid == e.pid => event(ProcKind::Exit, e.pid, e.tid, 0),
        _ => None,
    }
}

/// Plain statements of what the Ingero format lacks, written into the trace.
fn notes(sum: &ImportSummary, machine: &str) -> Vec<String> {
    let mut out = vec![
        "imported from Ingero: calls have no on-CPU/runnable/blocked split (Ingero does not record per-call scheduler state), so CPU-contention findings and culprits are unavailable".to_string(),
        "imported from Ingero: storage is selective (not every call was recorded), so counts and percentiles cover the stored subset only".to_string(),
        "imported from Ingero: allocations carry their size but not the returned device pointer: the memory ledger counts them, but frees cannot be matched to them (live memory is an upper bound when frees were stored); exit codes of processes are unknown".to_string(),
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
    push_counts(
        &mut out,
        "calls Ingero counted but did not store",
        &sum.not_stored_by_ingero,
        |op, n| format!("{op} {n}"),
    );
    push_counts(
        &mut out,
        "rows with impossible values, skipped",
        &sum.invalid_events,
        |why, n| format!("{n} ({why})"),
    );
    if sum.names_cut > 0 {
        out.push(format!(
            "{} process names longer than {MAX_NAME_BYTES} bytes were cut to that length",
            sum.names_cut
        ));
    }
    push_counts(
        &mut out,
        "events of ops gpusleuth does not map, skipped",
        &sum.skipped_unknown,
        |op, n| format!("{op} {n}"),
    );
    out
}

/// Adds the note `what: a, b, ...` listing `counts` (each entry written by
/// `entry`), unless there is nothing to list.
fn push_counts(
    out: &mut Vec<String>,
    what: &str,
    counts: &BTreeMap<String, u64>,
    entry: impl Fn(&str, u64) -> String,
) {
    if counts.is_empty() {
        return;
    }
    let list: Vec<String> = counts.iter().map(|(k, n)| entry(k, *n)).collect();
    out.push(format!("{what}: {}", list.join(", ")));
}
