//! Which processes a human listing of many (a node agent's run) shows in
//! full and which it sums up: `memory`'s text and the report's memory
//! section split them the same way; `--json` lists every one.

use sleuth_core::ledger::{self, ProcessLedger};

/// Past this many processes a listing shows in full only those that matter
/// now (see [`split_for_text`]).
const FULL_PROCESSES: usize = 16;

/// The processes summed up that are listed a line each (the highest peaks).
pub const BRIEF_LINES: usize = 10;

/// Which processes are rendered in full and which are summed up
/// (`ledger::notable_first` with [`FULL_PROCESSES`]).
pub fn split_for_text(processes: &[ProcessLedger]) -> (Vec<&ProcessLedger>, Vec<&ProcessLedger>) {
    ledger::notable_first(processes, FULL_PROCESSES)
}
