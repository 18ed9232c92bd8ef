//! The bottleneck verdicts: where a CUDA-issuing thread loses its time
//! *between* CUDA calls and in the calls that stage host memory.
//! host_bound, input_wait, launch_bound, sync_stall, pageable_copy.
//!
//! Each is judged per issuing thread over its window (first to last CUDA
//! call, see `threads.rs`), and states the share of that wall time it
//! explains: findings are ranked by it.

use super::inputs::{FindingInputs, ThreadInputs};
use super::*;
use crate::gpu_busy::GpuBusy;
use crate::ops::{op_by_id, OpClass};
use crate::threads::{Pause, ThreadSplit, WakerKind};
use serde_json::json;
use std::collections::{BTreeSet, HashMap};

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

fn us(ns: u64) -> String {
    format!("{:.1} us", ns as f64 / 1e3)
}

/// Severity of a verdict from the share of wall time it explains.
pub(super) fn severity_of_share(share: f64) -> Severity {
    Severity::grade(share, VERDICT_HIGH_SHARE, VERDICT_MEDIUM_SHARE)
}

/// "the main thread" / "thread 1234" of process comm (pid N).
pub(crate) fn who(t: &ThreadSplit) -> String {
    if t.tid == t.pid {
        format!("the main thread of {} (pid {})", t.comm, t.pid)
    } else {
        format!("thread {} of {} (pid {})", t.tid, t.comm, t.pid)
    }
}

/// Everything the verdicts need about one issuing thread.
pub(super) struct ThreadView<'a> {
    pub t: &'a ThreadSplit,
    /// Kernel launches attributed to this thread: its recorded launch calls,
    /// plus its process's launches counted in the kernel when it is the
    /// process's main issuing thread (counted launches carry no thread).
    pub launches: u64,
    /// Wall time inside recorded launch calls (0 when launches are only counted).
    pub launch_call_ns: u64,
    pub gpu: Option<GpuBusy>,
    /// The thread's aggregates (syncs, copies).
    pub agg: &'a ThreadInputs,
}

impl ThreadView<'_> {
    /// Host time per launch: on-CPU time between calls plus time inside
    /// recorded launch calls, over the launches.
    fn host_ns_per_launch(&self) -> Option<u64> {
        (self.launches > 0)
            .then(|| (self.t.between.on_cpu_ns + self.launch_call_ns) / self.launches)
    }

    /// Is there evidence the GPU was mostly idle? Measured busy below the
    /// threshold; or, not measured, the thread synchronized through its
    /// window and its syncs returned almost at once (little time inside them).
    fn gpu_idle(&self) -> Option<&'static str> {
        match self.gpu {
            Some(g) if g.busy < GPU_IDLE_MAX_BUSY => Some("GPU busy measured low"),
            Some(_) => None,
            None if self.syncs_sampled_the_window()
                && self.t.share(self.t.sync_ns) <= SYNC_AT_ONCE_MAX_SHARE =>
            {
                Some("GPU busy not measured; the syncs, spread over the window, returned almost at once")
            }
            None => None,
        }
    }

    /// Enough syncs, none after a host stretch of most of the window: what
    /// they found (a drained queue, or work still queued) stands for the
    /// whole window, not one moment of it.
    fn syncs_sampled_the_window(&self) -> bool {
        let longest_gap = self.agg.host_gaps.max_ns();
        self.t.syncs >= SYNC_AT_ONCE_MIN_SYNCS
            && longest_gap as f64 <= SYNC_AT_ONCE_MAX_GAP_SHARE * self.t.wall_ns as f64
    }

    fn gpu_json(&self) -> serde_json::Value {
        match self.gpu {
            Some(g) => {
                json!({"busy": g.busy, "gpu": g.gpu, "samples": g.samples, "coverage": g.coverage})
            }
            None => json!(null),
        }
    }

    fn gpu_text(&self) -> String {
        match self.gpu {
            Some(g) => format!("GPU busy {}", pct(g.busy)),
            None => "GPU busy: not measured".into(),
        }
    }

    fn base_evidence(&self) -> serde_json::Value {
        let t = self.t;
        json!({
            "pid": t.pid,
            "tid": t.tid,
            // Where the window begins: an export places the finding there.
            "window_start_ts_ns": t.start_ns,
            "window_ns": t.wall_ns,
            "in_calls": t.in_calls,
            "between_calls": t.between,
            "syncs": t.syncs,
            "sync_ns": t.sync_ns,
            "sync_p50_ns": t.sync_p50_ns,
            "longest_pause": t.longest_pause,
            "launches": self.launches,
            "gpu_busy": self.gpu_json(),
        })
    }
}

