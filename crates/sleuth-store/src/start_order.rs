//! A whole file's calls, or a window's, in start order without SQLite
//! sorting them (issue 16).
//!
//! `export` writes every call in start order (`StreamOrder::ByStart`, the
//! order of `Trace::load`'s calls). No index serves that order, so SQLite
//! sorted every row it read: the larger part of a whole export's reading
//! (docs/benchmarks.md, round 35). The writer stores calls nearly in that
//! order already (a call is stored when it returns, so it is late by the
//! calls that started and returned while it ran), so the rows are read by
//! id (on helper connections side by side where the file allows:
//! `crate::split_read`) and put in start order through the buffer the
//! ledger's return order uses (`crate::return_order`).
//!
//! A stream whose calls are already written out cannot start again, as
//! `Rows::replay_by_return` does when its buffer proves too small, unless
//! its caller can take back what it wrote. So the caller says which
//! (`ByStart`): an output that cannot be taken back (a pipe) has a first
//! pass over the rows' keys alone (id, start, op) run the same buffer,
//! and where it cannot put them in order SQLite sorts as before (both
//! passes read one snapshot of the file); an output that can (the
//! export's private temporary file) reads straight through the buffer,
//! and a call it cannot put in place ends the read with
//! `StoreError::OutOfReach` for the caller to write again with the proof
//! first. The keys pass was a fifth to a quarter of a whole export's time
//! (docs/benchmarks.md, round 45). Either way the calls and their order
//! are exactly `Rows::for_each_call`'s with `StreamOrder::ByStart`.
//!
//! A window (`export --from/--to`) reads the same way where the writer's
//! blocks name the ids that can hold its calls (`call_blocks`): its rows
//! by id, side by side, instead of a seek per row through the `(tid,
//! ts_ns)` index and SQLite's sort of them all (ten seconds of the bench's
//! 10M-call trace as `--format json`: docs/benchmarks.md, round 44).

use crate::error::StoreError;
use crate::return_order::{OrderKey, OutOfOrder, Reorder, REORDER_ROWS};
use crate::stream::{call_statement, CallQuery, Rows, StreamOrder};
use crate::types::StoredCall;

/// How a read in start order may use the reorder buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByStart {
    /// A pass over the rows' keys proves first that the buffer can put
    /// them in order (else SQLite sorts them): for a caller that cannot
    /// take back calls it was handed.
    ProveFirst,
    /// Straight through the buffer: a call it cannot put in place ends the
    /// read with [`StoreError::OutOfReach`], the calls before it already
    /// handed over. For a caller that can take them back and read again
    /// with [`ByStart::ProveFirst`].
    Speculate,
}

/// A call's place in start order: (start, 0, row id).
fn start_key(ts_ns: u64, id: i64) -> OrderKey {
    (ts_ns, 0, id)
}

