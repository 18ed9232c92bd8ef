//! `gpusleuth merge NODE1.db NODE2.db ... -o JOB.db`: one trace of a
//! distributed job from per-node traces.
//!
//! Clocks: every node's timestamps are its own monotonic clock; its session
//! records the offset to its wall clock. Node n's times are moved by
//! (its offset - the first node's offset), which is exact when the nodes'
//! wall clocks agree. What remains (NTP error, a wrong clock) is measured
//! from collective alignment (`sleuth_core::nccl::align`) and subtracted when
//! enough blocking rendezvous were seen (`--no-align` keeps the session
//! offsets only). Pids that collide with an earlier node's are moved by
//! node × 2^22 (above Linux's pid_max); `process_nodes` keeps the real ones.

use crate::load::FORCE_HINT;
use anyhow::{bail, Context};
use serde::Serialize;
use sleuth_core::nccl::align::{estimate, Alignment};
use sleuth_core::nccl::NcclEvent;
use sleuth_store::{input_facts, write_merged, InputFacts, MergeInput};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Pids of node n move by n << PID_SHIFT when they collide (Linux pid_max ≤ 2^22).
const PID_SHIFT: u32 = 22;

/// The most traces one merge takes: node n's pids move by n × 2^22 and
/// must stay below 2^32 (pids are 32-bit), so nodes 0 to 1023. Node 1024's
/// offset wrapped to 0 and its pids were taken for node 0's.
const MAX_NODES: usize = 1 << (32 - PID_SHIFT);

#[derive(clap::Args)]
pub struct Args {
    /// Per-node trace databases of one job (the first one's clock is the merged clock).
    #[arg(required = true, num_args = 2..)]
    inputs: Vec<PathBuf>,
    /// The merged trace to create.
    #[arg(short, long)]
    output: PathBuf,
    /// Replace the output if it exists.
    #[arg(long)]
    force: bool,
    /// Use the session clock offsets only (do not correct the skew measured from collectives).
    #[arg(long)]
    no_align: bool,
    #[command(flatten)]
    out: crate::args::JsonOutput,
}

#[derive(Serialize)]
struct NodeReport {
    source: String,
    hostname: String,
    shift_ns: i64,
    /// Measured from collective alignment (this node's clock minus the first's).
    skew: Option<Alignment>,
    skew_applied: bool,
    pid_offset: u32,
}

/// One file given twice (by the same name or another) would be merged as
/// two nodes, every call counted twice.
fn refuse_repeated_inputs(inputs: &[PathBuf]) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let mut seen: Vec<((u64, u64), &PathBuf)> = Vec::new();
    for p in inputs {
        let m = std::fs::metadata(p).with_context(|| p.display().to_string())?;
        let id = (m.dev(), m.ino());
        if let Some((_, first)) = seen.iter().find(|(i, _)| *i == id) {
            bail!(
                "{} and {} are the same file: give each node's trace once",
                first.display(),
                p.display()
            );
        }
        seen.push((id, p));
    }
    Ok(())
}

