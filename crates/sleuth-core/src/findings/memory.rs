//! Findings about GPU memory: allocation_failure, memory_growth, allocation_churn.
//! They read the per-process ledger (each allocation counted once).

use super::*;
use crate::ledger::ProcessLedger;
use crate::units::fmt_bytes;
use serde_json::json;
use std::collections::BTreeMap;

/// Failed allocations of one process.
pub(super) fn allocation_failure(l: &ProcessLedger) -> Option<Finding> {
    if l.failed_alloc_count() < ALLOC_FAILURE_MIN_COUNT as u64 {
        return None;
    }
    let first = l.failed_allocs.first()?;
    // `expandable_segments` helps when the process holds memory in fixed
    // segments (plain cudaMalloc / cuMemAlloc); a process already using the
    // virtual memory API has it (or an equivalent) on.
    let uses_vmm = l.vmm_bytes > 0 || l.unfreed.iter().any(|u| u.op == "cuMemCreate");
    let held = first.live_bytes_at;
    // Fragmentation can only explain the failure when the process itself
    // holds at least as much as it asked for.
    let fragmentation_applies = held > 0 && held >= first.bytes && !uses_vmm;
    let hint = if held == 0 {
        "the process held no device memory of its own when the request failed: the device is full of other \
         processes' memory (see `gpusleuth vram`) or the request exceeds the device"
            .to_string()
    } else if fragmentation_applies {
        format!(
            "the process held {} in fixed segments when {} more was requested; the caching allocator's reserved \
             but unused space can fragment it (live bytes here are what the driver handed out, the allocator's \
             in-use part is not visible)",
            fmt_bytes(held),
            fmt_bytes(first.bytes)
        )
    } else if uses_vmm {
        format!(
            "the process held {} (virtual-memory API in use) when {} more was requested",
            fmt_bytes(held),
            fmt_bytes(first.bytes)
        )
    } else {
        format!(
            "the request ({}) is larger than all the process held ({}): fragmentation of its own memory \
             cannot explain it; the device is full of other memory or the request exceeds it",
            fmt_bytes(first.bytes),
            fmt_bytes(held)
        )
    };
    let mut recommendation = String::from(
        "Reduce the working set (batch size, sequence length, model precision) or free memory before the large \
         allocation; check other processes on the device with `gpusleuth vram`.",
    );
    if fragmentation_applies {
        recommendation.push_str(
            " For PyTorch, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to cut fragmentation of reserved memory.",
        );
    }
    let examples: Vec<_> = l
        .failed_allocs
        .iter()
        .take(EXAMPLE_CALLS)
        .map(|f| {
            json!({"op": f.op, "bytes": f.bytes, "error": f.error, "error_name": error_name(f.error),
                   "ts_ns": f.ts_ns, "live_bytes_at": f.live_bytes_at, "site": f.site})
        })
        .collect();
    let at = first
        .site
        .as_deref()
        .map(|s| format!(" at {s}"))
        .unwrap_or_default();
    Some(Finding {
        kind: Kind::AllocationFailure,
        severity: Severity::High,
        op: first.op.to_string(),
        pids: vec![l.pid],
        summary: format!(
            "{} allocation(s) failed in {} (pid {}): first {} of {}{at} returned {} ({}) with {} live",
            l.failed_alloc_count(),
            l.comm,
            l.pid,
            first.op,
            fmt_bytes(first.bytes),
            first.error,
            error_name(first.error),
            fmt_bytes(held)
        ),
        evidence: json!({
            "failures": l.failed_alloc_count(),
            "examples": examples,
            "peak_bytes": l.peak_bytes,
            "peak_ts_ns": l.peak_ts_ns,
            "fragmentation_hint": hint,
            "uses_virtual_memory_api": uses_vmm,
            "fragmentation_applies": fragmentation_applies,
        }),
        culprits: Vec::new(),
        recommendation,
        impact_ns: 0,
        wall_share: None,
    })
}

