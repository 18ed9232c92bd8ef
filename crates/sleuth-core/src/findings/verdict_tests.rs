//! The bottleneck verdicts from hand-built traces, thresholds at their edges.

use super::*;
use crate::data::GpuSample;
use crate::event::{CallEvent, OpCount, WaitEvent, WaitKind, Waker};
use crate::ops::op_by_name;

use super::tests::{call, wait, MS, US};

/// The findings tests' one-process trace, with these waits.
fn trace(calls: Vec<CallEvent>, waits: Vec<WaitEvent>) -> TraceData {
    TraceData {
        waits,
        ..super::tests::trace(calls)
    }
}

fn kinds_of(d: &TraceData) -> Vec<Kind> {
    explain(d).iter().map(|f| f.kind).collect()
}

fn only(d: &TraceData, k: Kind) -> Vec<Finding> {
    explain(d).into_iter().filter(|f| f.kind == k).collect()
}

/// `total` launches of `cuLaunchKernel` counted in pid 100 (the trace's
/// only counted op), sampled every 200 ms from `from`: sample `i` (1 to
/// `periods`) reads `at(i)`.
fn counted_launches(
    d: &mut TraceData,
    total: u64,
    from: u64,
    periods: u64,
    at: impl Fn(u64) -> u64,
) {
    let op = op_by_name("cuLaunchKernel").unwrap().id;
    d.counts = vec![OpCount {
        pid: 100,
        op,
        count: total,
    }];
    d.count_samples = Some(
        (1..=periods)
            .map(|i| crate::counted::CountSample {
                ts_ns: from + i * 200 * MS,
                pid: 100,
                op,
                count: at(i),
            })
            .collect(),
    );
}

/// One more sample of [`counted_launches`]' op: `count` at `ts`.
fn sampled_at(d: &mut TraceData, ts: u64, count: u64) {
    let op = op_by_name("cuLaunchKernel").unwrap().id;
    d.count_samples
        .get_or_insert_with(Vec::new)
        .push(crate::counted::CountSample {
            ts_ns: ts,
            pid: 100,
            op,
            count,
        });
}

/// A 1000 ms window: a sync of `sync` ns at 0 (returning at once when short),
/// one returning at once every 100 ms after it (steps: the syncs sample the
/// GPU through the window, and no stretch between calls is one pause), a
/// last call in the final 1 ms, and between them `blocked` ns asleep (woken
/// by a timer) starting at 200 ms. The rest is on-CPU between calls.
fn host_trace(sync: u64, blocked: u64) -> TraceData {
    let mut calls = vec![call("cudaStreamSynchronize", 0, sync)];
    calls.extend((1..10).map(|i| call("cudaStreamSynchronize", i * 100 * MS, 0)));
    calls.push(call("cudaMalloc", 999 * MS, MS));
    let timer = Waker {
        pid: 0,
        tid: 0,
        comm: "swapper/0".into(),
        irq: true,
    };
    let waits = if blocked > 0 {
        vec![wait(
            WaitKind::Blocked,
            200 * MS,
            200 * MS + blocked,
            200 * MS + blocked,
            Some(timer),
        )]
    } else {
        Vec::new()
    };
    trace(calls, waits)
}

fn samples(busy_pct: f64) -> Option<Vec<GpuSample>> {
    Some(
        (1..=5)
            .map(|i| GpuSample {
                ts_ns: i * 200 * MS,
                gpu: 0,
                busy_pct,
                period_ns: 200 * MS,
            })
            .collect(),
    )
}

#[test]
fn host_bound_at_the_host_share_edge() {
    // Between calls: 899 ms; host = 899 - blocked; share 0.5 needs blocked <= 399 ms.
    let f = only(&host_trace(100 * MS, 399 * MS), Kind::HostBound);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].wall_share, Some(0.5));
    assert_eq!(f[0].severity, Severity::High);
    assert_eq!(f[0].evidence["host_ns"], 500 * MS);
    assert!(
        f[0].summary.contains("GPU busy: not measured"),
        "{}",
        f[0].summary
    );
    assert!(only(&host_trace(100 * MS, 399 * MS + 1), Kind::HostBound).is_empty());
}

#[test]
fn host_bound_needs_evidence_the_gpu_idled() {
    // Not measured: syncs may take at most 10% of the window.
    assert_eq!(only(&host_trace(100 * MS, 0), Kind::HostBound).len(), 1);
    assert!(only(&host_trace(100 * MS + 1, 0), Kind::HostBound).is_empty());
    // No sync at all and not measured: a full launch queue would look the same.
    let mut d = host_trace(100 * MS, 0);
    for c in &mut d.calls[..10] {
        *c = call("cudaMalloc", c.ts_ns, c.dur_ns);
    }
    assert!(only(&d, Kind::HostBound).is_empty());
    // Round 51's false-positive hunt: one sync at the end that blocked 35 ms
    // (3.5% of the window) saw the GPU once, with work queued: no evidence
    // it idled. Three syncs returning at once, spread over the window, are.
    // (Steps of 100 ms opened by allocations, so no stretch is one pause.)
    let steps = |syncs: &[u64]| {
        let mut calls: Vec<CallEvent> = (0..10)
            .map(|i| call("cudaMalloc", i * 100 * MS + 10 * US, 0))
            .collect();
        calls.extend(
            syncs
                .iter()
                .map(|&ts| call("cudaStreamSynchronize", ts * MS, 0)),
        );
        calls.push(call("cudaStreamSynchronize", 965 * MS, 35 * MS));
        calls.sort_by_key(|c| c.ts_ns);
        trace(calls, Vec::new())
    };
    let d = steps(&[]);
    assert!(only(&d, Kind::HostBound).is_empty(), "{:?}", kinds_of(&d));
    let d = steps(&[350, 650]);
    assert_eq!(only(&d, Kind::HostBound).len(), 1, "{:?}", kinds_of(&d));
    // Three syncs, but bunched after 900 ms of host work: they saw its end only.
    let d = steps(&[905, 935]);
    assert!(only(&d, Kind::HostBound).is_empty(), "{:?}", kinds_of(&d));
    // Measured: busy below 50% is evidence, 50% is not (whatever the syncs).
    let mut d = host_trace(100 * MS + 1, 0);
    d.gpu_samples = samples(49.0);
    let f = only(&d, Kind::HostBound);
    assert_eq!(f.len(), 1);
    assert!(f[0].summary.starts_with("GPU busy 49%"), "{}", f[0].summary);
    d.gpu_samples = samples(50.0);
    assert!(only(&d, Kind::HostBound).is_empty());
}

#[test]
fn launch_bound_at_the_cost_per_launch_edge() {
    // 899 ms on the CPU between calls; 50 us per launch needs 17,980 launches.
    let mut d = host_trace(100 * MS, 0);
    d.counts = vec![OpCount {
        pid: 100,
        op: op_by_name("cuLaunchKernel").unwrap().id,
        count: 17_980,
    }];
    let f = only(&d, Kind::LaunchBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["host_ns_per_launch"], 50 * US);
    assert_eq!(f[0].evidence["launches"], 17_980);
    // The same host time is not also called host_bound.
    assert!(only(&d, Kind::HostBound).is_empty());
    d.counts[0].count = 17_979; // 50.002 us per launch: host_bound instead
    assert!(only(&d, Kind::LaunchBound).is_empty());
    assert_eq!(only(&d, Kind::HostBound).len(), 1);
}

/// Round 56's tester: a launch loop sharing its CPU with a hog read
/// launch_bound 99.9% ("on the CPU") and a between-calls cpu_preemption
/// 50.2% of the same runnable time. launch_bound counts it: it names the
/// CPU's holders and says the time apart; no second finding claims it.
#[test]
fn launch_bound_says_the_cpu_taken_and_nothing_claims_it_again() {
    let mut d = host_trace(100 * MS, 0);
    d.counts = vec![OpCount {
        pid: 100,
        op: op_by_name("cuLaunchKernel").unwrap().id,
        count: 17_980,
    }];
    d.waits.extend([310, 410, 510].map(|t| {
        let mut w = wait(WaitKind::Preempted, t * MS, t * MS, (t + 80) * MS, None);
        w.culprits = vec![crate::event::Culprit {
            pid: 999,
            tid: 999,
            comm: "hog".into(),
            ns: 80 * MS,
        }];
        w
    }));
    d.waits.sort_by_key(|w| w.on_ns);
    let f = only(&d, Kind::LaunchBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["host_runnable_ns"], 240 * MS);
    assert_eq!(f[0].culprits[0].comm, "hog");
    assert!(
        f[0].summary.contains(
            "240.0 ms of it runnable while other tasks held the CPU, mostly hog (pid 999))"
        ),
        "{}",
        f[0].summary
    );
    assert!(
        only(&d, Kind::CpuPreemption).is_empty(),
        "{:?}",
        kinds_of(&d)
    );
    let line = explain_report(&d).summary.unwrap();
    assert!(
        line.ends_with("(66% computing, 24% waiting for a CPU): launch-bound"),
        "{line}"
    );
}

#[test]
fn launch_bound_needs_enough_launches() {
    // A 100 ms window: 10 ms sync, 1 ms last call, 89 ms between calls of
    // which 39.05 ms preempted: on-CPU 49.95 ms.
    // (Syncs returning at once every 15 ms from 25 ms: the GPU idled, and
    // no stretch between calls is a fifth of the window.)
    let mut calls = vec![call("cudaStreamSynchronize", 0, 10 * MS)];
    calls.extend((1..6).map(|i| call("cudaStreamSynchronize", (10 + i * 15) * MS, 0)));
    calls.push(call("cudaMalloc", 99 * MS, MS));
    let pre = wait(
        WaitKind::Preempted,
        20 * MS,
        20 * MS,
        20 * MS + 39_050 * US,
        None,
    );
    let mut d = trace(calls, vec![pre]);
    d.counts = vec![OpCount {
        pid: 100,
        op: op_by_name("cuLaunchKernel").unwrap().id,
        count: 999,
    }];
    assert!(only(&d, Kind::LaunchBound).is_empty());
    d.counts[0].count = 1000; // 49.95 us per launch
    assert_eq!(only(&d, Kind::LaunchBound).len(), 1);
}

