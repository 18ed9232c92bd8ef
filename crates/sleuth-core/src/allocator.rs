//! PyTorch's caching allocator rebuilt from outside: which blocks are live
//! (allocated, the counterpart of `torch.cuda.memory_allocated()`), inside
//! which CUDA segments (reserved), and so where the gap reserved − allocated
//! sits and why `empty_cache()` cannot give it back (a segment, or a mapped
//! page of an expandable segment, is released only when entirely free).
//!
//! Input: the `Block` words of `DeviceCachingAllocator::malloc` (read at
//! return), `::free` (read at entry, before neighbours are merged, so the
//! freed block's ptr and size are those handed out) and `::release_block`
//! events, plus the process's CUDA calls. Field offsets inside `Block` are
//! calibrated from the data (see `calibrate`); the reconstruction refuses to
//! answer when they cannot be. Reserved bytes come from the ledger; the
//! segments found here must add up to them, and any mismatch is reported as
//! an inconsistency rather than hidden.
//!
//! Pools: a segment is in the small pool when it is exactly 2 MiB and every
//! block overlapping it is ≤ 1 MiB (PyTorch serves requests ≤ 1 MiB from
//! 2 MiB segments and larger ones from segments of 20 MiB or more, or from
//! 20 MiB pages when expandable); otherwise it is in the large pool.

#[cfg(test)]
mod assemble_tests;
mod calibrate;
mod carry;
mod live_blocks;
mod resume;
mod segments;
#[cfg(test)]
pub(crate) mod tests;

pub use calibrate::{calibrate, Calibration, Calibrator, Layout, BLOCK_ROUNDING, MIN_AGREEMENT};
pub use carry::{shapes_allocator_view, CarriedReplay, FileViews, MAX_PENDING_STEPS};
pub use resume::RebuildState;
pub use segments::SegmentKind;

use crate::data::TraceData;
use crate::event::{BlockEvent, CallEvent};
use crate::ledger::{ProcessLedger, Ptr};
use crate::ops::{op_by_id, OpClass};
use live_blocks::LiveBlocks;
use segments::SegmentMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::num::NonZeroU64;

/// Segment size of PyTorch's small pool (`kSmallBuffer`).
pub const SMALL_SEGMENT_BYTES: u64 = 2 << 20;
/// Largest block of the small pool (`kSmallSize`).
pub const SMALL_BLOCK_MAX_BYTES: u64 = 1 << 20;

/// One event of a process in replay order.
#[derive(Clone, Copy)]
pub enum Step<'a> {
    Call(&'a CallEvent),
    Block(&'a BlockEvent),
}

impl Step<'_> {
    pub fn end_ns(&self) -> u64 {
        match self {
            Step::Call(c) => c.end_ns(),
            Step::Block(b) => b.end_ns,
        }
    }
}

/// One process's memory calls and allocator events in replay order: by
/// completion time, calls first at equal times (a segment is created
/// inside the malloc that uses it), calls of equal completion by start,
/// allocator events of equal completion as stored. Walked once per pass
/// (a view takes two: calibration, then the replay), so that a source can
/// stream them from a file rather than hold them (`sleuth_store`).
pub trait StepSource {
    /// Calls `visit` with each step of process `pid` in replay order that
    /// completed by `until` (every step when None) until it returns false:
    /// a source reading a file reads no later step.
    fn for_each_step(&self, pid: u32, until: Option<u64>, visit: &mut dyn FnMut(Step<'_>) -> bool);
}

/// A loaded trace: its calls (in load order) and allocator events.
impl StepSource for TraceData {
    fn for_each_step(&self, pid: u32, until: Option<u64>, visit: &mut dyn FnMut(Step<'_>) -> bool) {
        for s in steps_of(self, pid) {
            if until.is_some_and(|u| s.end_ns() > u) || !visit(s) {
                return;
            }
        }
    }
}

/// The process's calls and allocator events by completion time; at equal
/// times calls go first (a segment is created inside the malloc that uses it).
fn steps_of(data: &TraceData, pid: u32) -> Vec<Step<'_>> {
    let mut steps: Vec<Step<'_>> = data
        .calls
        .iter()
        .filter(|c| c.pid == pid)
        .map(Step::Call)
        .chain(data.blocks.iter().filter(|b| b.pid == pid).map(Step::Block))
        .collect();
    steps.sort_by_key(|s| (s.end_ns(), matches!(s, Step::Block(_))));
    steps
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    Small,
    Large,
}

/// A block handed out and not yet freed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveBlock {
    /// The `Block*` (key of malloc/free pairs).
    pub block: Ptr,
    pub ptr: Ptr,
    /// Rounded size (what `memory_allocated()` counts).
    pub size: u64,
    pub requested: u64,
    /// When the malloc returned (monotonic ns).
    pub since_ns: u64,
    /// Call site of the malloc (a stack id), when captured. The capture
    /// writes 0 for none (`record.rs`), so a stored 0 reads as none too and
    /// the id takes 8 bytes, not 16: a view holds every live block (500,000
    /// live blocks at the tracer's peak: 4 MB, round 40).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "stack_id_or_none"
    )]
    pub stack_id: Option<NonZeroU64>,
    /// The line (or native function) that asked for the block, when captured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<SiteLabel>,
}

fn stack_id_or_none<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<NonZeroU64>, D::Error> {
    Ok(Option::<u64>::deserialize(d)?.and_then(NonZeroU64::new))
}

/// A live block's site label behind one pointer: 8 bytes in the block
/// where a `Box<str>` takes 16 (a view holds every live block, and the
/// tracer's views name none: 500,000 live blocks, 4 MB at its peak, round
/// 40). Reads and writes as the string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SiteLabel(Box<Box<str>>);

impl From<String> for SiteLabel {
    fn from(s: String) -> SiteLabel {
        SiteLabel(Box::new(s.into_boxed_str()))
    }
}

