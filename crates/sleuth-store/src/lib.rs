//! gpusleuth's trace database: one SQLite file per trace session.
//!
//! - [`TraceWriter`] creates a database (mode 0600, WAL) and writes events
//!   from a writer thread in batched transactions, under a size cap.
//! - [`Trace`] opens one read-only, as untrusted input, and loads it as
//!   [`sleuth_core::TraceData`] or piecewise for big traces.
//! - [`run_readonly_sql`] runs caller-supplied SQL in a sandbox.
//! - [`import_ingero`] converts an Ingero database.
//! - [`outfile`] writes other outputs (reports, exports) atomically, never over an input.
//!
//! The schema is documented in `docs/schema.md`.

pub mod allocator_checkpoints;
mod allocator_raw;
mod allocator_rollup;
mod allocator_rows;
mod block_bases;
mod budget;
mod call_blocks;
mod call_groups;
mod check_cache;
mod check_plan;
mod checked;
pub mod disk_reserve;
mod error;
pub mod file_clock;
mod file_steps;
#[doc(hidden)]
pub use file_steps::passes_by_threads_for_tests;
mod finalize;
pub mod finish;
mod thread_pass;
mod thread_windows;
pub use finalize::COMPLETION_CPU_STAT;
pub mod finding_rollups;
mod import;
mod json_column;
pub mod lean;
mod ledger_feed;
mod ledger_rollup;
mod merge;
mod open;
pub mod outfile;
mod packed_calls;
mod problems;
mod reader;
pub mod report_reads;
mod return_order;
mod rows;
pub mod run;
pub mod run_allocator;
pub mod run_explain;
pub mod run_ledger;
mod run_pinned;
pub mod run_report;
mod run_steps;
pub mod run_window;
mod schema;
mod schema_check;

/// The text of `call_rows` and `waits` before version 6, for the tests
/// that make an older file out of a fresh one (readers accept only this
/// text for those versions).
#[doc(hidden)]
pub mod older_tables {
    pub const CALL_ROWS_V5: &str = crate::schema::CALL_ROWS_V5;
    pub const WAITS_V5: &str = crate::schema::WAITS_V5;
}
mod scope_feed;
mod scope_rollups;
pub mod scoped;
pub mod site_rollup;
mod split_read;
mod sql;
mod sqlite_config;
mod stacks;
mod start_order;
pub use start_order::ByStart;
mod step_feed;
mod stored_json;
pub mod stream;
mod types;
mod wait_groups;
mod wait_stream;
pub mod whole_stats;
pub mod window;
pub mod window_growth;
mod writer;

pub use budget::{ReadBudget, DEFAULT_READ_TIMEOUT};
pub use check_cache::CACHE_DIR_ENV;
pub use checked::CheckMemo;
pub use error::StoreError;
pub use import::{import_ingero, ImportSummary};
pub use merge::{input_facts, write_merged, InputFacts, MergeInput};
pub use open::wal_has_content;
pub use problems::InputProblems;
pub use reader::{pids_held, Trace};
pub use schema::{SCHEMA_VERSION, TOOL};
pub use sql::{
    run_readonly_sql, run_readonly_sql_remembered, run_readonly_sql_with, SqlLimits, SqlResult,
    BLOB_HEX_KEY, MAX_VALUE_BYTES,
};
pub use sqlite_config::turn_off_memory_statistics;
pub use types::{
    CallFilter, CallOrder, LibraryInfo, MergeNode, Note, NoteLevel, Session, SessionInfo,
    StoredCall, TraceSource, WaitFilter, WriteSummary, WriterOptions, DEFAULT_MAX_DB_BYTES,
};
pub use writer::{drop_stat_name, monotonic_now_ns, release_freed_heap, TraceWriter, WriterHandle};

/// Files the unit tests read.
#[cfg(test)]
pub(crate) mod test_files {
    /// The repository's example trace `name` (`examples/`).
    pub(crate) fn example(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(name)
    }

    /// A trace of this build's schema at `path` holding `events`, completed
    /// by its writer.
    pub(crate) fn written_with(
        path: &std::path::Path,
        events: impl IntoIterator<Item = sleuth_core::Event>,
    ) {
        let w =
            crate::TraceWriter::create(path, crate::SessionInfo::for_tests(), Default::default())
                .expect("writer");
        let h = w.handle();
        for e in events {
            h.send(e).expect("send");
        }
        drop(h);
        w.finish().expect("finish");
    }
}
