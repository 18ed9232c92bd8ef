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
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if let Some(n) = too_large(&v) {
        return Err(format!("a value no trace holds ({n})"));
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// The first number of `v` past [`MAX_STORED_VALUE`] either way.
fn too_large(v: &Value) -> Option<String> {
    match v {
        Value::Number(n) => {
            let big = n.as_u64().is_some_and(|u| u > MAX_STORED_VALUE)
                || n.as_i64()
                    .is_some_and(|i| i.unsigned_abs() > MAX_STORED_VALUE)
                || n.as_f64()
                    .is_some_and(|f| f.abs() > MAX_STORED_VALUE as f64);
            big.then(|| n.to_string())
        }
        Value::Array(a) => a.iter().find_map(too_large),
        Value::Object(o) => o.values().find_map(too_large),
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
}
