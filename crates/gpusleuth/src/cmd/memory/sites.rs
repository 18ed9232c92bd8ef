//! `gpusleuth memory --by-site`: device memory grouped by the line (or
//! native function) that allocated it, with the full stack of the top sites.

use crate::output::fmt_bytes;
use crate::render::table::table;
use serde::Serialize;
use sleuth_core::sites::{SiteMemory, Stack};
use sleuth_core::TraceData;
use std::fmt::Write as _;

/// Sites listed in text; the JSON has them all.
const SITE_ROWS: usize = 20;
/// Sites whose stack is printed under the table, and frames per stack.
const STACKS_SHOWN: usize = 3;
const FRAMES_SHOWN: usize = 12;

#[derive(Serialize)]
pub struct SitesReport<'a> {
    pub sites: Vec<SiteMemory>,
    /// Full stacks of the listed sites' examples, by id.
    pub stacks: Vec<&'a Stack>,
    /// Whether the trace captured any site at all.
    pub captured: bool,
    /// Whether `at_peak_bytes` is known: not over a run's files (zero there).
    pub at_peak_known: bool,
    /// A run's directory: the files read, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The report of the sites (stored by a finished trace's site rollup, or
/// streamed from the memory calls: `MemoryTrace::sites_streamed`).
pub fn report_of(sites: Vec<SiteMemory>, data: &TraceData) -> SitesReport<'_> {
    let stacks = sites
        .iter()
        .filter_map(|s| s.example_stack.and_then(|id| data.stacks.get(&id)))
        .collect();
    SitesReport {
        sites,
        stacks,
        captured: !data.stacks.is_empty(),
        at_peak_known: true,
        files: Vec::new(),
        notes: Vec::new(),
    }
}

pub fn render(r: &SitesReport) -> String {
    let mut out = String::new();
    if !r.captured {
        out.push_str(
            "no call sites in this trace (taken with --sites off, by an older gpusleuth, or imported)\n",
        );
    }
    let _ = writeln!(
        out,
        "Device memory by call site ({} site{}; unfreed = still allocated at exit, at the end, or at --at's moment; at peak = live at the process's peak)",
        r.sites.len(),
        if r.sites.len() == 1 { "" } else { "s" }
    );
    for n in &r.notes {
        let _ = writeln!(out, "Note: {n}");
    }
    let rows: Vec<Vec<String>> = r
        .sites
        .iter()
        .take(SITE_ROWS)
        .map(|s| {
            vec![
                s.site.clone(),
                s.allocs.to_string(),
                fmt_bytes(s.alloc_bytes),
                format!("{} ({})", fmt_bytes(s.unfreed_bytes), s.unfreed),
                match r.at_peak_known {
                    true => fmt_bytes(s.at_peak_bytes),
                    false => "–".into(),
                },
                if s.failed > 0 {
                    format!("{} ({})", s.failed, fmt_bytes(s.failed_bytes))
                } else {
                    "0".into()
                },
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "SITE",
            "ALLOCS",
            "ALLOCATED",
            "UNFREED",
            "AT PEAK",
            "FAILED",
        ],
        &rows,
        &[0],
    ));
    if r.sites.len() > SITE_ROWS {
        let _ = writeln!(out, "  ... {} more (use --json)", r.sites.len() - SITE_ROWS);
    }
    for s in r.sites.iter().take(STACKS_SHOWN) {
        let Some(stack) = s
            .example_stack
            .and_then(|id| r.stacks.iter().find(|st| st.id == id))
        else {
            continue;
        };
        let _ = writeln!(out, "\n{} — stack {:#x}:", s.site, stack.id);
        for f in stack.frames.iter().take(FRAMES_SHOWN) {
            let _ = writeln!(out, "    {}", f.label());
        }
        if stack.frames.len() > FRAMES_SHOWN {
            let _ = writeln!(
                out,
                "    ... {} more frames",
                stack.frames.len() - FRAMES_SHOWN
            );
        }
        for n in &stack.notes {
            let _ = writeln!(out, "    ({n})");
        }
    }
    out
}
