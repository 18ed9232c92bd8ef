//! A block replay stored midway and taken up again (issue 16).
//!
//! A window late in a file reads each process's allocator view at its
//! end, which a replay from the file's start gives: most of the file's
//! memory calls and allocator events read for a view of one moment. The
//! writer's completion stores the replay's state every so many steps
//! (`sleuth_store`'s allocator checkpoints) and a reader takes up the
//! latest one before its moment ([`Rebuilder::resume`]), replaying only
//! the steps after it. A stored state comes from a file, i.e. untrusted
//! input: it is taken up only with the layout the reader calibrated, each
//! block and segment once; its numbers are the reader's to range-check
//! (as any stored aggregate), and sums stay saturating as in any replay,
//! so crafted numbers give wrong answers at worst, never a panic.

use super::live_blocks::LiveBlocks;
use super::segments::{Seg, SegmentKind, SegmentMap};
use super::{BlockCounts, Blocks, FailedRequest, Held, Layout, LiveBlock, Moment, Rebuilder};
use serde::{Deserialize, Serialize};

/// A [`Rebuilder`]'s state, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebuildState {
    /// The layout the blocks were read with: word indexes of the requested
    /// size, the pointer and the size.
    layout: [usize; 3],
    /// Live blocks by their `Block*`, in that order.
    live: Vec<LiveBlock>,
    allocated: u64,
    requested: u64,
    counts: BlockCounts,
    peak: Option<Moment>,
    failures: Vec<FailedRequest>,
    /// Live segments by base.
    segments: Vec<StoredSegment>,
    owned_total: u64,
}

/// A live segment, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredSegment {
    base: u64,
    size: u64,
    kind: SegmentKind,
    since_ns: u64,
    owned: bool,
}

fn layout_words(l: Layout) -> [usize; 3] {
    [l.requested, l.ptr, l.size]
}

impl RebuildState {
    /// Entries that grow with the steps replayed (live blocks, failures,
    /// segments): what a writer and a reader bound.
    pub fn entries(&self) -> usize {
        self.live.len() + self.failures.len() + self.segments.len()
    }
}

impl Rebuilder {
    /// The state of the replay so far ([`Self::resume`] takes it up).
    pub fn state(&self) -> RebuildState {
        let b = &self.blocks;
        let mut live: Vec<LiveBlock> = b.live.iter().map(|(k, h)| h.live(k)).collect();
        live.sort_unstable_by_key(|l| l.block);
        let segments = self
            .segs
            .iter()
            .map(|(base, s)| StoredSegment {
                base,
                size: s.size,
                kind: s.kind,
                since_ns: s.since_ns,
                owned: s.owned,
            })
            .collect();
        RebuildState {
            layout: layout_words(self.layout),
            live,
            allocated: b.allocated,
            requested: b.requested,
            counts: b.counts.clone(),
            peak: b.peak.clone(),
            failures: b.failures.clone(),
            segments,
            owned_total: self.segs.owned_total(),
        }
    }

    /// The replay `state` was taken from, continued with `layout` (the
    /// reader's calibration); an error when the state was read with
    /// another layout or lists a block or a segment twice.
    pub fn resume(state: RebuildState, layout: Layout) -> Result<Rebuilder, String> {
        if state.layout != layout_words(layout) {
            return Err("a state read with another layout".into());
        }
        let mut live = LiveBlocks::with_capacity(state.live.len());
        for l in state.live {
            // Labels are the reader's to name (a held block has none).
            let key = l.block.0;
            if live.insert(key, Held::of(&l)).is_some() {
                return Err(format!("block {key:#x} listed twice"));
            }
        }
        let segs = state.segments.into_iter().map(|s| {
            let seg = Seg {
                size: s.size,
                kind: s.kind,
                since_ns: s.since_ns,
                owned: s.owned,
            };
            (s.base, seg)
        });
        Ok(Rebuilder {
            blocks: Blocks {
                live,
                allocated: state.allocated,
                requested: state.requested,
                counts: state.counts,
                peak: state.peak,
                failures: state.failures,
            },
            segs: SegmentMap::from_parts(segs, state.owned_total)?,
            layout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::Sim;
    use super::super::{steps_of, Layout, Rebuilder, StepSink};
    use super::RebuildState;

    const MIB: u64 = 1 << 20;

    /// A random torch-like process: segments made and freed, blocks
    /// allocated, freed and reused, failed requests at both levels.
    fn random_sim(next: &mut impl FnMut() -> u64) -> Sim {
        let mut sim = Sim::torch();
        let mut live: Vec<u64> = Vec::new();
        let mut segs: Vec<(u64, u64, u64)> = Vec::new();
        let mut block = 0x1000u64;
        for step in 0..120u64 {
            let r = next();
            match r % 11 {
                0..=2 if !live.is_empty() => {
                    let b = live.swap_remove((r as usize / 11) % live.len());
                    sim.free(b);
                }
                3 if !segs.is_empty() => {
                    let (base, _, _) = segs.swap_remove((r as usize / 11) % segs.len());
                    sim.cuda_free(base);
                }
                4 => sim.failed_request(80 * MIB),
                _ => {
                    block += 0x40;
                    sim.malloc_carved(&mut segs, step, block, 1 + r % (3 * MIB));
                    live.push(block);
                }
            }
        }
        sim
    }

    /// `Sim::torch`'s layout.
    const LAYOUT: Layout = Layout {
        requested: 7,
        ptr: 9,
        size: 6,
    };

    /// A replay stored after any prefix of the steps (as JSON, as a file
    /// stores it) and taken up again ends exactly as one replay of them all.
    #[test]
    fn a_replay_stored_midway_and_taken_up_again_ends_as_one_replay() {
        let layout = LAYOUT;
        let mut next = crate::testing::xorshift(0x5851_f42d_4c95_7f2d);
        let mut resumed = 0;
        for _ in 0..40 {
            let data = random_sim(&mut next).data();
            let steps = steps_of(&data, 7);
            let mut whole = Rebuilder::new(layout);
            for &s in &steps {
                whole.push(s);
            }
            let whole = whole.finish(123 * MIB);
            for cut in (0..=steps.len()).step_by(7) {
                let mut first = Rebuilder::new(layout);
                for &s in &steps[..cut] {
                    first.push(s);
                }
                let text = serde_json::to_string(&first.state()).unwrap();
                let state: RebuildState = serde_json::from_str(&text).unwrap();
                let mut rest = Rebuilder::resume(state, layout).unwrap();
                for &s in &steps[cut..] {
                    rest.push(s);
                }
                assert_eq!(rest.finish(123 * MIB), whole, "cut after {cut} steps");
                resumed += 1;
            }
        }
        assert!(resumed > 400);
    }

    #[test]
    fn a_state_of_another_layout_or_with_a_block_twice_is_refused() {
        let layout = LAYOUT;
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d);
        let data = random_sim(&mut next).data();
        let mut r = Rebuilder::new(layout);
        for s in steps_of(&data, 7) {
            r.push(s);
        }
        let state = r.state();
        assert!(!state.live.is_empty());
        let other = Layout { ptr: 8, ..layout };
        assert!(Rebuilder::resume(state.clone(), other).is_err());
        let mut twice = state.clone();
        twice.live.push(twice.live[0].clone());
        assert!(Rebuilder::resume(twice, layout).is_err());
        let mut seg_twice = state;
        seg_twice.segments.push(seg_twice.segments[0].clone());
        assert!(Rebuilder::resume(seg_twice, layout).is_err());
    }
}
