//! The allocator rollup (issue 16): the PyTorch allocator views
//! (`sleuth_core::allocator`) of each process with allocator events
//! (`trace --torch-allocator`), rebuilt once when the trace ends and read
//! back by whole-file answers (`memory` without `--at`, the lean
//! explanation of `explain`, the report, the Perfetto export, the MCP
//! tools) instead of two passes over the process's memory calls per view
//! (4–5 s on the bench's 10M-call trace with allocator events).
//!
//! Rows: each process's view at the end (`at_ns` NULL) and, where its
//! fragmentation finding describes another moment (a failure, the
//! reserved peak), its view then (`sleuth_core::allocator::KnownViews`,
//! what an explanation reads). Views are stored without their blocks'
//! site labels, which the reader names from its stacks
//! (`sleuth_core::allocator::name_sites`). A view whose numbers a reader
//! would refuse (a value past 2^62: `stored_json`) is not stored, and
//! the reader rebuilds that process's views from the file. Table and
//! meaning: docs/schema.md, "Allocator rollup".

use crate::file_steps::FileSteps;
use crate::finding_rollups::{complete_tables, damaged_table};
use crate::json_column::{insert_row, json, text_of, Col};
use crate::step_feed::StepFeed;
use rusqlite::Connection;
use sleuth_core::allocator::{
    name_sites, view_rebuilt, AllocatorView, Calibration, Calibrator, KnownViews, StoredView,
};
use sleuth_core::TraceData;
use std::collections::BTreeMap;

/// `meta.allocator_rollup` once the table below is complete.
const COMPLETE: &str = "1";

const TABLE: &str = "allocator_rollup";

/// The table's columns in order: a reader accepts nothing else.
pub(crate) const COLS: &[&str] = &["pid", "at_ns", "view"];

/// Members of a stored view not range-checked (`stored_json::parse_except`):
/// stack ids are 64-bit hashes.
const LABELS: &[&str] = &["stack_id"];

/// The calibrations of the processes with allocator events, fed the
/// memory calls by the completion's ledger replay (which reads them in
/// return order anyway, `crate::ledger_rollup::write`) and merged there
/// with each process's allocator events (`crate::step_feed`): the views
/// then take one pass of their own instead of two.
pub(crate) type CalibrationFeed<'a> = StepFeed<'a, Calibrator>;

/// A [`CalibrationFeed`] for every process of the file with allocator
/// events (`pids`, `allocator_rows::pids`); None when it has none.
pub(crate) fn calibration_feed<'a>(
    conn: &'a Connection,
    pids: &[u32],
) -> rusqlite::Result<Option<CalibrationFeed<'a>>> {
    if pids.is_empty() {
        return Ok(None);
    }
    let sinks = pids.iter().map(|&p| (p, Calibrator::default())).collect();
    StepFeed::new(conn, sinks)
}

/// Each process's calibration from its fed calibrator.
pub(crate) fn calibrations(fed: BTreeMap<u32, Calibrator>) -> BTreeMap<u32, Calibration> {
    fed.into_iter().map(|(pid, c)| (pid, c.finish())).collect()
}

/// Rebuilds and stores the views of every process with allocator events
/// from the file being completed (its calls and events streamed:
/// `FileSteps::own`), each calibrated by `calibrations` (the feed's);
/// `ledgers` are the file's own at its end (the views' reserved bytes). A
/// file without allocator events gets no table.
pub(crate) fn write(
    conn: &Connection,
    ledgers: &crate::ledger_rollup::Written,
    calibrations: BTreeMap<u32, Calibration>,
) -> rusqlite::Result<()> {
    if calibrations.is_empty() {
        return Ok(());
    }
    let source = FileSteps::own(conn)?;
    // Each view at the end from a replay that stores checkpoints of itself
    // along the way (`crate::allocator_checkpoints`), then the views at
    // their fragmentation findings' moments.
    let pages = crate::step_feed::page_query(conn)?.unwrap_or_default();
    let layouts: BTreeMap<u32, _> = calibrations
        .iter()
        .filter_map(|(&pid, cal)| Some((pid, cal.layout()?)))
        .collect();
    let mut replays = crate::allocator_checkpoints::replay_storing(conn, &pages, &layouts)?;
    let mut end = BTreeMap::new();
    for (pid, cal) in calibrations {
        let replay = replays.remove(&pid);
        let live = ledgers.live_bytes_of(pid);
        let view = view_rebuilt(pid, cal, replay, live, &TraceData::default());
        end.insert(pid, view);
    }
    crate::allocator_checkpoints::settle(conn)?;
    let known = KnownViews::with_moments(&source, &TraceData::default(), end);
    source.into_result().map_err(crate::stream::own_error)?;
    let rows = known.end().iter().map(|(&pid, v)| (pid, None, v)).chain(
        known
            .moments()
            .iter()
            .map(|(&(pid, ts), v)| (pid, Some(ts), v)),
    );
    store_views(conn, TABLE, rows)?;
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('allocator_rollup', ?1)",
        [COMPLETE],
    )?;
    Ok(())
}