/// A 1000 ms window: a 700 ms sync, steps opened by a call at 750, 800 and
/// 850 ms (no stretch is one pause), a last call in the final 1 ms.
fn steps_after_a_sync() -> Vec<CallEvent> {
    let mut calls = vec![call("cudaStreamSynchronize", 0, 700 * MS)];
    calls.extend([750, 800, 850].map(|ts| call("cudaMalloc", ts * MS, 0)));
    calls.push(call("cudaMalloc", 999 * MS, MS));
    calls
}

/// Blocked from `off` to `on` ms, woken by `by`.
fn step_wait(off: u64, on: u64, by: Waker) -> WaitEvent {
    wait(WaitKind::Blocked, off * MS, on * MS, on * MS, Some(by))
}

/// Round 51's false-positive hunt: a launcher blocked in `waitpid` on its
/// GPU-working child read as input-bound, woken by the child. Blocked time
/// another CUDA-issuing process of the trace ended is the thread waiting on
/// that process's GPU work: here 150 of the 200 ms, leaving 5%, no verdict.
#[test]
fn waiting_on_another_cuda_process_is_no_input_wait() {
    let woken_by = |pid: u32| Waker {
        pid,
        tid: pid,
        comm: "worker".into(),
        irq: false,
    };
    let mut calls = steps_after_a_sync();
    let waits = vec![
        step_wait(700, 750, woken_by(555)),
        step_wait(750, 800, woken_by(555)),
        step_wait(800, 850, woken_by(555)),
        step_wait(850, 900, woken_by(556)),
    ];
    let d = trace(calls.clone(), waits.clone());
    assert_eq!(
        only(&d, Kind::InputWait).len(),
        1,
        "555 is no CUDA process yet"
    );
    // Process 555 issues CUDA work of its own.
    for i in 0..3 {
        let mut c = call("cudaLaunchKernel", 100 * MS + i * MS, 10 * US);
        (c.pid, c.tid) = (555, 555);
        calls.push(c);
    }
    calls.sort_by_key(|c| c.ts_ns);
    let mut d = trace(calls, waits);
    d.processes.push(crate::data::ProcessInfo {
        pid: 555,
        comm: "worker".into(),
        ..Default::default()
    });
    assert!(only(&d, Kind::InputWait).is_empty(), "{:?}", kinds_of(&d));
}

#[test]
fn input_wait_names_the_wakers_with_their_share() {
    let worker = |pid: u32| Waker {
        pid,
        tid: pid,
        comm: "pt_data_worker".into(),
        irq: false,
    };
    // A 1000 ms window: a 700 ms sync, then 200 ms blocked between calls
    // (exactly 20%): 150 ms ended by worker 555, 50 ms by worker 556.
    let calls = steps_after_a_sync();
    let waits = vec![
        step_wait(700, 750, worker(555)),
        step_wait(750, 800, worker(555)),
        step_wait(800, 850, worker(555)),
        step_wait(850, 900, worker(556)),
    ];
    let d = trace(calls.clone(), waits.clone());
    let f = only(&d, Kind::InputWait);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].wall_share, Some(0.2));
    assert_eq!(f[0].severity, Severity::Medium);
    assert_eq!(f[0].culprits.len(), 2);
    assert_eq!(
        (f[0].culprits[0].pid, f[0].culprits[0].runnable_ns),
        (555, 150 * MS)
    );
    assert!((f[0].culprits[0].share - 0.75).abs() < 1e-9);
    // Each waker is a thread: its tid is in the answer.
    assert_eq!(f[0].culprits[0].tid, Some(555));
    assert!(
        f[0].recommendation.contains("DataLoader workers"),
        "{}",
        f[0].recommendation
    );
    assert!(
        f[0].summary
            .contains("pt_data_worker (pid 555, tid 555) 75%"),
        "{}",
        f[0].summary
    );
    // One nanosecond less blocked: below 20%.
    let mut w = waits.clone();
    (w[3].wake_ns, w[3].on_ns) = (900 * MS - 1, 900 * MS - 1);
    assert!(only(&trace(calls, w), Kind::InputWait).is_empty());
}

/// `n` steps of 10 ms: a sync of 10 ms - host, then `host` ns of work; a
/// launch at `n` x 10 ms queues the next step (it ends the last stretch),
/// a last call at `end` closes the window.
fn sync_trace(n: u64, host: u64, end: u64) -> TraceData {
    let mut calls: Vec<CallEvent> = (0..n)
        .map(|i| call("cudaStreamSynchronize", i * 10 * MS, 10 * MS - host))
        .collect();
    calls.push(call("cudaLaunchKernel", n * 10 * MS, 0));
    calls.push(call("cudaFree", end, 0));
    trace(calls, Vec::new())
}

#[test]
fn sync_stall_at_its_edges() {
    // 20 steps: 2 ms host, 8 ms sync: overlappable 20 x 2 ms = 40 ms of 200 ms = 20%.
    let f = only(&sync_trace(20, 2 * MS, 200 * MS), Kind::SyncStall);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].evidence["overlappable_ns"], 40 * MS);
    assert_eq!(f[0].wall_share, Some(0.2));
    assert_eq!(f[0].evidence["host_between_syncs_p50_ns"], 2 * MS);
    // One more nanosecond of window: just under 20%.
    assert!(only(&sync_trace(20, 2 * MS, 200 * MS + 1), Kind::SyncStall).is_empty());
    // 19 syncs are too few (window 190 ms: 38 ms = 20%).
    assert!(only(&sync_trace(19, 2 * MS, 190 * MS), Kind::SyncStall).is_empty());
    // Measured GPU busy caps what overlap could win: 90% busy leaves 20 ms idle.
    let mut d = sync_trace(20, 2 * MS, 200 * MS);
    d.gpu_samples = Some(vec![GpuSample {
        ts_ns: 200 * MS,
        gpu: 0,
        busy_pct: 90.0,
        period_ns: 200 * MS,
    }]);
    assert!(only(&d, Kind::SyncStall).is_empty());
    // Syncs that are the GPU's time (1 ms of host per 10 ms step) are healthy.
    assert!(explain(&sync_trace(20, MS / 2, 200 * MS)).is_empty());
}

fn copy(ts: u64, on_cpu: u64, host_ptr: u64) -> CallEvent {
    let mut c = call("cudaMemcpy", ts, on_cpu);
    c.kind = Some(1);
    c.size = Some(1 << 20);
    c.host_ptr = Some(host_ptr);
    c
}

fn host_alloc(op: &str, ts: u64, ptr: u64, size: u64) -> CallEvent {
    let mut c = call(op, ts, 10 * US);
    c.ptr = Some(ptr);
    c.size = Some(size);
    c
}

/// A 1000 ms window, GPU-bound (a 900 ms sync) plus copies of `on_cpu` each
/// from `host_ptr`, and the calls in `extra`.
fn copy_trace(copies: u64, on_cpu: u64, host_ptr: u64, extra: Vec<CallEvent>) -> TraceData {
    let mut calls = vec![
        call("cudaStreamSynchronize", 0, 900 * MS),
        call("cudaFree", 999 * MS, MS),
    ];
    calls.extend((0..copies).map(|i| copy(900 * MS + i * 9 * MS, on_cpu, host_ptr)));
    calls.extend(extra);
    trace(calls, Vec::new())
}

#[test]
fn pageable_copy_at_its_edge_and_pinned_ranges_respected() {
    // 10 copies of 5 ms on the CPU: 50 ms = 5% of the window.
    let f = only(&copy_trace(10, 5 * MS, 0x5000, vec![]), Kind::PageableCopy);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].evidence["copies"], 10);
    assert_eq!(f[0].evidence["staging_ns"], 50 * MS);
    assert_eq!(f[0].evidence["h2d"], 10);
    assert!(only(
        &copy_trace(10, 5 * MS - 1, 0x5000, vec![]),
        Kind::PageableCopy
    )
    .is_empty());
    // The same copies from inside a pinned buffer (cudaHostAlloc before them): none.
    let pinned = vec![host_alloc("cudaHostAlloc", MS, 0x4000, 0x2000)];
    assert!(only(&copy_trace(10, 5 * MS, 0x5000, pinned), Kind::PageableCopy).is_empty());
    // A registered range counts as pinned too; one byte past its end does not.
    let reg = vec![host_alloc("cudaHostRegister", MS, 0x4000, 0x1000)];
    assert!(only(
        &copy_trace(10, 5 * MS, 0x4fff, reg.clone()),
        Kind::PageableCopy
    )
    .is_empty());
    assert_eq!(
        only(&copy_trace(10, 5 * MS, 0x5000, reg), Kind::PageableCopy).len(),
        1
    );
    // Freed before the copies: pageable again.
    let mut freed = vec![host_alloc("cudaHostAlloc", MS, 0x4000, 0x2000)];
    let mut fh = call("cudaFreeHost", 2 * MS, 10 * US);
    fh.ptr = Some(0x4000);
    freed.push(fh);
    assert_eq!(
        only(&copy_trace(10, 5 * MS, 0x5000, freed), Kind::PageableCopy).len(),
        1
    );
}

#[test]
fn the_verdict_explaining_most_time_ranks_first_failures_before_all() {
    // Host-bound (89.9% host) with a pageable copy share of 5%.
    let mut d = host_trace(100 * MS, 0);
    d.calls
        .extend((0..10).map(|i| copy(300 * MS + i * 10 * MS, 5 * MS, 0x5000)));
    d.calls.sort_by_key(|c| c.ts_ns);
    let f = explain(&d);
    let k: Vec<Kind> = f.iter().map(|x| x.kind).collect();
    assert_eq!(&k[..2], &[Kind::HostBound, Kind::PageableCopy], "{k:?}");
    assert!(f[0].wall_share > f[1].wall_share);
    // A failed allocation comes before every verdict.
    let mut fail = call("cudaMalloc", 500 * MS, 10 * US);
    fail.ret = 2;
    fail.size = Some(1 << 40);
    d.calls.push(fail);
    d.calls.sort_by_key(|c| c.ts_ns);
    assert_eq!(explain(&d)[0].kind, Kind::AllocationFailure);
    // The summary line is still the verdict's: a failure is not where the
    // time went.
    let line = explain_report(&d).summary.unwrap();
    assert!(line.ends_with("host-bound"), "{line}");
}