/// One view per issuing thread whose window is long enough to judge.
pub(super) fn views<'a>(
    counts: &[crate::OpCount],
    threads: &'a [ThreadSplit],
    inputs: &'a FindingInputs,
    gpu: impl Fn(u64, u64) -> Option<GpuBusy>,
) -> Vec<ThreadView<'a>> {
    // Counted launches go to each process's longest issuing thread. With
    // `--launches all` both layers are counted: a runtime launch goes through
    // the driver, so the driver's count is used when there is one.
    let mut by_layer: HashMap<(u32, crate::ops::Layer), u64> = HashMap::new();
    for c in counts {
        if let Some(o) = op_by_id(c.op).filter(|o| o.class == OpClass::Launch) {
            *by_layer.entry((c.pid, o.layer)).or_default() += c.count;
        }
    }
    let mut counted: HashMap<u32, u64> = HashMap::new();
    for (&(pid, layer), &n) in &by_layer {
        let driver = by_layer
            .get(&(pid, crate::ops::Layer::Driver))
            .copied()
            .unwrap_or(0);
        if layer == crate::ops::Layer::Driver || driver == 0 {
            *counted.entry(pid).or_default() += n;
        }
    }
    let mut main_of: HashMap<u32, (u64, u32)> = HashMap::new();
    for t in threads {
        let e = main_of.entry(t.pid).or_insert((t.wall_ns, t.tid));
        if t.wall_ns > e.0 {
            *e = (t.wall_ns, t.tid);
        }
    }
    threads
        .iter()
        .filter(|t| t.wall_ns >= VERDICT_MIN_WINDOW_NS)
        .filter_map(|t| {
            // Every thread with a split made calls, so it has aggregates.
            let agg = inputs.threads.get(&(t.pid, t.tid))?;
            let is_main = main_of.get(&t.pid).is_some_and(|m| m.1 == t.tid);
            let extra = if is_main {
                counted.get(&t.pid).copied().unwrap_or(0)
            } else {
                0
            };
            Some(ThreadView {
                t,
                launches: agg.launches.count() + extra,
                launch_call_ns: agg.launch_ns,
                gpu: gpu(t.start_ns, t.end_ns),
                agg,
            })
        })
        .collect()
}

/// The steady part of a verdict's time: `explained` less the thread's
/// longest pause's part of it (`pause_part`) where that part is at least
/// [`PAUSE_DOMINANT_SHARE`] of it, with the window less the pause.
struct Steady<'a> {
    explained_ns: u64,
    window_ns: u64,
    /// The pause left out, if one was.
    pause: Option<&'a Pause>,
}

impl Steady<'_> {
    fn of<'a>(t: &'a ThreadSplit, explained: u64, pause_part: fn(&Pause) -> u64) -> Steady<'a> {
        let whole = Steady {
            explained_ns: explained,
            window_ns: t.wall_ns,
            pause: None,
        };
        let Some(p) = &t.longest_pause else {
            return whole;
        };
        let part = pause_part(p).min(explained);
        if explained == 0 || (part as f64) < PAUSE_DOMINANT_SHARE * explained as f64 {
            return whole;
        }
        Steady {
            explained_ns: explained - part,
            window_ns: t.wall_ns.saturating_sub(p.wall_ns()),
            pause: Some(p),
        }
    }

    fn share(&self) -> f64 {
        share(self.explained_ns, self.window_ns)
    }

    /// " (without one pause of 1.5 s, 0.0 s after the first CUDA call)".
    fn text(&self, t: &ThreadSplit) -> String {
        match self.pause {
            Some(p) => format!(", without one pause of {}", pause_text(p, t)),
            None => String::new(),
        }
    }

    fn evidence(&self, ev: &mut serde_json::Value) {
        ev["pause_left_out"] = json!(self.pause.is_some());
        ev["steady_window_ns"] = json!(self.window_ns);
    }
}

/// "1.5 s, 0.2 s after its first CUDA call".
pub(super) fn pause_text(p: &Pause, t: &ThreadSplit) -> String {
    format!(
        "{:.1} s, {:.1} s after its first CUDA call",
        p.wall_ns() as f64 / 1e9,
        p.start_ns.saturating_sub(t.start_ns) as f64 / 1e9
    )
}

fn finding(
    kind: Kind,
    v: &ThreadView,
    explained_ns: u64,
    summary: String,
    evidence: serde_json::Value,
    culprits: Vec<FindingCulprit>,
    recommendation: &str,
) -> Finding {
    finding_over(
        kind,
        v,
        (explained_ns, v.t.wall_ns),
        summary,
        evidence,
        culprits,
        recommendation,
    )
}