/// Live device bytes that keep rising across the run: the same size
/// allocated again and again and never freed, throughout the run (not a
/// model loaded once at the start, not a cache filled in the first step).
/// `span` is the process's CUDA activity: first call start to last call end,
/// reaching back to the oldest unfreed allocation the ledger holds (a run's
/// ledger carries allocations made in files `--keep` deleted, before the
/// calls read: counted over the kept files' span alone, 11 allocations made
/// over 11 s read as 4 s of growth on the H200, round 17).
pub(super) fn memory_growth(l: &ProcessLedger, span: (u64, u64)) -> Option<Finding> {
    let (first, last) = span;
    let first = l.unfreed.iter().map(|u| u.ts_ns).fold(first, u64::min);
    if last.saturating_sub(first) < GROWTH_MIN_SPAN_NS {
        return None;
    }
    let quarter = |ts: u64| -> usize {
        let q = (ts.saturating_sub(first) as u128 * GROWTH_QUARTERS as u128
            / (last - first) as u128) as usize;
        q.min(GROWTH_QUARTERS - 1)
    };
    // (site, size, op) -> (count, first ts, quarters seen): repeated same-size
    // leaks from one line are one cause.
    type Key<'a> = (Option<&'a str>, u64, &'a str);
    type Tally = (u64, u64, u64, [bool; GROWTH_QUARTERS]);
    let mut groups: BTreeMap<Key, Tally> = BTreeMap::new();
    for u in &l.unfreed {
        let e = groups.entry((u.site.as_deref(), u.bytes, u.op)).or_insert((
            0,
            u.ts_ns,
            u.ts_ns,
            [false; GROWTH_QUARTERS],
        ));
        e.0 += 1;
        e.1 = e.1.min(u.ts_ns);
        e.2 = e.2.max(u.ts_ns);
        e.3[quarter(u.ts_ns)] = true;
    }
    struct Group<'a> {
        total: u64,
        size: u64,
        op: &'a str,
        count: u64,
        first_ts: u64,
        last_ts: u64,
        quarters: usize,
        site: Option<&'a str>,
    }
    let mut growing: Vec<Group> = groups
        .into_iter()
        .filter_map(|((site, size, op), (count, first_ts, last_ts, q))| {
            let quarters = q.iter().filter(|&&b| b).count();
            (count >= GROWTH_MIN_ALLOCS && quarters >= GROWTH_MIN_QUARTERS).then(|| Group {
                total: size.saturating_mul(count),
                size,
                op,
                count,
                first_ts,
                last_ts,
                quarters,
                site,
            })
        })
        .collect();
    if growing.is_empty() {
        return None;
    }
    growing.sort_by(|a, b| b.total.cmp(&a.total).then(a.size.cmp(&b.size)));
    let bytes: u64 = growing.iter().fold(0u64, |a, g| a.saturating_add(g.total));
    let count: u64 = growing.iter().fold(0u64, |a, g| a.saturating_add(g.count));
    let severity = Severity::grade(bytes, GROWTH_HIGH_BYTES, GROWTH_MEDIUM_BYTES);
    // The rate is the leak's own: from its first growing allocation to its
    // last, what came after the first (a leak in the second half of a
    // program read half its rate over the whole CUDA span, round 60's
    // tester: "20.0 MiB over 1.0 s (19.4 MiB/s)" for 40 MiB/s).
    let grew_from = growing.iter().map(|g| g.first_ts).min().unwrap_or(first);
    let grew_to = growing.iter().map(|g| g.last_ts).max().unwrap_or(last);
    let growth_ns = grew_to.saturating_sub(grew_from);
    let rate = match growth_ns {
        0 => bytes as f64 / ((last - first) as f64 / 1e9).max(1e-9),
        ns => bytes as f64 * (count - 1) as f64 / count as f64 / (ns as f64 / 1e9),
    };
    let secs = match growth_ns {
        0 => (last - first) as f64 / 1e9,
        ns => ns as f64 / 1e9,
    };
    let top = &growing[0];
    let groups_json: Vec<_> = growing
        .iter()
        .take(10)
        .map(|g| {
            json!({"bytes": g.size, "count": g.count, "total_bytes": g.total, "op": g.op,
                   "first_ts_ns": g.first_ts, "quarters_with_allocations": g.quarters,
                   "site": g.site})
        })
        .collect();
    let any_site = l.unfreed.iter().any(|u| u.site.is_some());
    // The largest growing group with a known site, said the way a user acts on it.
    let top_site = growing.iter().find_map(|g| {
        g.site.map(|s| {
            format!(
                "allocated at {s}, {} × {}, never freed ({})",
                g.count,
                fmt_bytes(g.size),
                fmt_bytes(g.total)
            )
        })
    });
    let advice = "Memory that grows with every repetition runs out eventually: free (or reuse) the buffer \
                  allocated on every repetition; in PyTorch, look for tensors kept alive across steps (a \
                  list of losses without .item()/.detach(), a growing cache, history kept with its graph).";
    Some(Finding {
        kind: Kind::MemoryGrowth,
        severity,
        op: top.op.to_string(),
        pids: vec![l.pid],
        summary: format!(
            "{} (pid {}) kept allocating device memory it never freed: {} allocation(s), {} over {:.1} s \
             ({}/s), most often {} x{} via {}{}",
            l.comm,
            l.pid,
            count,
            fmt_bytes(bytes),
            secs,
            fmt_bytes(rate as u64),
            fmt_bytes(top.size),
            top.count,
            top.op,
            top_site
                .as_deref()
                .map(|t| format!("; {t}"))
                .unwrap_or_default()
        ),
        evidence: json!({
            "growing_bytes": bytes,
            "growing_allocations": count,
            "span_ns": last - first,
            // From the first growing allocation to the last (the rate's).
            "growth_span_ns": growth_ns,
            "groups": groups_json,
            "live_bytes_at_end": l.live_bytes,
            "peak_bytes": l.peak_bytes,
            "exited": l.exit_ns.is_some(),
            "unknown_ptr_allocs": l.unknown_ptr_allocs,
            "unmatched_frees": l.unmatched_frees,
            "call_sites": if any_site { json!(top_site) } else { json!("unknown: stacks were not captured") },
        }),
        culprits: Vec::new(),
        recommendation: match &top_site {
            Some(t) => format!("{t}. {advice}"),
            None => advice.to_string(),
        },
        impact_ns: bytes,
        wall_share: None,
    })
}

