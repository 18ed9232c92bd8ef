//! The reconstruction from hand-built allocator events: calibration on
//! several layouts, exact totals, the gap explained to the byte.

use super::*;
use crate::data::ProcessInfo;
use crate::event::BLOCK_WORDS;
use crate::ledger::ledger;
use crate::ops::op_by_name;
use std::collections::HashMap;

const MIB: u64 = 1 << 20;
const PID: u32 = 7;
/// Where the first simulated CUDA segment starts.
pub(crate) const BASE: u64 = 0x7f00_0000_0000;

/// Builds a trace of one process the way torch would produce it, with the
/// Block fields at chosen word indices.
pub(crate) struct Sim {
    pub(crate) calls: Vec<CallEvent>,
    pub(crate) blocks: Vec<BlockEvent>,
    ts: u64,
    layout: Layout,
    /// The words each live Block* held at malloc (a free reads the same).
    words: HashMap<u64, [u64; BLOCK_WORDS]>,
}

impl Sim {
    pub(crate) fn new(requested: usize, size: usize, ptr: usize) -> Sim {
        Sim {
            calls: Vec::new(),
            blocks: Vec::new(),
            ts: 1_000,
            layout: Layout {
                requested,
                ptr,
                size,
            },
            words: HashMap::new(),
        }
    }
    pub(crate) fn torch() -> Sim {
        Sim::new(7, 6, 9)
    }
    /// A torch process that has `cudaMalloc`ed one segment of `bytes` at [`BASE`].
    pub(crate) fn torch_with_segment(bytes: u64) -> Sim {
        let mut sim = Sim::torch();
        sim.cuda_malloc(BASE, bytes);
        sim
    }
    fn tick(&mut self) -> u64 {
        self.ts += 100;
        self.ts
    }
    fn call(&mut self, op: &str, size: Option<u64>, ptr: Option<u64>) -> &mut CallEvent {
        let ts = self.tick();
        self.calls.push(CallEvent {
            ts_ns: ts,
            dur_ns: 10,
            pid: PID,
            tid: PID,
            op: op_by_name(op).unwrap().id,
            size,
            ptr,
            ..Default::default()
        });
        self.calls.last_mut().unwrap()
    }
    pub(crate) fn cuda_malloc(&mut self, base: u64, size: u64) {
        self.call("cudaMalloc", Some(size), Some(base));
        // The driver twin inside it is not counted twice.
        self.call("cuMemAlloc_v2", Some(size), Some(base)).nested = true;
    }
    pub(crate) fn cuda_free(&mut self, base: u64) {
        self.call("cudaFree", None, Some(base));
    }
    pub(crate) fn block_event(
        &mut self,
        op: &str,
        block: u64,
        requested: Option<u64>,
        words: [u64; BLOCK_WORDS],
    ) {
        let ts = self.tick();
        self.blocks.push(crate::testing::block_event(
            PID, ts, op, block, requested, words,
        ));
    }
    pub(crate) fn malloc(&mut self, block: u64, ptr: u64, size: u64, requested: u64) {
        // Other words: host pointers, a stream handle, flags — nothing that
        // passes the field tests by chance.
        let mut w = [0u64; BLOCK_WORDS];
        for (i, x) in w.iter_mut().enumerate() {
            *x = 0x5555_0000_0000 + (self.ts << 8) + i as u64 * 8 + 3;
        }
        w[0] = 0; // DeviceIndex 0 and padding
        w[self.layout.requested] = requested;
        w[self.layout.size] = size;
        w[self.layout.ptr] = ptr;
        self.words.insert(block, w);
        self.block_event("DeviceCachingAllocator::malloc", block, Some(requested), w);
    }
    /// Mallocs `block` for `req` bytes (rounded to 512) from the first of
    /// `segs` (base, size, bump offset) with room, `cudaMalloc`ing a new
    /// segment at a base made from `step` when none has (2 MiB for a small
    /// request, 20 MiB else): how a random workload grows. Its size.
    pub(crate) fn malloc_carved(
        &mut self,
        segs: &mut Vec<(u64, u64, u64)>,
        step: u64,
        block: u64,
        req: u64,
    ) -> u64 {
        let size = req.div_ceil(512) * 512;
        let i = match segs.iter().position(|&(_, s, off)| off + size <= s) {
            Some(i) => i,
            None => {
                let base = BASE + step * 64 * MIB;
                let sz = if size <= MIB { 2 * MIB } else { 20 * MIB };
                self.cuda_malloc(base, sz);
                segs.push((base, sz, 0));
                segs.len() - 1
            }
        };
        let (base, _, off) = segs[i];
        segs[i].2 += size;
        self.malloc(block, base + off, size, req);
        size
    }
    /// A request of `bytes` the allocator could not serve: a failed
    /// `cudaMalloc`, then a malloc event that returned no block.
    pub(crate) fn failed_request(&mut self, bytes: u64) {
        self.call("cudaMalloc", Some(bytes), Some(0)).ret = 2;
        self.block_event(
            "DeviceCachingAllocator::malloc",
            0,
            Some(bytes),
            [0; BLOCK_WORDS],
        );
    }
    pub(crate) fn free(&mut self, block: u64) {
        let w = self.words.remove(&block).expect("free of a live block");
        self.block_event("DeviceCachingAllocator::free", block, None, w);
    }
    pub(crate) fn data(&self) -> TraceData {
        TraceData {
            calls: self.calls.clone(),
            blocks: self.blocks.clone(),
            processes: vec![ProcessInfo {
                pid: PID,
                comm: "python3".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }
    pub(crate) fn view_at(&self, at: Option<u64>) -> AllocatorView {
        let data = self.data();
        let l = ledger(&data, at);
        allocator_views(&data, at, &l)
            .remove(&PID)
            .expect("a view for the process")
    }
    pub(crate) fn state(&self) -> AllocatorState {
        let v = self.view_at(None);
        assert!(v.calibration.recognised, "{:?}", v.calibration);
        v.state.expect("state")
    }
}

/// The invariant the whole view rests on: segment free bytes add up to the gap.
fn assert_gap_explained(s: &AllocatorState) {
    let free: u64 = s.segments.iter().map(|g| g.free_bytes).sum();
    assert_eq!(
        free as i64, s.gap_bytes,
        "segment free bytes must sum to the gap"
    );
    assert_eq!(s.unexplained_bytes, 0);
    assert!(s.inconsistencies.is_empty(), "{:?}", s.inconsistencies);
    assert_eq!(
        s.pools.small.free_bytes + s.pools.large.free_bytes,
        free,
        "pool split covers every segment"
    );
}

/// Twenty blocks of assorted sizes in two 20 MiB segments, half freed.
fn workload(sim: &mut Sim) -> (u64, u64) {
    let bases = [0x7f00_0000_0000u64, 0x7f00_0200_0000];
    for b in bases {
        sim.cuda_malloc(b, 20 * MIB);
    }
    let (mut allocated, mut requested) = (0, 0);
    for i in 0..20u64 {
        let req = 1_000_000 + i * 12_345;
        let size = req.div_ceil(512) * 512;
        let base = bases[(i % 2) as usize];
        let ptr = base + (i / 2) * 2 * MIB;
        sim.malloc(0x5000 + i * 0x100, ptr, size, req);
        if i % 2 == 1 && i > 10 {
            sim.free(0x5000 + i * 0x100);
        } else {
            allocated += size;
            requested += req;
        }
    }
    (allocated, requested)
}

#[test]
fn calibration_finds_fields_in_different_layouts() {
    for (r, s, p) in [(7, 6, 9), (9, 8, 11), (4, 3, 2), (12, 2, 13)] {
        let mut sim = Sim::new(r, s, p);
        let (allocated, requested) = workload(&mut sim);
        let v = sim.view_at(None);
        let c = &v.calibration;
        assert!(c.recognised, "layout {r}/{s}/{p}: {c:?}");
        assert_eq!(
            (c.requested_index, c.size_index, c.ptr_index),
            (Some(r), Some(s), Some(p)),
            "layout {r}/{s}/{p}"
        );
        assert_eq!(c.malloc_events, 20);
        assert_eq!((c.requested_agree, c.size_agree, c.ptr_agree), (20, 20, 20));
        let st = v.state.unwrap();
        assert_eq!(
            (st.allocated_bytes, st.requested_bytes),
            (allocated, requested)
        );
        assert_gap_explained(&st);
    }
}

#[test]
fn sizes_equal_to_requests_still_calibrate() {
    // Every request a multiple of 512: size and requested_size words are
    // equal; the numbers are the same whichever is picked.
    let mut sim = Sim::new(9, 8, 11);
    sim.cuda_malloc(0x10_0000_0000, 20 * MIB);
    for i in 0..5u64 {
        sim.malloc(0x100 + i, 0x10_0000_0000 + i * 2 * MIB, 2 * MIB, 2 * MIB);
    }
    let v = sim.view_at(None);
    assert_eq!(
        (v.calibration.requested_index, v.calibration.size_index),
        (Some(9), Some(8))
    );
    assert_eq!(v.state.unwrap().allocated_bytes, 10 * MIB);
}

#[test]
fn a_layout_with_no_consistent_index_is_refused() {
    let mut sim = Sim::torch();
    let (_, _) = workload(&mut sim);
    // Scramble: the requested size no longer sits at one index.
    for (i, b) in sim.blocks.iter_mut().enumerate() {
        let r = b.words[7];
        b.words[7] = 0;
        b.words[1 + i % 5] = r;
    }
    let v = sim.view_at(None);
    assert!(!v.calibration.recognised);
    assert!(v.state.is_none());
    let line = v.refusal().unwrap();
    assert!(
        line.starts_with(
            "allocator layout not recognised: no Block word equals the requested size"
        ),
        "{line}"
    );
    assert!(line.ends_with("showing the CUDA-level view"), "{line}");

    // Pointers that lie in no segment are refused too.
    let mut sim = Sim::torch();
    workload(&mut sim);
    for b in &mut sim.blocks {
        b.words[9] = 0x1234_5600 + b.end_ns;
    }
    let v = sim.view_at(None);
    assert_eq!(v.calibration.requested_index, Some(7));
    assert!(v
        .calibration
        .reason
        .as_deref()
        .unwrap()
        .contains("points into a live CUDA segment"));
}

#[test]
fn one_percent_of_unreadable_blocks_is_tolerated_two_is_not() {
    let build = |bad: u64| {
        let mut sim = Sim::torch();
        sim.cuda_malloc(0x10_0000_0000, 200 * MIB);
        for i in 0..100u64 {
            sim.malloc(0x100 + i, 0x10_0000_0000 + i * MIB, MIB, MIB - 100);
        }
        for b in sim.blocks.iter_mut().take(bad as usize) {
            b.words = [0; BLOCK_WORDS]; // unreadable: zeros
        }
        sim.view_at(None).calibration
    };
    let ok = build(1);
    assert!(ok.recognised);
    assert_eq!(ok.requested_agree, 99);
    let refused = build(2);
    assert!(!refused.recognised);
    assert_eq!(refused.requested_agree, 98);
}

#[test]
fn exact_allocated_requested_rounding_and_gap() {
    let mut sim = Sim::torch();
    let (allocated, requested) = workload(&mut sim);
    let s = sim.state();
    assert_eq!(s.allocated_bytes, allocated);
    assert_eq!(s.requested_bytes, requested);
    assert_eq!(s.rounding_bytes, allocated - requested);
    assert_eq!(s.reserved_bytes, 40 * MIB);
    assert_eq!(s.allocator_reserved_bytes, 40 * MIB);
    assert_eq!(s.gap_bytes, (40 * MIB - allocated) as i64);
    assert_eq!(s.live_blocks, 15);
    assert_eq!((s.counts.mallocs, s.counts.frees), (20, 5));
    assert_gap_explained(&s);
    assert_eq!(s.pools.large.segments, 2);
    assert_eq!(s.pools.large.allocated_bytes, allocated);
}

#[test]
fn a_segment_pinned_by_one_small_block_is_named() {
    let mut sim = Sim::torch_with_segment(20 * MIB);
    let base = BASE;
    sim.cuda_malloc(base + 20 * MIB, 20 * MIB);
    sim.malloc(0xa0, base, 18 * MIB, 18 * MIB);
    sim.malloc(0xa1, base + 18 * MIB, 1536 * 1024, 1_500_000);
    sim.malloc(0xb0, base + 20 * MIB, 20 * MIB, 20 * MIB);
    sim.free(0xa0);
    sim.free(0xb0);
    let s = sim.state();
    assert_gap_explained(&s);
    let pinned = &s.segments[0];
    assert_eq!(pinned.live_blocks.len(), 1);
    assert_eq!(pinned.live_blocks[0].requested, 1_500_000);
    assert_eq!(pinned.free_bytes, 20 * MIB - 1536 * 1024);
    assert!(
        pinned.why.starts_with("1 live block(s) pin it"),
        "{}",
        pinned.why
    );
    let empty = &s.segments[1];
    assert_eq!(empty.live_blocks.len(), 0);
    assert!(empty.why.contains("empty_cache() releases it"));
    assert_eq!(s.pinned_free_bytes, pinned.free_bytes);
    assert_eq!(s.releasable_bytes, 20 * MIB);

    // After empty_cache(): the free segment goes back, the pinned one stays.
    sim.block_event(
        "DeviceCachingAllocator::release_block",
        0xb0,
        None,
        [0; BLOCK_WORDS],
    );
    sim.cuda_free(base + 20 * MIB);
    let s = sim.state();
    assert_gap_explained(&s);
    assert_eq!(s.segments.len(), 1);
    assert_eq!(s.gap_bytes as u64, s.pinned_free_bytes);
    assert_eq!(s.counts.segment_releases, 1);
}

#[test]
fn small_pool_segments_are_told_apart() {
    let mut sim = Sim::torch();
    let small = 0x7f00_0000_0000u64;
    let large = 0x7f00_1000_0000u64;
    sim.cuda_malloc(small, 2 * MIB);
    sim.cuda_malloc(large, 20 * MIB);
    for i in 0..8u64 {
        sim.malloc(0x10 + i, small + i * 512, 512, 400 + i);
    }
    sim.malloc(0x99, large, 4 * MIB, 3 * MIB);
    let s = sim.state();
    assert_gap_explained(&s);
    assert_eq!(s.pools.small.reserved_bytes, 2 * MIB);
    assert_eq!(s.pools.small.allocated_bytes, 8 * 512);
    assert_eq!(s.pools.large.reserved_bytes, 20 * MIB);
    assert_eq!(s.pools.large.allocated_bytes, 4 * MIB);
    assert_eq!(
        s.rounding_bytes,
        8 * 512 - (0..8).map(|i| 400 + i).sum::<u64>() + MIB
    );
}

#[test]
fn block_pointer_reuse() {
    let mut sim = Sim::torch_with_segment(20 * MIB);
    let base = BASE;
    // Freed then handed out again for another block: keyed by Block*, replaced.
    sim.malloc(0xb1, base, 4 * MIB, 4 * MIB);
    sim.free(0xb1);
    sim.malloc(0xb1, base + 8 * MIB, 2 * MIB, 2 * MIB - 7);
    // Allocated bytes, live blocks, and mallocs that returned a still-live Block*.
    let reuse = |s: &AllocatorState| {
        (
            s.allocated_bytes,
            s.live_blocks,
            s.counts.reused_live_blocks,
        )
    };
    let s = sim.state();
    assert_eq!(reuse(&s), (2 * MIB, 1, 0));
    assert_eq!(s.segments[0].live_blocks[0].ptr, Ptr(base + 8 * MIB));
    assert_gap_explained(&s);
    // A malloc returning a Block* still live: its free was lost; the new one replaces it.
    sim.malloc(0xb1, base + 12 * MIB, 6 * MIB, 6 * MIB);
    let s = sim.state();
    assert_eq!(reuse(&s), (6 * MIB, 1, 1));
    // A free of a block from before the trace is counted, not applied; its
    // size is recovered from the block's own size word.
    let mut pre = [0; BLOCK_WORDS];
    pre[sim.layout.size] = 3 * MIB;
    sim.words.insert(0xdead, pre);
    sim.free(0xdead);
    let s = sim.state();
    assert_eq!(s.counts.unmatched_frees, 1);
    assert_eq!(s.counts.unmatched_free_bytes, 3 * MIB);
    assert_eq!(s.allocated_bytes, 6 * MIB, "not applied to the live blocks");
}

#[test]
fn expandable_segments_use_mapped_pages() {
    let mut sim = Sim::new(9, 8, 11);
    let va = 0x7e00_0000_0000u64;
    sim.call("cuMemAddressReserve", Some(1 << 36), Some(va));
    for (i, h) in [0x51u64, 0x52, 0x53].iter().enumerate() {
        sim.call("cuMemCreate", Some(20 * MIB), Some(*h));
        sim.call("cuMemMap", Some(20 * MIB), Some(va + i as u64 * 20 * MIB));
    }
    // One block spans the first two pages, one sits in the third.
    sim.malloc(0xc0, va, 30 * MIB, 30 * MIB - 1000);
    sim.malloc(0xc1, va + 40 * MIB, 5 * MIB, 5 * MIB);
    sim.malloc(0xc2, va + 45 * MIB, 5 * MIB, 5 * MIB);
    sim.free(0xc2);
    let s = sim.state();
    assert!(s.expandable);
    assert_eq!(s.reserved_bytes, 60 * MIB);
    assert_eq!(s.allocated_bytes, 35 * MIB);
    assert_eq!(s.segments.len(), 3);
    assert!(s.segments.iter().all(|g| g.kind == SegmentKind::Mapped));
    assert_eq!(
        s.segments.iter().map(|g| g.free_bytes).collect::<Vec<_>>(),
        [0, 10 * MIB, 15 * MIB]
    );
    assert!(s.segments[1]
        .why
        .contains("mapped page of an expandable segment"));
    assert_gap_explained(&s);

    // Unmapping and releasing a page (torch shrinking) follows too.
    sim.free(0xc1);
    sim.call("cuMemUnmap", Some(20 * MIB), Some(va + 40 * MIB));
    sim.call("cuMemRelease", None, Some(0x53));
    let s = sim.state();
    assert_eq!((s.reserved_bytes, s.segments.len()), (40 * MIB, 2));
    assert_gap_explained(&s);
}

#[test]
fn at_a_moment_follows_the_ledger_semantics() {
    let mut sim = Sim::torch_with_segment(20 * MIB);
    let base = BASE;
    sim.malloc(0x1, base, 4 * MIB, 4 * MIB);
    let t_after_first = sim.ts;
    sim.malloc(0x2, base + 4 * MIB, 4 * MIB, 4 * MIB);
    sim.free(0x1);
    let at = |t| sim.view_at(Some(t)).state.unwrap();
    assert_eq!(at(t_after_first).allocated_bytes, 4 * MIB);
    assert_eq!(at(t_after_first - 1).allocated_bytes, 0);
    assert_eq!(at(sim.ts).allocated_bytes, 4 * MIB);
    assert_gap_explained(&at(t_after_first));
    // The peak: reserved after a block event, with the gap then.
    let s = sim.state();
    let peak = s.peak.unwrap();
    assert_eq!(
        (peak.reserved_bytes, peak.allocated_bytes),
        (20 * MIB, 4 * MIB)
    );
}

#[test]
fn blocks_outside_every_segment_and_foreign_memory_are_reported() {
    let mut sim = Sim::torch_with_segment(20 * MIB);
    let base = BASE;
    sim.cuda_malloc(0x7a00_0000_0000, 8 * MIB); // some other library's buffer
    sim.malloc(0x1, base, 4 * MIB, 4 * MIB);
    for i in 0..200u64 {
        sim.malloc(0x100 + i, base + 4 * MIB + i * 512, 512, 512);
    }
    // The segment's free is lost; the block stays live but its segment is gone.
    sim.cuda_free(base);
    let v = sim.view_at(None);
    let s = v.state.unwrap();
    assert_eq!(s.outside_allocator_bytes, 8 * MIB);
    assert_eq!(s.segments.len(), 1);
    assert!(!s.segments[0].allocator_owned);
    assert!(s.segments[0].why.contains("not the caching allocator's"));
    assert_ne!(s.unexplained_bytes, 0);
    crate::testing::assert_some_line(&s.inconsistencies, |i| {
        i.contains("201 live block(s) lie (partly) outside every live segment")
    });
}

#[test]
fn failures_record_the_gap_at_that_moment() {
    let mut sim = Sim::torch_with_segment(100 * MIB);
    let base = BASE;
    sim.malloc(0x1, base, 10 * MIB, 10 * MIB);
    sim.failed_request(80 * MIB);
    let s = sim.state();
    assert_eq!(s.failures.len(), 2);
    assert_eq!(s.failures[0].op, "cudaMalloc");
    assert_eq!(s.failures[1].op, "DeviceCachingAllocator::malloc");
    for f in &s.failures {
        assert_eq!((f.bytes, f.at.gap_bytes), (80 * MIB, (90 * MIB) as i64));
    }
    assert_eq!(s.counts.failed_mallocs, 1);
}

#[test]
fn random_workloads_always_explain_the_gap_exactly() {
    let mut next = crate::testing::xorshift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..50 {
        let mut sim = Sim::torch();
        let mut live: Vec<(u64, u64)> = Vec::new(); // (Block*, size)
        let mut segs: Vec<(u64, u64, u64)> = Vec::new(); // (base, size, bump offset)
        let mut block_id = 0x1000u64;
        for step in 0..150u64 {
            let r = next();
            if r.is_multiple_of(4) && !live.is_empty() {
                let (b, _) = live.swap_remove((r as usize / 4) % live.len());
                sim.free(b);
                continue;
            }
            block_id += 0x40;
            let size = sim.malloc_carved(&mut segs, step, block_id, 1 + r % (3 * MIB));
            live.push((block_id, size));
        }
        let s = sim.state();
        let reserved: u64 = segs.iter().map(|s| s.1).sum();
        assert_eq!(s.allocated_bytes, live.iter().map(|l| l.1).sum::<u64>());
        assert_eq!(s.reserved_bytes, reserved);
        assert_gap_explained(&s);
    }
}

#[test]
fn view_serializes_with_the_documented_fields() {
    let mut sim = Sim::torch();
    workload(&mut sim);
    let v = serde_json::to_value(sim.view_at(None)).unwrap();
    for k in [
        "calibration",
        "allocated_bytes",
        "requested_bytes",
        "reserved_bytes",
        "gap_bytes",
        "pools",
        "segments",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    assert_eq!(v["calibration"]["requested_index"], 7);
    assert_eq!(v["segment_count"], 2);

    let t = sim.view_at(None).trimmed(1, 2);
    let s = t.state.unwrap();
    assert_eq!((s.segments.len(), s.segment_count), (1, 2));
    assert_eq!(s.segments[0].live_blocks.len(), 2);
    assert!(s.segments[0].live_block_count > 2);
    let free_max = sim.state().segments.iter().map(|g| g.free_bytes).max();
    assert_eq!(Some(s.segments[0].free_bytes), free_max);
    assert!(v["segments"][0]["base"]
        .as_str()
        .unwrap()
        .starts_with("0x7f"));
    assert!(v["pools"]["small"].get("reserved_bytes").is_some());
}

#[test]
fn other_libraries_memory_is_reserved_but_not_part_of_the_gap() {
    // As on the H200: cuBLAS's workspace (a direct driver allocation) sits
    // beside the allocator's segments. PyTorch's gap is reserved − allocated of
    // its own segments, and their free bytes explain it exactly.
    let mut sim = Sim::torch_with_segment(20 * MIB);
    let base = BASE;
    sim.cuda_malloc(0x7a00_0000_0000, 64 * MIB); // not the allocator's
    sim.malloc(0x1, base, 4 * MIB, 4 * MIB - 100);
    let s = sim.view_at(None).state.unwrap();
    assert_eq!(s.reserved_bytes, 84 * MIB);
    assert_eq!(s.allocator_reserved_bytes, 20 * MIB);
    assert_eq!(s.outside_allocator_bytes, 64 * MIB);
    assert_eq!(s.gap_bytes, (16 * MIB) as i64);
    let owned_free: u64 = s
        .segments
        .iter()
        .filter(|g| g.allocator_owned)
        .map(|g| g.free_bytes)
        .sum();
    assert_eq!(owned_free as i64, s.gap_bytes);
    assert_eq!(s.unexplained_bytes, 0);
    assert_eq!(
        s.pools.small.reserved_bytes + s.pools.large.reserved_bytes,
        20 * MIB
    );
}

/// A trace's steps, counting the passes made over them.
struct CountedPasses<'a> {
    data: &'a TraceData,
    passes: std::cell::Cell<u32>,
}

impl StepSource for CountedPasses<'_> {
    fn for_each_step(&self, pid: u32, until: Option<u64>, visit: &mut dyn FnMut(Step<'_>) -> bool) {
        self.passes.set(self.passes.get() + 1);
        self.data.for_each_step(pid, until, visit);
    }
}

#[test]
fn a_guessed_layout_gives_the_same_views_in_one_pass_when_right() {
    let right = Layout {
        requested: 9,
        size: 8,
        ptr: 11,
    };
    let wrong = Layout {
        requested: 9,
        size: 11,
        ptr: 8,
    };
    let mut sim = Sim::new(9, 8, 11);
    workload(&mut sim);
    sim.failed_request(64 * MIB);
    // The same workload with its requested sizes scrambled: refused.
    let mut refused = Sim::new(9, 8, 11);
    workload(&mut refused);
    for (i, b) in refused.blocks.iter_mut().enumerate() {
        let r = b.words[9];
        b.words[9] = 0;
        b.words[1 + i % 5] = r;
    }
    for (sim, recognised) in [(&sim, true), (&refused, false)] {
        let data = sim.data();
        let mid = data.blocks[10].end_ns;
        for at in [None, Some(mid), Some(mid - 1), Some(0)] {
            let l = ledger(&data, at);
            let want = allocator_views_of(&data, &data, &[PID], at, &l, &BTreeMap::new());
            assert_eq!(want[&PID].calibration.recognised, recognised);
            // A right guess: one pass; a wrong one or none: the calibration's
            // pass, then its replay (none when it found no layout).
            let other = if recognised { 2 } else { 1 };
            for (guess, passes) in [(Some(right), 1), (Some(wrong), other), (None, other)] {
                let src = CountedPasses {
                    data: &data,
                    passes: Default::default(),
                };
                let guesses: BTreeMap<u32, Layout> = guess.map(|g| (PID, g)).into_iter().collect();
                let got = allocator_views_guessed(&src, &data, &[PID], at, &l, &guesses);
                assert_eq!(got, want, "guess {guess:?} at {at:?}");
                assert_eq!(src.passes.get(), passes, "guess {guess:?} at {at:?}");
                // A window's views (reserved bytes counted by the pass).
                let none = BTreeMap::new();
                let want = KnownViews::until(&data, &data, &[PID], at, &none);
                let got = KnownViews::until_guessed(&data, &data, &[PID], at, &guesses);
                assert_eq!(got.end(), want.end(), "until, guess {guess:?} at {at:?}");
                assert_eq!(got.moments(), want.moments(), "guess {guess:?} at {at:?}");
            }
        }
        // An explanation's views: those at the end and at the failure.
        let l = ledger(&data, None);
        let want = KnownViews::of_pids(&data, &data, &[PID], &l);
        let guesses = BTreeMap::from([(PID, right)]);
        let got = KnownViews::of_pids_guessed(&data, &data, &[PID], &l, &guesses);
        assert_eq!(got.end(), want.end());
        assert_eq!(got.moments(), want.moments());
        assert_eq!(want.moments().is_empty(), !recognised);
    }
}

#[test]
fn a_views_live_block_takes_56_bytes_and_reads_as_it_is_written() {
    // A view holds every live block: an optional stack id and site of 16
    // bytes each made one 72 (500,000 live blocks at the tracer's peak:
    // 36 MB).
    assert_eq!(std::mem::size_of::<LiveBlock>(), 56);
    let b = LiveBlock {
        block: Ptr(0x10),
        ptr: Ptr(0x7f00_0000_0000),
        size: 512,
        requested: 500,
        since_ns: 9,
        stack_id: NonZeroU64::new(0xfeed),
        site: Some(String::from("train.py:12").into()),
    };
    let json = serde_json::to_value(&b).unwrap();
    assert_eq!(json["stack_id"], 0xfeed);
    assert_eq!(json["site"], "train.py:12");
    assert_eq!(serde_json::from_value::<LiveBlock>(json).unwrap(), b);
    // Without a site or a stack id, neither is written; a stored 0 (the
    // capture's "none") reads as none.
    let bare = LiveBlock {
        stack_id: None,
        site: None,
        ..b
    };
    let json = serde_json::to_value(&bare).unwrap();
    assert!(
        json.get("stack_id").is_none() && json.get("site").is_none(),
        "{json}"
    );
    assert_eq!(serde_json::from_value::<LiveBlock>(json).unwrap(), bare);
    let mut zero = serde_json::to_value(&bare).unwrap();
    zero["stack_id"] = 0.into();
    assert_eq!(serde_json::from_value::<LiveBlock>(zero).unwrap(), bare);
}