/// [`finding`] whose share is of `window_ns`, not the thread's whole window.
fn finding_over(
    kind: Kind,
    v: &ThreadView,
    (explained_ns, window_ns): (u64, u64),
    summary: String,
    evidence: serde_json::Value,
    culprits: Vec<FindingCulprit>,
    recommendation: &str,
) -> Finding {
    let share = share(explained_ns, window_ns);
    Finding {
        kind,
        severity: severity_of_share(share),
        op: String::new(),
        pids: vec![v.t.pid],
        summary,
        evidence,
        culprits,
        recommendation: recommendation.to_string(),
        impact_ns: explained_ns,
        wall_share: Some(share),
    }
}

/// The GPU idles while the issuing thread works on the CPU outside CUDA
/// calls (computing, or runnable: wanting the CPU to compute on).
pub(super) fn host_bound(v: &ThreadView) -> Option<Finding> {
    let t = v.t;
    let on_cpu = t.between.on_cpu_ns;
    let steady = Steady::of(t, on_cpu + t.between.runnable_ns, Pause::host_ns);
    let host = steady.explained_ns;
    let share = steady.share();
    let per_launch = v.host_ns_per_launch();
    if share < HOST_BOUND_MIN_SHARE
        || per_launch.is_some_and(|p| p <= LAUNCH_BOUND_MAX_HOST_NS)
            && v.launches >= LAUNCH_BOUND_MIN_LAUNCHES
    {
        return None;
    }
    let why = v.gpu_idle()?;
    let culprits: Vec<FindingCulprit> = t
        .preempted_by
        .iter()
        .take(TOP_CULPRITS)
        .map(|h| FindingCulprit {
            pid: h.pid,
            comm: h.comm.clone(),
            runnable_ns: h.runnable_ns,
            share: super::share(h.runnable_ns, t.between.runnable_ns),
        })
        .collect();
    let summary = format!(
        "{}; {} spent {} ({} of {}{}) on the host between CUDA calls while the GPU waited for work: {} computing \
         on the CPU, {} runnable waiting for a CPU{}",
        v.gpu_text(),
        who(t),
        pct(share),
        ms(host),
        ms(steady.window_ns),
        steady.text(t),
        ms(on_cpu),
        ms(t.between.runnable_ns),
        match per_launch {
            Some(p) => format!("; {} of host time per kernel launch", ms(p)),
            None => String::new(),
        }
    );
    let mut ev = v.base_evidence();
    ev["host_ns"] = json!(host);
    ev["host_on_cpu_ns"] = json!(on_cpu);
    ev["host_runnable_ns"] = json!(t.between.runnable_ns);
    ev["host_ns_per_launch"] = json!(per_launch);
    ev["gpu_idle_evidence"] = json!(why);
    steady.evidence(&mut ev);
    Some(finding_over(
        Kind::HostBound,
        v,
        (host, steady.window_ns),
        summary,
        ev,
        culprits,
        "The GPU starves while this thread prepares work on the CPU. Move the host work off the issuing thread and \
         overlap it with the GPU: more DataLoader workers (num_workers), pin_memory=True, prefetching of the next \
         batch, or move the preprocessing (decoding, augmentation, tokenization) to the GPU. If much of it is \
         runnable time, the tasks named as culprits took the CPU.",
    ))
}

