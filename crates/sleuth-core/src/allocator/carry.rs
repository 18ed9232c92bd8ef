//! One process's allocator replay carried across the files of a run by the
//! tracer (`trace --rotate --torch-allocator`, `sleuth_store::run_allocator`).
//!
//! Each file's completion pushes the process's steps of that file (its
//! memory calls and allocator events in replay order; every step of a
//! file before every step of the next, as a reader's pass over the run's
//! files gives them) and takes the views a reader of the whole run would
//! rebuild by passes over every file: at the end, and at the moment its
//! fragmentation finding describes. What is carried is bounded by what is
//! live (the replay's blocks and segments, its ledger without history,
//! the requests that failed), and, until the process's layout is known,
//! its steps (at most [`MAX_PENDING_STEPS`]).
//!
//! Exact or nothing: where the carried state cannot give the view a
//! reader's replay gives, it says so, and the reader replays the process:
//! - the calibration over every step so far must keep the layout the
//!   replay started with;
//! - a moment's view is the replay of the steps that completed by then: it
//!   is made in the file holding the moment only when every earlier step
//!   completed by it, and kept for later files only while none of their
//!   steps completed by it. The views kept are those at the moments a
//!   later finding may describe (the reserved peak so far, the first
//!   failed request the gap could have served), so a finding that
//!   switches from the end to an earlier peak finds its view.

use super::{named_view, AllocatorView, Calibration, Calibrator, Layout, Replay, Step};
use super::{BlockEvent, CallEvent, StepSource};
use crate::ops::OpClass;
use crate::TraceData;
use std::collections::BTreeMap;

/// Steps kept while a process's layout is not known (about 200 bytes
/// each): past them the process is carried no further.
pub const MAX_PENDING_STEPS: usize = 16_384;

/// Whether a call changes what a process's allocator view replays (its
/// segments, its reserved bytes, its failed requests): a process with
/// such a call in an earlier file than its first allocator event is not
/// carried (its replay would start without it).
pub fn shapes_allocator_view(c: &CallEvent) -> bool {
    c.info().is_some_and(|i| {
        matches!(
            i.class,
            OpClass::DeviceAlloc | OpClass::PhysCreate | OpClass::VirtualMap
        )
    })
}

#[derive(Clone)]
enum OwnedStep {
    Call(CallEvent),
    Block(BlockEvent),
}

impl OwnedStep {
    fn of(s: Step<'_>) -> OwnedStep {
        match s {
            Step::Call(c) => OwnedStep::Call(c.clone()),
            Step::Block(b) => OwnedStep::Block(b.clone()),
        }
    }

    fn step(&self) -> Step<'_> {
        match self {
            OwnedStep::Call(c) => Step::Call(c),
            OwnedStep::Block(b) => Step::Block(b),
        }
    }
}

/// One process's replay over the files completed so far.
#[derive(Clone)]
pub struct CarriedReplay {
    pid: u32,
    calibrator: Calibrator,
    /// None until the calibration finds a layout (the steps wait in
    /// `pending` meanwhile). Its ledger counts a moment's reserved bytes.
    replayed: Option<Replay>,
    pending: Vec<OwnedStep>,
    /// More steps came before the layout was known than `pending` keeps.
    overflowed: bool,
    /// The replay as the current file began.
    at_begin: Option<Replay>,
    /// The latest completion of the steps of earlier files.
    before_max_end: Option<u64>,
    /// The earliest and latest completion of the current file's steps.
    file_ends: Option<(u64, u64)>,
    /// The views at the moments a later finding may describe (the
    /// reserved peak, the first failed request the gap could have served),
    /// by time. Boxed: a view is ~470 bytes and a map node holds eleven
    /// values inline, a 5 KB node for the one or two views a process
    /// keeps (7.8 MiB of ~1,000 processes carried: round 54, heaptrack).
    kept: BTreeMap<u64, Box<AllocatorView>>,
}

/// What the end of a file gives of one process.
pub struct FileViews {
    /// Its view at the end of the file (of the run so far).
    pub end: AllocatorView,
    /// Its view at the moment its fragmentation finding describes (a
    /// failure, the reserved peak); None when it describes the end or
    /// there is none.
    pub moment: Option<(u64, AllocatorView)>,
    /// False when that moment's view cannot be had from what is carried
    /// (a reader replays the process).
    pub complete: bool,
}

