//! The calls of a scope (`scoped`) into the explanation's accumulators:
//! each thread's non-nested calls in start order against the thread's
//! waits (`thread_pass`), every call in scope into the ledger's list of
//! processes, the extent and (with a window) the memory calls kept for the
//! replay in return order.
//!
//! Two ways to read the calls: thread by thread, each through the
//! `(tid, ts_ns)` index ([`per_thread`]: a window's calls are a range of
//! it), or an op's calls of every thread in one read ([`one_read`]). The
//! index holds neither the op nor the row, so a thread's read fetches every
//! row of the thread to find its calls of the op: on a 10M-call trace,
//! 10M row fetches for 1.9M copies, against one pass over the table.

use crate::packed_calls::PackedCalls;
use crate::report_reads::WindowTally;
use crate::rows::{call_from_row, OpColumn};
use crate::thread_pass::{sort_culprits, ThreadPass};
use crate::types::StoredCall;
use rusqlite::types::Value;
use rusqlite::{CachedStatement, Connection};
use sleuth_core::findings::inputs::FindingInputs;
use sleuth_core::ledger::LedgerBuilder;
use sleuth_core::threads::{ThreadSplit, ThreadStream};
use sleuth_core::Culprit;
use sleuth_core::{OpSet, TraceData};
use std::collections::{BTreeMap, BTreeSet};

/// Threads read at once by [`one_read`] at most (each holds a statement and
/// its pass); a scope of more threads is read thread by thread.
pub(crate) const ONE_READ_MAX_THREADS: usize = 64;

/// A window's memory and pinning calls kept by the pass at most, packed
/// (`packed_calls`: about 60 bytes a call with its sort key, ~30 MB here;
/// as `CallEvent`s 200,000 of them took as much). Past it they are read
/// again in return order after the pass (1.1 s for the 250,000 memory
/// calls of ten seconds of the bench's 10M-call trace).
pub(crate) const KEPT_MAX: usize = 500_000;

/// What the calls in scope feed.
pub(crate) struct Feed<'o> {
    pub(crate) inputs: FindingInputs,
    pub(crate) ledger: LedgerBuilder,
    /// With a window: its calls of the `keep` ops, for the replay in
    /// return order, up to [`KEPT_MAX`]; past it None (the replay reads
    /// them again, sorted by SQLite: memory stays bounded).
    pub(crate) kept: Option<PackedCalls>,
    pub(crate) kept_max: usize,
    pub(crate) keep: &'o OpSet,
    /// With a report's window: every call in scope tallied as the report
    /// reads them (`report_reads::window_calls`), from this pass.
    pub(crate) tally: Option<WindowTally>,
    /// Copies that join the pinned replay as they are read (`scoped`).
    pub(crate) copies: &'o OpSet,
    /// The first start and last end of the calls in scope.
    pub(crate) extent: Option<(u64, u64)>,
    pub(crate) splits: Vec<ThreadSplit>,
}

impl Feed<'_> {
    /// Adds the feed of another reader's threads of the same scope
    /// (`per_thread_side_by_side`): the kept calls join while both kept
    /// theirs and `kept_max` holds them all (else none: the replay reads
    /// them again).
    pub(crate) fn absorb(&mut self, theirs: Feed, kept_max: usize) -> rusqlite::Result<()> {
        self.inputs
            .add_other_threads(theirs.inputs)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        for pid in theirs.ledger.tracked() {
            self.ledger.track(pid);
        }
        self.kept = match (self.kept.take(), theirs.kept) {
            (Some(mut a), Some(b)) if a.len() + b.len() <= kept_max => a.append(b).then_some(a),
            _ => None,
        };
        if let Some(span) = theirs.extent {
            widen(&mut self.extent, span);
        }
        self.splits.extend(theirs.splits);
        if let (Some(t), Some(other)) = (&mut self.tally, theirs.tally) {
            t.absorb(other);
        }
        Ok(())
    }
}

/// What a pass over the calls in scope ([`per_thread`], [`one_read`])
/// hands them to.
pub(crate) trait CallSink {
    /// Any call in scope, nested too, as it is read.
    fn note(&mut self, s: &StoredCall);
    /// A non-nested call of a thread, after those before it, with its
    /// culprits from the thread's pass (sorted as `call_culprits` sorts them).
    fn add(&mut self, s: &StoredCall, culprits: Vec<Culprit>);
    /// A thread's whole split, once its calls in scope are read.
    fn split(&mut self, split: ThreadSplit);
}

