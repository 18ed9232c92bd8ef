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
//! chunk: the calls and order of one read by id. Memory: the calls the
//! helpers send in pieces ahead of the reader, [`CALLS_IN_FLIGHT`] at most
//! however the rows lie in the chunks.

use crate::checked::Helpers;
use crate::error::StoreError;
use crate::stream::{call_statement, read_error_of, run_select, CallQuery, Rows, StreamOrder};
use crate::types::StoredCall;
use std::sync::mpsc::sync_channel;

/// Row ids per chunk, whatever the helpers: 128k (a file of 10M calls is
/// 77 chunks).
const CHUNK_IDS: i64 = 128 * 1024;

/// Chunks at most: a file whose ids span more (a hostile one: ids 1 and
/// 2^62) gets larger chunks, not billions of reads.
const MAX_CHUNKS: i64 = 4096;

/// Calls per message of a helper.
const PIECE: usize = 4096;

/// Calls decoded ahead at most, over all helpers (each holds the piece it
/// fills and those in its channel): about 80 MB at 160 bytes a call,
/// however many calls a chunk holds (a hostile file's one chunk may hold
/// every row).
const CALLS_IN_FLIGHT: usize = 512 * 1024;

/// A helper's message.
enum Piece {
    /// The next calls of its current chunk.
    Calls(Vec<StoredCall>),
    /// Its current chunk is done.
    End,
    Failed(StoreError),
    /// No helper connection (the file changed since the trace opened it):
    /// the reader reads the chunk itself.
    Unhelped,
}

/// Why a helper's read of a chunk stopped early.
enum Stop {
    /// The reader is gone (an error, or the replay's restart).
    Gone,
    Failed(StoreError),
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Failed(e)
    }
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
    let table = crate::problems::call_table(src.version);
    let span = crate::call_blocks::id_span(conn, table).map_err(err)?;
    let span = match (span, blocks_bounds(conn, q).map_err(err)?) {
        (Some((lo, hi)), Some(Some((a, b)))) => Some((lo.max(a), hi.min(b))),
        // No row, or no block can hold one of its calls.
        (None, _) | (_, Some(None)) => None,
        (span, None) => span,
    };
    // A replay taken up from a checkpoint reads from its first id on.
    let span = span.map(|(lo, hi)| (lo.max(q.from_id.unwrap_or(lo)), hi));
    let chunks = match span {
        Some((lo, hi)) if hi.saturating_sub(lo) >= 2 * chunk_ids() => {
            let n = chunk_ids().max(hi.saturating_sub(lo) / MAX_CHUNKS + 1);
            cut(lo, hi, n)
        }
        _ => return rows.for_each_call(q, visit),
    };
    let st = call_statement(conn, src, q, true).map_err(err)?;
    #[cfg(test)]
    test_seams::SPLIT.with(|c| c.set(c.get() + 1));
    let pieces_ahead = (CALLS_IN_FLIGHT / piece() / workers)
        .saturating_sub(1)
        .max(1);
    std::thread::scope(|scope| {
        let mut answers = Vec::with_capacity(workers);
        for w in 0..workers {
            let (tx, rx) = sync_channel::<Piece>(pieces_ahead);
            answers.push(rx);
            let mine: Vec<(i64, i64)> = chunks.iter().copied().skip(w).step_by(workers).collect();
            let (st, helpers) = (&st, &helpers);
            // A helper that cannot be started reads nothing: its channel
            // closes and the reader reads its chunks itself.
            let _ = std::thread::Builder::new().spawn_scoped(scope, move || {
                let Some(conn) = helpers.open() else {
                    for _ in mine {
                        if tx.send(Piece::Unhelped).is_err() {
                            return;
                        }
                    }
                    return;
                };
                for (a, b) in mine {
                    let mut calls = Vec::with_capacity(piece());
                    let args = st.args_for(a, b);
                    let read =
                        run_select::<Stop>(&conn, &st.sql, &args, st.op_ids.as_ref(), &err, |c| {
                            calls.push(c);
                            if calls.len() >= piece() {
                                let next = Vec::with_capacity(piece());
                                let full = std::mem::replace(&mut calls, next);
                                tx.send(Piece::Calls(full)).map_err(|_| Stop::Gone)?;
                            }
                            Ok(())
                        });
                    let last = match read {
                        Ok(()) => tx
                            .send(Piece::Calls(calls))
                            .and_then(|()| tx.send(Piece::End)),
                        Err(Stop::Failed(e)) => tx.send(Piece::Failed(e)),
                        Err(Stop::Gone) => return,
                    };
                    if last.is_err() {
                        return;
                    }
                }
            });
        }
        for (i, &(a, b)) in chunks.iter().enumerate() {
            let mut started = false;
            loop {
                match answers[i % workers].recv() {
                    Ok(Piece::Calls(calls)) => {
                        started = true;
                        for c in calls {
                            visit(c)?;
                        }
                    }
                    Ok(Piece::End) => break,
                    Ok(Piece::Failed(e)) => return Err(e.into()),
                    // A helper without a connection (or never started):
                    // read here.
                    Ok(Piece::Unhelped) | Err(_) if !started => {
                        run_select(
                            conn,
                            &st.sql,
                            &st.args_for(a, b),
                            st.op_ids.as_ref(),
                            &err,
                            &mut visit,
                        )?;
                        break;
                    }
                    Ok(Piece::Unhelped) | Err(_) => {
                        let why = "a helper stopped in the middle of its part of the read";
                        return Err(StoreError::file(path, why).into());
                    }
                }
            }
        }
        Ok(())
    })
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

