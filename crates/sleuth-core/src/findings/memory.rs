//! Findings about GPU memory: allocation_failure, unfreed_memory, allocation_churn.
//! They read the per-process ledger (each allocation counted once).

use super::*;
use crate::ledger::ProcessLedger;
use serde_json::json;
use std::collections::BTreeMap;

fn mib(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// Failed allocations of one process.
pub(super) fn allocation_failure(l: &ProcessLedger) -> Option<Finding> {
    if l.failed_allocs.len() < ALLOC_FAILURE_MIN_COUNT {
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
            mib(held),
            mib(first.bytes)
        )
    } else if uses_vmm {
        format!(
            "the process held {} (virtual-memory API in use) when {} more was requested",
            mib(held),
            mib(first.bytes)
        )
    } else {
        format!(
            "the request ({}) is larger than all the process held ({}): fragmentation of its own memory \
             cannot explain it; the device is full of other memory or the request exceeds it",
            mib(first.bytes),
            mib(held)
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
            l.failed_allocs.len(),
            l.comm,
            l.pid,
            first.op,
            mib(first.bytes),
            first.error,
            error_name(first.error),
            mib(held)
        ),
        evidence: json!({
            "failures": l.failed_allocs.len(),
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
    })
}

/// Device allocations still live when the process exited or the trace ended.
pub(super) fn unfreed_memory(l: &ProcessLedger) -> Option<Finding> {
    let bytes: u64 = l.unfreed.iter().map(|u| u.bytes).sum();
    if bytes < UNFREED_MIN_BYTES || l.unfreed.is_empty() {
        return None;
    }
    let severity = if bytes >= UNFREED_HIGH_BYTES {
        Severity::High
    } else if bytes >= UNFREED_MEDIUM_BYTES {
        Severity::Medium
    } else {
        Severity::Low
    };
    // Group by (site, size, op): repeated same-size leaks from one line are one cause.
    let mut groups: BTreeMap<(Option<&str>, u64, &str), (u64, u64)> = BTreeMap::new();
    for u in &l.unfreed {
        let e = groups
            .entry((u.site.as_deref(), u.bytes, u.op))
            .or_insert((0, u.ts_ns));
        e.0 += 1;
        e.1 = e.1.min(u.ts_ns);
    }
    let mut by_size: Vec<_> = groups
        .into_iter()
        .map(|((site, size, op), (count, first_ts))| {
            (size.saturating_mul(count), size, op, count, first_ts, site)
        })
        .collect();
    by_size.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let main_op = by_size.first().map(|g| g.2).unwrap_or("cudaMalloc");
    let by_size_json: Vec<_> = by_size
        .iter()
        .take(10)
        .map(|&(total, size, op, count, first_ts, site)| {
            json!({"bytes": size, "count": count, "total_bytes": total, "op": op, "first_ts_ns": first_ts,
                   "site": site})
        })
        .collect();
    let any_site = l.unfreed.iter().any(|u| u.site.is_some());
    // The largest group with a known site, said the way a user acts on it.
    let top_site = by_size
        .iter()
        .find_map(|&(total, size, _, count, _, site)| {
            site.map(|s| {
                format!(
                    "allocated at {s}, {count} × {}, never freed ({})",
                    mib(size),
                    mib(total)
                )
            })
        });
    let (when, recommendation) = if l.exit_ns.is_some() {
        (
            "at exit",
            "Free device memory when done with it (cudaFree / cuMemRelease), or reuse buffers; the same size \
             left unfreed many times points at one allocation site in a loop.",
        )
    } else {
        (
            "at the end of the trace (the process was still running: memory it still holds, not necessarily a leak)",
            "If this keeps growing, compare `gpusleuth memory --at` at two moments to see which sizes accumulate; \
             free or reuse buffers that are no longer needed.",
        )
    };
    Some(Finding {
        kind: Kind::UnfreedMemory,
        severity,
        op: main_op.to_string(),
        pids: vec![l.pid],
        summary: format!(
            "{} (pid {}) left {} allocation(s), {} of device memory, unfreed {}{}",
            l.comm,
            l.pid,
            l.unfreed.len(),
            mib(bytes),
            when,
            top_site
                .as_deref()
                .map(|t| format!("; {t}"))
                .unwrap_or_default()
        ),
        evidence: json!({
            "unfreed_count": l.unfreed.len(),
            "unfreed_bytes": bytes,
            "peak_bytes": l.peak_bytes,
            "by_size": by_size_json,
            "exited": l.exit_ns.is_some(),
            "call_sites": if any_site { json!(top_site) } else { json!("unknown: stacks were not captured") },
        }),
        culprits: Vec::new(),
        recommendation: match &top_site {
            Some(t) => format!("{t}. {recommendation}"),
            None => recommendation.to_string(),
        },
        impact_ns: bytes,
    })
}

/// Freeing and re-allocating the same sizes over and over.
pub(super) fn allocation_churn(l: &ProcessLedger, trace_ns: u64) -> Option<Finding> {
    let c = &l.churn;
    if c.reallocs < CHURN_MIN_REALLOCS {
        return None;
    }
    let time_share = if trace_ns == 0 {
        0.0
    } else {
        c.alloc_free_ns as f64 / trace_ns as f64
    };
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
             {:.1} ms spent in allocation calls ({:.1}% of the trace)",
            l.comm,
            l.pid,
            c.reallocs,
            l.allocs,
            l.frees,
            top.map(|t| format!(", most often {} x{}", mib(t.bytes), t.times))
                .unwrap_or_default(),
            c.alloc_free_ns as f64 / 1e6,
            time_share * 100.0
        ),
        evidence: json!({
            "reallocs": c.reallocs,
            "allocs": l.allocs,
            "frees": l.frees,
            "alloc_free_ns": c.alloc_free_ns,
            "share_of_trace": time_share,
            "top_sizes": c.top_sizes,
        }),
        culprits: Vec::new(),
        recommendation: "Keep memory cached instead of returning it and asking again: for PyTorch, remove \
                         torch.cuda.empty_cache() from the loop; otherwise reuse buffers or use a stream-ordered \
                         pool (cudaMallocAsync with a release threshold)."
            .to_string(),
        impact_ns: c.alloc_free_ns,
    })
}
