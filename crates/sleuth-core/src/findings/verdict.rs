//! The one-line answer on top of `explain`, and the notes that go with the
//! verdicts: the tracer's own interference, what an imported trace cannot tell.

use super::bottleneck::{who, ThreadView};
use super::inputs::FindingInputs;
use super::*;
use crate::gpu_busy::GpuBusy;
use crate::threads::{ThreadSplit, WakerKind};

fn gpu_text(g: Option<GpuBusy>) -> String {
    match g {
        Some(g) => format!("GPU busy {}", pct(g.busy)),
        None => "GPU busy: not measured".to_string(),
    }
}

/// The pid and tid a finding's evidence names.
fn ids_of(f: &Finding) -> Option<(u64, u64)> {
    Some((
        f.evidence.get("pid")?.as_u64()?,
        f.evidence.get("tid")?.as_u64()?,
    ))
}

/// The thread a finding is about (its evidence names pid and tid).
fn thread_of<'a>(f: &Finding, threads: &'a [ThreadSplit]) -> Option<&'a ThreadSplit> {
    let ids = ids_of(f)?;
    threads.iter().find(|t| (t.pid as u64, t.tid as u64) == ids)
}

/// "the main thread of train (pid 7)", and what the verdicts judged of its
/// window where they left something out: a pause (", in its steady steps
/// (2.0 s of 3.5 s),"), the probes' traps where they are at least
/// [`TRAPS_NAMED_MIN_SHARE`] of it (", without the probes' traps (0.7 s of
/// 1.5 s traced),"), or both. Round 57 on an H100: the launch loop's line
/// said "in its steady steps (0.7 s of 1.5 s)" with no pause left out, and
/// other lines "(4.1 s of 4.1 s)" for traps of 6 ms.
fn who_steady(whole: &ThreadSplit, steady: &ThreadSplit, pause: bool, probe_ns: u64) -> String {
    let traps = probe_ns as f64 >= TRAPS_NAMED_MIN_SHARE * whole.wall_ns.max(1) as f64;
    let what = match (pause, traps) {
        (false, false) => return who(whole),
        (true, false) => "in its steady steps",
        (false, true) => "without the probes' traps",
        (true, true) => "in its steady steps without the probes' traps",
    };
    let (judged, traced) = two_times(steady.wall_ns, whole.wall_ns);
    format!("{}, {what} ({judged} s of {traced} s traced),", who(whole))
}

/// Two times in seconds with the fewest decimals (one to three) that tell
/// them apart: "1.5 s of 1.5 s" said nothing (an H200's queued loop, 1.48
/// of 1.50 s).
fn two_times(a: u64, b: u64) -> (String, String) {
    let secs = |ns: u64, d: usize| format!("{:.*}", d, ns as f64 / 1e9);
    (1..=3)
        .map(|d| (secs(a, d), secs(b, d)))
        .find(|(x, y)| x != y)
        .unwrap_or_else(|| (secs(a, 3), secs(b, 3)))
}

/// The share of a thread's window the probes' traps must reach for its
/// line to say they were left out (below it the note alone says so).
const TRAPS_NAMED_MIN_SHARE: f64 = 0.01;

/// "(60% computing, 30% waiting for a CPU)": the host time between calls
/// split where more than a tenth of it was runnable (other tasks held the
/// CPU); None otherwise.
fn cpu_taken(t: &ThreadSplit) -> Option<String> {
    let (cpu, run) = (t.between.on_cpu_ns, t.between.runnable_ns);
    (run * 10 > cpu + run).then(|| {
        format!(
            "({} computing, {} waiting for a CPU)",
            pct(t.share(cpu)),
            pct(t.share(run))
        )
    })
}

/// The thread the line speaks of: the longest window's, passing over a
/// launcher that spent most of it blocked until another CUDA process woke
/// it (its GPU worker exiting or answering): round 56's third tester had a
/// parent spawn its GPU-bound worker, and the line said the parent was
/// "100% blocked … no bottleneck verdict".
fn main_thread<'a>(
    threads: &'a [ThreadSplit],
    cuda_pids: &std::collections::BTreeSet<u32>,
) -> Option<&'a ThreadSplit> {
    threads
        .iter()
        .find(|t| {
            super::bottleneck::blocked_on_cuda_processes(t, cuda_pids).saturating_mul(2) < t.wall_ns
        })
        .or_else(|| threads.first())
}

