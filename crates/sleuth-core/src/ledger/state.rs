//! A ledger being replayed, stored and taken up again (issue 16).
//!
//! The tracer carries a run's [`LedgerBuilder`] from one file of
//! `trace --rotate` to the next; each file stores the state it began with
//! (`sleuth_store`'s run ledger), so `memory --at` of a run replays one
//! file from that state instead of every memory call before the moment.
//! A stored state comes from a file, i.e. untrusted input: every value is
//! checked to be one a replay can hold (known memory ops, pool codes, a
//! timeline's shape, no pid or site twice) before it is used; sums stay
//! saturating as in any replay, so crafted numbers give wrong answers at
//! worst, never a panic.

use super::peak_sites::{PeakSites, SiteState};
use super::timeline::{Timeline, TimelineState};
use super::{Churn, DeviceBytes, FailedAlloc, Ledger, LedgerBuilder, Live, Pool, Replay};
use crate::ops::op_by_name;
use serde::{Deserialize, Serialize};

/// A live allocation: bytes, op, start, pool code, device, stack id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct LiveState(u64, String, u64, u8, u32, Option<u64>);

/// A failed allocation: op, bytes, error, start, device bytes live then, stack id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FailedState(String, u64, i64, u64, u64, Option<u64>);

/// One process's replay state, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessState {
    pub pid: u32,
    by_ptr: Vec<(u64, LiveState)>,
    by_handle: Vec<(u64, LiveState)>,
    no_ptr: Vec<LiveState>,
    device: u64,
    vmm: u64,
    managed: u64,
    host: u64,
    peak: u64,
    peak_ts: Option<u64>,
    timeline: TimelineState,
    failed: Vec<FailedState>,
    /// Absent when 0 (the states of round 20 have no such member).
    #[serde(default, skip_serializing_if = "super::is_zero")]
    failed_not_kept: u64,
    allocs: u64,
    frees: u64,
    allocated_bytes: u64,
    freed_bytes: u64,
    unmatched_frees: u64,
    reused_live_ptrs: u64,
    unknown_ptr_allocs: u64,
    freed_sizes: Vec<(u64, u64)>,
    realloc_sizes: Vec<(u64, u64, String)>,
    reallocs: u64,
    alloc_free_ns: u64,
    thread_device: Vec<(u32, u32)>,
    per_device: Vec<DeviceBytes>,
    /// Per site what is live and changed after the peak; None when the
    /// builder did not keep it ([`LedgerBuilder::with_peak_sites`]).
    sites: Option<Vec<SiteState>>,
}

impl ProcessState {
    /// Entries that grow with the calls replayed (as `held_entries` counts
    /// them, plus sites): what a reader bounds.
    pub fn entries(&self) -> usize {
        self.by_ptr.len()
            + self.by_handle.len()
            + self.no_ptr.len()
            + self.failed.len()
            + self.freed_sizes.len()
            + self.realloc_sizes.len()
            + self.thread_device.len()
            + self.sites.as_ref().map_or(0, Vec::len)
    }

    /// The stack ids the state names (live and failed allocations, sites).
    pub fn stack_ids(&self) -> impl Iterator<Item = u64> + '_ {
        let live = self.by_ptr.iter().chain(&self.by_handle).map(|(_, l)| &l.5);
        live.chain(self.no_ptr.iter().map(|l| &l.5))
            .chain(self.failed.iter().map(|f| &f.5))
            .chain(self.sites.iter().flatten().map(|s| &s.0))
            .filter_map(|s| *s)
    }
}

/// The largest count a stored state may hold (as any trace's values, 2^62).
const MAX_COUNT: u64 = 1 << 62;

const POOLS: [Pool; 4] = [
    Pool::Device,
    Pool::Physical,
    Pool::Managed,
    Pool::HostPinned,
];

fn pool_code(p: Pool) -> u8 {
    POOLS.iter().position(|&q| q == p).unwrap_or(0) as u8
}

/// The op's name as this build knows it, when it is a memory op.
fn memory_op(name: &str) -> Result<&'static crate::ops::OpInfo, String> {
    op_by_name(name)
        .filter(|i| super::is_memory_op(i))
        .ok_or_else(|| {
            let shown: String = name.chars().take(40).collect();
            format!("an op that allocates no memory: {shown:?}")
        })
}

fn live_state(l: &Live) -> LiveState {
    LiveState(
        l.bytes,
        l.op().to_string(),
        l.ts_ns,
        pool_code(l.pool),
        l.device,
        l.stack_id(),
    )
}