impl CarriedReplay {
    pub fn new(pid: u32) -> CarriedReplay {
        CarriedReplay {
            pid,
            calibrator: Calibrator::default(),
            replayed: None,
            pending: Vec::new(),
            overflowed: false,
            at_begin: None,
            before_max_end: None,
            file_ends: None,
            kept: BTreeMap::new(),
        }
    }

    /// Before the steps of the next file (`source` gives them): for a
    /// process whose layout is not known yet, a pass of its own calibrates
    /// over the steps so far and the file's, so that the replay starts
    /// before the file's steps are pushed (a process's first file holds
    /// far more steps than are kept waiting). Err (why) when the process
    /// can be carried no further.
    pub fn begin_file(&mut self, source: &dyn StepSource) -> Result<(), String> {
        // Once steps were dropped waiting, no replay can start: the end's
        // calibration says whether the process is carried further.
        if self.replayed.is_none() && !self.overflowed {
            let mut calibrator = self.calibrator.clone();
            source.for_each_step(self.pid, None, &mut |s| {
                calibrator.push(s);
                true
            });
            if let Some(layout) = calibrator.finish().layout() {
                self.start(layout)?;
            }
        }
        self.at_begin = self.replayed.clone();
        self.file_ends = None;
        Ok(())
    }

    /// The replay as the current file began (after [`Self::begin_file`])
    /// and the latest completion of the earlier files' steps: a reader at
    /// a moment in this file from then on takes the state up and replays
    /// the file's steps up to the moment. None before the replay started.
    pub fn begin_state(&self) -> Option<(super::RebuildState, Option<u64>)> {
        let r = self.at_begin.as_ref()?;
        Some((r.blocks.state(), self.before_max_end))
    }

    /// Starts the replay with `layout`, replaying the steps kept waiting.
    fn start(&mut self, layout: Layout) -> Result<(), String> {
        if self.overflowed {
            return Err(format!(
                "more than {MAX_PENDING_STEPS} steps came before its layout was known"
            ));
        }
        let mut r = Replay::carried(layout, self.pid);
        for s in self.pending.drain(..) {
            r.push(s.step());
        }
        self.pending = Vec::new();
        self.replayed = Some(r);
        Ok(())
    }

    /// The process's next step of the current file.
    pub fn push(&mut self, s: Step<'_>) {
        self.calibrator.push(s);
        let end = s.end_ns();
        self.file_ends = Some(match self.file_ends {
            None => (end, end),
            Some((lo, hi)) => (lo.min(end), hi.max(end)),
        });
        match self.replayed.as_mut() {
            Some(r) => r.push(s),
            None if self.pending.len() < MAX_PENDING_STEPS => self.pending.push(OwnedStep::of(s)),
            None => self.overflowed = true,
        }
    }

    /// [`Self::push`], then Err(entries) when the carry now holds more
    /// than `max_entries` (its replay and the views it keeps, as
    /// [`Self::end_file`] counts them): the tracer drops the process then,
    /// so that what it carries is bounded at every step of a file, not only
    /// at the file's end (a process keeping 250,000 blocks live grew its
    /// table to ~30 MB, computed, before its file ended).
    pub fn push_within(&mut self, s: Step<'_>, max_entries: usize) -> Result<(), usize> {
        self.push(s);
        match self.bounded_entries() {
            n if n > max_entries => Err(n),
            _ => Ok(()),
        }
    }

    /// Entries held (live blocks, segments, failed requests, live
    /// allocations, steps waiting): what bounds the carried state.
    pub fn held_entries(&self) -> usize {
        let begin = self
            .at_begin
            .as_ref()
            .map_or(0, |r| r.blocks.held_entries());
        self.bounded_entries() + begin
    }

    /// [`Self::held_entries`] less the replay as the file began: what the
    /// tracer's bound counts after each step and at a file's end.
    fn bounded_entries(&self) -> usize {
        let kept: usize = self.kept.values().map(|v| view_entries(v)).sum();
        self.carried_entries() + kept
    }