impl std::ops::Deref for SiteLabel {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SiteLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

/// One live segment with the blocks in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub base: Ptr,
    pub size: u64,
    pub kind: SegmentKind,
    pub pool: Pool,
    pub since_ns: u64,
    /// An allocator block has used it; false: some other library's memory.
    pub allocator_owned: bool,
    /// Live blocks overlapping it, by address (see `AllocatorView::trimmed`).
    pub live_blocks: Vec<LiveBlock>,
    /// How many live blocks overlap it (also when `live_blocks` was trimmed).
    pub live_block_count: u64,
    /// Bytes of live blocks inside it.
    pub live_bytes: u64,
    /// `size − live_bytes`: cached but unused.
    pub free_bytes: u64,
    /// Why `empty_cache()` can or cannot release it.
    pub why: String,
}

/// Reserved and allocated bytes of one pool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolBytes {
    pub segments: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pools {
    pub small: PoolBytes,
    pub large: PoolBytes,
}

/// Allocator totals at one moment of the replay (reserved: the allocator's
/// own segments).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moment {
    pub ts_ns: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub gap_bytes: i64,
}

/// An allocation that failed: at the allocator (malloc returned no block)
/// or at CUDA level (a segment could not be created).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedRequest {
    pub op: &'static str,
    pub bytes: u64,
    #[serde(flatten)]
    pub at: Moment,
}

/// A [`FailedRequest`] as read back (a trace's allocator rollup,
/// `sleuth_store`): its op named by a name this build knows.
#[derive(Deserialize)]
struct StoredFailedRequest {
    op: String,
    bytes: u64,
    #[serde(flatten)]
    at: Moment,
}

// By hand: a derive would ask the input to live for `'static` because of
// the `&'static str` field.
impl<'de> Deserialize<'de> for FailedRequest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = StoredFailedRequest::deserialize(d)?;
        Ok(FailedRequest {
            op: crate::ledger::known_op(&f.op).map_err(serde::de::Error::custom)?,
            bytes: f.bytes,
            at: f.at,
        })
    }
}

/// Event counts of the replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockCounts {
    pub mallocs: u64,
    pub frees: u64,
    pub segment_releases: u64,
    pub failed_mallocs: u64,
    /// Frees of a `Block*` not live in the trace (allocated before tracing).
    pub unmatched_frees: u64,
    /// Bytes of those blocks, read from each block's own size field at its
    /// free: what the trace recovers of allocations made before it began
    /// (their allocation time and requested size stay unknown).
    pub unmatched_free_bytes: u64,
    /// A malloc returned a `Block*` still live: its free was lost.
    pub reused_live_blocks: u64,
    /// Frees whose block pointer differed from the one handed out.
    pub free_ptr_mismatches: u64,
}

/// The rebuilt allocator state of one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorState {
    /// Σ size of live blocks: `torch.cuda.memory_allocated()`.
    pub allocated_bytes: u64,
    /// Σ requested size of live blocks.
    pub requested_bytes: u64,
    /// `allocated − requested`: rounding to 512 B and unsplit remainders.
    pub rounding_bytes: u64,
    /// Live device memory from the ledger (every CUDA-level allocation).
    pub reserved_bytes: u64,
    /// Of those, segments the allocator used: `torch.cuda.memory_reserved()`.
    pub allocator_reserved_bytes: u64,
    /// Live device memory no allocator block ever used (other libraries).
    pub outside_allocator_bytes: u64,
    /// `allocator_reserved − allocated`: PyTorch's `memory_reserved() − memory_allocated()`.
    pub gap_bytes: i64,
    /// Σ segment free bytes of allocator segments pinned by live blocks:
    /// what `empty_cache()` cannot release.
    pub pinned_free_bytes: u64,
    /// Σ size of allocator segments with no live block: `empty_cache()` releases them.
    pub releasable_bytes: u64,
    /// `gap − Σ free bytes of the allocator's segments`: 0 when everything is accounted for.
    pub unexplained_bytes: i64,
    pub live_blocks: u64,
    pub pools: Pools,
    /// Segments by address (see `AllocatorView::trimmed`).
    pub segments: Vec<Segment>,
    /// How many live segments there are (also when `segments` was trimmed).
    pub segment_count: u64,
    /// The allocator's reserved peak (after a block event) and the gap then.
    pub peak: Option<Moment>,
    pub failures: Vec<FailedRequest>,
    pub counts: BlockCounts,
    /// Expandable segments (`cuMemMap`ped ranges) in use.
    pub expandable: bool,
    /// What does not add up, in words.
    pub inconsistencies: Vec<String>,
}

/// Calibration plus the state when the layout was recognised.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllocatorView {
    pub pid: u32,
    pub calibration: Calibration,
    #[serde(flatten)]
    pub state: Option<AllocatorState>,
}

/// An [`AllocatorView`] as a trace stores it (`sleuth_store`'s allocator
/// rollup): its state a member of its own rather than flattened into the
/// view, so that reading it back tells an absent state (the layout was not
/// recognised) from a damaged one.
#[derive(Debug, Serialize, Deserialize)]
pub struct StoredView {
    pub pid: u32,
    pub calibration: Calibration,
    pub state: Option<AllocatorState>,
}

/// [`StoredView`]'s serialization of a view, borrowed.
#[derive(Serialize)]
pub struct StoredViewRef<'a> {
    pid: u32,
    calibration: &'a Calibration,
    state: &'a Option<AllocatorState>,
}

impl From<StoredView> for AllocatorView {
    fn from(v: StoredView) -> Self {
        AllocatorView {
            pid: v.pid,
            calibration: v.calibration,
            state: v.state,
        }
    }
}

