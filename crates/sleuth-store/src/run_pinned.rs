//! pageable_copy over a run: each file's stored aggregates judged its
//! copies with the host ranges pinned in that file only, so a copy from
//! memory pinned in an earlier file was counted pageable. The run carries
//! the pinned ranges from file to file (`PinnedState`): every file's
//! pinning calls are replayed (a few rows), and a file whose copies were
//! judged pageable while ranges pinned earlier are live has its copies
//! judged again, streamed in end order as the writer fed them (memory: the
//! live ranges and a few examples). Since round 19 the tracer judges each
//! file's copies at its completion against the ranges it carries
//! (`meta.run_copies_judged`, below): a reader then takes the file's
//! judgement and its stored end ranges, and reads no copy.

use crate::finding_rollups::{complete_tables, damaged_table};
use crate::reader::Trace;
use crate::stream::{CallQuery, Rows};
use crate::StoreError;
use rusqlite::{params, Connection};
use sleuth_core::findings::inputs::{FindingInputs, PinnedState};

/// The pinned ranges the files read so far left live.
#[derive(Default)]
pub(crate) struct PinnedCarry {
    state: PinnedState,
}

impl PinnedCarry {
    /// A carry from the ranges `state` (pinned before the first file).
    pub(crate) fn starting(state: PinnedState) -> PinnedCarry {
        PinnedCarry { state }
    }

    /// The ranges the files read so far left live.
    pub(crate) fn into_state(self) -> PinnedState {
        self.state
    }

    /// The next file of the run (its calls under `rows`, its aggregates
    /// `inputs`, both of `pid` or all): re-judges its copies when needed,
    /// then carries the ranges it leaves live.
    pub(crate) fn file(
        &mut self,
        trace: &Trace,
        rows: &Rows,
        pid: Option<u32>,
        inputs: &mut FindingInputs,
    ) -> Result<(), StoreError> {
        if judged_from(trace, pid)?.is_some() {
            if let Some(at_end) = stored(trace, pid)? {
                // The tracer judged them against the whole run's ranges,
                // which know what this reader's may not (files deleted).
                self.state = at_end;
                return Ok(());
            }
        }
        let rejudge = !self.state.is_empty() && inputs.pageable_copies() > 0;
        let q = CallQuery {
            pid,
            ops: Some(crate::finding_rollups::pinned_replay_ops(rejudge)),
            ..Default::default()
        };
        let earlier = std::mem::take(&mut self.state);
        let (replay, _) = crate::scoped::replay_pinning(rows, q, earlier, |_| true)?;
        self.state = replay.pinned_state();
        if rejudge {
            inputs.replace_pageable(replay);
        }
        Ok(())
    }
}

// --- The run's pinned ranges carried by the tracer ---
//
// A reader of a run's file `n` (`--last` of a run's directory) needs the
// ranges the run's earlier files left pinned; replaying them opens every
// earlier file (each one's checks: 9 s for the 40 earlier files of a
// 42-file run, each a first read; docs/benchmarks.md), and cannot know the
// files `--keep` deleted. The tracer completes its files in order, carrying
// the run's ledger from one to the next (`run_ledger`); it carries the
// pinned ranges with it, starts the file's pinned-memory replay (the
// finding rollups', `finding_rollups::write`) from them, so the copies are
// judged against them, and stores, in each file it completes, the ranges
// live at the file's end: table `run_pinned(pid, start_ptr, end_ptr)`,
// `meta.run_pinned = 1` once complete. File `n` began with what file `n - 1`
// stored, when their links say they are consecutive files of one run
// whose chain starts at file 1 ([`when_file_began`]); anything else
// replays, as before.

/// The ranges live at the file's end (`meta.run_pinned`).
const END: Ranges = Ranges {
    table: "run_pinned",
    key: "run_pinned",
};

