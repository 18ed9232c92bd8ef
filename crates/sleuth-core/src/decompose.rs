//! Where the wall time of CUDA calls went: on-CPU, runnable-waiting (the CPU
//! was given to someone else) and blocked (sleeping: GPU wait, lock, I/O).
//!
//! The kernel side measures `runnable_ns` and `blocked_ns` per call; this
//! module turns them into a split that always adds up to the wall time, sums
//! splits over groups of calls, computes the tail split (calls above p95) and
//! aggregates the per-call culprits into per-group ones.

use crate::event::{CallEvent, Culprit};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// One call's (or a group's) wall time, split three ways.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    pub on_cpu_ns: u64,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
}

impl Split {
    /// The split of one call. Blocked time is taken first, then runnable,
    /// each clamped to what is left of the wall time, so a record with
    /// inconsistent counters (a lost switch event) still adds up exactly.
    pub fn of(call: &CallEvent) -> Split {
        let blocked = call.blocked_ns.min(call.dur_ns);
        let runnable = call.runnable_ns.min(call.dur_ns - blocked);
        Split {
            on_cpu_ns: call.dur_ns - blocked - runnable,
            runnable_ns: runnable,
            blocked_ns: blocked,
        }
    }

    /// The part of this split that `ns` of its wall time hold, each kind
    /// in proportion (the whole split when `ns` covers it): what a call
    /// adds to its thread's time inside calls beyond what an enclosing or
    /// overlapping call of the thread already counted.
    pub fn part(self, ns: u64) -> Split {
        let wall = self.wall_ns();
        if ns >= wall {
            return self;
        }
        let scale = |v: u64| (u128::from(v) * u128::from(ns) / u128::from(wall)) as u64;
        let (blocked, runnable) = (scale(self.blocked_ns), scale(self.runnable_ns));
        Split {
            on_cpu_ns: ns - blocked - runnable,
            runnable_ns: runnable,
            blocked_ns: blocked,
        }
    }

    pub fn wall_ns(&self) -> u64 {
        // Saturating: a split read from a stored aggregate may hold anything.
        self.on_cpu_ns
            .saturating_add(self.runnable_ns)
            .saturating_add(self.blocked_ns)
    }

    pub fn add(&mut self, other: Split) {
        self.on_cpu_ns = self.on_cpu_ns.saturating_add(other.on_cpu_ns);
        self.runnable_ns = self.runnable_ns.saturating_add(other.runnable_ns);
        self.blocked_ns = self.blocked_ns.saturating_add(other.blocked_ns);
    }

    /// Sum of the splits of `calls`.
    pub fn total<'a>(calls: impl IntoIterator<Item = &'a CallEvent>) -> Split {
        let mut s = Split::default();
        for c in calls {
            s.add(Split::of(c));
        }
        s
    }

    /// Shares of the wall time (0.0 each when the wall time is zero).
    pub fn shares(&self) -> (f64, f64, f64) {
        let wall = self.wall_ns();
        if wall == 0 {
            return (0.0, 0.0, 0.0);
        }
        let w = wall as f64;
        (
            self.on_cpu_ns as f64 / w,
            self.runnable_ns as f64 / w,
            self.blocked_ns as f64 / w,
        )
    }
}

/// How the slowest calls of a group spent their time: the calls strictly
/// above the group's p95 latency, and the shares of their summed wall time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TailSplit {
    pub calls: u64,
    pub on_cpu_share: f64,
    pub runnable_share: f64,
    pub blocked_share: f64,
}

impl TailSplit {
    /// The tail split of `calls` given the group's p95 (`dur_ns > p95_ns`).
    /// With fewer than 20 calls nearest-rank p95 is the maximum, so the tail
    /// is empty and every share is 0.
    pub fn of<'a>(calls: impl IntoIterator<Item = &'a CallEvent>, p95_ns: u64) -> TailSplit {
        let mut n = 0u64;
        let split = Split::total(
            calls
                .into_iter()
                .filter(|c| c.dur_ns > p95_ns)
                .inspect(|_| {
                    n += 1;
                }),
        );
        let (on_cpu_share, runnable_share, blocked_share) = split.shares();
        TailSplit {
            calls: n,
            on_cpu_share,
            runnable_share,
            blocked_share,
        }
    }
}