#[test]
fn windows_shorter_than_the_minimum_are_not_judged() {
    // 99.9 ms of pure host work in steps of 15 ms: too short.
    let mut calls = vec![call("cudaStreamSynchronize", 0, 10 * US)];
    calls.extend((1..7).map(|i| call("cudaStreamSynchronize", i * 15 * MS, 0)));
    calls.push(call("cudaMalloc", 99_890 * US, 10 * US));
    let d = trace(calls, Vec::new());
    assert!(explain(&d).is_empty());
    let mut d2 = d.clone();
    d2.calls.last_mut().unwrap().ts_ns = 99_990 * US; // exactly 100 ms
    assert_eq!(kinds_of(&d2), vec![Kind::HostBound]);
}

#[test]
fn the_tracer_is_never_a_culprit_and_its_time_is_a_note() {
    use crate::event::Culprit;
    let mut d = host_trace(100 * MS, 0);
    d.stats.insert(crate::threads::TRACER_PID_STAT.into(), 4242);
    let mut pre = wait(WaitKind::Preempted, 300 * MS, 300 * MS, 310 * MS, None);
    pre.culprits = vec![
        Culprit {
            pid: 4242,
            tid: 4243,
            comm: "tokio-rt".into(),
            ns: 6 * MS,
        },
        Culprit {
            pid: 7,
            tid: 7,
            comm: "hog".into(),
            ns: 4 * MS,
        },
    ];
    d.waits.push(pre);
    let r = explain_report(&d);
    let hb = r
        .findings
        .iter()
        .find(|f| f.kind == Kind::HostBound)
        .unwrap();
    assert_eq!(hb.culprits.len(), 1);
    assert_eq!(
        (hb.culprits[0].pid, hb.culprits[0].comm.as_str()),
        (7, "hog")
    );
    crate::testing::assert_some_line(&r.notes, |n| {
        n.starts_with("gpusleuth's own threads held the CPU for 6.00 ms")
    });
}

/// A GPU-bound loop of `steps` steps of 100 ms (a launch, then a sync
/// blocked `sync` ns; `wait` ns between, woken by a DataLoader worker),
/// after `cudaSetDevice` at 0 and a 1.5-s pause of `pause_blocked` ns
/// asleep (woken by a timer) and the rest on the CPU.
fn paused_trace(steps: u64, sync: u64, wait_ns: u64, pause_blocked: u64) -> TraceData {
    const PAUSE: u64 = 1_500 * MS;
    let timer = Waker {
        pid: 0,
        tid: 0,
        comm: "swapper/0".into(),
        irq: true,
    };
    let worker = Waker {
        pid: 555,
        tid: 555,
        comm: "pt_data_worker".into(),
        irq: false,
    };
    let mut calls = vec![call("cudaSetDevice", 0, 10 * US)];
    let mut waits = Vec::new();
    if pause_blocked > 0 {
        waits.push(wait(
            WaitKind::Blocked,
            10 * US,
            10 * US + pause_blocked,
            10 * US + pause_blocked,
            Some(timer),
        ));
    }
    for i in 0..steps {
        let t = PAUSE + i * 100 * MS;
        calls.push(call("cudaLaunchKernel", t, 10 * US));
        let mut s = call("cudaStreamSynchronize", t + 20 * US, sync);
        s.blocked_ns = sync;
        calls.push(s);
        if wait_ns > 0 {
            let off = t + 20 * US + sync;
            waits.push(wait(
                WaitKind::Blocked,
                off,
                off + wait_ns,
                off + wait_ns,
                Some(worker.clone()),
            ));
        }
    }
    calls.push(call("cudaFree", PAUSE + steps * 100 * MS, 0));
    trace(calls, waits)
}

/// Round 51's false-positive hunt: `set_device`, then 1.5 s loading a
/// dataset, then a GPU-bound loop read as input_wait woken by timers 100%
/// (asleep) or would read as host_bound (computing). One pause is not time
/// lost at every step: judged apart, and the summary line says it was there.
#[test]
fn a_pause_after_the_first_call_is_judged_apart_from_the_steady_steps() {
    // Asleep for the whole pause; each step 99.97 ms blocked in its sync.
    let d = paused_trace(20, 99_970 * US, 0, 1_500 * MS - 10 * US);
    let r = explain_report(&d);
    assert!(r.findings.is_empty(), "{:?}", kinds_of(&d));
    let line = r.summary.unwrap();
    assert!(
        line.contains("one pause of 1.5 s, 0.0 s after its first CUDA call (1.5 s blocked, woken by (interrupt: timer or device), 0.0 s on the host)"),
        "{line}"
    );
    // Where the time went is said of the steady steps: GPU-bound (over the
    // whole window the syncs were 57%, the pause 43%).
    assert!(
        line.contains("in its steady steps (2.0 s of 3.5 s traced), spent 100% waiting for the GPU inside syncs: GPU-bound"),
        "{line}"
    );
    // Computing through it (no wait recorded): no host_bound either.
    let d = paused_trace(20, 99_970 * US, 0, 0);
    let r = explain_report(&d);
    assert!(r.findings.is_empty(), "{:?}", kinds_of(&d));
    assert!(r
        .summary
        .unwrap()
        .contains("(0.0 s blocked, 1.5 s on the host)"));
    // Without the pause the thread's blocked time was 43% of its window.
    let t = &crate::threads::thread_splits(&d)[0];
    let p = &t.pauses[0];
    assert_eq!((p.start_ns, p.end_ns), (10 * US, 1_500 * MS));
}

/// Time lost at every step after a pause is still found, its share that of
/// the steady steps: 20 steps of 100 ms each 40 ms blocked, woken by a
/// worker (40%), after a 1.5-s pause asleep (1.5 + 0.8 s blocked of 3.5 s
/// would read 66%).
#[test]
fn steady_waits_after_a_pause_are_input_wait_of_the_steady_steps() {
    let d = paused_trace(20, 59_970 * US, 40 * MS, 1_500 * MS - 10 * US);
    let f = only(&d, Kind::InputWait);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    let share = f[0].wall_share.unwrap();
    assert!((share - 0.4).abs() < 0.001, "{share}");
    assert_eq!(f[0].evidence["pauses_left_out"], 1);
    // The window less the pause (10 us to 1500 ms).
    assert_eq!(f[0].evidence["steady_window_ns"], 2_000 * MS + 10 * US);
    assert!(
        f[0].summary
            .contains("(800.0 ms of 2000.0 ms, without one pause of 1.5 s"),
        "{}",
        f[0].summary
    );
    assert_eq!(f[0].culprits[0].pid, 555);
    // The pause a wait on another CUDA process (a launcher's `waitpid` on
    // its GPU worker): its time was taken out twice, once as waiting on GPU
    // work and once as the pause (round 52's tester: no finding).
    let mut d = paused_trace(20, 59_970 * US, 40 * MS, 1_500 * MS - 10 * US);
    d.waits[0].waker = Some(Waker {
        pid: 777,
        tid: 777,
        comm: "worker".into(),
        irq: false,
    });
    let mut c = call("cudaLaunchKernel", 100 * MS, 10 * US);
    (c.pid, c.tid) = (777, 777);
    d.calls.push(c);
    d.calls.sort_by_key(|c| c.ts_ns);
    d.processes.push(crate::data::ProcessInfo {
        pid: 777,
        comm: "worker".into(),
        ..Default::default()
    });
    let f = only(&d, Kind::InputWait);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert!((f[0].wall_share.unwrap() - 0.4).abs() < 0.001);
    // The same pause spent computing: left out as well, the same 40%.
    let d = paused_trace(20, 59_970 * US, 40 * MS, 0);
    let f = only(&d, Kind::InputWait);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["pauses_left_out"], 1);
    assert!((f[0].wall_share.unwrap() - 0.4).abs() < 0.001);
    // The wakers said are the steady steps': the worker's, not the pause's timer.
    assert!(
        f[0].summary
            .contains("woken by pt_data_worker (pid 555, tid 555) 100%"),
        "{}",
        f[0].summary
    );
}

/// A preempted copy's runnable time is cpu_preemption's: pageable_copy's
/// staging is its on-CPU time alone (round 51's false-positive hunt: both
/// findings counted it).
#[test]
fn a_pageable_copys_staging_is_its_on_cpu_time_alone() {
    let mut d = copy_trace(10, 5 * MS, 0x5000, vec![]);
    for c in d.calls.iter_mut().filter(|c| c.op_name() == "cudaMemcpy") {
        c.dur_ns += 3 * MS;
        c.runnable_ns = 3 * MS;
    }
    d.calls.sort_by_key(|c| c.ts_ns);
    let f = only(&d, Kind::PageableCopy);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["staging_ns"], 50 * MS);
    assert_eq!(f[0].evidence["runnable_in_copies_ns"], 30 * MS);
    assert_eq!(f[0].evidence["copy_wall_ns"], 80 * MS);
}

/// GPU busy is measured over the steady steps: the idle GPU of a pause
/// spent loading is no evidence that the loop starved it. After a 1.5-s
/// pause (GPU 0% busy) 20 steps of 60 ms host work and a 40 ms sync keep
/// the GPU 60% busy: no host_bound (over the whole window the GPU was 34%
/// busy, "measured low"), and the sync every step is found.
#[test]
fn gpu_busy_of_the_steady_steps_judges_them() {
    let mut calls = vec![call("cudaSetDevice", 0, 10 * US)];
    for i in 0..20 {
        let t = 1_500 * MS + i * 100 * MS;
        calls.push(call("cudaLaunchKernel", t + 60 * MS, 10 * US));
        let mut s = call("cudaStreamSynchronize", t + 60 * MS + 20 * US, 39_980 * US);
        s.blocked_ns = s.dur_ns;
        calls.push(s);
    }
    calls.push(call("cudaFree", 3_500 * MS, 0));
    let mut d = trace(calls, Vec::new());
    let sample = |i: u64, busy_pct: f64| GpuSample {
        ts_ns: i * 100 * MS,
        gpu: 0,
        busy_pct,
        period_ns: 100 * MS,
    };
    d.gpu_samples = Some(
        (1..=35)
            .map(|i| sample(i, if i <= 15 { 0.0 } else { 60.0 }))
            .collect(),
    );
    let r = explain_report(&d);
    assert!(only(&d, Kind::HostBound).is_empty(), "{:?}", kinds_of(&d));
    // What the steps do show: a sync every step, 40% of them could overlap
    // (over the whole window its 20 syncs were 5.7/s, under the 10/s floor).
    let kinds: Vec<Kind> = r.findings.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, vec![Kind::SyncStall]);
    assert!(
        r.findings[0]
            .summary
            .contains("of 1940.0 ms, without one pause of 1.6 s"),
        "{}",
        r.findings[0].summary
    );
    // 19 steps' 40 ms (the first step's host work is in the pause, and
    // the sync after it went with it) of 1.94 s.
    let share = r.findings[0].wall_share.unwrap();
    assert!((share - 0.76 / 1.94).abs() < 0.001, "{share}");
    let line = r.summary.unwrap();
    assert!(line.starts_with("GPU busy 60%;"), "{line}");
    // (The pause runs to the first launch: 1.56 s.)
    assert!(
        line.contains("in its steady steps (1.9 s of 3.5 s traced)"),
        "{line}"
    );
    // The loop's GPU idle instead (10% busy): host-bound.
    d.gpu_samples = Some(
        (1..=35)
            .map(|i| sample(i, if i <= 15 { 0.0 } else { 10.0 }))
            .collect(),
    );
    let f = only(&d, Kind::HostBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    // 19 steps' 60 ms of host work over 1.94 s (the first step's is in the pause).
    let share = f[0].wall_share.unwrap();
    assert!((share - 1.14 / 1.94).abs() < 0.001, "{share}");
    assert!(f[0].summary.starts_with("GPU busy 10%"), "{}", f[0].summary);
}

