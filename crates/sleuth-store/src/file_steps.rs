//! A process's allocator-view steps read from a file at each pass: its
//! memory calls in return order merged with its allocator events in
//! completion order (from their `(pid, end_ns)` index, unsorted), the
//! order `sleuth_core::allocator::StepSource` asks for, so a view is
//! rebuilt holding neither. A reader's file is read through its stream
//! (checks, budget); the writer completing its own file
//! (`crate::allocator_rollup`) reads it directly. The first read error ends
//! every later pass and is kept for the caller.

use crate::error::StoreError;
use crate::stream::{memory_calls_of, visit_calls, CallSource, Rows, StreamOrder};
use rusqlite::Connection;
use sleuth_core::allocator::{Step, StepSource};
use sleuth_core::BlockEvent;
use std::cell::RefCell;

pub(crate) struct FileSteps<'a> {
    calls: Calls<'a>,
    /// Each process's threads where reading them beats reading the file's
    /// memory calls (see [`Threads`]).
    threads: Threads,
    failed: RefCell<Option<StoreError>>,
}

/// The threads of each process of a file, from its stored call groups,
/// for the processes whose threads' rows are a small part of the file: a
/// pass of one such process then reads its own calls through the
/// `(tid, ts_ns)` index. Without it, each pass read every memory call of
/// the file (the calls have no index by process), and the completion of
/// a file of N short-lived PyTorch processes, one pass or three per
/// process (`crate::run_allocator`), took O(N²): a rotated node agent's
/// file of 14,564 processes never finished (round 53's tester).
#[derive(Default)]
struct Threads(std::collections::HashMap<u32, Vec<u32>>);

impl Threads {
    /// A process's threads are read by index where their rows are fewer
    /// than 1 in this many of the file's.
    const SMALL_PART: u64 = 8;

    /// From the file's call groups (none stored: a file being written or
    /// an older one, every process reads as before).
    fn of(conn: &Connection) -> rusqlite::Result<Self> {
        let Some(groups) = crate::call_groups::stored(conn)? else {
            return Ok(Self::default());
        };
        let mut rows_of_tid: std::collections::HashMap<u32, u64> = Default::default();
        let mut total = 0u64;
        for g in &groups {
            *rows_of_tid.entry(g.tid).or_default() += g.count;
            total = total.saturating_add(g.count);
        }
        let mut tids: std::collections::HashMap<u32, Vec<u32>> = Default::default();
        for g in &groups {
            tids.entry(g.pid).or_default().push(g.tid);
        }
        tids.retain(|_, t| {
            t.sort_unstable();
            t.dedup();
            let rows = t
                .iter()
                .map(|tid| rows_of_tid[tid])
                .fold(0u64, u64::saturating_add);
            rows.saturating_mul(Self::SMALL_PART) < total
        });
        Ok(Threads(tids))
    }

