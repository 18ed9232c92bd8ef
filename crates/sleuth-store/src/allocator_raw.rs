//! A process's allocator events of a version-5 file read from
//! `allocator_rows` itself rather than through the `allocator_events` view:
//! the same events, in the same order, with the same refusals, at about
//! half the cost per row (a pass over a run's 2.4M allocator events: the
//! view's join of each row's base row and its 16 `coalesce`s, and a name
//! per row looked up again, were most of it).
//!
//! What the view does is done here instead, exactly (`schema::ALLOCATOR_VIEW`,
//! which `schema_check` accepts only byte for byte):
//! - the op's name from `ops` (a row whose op is not there is left out, as
//!   the view's inner join leaves it out);
//! - each word the row leaves out (NULL) taken from its base row, the row
//!   `id - base_back` (computed by SQLite, so that its arithmetic is the
//!   view's); the base rows are looked up by id, most of them in a small
//!   cache of the rows just read (a block's base row is one of its own
//!   earlier rows), the others read one at a time. The rows come in id
//!   order, so the cache is a queue sorted by id, searched by halves: no
//!   hash of ids a crafted file chooses, and 1 MB where a hash map of as
//!   many rows grew to 4.3 MB, 6.5 MB while it grew (the tracer's peak with
//!   90,000 live blocks, round 34);
//! - the start, the thread and the time bounds in SQL, as the view's query
//!   computes them.
//!
//! Only files whose rows are in completion order by id (the `meta` key
//! `allocator_rows_in_end_order`), whose `ops` names are all text, are read
//! this way; the others through the view. [`RowsQuery`] is the one place
//! that picks the way and reads a row either way (a pass's, or a feed's a
//! page at a time).

use crate::problems::MAX_NS;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, Row};
use sleuth_core::event::BLOCK_WORDS;
use sleuth_core::ops::op_by_name;
use sleuth_core::BlockEvent;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// 2^63 as a float: the REAL row ids SQLite can compare with an integer one lie within ±it.
const I64_BOUND: f64 = 9_223_372_036_854_775_808.0;

/// Rows whose stored words are kept for later rows to take theirs from.
const CACHED_ROWS: usize = 4096;

/// One stored word as the view's `coalesce` sees it.
#[derive(Clone, Copy)]
enum Word {
    Int(u64),
    Null,
    /// A REAL, TEXT or BLOB: refused where it is read.
    Other,
}

impl Word {
    fn of(v: ValueRef<'_>) -> Word {
        match v {
            ValueRef::Integer(i) => Word::Int(i as u64),
            ValueRef::Null => Word::Null,
            _ => Word::Other,
        }
    }
}

type Words = [Word; BLOCK_WORDS];

/// The query of process `?1`'s rows in id order: the view's columns up to
/// the id (the op as its id), then the base row's id and the 16 words.
const SQL: &str = "SELECT a.end_ns - a.dur_ns, a.end_ns, a.pid, coalesce(a.tid, a.pid), a.op_id, \
     a.requested, a.block, a.stack_id, a.id, a.id - a.base_back, \
     a.w0, a.w1, a.w2, a.w3, a.w4, a.w5, a.w6, a.w7, a.w8, a.w9, a.w10, a.w11, a.w12, a.w13, a.w14, a.w15 \
     FROM allocator_rows a WHERE a.pid = ?1";

const BASE_SQL: &str =
    "SELECT w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15 \
     FROM allocator_rows WHERE id = ?1";

/// Which of a process's rows a [`query`] reads.
#[derive(Clone, Copy)]
pub(crate) enum Rows {
    /// Every one (`?1`: the pid).
    All,
    /// A page: those after row id `?3`, at most `?4` (`?2`, the last
    /// row's end, is bound but not needed: rows are in id order), as
    /// `allocator_rows::Select::OnePidPage` reads them.
    Page,
}

/// How a process's allocator events are read from a file: from
/// `allocator_rows` itself where this module reads the file (with its
/// ops), else through the `allocator_events` view
/// (`allocator_rows::query`): the same events either way.
#[derive(Clone, Default)]
pub(crate) struct RowsQuery {
    /// Its parameters are `allocator_rows::Select::OnePid`'s, or
    /// `OnePidPage`'s for a page ([`Rows`]).
    pub(crate) sql: String,
    ops: Option<Arc<Ops>>,
}

