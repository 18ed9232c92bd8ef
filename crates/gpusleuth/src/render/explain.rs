//! The explanation of a trace for people and programs: findings as text,
//! Markdown or the JSON contract, the per-thread time split and culprit
//! lines. `explain` prints it; `demo` prints it after its trace; the report
//! reuses the culprit and thread lines.

use crate::args::TraceInput;
use crate::load::{emit, json_text, warn_input_problems_of_reads};
use crate::output::{fmt_bytes, fmt_ns};
use crate::render::gpu_context;
use crate::term_text::terminal_safe;
use crate::window::{Window, WindowArgs, WindowSource};
use sleuth_core::analysis::Analysis;
use sleuth_core::findings::{Explanation, Finding, Kind};
use sleuth_core::ledger::ProcessLedger;
use sleuth_core::threads::{ThreadSplit, WakerKind};
use sleuth_core::TraceData;
use sleuth_store::lean::Lean;
use sleuth_store::run_window::RunLast;
use sleuth_store::{InputProblems, ReadBudget, DEFAULT_READ_TIMEOUT};
use std::fmt::Write as _;

/// How `explain` writes its findings.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Style {
    Text,
    Markdown,
    Json,
}

pub const CLEAN: &str = "No abnormal behaviour found";

/// Loads a trace and prints its explanation in `style` (the `explain`
/// command), of the part `window` names or the whole trace.
pub fn print(input: &TraceInput, window: WindowArgs, style: Style) -> anyhow::Result<i32> {
    if window.is_set() {
        emit(&window_output(input, window, style)?)?;
    } else {
        emit(&output(input, style, true)?)?;
    }
    Ok(0)
}

/// `explain --from/--to` (or `--last`): the findings of the calls that start in the
/// window, from those calls streamed thread by thread against their
/// waits (`sleuth_store::scoped`, as MCP `findings` with a window; a file
/// without stored call groups has the window's calls loaded instead), and
/// NVML's busy samples inside the window. The memory each process held
/// before the trace is a fact of the whole trace: `explain` without a
/// window gives it.
fn window_output(input: &TraceInput, window: WindowArgs, style: Style) -> anyhow::Result<String> {
    let file = match window.source_of(&input.db, Some(input.pid))? {
        WindowSource::File(f) => f,
        WindowSource::Run(run, note) => {
            return run_window_output(input, window, &run, style).inspect(|_| eprintln!("{note}"))
        }
    };
    let trace = crate::checks_memo::open(&file.path)?;
    crate::load::note_if_unfinished(&trace)?;
    if let Some(pid) = input.pid {
        trace.require_pid(pid)?;
    }
    let w = window
        .resolve_in(&trace, Some(&file))?
        .ok_or_else(|| anyhow::anyhow!("--from/--to: no window given"))?;
    let earlier = file.pinned_earlier(&trace, input.pid)?;
    let mut report =
        sleuth_store::scoped::explanation_or_loaded_after(&trace, &w.filter(input.pid), earlier)?;
    file.settle_growth(w.since, &mut report)?;
    let problems = warn_input_problems_of_reads(&trace)?;
    let samples = trace.gpu_samples()?;
    file.say();
    window_text(&w, None, &report, samples.as_deref(), &problems, style)
}

/// `explain --last` of a run's directory when the window spans several of
/// its files: each file's part of the window added up, the ledger and the
/// pinned host ranges carried from file to file (`sleuth_store::run_window`).
fn run_window_output(
    input: &TraceInput,
    window: WindowArgs,
    run: &RunLast,
    style: Style,
) -> anyhow::Result<String> {
    let w = Window::of_run(run, window.last.unwrap_or_default());
    let (report, read) = run.explanation(input.pid, crate::checks_memo::memo())?;
    crate::load::print_problems_at(&run.dir, &read.problems);
    window_text(
        &w,
        Some(run),
        &report,
        read.gpu_samples.as_deref(),
        &read.problems,
        style,
    )
}

