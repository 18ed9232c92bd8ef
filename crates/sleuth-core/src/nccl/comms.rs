//! Communicators across processes, and the k-th collective of a communicator
//! matched across its ranks.
//!
//! A communicator handle (`ncclComm_t`) is a pointer private to one process;
//! what the ranks share is the `ncclUniqueId` they all pass to
//! `ncclCommInitRank`. Each (process, handle) is therefore mapped to (unique
//! id, rank, size) from its init call, and collectives are counted per
//! handle: NCCL requires every rank to issue a communicator's collectives in
//! the same order, so the k-th collective of each rank is the same operation.

use super::NcclEvent;
use crate::ops::OpClass;
use std::collections::{BTreeMap, HashMap};

/// One rank's membership of a communicator, from its init call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Hex of the communicator's unique id (shared by all ranks).
    pub comm_id: String,
    pub rank: u32,
    pub nranks: u32,
    pub pid: u32,
    pub tid: u32,
    /// The process-local handle.
    pub handle: u64,
    /// The init call (start, end): a rendezvous of every rank.
    pub init_ns: u64,
    pub init_end_ns: u64,
}

/// One rank's call of a matched collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub rank: u32,
    pub pid: u32,
    pub tid: u32,
    /// When the rank entered (enqueued) the collective.
    pub ts_ns: u64,
    pub end_ns: u64,
    /// Time inside the call spent runnable (for a rank that waited: mostly
    /// after it was woken, before it ran again).
    pub runnable_ns: u64,
}

/// The k-th collective of a communicator, with every rank's call (by rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    pub comm_id: String,
    /// 0-based index among the communicator's collectives.
    pub seq: u64,
    pub op: &'static str,
    pub arrivals: Vec<Arrival>,
}

impl Matched {
    /// The first arrival (earliest entry).
    pub fn first_ns(&self) -> u64 {
        self.arrivals.iter().map(|a| a.ts_ns).min().unwrap_or(0)
    }
    /// The last rank to arrive: the one every other rank waited for.
    pub fn last(&self) -> Option<&Arrival> {
        self.arrivals.iter().max_by_key(|a| (a.ts_ns, a.rank))
    }
    /// How late the last rank was: its entry minus the first entry.
    pub fn lateness_ns(&self) -> u64 {
        self.last()
            .map(|l| l.ts_ns.saturating_sub(self.first_ns()))
            .unwrap_or(0)
    }
    /// Time the other ranks spent waiting for the last one (sum over ranks).
    pub fn waited_ns(&self) -> u64 {
        let Some(last) = self.last() else { return 0 };
        self.arrivals
            .iter()
            .map(|a| last.ts_ns.saturating_sub(a.ts_ns))
            .sum()
    }
}

/// Pending collectives kept per communicator while a rank lags behind; older
/// ones are dropped (a rank that is not traced never completes a match).
const MAX_PENDING_PER_COMM: u64 = 4096;

/// Matches collectives across ranks, one event at a time (live metrics) or
/// over a whole trace ([`match_all`]). Each process's events must arrive in
/// its own call order; processes may interleave.
#[derive(Debug, Default)]
pub struct Matcher {
    members: HashMap<(u32, u64), Member>,
    next_seq: HashMap<(u32, u64), u64>,
    pending: BTreeMap<(String, u64), (&'static str, Vec<Arrival>)>,
    newest_seq: HashMap<String, u64>,
    /// Collectives on a communicator whose init was not seen.
    pub unknown_comm: u64,
}

impl Matcher {
    pub fn new() -> Matcher {
        Matcher::default()
    }

    /// Every communicator membership seen so far.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// The membership of a process's communicator handle.
    pub fn member(&self, pid: u32, handle: u64) -> Option<&Member> {
        self.members.get(&(pid, handle))
    }

    /// Accounts one NCCL call; returns the collective it completed, if any.
    pub fn observe(&mut self, e: &NcclEvent) -> Option<Matched> {
        match e.class()? {
            OpClass::CommInit => {
                self.observe_init(e);
                None
            }
            OpClass::Collective => self.observe_collective(e),
            _ => None,
        }
    }

    fn observe_init(&mut self, e: &NcclEvent) {
        let (Some(id), Some(rank), Some(nranks), Some(handle)) =
            (&e.unique_id, e.rank, e.nranks, e.new_comm)
        else {
            return; // failed init, or a communicator without a shared id (split, init-all)
        };
        let key = (e.call.pid, handle);
        self.next_seq.insert(key, 0);
        self.members.insert(
            key,
            Member {
                comm_id: id.clone(),
                rank,
                nranks,
                pid: e.call.pid,
                tid: e.call.tid,
                handle,
                init_ns: e.call.ts_ns,
                init_end_ns: e.call.end_ns(),
            },
        );
    }

