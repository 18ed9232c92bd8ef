//! Reading `vram`/`reclaim` JSON in the tests that drive them.
#![allow(dead_code)] // each test file uses a different subset

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Output;

#[path = "../common/skip.rs"]
mod skip;
#[allow(unused_imports)] // not every test file that includes this module skips
pub use skip::skipped;

/// A command's stdout as JSON, or a panic showing what it printed instead.
pub fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout={} stderr={}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A command's stdout as JSON once its exit code is the expected one; a wrong
/// code shows both outputs (a refusal's reasons are on stdout, a crash's on stderr).
pub fn json_exit(out: &Output, code: i32) -> Value {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout={} stderr={}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    json(out)
}

/// The pids a `reclaim --json` plan would signal, in plan order.
pub fn target_pids(doc: &Value) -> Vec<u64> {
    doc["plan"]["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter_map(|t| t["pid"].as_u64())
        .collect()
}

/// pid → reason of every refusal in a `reclaim --json` plan.
pub fn refusals(doc: &Value) -> BTreeMap<u64, String> {
    by_pid(&doc["plan"]["refused"], "reason")
}

/// pid → class from a `vram --json` report.
pub fn classes(report: &Value) -> BTreeMap<u64, String> {
    by_pid(&report["holders"], "class")
}

/// pid → the string `field` of each entry of the JSON array `list`.
fn by_pid(list: &Value, field: &str) -> BTreeMap<u64, String> {
    list.as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .iter()
        .map(|e| {
            (
                e["pid"].as_u64().expect("pid"),
                e[field]
                    .as_str()
                    .unwrap_or_else(|| panic!("no {field}: {e}"))
                    .to_string(),
            )
        })
        .collect()
}

/// The holder entry of `pid` in a `vram --json` report.
pub fn holder(report: &Value, pid: u32) -> &Value {
    report["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|h| h["pid"].as_u64() == Some(pid as u64))
        .unwrap_or_else(|| panic!("pid {pid} not in report: {report}"))
}