/// Round 52's tester, the stretches that are the program and the pauses
/// that are not: `steps` steps of `step` ns after `cudaSetDevice` at 0, each
/// `host` ns of on-CPU work, a launch, and a sync blocked for the rest;
/// `pauses`: (before which step, how long) asleep, woken by a timer.
fn steps_with_pauses(steps: u64, step: u64, host: u64, pauses: &[(u64, u64)]) -> TraceData {
    let timer = Waker {
        pid: 0,
        tid: 0,
        comm: "swapper/0".into(),
        irq: true,
    };
    let mut calls = vec![call("cudaSetDevice", 0, 10 * US)];
    let mut waits = Vec::new();
    let mut t = 10 * US;
    for i in 0..steps {
        if let Some(&(_, len)) = pauses.iter().find(|p| p.0 == i) {
            waits.push(wait(
                WaitKind::Blocked,
                t,
                t + len,
                t + len,
                Some(timer.clone()),
            ));
            t += len;
        }
        calls.push(call("cudaLaunchKernel", t + host, 10 * US));
        let rest = step.saturating_sub(host + 10 * US);
        let mut s = call("cudaStreamSynchronize", t + host + 10 * US, rest);
        s.blocked_ns = rest;
        calls.push(s);
        t += step;
    }
    calls.push(call("cudaFree", t, 0));
    trace(calls, waits)
}

/// 30 waits of 30 ms every 33 ms from 1 ms, each ended by a loader thread
/// (pid 555): a loop of counted launches starved by its DataLoader.
fn loader_waits() -> Vec<WaitEvent> {
    let loader = Waker {
        pid: 555,
        tid: 555,
        comm: "gs-loader".into(),
        irq: false,
    };
    (0..30)
        .map(|i| {
            let off = MS + i * 33 * MS;
            let on = off + 30 * MS;
            wait(WaitKind::Blocked, off, on, on, Some(loader.clone()))
        })
        .collect()
}

#[test]
fn stretches_that_are_the_program_are_not_pauses() {
    // A DataLoader-starved loop of counted launches between `set_device`
    // and one final sync: two calls, one stretch of 99%: input_wait, not a
    // pause (it read "no verdict").
    let calls = vec![
        call("cudaSetDevice", 0, 10 * US),
        call("cudaStreamSynchronize", 995 * MS, 5 * MS),
    ];
    let waits = loader_waits();
    let d = trace(calls, waits);
    let f = only(&d, Kind::InputWait);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["pauses_left_out"], 0);
    // Two sleeps of 1.2 s around healthy GPU-bound steps: alike, so no
    // one-off; the thread's time asleep is said as it was (66%, woken by
    // timers), not left out as pauses.
    let d = steps_with_pauses(60, 20 * MS, 0, &[(0, 1_200 * MS), (30, 1_200 * MS)]);
    let f = only(&d, Kind::InputWait);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["pauses_left_out"], 0);
    assert!(f[0]
        .summary
        .contains("woken by (interrupt: timer or device) 100%"));
    // Asleep, not waiting on a producer: no DataLoader advice.
    assert!(
        f[0].recommendation
            .starts_with("The issuing thread mostly sleeps or waits on a device"),
        "{}",
        f[0].recommendation
    );
    // One of them 3.6 s: a one-off, left out.
    let d = steps_with_pauses(60, 20 * MS, 0, &[(0, 3_600 * MS), (30, 1_200 * MS)]);
    let f = only(&d, Kind::InputWait);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["pauses_left_out"], 1);
    // Periodic long host phases (three of 1 s, each before ten GPU-bound
    // steps) are the workload: host-bound, not three pauses (round 52's
    // tester: zero findings, "GPU-bound 99%").
    let mut calls = vec![call("cudaSetDevice", 0, 10 * US)];
    let mut t = 10 * US;
    for _ in 0..3 {
        t += 1_000 * MS;
        for _ in 0..10 {
            calls.push(call("cudaStreamSynchronize", t, MS));
            t += 3 * MS;
        }
    }
    calls.push(call("cudaFree", t, 0));
    let d = trace(calls, Vec::new());
    let f = only(&d, Kind::HostBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["pauses_left_out"], 0);
}

/// Host-bound steps after a 3-s setup spent computing (or asleep): found,
/// their share that of the steps; the syncs' evidence is read without the
/// pause (its stretch was the window's longest before a sync: no verdict,
/// round 52's tester).
#[test]
fn host_bound_steps_after_a_setup_are_found() {
    // A 3-s setup computing, then 60 steps of 16 ms: 15 ms host, a launch,
    // a sync returning in 1 ms (the tester's `compute 3000; repeat 60 {
    // compute 15; launch 1; sync_sleep 1 }`).
    let mut d = steps_with_pauses(60, 16 * MS, 15 * MS, &[]);
    for c in &mut d.calls[1..] {
        c.ts_ns += 3_000 * MS;
    }
    let f = only(&d, Kind::HostBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    let share = f[0].wall_share.unwrap();
    assert!((share - 15.0 / 16.0).abs() < 0.01, "{share}");
    assert_eq!(f[0].evidence["pauses_left_out"], 1);
    assert!(
        f[0].summary.contains("without one pause of 3.0 s"),
        "{}",
        f[0].summary
    );
    // The same setup asleep: found the same.
    let mut d = steps_with_pauses(60, 16 * MS, 15 * MS, &[(0, 3_000 * MS)]);
    d.calls.sort_by_key(|c| c.ts_ns);
    let f = only(&d, Kind::HostBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert!((f[0].wall_share.unwrap() - 15.0 / 16.0).abs() < 0.01);
}

/// A sync's runnable time is the CPU taken by other tasks (cpu_preemption's),
/// not GPU work that removing the sync could overlap. 20 steps of 2 ms host
/// and an 8 ms sync: with 7 ms of each sync runnable, the GPU's 1 ms a step
/// is all that could overlap (20 ms, 10%: no finding; it read 20%); with
/// 3 ms runnable, 5 ms remain and the host's 2 ms bound it (40 ms).
#[test]
fn a_syncs_runnable_time_is_not_overlappable() {
    let mut d = sync_trace(20, 2 * MS, 200 * MS);
    for c in d
        .calls
        .iter_mut()
        .filter(|c| c.op_name() == "cudaStreamSynchronize")
    {
        c.runnable_ns = 7 * MS;
    }
    assert!(only(&d, Kind::SyncStall).is_empty(), "{:?}", kinds_of(&d));
    for c in d
        .calls
        .iter_mut()
        .filter(|c| c.op_name() == "cudaStreamSynchronize")
    {
        c.runnable_ns = 3 * MS;
    }
    let f = only(&d, Kind::SyncStall);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["overlappable_ns"], 40 * MS);
}

/// Round 52's tester: four steps of 350 ms host work and a 30-ms sync are
/// a loop of long steps, not four pauses (it read "no verdict", the loop
/// 93% host-bound): pauses are one-offs, each at least three times the next
/// longest stretch.
#[test]
fn a_loop_of_a_few_long_steps_has_no_pauses() {
    let mut calls = vec![call("cudaSetDevice", 0, 10 * US)];
    let mut t = 10 * US;
    for _ in 0..4 {
        // A few calls (a copy, a memset), 350 ms computing, a sync returning at once.
        calls.push(call("cudaMemcpy", t, 10 * US));
        calls.push(call("cudaMemset", t + 20 * US, 10 * US));
        calls.push(call("cudaStreamSynchronize", t + 350 * MS, 100 * US));
        t += 351 * MS;
    }
    calls.push(call("cudaFree", t, 0));
    let d = trace(calls, Vec::new());
    let f = only(&d, Kind::HostBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["pauses_left_out"], 0);
    assert!(f[0].wall_share.unwrap() > 0.99);
}

/// A stretch in which the process launched kernels the kernel counted is no
/// pause: the tracer's samples of the running count place them. A 1-s loop
/// of launches starved by a loader between `set_device` and 30 syncs read
/// as a pause and no verdict (round 52's tester); and a 3-s warm-up of
/// 30,000 launches before host-bound steps read as the steps' launch_bound.
#[test]
fn counted_launches_place_what_is_no_pause() {
    let launch_op = op_by_name("cuLaunchKernel").unwrap().id;
    let sample = |ts: u64, count: u64| crate::counted::CountSample {
        ts_ns: ts,
        pid: 100,
        op: launch_op,
        count,
    };
    // The loader-starved loop: blocked 900 of its 1000 ms, woken by a
    // worker; then 30 syncs of 5 ms back to back.
    let mut calls = vec![call("cudaSetDevice", 0, 10 * US)];
    for i in 0..30 {
        let mut s = call("cudaStreamSynchronize", 1_000 * MS + i * 5 * MS, 5 * MS);
        s.blocked_ns = 5 * MS;
        calls.push(s);
    }
    let waits = loader_waits();
    let mut d = trace(calls, waits);
    d.counts = vec![OpCount {
        pid: 100,
        op: launch_op,
        count: 30,
    }];
    // Sampled every 200 ms while it launched.
    d.count_samples = Some((1..5).map(|i| sample(i * 200 * MS, i * 6)).collect());
    let f = only(&d, Kind::InputWait);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["pauses_left_out"], 0);
    // Not sampled (a run's files, an older trace): counted launches could
    // lie in any stretch; none is left out.
    d.count_samples = None;
    assert_eq!(only(&d, Kind::InputWait).len(), 1, "{:?}", kinds_of(&d));
    // Sampled, the samples' periods past the stretch's end (a sample just
    // after a pause counts the launches that followed it): a pause.
    d.count_samples = Some(vec![sample(1_100 * MS, 30)]);
    let f = only(&d, Kind::InputWait);
    assert!(f.is_empty(), "{:?}", kinds_of(&d));

    // The warm-up: 3 s of launches (counted), then 60 host-bound steps of
    // 16 ms with a launch call each (not counted) and a sync at once.
    let mut d = steps_with_pauses(60, 16 * MS, 15 * MS, &[]);
    for c in &mut d.calls[1..] {
        c.ts_ns += 3_000 * MS;
    }
    d.counts = vec![OpCount {
        pid: 100,
        op: launch_op,
        count: 30_000,
    }];
    d.count_samples = Some((1..15).map(|i| sample(i * 200 * MS, i * 2_000)).collect());
    let k = kinds_of(&d);
    assert!(!k.contains(&Kind::LaunchBound), "{k:?}");
    // Without samples nothing is left out: the whole window's launches.
    // (Neither is host-bound: the syncs saw only the steps, not the 3 s
    // before them, where the GPU may have been busy.)
    d.count_samples = None;
    let k = kinds_of(&d);
    assert!(!k.contains(&Kind::LaunchBound), "{k:?}");
}

