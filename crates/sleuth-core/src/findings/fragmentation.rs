//! `fragmentation`: PyTorch's caching allocator holds much more than its live
//! tensors, and the gap is explained segment by segment from the rebuilt
//! allocator state (`crate::allocator`). Only the allocator's own segments
//! count (memory of other libraries is not the allocator's gap).

use super::*;
use crate::allocator::{
    AllocatorReads, AllocatorState, AllocatorView, FailedRequest, Pool, Segment,
};
use crate::ledger::ProcessLedger;
use crate::units::fmt_bytes;
use serde_json::json;

/// The allocator's gap (reserved − allocated) must be at least this ...
pub const FRAGMENTATION_MIN_GAP_BYTES: u64 = 32 << 20;
/// ... and at least this share of its reserved bytes, at the end or at the reserved peak.
pub const FRAGMENTATION_MIN_GAP_SHARE: f64 = 0.10;
/// Gap share from which severity is medium (a failure with gap ≥ request is high).
pub const FRAGMENTATION_MEDIUM_SHARE: f64 = 0.25;
/// "One or few" blocks pinning a segment ...
pub const FRAGMENTATION_FEW_BLOCKS: usize = 3;
/// ... using at most this share of it.
pub const FRAGMENTATION_PIN_MAX_SHARE: f64 = 0.125;
/// From this many pinned large segments the gap is "spread".
pub const FRAGMENTATION_MANY_SEGMENTS: usize = 4;
/// Segments larger than this in the large pool are oversize: PyTorch split
/// them to serve smaller requests (`kLargeBuffer`, 20 MiB).
pub const FRAGMENTATION_LARGE_BUFFER: u64 = 20 << 20;
/// Segments (and pinning blocks per segment) shown as evidence.
pub const FRAGMENTATION_EVIDENCE_SEGMENTS: usize = 5;

/// Whether a gap is large enough to report.
pub fn gap_is_large(gap: i64, reserved: u64) -> bool {
    gap >= FRAGMENTATION_MIN_GAP_BYTES as i64
        && gap as f64 >= FRAGMENTATION_MIN_GAP_SHARE * reserved as f64
}

fn cache_gap(s: &AllocatorState) -> i64 {
    s.allocator_reserved_bytes as i64 - s.allocated_bytes as i64
}

/// Why the finding fires and at which moment the evidence is taken.
enum Trigger {
    End,
    Peak(u64),
    Failure {
        ts: u64,
        bytes: u64,
        op: &'static str,
    },
}

/// What to do about it, decided from the pinned segments.
struct Advice {
    case: &'static str,
    text: String,
}

