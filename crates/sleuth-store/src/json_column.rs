//! JSON values the tracer stores in a column (a process's ledger, the
//! run's ledger state when a file began), written without holding them
//! whole when they are large.
//!
//! A ledger lists every allocation still live: a program keeping 200,000
//! allocations makes a 24 MB JSON text. Serialized into a `String` and
//! bound, that text was held three times at once (the string grown by
//! doubling, 33.5 MB; SQLite's copy of the bound text; the record it built
//! to insert), 81 MB of the tracer's 112 MB peak heap (heaptrack, 2-vCPU VM,
//! 2026-12-03). A value longer than [`STREAM_ABOVE`] is instead stored as a
//! BLOB of the same UTF-8 text: the row is inserted with a `zeroblob` of its
//! length (SQLite writes the zeros without allocating them) and the JSON is
//! serialized again straight into the row through SQLite's incremental blob
//! I/O, 64 KiB at a time. Shorter values stay TEXT, serialized once, as
//! before: an older reader reads them as it did (unless they follow a long
//! one in the same row: [`insert_row`]; a reader that refuses the long one
//! refuses the row anyway).
//!
//! Readers take either ([`text_of`]): the bytes must be UTF-8 JSON either way.

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{Connection, MAIN_DB};
use std::io::{BufWriter, Write};

/// JSON longer than this (bytes) is written in pieces as a BLOB.
pub(crate) const STREAM_ABOVE: usize = 1 << 20;

/// The pieces an incremental write hands to SQLite.
const PIECE: usize = 64 << 10;

/// One column of a row to insert.
pub(crate) enum Col<'a> {
    Int(i64),
    Null,
    /// A value serialized by the function, which must write the same bytes
    /// each time it is called (it is called twice for a long value).
    Json(&'a dyn Fn(&mut dyn Write) -> serde_json::Result<()>),
}

/// Serializes `v` as a [`Col::Json`] writer.
pub(crate) fn json<T: serde::Serialize>(
    v: &T,
) -> impl Fn(&mut dyn Write) -> serde_json::Result<()> + '_ {
    move |w| serde_json::to_writer(w, v)
}