/// Round 52's tester: a 3-s sync in the middle of a loop of 20-ms syncs (a
/// GPU hang) read "GPU-bound" and nothing else; blocked sync time is never
/// a finding, but the summary line names the sync that stands out.
#[test]
fn the_slowest_sync_that_stands_out_is_named() {
    let mut calls = vec![call("cudaSetDevice", 0, 10 * US)];
    let mut t = 20 * US;
    for i in 0..40 {
        let dur = if i == 20 { 3_000 * MS } else { 20 * MS };
        let mut s = call("cudaStreamSynchronize", t, dur);
        s.blocked_ns = dur;
        calls.push(s);
        t += dur + 10 * US;
    }
    let d = trace(calls, Vec::new());
    let r = explain_report(&d);
    assert!(r.findings.is_empty(), "{:?}", kinds_of(&d));
    let line = r.summary.unwrap();
    assert!(
        line.contains(": GPU-bound; its slowest sync took 3.0 s, 0.4 s after its first CUDA call (150x the median, 20.0 ms)"),
        "{line}"
    );
    // Without it: nothing said.
    let calls: Vec<CallEvent> = d
        .calls
        .iter()
        .filter(|c| c.dur_ns != 3_000 * MS)
        .cloned()
        .collect();
    let line = explain_report(&trace(calls, Vec::new())).summary.unwrap();
    assert!(!line.contains("slowest sync"), "{line}");
}

/// [`sync_trace`] with a recorded launch in each step `at` ns after its
/// sync returned (`--launches full`, or an NCCL call).
fn sync_trace_with_launches(host: u64, at: u64) -> TraceData {
    let mut d = sync_trace(20, host, 200 * MS);
    d.calls
        .extend((0..20u64).map(|i| call("cudaLaunchKernel", i * 10 * MS + 10 * MS - host + at, 0)));
    d.calls.sort_by_key(|c| c.ts_ns);
    d
}

/// Round 55's tester: a loop that queues its kernels first and then works
/// on the host (`launch 20; compute 5; sync_sleep 10`) had the GPU busy
/// through the host work, yet read ~35% sync-stalled like one that works
/// first. A sync's stretch ends at the first kernel queued after it.
#[test]
fn kernels_queued_before_the_host_work_are_no_sync_stall() {
    // Launched as the sync returns, 2 ms of host work after: nothing to overlap.
    let d = sync_trace_with_launches(2 * MS, 0);
    assert!(only(&d, Kind::SyncStall).is_empty(), "{:?}", kinds_of(&d));
    // 3 ms of host work, launched after 2 ms of it: the GPU idled through
    // those 2 ms (20%).
    let f = only(&sync_trace_with_launches(3 * MS, 2 * MS), Kind::SyncStall);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].evidence["overlappable_ns"], 40 * MS);
    assert_eq!(f[0].evidence["host_between_syncs_p50_ns"], 2 * MS);
    // Launched midway: half of it.
    let d = sync_trace_with_launches(2 * MS, MS);
    let t = crate::threads::thread_splits(&d);
    assert_eq!(t[0].sync_overlap_ns, Some(20 * MS));
    // A failed launch queues nothing; a graph launch queues kernels.
    let step_launch = |c: &CallEvent| c.op_name() == "cudaLaunchKernel" && c.ts_ns < 200 * MS;
    let mut d = sync_trace_with_launches(2 * MS, 0);
    for c in d.calls.iter_mut().filter(|c| step_launch(c)) {
        c.ret = 1;
    }
    assert_eq!(only(&d, Kind::SyncStall).len(), 1, "{:?}", kinds_of(&d));
    let mut d = sync_trace_with_launches(2 * MS, 0);
    for c in d.calls.iter_mut().filter(|c| step_launch(c)) {
        c.op = op_by_name("cudaGraphLaunch").unwrap().id;
    }
    assert!(only(&d, Kind::SyncStall).is_empty(), "{:?}", kinds_of(&d));
}

/// A small copy queues no kernel: the GPU is busy for microseconds (round
/// 56's tester: `memcpy_async 4096 h2d` at the top of each step hid a 30%
/// stall). Copies and memsets leave the stretch open (their time inside
/// the call is not the host's own work).
#[test]
fn a_copy_at_the_top_of_the_step_does_not_end_the_stretch() {
    let mut d = sync_trace(20, 3 * MS, 200 * MS);
    d.calls.extend((0..20u64).map(|i| {
        let mut c = call("cudaMemcpyAsync", i * 10 * MS + 7 * MS, 10 * US);
        c.kind = Some(1);
        c
    }));
    d.calls.sort_by_key(|c| c.ts_ns);
    let f = only(&d, Kind::SyncStall);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["overlappable_ns"], 20 * (3 * MS - 10 * US));
}

/// Round 56's tester: a second sync after the host work that waits for
/// nothing (a `synchronize()` for step timing) ended the stretch with its
/// own wait, ~0, and the next sync's stretch began at it: a 30% stall read
/// 0%. The host work after a sync counts against that sync's wait.
#[test]
fn a_sync_that_waits_for_nothing_does_not_hide_the_stall() {
    let mut d = sync_trace(20, 2 * MS, 200 * MS);
    d.calls.extend((0..20u64).map(|i| {
        call(
            "cudaDeviceSynchronize",
            i * 10 * MS + 10 * MS - 10 * US,
            10 * US,
        )
    }));
    d.calls.sort_by_key(|c| c.ts_ns);
    let t = crate::threads::thread_splits(&d);
    assert_eq!(t[0].sync_overlap_ns, Some(20 * (2 * MS - 10 * US)));
}

/// Round 55's tester: a CPU hog on the loop's CPU raised `sync_stall`
/// (the thread's runnable time between calls counted as host work), and
/// time asleep between calls (`input_wait`'s) was claimed again. The host
/// stretch is the thread's on-CPU time: 1 ms of each step's 2 ms taken by
/// another task, or asleep, leaves 10% (no finding; both read 20%).
#[test]
fn time_off_the_cpu_between_calls_is_not_sync_stall() {
    for kind in [WaitKind::Preempted, WaitKind::Blocked] {
        let mut d = sync_trace(20, 2 * MS, 200 * MS);
        d.waits = (0..20u64)
            .map(|i| {
                let off = i * 10 * MS + 8 * MS + MS / 2;
                let wake = if kind == WaitKind::Blocked {
                    off + MS
                } else {
                    off
                };
                wait(kind, off, wake, off + MS, None)
            })
            .collect();
        let t = crate::threads::thread_splits(&d);
        assert_eq!(t[0].sync_overlap_ns, Some(20 * MS), "{kind:?}");
        assert_eq!(t[0].sync_host_p50_ns, Some(MS), "{kind:?}");
        assert!(
            only(&d, Kind::SyncStall).is_empty(),
            "{kind:?}: {:?}",
            kinds_of(&d)
        );
    }
}

/// Round 55/56's testers: a hog on the loop's CPU took a quarter of its
/// window between calls and no finding named it (`cpu_preemption` is per
/// op: time inside calls). The thread's runnable time between calls is a
/// `cpu_preemption` of the thread, its holders the culprits, from
/// `PREEMPTION_MEDIUM_SHARE` of the window; not where `host_bound` claims it.
#[test]
fn contention_between_calls_is_named() {
    let held = |runnable: u64, holder: Option<(u32, &str)>| {
        let mut d = sync_trace(20, 2 * MS, 200 * MS);
        d.waits = (0..20u64)
            .map(|i| {
                let off = i * 10 * MS + 8 * MS;
                let mut w = wait(WaitKind::Preempted, off, off, off + runnable, None);
                w.culprits = holder
                    .map(|(pid, comm)| crate::event::Culprit {
                        pid,
                        tid: pid,
                        comm: comm.into(),
                        ns: runnable,
                    })
                    .into_iter()
                    .collect();
                w
            })
            .collect();
        d
    };
    let hogged = |runnable: u64| held(runnable, Some((999, "hog")));
    // 20 x 1 ms runnable of 200 ms: 10%.
    let d = hogged(MS);
    let f: Vec<_> = only(&d, Kind::CpuPreemption)
        .into_iter()
        .filter(|f| f.op.is_empty())
        .collect();
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].wall_share, Some(0.1));
    assert_eq!(f[0].evidence["runnable_between_ns"], 20 * MS);
    assert_eq!(f[0].culprits[0].comm, "hog");
    assert_eq!(f[0].culprits[0].share, 1.0);
    assert!(
        f[0].summary.contains("mostly hog (pid 999, 100% of it)"),
        "{}",
        f[0].summary
    );
    // From 20% it heads the summary line, said as the thread's.
    let line = explain_report(&hogged(2 * MS)).summary.unwrap();
    assert!(
        line.ends_with(
            "the main thread of train (pid 100) waited runnable for 20% of its time between CUDA calls while other \
             tasks held its CPU: CPU contention"
        ),
        "{line}"
    );
    // Just under 10%: none.
    let d = hogged(MS - 1);
    assert!(
        only(&d, Kind::CpuPreemption)
            .iter()
            .all(|f| !f.op.is_empty()),
        "{:?}",
        kinds_of(&d)
    );
    // Half of it held by a task seen: judged on that half, saying how much
    // no task held.
    let mut d = held(2 * MS, Some((999, "hog")));
    for w in &mut d.waits {
        w.culprits[0].ns = MS;
    }
    let f: Vec<_> = only(&d, Kind::CpuPreemption)
        .into_iter()
        .filter(|f| f.op.is_empty())
        .collect();
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["named_runnable_between_ns"], 20 * MS);
    assert!(
        f[0].summary
            .ends_with("; 20.00ms of it with no task of this machine seen holding the CPU (gpusleuth's own threads, a hypervisor taking the CPU, wake-up latency or a migration)"),
        "{}",
        f[0].summary
    );
    // Held by no task seen (round 59's tester: a VM's CPU taken by its
    // hypervisor), or by gpusleuth's own threads: none.
    for holder in [None, Some((7, "gpusleuth-db"))] {
        let d = held(2 * MS, holder);
        assert!(
            only(&d, Kind::CpuPreemption).is_empty(),
            "{holder:?}: {:?}",
            kinds_of(&d)
        );
    }
}

