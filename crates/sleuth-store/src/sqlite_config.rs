//! Process-wide SQLite settings a command chooses before its first connection.
//!
//! SQLite counts every allocation it makes under a global mutex (its
//! "memory statistics", `SQLITE_CONFIG_MEMSTATUS`), which is what enforces
//! the hard heap limit the SQL sandbox sets (`sql.rs`). The tracer runs no
//! caller's SQL, and the counting was a tenth of its writer's CPU per
//! stored event (2-vCPU VM, `scripts/tracer_ab.py`, round 20): `trace`
//! turns it off for its own process. The sandbox refuses to run in a
//! process that did, so the heap limit can never be silently absent.

use std::sync::atomic::{AtomicBool, Ordering};

static MEMORY_STATISTICS_OFF: AtomicBool = AtomicBool::new(false);

/// Turns SQLite's memory statistics off for this process; false (nothing
/// changed) once SQLite is initialized, i.e. after the first connection.
pub fn turn_off_memory_statistics() -> bool {
    // SAFETY: sqlite3_config only changes SQLite's global configuration and
    // fails with SQLITE_MISUSE, changing nothing, once SQLite is
    // initialized; MEMSTATUS takes one int argument, as passed.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_config(
            rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS,
            0 as std::os::raw::c_int,
        )
    };
    let off = rc == rusqlite::ffi::SQLITE_OK;
    if off {
        MEMORY_STATISTICS_OFF.store(true, Ordering::SeqCst);
    }
    off
}

/// Whether SQLite counts its allocations in this process (its heap limit holds).
pub(crate) fn memory_statistics_on() -> bool {
    !MEMORY_STATISTICS_OFF.load(Ordering::SeqCst)
}
