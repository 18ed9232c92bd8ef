//! A run's allocator views carried by the tracer across its files (issue
//! 16, round 32), as `run_ledger` carries its ledger.
//!
//! A reader of a whole `trace --rotate --torch-allocator` run rebuilt each
//! process's allocator views by passes over every file's memory calls and
//! allocator events (`crate::run_steps`: ~1 µs a row, 2.5–5 s on the runs
//! measured), and a file `--keep` had deleted was missing from them. The
//! tracer completes its files one at a time, in order: each completion
//! now pushes the file's steps of every process it carries into that
//! process's replay (`sleuth_core::allocator::CarriedReplay`, one more
//! pass per process over the file's own steps) and stores the run's views
//! up to the end of the file in table `run_allocator(pid, at_ns, view)`
//! (`allocator_rollup`'s columns: the view at the end, `at_ns` NULL, and
//! the one at the moment its fragmentation finding describes), with
//! `meta.run_allocator = 1`. A reader of an intact chain (the one
//! `run_ledger` judges) reads the last file's rows instead of replaying.
//!
//! Exact or replayed: a process has rows only when its carried views are
//! those a replay of the chain's files gives. A process is not carried
//! (and a reader replays it) when its first allocator event comes in a
//! later file than a call that shapes its view (a segment, a failed
//! device allocation: `shapes_allocator_view`), when its calibration over
//! the run changes the layout its replay started with, when more steps
//! than `MAX_PENDING_STEPS` come before its layout is known, or, for one
//! file, when its finding's moment cannot be had from the carried state;
//! and the processes holding the most when the replays together hold more
//! than [`MAX_CARRIED_ENTRIES`] (the run's ledger is carried on).
//! Docs: docs/schema.md "Run allocator views".

use crate::file_steps::FileSteps;
use crate::finding_rollups::complete_tables;
use crate::json_column::{insert_row, json, text_of, Col};
use crate::reader::Trace;
use crate::StoreError;
use rusqlite::Connection;
use sleuth_core::allocator::{
    view_rebuilt, AllocatorView, Calibration, CarriedReplay, RebuildState, Rebuilder, StepSink,
    StepSource,
};
use sleuth_core::ledger::ProcessLedger;
use sleuth_core::{CallEvent, TraceData};
use std::collections::{BTreeMap, BTreeSet};

const TABLE: &str = "run_allocator";
/// Each carried process's replay as the file began (see [`views_at`]).
const BEGIN_TABLE: &str = "run_allocator_begin";
const BEGIN_COLS: &[&str] = &["pid", "before_ns", "replay"];
/// Members of a stored replay not range-checked: stack ids are hashes.
const LABELS: &[&str] = &["stack_id"];
/// `meta.run_allocator` once the table is complete.
const COMPLETE: &str = "1";

/// Past this many entries held by the carried replays
/// (`CarriedReplay::held_entries`: live blocks, segments, failed
/// requests, live allocations, the kept views' and the steps waiting for
/// a layout), the processes holding the most are carried no further (a
/// reader replays them), so that the tracer's memory stays bounded by
/// this, not by what the traced program keeps live: ~100-200 bytes
/// each, 10-20 MB, and as much again while a file's begin states are
/// held. The run's ledger is carried on either way.
pub const MAX_CARRIED_ENTRIES: usize = 100_000;

/// [`MAX_CARRIED_ENTRIES`], or what a test set ([`set_max_carried_for_tests`]).
static MAX_CARRIED: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(MAX_CARRIED_ENTRIES);

/// Lowers the bound on what the replays carried hold, for this process
/// (a test binary of its own: the tests beside it would see it).
#[doc(hidden)]
pub fn set_max_carried_for_tests(n: usize) {
    MAX_CARRIED.store(n, std::sync::atomic::Ordering::Relaxed);
}

/// What the completions of a run's files carry of its allocator views.
#[derive(Default)]
pub(crate) struct AllocatorCarry {
    /// Boxed: a replay is ~3 KB and a map node holds eleven values inline
    /// (each split of a full node moved 35 KB; round 54, heaptrack).
    replays: BTreeMap<u32, Box<CarriedReplay>>,
    /// Processes carried no further: a reader replays them.
    dropped: BTreeSet<u32>,
    /// Processes with a call that shapes an allocator view in an earlier
    /// file of the chain.
    shaped: BTreeSet<u32>,
    /// Those of the current file (added to `shaped` at its end).
    shaped_now: BTreeSet<u32>,
}

