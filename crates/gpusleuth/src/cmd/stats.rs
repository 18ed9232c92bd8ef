//! `gpusleuth stats`: per-op latency and time decomposition of a recorded trace.

use crate::output::fmt_ns;
use crate::term_text::{cell, pad_left, pad_right, terminal_safe};
use sleuth_core::stats::{self, Measured, OpStats, StatsReport};
use sleuth_core::TraceData;
use sleuth_store::InputProblems;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Trace database written by `gpusleuth trace` (or `import`).
    #[arg(long)]
    pub db: PathBuf,
    /// Only this process.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Machine-readable output (the documented stats contract).
    #[arg(long)]
    pub json: bool,
}

/// Opens a trace and loads it (one process with `pid`). The store's error is
/// already one line naming the file, so it is passed on as is. Rows the
/// readers had to skip are reported on stderr, with counts.
pub(crate) fn load_trace(db: &Path, pid: Option<u32>) -> anyhow::Result<TraceData> {
    Ok(load_trace_checked(db, pid)?.0)
}

/// [`load_trace`], also returning what was skipped (for outputs that must
/// not call such a trace clean).
pub(crate) fn load_trace_checked(
    db: &Path,
    pid: Option<u32>,
) -> anyhow::Result<(TraceData, InputProblems)> {
    let trace = sleuth_store::Trace::open(db)?;
    let problems = warn_input_problems(&trace)?;
    Ok((trace.load(pid)?, problems))
}

/// Prints one warning per kind of skipped row on stderr; returns them.
pub(crate) fn warn_input_problems(trace: &sleuth_store::Trace) -> anyhow::Result<InputProblems> {
    let problems = trace.input_problems()?;
    for line in problems.lines() {
        eprintln!(
            "gpusleuth: warning: {}: {}",
            terminal_safe(&trace.path().display().to_string()),
            terminal_safe(&line)
        );
    }
    Ok(problems)
}

/// Writes a command's output to stdout. A closed pipe (`| head`) ends the
/// output quietly instead of panicking like `println!` would.
pub(crate) fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing to stdout"))
        }
        _ => Ok(()),
    }
}

/// [`emit`] for human text: names and notes from the trace are escaped so
/// the terminal shows control sequences instead of obeying them.
pub(crate) fn emit_text(text: &str) -> anyhow::Result<()> {
    emit(&terminal_safe(text))
}

