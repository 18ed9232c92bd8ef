//! The ledger rollup (issue 16): each process's GPU memory ledger at the
//! end of the trace, replayed once when the trace ends and read back by
//! `memory` (without `--at` or `--by-site`), `explain`'s lean load, the
//! report, the Perfetto export and the MCP tools instead of a replay of
//! every memory call (1.25 million rows of a 10M-call trace).
//!
//! [`write`] runs the readers' own replay (`sleuth_core::ledger::LedgerBuilder`
//! over the calls streamed by `stream::visit_calls` in return order) on the
//! writer's connection and stores each ledger without its context (name,
//! exit time, site labels: `LedgerBuilder::finish_bare`); [`stored`] reads
//! them back and adds the context the reader loaded
//! (`sleuth_core::ledger::in_context`), which gives what the replay gives.
//! Table and meaning: docs/schema.md, "Ledger rollup".

use crate::finding_rollups::{complete_tables, damaged_table};
use crate::json_column::{insert_row, json, text_of, Col};
use crate::stream::{visit_own_memory_calls, StreamOrder};
use rusqlite::Connection;
use sleuth_core::ledger::{in_context, LedgerBuilder, LiveByStack, ProcessLedger};
use sleuth_core::{CallEvent, TraceData};
use std::collections::{BTreeMap, BTreeSet};

/// `meta.ledger_rollup` once the table below is complete.
const COMPLETE: &str = "1";

const CREATE: &str =
    "CREATE TABLE IF NOT EXISTS ledger_rollup(pid INTEGER NOT NULL, ledger TEXT NOT NULL)";

/// The table's columns in order: a reader accepts nothing else.
pub(crate) const COLS: &[&str] = &["pid", "ledger"];

/// The members of a stored ledger that are not range-checked
/// (`stored_json::parse_except`): stack ids are 64-bit hashes, and a failed
/// allocation's `error` is the status the library returned (any i64). Every
/// other number (bytes, counts, times) past 2^62 makes the file damaged.
const LABELS: &[&str] = &["stack_id", "error"];

/// Replays the memory calls of every process and stores the ledgers; the
/// writer's final transaction calls it after the call groups are written.
/// The processes are `listed`, those a reader lists ([`listed_pids`]).
/// `run`, the ledger a rotating trace carries from its earlier files
/// (`crate::run_ledger`), is fed the same processes and calls in the same
/// order: one read of the memory calls feeds both.
/// Returns what the site and allocator rollups take of the ledgers stored
/// (without context), and the processes that exited ([`retirable`]).
pub(crate) fn write(
    conn: &Connection,
    listed: &BTreeSet<u32>,
    mut run: Option<&mut LedgerBuilder>,
    mut also: impl FnMut(&CallEvent, i64),
) -> rusqlite::Result<Written> {
    conn.execute_batch(CREATE)?;
    conn.execute("DELETE FROM ledger_rollup", [])?;
    // What each process held per site at its peak comes out of the same
    // replay (the site rollup's "live at the peak"): no second one.
    let mut b = LedgerBuilder::new(None).with_peak_sites();
    let mut pids = listed.clone();
    if let Some(r) = run.as_deref_mut() {
        for &pid in &pids {
            r.track(pid);
        }
    }
    // A process that exited is finished once the replay passes its exit
    // (its calls all returned before), so the file's ledger holds one
    // finished ledger per exited process, not its replay (round 46). The
    // run's carried ledger retires them once stored (`crate::run_ledger`).
    let exited = retirable(conn)?;
    let mut out = Written {
        exited: exited.iter().map(|&(_, pid)| pid).collect(),
        ..Written::default()
    };
    let mut exits = exited.into_iter().peekable();
    // Each exited process's ledger stored as it is finished, its replay and
    // its ledger then dropped: what is held is what the site and allocator
    // rollups take from it (`LedgerEnd`).
    let mut retire = |b: &mut LedgerBuilder, pid: u32| -> rusqlite::Result<()> {
        let (l, at_peak) = b.retire(pid);
        store(conn, "ledger_rollup", std::slice::from_ref(&l))?;
        out.add(&l, at_peak);
        Ok(())
    };
    let mut failed = None;
    visit_own_memory_calls(conn, None, StreamOrder::ByReturn, |c, id| {
        while let Some((_, pid)) = exits.next_if(|&(at, _)| at < c.end_ns()) {
            if failed.is_none() && pids.remove(&pid) {
                failed = retire(&mut b, pid).err();
            }
        }
        b.push(c);
        if let Some(r) = run.as_deref_mut() {
            r.push(c);
        }
        also(c, id);
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    // Every call is in: the rest that exited one at a time, then the others.
    for (_, pid) in exits {
        if pids.remove(&pid) {
            retire(&mut b, pid)?;
        }
    }
    for pid in pids {
        b.track(pid);
    }
    let (ledgers, at_peak) = b.finish_bare_with_peak_sites();
    store(conn, "ledger_rollup", &ledgers)?;
    for l in &ledgers {
        out.add(l, None);
    }
    out.at_peak.extend(at_peak);
    out.ends.sort_unstable_by_key(|e| e.pid);
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('ledger_rollup', ?1)",
        [COMPLETE],
    )?;
    Ok(out)
}

/// The processes a reader lists in the file being completed: every pid
/// with a stored call (the call groups) or a kernel-counted one (`op_counts`).
pub(crate) fn listed_pids(conn: &Connection) -> rusqlite::Result<BTreeSet<u32>> {
    let mut st = conn.prepare("SELECT pid FROM call_groups UNION SELECT pid FROM op_counts")?;
    let mut pids = BTreeSet::new();
    for pid in st.query_map([], |r| r.get::<_, i64>(0))? {
        if let Ok(pid) = u32::try_from(pid?) {
            pids.insert(pid);
        }
    }
    Ok(pids)
}

/// The processes that exited with no stored call ending after their exit
/// (`processes.exit_ns`, the last ends of `call_groups`), by exit time: each
/// one's ledger is final once the return-order replay passes its exit. A
/// pid with a call after its exit (a pid reused, or a clock's slip) is left
/// to the end, so no process is finished before its last call.
fn retirable(conn: &Connection) -> rusqlite::Result<Vec<(u64, u32)>> {
    let mut st = conn.prepare(
        "SELECT p.exit_ns, p.pid FROM processes p
         LEFT JOIN (SELECT pid, max(last_end_ns) AS last FROM call_groups GROUP BY pid) g
           ON g.pid = p.pid
         WHERE p.exit_ns IS NOT NULL AND (g.last IS NULL OR g.last <= p.exit_ns)
         ORDER BY p.exit_ns, p.pid",
    )?;
    let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (at, pid) = row?;
        if let (Ok(at), Ok(pid)) = (u64::try_from(at), u32::try_from(pid)) {
            out.push((at, pid));
        }
    }
    Ok(out)
}

