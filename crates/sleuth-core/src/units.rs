//! The one way gpusleuth writes byte counts and durations for people. Every
//! human output (CLI text, findings' summaries, the HTML report, MCP text)
//! uses these two, so the same quantity reads the same everywhere.

/// Nanoseconds with a unit read at a glance: `999ns`, `1.5us`, `2.50ms`, `1.234s`.
pub fn fmt_ns(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}us", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", ns as f64 / 1e6)
    } else {
        format!("{:.3}s", ns as f64 / 1e9)
    }
}

/// A byte count in binary units: exact bytes below 1 KiB (`0 B`, `512 B`),
/// else one decimal (`1.5 KiB`, `3.0 MiB`, `909.5 TiB`).
pub fn fmt_bytes(b: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(fmt_ns(0), "0ns");
        assert_eq!(fmt_ns(999), "999ns");
        assert_eq!(fmt_ns(1_500), "1.5us");
        assert_eq!(fmt_ns(2_500_000), "2.50ms");
        assert_eq!(fmt_ns(1_234_000_000), "1.234s");
    }

    #[test]
    fn bytes() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_bytes(3 << 20), "3.0 MiB");
        assert_eq!(fmt_bytes(3 << 30), "3.0 GiB");
        // The allocation of 1e15 bytes that issue 14 saw written two ways.
        assert_eq!(fmt_bytes(1_000_000_000_000_000), "909.5 TiB");
        assert_eq!(fmt_bytes(u64::MAX), "16384.0 PiB");
    }
}
