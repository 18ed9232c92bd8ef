//! The row ids of a window's calls in a file still being written.
//!
//! The file a run's tracer is writing has no `(tid, ts_ns)` index yet (it
//! is built when the file is completed: keeping it while writing cost the
//! tracer), so a window of it (`explain --last 10m` an hour into `trace
//! --rotate 1h`) read every call row to find those that start in the
//! window. The writer stores one row per transaction in `call_blocks`: the
//! id range of the calls it stored and their earliest and latest start. A
//! window's calls lie in the blocks whose starts overlap it, so a read of
//! the window is kept to the ids from the first such block to the last:
//! the rows of that span, not of the file (rows are stored as calls return,
//! so a window's rows are one stretch of the table).

use crate::open::has_table;
use rusqlite::{Connection, OptionalExtension};

/// The ids `[first, last]` holding every call row that starts in
/// `[since, until)` (a bound None is open), from `call_blocks`; `(1, 0)`
/// (no id) when no block overlaps the window. None where the blocks cannot
/// say: no such table (a file written before it, or not by the tracer), or
/// blocks that do not cover every call row without a gap (then every row is
/// read, as before).
pub(crate) fn id_range(
    conn: &Connection,
    since: Option<u64>,
    until: Option<u64>,
) -> rusqlite::Result<Option<(i64, i64)>> {
    if !has_table(conn, "call_blocks")? || !has_table(conn, "call_rows")? {
        return Ok(None);
    }
    // Each alone: SQLite answers a lone min() or max() of the row id from
    // the table's ends; both in one statement would scan it.
    let end = |sql: &str| -> rusqlite::Result<Option<i64>> {
        conn.query_row(sql, [], |r| r.get(0))
            .optional()
            .map(Option::flatten)
    };
    let (Some(min_id), Some(max_id)) = (
        end("SELECT min(id) FROM call_rows")?,
        end("SELECT max(id) FROM call_rows")?,
    ) else {
        return Ok(None);
    };
    let ns = |t: u64| i64::try_from(t).unwrap_or(i64::MAX);
    let (since, until) = (since.map_or(i64::MIN, ns), until.map_or(i64::MAX, ns));
    let mut st = conn.prepare_cached(
        "SELECT first_id, last_id, min_ts_ns, max_ts_ns FROM call_blocks ORDER BY first_id",
    )?;
    let mut rows = st.query([])?;
    let mut next: Option<i64> = None;
    let mut span: Option<(i64, i64)> = None;
    while let Some(r) = rows.next()? {
        let (first, last, lo, hi): (i64, i64, i64, i64) =
            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
        // Contiguous from the table's first row: no row outside a block.
        let covered = match next {
            None => first <= min_id,
            Some(n) => first == n,
        };
        if !covered || last < first.saturating_sub(1) {
            return Ok(None);
        }
        next = Some(last.saturating_add(1));
        if hi >= since && lo < until && last >= first {
            span = Some(span.map_or((first, last), |(a, _)| (a, last)));
        }
    }
    if next.is_none_or(|n| n <= max_id) {
        return Ok(None);
    }
    Ok(Some(span.unwrap_or((1, 0))))
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

    /// A file as the tracer leaves the one it is still writing, its calls
    /// stored in eight transactions (a flush after each): two threads
    /// launch, copy and sync; one is preempted by a hog in every copy.
    fn being_written(path: &Path) {
        let w =
            crate::TraceWriter::create(path, crate::SessionInfo::for_tests(), Default::default())
                .unwrap();
        let h = w.handle();
        for block in 0..8u64 {
            for i in 0..100u64 {
                for tid in [100u32, 101] {
                    let ts = 1_000_000 + (block * 100 + i) * 10_000 + u64::from(tid - 100) * 10;
                    let c = match i % 3 {
                        0 => call("cudaLaunchKernel", tid, ts, 5 + i % 7),
                        1 => call("cudaMemcpy", tid, ts, 2_000 + i),
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
        let blocks: Vec<(i64, i64, i64, i64)> = c
            .prepare(
                "SELECT first_id, last_id, min_ts_ns, max_ts_ns FROM call_blocks ORDER BY first_id",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(blocks.len() >= 8, "{blocks:?}");
        let mut next = 1;
        for &(first, last, lo, hi) in &blocks {
            assert_eq!(first, next);
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
        let without = dir.join("without.db");
        std::fs::copy(&path, &without).unwrap();
        Connection::open(&without)
            .unwrap()
            .execute_batch("DROP TABLE call_blocks")
            .unwrap();
        let windows = [
            (Some(3_500_000), Some(5_200_000)),
            (Some(7_000_000), None),
            (None, Some(2_000_000)),
            (Some(900_000_000), None),
        ];
        let (with, bare) = (Trace::open(&path).unwrap(), Trace::open(&without).unwrap());
        let conn = with.bulk().unwrap();
        let all = id_range(conn, None, None).unwrap().unwrap();
        assert_eq!(all.0, 1);
        for (since, until) in windows {
            let at = format!("{since:?}..{until:?}");
            let range = id_range(conn, since, until).unwrap().unwrap();
            assert!(
                range.1 - range.0 < all.1 - all.0,
                "{at}: {range:?} of {all:?}"
            );
            let filter = CallFilter {
                since_ns: since,
                until_ns: until,
                ..Default::default()
            };
            let stats = |t: &Trace| {
                let (r, _) = crate::window::stats_of(t, &filter).unwrap();
                serde_json::to_value(r).unwrap()
            };
            assert_eq!(stats(&with), stats(&bare), "{at}: stats");
            let explain = |t: &Trace| {
                serde_json::to_value(crate::scoped::explanation_or_loaded(t, &filter).unwrap())
                    .unwrap()
            };
            assert_eq!(explain(&with), explain(&bare), "{at}: explain");
        }
        assert_eq!(
            id_range(conn, Some(900_000_000), None).unwrap(),
            Some((1, 0))
        );
        assert_eq!(id_range(bare.bulk().unwrap(), Some(1), None).unwrap(), None);
        // A gap between two blocks: every row is read.
        drop((with, bare));
        let c = Connection::open(&path).unwrap();
        c.execute(
            "DELETE FROM call_blocks WHERE first_id = (SELECT max(first_id) FROM call_blocks)",
            [],
        )
        .unwrap();
        assert_eq!(id_range(&c, Some(7_000_000), None).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
