//! The row ids of the calls a read wants in a file still being written.
//!
//! The file a run's tracer is writing has neither the `(tid, ts_ns)` nor
//! the `(op_id, dur_ns)` index yet (both are built when the file is
//! completed: keeping them while writing cost the tracer), so a window of
//! it (`explain --last 10m` an hour into `trace --rotate 1h`), and a read of
//! a few ops (the pinning calls before that window), read every call row.
//! The writer stores one row per transaction in `call_blocks`: the id range
//! of the calls it stored, their earliest and latest start, and the classes
//! of their ops (a bit per `OpClass`). A read keeps to the blocks that can
//! hold its calls: those whose starts overlap its window and which hold a
//! call of one of its ops' classes; contiguous blocks are one id range.

use crate::open::has_table;
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension};

/// Id ranges past which a read takes the one range from the first to the
/// last (each range is a term of the read's condition).
const MAX_RANGES: usize = 64;

/// Every op class (the mask of a read of any op).
pub(crate) const ALL_CLASSES: i64 = -1;

/// The class bit of an op (`call_blocks.classes`).
pub(crate) fn class_bit(info: &sleuth_core::ops::OpInfo) -> i64 {
    1i64 << (info.class as u32 % 63)
}

/// The classes of the ops named (`CallQuery::ops`; every class without);
/// None when one is not an op this build knows (a later tracer's op may
/// have a class this build has no bit for: the blocks cannot say).
pub(crate) fn classes_of(ops: Option<&[&str]>) -> Option<i64> {
    match ops {
        None => Some(ALL_CLASSES),
        Some(ops) => ops.iter().try_fold(0i64, |mask, name| {
            sleuth_core::op_by_name(name).map(|info| mask | class_bit(info))
        }),
    }
}

/// The id ranges (first, last; ascending, disjoint) holding every call row
/// that starts in `[since, until)` (a bound None is open) and is of an op
/// whose class bit is in `classes`, from `call_blocks`; empty when no block
/// can hold one. None where the blocks cannot say: no such table (a file
/// written before it, or not by the tracer), or blocks that do not cover
/// every call row without a gap (then every row is read, as before).
pub(crate) fn id_ranges(
    conn: &Connection,
    since: Option<u64>,
    until: Option<u64>,
    classes: i64,
) -> rusqlite::Result<Option<Vec<(i64, i64)>>> {
    if !has_table(conn, "call_blocks")? || !has_table(conn, "call_rows")? {
        return Ok(None);
    }
    let Some((min_id, max_id)) = id_span(conn, "call_rows")? else {
        return Ok(None);
    };
    let ns = |t: u64| i64::try_from(t).unwrap_or(i64::MAX);
    let (since, until) = (since.map_or(i64::MIN, ns), until.map_or(i64::MAX, ns));
    let mut st = conn.prepare_cached(
        "SELECT first_id, last_id, min_ts_ns, max_ts_ns, classes FROM call_blocks ORDER BY first_id",
    )?;
    let mut rows = st.query([])?;
    let mut next: Option<i64> = None;
    let mut ranges: Vec<(i64, i64)> = Vec::new();
    while let Some(r) = rows.next()? {
        // A value that is no integer (a damaged or crafted file): the
        // blocks cannot say, and the read takes the index or every row.
        let int = |i: usize| r.get_ref(i).ok().and_then(|v| v.as_i64().ok());
        let (Some(first), Some(last), Some(lo), Some(hi), Some(held)) =
            (int(0), int(1), int(2), int(3), int(4))
        else {
            return Ok(None);
        };
        // Contiguous from the table's first row: no row outside a block.
        let covered = match next {
            None => first <= min_id,
            Some(n) => first == n,
        };
        if !covered || last < first.saturating_sub(1) {
            return Ok(None);
        }
        next = Some(last.saturating_add(1));
        if hi >= since && lo < until && held & classes != 0 && last >= first {
            match ranges.last_mut() {
                Some(r) if r.1.saturating_add(1) == first => r.1 = last,
                _ => ranges.push((first, last)),
            }
        }
    }
    if next.is_none_or(|n| n <= max_id) {
        return Ok(None);
    }
    if ranges.len() > MAX_RANGES {
        let (a, b) = (ranges[0].0, ranges[ranges.len() - 1].1);
        ranges = vec![(a, b)];
    }
    Ok(Some(ranges))
}

