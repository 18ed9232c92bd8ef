//! The aggregates stored as JSON in a trace (the finding rollups, the
//! threads' splits) are the writer's, but a file may be crafted: a value no
//! trace can hold (a sum of nanoseconds past 2^62, the bound of every
//! time and duration a reader accepts) made the findings' arithmetic
//! overflow (a panic in a debug build, a wrapped sum in a release build).
//! Such a row is refused as damaged before it is used.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// The largest number a stored aggregate may hold (as call times and
/// durations, `problems::MAX_NS`-like): sums of a file's durations are
/// refused past it as well.
const MAX_STORED_VALUE: u64 = 1 << 62;

/// Parses one stored aggregate: an error (the reader's "damaged" message)
/// for JSON that does not parse as `T` or holds a number past 2^62.
pub(crate) fn parse<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    parse_except(text, &[])
}

/// [`parse`], the values of object members named in `labels` left
/// unchecked: numbers that label rather than count (a stack id is a 64-bit
/// hash of the frames; a failed call's status is what the library
/// returned), which no reader adds up. They still parse as their type.
pub(crate) fn parse_except<T: DeserializeOwned>(text: &str, labels: &[&str]) -> Result<T, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if let Some(n) = too_large(&v, labels) {
        return Err(format!("a value no trace holds ({n})"));
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// The first number of `v` past [`MAX_STORED_VALUE`] either way, outside
/// the members named in `labels`.
fn too_large(v: &Value, labels: &[&str]) -> Option<String> {
    match v {
        Value::Number(n) => {
            let big = n.as_u64().is_some_and(|u| u > MAX_STORED_VALUE)
                || n.as_i64()
                    .is_some_and(|i| i.unsigned_abs() > MAX_STORED_VALUE)
                || n.as_f64()
                    .is_some_and(|f| f.abs() > MAX_STORED_VALUE as f64);
            big.then(|| n.to_string())
        }
        Value::Array(a) => a.iter().find_map(|x| too_large(x, labels)),
        Value::Object(o) => o
            .iter()
            .filter(|(k, _)| !labels.contains(&k.as_str()))
            .find_map(|(_, x)| too_large(x, labels)),
        _ => None,
    }
}

/// Whether `v`, serialized, reads back through [`parse_except`] with the
/// same `labels` as far as its numbers go (none past [`MAX_STORED_VALUE`]
/// outside a label's member), checked on the serializer's output as it
/// comes rather than on a held copy: the writer stores an aggregate built
/// from what a traced program handed it (an allocator block's size word, a
/// request of any size) only when a reader would accept it, and otherwise
/// leaves the readers to rebuild it. Stricter than the reader in one way:
/// a label's member is exempt only when it holds a number itself.
pub(crate) fn readable<T: serde::Serialize>(v: &T, labels: &[&str]) -> bool {
    let mut scan = Scan {
        labels,
        ..Default::default()
    };
    serde_json::to_writer(&mut scan, v).is_ok() && scan.end_number() && !scan.refused
}

/// The state of [`readable`]'s pass over compact JSON text.
#[derive(Default)]
struct Scan<'a> {
    labels: &'a [&'a str],
    in_string: bool,
    escaped: bool,
    /// The string being read (its first bytes: a longer one is no label).
    string: Vec<u8>,
    /// The last string read, and the key a value after `:` belongs to.
    last_string: Vec<u8>,
    key: Vec<u8>,
    /// The last byte outside strings.
    prev: u8,
    number: Vec<u8>,
    number_exempt: bool,
    refused: bool,
}

/// Longer strings are not compared with the labels.
const LABEL_BYTES: usize = 64;

