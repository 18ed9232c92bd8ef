//! Allocator checkpoints (issue 16): each process's allocator replay
//! stored along the file at its completion, so a reader of a late moment
//! takes it up there instead of replaying from the file's start.
//!
//! A window's allocator views are each process's view at the window's end
//! (`crate::scoped`): a replay of its memory calls and allocator events
//! from the file's start, since a segment outlives the window that uses
//! it. Late in the bench's 10M-call trace with allocator events that is
//! ~1.7M memory calls read for a one-second window (1.5–1.8 s of its
//! 1.8–2.4 s). The completion replays every process's steps anyway to
//! store its views at the end (`crate::allocator_rollup`); that replay now
//! also stores its state every [`EVERY`] steps at least: table
//! `allocator_checkpoints(pid, at_ns, from_id, blocks_end, blocks_id,
//! ledger, replay)`, complete once `meta.allocator_checkpoints = 1`.
//!
//! A row holds the state after every step of process `pid` that completed
//! by `at_ns` and none later: `ledger` (the process's ledger without
//! history: live allocations and totals, `LedgerBuilder::without_history`),
//! `replay` (the block replay, `sleuth_core::allocator::RebuildState`),
//! (`blocks_end`, `blocks_id`) the position of the last allocator row it
//! holds, and `from_id` the lowest row id of the process's memory calls
//! that returned after `at_ns` (NULL when none did): a reader takes the
//! row up and reads only the calls that returned after `at_ns`, from that
//! id on, and the allocator rows after that position.
//!
//! A checkpoint is taken only between steps of different completion
//! times, so "completed by `at_ns`" splits the steps exactly. Its size
//! grows with what is live, so the steps between two checkpoints grow
//! with it (512 per entry stored, [`EVERY`] at least): the table stays a
//! fraction of the file whatever the process holds. A state past
//! [`MAX_ENTRIES`] ends the process's checkpoints (readers replay from the
//! last one).
//!
//! Readers: rows are untrusted input. Every number is range-checked
//! (`stored_json`), the ledger by `LedgerBuilder::from_states_without_history`,
//! the replay by `Rebuilder::resume` with the reader's own calibration
//! (another layout is refused); a table or row no writer makes is an
//! error naming the table. A crafted row can make a view wrong, not a
//! reader panic or hang: the reads it steers are bounded by the file.
//! Docs: docs/schema.md "Allocator checkpoints".

use crate::finding_rollups::{complete_tables, damaged_table};
use crate::json_column::{insert_row, json, text_of, Col};
use crate::step_feed::{FedSink, RowPos, StepFeed};
use crate::stream::{visit_own_memory_calls, StreamOrder};
use rusqlite::Connection;
use sleuth_core::allocator::{Layout, RebuildState, Rebuilder, Step, StepSink};
use sleuth_core::ledger::{LedgerBuilder, ProcessState};
use std::collections::BTreeMap;

/// `meta.allocator_checkpoints` once the table is complete.
const COMPLETE: &str = "1";

const TABLE: &str = "allocator_checkpoints";

const CREATE: &str = "CREATE TABLE IF NOT EXISTS allocator_checkpoints(
    pid INTEGER NOT NULL, at_ns INTEGER NOT NULL, from_id INTEGER,
    blocks_end INTEGER NOT NULL, blocks_id INTEGER NOT NULL,
    ledger TEXT NOT NULL, replay TEXT NOT NULL)";

/// The table's columns in order: a reader accepts nothing else.
const COLS: &[&str] = &[
    "pid",
    "at_ns",
    "from_id",
    "blocks_end",
    "blocks_id",
    "ledger",
    "replay",
];

/// Steps between two checkpoints at least: 64k (a late window of the
/// bench's 10M-call trace replays at most that many, ~50 ms).
pub(crate) const EVERY: u64 = 1 << 16;

/// [`EVERY`], or what a test set ([`set_steps_for_tests`]).
static STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(EVERY);