    /// [`Self::held_entries`] less the replay as the file began and the
    /// views kept: what the end of a file keeps besides the views it makes.
    fn carried_entries(&self) -> usize {
        let replayed = self.replayed.as_ref().map_or(0, Replay::held_entries);
        replayed + self.calibrator.held_entries() + self.pending.len()
    }

    /// The views after the current file's steps; `reserved_bytes` is the
    /// process's live device bytes then (the run's ledger); `source` gives
    /// the current file's steps again for a moment's view. Err (why) when
    /// the process can be carried no further, also when what it would hold
    /// after the file ([`Self::held_entries`]) is past `max_entries`:
    /// known before the end's view (its carried replay alone) and before
    /// each moment's view is made (a replay's entries are its view's), so
    /// that a process the tracer drops anyway holds no moment's view
    /// beside its end view and its carried replay.
    pub fn end_file(
        &mut self,
        source: &dyn StepSource,
        reserved_bytes: u64,
        max_entries: usize,
    ) -> Result<FileViews, String> {
        let too_many = |n: usize| {
            format!(
                "its replay held {n} blocks, segments, requests and views (counted until past the bound), \
                 more than the {max_entries} the tracer carries"
            )
        };
        let calibration = self.calibrator.clone().finish();
        let layout = calibration.layout();
        if let (None, Some(l)) = (self.replayed.as_ref(), layout) {
            // Not reached when `begin_file` calibrated over the same steps.
            self.start(l)?;
        }
        if self
            .replayed
            .as_ref()
            .is_some_and(|r| Some(r.blocks.layout) != layout)
        {
            return Err(
                "its calibration over the run no longer finds the layout its replay started with"
                    .into(),
            );
        }
        let mut held = self.carried_entries();
        if held > max_entries {
            return Err(too_many(held));
        }
        let state = self
            .replayed
            .as_ref()
            .map(|r| r.blocks.state_now(reserved_bytes));
        let end = named_view(self.pid, calibration.clone(), state, &TraceData::default());
        // The views at the moments a finding may describe, now or after
        // later files: kept while no later step completed by them, else
        // replayed from the file's start when every earlier step had.
        let trigger = end
            .state
            .as_ref()
            .and_then(crate::findings::fragmentation_moment);
        let mut wanted = end
            .state
            .as_ref()
            .map(crate::findings::fragmentation_moments_kept)
            .unwrap_or_default();
        wanted.extend(trigger);
        wanted.sort_unstable();
        wanted.dedup();
        let mut old = std::mem::take(&mut self.kept);
        for ts in wanted {
            let room = max_entries
                .checked_sub(held)
                .ok_or_else(|| too_many(held))?;
            let unchanged = self.file_ends.is_none_or(|(lo, _)| lo > ts);
            let view = match old.remove(&ts) {
                Some(v) if unchanged => Some(*v),
                _ => self
                    .moment_in_file(source, ts, &calibration, room)
                    .map_err(|n| too_many(held + n))?,
            };
            if let Some(mut v) = view {
                held += view_entries(&v);
                // The calibration over every step, as a reader's.
                v.calibration = calibration.clone();
                self.kept.insert(ts, Box::new(v));
            }
        }
        if held > max_entries {
            return Err(too_many(held));
        }
        let (moment, complete) = match trigger {
            None => (None, true),
            Some(ts) => match self.kept.get(&ts) {
                Some(v) => (Some((ts, AllocatorView::clone(v))), true),
                None => (None, false),
            },
        };
        if let Some((_, hi)) = self.file_ends {
            self.before_max_end = self.before_max_end.max(Some(hi));
        }
        self.at_begin = None;
        Ok(FileViews {
            end,
            moment,
            complete,
        })
    }