/// The issuing thread sleeps outside CUDA calls until other tasks wake it.
pub(super) fn input_wait(v: &ThreadView, cuda_pids: &BTreeSet<u32>) -> Option<Finding> {
    let t = v.t;
    // Woken by another process that itself issues CUDA work in the trace,
    // the thread waited on that process's GPU work, not on input: a
    // launcher in `waitpid` on its GPU worker (round 51's false-positive
    // hunt: "input-bound, woken by workload (its child) 100%", the child
    // 99% blocked in syncs).
    let on_cuda_process = |w: &&crate::threads::WakerTime| {
        w.kind == WakerKind::Task && w.pid != t.pid && cuda_pids.contains(&w.pid)
    };
    let waited_on_gpu_work: u64 = t
        .wakers
        .iter()
        .filter(on_cuda_process)
        .map(|w| w.blocked_ns)
        .sum();
    let steady = Steady::of(
        t,
        t.between.blocked_ns.saturating_sub(waited_on_gpu_work),
        |p| p.blocked_ns,
    );
    let blocked = steady.explained_ns;
    let share = steady.share();
    if share < INPUT_WAIT_MIN_SHARE || blocked < INPUT_WAIT_MIN_NS {
        return None;
    }
    let culprits: Vec<FindingCulprit> = t
        .wakers
        .iter()
        .filter(|w| w.kind == WakerKind::Task && !on_cuda_process(w))
        .take(TOP_CULPRITS)
        .map(|w| FindingCulprit {
            pid: w.pid,
            comm: w.comm.clone(),
            runnable_ns: w.blocked_ns,
            share: w.share,
        })
        .collect();
    let named: Vec<String> = t
        .wakers
        .iter()
        .take(3)
        .map(|w| match w.kind {
            WakerKind::Task => {
                format!("{} (pid {}, tid {}) {}", w.comm, w.pid, w.tid, pct(w.share))
            }
            _ => format!("{} {}", w.comm, pct(w.share)),
        })
        .collect();
    let summary = format!(
        "{}; {} spent {} ({} of {}{}) blocked between CUDA calls, woken by {}",
        v.gpu_text(),
        who(t),
        pct(share),
        ms(blocked),
        ms(steady.window_ns),
        steady.text(t),
        if named.is_empty() {
            "tasks the trace did not name".to_string()
        } else {
            named.join(", ")
        }
    );
    let mut ev = v.base_evidence();
    ev["blocked_between_ns"] = json!(t.between.blocked_ns);
    ev["blocked_on_cuda_processes_ns"] = json!(waited_on_gpu_work);
    ev["blocked_by_tasks_ns"] = json!(t.blocked_by_tasks_ns());
    ev["wakers"] = json!(t.wakers);
    steady.evidence(&mut ev);
    Some(finding_over(
        Kind::InputWait,
        v,
        (blocked, steady.window_ns),
        summary,
        ev,
        culprits,
        "The issuing thread waits for its input. If the wakers are DataLoader workers, they cannot keep up: raise \
         num_workers, make each sample cheaper (decode/augment on the GPU, cache preprocessed data), set \
         persistent_workers=True and a larger prefetch_factor; if it is a queue, a tokenizer or I/O thread, speed \
         that producer up or prefetch further ahead.",
    ))
}

/// Many short kernels: the host's launch path is the limit.
pub(super) fn launch_bound(v: &ThreadView) -> Option<Finding> {
    let t = v.t;
    let per_launch = v.host_ns_per_launch()?;
    // Runnable time between calls is host time too (the thread wanted the
    // CPU to issue its next launch); the per-launch cost counts on-CPU only.
    let host = t.between.on_cpu_ns + t.between.runnable_ns + v.launch_call_ns;
    let share = t.share(host);
    if v.launches < LAUNCH_BOUND_MIN_LAUNCHES
        || per_launch > LAUNCH_BOUND_MAX_HOST_NS
        || share < LAUNCH_BOUND_MIN_SHARE
    {
        return None;
    }
    let why = v.gpu_idle()?;
    let rate = v.launches as f64 / (t.wall_ns as f64 / 1e9);
    let summary = format!(
        "{}; {} launched {} kernels at {:.0}/s, {} of host time each: the launch path, not the GPU, sets the pace \
         ({} of {} on the host issuing work)",
        v.gpu_text(),
        who(t),
        v.launches,
        rate,
        us(per_launch),
        pct(share),
        ms(t.wall_ns)
    );
    let mut ev = v.base_evidence();
    ev["launch_rate_per_s"] = json!(rate);
    ev["host_ns_per_launch"] = json!(per_launch);
    ev["host_issue_ns"] = json!(host);
    ev["gpu_idle_evidence"] = json!(why);
    Some(finding(
        Kind::LaunchBound,
        v,
        host,
        summary,
        ev,
        Vec::new(),
        "Each kernel is too small to cover the cost of launching it. Capture the step in a CUDA graph \
         (torch.cuda.graphs / torch.compile(mode=\"reduce-overhead\")), fuse small ops (torch.compile, fused \
         optimizers such as foreach/fused=True), or give each kernel more work (larger batches).",
    ))
}

