//! One thread's calls, streamed in start order, against its waits streamed
//! alongside: each call's culprits (the tasks that held the CPU while the
//! thread waited runnable during it) and the thread's whole-thread split.
//! Memory is bounded by the waits overlapping one call, not by the thread.
//!
//! The writer's end-of-trace pass (`finalize`) runs it on every thread of
//! the file; the scoped explanation (`scoped`) on the threads of the calls
//! in a scope. Both get the culprits `culprits::call_culprits` and the
//! split `threads::stream_threads` give a loaded trace.
//!
//! The waits are read once (`wait_stream`), for both: the culprits need
//! those overlapping the current call, the split those back on CPU by its
//! start; both in `on_ns` order, so one buffer of the waits read past the
//! current call's start serves them (it was two reads of the waits, the
//! culprits of each wait looked up in each).

use crate::wait_stream::WaitStream;
use rusqlite::Rows;
use sleuth_core::culprits::culprits_of_call;
use sleuth_core::threads::{ThreadSplit, ThreadStream};
use sleuth_core::{CallEvent, Culprit, WaitEvent};
use std::collections::VecDeque;

/// The pass over one thread. Feed its calls in start order (ties: row id).
pub(crate) struct ThreadPass<'s> {
    /// The thread's waits (`wait_stream::thread_waits_sql`).
    waits: WaitStream<'s>,
    /// Waits read that went back on CPU after the current call's start, in
    /// stream order; the last may have woken after its end (read ahead).
    ahead: VecDeque<WaitEvent>,
    done: bool,
    /// The thread's split; None without one to compute (a thread with
    /// nested calls only): waits are then dropped once past.
    split: Option<ThreadStream>,
    /// The splits of each op's calls alone (`with_op_splits`), by op id.
    op_splits: Vec<OpSplit>,
    /// The trace's tracer pid: its threads are never a call's culprits.
    tracer: Option<u32>,
}

/// Each op's split of a thread, by op id (`ThreadPass::finish_with_ops`).
pub(crate) type OpSplits = Vec<(u16, ThreadSplit)>;

/// The split of one op's non-nested calls of the thread over their own
/// window, as a scope of that op alone sees the thread (MCP `findings` with
/// an op): the other ops' calls are time between its calls there.
struct OpSplit {
    op: u16,
    window: (u64, u64),
    stream: ThreadStream,
}

impl OpSplit {
    /// A wait that went back on CPU by its window's start, or went off CPU
    /// at or after its end, adds nothing to it (`ThreadStream` clamps waits
    /// to the window): most waits of an op whose calls span part of the
    /// thread.
    fn add_wait(&mut self, w: &WaitEvent) {
        if w.on_ns > self.window.0 && w.off_ns < self.window.1 {
            self.stream.add_wait(w);
        }
    }
}