impl AllocatorCarry {
    /// Drops process `pid`'s replay: it exited, and the file it exited in
    /// stored its last views (a reader takes them from there).
    pub(crate) fn retire(&mut self, pid: u32) {
        self.replays.remove(&pid);
    }

    /// One memory call of the current file, as the ledger's replay reads it.
    pub(crate) fn saw(&mut self, c: &CallEvent) {
        if sleuth_core::allocator::shapes_allocator_view(c) {
            self.shaped_now.insert(c.pid);
        }
    }

    /// Pushes the file's steps into the replays of the processes carried
    /// and of those whose first allocator events it holds (`pids`: the
    /// file's processes with allocator events), and stores the run's views
    /// at its end (`run`: the run's ledgers then, for the views' reserved
    /// bytes).
    pub(crate) fn write(
        &mut self,
        conn: &Connection,
        run: &[ProcessLedger],
        pids: &[u32],
    ) -> rusqlite::Result<()> {
        for &pid in pids {
            if self.replays.contains_key(&pid) || self.dropped.contains(&pid) {
                continue;
            }
            match self.shaped.contains(&pid) {
                true => self.dropped.insert(pid),
                false => self
                    .replays
                    .insert(pid, Box::new(CarriedReplay::new(pid)))
                    .is_none(),
            };
        }
        self.shaped.append(&mut self.shaped_now);
        conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {BEGIN_TABLE}(pid INTEGER NOT NULL, before_ns INTEGER, replay TEXT NOT NULL)"
        ))?;
        conn.execute(&format!("DELETE FROM {BEGIN_TABLE}"), [])?;
        let source = FileSteps::own(conn)?;
        let max = MAX_CARRIED.load(std::sync::atomic::Ordering::Relaxed);
        let mut views: Vec<(u32, Option<u64>, AllocatorView)> = Vec::new();
        let mut lost = Vec::new();
        for (&pid, replay) in self.replays.iter_mut() {
            if let Err(why) = replay.begin_file(&source) {
                lost.push((pid, why));
                continue;
            }
            store_begin(conn, pid, replay)?;
            let mut over = None;
            source.for_each_step(pid, None, &mut |s| {
                over = replay.push_within(s, max).err();
                over.is_none()
            });
            if let Some(n) = over {
                // Its replay's memory goes now, not after every process.
                **replay = CarriedReplay::new(pid);
                lost.push((
                    pid,
                    format!("its replay held {n} blocks, segments, requests and views during the file, more than the {max} the tracer carries"),
                ));
                continue;
            }
            let reserved = sleuth_core::ledger::live_bytes_of(run, pid);
            // A process past the bound alone is dropped by the loop below
            // too (the largest go first): it stops before its views.
            match replay.end_file(&source, reserved, max) {
                Ok(v) if v.complete => {
                    views.push((pid, None, v.end));
                    views.extend(v.moment.map(|(ts, m)| (pid, Some(ts), m)));
                }
                Ok(_) => {}
                Err(why) => lost.push((pid, why)),
            }
        }
        source.into_result().map_err(crate::stream::own_error)?;
        // The processes holding the most first, until the rest fit.
        let mut held: Vec<(usize, u32)> = self
            .replays
            .iter()
            .filter(|(pid, _)| !lost.iter().any(|(l, _)| l == *pid))
            .map(|(&pid, r)| (r.held_entries(), pid))
            .collect();
        held.sort_unstable();
        let mut total: usize = held.iter().map(|h| h.0).sum();
        while total > max {
            let Some((n, pid)) = held.pop() else { break };
            total -= n;
            views.retain(|v| v.0 != pid);
            lost.push((
                pid,
                format!("its replay held {n} blocks, segments, requests and views, more than the {max} the tracer carries"),
            ));
        }
        for (pid, why) in lost {
            self.replays.remove(&pid);
            self.dropped.insert(pid);
            crate::writer::insert_note(
                conn,
                crate::file_clock::now_on_file_clock(conn)?,
                crate::NoteLevel::Info.as_str(),
                &format!(
                    "run allocator views: process {pid} is carried no further ({why}); `memory --db DIR` replays its allocator events"
                ),
            )?;
        }
        let rows = views.iter().map(|(pid, at, v)| (*pid, *at, v));
        crate::allocator_rollup::store_views(conn, TABLE, rows)?;
        let mut meta = conn.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)")?;
        meta.execute(["run_allocator", COMPLETE])?;
        meta.execute(["run_allocator_begin", COMPLETE])?;
        Ok(())
    }
}