impl CallSink for Feed<'_> {
    fn note(&mut self, s: &StoredCall) {
        let c = &s.call;
        self.ledger.track(c.pid);
        if let Some(t) = &mut self.tally {
            t.add(s.id, c);
        }
        if let Some(kept) = &mut self.kept {
            if self.keep.contains(c.op) && (kept.len() >= self.kept_max || !kept.push(s.id, c)) {
                self.kept = None;
            }
        }
        widen(&mut self.extent, (c.ts_ns, c.end_ns()));
    }

    fn add(&mut self, s: &StoredCall, culprits: Vec<Culprit>) {
        let index = crate::finding_rollups::row_index(s.id);
        self.inputs.add_call(index, &s.call, &culprits);
        if self.copies.contains(s.call.op) {
            self.inputs.add_in_end_order(index, &s.call);
        }
    }

    fn split(&mut self, split: ThreadSplit) {
        self.splits.push(split);
    }
}

/// A thread's waits that went back on CPU after its window's start (`?1`
/// pid, `?2` tid, `?3` the first start of its non-nested calls in scope):
/// the statement a pass ([`Threads::waits_sql`]) reads them with.
pub(crate) fn thread_waits_after_sql(conn: &Connection) -> rusqlite::Result<String> {
    let valid = crate::problems::valid_wait("w.");
    crate::wait_stream::thread_waits_sql(conn, &format!("{valid} AND w.on_ns > ?3"))
}

/// Where the threads' waits are read from: the threads of the scope, the
/// waits' statement (`?1` pid, `?2` tid, `?3` the window's start), the
/// trace's tracer and process names.
pub(crate) struct Threads<'q> {
    pub(crate) conn: &'q Connection,
    pub(crate) threads: &'q BTreeSet<(u32, u32)>,
    pub(crate) waits_sql: &'q str,
    pub(crate) tracer: Option<u32>,
    pub(crate) data: &'q TraceData,
}

/// A thread whose pass began at its first non-nested call in scope: that
/// call's start is the window's start, where its waits are read from; the
/// window's end, the last end of its non-nested calls in scope, is known
/// once they are read, and the split is told it then.
struct OpenThread<'s> {
    pass: ThreadPass<'s>,
    window_end: u64,
    /// The last call fed, (start, row id): the pass needs them in order.
    last: (u64, i64),
}

impl<'s> OpenThread<'s> {
    fn start(
        waits: &'s mut CachedStatement,
        first: &StoredCall,
        tracer: Option<u32>,
    ) -> rusqlite::Result<OpenThread<'s>> {
        let c = &first.call;
        let start = c.ts_ns;
        let rows = waits.query(rusqlite::params![
            c.pid,
            c.tid,
            i64::try_from(start).unwrap_or(i64::MAX)
        ])?;
        Ok(OpenThread {
            pass: ThreadPass::new(
                rows,
                Some(ThreadStream::new(c.pid, c.tid, (start, u64::MAX), tracer)),
                tracer,
            ),
            window_end: start,
            last: (0, i64::MIN),
        })
    }

    /// The thread's next non-nested call: its culprits, sorted.
    fn feed(&mut self, s: &StoredCall) -> rusqlite::Result<Vec<Culprit>> {
        self.window_end = self.window_end.max(s.call.end_ns());
        self.last = (s.call.ts_ns, s.id);
        let mut culprits = self.pass.call(&s.call)?;
        sort_culprits(&mut culprits);
        Ok(culprits)
    }

    fn finish(self, comm: &str) -> rusqlite::Result<Option<ThreadSplit>> {
        self.pass.finish(comm, Some(self.window_end))
    }
}

/// A thread's calls in scope as [`per_thread`] reads them: `sql` with `?1`
/// pid, `?2` tid, then `args`, in `(ts_ns, id)` order, its rows' op as
/// `ops` names it.
#[derive(Clone, Copy)]
pub(crate) struct ThreadCalls<'q> {
    pub(crate) sql: &'q str,
    pub(crate) args: &'q [Value],
    pub(crate) ops: OpColumn<'q>,
    /// `sql` reads the calls' `stack_id` as column 16: the ledger's
    /// allocations keep their sites (a window's memory findings named none
    /// before round 51).
    pub(crate) stacks: bool,
}