impl RowsQuery {
    /// The query of `rows`; None when the file has no allocator events.
    pub(crate) fn of(conn: &Connection, rows: Rows) -> rusqlite::Result<Option<RowsQuery>> {
        if let Some((sql, ops)) = query(conn, rows)? {
            let ops = Some(Arc::new(ops));
            return Ok(Some(RowsQuery { sql, ops }));
        }
        let select = match rows {
            Rows::All => crate::allocator_rows::Select::OnePid,
            Rows::Page => crate::allocator_rows::Select::OnePidPage,
        };
        let sql = crate::allocator_rows::query(conn, select)?;
        Ok(sql.map(|sql| RowsQuery { sql, ops: None }))
    }

    /// A reader of this query's rows, for one pass or one feed (it keeps
    /// rows for the later ones to take their words from).
    pub(crate) fn reader<'c>(&self, conn: &'c Connection) -> RowReader<'c> {
        RowReader(self.ops.clone().map(|ops| Resolver::new(conn, ops)))
    }
}

/// Reads the rows of a [`RowsQuery`] ([`RowsQuery::reader`]).
pub(crate) struct RowReader<'c>(Option<Resolver<'c>>);

impl RowReader<'_> {
    /// The event of row `r` of the query; None for a row the view leaves
    /// out or an op this build does not know.
    pub(crate) fn event(&mut self, r: &Row<'_>) -> rusqlite::Result<Option<BlockEvent>> {
        match &mut self.0 {
            Some(resolver) => resolver.resolve(raw_row(r)?),
            None => crate::allocator_rows::block_of(r),
        }
    }
}

/// The query of `rows` and the file's ops for a file read this way; None
/// when it is not (see the module's comment).
fn query(conn: &Connection, rows: Rows) -> rusqlite::Result<Option<(String, Ops)>> {
    if !crate::allocator_rows::in_end_order(conn)?
        || !crate::stacks::has_column(conn, "allocator_rows", "base_back")?
        || !crate::stacks::has_column(conn, "allocator_rows", "dur_ns")?
    {
        return Ok(None);
    }
    let Some(ops) = Ops::read(conn)? else {
        return Ok(None);
    };
    let (after, page) = match rows {
        Rows::All => ("", ""),
        Rows::Page => (" AND ?2 IS NOT NULL AND a.id > ?3", " LIMIT ?4"),
    };
    let sql = format!(
        "{SQL}{after} AND a.end_ns - a.dur_ns BETWEEN 0 AND {MAX_NS} AND a.end_ns BETWEEN 0 AND {MAX_NS} \
         ORDER BY a.id{page}"
    );
    Ok(Some((sql, ops)))
}

/// The file's ops by id: this build's op id of each name (None: a name it
/// does not know).
struct Ops(HashMap<i64, Option<u16>>);

impl Ops {
    /// None when a name is not text (the view's reader refuses it where
    /// a row uses it: read through the view then).
    fn read(conn: &Connection) -> rusqlite::Result<Option<Ops>> {
        let mut st = conn.prepare("SELECT id, op FROM ops")?;
        let mut rows = st.query([])?;
        let mut ops = HashMap::new();
        while let Some(r) = rows.next()? {
            let ValueRef::Text(name) = r.get_ref(1)? else {
                return Ok(None);
            };
            let op = std::str::from_utf8(name)
                .ok()
                .and_then(op_by_name)
                .map(|o| o.id);
            ops.insert(r.get::<_, i64>(0)?, op);
        }
        Ok(Some(Ops(ops)))
    }
}

/// One row as read, before its op and its base row's words are known.
struct RawRow {
    event: BlockEvent,
    id: i64,
    op_id: Option<i64>,
    base: Option<i64>,
    words: Words,
}

/// Reads one row of [`query`].
fn raw_row(r: &Row<'_>) -> rusqlite::Result<RawRow> {
    let mut words = [Word::Null; BLOCK_WORDS];
    for (i, w) in words.iter_mut().enumerate() {
        *w = Word::of(r.get_ref(10 + i)?);
    }
    // The view's join matches an integral id only.
    let base = match r.get_ref(9)? {
        ValueRef::Integer(i) => Some(i),
        ValueRef::Real(f) if f.fract() == 0.0 && (-I64_BOUND..I64_BOUND).contains(&f) => {
            Some(f as i64)
        }
        _ => None,
    };
    let op_id = match r.get_ref(4)? {
        ValueRef::Integer(i) => Some(i),
        _ => None,
    };
    Ok(RawRow {
        // As `allocator_rows::block_of` reads the view's row (the op and
        // the words once known).
        event: crate::allocator_rows::event_of(r, 0, [0; BLOCK_WORDS]),
        id: r.get(8)?,
        op_id,
        base,
        words,
    })
}

