//! The live GPU tools: who holds GPU memory now, and the reclaim plan. Thin
//! calls into sleuth-gpu, the same code `gpusleuth vram` / `reclaim` use.

use crate::args;
use anyhow::{bail, Result};
use serde_json::{json, Value};
use sleuth_gpu::{execute, make_plan, Caller, ExecOptions, Selection, Sources};

/// NVML devices and every process holding GPU memory, classified.
pub fn gpu_holders(sources: &Sources) -> Result<Value> {
    let obs = sources.observe();
    Ok(json!({ "units": "bytes", "report": obs.report }))
}

/// The reclaim plan for `a.pids` (or every orphaned holder); executed only
/// when the server allows it AND the caller asks for it.
pub fn reclaim_plan(sources: &Sources, a: &args::Reclaim, allow_reclaim: bool) -> Result<Value> {
    let execute_requested = a.execute.unwrap_or(false);
    if execute_requested && !allow_reclaim {
        bail!("execute=true refused: the server was not started with --allow-reclaim (call without execute for the dry-run plan)");
    }
    let selection = match &a.pids {
        Some(pids) if !pids.is_empty() => Selection::Pids(pids.clone()),
        _ => Selection::Orphans,
    };
    let obs = sources.observe();
    let caller = Caller::current(&sources.scan.proc_root);
    let plan = make_plan(&obs.report, &obs.procs, &selection, &caller);
    if !execute_requested {
        return Ok(json!({
            "executed": false,
            "execution_allowed": allow_reclaim,
            "plan": plan,
        }));
    }
    let outcome = execute(&plan, sources, &obs, &ExecOptions::default());
    Ok(json!({ "executed": true, "plan": plan, "outcome": outcome }))
}