/// A window's explanation as written to stdout, with NVML's busy samples
/// inside it; over several files of a run (`run`), their names.
fn window_text(
    w: &Window,
    run: Option<&RunLast>,
    report: &Explanation,
    samples: Option<&[sleuth_core::GpuSample]>,
    problems: &InputProblems,
    style: Style,
) -> anyhow::Result<String> {
    let busy = sleuth_core::gpu_activity::busy(samples, Some((w.since, w.until)));
    if style == Style::Json {
        #[derive(serde::Serialize)]
        struct Doc<'a> {
            window: serde_json::Value,
            /// A window over several files of a run: their names, oldest first.
            #[serde(skip_serializing_if = "Vec::is_empty")]
            files: Vec<String>,
            #[serde(flatten)]
            report: &'a Explanation,
            gpu_activity: sleuth_core::gpu_activity::GpuActivity,
            #[serde(skip_serializing_if = "InputProblems::is_empty")]
            input_problems: &'a InputProblems,
        }
        return json_text(&Doc {
            window: w.json(),
            files: run.map_or_else(Vec::new, RunLast::file_names),
            report,
            gpu_activity: busy,
            input_problems: problems,
        });
    }
    let gpu = gpu_context::busy_lines(&busy);
    let header = match run {
        None => w.describe(),
        Some(r) => format!(
            "{}\nFiles: {} ({} files of the run in {})",
            w.describe(),
            crate::window::files_named(r),
            r.files.len(),
            r.dir.display()
        ),
    };
    Ok(human(Some(&header), report, &gpu, problems, style))
}

/// The explanation for people, text or Markdown: the skipped rows, a
/// header line (a window's), the findings, then the GPU lines.
fn human(
    header: Option<&str>,
    report: &Explanation,
    gpu: &[String],
    problems: &InputProblems,
    style: Style,
) -> String {
    let mut body = header.map(|h| format!("{h}\n")).unwrap_or_default();
    if style == Style::Markdown {
        if header.is_some() {
            body.push('\n');
        }
        body.push_str(&markdown_of(report, scope_of(header)));
        body.push_str("\n## GPU\n\n");
        for l in gpu {
            body.push_str(&format!("- {}\n", md(l)));
        }
    } else {
        body.push_str(&text_with(report, !problems.is_empty(), scope_of(header)));
        body.push('\n');
        for l in gpu {
            body.push_str(l);
            body.push('\n');
        }
    }
    terminal_safe(&format!("{}{}", problem_text(problems), body)).into_owned()
}

/// What `explain` writes to stdout. With `lean_allowed`, a trace that
/// stored its finding rollups is answered from them without loading its
/// calls and waits, with `--pid` too (see [`lean_load`]); the answer is the same as the full
/// load's, percentiles within the histogram's bound (docs/schema.md).
fn output(input: &TraceInput, style: Style, lean_allowed: bool) -> anyhow::Result<String> {
    if input.db.is_dir() {
        return run_output(input, style);
    }
    let trace = crate::checks_memo::open(&input.db)?;
    crate::load::note_if_unfinished(&trace)?;
    let lean = if lean_allowed {
        lean_load(&trace, input.pid)?
    } else {
        None
    };
    let (data, ledgers, report) = match lean {
        Some(l) => {
            let report = l.explanation();
            (l.data, l.ledgers, report)
        }
        // No rollups (a file still being written, or whose writer was
        // killed): streamed where it can be, in bounded memory.
        None => match lean_allowed
            .then(|| {
                let above = sleuth_store::scoped::STREAMED_ABOVE_ROWS;
                sleuth_store::scoped::whole_streamed(&trace, input.pid, above)
            })
            .transpose()?
            .flatten()
        {
            Some(streamed) => streamed,
            None => {
                let data = trace.load(input.pid)?;
                let analysis = Analysis::of(&data);
                (data, analysis.ledgers, analysis.explanation)
            }
        },
    };
    // After the reads: what they skipped (none when a large trace was
    // answered from its aggregates alone; see `input_problems_of_reads`).
    let problems = warn_input_problems_of_reads(&trace)?;
    render(&data, &ledgers, &report, &problems, style)
}