impl<'s> ThreadPass<'s> {
    pub(crate) fn new(
        waits: Rows<'s>,
        split: Option<ThreadStream>,
        tracer: Option<u32>,
    ) -> ThreadPass<'s> {
        ThreadPass {
            waits: WaitStream::new(waits),
            ahead: VecDeque::new(),
            done: false,
            split,
            op_splits: Vec::new(),
            tracer,
        }
    }

    /// Also splits each op's calls alone over its window (`windows`: op id,
    /// first start and last end of the thread's non-nested calls of it;
    /// `ThreadWindows::ops`), for the writer's per-op finding rollups.
    /// Their waits are all read (`finish` with no end).
    pub(crate) fn with_op_splits(
        mut self,
        windows: &[(u16, (u64, u64))],
        pid: u32,
        tid: u32,
        tracer: Option<u32>,
    ) -> ThreadPass<'s> {
        self.op_splits = windows
            .iter()
            .map(|&(op, window)| OpSplit {
                op,
                window,
                stream: ThreadStream::new(pid, tid, window, tracer),
            })
            .collect();
        self
    }

    /// The culprits of the thread's next call (nested ones too), in
    /// `culprits_of_call`'s order; a non-nested call also joins the
    /// thread's split, after the waits that went back on CPU by its start.
    pub(crate) fn call(&mut self, c: &CallEvent) -> rusqlite::Result<Vec<Culprit>> {
        let (start, end) = (c.ts_ns, c.end_ns());
        // Waits back on CPU by the start overlap no call from here on (calls
        // come in start order): into the split, before this call. A nested
        // call may pass them too: every call starting before them is in.
        while let Some(w) = self.ahead.pop_front() {
            if w.on_ns > start {
                self.ahead.push_front(w);
                break;
            }
            self.pass(&w);
        }
        // Up to a wait back on CPU after the start that woke at or after the
        // end: a thread is off CPU once at a time, so the waits after it
        // start after it, past this call.
        while !self.done
            && !self
                .ahead
                .back()
                .is_some_and(|w| w.on_ns > start && w.wake_ns >= end)
        {
            match self.waits.next_wait()? {
                // Sorted by `on_ns`: `ahead` is empty then.
                Some(w) if w.on_ns <= start && self.ahead.is_empty() => self.pass(&w),
                Some(w) => self.ahead.push_back(w),
                None => self.done = true,
            }
        }
        // What `culprits::call_culprits` reads: waits with runnable time and culprits.
        let refs: Vec<&WaitEvent> = self
            .ahead
            .iter()
            .filter(|w| w.on_ns > w.wake_ns && !w.culprits.is_empty())
            .collect();
        let culprits = culprits_of_call(c, &refs, self.tracer);
        if c.nested {
            self.nested(c.op, 1);
        } else {
            if let Some(t) = &mut self.split {
                t.add_call(c);
            }
            if let Some(o) = self.op_splits.iter_mut().find(|o| o.op == c.op) {
                o.stream.add_call(c);
            }
        }
        Ok(culprits)
    }

    /// `n` nested calls of `op` the caller does not feed through
    /// [`Self::call`] (their culprits unwanted): the thread's split and the
    /// op's count them, for their probes' traps, as a scope's read counts
    /// the nested calls it reads.
    pub(crate) fn nested(&mut self, op: u16, n: u64) {
        if let Some(t) = &mut self.split {
            t.add_nested(n);
        }
        if let Some(o) = self.op_splits.iter_mut().find(|o| o.op == op) {
            o.stream.add_nested(n);
        }
    }

    /// A wait no later call overlaps: the splits' (dropped without one).
    fn pass(&mut self, w: &WaitEvent) {
        if let Some(t) = &mut self.split {
            t.add_wait(w);
        }
        for o in &mut self.op_splits {
            o.add_wait(w);
        }
    }

    /// [`ThreadPass::finish`] without an end, with the op splits
    /// (`with_op_splits`) by op id.
    pub(crate) fn finish_with_ops(
        mut self,
        comm: &str,
    ) -> rusqlite::Result<(Option<ThreadSplit>, OpSplits)> {
        // The whole thread's waits, each into every split (none read
        // without a split to add them to: a thread with nested calls only).
        if self.split.is_some() || !self.op_splits.is_empty() {
            while let Some(w) = self.ahead.pop_front() {
                self.pass(&w);
            }
            while let Some(w) = self.waits.next_wait()? {
                self.pass(&w);
            }
        }
        let ops = std::mem::take(&mut self.op_splits)
            .into_iter()
            .map(|o| (o.op, o.stream.finish(comm)))
            .collect();
        Ok((self.split.take().map(|t| t.finish(comm)), ops))
    }

    /// The thread's split once its calls are all fed (None without one):
    /// the waits left are added. With `end`, the window's end where the
    /// split was made without it (`ThreadStream::close_window`), up to the
    /// first wait that went back on CPU at or after it: a thread is off CPU
    /// once at a time, so the later ones start after it, and add nothing
    /// (`ThreadStream` clamps waits to the window): the rest of a long
    /// trace is not read.
    pub(crate) fn finish(
        mut self,
        comm: &str,
        end: Option<u64>,
    ) -> rusqlite::Result<Option<ThreadSplit>> {
        let Some(mut t) = self.split.take() else {
            return Ok(None);
        };
        if let Some(end) = end {
            t.close_window(end);
        }
        let past = |w: &WaitEvent| end.is_some_and(|e| w.on_ns >= e);
        while let Some(w) = self.ahead.pop_front() {
            t.add_wait(&w);
            if past(&w) {
                return Ok(Some(t.finish(comm)));
            }
        }
        while let Some(w) = self.waits.next_wait()? {
            t.add_wait(&w);
            if past(&w) {
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
