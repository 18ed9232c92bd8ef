//! A run's allocator-view steps (`trace --rotate --torch-allocator`): each
//! finished file's (`FileSteps`: its memory calls in return order merged
//! with its allocator events), file after file, oldest first, read again
//! at each pass, so that the views over a whole run hold no allocator
//! event and no memory call of it (before round 31 the run's readers
//! loaded every one of them: ~250 bytes per allocator event).
//!
//! The calibration and the replay are carried from file to file because
//! they are one pass over this source. A process's steps are in replay
//! order within each file; across a rotation, every step of a file comes
//! before every step of the next one, even one of the next file that
//! completed a little earlier (events of two CPUs reaching the writer on
//! either side of the rotation): the order the tracer recorded them in.
//!
//! Each pass opens each file again (its checks taken from the memo the run
//! was read with): a run may hold more files than a process may keep open.
//! The first read error ends every later pass and is kept for the caller.

use crate::checked::CheckMemo;
use crate::file_steps::FileSteps;
use crate::reader::Trace;
use crate::stream::{MemoryTrace, Rows};
use crate::{ReadBudget, StoreError};
use sleuth_core::allocator::{Layout, Step, StepSource};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// What a run's views guess before their passes: the layout each
/// process's stored views were calibrated to (the first file's that
/// stored one), so that one pass both calibrates and replays
/// (`sleuth_core::allocator::allocator_views_guessed`); and the processes
/// with allocator events in the files listed.
#[derive(Default)]
pub(crate) struct Guesses {
    pub(crate) pids: BTreeSet<u32>,
    pub(crate) layouts: BTreeMap<u32, Layout>,
}

impl Guesses {
    /// Adds one file read through `view`; its processes with allocator
    /// events are listed when `listed` (else only their layouts are taken).
    pub(crate) fn add(&mut self, view: &MemoryTrace, listed: bool) -> Result<(), StoreError> {
        if listed {
            self.pids.extend(view.block_pids().iter().copied());
        }
        if view
            .block_pids()
            .iter()
            .any(|p| !self.layouts.contains_key(p))
        {
            for (pid, layout) in view.stored_layouts()? {
                self.layouts.entry(pid).or_insert(layout);
            }
        }
        Ok(())
    }

    /// The processes listed, in order.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.pids.iter().copied().collect()
    }
}

pub(crate) struct RunSteps<'a> {
    files: &'a [PathBuf],
    budget: &'a ReadBudget,
    memo: &'a CheckMemo,
    failed: RefCell<Option<StoreError>>,
}

impl<'a> RunSteps<'a> {
    /// The steps of `files` (a run's, oldest first), each read under
    /// `budget` with the checks it passed taken from `memo`.
    pub(crate) fn new(files: &'a [PathBuf], budget: &'a ReadBudget, memo: &'a CheckMemo) -> Self {
        RunSteps {
            files,
            budget,
            memo,
            failed: RefCell::new(None),
        }
    }

    /// The first read error of any pass, if one failed.
    pub(crate) fn into_result(self) -> Result<(), StoreError> {
        match self.failed.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Visits process `pid`'s steps of one file that completed by `until`;
    /// Ok(false) once `visit` asked for no more.
    fn file_steps(
        &self,
        path: &std::path::Path,
        pid: u32,
        until: Option<u64>,
        visit: &mut dyn FnMut(Step<'_>) -> bool,
    ) -> Result<bool, StoreError> {
        let trace = Trace::open_remembered(path, self.budget.clone(), self.memo)?;
        let rows = Rows::open_with(&trace, self.budget.clone())?;
        let steps = FileSteps::read(&rows);
        let mut more = true;
        steps.for_each_step(pid, until, &mut |s| {
            more = visit(s);
            more
        });
        steps.into_result().map(|()| more)
    }
}

impl StepSource for RunSteps<'_> {
    fn for_each_step(&self, pid: u32, until: Option<u64>, visit: &mut dyn FnMut(Step<'_>) -> bool) {
        for path in self.files {
            if self.failed.borrow().is_some() {
                return;
            }
            match self.file_steps(path, pid, until, visit) {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    self.failed.borrow_mut().get_or_insert(e);
                    return;
                }
            }
        }
    }
}
