//! Which tasks held the CPU while a CUDA call was runnable-waiting.
//!
//! A wait's runnable part `[wake_ns, on_ns)` carries the tasks that ran on
//! the CPU meanwhile (`WaitEvent::culprits`, with how long each ran). A
//! call's share of that wait is the overlap of `[ts_ns, ts_ns + dur_ns)` with
//! the runnable part; it is split over the wait's culprits in proportion to
//! their `ns`. Runnable time no culprit covers stays unattributed.
//!
//! gpusleuth's own threads (`threads::is_tracer`: the trace's `tracer_pid`,
//! or a `gpusleuth`/`gpusleuth-*` comm) are never a call's culprit: the time
//! they took stays in the call's runnable part, and `explain` states it as
//! the tracer's measured interference (from the waits, which keep them).

use crate::event::{CallEvent, Culprit, WaitEvent};
use crate::threads::is_tracer;
use std::collections::{BTreeMap, HashMap};

/// For each call (same order as `calls`), the tasks that held the CPU while it
/// was runnable-waiting, largest share first.
///
/// Per thread, waits are sorted once and each call finds its first
/// overlapping wait by binary search: O((calls + waits) log n) overall, plus
/// the overlapping waits themselves.
pub fn call_culprits(
    calls: &[CallEvent],
    waits: &[WaitEvent],
    tracer: Option<u32>,
) -> Vec<Vec<Culprit>> {
    let by_thread = culprit_waits_by_thread(waits);
    calls
        .iter()
        .map(|c| match by_thread.get(&(c.pid, c.tid)) {
            Some(list) => culprits_of_call(c, list, tracer),
            None => Vec::new(),
        })
        .collect()
}

/// Whether a wait can name culprits of a call: it has runnable time and
/// culprits (the only waits [`call_culprits`] uses; a reader streaming the
/// calls keeps just these).
pub fn names_culprits(w: &WaitEvent) -> bool {
    w.on_ns > w.wake_ns && !w.culprits.is_empty()
}

/// The waits that [`names_culprits`] of each thread, sorted by
/// `(on_ns, wake_ns)`: what [`culprits_of_call`] takes.
pub fn culprit_waits_by_thread<'w>(
    waits: impl IntoIterator<Item = &'w WaitEvent>,
) -> HashMap<(u32, u32), Vec<&'w WaitEvent>> {
    let mut by_thread: HashMap<(u32, u32), Vec<&WaitEvent>> = HashMap::new();
    for w in waits.into_iter().filter(|w| names_culprits(w)) {
        by_thread.entry((w.pid, w.tid)).or_default().push(w);
    }
    for list in by_thread.values_mut() {
        list.sort_by_key(|w| (w.on_ns, w.wake_ns));
    }
    by_thread
}

