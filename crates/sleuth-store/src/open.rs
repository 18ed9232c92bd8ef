//! Opening database files we did not just write, as untrusted input.
//!
//! Read-only flag (not `mode=ro`, not `query_only`), the URI built here from
//! the path (a caller's path is never parsed as a URI), schema not trusted
//! (no functions with side effects from views or triggers), cell sizes
//! checked, no memory mapping, and an integrity check before anything else
//! reads the file, so a corrupt or hostile file yields an error.
//!
//! Reading must not write beside the input: a WAL-mode trace opened the
//! usual way gets `-wal`/`-shm` files created next to it. When no `-wal`
//! with content is there, the file is opened `immutable=1` (SQLite then
//! neither locks nor creates anything); when one is (a trace still being
//! written, or one whose writer was killed), its content is part of the
//! trace, and SQLite needs a `-shm` beside it to read it.

use crate::budget::ReadBudget;
use crate::error::{SqlContext, StoreError};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

/// Opens `path` read-only with the hardening above and checks it is an
/// intact SQLite database.
pub(crate) fn open_untrusted(path: &Path) -> Result<Connection, StoreError> {
    let conn = open_untrusted_unchecked(path)?;
    let verdict: String = conn
        .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
        .map_err(|e| {
            StoreError::file(path, format!("not a valid SQLite database: {}", short(&e)))
        })?;
    if verdict != "ok" {
        // SQLite's verdict spans lines; an error is one line.
        let verdict: Vec<&str> = verdict.lines().map(str::trim).collect();
        return Err(StoreError::file(
            path,
            format!("SQLite database is corrupt: {}", verdict.join(" ")),
        ));
    }
    Ok(conn)
}

/// Opens a trace for the readers: the hardening above, every statement
/// under `budget`, and SQLite's full `integrity_check` (which, unlike
/// `quick_check`, verifies that every index matches its table: readers use
/// the indexes, and a broken one silently drops rows). The caller checks
/// the schema before anything else reads the file.
pub(crate) fn open_trace_file(path: &Path, budget: &ReadBudget) -> Result<Connection, StoreError> {
    let mut conn = open_untrusted_unchecked(path)?;
    budget.watch(&mut conn).map_err(|e| {
        StoreError::file(path, format!("cannot set a read deadline: {}", short(&e)))
    })?;
    Ok(conn)
}

/// Files up to this size get SQLite's full `integrity_check`, which also
/// verifies that every index entry matches its row (a broken index made
/// readers drop rows while `quick_check` passed). Above it that check costs
/// minutes (33 s for a 64 MB trace on a busy 2-core CI machine, against
/// 2.7 s for `quick_check`), so larger files get `quick_check` only: page
/// structure and index entry counts, not index contents (docs/schema.md).
pub const FULL_CHECK_BYTES: u64 = 64 << 20;

/// [`FULL_CHECK_BYTES`], which a unit test may lower on its own thread to
/// take the large-file path on the small example traces.
pub(crate) fn full_check_bytes() -> u64 {
    #[cfg(test)]
    if let Some(b) = test_seams::FULL_CHECK_BYTES.with(|b| b.get()) {
        return b;
    }
    FULL_CHECK_BYTES
}

/// What unit tests observe and change of the checks, per thread (tests run
/// in parallel; a check runs on the thread that reads).
#[cfg(test)]
pub(crate) mod test_seams {
    use std::cell::Cell;
    thread_local! {
        /// Check pragmas run on this thread.
        pub(crate) static CHECKS_RUN: Cell<usize> = const { Cell::new(0) };
        /// Plans of checks and counts run on this thread (`Checks::ensure_counts`).
        pub(crate) static PLANS_RUN: Cell<usize> = const { Cell::new(0) };
        /// The size above which files get `quick_check` only, when set.
        pub(crate) static FULL_CHECK_BYTES: Cell<Option<u64>> = const { Cell::new(None) };
    }

    pub(crate) fn checks_run() -> usize {
        CHECKS_RUN.with(|c| c.get())
    }

    pub(crate) fn plans_run() -> usize {
        PLANS_RUN.with(|c| c.get())
    }
}