/// Informational: device memory a still-running process held when the trace
/// ended. Memory held at exit is not reported: the driver releases it with
/// the context, and a caching allocator keeps its cache on purpose.
pub(super) fn held_at_end_note(l: &ProcessLedger) -> Option<String> {
    if l.exit_ns.is_some() || l.live_bytes == 0 {
        return None;
    }
    Some(format!(
        "{} (pid {}) was still running when the trace ended and held {} of device memory in {} allocation(s) \
         (peak {}): held, not necessarily leaked.",
        l.comm,
        l.pid,
        fmt_bytes(l.live_bytes),
        l.unfreed.len(),
        fmt_bytes(l.peak_bytes)
    ))
}

/// Freeing and re-allocating the same sizes over and over.
/// `trap_each`: what each of the process's recorded calls lasted more for
/// the probes' traps (`bottleneck::call_trap_each`), taken out of the time
/// in its allocation calls (the third tester of round 58: 10,000
/// allocations and frees of a simulated loop read 347.5 ms, ~2 ms
/// untraced).
pub(super) fn allocation_churn(
    l: &ProcessLedger,
    (start_ns, end_ns): (u64, u64),
    trap_each: u64,
) -> Option<Finding> {
    let c = &l.churn;
    if c.reallocs < CHURN_MIN_REALLOCS {
        return None;
    }
    // Every counted allocation and free at most (stream-ordered ones are
    // not in the time): the traps taken out never exceed it.
    let traps = (l.allocs.saturating_add(l.frees))
        .saturating_mul(trap_each)
        .min(c.alloc_free_ns);
    let alloc_free_ns = c.alloc_free_ns - traps;
    // A run's ledger read with files `--keep` deleted holds their calls
    // too: its churn is measured against the time since the process's
    // first allocation there, not against the files read alone (round 51's
    // tester: 2,000 allocations of deleted files over a kept file's 0.9 s
    // read 16.4%, medium; 4.9% of the time they took).
    let first = l
        .timeline
        .first()
        .map(|p| p.ts_ns)
        .filter(|&t| t < start_ns);
    let (span_ns, of_what) = match first {
        Some(t) => (
            end_ns - t,
            "of the time since its first allocation, in a file no longer read",
        ),
        None => (end_ns - start_ns, "of the trace"),
    };
    let time_share = share(alloc_free_ns, span_ns);
    // Counted re-allocations that cost next to nothing (a buffer made again
    // once per epoch) are how a healthy program runs: no finding (round 56).
    if time_share < CHURN_MIN_SHARE {
        return None;
    }
    let severity = if time_share >= CHURN_MEDIUM_SHARE {
        Severity::Medium
    } else {
        Severity::Low
    };
    let top = c.top_sizes.first();
    Some(Finding {
        kind: Kind::AllocationChurn,
        severity,
        op: top.map(|t| t.op).unwrap_or("cudaMalloc").to_string(),
        pids: vec![l.pid],
        summary: format!(
            "{} (pid {}) freed and re-allocated the same sizes {} times ({} allocations, {} frees){}; \
             {:.1} ms spent in allocation calls ({:.1}% {})",
            l.comm,
            l.pid,
            c.reallocs,
            l.allocs,
            l.frees,
            top.map(|t| format!(", most often {} x{}", fmt_bytes(t.bytes), t.times))
                .unwrap_or_default(),
            alloc_free_ns as f64 / 1e6,
            time_share * 100.0,
            of_what
        ),
        evidence: json!({
            "reallocs": c.reallocs,
            "allocs": l.allocs,
            "frees": l.frees,
            // Without the probes' traps (`probe_traps_ns`).
            "alloc_free_ns": alloc_free_ns,
            "probe_traps_ns": traps,
            "share_of_trace": time_share,
            "top_sizes": c.top_sizes,
        }),
        culprits: Vec::new(),
        recommendation: "Keep memory cached instead of returning it and asking again: for PyTorch, remove \
                         torch.cuda.empty_cache() from the loop; otherwise reuse buffers or use a stream-ordered \
                         pool (cudaMallocAsync with a release threshold)."
            .to_string(),
        impact_ns: alloc_free_ns,
        wall_share: None,
    })
}