/// Each thread's calls in scope through its own read (`calls`).
pub(crate) fn per_thread(
    feed: &mut impl CallSink,
    th: &Threads,
    calls: ThreadCalls,
) -> rusqlite::Result<()> {
    for &(p, t) in th.threads {
        let mut cst = th.conn.prepare_cached(calls.sql)?;
        let mut statement = th.conn.prepare_cached(th.waits_sql)?;
        // Borrowed by the thread's pass once its first non-nested call is read.
        let mut waits = Some(&mut statement);
        let mut params = vec![Value::Integer(p.into()), Value::Integer(t.into())];
        params.extend(calls.args.iter().cloned());
        let mut rows = cst.query(rusqlite::params_from_iter(params))?;
        let mut open: Option<OpenThread> = None;
        // By op: a scope of a nested op alone never opens its thread.
        let mut early_nested: BTreeMap<u16, u64> = BTreeMap::new();
        while let Some(row) = rows.next()? {
            let Some(mut s) = calls.ops.call(row)? else {
                continue;
            };
            if calls.stacks {
                s.call.stack_id = row.get::<_, Option<i64>>(16)?.map(|v| v as u64);
            }
            feed.note(&s);
            if s.call.nested {
                // Counted for its traps (its time is its caller's), also
                // before the thread's first call in scope, as the writer's
                // pass counts every one of the thread's.
                match &mut open {
                    Some(o) => o.pass.nested(s.call.op, 1),
                    None => *early_nested.entry(s.call.op).or_default() += 1,
                }
                continue;
            }
            // Without a non-nested call in scope the thread feeds only the
            // ledger's list of processes: no wait is read.
            let thread = match (&mut open, waits.take()) {
                (Some(o), _) => o,
                (None, Some(st)) => {
                    let o = open.insert(OpenThread::start(st, &s, th.tracer)?);
                    for (op, n) in std::mem::take(&mut early_nested) {
                        o.pass.nested(op, n);
                    }
                    o
                }
                (None, None) => continue, // unreachable: the pass opens once
            };
            let culprits = thread.feed(&s)?;
            feed.add(&s, culprits);
        }
        drop(rows);
        if let Some(o) = open {
            if let Some(split) = o.finish(th.data.comm_of(p))? {
                feed.split(split);
            }
        }
    }
    Ok(())
}

/// [`per_thread`] with the threads shared out between `th.conn` and the
/// connections of `others`, each share read on its own CPU into its own
/// feed, the side feeds then added to `feed` (`absorb`) in their order.
/// Threads go to the lightest share by weight (heaviest first), so a
/// window of several busy threads (PyTorch's main and autograd threads, a
/// process per GPU) reads in about the time of its busiest share; a scope
/// of one busy thread gains nothing. What a thread's pass does depends on its
/// own calls and waits only, so the feeds hold what one pass would, as
/// long as `absorb` adds them as one trace's (`add_other_threads`).
pub(crate) fn per_thread_side_by_side<F: CallSink + Send>(
    feed: &mut F,
    th: &Threads,
    others: SideReaders<F>,
    calls: ThreadCalls,
    mut absorb: impl FnMut(&mut F, F) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    let SideReaders {
        side,
        weight,
        side_feed,
    } = others;
    let shares = share_out(th.threads, side.len() + 1, weight);
    let (mine, theirs) = shares.split_first().expect("one share at least");
    let (waits_sql, tracer, data) = (th.waits_sql, th.tracer, th.data);
    let fed = std::thread::scope(|scope| {
        let readers: Vec<_> = side
            .into_iter()
            .zip(theirs)
            .map(|(conn, threads)| {
                scope.spawn(move || {
                    let th = Threads {
                        conn: &conn,
                        threads,
                        waits_sql,
                        tracer,
                        data,
                    };
                    let mut f = side_feed();
                    per_thread(&mut f, &th, calls).map(|()| f)
                })
            })
            .collect();
        let own = Threads {
            threads: mine,
            ..*th
        };
        let result = per_thread(feed, &own, calls);
        let side: Vec<rusqlite::Result<F>> = readers
            .into_iter()
            .map(|r| r.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        result.map(|()| side)
    })?;
    for f in fed {
        absorb(feed, f?)?;
    }
    Ok(())
}

/// The readers [`per_thread_side_by_side`] shares a scope's threads with.
pub(crate) struct SideReaders<'a, F> {
    /// Their connections (the file again, `checked::Helpers`).
    pub(crate) side: Vec<Connection>,
    /// A thread's calls in scope, about.
    pub(crate) weight: &'a dyn Fn(&(u32, u32)) -> u64,
    /// A feed for one of them.
    pub(crate) side_feed: &'a (dyn Fn() -> F + Sync),
}

