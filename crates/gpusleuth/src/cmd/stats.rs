//! `gpusleuth stats`: per-op latency and time decomposition of a recorded
//! trace, or of a part of it (`--from`/`--to`).

use crate::args::{JsonOutput, TraceInput};
use crate::load::{emit_json, emit_text, stats_of, warn_input_problems_of_reads};
use crate::window::{Window, WindowArgs};
use sleuth_core::stats::StatsReport;
use sleuth_store::window;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: TraceInput,
    /// `--from`/`--to`/`--last`: the calls that start in the window (the event and
    /// drop counters stay the whole trace's).
    #[command(flatten)]
    pub window: WindowArgs,
    #[command(flatten)]
    pub out: JsonOutput,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    if args.window.is_set() {
        return run_window(&args);
    }
    let report = stats_of(&args.input.db, args.input.pid)?;
    if args.out.json {
        emit_json(&report)?;
    } else {
        emit_text(&crate::render::stats::render(&report))?;
    }
    Ok(0)
}

/// `stats --from/--to` (or `--last`): the window's calls with their stored culprits
/// (`sleuth_store::window`), without the per-thread splits; a trace that
/// did not finish has its window's calls loaded with their waits instead.
fn run_window(args: &Args) -> anyhow::Result<i32> {
    let db = args.window.file_of(&args.input.db)?.path;
    let pid = args.input.pid;
    let trace = crate::checks_memo::open(&db)?;
    if let Some(pid) = pid {
        trace.require_pid(pid)?;
    }
    let w = args
        .window
        .resolve(&trace)?
        .ok_or_else(|| anyhow::anyhow!("--from/--to: no window given"))?;
    let (report, counted) = window::stats_of(&trace, &w.filter(pid))?;
    warn_input_problems_of_reads(&trace)?;
    let notes = counted.notes(window::STATS_COUNT);
    if args.out.json {
        emit_json(&WindowStats {
            window: w.json(),
            report: &report,
            notes,
            counted_in_window: counted.json(),
        })?;
    } else {
        emit_text(&render_window(&w, &report, &notes))?;
    }
    Ok(0)
}

/// `stats --json` of a window: the window, the report's fields, the notes
/// and the kernel-counted calls' bounds.
#[derive(serde::Serialize)]
struct WindowStats<'a> {
    window: serde_json::Value,
    #[serde(flatten)]
    report: &'a StatsReport,
    notes: Vec<String>,
    /// Per kernel-counted op: the calls certainly, probably and possibly
    /// in the window (`sleuth_store::window::WindowCounts`).
    counted_in_window: serde_json::Value,
}

/// The window's header line, the table, the notes.
fn render_window(w: &Window, report: &StatsReport, notes: &[String]) -> String {
    let mut out = format!(
        "{}; the event and drop counters are the whole trace's.\n",
        w.describe()
    );
    out.push_str(&crate::render::stats::render(report));
    for n in notes {
        out.push_str(&format!("Note: {n}\n"));
    }
    out
}