/// The stats answer of a trace: from its rollups when it has them (no call
/// row is read), else from the whole trace loaded (older, merged, imported
/// or cut-short traces).
pub(crate) fn stats_of(db: &Path, pid: Option<u32>) -> anyhow::Result<StatsReport> {
    let trace = sleuth_store::Trace::open(db)?;
    if let Some(r) = trace.stats_report(pid)? {
        return Ok(r);
    }
    warn_input_problems(&trace)?;
    Ok(stats::compute(&trace.load(pid)?))
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let report = stats_of(&args.db, args.pid)?;
    if args.json {
        emit(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        emit_text(&render(&report))?;
    }
    Ok(0)
}

fn opt_ns(v: Option<u64>) -> String {
    v.map(fmt_ns).unwrap_or_else(|| "-".into())
}

fn share(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// Columns of the human table, one row per op.
fn row(o: &OpStats) -> Vec<String> {
    let tail = match (&o.tail, o.measured) {
        (Some(t), Measured::PerCall) if t.calls > 0 => format!(
            "{} cpu/{} run/{} blk",
            share(t.on_cpu_share),
            share(t.runnable_share),
            share(t.blocked_share)
        ),
        (_, Measured::Counted) => "counted in kernel".into(),
        _ => "-".into(),
    };
    let culprit = o
        .culprits
        .first()
        .map(|c| format!("{}({}) {}", c.comm, c.pid, fmt_ns(c.runnable_ns)))
        .unwrap_or_else(|| "-".into());
    vec![
        o.layer.as_str().to_string(),
        o.op.to_string(),
        o.count.to_string(),
        o.errors
            .map(|e| e.to_string())
            .unwrap_or_else(|| "-".into()),
        opt_ns(o.p50_ns),
        opt_ns(o.p95_ns),
        opt_ns(o.p99_ns),
        opt_ns(o.max_ns),
        opt_ns(o.total_ns),
        opt_ns(o.on_cpu_ns),
        opt_ns(o.runnable_ns),
        opt_ns(o.blocked_ns),
        tail,
        culprit,
    ]
}

const HEADER: [&str; 14] = [
    "LAYER",
    "OP",
    "COUNT",
    "ERR",
    "P50",
    "P95",
    "P99",
    "MAX",
    "TOTAL",
    "ON-CPU",
    "RUNNABLE",
    "BLOCKED",
    "TAIL >P95",
    "TOP CULPRIT",
];

/// Widest a table cell is shown (a 70k-character process name must not
/// make a 70k-column table).
const CELL_CHARS: usize = 120;

/// Left-aligns text columns and right-aligns numbers, two spaces apart.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>], left: &[usize]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| cell(c, CELL_CHARS)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, cell) in r.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            if left.contains(&i) {
                s.push_str(&pad_right(c, widths[i]));
            } else {
                s.push_str(&pad_left(c, widths[i]));
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}

fn counters(m: &BTreeMap<String, u64>) -> String {
    let total = m.get("total").copied().unwrap_or(0);
    let parts: Vec<String> = m
        .iter()
        .filter(|(k, _)| k.as_str() != "total")
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    format!("{total} ({})", parts.join(", "))
}

/// The human rendering: the table, then events recorded and drops (always).
pub fn render(r: &StatsReport) -> String {
    let mut out = String::new();
    if r.ops.is_empty() {
        out.push_str("No CUDA calls recorded.\n");
    } else {
        let rows: Vec<Vec<String>> = r.ops.iter().map(row).collect();
        out.push_str(&table(&HEADER, &rows, &[0, 1, 12, 13]));
        if r.ops.iter().any(|o| o.measured == Measured::Counted) {
            out.push_str(
                "Ops marked 'counted in kernel' have exact counts but no per-call latency.\n",
            );
        }
        for o in r.ops.iter().filter(|o| o.also_counted.is_some()) {
            let _ = writeln!(
                out,
                "Note: {} was both recorded per call and counted in the kernel; COUNT sums both ({} counted).",
                o.op,
                o.also_counted.unwrap_or(0)
            );
        }
    }
    if !r.threads.is_empty() {
        out.push_str("Where the time went, per CUDA-issuing thread:\n");
        for line in crate::cmd::explain::thread_lines(&r.threads) {
            let _ = writeln!(out, "  {line}");
        }
    }
    let _ = writeln!(out, "events recorded: {}", counters(&r.events));
    let _ = writeln!(out, "events dropped:  {}", counters(&r.drops));
    let _ = writeln!(
        out,
        "attach edges (not losses): {}",
        counters(&r.attach_edges)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::{CallEvent, OpCount};

    fn call(op: u16, dur: u64) -> CallEvent {
        CallEvent {
            ts_ns: 0,
            dur_ns: dur,
            pid: 1,
            tid: 1,
            op,
            blocked_ns: dur / 2,
            ..Default::default()
        }
    }

    #[test]
    fn table_shows_units_counted_ops_and_zero_drops() {
        let mut d = TraceData {
            calls: vec![call(1, 1_500), call(1, 2_500_000)],
            counts: vec![OpCount {
                pid: 1,
                op: 43,
                count: 42,
            }],
            has_host_context: true,
            ..Default::default()
        };
        d.stats.insert("events_call".into(), 2);
        let text = render(&stats::compute(&d));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("LAYER") && lines[0].contains("RUNNABLE"));
        assert!(
            lines[1].contains("cudaMalloc")
                && lines[1].contains("2.50ms")
                && lines[1].contains("1.5us")
        );
        assert!(lines[2].contains("cuLaunchKernel") && lines[2].contains("counted in kernel"));
        assert!(text.contains("events recorded: 2 (call 2)"));
        assert!(text.contains("events dropped:  0 ("));
        assert!(text.contains("ring_full_call 0"));
        // Columns line up: every row as wide as the header's columns.
        assert_eq!(lines[1].find("cudaMalloc"), lines[0].find("OP"));
    }

    #[test]
    fn empty_trace_still_reports_drops() {
        let text = render(&stats::compute(&TraceData::default()));
        assert!(text.contains("No CUDA calls recorded."));
        assert!(text.contains("events dropped:  0"));
        assert!(
            text.contains(
                "attach edges (not losses): 0 (call_open_at_end 0, return_without_entry 0)"
            ),
            "{text}"
        );
    }
}
