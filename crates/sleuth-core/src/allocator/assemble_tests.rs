//! A view's assembly made segment by segment from the last (round 36)
//! against the one-pass assembly it replaced, kept here as the reference:
//! the same state for any list of blocks and segments, crafted overlaps
//! included.

use super::segments::{Seg, SegmentKind, SegmentMap};
use super::*;
use crate::testing::xorshift;

/// The assembly before round 36, word for word.
fn assemble_in_one_pass(
    live: Vec<(u64, Held)>,
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
    for (base, s) in segs.iter() {
        let hi = s.end(base);
        // Blocks do not overlap one another, so their ends are sorted too.
        let first = live.partition_point(|(_, h)| h.ptr.saturating_add(h.size) <= base);
        let n = live[first..].iter().take_while(|(_, h)| h.ptr < hi).count();
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
    }
    out.segment_count = out.segments.len() as u64;
    out.unexplained_bytes = out.gap_bytes - free_total as i64;
    if seg_total != reserved_bytes {
        out.inconsistencies.push(format!(
            "the ledger has {reserved_bytes} bytes of live device memory but the live segments cover {seg_total} \
             (a physical allocation not mapped, or a mapping whose handle was released)"
        ));
    }
    let outside: Vec<(u64, u64)> = live
        .iter()
        .zip(&covered)
        .filter(|&(&(_, h), &c)| c < h.size)
        .map(|(&(_, h), &c)| (h.ptr, h.size - c))
        .collect();
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

/// `n` blocks and `segs` segments in a space of `space` bytes: blocks of
/// up to `max_block` bytes (overlapping when the space is small: crafted
/// input), segments of up to `max_seg`.
fn random_case(
    seed: u64,
    n: usize,
    segs: usize,
    space: u64,
    max_block: u64,
    max_seg: u64,
) -> (Vec<(u64, Held)>, Blocks, SegmentMap, u64) {
    let mut next = xorshift(seed);
    let mut live: Vec<(u64, Held)> = (0..n as u64)
        .map(|i| {
            let size = 1 + next() % max_block;
            let h = Held {
                ptr: next() % space,
                size,
                requested: size - next() % size,
                since_ns: next() % 1_000_000,
                stack_id: next()
                    .is_multiple_of(2)
                    .then(&mut next)
                    .and_then(NonZeroU64::new),
            };
            (0x1000 + i * 16, h)
        })
        .collect();
    live.sort_unstable_by_key(|&(block, h)| (h.ptr, block));
    let map = SegmentMap::from_parts(
        (0..segs)
            .map(|_| {
                let seg = Seg {
                    size: 1 + next() % max_seg,
                    kind: match next() % 4 {
                        0 => SegmentKind::Mapped,
                        _ => SegmentKind::Malloc,
                    },
                    since_ns: next() % 1_000_000,
                    owned: !next().is_multiple_of(5),
                };
                (next() % space, seg)
            })
            .collect::<std::collections::BTreeMap<u64, Seg>>(),
        next() % (space * 2),
    )
    .expect("bases are unique");
    let blocks = Blocks {
        allocated: live.iter().map(|(_, h)| h.size).sum(),
        requested: live.iter().map(|(_, h)| h.requested).sum(),
        counts: BlockCounts {
            free_ptr_mismatches: next() % 2,
            ..BlockCounts::default()
        },
        ..Blocks::default()
    };
    (live, blocks, map, next() % (space * 2))
}

fn assert_same(live: Vec<(u64, Held)>, blocks: &Blocks, segs: &SegmentMap, reserved: u64) {
    let failures = vec![FailedRequest {
        op: "DeviceCachingAllocator::malloc",
        bytes: 512,
        at: blocks.moment(7, segs),
    }];
    let want = assemble_in_one_pass(live.clone(), blocks, failures.clone(), segs, reserved);
    let got = assemble(live, blocks, failures, segs, reserved);
    assert_eq!(got, want);
}

#[test]
fn the_same_state_as_the_one_pass_assembly_on_crafted_overlaps() {
    for seed in 1..400u64 {
        let n = (seed as usize * 7) % 300;
        let segs = (seed as usize * 3) % 25;
        // A small space: blocks overlap one another and segments overlap.
        let (live, blocks, map, reserved) = random_case(seed, n, segs, 64 << 10, 4096, 16 << 10);
        assert_same(live, &blocks, &map, reserved);
    }
}

#[test]
fn the_same_state_as_the_one_pass_assembly_on_many_blocks() {
    // Blocks of a torch-like process: many segments, many blocks each,
    // some outside every segment; lists past a MiB, so the assembly
    // hands room back as it goes.
    for seed in [3u64, 11, 29] {
        let mut next = xorshift(seed);
        let seg_size = 2u64 << 20;
        let mut segs = std::collections::BTreeMap::new();
        let mut live: Vec<(u64, Held)> = Vec::new();
        for s in 0..480u64 {
            let base = s * 4 * seg_size;
            segs.insert(
                base,
                Seg {
                    size: seg_size,
                    kind: SegmentKind::Malloc,
                    since_ns: s,
                    owned: true,
                },
            );
            // Blocks of 4 KiB packed into the segment, one in 7 skipped;
            // a few past its end (outside every segment).
            for b in 0..(seg_size / 4096 + next() % 3) {
                if next().is_multiple_of(7) {
                    continue;
                }
                let h = Held {
                    ptr: base + b * 4096,
                    size: 4096,
                    requested: 4000,
                    since_ns: next() % 1000,
                    stack_id: NonZeroU64::new(next() % 50),
                };
                live.push((0x10_0000 + live.len() as u64 * 16, h));
            }
        }
        live.sort_unstable_by_key(|&(block, h)| (h.ptr, block));
        assert!(live.len() * std::mem::size_of::<(u64, Held)>() > 8 << 20);
        let total: u64 = segs.values().map(|s| s.size).sum();
        let map = SegmentMap::from_parts(segs, total).expect("unique bases");
        let blocks = Blocks {
            allocated: live.iter().map(|(_, h)| h.size).sum(),
            requested: live.iter().map(|(_, h)| h.requested).sum(),
            ..Blocks::default()
        };
        assert_same(live, &blocks, &map, total);
    }
}

#[test]
fn no_segments_or_no_blocks() {
    let (live, blocks, map, reserved) = random_case(5, 50, 0, 1 << 20, 4096, 1 << 16);
    assert_same(live, &blocks, &map, reserved);
    let (_, blocks, map, reserved) = random_case(6, 0, 10, 1 << 20, 4096, 1 << 16);
    assert_same(Vec::new(), &blocks, &map, reserved);
}
