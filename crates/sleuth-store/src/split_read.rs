//! A large file's calls read side by side (issue 16).
//!
//! A moment late in a 10M-call file (`memory --at`, a window's allocator
//! views) replays the memory calls returned by then: one read of most of
//! the file's call rows in row order, SQLite's steps and the rows' decoding
//! on one core while the replay itself is a few percent of the time
//! (docs/benchmarks.md, round 29). Where the file cannot change under a
//! reader (opened `immutable`, as the checks' helper connections need:
//! `checked::Helpers`), the row ids are cut into chunks read on helper
//! connections, each chunk's calls sent whole, and visited chunk after
//! chunk: the calls and order of one read by id. Memory: a chunk's calls
//! per helper, one more in each channel, the chunks cut smaller the more
//! helpers there are ([`IDS_IN_FLIGHT`]).

use crate::checked::Helpers;
use crate::error::StoreError;
use crate::stream::{call_statement, read_error_of, run_select, CallQuery, Rows, StreamOrder};
use crate::types::StoredCall;
use std::sync::mpsc::sync_channel;

/// Row ids of the chunks in flight at most (each helper's chunk being read
/// and the one in its channel): at most this many calls decoded ahead, 80
/// MB for a read of every call (about 160 bytes each), a fifth of that for
/// the memory calls of the bench's mix. Two helpers read chunks of 128k ids.
const IDS_IN_FLIGHT: i64 = 512 * 1024;

/// A helper's answer for one chunk.
enum Chunk {
    Calls(Vec<StoredCall>),
    Failed(StoreError),
    /// No helper connection (the file changed since the trace opened it):
    /// the reader reads the chunk itself.
    Unhelped,
}

/// [`Rows::for_each_call`] of `q`, its chunks read on helper connections
/// when `q` reads by id without a limit, the file spans several chunks and
/// helpers may read it; otherwise one read as before.
pub(crate) fn for_each_call<E: From<StoreError>>(
    rows: &Rows,
    q: &CallQuery,
    mut visit: impl FnMut(StoredCall) -> Result<(), E>,
) -> Result<(), E> {
    let (path, budget, src, bulk) = rows.parts();
    let helpers = Helpers::new(path, budget, bulk.identity());
    let workers = helpers.workers();
    if q.order != StreamOrder::ById || q.limit.is_some() || workers < 2 {
        return rows.for_each_call(q, visit);
    }
    let conn = rows.checked_for_calls()?;
    let err = |e| read_error_of(path, budget, e);
    let span = id_span(conn, src.version).map_err(err)?;
    let span = match (span, blocks_bounds(conn, q).map_err(err)?) {
        (Some((lo, hi)), Some(Some((a, b)))) => Some((lo.max(a), hi.min(b))),
        // No row, or no block can hold one of its calls.
        (None, _) | (_, Some(None)) => None,
        (span, None) => span,
    };
    let chunks = match span {
        Some((lo, hi)) if hi.saturating_sub(lo) >= 2 * chunk_ids(workers) => {
            cut(lo, hi, chunk_ids(workers))
        }
        _ => return rows.for_each_call(q, visit),
    };
    let st = call_statement(conn, src, q, true).map_err(err)?;
    #[cfg(test)]
    test_seams::SPLIT.with(|c| c.set(c.get() + 1));
    std::thread::scope(|scope| {
        let mut answers = Vec::with_capacity(workers);
        for w in 0..workers {
            let (tx, rx) = sync_channel::<Chunk>(1);
            answers.push(rx);
            let mine: Vec<(i64, i64)> = chunks.iter().copied().skip(w).step_by(workers).collect();
            let (st, helpers) = (&st, &helpers);
            // A helper that cannot be started reads nothing: its channel
            // closes and the reader reads its chunks itself.
            let _ = std::thread::Builder::new().spawn_scoped(scope, move || {
                let Some(conn) = helpers.open() else {
                    for _ in mine {
                        if tx.send(Chunk::Unhelped).is_err() {
                            return;
                        }
                    }
                    return;
                };
                for (a, b) in mine {
                    let mut calls = Vec::new();
                    let args = st.args_for(a, b);
                    let read = run_select::<StoreError>(&conn, &st.sql, &args, &err, |c| {
                        calls.push(c);
                        Ok(())
                    });
                    let answer = match read {
                        Ok(()) => Chunk::Calls(calls),
                        Err(e) => Chunk::Failed(e),
                    };
                    // The reader stopped (an error, or the replay's restart).
                    if tx.send(answer).is_err() {
                        return;
                    }
                }
            });
        }
        for (i, &(a, b)) in chunks.iter().enumerate() {
            match answers[i % workers].recv() {
                Ok(Chunk::Calls(calls)) => {
                    for c in calls {
                        visit(c)?;
                    }
                }
                Ok(Chunk::Failed(e)) => return Err(e.into()),
                // A helper without a connection (or gone): read here.
                Ok(Chunk::Unhelped) | Err(_) => {
                    run_select(conn, &st.sql, &st.args_for(a, b), &err, &mut visit)?;
                }
            }
        }
        Ok(())
    })
}

/// The first and last call row id (None without rows): each alone, as
/// SQLite answers a lone min() or max() of the row id from the table's ends.
fn id_span(conn: &rusqlite::Connection, version: i64) -> rusqlite::Result<Option<(i64, i64)>> {
    let table = match version {
        1 => "calls",
        _ => "call_rows",
    };
    let end = |f: &str| -> rusqlite::Result<Option<i64>> {
        conn.query_row(&format!("SELECT {f}(rowid) FROM {table}"), [], |r| r.get(0))
    };
    Ok(end("min")?.zip(end("max")?))
}

