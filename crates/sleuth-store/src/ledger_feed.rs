//! A file's memory calls read ahead on another thread (issue 16).
//!
//! `explain --last` over a run's files replays the memory calls of each
//! whole file of the window into the window's ledger, file after file (as
//! do `explain --db DIR` of a run replayed file by file and `memory --at`
//! of a run whose files stored no state to start from): 89%
//! of its time, of which the ledger's own work is 3% and SQLite's steps
//! and the rows' decoding the rest (docs/benchmarks.md). The files are
//! replayed in order, but reading one needs nothing from the others: while
//! one file is answered, the next one's memory calls are read on a second
//! thread, in the order its replay applies them, into a bounded channel
//! ([`AHEAD_CALLS`] calls). The replay then applies them
//! (`MemoryTrace::replay_ledger_fed`), or replays the file itself should
//! the read ahead fail.

use crate::checked::CheckMemo;
use crate::run::open_in_run;
use crate::stream::{memory_calls_of, Rows, StreamOrder};
use crate::types::StoredCall;
use crate::{ReadBudget, StoreError};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::Scope;

/// Calls per message.
const CHUNK: usize = 8192;

/// Calls read ahead at most (with the file being drained, 64–72 MB more at
/// `explain --last`'s peak, docs/benchmarks.md): a file of up to this many
/// memory calls is read whole while the one before it is answered.
pub(crate) const AHEAD_CALLS: usize = 256 * 1024;

/// One message of a read ahead.
pub(crate) enum LedgerFeed {
    /// The next calls, in the order the ledger applies them.
    Calls(Vec<StoredCall>),
    /// The file's order forced SQLite's sorted read: the calls sent before
    /// are void, the stream starts again.
    Restart,
    /// Every call was sent.
    Done,
}

pub(crate) type Fed = Result<LedgerFeed, StoreError>;

/// Files of a run replayed in order, each next one read ahead: the one
/// reader both `--last` (`run_window`) and a run replayed file by file
/// (`run_explain`, through [`visit_read_ahead`]) use. Dropping it stops
/// the read ahead not taken.
pub(crate) struct ReadAhead<'scope, 'env> {
    scope: &'scope Scope<'scope, 'env>,
    pid: Option<u32>,
    /// Only the calls that returned by then (`memory --at`); None: all.
    until: Option<u64>,
    budget: ReadBudget,
    memo: CheckMemo,
    ahead: Option<(PathBuf, Receiver<Fed>)>,
}

impl<'scope, 'env> ReadAhead<'scope, 'env> {
    pub(crate) fn new(
        scope: &'scope Scope<'scope, 'env>,
        pid: Option<u32>,
        budget: &ReadBudget,
        memo: &CheckMemo,
    ) -> Self {
        ReadAhead {
            scope,
            pid,
            until: None,
            budget: budget.clone(),
            memo: memo.clone(),
            ahead: None,
        }
    }

    /// Reads only the calls that returned by `at_ns` (a ledger at a moment).
    pub(crate) fn until(mut self, at_ns: Option<u64>) -> Self {
        self.until = at_ns;
        self
    }

    /// The calls read ahead for `path`, the file about to be replayed
    /// (None if it was not the one read ahead: a file skipped between),
    /// and the read ahead of `next` started.
    pub(crate) fn take(&mut self, path: &Path, next: Option<&Path>) -> Option<Receiver<Fed>> {
        let feed = match self.ahead.take() {
            Some((p, rx)) if p == path => Some(rx),
            _ => None,
        };
        if let Some(next) = next {
            let rx = read_ahead(
                self.scope,
                next.to_path_buf(),
                (self.pid, self.until),
                self.budget.clone(),
                self.memo.clone(),
            );
            self.ahead = Some((next.to_path_buf(), rx));
        }
        feed
    }
}

