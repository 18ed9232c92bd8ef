//! Finds where `size`, `requested_size` and `ptr` sit in PyTorch's `Block`
//! struct, from the captured words themselves: the layout changes between
//! torch versions (and with the size of `stream_set`), so nothing is
//! hard-coded. Each field is the word index that satisfies its test in at
//! least [`MIN_AGREEMENT`] of the successful malloc events:
//!
//! - requested_size: equals the size the malloc was asked for;
//! - ptr: points inside a live CUDA segment of the process at that moment;
//! - size: ≥ requested, a multiple of 512, and `[ptr, ptr+size)` lies inside
//!   live segments.

use super::segments::SegmentMap;
use super::{Step, StepSource};
use crate::event::{BlockEvent, BLOCK_WORDS};
use crate::ops::OpClass;
use serde::{Deserialize, Serialize};

/// Share of malloc events a field's test must hold for.
pub const MIN_AGREEMENT: f64 = 0.99;
/// PyTorch rounds every block to a multiple of this.
pub const BLOCK_ROUNDING: u64 = 512;

/// The result of calibration, reported as is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Successful malloc events with a requested size (the sample).
    pub malloc_events: u64,
    /// Word indices (byte offset = 8 × index) and how many events agreed.
    pub requested_index: Option<usize>,
    pub requested_agree: u64,
    pub ptr_index: Option<usize>,
    pub ptr_agree: u64,
    pub size_index: Option<usize>,
    pub size_agree: u64,
    pub min_agreement: f64,
    pub recognised: bool,
    /// Why the layout was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The calibrated field positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub requested: usize,
    pub ptr: usize,
    pub size: usize,
}

impl Calibration {
    pub fn layout(&self) -> Option<Layout> {
        match (
            self.recognised,
            self.requested_index,
            self.ptr_index,
            self.size_index,
        ) {
            (true, Some(requested), Some(ptr), Some(size)) => Some(Layout {
                requested,
                ptr,
                size,
            }),
            _ => None,
        }
    }
}

/// A malloc event usable for calibration: it returned a block for a known,
/// non-zero request.
fn sample(b: &BlockEvent) -> Option<u64> {
    let class = crate::ops::op_by_id(b.op)?.class;
    (class == OpClass::BlockAlloc && b.block != 0)
        .then_some(b.requested)
        .flatten()
        .filter(|&r| r > 0)
}

fn agrees(count: u64, total: u64) -> bool {
    total > 0 && count as f64 >= MIN_AGREEMENT * total as f64
}

/// Ok when word `i` of `counts` agrees in enough of the `n` malloc events;
/// else the reason, `what` being the property no word had often enough.
fn check_agreement(counts: &[u64; BLOCK_WORDS], i: usize, n: u64, what: &str) -> Refusal {
    if agrees(counts[i], n) {
        return Ok(());
    }
    Err(Some(format!(
        "no Block word {what} in {:.0}% of {n} malloc events (best: word {i}, {} events)",
        MIN_AGREEMENT * 100.0,
        counts[i]
    )))
}

/// The index with the most agreement among `allowed`; ties go to `prefer`
/// when it is among them, else to the first or last index as `high` says.
fn best(
    counts: &[u64; BLOCK_WORDS],
    allowed: impl Fn(usize) -> bool,
    prefer: Option<usize>,
    high: bool,
) -> Option<usize> {
    let max = (0..BLOCK_WORDS)
        .filter(|&i| allowed(i))
        .map(|i| counts[i])
        .max()?;
    let tied: Vec<usize> = (0..BLOCK_WORDS)
        .filter(|&i| allowed(i) && counts[i] == max)
        .collect();
    if let Some(p) = prefer.filter(|p| tied.contains(p)) {
        return Some(p);
    }
    if high {
        tied.last().copied()
    } else {
        tied.first().copied()
    }
}

/// What one pass over a process's steps counts for the fit, for every
/// Block word at once: each later choice (the pointer word given the
/// requested one, the size word given the pointer word) picks among
/// these counts, so the choices are those of a pass per word.
#[derive(Clone)]
struct WordCounts {
    /// Sampled malloc events (successful, with a requested size).
    n: u64,
    /// Events whose word equals the requested size.
    equal: [u64; BLOCK_WORDS],
    /// Events whose word points into a live segment of the process when
    /// the malloc returned.
    inside: [u64; BLOCK_WORDS],
    /// `fits[p][i]`: events whose word `i` is a 512-byte-rounded size ≥ the
    /// request and a block of that size at word `p` lies inside live
    /// segments (only words `p` that point into one can; the others stay 0).
    fits: [[u64; BLOCK_WORDS]; BLOCK_WORDS],
}