/// Time inside calls between syncs (a copy's staging is `pageable_copy`'s)
/// is no host stretch: a 1 ms `cudaMalloc` in each step's 2 ms of work
/// leaves 1 ms a step (10%).
#[test]
fn time_inside_other_calls_is_not_sync_stall() {
    let mut d = sync_trace(20, 2 * MS, 200 * MS);
    d.calls
        .extend((0..20u64).map(|i| call("cudaMalloc", i * 10 * MS + 8 * MS + MS / 2, MS)));
    d.calls.sort_by_key(|c| c.ts_ns);
    let t = crate::threads::thread_splits(&d);
    assert_eq!(t[0].sync_overlap_ns, Some(20 * MS));
    assert!(only(&d, Kind::SyncStall).is_empty(), "{:?}", kinds_of(&d));
}

/// A pause in a sync's stretch (1.5 s computing after step 10's sync, the
/// whole stretch) takes along what its on-CPU time added: that stretch's
/// `min(H, S)`, the sync's whole 8-ms wait. Left out with it, the steady
/// steps' overlap is 29 x 2 ms of 298 ms (19.5%, no finding; 22% with it:
/// the stretch was closed before the gap joined the pauses).
#[test]
fn a_pause_in_a_sync_stretch_takes_its_overlap_along() {
    let mut calls = Vec::new();
    let mut t = 0;
    for i in 0..30u64 {
        calls.push(call("cudaStreamSynchronize", t, 8 * MS));
        t += 10 * MS;
        if i == 10 {
            t += 1500 * MS - 2 * MS;
        }
    }
    calls.push(call("cudaLaunchKernel", t, 0));
    let d = trace(calls, Vec::new());
    let split = &crate::threads::thread_splits(&d)[0];
    assert_eq!(split.sync_overlap_ns, Some(29 * 2 * MS + 8 * MS));
    assert_eq!(split.pauses[0].wall_ns(), 1500 * MS);
    assert_eq!(split.pauses[0].sync_overlap_ns, 8 * MS);
    assert!(only(&d, Kind::SyncStall).is_empty(), "{:?}", kinds_of(&d));
}

/// A split stored before round 56 carries no `sync_overlap_ns`: the verdict
/// reads the old rule's sum the trace stored with its thread aggregates.
#[test]
fn a_split_stored_before_round_56_keeps_the_old_rule() {
    let d = sync_trace(20, 2 * MS, 200 * MS);
    let ledgers = crate::ledger::ledger(&d, None);
    let stored = |overlap: u64| {
        let mut inputs = inputs::FindingInputs::of(&d, &vec![Vec::new(); d.calls.len()]);
        for t in &mut inputs.splits {
            t.sync_overlap_ns = None;
            t.sync_host_p50_ns = None;
        }
        for t in inputs.threads.values_mut() {
            t.overlap_ns = overlap;
        }
        explain_inputs(&d, &inputs, &ledgers)
            .findings
            .into_iter()
            .filter(|f| f.kind == Kind::SyncStall)
            .collect::<Vec<_>>()
    };
    assert!(stored(30 * MS).is_empty(), "15% by the stored sum");
    let f = stored(40 * MS);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].evidence["overlappable_ns"], 40 * MS);
    // The stored host stretches' median, as before.
    assert_eq!(f[0].evidence["host_between_syncs_p50_ns"], 2 * MS);
}

/// Round 56's third tester: the probes' own traps on kernel-counted launches
/// (14.4 us each on the 2-vCPU VM, against 9 ns for the simulated launch)
/// were read as the program's host work. The trace's measured trap cost
/// (`probe_trap_ns`) times the counted calls the samples place in the
/// thread's window is taken out of its on-CPU time between calls and its
/// window, and said in a note; not out of `sync_stall`'s overlap, and not
/// for launches outside the window (the fourth tester: both hid real
/// findings).
#[test]
fn the_probes_traps_are_not_the_programs_host_work() {
    // `n` launches counted evenly over [from, to), sampled every 200 ms.
    let counted = |d: &mut TraceData, n: u64, trap: u64, (from, to): (u64, u64)| {
        let periods = (to - from) / (200 * MS);
        counted_launches(d, n, from, periods, |i| n * i / periods);
        d.stats.insert(crate::threads::PROBE_TRAP_STAT.into(), trap);
    };
    let whole = (0, 1000 * MS);
    // launch_bound's edge (899 ms on the CPU, 17,980 launches): with 49 us
    // a trap, 881 ms of it was the tracer's; untraced, the loop was 18 ms
    // of host work in 119 ms (15%).
    let mut d = host_trace(100 * MS, 0);
    counted(&mut d, 17_980, 0, whole);
    assert_eq!(only(&d, Kind::LaunchBound).len(), 1, "{:?}", kinds_of(&d));
    counted(&mut d, 17_980, 49 * US, whole);
    let r = explain_report(&d);
    assert!(r.findings.is_empty(), "{:?}", kinds_of(&d));
    // Where the time went is said of the program untraced too (round 57:
    // the line said "in its steady steps" where no pause was left out).
    let line = r.summary.unwrap();
    assert!(
        line.contains("(pid 100), without the probes' traps (0.1 s of 1.0 s traced), spent"),
        "{line}"
    );
    assert!(!line.contains("steady steps"), "{line}");
    let note = r
        .notes
        .iter()
        .find(|n| n.starts_with("The probes' traps"))
        .unwrap();
    assert!(
        note.contains(
            "cost the main thread of train (pid 100) 881.0 ms (88% of its window; 49.00 us a trap"
        ),
        "{note}"
    );
    // Launches no sample places in the window (made before its first
    // call): neither their traps nor the launches are its (round 57: they
    // were its launches, and read launch-bound).
    counted(&mut d, 17_980, 49 * US, whole);
    d.count_samples = Some(Vec::new());
    assert!(only(&d, Kind::LaunchBound).is_empty(), "{:?}", kinds_of(&d));
    // A trace without samples (a run's directory) cannot place them: all
    // the process's, no traps taken out.
    d.count_samples = None;
    let f = only(&d, Kind::LaunchBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["probe_traps_ns"], 0);
    assert_eq!(f[0].evidence["launches"], 17_980);
    // The traps come out of the window too: the view judges the program's
    // time untraced (10 us a trap: 179.8 ms of the 1000; a 50-ms first
    // sync, 6% of the 820 left: the syncs still returned almost at once).
    let mut d = host_trace(50 * MS, 0);
    counted(&mut d, 17_980, 10 * US, whole);
    let f = only(&d, Kind::LaunchBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["probe_traps_ns"], 179_800_000);
    assert_eq!(f[0].evidence["steady_window_ns"], 1000 * MS - 179_800_000);
    let line = explain_report(&d).summary.unwrap();
    assert!(
        line.contains(
            "(pid 100), without the probes' traps (0.8 s of 1.0 s traced), spent 94% on the CPU"
        ),
        "{line}"
    );
    // sync_stall's overlap loses the traps' share of the host time (which
    // stretches they fell in is not known: in proportion to each one's host
    // time): 4 ms of host work a step, a quarter of it traps, 80 ms of
    // overlap → 60 ms of the 180 left, a third (round 56 kept all 80).
    let mut d = sync_trace(20, 4 * MS, 200 * MS);
    counted(&mut d, 1_000, 20 * US, (0, 200 * MS));
    let f = only(&d, Kind::SyncStall);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["overlappable_ns"], 60 * MS);
    assert_eq!(f[0].wall_share, Some(1.0 / 3.0));
    // A window too short without its traps is not judged, and the line
    // says why (round 57's second tester: "whether the GPU waited … is not
    // known" for 82 ms untraced); the note says tracing this slow may have
    // changed what the thread waited for.
    let mut d = host_trace(10 * MS, 0);
    counted(&mut d, 20_000, 49 * US, whole);
    let r = explain_report(&d);
    assert!(r.findings.is_empty(), "{:?}", kinds_of(&d));
    let line = r.summary.unwrap();
    assert!(
        line.contains(
            "issued CUDA calls for only 20.0 ms without the probes' traps (1000.0 ms traced): too short"
        ),
        "{line}"
    );
    assert!(
        r.notes
            .iter()
            .any(|n| n.starts_with("The probes' traps") && n.contains("may wait less")),
        "{:?}",
        r.notes
    );
    // Host work that outlasts the sync with its traps gone keeps its
    // overlap (round 57's second tester: 10 ms of compute and 2,000
    // launches before a 10-ms sync read 14% for 35%): 8 ms of host a step,
    // an eighth of it traps, 2-ms syncs: 40 ms of the 180 left, 22%.
    let mut d = sync_trace(20, 8 * MS, 200 * MS);
    counted(&mut d, 1_000, 20 * US, (0, 200 * MS));
    let f = only(&d, Kind::SyncStall);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["overlappable_ns"], 40 * MS);
    assert_eq!(f[0].evidence["host_between_syncs_p50_ns"], 7 * MS);
    // Host stretches that were all traps: nothing could overlap.
    let mut d = sync_trace(20, 2 * MS, 200 * MS);
    counted(&mut d, 2_000, 20 * US, (0, 200 * MS));
    assert!(only(&d, Kind::SyncStall).is_empty(), "{:?}", kinds_of(&d));
    // Below 1% of the window: no note.
    let mut d = sync_trace(20, 4 * MS, 200 * MS);
    counted(&mut d, 2_000, US / 2, (0, 200 * MS));
    assert!(
        explain_report(&d)
            .notes
            .iter()
            .all(|n| !n.starts_with("The probes' traps")),
        "1 ms of 200"
    );
    // Where the traps are 1% of the window the two times are told apart
    // (round 57: "(1.5 s of 1.5 s traced)"): 4 ms of 200.
    counted(&mut d, 2_000, 2 * US, (0, 200 * MS));
    let line = explain_report(&d).summary.unwrap();
    assert!(
        line.contains("without the probes' traps (0.196 s of 0.200 s traced)"),
        "{line}"
    );
    // Below 1%: nor a clause in the line ("(0.2 s of 0.2 s)" said nothing).
    counted(&mut d, 2_000, US / 2, (0, 200 * MS));
    let line = explain_report(&d).summary.unwrap();
    assert!(
        line.contains("the main thread of train (pid 100) synchronized"),
        "{line}"
    );
}

