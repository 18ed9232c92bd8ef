//! pageable_copy over a run: each file's stored aggregates judged its
//! copies with the host ranges pinned in that file only, so a copy from
//! memory pinned in an earlier file was counted pageable. The run carries
//! the pinned ranges from file to file (`PinnedState`): every file's
//! pinning calls are replayed (a few rows), and a file whose copies were
//! judged pageable while ranges pinned earlier are live has its copies
//! judged again, streamed in end order as the writer fed them (memory: the
//! live ranges and a few examples).

use crate::stream::{CallQuery, Rows};
use crate::StoreError;
use sleuth_core::findings::inputs::{FindingInputs, PinnedState};

/// The pinned ranges the files read so far left live.
#[derive(Default)]
pub(crate) struct PinnedCarry {
    state: PinnedState,
}

impl PinnedCarry {
    /// The next file of the run (its calls under `rows`, its aggregates
    /// `inputs`, both of `pid` or all): re-judges its copies when needed,
    /// then carries the ranges it leaves live.
    pub(crate) fn file(
        &mut self,
        rows: &Rows,
        pid: Option<u32>,
        inputs: &mut FindingInputs,
    ) -> Result<(), StoreError> {
        let rejudge = !self.state.is_empty() && inputs.pageable_copies() > 0;
        let q = CallQuery {
            pid,
            ops: Some(crate::finding_rollups::pinned_replay_ops(rejudge)),
            ..Default::default()
        };
        let earlier = std::mem::take(&mut self.state);
        let (replay, _) = crate::scoped::replay_pinning(rows, q, earlier, |_| true)?;
        self.state = replay.pinned_state();
        if rejudge {
            inputs.replace_pageable(replay);
        }
        Ok(())
    }
}