impl Rows {
    /// [`Rows::for_each_call`] of `q`, without SQLite's sort when `q` is a
    /// stream in start order without a limit (whole, or a window the
    /// writer's blocks can keep to) whose rows the buffer can put in that
    /// order; any other query as it is. The rows are read on helper
    /// connections side by side (`crate::split_read`, where the file
    /// allows) on machines of `side_by_side_from_cpus` or more. Below, the
    /// helpers only compete with the caller's own threads: on the 2-vCPU
    /// development VM a 1M-call Perfetto export, its serializer filling the
    /// second CPU, took 1.31 s and 111 MB with them, 1.24 s and 25 MB
    /// without (round 35); a caller with little work per row leaves the
    /// other CPU idle while one thread reads (every export since round 44
    /// asks from 2; the protobuf export 15.8 -> 11.7 s on that VM's 10M-call
    /// trace, 27 -> 78 MB, round 37).
    ///
    /// `how` says whether the buffer's reach is proved before the first
    /// call is handed over ([`ByStart`]).
    pub fn for_each_call_by_start_from<E: From<StoreError>>(
        &self,
        q: &CallQuery,
        side_by_side_from_cpus: usize,
        how: ByStart,
        mut visit: impl FnMut(StoredCall) -> Result<(), E>,
    ) -> Result<(), E> {
        // A whole stream, or a window of one (its rows by id from the
        // writer's blocks that can hold them: the keys pass says where the
        // blocks cannot).
        let unbounded_by_start = q.order == StreamOrder::ByStart && q.limit.is_none();
        if !unbounded_by_start {
            return self.for_each_call(q, visit);
        }
        let by_id = CallQuery {
            order: StreamOrder::ById,
            ..q.clone()
        };
        // One read transaction for the statement's blocks and the passes
        // (the keys pass with `ByStart::ProveFirst`, the data pass), so
        // that they see one snapshot of the file (one still being written
        // gains rows between two statements otherwise); rolled back when
        // dropped, having written nothing. Inside a caller's transaction,
        // that one serves.
        let conn = self.conn();
        let _snapshot = match conn.is_autocommit() {
            true => Some(
                conn.unchecked_transaction()
                    .map_err(|e| self.read_error(e))?,
            ),
            false => None,
        };
        if !self.keys_in_reach(&by_id, how)? {
            #[cfg(test)]
            test_seams::SORTED.with(|c| c.set(c.get() + 1));
            return self.for_each_call(q, visit);
        }
        #[cfg(test)]
        test_seams::BUFFERED.with(|c| c.set(c.get() + 1));
        let mut buf = Reorder::new(REORDER_ROWS);
        let put_in_order = |c: StoredCall| {
            match buf.push(start_key(c.call.ts_ns, c.id), c) {
                Ok(Some(ready)) => visit(ready),
                Ok(None) => Ok(()),
                Err(OutOfOrder) => Err(match how {
                    ByStart::Speculate => StoreError::OutOfReach {
                        path: self.parts().0.to_path_buf(),
                    },
                    // The keys pass read the same rows of the same snapshot.
                    ByStart::ProveFirst => {
                        StoreError::file(self.parts().0, "its calls changed while they were read")
                    }
                }
                .into()),
            }
        };
        match side_by_side(side_by_side_from_cpus) {
            true => crate::split_read::for_each_call::<E>(self, &by_id, put_in_order)?,
            false => self.for_each_call::<E>(&by_id, put_in_order)?,
        }
        while let Some(ready) = buf.pop() {
            visit(ready)?;
        }
        Ok(())
    }