/// The first and last row id of `table` (None without rows): each alone,
/// as SQLite answers a lone min() or max() of the row id from the table's
/// ends; both in one statement would scan it.
pub(crate) fn id_span(conn: &Connection, table: &str) -> rusqlite::Result<Option<(i64, i64)>> {
    let end = |f: &str| -> rusqlite::Result<Option<i64>> {
        conn.query_row(&format!("SELECT {f}(rowid) FROM {table}"), [], |r| r.get(0))
            .optional()
            .map(Option::flatten)
    };
    Ok(end("min")?.zip(end("max")?))
}

/// The condition that keeps a read of the calls of `ops` (all without)
/// starting in `[since, until)` to the blocks that can hold them, on the id
/// column `id` (`calls.id`), its bounds added to `args`; None where the
/// blocks cannot say ([`classes_of`], [`id_ranges`]): every row is read.
pub(crate) fn restrict(
    conn: &Connection,
    ops: Option<&[&str]>,
    (since, until): (Option<u64>, Option<u64>),
    id: &str,
    args: &mut Vec<Value>,
) -> rusqlite::Result<Option<String>> {
    restrict_from(conn, ops, (since, until), None, id, args)
}

/// [`restrict`] to the ids from `from` on (all when None): a replay taken
/// up from a checkpoint. The ranges themselves are cut, not a condition
/// added beside them: SQLite reads a disjunction of ranges range by range
/// and would read every earlier block to drop its rows.
pub(crate) fn restrict_from(
    conn: &Connection,
    ops: Option<&[&str]>,
    (since, until): (Option<u64>, Option<u64>),
    from: Option<i64>,
    id: &str,
    args: &mut Vec<Value>,
) -> rusqlite::Result<Option<String>> {
    let Some(classes) = classes_of(ops) else {
        return Ok(None);
    };
    let ranges = id_ranges(conn, since, until, classes)?.map(|r| match from {
        None => r,
        Some(f) => r
            .into_iter()
            .filter(|&(_, b)| b >= f)
            .map(|(a, b)| (a.max(f), b))
            .collect(),
    });
    Ok(ranges.map(|r| condition(id, &r, args)))
}

