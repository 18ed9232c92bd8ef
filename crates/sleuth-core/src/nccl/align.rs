//! Residual clock skew between two nodes' traces, from collective alignment.
//!
//! A blocking rendezvous (communicator init, a collective that returns only
//! once every rank has arrived) releases every rank right after the last one
//! enters. So for a collective whose last rank is on one node and a rank that
//! waited for it on the other, the waiter's wake-up and the last rank's entry
//! are the same moment up to a few µs: their difference, read on the two
//! clocks, is the clock skew. The waiter's wake-up is its return minus the
//! time it then spent runnable (waiting for a CPU: milliseconds on a busy
//! machine). The estimate is the median over such pairs, using only pairs
//! whose last rank went straight through its call (at most
//! [`MAX_LAST_CALL_NS`]: not preempted before releasing the others) when
//! there are enough of them. Only pairs where the waiter really waited (its
//! call lasted at least [`MIN_WAIT_NS`]) count: NCCL collectives that return
//! at enqueue (asynchronous) give no pair, and then only blocking inits are used.

use super::comms::{match_all, Arrival};
use super::NcclEvent;
use serde::Serialize;
use std::collections::HashSet;

/// A waiter's call must have lasted this long to be a rendezvous sample.
pub const MIN_WAIT_NS: u64 = 1_000_000;
/// Fewest samples for an estimate to be applied.
pub const MIN_SAMPLES: usize = 3;
/// A last rank's call at most this long released the others at once.
pub const MAX_LAST_CALL_NS: u64 = 200_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Alignment {
    /// The other node's clock minus the base node's (ns): subtract it from the other's times.
    pub skew_ns: i64,
    pub samples: usize,
    /// Median absolute deviation of the samples.
    pub spread_ns: i64,
}

/// Estimates the skew of `other`'s clock against `base`'s. Both sets must use
/// distinct pids and the same nominal clock (session offsets already applied).
pub fn estimate(base: &[NcclEvent], other: &[NcclEvent]) -> Option<Alignment> {
    let base_pids: HashSet<u32> = base.iter().map(|e| e.call.pid).collect();
    let all: Vec<NcclEvent> = base.iter().chain(other.iter()).cloned().collect();
    let (members, matched, _) = match_all(&all);
    let mut samples: Vec<i64> = Vec::new();
    let mut clean: Vec<i64> = Vec::new();
    let mut add = |arrivals: &[Arrival]| {
        let Some(last) = arrivals.iter().max_by_key(|a| a.ts_ns) else {
            return;
        };
        let last_on_base = base_pids.contains(&last.pid);
        // The waiter on the other side that returned first (closest to the release).
        let waiter = arrivals
            .iter()
            .filter(|a| base_pids.contains(&a.pid) != last_on_base)
            .filter(|a| a.end_ns.saturating_sub(a.ts_ns) >= MIN_WAIT_NS)
            .min_by_key(|a| a.end_ns);
        if let Some(w) = waiter {
            let woken = w.end_ns.saturating_sub(w.runnable_ns).max(w.ts_ns);
            let d = woken as i64 - last.ts_ns as i64;
            // On the other node's clock minus on the base's.
            let sample = if last_on_base { d } else { -d };
            samples.push(sample);
            if last.end_ns.saturating_sub(last.ts_ns) <= MAX_LAST_CALL_NS {
                clean.push(sample);
            }
        }
    };
    for m in &matched {
        add(&m.arrivals);
    }
    // Inits are rendezvous too (blocking in real NCCL).
    let mut ids: Vec<&str> = members.iter().map(|m| m.comm_id.as_str()).collect();
    ids.dedup();
    for id in ids {
        let arrivals: Vec<Arrival> = members
            .iter()
            .filter(|m| m.comm_id == id)
            .map(|m| Arrival {
                rank: m.rank,
                pid: m.pid,
                tid: m.tid,
                ts_ns: m.init_ns,
                end_ns: m.init_end_ns,
                runnable_ns: 0,
            })
            .collect();
        if arrivals.len() as u32
            >= members
                .iter()
                .find(|m| m.comm_id == id)
                .map_or(0, |m| m.nranks)
        {
            add(&arrivals);
        }
    }
    if clean.len() >= MIN_SAMPLES {
        samples = clean;
    }
    if samples.len() < MIN_SAMPLES {
        return None;
    }
    let skew = median(&mut samples);
    let mut dev: Vec<i64> = samples.iter().map(|s| (s - skew).abs()).collect();
    Some(Alignment {
        skew_ns: skew,
        samples: samples.len(),
        spread_ns: median(&mut dev),
    })
}

fn median(v: &mut [i64]) -> i64 {
    v.sort_unstable();
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::comms::tests::{all_reduce, init};

    /// Rank 0 (pid 10, base) and rank 1 (pid 20, other node, clock +skew).
    /// Collectives block until both arrived; release 30 µs after the last entry.
    fn pair(skew: i64, late_rank: impl Fn(u64) -> u32) -> (Vec<NcclEvent>, Vec<NcclEvent>) {
        let s = |t: u64| (t as i64 + skew) as u64;
        let (mut a, mut b) = (
            vec![init(10, 0xa, 0, 2, 10_000_000)],
            vec![init(20, 0xb, 1, 2, s(10_000_000))],
        );
        for k in 0..9u64 {
            let t = 100_000_000 * (k + 1);
            let (t0, t1) = if late_rank(k) == 1 {
                (t, t + 20_000_000)
            } else {
                (t + 20_000_000, t)
            };
            let release = t0.max(t1) + 30_000;
            a.push(all_reduce(10, 0xa, t0, release - t0));
            b.push(all_reduce(20, 0xb, s(t1), release - t1));
        }
        (a, b)
    }

    #[test]
    fn recovers_the_skew_when_one_node_is_always_late() {
        let (a, b) = pair(250_000_000, |_| 1);
        let al = estimate(&a, &b).unwrap();
        assert!((al.skew_ns - 250_000_000).abs() < 100_000, "{al:?}");
        assert!(al.samples >= 9);
        let (a, b) = pair(-3_000_000, |k| (k % 2) as u32);
        let al = estimate(&a, &b).unwrap();
        assert!((al.skew_ns + 3_000_000).abs() < 100_000, "{al:?}");
    }

    #[test]
    fn asynchronous_collectives_give_no_estimate() {
        let (mut a, mut b) = pair(5_000_000, |_| 1);
        for e in a.iter_mut().chain(b.iter_mut()) {
            e.call.dur_ns = 5_000; // returned at enqueue
        }
        assert_eq!(estimate(&a, &b), None);
    }
}