/// A task that held the CPU while calls of a group were runnable-waiting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CulpritTime {
    pub pid: u32,
    pub comm: String,
    /// Runnable-waiting time of the group's calls while this task ran.
    pub runnable_ns: u64,
}

/// Sums per-call culprits by (pid, comm), largest first (ties: lowest pid).
pub fn aggregate_culprits<'a>(
    per_call: impl IntoIterator<Item = &'a [Culprit]>,
) -> Vec<CulpritTime> {
    let mut by_task: HashMap<(u32, &str), u64> = HashMap::new();
    for culprits in per_call {
        for c in culprits {
            let e = by_task.entry((c.pid, c.comm.as_str())).or_default();
            *e = e.saturating_add(c.ns);
        }
    }
    culprit_times(by_task)
}

/// Runnable time summed per (pid, comm) as culprit rows, largest first
/// (ties: lowest pid, then name): the one order of every culprit list.
pub fn culprit_times<'a>(
    by_task: impl IntoIterator<Item = ((u32, &'a str), u64)>,
) -> Vec<CulpritTime> {
    let mut out: Vec<CulpritTime> = by_task
        .into_iter()
        .map(|((pid, comm), ns)| CulpritTime {
            pid,
            comm: comm.to_string(),
            runnable_ns: ns,
        })
        .collect();
    out.sort_by(|a, b| {
        b.runnable_ns
            .cmp(&a.runnable_ns)
            .then(a.pid.cmp(&b.pid))
            .then(a.comm.cmp(&b.comm))
    });
    out
}

/// The culprits of call `i`, or none when the per-call list is shorter
/// (culprits not computed, or an imported trace without host context).
pub fn culprits_of(per_call: &[Vec<Culprit>], i: usize) -> &[Culprit] {
    per_call.get(i).map(|v| v.as_slice()).unwrap_or(&[])
}

/// The decomposition of one (process, op) group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupSplit {
    pub pid: u32,
    pub op: &'static str,
    pub calls: u64,
    pub wall_ns: u64,
    #[serde(flatten)]
    pub split: Split,
    pub tail: TailSplit,
    pub culprits: Vec<CulpritTime>,
}