/// `explain --db DIR` over a run of `trace --rotate`: every finished file
/// as one trace (`sleuth_store::run_explain`), from their stored
/// aggregates; a file still being written is left out with the note
/// `stats` prints.
fn run_output(input: &TraceInput, style: Style) -> anyhow::Result<String> {
    let run = sleuth_store::run_explain::load_remembered(
        &input.db,
        input.pid,
        ReadBudget::new(DEFAULT_READ_TIMEOUT),
        crate::checks_memo::memo(),
    )?;
    crate::load::note_unfinished(&run.incomplete);
    crate::load::note_finished_files(&run.files);
    crate::load::print_problems_at(&input.db, &run.problems);
    let report = run.explanation()?;
    render(&run.data, &run.ledgers, &report, &run.problems, style)
}

/// The trace (or the process of `--pid`) as the explanation reads it,
/// without its calls and waits (`sleuth_store::lean`, shared with the
/// Perfetto export and the MCP `findings` tool). None (load everything) for
/// a trace without finding rollups, with `--pid` for a trace written before
/// the per-process rollups, or with collectives: the straggler finding
/// reads every call and wait of the ranks.
fn lean_load(trace: &sleuth_store::Trace, pid: Option<u32>) -> anyhow::Result<Option<Lean>> {
    Ok(sleuth_store::lean::load(
        trace,
        pid,
        ReadBudget::new(DEFAULT_READ_TIMEOUT),
    )?)
}

/// The explanation in `style`, as written to stdout.
fn render(
    data: &TraceData,
    ledgers: &[ProcessLedger],
    report: &Explanation,
    problems: &InputProblems,
    style: Style,
) -> anyhow::Result<String> {
    let gpu = gpu_context::lines(data, ledgers);
    if style == Style::Json {
        // The documented contract, field order included (the report's fields
        // first); `input_problems` is added only when rows were skipped.
        #[derive(serde::Serialize)]
        struct Doc<'a, G: serde::Serialize, H: serde::Serialize> {
            #[serde(flatten)]
            report: &'a Explanation,
            gpu_activity: G,
            held_memory: H,
            #[serde(skip_serializing_if = "InputProblems::is_empty")]
            input_problems: &'a InputProblems,
        }
        let doc = Doc {
            report,
            gpu_activity: sleuth_core::gpu_activity::of_trace(data),
            held_memory: sleuth_core::held::held(data, ledgers),
            input_problems: problems,
        };
        Ok(json_text(&doc)?)
    } else {
        Ok(human(None, report, &gpu, problems, style))
    }
}

/// "comm (pid N) 1.2ms = 80%, ..." for a finding's culprits; None when it has none.
pub fn culprit_line(f: &Finding) -> Option<String> {
    if f.culprits.is_empty() {
        return None;
    }
    let parts: Vec<String> = f
        .culprits
        .iter()
        .map(|c| {
            format!(
                "{} (pid {}) {} = {:.0}%",
                c.comm,
                c.pid,
                fmt_ns(c.runnable_ns),
                c.share * 100.0
            )
        })
        .collect();
    Some(parts.join(", "))
}

/// One line per CUDA-issuing thread: where its time went, inside and between CUDA calls.
/// What a thread's window is: one trace's, from its first CUDA call to its
/// last; a run's, its windows in the files added up, shorter than its
/// first to last call when the thread made none for a while (round 54's
/// tester: "1.800s from first to last CUDA call" of a thread whose calls
/// spanned 8.2 s, the shares then of the 1.8 s).
fn window_words(t: &ThreadSplit) -> String {
    let span = t.end_ns.saturating_sub(t.start_ns);
    if span <= t.wall_ns {
        return format!("{} from first to last CUDA call", fmt_ns(t.wall_ns));
    }
    format!(
        "{} in its windows in the files (from its first to its last CUDA call in each; {} from first to last \
         over the run: the {} between its last call in one file and its first in a later one is in none, \
         and the shares below are of the windows)",
        fmt_ns(t.wall_ns),
        fmt_ns(span),
        fmt_ns(span - t.wall_ns)
    )
}