/// What [`write`] computed beside the rows it stored: what the site and
/// allocator rollups take from each process's ledger, and what each
/// process with a peak held per site at it.
#[derive(Default)]
pub(crate) struct Written {
    /// By pid.
    pub ends: Vec<LedgerEnd>,
    pub at_peak: BTreeMap<u32, LiveByStack>,
    /// The processes that exited in the file ([`retirable`]), by exit.
    pub exited: Vec<u32>,
}

impl Written {
    fn add(&mut self, l: &ProcessLedger, at_peak: Option<LiveByStack>) {
        self.ends.push(LedgerEnd {
            pid: l.pid,
            live_bytes: l.live_bytes,
            unfreed: l.unfreed.iter().map(|u| (u.stack_id, u.bytes)).collect(),
        });
        if let Some(p) = at_peak {
            self.at_peak.insert(l.pid, p);
        }
    }

    /// Process `pid`'s live device bytes at the end (0 when it has none):
    /// the reserved bytes its allocator views are rebuilt with.
    pub fn live_bytes_of(&self, pid: u32) -> u64 {
        self.ends
            .binary_search_by_key(&pid, |e| e.pid)
            .map_or(0, |i| self.ends[i].live_bytes)
    }
}

/// A process's ledger at the end as the site and allocator rollups read
/// it: its live device bytes and each device allocation it left unfreed
/// (its site's stack id, its bytes).
pub(crate) struct LedgerEnd {
    pub pid: u32,
    pub live_bytes: u64,
    pub unfreed: Vec<(Option<u64>, u64)>,
}

/// Inserts `ledgers` as JSON rows `(pid, ledger)` into `table` (this one
/// or the run's, `crate::run_ledger`: the same shape); a long ledger (many
/// live allocations) is written in pieces (`crate::json_column`).
pub(crate) fn store(
    conn: &Connection,
    table: &str,
    ledgers: &[ProcessLedger],
) -> rusqlite::Result<()> {
    for l in ledgers {
        let ledger = json(l);
        insert_row(
            conn,
            table,
            COLS,
            &[Col::Int(l.pid.into()), Col::Json(&ledger)],
        )?;
    }
    Ok(())
}

/// The stored ledgers of `pids`, in `context` (names, exit times, sites),
/// by pid; None when the trace has no complete table or it lacks one of
/// `pids` (then the replay answers). A table that is not the one gpusleuth
/// writes, or a ledger that does not parse, makes the file damaged: an error.
pub(crate) fn stored(
    conn: &Connection,
    pids: &BTreeSet<u32>,
    context: &TraceData,
) -> rusqlite::Result<Option<Vec<ProcessLedger>>> {
    if !complete_tables(conn, "ledger_rollup", &[("ledger_rollup", COLS)])? {
        return Ok(None);
    }
    let found = read(conn, "ledger_rollup", pids, context)?;
    Ok((found.len() == pids.len()).then(|| found.into_values().collect()))
}

/// The rows of `pids` of a ledger table (`ledger_rollup` or the run's,
/// whose completeness the caller checked), in `context`, by pid: those
/// found (a pid without a row is left out; the caller decides). A ledger
/// that does not parse, holds a number no trace holds (`ledger_json`) or a
/// second or foreign row makes the file damaged: an error.
pub(crate) fn read(
    conn: &Connection,
    table: &str,
    pids: &BTreeSet<u32>,
    context: &TraceData,
) -> rusqlite::Result<BTreeMap<u32, ProcessLedger>> {
    let bad = |what: String| damaged_table(table, &what);
    // One pass; only the rows of `pids` are parsed (one per process).
    let mut st = conn.prepare(&format!("SELECT pid, ledger FROM {table}"))?;
    let mut rows = st.query([])?;
    let mut out = BTreeMap::new();
    while let Some(r) = rows.next()? {
        let Ok(pid) = u32::try_from(r.get::<_, i64>(0)?) else {
            continue;
        };
        if !pids.contains(&pid) {
            continue;
        }
        let text = text_of(r.get_ref(1)?).map_err(|e| bad(format!("of pid {pid}: {e}")))?;
        let l: ProcessLedger = crate::stored_json::parse_except(text, LABELS)
            .map_err(|e| bad(format!("of pid {pid}: {e}")))?;
        if l.pid != pid || out.contains_key(&pid) {
            return Err(bad(format!(
                "holds a second or a foreign row for pid {pid}"
            )));
        }
        out.insert(pid, in_context(l, context, None));
    }
    Ok(out)
}