fn advise(s: &AllocatorState) -> Advice {
    let mut pinned: Vec<&Segment> = s
        .segments
        .iter()
        .filter(|g| g.allocator_owned && !g.live_blocks.is_empty() && g.free_bytes > 0)
        .collect();
    pinned.sort_by(|a, b| b.free_bytes.cmp(&a.free_bytes).then(a.base.cmp(&b.base)));
    let pinned_free = s.pinned_free_bytes;
    if s.releasable_bytes >= pinned_free {
        return Advice {
            case: "cached_free_segments",
            text: format!(
                "Most of the gap ({}) is in entirely free cached segments: torch.cuda.empty_cache() returns \
                 them to the device. They are reused by this process anyway; release them only when another \
                 process needs the memory.",
                fmt_bytes(s.releasable_bytes)
            ),
        };
    }
    if s.expandable {
        return Advice {
            case: "expandable_pages_pinned",
            text: "expandable_segments is already on: what remains is free space in mapped pages that live \
                   blocks overlap. Free (or allocate later / earlier, together) the tensors that pin those \
                   pages; see the pinning blocks in the evidence."
                .to_string(),
        };
    }
    if let Some(top) = pinned.first() {
        let few = top.live_blocks.len() <= FRAGMENTATION_FEW_BLOCKS
            && top.live_bytes as f64 <= FRAGMENTATION_PIN_MAX_SHARE * top.size as f64;
        if few && top.free_bytes.saturating_mul(2) >= pinned_free {
            return Advice {
                case: "few_blocks_pin",
                text: format!(
                    "Free the tensor(s) pinning segment {:#x}: {} live block(s) of {} keep a {} segment from \
                     being released. Delete them (or move them to the CPU) before torch.cuda.empty_cache(), or \
                     allocate such long-lived small tensors before the large temporary ones.",
                    top.base.0,
                    top.live_blocks.len(),
                    fmt_bytes(top.live_bytes),
                    fmt_bytes(top.size)
                ),
            };
        }
    }
    let split: Vec<&&Segment> = pinned
        .iter()
        .filter(|g| g.pool == Pool::Large && g.size > FRAGMENTATION_LARGE_BUFFER)
        .collect();
    let split_free: u64 = split
        .iter()
        .fold(0u64, |a, g| a.saturating_add(g.free_bytes));
    if let Some(smallest) = split.iter().map(|g| g.size).min() {
        if split_free.saturating_mul(2) >= pinned_free {
            let mb = (smallest >> 20) / 2;
            let mb = mb.max(21);
            return Advice {
                case: "large_segments_split",
                text: format!(
                    "{} of the gap sits in {} oversize segment(s) split by smaller blocks: set \
                     PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{mb} so blocks larger than that are not split \
                     (or expandable_segments:True).",
                    fmt_bytes(split_free),
                    split.len()
                ),
            };
        }
    }
    let large = pinned.iter().filter(|g| g.pool == Pool::Large).count();
    let spread = if large >= FRAGMENTATION_MANY_SEGMENTS {
        format!("the non-releasable gap is spread over {large} large segments")
    } else {
        format!(
            "{} pinned segment(s) hold the non-releasable gap",
            pinned.len()
        )
    };
    Advice {
        case: "spread_over_segments",
        text: format!(
            "{spread}: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so the allocator grows one \
             segment in pages and can unmap free pages."
        ),
    }
}

fn segment_json(g: &Segment) -> serde_json::Value {
    let blocks: Vec<_> = g
        .live_blocks
        .iter()
        .take(FRAGMENTATION_EVIDENCE_SEGMENTS)
        .map(|b| json!({"ptr": b.ptr, "size": b.size, "requested": b.requested, "since_ns": b.since_ns, "site": b.site}))
        .collect();
    json!({
        "base": g.base, "size": g.size, "kind": g.kind, "pool": g.pool,
        "free_bytes": g.free_bytes, "live_bytes": g.live_bytes,
        "live_blocks": g.live_blocks.len(), "pinning_blocks": blocks, "why": g.why,
    })
}

/// What makes the finding of a process's end state, if anything: a
/// failed request the gap could have served, a large gap at the end, or
/// one at the allocator's reserved peak.
fn trigger_of(end: &AllocatorState) -> Option<Trigger> {
    let failure = first_servable_failure(end);
    Some(if let Some(f) = failure {
        Trigger::Failure {
            ts: f.at.ts_ns,
            bytes: f.bytes,
            op: f.op,
        }
    } else if gap_is_large(cache_gap(end), end.allocator_reserved_bytes) {
        Trigger::End
    } else {
        let p = end.peak.as_ref()?;
        if !gap_is_large(p.gap_bytes, p.reserved_bytes) {
            return None;
        }
        Trigger::Peak(p.ts_ns)
    })
}

/// The first failed request the gap could have served: once a replay
/// has one it stays the first whatever comes after.
fn first_servable_failure(end: &AllocatorState) -> Option<&FailedRequest> {
    end.failures
        .iter()
        .find(|f| f.bytes > 0 && f.at.gap_bytes >= f.bytes as i64)
}

/// Every moment whose state the finding of a later state of the same
/// replay may describe, from `end`: the reserved peak so far and the
/// first failure the gap could have served (a replay carried across a
/// run's files keeps the views at these: `allocator::CarriedReplay`).
pub(crate) fn moments_kept(end: &AllocatorState) -> Vec<u64> {
    let peak = end.peak.as_ref().map(|p| p.ts_ns);
    let failure = first_servable_failure(end).map(|f| f.at.ts_ns);
    let mut v: Vec<u64> = peak.into_iter().chain(failure).collect();
    v.dedup();
    v
}