/// Completes the rows of one pass: their ops and their base rows' words.
struct Resolver<'c> {
    conn: &'c Connection,
    ops: Arc<Ops>,
    /// The rows kept, by increasing id.
    cached: VecDeque<(i64, Words)>,
    /// How many rows are kept ([`CACHED_ROWS`]; fewer in tests).
    capacity: usize,
}

impl<'c> Resolver<'c> {
    fn new(conn: &'c Connection, ops: Arc<Ops>) -> Self {
        Self::keeping(conn, ops, CACHED_ROWS)
    }

    fn keeping(conn: &'c Connection, ops: Arc<Ops>, capacity: usize) -> Self {
        Resolver {
            conn,
            ops,
            cached: VecDeque::new(),
            capacity,
        }
    }

    /// The event of `raw`, as the view's row gives it to
    /// `allocator_rows::block_of`: None for a row the view leaves out or
    /// an op this build does not know; an error for a word that is no
    /// integer (checked before the op, as there).
    fn resolve(&mut self, raw: RawRow) -> rusqlite::Result<Option<BlockEvent>> {
        let RawRow {
            mut event,
            id,
            op_id,
            base,
            words,
        } = raw;
        // The inner join with `ops`.
        let Some(op) = op_id.and_then(|i| self.ops.0.get(&i).copied()) else {
            return Ok(None);
        };
        let needs_base = words.iter().any(|w| matches!(w, Word::Null));
        let base_words = match (needs_base, base) {
            (true, Some(b)) => self.words_of(b)?,
            _ => None,
        };
        for (i, w) in words.iter().enumerate() {
            let w = match (w, base_words.as_ref()) {
                (Word::Null, Some(b)) => b[i],
                (w, _) => *w,
            };
            event.words[i] = match w {
                Word::Int(v) => v,
                _ => {
                    return Err(crate::finding_rollups::damaged_table(
                        "allocator_events",
                        "holds a word that is no integer",
                    ))
                }
            };
        }
        self.keep(id, words);
        let Some(op) = op else { return Ok(None) };
        event.op = op;
        Ok(Some(event))
    }

    /// Row `id`'s stored words; None when there is no such row.
    fn words_of(&mut self, id: i64) -> rusqlite::Result<Option<Words>> {
        if let Ok(i) = self.cached.binary_search_by_key(&id, |&(kept, _)| kept) {
            return Ok(Some(self.cached[i].1));
        }
        let mut st = self.conn.prepare_cached(BASE_SQL)?;
        let mut rows = st.query([id])?;
        let Some(r) = rows.next()? else {
            return Ok(None);
        };
        let mut words = [Word::Null; BLOCK_WORDS];
        for (i, w) in words.iter_mut().enumerate() {
            *w = Word::of(r.get_ref(i)?);
        }
        Ok(Some(words))
    }

