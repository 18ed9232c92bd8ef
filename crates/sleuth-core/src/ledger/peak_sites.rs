//! What one process held per allocation site at its peak, kept during the
//! ledger's own replay: the by-site table's "live at the peak" without a
//! second replay up to the peak (`PeakSnapshots`).
//!
//! The peak is known only once the replay ends, so the state at it cannot
//! be copied when it is reached (a growing process reaches a new peak at
//! nearly every allocation). Instead the live bytes per site are kept, and
//! beside them the net change made by calls that returned after the latest
//! peak's time; a new peak forgets that change. At the end, the state at
//! the peak is the live state minus that change: exactly what a replay
//! stopped just before the first call that returned after the peak holds
//! (calls that returned at the peak's very time, after it, are in it).

use std::collections::{BTreeMap, HashMap};

/// Device bytes live per allocation site (stack id; None when the call
/// carried none): only sites with at least one live allocation are keys.
pub type LiveByStack = BTreeMap<Option<u64>, u64>;

/// Live allocations and their bytes of one site. Sums wrap (as a change
/// may be negative), so `live - after_peak` is exact whenever the true
/// value fits, which valid traces guarantee (sizes add up to under 2^62).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Held {
    count: u64,
    bytes: u64,
}

impl Held {
    fn plus(self, count: u64, bytes: u64) -> Held {
        Held {
            count: self.count.wrapping_add(count),
            bytes: self.bytes.wrapping_add(bytes),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(super) struct PeakSites {
    /// Per site, what is live now.
    live: HashMap<Option<u64>, Held>,
    /// Per site, the net change by calls that returned after the latest
    /// peak's time (a removal adds `0 - bytes`).
    after_peak: HashMap<Option<u64>, Held>,
}

impl PeakSites {
    /// A device allocation of `bytes` at `stack` became live (`added`) or
    /// stopped being live, by a call that returned after the latest peak's
    /// time or not (`after_peak`).
    pub(super) fn change(&mut self, stack: Option<u64>, bytes: u64, added: bool, after_peak: bool) {
        let (count, bytes) = if added {
            (1, bytes)
        } else {
            (0u64.wrapping_sub(1), 0u64.wrapping_sub(bytes))
        };
        let e = self.live.entry(stack).or_default();
        *e = e.plus(count, bytes);
        if after_peak {
            let e = self.after_peak.entry(stack).or_default();
            *e = e.plus(count, bytes);
        }
    }

    /// The process reached a new peak: the state now is the state at it.
    pub(super) fn new_peak(&mut self) {
        // Checked first: a growing process reaches a new peak at nearly every
        // allocation, with nothing to forget.
        if !self.after_peak.is_empty() {
            self.after_peak.clear();
        }
    }

    /// The live bytes per site at the latest peak.
    pub(super) fn at_peak(&self) -> LiveByStack {
        self.live
            .iter()
            .filter_map(|(&stack, &now)| {
                let later = self.after_peak.get(&stack).copied().unwrap_or_default();
                let then = now.plus(
                    0u64.wrapping_sub(later.count),
                    0u64.wrapping_sub(later.bytes),
                );
                (then.count != 0).then_some((stack, then.bytes))
            })
            .collect()
    }
}

/// One site's entry of a stored [`PeakSites`]: the stack, what is live
/// (count, bytes) and the change after the latest peak (count, bytes).
pub(crate) type SiteState = (Option<u64>, u64, u64, u64, u64);

impl PeakSites {
    /// What the state holds, to be stored (sites in stack order).
    pub(super) fn state(&self) -> Vec<SiteState> {
        let mut out: Vec<SiteState> = self
            .live
            .iter()
            .map(|(&stack, live)| {
                let after = self.after_peak.get(&stack).copied().unwrap_or_default();
                (stack, live.count, live.bytes, after.count, after.bytes)
            })
            .collect();
        // Every site of `after_peak` is in `live` (`change` adds to both).
        out.sort_unstable();
        out
    }

    /// The state [`Self::state`] gave; an error for a site listed twice.
    pub(super) fn from_state(sites: Vec<SiteState>) -> Result<PeakSites, String> {
        let mut p = PeakSites::default();
        for (stack, lc, lb, ac, ab) in sites {
            let fresh = p
                .live
                .insert(
                    stack,
                    Held {
                        count: lc,
                        bytes: lb,
                    },
                )
                .is_none();
            if !fresh {
                return Err("a site listed twice".into());
            }
            if (ac, ab) != (0, 0) {
                p.after_peak.insert(
                    stack,
                    Held {
                        count: ac,
                        bytes: ab,
                    },
                );
            }
        }
        Ok(p)
    }
}

/// The device bytes of a ledger's `unfreed` allocations, by site: what a
/// ledger taken at a peak (`PeakSnapshots`, `ledger(data, Some(peak))`)
/// held per site, in the form [`PeakSites`] keeps it.
pub fn live_by_stack(l: &super::ProcessLedger) -> LiveByStack {
    let mut out = LiveByStack::new();
    for u in &l.unfreed {
        let b = out.entry(u.stack_id).or_default();
        *b = b.wrapping_add(u.bytes);
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{ledger, LedgerBuilder, PeakSnapshots};
    use super::*;
    use crate::data::TraceData;
    use crate::event::CallEvent;
    use crate::ops::op_by_name;

    /// A memory call of `pid` that starts at `ts` and takes `dur`.
    pub(in crate::ledger) fn call(
        op: &str,
        pid: u32,
        ts: u64,
        dur: u64,
        size: Option<u64>,
        ptr: Option<u64>,
        stack: Option<u64>,
    ) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: dur,
            pid,
            tid: pid,
            op: op_by_name(op).unwrap().id,
            size,
            ptr,
            stack_id: stack,
            ..Default::default()
        }
    }

    /// Random memory calls of three processes: allocations of every pool
    /// at a few sites (some pointers reused while live, some unknown),
    /// frees of live, freed and never-allocated pointers, `cuMemCreate`
    /// handles, nested driver twins, failed calls, and many equal return
    /// times (ties at a peak's very time).
    pub(in crate::ledger) fn random_calls(next: &mut impl FnMut() -> u64) -> Vec<CallEvent> {
        let mut calls = Vec::new();
        for i in 0..80u64 {
            let r = next();
            let pid = 1 + (r % 3) as u32;
            // Coarse times: many calls return at the same nanosecond.
            let ts = (i / 3) * 100 + (r >> 8) % 3;
            let dur = 1 + (r >> 12) % 4 * 50;
            let ptr = 0x1000 * (1 + (r >> 16) % 12);
            let size = (r >> 24) % 5000;
            let stack = [None, Some(7), Some(8), Some(u64::MAX)][((r >> 32) % 4) as usize];
            let mut c = match (r >> 40) % 10 {
                0..=3 => call("cudaMalloc", pid, ts, dur, Some(size), Some(ptr), stack),
                4 => call("cuMemCreate", pid, ts, dur, Some(size), Some(ptr), stack),
                5 => call("cuMemRelease", pid, ts, dur, None, Some(ptr), None),
                6 => call(
                    "cudaMallocManaged",
                    pid,
                    ts,
                    dur,
                    Some(size),
                    Some(ptr),
                    stack,
                ),
                7 => call("cudaMalloc", pid, ts, dur, Some(size), None, stack),
                _ => call("cudaFree", pid, ts, dur, None, Some(ptr), None),
            };
            c.nested = (r >> 44).is_multiple_of(13);
            if (r >> 48).is_multiple_of(11) {
                c.ret = 2;
            }
            calls.push(c);
        }
        calls
    }

    /// What the by-site table read of a second replay (`PeakSnapshots`, or
    /// the loaded ledger at each peak) equals what one replay kept.
    #[test]
    fn one_replay_keeps_what_each_process_held_per_site_at_its_peak() {
        let mut next = crate::testing::xorshift(0x51ed_27a3_0c4b_9e11);
        let mut peaks_seen = 0;
        for round in 0..300 {
            let data = TraceData {
                calls: random_calls(&mut next),
                ..Default::default()
            };
            let mut order: Vec<&CallEvent> = data.calls.iter().collect();
            order.sort_by_key(|c| c.end_ns());
            let moments = [None, Some(1_000), Some(2_000), Some(round * 10)];
            for at in moments {
                let mut b = LedgerBuilder::new(at).with_peak_sites();
                for &c in &order {
                    b.push(c);
                }
                let (ledgers, kept) = b.finish_with_peak_sites(&data);
                assert_eq!(ledgers, ledger(&data, at), "the ledgers are unchanged");
                let mut second = PeakSnapshots::new(&ledgers);
                for &c in order.iter().filter(|c| at.is_none_or(|t| c.end_ns() <= t)) {
                    second.push(c);
                }
                let want: BTreeMap<u32, LiveByStack> = second
                    .finish()
                    .iter()
                    .map(|(&pid, l)| (pid, live_by_stack(l)))
                    .collect();
                assert_eq!(kept, want, "round {round} at {at:?}");
                // And the loaded ledger at each peak (`sites::memory_by_site`).
                for l in &ledgers {
                    let Some(peak) = l.peak_ts_ns else { continue };
                    let then = ledger(&data, Some(peak));
                    let p = then.iter().find(|p| p.pid == l.pid).unwrap();
                    assert_eq!(kept[&l.pid], live_by_stack(p), "pid {} at {peak}", l.pid);
                    peaks_seen += 1;
                }
            }
        }
        assert!(peaks_seen > 1000, "{peaks_seen}");
    }

    #[test]
    fn calls_at_the_peaks_time_are_in_it_later_ones_are_not() {
        let at = |calls: Vec<CallEvent>| {
            let data = TraceData {
                calls,
                ..Default::default()
            };
            let mut b = LedgerBuilder::new(None).with_peak_sites();
            for c in &data.calls {
                b.push(c);
            }
            b.finish_with_peak_sites(&data).1.remove(&1).unwrap()
        };
        let malloc =
            |ts, size, ptr, stack| call("cudaMalloc", 1, ts, 10, Some(size), Some(ptr), stack);
        let free = |ts, ptr| call("cudaFree", 1, ts, 10, None, Some(ptr), None);
        // Peak 300 B at 20; the free returning at 20 too is in the peak's
        // state (a replay stopped at the peak's time applies it), the
        // allocation at 30 is not.
        let got = at(vec![
            malloc(0, 100, 0xa, Some(1)),
            malloc(10, 200, 0xb, Some(2)),
            free(10, 0xa),
            malloc(20, 50, 0xc, Some(1)),
        ]);
        assert_eq!(got, LiveByStack::from([(Some(2), 200)]));
        // A later, higher peak forgets what came between.
        let got = at(vec![
            malloc(0, 100, 0xa, Some(1)),
            free(10, 0xa),
            malloc(20, 300, 0xb, None),
            free(30, 0xb),
        ]);
        assert_eq!(got, LiveByStack::from([(None, 300)]));
    }
}