/// Round 56's third tester: a parent that spawned its GPU worker and waited
/// had the longest window, and the summary line spoke of it ("100% blocked
/// … no bottleneck verdict") while the worker was GPU-bound. The line
/// passes over a thread blocked most of its window until another CUDA
/// process woke it.
#[test]
fn the_summary_speaks_of_the_worker_not_the_launcher_waiting_on_it() {
    let mut calls = vec![
        call("cudaSetDevice", 0, 10 * US),
        call("cudaFree", 1000 * MS, 0),
    ];
    for i in 0..10 {
        let mut c = call("cudaStreamSynchronize", (10 + i * 98) * MS, 95 * MS);
        c.blocked_ns = 95 * MS;
        (c.pid, c.tid) = (555, 555);
        calls.push(c);
    }
    calls.sort_by_key(|c| c.ts_ns);
    let exit = Waker {
        pid: 555,
        tid: 555,
        comm: "worker".into(),
        irq: false,
    };
    let waits = vec![wait(WaitKind::Blocked, MS, 999 * MS, 999 * MS, Some(exit))];
    let mut d = trace(calls, waits);
    d.processes.push(crate::data::ProcessInfo {
        pid: 555,
        comm: "worker".into(),
        ..Default::default()
    });
    let r = explain_report(&d);
    assert!(r.findings.is_empty(), "{:?}", kinds_of(&d));
    let line = r.summary.unwrap();
    assert!(
        line.contains(
            "the main thread of worker (pid 555) spent 97% waiting for the GPU inside syncs"
        ),
        "{line}"
    );
    assert!(line.ends_with(": GPU-bound"), "{line}");
}

