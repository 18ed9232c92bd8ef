//! The checks of the trace files this run reads, shared with earlier and
//! later runs through the user's cache (`sleuth_store::CheckMemo::on_disk`):
//! on a 10M-call trace the checks of an untrusted file cost seconds, and a
//! user asks several questions about one file in a row.

use sleuth_store::{CheckMemo, ReadBudget, StoreError, Trace, DEFAULT_READ_TIMEOUT};
use std::path::Path;
use std::sync::OnceLock;

static MEMO: OnceLock<CheckMemo> = OnceLock::new();

/// This run's memo, loaded from the cache on first use.
pub fn memo() -> &'static CheckMemo {
    MEMO.get_or_init(CheckMemo::on_disk)
}

/// Opens a trace as [`Trace::open`] does, without the checks it passed in
/// an earlier run while it stayed the same.
pub fn open(path: &Path) -> Result<Trace, StoreError> {
    Trace::open_remembered(path, budget(), memo())
}

/// The budget a command's reads run under ([`DEFAULT_READ_TIMEOUT`]).
pub fn budget() -> ReadBudget {
    ReadBudget::new(DEFAULT_READ_TIMEOUT)
}

/// Saves what this run's checks passed (when it read a trace at all).
pub fn save() {
    if let Some(m) = MEMO.get() {
        m.save();
    }
}