/// Visits the run files `paths` in order, each with the calls read ahead
/// for it (of process `pid`, returned by `until` when given): while
/// `visit` replays one, the next is read on a second thread.
pub(crate) fn visit_read_ahead(
    paths: &[PathBuf],
    (pid, until): (Option<u32>, Option<u64>),
    budget: &ReadBudget,
    memo: &CheckMemo,
    mut visit: impl FnMut(&Path, Option<Receiver<Fed>>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    std::thread::scope(|threads| {
        let mut ahead = ReadAhead::new(threads, pid, budget, memo).until(until);
        for (i, path) in paths.iter().enumerate() {
            let feed = ahead.take(path, paths.get(i + 1).map(PathBuf::as_path));
            visit(path, feed)?;
        }
        Ok(())
    })
}

/// Applies the calls of a read ahead to `state` with `each`, in the order
/// sent: how many when the feed said it sent every one; None, `state` as
/// it was before, when it failed or ended without saying so (the caller
/// then replays the file itself). A restart voids the calls before it.
pub(crate) fn apply<S: Clone>(
    state: &mut S,
    feed: impl IntoIterator<Item = Fed>,
    mut each: impl FnMut(&mut S, &StoredCall),
) -> Option<u64> {
    let before = state.clone();
    let mut read = 0u64;
    for m in feed {
        match m {
            Ok(LedgerFeed::Calls(calls)) => {
                read += calls.len() as u64;
                for c in &calls {
                    each(state, c);
                }
            }
            // The file's order forced SQLite's sort: from the start again.
            Ok(LedgerFeed::Restart) => {
                *state = before.clone();
                read = 0;
            }
            Ok(LedgerFeed::Done) => return Some(read),
            Err(_) => break,
        }
    }
    *state = before;
    None
}

/// Starts reading the memory calls of the run file `path` (of process
/// `pid`, returned by `until` when given) on a thread of `scope`; the
/// receiver yields them. Dropping it stops the thread at its next message.
fn read_ahead<'scope>(
    scope: &'scope Scope<'scope, '_>,
    path: PathBuf,
    (pid, until): (Option<u32>, Option<u64>),
    budget: ReadBudget,
    memo: CheckMemo,
) -> Receiver<Fed> {
    let (tx, rx) = sync_channel(AHEAD_CALLS / CHUNK);
    let started = std::thread::Builder::new()
        .name("gpusleuth-ahead".into())
        .spawn_scoped(scope, move || {
            let r = open_in_run(&path, &budget, &memo).and_then(|trace| {
                send_calls(&Rows::open_with(&trace, budget)?, &path, (pid, until), &tx)
            });
            let _ = tx.send(r.map(|()| LedgerFeed::Done));
        });
    // No thread: the receiver ends at once, and the file is replayed where
    // it is answered.
    drop(started);
    rx
}

