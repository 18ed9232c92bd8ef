//! `gpusleuth memory`: the GPU memory ledger of a recorded trace.

use crate::cmd::stats::{emit, load_trace, table};
use crate::output::{fmt_bytes, fmt_ns};
use anyhow::{bail, Context as _};
use serde::Serialize;
use sleuth_core::ledger::{ledger, ProcessLedger};
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
    /// The ledger at this moment: ns since the trace started, or a duration (1.5s, 250ms, 40us).
    #[arg(long)]
    pub at: Option<String>,
    /// Machine-readable output (the documented memory contract).
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    processes: &'a [ProcessLedger],
    /// The moment (ns since trace start) the ledger was computed at, when `--at` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    at_offset_ns: Option<u64>,
}

/// Parses `--at`: a bare integer is nanoseconds; otherwise a number with a
/// unit (ns, us, ms, s, m).
pub fn parse_at(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    if let Ok(ns) = s.parse::<u64>() {
        return Ok(ns);
    }
    let split = s
        .find(|c: char| c.is_ascii_alphabetic())
        .with_context(|| format!("--at {s:?}: expected nanoseconds or a duration like 1.5s"))?;
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .with_context(|| format!("--at {s:?}: {num:?} is not a non-negative number"))?;
    let scale = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        _ => bail!("--at {s:?}: unknown unit {unit:?} (use ns, us, ms, s or m)"),
    };
    let ns = value * scale;
    if ns > u64::MAX as f64 {
        bail!("--at {s:?}: too large");
    }
    Ok(ns.round() as u64)
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let at_offset = args.at.as_deref().map(parse_at).transpose()?;
    let data = load_trace(&args.db, args.pid)?;
    let origin = data
        .start_ns
        .or_else(|| data.calls.iter().map(|c| c.ts_ns).min())
        .unwrap_or(0);
    if let Some(o) = at_offset {
        // A moment past the end is a mistake (often an absolute timestamp
        // given where an offset is expected), not "the state at the end".
        let end = data
            .end_ns
            .or_else(|| data.calls.iter().map(|c| c.end_ns()).max())
            .unwrap_or(origin);
        let span = end.saturating_sub(origin);
        if o > span {
            anyhow::bail!(
                "--at {}: the trace lasts only {} (--at is the time since the trace started)",
                fmt_ns(o),
                fmt_ns(span)
            );
        }
    }
    let at_abs = at_offset.map(|o| origin.saturating_add(o));
    let processes = ledger(&data, at_abs);
    if args.json {
        let report = Report {
            processes: &processes,
            at_offset_ns: at_offset,
        };
        emit(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        emit(&render(&processes, origin, at_offset))?;
    }
    Ok(0)
}

