//! A replay's live blocks by `Block*`: a dense list and a table of
//! positions into it (issue 16, round 36).
//!
//! A replay holds every live block of its process: the tracer's file
//! completion, its carried replays and the moments they view. A hash map
//! of (key, block) pairs is full of empty buckets just after it doubles
//! (250,000 live blocks: 524,288 buckets of 56 bytes, 30 MB, all of it
//! touched since keys land anywhere) and holds the old table beside the
//! new one while it doubles. Here the buckets hold 4-byte positions (2.6
//! MB at 250,000), the blocks lie in one list in the order they came
//! (12 MB at 250,000, 48 bytes a block: a list grown in place, whose
//! unused room the system never hands out until it is written), and a
//! removal moves the last block into the hole.

use super::Held;
use hashbrown::HashTable;
use std::hash::{BuildHasher, RandomState};

/// Live blocks by `Block*`. Keys come from the traced process (or a file),
/// so they are hashed with a keyed hash: no crafted set of keys makes one
/// probe sequence long.
#[derive(Default, Clone)]
pub(super) struct LiveBlocks {
    /// Positions in `entries`, found by their key's hash.
    slots: HashTable<u32>,
    entries: Vec<(u64, Held)>,
    hasher: RandomState,
}

impl LiveBlocks {
    pub(super) fn with_capacity(n: usize) -> LiveBlocks {
        LiveBlocks {
            slots: HashTable::with_capacity(n),
            entries: Vec::with_capacity(n),
            hasher: RandomState::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Room for `additional` more blocks without growing.
    pub(super) fn reserve(&mut self, additional: usize) {
        let Self {
            slots,
            entries,
            hasher,
        } = self;
        slots.reserve(additional, rehash(entries, hasher));
        entries.reserve(additional);
    }

    /// Holds `held` under `key`; the block it replaces, if any.
    pub(super) fn insert(&mut self, key: u64, held: Held) -> Option<Held> {
        let Self {
            slots,
            entries,
            hasher,
        } = self;
        let hash = hasher.hash_one(key);
        if let Some(&i) = slots.find(hash, |&i| entries[i as usize].0 == key) {
            return Some(std::mem::replace(&mut entries[i as usize].1, held));
        }
        // A position fits in 32 bits: 2^32 live blocks would take 240 GB.
        let at = u32::try_from(entries.len()).expect("fewer than 2^32 live blocks");
        slots.insert_unique(hash, at, rehash(entries, hasher));
        entries.push((key, held));
        None
    }

    /// Takes the block under `key` out: the last block takes its place.
    pub(super) fn remove(&mut self, key: u64) -> Option<Held> {
        let Self {
            slots,
            entries,
            hasher,
        } = self;
        let hash = hasher.hash_one(key);
        let (at, _) = slots
            .find_entry(hash, |&i| entries[i as usize].0 == key)
            .ok()?
            .remove();
        let last = entries.len() - 1;
        if at as usize != last {
            let moved = hasher.hash_one(entries[last].0);
            // Every block has its slot: the last one's now points at `at`.
            let slot = slots
                .find_mut(moved, |&i| i as usize == last)
                .expect("the last block has a slot");
            *slot = at;
        }
        Some(entries.swap_remove(at as usize).1)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Held> {
        self.entries.iter().map(|(_, h)| h)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, Held)> + '_ {
        self.entries.iter().copied()
    }

    /// The blocks, the table gone.
    pub(super) fn into_entries(self) -> Vec<(u64, Held)> {
        self.entries
    }
}

/// A slot's hash (the table's own, when it grows): its block's key's.
fn rehash<'a>(entries: &'a [(u64, Held)], hasher: &'a RandomState) -> impl Fn(&u32) -> u64 + 'a {
    move |&i| hasher.hash_one(entries[i as usize].0)
}

#[cfg(test)]
mod tests {
    use super::{Held, LiveBlocks};
    use std::collections::HashMap;
    use std::num::NonZeroU64;

    #[test]
    fn a_live_block_takes_48_bytes_in_the_list() {
        // The list is most of a replay's memory with many live blocks
        // (heaptrack, round 39): an optional site as a plain Option<u64>
        // would make each 56.
        assert_eq!(std::mem::size_of::<(u64, Held)>(), 48);
    }

    fn held(n: u64) -> Held {
        Held {
            ptr: n * 512,
            size: n + 1,
            requested: n,
            since_ns: n * 7,
            stack_id: (!n.is_multiple_of(3))
                .then_some(n)
                .and_then(NonZeroU64::new),
        }
    }

    fn same(h: Option<Held>, m: Option<Held>) -> bool {
        match (h, m) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                (a.ptr, a.size, a.requested, a.since_ns, a.stack_id)
                    == (b.ptr, b.size, b.requested, b.since_ns, b.stack_id)
            }
            _ => false,
        }
    }

    /// Random inserts (new keys and replacements) and removals (held keys
    /// and absent ones) agree with a std map at every step: what each
    /// returns, the length, and the blocks held.
    #[test]
    fn agrees_with_a_map_under_random_inserts_and_removals() {
        let mut next = crate::testing::xorshift(0x9e37_79b9_7f4a_7c15);
        let mut live = LiveBlocks::default();
        let mut map: HashMap<u64, Held> = HashMap::new();
        for step in 0..200_000u64 {
            // Keys from a small range so that replacements and removals of
            // held keys are frequent; removals lag inserts so it grows.
            let key = next() % 40_000;
            let r = next() % 10;
            if r < 6 {
                let h = held(step);
                assert!(
                    same(live.insert(key, h), map.insert(key, h)),
                    "insert {step}"
                );
            } else {
                assert!(same(live.remove(key), map.remove(&key)), "remove {step}");
            }
            assert_eq!(live.len(), map.len());
            if step.is_multiple_of(10_000) {
                live.reserve((next() % 5000) as usize);
            }
        }
        let mut got: Vec<(u64, u64)> = live.iter().map(|(k, h)| (k, h.since_ns)).collect();
        let mut want: Vec<(u64, u64)> = map.iter().map(|(&k, h)| (k, h.since_ns)).collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
        assert_eq!(live.values().count(), map.len());
        let cloned = live.clone();
        assert_eq!(cloned.into_entries().len(), map.len());
        // Every held key is found after all the moves.
        for (&k, h) in &map {
            assert!(same(live.remove(k), Some(*h)));
        }
        assert_eq!(live.len(), 0);
    }

    #[test]
    fn removing_the_last_and_an_absent_block() {
        let mut live = LiveBlocks::with_capacity(4);
        assert!(live.remove(1).is_none());
        live.insert(1, held(1));
        live.insert(2, held(2));
        assert!(same(live.remove(2), Some(held(2))));
        assert!(live.remove(2).is_none());
        assert!(same(live.remove(1), Some(held(1))));
        assert_eq!(live.len(), 0);
    }
}
