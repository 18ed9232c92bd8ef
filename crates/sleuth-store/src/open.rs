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

/// Checks the file under the connection's budget: an error when SQLite
/// finds it damaged or the check could not finish.
pub(crate) fn integrity_check(
    conn: &Connection,
    path: &Path,
    budget: &ReadBudget,
) -> Result<(), StoreError> {
    let stopped = |e: &rusqlite::Error| match budget.stop_reason() {
        Some(why) => StoreError::file(path, format!("integrity check stopped: {why}")),
        None => StoreError::file(
            path,
            format!("damaged or not a valid SQLite database: {}", short(e)),
        ),
    };
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(u64::MAX);
    let pragma = if size <= FULL_CHECK_BYTES {
        "PRAGMA integrity_check(1)"
    } else {
        "PRAGMA quick_check(1)"
    };
    let verdict: String = conn
        .query_row(pragma, [], |r| r.get(0))
        .map_err(|e| stopped(&e))?;
    if verdict != "ok" {
        return Err(StoreError::file(
            path,
            format!("SQLite database is damaged: {verdict}"),
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
        return Err(StoreError::file(path, "not a regular file"));
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
    let mut wal = abs.into_os_string();
    wal.push("-wal");
    let wal_has_content = std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0);
    uri.push_str(if wal_has_content {
        "?mode=ro"
    } else {
        "?immutable=1"
    });
    Ok(uri)
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

#[cfg(test)]
mod tests {
    use super::*;

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