/// A calibration fed one step at a time, in replay order, by a pass that
/// reads the process's steps for another purpose too (the writer's ledger
/// replay, `sleuth_store`): what [`calibrate`] makes of one pass over a
/// [`StepSource`].
#[derive(Clone)]
pub struct Calibrator {
    counts: WordCounts,
    /// The segments replayed so that each malloc event sees them as they
    /// stood when it returned.
    segs: SegmentMap,
}

impl Default for Calibrator {
    fn default() -> Self {
        Calibrator {
            counts: WordCounts {
                n: 0,
                equal: [0; BLOCK_WORDS],
                inside: [0; BLOCK_WORDS],
                fits: [[0; BLOCK_WORDS]; BLOCK_WORDS],
            },
            segs: SegmentMap::default(),
        }
    }
}

impl Calibrator {
    /// The process's next step.
    pub fn push(&mut self, s: Step<'_>) {
        match s {
            Step::Call(call) => self.segs.apply(call),
            Step::Block(b) => self.counts.add(&self.segs, b),
        }
    }

    /// Entries held: the segments replayed.
    pub fn held_entries(&self) -> usize {
        self.segs.len()
    }

    pub fn finish(self) -> Calibration {
        let mut cal = Calibration {
            malloc_events: 0,
            requested_index: None,
            requested_agree: 0,
            ptr_index: None,
            ptr_agree: 0,
            size_index: None,
            size_agree: 0,
            min_agreement: MIN_AGREEMENT,
            recognised: false,
            reason: None,
        };
        if let Err(why) = fit(&self.counts, &mut cal) {
            cal.reason = why;
        }
        cal
    }
}

impl WordCounts {
    fn add(&mut self, segs: &SegmentMap, b: &BlockEvent) {
        let Some(req) = sample(b) else { return };
        self.n += 1;
        for (i, &w) in b.words.iter().enumerate() {
            self.equal[i] += u64::from(w == req);
            if segs.containing(w).is_none() {
                continue;
            }
            self.inside[i] += 1;
            for (k, &size) in b.words.iter().enumerate() {
                let fits = size >= req && size % BLOCK_ROUNDING == 0 && segs.covers(w, size);
                self.fits[i][k] += u64::from(fits);
            }
        }
    }
}

/// The calibration of `pid` from one pass over its steps.
pub fn calibrate(source: &dyn StepSource, pid: u32) -> Calibration {
    let mut c = Calibrator::default();
    source.for_each_step(pid, None, &mut |s| {
        c.push(s);
        true
    });
    c.finish()
}

/// Why a calibration stopped early: `Err(None)` when no word could even be
/// tried (no candidate left), `Err(Some(..))` with the reason otherwise.
type Refusal = Result<(), Option<String>>;

/// Fills `cal` word by word; each step needs the ones before it, so the first
/// refusal ends it (the agreement counts found so far stay in `cal`).
fn fit(counts: &WordCounts, cal: &mut Calibration) -> Refusal {
    // requested_size: plain equality. Ties (every size equal to its request,
    // so the size word matches too) go to the higher index: torch declares
    // `size` right before `requested_size`, and the numbers agree anyway.
    let eq = counts.equal;
    cal.malloc_events = counts.n;
    let n = cal.malloc_events;
    if n == 0 {
        return Err(Some(
            "no successful DeviceCachingAllocator::malloc event with a requested size".into(),
        ));
    }
    let r = best(&eq, |_| true, None, true).ok_or(None)?;
    cal.requested_agree = eq[r];
    check_agreement(&eq, r, n, "equals the requested size")?;
    cal.requested_index = Some(r);

    // ptr: inside a live segment of the process when the malloc returned.
    let inside = counts.inside;
    let p = best(&inside, |i| i != r, Some(r + 2), false).ok_or(None)?;
    cal.ptr_agree = inside[p];
    check_agreement(&inside, p, n, "points into a live CUDA segment")?;
    cal.ptr_index = Some(p);

    // size: a rounded size, at least the request, whose block fits in the segment.
    let fits = counts.fits[p];
    let sz = best(&fits, |i| i != r && i != p, r.checked_sub(1), false).ok_or(None)?;
    cal.size_agree = fits[sz];
    check_agreement(
        &fits,
        sz,
        n,
        "holds a 512-byte-rounded size ≥ the request that fits its segment",
    )?;
    cal.size_index = Some(sz);
    cal.recognised = true;
    Ok(())
}
