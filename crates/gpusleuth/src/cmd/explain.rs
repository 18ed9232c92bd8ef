//! `gpusleuth explain`: ranked, evidence-backed findings of a recorded trace.

use crate::cmd::stats::{emit, load_trace};
use crate::output::fmt_ns;
use sleuth_core::findings::{explain_report, Explanation, Finding};
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Trace database written by `gpusleuth trace` (or `import`).
    #[arg(long)]
    pub db: PathBuf,
    /// Only this process.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Machine-readable output (the documented findings contract).
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,
    /// Markdown report (for issues, pull requests, notebooks).
    #[arg(long)]
    pub markdown: bool,
}

pub const CLEAN: &str = "No abnormal behaviour found";

pub fn run(args: Args) -> anyhow::Result<i32> {
    let data = load_trace(&args.db, args.pid)?;
    let report = explain_report(&data);
    if args.json {
        emit(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else if args.markdown {
        emit(&markdown(&report))?;
    } else {
        emit(&text(&report))?;
    }
    Ok(0)
}

/// "comm (pid N) 1.2ms = 80%, ..." for a finding's culprits; None when it has none.
pub(crate) fn culprit_line(f: &Finding) -> Option<String> {
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

/// Plain-text rendering.
pub fn text(r: &Explanation) -> String {
    let mut out = String::new();
    if r.findings.is_empty() {
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
            let _ = writeln!(out, "   culprits: {c}");
        }
        let _ = writeln!(out, "   what to do: {}", f.recommendation);
        for line in example_lines(&f.evidence) {
            let _ = writeln!(out, "   {line}");
        }
        out.push('\n');
    }
    if !r.findings.is_empty() {
        let _ = writeln!(out, "(full evidence of each finding: --json or --markdown)");
    }
    for n in &r.notes {
        let _ = writeln!(out, "Note: {n}");
    }
    out
}

/// The slowest example calls of a finding, one readable line each.
fn example_lines(evidence: &serde_json::Value) -> Vec<String> {
    let Some(examples) = evidence.get("examples").and_then(|e| e.as_array()) else {
        return Vec::new();
    };
    let ns = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_u64());
    examples
        .iter()
        .take(3)
        .map(|e| {
            let at = ns(e, "offset_ns")
                .map(|o| format!("+{:.3}s ", o as f64 / 1e9))
                .unwrap_or_default();
            let mut line = format!(
                "example: {at}{}",
                e.get("op").and_then(|x| x.as_str()).unwrap_or("")
            );
            if let Some(pid) = ns(e, "pid") {
                line.push_str(&format!(" pid {pid}"));
            }
            if let Some(d) = ns(e, "dur_ns") {
                line.push_str(&format!(
                    " took {} (on-CPU {}, runnable {}, blocked {})",
                    fmt_ns(d),
                    fmt_ns(ns(e, "on_cpu_ns").unwrap_or(0)),
                    fmt_ns(ns(e, "runnable_ns").unwrap_or(0)),
                    fmt_ns(ns(e, "blocked_ns").unwrap_or(0))
                ));
            }
            if let Some(b) = ns(e, "bytes") {
                line.push_str(&format!(" {} bytes", b));
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

/// Markdown rendering.
pub fn markdown(r: &Explanation) -> String {
    let mut out = String::from("# gpusleuth findings\n\n");
    if r.findings.is_empty() {
        let _ = writeln!(out, "{CLEAN}.\n");
    }
    for (i, f) in r.findings.iter().enumerate() {
        let _ = writeln!(
            out,
            "## {}. {} ({}, `{}`)\n",
            i + 1,
            f.kind.as_str(),
            f.severity.as_str(),
            f.op
        );
        let _ = writeln!(out, "{}\n", f.summary);
        if !f.culprits.is_empty() {
            out.push_str("| culprit | pid | runnable time | share |\n|---|---:|---:|---:|\n");
            for c in &f.culprits {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.0}% |",
                    c.comm.replace('|', "\\|"),
                    c.pid,
                    fmt_ns(c.runnable_ns),
                    c.share * 100.0
                );
            }
            out.push('\n');
        }
        let _ = writeln!(out, "**What to do:** {}\n", f.recommendation);
        let evidence = serde_json::to_string_pretty(&f.evidence).unwrap_or_default();
        let _ = writeln!(
            out,
            "<details><summary>Evidence</summary>\n\n```json\n{evidence}\n```\n</details>\n"
        );
    }
    if !r.notes.is_empty() {
        out.push_str("## Notes\n\n");
        for n in &r.notes {
            let _ = writeln!(out, "- {n}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn findings_render_with_recommendation_and_evidence() {
        let r = explain_report(&failing_trace());
        let t = text(&r);
        assert!(t.starts_with("1. [high] allocation_failure:"));
        // Text shows the advice and the example calls; the full evidence is in --json/--markdown.
        assert!(t.contains("what to do:"), "{t}");
        assert!(t.contains("example: cudaMalloc 1073741824 bytes"), "{t}");
        assert!(t.contains("failed: out of memory"), "{t}");
        assert!(
            t.contains("(full evidence of each finding: --json or --markdown)"),
            "{t}"
        );
        let md = markdown(&r);
        assert!(md.contains("## 1. allocation_failure (high, `cudaMalloc`)"));
        assert!(md.contains("```json"));
    }

    #[test]
    fn imported_trace_states_what_cannot_be_evaluated() {
        let mut d = failing_trace();
        d.has_host_context = false;
        let t = text(&explain_report(&d));
        assert!(t.contains("Note: This trace has no host scheduler context"));
    }
}