/// Passes that took up a checkpoint (tests see that one was).
static TAKEN_UP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// [`STEPS_PER_ENTRY`], or 0 once a test set the spacing.
static PER_ENTRY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(STEPS_PER_ENTRY);

/// Makes every writer of this process store a checkpoint every `n` steps
/// whatever its size (tests: small files then have many). The answers are
/// the same at any spacing, so tests running beside each other may share it.
#[doc(hidden)]
pub fn set_steps_for_tests(n: u64) {
    STEPS.store(n.max(1), std::sync::atomic::Ordering::Relaxed);
    PER_ENTRY.store(0, std::sync::atomic::Ordering::Relaxed);
}

/// How many reads took up a checkpoint in this process (tests).
#[doc(hidden)]
pub fn taken_up_for_tests() -> u64 {
    TAKEN_UP.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn note_taken_up() {
    TAKEN_UP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

fn every() -> u64 {
    STEPS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Steps between two checkpoints per entry of the last one stored: the
/// table holds at most one entry per this many steps. An entry is ~90–130
/// bytes of JSON (a live block, a segment, a live allocation), so ~0.25
/// bytes per step at most: on the H200's real `--torch-allocator` traces
/// (~460 entries, 52–58 KB a state) 8 per entry stored 6 states, 0.8
/// bytes per event of a 78-byte event.
const STEPS_PER_ENTRY: u64 = 512;

/// Entries (live allocations, live blocks, segments, failures) of a state
/// past which a process's checkpoints end.
pub(crate) const MAX_ENTRIES: usize = 1 << 20;

/// Members of a stored replay not range-checked: stack ids are hashes.
const LABELS: &[&str] = &["stack_id"];

/// The longest text a reader takes for one state (JSON of
/// [`MAX_ENTRIES`] entries stays below it).
const MAX_TEXT: usize = 256 << 20;

/// A step sink that replays one process's steps and stores checkpoints of
/// its state along the way.
struct Checkpointer<'a> {
    conn: &'a Connection,
    pid: u32,
    replay: Rebuilder,
    ledger: LedgerBuilder,
    /// Steps applied since the last checkpoint (or the start).
    steps: u64,
    /// Steps before the next checkpoint may be taken.
    every: u64,
    last_end: Option<u64>,
    /// The position of the last allocator row applied.
    last_row: RowPos,
    /// The times of the checkpoints stored, in order.
    times: Vec<u64>,
    /// Past [`MAX_ENTRIES`]: no more checkpoints.
    ended: bool,
    failed: Option<rusqlite::Error>,
}

impl Checkpointer<'_> {
    /// Stores the state as it stands: every step that completed by `at_ns`.
    fn store(&mut self, at_ns: u64) {
        let ledger: Vec<ProcessState> = self.ledger.states();
        let replay = self.replay.state();
        let entries = ledger.iter().map(ProcessState::entries).sum::<usize>() + replay.entries();
        if entries > MAX_ENTRIES {
            self.ended = true;
            return;
        }
        let (Some(state), true) = (
            ledger.first(),
            crate::stored_json::readable(&replay, LABELS),
        ) else {
            // A number no reader would accept: the next one may be storable.
            self.steps = 0;
            return;
        };
        let written = insert_row(
            self.conn,
            TABLE,
            COLS,
            &[
                Col::Int(self.pid.into()),
                Col::Int(at_ns as i64),
                Col::Null,
                Col::Int(self.last_row.0),
                Col::Int(self.last_row.1),
                Col::Json(&json(state)),
                Col::Json(&json(&replay)),
            ],
        );
        if let Err(e) = written {
            self.failed.get_or_insert(e);
            self.ended = true;
            return;
        }
        self.times.push(at_ns);
        self.steps = 0;
        let per_entry = PER_ENTRY.load(std::sync::atomic::Ordering::Relaxed);
        self.every = every().max((entries as u64).saturating_mul(per_entry));
    }
}

impl StepSink for Checkpointer<'_> {
    fn push(&mut self, s: Step<'_>) {
        let end = s.end_ns();
        if let (Some(last), false) = (self.last_end, self.ended) {
            if end > last && self.steps >= self.every {
                self.store(last);
            }
        }
        if let Step::Call(c) = s {
            self.ledger.push(c);
        }
        self.replay.push(s);
        self.steps += 1;
        self.last_end = Some(end);
    }
}

