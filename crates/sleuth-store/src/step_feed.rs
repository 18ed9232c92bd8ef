//! A process's allocator-view steps fed from a pass over the memory calls
//! that some other answer makes anyway, in return order (the completion's
//! ledger replay, `memory --at`'s): each call of a process with allocator
//! events is preceded by that process's allocator events that completed
//! before it (at equal times calls go first, as `FileSteps` merges them),
//! read a page at a time in completion order. The views then take no pass
//! of their own (`crate::allocator_rollup` calibrates with one, `memory
//! --at` rebuilds with one).

use crate::allocator_raw::{RowReader, Rows, RowsQuery};
use crate::allocator_rows::EndOrder;
use rusqlite::Connection;
use sleuth_core::allocator::{Calibrator, Rebuilder, Step, StepSink};
use std::collections::{BTreeMap, VecDeque};

/// Allocator events read per page.
const PAGE: i64 = 4096;

/// Where a feed stands in a process's allocator rows: the (end, id) of
/// the last row it read, or pushed; (-1, 0) before the first.
pub(crate) type RowPos = (i64, i64);

/// Before the first row.
pub(crate) const START: RowPos = (-1, 0);

/// A sink a feed pushes steps into, told the position of each allocator
/// row it was pushed (a checkpoint stores where the rows it holds end).
pub(crate) trait FedSink: StepSink {
    fn applied_row(&mut self, _pos: RowPos) {}
}

impl FedSink for Calibrator {}
impl FedSink for Rebuilder {}

/// The processes' sinks (`S`: a calibration, a rebuild) and the allocator
/// events read ahead of them.
pub(crate) struct StepFeed<'a, S> {
    conn: &'a Connection,
    pages: RowsQuery,
    procs: BTreeMap<u32, Fed<'a, S>>,
    failed: Option<rusqlite::Error>,
}

/// One process's sink and the allocator events read ahead of it.
struct Fed<'a, S> {
    sink: S,
    /// Reads the pages' rows, its rows kept from page to page.
    reader: RowReader<'a>,
    /// Events read and not yet pushed, each with its row's position.
    ahead: VecDeque<(sleuth_core::BlockEvent, RowPos)>,
    /// The position of the last row read.
    after: RowPos,
    /// Every row read.
    done: bool,
    /// Rows read by id must come in completion order.
    order: EndOrder,
}

impl<'a, S: FedSink> StepFeed<'a, S> {
    /// A feed for the processes of `sinks` (each process's allocator events
    /// go to its sink); None when the file has no allocator events.
    pub(crate) fn new(
        conn: &'a Connection,
        sinks: BTreeMap<u32, S>,
    ) -> rusqlite::Result<Option<Self>> {
        Ok(page_query(conn)?.map(|pages| Self::with_query(conn, pages, sinks)))
    }

    /// [`Self::new`] with the file's [`page_query`] known.
    pub(crate) fn with_query(
        conn: &'a Connection,
        pages: RowsQuery,
        sinks: BTreeMap<u32, S>,
    ) -> Self {
        let at_start = sinks.into_iter().map(|(pid, s)| (pid, (s, START)));
        Self::resumed(conn, pages, at_start.collect())
    }

    /// [`Self::with_query`] with each process's sink fed already the rows
    /// up to a position (a checkpoint's): its rows after it follow.
    pub(crate) fn resumed(
        conn: &'a Connection,
        pages: RowsQuery,
        sinks: BTreeMap<u32, (S, RowPos)>,
    ) -> Self {
        let procs = sinks
            .into_iter()
            .map(|(pid, (sink, after))| {
                let fed = Fed {
                    sink,
                    reader: pages.reader(conn),
                    ahead: VecDeque::new(),
                    after,
                    done: false,
                    order: EndOrder::default(),
                };
                (pid, fed)
            })
            .collect();
        StepFeed {
            conn,
            pages,
            procs,
            failed: None,
        }
    }

    /// The next memory call of the pass (all processes, in return order):
    /// the allocator events of its process that completed before it, then it.
    pub(crate) fn push_call(&mut self, c: &sleuth_core::CallEvent) {
        if self.failed.is_some() {
            return;
        }
        let Some(fed) = self.procs.get_mut(&c.pid) else {
            return;
        };
        if let Err(e) = feed_blocks(self.conn, &self.pages.sql, c.pid, fed, Some(c.end_ns())) {
            self.failed = Some(e);
            return;
        }
        fed.sink.push(Step::Call(c));
    }

    /// Process `pid`'s sink as it stands.
    pub(crate) fn sink(&self, pid: u32) -> Option<&S> {
        self.procs.get(&pid).map(|f| &f.sink)
    }

    /// Each process's sink once every call was pushed, fed the allocator
    /// events that completed by `until` (all when None); the first read
    /// error of the feed instead, if one failed.
    pub(crate) fn finish(mut self, until: Option<u64>) -> rusqlite::Result<BTreeMap<u32, S>> {
        let before = until.map(|t| t.saturating_add(1));
        for (&pid, fed) in &mut self.procs {
            if self.failed.is_none() {
                if let Err(e) = feed_blocks(self.conn, &self.pages.sql, pid, fed, before) {
                    self.failed = Some(e);
                }
            }
        }
        if let Some(e) = self.failed {
            return Err(e);
        }
        Ok(self
            .procs
            .into_iter()
            .map(|(pid, fed)| (pid, fed.sink))
            .collect())
    }
}

/// The query a feed reads a process's allocator events with, a page at a
/// time; None when the file has no allocator events.
pub(crate) fn page_query(conn: &Connection) -> rusqlite::Result<Option<RowsQuery>> {
    RowsQuery::of(conn, Rows::Page)
}

/// Pushes `pid`'s allocator events that completed before `before` (all
/// when None) into its sink, reading pages as needed: a page is read only
/// when none is ahead, so a bound early in the file reads no later page.
fn feed_blocks<S: FedSink>(
    conn: &Connection,
    sql: &str,
    pid: u32,
    fed: &mut Fed<'_, S>,
    before: Option<u64>,
) -> rusqlite::Result<()> {
    loop {
        while let Some((b, pos)) = fed
            .ahead
            .pop_front_if(|(b, _)| before.is_none_or(|t| b.end_ns < t))
        {
            fed.sink.push(Step::Block(&b));
            fed.sink.applied_row(pos);
        }
        if !fed.ahead.is_empty() || fed.done {
            return Ok(());
        }
        let mut st = conn.prepare_cached(sql)?;
        let mut rows = st.query(rusqlite::params![pid, fed.after.0, fed.after.1, PAGE])?;
        let mut read = 0;
        while let Some(r) = rows.next()? {
            read += 1;
            fed.after = (r.get(1)?, r.get(crate::allocator_rows::ID_COL)?);
            if let Some(b) = fed.reader.event(r)? {
                fed.order.check(&b)?;
                fed.ahead.push_back((b, fed.after));
            }
        }
        fed.done = read < PAGE;
    }
}