/// Row ids per chunk (at least: see [`MAX_CHUNKS`]).
fn chunk_ids() -> i64 {
    #[cfg(test)]
    if let Some(n) = test_seams::CHUNK_IDS.with(|c| c.get()) {
        return n;
    }
    CHUNK_IDS
}

/// Calls per message of a helper.
fn piece() -> usize {
    #[cfg(test)]
    if let Some(n) = test_seams::PIECE.with(|c| c.get()) {
        return n;
    }
    PIECE
}

#[cfg(test)]
pub(crate) mod test_seams {
    use std::cell::Cell;
    thread_local! {
        /// Row ids per chunk of reads from this thread, when set.
        pub(crate) static CHUNK_IDS: Cell<Option<i64>> = const { Cell::new(None) };
        /// Calls per helper message of reads from this thread, when set.
        pub(crate) static PIECE: Cell<Option<usize>> = const { Cell::new(None) };
        /// Reads split into chunks on this thread.
        pub(crate) static SPLIT: Cell<usize> = const { Cell::new(0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check_plan::test_seams::WORKERS;
    use crate::Trace;

    use crate::test_files::example;

    /// A trace of this build's schema at `path`: 3,000 calls of two
    /// threads, allocations, frees and launches.
    fn written(path: &std::path::Path) {
        use sleuth_core::{op_by_name, CallEvent, Event};
        let calls = (0..3_000u64).map(|i| {
            let (op, size) = match i % 3 {
                0 => ("cudaMalloc", Some(256)),
                1 => ("cudaFree", None),
                _ => ("cudaLaunchKernel", None),
            };
            Event::Call(CallEvent {
                ts_ns: 10_000 + i * 10,
                dur_ns: 5 + i % 7,
                pid: 7,
                tid: 7 + (i % 2) as u32,
                op: op_by_name(op).expect("op").id,
                size,
                ptr: Some(0x10_0000 + (i / 3 % 500) * 0x100),
                ..Default::default()
            })
        });
        crate::test_files::written_with(path, calls);
    }

    /// A directory of its own, removed when dropped.
    struct Dir(std::path::PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("gs-split-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).expect("dir");
            Dir(d)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Chunks cover the range once, each at most `n` ids.
    #[test]
    fn chunks_cover_the_range() {
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
        let dir = Dir::new("read");
        let current = dir.0.join("t.db");
        written(&current);
        let files = [
            example("demo-sim.db"),
            example("h200-contention.db"),
            current,
        ];
        for file in &files {
            let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("?");
            let trace = Trace::open(file).expect("open");
            let rows = Rows::open(&trace).expect("rows");
            let calls = trace.load(None).expect("load").calls;
            let end = calls.iter().map(|c| c.end_ns()).max().expect("calls");
            let table = crate::problems::call_table(rows.parts().2.version);
            let span = crate::call_blocks::id_span(rows.conn(), table)
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
                for (workers, chunk, piece) in
                    [(2, 7, 2), (3, 1, 1), (2, 1_000, 4096), (2, 1 << 40, 3)]
                {
                    WORKERS.with(|w| w.set(Some(workers)));
                    test_seams::CHUNK_IDS.with(|c| c.set(Some(chunk)));
                    test_seams::PIECE.with(|c| c.set(Some(piece)));
                    let before = test_seams::SPLIT.with(|c| c.get());
                    let what = format!("{name}, {workers} workers, {chunk} ids per chunk");
                    assert_eq!(ids(&rows, q), one, "{what}");
                    let split = test_seams::SPLIT.with(|c| c.get()) > before;
                    assert_eq!(split, span.1 - span.0 >= 2 * chunk, "{what}");
                }
            }
            let memory_calls = ids(&rows, &memory).len();
            assert!(
                name == "h200-contention.db" || memory_calls >= 5,
                "{memory_calls}"
            );
        }
        WORKERS.with(|w| w.set(None));
        test_seams::CHUNK_IDS.with(|c| c.set(None));
        test_seams::PIECE.with(|c| c.set(None));
    }

    /// Ids far apart (a file changed by hand: its last call's id near
    /// 2^62) make larger chunks, not billions of reads, and the same calls.
    #[test]
    fn ids_far_apart_are_read_in_few_chunks() {
        let dir = Dir::new("sparse");
        let path = dir.0.join("t.db");
        written(&path);
        rusqlite::Connection::open(&path)
            .expect("open")
            .execute_batch(
                "UPDATE call_rows SET id = 4611686018427387000 WHERE id = (SELECT max(id) FROM call_rows)",
            )
            .expect("update");
        let trace = Trace::open(&path).expect("open");
        let rows = Rows::open(&trace).expect("rows");
        let all = CallQuery {
            order: StreamOrder::ById,
            ..Default::default()
        };
        WORKERS.with(|w| w.set(Some(1)));
        let one = ids(&rows, &all);
        assert_eq!(one.last().map(|c| c.0), Some(4611686018427387000));
        WORKERS.with(|w| w.set(Some(2)));
        test_seams::CHUNK_IDS.with(|c| c.set(Some(7)));
        test_seams::PIECE.with(|c| c.set(Some(16)));
        let t = std::time::Instant::now();
        assert_eq!(ids(&rows, &all), one);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "{:?}",
            t.elapsed()
        );
        WORKERS.with(|w| w.set(None));
        test_seams::CHUNK_IDS.with(|c| c.set(None));
        test_seams::PIECE.with(|c| c.set(None));
    }
}