/// "GPU busy 9%; the main thread of train (pid 7) spent 88% computing on the
/// CPU between CUDA calls: host-bound". None when no thread issued CUDA calls.
pub(super) fn summary_line(
    has_host_context: bool,
    threads: &[ThreadSplit],
    cuda_pids: &std::collections::BTreeSet<u32>,
    views: &[ThreadView],
    findings: &[Finding],
    places: &super::bottleneck::LaunchPlaces,
    gpu: &dyn Fn(u64, u64) -> Option<GpuBusy>,
) -> Option<String> {
    if !has_host_context {
        return None; // said in a note: what can and cannot be told
    }
    let main = main_thread(threads, cuda_pids)?;
    // A verdict heads the line only when it explains a real share of the
    // time; otherwise the line says where the main thread's time went. The
    // findings ranked ahead by rule (a failed allocation, a straggler) are
    // not where the time went: the verdict after them heads the line (a
    // trace with a failed allocation said "no bottleneck verdict" above a
    // 38% sync stall, round 50).
    let top = findings
        .iter()
        .find(|f| !f.kind.ranks_ahead_by_rule())
        .filter(|f| {
            f.kind.is_time_verdict() && f.wall_share.unwrap_or(0.0) >= VERDICT_MEDIUM_SHARE
        });
    if let Some(f) = top {
        let share = pct(f.wall_share.unwrap_or(0.0));
        // The verdict's own numbers: its thread's steady steps and their GPU busy.
        let view = views
            .iter()
            .find(|v| Some((v.t.pid as u64, v.t.tid as u64)) == ids_of(f));
        let (t, g, w) = match view {
            Some(v) => (
                &*v.t,
                gpu_text(v.gpu),
                who_steady(v.whole, &v.t, v.pause.is_some(), v.probe_ns),
            ),
            None => {
                let t = thread_of(f, threads).unwrap_or(main);
                (t, gpu_text(gpu(t.start_ns, t.end_ns)), who(t))
            }
        };
        let line = match f.kind {
            Kind::HostBound => match cpu_taken(t) {
                None => format!("{g}; {w} spent {share} computing on the CPU between CUDA calls: host-bound"),
                Some(split) => {
                    format!("{g}; {w} spent {share} on the host between CUDA calls {split}: host-bound")
                }
            },
            Kind::InputWait => {
                let by = t
                    .wakers
                    .iter()
                    .find(|k| k.kind == WakerKind::Task)
                    .map(|k| format!(" for {} (pid {})", k.comm, k.pid))
                    .unwrap_or_default();
                format!("{g}; {w} spent {share} blocked between CUDA calls waiting{by}: input-bound")
            }
            Kind::LaunchBound => {
                let launches = views
                    .iter()
                    .find(|v| v.t.pid == t.pid && v.t.tid == t.tid)
                    .map(|v| v.launches)
                    .unwrap_or(0);
                // Like host_bound's: the CPU taken is said apart (round 56's
                // tester: half of it was a neighbour's, said nowhere).
                match cpu_taken(t) {
                    None => format!(
                        "{g}; {w} spent {share} on the CPU issuing {launches} kernel launches: launch-bound"
                    ),
                    Some(split) => format!(
                        "{g}; {w} spent {share} on the host issuing {launches} kernel launches {split}: launch-bound"
                    ),
                }
            }
            Kind::SyncStall => format!(
                "{g}; {w} synchronized with the GPU {} times and up to {share} of its time could overlap with GPU work: sync-stalled",
                t.syncs
            ),
            Kind::PageableCopy => format!(
                "{g}; {w} spent {share} on the host staging copies from pageable memory: pageable copies"
            ),
            // A thread's, between its calls (no op), or an op's calls.
            Kind::CpuPreemption if f.op.is_empty() => format!(
                "{g}; {w} waited runnable for {share} of its time between CUDA calls while other tasks held its CPU: \
                 CPU contention"
            ),
            Kind::CpuPreemption => format!(
                "{g}; CUDA calls waited runnable for {share} of the trace while other tasks held the CPU: CPU contention"
            ),
            _ => return None,
        };
        return Some(line);
    }
    // No time verdict: say where the main thread's time went; with a pause
    // left out, in its steady steps (35% in syncs over a window that was 65%
    // one pause read as no verdict where the steps were 99% GPU wait).
    let whole = main;
    let main_pause = super::bottleneck::left_out_pause(main, places);
    let pause = main_pause.map(|p| pause_note(main, p)).unwrap_or_default();
    // Its view where it has one: the shares of the time the program would
    // have taken (the pause and the probes' traps left out), as a verdict's.
    let view = views
        .iter()
        .find(|v| (v.t.pid, v.t.tid) == (main.pid, main.tid));
    let steady = match view {
        Some(v) => Some(ThreadSplit::clone(&v.t)),
        None => main_pause.map(|p| super::bottleneck::steady_split(main, p)),
    };
    let main = steady.as_ref().unwrap_or(main);
    let g = gpu_text(match view {
        Some(v) => v.gpu,
        None => super::bottleneck::steady_gpu(&gpu, whole, main_pause),
    });
    let w = who_steady(
        whole,
        main,
        main_pause.is_some(),
        view.map_or(0, |v| v.probe_ns),
    );
    // Runnable time inside calls is the CPU being taken, not the GPU working.
    let gpu_wait = main.sync_ns.saturating_sub(main.in_calls.runnable_ns);
    let sync_share = main.share(gpu_wait);
    let runnable_note = if main.share(main.in_calls.runnable_ns) >= 0.01 {
        format!(
            " ({} more runnable inside CUDA calls: the CPU was taken)",
            pct(main.share(main.in_calls.runnable_ns))
        )
    } else {
        String::new()
    };
    let in_share = main.share(main.in_calls.wall_ns());
    let line = if whole.wall_ns < VERDICT_MIN_WINDOW_NS {
        format!(
            "{g}; {w} issued CUDA calls for only {:.1} ms: too short for a bottleneck verdict",
            whole.wall_ns as f64 / 1e6
        )
    } else if view.is_some_and(|v| v.too_short) {
        // Long enough traced, not without the traps (round 57's second
        // tester: "whether the GPU waited … is not known" for a window of
        // 82 ms untraced, 351 ms traced).
        format!(
            "{g}; {} issued CUDA calls for only {:.1} ms without the probes' traps ({:.1} ms traced): too short \
             for a bottleneck verdict",
            who(whole),
            main.wall_ns as f64 / 1e6,
            whole.wall_ns as f64 / 1e6
        )
    } else if sync_share >= 0.5 {
        format!(
            "{g}; {w} spent {} waiting for the GPU inside syncs{runnable_note}: GPU-bound",
            pct(sync_share)
        )
    } else {
        format!(
            "{g}; {w} spent {} inside CUDA calls, {} on the CPU between them, {} blocked, {} runnable: no bottleneck verdict{}",
            pct(in_share),
            pct(main.share(main.between.on_cpu_ns)),
            pct(main.share(main.between.blocked_ns)),
            pct(main.share(main.between.runnable_ns)),
            host_without_verdict(main, view)
        )
    };
    Some(line + &slowest_sync_note(whole) + &pause)
}