/// Stores process `pid`'s replay as the file began, when it has one that
/// a reader would accept (a number past 2^62 outside `stack_id`, or more
/// entries than a checkpoint holds: none, and readers replay).
fn store_begin(conn: &Connection, pid: u32, replay: &CarriedReplay) -> rusqlite::Result<()> {
    let Some((state, before)) = replay.begin_state() else {
        return Ok(());
    };
    if state.entries() > crate::allocator_checkpoints::MAX_ENTRIES
        || !crate::stored_json::readable(&state, LABELS)
    {
        return Ok(());
    }
    let before = before.map_or(Col::Null, |t| Col::Int(t as i64));
    let text = json(&state);
    insert_row(
        conn,
        BEGIN_TABLE,
        BEGIN_COLS,
        &[Col::Int(pid.into()), before, Col::Json(&text)],
    )
}

/// The views at `at` of the processes `pids` that `rows`' file (the last
/// file of a run begun by `at`, on an intact chain of links) gives from
/// the replays it stored as it began: each taken up with the layout of
/// the file's own carried view at its end (whose calibration, over every
/// step of the chain's files up to this one, is the one a reader's replay
/// of the files begun by `at` finds), then fed the file's steps that
/// completed by `at`; reserved bytes from `ledgers` (the run's at `at`).
/// A process without a begin state, without a view at the file's end, or
/// one an earlier file's step completed after `at`, is left out (the
/// caller replays it). An error naming the table for a row no writer
/// stores.
pub(crate) fn views_at(
    rows: &crate::stream::Rows,
    at: u64,
    pids: &[u32],
    ledgers: &[ProcessLedger],
    data: &TraceData,
) -> Result<BTreeMap<u32, AllocatorView>, StoreError> {
    let conn = rows.conn();
    let bad = |what: String| crate::finding_rollups::damaged_table(BEGIN_TABLE, &what);
    let read = || -> rusqlite::Result<BTreeMap<u32, (Calibration, RebuildState)>> {
        let meta = |k| crate::open::meta_value(conn, k);
        if meta("run_allocator")?.as_deref() != Some(COMPLETE)
            || meta("run_allocator_begin")?.as_deref() != Some(COMPLETE)
        {
            return Ok(BTreeMap::new());
        }
        if !complete_tables(conn, TABLE, &[(TABLE, crate::allocator_rollup::COLS)])?
            || !complete_tables(conn, BEGIN_TABLE, &[(BEGIN_TABLE, BEGIN_COLS)])?
        {
            return Err(bad(
                "is missing though meta.run_allocator_begin says it is complete".into(),
            ));
        }
        let (ends, _) =
            crate::allocator_rollup::read_views(conn, TABLE, &|p| pids.contains(&p), data)?;
        let mut st = conn.prepare(&format!("SELECT pid, before_ns, replay FROM {BEGIN_TABLE}"))?;
        let mut q = st.query([])?;
        let mut out = BTreeMap::new();
        let mut seen = BTreeSet::new();
        while let Some(r) = q.next()? {
            let Ok(pid) = u32::try_from(r.get::<_, i64>(0)?) else {
                return Err(bad("holds a pid outside 0..2^32".into()));
            };
            if !seen.insert(pid) {
                return Err(bad(format!("holds a second row for pid {pid}")));
            }
            let Some(end) = ends.get(&pid) else { continue };
            let before: Option<i64> = r.get(1)?;
            let before = before
                .map(|t| {
                    crate::problems::stored_time(t)
                        .ok_or_else(|| bad(format!("has a time no trace holds for pid {pid}")))
                })
                .transpose()?;
            if before.is_some_and(|b| b > at) {
                continue;
            }
            let text = text_of(r.get_ref(2)?).map_err(|e| bad(format!("of pid {pid}: {e}")))?;
            if text.len() > MAX_BEGIN_TEXT {
                return Err(bad(format!(
                    "holds a state of pid {pid} longer than any writer stores"
                )));
            }
            let state: RebuildState = crate::stored_json::parse_except(text, LABELS)
                .map_err(|e| bad(format!("of pid {pid}: {e}")))?;
            if state.entries() > crate::allocator_checkpoints::MAX_ENTRIES {
                return Err(bad(format!(
                    "holds a state of pid {pid} larger than any writer stores"
                )));
            }
            out.insert(pid, (end.calibration.clone(), state));
        }
        Ok(out)
    };
    let states = read().map_err(|e| rows.read_error(e))?;
    let steps = FileSteps::read(rows);
    let mut views = BTreeMap::new();
    for (pid, (calibration, state)) in states {
        let Some(layout) = calibration.layout() else {
            continue;
        };
        let mut replay = Rebuilder::resume(state, layout).map_err(|why| {
            rows.read_error(bad(format!(
                "holds a state of pid {pid} no writer stores: {why}"
            )))
        })?;
        steps.for_each_step(pid, Some(at), &mut |s| {
            replay.push(s);
            true
        });
        let reserved = sleuth_core::ledger::live_bytes_of(ledgers, pid);
        views.insert(
            pid,
            view_rebuilt(pid, calibration, Some(replay), reserved, data),
        );
    }
    steps.into_result()?;
    Ok(views)
}

