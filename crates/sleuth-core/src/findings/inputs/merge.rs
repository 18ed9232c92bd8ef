//! Adding the finding inputs of a later file of the same run (`trace
//! --rotate`) to an earlier one's, so `explain --db DIR` concludes over the
//! whole run from each file's stored aggregates (`sleuth_store::run_explain`).
//!
//! What adds up exactly: histograms of the same resolution (bucket counts
//! and split sums), sums and counts, processes, culprit sums per culprit,
//! each process's first and last call, and the example calls (the slowest
//! over all files; a tie goes to the earlier file's call, as row order
//! breaks it in one trace). What a file boundary cuts, following
//! `rollup::merge_thread_split`:
//! - a thread's window is the files' windows added: the time between its
//!   last call in one file and its first in the next belongs to neither;
//! - sync_stall's host time before a thread's first sync in a file counts
//!   from that file's first call of the thread, not from the last sync of
//!   the previous file.
//!
//! pageable_copy's pinned ranges are replayed per file when the file is
//! written; a run carries them from file to file ([`PinnedState`]) and
//! judges a file's copies again when ranges pinned earlier are live.

use super::{
    FindingInputs, LatencyHist, OpInputs, PageableInputs, PinnedRanges, Resolution, ThreadInputs,
    TopK,
};
use crate::rollup::merge_thread_splits;
use std::collections::HashMap;

/// Two aggregates whose histograms keep durations differently: adding
/// their buckets would mix keys of two kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolutionMismatch {
    pub mine: Resolution,
    pub later: Resolution,
}

impl std::fmt::Display for ResolutionMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "finding aggregates of different histogram resolutions ({:?} and {:?}) cannot be added",
            self.mine, self.later
        )
    }
}

impl std::error::Error for ResolutionMismatch {}

impl LatencyHist {
    /// Adds another histogram of the same resolution: bucket counts and
    /// splits add, the maximum is the larger.
    pub fn merge(&mut self, later: &LatencyHist) -> Result<(), ResolutionMismatch> {
        if self.res != later.res {
            return Err(ResolutionMismatch {
                mine: self.res,
                later: later.res,
            });
        }
        self.add_hist(later);
        Ok(())
    }
}

impl TopK {
    /// Keeps the `k` largest of both. A later file's call ranks after an
    /// earlier file's of equal key and order (the stable sort keeps the
    /// earlier list first): row ids only order calls within one file, so
    /// a merged list is final and takes no more offers.
    pub fn merge(&mut self, later: TopK) {
        self.k = self.k.max(later.k);
        self.kept.extend(later.kept);
        self.kept.sort_by_key(|(rank, _)| (rank.0, rank.1));
        self.kept.truncate(self.k);
    }
}

impl OpInputs {
    pub fn merge(&mut self, later: OpInputs) -> Result<(), ResolutionMismatch> {
        self.hist.merge(&later.hist)?;
        self.add_sums(&later);
        self.by_runnable.merge(later.by_runnable);
        self.by_dur.merge(later.by_dur);
        Ok(())
    }
}

impl PageableInputs {
    pub fn merge(&mut self, later: PageableInputs) {
        self.count = self.count.saturating_add(later.count);
        self.bytes = self.bytes.saturating_add(later.bytes);
        self.on_cpu = self.on_cpu.saturating_add(later.on_cpu);
        self.runnable = self.runnable.saturating_add(later.runnable);
        self.wall = self.wall.saturating_add(later.wall);
        self.h2d = self.h2d.saturating_add(later.h2d);
        self.d2h = self.d2h.saturating_add(later.d2h);
        self.pinned_copies = self.pinned_copies.saturating_add(later.pinned_copies);
        self.examples.merge(later.examples);
    }
}

impl ThreadInputs {
    pub fn merge(&mut self, later: ThreadInputs) -> Result<(), ResolutionMismatch> {
        self.launches.merge(&later.launches)?;
        self.launch_ns = self.launch_ns.saturating_add(later.launch_ns);
        self.overlap_ns = self.overlap_ns.saturating_add(later.overlap_ns);
        self.host_gaps.merge(&later.host_gaps)?;
        // Feeding state only: a merged aggregate takes no more calls.
        self.prev_end = later.prev_end.or(self.prev_end);
        self.pageable.merge(later.pageable);
        Ok(())
    }
}

impl FindingInputs {
    /// Adds the aggregates of a later file of the same run (see the module
    /// for what a file boundary cuts). The per-process op aggregates stay
    /// only when both kept them. Feeding calls after a merge is not
    /// supported: the pinned-range replay state is the later file's.
    pub fn merge(&mut self, later: FindingInputs) -> Result<(), ResolutionMismatch> {
        if self.res != later.res {
            return Err(ResolutionMismatch {
                mine: self.res,
                later: later.res,
            });
        }
        // One session: the same tracer; the later file's value is the last known.
        self.tracer = later.tracer.or(self.tracer);
        for (op, o) in later.ops {
            match self.ops.get_mut(&op) {
                Some(mine) => mine.merge(o)?,
                None => {
                    self.ops.insert(op, o);
                }
            }
        }
        self.add_threads_and_spans(later.threads, later.spans)?;
        merge_thread_splits(&mut self.splits, later.splits);
        crate::threads::sort_splits(&mut self.splits);
        self.process_ops = match (self.process_ops.take(), later.process_ops) {
            (Some(mut mine), Some(theirs)) => {
                for (key, o) in theirs {
                    match mine.get_mut(&key) {
                        Some(m) => m.merge(o)?,
                        None => {
                            mine.insert(key, o);
                        }
                    }
                }
                Some(mine)
            }
            _ => None,
        };
        self.pinned = later.pinned;
        Ok(())
    }