impl Scan<'_> {
    /// Judges the number just read, if any; false once one was refused.
    fn end_number(&mut self) -> bool {
        if !self.number.is_empty() && !self.number_exempt {
            let text = std::str::from_utf8(&self.number).unwrap_or("x");
            let fits = if text.contains(['.', 'e', 'E']) {
                text.parse::<f64>()
                    .is_ok_and(|f| f.abs() <= MAX_STORED_VALUE as f64)
            } else {
                text.parse::<i128>()
                    .is_ok_and(|n| n.unsigned_abs() <= MAX_STORED_VALUE as u128)
            };
            self.refused |= !fits;
        }
        self.number.clear();
        !self.refused
    }

    fn byte(&mut self, b: u8) {
        if self.in_string {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => {
                    self.in_string = false;
                    self.last_string = std::mem::take(&mut self.string);
                    self.prev = b;
                    return;
                }
                _ => {}
            }
            if self.string.len() <= LABEL_BYTES {
                self.string.push(b);
            }
            return;
        }
        // A number starts with a sign or a digit (the `e` of `true` is none).
        let starts = matches!(b, b'-' | b'0'..=b'9');
        let goes_on = !self.number.is_empty() && matches!(b, b'+' | b'.' | b'e' | b'E');
        if starts || goes_on {
            if self.number.is_empty() {
                self.number_exempt =
                    self.prev == b':' && self.labels.iter().any(|l| l.as_bytes() == self.key);
            }
            self.number.push(b);
            return;
        }
        self.end_number();
        match b {
            b'"' => {
                self.in_string = true;
                self.string.clear();
            }
            b':' => self.key = std::mem::take(&mut self.last_string),
            _ => {}
        }
        if !b.is_ascii_whitespace() {
            self.prev = b;
        }
    }
}

impl std::io::Write for Scan<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for &b in buf {
            self.byte(b);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_2_62_are_refused_others_read() {
        let ok: Vec<u64> = parse("[0, 4611686018427387904]").unwrap();
        assert_eq!(ok, vec![0, 1 << 62]);
        for bad in [
            "[4611686018427387905]",
            "{\"a\": {\"b\": [18446744073709551615]}}",
            "[-4611686018427387905]",
            "[1e300]",
        ] {
            let e = parse::<Value>(bad).unwrap_err();
            assert!(e.contains("no trace holds"), "{bad}: {e}");
        }
        assert!(parse::<Vec<u64>>("[1, \"x\"]").is_err());
    }

    /// A label's member may hold any value of its type, at any depth; the
    /// same number elsewhere (a sibling, the label's name on an array) is
    /// still refused.
    #[test]
    fn labels_are_left_unchecked_and_only_they() {
        let text = r#"{"unfreed": [{"stack_id": 18446744073709551615, "bytes": 1}]}"#;
        assert!(parse::<Value>(text).is_err());
        let v: Value = parse_except(text, &["stack_id"]).unwrap();
        assert_eq!(v["unfreed"][0]["stack_id"], u64::MAX);
        for bad in [
            r#"{"unfreed": [{"stack_id": 1, "bytes": 18446744073709551615}]}"#,
            r#"{"stack_ids": [18446744073709551615]}"#,
        ] {
            let e = parse_except::<Value>(bad, &["stack_id"]).unwrap_err();
            assert!(e.contains("no trace holds"), "{bad}: {e}");
        }
    }

    /// What the writer's check on a serializer's output accepts is what
    /// the reader accepts: numbers at the bound and past it, either sign,
    /// floats, at any depth, beside strings that look like numbers or
    /// keys, and a label's own number.
    #[test]
    fn the_writers_check_accepts_what_the_reader_accepts() {
        let labels = ["stack_id"];
        for text in [
            "[0, 4611686018427387904]",
            "[4611686018427387905]",
            "[-4611686018427387904]",
            "[-4611686018427387905]",
            "{\"a\": {\"b\": [18446744073709551615]}}",
            "{\"a\": 0.99, \"b\": 1e300}",
            "{\"a\": 0.99, \"b\": -2.5e3, \"c\": true, \"d\": [false, null, 1E+5]}",
            "[true, 4611686018427387905, false]",
            "{\"stack_id\": 18446744073709551615, \"x\": \"18446744073709551615\"}",
            "{\"stack_id\": 1, \"bytes\": 18446744073709551615}",
            "{\"stack_ids\": 18446744073709551615}",
            "{\"k\\\"stack_id\": 18446744073709551615}",
            "{\"why\": \"stack_id\", \"n\": [1, 2, 3]}",
            "{\"s\": \"a \\\"quoted\\\" \\\\\", \"stack_id\": 9223372036854775808}",
        ] {
            let v: Value = serde_json::from_str(text).unwrap();
            let reader = parse_except::<Value>(text, &labels).is_ok();
            assert_eq!(readable(&v, &labels), reader, "{text}");
        }
    }
}