/// The first and last id of the writer's blocks that can hold a call of
/// `q` (`call_blocks`: a moment's calls started by it, a window's in it,
/// a few ops' in blocks of their classes), Some(None) when none can; None
/// where the blocks cannot say. A chunk past them would read rows for
/// nothing (the statement keeps to the blocks, but SQLite seeks one range).
fn blocks_bounds(
    conn: &rusqlite::Connection,
    q: &CallQuery,
) -> rusqlite::Result<Option<Option<(i64, i64)>>> {
    let returned = q.returned_by.map(|t| t.saturating_add(1));
    let until = match (returned, q.until_ns) {
        (Some(r), Some(u)) => Some(r.min(u)),
        (r, u) => r.or(u),
    };
    let Some(classes) = crate::call_blocks::classes_of(q.ops.as_deref()) else {
        return Ok(None);
    };
    let ranges = crate::call_blocks::id_ranges(conn, q.since_ns, until, classes)?;
    Ok(ranges.map(|r| r.first().zip(r.last()).map(|(a, b)| (a.0, b.1))))
}

/// `[lo, hi]` cut into chunks of `n` ids.
fn cut(lo: i64, hi: i64, n: i64) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut a = lo;
    while a <= hi {
        let b = a.saturating_add(n - 1).min(hi);
        out.push((a, b));
        if b == i64::MAX {
            break;
        }
        a = b + 1;
    }
    out
}

/// Row ids per chunk read by one of `workers` helpers.
fn chunk_ids(workers: usize) -> i64 {
    #[cfg(test)]
    if let Some(n) = test_seams::CHUNK_IDS.with(|c| c.get()) {
        return n;
    }
    (IDS_IN_FLIGHT / (2 * workers.max(1) as i64)).max(1)
}

#[cfg(test)]
pub(crate) mod test_seams {
    use std::cell::Cell;
    thread_local! {
        /// Row ids per chunk of reads from this thread, when set.
        pub(crate) static CHUNK_IDS: Cell<Option<i64>> = const { Cell::new(None) };
        /// Reads split into chunks on this thread.
        pub(crate) static SPLIT: Cell<usize> = const { Cell::new(0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check_plan::test_seams::WORKERS;
    use crate::Trace;

    fn example(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(name)
    }

    /// The chunks in flight hold at most [`IDS_IN_FLIGHT`] ids, whatever
    /// the helpers, and cover the range once.
    #[test]
    fn chunks_shrink_with_helpers_and_cover_the_range() {
        for workers in 1..=8 {
            let n = chunk_ids(workers);
            assert!(2 * workers as i64 * n <= IDS_IN_FLIGHT, "{workers}");
        }
        assert_eq!(chunk_ids(2), 128 * 1024);
        for (lo, hi, n) in [
            (1, 10, 3),
            (5, 5, 7),
            (1, 9, 3),
            (i64::MAX - 4, i64::MAX, 2),
        ] {
            let chunks = cut(lo, hi, n);
            assert_eq!(chunks.first().map(|c| c.0), Some(lo));
            assert_eq!(chunks.last().map(|c| c.1), Some(hi));
            assert!(chunks.windows(2).all(|w| w[1].0 == w[0].1 + 1));
            assert!(chunks.iter().all(|c| c.0 <= c.1 && c.1 - c.0 < n));
        }
    }

    fn ids(rows: &Rows, q: &CallQuery) -> Vec<(i64, u64)> {
        let mut out = Vec::new();
        for_each_call::<StoreError>(rows, q, |c| {
            out.push((c.id, c.call.ts_ns));
            Ok(())
        })
        .expect("read");
        out
    }

    /// Chunks read on helpers give the calls of one read by id, in its
    /// order: every call, the memory calls, those returned by a moment;
    /// and a chunk size of one id, of more than the file, a single helper.
    #[test]
    fn chunks_read_side_by_side_are_one_read_by_id() {
        for name in ["demo-sim.db", "h200-contention.db"] {
            let trace = Trace::open(&example(name)).expect("open");
            let rows = Rows::open(&trace).expect("rows");
            let calls = trace.load(None).expect("load").calls;
            let end = calls.iter().map(|c| c.end_ns()).max().expect("calls");
            let span = id_span(rows.conn(), rows.parts().2.version)
                .expect("span")
                .expect("rows");
            let memory = crate::stream::memory_calls_of(None, StreamOrder::ById, None);
            let all = CallQuery {
                order: StreamOrder::ById,
                ..Default::default()
            };
            let moment = crate::stream::memory_calls_of(None, StreamOrder::ById, Some(end / 2 + 1));
            for q in [&all, &memory, &moment] {
                WORKERS.with(|w| w.set(Some(1)));
                let one = ids(&rows, q);
                for (workers, chunk) in [(2, 7), (3, 1), (2, 1_000), (2, 1 << 40)] {
                    WORKERS.with(|w| w.set(Some(workers)));
                    test_seams::CHUNK_IDS.with(|c| c.set(Some(chunk)));
                    let before = test_seams::SPLIT.with(|c| c.get());
                    let what = format!("{name}, {workers} workers, {chunk} ids per chunk");
                    assert_eq!(ids(&rows, q), one, "{what}");
                    let split = test_seams::SPLIT.with(|c| c.get()) > before;
                    assert_eq!(split, span.1 - span.0 >= 2 * chunk, "{what}");
                }
            }
            let memory_calls = ids(&rows, &memory).len();
            assert!(name != "demo-sim.db" || memory_calls >= 5, "{memory_calls}");
        }
        WORKERS.with(|w| w.set(None));
        test_seams::CHUNK_IDS.with(|c| c.set(None));
    }
}