    /// Adds the aggregates of other threads of the same trace, fed from
    /// the same start (`with_pinned`) by another reader of the same scope
    /// (`sleuth_store`'s threads read side by side): as if their calls had
    /// been added here. Histograms and sums add, examples keep the best
    /// ranks of both compared by row index (the lists sequential offers
    /// would keep), threads and splits join, spans widen. Unlike
    /// [`FindingInputs::merge`], feeding calls afterwards is supported: the
    /// pinned ranges are the common start's (a pass adds no range: pinning
    /// calls are replayed in end order after it).
    pub fn add_other_threads(&mut self, other: FindingInputs) -> Result<(), ResolutionMismatch> {
        if self.res != other.res {
            return Err(ResolutionMismatch {
                mine: self.res,
                later: other.res,
            });
        }
        self.tracer = self.tracer.or(other.tracer);
        let res = self.res;
        for (op, o) in other.ops {
            match self.ops.get_mut(&op) {
                Some(mine) => mine.add_same_trace(&o),
                None => {
                    self.ops.insert(op, o);
                }
            }
        }
        self.add_threads_and_spans(other.threads, other.spans)?;
        self.splits.extend(other.splits);
        crate::threads::sort_splits(&mut self.splits);
        if let (Some(mine), Some(theirs)) = (&mut self.process_ops, other.process_ops) {
            for (key, o) in theirs {
                mine.entry(key)
                    .or_insert_with(|| OpInputs::new(res))
                    .add_same_trace(&o);
            }
        }
        for (pid, ranges) in other.pinned {
            self.pinned.entry(pid).or_insert(ranges);
        }
        Ok(())
    }

    /// Adds other aggregates' threads (a thread in both merged as a later
    /// file's) and processes' spans (widened).
    fn add_threads_and_spans(
        &mut self,
        threads: HashMap<(u32, u32), ThreadInputs>,
        spans: HashMap<u32, (u64, u64)>,
    ) -> Result<(), ResolutionMismatch> {
        for (key, t) in threads {
            match self.threads.get_mut(&key) {
                Some(mine) => mine.merge(t)?,
                None => {
                    self.threads.insert(key, t);
                }
            }
        }
        for (pid, (first, last)) in spans {
            let e = self.spans.entry(pid).or_insert((first, last));
            e.0 = e.0.min(first);
            e.1 = e.1.max(last);
        }
        Ok(())
    }

    /// Copies judged pageable, over every thread.
    pub fn pageable_copies(&self) -> u64 {
        self.threads
            .values()
            .fold(0u64, |a, t| a.saturating_add(t.pageable.count))
    }

    /// The pinned host ranges live after the calls fed in end order.
    pub fn pinned_state(&self) -> PinnedState {
        PinnedState(self.pinned.clone())
    }

    /// Starts the pinned-range replay from `state` (ranges pinned before
    /// the first call fed: a run's earlier files).
    pub fn with_pinned(mut self, state: PinnedState) -> FindingInputs {
        self.pinned = state.0;
        self
    }

    /// Puts the pageable-copy aggregates of `judged` (the same calls fed
    /// again in end order, from a [`PinnedState`] that knows more) in place
    /// of this one's, thread by thread.
    pub fn replace_pageable(&mut self, judged: FindingInputs) {
        let mut judged = judged.threads;
        for (key, t) in &mut self.threads {
            t.pageable = judged.remove(key).map(|j| j.pageable).unwrap_or_default();
        }
        // A thread with copies and nothing else stored (none in practice: every copy is a call).
        self.threads.extend(judged);
    }
}

/// Pinned host ranges per process, carried from one file of a run to the
/// next: memory pinned in one file and copied from in a later one is
/// pinned there too.
#[derive(Debug, Clone, Default)]
pub struct PinnedState(HashMap<u32, PinnedRanges>);

impl PinnedState {
    /// Whether no process has a pinned range live.
    pub fn is_empty(&self) -> bool {
        self.0.values().all(|r| r.live.is_empty())
    }

    /// The live ranges as (pid, start, end exclusive), by pid then start:
    /// what a file stores for the next one (`sleuth_store`'s run carry).
    pub fn ranges(&self) -> Vec<(u32, u64, u64)> {
        let mut out: Vec<(u32, u64, u64)> = self
            .0
            .iter()
            .flat_map(|(&pid, r)| r.live.iter().map(move |(&s, &e)| (pid, s, e)))
            .collect();
        out.sort_unstable();
        out
    }