pub fn thread_lines(threads: &[ThreadSplit]) -> Vec<String> {
    let pct = |t: &ThreadSplit, ns: u64| format!("{:.0}%", t.share(ns) * 100.0);
    let mut lines: Vec<String> = threads
        .iter()
        .take(THREAD_LINES)
        .map(|t| {
            let mut line = format!(
                "{} pid {} tid {}: {}; inside calls {} (on-CPU {}, runnable {}, \
                 blocked {}); between calls {}: on-CPU {}, blocked {}, runnable {}",
                t.comm,
                t.pid,
                t.tid,
                window_words(t),
                pct(t, t.in_calls.wall_ns()),
                pct(t, t.in_calls.on_cpu_ns),
                pct(t, t.in_calls.runnable_ns),
                pct(t, t.in_calls.blocked_ns),
                pct(t, t.between.wall_ns()),
                pct(t, t.between.on_cpu_ns),
                pct(t, t.between.blocked_ns),
                pct(t, t.between.runnable_ns),
            );
            let wakers: Vec<String> = t
                .wakers
                .iter()
                .take(3)
                .map(|w| match w.kind {
                    WakerKind::Task => {
                        format!("{} pid {} tid {} {:.0}%", w.comm, w.pid, w.tid, w.share * 100.0)
                    }
                    _ => format!("{} {:.0}%", w.comm, w.share * 100.0),
                })
                .collect();
            if !wakers.is_empty() {
                line.push_str(&format!("; woken by {}", wakers.join(", ")));
            }
            let holders: Vec<String> = t
                .preempted_by
                .iter()
                .take(3)
                .map(|h| format!("{} pid {} {}", h.comm, h.pid, fmt_ns(h.runnable_ns)))
                .collect();
            if !holders.is_empty() {
                line.push_str(&format!("; CPU taken by {}", holders.join(", ")));
            }
            // A stretch of a fifth of the window or more: a pause the
            // verdicts may judge apart (docs/findings.md), or a long step.
            if let Some(p) = t.pauses.first().filter(|p| t.share(p.wall_ns()) >= 0.2) {
                line.push_str(&format!(
                    "; longest stretch between calls {} ({} of the window, {} after its first call)",
                    fmt_ns(p.wall_ns()),
                    pct(t, p.wall_ns()),
                    fmt_ns(p.start_ns.saturating_sub(t.start_ns))
                ));
            }
            line
        })
        .collect();
    if threads.len() > THREAD_LINES {
        let rest = &threads[THREAD_LINES..];
        let wall: u64 = rest.iter().map(|t| t.wall_ns).sum();
        lines.push(format!(
            "... {} more thread(s), {} from first to last CUDA call in all, each shorter (--json lists them all)",
            rest.len(),
            fmt_ns(wall)
        ));
    }
    lines
}

/// Threads listed a line each, the longest first (`sort_splits`): a node
/// agent's run of 6,000 short-lived processes made 6,000 lines (round 47).
const THREAD_LINES: usize = 20;

/// No finding in a trace that lost events: not a clean bill of health (a
/// flood of 16 processes lost 75-86% of its calls on a 16-core host).
/// `scope`: "trace" or "window" (the drops are the trace's: a window cannot
/// rule them out either); `see`: where the drops' note is. The report's
/// findings section says the same (cmd/report.rs).
pub(crate) fn nothing_in_what_was_recorded(lost: u64, scope: &str, see: &str) -> String {
    format!(
        "Nothing abnormal in the events that were recorded, but {lost} were lost during capture \
         (see {see}): this {scope} cannot say the program is healthy."
    )
}

/// What a human rendering calls what it explains: a window has a header.
fn scope_of(header: Option<&str>) -> &'static str {
    match header {
        Some(_) => "window",
        None => "trace",
    }
}

/// What the readers skipped, before the findings: a trace with unusable
/// rows is never called clean without saying so.
fn problem_text(p: &InputProblems) -> String {
    let mut out = String::new();
    for line in p.lines() {
        let _ = writeln!(out, "Input problem: {line}.");
    }
    out
}

/// Plain-text rendering.
#[cfg(test)]
pub fn text(r: &Explanation) -> String {
    text_with(r, false, "trace")
}