/// Sends the memory calls `rows` hold as `MemoryTrace::replay_ledger`
/// (`replay_ledger_and_sites` with a moment) applies them
/// (`Rows::replay_by_return` of the same query); Ok when the receiver went
/// away.
fn send_calls(
    rows: &Rows,
    path: &std::path::Path,
    (pid, until): (Option<u32>, Option<u64>),
    tx: &SyncSender<Fed>,
) -> Result<(), StoreError> {
    let q = memory_calls_of(pid, StreamOrder::ByReturn, until);
    let gone = Cell::new(false);
    let first = Cell::new(true);
    let send = |m: LedgerFeed| {
        if tx.send(Ok(m)).is_err() {
            gone.set(true);
        }
        !gone.get()
    };
    let rest = rows.replay_by_return::<_, StoreError>(
        &q,
        || {
            if !first.replace(false) {
                send(LedgerFeed::Restart);
            }
            Vec::with_capacity(CHUNK)
        },
        |buf, c| {
            buf.push(c);
            if buf.len() == CHUNK {
                let full = std::mem::replace(buf, Vec::with_capacity(CHUNK));
                if !send(LedgerFeed::Calls(full)) {
                    return Err(StoreError::file(path, "nobody reads the calls read ahead"));
                }
            }
            Ok(())
        },
    );
    match rest {
        Ok(rest) if !rest.is_empty() => {
            send(LedgerFeed::Calls(rest));
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(_) if gone.get() => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::Trace;
    use crate::stream::MemoryTrace;
    use sleuth_core::ledger::LedgerBuilder;
    use sleuth_core::{op_by_name, CallEvent, Event};
    use std::path::Path;

    fn call(op: &str, ts: u64, dur: u64, size: Option<u64>, ptr: u64) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: dur,
            pid: 7,
            tid: 7,
            op: op_by_name(op).unwrap().id,
            size,
            ptr: Some(ptr),
            ..Default::default()
        }
    }

    /// 60,000 allocations and frees in start order, then (`disordered`) an
    /// allocation stored last that returned before all of them: further
    /// back than the return-order buffer holds, so the replay restarts on
    /// SQLite's sorted read, after some calls were sent.
    fn written(path: &Path, disordered: bool) {
        let w =
            crate::TraceWriter::create(path, crate::SessionInfo::for_tests(), Default::default())
                .unwrap();
        let h = w.handle();
        for i in 0..60_000u64 {
            let ptr = 0x10_0000 + (i % 5000) * 0x100;
            let (op, size) = match i % 2 {
                0 => ("cudaMalloc", Some(256)),
                _ => ("cudaFree", None),
            };
            h.send(Event::Call(call(op, 10_000 + i * 10, 5, size, ptr)))
                .unwrap();
        }
        if disordered {
            h.send(Event::Call(call("cudaMalloc", 9_000, 5, Some(64), 0x9999)))
                .unwrap();
        }
        drop(h);
        w.finish().unwrap();
    }

    fn budget() -> ReadBudget {
        ReadBudget::new(std::time::Duration::from_secs(60))
    }

    fn fed(path: &Path) -> Vec<Fed> {
        fed_until(path, None)
    }

    fn fed_until(path: &Path, until: Option<u64>) -> Vec<Fed> {
        std::thread::scope(|s| {
            read_ahead(
                s,
                path.to_path_buf(),
                (None, until),
                budget(),
                CheckMemo::new(),
            )
            .iter()
            .collect()
        })
    }

    /// A file's ledger and per-site tallies at `at` replayed here, from a
    /// state earlier files left (`memory --at` of a run).
    fn replayed_at(
        path: &Path,
        at: u64,
        feed: Option<Vec<Fed>>,
    ) -> (
        Vec<sleuth_core::ledger::ProcessLedger>,
        Vec<crate::stream::TallyEntry>,
    ) {
        let trace = Trace::open(path).unwrap();
        let view = MemoryTrace::open(&trace, None, budget()).unwrap();
        let mut b = LedgerBuilder::new(Some(at)).with_peak_sites();
        let mut tally = crate::stream::SiteTally::default();
        // At a site of its own: the file's calls start their own tally.
        let mut early = call("cudaMalloc", 1, 1, Some(1 << 20), 0x1);
        early.stack_id = Some(7);
        b.push(&early);
        tally.add(&early, 0);
        view.replay_ledger_and_sites_fed(&mut b, &mut tally, Some(at), feed)
            .unwrap();
        (b.finish_bare(), tally.entries())
    }

    /// Read ahead up to a moment, a file's memory calls give the ledger and
    /// the site tallies its own replay to that moment gives, the allocation
    /// stored out of order included.
    #[test]
    fn calls_read_ahead_to_a_moment_give_the_files_own_replay_then() {
        let dir = std::env::temp_dir().join(format!("gs-feed-at-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Half the calls returned by then.
        let at = 10_000 + 30_000 * 10;
        for disordered in [false, true] {
            let path = dir.join(format!("t{disordered}.db"));
            written(&path, disordered);
            let messages = fed_until(&path, Some(at));
            let sent: usize = messages
                .iter()
                .map(|m| match m {
                    Ok(LedgerFeed::Calls(c)) => c.len(),
                    _ => 0,
                })
                .sum();
            let want = replayed_at(&path, at, None);
            assert_eq!(want.0[0].allocs, 15_000 + u64::from(disordered) + 1);
            // Only the calls that returned by the moment were read ahead
            // (the stored-order read sent every one of them once).
            if !disordered {
                assert_eq!(sent, 30_000);
            }
            assert_eq!(
                replayed_at(&path, at, Some(messages)),
                want,
                "disordered {disordered}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The ledger of a file replayed here, from a state earlier files left.
    fn replayed(path: &Path, feed: Option<Vec<Fed>>) -> Vec<sleuth_core::ledger::ProcessLedger> {
        let trace = Trace::open(path).unwrap();
        let view = MemoryTrace::open(&trace, None, budget()).unwrap();
        let mut b = LedgerBuilder::new(None);
        b.push(&call("cudaMalloc", 1, 1, Some(1 << 20), 0x1));
        match feed {
            Some(f) => view.replay_ledger_fed(&mut b, Some(f)).unwrap(),
            None => view.replay_ledger(&mut b).unwrap(),
        };
        b.finish_bare()
    }

    /// Read ahead on another thread, a file's memory calls give the ledger
    /// its own replay gives, whether they came in stored order or the
    /// file's order forced the sorted read (a restart on the way).
    #[test]
    fn calls_read_ahead_give_the_files_own_replay() {
        let dir = std::env::temp_dir().join(format!("gs-feed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for disordered in [false, true] {
            let path = dir.join(format!("t{disordered}.db"));
            written(&path, disordered);
            let messages = fed(&path);
            let restarts = messages
                .iter()
                .filter(|m| matches!(m, Ok(LedgerFeed::Restart)))
                .count();
            assert_eq!(restarts, usize::from(disordered), "disordered {disordered}");
            // Calls were sent before the restart (they must be dropped).
            assert!(matches!(messages[0], Ok(LedgerFeed::Calls(_))));
            assert!(matches!(messages.last(), Some(Ok(LedgerFeed::Done))));
            let want = replayed(&path, None);
            assert_eq!(want[0].allocs, 30_000 + u64::from(disordered) + 1);
            assert_eq!(
                replayed(&path, Some(messages)),
                want,
                "disordered {disordered}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A read ahead that failed or stopped short (no `Done`) is replaced by
    /// the file's own replay from the state before it.
    #[test]
    fn a_failed_or_short_read_ahead_falls_back_to_the_files_replay() {
        let dir = std::env::temp_dir().join(format!("gs-feed-short-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.db");
        written(&path, false);
        let want = replayed(&path, None);
        let first = || {
            let mut m = fed(&path);
            m.truncate(1);
            assert!(matches!(m[0], Ok(LedgerFeed::Calls(_))));
            m
        };
        let mut failed = first();
        failed.push(Err(StoreError::file(&path, "read ahead failed")));
        assert_eq!(replayed(&path, Some(failed)), want);
        assert_eq!(replayed(&path, Some(first())), want, "no Done");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
