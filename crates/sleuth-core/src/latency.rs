//! The latency model. A stored trace keeps every call's duration, and its
//! percentiles (`stats`) are exact. A running trace cannot keep them all: the
//! live view's percentiles and the metrics' histogram buckets both come from
//! one [`LogHistogram`] per (process, op), whose error is bounded:
//!
//! - values are kept in log-linear buckets, 16 per power of two (values
//!   below 16 ns exactly), so a bucket's width is at most 1/16 of its lower
//!   bound;
//! - a [`LogHistogram::quantile`] is the lower bound of the bucket holding
//!   that rank: at most the true value, and above 16/17 of it (under 6%
//!   low);
//! - [`LogHistogram::count_le`] counts every value at or below the bound,
//!   and may also count values of the bucket straddling it: up to 6.25%
//!   above the bound, never a value further off.

use std::collections::BTreeMap;

/// Sub-buckets per power of two (the error bound is 1 / this).
const SUB: u32 = 16;
const SUB_BITS: u32 = 4;

/// A log-linear histogram of durations in nanoseconds; memory grows with
/// the number of distinct buckets used (at most 16 per power of two).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogHistogram {
    buckets: BTreeMap<u32, u64>,
    n: u64,
}

impl LogHistogram {
    fn bucket(v: u64) -> u32 {
        if v < u64::from(SUB) {
            return v as u32;
        }
        let exp = 63 - v.leading_zeros();
        let sub = ((v >> (exp - SUB_BITS)) & u64::from(SUB - 1)) as u32;
        exp * SUB + sub
    }

    /// The smallest value of bucket `b`.
    fn lower(b: u32) -> u64 {
        if b < SUB {
            return u64::from(b);
        }
        let (exp, sub) = (b / SUB, b % SUB);
        (1u64 << exp) | (u64::from(sub) << (exp - SUB_BITS))
    }

    pub fn add(&mut self, v: u64) {
        *self.buckets.entry(Self::bucket(v)).or_default() += 1;
        self.n += 1;
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &LogHistogram) {
        for (&b, &c) in &other.buckets {
            *self.buckets.entry(b).or_default() += c;
        }
        self.n += other.n;
    }

    /// Values added.
    pub fn count(&self) -> u64 {
        self.n
    }

    /// The `q` quantile (0..=1), from below (see the module's error bound); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let rank = ((q * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (&b, &c) in &self.buckets {
            seen += c;
            if seen >= rank {
                return Self::lower(b);
            }
        }
        0
    }

    /// Values at most `bound_ns` (plus those sharing its bucket, see the module).
    pub fn count_le(&self, bound_ns: u64) -> u64 {
        self.buckets
            .range(..=Self::bucket(bound_ns))
            .map(|(_, &c)| c)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_the_bound_and_from_below() {
        let mut h = LogHistogram::default();
        for v in 1..=10_000u64 {
            h.add(v * 1000);
        }
        for (q, truth) in [(0.5, 5_000_000.0), (0.99, 9_900_000.0), (1.0, 1e7)] {
            let got = h.quantile(q) as f64;
            assert!(got <= truth, "{q}: {got}");
            assert!(got > truth * 16.0 / 17.0, "{q}: {got}");
        }
        assert_eq!(LogHistogram::default().quantile(0.5), 0);
        for v in [0u64, 1, 15, 16, 17, 1000, 1 << 40, u64::MAX] {
            let lo = LogHistogram::lower(LogHistogram::bucket(v));
            assert!(lo <= v && v - lo <= lo / u64::from(SUB), "{v}");
        }
    }

    #[test]
    fn count_le_counts_everything_below_and_nothing_far_above() {
        let mut h = LogHistogram::default();
        let values: Vec<u64> = (0..5000u64).map(|i| i * 37 + i * i).collect();
        for &v in &values {
            h.add(v);
        }
        for bound in [0u64, 15, 16, 1000, 5000, 1_000_000, 10_000_000] {
            let exact = values.iter().filter(|&&v| v <= bound).count() as u64;
            let loose = values
                .iter()
                .filter(|&&v| v as f64 <= bound as f64 * 1.0625)
                .count() as u64;
            let got = h.count_le(bound);
            assert!(
                exact <= got && got <= loose,
                "{bound}: {exact} {got} {loose}"
            );
        }
        let mut twice = h.clone();
        twice.merge(&h);
        assert_eq!(twice.count(), 2 * h.count());
        assert_eq!(twice.count_le(1000), 2 * h.count_le(1000));
    }
}