/// The culprits of one call from its thread's waits that have culprits and
/// runnable time (`on_ns > wake_ns`), sorted by `(on_ns, wake_ns)`; waits
/// ending at or before the call starts may be left out (streaming callers).
/// `tracer`: the trace's tracer pid (`threads::tracer_pid`), never a culprit.
pub fn culprits_of_call(
    call: &CallEvent,
    waits: &[&WaitEvent],
    tracer: Option<u32>,
) -> Vec<Culprit> {
    let (start, end) = (call.ts_ns, call.end_ns());
    if end <= start {
        return Vec::new();
    }
    // A thread's waits do not overlap, so sorted by on_ns they are also
    // sorted by wake_ns: the first candidate is the first wait ending after
    // the call starts, and the scan stops at the first one starting after it ends.
    let first = waits.partition_point(|w| w.on_ns <= start);
    let mut acc: BTreeMap<(u32, u32, &str), u64> = BTreeMap::new();
    for w in &waits[first..] {
        if w.wake_ns >= end {
            break;
        }
        let overlap = end.min(w.on_ns).saturating_sub(start.max(w.wake_ns));
        let runnable = w.runnable_ns();
        if overlap == 0 || runnable == 0 {
            continue;
        }
        for c in &w.culprits {
            // Its share of the runnable time is computed as for any culprit
            // (the others' shares do not grow), then left unnamed.
            let share = (c.ns.min(runnable) as u128 * overlap as u128 / runnable as u128) as u64;
            if share > 0 && !is_tracer(c.pid, &c.comm, tracer) {
                *acc.entry((c.pid, c.tid, c.comm.as_str())).or_default() += share;
            }
        }
    }
    let mut out: Vec<Culprit> = acc
        .into_iter()
        .map(|((pid, tid, comm), ns)| Culprit {
            pid,
            tid,
            comm: comm.to_string(),
            ns,
        })
        .collect();
    out.sort_by(|a, b| {
        b.ns.cmp(&a.ns)
            .then(a.pid.cmp(&b.pid))
            .then(a.tid.cmp(&b.tid))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::WaitKind;

    fn call(tid: u32, ts: u64, dur: u64) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: dur,
            pid: 10,
            tid,
            op: 1,
            ..Default::default()
        }
    }

    fn culprit(pid: u32, ns: u64) -> Culprit {
        Culprit {
            pid,
            tid: pid,
            comm: format!("hog{pid}"),
            ns,
        }
    }

    fn wait(tid: u32, off: u64, wake: u64, on: u64, culprits: Vec<Culprit>) -> WaitEvent {
        WaitEvent {
            pid: 10,
            tid,
            kind: if off == wake {
                WaitKind::Preempted
            } else {
                WaitKind::Blocked
            },
            off_ns: off,
            wake_ns: wake,
            on_ns: on,
            prev_state: 0,
            cpu: 0,
            culprits,
            waker: None,
        }
    }

    #[test]
    fn whole_wait_inside_call_is_split_by_culprit_share() {
        // Runnable 100 ns: hog 1 ran 60, hog 2 ran 30, 10 ns uncovered.
        let calls = [call(1, 0, 1_000)];
        let waits = [wait(1, 100, 100, 200, vec![culprit(1, 60), culprit(2, 30)])];
        let got = call_culprits(&calls, &waits, None);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0], vec![culprit(1, 60), culprit(2, 30)]);
    }

    #[test]
    fn partial_overlap_is_proportional_and_blocked_part_ignored() {
        // Blocked [0, 500), runnable [500, 700); the call covers [600, 900):
        // half of the runnable part.
        let calls = [call(1, 600, 300)];
        let waits = [wait(1, 0, 500, 700, vec![culprit(7, 200)])];
        assert_eq!(
            call_culprits(&calls, &waits, None)[0],
            vec![culprit(7, 100)]
        );
    }

    #[test]
    fn other_threads_and_disjoint_waits_do_not_count() {
        let calls = [call(1, 1_000, 100), call(2, 0, 10)];
        let waits = [
            wait(1, 0, 0, 500, vec![culprit(3, 500)]), // before the call
            wait(1, 1_100, 1_100, 1_200, vec![culprit(3, 100)]), // after (end is exclusive)
            wait(2, 1_000, 1_000, 1_100, vec![culprit(4, 100)]), // other thread, overlaps call 0's time
        ];
        let got = call_culprits(&calls, &waits, None);
        assert!(got[0].is_empty(), "{:?}", got[0]);
        assert!(got[1].is_empty(), "{:?}", got[1]);
    }

    #[test]
    fn culprits_sum_over_several_waits_and_nested_calls_share_them() {
        // Runtime call [0, 1000) with a nested driver call [100, 400).
        let calls = [call(1, 0, 1_000), call(1, 100, 300)];
        let waits = [
            wait(1, 200, 200, 300, vec![culprit(5, 100)]),
            wait(1, 500, 500, 800, vec![culprit(5, 150), culprit(6, 150)]),
        ];
        let got = call_culprits(&calls, &waits, None);
        assert_eq!(got[0], vec![culprit(5, 250), culprit(6, 150)]);
        assert_eq!(got[1], vec![culprit(5, 100)]);
    }

    #[test]
    fn attributed_time_never_exceeds_runnable_overlap() {
        // Culprit ns larger than the runnable part (clock skew) is clamped.
        let calls = [call(1, 0, 50)];
        let waits = [wait(1, 0, 0, 100, vec![culprit(1, 1_000)])];
        let got = call_culprits(&calls, &waits, None);
        assert_eq!(got[0], vec![culprit(1, 50)]);
    }

    /// Round 51's tester: `stats`, `report` and MCP named the tracer as a
    /// call's culprit. Known by its stored pid and by its name.
    #[test]
    fn the_tracer_is_never_a_culprit_and_others_keep_their_share() {
        let calls = [call(1, 0, 1_000)];
        let mut by_comm = culprit(8, 20);
        by_comm.comm = "gpusleuth-db".into();
        let waits = [wait(
            1,
            100,
            100,
            200,
            vec![culprit(9, 50), culprit(2, 30), by_comm],
        )];
        assert_eq!(
            call_culprits(&calls, &waits, Some(9))[0],
            vec![culprit(2, 30)]
        );
        assert_eq!(
            call_culprits(&calls, &waits, None)[0],
            vec![culprit(9, 50), culprit(2, 30)]
        );
    }
}