/// Checks the file under the connection's budget: an error when SQLite
/// finds it damaged or the check could not finish.
pub(crate) fn integrity_check(
    conn: &Connection,
    path: &Path,
    budget: &ReadBudget,
) -> Result<(), StoreError> {
    let pragma = if file_size(path) <= full_check_bytes() {
        "PRAGMA integrity_check(1)"
    } else {
        "PRAGMA quick_check(1)"
    };
    run_check(conn, path, budget, pragma)
}

/// Tables with rows per call or wait: in a large trace nearly every page is
/// theirs. [`check_at_open`] leaves them to [`check_tables`], run by the
/// reader (`checked::Checks::ensure_bulk`) just before the first read of
/// any of them, so a command that answers from the other tables (`stats`
/// from the rollups) does not pay a pass over the whole file, and no table
/// is read before it was checked.
pub(crate) const BULK_TABLES: &[&str] = &[
    "calls",
    "call_rows",
    "call_host_ptrs",
    "call_culprits",
    "waits",
    "wait_culprits",
    "wait_wakers",
];

/// The check a reader runs when it opens a trace. Files up to
/// [`FULL_CHECK_BYTES`]: `integrity_check` of the whole file, as ever
/// (returns false). Larger files: `quick_check` of every table except
/// [`BULK_TABLES`] (returns true: the caller must [`check_tables`] those
/// before reading them). What is not checked then is the page accounting
/// of the whole file (free-list, pages no table owns): pages no reader
/// reads. The schema was checked before (plain tables, plain indexes).
pub(crate) fn check_at_open(
    conn: &Connection,
    path: &Path,
    budget: &ReadBudget,
) -> Result<bool, StoreError> {
    check_at_open_above(conn, path, budget, full_check_bytes())
}

/// [`check_at_open`] with the size above which bulk tables are deferred.
fn check_at_open_above(
    conn: &Connection,
    path: &Path,
    budget: &ReadBudget,
    full_check_bytes: u64,
) -> Result<bool, StoreError> {
    if file_size(path) <= full_check_bytes {
        integrity_check(conn, path, budget)?;
        return Ok(false);
    }
    let others: Vec<String> = tables(conn)
        .map_err(|e| StoreError::file(path, short(&e)))?
        .into_iter()
        .filter(|t| !BULK_TABLES.contains(&t.as_str()))
        .collect();
    check_tables(conn, path, budget, &others)?;
    Ok(true)
}

/// `quick_check` of these tables and their indexes (page structure, cell
/// sizes, index entry counts), one table at a time.
pub(crate) fn check_tables(
    conn: &Connection,
    path: &Path,
    budget: &ReadBudget,
    names: &[String],
) -> Result<(), StoreError> {
    for name in names {
        check_table(conn, path, budget, name)?;
    }
    Ok(())
}

/// `quick_check` of one table and its indexes.
pub(crate) fn check_table(
    conn: &Connection,
    path: &Path,
    budget: &ReadBudget,
    name: &str,
) -> Result<(), StoreError> {
    // A name from the file, as an SQL string literal.
    let quoted = name.replace('\'', "''");
    run_check(
        conn,
        path,
        budget,
        &format!("PRAGMA quick_check('{quoted}')"),
    )
}

/// Every table of the file (not views, not indexes).
pub(crate) fn tables(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut st = conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table'")?;
    let rows = st.query_map([], |r| r.get(0))?;
    rows.collect()
}

pub(crate) fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(u64::MAX)
}

/// Runs one check pragma: an error naming the damage or why it stopped.
fn run_check(
    conn: &Connection,
    path: &Path,
    budget: &ReadBudget,
    pragma: &str,
) -> Result<(), StoreError> {
    let stopped = |e: &rusqlite::Error| match budget.stop_reason() {
        Some(why) => StoreError::file(path, format!("integrity check stopped: {why}")),
        None => StoreError::file(
            path,
            format!("damaged or not a valid SQLite database: {}", short(e)),
        ),
    };
    #[cfg(test)]
    test_seams::CHECKS_RUN.with(|c| c.set(c.get() + 1));
    let verdict: String = conn
        .query_row(pragma, [], |r| r.get(0))
        .map_err(|e| stopped(&e))?;
    if verdict != "ok" {
        // SQLite's verdict spans lines ("*** in database main ***" first);
        // an error is one line.
        let verdict: Vec<&str> = verdict.lines().map(str::trim).collect();
        return Err(StoreError::file(
            path,
            format!("SQLite database is damaged: {}", verdict.join(" ")),
        ));
    }
    Ok(())
}