/// The condition that keeps a read to `ranges` (of [`id_ranges`]) on the
/// id column `id` (`calls.id`), its bounds added to `args`.
fn condition(id: &str, ranges: &[(i64, i64)], args: &mut Vec<Value>) -> String {
    if ranges.is_empty() {
        return "0".into();
    }
    let terms: Vec<String> = ranges
        .iter()
        .map(|&(a, b)| {
            args.push(Value::Integer(a));
            args.push(Value::Integer(b));
            format!("{id} BETWEEN ?{} AND ?{}", args.len() - 1, args.len())
        })
        .collect();
    format!("({})", terms.join(" OR "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::CallFilter;
    use crate::Trace;
    use sleuth_core::{op_by_name, CallEvent, Event, WaitEvent, WaitKind};
    use std::path::Path;

    fn call(op: &str, tid: u32, ts: u64, dur: u64) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: dur,
            pid: 100,
            tid,
            op: op_by_name(op).unwrap().id,
            runnable_ns: dur / 4,
            ..Default::default()
        }
    }

    fn window(since_ns: Option<u64>, until_ns: Option<u64>) -> CallFilter {
        CallFilter {
            since_ns,
            until_ns,
            ..Default::default()
        }
    }

    /// A copy of the file at `path` beside it, its blocks dropped.
    fn copy_without_blocks(path: &Path) -> std::path::PathBuf {
        let without = path.with_file_name("without.db");
        std::fs::copy(path, &without).unwrap();
        Connection::open(&without)
            .unwrap()
            .execute_batch("DROP TABLE call_blocks")
            .unwrap();
        without
    }

    /// `stats` of a window as JSON.
    fn stats_json(t: &Trace, filter: &CallFilter) -> serde_json::Value {
        let (r, _) = crate::window::stats_of(t, filter).unwrap();
        serde_json::to_value(r).unwrap()
    }

    /// The pinned buffer's address.
    const PINNED: u64 = 0x7f00_0000_0000;

    /// A file as the tracer leaves the one it is still writing, its calls
    /// stored in eight transactions (a flush after each): two threads
    /// launch, copy and sync; one is preempted by a hog in every copy.
    fn being_written(path: &Path) {
        let w =
            crate::TraceWriter::create(path, crate::SessionInfo::for_tests(), Default::default())
                .unwrap();
        let h = w.handle();
        // A pinned host buffer, allocated in the first block only: the
        // later windows' copies from it are pinned (read through the blocks
        // of its class).
        let mut pin = call("cudaHostAlloc", 100, 500_000, 20_000);
        (pin.size, pin.ptr) = (Some(1 << 20), Some(PINNED));
        h.send(Event::Call(pin)).unwrap();
        for block in 0..8u64 {
            for i in 0..100u64 {
                for tid in [100u32, 101] {
                    let ts = 1_000_000 + (block * 100 + i) * 10_000 + u64::from(tid - 100) * 10;
                    let c = match i % 3 {
                        0 => call("cudaLaunchKernel", tid, ts, 5 + i % 7),
                        1 => {
                            let mut c = call("cudaMemcpy", tid, ts, 4_000 + i);
                            (c.size, c.kind) = (Some(1 << 16), Some(1));
                            c.host_ptr = Some(PINNED + (i % 8) * 4096);
                            c
                        }
                        _ => call("cudaStreamSynchronize", tid, ts, 3_000 + block),
                    };
                    if i % 3 == 1 {
                        h.send(Event::Wait(WaitEvent {
                            pid: 100,
                            tid,
                            kind: WaitKind::Preempted,
                            off_ns: ts + 100,
                            wake_ns: ts + 100,
                            on_ns: ts + 600,
                            prev_state: 0,
                            cpu: 0,
                            culprits: vec![sleuth_core::Culprit {
                                pid: 200,
                                tid: 200,
                                comm: "hog".into(),
                                ns: 500,
                            }],
                            waker: None,
                        }))
                        .unwrap();
                    }
                    h.send(Event::Call(c)).unwrap();
                }
            }
            h.flush().unwrap();
        }
        drop(h);
        w.finish().unwrap();
        let c = Connection::open(path).unwrap();
        c.execute_batch(
            "DELETE FROM meta WHERE key NOT IN ('schema_version', 'tool', 'source', 'tool_version');
             DROP TABLE call_groups;
             DROP INDEX IF EXISTS call_rows_tid_ts; DROP INDEX IF EXISTS call_rows_op_dur;",
        )
        .unwrap();
    }

    /// The writer's blocks cover every call row, in order and without a
    /// gap, and each bounds its rows' starts exactly.
    #[test]
    fn the_writers_blocks_cover_every_call_and_bound_its_start() {
        let dir = std::env::temp_dir().join(format!("gs-blocks-w-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("live.db");
        being_written(&path);
        let c = Connection::open(&path).unwrap();
        let blocks: Vec<(i64, i64, i64, i64, i64)> = c
            .prepare(
                "SELECT first_id, last_id, min_ts_ns, max_ts_ns, classes FROM call_blocks
                 ORDER BY first_id",
            )
            .unwrap()
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(blocks.len() >= 8, "{blocks:?}");
        let mut next = 1;
        for &(first, last, lo, hi, classes) in &blocks {
            assert_eq!(first, next);
            let ops: Vec<String> = c
                .prepare(
                    "SELECT DISTINCT o.op FROM call_rows c JOIN ops o ON o.id = c.op_id
                     WHERE c.id BETWEEN ?1 AND ?2",
                )
                .unwrap()
                .query_map([first, last], |r| r.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            let names: Vec<&str> = ops.iter().map(String::as_str).collect();
            assert_eq!(Some(classes), classes_of(Some(&names)), "{names:?}");
            let (a, b): (i64, i64) = c
                .query_row(
                    "SELECT min(ts_ns), max(ts_ns) FROM call_rows WHERE id BETWEEN ?1 AND ?2",
                    [first, last],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap();
            assert_eq!((a, b), (lo, hi));
            next = last + 1;
        }
        let max: i64 = c
            .query_row("SELECT max(id) FROM call_rows", [], |r| r.get(0))
            .unwrap();
        assert_eq!(next, max + 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A window of a file still being written reads the ids of the blocks
    /// it overlaps, and answers as the same file read whole: `stats` of
    /// the window and its explanation equal those of a copy without the
    /// blocks; a gap in the blocks, or none, reads every row.
    #[test]
    fn a_window_reads_the_blocks_it_overlaps_and_answers_as_every_row() {
        let dir = std::env::temp_dir().join(format!("gs-blocks-r-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("live.db");
        being_written(&path);
        let without = copy_without_blocks(&path);
        let windows = [
            (Some(3_500_000), Some(5_200_000)),
            (Some(7_000_000), None),
            (None, Some(2_000_000)),
            (Some(900_000_000), None),
        ];
        let (with, bare) = (Trace::open(&path).unwrap(), Trace::open(&without).unwrap());
        let conn = with.bulk().unwrap();
        let span = |r: Vec<(i64, i64)>| match (r.first(), r.last()) {
            (Some(a), Some(b)) => (a.0, b.1),
            _ => (1, 0),
        };
        let all = span(id_ranges(conn, None, None, ALL_CLASSES).unwrap().unwrap());
        assert_eq!(all.0, 1);
        for (since, until) in windows {
            let at = format!("{since:?}..{until:?}");
            let range = span(id_ranges(conn, since, until, ALL_CLASSES).unwrap().unwrap());
            assert!(
                range.1 - range.0 < all.1 - all.0,
                "{at}: {range:?} of {all:?}"
            );
            let filter = window(since, until);
            let stats = |t: &Trace| stats_json(t, &filter);
            assert_eq!(stats(&with), stats(&bare), "{at}: stats");
            let explain = |t: &Trace| {
                serde_json::to_value(crate::scoped::explanation_or_loaded(t, &filter).unwrap())
                    .unwrap()
            };
            assert_eq!(explain(&with), explain(&bare), "{at}: explain");
        }
        let late = id_ranges(conn, Some(900_000_000), None, ALL_CLASSES).unwrap();
        assert_eq!(late, Some(vec![]));
        // The pinning calls are in the first block alone; the memory pinned
        // before a late window is found through it.
        let pinning = classes_of(Some(&["cudaHostAlloc", "cudaFreeHost"])).unwrap();
        let first_block = id_ranges(conn, None, None, pinning).unwrap().unwrap();
        assert!(
            first_block.len() == 1 && first_block[0].0 == 1 && first_block[0].1 < all.1,
            "{first_block:?}"
        );
        let pinned = |t: &Trace| {
            let p = crate::scoped::pinned_before(t, None, Some(7_000_000), Default::default());
            p.unwrap().ranges()
        };
        assert_eq!(pinned(&with), vec![(100, PINNED, PINNED + (1 << 20))]);
        assert_eq!(pinned(&with), pinned(&bare));
        assert_eq!(
            id_ranges(bare.bulk().unwrap(), Some(1), None, ALL_CLASSES).unwrap(),
            None
        );
        // A gap between two blocks: every row is read.
        drop((with, bare));
        let c = Connection::open(&path).unwrap();
        c.execute(
            "DELETE FROM call_blocks WHERE first_id = (SELECT max(first_id) FROM call_blocks)",
            [],
        )
        .unwrap();
        assert_eq!(
            id_ranges(&c, Some(7_000_000), None, ALL_CLASSES).unwrap(),
            None
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A finished file (its call groups and indexes built): a window read
    /// by row id (`split_read`'s chunks, `replay_by_return`) keeps to the
    /// blocks its starts overlap, not to the `(tid, ts_ns)` index (which
    /// SQLite would sort by id), and answers as that index does (the same
    /// file without its blocks) and as the window loaded: with a long call
    /// stored four blocks after its start, and a window that holds nothing.
    #[test]
    fn a_finished_files_window_by_id_keeps_to_its_blocks_and_answers_as_the_index() {
        let dir = std::env::temp_dir().join(format!("gs-blocks-f-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("done.db");
        let w =
            crate::TraceWriter::create(&path, crate::SessionInfo::for_tests(), Default::default())
                .unwrap();
        let h = w.handle();
        for block in 0..6u64 {
            for i in 0..50u64 {
                for tid in [100u32, 101] {
                    let ts = 1_000_000 + (block * 50 + i) * 10_000 + u64::from(tid - 100);
                    let op = ["cudaLaunchKernel", "cudaMemcpy", "cudaStreamSynchronize"];
                    let c = call(op[(i % 3) as usize], tid, ts, 1_000 + i * 17 + block);
                    h.send(Event::Call(c)).unwrap();
                }
            }
            if block == 4 {
                // Started in block 0's time, returned in block 4's.
                let long = call("cudaStreamSynchronize", 102, 1_250_000, 2_000_000);
                h.send(Event::Call(long)).unwrap();
            }
            h.flush().unwrap();
        }
        drop(h);
        w.finish().unwrap();
        let without = copy_without_blocks(&path);
        let (with, bare) = (Trace::open(&path).unwrap(), Trace::open(&without).unwrap());
        let windows = [
            (Some(1_200_000), Some(1_300_000)),
            (Some(2_000_000), Some(3_000_000)),
            (None, Some(1_100_000)),
            (Some(900_000_000), None),
        ];
        for (since, until) in windows {
            let at = format!("{since:?}..{until:?}");
            let q = crate::stream::CallQuery {
                order: crate::stream::StreamOrder::ById,
                since_ns: since,
                until_ns: until,
                ..Default::default()
            };
            let src = crate::stream::CallSource {
                version: with.version(),
                has_stacks: false,
                host_ptrs: true,
            };
            let sql = |t: &Trace| {
                crate::stream::call_statement(t.bulk().unwrap(), src, &q, true)
                    .unwrap()
                    .sql
            };
            let (blocks, index) = (sql(&with), sql(&bare));
            assert!(!blocks.contains("tid IN"), "{at}: {blocks}");
            assert!(index.contains("tid IN"), "{at}: {index}");
            let filter = window(since, until);
            let stats = |t: &Trace| stats_json(t, &filter);
            let loaded = {
                let data = with.load_calls_of(&filter).unwrap();
                let (r, _) = crate::window::stats_from_loaded(&with, data, &filter).unwrap();
                serde_json::to_value(r).unwrap()
            };
            assert_eq!(stats(&with), stats(&bare), "{at}: stats");
            assert_eq!(stats(&with), loaded, "{at}: stats");
            let ids = |t: &Trace| {
                let mut ids = Vec::new();
                crate::stream::Rows::open(t)
                    .unwrap()
                    .for_each_call::<crate::StoreError>(&q, |s| {
                        ids.push(s.id);
                        Ok(())
                    })
                    .unwrap();
                ids
            };
            let got = ids(&with);
            assert_eq!(got, ids(&bare), "{at}: rows");
            assert!(got.windows(2).all(|p| p[0] < p[1]), "{at}: by id");
        }
        let (r, _) =
            crate::window::stats_of(&with, &window(Some(1_200_000), Some(1_300_000))).unwrap();
        let sync = r.ops.iter().find(|o| o.op == "cudaStreamSynchronize");
        assert_eq!(
            sync.and_then(|o| o.max_ns),
            Some(2_000_000),
            "the long call is in its window"
        );
        // Damaged blocks: a value that is no integer, one block over every
        // id, overlapping blocks. Each answers as the index does.
        let damaged = [
            "UPDATE call_blocks SET min_ts_ns = 'x' WHERE rowid = 2",
            "DELETE FROM call_blocks; INSERT INTO call_blocks VALUES (1, 4611686018427387904, 0, 9223372036854775807, -1)",
            "UPDATE call_blocks SET first_id = first_id - 3 WHERE rowid = 3",
        ];
        drop(with);
        for (i, sql) in damaged.iter().enumerate() {
            let copy = dir.join(format!("damaged{i}.db"));
            std::fs::copy(&path, &copy).unwrap();
            Connection::open(&copy).unwrap().execute_batch(sql).unwrap();
            let t = Trace::open(&copy).unwrap();
            for (since, until) in windows {
                let filter = window(since, until);
                assert_eq!(stats_json(&t, &filter), stats_json(&bare, &filter), "{sql}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