    /// The view at `ts`, a moment after every step of the earlier files
    /// completed: the replay as the file began, then the file's steps that
    /// completed by it. None when an earlier step completed after it, or
    /// when the replay began in this file from earlier files' steps;
    /// Err(entries) when the view would hold more than `room` entries
    /// (then it is not made).
    fn moment_in_file(
        &self,
        source: &dyn StepSource,
        ts: u64,
        calibration: &Calibration,
        room: usize,
    ) -> Result<Option<AllocatorView>, usize> {
        if self.before_max_end.is_some_and(|m| m > ts) {
            return Ok(None);
        }
        let Some(layout) = calibration.layout() else {
            return Ok(None);
        };
        if self.at_begin.is_none() && self.before_max_end.is_some() {
            return Ok(None);
        }
        // The carried replay's blocks live since before `ts` are live in
        // the view at `ts`: past the room, no replay is made (its table
        // would be as large as the carried one's).
        let at_least = self
            .replayed
            .as_ref()
            .map_or(0, |r| r.live_blocks_since_by(ts));
        if at_least > room {
            return Err(at_least);
        }
        let mut r = match &self.at_begin {
            Some(r) => r.clone(),
            None => Replay::carried(layout, self.pid),
        };
        // About as many blocks as the carried replay holds now: one table,
        // not the doublings' old and new ones side by side beside it (a
        // table sized to `room` doubles past it when the moment holds more).
        r.reserve_live(self.replayed.as_ref().map_or(0, Replay::live_blocks));
        source.for_each_step(self.pid, Some(ts), &mut |s| {
            r.push(s);
            true
        });
        // The view's entries, known before it is made: one segment per
        // segment replayed, one block per live one, the failed requests.
        let n = r.blocks.held_entries();
        if n > room {
            return Err(n);
        }
        Ok(Some(named_view(
            self.pid,
            calibration.clone(),
            Some(r.finish()),
            &TraceData::default(),
        )))
    }
}

