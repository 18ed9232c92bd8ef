//! Opening database files we did not just write, as untrusted input.
//!
//! Read-only flag (not `mode=ro`, not `query_only`), no URI parsing, schema
//! not trusted (no functions with side effects from views or triggers),
//! cell sizes checked, no memory mapping, and `quick_check` before anything
//! else reads the file, so a corrupt or hostile file yields an error.

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

/// The same hardening without the (size-proportional) integrity check, for
/// the SQL sandbox, which runs many small queries under a time limit; the
/// header is still read, so a non-SQLite file fails here.
pub(crate) fn open_untrusted_unchecked(path: &Path) -> Result<Connection, StoreError> {
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => StoreError::file(path, "no such file"),
        _ => StoreError::io(path, e),
    })?;
    if !meta.is_file() {
        return Err(StoreError::file(path, "not a regular file"));
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| StoreError::file(path, format!("cannot open as SQLite: {}", short(&e))))?;
    harden(&conn).at(path)?;
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_err(|e| StoreError::file(path, format!("not a valid SQLite database: {}", short(&e))))?;
    Ok(conn)
}

fn harden(conn: &Connection) -> rusqlite::Result<()> {
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
    conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type IN ('table','view') AND name = ?1",
        [name],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}