    /// Whether the rows `by_id` reads, in that order, can be put in start
    /// order by a [`Reorder`] of [`REORDER_ROWS`]: the same buffer run on
    /// their keys alone. The rows are those [`Rows::for_each_call`] visits
    /// (same conditions, rows of ops this build does not know skipped).
    /// With [`ByStart::Speculate`], whether they may be: the keys are left
    /// to the read itself.
    fn keys_in_reach(&self, by_id: &CallQuery, how: ByStart) -> Result<bool, StoreError> {
        let conn = self.checked_for_calls()?;
        let err = |e| self.read_error(e);
        let (_, _, src, _) = self.parts();
        let st = call_statement(conn, src, by_id, false).map_err(err)?;
        // A window read by id through the `(tid, ts_ns)` index (the blocks
        // cannot say) would have SQLite sort each read by id instead of
        // once by start: left to that one sort.
        let windowed = by_id.since_ns.is_some() || by_id.until_ns.is_some();
        if windowed && !st.in_blocks {
            return Ok(false);
        }
        if how == ByStart::Speculate {
            return Ok(true);
        }
        #[cfg(test)]
        test_seams::KEYS_PASSES.with(|c| c.set(c.get() + 1));
        let mut stmt = conn.prepare(&st.keys_sql).map_err(err)?;
        let mut rows = stmt
            .query(rusqlite::params_from_iter(st.args().iter()))
            .map_err(err)?;
        let mut buf = Reorder::<()>::new(REORDER_ROWS);
        while let Some(row) = rows.next().map_err(err)? {
            let op = row.get_ref(2).map_err(err)?;
            let known = match &st.op_ids {
                // The op's id: a row the data pass skips is skipped here.
                Some(ids) => ids.get(op).is_some(),
                None => op.as_str().ok().and_then(sleuth_core::op_by_name).is_some(),
            };
            if !known {
                continue;
            }
            let id: i64 = row.get(0).map_err(err)?;
            let ts_ns = row.get::<_, i64>(1).map_err(err)? as u64;
            if buf.push(start_key(ts_ns, id), ()).is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

fn side_by_side(from_cpus: usize) -> bool {
    #[cfg(test)]
    if let Some(on) = test_seams::SIDE_BY_SIDE.with(|c| c.get()) {
        return on;
    }
    std::thread::available_parallelism().is_ok_and(|n| n.get() >= from_cpus)
}

#[cfg(test)]
pub(crate) mod test_seams {
    use std::cell::Cell;
    thread_local! {
        /// Whole streams read by id and put in order here (this thread).
        pub(crate) static BUFFERED: Cell<usize> = const { Cell::new(0) };
        /// Passes over the keys alone (proofs of the buffer's reach).
        pub(crate) static KEYS_PASSES: Cell<usize> = const { Cell::new(0) };
        /// Whole streams the keys pass handed to SQLite's sort.
        pub(crate) static SORTED: Cell<usize> = const { Cell::new(0) };
        /// Whether reads from this thread are split over helpers, when set.
        pub(crate) static SIDE_BY_SIDE: Cell<Option<bool>> = const { Cell::new(None) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Trace;
    use sleuth_core::{op_by_name, CallEvent, Event};

    fn call(op: &str, pid: u32, tid: u32, ts_ns: u64, dur_ns: u64) -> CallEvent {
        CallEvent {
            ts_ns,
            dur_ns,
            pid,
            tid,
            op: op_by_name(op).expect("op").id,
            ..Default::default()
        }
    }

    /// A trace of `calls` stored in the order given, in a folder of its
    /// own removed when the test ends.
    fn written(tag: &str, calls: Vec<CallEvent>) -> Written {
        let dir = std::env::temp_dir().join(format!("gs-start-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("t.db");
        crate::test_files::written_with(&path, calls.into_iter().map(Event::Call));
        Written(path)
    }

    struct Written(std::path::PathBuf);

    impl std::ops::Deref for Written {
        type Target = std::path::Path;
        fn deref(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl AsRef<std::path::Path> for Written {
        fn as_ref(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for Written {
        fn drop(&mut self) {
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    /// Calls stored as a tracer stores them, when they return: three
    /// threads of two processes, start times shared across threads, and
    /// every 50th call long (it returns 400 calls later).
    fn captured(n: u64) -> Vec<CallEvent> {
        let mut calls: Vec<CallEvent> = (0..n)
            .map(|i| {
                let (pid, tid) = [(7, 7), (7, 8), (9, 9)][(i % 3) as usize];
                let dur = if i % 50 == 0 { 4_000 } else { 3 + i % 5 };
                let op = ["cudaLaunchKernel", "cudaMalloc", "cuLaunchKernel"][(i % 4 % 3) as usize];
                call(op, pid, tid, 1_000 + i / 2 * 10, dur)
            })
            .collect();
        calls.sort_by_key(|c| c.ts_ns + c.dur_ns);
        calls
    }

    /// (id, call) of every call `q` selects: read by start through the
    /// buffer, and as SQLite sorts them.
    /// Also read with the rows split over helper connections: the same
    /// calls; whether that read was split.
    fn both_ways(path: &std::path::Path, q: &CallQuery) -> ([Vec<(i64, CallEvent)>; 2], bool) {
        let trace = Trace::open(path).expect("open");
        let rows = Rows::open(&trace).expect("rows");
        // Read on this thread alone, whatever the machine's CPUs.
        test_seams::SIDE_BY_SIDE.with(|c| c.set(Some(false)));
        let mut by_start = Vec::new();
        rows.for_each_call_by_start_from::<StoreError>(q, 2, ByStart::ProveFirst, |c| {
            by_start.push((c.id, c.call));
            Ok(())
        })
        .expect("by start");
        // The same read split over helper connections (chunks of 256 ids
        // here, so that a few thousand calls make several).
        let split = crate::split_read::test_seams::SPLIT.with(|c| c.get());
        test_seams::SIDE_BY_SIDE.with(|c| c.set(Some(true)));
        crate::split_read::test_seams::CHUNK_IDS.with(|c| c.set(Some(256)));
        crate::check_plan::test_seams::WORKERS.with(|c| c.set(Some(3)));
        let mut side_by_side = Vec::new();
        rows.for_each_call_by_start_from::<StoreError>(q, 2, ByStart::ProveFirst, |c| {
            side_by_side.push((c.id, c.call));
            Ok(())
        })
        .expect("side by side");
        test_seams::SIDE_BY_SIDE.with(|c| c.set(None));
        crate::split_read::test_seams::CHUNK_IDS.with(|c| c.set(None));
        crate::check_plan::test_seams::WORKERS.with(|c| c.set(None));
        assert_eq!(by_start, side_by_side, "{q:?}: split over helpers");
        let was_split = crate::split_read::test_seams::SPLIT.with(|c| c.get()) > split;
        let mut sorted = Vec::new();
        rows.for_each_call::<StoreError>(q, |c| {
            sorted.push((c.id, c.call));
            Ok(())
        })
        .expect("sorted");
        ([by_start, sorted], was_split)
    }

    /// (id, call) of every call `q` selects, read straight through the
    /// buffer (`ByStart::Speculate`) on this thread, or why not; and
    /// whether that read ran a pass over the keys.
    fn speculated(
        path: &std::path::Path,
        q: &CallQuery,
    ) -> (Result<Vec<(i64, CallEvent)>, StoreError>, bool) {
        let trace = Trace::open(path).expect("open");
        let rows = Rows::open(&trace).expect("rows");
        test_seams::SIDE_BY_SIDE.with(|c| c.set(Some(false)));
        let keys = test_seams::KEYS_PASSES.with(|c| c.get());
        let mut got = Vec::new();
        let read = rows.for_each_call_by_start_from::<StoreError>(q, 2, ByStart::Speculate, |c| {
            got.push((c.id, c.call));
            Ok(())
        });
        test_seams::SIDE_BY_SIDE.with(|c| c.set(None));
        let proved = test_seams::KEYS_PASSES.with(|c| c.get()) > keys;
        (read.map(|()| got), proved)
    }

    /// The calls of [`captured`] in a file whose `ops` has an op this build
    /// does not know, ids it lacks (one not even an integer) and two names
    /// swapped.
    fn with_odd_ops(tag: &str) -> Written {
        let path = written(tag, captured(6_000));
        // Rows of an op this build does not know are skipped either way, and
        // so are rows whose op id `ops` does not hold (the view's join has
        // none for them; the reads take the ids without it); ops named as
        // the file's `ops` names them, here two names swapped.
        let conn = rusqlite::Connection::open(&path).expect("db");
        conn.execute_batch(
            "INSERT INTO ops(id, layer, op) VALUES (999, 'runtime', 'cudaNotAnOp');
             UPDATE call_rows SET op_id = 999 WHERE id % 97 = 0;
             UPDATE call_rows SET op_id = 12345 WHERE id % 89 = 0;
             UPDATE call_rows SET op_id = 'x' WHERE id % 83 = 0;
             UPDATE ops SET op = 'swap' WHERE op = 'cudaMalloc';
             UPDATE ops SET op = 'cudaMalloc' WHERE op = 'cudaLaunchKernel';
             UPDATE ops SET op = 'cudaLaunchKernel' WHERE op = 'swap';",
        )
        .expect("unknown op");
        drop(conn);
        path
    }

    /// (id, op) of every call `q` selects, read as the readers read them.
    fn read(path: &std::path::Path, q: &CallQuery) -> Vec<(i64, u16)> {
        let trace = Trace::open(path).expect("open");
        let mut got = Vec::new();
        Rows::open(&trace)
            .expect("rows")
            .for_each_call::<StoreError>(q, |c| {
                got.push((c.id, c.call.op));
                Ok(())
            })
            .expect("read");
        got
    }

    #[test]
    fn a_window_or_some_ops_are_the_views_rows_and_names() {
        let path = with_odd_ops("odd");
        let malloc = op_by_name("cudaMalloc").expect("op").id;
        let window = (5_000, 9_000);
        for pid in [None, Some(7)] {
            let q = CallQuery {
                pid,
                since_ns: Some(window.0),
                until_ns: Some(window.1),
                ..Default::default()
            };
            let got = read(&path, &q);
            assert!(got.len() > 100, "{pid:?}: {}", got.len());
            assert_eq!(got, through_the_view(&path, pid, Some(window)), "{pid:?}");
            // Some ops, asked for by the names `ops` gives them, whole and
            // from a moment.
            for since_ns in [None, Some(window.0)] {
                let q = CallQuery {
                    pid,
                    ops: Some(vec!["cudaMalloc", "cudaNotAnOp"]),
                    since_ns,
                    order: StreamOrder::ByStart,
                    ..Default::default()
                };
                let want: Vec<(i64, u16)> =
                    through_the_view(&path, pid, since_ns.map(|a| (a, u64::MAX)))
                        .into_iter()
                        .filter(|(_, op)| *op == malloc)
                        .collect();
                assert!(want.len() > 100, "{pid:?}: {}", want.len());
                assert_eq!(read(&path, &q), want, "{pid:?} {since_ns:?}");
            }
        }
    }

    /// (id, op) of the calls the `calls` view holds (of `pid`, starting in
    /// `window`) whose op this build knows, in start order.
    fn through_the_view(
        path: &std::path::Path,
        pid: Option<u32>,
        window: Option<(u64, u64)>,
    ) -> Vec<(i64, u16)> {
        let conn = rusqlite::Connection::open(path).expect("db");
        let mut st = conn
            .prepare("SELECT id, op, pid, ts_ns FROM calls ORDER BY ts_ns, id")
            .expect("select");
        let rows = st
            .query_map([], |r| {
                let (id, op) = (r.get::<_, i64>(0)?, r.get::<_, String>(1)?);
                Ok((id, op, r.get::<_, u32>(2)?, r.get::<_, i64>(3)? as u64))
            })
            .expect("query");
        rows.map(|r| r.expect("row"))
            .filter(|(_, _, p, _)| pid.is_none_or(|want| want == *p))
            .filter(|(_, _, _, ts)| window.is_none_or(|(a, b)| (a..b).contains(ts)))
            .filter_map(|(id, op, _, _)| Some((id, op_by_name(&op)?.id)))
            .collect()
    }

    fn counts() -> (usize, usize) {
        (
            test_seams::BUFFERED.with(|c| c.get()),
            test_seams::SORTED.with(|c| c.get()),
        )
    }

    #[test]
    fn calls_stored_as_they_return_come_out_as_sqlite_sorts_them() {
        let path = with_odd_ops("near");
        for pid in [None, Some(7), Some(9)] {
            let before = counts();
            let q = CallQuery {
                pid,
                ..Default::default()
            };
            let ([by_start, sorted], split) = both_ways(&path, &q);
            assert_eq!(counts(), (before.0 + 2, before.1), "{pid:?}: buffered");
            assert!(split, "{pid:?}: not split over helpers");
            assert!(sorted.len() > 1_000, "{pid:?}: {}", sorted.len());
            assert_eq!(by_start, sorted, "{pid:?}");
            // Straight through the buffer, no pass over the keys: the same.
            let (speculated, proved) = speculated(&path, &q);
            assert!(!proved, "{pid:?}: a keys pass");
            assert_eq!(speculated.expect("speculated"), sorted, "{pid:?}");
            // Both read the ops by id: the rows are the `calls` view's, with
            // their op names, in its order.
            assert_eq!(
                by_start
                    .iter()
                    .map(|(id, c)| (*id, c.op))
                    .collect::<Vec<_>>(),
                through_the_view(&path, pid, None),
                "{pid:?}"
            );
        }
    }

    #[test]
    fn a_call_stored_past_the_buffers_reach_is_left_to_sqlites_sort() {
        // The first call starts first and is stored last, after more
        // calls than the buffer holds.
        let mut calls = captured(REORDER_ROWS as u64 + 500);
        let mut long = call("cudaDeviceSynchronize", 7, 7, 1_000, u64::MAX >> 8);
        long.ts_ns = 999;
        calls.push(long);
        let path = written("far", calls);
        let before = counts();
        let ([by_start, sorted], _) = both_ways(&path, &CallQuery::default());
        assert_eq!(counts(), (before.0, before.1 + 2));
        assert_eq!(by_start[0].1.ts_ns, 999);
        assert_eq!(by_start, sorted);
        // Straight through the buffer, the read ends at the late call with
        // the error its caller takes back its output on, having handed over
        // the calls before it.
        let (speculated, proved) = speculated(&path, &CallQuery::default());
        assert!(!proved);
        match speculated {
            Err(StoreError::OutOfReach { path: p }) => assert_eq!(p, *path),
            other => panic!("{:?}", other.map(|v| v.len())),
        }
    }

    #[test]
    fn a_page_or_another_order_is_read_as_it_always_was() {
        let path = written("page", captured(3_000));
        for q in [
            CallQuery {
                limit: Some(10),
                ..Default::default()
            },
            CallQuery {
                order: StreamOrder::ByReturn,
                ..Default::default()
            },
        ] {
            let before = counts();
            let ([by_start, sorted], _) = both_ways(&path, &q);
            assert_eq!(counts(), before, "{q:?}");
            assert!(!sorted.is_empty(), "{q:?}");
            assert_eq!(by_start, sorted, "{q:?}");
        }
    }

    /// A window's calls (of a process or all, from a moment, up to one, or
    /// both) are read by id from the writer's blocks and put in order, as
    /// SQLite sorts them; where the blocks cannot say (the table emptied),
    /// SQLite sorts them as before.
    #[test]
    fn a_window_is_read_from_the_blocks_and_put_in_order() {
        let path = with_odd_ops("window");
        let windows = [
            (Some(5_000), Some(9_000)),
            (Some(20_000), None),
            (None, Some(4_000)),
        ];
        for pid in [None, Some(7)] {
            for (since_ns, until_ns) in windows {
                let q = CallQuery {
                    pid,
                    since_ns,
                    until_ns,
                    ..Default::default()
                };
                let before = counts();
                let ([by_start, sorted], split) = both_ways(&path, &q);
                assert_eq!(counts(), (before.0 + 2, before.1), "{q:?}: buffered");
                assert!(split, "{q:?}: not split over helpers");
                assert!(sorted.len() > 100, "{q:?}: {}", sorted.len());
                assert_eq!(by_start, sorted, "{q:?}");
                let (speculated, proved) = speculated(&path, &q);
                assert!(!proved, "{q:?}: a keys pass");
                assert_eq!(speculated.expect("speculated"), sorted, "{q:?}");
                let window = (since_ns.unwrap_or(0), until_ns.unwrap_or(u64::MAX));
                let ids: Vec<(i64, u16)> = by_start.iter().map(|(id, c)| (*id, c.op)).collect();
                assert_eq!(ids, through_the_view(&path, pid, Some(window)), "{q:?}");
            }
        }
        let conn = rusqlite::Connection::open(&*path).expect("db");
        conn.execute_batch("DELETE FROM call_blocks")
            .expect("no blocks");
        drop(conn);
        let q = CallQuery {
            since_ns: Some(5_000),
            until_ns: Some(9_000),
            ..Default::default()
        };
        let before = counts();
        let ([by_start, sorted], _) = both_ways(&path, &q);
        assert_eq!(counts(), (before.0, before.1 + 2), "sorted without blocks");
        assert!(!sorted.is_empty());
        assert_eq!(by_start, sorted);
        // Nothing to speculate on: SQLite sorts, no keys pass.
        let before = counts();
        let (speculated, proved) = speculated(&path, &q);
        assert!(!proved);
        assert_eq!(speculated.expect("sorted"), sorted);
        assert_eq!(counts(), (before.0, before.1 + 1));
    }
}