/// Stores `rows` (pid, moment (None: the end), view) in `table` (created
/// with [`COLS`] and emptied first), leaving out every view of a process
/// one of whose views a reader would refuse (a value past 2^62:
/// `stored_json`): the reader rebuilds that process's views.
pub(crate) fn store_views<'v>(
    conn: &Connection,
    table: &str,
    rows: impl Iterator<Item = (u32, Option<u64>, &'v AllocatorView)> + Clone,
) -> rusqlite::Result<()> {
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {table}(pid INTEGER NOT NULL, at_ns INTEGER, view TEXT NOT NULL)"
    ))?;
    conn.execute(&format!("DELETE FROM {table}"), [])?;
    let refused: std::collections::BTreeSet<u32> = rows
        .clone()
        .filter(|(_, _, v)| !crate::stored_json::readable(&v.to_stored(), LABELS))
        .map(|(pid, _, _)| pid)
        .collect();
    for (pid, at_ns, v) in rows.filter(|(pid, _, _)| !refused.contains(pid)) {
        let view = v.to_stored();
        let view = json(&view);
        let at = at_ns.map_or(Col::Null, |ts| Col::Int(ts as i64));
        insert_row(
            conn,
            table,
            COLS,
            &[Col::Int(pid.into()), at, Col::Json(&view)],
        )?;
    }
    Ok(())
}

/// The stored views of `pids` (their blocks' sites named from `context`),
/// or None when the trace has no complete table or lacks one of `pids`'
/// views at the end (then rebuild them from the file). A table that is not
/// the one gpusleuth writes, or a row that does not parse or holds a
/// number no trace holds, a second view of a process at the same moment,
/// or a foreign one, makes the file damaged: an error.
pub(crate) fn stored_views(
    conn: &Connection,
    pids: &[u32],
    context: &TraceData,
) -> rusqlite::Result<Option<KnownViews>> {
    if pids.is_empty() || !complete_tables(conn, TABLE, &[(TABLE, COLS)])? {
        return Ok(None);
    }
    let (end, moments) = read_views(conn, TABLE, &|pid| pids.contains(&pid), context)?;
    if end.len() != pids.len() {
        return Ok(None);
    }
    Ok(Some(KnownViews::from_parts(end, moments)))
}

/// Views at the end by pid, and at other moments by (pid, time).
pub(crate) type Views = (
    BTreeMap<u32, AllocatorView>,
    BTreeMap<(u32, u64), AllocatorView>,
);

/// The views stored in `table` of the processes `wanted` keeps (their
/// blocks' sites named from `context`): at the end by pid, at other
/// moments by (pid, time). A row that does not parse or holds a number no
/// trace holds, a second view of a process at the same moment, or a
/// foreign one, makes the file damaged: an error naming the table.
pub(crate) fn read_views(
    conn: &Connection,
    table: &str,
    wanted: &dyn Fn(u32) -> bool,
    context: &TraceData,
) -> rusqlite::Result<Views> {
    let bad = |what: String| damaged_table(table, &what);
    let mut st = conn.prepare(&format!("SELECT pid, at_ns, view FROM {table}"))?;
    let mut rows = st.query([])?;
    let mut end = BTreeMap::new();
    let mut moments = BTreeMap::new();
    while let Some(r) = rows.next()? {
        let Ok(pid) = u32::try_from(r.get::<_, i64>(0)?) else {
            continue;
        };
        if !wanted(pid) {
            continue;
        }
        let at_ns: Option<i64> = r.get(1)?;
        let at_ns = at_ns
            .map(|t| {
                crate::problems::stored_time(t)
                    .ok_or_else(|| bad(format!("has a time no trace holds for pid {pid}")))
            })
            .transpose()?;
        let text = text_of(r.get_ref(2)?).map_err(|e| bad(format!("of pid {pid}: {e}")))?;
        let v: StoredView = crate::stored_json::parse_except(text, LABELS)
            .map_err(|e| bad(format!("of pid {pid}: {e}")))?;
        if v.pid != pid {
            return Err(bad(format!("holds a foreign view for pid {pid}")));
        }
        let mut view = AllocatorView::from(v);
        name_sites(&mut view, context);
        let second = match at_ns {
            None => end.insert(pid, view).is_some(),
            Some(ts) => moments.insert((pid, ts), view).is_some(),
        };
        if second {
            return Err(bad(format!(
                "holds a second view of pid {pid} at one moment"
            )));
        }
    }
    Ok((end, moments))
}
