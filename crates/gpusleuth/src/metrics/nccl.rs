//! Per-rank NCCL collective series: counts, time inside the calls, lateness
//! (own entry minus the first rank's entry, over collectives matched across
//! the ranks traced here) and how often the rank entered last. A Prometheus
//! that scrapes every node sees the straggler across the cluster without a
//! gpusleuth server of its own.
//!
//! Cardinality: one label set per (communicator, rank) seen at init, at most
//! [`MAX_RANK_SERIES`]; later ones are not exported (and counted).

use sleuth_core::nccl::comms::{Matched, Matcher};
use sleuth_core::nccl::stragglers::STRAGGLER_MIN_LATENESS_NS;
use sleuth_core::nccl::NcclEvent;
use std::collections::BTreeMap;

/// Label sets of (communicator, rank) exported at most.
pub const MAX_RANK_SERIES: usize = 1024;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RankSeries {
    pub pid: u32,
    pub nranks: u32,
    pub collectives: u64,
    pub time_ns: u128,
    pub lateness_ns: u128,
    /// Matched collectives this rank entered last, at least the noise floor late.
    pub last: u64,
}

#[derive(Debug, Default)]
pub struct NcclMetrics {
    matcher: Matcher,
    /// (communicator id, rank) -> series.
    pub ranks: BTreeMap<(String, u32), RankSeries>,
    /// Communicator memberships beyond the label budget.
    pub unexported: u64,
}

impl NcclMetrics {
    pub fn observe(&mut self, e: &NcclEvent) {
        let matched = self.matcher.observe(e);
        if e.new_comm.is_some() {
            if let Some(m) = e.new_comm.and_then(|h| self.matcher.member(e.call.pid, h)) {
                let key = (m.comm_id.clone(), m.rank);
                if !self.ranks.contains_key(&key) && self.ranks.len() >= MAX_RANK_SERIES {
                    self.unexported += 1;
                } else {
                    let s = self.ranks.entry(key).or_default();
                    s.pid = m.pid;
                    s.nranks = m.nranks;
                }
            }
        }
        if e.is_collective() {
            if let Some(m) = e.comm.and_then(|h| self.matcher.member(e.call.pid, h)) {
                if let Some(s) = self.ranks.get_mut(&(m.comm_id.clone(), m.rank)) {
                    s.collectives += 1;
                    s.time_ns += u128::from(e.call.dur_ns);
                }
            }
        }
        if let Some(m) = matched {
            self.add_matched(&m);
        }
    }

    fn add_matched(&mut self, m: &Matched) {
        let first = m.first_ns();
        for a in &m.arrivals {
            if let Some(s) = self.ranks.get_mut(&(m.comm_id.clone(), a.rank)) {
                s.lateness_ns += u128::from(a.ts_ns - first);
            }
        }
        if m.lateness_ns() >= STRAGGLER_MIN_LATENESS_NS {
            if let Some(last) = m.last() {
                if let Some(s) = self.ranks.get_mut(&(m.comm_id.clone(), last.rank)) {
                    s.last += 1;
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use sleuth_core::{op_by_name, CallEvent};

    /// A rank's NCCL call; the encoder's tests build their events with it too.
    pub(in crate::metrics) fn ev(op: &str, pid: u32, ts: u64, dur: u64) -> NcclEvent {
        NcclEvent {
            call: CallEvent {
                op: op_by_name(op).unwrap().id,
                pid,
                tid: pid,
                ts_ns: ts,
                dur_ns: dur,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn per_rank_counts_time_and_lateness() {
        let mut m = NcclMetrics::default();
        for (pid, rank) in [(10, 0), (20, 1)] {
            let mut e = ev("ncclCommInitRank", pid, 0, 10);
            e.new_comm = Some(0x100 + pid as u64);
            e.rank = Some(rank);
            e.nranks = Some(2);
            e.unique_id = Some("ab".into());
            m.observe(&e);
        }
        for k in 0..3u64 {
            let t = 1_000_000_000 * (k + 1);
            let mut a = ev("ncclAllReduce", 10, t, 5_000_000);
            a.comm = Some(0x10a);
            let mut b = ev("ncclAllReduce", 20, t + 5_000_000, 100);
            b.comm = Some(0x114);
            m.observe(&a);
            m.observe(&b);
        }
        let r0 = &m.ranks[&("ab".to_string(), 0)];
        let r1 = &m.ranks[&("ab".to_string(), 1)];
        assert_eq!(
            (r0.collectives, r0.time_ns, r0.lateness_ns, r0.last),
            (3, 15_000_000, 0, 0)
        );
        assert_eq!(
            (r1.collectives, r1.lateness_ns, r1.last, r1.pid),
            (3, 15_000_000, 3, 20)
        );
    }
}