/// The same hardening without the (size-proportional) integrity check, for
/// the SQL sandbox, which runs many small queries under a time limit; the
/// header is still read, so a non-SQLite file fails here.
pub(crate) fn open_untrusted_unchecked(path: &Path) -> Result<Connection, StoreError> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => StoreError::file(path, "no such file"),
        _ => StoreError::io(path, e),
    })?;
    if !meta.is_file() {
        // A run of `trace --rotate` is a directory: say which commands read
        // it whole and which file the others take.
        let newest = meta
            .is_dir()
            .then(|| crate::run::run_files(path).ok())
            .flatten()
            .and_then(|f| f.last().map(|(n, _)| crate::run::part_name(*n)));
        return Err(StoreError::file(
            path,
            match newest {
                Some(name) => format!(
                    "a run of `trace --rotate` (a directory): `stats`, `explain`, `memory`, `report` and `export` read \
                     it; give this command one of its files (the newest: {name})"
                ),
                None => "not a regular file".to_string(),
            },
        ));
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let uri = read_only_uri(path)?;
    let conn = Connection::open_with_flags(&uri, flags)
        .map_err(|e| StoreError::file(path, format!("cannot open as SQLite: {}", short(&e))))?;
    harden(&conn).at(path)?;
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_err(|e| StoreError::file(path, format!("not a valid SQLite database: {}", short(&e))))?;
    Ok(conn)
}

/// `file:` URI of `path` (absolute, every byte outside the unreserved set
/// percent-encoded), `immutable=1` unless a `-wal` with content is beside it.
fn read_only_uri(path: &Path) -> Result<String, StoreError> {
    use std::os::unix::ffi::OsStrExt;
    let abs = std::path::absolute(path).map_err(|e| StoreError::io(path, e))?;
    let mut uri = String::from("file:");
    for &b in abs.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str(if wal_has_content(&abs) {
        "?mode=ro"
    } else {
        "?immutable=1"
    });
    Ok(uri)
}

/// Whether a `-wal` with content is beside the database `path`: the file
/// is then read with it (not `immutable`), and a complete one left in WAL
/// mode (a reader held it as its tracer completed it) is folded by a
/// writer (`gpusleuth finish`).
pub fn wal_has_content(path: &Path) -> bool {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0)
}

pub(crate) fn harden(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    conn.execute_batch(
        "PRAGMA trusted_schema=OFF; PRAGMA cell_size_check=ON; PRAGMA mmap_size=0;",
    )?;
    Ok(())
}

/// SQLite's message without rusqlite's wrapping.
pub(crate) fn short(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(_, Some(msg)) => msg.clone(),
        rusqlite::Error::SqliteFailure(f, None) => f.to_string(),
        other => other.to_string(),
    }
}

/// Whether a table (or view) of that name exists.
pub(crate) fn has_table(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    in_schema(conn, "type IN ('table','view')", name)
}

/// Whether an index of that name exists.
pub(crate) fn has_index(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    in_schema(conn, "type = 'index'", name)
}