/// A file its tracer did not complete has no session end and its
/// kernel-counted launches only in its samples: merged as it is, the
/// merged windows would end before its calls and those launches would be
/// lost. A tracer still writing it is named (wait for it); else `gpusleuth
/// finish` completes it (the store's words).
fn refuse_unfinished(path: &std::path::Path, facts: &InputFacts) -> anyhow::Result<()> {
    let Some(why) = &facts.unfinished else {
        return Ok(());
    };
    if let Some((pid, comm)) = crate::finishing::live_writer(path) {
        bail!(
            "{}: is being written by {} (pid {pid}): merge it once that trace has ended",
            path.display(),
            crate::term_text::terminal_safe(&comm)
        );
    }
    bail!("{}: {why}", path.display())
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    if args.inputs.len() > MAX_NODES {
        bail!(
            "{} traces given: merge takes at most {MAX_NODES} (each node's pids move by node × 2^{PID_SHIFT}, which must stay below 2^32)",
            args.inputs.len()
        );
    }
    let inputs: Vec<&std::path::Path> = args.inputs.iter().map(|p| p.as_path()).collect();
    // `--force` renames the merge over the output: a tracer still recording
    // there would go on into a file no name leads to (round 50).
    crate::output_file::check_output(&args.output, &inputs, args.force, Some(FORCE_HINT))?;
    refuse_repeated_inputs(&args.inputs)?;
    let mut facts = Vec::new();
    for p in &args.inputs {
        let f = input_facts(p).with_context(|| format!("reading {}", p.display()))?;
        refuse_unfinished(p, &f)?;
        facts.push(f);
    }
    let base_offset = facts[0].realtime_offset_ns;
    let mut seen: BTreeSet<u32> = BTreeSet::new();
    let mut base_events: Vec<NcclEvent> = Vec::new();
    let mut inputs = Vec::new();
    let mut reports = Vec::new();
    for (i, (path, f)) in args.inputs.iter().zip(&facts).enumerate() {
        let pid_offset = if f.pids.iter().any(|p| seen.contains(p)) {
            // Below 2^32: i < MAX_NODES (checked above).
            (i as u32) << PID_SHIFT
        } else {
            0
        };
        // A pid above Linux's pid_max (2^22: only a crafted file's) moved
        // past 2^32 would wrap onto another node's.
        for p in &f.pids {
            if p.checked_add(pid_offset).is_none() {
                bail!(
                    "{}: pid {p} is above Linux's pid_max (2^{PID_SHIFT}): its node's pids cannot be moved by {pid_offset} to keep them apart from an earlier node's",
                    path.display()
                );
            }
        }
        seen.extend(f.pids.iter().map(|p| p + pid_offset));
        // Crafted offsets far apart wrapped here (release builds): refused,
        // as the store refuses a shift that moves times out of range.
        let Some(session_shift) = f.realtime_offset_ns.checked_sub(base_offset) else {
            bail!(
                "{}: its wall-clock offset ({} ns) is too far from the first trace's ({base_offset} ns) to move its times onto that clock",
                path.display(),
                f.realtime_offset_ns
            );
        };
        let events = crate::checks_memo::open(path)?.nccl_calls(None)?;
        let moved: Vec<NcclEvent> = events
            .into_iter()
            .map(|mut e| {
                // Only to estimate the skew: a tid a reader would skip
                // (past 2^32 once moved) saturates rather than wraps.
                e.call.pid = e.call.pid.saturating_add(pid_offset);
                e.call.tid = e.call.tid.saturating_add(pid_offset);
                e.call.ts_ns = e.call.ts_ns.saturating_add_signed(session_shift);
                e
            })
            .collect();
        let (skew, applied) = if i == 0 {
            base_events = moved;
            (None, false)
        } else {
            let a = estimate(&base_events, &moved);
            (a, a.is_some() && !args.no_align)
        };
        let skew_ns = skew.map(|a| a.skew_ns).unwrap_or(0);
        let shift_ns = match session_shift.checked_sub(if applied { skew_ns } else { 0 }) {
            Some(s) => s,
            None => bail!(
                "{}: its clock shift ({session_shift} ns) and measured skew ({skew_ns} ns) overflow: its clock does not match the first trace's",
                path.display()
            ),
        };
        inputs.push(MergeInput {
            path: path.clone(),
            shift_ns,
            pid_offset,
            skew_ns,
            skew_applied: applied,
            skew_samples: skew.map(|a| a.samples).unwrap_or(0),
            skew_spread_ns: skew.map(|a| a.spread_ns),
        });
        reports.push(NodeReport {
            source: path.display().to_string(),
            hostname: f.hostname.clone(),
            shift_ns,
            skew,
            skew_applied: applied,
            pid_offset,
        });
    }
    write_merged(&inputs, &args.output, args.force, env!("CARGO_PKG_VERSION"))
        .with_context(|| format!("writing {}", args.output.display()))?;
    if args.out.json {
        outln!("{}", serde_json::to_string_pretty(&reports)?)?;
        return Ok(0);
    }
    outln!(
        "merged {} traces into {}",
        reports.len(),
        args.output.display()
    )?;
    for (i, r) in reports.iter().enumerate() {
        let skew = match (&r.skew, i) {
            (_, 0) => "reference clock".to_string(),
            (Some(a), _) => format!(
                "residual skew {:+.3} ms (±{:.3} ms, {} rendezvous){}",
                a.skew_ns as f64 / 1e6,
                a.spread_ns as f64 / 1e6,
                a.samples,
                if r.skew_applied {
                    ", corrected"
                } else {
                    ", not applied (--no-align)"
                }
            ),
            (None, _) => {
                "residual skew unknown (too few blocking rendezvous): session clock offsets only"
                    .into()
            }
        };
        outln!(
            "  node {i} {} ({}): shift {:+.3} ms, {}{}",
            r.hostname,
            r.source,
            r.shift_ns as f64 / 1e6,
            skew,
            if r.pid_offset > 0 {
                format!(", pids +{}", r.pid_offset)
            } else {
                String::new()
            }
        )?;
    }
    Ok(0)
}