/// Why mostly host time between calls is no `host_bound`, where it is at
/// least `HOST_BOUND_MIN_SHARE` of the window: the GPU was busy meanwhile,
/// or nothing tells whether it waited (round 57's tester: "100% on the CPU
/// between them … no bottleneck verdict" said nothing of why).
fn host_without_verdict(t: &ThreadSplit, view: Option<&ThreadView>) -> String {
    if t.share(t.between.on_cpu_ns + t.between.runnable_ns) < HOST_BOUND_MIN_SHARE {
        return String::new();
    }
    // With the verdicts' own evidence that the GPU idled, the reason is
    // another: that time would have been host_bound or launch_bound, were
    // the window's launches known well enough to tell which.
    if let Some(v) = view.filter(|v| v.gpu_idle().is_some()) {
        return v
            .undecided_launches()
            .map(|why| format!(" ({why})"))
            .unwrap_or_default();
    }
    match view.and_then(|v| v.gpu) {
        Some(g) => format!(
            " (the GPU was busy {} meanwhile: the host's work overlapped its)",
            pct(g.busy)
        ),
        None => " (whether the GPU waited for the host is not known: GPU busy not measured, and no syncs spread \
                  over the window returned at once)"
            .to_string(),
    }
}

/// "; its slowest sync took 3.0 s, 1.2 s after its first CUDA call (150x
/// the median, 20.0 ms)" where one sync stands out (at least
/// `SLOW_SYNC_MIN_NS` and `SLOW_SYNC_MIN_RATIO` times the median of 3 or
/// more): blocked sync time is never a finding, so a GPU hang inside one
/// sync of a GPU-bound loop read "GPU-bound" and nothing else (round 52's
/// tester).
fn slowest_sync_note(t: &ThreadSplit) -> String {
    let (at, dur) = t.slowest_sync;
    if t.syncs < 3
        || dur < SLOW_SYNC_MIN_NS
        || (dur as f64) < SLOW_SYNC_MIN_RATIO * t.sync_p50_ns as f64
    {
        return String::new();
    }
    format!(
        "; its slowest sync took {:.1} s, {:.1} s after its first CUDA call ({:.0}x the median, {:.1} ms)",
        dur as f64 / 1e9,
        at.saturating_sub(t.start_ns) as f64 / 1e9,
        dur as f64 / t.sync_p50_ns.max(1) as f64,
        t.sync_p50_ns as f64 / 1e6
    )
}