/// Round 57: a warm-up of 30,000 counted launches just before a host-bound
/// loop's first call (the last of them read by a sample 100 ms into the
/// loop) were the loop's launches, and the loop read launch-bound
/// ("30050 kernels at 80604/s", on the simulated libraries). The launches
/// of a period across the window's edge count at the rate of the periods
/// inside it; those inside count whole.
#[test]
fn launches_just_before_the_window_are_not_the_loops() {
    const OFF: u64 = 10_000 * MS;
    let mut d = host_trace(100 * MS, 0);
    for c in &mut d.calls {
        c.ts_ns += OFF;
    }
    let op = op_by_name("cuLaunchKernel").unwrap().id;
    d.counts = vec![OpCount {
        pid: 100,
        op,
        count: 30_050,
    }];
    // Read every 200 ms: 30,000 by OFF + 100 ms (the warm-up ended before
    // OFF), then 10 more in each period of the loop.
    let at = |ms: u64, count: u64| crate::counted::CountSample {
        ts_ns: OFF + ms * MS - 300 * MS,
        pid: 100,
        op,
        count,
    };
    d.count_samples = Some(vec![
        at(0, 10_000),
        at(200, 20_000),
        at(400, 30_000),
        at(600, 30_010),
        at(800, 30_020),
        at(1000, 30_030),
        at(1200, 30_040),
        at(1400, 30_050),
    ]);
    let f = only(&d, Kind::HostBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    // 40 inside (four periods of 10), 5 of each period across an edge.
    assert_eq!(f[0].evidence["launches"], 50, "{}", f[0].summary);
    // The tracer reads a little later than every 200 ms (215 here): the
    // first read after the window's start, 200 ms into it, counted the
    // warm-up's last 1,000 launches too (its period began 15 ms before
    // the window); taken as 200 ms long it lay inside.
    let at = |ms: i64, count: u64| crate::counted::CountSample {
        ts_ns: (OFF as i64 + ms * MS as i64) as u64,
        pid: 100,
        op,
        count,
    };
    d.count_samples = Some(vec![
        at(-230, 7_000),
        at(-15, 28_500),
        at(200, 29_505),
        at(415, 29_515),
        at(630, 29_525),
        at(845, 29_535),
        at(1060, 29_545),
    ]);
    d.counts[0].count = 29_545;
    let f = only(&d, Kind::HostBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    // 30 inside; of the periods across the edges, 200 and 155 ms at their
    // rate (9 and 7).
    assert_eq!(f[0].evidence["launches"], 46, "{}", f[0].summary);
    // What the samples do not place by the end of the file counted in its
    // last period: a launch-bound loop's last launches are its.
    let mut d = host_trace(100 * MS, 0);
    counted_launches(&mut d, 40_000, 0, 4, |i| i * 8_000);
    d.end_ns = Some(1000 * MS);
    let f = only(&d, Kind::LaunchBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["launches"], 40_000);
    // Without the file's end (a window's read) they are not placed.
    d.end_ns = None;
    let f = only(&d, Kind::LaunchBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["launches"], 32_000);
    // Unless the read knows where the file's counts ended (round 59's
    // tester: a window over a run's files left a file's last 3,800
    // launches and a short last file's 3,200 out, and read host-bound).
    let op = op_by_name("cuLaunchKernel").unwrap().id;
    d.count_ends = vec![crate::counted::CountSample {
        ts_ns: 1000 * MS,
        pid: 100,
        op,
        count: 40_000,
    }];
    let f = only(&d, Kind::LaunchBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(f[0].evidence["launches"], 40_000);
    // A file's end is no read of the clock: the first sample after it
    // counts from it. Here a file ends at 500 ms (20,000 launches) and the
    // next file's first read, 100 ms later, counts on to 24,000: the 4,000
    // fell in [500, 600] ms, 90% of them at a steady rate in [510, 600]
    // (not 45%, as a 200-ms period from 400 ms would give).
    let mut d = host_trace(100 * MS, 0);
    counted_launches(&mut d, 24_000, 0, 2, |i| i * 8_000);
    sampled_at(&mut d, 600 * MS, 24_000);
    d.count_ends = vec![crate::counted::CountSample {
        ts_ns: 500 * MS,
        pid: 100,
        op,
        count: 20_000,
    }];
    let places = super::bottleneck::LaunchPlaces::of(&d);
    let placed = places.in_window(100, 510 * MS, 600 * MS, 0).unwrap();
    assert_eq!(placed[0].0, op);
    assert_eq!(placed[0].1.estimate, 3_600);
}

/// Round 57's tester: "spent 0% inside CUDA calls, 100% on the CPU between
/// them … no bottleneck verdict" said nothing of why host time was no
/// host_bound: the GPU was busy meanwhile, or whether it waited is unknown.
#[test]
fn host_time_without_a_verdict_says_why() {
    let mut d = host_trace(100 * MS, 0);
    d.gpu_samples = samples(90.0);
    let r = explain_report(&d);
    assert!(r.findings.is_empty(), "{:?}", kinds_of(&d));
    let line = r.summary.unwrap();
    assert!(
        line.contains("no bottleneck verdict (the GPU was busy 90% meanwhile: the host's work overlapped its)"),
        "{line}"
    );
    // One sync and a last call: nothing samples the GPU through the window.
    let mut d = host_trace(100 * MS, 0);
    d.calls.retain(|c| c.ts_ns == 0 || c.ts_ns >= 999 * MS);
    let r = explain_report(&d);
    assert!(r.findings.is_empty(), "{:?}", kinds_of(&d));
    let line = r.summary.unwrap();
    assert!(
        line.contains("no bottleneck verdict (whether the GPU waited for the host is not known"),
        "{line}"
    );
    // Mostly blocked between calls: no such clause.
    let d = host_trace(100 * MS, 600 * MS);
    let line = explain_report(&d).summary.unwrap();
    assert!(
        !line.contains("meanwhile") && !line.contains("not known"),
        "{line}"
    );
}

/// Round 57's second tester: 53 us of host time per launch, beside
/// launch_bound's 50-us bound, read "0.1 ms".
#[test]
fn host_time_per_launch_under_a_millisecond_is_in_microseconds() {
    let mut d = host_trace(100 * MS, 0);
    let op = op_by_name("cuLaunchKernel").unwrap().id;
    d.counts = vec![OpCount {
        pid: 100,
        op,
        count: 17_000,
    }];
    let f = only(&d, Kind::HostBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert!(
        f[0].summary
            .ends_with("; 52.9 us of host time per kernel launch"),
        "{}",
        f[0].summary
    );
}

/// Round 58: with `--launches full` every launch is a recorded call with an
/// entry and a return trap, and its nested driver launch another; on the
/// VM a loop of 4-us launches read 42.3 us a launch. The trace's measured
/// cost of a recorded call's traps (`probe_call_trap_ns`) times the
/// thread's recorded calls, nested ones too, comes out of its on-CPU time
/// inside calls (a launch's out of its launch calls' time) and its window.
#[test]
fn a_recorded_calls_traps_are_not_the_programs_host_work() {
    // 15,000 runtime launches of 60 us every 64 us, each with a nested
    // driver launch; a sync at the start and an allocation at the end: 66.5
    // us of host time a launch traced, no launch_bound.
    let mut calls = vec![call("cudaStreamSynchronize", 0, 0)];
    for i in 0..15_000 {
        let ts = MS + i * 64 * US;
        calls.push(call("cudaLaunchKernel", ts, 60 * US));
        let mut nested = call("cuLaunchKernel", ts + 10 * US, 20 * US);
        nested.nested = true;
        calls.push(nested);
    }
    calls.push(call("cudaMalloc", 999 * MS, MS));
    let mut d = trace(calls, Vec::new());
    d.gpu_samples = samples(5.0);
    assert!(only(&d, Kind::LaunchBound).is_empty(), "{:?}", kinds_of(&d));
    // 25 us a recorded call's traps: 30,002 calls' 750.05 ms, inside the
    // 901 ms in calls; 749.95 ms of them the launches' (15,000 of the
    // 15,002 outer calls). Untraced: 98 ms between calls and 150.05 ms in
    // launch calls for 15,000 launches, 16.5 us each, in 250 ms.
    d.stats
        .insert(crate::threads::PROBE_CALL_TRAP_STAT.into(), 25 * US);
    let f = only(&d, Kind::LaunchBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    let ev = &f[0].evidence;
    assert_eq!(ev["probe_call_traps_ns"], 750_050_000);
    assert_eq!(ev["probe_traps_ns"], 750_050_000);
    assert_eq!(ev["steady_window_ns"], 1000 * MS - 750_050_000);
    assert_eq!(ev["launches"], 15_000);
    let between = 1000 * MS - 901 * MS;
    let launch_calls = 900 * MS - 15_000 * 750_050_000 / 15_002;
    assert_eq!(
        ev["host_ns_per_launch"],
        (between + launch_calls) / 15_000,
        "{ev}"
    );
    let r = explain_report(&d);
    let note = r
        .notes
        .iter()
        .find(|n| n.starts_with("The probes' traps"))
        .unwrap();
    assert!(
        note.contains(
            "on its recorded calls cost the main thread of train (pid 100) 750.0 ms (75% of its window; \
             25.00 us a call, its entry and return"
        ),
        "{note}"
    );
    // Kernel-counted calls' traps as well (1,000 counted evenly, sampled
    // every 200 ms; 10 us a trap): taken between calls, both said.
    counted_launches(&mut d, 1000, 0, 5, |i| 200 * i);
    d.stats
        .insert(crate::threads::PROBE_TRAP_STAT.into(), 10 * US);
    let r = explain_report(&d);
    let note = r
        .notes
        .iter()
        .find(|n| n.starts_with("The probes' traps"))
        .unwrap();
    assert!(
        note.contains(
            "on its kernel-counted calls (10.0 ms) and recorded calls (750.0 ms) cost the main thread of train \
             (pid 100) 760.0 ms"
        ),
        "{note}"
    );
    assert!(
        note.contains(
            "10.00 us a counted call's trap, 25.00 us a recorded call's entry and return"
        ),
        "{note}"
    );
}

/// Round 58's tester: a recorded call lasts its traps more, a sync as well
/// as a launch: a loop of syncs that return at once, 34 us each traced on
/// the VM, read "406% waiting for the GPU inside syncs" and sync-stalled;
/// 6,000 copies of 4 KiB read 194.5 ms of pageable staging, all of it
/// traps. Each recorded call's traps come out of its sync's time (the
/// median, the slowest) and of a copy's staging, as out of the window.
#[test]
fn a_recorded_syncs_and_copies_traps_are_not_their_time() {
    // 10,000 steps of 100 us: a 40-us sync (its nested driver sync inside)
    // and 60 us of host work. 19 us a recorded call's traps: 38 us a sync.
    let mut calls = Vec::new();
    for i in 0..10_000 {
        let ts = i * 100 * US;
        calls.push(call("cudaStreamSynchronize", ts, 40 * US));
        let mut nested = call("cuStreamSynchronize", ts + 5 * US, 30 * US);
        nested.nested = true;
        calls.push(nested);
    }
    let mut d = trace(calls, Vec::new());
    d.stats
        .insert(crate::threads::PROBE_CALL_TRAP_STAT.into(), 19 * US);
    let f = only(&d, Kind::HostBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    let ev = &f[0].evidence;
    // 2 us a sync untraced: 20 ms of the 620 ms left (20,000 recorded
    // calls, 380 ms of traps, out of the window).
    assert_eq!(ev["sync_ns"], 20 * MS, "{ev}");
    assert_eq!(ev["sync_p50_ns"], 2 * US, "{ev}");
    assert_eq!(ev["steady_window_ns"], 999_940 * US - 380 * MS, "{ev}");
    assert!(only(&d, Kind::SyncStall).is_empty(), "{:?}", kinds_of(&d));
    // The copies' staging: 2,000 pageable copies of 30 us on the CPU, a
    // nested driver copy in each, 14 us a recorded call's traps: 28 us of
    // each copy, 4 ms of staging left, under pageable_copy's floor.
    let mut calls = vec![call("cudaStreamSynchronize", 0, 0)];
    for i in 0..2_000 {
        let ts = MS + i * 400 * US;
        calls.push(copy(ts, 30 * US, 0x1000));
        let mut nested = call("cuMemcpyHtoD_v2", ts + 5 * US, 20 * US);
        nested.nested = true;
        calls.push(nested);
    }
    calls.push(call("cudaStreamSynchronize", 802 * MS, 0));
    let mut d = trace(calls, Vec::new());
    assert_eq!(only(&d, Kind::PageableCopy).len(), 1, "{:?}", kinds_of(&d));
    d.stats
        .insert(crate::threads::PROBE_CALL_TRAP_STAT.into(), 14 * US);
    assert!(
        only(&d, Kind::PageableCopy).is_empty(),
        "{:?}",
        kinds_of(&d)
    );
}

/// Round 59's tester: a window with no whole sample period inside it (a
/// uniform launch-bound loop's `--last 200ms`, a child's `--from 600ms --to
/// 900ms`) counted the fewest launches its edge periods could hold (0 to
/// 3,287 of 2,800 to 4,400) and read host-bound. Its launches are known
/// only between bounds there: where the launch rule holds at the most and
/// not at the fewest, neither verdict judges it, and the summary line says
/// why; a window with a rate inside is judged on its estimate.
#[test]
fn a_window_whose_launches_the_samples_cannot_bound_is_no_verdict() {
    // 300 ms of host work between syncs that return at once, every 50 ms;
    // 6,000 launches read at 150 and 350 ms: the first period (from the
    // trace's start) inside, the second across the window's end, holding
    // 0 to 3,000 of its 150 ms inside.
    let with = |end_ms: u64, reads: &[(u64, u64)]| {
        let mut calls: Vec<CallEvent> = (0..end_ms / 50)
            .map(|i| call("cudaStreamSynchronize", i * 50 * MS, 0))
            .collect();
        calls.push(call("cudaMalloc", end_ms * MS - MS, MS));
        let mut d = trace(calls, Vec::new());
        let op = op_by_name("cuLaunchKernel").unwrap().id;
        let total = reads.last().unwrap().1;
        d.counts = vec![OpCount {
            pid: 100,
            op,
            count: total,
        }];
        d.count_samples = Some(
            reads
                .iter()
                .map(|&(ms, count)| crate::counted::CountSample {
                    ts_ns: ms * MS,
                    pid: 100,
                    op,
                    count,
                })
                .collect(),
        );
        d.stats
            .insert(crate::threads::PROBE_TRAP_STAT.into(), 10 * US);
        // A window's read: no tail after the last sample.
        d.window_ns = (Some(0), Some(end_ms * MS));
        d
    };
    let d = with(300, &[(150, 3_000), (350, 6_000)]);
    let r = explain_report(&d);
    assert!(r.findings.is_empty(), "{:?}", kinds_of(&d));
    let line = r.summary.unwrap();
    assert!(
        line.contains(
            "no bottleneck verdict (launch- or host-bound: between its first and last CUDA call here it made 3000 \
             to 6000 kernel launches"
        ),
        "{line}"
    );
    // A window's read counts the calls certainly inside it, none where no
    // two samples are (the tester's child read 0 launches, host-bound):
    // the samples still place them.
    let mut d = with(300, &[(150, 3_000), (350, 6_000)]);
    d.counts.clear();
    let r = explain_report(&d);
    assert!(r.findings.is_empty(), "{:?}", kinds_of(&d));
    assert!(r
        .summary
        .unwrap()
        .contains("made 3000 to 6000 kernel launches"));
    // Host-bound at the most launches the window can hold: judged so,
    // the launches said as their bounds (the third tester: a host-bound
    // window beside a launch burst read 296.2 us a launch, 580 for ~50).
    let d = with(300, &[(150, 50), (350, 1_000)]);
    let f = only(&d, Kind::HostBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    assert_eq!(
        f[0].evidence["launches_range"],
        serde_json::json!([50, 1000])
    );
    assert!(
        f[0].summary.ends_with(
            "; 50 to 1000 kernel launches, by the tracer's samples of their counts (200 ms apart): 289.0 us to \
             6.0 ms of host time each"
        ),
        "{}",
        f[0].summary
    );
    // Read every 200 ms through 700 ms: two whole periods inside, the
    // rate stands for the edges' parts and the loop is launch-bound.
    let d = with(
        700,
        &[(150, 4_000), (350, 8_000), (550, 12_000), (750, 16_000)],
    );
    let f = only(&d, Kind::LaunchBound);
    assert_eq!(f.len(), 1, "{:?}", kinds_of(&d));
    // 12,000 inside, and 150 ms of the last period at their rate.
    assert_eq!(f[0].evidence["launches"], 15_272);
}

/// Round 59's third tester: a child's last 971 launches, read 198 ms after
/// it exited, were placed in its parent's later window. A read after the
/// process's exit counted launches made before it.
#[test]
fn launches_read_after_the_exit_fell_before_it() {
    let mut d = host_trace(100 * MS, 0);
    counted_launches(&mut d, 2_000, 0, 1, |_| 1_000);
    sampled_at(&mut d, 600 * MS, 2_000);
    d.processes.push(crate::ProcessInfo {
        pid: 100,
        exit_ns: Some(450 * MS),
        ..Default::default()
    });
    let places = super::bottleneck::LaunchPlaces::of(&d);
    let at = |a: u64, b: u64| places.in_window(100, a * MS, b * MS, 0).unwrap()[0].1;
    // The read at 600 ms: its period from 400 ms, to the exit at 450.
    assert_eq!(at(460, 600).estimate, 0);
    assert_eq!(at(400, 450).estimate, 1_000);
}
