//! A hasher for the small integer keys the trace writer looks up once per
//! stored event (a histogram bucket's index, a (pid, op id) pair).
//!
//! std's default SipHash resists keys chosen to collide, at a cost that was
//! most of the lookup; these keys cannot be chosen that way: a bucket index
//! is below 2^16 (`rollup::bucket_of` of any u64), an op id is ours and a
//! pid comes from the kernel. A multiply-rotate mix (FxHash's) spreads
//! consecutive integers over both the low bits (the table slot) and the
//! high bits (the control byte) of the hash.

use std::hash::{BuildHasherDefault, Hasher};

/// Odd constant with well-mixed bits (2^64 / the golden ratio).
const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// See the module's comment.
#[derive(Debug, Default, Clone, Copy)]
pub struct IntHasher(u64);

impl IntHasher {
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
    }
}

impl Hasher for IntHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(u64::from(b));
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.add(u64::from(v));
    }
    fn write_u16(&mut self, v: u16) {
        self.add(u64::from(v));
    }
    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The `HashMap` state for [`IntHasher`].
pub type IntHashState = BuildHasherDefault<IntHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::hash::BuildHasher;

    #[test]
    fn consecutive_keys_take_distinct_slots_and_control_bytes() {
        let s = IntHashState::default();
        let slots: std::collections::BTreeSet<u64> =
            (0u32..4096).map(|k| s.hash_one(k) & 4095).collect();
        assert_eq!(slots.len(), 4096, "low bits are a bijection of small keys");
        let tags: std::collections::BTreeSet<u64> =
            (0u32..4096).map(|k| s.hash_one(k) >> 57).collect();
        assert!(tags.len() > 100, "high bits vary: {} tags", tags.len());
    }

    #[test]
    fn a_map_with_it_behaves_as_any_map() {
        let mut m: HashMap<(u32, u16), u64, IntHashState> = HashMap::default();
        for pid in 0..50u32 {
            for op in 0..20u16 {
                *m.entry((pid, op)).or_default() += u64::from(pid) * 100 + u64::from(op);
            }
        }
        assert_eq!(m.len(), 1000);
        assert_eq!(m[&(49, 19)], 4919);
    }
}