/// The human rendering: one block per process.
fn render(processes: &[ProcessLedger], origin: u64, at: Option<u64>) -> String {
    let mut out = String::new();
    if let Some(at) = at {
        let _ = writeln!(out, "Ledger at {} after the trace started.\n", fmt_ns(at));
    }
    if processes.is_empty() {
        out.push_str("No traced process made CUDA calls.\n");
        return out;
    }
    let rel = |ts: u64| fmt_ns(ts.saturating_sub(origin));
    for p in processes {
        let state = if p.exit_ns.is_some() {
            "at exit"
        } else if at.is_some() {
            "at that moment"
        } else {
            "at trace end"
        };
        let _ = writeln!(out, "{} (pid {})", p.comm, p.pid);
        let _ = writeln!(out, "  device live {state}: {}", fmt_bytes(p.live_bytes));
        match p.peak_ts_ns {
            Some(ts) => {
                let _ = writeln!(
                    out,
                    "  device peak: {} at +{}",
                    fmt_bytes(p.peak_bytes),
                    rel(ts)
                );
            }
            None => out.push_str("  device peak: 0 B\n"),
        }
        if p.vmm_bytes > 0 {
            let _ = writeln!(
                out,
                "  of which cuMemCreate (virtual memory API): {}",
                fmt_bytes(p.vmm_bytes)
            );
        }
        let _ = writeln!(
            out,
            "  host pinned: {}   managed: {}   (not device memory)",
            fmt_bytes(p.host_pinned_bytes),
            fmt_bytes(p.managed_bytes)
        );
        let _ = writeln!(
            out,
            "  allocations: {}   frees: {}   unmatched frees: {}",
            p.allocs, p.frees, p.unmatched_frees
        );
        if !p.unfreed.is_empty() {
            let total: u64 = p.unfreed.iter().map(|u| u.bytes).sum();
            let _ = writeln!(
                out,
                "  unfreed: {} allocation(s), {}",
                p.unfreed.len(),
                fmt_bytes(total)
            );
            let rows: Vec<Vec<String>> = p
                .unfreed
                .iter()
                .take(20)
                .map(|u| {
                    vec![
                        format!("{:#x}", u.ptr.0),
                        fmt_bytes(u.bytes),
                        u.op.to_string(),
                        format!("+{}", rel(u.ts_ns)),
                    ]
                })
                .collect();
            for line in table(&["PTR", "BYTES", "OP", "AT"], &rows, &[0, 2]).lines() {
                let _ = writeln!(out, "    {line}");
            }
            if p.unfreed.len() > 20 {
                let _ = writeln!(out, "    ... {} more (use --json)", p.unfreed.len() - 20);
            }
        }
        for f in &p.failed_allocs {
            let _ = writeln!(
                out,
                "  FAILED: {} of {} returned {} at +{} with {} live",
                f.op,
                fmt_bytes(f.bytes),
                f.error,
                rel(f.ts_ns),
                fmt_bytes(f.live_bytes_at)
            );
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_accepts_nanoseconds_and_durations() {
        assert_eq!(parse_at("1500").unwrap(), 1500);
        assert_eq!(parse_at("1.5s").unwrap(), 1_500_000_000);
        assert_eq!(parse_at("250ms").unwrap(), 250_000_000);
        assert_eq!(parse_at("40us").unwrap(), 40_000);
        assert_eq!(parse_at("2m").unwrap(), 120_000_000_000);
        for bad in ["", "abc", "-1s", "1.5h", "1e400s", "s"] {
            assert!(parse_at(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn render_names_unfreed_and_failed() {
        let data = sleuth_core::TraceData {
            calls: vec![
                sleuth_core::CallEvent {
                    ts_ns: 100,
                    dur_ns: 10,
                    pid: 7,
                    tid: 7,
                    op: 1,
                    ret: 0,
                    size: Some(4096),
                    ptr: Some(0xabc000),
                    stream: None,
                    kind: None,
                    nested: false,
                    runnable_ns: 0,
                    blocked_ns: 0,
                    cpu: 0,
                },
                sleuth_core::CallEvent {
                    ts_ns: 200,
                    dur_ns: 10,
                    pid: 7,
                    tid: 7,
                    op: 1,
                    ret: 2,
                    size: Some(1 << 40),
                    ptr: None,
                    stream: None,
                    kind: None,
                    nested: false,
                    runnable_ns: 0,
                    blocked_ns: 0,
                    cpu: 0,
                },
            ],
            ..Default::default()
        };
        let l = ledger(&data, None);
        let text = render(&l, 0, None);
        assert!(text.contains("device live at trace end: 4.0 KiB"));
        assert!(text.contains("0xabc000"));
        assert!(text.contains("FAILED: cudaMalloc of 1.0 TiB returned 2"));
        let json = serde_json::to_value(Report {
            processes: &l,
            at_offset_ns: None,
        })
        .unwrap();
        let p = &json["processes"][0];
        for k in [
            "pid",
            "comm",
            "live_bytes",
            "peak_bytes",
            "unfreed",
            "failed_allocs",
        ] {
            assert!(p.get(k).is_some(), "missing {k}");
        }
        assert_eq!(p["unfreed"][0]["ptr"], "0xabc000");
        assert_eq!(p["failed_allocs"][0]["error"], 2);
    }
}