/// `threads` in `n` shares of about equal weight: each thread, heaviest
/// first (ties in thread order), to the lightest share so far (the first
/// of equals). Empty shares stay (their reader reads nothing).
pub(crate) fn share_out(
    threads: &BTreeSet<(u32, u32)>,
    n: usize,
    weight: &dyn Fn(&(u32, u32)) -> u64,
) -> Vec<BTreeSet<(u32, u32)>> {
    let mut order: Vec<(u64, (u32, u32))> = threads.iter().map(|t| (weight(t), *t)).collect();
    order.sort_by_key(|&(w, t)| (std::cmp::Reverse(w), t));
    let mut shares = vec![(0u64, BTreeSet::new()); n.max(1)];
    for (w, t) in order {
        let lightest = (0..shares.len())
            .min_by_key(|&i| (shares[i].0, i))
            .expect("one share at least");
        shares[lightest].0 = shares[lightest].0.saturating_add(w);
        shares[lightest].1.insert(t);
    }
    shares.into_iter().map(|(_, s)| s).collect()
}

/// The calls in scope of every thread from one read (`calls_sql` with
/// `args`; rows of threads outside the scope's are passed over), the
/// threads' passes side by side. The read may hand out a thread's calls in
/// any order across threads, but each thread's non-nested calls must come
/// in `(ts_ns, id)` order: the row order of a file written by the tracer
/// (a thread's calls that do not nest do not overlap, and are stored as
/// they return). False at the first that does not (a crafted or merged
/// file): what was fed is then to be dropped, and the scope read thread by
/// thread.
pub(crate) fn one_read(
    feed: &mut impl CallSink,
    th: &Threads,
    calls_sql: &str,
    args: &[Value],
) -> rusqlite::Result<bool> {
    // One waits statement per thread, each borrowed by its pass once the
    // thread's first non-nested call is read.
    let mut statements = th
        .threads
        .iter()
        .map(|_| th.conn.prepare_cached(th.waits_sql))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut unopened: BTreeMap<(u32, u32), &mut CachedStatement> = th
        .threads
        .iter()
        .copied()
        .zip(statements.iter_mut())
        .collect();
    let mut open: BTreeMap<(u32, u32), OpenThread> = BTreeMap::new();
    // By thread and op, until the thread's first call in scope.
    let mut early_nested: BTreeMap<((u32, u32), u16), u64> = BTreeMap::new();
    let mut cst = th.conn.prepare_cached(calls_sql)?;
    let mut calls = cst.query(rusqlite::params_from_iter(args))?;
    while let Some(row) = calls.next()? {
        let Some(s) = call_from_row(row)? else {
            continue;
        };
        let key = (s.call.pid, s.call.tid);
        if !th.threads.contains(&key) {
            continue;
        }
        feed.note(&s);
        if s.call.nested {
            // Counted for its traps, as in `per_thread`.
            match open.get_mut(&key) {
                Some(o) => o.pass.nested(s.call.op, 1),
                None => *early_nested.entry((key, s.call.op)).or_default() += 1,
            }
            continue;
        }
        let thread = match open.get_mut(&key) {
            Some(o) if (s.call.ts_ns, s.id) <= o.last => return Ok(false),
            Some(o) => o,
            None => match unopened.remove(&key) {
                Some(st) => {
                    let o = open
                        .entry(key)
                        .or_insert(OpenThread::start(st, &s, th.tracer)?);
                    let early: Vec<_> = early_nested
                        .range((key, 0)..=(key, u16::MAX))
                        .map(|(&(_, op), &n)| (op, n))
                        .collect();
                    for (op, n) in early {
                        early_nested.remove(&(key, op));
                        o.pass.nested(op, n);
                    }
                    o
                }
                None => return Ok(false), // unreachable: a thread opens once
            },
        };
        let culprits = thread.feed(&s)?;
        feed.add(&s, culprits);
    }
    drop(calls);
    for ((p, _), o) in open {
        if let Some(split) = o.finish(th.data.comm_of(p))? {
            feed.split(split);
        }
    }
    Ok(true)
}

/// Widens `span` (first start, last end) to cover `(first, last)`.
pub(crate) fn widen(span: &mut Option<(u64, u64)>, (first, last): (u64, u64)) {
    *span = Some(span.map_or((first, last), |(a, b)| (a.min(first), b.max(last))));
}