impl AllocatorView {
    /// The view as a trace stores it ([`StoredView`]).
    pub fn to_stored(&self) -> StoredViewRef<'_> {
        StoredViewRef {
            pid: self.pid,
            calibration: &self.calibration,
            state: &self.state,
        }
    }

    /// The line to show when the state could not be rebuilt.
    pub fn refusal(&self) -> Option<String> {
        if self.state.is_some() {
            return None;
        }
        Some(format!(
            "allocator layout not recognised: {}; showing the CUDA-level view",
            self.calibration
                .reason
                .as_deref()
                .unwrap_or("unknown reason")
        ))
    }

    /// A bounded copy for compact outputs (MCP): the `max_segments` segments
    /// with the most free bytes, each with at most `max_blocks` blocks (the
    /// largest). Totals and counts are unchanged.
    pub fn trimmed(&self, max_segments: usize, max_blocks: usize) -> AllocatorView {
        let mut v = self.clone();
        if let Some(s) = v.state.as_mut() {
            s.segments
                .sort_by(|a, b| b.free_bytes.cmp(&a.free_bytes).then(a.base.cmp(&b.base)));
            s.segments.truncate(max_segments);
            for g in &mut s.segments {
                g.live_blocks
                    .sort_by(|a, b| b.size.cmp(&a.size).then(a.ptr.cmp(&b.ptr)));
                g.live_blocks.truncate(max_blocks);
            }
        }
        v
    }
}

/// Allocator views of every process with allocator events, by pid, at the
/// end or at `at_ns` (same semantics as the ledger's). `ledgers` must be the
/// ledger of the same data at the same moment (reserved bytes come from it).
pub fn allocator_views(
    data: &TraceData,
    at_ns: Option<u64>,
    ledgers: &[ProcessLedger],
) -> BTreeMap<u32, AllocatorView> {
    let pids = pids_with_blocks(&data.blocks);
    allocator_views_of(data, data, &pids, at_ns, ledgers, &BTreeMap::new())
}

