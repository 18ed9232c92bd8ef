//! `gpusleuth stats`: per-op latency and time decomposition of a recorded
//! trace, or of a part of it (`--from`/`--to`).

use crate::args::{JsonOutput, TraceInput};
use crate::load::{emit_json, emit_text, stats_of, warn_input_problems_of_reads};
use crate::window::{files_named, Window, WindowArgs, WindowSource};
use sleuth_core::stats::StatsReport;
use sleuth_store::run_window::RunLast;
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
    let file = match args.window.source_of(&args.input.db, None)? {
        WindowSource::File(f) => f,
        WindowSource::Run(run, note) => return run_window_of_run(args, &run, &note),
    };
    let db = &file.path;
    let pid = args.input.pid;
    let trace = crate::checks_memo::open(db)?;
    crate::load::note_if_unfinished(&trace)?;
    if let Some(pid) = pid {
        trace.require_pid(pid)?;
    }
    let w = args
        .window
        .resolve_in(&trace, Some(&file))?
        .ok_or_else(|| anyhow::anyhow!("--from/--to: no window given"))?;
    let (report, counted) = window::stats_of(&trace, &w.filter(pid))?;
    warn_input_problems_of_reads(&trace)?;
    file.say();
    let notes = counted.notes(window::STATS_COUNT);
    if args.out.json {
        emit_json(&WindowStats {
            window: w.json(),
            files: Vec::new(),
            report: &report,
            notes,
            counted_in_window: counted.json(),
        })?;
    } else {
        emit_text(&render_window(&w, &report, &notes, None))?;
    }
    Ok(0)
}

/// `stats --last` of a run's directory when the window spans several of
/// its files: each file's part of the window added up
/// (`sleuth_store::run_window`).
fn run_window_of_run(args: &Args, run: &RunLast, note: &str) -> anyhow::Result<i32> {
    let last = args.window.last.unwrap_or_default();
    let w = Window::of_run(run, last);
    let (report, counted, read) = run.stats(args.input.pid, crate::checks_memo::memo())?;
    crate::load::print_problems_at(&run.dir, &read.problems);
    eprintln!("{note}");
    let notes = counted.notes(window::STATS_COUNT);
    if args.out.json {
        emit_json(&WindowStats {
            window: w.json(),
            files: run.file_names(),
            report: &report,
            notes,
            counted_in_window: counted.json(),
        })?;
    } else {
        let files = format!(
            "{} ({} files of the run in {})",
            files_named(run),
            run.files.len(),
            run.dir.display()
        );
        emit_text(&render_window(&w, &report, &notes, Some(&files)))?;
    }
    Ok(0)
}

/// `stats --json` of a window: the window, the report's fields, the notes
/// and the kernel-counted calls' bounds.
#[derive(serde::Serialize)]
struct WindowStats<'a> {
    window: serde_json::Value,
    /// A window over several files of a run: their names, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    files: Vec<String>,
    #[serde(flatten)]
    report: &'a StatsReport,
    notes: Vec<String>,
    /// Per kernel-counted op: the calls certainly, probably and possibly
    /// in the window (`sleuth_store::window::WindowCounts`).
    counted_in_window: serde_json::Value,
}

/// The window's header line, the table, the notes.
fn render_window(
    w: &Window,
    report: &StatsReport,
    notes: &[String],
    files: Option<&str>,
) -> String {
    let mut out = match files {
        None => format!(
            "{}; the event and drop counters are the whole trace's.\n",
            w.describe()
        ),
        Some(files) => format!(
            "{}; the event and drop counters are those of the files it spans.\nFiles: {files}\n",
            w.describe()
        ),
    };
    out.push_str(&crate::render::stats::render(report));
    for n in notes {
        out.push_str(&format!("Note: {n}\n"));
    }
    out
}
