//! What the unit tests of several modules share: the millisecond in trace
//! nanoseconds, and the deterministic pseudo-random sequence the
//! property-style tests sweep with (xorshift64: the same seed gives the same
//! cases on every run).

/// One millisecond, in the nanoseconds every timestamp is kept in.
pub(crate) const MS: u64 = 1_000_000;

/// Successive xorshift64 values from `seed` (which must not be 0).
pub(crate) fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}