/// The processes of `blocks` (allocator events), each once, in order.
pub fn pids_with_blocks(blocks: &[BlockEvent]) -> Vec<u32> {
    let mut pids: Vec<u32> = blocks.iter().map(|b| b.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// [`allocator_views`] of processes `pids` (those with allocator events),
/// their steps from `source`; `data` names the sites of their blocks
/// (its stacks). `calibrations` are those known already (a trace's stored
/// views': the calibration reads every step whatever the moment, so the
/// end's is every moment's); the others take a pass of their own.
pub fn allocator_views_of(
    source: &dyn StepSource,
    data: &TraceData,
    pids: &[u32],
    at_ns: Option<u64>,
    ledgers: &[ProcessLedger],
    calibrations: &BTreeMap<u32, Calibration>,
) -> BTreeMap<u32, AllocatorView> {
    by_pid(pids, ledgers, |pid, reserved| {
        match calibrations.get(&pid) {
            Some(cal) => allocator_view_calibrated(source, data, pid, at_ns, reserved, cal.clone()),
            None => allocator_view_of(source, data, pid, at_ns, reserved),
        }
    })
}

/// The view `view` makes of each of `pids` given its reserved bytes (its
/// ledger's live bytes in `ledgers`, 0 without one), by pid.
fn by_pid(
    pids: &[u32],
    ledgers: &[ProcessLedger],
    view: impl Fn(u32, u64) -> AllocatorView,
) -> BTreeMap<u32, AllocatorView> {
    pids.iter()
        .map(|&pid| {
            let reserved = crate::ledger::live_bytes_of(ledgers, pid);
            (pid, view(pid, reserved))
        })
        .collect()
}

/// [`allocator_views_of`] with each process's layout guessed beforehand
/// (`guesses`: the layout its trace's parts were calibrated to, such as a
/// run's files' stored views): one pass both calibrates the process over
/// every step and replays its blocks with the guess; the view is that
/// replay when the calibration found the guessed layout, else (or without
/// a guess) the calibration's own replay, a second pass. The views are
/// [`allocator_views_of`]'s whatever the guesses.
pub fn allocator_views_guessed(
    source: &dyn StepSource,
    data: &TraceData,
    pids: &[u32],
    at_ns: Option<u64>,
    ledgers: &[ProcessLedger],
    guesses: &BTreeMap<u32, Layout>,
) -> BTreeMap<u32, AllocatorView> {
    by_pid(pids, ledgers, |pid, reserved| {
        let guess = guesses.get(&pid).copied();
        view_guessed(source, data, pid, at_ns, Reserved::Known(reserved), guess)
    })
}

/// [`allocator_view_of`] in one pass when `guess` is the layout the
/// calibration finds (see [`allocator_views_guessed`]).
fn view_guessed(
    source: &dyn StepSource,
    data: &TraceData,
    pid: u32,
    at_ns: Option<u64>,
    reserved: Reserved,
    guess: Option<Layout>,
) -> AllocatorView {
    let Some(layout) = guess else {
        let calibration = calibrate(source, pid);
        return view_with(source, data, pid, at_ns, calibration, reserved);
    };
    let mut calibrator = Calibrator::default();
    let mut replay = Replay::new(layout, pid, at_ns, reserved);
    // The calibration reads every step whatever the moment; the replay
    // those that completed by it (a prefix: steps come in completion order).
    source.for_each_step(pid, None, &mut |s| {
        calibrator.push(s);
        if at_ns.is_none_or(|at| s.end_ns() <= at) {
            replay.push(s);
        }
        true
    });
    let calibration = calibrator.finish();
    if calibration.layout() == Some(layout) {
        return named_view(pid, calibration, Some(replay.finish()), data);
    }
    view_with(source, data, pid, at_ns, calibration, reserved)
}

/// The allocator view of one process; `reserved_bytes` is its ledger's live bytes at that moment.
pub fn allocator_view(
    data: &TraceData,
    pid: u32,
    at_ns: Option<u64>,
    reserved_bytes: u64,
) -> AllocatorView {
    allocator_view_of(data, data, pid, at_ns, reserved_bytes)
}

/// Where an explanation's allocator views come from: a loaded trace
/// rebuilds them from its calls and allocator events; a reader of a file
/// gives [`KnownViews`], rebuilt beforehand from the file without holding
/// its calls.
pub trait AllocatorReads {
    /// The views at the end of the processes with allocator events;
    /// `ledgers` are the processes' ledgers at the end.
    fn views(&self, ledgers: &[ProcessLedger]) -> BTreeMap<u32, AllocatorView>;
    /// Process `pid`'s view at `ts`, reserved bytes from its ledger then
    /// (None when not known).
    fn view_at(&self, pid: u32, ts: u64) -> Option<AllocatorView>;
}

impl AllocatorReads for TraceData {
    fn views(&self, ledgers: &[ProcessLedger]) -> BTreeMap<u32, AllocatorView> {
        allocator_views(self, None, ledgers)
    }

    fn view_at(&self, pid: u32, ts: u64) -> Option<AllocatorView> {
        let cal = calibrate(self, pid);
        Some(view_replayed(self, self, pid, Some(ts), cal))
    }
}

/// The views an explanation reads, rebuilt ahead from a [`StepSource`]:
/// those at the end and, for each one whose fragmentation finding
/// describes another moment (a failure, the reserved peak), the view then.
#[derive(Debug, Clone, Default)]
pub struct KnownViews {
    end: BTreeMap<u32, AllocatorView>,
    moments: BTreeMap<(u32, u64), AllocatorView>,
}

impl KnownViews {
    /// The views of the processes with allocator events in `data` (which
    /// also names their blocks' sites), their steps from `source`;
    /// `ledgers` are the end's.
    pub fn of(source: &dyn StepSource, data: &TraceData, ledgers: &[ProcessLedger]) -> KnownViews {
        Self::of_pids(source, data, &pids_with_blocks(&data.blocks), ledgers)
    }

    /// [`KnownViews::of`] the processes `pids` (those with allocator events).
    pub fn of_pids(
        source: &dyn StepSource,
        data: &TraceData,
        pids: &[u32],
        ledgers: &[ProcessLedger],
    ) -> KnownViews {
        let calibrations = pids.iter().map(|&p| (p, calibrate(source, p))).collect();
        Self::of_calibrated(source, data, calibrations, ledgers)
    }

    /// [`KnownViews::of_pids`], the views at the end rebuilt with each
    /// process's layout guessed ([`allocator_views_guessed`]): one pass
    /// for each when the guess is right, where `of_pids` takes two.
    pub fn of_pids_guessed(
        source: &dyn StepSource,
        data: &TraceData,
        pids: &[u32],
        ledgers: &[ProcessLedger],
        guesses: &BTreeMap<u32, Layout>,
    ) -> KnownViews {
        let end = allocator_views_guessed(source, data, pids, None, ledgers, guesses);
        Self::with_moments(source, data, end)
    }

    /// [`KnownViews::of_pids`] the processes of `calibrations`, each
    /// calibrated already: one pass per view.
    fn of_calibrated(
        source: &dyn StepSource,
        data: &TraceData,
        calibrations: BTreeMap<u32, Calibration>,
        ledgers: &[ProcessLedger],
    ) -> KnownViews {
        let live = |pid| crate::ledger::live_bytes_of(ledgers, pid);
        let end: BTreeMap<u32, AllocatorView> = calibrations
            .into_iter()
            .map(|(pid, cal)| {
                let view = allocator_view_calibrated(source, data, pid, None, live(pid), cal);
                (pid, view)
            })
            .collect();
        let moments = end
            .values()
            .filter_map(|v| moment_view(source, data, v))
            .collect();
        KnownViews { end, moments }
    }

    /// The views a window ending at `until_ns` reads (the end of the
    /// trace when None): each process's view then, its steps from the
    /// start of `source` (a segment outlives the window that uses it) and
    /// its reserved bytes from `source`'s calls then, not from the window's
    /// own ledger; and the view at its fragmentation finding's moment.
    /// `calibrations` are those known already (a trace's stored views':
    /// the calibration reads every step whatever the moment); the others
    /// take a pass of their own.
    pub fn until(
        source: &dyn StepSource,
        data: &TraceData,
        pids: &[u32],
        until_ns: Option<u64>,
        calibrations: &BTreeMap<u32, Calibration>,
    ) -> KnownViews {
        let mut end = BTreeMap::new();
        let mut moments = BTreeMap::new();
        for &pid in pids {
            let cal = match calibrations.get(&pid) {
                Some(c) => c.clone(),
                None => calibrate(source, pid),
            };
            let view = view_replayed(source, data, pid, until_ns, cal);
            moments.extend(moment_view(source, data, &view));
            end.insert(pid, view);
        }
        KnownViews { end, moments }
    }

    /// [`KnownViews::until`] with each process's layout guessed
    /// (`guesses`, see [`allocator_views_guessed`]): one pass for each
    /// view at the window's end when the guess is right, the same views.
    pub fn until_guessed(
        source: &dyn StepSource,
        data: &TraceData,
        pids: &[u32],
        until_ns: Option<u64>,
        guesses: &BTreeMap<u32, Layout>,
    ) -> KnownViews {
        let end = pids
            .iter()
            .map(|&pid| {
                let guess = guesses.get(&pid).copied();
                let view = view_guessed(source, data, pid, until_ns, Reserved::Replayed, guess);
                (pid, view)
            })
            .collect();
        Self::with_moments(source, data, end)
    }

    /// [`KnownViews::until`] with the views at the window's end rebuilt
    /// already (`end`, by a pass made for something else too): the views
    /// at their fragmentation findings' moments, each a pass of `source`.
    pub fn with_moments(
        source: &dyn StepSource,
        data: &TraceData,
        end: BTreeMap<u32, AllocatorView>,
    ) -> KnownViews {
        let moments = end
            .values()
            .filter_map(|v| moment_view(source, data, v))
            .collect();
        KnownViews { end, moments }
    }

    /// The views already rebuilt: at the end by pid, and at other moments
    /// by (pid, time) (a trace's stored ones).
    pub fn from_parts(
        end: BTreeMap<u32, AllocatorView>,
        moments: BTreeMap<(u32, u64), AllocatorView>,
    ) -> KnownViews {
        KnownViews { end, moments }
    }

    /// These views and `other`'s (of other processes), as one.
    pub fn join(mut self, other: KnownViews) -> KnownViews {
        self.end.extend(other.end);
        self.moments.extend(other.moments);
        self
    }

    /// The views at the end, by pid.
    pub fn end(&self) -> &BTreeMap<u32, AllocatorView> {
        &self.end
    }

    /// The views at other moments, by (pid, time).
    pub fn moments(&self) -> &BTreeMap<(u32, u64), AllocatorView> {
        &self.moments
    }
}

impl AllocatorReads for KnownViews {
    fn views(&self, _ledgers: &[ProcessLedger]) -> BTreeMap<u32, AllocatorView> {
        self.end.clone()
    }

    fn view_at(&self, pid: u32, ts: u64) -> Option<AllocatorView> {
        self.moments.get(&(pid, ts)).cloned()
    }
}

/// The view of `end`'s process at the moment its fragmentation finding
/// describes (a failure, the reserved peak), keyed by (pid, moment); None
/// when the finding describes the end itself. The calibration reads every
/// step whatever the moment: `end`'s.
fn moment_view(
    source: &dyn StepSource,
    data: &TraceData,
    end: &AllocatorView,
) -> Option<((u32, u64), AllocatorView)> {
    let ts = crate::findings::fragmentation_moment(end.state.as_ref()?)?;
    let view = view_replayed(source, data, end.pid, Some(ts), end.calibration.clone());
    Some(((end.pid, ts), view))
}

/// The view of `pid` at `at_ns` (the end when None) with its calibration
/// known, its reserved bytes (the process's ledger's live bytes then, by
/// the ledger's rules) counted by the same pass: one pass.
fn view_replayed(
    source: &dyn StepSource,
    data: &TraceData,
    pid: u32,
    at_ns: Option<u64>,
    calibration: Calibration,
) -> AllocatorView {
    view_with(source, data, pid, at_ns, calibration, Reserved::Replayed)
}

/// [`allocator_view`], the process's steps from `source` (two passes).
pub fn allocator_view_of(
    source: &dyn StepSource,
    data: &TraceData,
    pid: u32,
    at_ns: Option<u64>,
    reserved_bytes: u64,
) -> AllocatorView {
    let calibration = calibrate(source, pid);
    allocator_view_calibrated(source, data, pid, at_ns, reserved_bytes, calibration)
}

/// [`allocator_view_of`] with the process's calibration known: one pass.
pub fn allocator_view_calibrated(
    source: &dyn StepSource,
    data: &TraceData,
    pid: u32,
    at_ns: Option<u64>,
    reserved_bytes: u64,
    calibration: Calibration,
) -> AllocatorView {
    let reserved = Reserved::Known(reserved_bytes);
    view_with(source, data, pid, at_ns, calibration, reserved)
}

/// The view of `pid` at `at_ns` with its calibration known and its
/// reserved bytes as `reserved` says, its blocks' sites named: one pass.
fn view_with(
    source: &dyn StepSource,
    data: &TraceData,
    pid: u32,
    at_ns: Option<u64>,
    calibration: Calibration,
    reserved: Reserved,
) -> AllocatorView {
    let state = calibration
        .layout()
        .map(|layout| rebuild(source, pid, layout, at_ns, reserved));
    named_view(pid, calibration, state, data)
}

/// The view of `pid` with `state`, its blocks' sites named from `data`.
fn named_view(
    pid: u32,
    calibration: Calibration,
    state: Option<AllocatorState>,
    data: &TraceData,
) -> AllocatorView {
    let mut view = AllocatorView {
        pid,
        calibration,
        state,
    };
    name_sites(&mut view, data);
    view
}

/// Names the line (or native function) that asked for each live block of
/// `view` from `data`'s stacks: a view rebuilt without them (a trace's
/// stored one) reads them from the trace that loads it.
pub fn name_sites(view: &mut AllocatorView, data: &TraceData) {
    let (Some(st), false) = (view.state.as_mut(), data.stacks.is_empty()) else {
        return;
    };
    for seg in &mut st.segments {
        for b in &mut seg.live_blocks {
            b.site = b
                .stack_id
                .map(|id| crate::sites::label_of(data, Some(id.get())).into());
        }
    }
}

/// A live block as a replay holds it: its `Block*` is the map's key and
/// its site is named only in views, so 40 bytes where a [`LiveBlock`] takes
/// 56. A replay holds every live block (the tracer's carried replays and
/// the moments they view), in a [`LiveBlocks`] list: 48 bytes a block and
/// 5 a slot of its table (250,000 live blocks: 15 MB where a hash map of
/// the pairs took 30).
#[derive(Debug, Clone, Copy)]
struct Held {
    ptr: u64,
    size: u64,
    requested: u64,
    since_ns: u64,
    /// 0 is "no site" on the capture's side (`record.rs`), so the niche
    /// costs nothing there; a file's stack id 0 reads as none too.
    stack_id: Option<NonZeroU64>,
}

impl Held {
    fn of(b: &LiveBlock) -> Held {
        Held {
            ptr: b.ptr.0,
            size: b.size,
            requested: b.requested,
            since_ns: b.since_ns,
            stack_id: b.stack_id,
        }
    }

    /// The block `block` as views show it (no site yet).
    fn live(self, block: u64) -> LiveBlock {
        LiveBlock {
            block: Ptr(block),
            ptr: Ptr(self.ptr),
            size: self.size,
            requested: self.requested,
            since_ns: self.since_ns,
            stack_id: self.stack_id,
            site: None,
        }
    }
}

/// Running state of the block replay.
#[derive(Default, Clone)]
struct Blocks {
    live: LiveBlocks,
    allocated: u64,
    requested: u64,
    counts: BlockCounts,
    peak: Option<Moment>,
    failures: Vec<FailedRequest>,
}

impl Blocks {
    fn moment(&self, ts_ns: u64, segs: &SegmentMap) -> Moment {
        let reserved = segs.owned_total();
        Moment {
            ts_ns,
            reserved_bytes: reserved,
            allocated_bytes: self.allocated,
            gap_bytes: reserved as i64 - self.allocated as i64,
        }
    }

    fn drop_live(&mut self, key: u64) -> Option<Held> {
        let old = self.live.remove(key)?;
        self.allocated = self.allocated.saturating_sub(old.size);
        self.requested = self.requested.saturating_sub(old.requested);
        Some(old)
    }

    fn apply(&mut self, segs: &mut SegmentMap, b: &BlockEvent, l: Layout) {
        let Some(class) = op_by_id(b.op).map(|o| o.class) else {
            return;
        };
        match class {
            OpClass::BlockAlloc if b.block == 0 => {
                self.counts.failed_mallocs += 1;
                self.failures.push(FailedRequest {
                    op: "DeviceCachingAllocator::malloc",
                    bytes: b.requested.unwrap_or(0),
                    at: self.moment(b.end_ns, segs),
                });
            }
            OpClass::BlockAlloc => {
                self.counts.mallocs += 1;
                if self.drop_live(b.block).is_some() {
                    self.counts.reused_live_blocks += 1;
                }
                let block = Held {
                    ptr: b.words[l.ptr],
                    size: b.words[l.size],
                    requested: b.requested.unwrap_or(b.words[l.requested]),
                    since_ns: b.end_ns,
                    stack_id: b.stack_id.and_then(NonZeroU64::new),
                };
                segs.mark_owned(block.ptr, block.size);
                self.allocated = self.allocated.saturating_add(block.size);
                self.requested = self.requested.saturating_add(block.requested);
                self.live.insert(b.block, block);
                self.note_peak(b.end_ns, segs);
            }
            OpClass::BlockFree => match self.drop_live(b.block) {
                Some(old) => {
                    self.counts.frees += 1;
                    if old.ptr != b.words[l.ptr] {
                        self.counts.free_ptr_mismatches += 1;
                    }
                    self.note_peak(b.end_ns, segs);
                }
                None => {
                    self.counts.unmatched_frees += 1;
                    self.counts.unmatched_free_bytes = self
                        .counts
                        .unmatched_free_bytes
                        .saturating_add(b.words[l.size]);
                }
            },
            OpClass::BlockRelease => self.counts.segment_releases += 1,
            _ => {}
        }
    }

    fn note_peak(&mut self, ts: u64, segs: &SegmentMap) {
        if self
            .peak
            .as_ref()
            .is_none_or(|p| segs.owned_total() > p.reserved_bytes)
        {
            self.peak = Some(self.moment(ts, segs));
        }
    }

    /// A failed CUDA-level allocation (the allocator could not grow).
    fn cuda_failure(&mut self, c: &CallEvent, segs: &SegmentMap) {
        let Some(info) = c.info() else { return };
        if c.nested
            || !c.failed()
            || !matches!(info.class, OpClass::DeviceAlloc | OpClass::PhysCreate)
        {
            return;
        }
        self.failures.push(FailedRequest {
            op: info.name,
            bytes: c.size.unwrap_or(0),
            at: self.moment(c.end_ns(), segs),
        });
    }
}

/// The reserved bytes a view is rebuilt with.
#[derive(Clone, Copy)]
enum Reserved {
    /// The process's ledger's live bytes then, known.
    Known(u64),
    /// Counted by the ledger's rules (`ledger::ledger(data, Some(at))`'s
    /// live bytes) from the replay's own calls, in the same pass.
    Replayed,
}

/// One process's block replay up to a moment, with its reserved bytes as
/// [`Reserved`] says: known, or counted by a ledger its calls are pushed to
/// (without history: the live bytes are the same, and a replay carried
/// across a run's files, `carry`, holds only what is live).
#[derive(Clone)]
struct Replay {
    blocks: Rebuilder,
    pid: u32,
    reserved: Reserved,
    /// Counts the reserved bytes (`Reserved::Replayed`).
    counter: Option<crate::ledger::LedgerBuilder>,
}

impl Replay {
    fn new(layout: Layout, pid: u32, at_ns: Option<u64>, reserved: Reserved) -> Replay {
        let counter = match reserved {
            Reserved::Replayed => {
                let mut b = crate::ledger::LedgerBuilder::without_history().until(at_ns);
                b.track(pid);
                Some(b)
            }
            Reserved::Known(_) => None,
        };
        Replay {
            blocks: Rebuilder::new(layout),
            pid,
            reserved,
            counter,
        }
    }

    /// A replay carried across a run's files (`carry`): every step of each
    /// file pushed, its reserved bytes counted at the moment it finishes.
    fn carried(layout: Layout, pid: u32) -> Replay {
        Replay::new(layout, pid, None, Reserved::Replayed)
    }

    /// Entries held: the blocks' and the counting ledger's.
    fn held_entries(&self) -> usize {
        let counter = self
            .counter
            .as_ref()
            .map_or(0, crate::ledger::LedgerBuilder::held_entries);
        self.blocks.held_entries() + counter
    }

    /// Room for `live` live blocks at once: a replay that will grow to
    /// about that many grows its map once, not by doubling (each doubling
    /// holds the old table and the new one together).
    fn reserve_live(&mut self, live: usize) {
        let have = self.blocks.blocks.live.len();
        self.blocks.blocks.live.reserve(live.saturating_sub(have));
    }

    /// Live blocks held.
    fn live_blocks(&self) -> usize {
        self.blocks.blocks.live.len()
    }

    /// Live blocks held whose malloc returned by `ts`: each was live at `ts`
    /// in any replay of the same steps that stops at `ts` (its last malloc
    /// completed by then, and no free of it came after), so a view at `ts`
    /// holds at least as many.
    fn live_blocks_since_by(&self, ts: u64) -> usize {
        self.blocks
            .blocks
            .live
            .values()
            .filter(|h| h.since_ns <= ts)
            .count()
    }

    fn push(&mut self, s: Step<'_>) {
        if let (Step::Call(c), Some(l)) = (s, self.counter.as_mut()) {
            l.push(c);
        }
        self.blocks.push(s);
    }

    fn finish(self) -> AllocatorState {
        let reserved_bytes = match self.reserved {
            Reserved::Known(bytes) => bytes,
            Reserved::Replayed => self.counter.map_or(0, |l| l.live_bytes(self.pid)),
        };
        self.blocks.finish(reserved_bytes)
    }
}

fn rebuild(
    source: &dyn StepSource,
    pid: u32,
    layout: Layout,
    at_ns: Option<u64>,
    reserved: Reserved,
) -> AllocatorState {
    let mut replay = Replay::new(layout, pid, at_ns, reserved);
    // The source gives only the steps that completed by `at_ns`.
    source.for_each_step(pid, at_ns, &mut |s| {
        replay.push(s);
        true
    });
    replay.finish()
}

/// What takes a process's steps one at a time, in replay order.
pub trait StepSink {
    fn push(&mut self, s: Step<'_>);
}

impl StepSink for Calibrator {
    fn push(&mut self, s: Step<'_>) {
        Calibrator::push(self, s);
    }
}

/// The block replay of one process with its calibration's layout, fed a
/// step at a time (in replay order, those that completed by the view's
/// moment): what a view rebuilds, so that a reader can feed it from a pass
/// it makes anyway (`memory --at`'s ledger replay, `sleuth_store`).
#[derive(Clone)]
pub struct Rebuilder {
    blocks: Blocks,
    /// Block events also mark segments as the allocator's.
    segs: SegmentMap,
    layout: Layout,
}

impl Rebuilder {
    pub fn new(layout: Layout) -> Rebuilder {
        Rebuilder {
            blocks: Blocks::default(),
            segs: SegmentMap::default(),
            layout,
        }
    }

    /// Entries held: live blocks, segments and failed requests.
    pub fn held_entries(&self) -> usize {
        self.blocks.live.len() + self.blocks.failures.len() + self.segs.len()
    }

    /// The state after every step pushed; `reserved_bytes` is the
    /// process's ledger's live bytes at the same moment.
    pub fn finish(mut self, reserved_bytes: u64) -> AllocatorState {
        // The blocks' list is taken and its table dropped before the view's
        // blocks are made (250,000 live blocks: 17 MB).
        let live = by_address(std::mem::take(&mut self.blocks.live).into_entries());
        let failures = std::mem::take(&mut self.blocks.failures);
        assemble(live, &self.blocks, failures, &self.segs, reserved_bytes)
    }

    /// [`Self::finish`] of a replay that goes on: the state now, without a
    /// copy of its live blocks' table (a replay carried across a run's
    /// files, 90,000 live blocks: 7.5 MB).
    pub fn state_now(&self, reserved_bytes: u64) -> AllocatorState {
        let live = by_address(self.blocks.live.iter().collect());
        let failures = self.blocks.failures.clone();
        assemble(live, &self.blocks, failures, &self.segs, reserved_bytes)
    }
}

impl StepSink for Rebuilder {
    fn push(&mut self, s: Step<'_>) {
        match s {
            Step::Call(c) => {
                self.segs.apply(c);
                self.blocks.cuda_failure(c, &self.segs);
            }
            Step::Block(b) => self.blocks.apply(&mut self.segs, b, self.layout),
        }
    }
}

/// The view of `pid` calibrated by `calibration` from the replay fed to
/// `rebuilt` (None when the calibration has no layout: the view says why),
/// `reserved_bytes` its ledger's live bytes then; its blocks' sites named
/// from `data`.
pub fn view_rebuilt(
    pid: u32,
    calibration: Calibration,
    rebuilt: Option<Rebuilder>,
    reserved_bytes: u64,
    data: &TraceData,
) -> AllocatorView {
    let state = calibration
        .layout()
        .and(rebuilt)
        .map(|r| r.finish(reserved_bytes));
    named_view(pid, calibration, state, data)
}

fn pool_of(size: u64, blocks: &[LiveBlock]) -> Pool {
    if size == SMALL_SEGMENT_BYTES && blocks.iter().all(|b| b.size <= SMALL_BLOCK_MAX_BYTES) {
        Pool::Small
    } else {
        Pool::Large
    }
}

fn why(owned: bool, kind: SegmentKind, blocks: usize) -> String {
    let unit = match kind {
        SegmentKind::Malloc => "a segment",
        SegmentKind::Mapped => "a mapped page of an expandable segment",
    };
    match (owned, blocks) {
        (false, _) => "no allocator block ever used it: not the caching allocator's memory".into(),
        (true, 0) => "entirely free: empty_cache() releases it".into(),
        (true, n) => format!(
            "{n} live block(s) pin it: empty_cache() releases {unit} only when entirely free"
        ),
    }
}

/// Bytes of the block at `ptr` of `size` bytes inside `[lo, hi)`.
fn overlap(ptr: u64, size: u64, lo: u64, hi: u64) -> u64 {
    let end = ptr.saturating_add(size);
    end.min(hi).saturating_sub(ptr.max(lo))
}

/// A replay's live blocks (`Block*`, the block) by address, as the replay
/// holds them (48 bytes each with the key): `assemble` makes each a view's
/// `LiveBlock` (56) only in the segments that list it, so a view of many
/// live blocks holds them once beside this list, not a sorted copy and
/// each segment's copies too (90,000 live blocks: 24 MB at the tracer's
/// peak, round 34).
fn by_address(mut live: Vec<(u64, Held)>) -> Vec<(u64, Held)> {
    live.sort_unstable_by_key(|&(block, h)| (h.ptr, block));
    live
}

/// A list that shrank by a MiB or more hands its room back: glibc maps a
/// block that large on its own (the tracer sets its threshold to 1 MiB)
/// and shrinks it in place, the pages returned at once.
fn give_back<T>(v: &mut Vec<T>) {
    if (v.capacity() - v.len()) * std::mem::size_of::<T>() >= 1 << 20 {
        v.shrink_to_fit();
    }
}

/// The state of the live blocks `live` (by address), the rest of `blocks`
/// (its failed requests `failures`) and `segs`.
fn assemble(
    mut live: Vec<(u64, Held)>,
    blocks: &Blocks,
    failures: Vec<FailedRequest>,
    segs: &SegmentMap,
    reserved_bytes: u64,
) -> AllocatorState {
    // Bytes of each live block inside some segment, by its place in `live`.
    let mut covered: Vec<u64> = vec![0; live.len()];
    let mut out = AllocatorState {
        allocated_bytes: blocks.allocated,
        requested_bytes: blocks.requested,
        rounding_bytes: blocks.allocated.saturating_sub(blocks.requested),
        reserved_bytes,
        allocator_reserved_bytes: segs.owned_total(),
        outside_allocator_bytes: 0,
        // The gap PyTorch reports (memory_reserved() − memory_allocated()):
        // memory of other libraries is reserved but is no part of it.
        gap_bytes: segs.owned_total() as i64 - blocks.allocated as i64,
        pinned_free_bytes: 0,
        releasable_bytes: 0,
        unexplained_bytes: 0,
        live_blocks: live.len() as u64,
        pools: Pools::default(),
        segments: Vec::new(),
        segment_count: 0,
        peak: blocks.peak.clone(),
        failures,
        counts: blocks.counts.clone(),
        expandable: false,
        inconsistencies: Vec::new(),
    };
    let mut seg_total = 0u64;
    let mut free_total = 0u64;
    // Each segment's blocks, a range of `live`, found on the whole list.
    let ranges: Vec<(u64, &segments::Seg, usize, usize)> = segs
        .iter()
        .map(|(base, s)| {
            let hi = s.end(base);
            // Blocks do not overlap one another, so their ends are sorted too.
            let first = live.partition_point(|(_, h)| h.ptr.saturating_add(h.size) <= base);
            let n = live[first..].iter().take_while(|(_, h)| h.ptr < hi).count();
            (base, s, first, n)
        })
        .collect();
    // The segments are made last to first, so that the blocks no earlier
    // segment's range reaches are done with and leave the list as the
    // views' blocks are made: the list (48 bytes a block) and the views
    // (56) are not both whole at once (250,000 live blocks: 34 MB together
    // at the tracer's peak while a view's block took 80, round 36).
    // `reach[j]`: the end of the ranges before segment `j`.
    let mut reach: Vec<usize> = Vec::with_capacity(ranges.len());
    let mut furthest = 0;
    for &(_, _, first, n) in &ranges {
        reach.push(furthest);
        furthest = furthest.max(first + n);
    }
    // Blocks (partly) outside every live segment, in pieces from the last.
    let mut outside_pieces: Vec<Vec<(u64, u64)>> = Vec::new();
    let mut done_from = |keep: usize, live: &mut Vec<(u64, Held)>, covered: &mut Vec<u64>| {
        let piece: Vec<(u64, u64)> = live[keep..]
            .iter()
            .zip(&covered[keep..])
            .filter(|&(&(_, h), &c)| c < h.size)
            .map(|(&(_, h), &c)| (h.ptr, h.size - c))
            .collect();
        if !piece.is_empty() {
            outside_pieces.push(piece);
        }
        live.truncate(keep);
        covered.truncate(keep);
        give_back(live);
        give_back(covered);
    };
    for (j, &(base, s, first, n)) in ranges.iter().enumerate().rev() {
        let hi = s.end(base);
        let mut inside: Vec<LiveBlock> = Vec::with_capacity(n);
        let mut live_bytes = 0u64;
        for (i, &(block, h)) in live.iter().enumerate().skip(first).take(n) {
            let o = overlap(h.ptr, h.size, base, hi);
            covered[i] += o;
            live_bytes += o;
            inside.push(h.live(block));
        }
        let free = s.size.saturating_sub(live_bytes);
        let pool = pool_of(s.size, &inside);
        seg_total += s.size;
        if s.owned {
            let p = match pool {
                Pool::Small => &mut out.pools.small,
                Pool::Large => &mut out.pools.large,
            };
            p.segments += 1;
            p.reserved_bytes += s.size;
            p.allocated_bytes += live_bytes;
            p.free_bytes += free;
            free_total += free;
        }
        if !s.owned {
            out.outside_allocator_bytes += s.size;
        } else if inside.is_empty() {
            out.releasable_bytes += s.size;
        } else {
            out.pinned_free_bytes += free;
        }
        out.expandable |= s.kind == SegmentKind::Mapped;
        out.segments.push(Segment {
            base: Ptr(base),
            size: s.size,
            kind: s.kind,
            pool,
            since_ns: s.since_ns,
            allocator_owned: s.owned,
            why: why(s.owned, s.kind, inside.len()),
            live_block_count: inside.len() as u64,
            live_blocks: inside,
            live_bytes,
            free_bytes: free,
        });
        if reach[j] < live.len() {
            done_from(reach[j], &mut live, &mut covered);
        }
    }
    if !live.is_empty() {
        done_from(0, &mut live, &mut covered);
    }
    out.segments.reverse();
    out.segment_count = out.segments.len() as u64;
    out.unexplained_bytes = out.gap_bytes - free_total as i64;
    if seg_total != reserved_bytes {
        out.inconsistencies.push(format!(
            "the ledger has {reserved_bytes} bytes of live device memory but the live segments cover {seg_total} \
             (a physical allocation not mapped, or a mapping whose handle was released)"
        ));
    }
    let outside: Vec<(u64, u64)> = outside_pieces.into_iter().rev().flatten().collect();
    if let Some(&(first_ptr, _)) = outside.first() {
        let bytes: u64 = outside.iter().map(|o| o.1).sum();
        out.inconsistencies.push(format!(
            "{} live block(s) lie (partly) outside every live segment ({bytes} bytes), first at {first_ptr:#x}",
            outside.len(),
        ));
    }
    if out.counts.free_ptr_mismatches > 0 {
        out.inconsistencies.push(format!(
            "{} free(s) read a block address different from the one handed out",
            out.counts.free_ptr_mismatches
        ));
    }
    out
}
