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
    if db.is_dir() {
        return call_sites_of_run(db, a, limit, budget);
    }
    let trace = crate::trace_tools::open(db, budget)?;
    // The ledger streams (or is read from the ledger rollup); the per-site
    // tables come from the site rollup of a finished trace, else from the
    // memory calls and one pass over every call.
    let mut mt = MemoryTrace::open(&trace, a.pid, budget.clone())?;
    let ledgers = mt.ledgers(None)?;
    let by_site = match mt.stored_sites()? {
        Some(m) => m,
        None => {
            mt.load_memory_calls(None)?;
            memory_by_site(&mt.base, &ledgers)
        }
    };
    let calls = calls_by_site(&mt, a.pid)?;
    Ok(answer(by_site, &mt.base, calls, &ledgers, limit))
}

/// `call_sites` of a run's directory: the run's per-site table
/// (`run_report::load_sites`: allocations added up over the files, unfreed
/// from the run's ledger, no bytes at the peak), each file's calls by site
/// and op added up (labels, `file:line function`, are the same in every
/// file), the failed allocations of the run's ledger.
fn call_sites_of_run(
    dir: &Path,
    a: &args::CallSites,
    limit: u32,
    budget: &ReadBudget,
) -> Result<Value> {
    let mut calls: Calls = BTreeMap::new();
    let (run, by_site) = sleuth_store::run_report::load_sites_with(
        dir,
        a.pid,
        budget.clone(),
        crate::trace_tools::memo(),
        |_, view| {
            for (k, (n, errors, total)) in calls_by_site(view, a.pid)? {
                let e = calls.entry(k).or_default();
                (e.0, e.1, e.2) = (e.0 + n, e.1 + errors, e.2.saturating_add(total));
            }
            Ok(())
        },
    )?;
    let mut v = answer(by_site, &run.data, calls, &run.ledgers, limit);
    v["files"] = json!(sleuth_store::run::file_names(&run.files));
    let mut notes: Vec<String> = run.ledger_note.iter().cloned().collect();
    notes.push(format!(
        "memory_by_site: {}",
        sleuth_store::run_report::SITES_NOTE
    ));
    notes.extend(crate::run_tools::unfinished_notes(&run.incomplete, false));
    v["notes"] = json!(notes);
    Ok(v)
}

/// Recorded calls by (site label, op): how many, how many failed, their time.
type Calls = BTreeMap<(String, &'static str), (u64, u64, u64)>;

/// One trace's calls by site and op: from its site rollup, else from one
/// pass over every call (only its sums kept).
fn calls_by_site(mt: &MemoryTrace, pid: Option<u32>) -> Result<Calls, sleuth_store::StoreError> {
    if let Some(c) = mt.stored_calls_by_site()? {
        return Ok(c
            .into_iter()
            .map(|(k, v)| (k, (v.calls, v.errors, v.total_ns)))
            .collect());
    }
    let data = &mt.base;
    let mut other = BTreeMap::new();
    mt.rows().for_each_call::<sleuth_store::StoreError>(
        &CallQuery {
            pid,
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
    Ok(other)
}

/// The answer: the `limit` sites holding the most memory (each with its
/// example stack's frames), the calls by site slowest in total first, the
/// failed allocations of `ledgers`.
fn answer(
    by_site: Vec<sleuth_core::sites::SiteMemory>,
    data: &sleuth_core::TraceData,
    other: Calls,
    ledgers: &[sleuth_core::ledger::ProcessLedger],
    limit: u32,
) -> Value {
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
    json!({
        "units": "bytes and ns; a site is `file:line function` (Python) or `function (library)` (native)",
        "captured": !data.stacks.is_empty(),
        "memory_by_site": memory,
        "calls_by_site": calls,
        "failed_allocations": failed,
    })
}