/// Host synchronizations every step drain the GPU queue: host and GPU take turns.
pub(super) fn sync_stall(v: &ThreadView) -> Option<Finding> {
    let t = v.t;
    if t.syncs < SYNC_STALL_MIN_SYNCS {
        return None;
    }
    let rate = t.syncs as f64 / (t.wall_ns as f64 / 1e9);
    if rate < SYNC_STALL_MIN_RATE {
        return None;
    }
    // Per sync: host time since the previous sync ended (H) and the sync's own
    // wall time (S: the GPU finishing what the host queued). With the sync
    // gone, up to min(H, S) of each step could overlap (summed as the calls stream past).
    let mut overlap = v.agg.overlap_ns;
    // Measured GPU idle time bounds what overlapping could win.
    if let Some(g) = v.gpu {
        let idle = ((1.0 - g.busy).max(0.0) * t.wall_ns as f64) as u64;
        overlap = overlap.min(idle);
    }
    let share = t.share(overlap);
    if share < SYNC_STALL_MIN_SHARE {
        return None;
    }
    let h50 = v.agg.host_gaps.percentile(50).unwrap_or(0);
    let summary = format!(
        "{}; {} synchronized with the GPU {} times ({:.0}/s, median sync {}); after each sync the GPU has no queued \
         work while the host spends a median {} preparing the next step: up to {} ({} of {}) could overlap",
        v.gpu_text(),
        who(t),
        t.syncs,
        rate,
        ms(t.sync_p50_ns),
        ms(h50),
        ms(overlap),
        pct(share),
        ms(t.wall_ns)
    );
    let mut ev = v.base_evidence();
    ev["syncs_per_s"] = json!(rate);
    ev["host_between_syncs_p50_ns"] = json!(h50);
    ev["overlappable_ns"] = json!(overlap);
    ev["gpu_idle_gap_after_sync"] = json!(
        "at least the host time until the next launch; launch times are not recorded by default"
    );
    Some(finding(
        Kind::SyncStall,
        v,
        overlap,
        summary,
        ev,
        Vec::new(),
        "Stop synchronizing every step: keep losses and metrics on the GPU and read them every N steps (no \
         .item()/.cpu()/print of a CUDA tensor in the loop), use non_blocking=True copies to pinned memory, and \
         replace explicit synchronizations with CUDA events where ordering is all that is needed.",
    ))
}

/// Host<->device copies from pageable memory, with the on-CPU staging time.
pub(super) fn pageable_copy(views: &[ThreadView]) -> Vec<Finding> {
    let mut out = Vec::new();
    for v in views {
        let a = &v.agg.pageable;
        if a.count == 0 {
            continue;
        }
        let share = v.t.share(a.on_cpu);
        if share < PAGEABLE_MIN_SHARE || a.on_cpu < PAGEABLE_MIN_NS {
            continue;
        }
        let examples: Vec<_> = a
            .examples
            .examples()
            .map(|e| {
                let c = &e.call;
                json!({"op": c.op_name(), "ts_ns": c.ts_ns, "pid": c.pid, "tid": c.tid, "dur_ns": c.dur_ns,
                       "on_cpu_ns": c.on_cpu_ns(), "runnable_ns": c.runnable_ns, "blocked_ns": c.blocked_ns,
                       "bytes": c.size, "host_ptr": c.host_ptr.map(|p| format!("{p:#x}"))})
            })
            .collect();
        let summary = format!(
            "{} made {} copies from pageable host memory ({} H2D, {} D2H, {:.1} MiB): {} on the host staging them \
             ({} of {}){}",
            who(v.t),
            a.count,
            a.h2d,
            a.d2h,
            a.bytes as f64 / (1u64 << 20) as f64,
            ms(a.on_cpu),
            pct(share),
            ms(v.t.wall_ns),
            match a.pinned_copies {
                0 => String::new(),
                n => format!("; {n} other copies used pinned memory"),
            }
        );
        let mut ev = v.base_evidence();
        ev["copies"] = json!(a.count);
        ev["bytes"] = json!(a.bytes);
        ev["h2d"] = json!(a.h2d);
        ev["d2h"] = json!(a.d2h);
        // On-CPU time inside the copies: the CPU's part of the copy. Their
        // runnable time is other tasks' (cpu_preemption), said apart.
        ev["staging_ns"] = json!(a.on_cpu);
        ev["runnable_in_copies_ns"] = json!(a.runnable);
        ev["copy_wall_ns"] = json!(a.wall);
        ev["pinned_copies"] = json!(a.pinned_copies);
        ev["pinned_ranges_seen"] = json!(
            "cudaMallocHost, cudaHostAlloc, cuMemAllocHost, cudaHostRegister, cuMemHostRegister made during the trace; \
             memory pinned before the trace started is not known"
        );
        ev["examples"] = json!(examples);
        out.push(finding(
            Kind::PageableCopy,
            v,
            a.on_cpu,
            summary,
            ev,
            Vec::new(),
            "Copy from page-locked memory: allocate host buffers pinned (cudaMallocHost / cudaHostAlloc, or \
             cudaHostRegister an existing buffer; in PyTorch pin_memory=True in the DataLoader or tensor.pin_memory()) \
             and copy with non_blocking=True so the copy overlaps with compute instead of being staged by the CPU.",
        ));
    }
    out
}