fn live_of(s: LiveState) -> Result<Live, String> {
    let pool = *POOLS
        .get(usize::from(s.3))
        .ok_or("an unknown memory pool")?;
    Ok(Live::new(s.0, memory_op(&s.1)?, s.2, pool, s.4, s.5))
}

impl Replay {
    fn state(&self, pid: u32) -> ProcessState {
        // By key: the same state always stores the same text.
        let lives = |m: &std::collections::HashMap<u64, Live>| {
            let mut v: Vec<(u64, LiveState)> = m.iter().map(|(&p, l)| (p, live_state(l))).collect();
            v.sort_unstable_by_key(|e| e.0);
            v
        };
        let (by_ptr, by_handle) = (lives(&self.by_ptr), lives(&self.by_handle));
        let mut freed_sizes: Vec<(u64, u64)> =
            self.freed_sizes.iter().map(|(&b, &n)| (b, n)).collect();
        freed_sizes.sort_unstable();
        let mut realloc_sizes: Vec<(u64, u64, String)> = self
            .realloc_sizes
            .iter()
            .map(|(&b, &(n, op))| (b, n, op.to_string()))
            .collect();
        realloc_sizes.sort_unstable();
        let mut thread_device: Vec<(u32, u32)> =
            self.thread_device.iter().map(|(&t, &d)| (t, d)).collect();
        thread_device.sort_unstable();
        ProcessState {
            pid,
            by_ptr,
            by_handle,
            no_ptr: self.no_ptr.iter().map(live_state).collect(),
            device: self.device,
            vmm: self.vmm,
            managed: self.managed,
            host: self.host,
            peak: self.peak,
            peak_ts: self.peak_ts,
            timeline: self.timeline.state(),
            failed: self
                .failed
                .iter()
                .map(|f| {
                    FailedState(
                        f.op.to_string(),
                        f.bytes,
                        f.error,
                        f.ts_ns,
                        f.live_bytes_at,
                        f.stack_id,
                    )
                })
                .collect(),
            failed_not_kept: self.failed_not_kept,
            allocs: self.allocs,
            frees: self.frees,
            allocated_bytes: self.allocated_bytes,
            freed_bytes: self.freed_bytes,
            unmatched_frees: self.unmatched_frees,
            reused_live_ptrs: self.reused_live_ptrs,
            unknown_ptr_allocs: self.unknown_ptr_allocs,
            freed_sizes,
            realloc_sizes,
            reallocs: self.churn.reallocs,
            alloc_free_ns: self.churn.alloc_free_ns,
            thread_device,
            per_device: self.per_device.values().cloned().collect(),
            sites: self.sites.as_ref().map(|s| s.state()),
        }
    }