/// Plain-text rendering; `skipped_rows`: some rows could not be read;
/// `scope`: a trace's or a window's explanation.
fn text_with(r: &Explanation, skipped_rows: bool, scope: &str) -> String {
    let mut out = String::new();
    if let Some(s) = &r.summary {
        let _ = writeln!(out, "{s}\n");
    }
    if r.findings.is_empty() && skipped_rows {
        let _ = writeln!(
            out,
            "Nothing abnormal in the calls that could be read; the skipped rows above were not examined."
        );
    } else if r.findings.is_empty() && r.events_lost > 0 {
        let lost = nothing_in_what_was_recorded(r.events_lost, scope, "the note below");
        let _ = writeln!(out, "{lost}");
    } else if r.findings.is_empty() {
        let _ = writeln!(out, "{CLEAN}.");
    }
    for (i, f) in r.findings.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}. [{}] {}: {}",
            i + 1,
            f.severity.as_str(),
            f.kind.as_str(),
            f.summary
        );
        if let Some(c) = culprit_line(f) {
            let label = if f.kind == Kind::InputWait {
                "woken by"
            } else {
                "culprits"
            };
            let _ = writeln!(out, "   {label}: {c}");
        }
        let _ = writeln!(out, "   what to do: {}", f.recommendation);
        for line in example_lines(&f.evidence, &f.op) {
            let _ = writeln!(out, "   {line}");
        }
        out.push('\n');
    }
    if !r.findings.is_empty() {
        let _ = writeln!(out, "(full evidence of each finding: --json or --markdown)");
    }
    if !r.threads.is_empty() {
        let _ = writeln!(out, "\nWhere the time went, per CUDA-issuing thread:");
        for line in thread_lines(&r.threads) {
            let _ = writeln!(out, "  {line}");
        }
        out.push('\n');
    }
    for n in &r.notes {
        let _ = writeln!(out, "Note: {n}");
    }
    out
}

/// The slowest example calls of a finding, one readable line each.
/// `op` names the calls when an example does not (time findings are per op).
fn example_lines(evidence: &serde_json::Value, op: &str) -> Vec<String> {
    let Some(examples) = evidence.get("examples").and_then(|e| e.as_array()) else {
        return Vec::new();
    };
    let ns = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_u64());
    examples
        .iter()
        .take(3)
        .map(|e| {
            // null (unknown: no host context) reads "-", never 0.
            let part = |k: &str| ns(e, k).map(fmt_ns).unwrap_or_else(|| "-".into());
            let mut line = String::from("example:");
            if let Some(o) = ns(e, "offset_ns") {
                line.push_str(&format!(" +{}", fmt_ns(o)));
            }
            let name = e.get("op").and_then(|x| x.as_str()).unwrap_or(op);
            if !name.is_empty() {
                line.push_str(&format!(" {name}"));
            }
            if let Some(pid) = ns(e, "pid") {
                line.push_str(&format!(" pid {pid}"));
            }
            if let Some(d) = ns(e, "dur_ns") {
                line.push_str(&format!(
                    " took {} (on-CPU {}, runnable {}, blocked {})",
                    fmt_ns(d),
                    part("on_cpu_ns"),
                    part("runnable_ns"),
                    part("blocked_ns")
                ));
            }
            if let Some(b) = ns(e, "bytes") {
                line.push_str(&format!(" {}", fmt_bytes(b)));
            }
            if let Some(err) = e.get("error_name").and_then(|x| x.as_str()) {
                line.push_str(&format!(" failed: {err}"));
            }
            if let Some(site) = e.get("site").and_then(|x| x.as_str()) {
                line.push_str(&format!(" at {site}"));
            }
            line
        })
        .collect()
}

/// Markdown rendering of a whole trace's explanation.
#[cfg(test)]
pub fn markdown(r: &Explanation) -> String {
    markdown_of(r, "trace")
}