/// The moment whose allocator state the finding of `end` describes, when
/// it is not the end itself (a failure, the reserved peak).
pub(crate) fn moment_of(end: &AllocatorState) -> Option<u64> {
    match trigger_of(end)? {
        Trigger::End => None,
        Trigger::Peak(ts) | Trigger::Failure { ts, .. } => Some(ts),
    }
}

/// The finding for one process's allocator view (its ledger supplies
/// reserved bytes); the state at a failure or at the peak from `reads`.
pub(super) fn fragmentation(
    view: &AllocatorView,
    ledgers: &[ProcessLedger],
    reads: &dyn AllocatorReads,
) -> Option<Finding> {
    let end = view.state.as_ref()?;
    let trigger = trigger_of(end)?;
    // The state the evidence describes: the end, or the moment that triggered.
    let moment_view;
    let (moment, state) = match trigger {
        Trigger::End => ("end", end),
        Trigger::Peak(ts) | Trigger::Failure { ts, .. } => {
            moment_view = reads.view_at(view.pid, ts)?;
            let s = moment_view.state.as_ref()?;
            (
                if matches!(trigger, Trigger::Peak(_)) {
                    "peak"
                } else {
                    "failure"
                },
                s,
            )
        }
    };
    let gap = cache_gap(state);
    let reserved = state.allocator_reserved_bytes;
    let share = if reserved == 0 {
        0.0
    } else {
        gap as f64 / reserved as f64
    };
    let severity = if matches!(trigger, Trigger::Failure { .. }) {
        Severity::High
    } else if share >= FRAGMENTATION_MEDIUM_SHARE {
        Severity::Medium
    } else {
        Severity::Low
    };
    let advice = advise(state);
    if advice.case == "cached_free_segments" && !matches!(trigger, Trigger::Failure { .. }) {
        // The gap is the cache itself, in entirely free segments the
        // process reuses: not fragmentation, and nothing to do while no
        // request failed (round 55's tester: a caching-allocator loop that
        // reused its cache perfectly got a medium finding at its end, whose
        // advice was "they are reused by this process anyway").
        return None;
    }
    let mut top: Vec<&Segment> = state
        .segments
        .iter()
        .filter(|g| g.allocator_owned && g.free_bytes > 0)
        .collect();
    top.sort_by(|a, b| b.free_bytes.cmp(&a.free_bytes).then(a.base.cmp(&b.base)));
    let top_json: Vec<_> = top
        .iter()
        .take(FRAGMENTATION_EVIDENCE_SEGMENTS)
        .map(|g| segment_json(g))
        .collect();
    let comm = ledgers
        .iter()
        .find(|l| l.pid == view.pid)
        .map(|l| l.comm.as_str())
        .unwrap_or("?");
    let when = match trigger {
        Trigger::End => "at the end".to_string(),
        Trigger::Peak(_) => "at its reserved peak".to_string(),
        Trigger::Failure { bytes, op, .. } => {
            format!(
                "when {op} of {} failed although the cache held more than that unused",
                fmt_bytes(bytes)
            )
        }
    };
    Some(Finding {
        kind: Kind::Fragmentation,
        severity,
        op: "DeviceCachingAllocator::malloc".to_string(),
        pids: vec![view.pid],
        summary: format!(
            "PyTorch's allocator in {comm} (pid {}) reserved {} but had {} allocated {when}: a gap of {} \
             ({:.0}%), {} of it pinned by live blocks in {} segment(s)",
            view.pid,
            fmt_bytes(reserved),
            fmt_bytes(state.allocated_bytes),
            fmt_bytes(gap.max(0) as u64),
            share * 100.0,
            fmt_bytes(state.pinned_free_bytes),
            top.iter().filter(|g| !g.live_blocks.is_empty()).count(),
        ),
        evidence: json!({
            "moment": moment,
            "reserved_bytes": reserved,
            "allocated_bytes": state.allocated_bytes,
            "requested_bytes": state.requested_bytes,
            "gap_bytes": gap,
            "gap_share": share,
            "pinned_free_bytes": state.pinned_free_bytes,
            "releasable_bytes": state.releasable_bytes,
            "outside_allocator_bytes": state.outside_allocator_bytes,
            "pools": state.pools,
            "expandable_segments": state.expandable,
            "top_segments": top_json,
            "case": advice.case,
            "calibration": view.calibration,
            "known": "block and segment addresses, sizes and times, measured from the allocator's own events",
            "call_sites": if state.segments.iter().any(|g| g.live_blocks.iter().any(|b| b.site.is_some())) {
                json!("each pinning block's `site` is the line that allocated it")
            } else {
                json!("unknown: stacks were not captured, so the Python lines that allocated the pinning blocks are not known")
            },
        }),
        culprits: Vec::new(),
        recommendation: advice.text,
        impact_ns: gap.max(0) as u64,
        wall_share: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::allocator_views;
    use crate::allocator::tests::Sim;
    use crate::ledger::ledger;

    const MIB: u64 = 1 << 20;

    fn finding(sim: &Sim) -> Option<Finding> {
        let data = sim.data();
        let l = ledger(&data, None);
        let views = allocator_views(&data, None, &l);
        fragmentation(views.values().next()?, &l, &data)
    }

    /// One segment of `reserved` bytes holding one block of `allocated`.
    fn one_segment(reserved: u64, allocated: u64) -> Sim {
        let mut sim = Sim::torch();
        sim.cuda_malloc(0x7f00_0000_0000, reserved);
        sim.malloc(0x1, 0x7f00_0000_0000, allocated, allocated);
        sim
    }

    /// A torch process with `n` segments of `size` bytes, 256 MiB apart;
    /// `fill(sim, index, base)` carves each one's blocks right after it.
    fn segments(n: u64, size: u64, mut fill: impl FnMut(&mut Sim, u64, u64)) -> Sim {
        let mut sim = Sim::torch();
        for s in 0..n {
            let base = 0x7f00_0000_0000 + s * 0x1000_0000;
            sim.cuda_malloc(base, size);
            fill(&mut sim, s, base);
        }
        sim
    }

    #[test]
    fn gap_thresholds_at_their_edges() {
        // 32 MiB gap, exactly 10% of reserved: fires.
        let f = finding(&one_segment(320 * MIB, 288 * MIB)).expect("at the edge");
        assert_eq!(f.kind, Kind::Fragmentation);
        assert_eq!(f.severity, Severity::Low);
        assert_eq!(f.evidence["gap_bytes"], 32 * MIB);
        // 512 B less gap: below the byte threshold.
        assert!(finding(&one_segment(320 * MIB, 288 * MIB + 512)).is_none());
        // ≥ 32 MiB but under 10% of reserved.
        assert!(finding(&one_segment(400 * MIB, 360 * MIB + 512)).is_none());
        assert!(finding(&one_segment(400 * MIB, 360 * MIB)).is_some());
        // 25% is medium.
        let f = finding(&one_segment(400 * MIB, 300 * MIB)).unwrap();
        assert_eq!(f.severity, Severity::Medium);
    }

    #[test]
    fn a_gap_only_at_the_peak_fires_with_evidence_from_then() {
        let mut sim = one_segment(320 * MIB, 100 * MIB);
        let peak_ts = sim.blocks.last().unwrap().end_ns;
        // Later the gap closes: a big block fills the segment.
        sim.malloc(0x2, 0x7f00_0000_0000 + 100 * MIB, 220 * MIB, 220 * MIB);
        let f = finding(&sim).expect("peak trigger");
        assert_eq!(f.evidence["moment"], "peak");
        assert_eq!(f.evidence["gap_bytes"], 220 * MIB);
        assert!(f.summary.contains("at its reserved peak"), "{}", f.summary);
        let _ = peak_ts;
    }

    #[test]
    fn a_failure_while_the_cache_could_have_served_it_is_high() {
        let mut sim = one_segment(100 * MIB, 90 * MIB);
        // 10 MiB free in the cache; a 4 MiB request fails anyway: fires even
        // though the gap is below the size thresholds.
        sim.block_event("DeviceCachingAllocator::malloc", 0, Some(4 * MIB), [0; 16]);
        let f = finding(&sim).expect("failure trigger");
        assert_eq!(
            (f.severity, f.evidence["moment"].as_str()),
            (Severity::High, Some("failure"))
        );
        // A request larger than the gap is not fragmentation.
        let mut sim = one_segment(100 * MIB, 90 * MIB);
        sim.block_event(
            "DeviceCachingAllocator::malloc",
            0,
            Some(10 * MIB + 512),
            [0; 16],
        );
        assert!(finding(&sim).is_none());
    }

    #[test]
    fn one_small_block_pinning_a_big_segment_says_free_it() {
        let mut sim = Sim::torch();
        let base = 0x7f00_0000_0000u64;
        sim.cuda_malloc(base, 200 * MIB);
        sim.malloc(0x1, base, 198 * MIB, 198 * MIB);
        sim.malloc(0x2, base + 198 * MIB, 2 * MIB, 2 * MIB - 100);
        sim.free(0x1);
        let f = finding(&sim).unwrap();
        assert_eq!(f.evidence["case"], "few_blocks_pin");
        assert!(f
            .recommendation
            .starts_with("Free the tensor(s) pinning segment 0x7f0000000000"));
        let top = &f.evidence["top_segments"][0];
        assert_eq!(top["live_blocks"], 1);
        assert_eq!(top["pinning_blocks"][0]["requested"], 2 * MIB - 100);
        assert!(f.evidence["call_sites"]
            .as_str()
            .unwrap()
            .starts_with("unknown"));
    }

    #[test]
    fn oversize_segments_split_by_smaller_blocks_suggest_max_split_size() {
        // Four 10 MiB blocks spread over each segment: 60 MiB free in holes.
        let sim = segments(2, 100 * MIB, |sim, s, base| {
            for i in 0..4u64 {
                sim.malloc(0x100 * (s + 1) + i, base + i * 25 * MIB, 10 * MIB, 10 * MIB);
            }
        });
        let f = finding(&sim).unwrap();
        assert_eq!(f.evidence["case"], "large_segments_split");
        assert!(
            f.recommendation.contains("max_split_size_mb:50"),
            "{}",
            f.recommendation
        );
    }

    #[test]
    fn many_pinned_standard_segments_suggest_expandable_segments() {
        let sim = segments(6, 20 * MIB, |sim, s, base| {
            sim.malloc(0x100 + s, base, 12 * MIB, 12 * MIB)
        });
        let f = finding(&sim).unwrap();
        assert_eq!(f.evidence["case"], "spread_over_segments");
        assert!(f.recommendation.contains("expandable_segments:True"));
        assert!(f.recommendation.contains("spread over 6 large segments"));
    }

    /// A gap held in entirely free cached segments is the cache the
    /// process reuses, not fragmentation: no finding at the end or at the
    /// peak (round 55's tester: a loop that reused its cache perfectly got
    /// a medium finding). A request that failed while it could have been
    /// served is one, and points at `empty_cache()`.
    #[test]
    fn entirely_free_cached_segments_are_the_cache_unless_a_request_failed() {
        let cached = || {
            let mut sim = one_segment(20 * MIB, 20 * MIB);
            sim.cuda_malloc(0x7f00_1000_0000, 100 * MIB);
            sim.malloc(0x9, 0x7f00_1000_0000, 100 * MIB, 100 * MIB);
            sim.free(0x9);
            sim
        };
        assert!(finding(&cached()).is_none());
        let mut sim = cached();
        sim.block_event("DeviceCachingAllocator::malloc", 0, Some(4 * MIB), [0; 16]);
        let f = finding(&sim).expect("failure trigger");
        assert_eq!(f.evidence["case"], "cached_free_segments");
        assert_eq!(f.severity, Severity::High);
        assert!(f.recommendation.contains("empty_cache()"));
    }

    #[test]
    fn a_refused_layout_gives_no_finding() {
        let mut sim = one_segment(320 * MIB, 100 * MIB);
        for b in &mut sim.blocks {
            b.words = [0; 16];
        }
        assert!(finding(&sim).is_none());
    }
}
