//! The `call_sites` tool: where memory was allocated and which lines made
//! the failed and slow calls, from the stacks captured at trace time.

use crate::args;
use anyhow::{bail, Result};
use serde_json::{json, Value};
use sleuth_core::findings;
use sleuth_core::sites::{label_of, memory_by_site};
use sleuth_store::stream::{CallQuery, MemoryTrace};
use sleuth_store::ReadBudget;
use std::collections::BTreeMap;
use std::path::Path;

const SITES_DEFAULT: u32 = 20;
const SITES_MAX: u32 = 200;
/// Frames of each example stack in the answer.
const FRAMES_MAX: usize = 16;

pub fn call_sites(db: &Path, a: &args::CallSites, budget: &ReadBudget) -> Result<Value> {
    let limit = a.limit.unwrap_or(SITES_DEFAULT);
    if limit == 0 || limit > SITES_MAX {
        bail!("limit must be between 1 and {SITES_MAX} (got {limit})");
    }
    let trace = crate::trace_tools::open(db, budget)?;
    // The ledger streams (or is read from the ledger rollup); the per-site
    // tables come from the site rollup of a finished trace, else from the
    // memory calls and one pass over every call.
    let mut mt = MemoryTrace::open(&trace, a.pid, budget.clone())?;
    let ledgers = mt.ledgers(None)?;
    let (by_site, stored_calls) = match (mt.stored_sites()?, mt.stored_calls_by_site()?) {
        (Some(m), Some(c)) => (m, Some(c)),
        _ => {
            mt.load_memory_calls(None)?;
            (memory_by_site(&mt.base, &ledgers), None)
        }
    };
    let data = &mt.base;
    let memory: Vec<Value> = by_site
        .into_iter()
        .take(limit as usize)
        .map(|s| {
            let frames: Vec<String> = s
                .example_stack
                .and_then(|id| data.stacks.get(&id))
                .map(|st| {
                    st.frames
                        .iter()
                        .take(FRAMES_MAX)
                        .map(|f| f.label())
                        .collect()
                })
                .unwrap_or_default();
            let mut v = serde_json::to_value(&s).unwrap_or(Value::Null);
            v["stack"] = json!(frames);
            v
        })
        .collect();
    // Failed and slow calls by (site, op): what went wrong where.
    let other: BTreeMap<(String, &'static str), (u64, u64, u64)> = match stored_calls {
        Some(c) => c
            .into_iter()
            .map(|(k, v)| (k, (v.calls, v.errors, v.total_ns)))
            .collect(),
        None => {
            let mut other = BTreeMap::new();
            // Every call is read once, in order, and only its sums are kept.
            mt.rows().for_each_call::<sleuth_store::StoreError>(
                &CallQuery {
                    pid: a.pid,
                    ..Default::default()
                },
                |s| {
                    let c = &s.call;
                    if c.stack_id.is_some() {
                        let e: &mut (u64, u64, u64) = other
                            .entry((label_of(data, c.stack_id), c.op_name()))
                            .or_default();
                        e.0 += 1;
                        e.1 += c.failed() as u64;
                        e.2 += c.dur_ns;
                    }
                    Ok(())
                },
            )?;
            other
        }
    };
    let mut calls: Vec<Value> = other
        .into_iter()
        .map(|((site, op), (n, errors, total_ns))| {
            json!({"site": site, "op": op, "calls": n, "errors": errors, "total_ns": total_ns})
        })
        .collect();
    calls.sort_by_key(|v| std::cmp::Reverse(v["total_ns"].as_u64().unwrap_or(0)));
    calls.truncate(limit as usize);
    let failed: Vec<Value> = ledgers
        .iter()
        .flat_map(|l| l.failed_allocs.iter())
        .take(limit as usize)
        .map(|f| json!({"op": f.op, "bytes": f.bytes, "error": findings::error_name(f.error), "site": f.site}))
        .collect();
    Ok(json!({
        "units": "bytes and ns; a site is `file:line function` (Python) or `function (library)` (native)",
        "captured": !data.stacks.is_empty(),
        "memory_by_site": memory,
        "calls_by_site": calls,
        "failed_allocations": failed,
    }))
}