/// Untrusted text (names, paths, command lines inside summaries) as
/// Markdown that says what it says: one line (a newline in a name started
/// a heading, or ended a table), no HTML (`<`, `>`, `&` as entities), no
/// link or image (`[`, `]` escaped), `|` escaped for table cells. Before
/// round 55 a traced program named `<img src=x onerror=…>` put HTML into
/// reports meant for issues and notebooks.
fn md(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' | '\r' | '\t' => out.push(' '),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '[' | ']' | '|' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// JSON text whose dangerous characters (controls, bidirectional marks)
/// are `\uXXXX` escapes, still JSON (the terminal's escapes, `\u{202e}`,
/// made the evidence block invalid JSON).
fn json_ascii_safe(json: &str) -> String {
    json.chars()
        .map(|c| match crate::term_text::needs_escape(c) {
            true => format!("\\u{:04x}", c as u32),
            false => c.to_string(),
        })
        .collect()
}

/// Markdown rendering; `scope`: a trace's or a window's explanation.
fn markdown_of(r: &Explanation, scope: &str) -> String {
    let mut out = String::from("# gpusleuth findings\n\n");
    if let Some(s) = &r.summary {
        let _ = writeln!(out, "**{}**\n", md(s));
    }
    if r.findings.is_empty() && r.events_lost > 0 {
        let lost = nothing_in_what_was_recorded(r.events_lost, scope, "the note below");
        let _ = writeln!(out, "{lost}\n");
    } else if r.findings.is_empty() {
        let _ = writeln!(out, "{CLEAN}.\n");
    }
    for (i, f) in r.findings.iter().enumerate() {
        // A thread's verdict is about no one op: no empty code span.
        let op = match f.op.is_empty() {
            true => String::new(),
            false => format!(", `{}`", f.op),
        };
        let _ = writeln!(
            out,
            "## {}. {} ({}{op})\n",
            i + 1,
            f.kind.as_str(),
            f.severity.as_str(),
        );
        let _ = writeln!(out, "{}\n", md(&f.summary));
        if !f.culprits.is_empty() {
            out.push_str("| culprit | pid | runnable time | share |\n|---|---:|---:|---:|\n");
            for c in &f.culprits {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.0}% |",
                    md(&c.comm),
                    c.pid,
                    fmt_ns(c.runnable_ns),
                    c.share * 100.0
                );
            }
            out.push('\n');
        }
        let _ = writeln!(out, "**What to do:** {}\n", md(&f.recommendation));
        let evidence =
            json_ascii_safe(&serde_json::to_string_pretty(&f.evidence).unwrap_or_default());
        let _ = writeln!(
            out,
            "<details><summary>Evidence</summary>\n\n```json\n{evidence}\n```\n</details>\n"
        );
    }
    if !r.threads.is_empty() {
        out.push_str("## Where the time went\n\n");
        for line in thread_lines(&r.threads) {
            let _ = writeln!(out, "- {}", md(&line));
        }
        out.push('\n');
    }
    if !r.notes.is_empty() {
        out.push_str("## Notes\n\n");
        for n in &r.notes {
            let _ = writeln!(out, "- {}", md(n));
        }
    }
    out
}