/// Whether the schema holds an object of that name whose type meets
/// `types` (a condition on `sqlite_master.type`).
fn in_schema(conn: &Connection, types: &str, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        &format!("SELECT count(*) FROM sqlite_master WHERE {types} AND name = ?1"),
        [name],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// The `meta` value stored under `key`, or None when the trace has none.
pub(crate) fn meta_value(conn: &Connection, key: &str) -> rusqlite::Result<Option<String>> {
    use rusqlite::OptionalExtension;
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()
}

/// Tests: the bytes of the database at `path` with the b-tree page type of
/// `table`'s root page overwritten (SQLite then calls the table damaged),
/// same size.
#[cfg(test)]
pub(crate) fn damaged_root(path: &Path, table: &str) -> Vec<u8> {
    let (root, page_size): (i64, i64) = {
        let c = Connection::open(path).expect("open");
        (
            c.query_row(
                "SELECT rootpage FROM sqlite_master WHERE name = ?1",
                [table],
                |r| r.get(0),
            )
            .expect("root"),
            c.query_row("PRAGMA page_size", [], |r| r.get(0))
                .expect("page size"),
        )
    };
    let mut bytes = std::fs::read(path).expect("read");
    bytes[((root - 1) * page_size) as usize] = 0x42;
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with a `waits` table (bulk) and a `notes` table (checked at
    /// open).
    fn two_tables(path: &Path) {
        let c = Connection::open(path).expect("create");
        c.execute_batch(
            "CREATE TABLE notes(text TEXT); CREATE TABLE waits(id INTEGER PRIMARY KEY, x TEXT);
             INSERT INTO notes VALUES ('n');
             WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 2000)
             INSERT INTO waits(x) SELECT printf('%.*c', 100, 'w') FROM r;",
        )
        .expect("fill");
    }

    /// Overwrites the b-tree page type of `table`'s root page (SQLite then
    /// calls the table damaged).
    fn damage_root(path: &Path, table: &str) {
        std::fs::write(path, super::damaged_root(path, table)).expect("write");
    }

    fn check(path: &Path) -> (Result<bool, StoreError>, Connection) {
        let conn = open_untrusted_unchecked(path).expect("open");
        let budget = ReadBudget::new(std::time::Duration::from_secs(30));
        (check_at_open_above(&conn, path, &budget, 0), conn)
    }

    /// Round 60's tester: random bytes over the `meta` table's page read
    /// "not a gpusleuth trace database"; the file is one, damaged.
    #[test]
    fn a_damaged_meta_table_is_called_damaged() {
        let dir = std::env::temp_dir().join(format!("gs-open-meta-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let db = dir.join("t.db");
        let example = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/h200-contention.db"
        );
        std::fs::copy(example, &db).expect("copy");
        std::fs::write(&db, damaged_root(&db, "meta")).expect("damage");
        let e = crate::Trace::open(&db).err().expect("refused").to_string();
        assert!(
            e.contains("SQLite database is damaged") && !e.contains("not a gpusleuth"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn large_files_check_bulk_tables_before_their_first_read_and_the_rest_at_open() {
        let dir = std::env::temp_dir().join(format!("gs-open-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let budget = ReadBudget::new(std::time::Duration::from_secs(30));

        let bulk = dir.join("bulk.db");
        two_tables(&bulk);
        damage_root(&bulk, "waits");
        let (deferred, conn) = check(&bulk);
        assert!(
            deferred.expect("the rest is intact"),
            "bulk tables deferred"
        );
        let e = crate::checked::Checks::default()
            .ensure_bulk(&conn, &bulk, &budget)
            .expect_err("damage found");
        assert!(e.to_string().contains("damaged"), "{e}");

        let other = dir.join("other.db");
        two_tables(&other);
        damage_root(&other, "notes");
        let e = check(&other).0.expect_err("damage found at open");
        assert!(e.to_string().contains("damaged"), "{e}");

        let intact = dir.join("intact.db");
        two_tables(&intact);
        let (deferred, conn) = check(&intact);
        assert!(deferred.expect("intact"));
        crate::checked::Checks::default()
            .ensure_bulk(&conn, &intact, &budget)
            .expect("intact");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn uri_escapes_everything_sqlite_would_parse() {
        let dir = std::env::temp_dir();
        let p = dir.join("a b?mode=rwc#x%.db");
        let uri = read_only_uri(&p).expect("uri");
        assert!(uri.starts_with("file:/"), "{uri}");
        assert!(
            uri.ends_with("a%20b%3Fmode%3Drwc%23x%25.db?immutable=1"),
            "{uri}"
        );
    }
}
