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
}
