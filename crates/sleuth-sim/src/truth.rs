//! Reading the workload's `--truth` file (one JSON object per process).

use crate::{Alloc, Truth};
use serde_json::Value;
use std::collections::BTreeMap;

fn counts(v: &Value) -> BTreeMap<String, u64> {
    v.as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_u64().map(|n| (k.clone(), n)))
                .collect()
        })
        .unwrap_or_default()
}

fn field_u64(v: &Value, name: &str) -> Result<u64, String> {
    v.get(name)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("truth line lacks '{name}'"))
}

/// Parses a truth file's text: one [`Truth`] per line, in the order the
/// processes exited.
pub fn parse_truth(text: &str) -> Result<Vec<Truth>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value =
                serde_json::from_str(line).map_err(|e| format!("bad truth line: {e}: {line}"))?;
            let allocs = v
                .get("allocs")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|x| Alloc {
                            op: x["op"].as_str().unwrap_or_default().to_string(),
                            size: x["size"].as_u64().unwrap_or_default(),
                            ptr: x["ptr"].as_u64().unwrap_or_default(),
                            ret: x["ret"].as_i64().unwrap_or_default(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            Ok(Truth {
                pid: field_u64(&v, "pid")? as u32,
                ppid: field_u64(&v, "ppid")? as u32,
                exit_code: v.get("exit_code").and_then(Value::as_i64).unwrap_or(0) as i32,
                runtime: counts(&v["runtime"]),
                driver: counts(&v["driver"]),
                allocs,
            })
        })
        .collect()
}