/// Longest stored begin state (a checkpoint's bound).
const MAX_BEGIN_TEXT: usize = 256 << 20;

/// The run's allocator views stored in the last file of an intact chain
/// (`trace`), of the processes `wanted` keeps, their blocks' sites named
/// from `context`: the processes listed have their view at the end and,
/// where their finding describes another moment, their view then; empty
/// when the file stored none (an older gpusleuth, a run without allocator
/// events). An error naming the table when it is not the one gpusleuth
/// writes or a view is damaged.
pub(crate) fn stored(
    trace: &Trace,
    wanted: &dyn Fn(u32) -> bool,
    context: &TraceData,
) -> Result<crate::allocator_rollup::Views, StoreError> {
    let conn = trace.keyed();
    let read = || -> rusqlite::Result<crate::allocator_rollup::Views> {
        if crate::open::meta_value(conn, "run_allocator")?.as_deref() != Some(COMPLETE) {
            return Ok(Default::default());
        }
        if !complete_tables(conn, TABLE, &[(TABLE, crate::allocator_rollup::COLS)])? {
            return Err(crate::finding_rollups::damaged_table(
                TABLE,
                "is missing though meta.run_allocator says it is complete",
            ));
        }
        crate::allocator_rollup::read_views(conn, TABLE, wanted, context)
    };
    read().map_err(|e| trace.read_error(e))
}

/// The processes (`pid` alone, or all) whose views the tracer carried to
/// the end of `trace`'s file (those it exited in included): a process
/// whose allocator events were all in files `--keep` deleted is known to
/// a reader only from here (round 54).
pub(crate) fn carried_pids(trace: &Trace, pid: Option<u32>) -> Result<BTreeSet<u32>, StoreError> {
    crate::run_ledger::stored_pids(
        trace,
        "run_allocator",
        (TABLE, crate::allocator_rollup::COLS),
        pid,
    )
}

/// The carried views of processes `pids` that the run's ledger retired at
/// their exit (round 47), from the chain's files before its last one
/// (`earlier`, newest first): each process's views as the file it exited
/// in stored them, its last (no step of a process follows its exit; its
/// reserved bytes, the ledger's live bytes at the end, are those at its
/// exit). A file is read while it says some process was retired
/// (`run_ledger::retired_any`); a process is taken from the file whose
/// `run_ledger_exited` lists it, and one without views there is left out
/// (the caller replays it).
pub(crate) fn stored_where_exited(
    earlier: impl Iterator<Item = Result<Trace, StoreError>>,
    pids: &[u32],
    context: &TraceData,
) -> Result<crate::allocator_rollup::Views, StoreError> {
    let mut out = crate::allocator_rollup::Views::default();
    let mut looking: BTreeSet<u32> = pids.iter().copied().collect();
    for trace in earlier {
        if looking.is_empty() {
            break;
        }
        let trace = trace?;
        if !crate::run_ledger::retired_any(&trace)? {
            break;
        }
        let exited = crate::run_ledger::exited_pids(&trace)?;
        let here: BTreeSet<u32> = looking.intersection(&exited).copied().collect();
        if here.is_empty() {
            continue;
        }
        looking.retain(|p| !here.contains(p));
        let (end, moments) = stored(&trace, &|p| here.contains(&p), context)?;
        out.0.extend(end);
        out.1.extend(moments);
    }
    Ok(out)
}
