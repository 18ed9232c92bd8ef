//! `gpusleuth reclaim`: end the processes that keep GPU memory, safely.
//! Dry run unless `--yes`. Exit codes (docs/vram.md): 0 done or plan shown,
//! 2 memory stayed held after `--yes`, 3 every requested pid was refused.

use crate::output::fmt_bytes;
use crate::term_text::terminal_safe;
use anyhow::Context;
use sleuth_gpu::plan::{make_plan, Caller, Plan, Selection};
use sleuth_gpu::reclaim::{execute, ExecOptions, Outcome};
use sleuth_gpu::Sources;
use std::time::Duration;

/// Exit code when memory stayed held after `--yes`.
pub const EXIT_STILL_HELD: i32 = 2;
/// Exit code when nothing could be done because every requested pid was refused.
pub const EXIT_ALL_REFUSED: i32 = 3;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["pid", "orphans"])))]
pub struct Args {
    /// Pids to reclaim (a dead pid NVML still lists resolves to the processes that keep its memory).
    #[arg(long, num_args = 1.., value_name = "PID")]
    pid: Vec<u32>,
    /// Reclaim every orphaned worker (holders whose CUDA parent is gone).
    #[arg(long)]
    orphans: bool,
    /// Execute the plan (SIGTERM, wait --grace, SIGKILL), then verify the memory was released.
    #[arg(long)]
    yes: bool,
    /// Time between SIGTERM and SIGKILL (e.g. 5s, 500ms; at most 1h).
    #[arg(long, default_value = "5s", value_parser = crate::args::duration)]
    grace: Duration,
    #[command(flatten)]
    out: crate::args::JsonOutput,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    if args.grace > Duration::from_secs(3600) {
        anyhow::bail!(
            "--grace must be at most 1h, got {}",
            crate::output::fmt_ns(args.grace.as_nanos() as u64)
        );
    }
    let sources = Sources::from_env();
    if let Some(note) = &sources.seam_note {
        eprintln!("gpusleuth: {note}");
    }
    let before = sources.observe();
    let caller = Caller::current(&sources.scan.proc_root);
    let selection = if args.orphans {
        Selection::Orphans
    } else {
        Selection::Pids(args.pid.clone())
    };
    let plan = make_plan(&before.report, &before.procs, &selection, &caller);

    let outcome = if args.yes && !plan.targets.is_empty() {
        let opts = ExecOptions {
            grace: args.grace,
            ..ExecOptions::default()
        };
        Some(execute(&plan, &sources, &before, &opts))
    } else {
        None
    };
    let code = match &outcome {
        Some(o) if !o.memory_released => EXIT_STILL_HELD,
        _ if plan.targets.is_empty() && !plan.refused.is_empty() => EXIT_ALL_REFUSED,
        _ => 0,
    };

    if args.out.json {
        let doc = serde_json::json!({
            "dry_run": !args.yes,
            "nvml_available": before.report.nvml.available,
            "nvml_reason": before.report.nvml.reason,
            "plan": plan,
            "outcome": outcome,
            "exit_code": code,
        });
        outln!("{}", serde_json::to_string(&doc).context("writing JSON")?)?;
    } else {
        if let Some(why) = &before.report.nvml.reason {
            outln!("NVML not available: {why}; showing /proc holders only")?;
        }
        out!("{}", render_plan(&plan, args.yes))?;
        if let Some(o) = &outcome {
            out!("{}", render_outcome(o))?;
        }
    }
    Ok(code)
}

fn render_plan(plan: &Plan, executing: bool) -> String {
    let mut s = String::new();
    if plan.targets.is_empty() && plan.hints.is_empty() {
        s.push_str("Nothing to reclaim.\n");
    } else if plan.targets.is_empty() {
        s.push_str("Nothing this selection ends safely.\n");
    } else {
        s.push_str(if executing {
            "Reclaim plan (executing):\n"
        } else {
            "Reclaim plan (dry run; add --yes to execute):\n"
        });
        for t in &plan.targets {
            s.push_str(&format!(
                "  end pid {} ({}) [{}]: {}\n",
                t.pid,
                terminal_safe(&crate::term_text::cell(&t.cmdline_or_comm(), 200)),
                t.class.as_str(),
                t.reason
            ));
        }
        if plan.expected_free_bytes.is_empty() {
            s.push_str("  expected to free: no memory NVML attributes to these pids\n");
        }
        for (gpu, bytes) in &plan.expected_free_bytes {
            s.push_str(&format!(
                "  expected to free on GPU {gpu}: {} ({} MiB)\n",
                fmt_bytes(*bytes),
                bytes >> 20
            ));
        }
    }
    if !plan.hints.is_empty() {
        s.push_str("Held, but not ended by --orphans:\n");
        for h in &plan.hints {
            s.push_str(&format!(
                "  pid {} ({}) {}; to end it: {}\n",
                h.pid,
                terminal_safe(&h.comm),
                h.holds,
                h.command
            ));
        }
    }
    if !plan.refused.is_empty() {
        s.push_str("Refused:\n");
        for r in &plan.refused {
            s.push_str(&format!("  pid {}: {}", r.pid, r.reason));
            if let Some(hint) = &r.suggestion {
                s.push_str(&format!(" ({hint})"));
            }
            s.push('\n');
        }
    }
    s
}

fn render_outcome(o: &Outcome) -> String {
    let mut s = String::from("Result:\n");
    for r in &o.results {
        s.push_str(&format!("  pid {}: {}", r.pid, r.status));
        if let Some(d) = &r.detail {
            s.push_str(&format!(" ({d})"));
        }
        s.push('\n');
    }
    for g in &o.freed {
        s.push_str(&format!(
            "  GPU {}: freed {} MiB (used {} MiB -> {} MiB)\n",
            g.gpu,
            g.freed_bytes >> 20,
            g.used_before_bytes >> 20,
            g.used_after_bytes >> 20
        ));
    }
    if o.verified {
        s.push_str(&format!(
            "Memory released (verified: {}).\n",
            o.verification
        ));
    } else {
        s.push_str("Memory still held:\n");
        for l in &o.still_held {
            s.push_str(&format!("  {l}\n"));
        }
        if o.still_held.is_empty() {
            s.push_str("  a target was not ended (see above)\n");
        }
    }
    s
}