    fn from_state(s: ProcessState, no_history: bool) -> Result<Replay, String> {
        // Counts grow by one per call (unchecked sums): none may be near
        // overflow. Byte sums saturate and are left as they are.
        let counts = [
            s.failed_not_kept,
            s.allocs,
            s.frees,
            s.unmatched_frees,
            s.reused_live_ptrs,
            s.unknown_ptr_allocs,
            s.reallocs,
        ];
        let per_size = s.freed_sizes.iter().map(|e| e.1);
        let per_size = per_size.chain(s.realloc_sizes.iter().map(|e| e.1));
        if let Some(n) = counts.into_iter().chain(per_size).find(|&n| n > MAX_COUNT) {
            return Err(format!("a count no replay reaches ({n})"));
        }
        let lives = |v: Vec<(u64, LiveState)>, what: &str| {
            let mut m = std::collections::HashMap::with_capacity(v.len());
            for (ptr, l) in v {
                if m.insert(ptr, live_of(l)?).is_some() {
                    return Err(format!("a {what} listed twice"));
                }
            }
            Ok(m)
        };
        let mut freed_sizes = std::collections::HashMap::with_capacity(s.freed_sizes.len());
        for (b, n) in s.freed_sizes {
            if freed_sizes.insert(b, n).is_some() {
                return Err("a freed size listed twice".into());
            }
        }
        let mut realloc_sizes = std::collections::HashMap::with_capacity(s.realloc_sizes.len());
        for (b, n, op) in s.realloc_sizes {
            if realloc_sizes.insert(b, (n, memory_op(&op)?.name)).is_some() {
                return Err("a re-allocated size listed twice".into());
            }
        }
        let mut thread_device = std::collections::HashMap::with_capacity(s.thread_device.len());
        for (t, d) in s.thread_device {
            if thread_device.insert(t, d).is_some() {
                return Err("a thread listed twice".into());
            }
        }
        let mut per_device = std::collections::BTreeMap::new();
        for d in s.per_device {
            if per_device.insert(d.device, d).is_some() {
                return Err("a device listed twice".into());
            }
        }
        // A replay lists the first failures and counts the rest only once
        // the list is full.
        if s.failed.len() > super::MAX_FAILED_KEPT
            || (s.failed_not_kept > 0 && s.failed.len() < super::MAX_FAILED_KEPT)
        {
            return Err(format!(
                "{} failed allocations listed and {} counted, which no replay keeps",
                s.failed.len(),
                s.failed_not_kept
            ));
        }
        let failed = s
            .failed
            .into_iter()
            .map(|f| {
                Ok(FailedAlloc {
                    op: memory_op(&f.0)?.name,
                    bytes: f.1,
                    error: f.2,
                    ts_ns: f.3,
                    live_bytes_at: f.4,
                    stack_id: f.5,
                    site: None,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Replay {
            no_history,
            by_ptr: lives(s.by_ptr, "pointer")?,
            by_handle: lives(s.by_handle, "handle")?,
            no_ptr: s
                .no_ptr
                .into_iter()
                .map(live_of)
                .collect::<Result<_, _>>()?,
            device: s.device,
            vmm: s.vmm,
            managed: s.managed,
            host: s.host,
            peak: s.peak,
            peak_ts: s.peak_ts,
            timeline: Timeline::from_state(s.timeline)?,
            failed,
            failed_not_kept: s.failed_not_kept,
            allocs: s.allocs,
            frees: s.frees,
            allocated_bytes: s.allocated_bytes,
            freed_bytes: s.freed_bytes,
            unmatched_frees: s.unmatched_frees,
            reused_live_ptrs: s.reused_live_ptrs,
            unknown_ptr_allocs: s.unknown_ptr_allocs,
            freed_sizes,
            realloc_sizes,
            churn: Churn {
                reallocs: s.reallocs,
                alloc_free_ns: s.alloc_free_ns,
                top_sizes: Vec::new(),
            },
            thread_device,
            per_device,
            sites: s
                .sites
                .map(PeakSites::from_state)
                .transpose()?
                .map(Box::new),
        })
    }
}

impl LedgerBuilder {
    /// Each process's replay state, by pid ([`Self::from_states`] takes
    /// them up again). Only a builder without a moment (`new(None)`) and
    /// with history (timelines, failures) is meant to be stored.
    pub fn states(&self) -> Vec<ProcessState> {
        self.each_state().collect()
    }

    /// [`Self::states`] one process at a time (a writer holds one state,
    /// not all, beside the builder).
    pub fn each_state(&self) -> impl Iterator<Item = ProcessState> + '_ {
        self.ledger.procs.iter().map(|(&pid, r)| r.state(pid))
    }

    /// Process `pid`'s replay state, when the builder holds one.
    pub fn state_of(&self, pid: u32) -> Option<ProcessState> {
        self.ledger.procs.get(&pid).map(|r| r.state(pid))
    }

    /// Whether [`Self::from_states`] takes `state` up (with its sites at
    /// the peak): the error naming what no replay leaves. A reader that
    /// gathers states from several files checks each where it read it.
    pub fn check_state(state: &ProcessState) -> Result<(), String> {
        Self::restored(vec![state.clone()], None, true, false).map(|_| ())
    }

    /// A builder at `at_ns` (as [`Self::new`]) that continues from
    /// `states`, keeping each process's sites at its peak when `peak_sites`
    /// (then every state must carry them); an error naming what no replay
    /// leaves.
    pub fn from_states(
        states: Vec<ProcessState>,
        at_ns: Option<u64>,
        peak_sites: bool,
    ) -> Result<LedgerBuilder, String> {
        Self::restored(states, at_ns, peak_sites, false)
    }

    /// [`Self::from_states`] of states a builder [`Self::without_history`]
    /// left (no timeline, no failures listed), continued the same way: what
    /// a reader that needs only live bytes takes up (the allocator
    /// checkpoints of `sleuth_store`).
    pub fn from_states_without_history(
        states: Vec<ProcessState>,
        at_ns: Option<u64>,
    ) -> Result<LedgerBuilder, String> {
        Self::restored(states, at_ns, false, true)
    }

    fn restored(
        states: Vec<ProcessState>,
        at_ns: Option<u64>,
        peak_sites: bool,
        no_history: bool,
    ) -> Result<LedgerBuilder, String> {
        let mut procs = std::collections::BTreeMap::new();
        for s in states {
            let pid = s.pid;
            if peak_sites && s.sites.is_none() {
                return Err(format!("process {pid}'s state keeps no sites"));
            }
            if no_history && (!s.failed.is_empty() || !s.timeline.is_empty()) {
                return Err(format!("process {pid}'s state keeps a history"));
            }
            let mut r = Replay::from_state(s, no_history)?;
            if !peak_sites {
                r.sites = None;
            }
            if procs.insert(pid, Box::new(r)).is_some() {
                return Err(format!("process {pid} listed twice"));
            }
        }
        Ok(LedgerBuilder {
            ledger: Ledger {
                procs,
                no_history,
                peak_sites,
            },
            at_ns,
            last_end_ns: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::peak_sites::tests::{call, random_calls};
    use super::*;
    use crate::data::TraceData;
    use crate::event::CallEvent;

    /// A replay stored after any prefix of the calls (as JSON, as a file
    /// stores it) and taken up again ends exactly as one replay of them
    /// all: ledgers and sites at the peak, at the end and at moments after
    /// the prefix. Calls of every pool, failures, devices, reused pointers.
    #[test]
    fn a_replay_stored_midway_and_taken_up_again_ends_as_one_replay() {
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d);
        let mut restored = 0;
        for round in 0..200u64 {
            let mut calls = random_calls(&mut next);
            for k in 0..6u64 {
                let (pid, ts) = (1 + (k % 3) as u32, 40 * k + 7);
                let host = 0x9000 + k % 2;
                calls.push(call(
                    "cudaHostAlloc",
                    pid,
                    ts,
                    3,
                    Some(4096),
                    Some(host),
                    Some(9),
                ));
                calls.push(call(
                    "cudaFreeHost",
                    pid,
                    ts + 100,
                    3,
                    None,
                    Some(host),
                    None,
                ));
                let mut dev = call("cudaSetDevice", pid, ts + 5, 1, None, Some(k % 2), None);
                dev.tid = pid;
                calls.push(dev);
                // A cache emptied and refilled: re-allocations of one size.
                let p = 0x7_0000 + k;
                calls.push(call(
                    "cudaMalloc",
                    pid,
                    ts + 20,
                    2,
                    Some(1 << 20),
                    Some(p),
                    Some(7),
                ));
                calls.push(call("cudaFree", pid, ts + 60, 2, None, Some(p), None));
            }
            let data = TraceData {
                calls,
                ..Default::default()
            };
            let mut order: Vec<&CallEvent> = data.calls.iter().collect();
            order.sort_by_key(|c| c.end_ns());
            for at in [None, Some(1_500), Some(round * 15)] {
                let mut whole = LedgerBuilder::new(at).with_peak_sites();
                for &c in &order {
                    whole.push(c);
                }
                let want = whole.finish_with_peak_sites(&data);
                let before = order
                    .iter()
                    .take_while(|c| at.is_none_or(|t| c.end_ns() <= t))
                    .count();
                for split in [0, before / 3, before / 2, before] {
                    let mut first = LedgerBuilder::new(None).with_peak_sites();
                    for &c in &order[..split] {
                        first.push(c);
                    }
                    let states = first.states();
                    let json = serde_json::to_string(&states).unwrap();
                    let back: Vec<ProcessState> = serde_json::from_str(&json).unwrap();
                    assert_eq!(back, states);
                    let mut b = LedgerBuilder::from_states(back, at, true).unwrap();
                    for &c in &order[split..] {
                        b.push(c);
                    }
                    assert_eq!(
                        b.finish_with_peak_sites(&data),
                        want,
                        "round {round} at {at:?} split {split}"
                    );
                    restored += 1;
                }
            }
        }
        assert!(restored >= 2000, "{restored}");
    }

    /// A builder without history stored midway and taken up again ends
    /// with the live bytes, counts and live allocations of one replay with
    /// history; a state with history is refused as one without.
    #[test]
    fn a_replay_without_history_stored_midway_keeps_what_is_live() {
        let mut next = crate::testing::xorshift(0x5851_f42d_4c95_7f2d);
        for round in 0..100u64 {
            let data = TraceData {
                calls: random_calls(&mut next),
                ..Default::default()
            };
            let mut order: Vec<&CallEvent> = data.calls.iter().collect();
            order.sort_by_key(|c| c.end_ns());
            let at = Some(round * 20);
            let mut whole = LedgerBuilder::new(at);
            order.iter().for_each(|c| whole.push(c));
            let want = whole.finish_bare();
            // A state holds only calls that returned by the moment.
            let before = order
                .iter()
                .take_while(|c| at.is_none_or(|t| c.end_ns() <= t))
                .count();
            for split in [0, before / 3, before / 2, before] {
                let mut first = LedgerBuilder::without_history();
                order[..split].iter().for_each(|c| first.push(c));
                let json = serde_json::to_string(&first.states()).unwrap();
                let back: Vec<ProcessState> = serde_json::from_str(&json).unwrap();
                let mut b = LedgerBuilder::from_states_without_history(back, at).unwrap();
                order[split..].iter().for_each(|c| b.push(c));
                let got = b.finish_bare();
                assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(&want) {
                    let key = |l: &crate::ledger::ProcessLedger| {
                        (l.pid, l.live_bytes, l.allocs, l.frees, l.unfreed.len())
                    };
                    assert_eq!(key(g), key(w), "round {round} split {split}");
                }
            }
            let mut with_history = LedgerBuilder::new(None);
            order.iter().for_each(|c| with_history.push(c));
            let states = with_history.states();
            if states.iter().any(|s| !s.timeline.is_empty()) {
                assert!(LedgerBuilder::from_states_without_history(states, None).is_err());
            }
        }
    }

    /// Failures past the kept list: a state stored before the list is
    /// full, as it fills and after, taken up again, ends as one replay
    /// (list and count).
    #[test]
    fn failures_counted_past_the_list_survive_a_stored_state() {
        let kept = super::super::MAX_FAILED_KEPT;
        let mut calls = vec![call("cudaMalloc", 1, 1, 1, Some(64), Some(0x10), None)];
        for i in 0..(kept as u64 + 300) {
            let mut f = call("cudaMalloc", 1, 10 + i, 1, Some(1 << 40), None, Some(i % 3));
            f.ret = 2;
            calls.push(f);
        }
        let data = TraceData {
            calls,
            ..Default::default()
        };
        let whole = {
            let mut b = LedgerBuilder::new(None);
            data.calls.iter().for_each(|c| b.push(c));
            b.finish(&data)
        };
        assert_eq!(whole[0].failed_allocs_not_kept, 300);
        for split in [1, kept, kept + 1, kept + 150, data.calls.len()] {
            let mut first = LedgerBuilder::new(None);
            data.calls[..split].iter().for_each(|c| first.push(c));
            let json = serde_json::to_string(&first.states()).unwrap();
            let back: Vec<ProcessState> = serde_json::from_str(&json).unwrap();
            let mut b = LedgerBuilder::from_states(back, None, false).unwrap();
            data.calls[split..].iter().for_each(|c| b.push(c));
            assert_eq!(b.finish(&data), whole, "split {split}");
        }
    }

    /// Every number of a stored state set to an extreme (0, 1, 2^62,
    /// 2^63 - 1, u64::MAX, -1), one at a time and in random pairs: the
    /// state is refused or taken up, and a replay continued from it then
    /// finished never panics (overflow checks on in test builds).
    #[test]
    fn crafted_numbers_in_a_state_never_panic_the_replay() {
        let mut next = crate::testing::xorshift(0x9e37_79b9_7f4a_7c15);
        let calls = random_calls(&mut next);
        let data = TraceData {
            calls: calls.clone(),
            ..Default::default()
        };
        let mut order: Vec<&CallEvent> = calls.iter().collect();
        order.sort_by_key(|c| c.end_ns());
        let mut first = LedgerBuilder::new(None).with_peak_sites();
        for &c in &order[..order.len() / 2] {
            first.push(c);
        }
        let json = serde_json::to_value(first.states()).unwrap();
        // Paths to every number in the state.
        fn numbers(v: &serde_json::Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
            match v {
                serde_json::Value::Number(_) => out.push(at.clone()),
                serde_json::Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| {
                    at.push(i.to_string());
                    numbers(x, at, out);
                    at.pop();
                }),
                serde_json::Value::Object(o) => o.iter().for_each(|(k, x)| {
                    at.push(k.clone());
                    numbers(x, at, out);
                    at.pop();
                }),
                _ => {}
            }
        }
        let mut paths = Vec::new();
        numbers(&json, &mut Vec::new(), &mut paths);
        assert!(paths.len() > 100, "{}", paths.len());
        let extremes: [serde_json::Value; 6] = [
            0.into(),
            1.into(),
            (1u64 << 62).into(),
            i64::MAX.into(),
            u64::MAX.into(),
            (-1).into(),
        ];
        let set = |v: &mut serde_json::Value, path: &[String], x: &serde_json::Value| {
            let mut cur = v;
            for k in path {
                cur = match k.parse::<usize>() {
                    Ok(i) if cur.is_array() => &mut cur[i],
                    _ => &mut cur[k.as_str()],
                };
            }
            *cur = x.clone();
        };
        let (mut taken, mut refused) = (0, 0);
        let mut try_state = |v: serde_json::Value| {
            let Ok(states) = serde_json::from_value::<Vec<ProcessState>>(v) else {
                refused += 1;
                return;
            };
            match LedgerBuilder::from_states(states, None, true) {
                Ok(mut b) => {
                    for &c in &order[order.len() / 2..] {
                        b.push(c);
                    }
                    let _ = b.finish_with_peak_sites(&data);
                    taken += 1;
                }
                Err(_) => refused += 1,
            }
        };
        for path in &paths {
            for x in &extremes {
                let mut v = json.clone();
                set(&mut v, path, x);
                try_state(v);
            }
        }
        for _ in 0..2000 {
            let mut v = json.clone();
            for _ in 0..2 {
                let path = &paths[(next() % paths.len() as u64) as usize];
                set(&mut v, path, &extremes[(next() % 6) as usize]);
            }
            try_state(v);
        }
        assert!(
            taken > 100 && refused > 100,
            "taken {taken}, refused {refused}"
        );
    }

    /// States no replay leaves are refused with a line naming why.
    #[test]
    fn a_state_no_replay_leaves_is_refused() {
        let mut b = LedgerBuilder::new(None).with_peak_sites();
        b.push(&call(
            "cudaMalloc",
            4,
            10,
            5,
            Some(4096),
            Some(0x1000),
            Some(3),
        ));
        b.push(&call(
            "cudaMalloc",
            4,
            20,
            5,
            Some(8192),
            Some(0x2000),
            None,
        ));
        let json = serde_json::to_value(b.states()).unwrap();
        let refused = |edit: &dyn Fn(&mut serde_json::Value), why: &str| {
            let mut v = json.clone();
            edit(&mut v);
            let err = match serde_json::from_value::<Vec<ProcessState>>(v) {
                Err(e) => e.to_string(),
                Ok(s) => LedgerBuilder::from_states(s, None, true).expect_err(why),
            };
            assert!(err.contains(why), "{err} (wanted {why})");
        };
        refused(
            &|v| v[0]["by_ptr"][0][1][1] = "cudaLaunchKernel".into(),
            "allocates no memory",
        );
        refused(
            &|v| v[0]["by_ptr"][0][1][3] = 9.into(),
            "unknown memory pool",
        );
        refused(
            &|v| v[0]["by_ptr"][1][0] = v[0]["by_ptr"][0][0].clone(),
            "pointer listed twice",
        );
        refused(&|v| v[0]["timeline"]["stride"] = 3.into(), "timeline");
        refused(&|v| v[0]["timeline"]["in_filling"] = 5.into(), "timeline");
        refused(
            &|v| v[0]["sites"] = serde_json::Value::Null,
            "keeps no sites",
        );
        refused(&|v| v[0]["extra"] = 1.into(), "unknown field");
        refused(&|v| v[0]["device"] = (-1).into(), "invalid value");
        refused(
            &|v| v[0]["allocs"] = u64::MAX.into(),
            "a count no replay reaches",
        );
        refused(
            &|v| v[0]["failed_not_kept"] = 3.into(),
            "which no replay keeps",
        );
        let failure = serde_json::json!(["cudaMalloc", 1, 2, 30, 0, null]);
        refused(
            &|v| v[0]["failed"] = vec![failure.clone(); super::super::MAX_FAILED_KEPT + 1].into(),
            "which no replay keeps",
        );
        let twice = serde_json::Value::Array(vec![json[0].clone(), json[0].clone()]);
        let s: Vec<ProcessState> = serde_json::from_value(twice).unwrap();
        let err = LedgerBuilder::from_states(s, None, true).unwrap_err();
        assert!(err.contains("listed twice"), "{err}");
    }
}