/// Entries a kept view holds: its segments, live blocks and failed requests.
fn view_entries(v: &AllocatorView) -> usize {
    v.state.as_ref().map_or(0, |s| {
        s.segments.len() + s.live_blocks as usize + s.failures.len()
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::Sim;
    use super::super::{view_replayed, KnownViews};
    use super::*;
    use crate::ledger::LedgerBuilder;
    use crate::testing::{xorshift, FilesInOrder};

    const PID: u32 = 7;

    /// A random workload of one process cut into `files` files, the events
    /// of a band before each cut sent to the next file at random.
    fn random_run(seed: u64, files: usize) -> Vec<TraceData> {
        const MIB: u64 = 1 << 20;
        let mut next = xorshift(seed);
        let mut sim = Sim::torch();
        let mut segs = Vec::new();
        let mut live: Vec<u64> = Vec::new();
        for step in 0..700u64 {
            let r = next();
            match r % 10 {
                0..=3 if !live.is_empty() => {
                    let b = live.swap_remove((r >> 8) as usize % live.len());
                    sim.free(b);
                }
                4 if step % 3 == 0 => sim.failed_request(40 * MIB + (r >> 12) % MIB),
                _ => {
                    let block = 0x10_0000 + step * 0x40;
                    let req = 1 + (r >> 16) % (3 * MIB / 2);
                    sim.malloc_carved(&mut segs, step, block, req);
                    live.push(block);
                }
            }
        }
        let data = sim.data();
        let last = data
            .calls
            .iter()
            .map(CallEvent::end_ns)
            .chain(data.blocks.iter().map(|b| b.end_ns))
            .max()
            .unwrap();
        let cuts: Vec<u64> = (1..files as u64).map(|k| last * k / files as u64).collect();
        let band = last / (files as u64 * 4);
        let mut file_of = |end: u64| {
            let k = cuts.partition_point(|&c| c <= end);
            let straddles = k < cuts.len() && end + band >= cuts[k] && next().is_multiple_of(2);
            k + usize::from(straddles)
        };
        let mut out = vec![TraceData::default(); files];
        for c in &data.calls {
            out[file_of(c.end_ns())].calls.push(c.clone());
        }
        for b in &data.blocks {
            out[file_of(b.end_ns)].blocks.push(b.clone());
        }
        out
    }

    fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
        serde_json::to_value(v).unwrap()
    }

    #[test]
    fn carried_views_are_those_replayed_over_the_files_so_far() {
        let (mut kept_checked, mut moments, mut lost) = (0, 0, 0);
        for seed in 1..=40u64 {
            let files = random_run(seed * 0x9e37_79b9, 2 + (seed % 4) as usize);
            let mut carry = CarriedReplay::new(PID);
            let mut counter = LedgerBuilder::new(None);
            for k in 0..files.len() {
                let file = &files[k..=k];
                carry.begin_file(&FilesInOrder(file)).unwrap();
                FilesInOrder(file).for_each_step(PID, None, &mut |s| {
                    carry.push(s);
                    if let Step::Call(c) = s {
                        counter.push(c);
                    }
                    true
                });
                let Ok(v) =
                    carry.end_file(&FilesInOrder(file), counter.live_bytes(PID), usize::MAX)
                else {
                    // A straddling segment changed the run's calibration:
                    // carried no further (a reader replays the process).
                    lost += 1;
                    break;
                };
                let so_far = FilesInOrder(&files[..=k]);
                let none = std::collections::BTreeMap::new();
                let want = KnownViews::until(&so_far, &TraceData::default(), &[PID], None, &none);
                let what = format!("seed {seed}, file {k}");
                assert_eq!(json(&v.end), json(&want.end()[&PID]), "{what}: end");
                if v.complete {
                    let want_moment = want
                        .moments()
                        .iter()
                        .next()
                        .map(|(&(_, t), v)| (t, json(v)));
                    assert_eq!(
                        v.moment.map(|(t, m)| (t, json(&m))),
                        want_moment,
                        "{what}: moment"
                    );
                    moments += usize::from(want_moment_is_some(&want));
                }
                for (&ts, view) in &carry.kept {
                    let cal = v.end.calibration.clone();
                    let replayed =
                        view_replayed(&so_far, &TraceData::default(), PID, Some(ts), cal);
                    assert_eq!(json(view), json(&replayed), "{what}: kept at {ts}");
                    kept_checked += 1;
                }
            }
        }
        assert!(
            kept_checked > 50 && moments > 20 && lost < 12,
            "{kept_checked} kept, {moments} moments, {lost} lost"
        );
    }

    /// One carried run of `files` under `max_entries`, each step pushed
    /// as the tracer pushes it (`push_within`): per file, what its end gave
    /// (its views as JSON, or the error), what the carry held after it and
    /// the most it held after a step of it.
    fn carried_under(
        files: &[TraceData],
        max_entries: usize,
    ) -> Vec<(Result<String, String>, usize, usize)> {
        let mut carry = CarriedReplay::new(PID);
        let mut counter = LedgerBuilder::new(None);
        let mut out = Vec::new();
        let past = |n: usize| format!("{n} held: more than the {max_entries} the tracer carries");
        for k in 0..files.len() {
            let file = FilesInOrder(&files[k..=k]);
            if let Err(e) = carry.begin_file(&file) {
                out.push((Err(e), 0, 0));
                break;
            }
            let (mut most, mut over) = (0, None);
            file.for_each_step(PID, None, &mut |s| {
                over = carry.push_within(s, max_entries).err();
                most = most.max(carry.bounded_entries());
                if let Step::Call(c) = s {
                    counter.push(c);
                }
                over.is_none()
            });
            if let Some(n) = over {
                out.push((Err(past(n)), 0, most));
                break;
            }
            let v = carry.end_file(&file, counter.live_bytes(PID), max_entries);
            let v = v.map(|v| json(&(v.end, v.moment, v.complete)).to_string());
            let stop = v.is_err();
            out.push((v, carry.held_entries(), most));
            if stop {
                break;
            }
        }
        out
    }

    /// The tracer drops a process whose carry holds more than the bound
    /// after a step of a file or at its end (`sleuth_store::run_allocator`);
    /// `push_within` says so at that step and `end_file` before that file's
    /// views, exactly then, and otherwise each gives what it gives
    /// unbounded. Mutation: the check before the end's view, or the
    /// push's, off by one fails it (a moment's check only spares memory: a
    /// view past the room is refused after the loop too).
    #[test]
    fn the_bound_stops_a_file_exactly_when_the_carry_would_hold_more() {
        let (mut stopped, mut at_the_edge, mut by_a_step) = (0, 0, 0);
        for seed in 1..=24u64 {
            let files = random_run(seed * 0x2545_f491, 2 + (seed % 3) as usize);
            let free = carried_under(&files, usize::MAX);
            for (k, (v, held, most)) in free.iter().enumerate() {
                if v.is_err() {
                    break;
                }
                let edges = [*held, *most].map(|h| [h.saturating_sub(1), h, h + 1]);
                for max in edges.into_iter().flatten() {
                    let bounded = carried_under(&files, max);
                    for (j, (got, got_held, got_most)) in bounded.iter().enumerate() {
                        let (want, want_held, want_most) = &free[j];
                        let what = format!("seed {seed}, file {j}, bound {max}");
                        // Dropped by a step of the file: whatever its end
                        // would have said (also a layout that changed).
                        if *want_most > max || (*want_held > max && want.is_ok()) {
                            let e = got.as_ref().expect_err(&what);
                            assert!(
                                e.contains(&format!("more than the {max} the tracer carries")),
                                "{what}: {e}"
                            );
                            stopped += 1;
                            at_the_edge += usize::from(j == k && max + 1 == *held);
                            by_a_step += usize::from(e.contains(" held: "));
                            break;
                        }
                        assert_eq!(got, want, "{what}");
                        assert_eq!((got_held, got_most), (want_held, want_most), "{what}");
                    }
                }
            }
        }
        assert!(
            stopped > 40 && at_the_edge > 10 && by_a_step > 10,
            "{stopped} stopped, {at_the_edge} at the edge, {by_a_step} by a step"
        );
    }

    /// `first` and what `all` holds after it: two files of one run.
    fn two_files(first: TraceData, all: TraceData) -> [TraceData; 2] {
        let second = TraceData {
            calls: all.calls[first.calls.len()..].to_vec(),
            blocks: all.blocks[first.blocks.len()..].to_vec(),
            ..Default::default()
        };
        [first, second]
    }

    /// A view kept from an earlier file (no step of this file completed by
    /// its moment) is not made again, and counts toward the bound too.
    #[test]
    fn a_view_kept_from_an_earlier_file_counts_toward_the_bound() {
        let base = super::super::tests::BASE;
        let mut sim = Sim::torch_with_segment(64 << 20);
        for i in 0..20u64 {
            sim.malloc(0x1_0000 + i, base + i * 4096, 4096, 4000);
        }
        let first = sim.data();
        for i in 20..25u64 {
            sim.malloc(0x1_0000 + i, base + i * 4096, 4096, 4000);
        }
        let files = two_files(first, sim.data());
        let free = carried_under(&files, usize::MAX);
        assert!(free.iter().all(|(v, ..)| v.is_ok()), "{free:?}");
        let held = free[1].1;
        let bounded = carried_under(&files, held - 1);
        assert_eq!(bounded[0], free[0]);
        let e = bounded[1].0.as_ref().expect_err("past the bound");
        assert!(e.contains("the tracer carries"), "{e}");
    }

    /// A process with `frees` block frees (no sample for the calibration)
    /// in its first file and well-formed mallocs in its second: carried on
    /// when the frees were kept waiting, not when more came than are kept.
    fn after_frees(frees: u64) -> Result<FileViews, String> {
        let mut sim = Sim::torch_with_segment(64 << 20);
        for i in 0..frees {
            let words = [0; crate::event::BLOCK_WORDS];
            sim.block_event("DeviceCachingAllocator::free", 0x9000 + i, None, words);
        }
        let first = sim.data();
        for i in 0..50u64 {
            let base = super::super::tests::BASE;
            sim.malloc(0x1_0000 + i, base + i * 4096, 4096, 4000);
        }
        let files = two_files(first, sim.data());
        let mut carry = CarriedReplay::new(PID);
        let mut last = None;
        for k in 0..files.len() {
            let file = FilesInOrder(&files[k..=k]);
            carry.begin_file(&file)?;
            file.for_each_step(PID, None, &mut |s| {
                carry.push(s);
                true
            });
            last = Some(carry.end_file(&file, 64 << 20, usize::MAX)?);
        }
        Ok(last.expect("two files"))
    }

    #[test]
    fn steps_kept_waiting_for_a_layout_are_bounded() {
        let v = after_frees(100).unwrap();
        let state = v.end.state.expect("a replay once calibrated");
        assert_eq!(state.counts.mallocs, 50);
        assert_eq!(state.counts.unmatched_frees, 100);
        let err = after_frees(MAX_PENDING_STEPS as u64 + 1)
            .err()
            .expect("carried no further");
        assert!(err.contains("came before its layout was known"), "{err}");
    }

    fn want_moment_is_some(k: &KnownViews) -> bool {
        !k.moments().is_empty()
    }
}
