//! The one way gpusleuth writes byte counts and durations for people, and
//! the one way it reads them back. Every human output (CLI text, findings'
//! summaries, the HTML report, MCP text) uses the formatters, and every
//! command-line option that takes a time or a size uses the parsers, so the
//! same quantity reads and is written the same everywhere.
//!
//! Durations always carry a unit (`1.5s`, `250ms`, `40us`, `2m`): a bare
//! number is refused with a hint, because `5` meant seconds to one option
//! and nanoseconds to another. Only `0` needs no unit. Sizes are bytes
//! unless suffixed (`512M`, `2G`, `64KiB`), since bytes are the only unit a
//! bare size could mean.

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

/// Units a duration may be written in, nanoseconds per unit.
const DURATION_UNITS: [(&str, f64); 8] = [
    ("ns", 1.0),
    ("us", 1e3),
    ("µs", 1e3),
    ("ms", 1e6),
    ("s", 1e9),
    ("m", 60e9),
    ("min", 60e9),
    ("h", 3600e9),
];

/// Parses a duration with a unit into nanoseconds: `1.5s`, `250ms`, `40us`,
/// `2m`, `1h`, `500ns`, or `0`. A bare number other than 0 is refused with
/// the spelling to use instead. A leading `+` or `.` (`+1s`, `.5s`) and
/// blanks between the number and its unit (`"1 s"`, one argument) are
/// accepted: none of them can be read as another duration.
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (write e.g. 1.5s, 250ms, 40us, 2m)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("'{s}' is not a non-negative duration"));
    }
    let unit = unit.trim();
    if unit.is_empty() {
        if value == 0.0 {
            return Ok(0);
        }
        return Err(format!(
            "'{s}' has no unit: write {num}s for seconds (or {num}ms, {num}us, {num}ns)"
        ));
    }
    let scale = DURATION_UNITS
        .iter()
        .find(|(u, _)| *u == unit)
        .map(|(_, k)| *k)
        .ok_or_else(|| format!("'{s}': unknown unit '{unit}' (use ns, us, ms, s, m or h)"))?;
    let ns = (value * scale).round();
    if ns >= u64::MAX as f64 {
        return Err(format!("'{s}' is too long"));
    }
    Ok(ns as u64)
}

/// Parses a size into bytes: `512M`, `2G`, `64K`, `1.5GiB`, `8MB` (binary
/// multiples either way), or plain bytes. Must be at least one byte.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches(['B', 'b', 'i']);
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        Some('T' | 't') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 512M, 2G)"))?;
    let bytes = v * mult as f64;
    // At least one byte: `0.5G` is 512 MiB (round 55's docs tester: refused
    // as "not a positive size").
    if !v.is_finite() || bytes < 1.0 {
        return Err(format!("'{s}' is not a positive size"));
    }
    if bytes >= u64::MAX as f64 {
        return Err(format!("'{s}' is too large"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_every_unit() {
        assert_eq!(parse_duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration_ns(" 250ms "), Ok(250_000_000));
        assert_eq!(parse_duration_ns("40us"), Ok(40_000));
        assert_eq!(parse_duration_ns("40µs"), Ok(40_000));
        assert_eq!(parse_duration_ns("500ns"), Ok(500));
        assert_eq!(parse_duration_ns("2m"), Ok(120_000_000_000));
        assert_eq!(parse_duration_ns("2min"), Ok(120_000_000_000));
        assert_eq!(parse_duration_ns("1h"), Ok(3_600_000_000_000));
        assert_eq!(parse_duration_ns("0"), Ok(0));
        assert_eq!(parse_duration_ns("0ms"), Ok(0));
    }

    #[test]
    fn spellings_that_mean_one_duration_are_read_as_it() {
        assert_eq!(parse_duration_ns(".5s"), Ok(500_000_000));
        assert_eq!(parse_duration_ns("+1s"), Ok(1_000_000_000));
        assert_eq!(parse_duration_ns("1 s"), Ok(1_000_000_000));
        for bad in [
            "1e3ms", "1 2s", "s", "1s s", "--1s", "1.2.3s", "nans", "infs",
        ] {
            assert!(parse_duration_ns(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bare_number_is_refused_with_the_spelling_to_use() {
        let e = parse_duration_ns("1.5").unwrap_err();
        assert!(e.contains("no unit") && e.contains("write 1.5s"), "{e}");
        assert!(parse_duration_ns("5").unwrap_err().contains("write 5s"));
    }

    #[test]
    fn bad_durations_are_refused() {
        for bad in [
            "",
            "s",
            "-1s",
            "1.5 parsecs",
            "1e999s",
            "nan",
            "1x",
            "99999999999h",
        ] {
            assert!(parse_duration_ns(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("8MB"), Ok(8 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        // A fraction of a unit is that many bytes.
        assert_eq!(parse_size("0.5G"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        for bad in ["", "0", "-1M", "lots", "1e30T", "0.5", "0.0000001K"] {
            assert!(parse_size(bad).is_err(), "{bad} accepted");
        }
    }

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