/// The ranges live when the file began, over the whole run, against which
/// its copies were judged (`meta.run_copies_judged`): the completion
/// judged the file's copies (its finding rollups, per-process ones and op
/// scopes') from them, carried on a chain from the run's file 1, so no
/// reader judges them again, and a window of the file starts from them
/// with no other file read (the file copied elsewhere, its previous one
/// deleted).
const BEGIN: Ranges = Ranges {
    table: "run_pinned_begin",
    key: "run_copies_judged",
};

const COLS: &[&str] = &["pid", "start_ptr", "end_ptr"];

/// A stored set of pinned ranges: its table (columns [`COLS`]) and the
/// meta key set once it is complete.
struct Ranges {
    table: &'static str,
    key: &'static str,
}

impl Ranges {
    fn store(&self, conn: &Connection, state: &PinnedState) -> rusqlite::Result<()> {
        let t = self.table;
        conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {t}(pid INTEGER NOT NULL, start_ptr INTEGER NOT NULL, end_ptr INTEGER NOT NULL);
             DELETE FROM {t};"
        ))?;
        let mut ins = conn.prepare(&format!(
            "INSERT INTO {t}(pid, start_ptr, end_ptr) VALUES (?1, ?2, ?3)"
        ))?;
        for (pid, start, end) in state.ranges() {
            // Addresses are stored as SQLite's signed integers, bit for bit.
            ins.execute(params![pid, start as i64, end as i64])?;
        }
        conn.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, '1')",
            [self.key],
        )?;
        Ok(())
    }

    /// The ranges of process `pid` (or every process); None when the file
    /// stored none. A table that is not the one gpusleuth writes, or that
    /// holds more ranges than a tracer carries, is an error naming it.
    fn read(&self, trace: &Trace, pid: Option<u32>) -> Result<Option<PinnedState>, StoreError> {
        let conn = trace.keyed();
        let table = self.table;
        let read = || -> rusqlite::Result<Option<PinnedState>> {
            if !complete_tables(conn, self.key, &[(table, COLS)])? {
                return Ok(None);
            }
            let max = crate::run_ledger::MAX_CARRIED_ENTRIES;
            let mut st = conn.prepare(&format!(
                "SELECT pid, start_ptr, end_ptr FROM {table} WHERE ?1 IS NULL OR pid = ?1 LIMIT ?2"
            ))?;
            let mut rows = st.query(params![pid, max as i64 + 1])?;
            let mut ranges = Vec::new();
            while let Some(r) = rows.next()? {
                let (p, s, e): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
                let Ok(p) = u32::try_from(p) else {
                    return Err(damaged_table(table, "holds a pid no process has"));
                };
                ranges.push((p, s as u64, e as u64));
            }
            if ranges.len() > max {
                return Err(damaged_table(
                    table,
                    "holds more ranges than a tracer carries",
                ));
            }
            Ok(Some(PinnedState::from_ranges(ranges)))
        };
        read().map_err(|e| trace.read_error(e))
    }
}

/// Stores `state` as the ranges live at this file's end.
pub(crate) fn store(conn: &Connection, state: &PinnedState) -> rusqlite::Result<()> {
    END.store(conn, state)
}

/// The ranges of process `pid` (or every process) `trace` stored as live
/// at its end; None when it stored none (an older file, a file of a trace
/// without `--rotate`). A damaged table is an error naming it.
pub(crate) fn stored(trace: &Trace, pid: Option<u32>) -> Result<Option<PinnedState>, StoreError> {
    END.read(trace, pid)
}

/// Stores `state`, the whole run's ranges live when this file began, as
/// those its copies were judged against (the completion's transaction).
pub(crate) fn store_judged_from(conn: &Connection, state: &PinnedState) -> rusqlite::Result<()> {
    BEGIN.store(conn, state)
}

/// The whole run's ranges of `pid` (or every process) live when the file
/// began, when the tracer judged the file's copies against them
/// ([`store_judged_from`]); None otherwise (an older file, a chain that did
/// not start at the run's file 1). A damaged table is an error naming it.
pub(crate) fn judged_from(
    trace: &Trace,
    pid: Option<u32>,
) -> Result<Option<PinnedState>, StoreError> {
    BEGIN.read(trace, pid)
}