#[cfg(test)]
#[path = "explain_lean_tests.rs"]
pub(crate) mod lean_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::findings::explain_report;
    use sleuth_core::{CallEvent, TraceData};

    fn failing_trace() -> TraceData {
        TraceData {
            calls: vec![CallEvent {
                ts_ns: 0,
                dur_ns: 10,
                pid: 3,
                tid: 3,
                op: 1,
                ret: 2,
                size: Some(1 << 30),
                ..Default::default()
            }],
            has_host_context: true,
            ..Default::default()
        }
    }

    /// The main thread `pid` of `comm`, its calls spanning `[start, end)`,
    /// nothing else measured.
    fn idle_split(pid: u32, comm: &str, start_ns: u64, end_ns: u64) -> ThreadSplit {
        ThreadSplit {
            pid,
            tid: pid,
            comm: comm.into(),
            start_ns,
            end_ns,
            wall_ns: end_ns - start_ns,
            calls: 1,
            nested_calls: 0,
            in_calls: Default::default(),
            between: Default::default(),
            syncs: 0,
            sync_ns: 0,
            sync_p50_ns: 0,
            slowest_sync: (0, 0),
            wakers: Vec::new(),
            preempted_by: Vec::new(),
            tracer_runnable_ns: 0,
            pauses: Vec::new(),
            sync_overlap_ns: None,
            sync_host_p50_ns: None,
        }
    }

    /// A pause of a fifth of the window or more is on the thread's line.
    #[test]
    fn a_threads_long_pause_is_on_its_line() {
        let pause = |start_ns: u64, end_ns: u64| sleuth_core::threads::Pause {
            start_ns,
            end_ns,
            blocked_ns: end_ns - start_ns,
            runnable_ns: 0,
            wakers: Vec::new(),
            sync_overlap_ns: 0,
        };
        let mut t = idle_split(7, "train", 1_000_000_000, 4_500_000_000);
        t.pauses = vec![pause(1_000_010_000, 2_500_000_000)];
        let line = &thread_lines(std::slice::from_ref(&t))[0];
        assert!(
            line.ends_with(
                "; longest stretch between calls 1.500s (43% of the window, 10.0us after its first call)"
            ),
            "{line}"
        );
        t.pauses = vec![pause(1_000_000_000, 1_600_000_000)]; // 17%
        let line = &thread_lines(std::slice::from_ref(&t))[0];
        assert!(!line.contains("pause"), "{line}");
    }

    /// A run's thread whose windows in the files add up to less than its
    /// first to last call says so (round 54's tester).
    #[test]
    fn a_runs_thread_says_its_windows_leave_out_the_gaps_between_files() {
        let one = idle_split(7, "train", 1_000_000_000, 2_000_000_000);
        let line = &thread_lines(std::slice::from_ref(&one))[0];
        assert!(
            line.contains(": 1.000s from first to last CUDA call;"),
            "{line}"
        );
        let mut run = one.clone();
        run.end_ns = 9_200_000_000;
        let line = &thread_lines(std::slice::from_ref(&run))[0];
        assert!(
            line.contains(
                ": 1.000s in its windows in the files (from its first to its last CUDA call in each; 8.200s from \
                 first to last over the run: the 7.200s between"
            ),
            "{line}"
        );
    }

    /// Past twenty threads (a node agent's run of thousands of short-lived
    /// processes) the longest twenty a line each, then one line for the rest.
    #[test]
    fn many_threads_are_listed_longest_first_up_to_twenty() {
        let split = |i: u32| idle_split(i, "job", 0, u64::from(100 - i) * 1_000);
        let threads: Vec<ThreadSplit> = (0..25).map(split).collect();
        let lines = thread_lines(&threads);
        assert_eq!(lines.len(), 21, "{lines:?}");
        assert!(
            lines[0].starts_with("job pid 0 tid 0: 100.0us"),
            "{}",
            lines[0]
        );
        assert!(lines[19].starts_with("job pid 19 tid 19:"), "{}", lines[19]);
        // 80 + 79 + 78 + 77 + 76 us.
        assert_eq!(
            lines[20],
            "... 5 more thread(s), 390.0us from first to last CUDA call in all, each shorter (--json lists them all)"
        );
        assert_eq!(thread_lines(&threads[..20]).len(), 20);
    }

    #[test]
    fn clean_trace_says_so_in_every_format() {
        let r = explain_report(&TraceData {
            has_host_context: true,
            ..Default::default()
        });
        assert_eq!(text(&r), "No abnormal behaviour found.\n");
        assert!(markdown(&r).contains(CLEAN));
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"findings":[]}"#);
    }

    #[test]
    fn no_finding_in_a_trace_that_lost_events_is_not_called_clean() {
        let mut data = TraceData {
            has_host_context: true,
            ..Default::default()
        };
        data.stats.insert("drop_ring_full_call".into(), 40);
        data.stats.insert("events_call".into(), 60);
        let r = explain_report(&data);
        assert_eq!(r.events_lost, 40);
        for out in [text(&r), markdown(&r)] {
            assert!(!out.contains(CLEAN), "{out}");
            assert!(
                out.contains("Nothing abnormal in the events that were recorded, but 40 were lost")
                    && out.contains("40 events (40% of those the probes produced) were dropped"),
                "{out}"
            );
        }
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["events_lost"], 40);
        // A window's explanation (it has a header) says so.
        for style in [Style::Text, Style::Markdown] {
            let out = human(Some("window"), &r, &[], &InputProblems::default(), style);
            assert!(out.contains("this window cannot say"), "{out}");
        }
        assert!(text(&r).contains("this trace cannot say"));
    }

    #[test]
    fn findings_render_with_recommendation_and_evidence() {
        let r = explain_report(&failing_trace());
        let t = text(&r);
        // The summary line on top, then the ranked findings.
        assert!(
            t.starts_with("GPU busy: not measured; the main thread of ? (pid 3)"),
            "{t}"
        );
        assert!(t.contains("\n1. [high] allocation_failure:"), "{t}");
        assert!(
            t.contains("Where the time went, per CUDA-issuing thread:\n  ? pid 3 tid 3:"),
            "{t}"
        );
        // Text shows the advice and the example calls; the full evidence is in --json/--markdown.
        assert!(t.contains("what to do:"), "{t}");
        assert!(t.contains("example: cudaMalloc 1.0 GiB"), "{t}");
        assert!(t.contains("failed: out of memory"), "{t}");
        assert!(
            t.contains("(full evidence of each finding: --json or --markdown)"),
            "{t}"
        );
        let md = markdown(&r);
        assert!(md.contains("## 1. allocation_failure (high, `cudaMalloc`)"));
        assert!(md.contains("```json"));
    }

    /// A traced program's name carries no Markdown or HTML into `--markdown`
    /// (a newline started a heading, `<img …>` stayed HTML, a link stayed a
    /// link), and the evidence block stays JSON (round 55's tester).
    #[test]
    fn hostile_names_say_what_they_say_in_markdown() {
        let mut d = failing_trace();
        let name = "W\n# H\n<img src=x onerror=1>[a](http://x)\u{202e}|";
        d.processes.push(sleuth_core::ProcessInfo {
            pid: 3,
            comm: name.into(),
            ..Default::default()
        });
        let r = explain_report(&d);
        let out = human(
            None,
            &r,
            &[format!("GPU line of {name}")],
            &Default::default(),
            Style::Markdown,
        );
        assert!(
            out.contains("W # H &lt;img src=x onerror=1&gt;\\[a\\](http://x)"),
            "{out}"
        );
        assert!(!out.contains("<img") && !out.contains("\n# H"), "{out}");
        assert!(!out.contains('\u{202e}'), "{out}");
        let json = out
            .split("```json\n")
            .nth(1)
            .and_then(|j| j.split("\n```").next())
            .unwrap();
        let _: serde_json::Value = serde_json::from_str(json).expect("the evidence is JSON");
        assert_eq!(md("a|b\\c"), "a\\|b\\\\c");
    }

    #[test]
    fn imported_trace_states_what_cannot_be_evaluated() {
        let mut d = failing_trace();
        d.has_host_context = false;
        let t = text(&explain_report(&d));
        assert!(t.contains("Note: This trace has no host scheduler context"));
    }

    #[test]
    fn unknown_host_context_prints_as_unknown_not_zero() {
        let e = serde_json::json!({"examples": [
            {"op": "cudaMalloc", "offset_ns": 1_500_000, "pid": 7, "dur_ns": 293_900,
             "on_cpu_ns": null, "runnable_ns": null, "blocked_ns": null},
            {"pid": 7, "dur_ns": 2_000,
             "on_cpu_ns": 1_000, "runnable_ns": 0, "blocked_ns": 1_000}
        ]});
        let lines = example_lines(&e, "cudaMalloc");
        assert_eq!(
            lines[0],
            "example: +1.50ms cudaMalloc pid 7 took 293.9us (on-CPU -, runnable -, blocked -)"
        );
        assert!(
            lines[1].contains("(on-CPU 1.0us, runnable 0ns, blocked 1.0us)"),
            "{}",
            lines[1]
        );
    }
}