/// Inserts one row of `cols` (named `names`) into `table` of the main
/// database, each JSON value as TEXT when at most [`STREAM_ABOVE`] bytes
/// long, else as a BLOB written in pieces. SQLite leaves a `zeroblob`
/// unexpanded only when no column after it holds bytes: a JSON column
/// following a long one is stored as a BLOB of its text too (written
/// after the insert), so the long one is never held whole (it was twice,
/// the zeros and the record, for `run_ledger_begin`'s state).
pub(crate) fn insert_row(
    conn: &Connection,
    table: &str,
    names: &[&str],
    cols: &[Col<'_>],
) -> rusqlite::Result<()> {
    let mut held: Vec<Held> = Vec::with_capacity(cols.len());
    for c in cols {
        held.push(match c {
            Col::Int(v) => Held::Int(*v),
            Col::Null => Held::Null,
            Col::Json(write) => {
                let mut first = Spill::new();
                write(&mut first).map_err(conversion)?;
                match first.text {
                    Some(bytes) => Held::Text(String::from_utf8(bytes).map_err(conversion)?),
                    None => Held::Long(first.len),
                }
            }
        });
    }
    if let Some(f) = held.iter().position(|h| matches!(h, Held::Long(_))) {
        if held[f..].iter().all(|h| !matches!(h, Held::Int(_))) {
            for h in &mut held[f..] {
                if let Held::Text(t) = h {
                    *h = Held::Trailing(std::mem::take(t).into_bytes());
                }
            }
        }
    }
    let bound = held.iter().map(|h| match h {
        Held::Int(v) => ToSqlOutput::Owned(Value::Integer(*v)),
        Held::Null => ToSqlOutput::Owned(Value::Null),
        Held::Text(t) => ToSqlOutput::Borrowed(ValueRef::Text(t.as_bytes())),
        // SQLite refuses a zeroblob past its length limit (an error from
        // the INSERT, nothing stored).
        Held::Long(len) => ToSqlOutput::ZeroBlob(*len as u64),
        Held::Trailing(b) => ToSqlOutput::ZeroBlob(b.len() as u64),
    });
    let placeholders = (1..=cols.len())
        .map(|n| format!("?{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "INSERT INTO {table}({}) VALUES ({placeholders})",
        names.join(", ")
    );
    conn.prepare_cached(&sql)?
        .execute(rusqlite::params_from_iter(bound))?;
    let row = conn.last_insert_rowid();
    for (i, h) in held.iter().enumerate() {
        let (Held::Long(_) | Held::Trailing(_)) = h else {
            continue;
        };
        let blob = conn.blob_open(MAIN_DB, table, names[i], row, false)?;
        let mut w = BufWriter::with_capacity(
            PIECE,
            Counted {
                inner: blob,
                len: 0,
            },
        );
        let len = match (h, &cols[i]) {
            (Held::Long(len), Col::Json(write)) => {
                write(&mut w).map_err(conversion)?;
                *len
            }
            (Held::Trailing(bytes), _) => {
                w.write_all(bytes).map_err(conversion)?;
                bytes.len()
            }
            _ => unreachable!("only JSON columns are streamed"),
        };
        let written = w.into_inner().map_err(|e| conversion(e.into_error()))?.len;
        if written != len {
            // The serializer wrote fewer bytes than it did the first time:
            // the row would end in zeros no reader parses.
            return Err(conversion(std::io::Error::other(format!(
                "{} changed length between two serializations ({len} then {written} bytes)",
                names[i]
            ))));
        }
    }
    Ok(())
}

/// Sets integer column `col` of row `rowid` of `table` (whose columns are
/// `names`) to `value`, without holding the row's long values. SQLite's
/// UPDATE reads the whole record and writes it again: a row holding a
/// long JSON value (a BLOB [`insert_row`] wrote in pieces) was held twice
/// over (an allocator checkpoint's 9 MB state, 18 MB of the tracer's peak
/// with 90,000 live blocks, round 34). Such a row is instead copied: a
/// new row with `value`, the other short columns as they are, each BLOB
/// from the first long one on as a `zeroblob` of its length (SQLite reads
/// a BLOB's length without its bytes) then copied into it in pieces; the
/// old row deleted. A row without long values is updated in place.
pub(crate) fn set_int(
    conn: &Connection,
    table: &str,
    names: &[&str],
    rowid: i64,
    col: &str,
    value: Option<i64>,
) -> rusqlite::Result<()> {
    let probe = names
        .iter()
        .map(|n| format!("CASE WHEN typeof({n}) = 'blob' THEN length({n}) ELSE 0 END"))
        .collect::<Vec<_>>()
        .join(", ");
    let row = |select: &str| format!("SELECT {select} FROM {table} WHERE rowid = {rowid}");
    let lengths: Vec<i64> = columns(conn, &row(&probe), names.len())?;
    let Some(first) = lengths.iter().position(|&l| l > STREAM_ABOVE as i64) else {
        return conn
            .prepare_cached(&format!("UPDATE {table} SET {col} = ?1 WHERE rowid = ?2"))?
            .execute(rusqlite::params![value, rowid])
            .map(drop);
    };
    // Streamed: every BLOB from the first long one on (`insert_row` writes
    // each JSON value after a long one as a BLOB, so none holds bytes after
    // a zeroblob and SQLite leaves each unexpanded).
    let streamed: Vec<bool> = (0..names.len())
        .map(|i| i >= first && lengths[i] > 0 && names[i] != col)
        .collect();
    // The other columns' values read (short ones), the long ones bound as
    // zeroblobs: an INSERT … SELECT from the table itself would first
    // materialize its rows, zeros expanded (31 MB for an 11 MB value).
    let kept = names
        .iter()
        .zip(&streamed)
        .map(|(n, &s)| if s || *n == col { "NULL" } else { n })
        .collect::<Vec<_>>()
        .join(", ");
    let values: Vec<Value> = columns(conn, &row(&kept), names.len())?;
    let bound = values.into_iter().enumerate().map(|(i, v)| {
        if names[i] == col {
            ToSqlOutput::Owned(value.map_or(Value::Null, Value::Integer))
        } else if streamed[i] {
            ToSqlOutput::ZeroBlob(lengths[i] as u64)
        } else {
            ToSqlOutput::Owned(v)
        }
    });
    let placeholders = (1..=names.len())
        .map(|n| format!("?{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    conn.execute(
        &format!(
            "INSERT INTO {table}({}) VALUES ({placeholders})",
            names.join(", ")
        ),
        rusqlite::params_from_iter(bound),
    )?;
    let copy = conn.last_insert_rowid();
    for i in (0..names.len()).filter(|&i| streamed[i]) {
        let from = conn.blob_open(MAIN_DB, table, names[i], rowid, true)?;
        let mut to = conn.blob_open(MAIN_DB, table, names[i], copy, false)?;
        let mut from = std::io::BufReader::with_capacity(PIECE, from);
        std::io::copy(&mut from, &mut to).map_err(conversion)?;
    }
    conn.execute(&format!("DELETE FROM {table} WHERE rowid = ?1"), [rowid])?;
    Ok(())
}

/// The `n` columns of the one row `sql` selects.
fn columns<T: rusqlite::types::FromSql>(
    conn: &Connection,
    sql: &str,
    n: usize,
) -> rusqlite::Result<Vec<T>> {
    conn.query_row(sql, [], |r| (0..n).map(|i| r.get::<_, T>(i)).collect())
}

/// A column of a row about to be inserted.
enum Held {
    Int(i64),
    Null,
    /// JSON bound as TEXT.
    Text(String),
    /// JSON longer than [`STREAM_ABOVE`] (its length), serialized again
    /// into the row.
    Long(usize),
    /// Short JSON after a long one, written into the row as it is.
    Trailing(Vec<u8>),
}

/// The text of a stored JSON value, TEXT or BLOB; an error for another
/// type or bytes that are not UTF-8 (the caller names the file damaged).
pub(crate) fn text_of(v: ValueRef<'_>) -> Result<&str, String> {
    match v {
        ValueRef::Text(b) | ValueRef::Blob(b) => {
            std::str::from_utf8(b).map_err(|_| "a value that is not UTF-8 text".to_string())
        }
        _ => Err(format!("a {} where JSON text belongs", v.data_type())),
    }
}

fn conversion<E: std::error::Error + Send + Sync + 'static>(e: E) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(e))
}

/// A writer that keeps what it is given while it is at most
/// [`STREAM_ABOVE`] bytes long, then only counts.
struct Spill {
    /// None once longer than [`STREAM_ABOVE`].
    text: Option<Vec<u8>>,
    len: usize,
}

impl Spill {
    fn new() -> Spill {
        Spill {
            text: Some(Vec::new()),
            len: 0,
        }
    }
}

impl Write for Spill {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.len += buf.len();
        if self.len > STREAM_ABOVE {
            self.text = None;
        } else if let Some(t) = &mut self.text {
            t.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A writer that counts the bytes its inner writer took.
struct Counted<W> {
    inner: W,
    len: usize,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.len += n;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE t(pid INTEGER NOT NULL, a TEXT NOT NULL, b TEXT NOT NULL)")
            .unwrap();
        c
    }

    /// A short value is TEXT, a long one a BLOB; both read back as the
    /// text `serde_json::to_string` gives, beside the integer column.
    #[test]
    fn short_values_are_text_long_ones_blobs_of_the_same_text() {
        let c = table();
        let short: Vec<u64> = (0..1000).collect();
        // ~1.9 MB of JSON: past the threshold.
        let long: Vec<String> = (0..100_000).map(|i| format!("entry {i:08}")).collect();
        for (pid, a, b) in [(1, &short, &long), (2, &short, &long)] {
            let (ja, jb) = (json(a), json(b));
            insert_row(
                &c,
                "t",
                &["pid", "a", "b"],
                &[Col::Int(pid), Col::Json(&ja), Col::Json(&jb)],
            )
            .unwrap();
        }
        let mut st = c
            .prepare("SELECT pid, typeof(a), typeof(b), a, b FROM t ORDER BY pid")
            .unwrap();
        let mut rows = st.query([]).unwrap();
        let mut n = 0;
        while let Some(r) = rows.next().unwrap() {
            n += 1;
            assert_eq!(r.get::<_, i64>(0).unwrap(), n);
            assert_eq!(r.get::<_, String>(1).unwrap(), "text");
            assert_eq!(r.get::<_, String>(2).unwrap(), "blob");
            let a = text_of(r.get_ref(3).unwrap()).unwrap();
            let b = text_of(r.get_ref(4).unwrap()).unwrap();
            assert_eq!(a, serde_json::to_string(&short).unwrap());
            assert_eq!(b, serde_json::to_string(&long).unwrap());
            assert!(b.len() > STREAM_ABOVE);
        }
        assert_eq!(n, 2);
        // SQL over the column reads a BLOB's text as it reads TEXT.
        let (first, last): (String, String) = c
            .query_row(
                "SELECT json_extract(b, '$[0]'), json_extract(b, '$[#-1]') FROM t WHERE pid = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(
            (first.as_str(), last.as_str()),
            ("entry 00000000", "entry 00099999")
        );
    }

    /// A short value after a long one is stored as a BLOB of its text (so
    /// SQLite leaves the long one's zeros unexpanded); a short one before
    /// it, or one with an integer column between, stays TEXT.
    #[test]
    fn a_short_value_after_a_long_one_is_a_blob_of_its_text() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch("CREATE TABLE t(pid INTEGER NOT NULL, a TEXT, b TEXT, n INTEGER, d TEXT)")
            .unwrap();
        let long: Vec<String> = (0..100_000).map(|i| format!("entry {i:08}")).collect();
        let short = vec![1u64, 2, 3];
        let (jl, js) = (json(&long), json(&short));
        insert_row(
            &c,
            "t",
            &["pid", "a", "b"],
            &[Col::Int(1), Col::Json(&jl), Col::Json(&js)],
        )
        .unwrap();
        insert_row(
            &c,
            "t",
            &["pid", "a", "n", "d"],
            &[Col::Int(2), Col::Json(&jl), Col::Int(7), Col::Json(&js)],
        )
        .unwrap();
        let row = |pid: i64| -> (String, String, String, String) {
            c.query_row(
                "SELECT typeof(a), typeof(coalesce(b, d)), CAST(a AS TEXT), CAST(coalesce(b, d) AS TEXT) FROM t WHERE pid = ?1",
                [pid],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap()
        };
        let (long_text, short_text) = (
            serde_json::to_string(&long).unwrap(),
            serde_json::to_string(&short).unwrap(),
        );
        let (ta, tb, a, b) = row(1);
        assert_eq!((ta.as_str(), tb.as_str()), ("blob", "blob"));
        assert_eq!(
            (a.as_str(), b.as_str()),
            (long_text.as_str(), short_text.as_str())
        );
        // An integer after the long value: SQLite expands it anyway, the
        // short one stays as an older reader expects it.
        let (ta, td, a, d) = row(2);
        assert_eq!((ta.as_str(), td.as_str()), ("blob", "text"));
        assert_eq!(
            (a.as_str(), d.as_str()),
            (long_text.as_str(), short_text.as_str())
        );
    }

    /// `set_int` changes one integer column and nothing else of the row:
    /// in place without a long value, by a copy with one (the long values
    /// the same bytes, the same types; the old row gone).
    #[test]
    fn set_int_changes_one_column_and_keeps_every_other_byte() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE t(pid INTEGER NOT NULL, k INTEGER, a TEXT, n INTEGER, b TEXT)",
        )
        .unwrap();
        let names = ["pid", "k", "a", "n", "b"];
        let long: Vec<String> = (0..100_000).map(|i| format!("entry {i:08}")).collect();
        let short = vec![1u64, 2, 3];
        let (jl, js) = (json(&long), json(&short));
        // pid 1: short only; 2: long last; 3: long, long; 4: long, integer, short text.
        let rows: [(i64, &[Col<'_>]); 4] = [
            (1, &[Col::Json(&js), Col::Int(5), Col::Json(&js)]),
            (2, &[Col::Json(&js), Col::Int(5), Col::Json(&jl)]),
            (3, &[Col::Json(&jl), Col::Null, Col::Json(&jl)]),
            (4, &[Col::Json(&jl), Col::Int(7), Col::Json(&js)]),
        ];
        for (pid, rest) in &rows {
            let mut cols = vec![Col::Int(*pid), Col::Null];
            cols.extend(rest.iter().map(|c| match c {
                Col::Int(v) => Col::Int(*v),
                Col::Null => Col::Null,
                Col::Json(w) => Col::Json(*w),
            }));
            insert_row(&c, "t", &names, &cols).unwrap();
        }
        type Row = (i64, Option<i64>, Vec<(String, Option<Vec<u8>>)>);
        let read = |pid: i64| -> Row {
            c.query_row(
                "SELECT rowid, k, typeof(a), CAST(a AS BLOB), typeof(n), CAST(n AS BLOB), typeof(b), CAST(b AS BLOB) FROM t WHERE pid = ?1",
                [pid],
                |r| {
                    let cols = (0..3)
                        .map(|i| Ok((r.get(2 + 2 * i)?, r.get(3 + 2 * i)?)))
                        .collect::<rusqlite::Result<_>>()?;
                    Ok((r.get(0)?, r.get(1)?, cols))
                },
            )
            .unwrap()
        };
        for (pid, value, in_place) in [
            (1, Some(11), true),
            (2, Some(22), false),
            (3, Some(33), false),
            (4, None, false),
            (2, Some(-2), false),
        ] {
            let (rowid, _, before) = read(pid);
            set_int(&c, "t", &names, rowid, "k", value).unwrap();
            let (after_rowid, k, after) = read(pid);
            let what = format!("pid {pid}");
            assert_eq!(k, value, "{what}");
            assert_eq!(after, before, "{what}");
            assert_eq!(after_rowid == rowid, in_place, "{what}");
        }
        let n: i64 = c
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 4);
    }

    /// A value exactly at the threshold stays TEXT; one byte more is a BLOB.
    #[test]
    fn the_threshold_is_inclusive() {
        let c = table();
        // A JSON string of n bytes of 'x' is n + 2 bytes long.
        for (pid, len, ty) in [(1, STREAM_ABOVE, "text"), (2, STREAM_ABOVE + 1, "blob")] {
            let s = "x".repeat(len - 2);
            let j = json(&s);
            insert_row(
                &c,
                "t",
                &["pid", "a", "b"],
                &[Col::Int(pid), Col::Json(&j), Col::Json(&j)],
            )
            .unwrap();
            let (got, n): (String, i64) = c
                .query_row(
                    "SELECT typeof(a), length(CAST(a AS BLOB)) FROM t WHERE pid = ?1",
                    [pid],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap();
            assert_eq!((got.as_str(), n as usize), (ty, len), "pid {pid}");
        }
    }

    /// A serializer that writes less the second time is an error, not a
    /// row ending in zeros.
    #[test]
    fn a_value_that_shrinks_between_its_two_writes_is_an_error() {
        let c = table();
        let calls = std::cell::Cell::new(0);
        let shrinking = |w: &mut dyn Write| {
            calls.set(calls.get() + 1);
            let n = if calls.get() == 1 {
                STREAM_ABOVE + 10
            } else {
                5
            };
            w.write_all(&vec![b'1'; n]).map_err(serde_json::Error::io)
        };
        let ok = json(&1);
        let e = insert_row(
            &c,
            "t",
            &["pid", "a", "b"],
            &[Col::Int(1), Col::Json(&ok), Col::Json(&shrinking)],
        )
        .unwrap_err();
        assert!(e.to_string().contains("changed length"), "{e}");
    }

    #[test]
    fn readers_refuse_other_types_and_bytes_that_are_not_utf8() {
        assert_eq!(text_of(ValueRef::Text(b"[1]")).unwrap(), "[1]");
        assert_eq!(text_of(ValueRef::Blob(b"[1]")).unwrap(), "[1]");
        assert!(text_of(ValueRef::Blob(&[0xff, 0xfe])).is_err());
        assert!(text_of(ValueRef::Integer(3)).is_err());
        assert!(text_of(ValueRef::Null).is_err());
    }
}