    /// Keeps a row that stores words for the rows after it (the oldest
    /// kept one goes when there are too many). A row whose id is not past
    /// every kept one (no query here reads so) empties the queue first, so
    /// that it stays sorted: what is kept only spares a query.
    fn keep(&mut self, id: i64, words: Words) {
        if words.iter().all(|w| matches!(w, Word::Null)) {
            return;
        }
        if self.cached.back().is_some_and(|&(last, _)| last >= id) {
            self.cached.clear();
        }
        // Room made first: a queue one past its capacity would double.
        if self.cached.len() >= self.capacity {
            self.cached.pop_front();
        }
        if self.capacity > 0 {
            self.cached.push_back((id, words));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator_rows::{block_of, EndOrder, Select};
    use sleuth_core::{op_by_name, Event};

    /// A trace of this build's schema at `path`: two processes' allocator
    /// events over 60 blocks, most of a block's rows taking their words
    /// from its first (words above 2^63 among them).
    fn written(path: &std::path::Path) {
        let mut next = sleuth_core::testing::xorshift(0x5eed);
        let events = (0..3_000u64).map(|i| {
            let r = next();
            let block = 0x1000 + (r % 60) * 0x40;
            let op = match i % 3 {
                0 => "DeviceCachingAllocator::malloc",
                1 => "DeviceCachingAllocator::free",
                _ => "DeviceCachingAllocator::release_block",
            };
            let mut words = [0u64; BLOCK_WORDS];
            for (k, w) in words.iter_mut().enumerate() {
                *w = block.wrapping_mul(k as u64 + 1) ^ (u64::MAX * (k % 5 == 0) as u64);
            }
            // Now and then a block's words change (a new base row).
            words[3] ^= (r >> 40) % 4;
            let pid = if r & 1 == 0 { 7 } else { 9 };
            Event::Block(BlockEvent {
                op: op_by_name(op).expect("op").id,
                pid,
                tid: pid + ((r >> 8) % 2) as u32,
                start_ns: 1_000 + i * 100,
                end_ns: 1_050 + i * 100,
                requested: (i % 3 == 0).then_some(512 * (r % 9)),
                block,
                words,
                stack_id: r.is_multiple_of(7).then_some(r >> 3),
            })
        });
        crate::test_files::written_with(path, events);
    }

    /// Process `pid`'s events through the view, as every reader read them
    /// before (or the error, as a line).
    fn via_view(conn: &Connection, pid: u32) -> Result<Vec<BlockEvent>, String> {
        let sql = crate::allocator_rows::query(conn, Select::OnePid)
            .map_err(|e| e.to_string())?
            .expect("a table");
        let mut st = conn.prepare(&sql).map_err(|e| e.to_string())?;
        let mut rows = st.query([pid]).map_err(|e| e.to_string())?;
        let (mut out, mut order) = (Vec::new(), EndOrder::default());
        while let Some(r) = rows.next().map_err(|e| e.to_string())? {
            if let Some(b) = block_of(r).map_err(|e| e.to_string())? {
                order.check(&b).map_err(|e| e.to_string())?;
                out.push(b);
            }
        }
        Ok(out)
    }

    /// The same read from the table, keeping `capacity` rows; None when
    /// the file is not read this way.
    fn via_table(
        conn: &Connection,
        pid: u32,
        capacity: usize,
    ) -> Option<Result<Vec<BlockEvent>, String>> {
        let (sql, ops) = query(conn, Rows::All).expect("query")?;
        let read = || -> rusqlite::Result<Vec<BlockEvent>> {
            let mut st = conn.prepare(&sql)?;
            let mut rows = st.query([pid])?;
            let mut resolver = Resolver::keeping(conn, Arc::new(ops), capacity);
            let (mut out, mut order) = (Vec::new(), EndOrder::default());
            while let Some(r) = rows.next()? {
                if let Some(b) = resolver.resolve(raw_row(r)?)? {
                    order.check(&b)?;
                    out.push(b);
                }
            }
            Ok(out)
        };
        Some(read().map_err(|e| e.to_string()))
    }

    /// The same read a page of 7 rows at a time, as a feed reads them
    /// (`crate::step_feed`: one resolver from page to page).
    fn via_pages(conn: &Connection, pid: u32) -> Result<Vec<BlockEvent>, String> {
        let (sql, ops) = query(conn, Rows::Page)
            .expect("query")
            .expect("read this way");
        let read = || -> rusqlite::Result<Vec<BlockEvent>> {
            let mut resolver = Resolver::new(conn, Arc::new(ops));
            let (mut out, mut order) = (Vec::new(), EndOrder::default());
            let mut after = (-1i64, 0i64);
            loop {
                let mut st = conn.prepare_cached(&sql)?;
                let mut rows = st.query(rusqlite::params![pid, after.0, after.1, 7])?;
                let mut read = 0;
                while let Some(r) = rows.next()? {
                    read += 1;
                    after = (r.get(1)?, r.get(crate::allocator_rows::ID_COL)?);
                    if let Some(b) = resolver.resolve(raw_row(r)?)? {
                        order.check(&b)?;
                        out.push(b);
                    }
                }
                if read < 7 {
                    return Ok(out);
                }
            }
        };
        read().map_err(|e| e.to_string())
    }

    /// Every row the writer stores, and every change of a row a crafted
    /// file can make, reads the same events (or the same error) from the
    /// table as through the view, whatever the rows kept.
    #[test]
    fn the_table_reads_what_the_view_reads() {
        let dir = std::env::temp_dir().join(format!("gs-allocator-raw-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let good = dir.join("good.db");
        written(&good);
        // A row taking its words from a base, and one storing them.
        let (taker, base): (i64, i64) = Connection::open(&good)
            .expect("open")
            .query_row(
                "SELECT (SELECT min(id) FROM allocator_rows WHERE base_back IS NOT NULL AND id > 100),
                        (SELECT min(id) FROM allocator_rows WHERE w0 IS NOT NULL AND id > 100)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("rows");
        let t = "UPDATE allocator_rows SET";
        let changes = [
            String::new(),
            format!("{t} base_back = NULL WHERE id = {taker}"),
            format!("{t} base_back = base_back + 1000000 WHERE id = {taker}"),
            format!("{t} base_back = base_back + 0.5 WHERE id = {taker}"),
            format!("{t} base_back = 9223372036854775807 WHERE id = {taker}"),
            format!("{t} base_back = -9223372036854775807 WHERE id = {taker}"),
            format!("{t} base_back = 'abc' WHERE id = {taker}"),
            format!("{t} base_back = 0 WHERE id = {taker}"),
            format!("{t} base_back = -3 WHERE id = {taker}"),
            format!("{t} base_back = {taker} - {base} WHERE id = {taker}"),
            format!("{t} w4 = 'x' WHERE id = {base}"),
            format!("{t} w4 = 1.5 WHERE id = {base}"),
            format!("{t} w4 = NULL WHERE id = {base}"),
            format!("{t} w0 = 5, w1 = NULL WHERE id = {taker}"),
            format!("{t} op_id = 999 WHERE id = {taker}"),
            format!("{t} op_id = 'm' WHERE id = {taker}"),
            // The view leaves the row out before any word is read.
            format!("{t} op_id = 999, w0 = 'x' WHERE id = {taker}"),
            format!("UPDATE ops SET op = 'bogus' WHERE id = (SELECT op_id FROM allocator_rows WHERE id = {taker})"),
            format!("UPDATE ops SET op = '12' WHERE id = (SELECT op_id FROM allocator_rows WHERE id = {taker})"),
            format!("{t} tid = NULL WHERE id = {taker}"),
            format!("{t} tid = 99999999999 WHERE id = {taker}"),
            format!("{t} requested = 'abc' WHERE id = {taker}"),
            format!("{t} stack_id = 1.5 WHERE id = {taker}"),
            format!("{t} block = 'b' WHERE id = {taker}"),
            format!("{t} dur_ns = end_ns + 1 WHERE id = {taker}"),
            format!("{t} end_ns = 9223372036854775807 WHERE id = {taker}"),
            format!("{t} dur_ns = -9223372036854775807 WHERE id = {taker}"),
            format!("{t} end_ns = 10 WHERE id = {taker}"),
            format!("{t} pid = 9 WHERE id = {taker}"),
            format!("DELETE FROM allocator_rows WHERE id = {base}"),
        ];
        for (i, change) in changes.iter().enumerate() {
            let path = dir.join(format!("c{i}.db"));
            std::fs::copy(&good, &path).expect("copy");
            let conn = Connection::open(&path).expect("open");
            conn.execute_batch(change).expect(change);
            for pid in [7, 9] {
                let want = via_view(&conn, pid);
                if i == 0 {
                    assert!(want.as_ref().is_ok_and(|e| e.len() > 1000), "{want:?}");
                }
                for capacity in [CACHED_ROWS, 1, 0] {
                    let got = via_table(&conn, pid, capacity).expect("read from the table");
                    assert_eq!(got, want, "{change:?}, pid {pid}, keeping {capacity}");
                }
                assert_eq!(
                    via_pages(&conn, pid),
                    want,
                    "{change:?}, pid {pid}, by pages"
                );
            }
        }
        // Not read this way: a name that is no text, rows out of order.
        for change in [
            "UPDATE ops SET op = x'00' WHERE id = (SELECT min(op_id) FROM allocator_rows)",
            "DELETE FROM meta WHERE key = 'allocator_rows_in_end_order'",
        ] {
            let path = dir.join("other.db");
            std::fs::copy(&good, &path).expect("copy");
            let conn = Connection::open(&path).expect("open");
            conn.execute_batch(change).expect(change);
            assert!(via_table(&conn, 7, CACHED_ROWS).is_none(), "{change}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
