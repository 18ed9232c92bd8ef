//! One error type for the store; every message names the file it concerns.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database (or its input) could not be used: missing, corrupt, not ours.
    #[error("{}: {msg}", path.display())]
    File { path: PathBuf, msg: String },
    /// SQLite refused an operation on a database we opened.
    #[error("{}: {}", path.display(), sqlite_text(source))]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    /// A read-only SQL statement was refused or failed.
    #[error("query refused: {0}")]
    Query(String),
    /// The writer thread stopped (its error, if any, is reported by `finish`).
    #[error("trace writer stopped: {0}")]
    WriterGone(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A read in start order that went straight through the reorder buffer
    /// (`ByStart::Speculate`) met a call the buffer cannot put in place:
    /// the caller takes back what it wrote and reads again
    /// (`ByStart::ProveFirst`). Not a fault of the file.
    #[error("{}: its calls lie too far from start order for the reorder buffer", path.display())]
    OutOfReach { path: PathBuf },
}

/// SQLite's error as a reader says it: a value the readers refused as
/// damage (`finding_rollups::damaged_table` and its kin carry their
/// message as the cause of a conversion failure) without rusqlite's
/// "Conversion error from type .. at index: ..," before it.
fn sqlite_text(e: &rusqlite::Error) -> String {
    if let rusqlite::Error::FromSqlConversionFailure(_, _, inner) = e {
        let text = inner.to_string();
        if text.starts_with("damaged trace:") {
            return text;
        }
    }
    e.to_string()
}

impl StoreError {
    pub(crate) fn file(path: &Path, msg: impl Into<String>) -> Self {
        StoreError::File {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        StoreError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Attaches a path to rusqlite results.
pub(crate) trait SqlContext<T> {
    fn at(self, path: &Path) -> Result<T, StoreError>;
}

impl<T> SqlContext<T> for rusqlite::Result<T> {
    fn at(self, path: &Path) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        })
    }
}