    fn of_pid(&self, pid: u32) -> Option<Vec<u32>> {
        let tids = self.0.get(&pid).cloned();
        if tids.is_some() {
            BY_THREADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        tids
    }
}

/// Passes that read a process's calls by its threads (tests).
static BY_THREADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many passes in this process read a process's calls by its threads.
#[doc(hidden)]
pub fn passes_by_threads_for_tests() -> u64 {
    BY_THREADS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Where the memory calls come from.
enum Calls<'a> {
    /// A reader's stream (its checks and budget).
    Read(&'a Rows),
    /// The writer's own file.
    Own(&'a Connection, CallSource),
}

impl<'a> FileSteps<'a> {
    /// The steps of a reader's file, read through `rows`.
    pub(crate) fn read(rows: &'a Rows) -> Self {
        // Only a way to read: a call groups table the reader refuses (said
        // by the readers that answer from it) leaves every pass as before.
        Self::new(
            Calls::Read(rows),
            Threads::of(rows.conn()).unwrap_or_default(),
        )
    }

    /// The steps of the file the writer is completing.
    pub(crate) fn own(conn: &'a Connection) -> rusqlite::Result<Self> {
        Ok(Self::new(
            Calls::Own(conn, CallSource::of(conn)?),
            Threads::of(conn)?,
        ))
    }

    fn new(calls: Calls<'a>, threads: Threads) -> Self {
        FileSteps {
            calls,
            threads,
            failed: RefCell::new(None),
        }
    }

    fn conn(&self) -> &'a Connection {
        match self.calls {
            Calls::Read(rows) => rows.conn(),
            Calls::Own(conn, _) => conn,
        }
    }

    /// The first read error of any pass, if one failed.
    pub(crate) fn into_result(self) -> Result<(), StoreError> {
        match self.failed.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn fail(&self, e: StoreError) {
        self.failed.borrow_mut().get_or_insert(e);
    }

    fn sqlite(&self, e: rusqlite::Error) -> StoreError {
        match self.calls {
            Calls::Read(rows) => rows.read_error(e),
            Calls::Own(..) => StoreError::Sqlite {
                path: Default::default(),
                source: e,
            },
        }
    }

    /// Visits process `pid`'s memory calls and `blocks` (its allocator
    /// events in completion order) that completed by `until` (all when
    /// None), merged, until `visit` returns false. The calls' bound is the
    /// query's: the return order is SQLite's sort (or a bounded buffer's),
    /// which would otherwise take in every later memory call of the file.
    fn merge(
        &self,
        pid: u32,
        until: Option<u64>,
        blocks: impl Iterator<Item = BlockEvent>,
        visit: &mut dyn FnMut(Step<'_>) -> bool,
    ) {
        let mut blocks = blocks
            .take_while(|b| until.is_none_or(|u| b.end_ns <= u))
            .peekable();
        let mut q = memory_calls_of(Some(pid), StreamOrder::ByReturn, until);
        q.tids = self.threads.of_pid(pid);
        let mut each = |c: crate::types::StoredCall| {
            // At equal completion times calls go first.
            while let Some(b) = blocks.next_if(|b| b.end_ns < c.call.end_ns()) {
                if !visit(Step::Block(&b)) {
                    return Err(Halt::Done);
                }
            }
            match visit(Step::Call(&c.call)) {
                true => Ok(()),
                false => Err(Halt::Done),
            }
        };
        let calls = match self.calls {
            Calls::Read(rows) => rows.for_each_call::<Halt>(&q, &mut each),
            Calls::Own(conn, src) => visit_calls::<Halt>(conn, src, &q, &|e| self.sqlite(e), each),
        };
        match calls {
            Ok(()) => {
                for b in blocks {
                    if !visit(Step::Block(&b)) {
                        break;
                    }
                }
            }
            Err(Halt::Done) => {}
            Err(Halt::Failed(e)) => self.fail(e),
        }
    }

    /// [`Self::merge`] with process `pid`'s allocator events read from the
    /// file as the calls are (`crate::allocator_raw::RowsQuery`).
    fn merge_from_file(
        &self,
        pid: u32,
        until: Option<u64>,
        visit: &mut dyn FnMut(Step<'_>) -> bool,
    ) {
        let conn = self.conn();
        match crate::allocator_raw::RowsQuery::of(conn, crate::allocator_raw::Rows::All) {
            Ok(Some(q)) => {
                let mut reader = q.reader(conn);
                self.merge_rows(pid, until, &q.sql, |r| reader.event(r), visit)
            }
            Ok(None) => self.merge(pid, until, std::iter::empty(), visit),
            Err(e) => self.fail(self.sqlite(e)),
        }
    }

    /// [`Self::merge`] with process `pid`'s allocator events of query
    /// `sql` (its one parameter the pid), each row made an event (or none:
    /// left out, an op this build does not know) by `read`. A row that
    /// cannot be read, or out of completion order, ends the events (and
    /// fails the pass).
    fn merge_rows(
        &self,
        pid: u32,
        until: Option<u64>,
        sql: &str,
        read: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<Option<BlockEvent>>,
        visit: &mut dyn FnMut(Step<'_>) -> bool,
    ) {
        let conn = self.conn();
        let mut st = match conn.prepare_cached(sql) {
            Ok(st) => st,
            Err(e) => return self.fail(self.sqlite(e)),
        };
        let rows = match st.query_map([pid], read) {
            Ok(rows) => rows,
            Err(e) => return self.fail(self.sqlite(e)),
        };
        let broken = RefCell::new(None);
        let mut order = crate::allocator_rows::EndOrder::default();
        let blocks = rows
            .map_while(|r| r.map_err(|e| *broken.borrow_mut() = Some(e)).ok())
            .flatten()
            .map_while(|b| match order.check(&b) {
                Ok(()) => Some(b),
                Err(e) => {
                    *broken.borrow_mut() = Some(e);
                    None
                }
            });
        self.merge(pid, until, blocks, visit);
        if let Some(e) = broken.into_inner() {
            self.fail(self.sqlite(e));
        }
    }
}

/// Why a pass over the calls stopped early.
enum Halt {
    /// The view asked for no more steps.
    Done,
    Failed(StoreError),
}

impl From<StoreError> for Halt {
    fn from(e: StoreError) -> Self {
        Halt::Failed(e)
    }
}

impl StepSource for FileSteps<'_> {
    fn for_each_step(&self, pid: u32, until: Option<u64>, visit: &mut dyn FnMut(Step<'_>) -> bool) {
        if self.failed.borrow().is_some() {
            return;
        }
        self.merge_from_file(pid, until, visit);
    }
}
