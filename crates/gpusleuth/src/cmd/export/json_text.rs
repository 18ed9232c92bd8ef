//! JSON tokens written straight into a buffer, byte for byte as
//! `serde_json` writes them: a Perfetto export's elements are mostly call
//! slices, and through serde's derived path its serializer thread took a
//! third of the export's samples, half of them formatting floats
//! shortest, escaping strings and writing map keys (perf, the bench's
//! 10M-call trace on the 2-vCPU development VM; docs/benchmarks.md,
//! round 44).

/// Below this many nanoseconds, `ns as f64 / 1e3` written shortest (as
/// `serde_json` does) is the decimal `ns / 1000` itself: `ns` is exact as an
/// f64, the division rounds to the double nearest that decimal, and every
/// other decimal of as few digits is at least 0.001 away from it, farther
/// than half a double's step there (under 2^-13 below 10^12). At or past it
/// (11.6 days), the float is formatted.
const EXACT_MICROS_BELOW_NS: u64 = 1_000_000_000_000_000;

/// `ns` as fractional microseconds: what `serde_json` writes for
/// `ns as f64 / 1e3` ("1234.567", "0.5", "12.0").
pub(super) fn push_micros(buf: &mut Vec<u8>, ns: u64) {
    if ns >= EXACT_MICROS_BELOW_NS {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *buf, &(ns as f64 / 1e3));
        return;
    }
    push_int(buf, ns / 1000);
    buf.push(b'.');
    let frac = ns % 1000;
    if frac == 0 {
        buf.push(b'0');
        return;
    }
    let digits = [
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ];
    let kept = match (digits[1], digits[2]) {
        (_, d) if d != b'0' => 3,
        (d, _) if d != b'0' => 2,
        _ => 1,
    };
    buf.extend_from_slice(&digits[..kept]);
}

/// An integer, as `serde_json` writes it (through the same `itoa`).
pub(super) fn push_int(buf: &mut Vec<u8>, v: impl itoa::Integer) {
    buf.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// `v`, or `null` when absent (an `Option` field serde writes).
pub(super) fn push_opt_u64(buf: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => push_int(buf, v),
        None => buf.extend_from_slice(b"null"),
    }
}

/// A JSON string: as is between quotes when no byte needs an escape
/// (serde_json escapes the quote, the backslash and control bytes, and
/// writes everything else, UTF-8 included, as it is), else through
/// `serde_json`.
pub(super) fn push_str(buf: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    } else {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *buf, s);
    }
}

/// `v` as `"0x…"` (lower-case hex), as `format!("{v:#x}")`.
pub(super) fn push_hex(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(b"\"0x");
    let digits = (64 - v.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        buf.push(b"0123456789abcdef"[(v >> (4 * i) & 0xf) as usize]);
    }
    buf.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn micros(ns: u64) -> String {
        let mut b = Vec::new();
        push_micros(&mut b, ns);
        String::from_utf8(b).unwrap()
    }

    fn serde_micros(ns: u64) -> String {
        serde_json::to_string(&(ns as f64 / 1e3)).unwrap()
    }

    /// A small deterministic generator (xorshift), no crate needed.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn micros_are_what_serde_json_writes_for_the_float() {
        let mut edges = vec![0, 1, 9, 10, 99, 100, 101, 110, 999, 1000, 1001, 1010, 1100];
        for p in 0..20u32 {
            let t = 10u64.pow(p);
            edges.extend([
                t.saturating_sub(1),
                t,
                t + 1,
                t + 500,
                t.saturating_sub(500),
            ]);
        }
        for k in [1u64 << 52, 1 << 53, (1 << 53) + 1, u64::MAX, u64::MAX - 999] {
            edges.push(k);
        }
        edges.extend([
            EXACT_MICROS_BELOW_NS - 1,
            EXACT_MICROS_BELOW_NS,
            EXACT_MICROS_BELOW_NS - 999,
            EXACT_MICROS_BELOW_NS + 1,
        ]);
        for ns in edges {
            assert_eq!(micros(ns), serde_micros(ns), "ns {ns}");
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for shift in [0, 4, 10, 14, 20, 24, 30, 34, 40, 44, 48, 50, 54, 60] {
            for _ in 0..20_000 {
                let ns = next(&mut s) >> shift;
                assert_eq!(micros(ns), serde_micros(ns), "ns {ns}");
            }
        }
    }

    #[test]
    fn integers_strings_and_hex_are_what_serde_json_writes() {
        let mut b = Vec::new();
        for v in [0u64, 7, 10, 4_294_967_296, u64::MAX] {
            b.clear();
            push_int(&mut b, v);
            assert_eq!(b, serde_json::to_vec(&v).unwrap());
            b.clear();
            push_hex(&mut b, v);
            assert_eq!(b, serde_json::to_vec(&format!("{v:#x}")).unwrap());
        }
        for v in [None, Some(0u64), Some(u64::MAX)] {
            b.clear();
            push_opt_u64(&mut b, v);
            assert_eq!(b, serde_json::to_vec(&v).unwrap());
        }
        for v in [0i64, -1, 2, i64::MIN, i64::MAX] {
            b.clear();
            push_int(&mut b, v);
            assert_eq!(b, serde_json::to_vec(&v).unwrap());
        }
        for s in [
            "",
            "cudaMalloc",
            "a \"quoted\" \\ path",
            "tab\there\nnew\u{1b}[31m",
            "ünïcödé → 🚀",
            "\u{7f}del",
        ] {
            b.clear();
            push_str(&mut b, s);
            assert_eq!(b, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }
}
