//! gpusleuth's trace database: one SQLite file per trace session.
//!
//! - [`TraceWriter`] creates a database (mode 0600, WAL) and writes events
//!   from a writer thread in batched transactions, under a size cap.
//! - [`Trace`] opens one read-only, as untrusted input, and loads it as
//!   [`sleuth_core::TraceData`] or piecewise for big traces.
//! - [`run_readonly_sql`] runs caller-supplied SQL in a sandbox.
//! - [`import_ingero`] converts an Ingero database.
//!
//! The schema is documented in `docs/schema.md`.

mod error;
mod finalize;
mod import;
mod open;
mod reader;
mod rows;
mod schema;
mod sql;
mod stacks;
mod types;
mod writer;

pub use error::StoreError;
pub use import::{import_ingero, ImportSummary};
pub use reader::Trace;
pub use schema::{SCHEMA_VERSION, TOOL};
pub use sql::{run_readonly_sql, SqlLimits, SqlResult};
pub use types::{
    CallFilter, CallOrder, LibraryInfo, Note, NoteLevel, Session, SessionInfo, StoredCall,
    TraceSource, WaitFilter, WriteSummary, WriterOptions, DEFAULT_MAX_DB_BYTES,
};
pub use writer::{drop_stat_name, monotonic_now_ns, TraceWriter, WriterHandle};