    fn observe_collective(&mut self, e: &NcclEvent) -> Option<Matched> {
        let key = (e.call.pid, e.comm?);
        let Some(m) = self.members.get(&key) else {
            self.unknown_comm += 1;
            return None;
        };
        let (comm_id, rank, nranks) = (m.comm_id.clone(), m.rank, m.nranks);
        let seq_slot = self.next_seq.entry(key).or_insert(0);
        let seq = *seq_slot;
        *seq_slot += 1;
        let newest = self.newest_seq.entry(comm_id.clone()).or_insert(0);
        *newest = (*newest).max(seq);
        let floor = newest.saturating_sub(MAX_PENDING_PER_COMM);
        let arrival = Arrival {
            rank,
            pid: e.call.pid,
            tid: e.call.tid,
            ts_ns: e.call.ts_ns,
            end_ns: e.call.end_ns(),
            runnable_ns: e.call.runnable_ns,
        };
        let slot = self
            .pending
            .entry((comm_id.clone(), seq))
            .or_insert_with(|| (e.call.op_name(), Vec::new()));
        if slot.1.iter().any(|a| a.rank == rank) {
            return None; // two handles claim the same rank: not a consistent match
        }
        slot.1.push(arrival);
        let done = slot.1.len() as u32 >= nranks;
        let matched = if done {
            self.pending
                .remove(&(comm_id.clone(), seq))
                .map(|(op, mut arrivals)| {
                    arrivals.sort_by_key(|a| a.rank);
                    Matched {
                        comm_id: comm_id.clone(),
                        seq,
                        op,
                        arrivals,
                    }
                })
        } else {
            None
        };
        if floor > 0 {
            // Keep the pending set bounded: forget collectives far behind the newest.
            self.pending
                .retain(|(id, s), _| id != &comm_id || *s >= floor);
        }
        matched
    }
}

/// Every communicator membership and matched collective of a trace.
pub fn match_all(events: &[NcclEvent]) -> (Vec<Member>, Vec<Matched>, u64) {
    let mut sorted: Vec<&NcclEvent> = events.iter().collect();
    sorted.sort_by_key(|e| (e.call.ts_ns, e.call.pid, e.call.tid));
    let mut m = Matcher::new();
    let mut out = Vec::new();
    for e in sorted {
        out.extend(m.observe(e));
    }
    let mut members: Vec<Member> = m.members().cloned().collect();
    members.sort_by(|a, b| (&a.comm_id, a.rank, a.pid).cmp(&(&b.comm_id, b.rank, b.pid)));
    out.sort_by(|a, b| (&a.comm_id, a.seq).cmp(&(&b.comm_id, b.seq)));
    (members, out, m.unknown_comm)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::event::CallEvent;
    use crate::ops::op_by_name;

    pub(crate) fn init(pid: u32, handle: u64, rank: u32, nranks: u32, ts: u64) -> NcclEvent {
        NcclEvent {
            call: CallEvent {
                op: op_by_name("ncclCommInitRank").unwrap().id,
                pid,
                tid: pid,
                ts_ns: ts,
                dur_ns: 1000,
                ..Default::default()
            },
            new_comm: Some(handle),
            rank: Some(rank),
            nranks: Some(nranks),
            unique_id: Some("feed".into()),
            ..Default::default()
        }
    }

    pub(crate) fn all_reduce(pid: u32, handle: u64, ts: u64, dur: u64) -> NcclEvent {
        NcclEvent {
            call: CallEvent {
                op: op_by_name("ncclAllReduce").unwrap().id,
                pid,
                tid: pid,
                ts_ns: ts,
                dur_ns: dur,
                ..Default::default()
            },
            comm: Some(handle),
            ..Default::default()
        }
    }

    #[test]
    fn the_kth_collective_of_each_rank_is_matched() {
        let ev = vec![
            init(10, 0xa, 0, 2, 0),
            init(20, 0xb, 1, 2, 5),
            all_reduce(10, 0xa, 100, 50),
            all_reduce(20, 0xb, 140, 10),
            all_reduce(10, 0xa, 200, 5),
            all_reduce(20, 0xb, 190, 20),
            all_reduce(10, 0xa, 300, 5), // rank 1 never issues its third
        ];
        let (members, matched, unknown) = match_all(&ev);
        assert_eq!(members.len(), 2);
        assert_eq!(unknown, 0);
        assert_eq!(matched.len(), 2);
        assert_eq!(matched[0].last().unwrap().rank, 1);
        assert_eq!(matched[0].lateness_ns(), 40);
        assert_eq!(matched[0].waited_ns(), 40);
        assert_eq!(matched[1].last().unwrap().rank, 0);
        assert_eq!(matched[1].lateness_ns(), 10);
    }

    #[test]
    fn collectives_without_a_known_communicator_are_counted() {
        let ev = vec![all_reduce(10, 0xa, 100, 50)];
        let (_, matched, unknown) = match_all(&ev);
        assert!(matched.is_empty());
        assert_eq!(unknown, 1);
    }
}