/// "; one pause of 1.5 s, 0.0 s after its first CUDA call (1.5 s blocked,
/// woken by …): judged apart from the steady steps", for the pause the
/// verdicts left out of thread `t` (`bottleneck::left_out_pause`).
fn pause_note(t: &ThreadSplit, p: &crate::threads::Pause) -> String {
    let waker = match p.wakers.first() {
        Some(w) if p.blocked_ns > 0 => match w.kind {
            WakerKind::Task => format!(", woken by {} (pid {})", w.comm, w.pid),
            _ => format!(", woken by {}", w.comm),
        },
        _ => String::new(),
    };
    format!(
        "; one pause of {} ({:.1} s blocked{waker}, {:.1} s on the host): judged apart from the steady steps",
        super::bottleneck::pause_text(p, t),
        p.blocked_ns as f64 / 1e9,
        p.host_ns() as f64 / 1e9
    )
}

/// gpusleuth's measured interference: runnable time of traced threads while
/// one of its own threads held their CPU. None when it took none.
pub(super) fn tracer_note(threads: &[ThreadSplit]) -> Option<String> {
    // Saturating: the splits may come from a stored aggregate.
    let sum =
        |f: &dyn Fn(&ThreadSplit) -> u64| threads.iter().fold(0u64, |a, t| a.saturating_add(f(t)));
    let took = sum(&|t| t.tracer_runnable_ns);
    if took == 0 {
        return None;
    }
    let wall = sum(&|t| t.wall_ns);
    let runnable = sum(&|t| t.in_calls.runnable_ns.saturating_add(t.between.runnable_ns));
    Some(format!(
        "gpusleuth's own threads held the CPU for {:.2} ms while traced threads waited runnable ({} of their \
         runnable time, {:.3}% of their wall time): the tracer's measured interference, never counted as a culprit.",
        took as f64 / 1e6,
        pct(if runnable == 0 { 0.0 } else { took as f64 / runnable as f64 }),
        if wall == 0 { 0.0 } else { took as f64 * 100.0 / wall as f64 }
    ))
}