/// Decomposition per (process, op), sorted by wall time, largest first.
/// `per_call_culprits` is aligned with `calls` (may be empty).
pub fn by_process_op(calls: &[CallEvent], per_call_culprits: &[Vec<Culprit>]) -> Vec<GroupSplit> {
    let mut groups: HashMap<(u32, u16), Vec<usize>> = HashMap::new();
    for (i, c) in calls.iter().enumerate() {
        groups.entry((c.pid, c.op)).or_default().push(i);
    }
    let mut out: Vec<GroupSplit> = groups
        .into_iter()
        .map(|((pid, _), idx)| {
            let members = || idx.iter().map(|&i| &calls[i]);
            let mut durs: Vec<u64> = members().map(|c| c.dur_ns).collect();
            durs.sort_unstable();
            let p95 = crate::stats::nearest_rank(&durs, 95).unwrap_or(0);
            let split = Split::total(members());
            GroupSplit {
                pid,
                op: calls[idx[0]].op_name(),
                calls: idx.len() as u64,
                wall_ns: split.wall_ns(),
                split,
                tail: TailSplit::of(members(), p95),
                culprits: aggregate_culprits(
                    idx.iter().map(|&i| culprits_of(per_call_culprits, i)),
                ),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.wall_ns
            .cmp(&a.wall_ns)
            .then(a.pid.cmp(&b.pid))
            .then(a.op.cmp(b.op))
    });
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A call of op `op` lasting `dur` with the given runnable/blocked parts.
    pub(crate) fn call(op: u16, ts: u64, dur: u64, runnable: u64, blocked: u64) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: dur,
            pid: 100,
            tid: 100,
            op,
            runnable_ns: runnable,
            blocked_ns: blocked,
            ..Default::default()
        }
    }

    fn culprit(pid: u32, comm: &str, ns: u64) -> Culprit {
        Culprit {
            pid,
            tid: pid,
            comm: comm.into(),
            ns,
        }
    }

    #[test]
    fn split_adds_up_to_wall_time_for_every_call() {
        // Property-style: a deterministic sweep of consistent and
        // inconsistent counters (runnable+blocked above the wall time).
        let mut next = crate::testing::xorshift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..10_000 {
            let seed = next();
            let dur = seed % 1_000_000;
            let runnable = (seed >> 20) % 700_000;
            let blocked = (seed >> 40) % 700_000;
            let s = Split::of(&call(1, 0, dur, runnable, blocked));
            assert_eq!(s.wall_ns(), dur, "dur={dur} r={runnable} b={blocked}");
            assert!(s.blocked_ns <= blocked && s.runnable_ns <= runnable);
            if runnable + blocked <= dur {
                assert_eq!((s.runnable_ns, s.blocked_ns), (runnable, blocked));
            }
        }
    }

    #[test]
    fn totals_and_shares() {
        let calls = [call(1, 0, 100, 30, 20), call(1, 0, 300, 0, 150)];
        let s = Split::total(&calls);
        assert_eq!(
            s,
            Split {
                on_cpu_ns: 200,
                runnable_ns: 30,
                blocked_ns: 170
            }
        );
        let (c, r, b) = s.shares();
        assert!((c - 0.5).abs() < 1e-12 && (r - 0.075).abs() < 1e-12 && (b - 0.425).abs() < 1e-12);
        assert_eq!(Split::default().shares(), (0.0, 0.0, 0.0));
    }

    #[test]
    fn tail_split_counts_only_calls_strictly_above_p95() {
        let mut calls: Vec<CallEvent> = (1..=20).map(|i| call(1, i, i * 10, 0, 0)).collect();
        // The two calls above p95 (=190): one spent runnable, one blocked.
        calls.push(call(1, 30, 1000, 1000, 0));
        calls.push(call(1, 31, 1000, 0, 500));
        let t = TailSplit::of(&calls, 190);
        assert_eq!(t.calls, 3); // 200, 1000, 1000
        assert!((t.runnable_share - 1000.0 / 2200.0).abs() < 1e-12);
        assert!((t.blocked_share - 500.0 / 2200.0).abs() < 1e-12);
        assert!((t.on_cpu_share - 700.0 / 2200.0).abs() < 1e-12);
        assert_eq!(TailSplit::of(&calls, 1000).calls, 0);
    }

    #[test]
    fn culprits_are_summed_per_task_and_ranked() {
        let per_call = vec![
            vec![culprit(7, "hog", 50), culprit(8, "kworker", 5)],
            vec![],
            vec![culprit(7, "hog", 25)],
        ];
        let agg = aggregate_culprits(per_call.iter().map(|v| v.as_slice()));
        assert_eq!(agg.len(), 2);
        assert_eq!(
            (agg[0].pid, agg[0].comm.as_str(), agg[0].runnable_ns),
            (7, "hog", 75)
        );
        assert_eq!(agg[1].runnable_ns, 5);
        assert!(culprits_of(&per_call, 9).is_empty());
    }

    #[test]
    fn groups_by_process_and_op() {
        let mut calls = vec![
            call(1, 0, 100, 10, 0),
            call(1, 1, 100, 0, 0),
            call(14, 2, 1000, 0, 900),
        ];
        calls[1].pid = 200;
        let per_call = vec![vec![culprit(7, "hog", 10)]];
        let g = by_process_op(&calls, &per_call);
        assert_eq!(g.len(), 3);
        assert_eq!(g[0].op, "cudaStreamSynchronize");
        assert_eq!(g[0].split.blocked_ns, 900);
        let mine = g
            .iter()
            .find(|x| x.pid == 100 && x.op == "cudaMalloc")
            .unwrap();
        assert_eq!(mine.culprits[0].comm, "hog");
        assert_eq!(mine.split.runnable_ns, 10);
    }
}