    /// The state of `ranges` ([`Self::ranges`]' shape); a start at or past
    /// its end is no range.
    pub fn from_ranges(ranges: impl IntoIterator<Item = (u32, u64, u64)>) -> PinnedState {
        let mut state = PinnedState::default();
        for (pid, start, end) in ranges {
            if start < end {
                state.0.entry(pid).or_default().live.insert(start, end);
            }
        }
        state
    }

    /// How many ranges are live, over every process.
    pub fn range_count(&self) -> usize {
        self.0.values().map(|r| r.live.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decompose::Split;
    use crate::event::{CallEvent, Culprit};

    /// Calls of two processes and two threads each, with culprits and
    /// runnable time, in start order; their global index is their position.
    fn calls() -> Vec<(CallEvent, Vec<Culprit>)> {
        let ops = [
            "cudaMemcpy",
            "cudaLaunchKernel",
            "cudaMalloc",
            "cudaStreamSynchronize",
        ];
        crate::testing::noisy_calls(0x51ed_270b_27a2_b0a7, 400, &ops, 2)
    }

    fn fed<'a>(
        calls: impl Iterator<Item = (usize, &'a (CallEvent, Vec<Culprit>))>,
    ) -> FindingInputs {
        let mut f = FindingInputs::new(Resolution::Bucketed, None).keep_process_ops();
        for (i, (c, k)) in calls {
            f.add_call(i, c, k);
        }
        f
    }

    /// Everything an op aggregate concludes from, buckets included (they
    /// are not serialized).
    fn op_view(o: &OpInputs) -> (String, Vec<(u64, u64, Split)>, u64) {
        (
            serde_json::to_string(o).unwrap(),
            o.hist.buckets().collect(),
            o.hist.percentile(100).unwrap_or(0),
        )
    }

    fn thread_view(t: &ThreadInputs) -> (Vec<(u64, u64, Split)>, u64, u64, String) {
        (
            t.launches.buckets().collect(),
            t.launches.count(),
            t.launch_ns,
            serde_json::to_string(&t.pageable).unwrap(),
        )
    }

    /// A trace cut in two at any time and merged gives the whole trace's
    /// op aggregates (examples, culprits and percentiles included), spans,
    /// launches and per-process ops.
    #[test]
    fn two_halves_merged_equal_the_whole() {
        let all = calls();
        let whole = fed(all.iter().enumerate());
        for cut in [1_000, 150_000, 200_500, 399_000] {
            let mut merged = fed(all.iter().enumerate().filter(|(_, (c, _))| c.ts_ns < cut));
            let later = fed(all.iter().enumerate().filter(|(_, (c, _))| c.ts_ns >= cut));
            merged.merge(later).unwrap();
            assert_eq!(
                merged.ops.keys().collect::<Vec<_>>(),
                whole.ops.keys().collect::<Vec<_>>()
            );
            for (op, o) in &whole.ops {
                assert_eq!(op_view(&merged.ops[op]), op_view(o), "cut {cut} op {op}");
                assert_eq!(merged.ops[op].culprits(), o.culprits(), "cut {cut} op {op}");
            }
            let (mp, wp) = (
                merged.process_ops.as_ref().unwrap(),
                whole.process_ops.as_ref().unwrap(),
            );
            assert_eq!(mp.len(), wp.len());
            for (key, o) in wp {
                assert_eq!(op_view(&mp[key]), op_view(o), "cut {cut} {key:?}");
            }
            let mut spans: Vec<_> = merged.spans.iter().collect();
            let mut want: Vec<_> = whole.spans.iter().collect();
            spans.sort();
            want.sort();
            assert_eq!(spans, want, "cut {cut}");
            assert_eq!(merged.threads.len(), whole.threads.len());
            for (key, t) in &whole.threads {
                let m = &merged.threads[key];
                assert_eq!(thread_view(m), thread_view(t), "cut {cut} {key:?}");
                // Every sync is counted; only the boundary's host gap differs.
                assert_eq!(m.host_gaps.count(), t.host_gaps.count());
            }
        }
    }

    #[test]
    fn an_example_tie_goes_to_the_earlier_file() {
        let ex = |index| super::super::Example {
            index,
            call: CallEvent::default(),
            culprits: Vec::new(),
        };
        let mut early = TopK::new(2);
        early.offer(5, 0, 40, || ex(40));
        early.offer(9, 0, 41, || ex(41));
        // Row ids restart in each file: the later file's row 3 ties with key 5.
        let mut later = TopK::new(2);
        later.offer(5, 0, 3, || ex(3));
        later.offer(1, 0, 4, || ex(4));
        early.merge(later);
        let kept: Vec<usize> = early.examples().map(|e| e.index).collect();
        assert_eq!(kept, vec![41, 40]);
    }

    #[test]
    fn histograms_of_different_resolutions_are_refused() {
        let mut a = FindingInputs::new(Resolution::Exact, None);
        let b = FindingInputs::new(Resolution::Bucketed, None);
        let e = a.merge(b).unwrap_err();
        assert!(e.to_string().contains("cannot be added"), "{e}");
        let mut h = LatencyHist::new(Resolution::Exact);
        assert!(h.merge(&LatencyHist::new(Resolution::Bucketed)).is_err());
    }
}