impl FedSink for Checkpointer<'_> {
    fn applied_row(&mut self, pos: RowPos) {
        self.last_row = pos;
    }
}

/// Replays the steps of every process of `layouts` in the file being
/// completed, each with its layout, storing checkpoints along the way (the
/// table made first), and returns each replay at the end (what its view at
/// the end is assembled from). `pages` is the allocator rows' page query.
///
/// One pass over the file's memory calls feeds every process: a pass per
/// process read every memory call of the file each time (the calls have no
/// index by process), so a file of N short-lived PyTorch processes took
/// O(N²) to complete (1,000 processes ~10 s, 14,564 never finished in a
/// node agent's run; round 53's tester).
pub(crate) fn replay_storing(
    conn: &Connection,
    pages: &crate::allocator_raw::RowsQuery,
    layouts: &BTreeMap<u32, Layout>,
) -> rusqlite::Result<BTreeMap<u32, Rebuilder>> {
    conn.execute_batch(CREATE)?;
    let sinks = layouts.iter().map(|(&pid, &layout)| {
        let mut ledger = LedgerBuilder::without_history();
        ledger.track(pid);
        let sink = Checkpointer {
            conn,
            pid,
            replay: Rebuilder::new(layout),
            ledger,
            steps: 0,
            every: every(),
            last_end: None,
            last_row: crate::step_feed::START,
            times: Vec::new(),
            ended: false,
            failed: None,
        };
        (pid, sink)
    });
    let mut feed = StepFeed::with_query(conn, pages.clone(), sinks.collect());
    // Per process: the lowest id of its calls applied after each
    // checkpoint, before the next.
    let mut lowest: BTreeMap<u32, Vec<Option<i64>>> = BTreeMap::new();
    visit_own_memory_calls(conn, None, StreamOrder::ByReturn, |c, id| {
        if !layouts.contains_key(&c.pid) {
            return;
        }
        feed.push_call(c);
        // A checkpoint taken as this call was pushed starts a segment: the call is its first.
        let taken = feed.sink(c.pid).map_or(0, |s| s.times.len());
        let low = lowest.entry(c.pid).or_default();
        low.resize(taken, None);
        if let Some(low) = low.last_mut() {
            *low = Some(low.map_or(id, |l| l.min(id)));
        }
    })?;
    let sinks = feed.finish(None)?;
    let mut row = conn.prepare(&format!(
        "SELECT rowid FROM {TABLE} WHERE pid = ?1 AND at_ns = ?2"
    ))?;
    let mut out = BTreeMap::new();
    for (pid, sink) in sinks {
        if let Some(e) = sink.failed {
            return Err(e);
        }
        // A checkpoint's first id: the lowest of every call applied after it.
        let mut lowest = lowest.remove(&pid).unwrap_or_default();
        lowest.resize(sink.times.len(), None);
        let mut low: Option<i64> = None;
        for (at, l) in sink.times.iter().zip(&lowest).rev() {
            low = match (low, *l) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let rowid: i64 = row.query_row(rusqlite::params![pid, *at as i64], |r| r.get(0))?;
            // Not an UPDATE: it would hold a long state twice over.
            crate::json_column::set_int(conn, TABLE, COLS, rowid, "from_id", low)?;
        }
        out.insert(pid, sink.replay);
    }
    // `finish` returns every sink the feed was given: one per layout.
    Ok(out)
}

/// Says the table is complete (after every process's replay).
pub(crate) fn settle(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(CREATE)?;
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES ('allocator_checkpoints', ?1)",
        [COMPLETE],
    )?;
    Ok(())
}