/// The probes' own cost to the traced threads: the traps on kernel-counted
/// calls and on recorded calls, taken out of the host time the verdicts
/// judge. None where they took under 1% of every judged window (or no cost
/// was measured).
pub(super) fn probe_note(views: &[ThreadView], trap_ns: u64, call_trap_ns: u64) -> Option<String> {
    // Of the window as traced (the view's is without the traps).
    let share =
        |v: &ThreadView| v.probe_ns as f64 / v.t.wall_ns.saturating_add(v.probe_ns).max(1) as f64;
    let v = views
        .iter()
        .filter(|v| v.probe_ns > 0)
        .max_by(|a, b| share(a).total_cmp(&share(b)))?;
    if share(v) < 0.01 {
        return None;
    }
    // Tracing that slowed the thread this much may have changed what it
    // waited for (round 57's second tester: a loop fed by a loader took 30
    // ms of traps a step, outran nothing, never blocked, and read
    // launch-bound where untraced it waited 22 ms a step for its batches).
    let changed = if share(v) >= TRAPS_CHANGE_TIMING_SHARE {
        " Slowed this much, the thread may wait less on other threads or processes (a data loader, a queue) than \
         it would untraced: the verdicts judge the traced order of events."
    } else {
        ""
    };
    let counted_ns = v.probe_ns - v.call_probe_ns;
    let (on_what, each) = match (counted_ns > 0, v.call_probe_ns > 0) {
        (true, false) => (
            "its kernel-counted calls".to_string(),
            format!("{:.2} us a trap", trap_ns as f64 / 1e3),
        ),
        (false, _) => (
            "its recorded calls".to_string(),
            format!(
                "{:.2} us a call, its entry and return",
                call_trap_ns as f64 / 1e3
            ),
        ),
        (true, true) => (
            format!(
                "its kernel-counted calls ({:.1} ms) and recorded calls ({:.1} ms)",
                counted_ns as f64 / 1e6,
                v.call_probe_ns as f64 / 1e6
            ),
            format!(
                "{:.2} us a counted call's trap, {:.2} us a recorded call's entry and return",
                trap_ns as f64 / 1e3,
                call_trap_ns as f64 / 1e3
            ),
        ),
    };
    Some(format!(
        "The probes' traps on {on_what} cost {} {:.1} ms ({} of its window; {each}, measured as the probes were \
         attached): the tracer's time, taken out of the host time and the window the verdicts judge.{changed}",
        super::bottleneck::who(&v.t),
        v.probe_ns as f64 / 1e6,
        pct(share(v)),
    ))
}

/// The share of a thread's traced window in traps from which the note says
/// tracing may have changed what the thread waited for.
const TRAPS_CHANGE_TIMING_SHARE: f64 = 0.25;

/// For a trace without host context (imported): what the call records alone
/// say about the main issuing thread, and what stays unknown.
pub(super) fn unknown_without_host_context(
    has_host_context: bool,
    inputs: &FindingInputs,
    gpu: &dyn Fn(u64, u64) -> Option<GpuBusy>,
) -> Option<String> {
    if has_host_context {
        return None;
    }
    let t = inputs.splits.first()?;
    let launches = &inputs.threads.get(&(t.pid, t.tid))?.launches;
    let launch_text = match launches.percentile(50) {
        Some(p50) => format!(
            "; it launched {} kernels ({:.0}/s, median {:.1} us inside each launch call)",
            launches.count(),
            launches.count() as f64 / (t.wall_ns.max(1) as f64 / 1e9),
            p50 as f64 / 1e3
        ),
        None => String::new(),
    };
    Some(format!(
        "{}; {} spent {} of its {:.1} ms window inside CUDA calls and {} between them{}. Whether the time between \
         calls was computing on the CPU (host_bound), waiting for other tasks such as DataLoader workers \
         (input_wait) or preempted is unknown: the trace holds no scheduler context. Re-record with `gpusleuth \
         trace` for the verdict.",
        gpu_text(gpu(t.start_ns, t.end_ns)),
        who(t),
        pct(t.share(t.in_calls.wall_ns())),
        t.wall_ns as f64 / 1e6,
        pct(t.share(t.between.wall_ns())),
        launch_text
    ))
}
