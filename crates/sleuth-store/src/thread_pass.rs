//! One thread's calls, streamed in start order, against its waits streamed
//! alongside: each call's culprits (the tasks that held the CPU while the
//! thread waited runnable during it) and the thread's whole-thread split.
//! Memory is bounded by the waits overlapping one call, not by the thread.
//!
//! The writer's end-of-trace pass (`finalize`) runs it on every thread of
//! the file; the scoped explanation (`scoped`) on the threads of the calls
//! in a scope. Both get the culprits `culprits::call_culprits` and the
//! split `threads::stream_threads` give a loaded trace.

use crate::rows::wait_from_row;
use rusqlite::{CachedStatement, Rows};
use sleuth_core::culprits::culprits_of_call;
use sleuth_core::threads::{ThreadSplit, ThreadStream};
use sleuth_core::{CallEvent, Culprit, WaitEvent};
use std::collections::VecDeque;

/// The pass over one thread. Feed its calls in start order (ties: row id).
pub(crate) struct ThreadPass<'s> {
    /// The thread's waits with runnable time, by `(on_ns, wake_ns)`.
    culprit_waits: Rows<'s>,
    /// Waits that may still overlap a later call, from the first one still
    /// ending after the current call's start.
    queue: VecDeque<WaitEvent>,
    /// Read and not yet due (it woke after the current call's end).
    pending: Option<WaitEvent>,
    waits_done: bool,
    /// The thread's split and all its waits by `(on_ns, off_ns)`; None
    /// without a split to compute (a thread with nested calls only).
    split: Option<(ThreadStream, WaitFeed<'s>)>,
}

impl<'s> ThreadPass<'s> {
    pub(crate) fn new(
        culprit_waits: Rows<'s>,
        split: Option<(ThreadStream, Rows<'s>)>,
    ) -> ThreadPass<'s> {
        ThreadPass {
            culprit_waits,
            queue: VecDeque::new(),
            pending: None,
            waits_done: false,
            split: split.map(|(t, rows)| (t, WaitFeed::new(rows))),
        }
    }

    /// The culprits of the thread's next call (nested ones too), in
    /// `culprits_of_call`'s order; a non-nested call also joins the
    /// thread's split, after the waits that went back on CPU by its start.
    pub(crate) fn call(
        &mut self,
        c: &CallEvent,
        culprits_st: &mut CachedStatement,
    ) -> rusqlite::Result<Vec<Culprit>> {
        let (start, end) = (c.ts_ns, c.end_ns());
        while self.queue.front().is_some_and(|w| w.on_ns <= start) {
            self.queue.pop_front();
        }
        loop {
            if self.pending.is_none() && !self.waits_done {
                self.pending = match self.culprit_waits.next()? {
                    Some(r) => wait_from_row(r, culprits_st)?,
                    None => {
                        self.waits_done = true;
                        None
                    }
                };
                if self.pending.is_none() && !self.waits_done {
                    continue; // an unknown kind: skipped
                }
            }
            match self.pending.take() {
                Some(w) if w.wake_ns < end => {
                    if w.on_ns > start && !w.culprits.is_empty() {
                        self.queue.push_back(w);
                    }
                }
                other => {
                    self.pending = other;
                    break;
                }
            }
        }
        let refs: Vec<&WaitEvent> = self.queue.iter().collect();
        let culprits = culprits_of_call(c, &refs);
        if !c.nested {
            if let Some((t, feed)) = &mut self.split {
                while let Some(w) = feed.next_until(start, culprits_st)? {
                    t.add_wait(&w);
                }
                t.add_call(c);
            }
        }
        Ok(culprits)
    }

    /// The thread's split once its calls are all fed: the waits left are
    /// added, up to the first that went back on CPU at or after `last_on`
    /// (`u64::MAX`: all of them). A thread is off CPU once at a time, so
    /// its waits after that one start after it: given the end of the
    /// thread's window, the rest of a long trace is not read (a later wait
    /// adds nothing to the split: `ThreadStream` clamps waits to the window).
    /// None without a split.
    pub(crate) fn finish(
        self,
        culprits_st: &mut CachedStatement,
        comm: &str,
        last_on: u64,
    ) -> rusqlite::Result<Option<ThreadSplit>> {
        drop(self.culprit_waits);
        let Some((mut t, mut feed)) = self.split else {
            return Ok(None);
        };
        while let Some(w) = feed.next_until(u64::MAX, culprits_st)? {
            t.add_wait(&w);
            if w.on_ns >= last_on {
                break;
            }
        }
        Ok(Some(t.finish(comm)))
    }
}

/// Culprits in the order a reader of `call_culprits` gets them (runnable
/// time, largest first, then pid and tid): the finding accumulators'
/// examples keep the first ones.
pub(crate) fn sort_culprits(culprits: &mut [Culprit]) {
    culprits.sort_by(|a, b| {
        b.ns.cmp(&a.ns)
            .then(a.pid.cmp(&b.pid))
            .then(a.tid.cmp(&b.tid))
    });
}

/// The waits of one thread in `(on_ns, off_ns)` order, handed out up to a
/// moment: the split's side of the merge with the thread's calls.
struct WaitFeed<'s> {
    rows: Rows<'s>,
    /// Read, not handed out yet (it ends after the last call asked for).
    next: Option<WaitEvent>,
    done: bool,
}

impl<'s> WaitFeed<'s> {
    fn new(rows: Rows<'s>) -> WaitFeed<'s> {
        WaitFeed {
            rows,
            next: None,
            done: false,
        }
    }

    /// The next wait that went back on CPU at or before `until` (a call
    /// starting at `until` comes after it); None once the next one is later
    /// or there is none. Waits of an unknown kind are skipped.
    fn next_until(
        &mut self,
        until: u64,
        culprits_st: &mut CachedStatement,
    ) -> rusqlite::Result<Option<WaitEvent>> {
        while self.next.is_none() && !self.done {
            match self.rows.next()? {
                Some(r) => self.next = wait_from_row(r, culprits_st)?,
                None => self.done = true,
            }
        }
        Ok(match self.next.take() {
            Some(w) if w.on_ns <= until => Some(w),
            other => {
                self.next = other;
                None
            }
        })
    }
}