/// The error of a state of process `pid` that a replay refused to take up
/// (`why`): the file is damaged.
pub(crate) fn refused(pid: u32, why: &str) -> rusqlite::Error {
    damaged_table(
        TABLE,
        &format!("holds a state of pid {pid} no writer stores: {why}"),
    )
}

/// A checkpoint as a reader takes it up.
pub(crate) struct Checkpoint {
    pub(crate) at_ns: u64,
    /// The lowest id of the process's memory calls that returned after
    /// `at_ns`; None when none did.
    pub(crate) from_id: Option<i64>,
    /// The position of the last allocator row the state holds.
    pub(crate) rows_after: RowPos,
    pub(crate) ledger: ProcessState,
    pub(crate) replay: RebuildState,
}

/// Process `pid`'s latest checkpoint at or before `at_ns`: None when the
/// file stores none (an older file, one without allocator events, a
/// moment before the first); an error naming the table for a table or a
/// row no writer makes.
pub(crate) fn latest(
    conn: &Connection,
    pid: u32,
    at_ns: u64,
) -> rusqlite::Result<Option<Checkpoint>> {
    let done = crate::open::meta_value(conn, "allocator_checkpoints")?;
    if done.as_deref() != Some(COMPLETE) {
        return Ok(None);
    }
    let bad = |what: String| damaged_table(TABLE, &what);
    if !complete_tables(conn, "allocator_checkpoints", &[(TABLE, COLS)])? {
        return Err(bad(
            "is missing though meta.allocator_checkpoints says it is complete".into(),
        ));
    }
    let at = i64::try_from(at_ns).unwrap_or(i64::MAX);
    let mut st = conn.prepare(&format!(
        "SELECT at_ns, from_id, blocks_end, blocks_id, ledger, replay FROM {TABLE}
         WHERE pid = ?1 AND at_ns <= ?2 ORDER BY at_ns DESC LIMIT 2"
    ))?;
    let mut rows = st.query(rusqlite::params![pid, at])?;
    let Some(r) = rows.next()? else {
        return Ok(None);
    };
    let at_ns = crate::problems::stored_time(r.get(0)?)
        .ok_or_else(|| bad(format!("has a time no trace holds for pid {pid}")))?;
    let from_id: Option<i64> = r.get(1)?;
    if from_id.is_some_and(|id| id < 0) {
        return Err(bad(format!("has a row id no file holds for pid {pid}")));
    }
    let rows_after: RowPos = (r.get(2)?, r.get(3)?);
    let text = |i: usize| -> rusqlite::Result<String> {
        let t = text_of(r.get_ref(i)?).map_err(|e| bad(format!("of pid {pid}: {e}")))?;
        match t.len() > MAX_TEXT {
            true => Err(bad(format!(
                "holds a state of pid {pid} longer than any writer stores"
            ))),
            false => Ok(t.to_string()),
        }
    };
    let ledger: ProcessState =
        serde_json::from_str(&text(4)?).map_err(|e| bad(format!("of pid {pid}: {e}")))?;
    let replay: RebuildState = crate::stored_json::parse_except(&text(5)?, LABELS)
        .map_err(|e| bad(format!("of pid {pid}: {e}")))?;
    if ledger.pid != pid {
        return Err(bad(format!("holds a foreign state for pid {pid}")));
    }
    if ledger.entries().saturating_add(replay.entries()) > MAX_ENTRIES {
        return Err(bad(format!(
            "holds a state of pid {pid} larger than any writer stores"
        )));
    }
    // Two checkpoints of one moment: no writer stores them.
    if let Some(next) = rows.next()? {
        if next.get::<_, i64>(0)? == at_ns as i64 {
            return Err(bad(format!("holds two states of pid {pid} at one moment")));
        }
    }
    Ok(Some(Checkpoint {
        at_ns,
        from_id,
        rows_after,
        ledger,
        replay,
    }))
}
