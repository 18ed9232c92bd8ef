//! `gpusleuth memory`: the GPU memory ledger of a recorded trace.

mod sites;

use crate::args::{JsonOutput, TraceInput};
use crate::load::{emit_json, emit_text, warn_input_problems_of_reads};
use crate::output::{fmt_bytes, fmt_ns};
use crate::render::processes::{split_for_text, BRIEF_LINES};
use crate::render::table::table;
use serde::Serialize;
use sleuth_core::allocator::{AllocatorState, AllocatorView};
use sleuth_core::gpu_activity::{self, GpuActivity};
use sleuth_core::held::HeldMemory;
use sleuth_core::ledger::{self, ProcessLedger};
use sleuth_store::stream::MemoryTrace;
use sleuth_store::ReadBudget;
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: TraceInput,
    /// The ledger at this moment, as time since the trace started (1.5s, 250ms, 40us, 0).
    #[arg(long, value_parser = crate::args::duration_ns, allow_hyphen_values = true)]
    pub at: Option<u64>,
    /// Per-segment view of PyTorch's caching allocator: live blocks and free
    /// bytes of each segment (needs a trace taken with `--torch-allocator`).
    #[arg(long, conflicts_with = "by_site")]
    pub segments: bool,
    /// Device memory by call site: allocated, unfreed and live at the peak
    /// per Python line or native function, with the stacks of the top sites.
    #[arg(long = "by-site")]
    pub by_site: bool,
    #[command(flatten)]
    pub out: JsonOutput,
}

/// Segments listed by `--segments` (most free bytes first), and blocks per segment.
const SEGMENT_ROWS: usize = 30;
const BLOCK_ROWS: usize = 5;

/// One process: the ledger's contract fields, plus the allocator view
/// (null when the trace has no allocator events for it).
#[derive(Serialize)]
struct ProcessReport<'a> {
    #[serde(flatten)]
    ledger: &'a ProcessLedger,
    allocator: Option<&'a AllocatorView>,
    /// What the driver (NVML) said the process held before and during the trace.
    held: Option<&'a HeldMemory>,
}

#[derive(Serialize)]
struct Report<'a> {
    /// A run's directory (`--db DIR`): the finished files read, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    files: Vec<String>,
    /// A run's directory: how its ledger was had (carried over files
    /// `--keep` deleted, or replayed and why).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
    processes: Vec<ProcessReport<'a>>,
    /// GPU busy per GPU over the trace (NVML), or `measured: false`.
    gpu_activity: &'a GpuActivity,
    /// The moment (ns since trace start) the ledger was computed at, when `--at` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    at_offset_ns: Option<u64>,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    if args.input.db.is_dir() {
        return run_of_run(&args);
    }
    let at_offset = args.at;
    let trace = crate::checks_memo::open(&args.input.db)?;
    crate::load::note_if_unfinished(&trace)?;
    // The memory calls are streamed from the store, never the whole trace.
    let mt = MemoryTrace::open(
        &trace,
        args.input.pid,
        ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT),
    )?;
    let span = mt.span;
    let origin = span.start_ns;
    if let Some(o) = at_offset {
        // A moment past the end is a mistake (often an absolute timestamp
        // given where an offset is expected), not "the state at the end".
        if o > span.duration_ns() {
            anyhow::bail!(
                "--at {}: the trace lasts only {} (--at is the time since the trace started)",
                fmt_ns(o),
                fmt_ns(span.duration_ns())
            );
        }
    }
    let at_abs = at_offset.map(|o| origin.saturating_add(o));
    let mut processes = mt.ledgers(at_abs)?;
    if args.by_site {
        // At the end of a finished trace the per-site table is stored (the
        // site rollup); else it is streamed from the memory calls, never
        // all held (`MemoryTrace::sites_streamed`).
        let stored = match at_abs {
            None => mt.stored_sites()?,
            Some(_) => None,
        };
        let sites = match stored {
            Some(s) => s,
            None => mt.sites_streamed(&processes, at_abs)?,
        };
        warn_input_problems_of_reads(&trace)?;
        let r = sites::report_of(sites, &mt.base);
        if args.out.json {
            emit_json(&r)?;
        } else {
            emit_text(&sites::render(&r))?;
        }
        return Ok(0);
    }
    // The allocator view replays its processes' memory calls beside their
    // block events (only traces taken with --torch-allocator have any),
    // read from the file at each of its passes.
    let allocators = mt.allocator_views(at_abs, &processes)?;
    // After the reads: what they skipped (`input_problems_of_reads`).
    warn_input_problems_of_reads(&trace)?;
    let data = &mt.base;
    let helds = held_by_pid(data, &mut processes, at_abs);
    let activity = gpu_activity::of_trace(data);
    let notes: Vec<String> = sleuth_core::stats::ledger_loss_note(data)
        .into_iter()
        .collect();
    if args.out.json {
        let mut r = report(&processes, &allocators, &helds, &activity, at_offset);
        r.notes = notes;
        emit_json(&r)?;
    } else {
        let mut text: String = notes.iter().map(|n| format!("Note: {n}\n\n")).collect();
        text.push_str(&render(
            &processes,
            &allocators,
            &helds,
            origin,
            match at_offset {
                Some(a) => Stand::At(a, "the trace started"),
                None if !trace.has_rollups()? => Stand::SoFar,
                None => Stand::End,
            },
            args.segments,
        ));
        emit_text(&text)?;
    }
    Ok(0)
}

/// `memory --db DIR` of a run of `trace --rotate`: the run's ledger (the
/// one the tracer carried across its files, stored in the last finished
/// one, which also covers files `--keep` deleted; else replayed from every
/// file's memory calls), the allocator views (those the tracer carried,
/// stored in the last finished file; else replayed over the files' block
/// events),
/// the driver's view and GPU busy over the files (`sleuth_store::run_explain`,
/// as `explain --db DIR` reads them). The file still being written is left
/// out with a note. With `--at` (counted from the oldest finished file's
/// start): the ledger and per-site table replayed from the memory calls of
/// the files that began by then (`run_explain::load_memory_at`), or from
/// the state the tracer stored as the file holding the moment began, and
/// the allocator views likewise (`run_allocator_begin`, round 32).
fn run_of_run(args: &Args) -> anyhow::Result<i32> {
    let dir = &args.input.db;
    if args.by_site && args.at.is_none() {
        return sites_of_run(args);
    }
    let (budget, memo) = (crate::checks_memo::budget(), crate::checks_memo::memo());
    let run = match args.at {
        Some(offset) => sleuth_store::run_explain::load_memory_at(
            dir,
            args.input.pid,
            sleuth_store::run_explain::Moment::Since(offset),
            budget,
            memo,
        )?,
        None => sleuth_store::run_explain::load_memory(dir, args.input.pid, budget, memo)?,
    };
    crate::load::note_unfinished(&run.incomplete);
    crate::load::note_finished_files(&run.files);
    crate::load::print_problems_at(dir, &run.problems);
    if args.by_site {
        // At a moment (`--at`): the replay's table, peaks included.
        let mut r = sites::report_of(run.sites_at.clone(), &run.data);
        r.files = sleuth_store::run::file_names(&run.files);
        r.notes = run.ledger_note.iter().cloned().collect();
        return emit_sites(args, &r);
    }
    let mut processes = run.ledgers.clone();
    let data = &run.data;
    let allocators = run.allocator_views()?;
    // `--at` counts from the oldest file read's start (`data.start_ns`).
    let at_abs = args
        .at
        .map(|a| data.start_ns.unwrap_or(0).saturating_add(a));
    let helds = held_by_pid(data, &mut processes, at_abs);
    let activity = gpu_activity::of_trace(data);
    let files = sleuth_store::run::file_names(&run.files);
    let notes: Vec<String> = run
        .ledger_note
        .iter()
        .cloned()
        .chain(sleuth_core::stats::ledger_loss_note(data))
        .collect();
    if args.out.json {
        let mut r = report(&processes, &allocators, &helds, &activity, args.at);
        r.files = files;
        r.notes = notes;
        emit_json(&r)?;
    } else {
        // Allocations carried from files `--keep` deleted began before the
        // oldest file kept: times count from the earliest of them (at a
        // moment the ledger is the kept files', from the oldest one's start).
        let origin = match args.at {
            Some(_) => data.start_ns.unwrap_or(0),
            None => run_origin(args, &processes, data)?,
        };
        let mut text = format!(
            "Run in {}: {} finished file(s){}, {}; times since {}.\n",
            dir.display(),
            files.len(),
            match (args.at, args.input.pid) {
                (Some(_), Some(pid)) => format!(" holding process {pid} that began by the moment"),
                (Some(_), None) => " that began by the moment".to_string(),
                _ => String::new(),
            },
            sleuth_store::run::first_to_last(&files),
            if data.start_ns.is_some_and(|s| s <= origin) {
                "the oldest file's start"
            } else {
                "the earliest allocation the run's ledger holds (made in a file --keep deleted; --at counts \
                 from the oldest file's start)"
            }
        );
        for n in &notes {
            text.push_str(&format!("Note: {n}\n"));
        }
        text.push('\n');
        text.push_str(&render(
            &processes,
            &allocators,
            &helds,
            origin,
            match args.at {
                Some(a) => Stand::At(a, "the oldest file read started"),
                None => Stand::End,
            },
            args.segments,
        ));
        emit_text(&crate::term_text::terminal_safe(&text))?;
    }
    Ok(0)
}

/// `memory --by-site --db DIR`: the run's per-site table
/// (`sleuth_store::run_report::load_sites`: the files' allocations added
/// up, unfreed from the run's ledger; no bytes at the peak).
fn sites_of_run(args: &Args) -> anyhow::Result<i32> {
    let dir = &args.input.db;
    let (run, table) = sleuth_store::run_report::load_sites(
        dir,
        args.input.pid,
        crate::checks_memo::budget(),
        crate::checks_memo::memo(),
    )?;
    crate::load::note_unfinished(&run.incomplete);
    crate::load::note_finished_files(&run.files);
    crate::load::print_problems_at(dir, &run.problems);
    let mut r = sites::report_of(table, &run.data);
    r.at_peak_known = false;
    r.files = sleuth_store::run::file_names(&run.files);
    r.notes = run.ledger_note.iter().cloned().collect();
    r.notes.push(sleuth_store::run_report::SITES_NOTE.into());
    emit_sites(args, &r)
}

/// A run's per-site table, as JSON or text.
fn emit_sites(args: &Args, r: &sites::SitesReport) -> anyhow::Result<i32> {
    if args.out.json {
        emit_json(r)?;
    } else {
        emit_text(&crate::term_text::terminal_safe(&sites::render(r)))?;
    }
    Ok(0)
}

/// What a run's times count from at its end: the earliest allocation the
/// run's ledger holds, or the oldest file's start if earlier. With `--pid`
/// the ledgers read hold that process alone, whose first allocation would
/// move the origin (round 55's tester: a 20 MiB cudaMalloc listed at
/// +3.709s, and at +3.000s with `--pid`, under the same header): the
/// whole run's ledgers are read for it, so a time means the same with and
/// without `--pid`.
fn run_origin(
    args: &Args,
    ledgers: &[ProcessLedger],
    data: &sleuth_core::TraceData,
) -> anyhow::Result<u64> {
    let start = data.start_ns.unwrap_or(u64::MAX);
    if args.input.pid.is_none() {
        return Ok(earliest(ledgers).min(start));
    }
    let (budget, memo) = (crate::checks_memo::budget(), crate::checks_memo::memo());
    let all = sleuth_store::run_explain::load_memory(&args.input.db, None, budget, memo)?;
    let start = all.data.start_ns.unwrap_or(u64::MAX).min(start);
    Ok(earliest(&all.ledgers).min(earliest(ledgers)).min(start))
}

/// The earliest moment a ledger names (an unfreed allocation, a failed
/// one, the timeline's first point); `u64::MAX` when none.
fn earliest(ledgers: &[ProcessLedger]) -> u64 {
    ledgers
        .iter()
        .flat_map(|l| {
            l.unfreed
                .iter()
                .map(|u| u.ts_ns)
                .chain(l.failed_allocs.iter().map(|f| f.ts_ns))
                .chain(l.timeline.first().map(|t| t.ts_ns))
        })
        .min()
        .unwrap_or(u64::MAX)
}

/// The driver's view per pid; a process NVML lists but the trace saw no call
/// of gets an empty ledger, so it is shown (never as holding nothing).
/// `until_ns`: the moment the ledgers stand at (`--at`), whose NVML
/// readings are those taken by then (`held::held_until`).
pub(crate) fn held_by_pid(
    data: &sleuth_core::TraceData,
    processes: &mut Vec<ProcessLedger>,
    until_ns: Option<u64>,
) -> BTreeMap<u32, HeldMemory> {
    let helds = sleuth_core::held::held_until(data, processes, until_ns);
    sleuth_core::held::list_held_only(processes, &helds, data);
    helds.into_iter().map(|h| (h.pid, h)).collect()
}

fn report<'a>(
    processes: &'a [ProcessLedger],
    allocators: &'a BTreeMap<u32, AllocatorView>,
    helds: &'a BTreeMap<u32, HeldMemory>,
    gpu_activity: &'a GpuActivity,
    at_offset_ns: Option<u64>,
) -> Report<'a> {
    Report {
        files: Vec::new(),
        notes: Vec::new(),
        processes: processes
            .iter()
            .map(|l| ProcessReport {
                ledger: l,
                allocator: allocators.get(&l.pid),
                held: helds.get(&l.pid),
            })
            .collect(),
        gpu_activity,
        at_offset_ns,
    }
}

/// The NVML lines of one process: the baseline beside the ledger, and what
/// the driver's change over the trace leaves unexplained.
fn render_held(out: &mut String, h: &HeldMemory, stand: &Stand) {
    let _ = writeln!(out, "  {}", h.line(fmt_bytes));
    if let Some(end) = h.at_end_bytes.filter(|_| h.measured) {
        if h.exited {
            // Not compared with the ledger: the driver released the
            // process's memory when it exited, which no free call shows.
            let _ = writeln!(
                out,
                "  NVML after the process exited: {} (the driver releases a process's memory at exit)",
                fmt_bytes(end)
            );
            return;
        }
        let when = match stand {
            Stand::End => "at trace end",
            Stand::SoFar => "at its last reading (the file is not finished)",
            Stand::At(..) => "at its last reading by then",
        };
        let _ = write!(out, "  NVML {when}: {}", fmt_bytes(end));
        match h.unexplained_change_bytes {
            Some(d) if d < 0 => {
                let _ = write!(
                    out,
                    "; {} less than the ledger explains (frees of memory allocated before the trace, \
                     driver-side memory)",
                    fmt_bytes(d.unsigned_abs())
                );
            }
            Some(d) if d > 0 => {
                let _ = write!(
                    out,
                    "; {} more than the ledger explains (memory the driver charges outside the traced \
                     allocation calls: context, modules, library workspaces)",
                    fmt_bytes(d as u64)
                );
            }
            _ => {}
        }
        out.push('\n');
    }
}

/// The allocator lines of one process (with `segments`, the per-segment
/// table); `traced_allocator`: some process of the answer has a view (the
/// trace was taken with `--torch-allocator`), so a process without one
/// had no allocator events read, and the option is not what it lacks.
fn render_allocator(
    out: &mut String,
    view: Option<&AllocatorView>,
    origin: u64,
    segments: bool,
    traced_allocator: bool,
) {
    match view {
        None if traced_allocator => out.push_str(
            "  allocator-level numbers (allocated, gap): no PyTorch allocator event of this process was read (not a \
             PyTorch process, its allocator made no call while traced, or, in a run, its events were in files \
             --keep deleted and the tracer's carried views could not be used)\n",
        ),
        None => out.push_str(
            "  allocator-level numbers (allocated, gap) need a trace taken with `trace --torch-allocator`\n",
        ),
        Some(v) => match (&v.state, v.refusal()) {
            (Some(s), _) => render_state(out, v, s, origin, segments),
            (None, Some(line)) => {
                let _ = writeln!(out, "  {line}");
            }
            (None, None) => {}
        },
    }
}

/// `ts` as an offset from `origin`, signed: a run's ledger holds what files
/// `--keep` deleted made before the oldest file read, which printed as
/// "+0ns" (round 60's tester: "peak 3.0 MiB at +0ns" beside 2.0 MiB live).
fn offset_from(origin: u64, ts: u64) -> String {
    match ts.checked_sub(origin) {
        Some(after) => format!("+{}", fmt_ns(after)),
        None => format!("-{}", fmt_ns(origin - ts)),
    }
}

fn render_state(
    out: &mut String,
    v: &AllocatorView,
    s: &AllocatorState,
    origin: u64,
    segments: bool,
) {
    let rel = |ts: u64| offset_from(origin, ts);
    let c = &v.calibration;
    let _ = writeln!(
        out,
        "  allocator (PyTorch): allocated {}   requested {}   rounding {}   live blocks {}",
        fmt_bytes(s.allocated_bytes),
        fmt_bytes(s.requested_bytes),
        fmt_bytes(s.rounding_bytes),
        s.live_blocks
    );
    let gap = if s.gap_bytes < 0 {
        format!("-{}", fmt_bytes(s.gap_bytes.unsigned_abs()))
    } else {
        fmt_bytes(s.gap_bytes as u64)
    };
    let _ = writeln!(
        out,
        "  reserved {} (memory_reserved(): {}; other libraries' memory: {})   gap memory_reserved() - memory_allocated(): {}",
        fmt_bytes(s.reserved_bytes),
        fmt_bytes(s.allocator_reserved_bytes),
        fmt_bytes(s.outside_allocator_bytes),
        gap
    );
    let _ = writeln!(
        out,
        "  the gap: {} pinned by live blocks (empty_cache() cannot release it) + {} in entirely free segments \
         (empty_cache() releases it)",
        fmt_bytes(s.pinned_free_bytes),
        fmt_bytes(s.releasable_bytes),
    );
    for (name, pb) in [("small", &s.pools.small), ("large", &s.pools.large)] {
        let _ = writeln!(
            out,
            "  {name} pool: {} segment(s), reserved {}, allocated {}, free {}",
            pb.segments,
            fmt_bytes(pb.reserved_bytes),
            fmt_bytes(pb.allocated_bytes),
            fmt_bytes(pb.free_bytes)
        );
    }
    let _ = writeln!(
        out,
        "  calibration: Block words requested={} size={} ptr={} (agreed in {}/{}/{} of {} mallocs){}",
        c.requested_index.unwrap_or(0),
        c.size_index.unwrap_or(0),
        c.ptr_index.unwrap_or(0),
        c.requested_agree,
        c.size_agree,
        c.ptr_agree,
        c.malloc_events,
        if s.expandable { "; expandable segments" } else { "" }
    );
    if s.counts.unmatched_frees > 0 {
        let _ = writeln!(
            out,
            "  blocks allocated before the trace and freed during it: {} ({}, from the blocks' own size field; \
             when they were allocated stays unknown)",
            s.counts.unmatched_frees,
            fmt_bytes(s.counts.unmatched_free_bytes)
        );
    }
    for i in &s.inconsistencies {
        let _ = writeln!(out, "  INCONSISTENT: {i}");
    }
    if !segments {
        return;
    }
    let mut segs: Vec<_> = s.segments.iter().collect();
    segs.sort_by(|a, b| b.free_bytes.cmp(&a.free_bytes).then(a.base.cmp(&b.base)));
    let rows: Vec<Vec<String>> = segs
        .iter()
        .take(SEGMENT_ROWS)
        .map(|g| {
            vec![
                format!("{:#x}", g.base.0),
                fmt_bytes(g.size),
                // A device allocation no allocator block used is in no
                // pool (the pool lines count the allocator's segments).
                match g.allocator_owned {
                    true => format!("{:?}", g.pool).to_lowercase(),
                    false => "-".to_string(),
                },
                g.live_block_count.to_string(),
                fmt_bytes(g.live_bytes),
                fmt_bytes(g.free_bytes),
                rel(g.since_ns),
                g.why.clone(),
            ]
        })
        .collect();
    let foreign = s.segments.iter().filter(|g| !g.allocator_owned).count();
    let _ = writeln!(
        out,
        "  segments ({}{}), most free first:",
        s.segment_count,
        match foreign {
            0 => String::new(),
            n => format!("; {n} not the caching allocator's, in no pool"),
        }
    );
    let table_text = table(
        &[
            "BASE", "SIZE", "POOL", "BLOCKS", "LIVE", "FREE", "SINCE", "WHY",
        ],
        &rows,
        &[0, 2, 7],
    );
    for line in table_text.lines() {
        let _ = writeln!(out, "    {line}");
    }
    if segs.len() > SEGMENT_ROWS {
        let _ = writeln!(
            out,
            "    ... {} more (use --json)",
            segs.len() - SEGMENT_ROWS
        );
    }
    for g in segs
        .iter()
        .take(BLOCK_ROWS)
        .filter(|g| g.free_bytes > 0 && !g.live_blocks.is_empty())
    {
        let _ = writeln!(out, "  live blocks pinning {:#x}:", g.base.0);
        for b in g.live_blocks.iter().take(BLOCK_ROWS) {
            let _ = writeln!(
                out,
                "    {:#x}  {} (requested {})  since {}{}",
                b.ptr.0,
                fmt_bytes(b.size),
                fmt_bytes(b.requested),
                rel(b.since_ns),
                b.site
                    .as_deref()
                    .map(|s| format!("  at {s}"))
                    .unwrap_or_default()
            );
        }
        if g.live_blocks.len() > BLOCK_ROWS {
            let _ = writeln!(out, "    ... {} more", g.live_blocks.len() - BLOCK_ROWS);
        }
    }
}

/// Where the ledger stands.
#[derive(Debug, Clone, Copy)]
enum Stand<'a> {
    /// At the end of a finished trace (or run).
    End,
    /// At the last event of a file still being written (or whose tracer
    /// was killed): not the trace's end (round 54's tester).
    SoFar,
    /// At a moment, this long after what `&str` names.
    At(u64, &'a str),
}

/// The human rendering: one block per process.
fn render(
    processes: &[ProcessLedger],
    allocators: &BTreeMap<u32, AllocatorView>,
    helds: &BTreeMap<u32, HeldMemory>,
    origin: u64,
    stand: Stand,
    segments: bool,
) -> String {
    let mut out = String::new();
    if let Stand::At(at, since) = stand {
        let _ = writeln!(out, "Ledger at {} after {since}.\n", fmt_ns(at));
    }
    if processes.is_empty() {
        out.push_str("No traced process made CUDA calls.\n");
        return out;
    }
    let rel = |ts: u64| offset_from(origin, ts);
    let (full, brief) = split_for_text(processes);
    // Some process has a view: the trace was taken with `--torch-allocator`.
    let traced_allocator = !allocators.is_empty();
    for p in full {
        let state = if p.exit_ns.is_some() {
            "at exit"
        } else {
            match stand {
                Stand::At(..) => "at that moment",
                Stand::SoFar => "at the last event recorded (the file is not finished)",
                Stand::End => "at trace end",
            }
        };
        let _ = writeln!(out, "{} (pid {})", p.comm, p.pid);
        let held = helds.get(&p.pid);
        if let Some(h) = held {
            render_held(&mut out, h, &stand);
        }
        match held.and_then(|h| h.before_trace_bytes).filter(|&b| b > 0) {
            // Never a bare "0 B" that reads as "holds nothing" when the driver says otherwise.
            Some(_) => {
                let _ = writeln!(
                    out,
                    "  device live {state} (allocations made during the trace): {}",
                    fmt_bytes(p.live_bytes)
                );
            }
            None => {
                let _ = writeln!(out, "  device live {state}: {}", fmt_bytes(p.live_bytes));
            }
        }
        match p.peak_ts_ns {
            Some(ts) => {
                let _ = writeln!(
                    out,
                    "  device peak: {} at {}",
                    fmt_bytes(p.peak_bytes),
                    rel(ts)
                );
            }
            None => out.push_str("  device peak: 0 B\n"),
        }
        // One line per GPU when the process used more than device 0.
        if p.devices.iter().any(|d| d.device != 0) {
            for d in &p.devices {
                let _ = writeln!(
                    out,
                    "  GPU {}: live {}, peak {}",
                    d.device,
                    fmt_bytes(d.live_bytes),
                    fmt_bytes(d.peak_bytes)
                );
            }
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
            "  allocations: {}   frees: {}   unmatched frees: {}{}",
            p.allocs,
            p.frees,
            p.unmatched_frees,
            if p.unmatched_frees > 0 {
                " (memory allocated before the trace or by another process, such as the parent a \
                 forked child inherited it from, or an allocation not seen)"
            } else {
                ""
            }
        );
        if p.unknown_ptr_allocs > 0 {
            let bound = if p.unmatched_frees > 0 {
                "; frees cannot be matched to them, so live is an upper bound"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  {} allocation(s) with an unknown pointer (the trace stored sizes only){bound}",
                p.unknown_ptr_allocs
            );
        }
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
                        u.ptr.map_or_else(|| "-".into(), |p| format!("{:#x}", p.0)),
                        fmt_bytes(u.bytes),
                        u.op.to_string(),
                        rel(u.ts_ns),
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
        for f in p.failed_allocs.iter().take(20) {
            let _ = writeln!(
                out,
                "  FAILED: {} of {} returned {} at {} with {} live",
                f.op,
                fmt_bytes(f.bytes),
                f.error,
                rel(f.ts_ns),
                fmt_bytes(f.live_bytes_at)
            );
        }
        let failed = p.failed_alloc_count();
        if failed > 20 {
            let listed = match p.failed_allocs_not_kept {
                0 => "use --json".to_string(),
                _ => format!("--json lists the first {}", ledger::MAX_FAILED_KEPT),
            };
            let _ = writeln!(out, "  ... {} more failed ({listed})", failed - 20);
        }
        render_allocator(
            &mut out,
            allocators.get(&p.pid),
            origin,
            segments,
            traced_allocator,
        );
        out.push('\n');
    }
    render_brief(&mut out, &brief, processes.len() > brief.len(), &rel);
    out
}

/// The processes `split_for_text` sums up: how many, their peaks and what
/// they left unfreed, the highest peaks a line each.
/// `after_full`: whether processes were listed in full above.
fn render_brief(
    out: &mut String,
    brief: &[&ProcessLedger],
    after_full: bool,
    rel: &dyn Fn(u64) -> String,
) {
    if brief.is_empty() {
        return;
    }
    let exited = brief.iter().filter(|p| p.exit_ns.is_some()).count();
    let unfreed: u64 = brief.iter().map(|p| p.live_bytes).sum();
    let _ = writeln!(
        out,
        "{} {}process(es), {exited} of them exited (the driver frees a process's device memory when it exits) with {} unfreed in all; the highest peaks:",
        brief.len(),
        if after_full { "more " } else { "" },
        fmt_bytes(unfreed)
    );
    for p in brief.iter().take(BRIEF_LINES) {
        let peak = match p.peak_ts_ns {
            Some(ts) => format!("peak {} at {}", fmt_bytes(p.peak_bytes), rel(ts)),
            None => "peak 0 B".to_string(),
        };
        let bytes = fmt_bytes(p.live_bytes);
        let end = match p.exit_ns {
            Some(ts) => format!("exited at {} with {bytes} unfreed", rel(ts)),
            None => format!("{bytes} live"),
        };
        let _ = writeln!(
            out,
            "  {} (pid {}): {peak}; {end}; {} allocation(s), {} free(s)",
            p.comm, p.pid, p.allocs, p.frees
        );
    }
    if brief.len() > BRIEF_LINES {
        let _ = writeln!(
            out,
            "  ... {} more (--pid N shows one in full, --json lists them all)",
            brief.len() - BRIEF_LINES
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::allocator::allocator_views;
    use sleuth_core::ledger::ledger;
    use sleuth_core::testing::{alloc, failed_alloc};

    /// Fails, showing `text`, unless it holds every one of `parts`.
    fn assert_mentions(text: &str, parts: &[&str]) {
        for p in parts {
            assert!(text.contains(p), "{p:?} missing from:\n{text}");
        }
    }

    #[test]
    fn render_names_unfreed_and_failed() {
        let data = sleuth_core::TraceData {
            calls: vec![alloc(100, 4096, 0xabc000), failed_alloc(200, 1 << 40)],
            ..Default::default()
        };
        let l = ledger(&data, None);
        let text = render(&l, &BTreeMap::new(), &BTreeMap::new(), 0, Stand::End, true);
        assert!(text.contains("device live at trace end: 4.0 KiB"));
        assert!(text.contains("0xabc000"));
        assert!(text.contains("FAILED: cudaMalloc of 1.0 TiB returned 2"));
        let json = serde_json::to_value(report(
            &l,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &gpu_activity::busy(None, None),
            None,
        ))
        .unwrap();
        let p = &json["processes"][0];
        for k in [
            "pid",
            "comm",
            "live_bytes",
            "peak_bytes",
            "unfreed",
            "failed_allocs",
            "allocator",
        ] {
            assert!(p.get(k).is_some(), "missing {k}");
        }
        assert!(p["allocator"].is_null());
        assert!(p["held"].is_null(), "no NVML reading: no baseline");
        assert_eq!(p["allocated_bytes"], 4096);
        assert_eq!(json["gpu_activity"]["measured"], false);
        assert!(text.contains("need a trace taken with `trace --torch-allocator`"));
        assert_eq!(p["unfreed"][0]["ptr"], "0xabc000");
        assert_eq!(p["failed_allocs"][0]["error"], 2);
    }

    /// The moment's line says what its time counts from: a run's oldest
    /// file read, not "the trace" (round 53's tester).
    #[test]
    fn the_moment_says_what_it_counts_from() {
        let data = sleuth_core::TraceData {
            calls: vec![alloc(100, 4096, 0xabc000)],
            ..Default::default()
        };
        let l = ledger(&data, Some(1_500_000_000));
        let (none, one) = (&BTreeMap::new(), &BTreeMap::new());
        for since in ["the trace started", "the oldest file read started"] {
            let text = render(&l, none, one, 0, Stand::At(1_500_000_000, since), false);
            assert!(
                text.starts_with(&format!("Ledger at 1.500s after {since}.\n")),
                "{text}"
            );
            assert!(
                text.contains("device live at that moment: 4.0 KiB"),
                "{text}"
            );
        }
        // A file not finished does not end where the ledger stands.
        let l = ledger(&data, None);
        let text = render(&l, none, one, 0, Stand::SoFar, false);
        assert!(
            text.contains(
                "device live at the last event recorded (the file is not finished): 4.0 KiB"
            ),
            "{text}"
        );
        assert!(!text.contains("trace end"), "{text}");
    }

    /// A ledger of process `pid` that left `live` bytes, peaked at `peak`,
    /// exited when `exit` is given, with `failed` failed allocations.
    fn brief_ledger(
        pid: u32,
        live: u64,
        peak: u64,
        exit: Option<u64>,
        failed: u64,
    ) -> ProcessLedger {
        let mut l = ledger::empty_ledger(pid, format!("job{pid}"), exit);
        (l.live_bytes, l.peak_bytes, l.peak_ts_ns) = (live, peak, Some(1_000));
        (l.allocs, l.failed_allocs_not_kept) = (1, failed);
        l
    }

    /// Many processes (a node agent's run): in full only those still
    /// running and those with a failed allocation (at most sixteen, most
    /// live bytes first, listed by pid); the rest summed up in one line,
    /// the ten highest peaks a line each, then how many more. Up to
    /// sixteen: every one in full.
    #[test]
    fn many_processes_list_in_full_only_those_that_matter_now() {
        let mut l: Vec<ProcessLedger> = (0..36u32)
            .map(|i| brief_ledger(1000 + i, 4096, 4096 * u64::from(i + 1), Some(5_000), 0))
            .collect();
        l.push(brief_ledger(10, 1 << 30, 1 << 30, None, 0));
        l.push(brief_ledger(20, 0, 8 << 20, Some(9_000), 3));
        l.push(brief_ledger(30, 0, 0, Some(9_000), 0));
        l.sort_by_key(|p| p.pid);
        let helds = BTreeMap::new();
        let text = render(&l, &BTreeMap::new(), &helds, 0, Stand::End, false);
        let full: Vec<&str> = text
            .lines()
            .filter(|t| t.ends_with(")") && !t.starts_with(' '))
            .collect();
        assert_eq!(full, ["job10 (pid 10)", "job20 (pid 20)"], "{text}");
        assert!(
            text.contains("37 more process(es), 37 of them exited (the driver frees a process's device memory when it exits) with 144.0 KiB unfreed in all; the highest peaks:"),
            "{text}"
        );
        let brief: Vec<&str> = text.lines().filter(|t| t.starts_with("  job1")).collect();
        assert_eq!(brief.len(), 10, "{text}");
        assert!(brief[0].starts_with("  job1035 (pid 1035): peak 144.0 KiB at +1.0us; exited at +5.0us with 4.0 KiB unfreed; 1 allocation(s), 0 free(s)"), "{text}");
        assert!(brief[9].starts_with("  job1026 (pid 1026)"), "{text}");
        assert!(text.contains("  ... 27 more (--pid N shows one in full, --json lists them all)"));
        // Sixteen: all in full, nothing summed up.
        let text = render(&l[..16], &BTreeMap::new(), &helds, 0, Stand::End, false);
        assert!(!text.contains("process(es)"), "{text}");
        assert_eq!(text.matches("device live").count(), 16);
        // More running processes than that: the sixteen holding the most
        // in full, the others a line each, live.
        let running: Vec<ProcessLedger> = (0..20u32)
            .map(|i| brief_ledger(i, u64::from(i) << 20, u64::from(i) << 20, None, 0))
            .collect();
        let text = render(
            &running,
            &BTreeMap::new(),
            &BTreeMap::new(),
            0,
            Stand::End,
            false,
        );
        assert_eq!(text.matches("device live").count(), 16, "{text}");
        assert!(
            text.contains("job4 (pid 4)\n") && !text.contains("job3 (pid 3)\n"),
            "{text}"
        );
        assert!(
            text.contains("4 more process(es), 0 of them exited"),
            "{text}"
        );
        assert!(
            text.contains("  job3 (pid 3): peak 3.0 MiB at +1.0us; 3.0 MiB live;"),
            "{text}"
        );
    }

    /// Many failures: twenty lines, then how many more and where the
    /// kept ones are listed; the JSON counts every one.
    #[test]
    fn many_failures_are_summed_up_after_twenty_lines() {
        let n = ledger::MAX_FAILED_KEPT as u64 + 30;
        let data = sleuth_core::TraceData {
            calls: (0..n).map(|i| failed_alloc(100 + i, 1 << 40)).collect(),
            ..Default::default()
        };
        let l = ledger::ledger(&data, None);
        let text = render(&l, &BTreeMap::new(), &BTreeMap::new(), 0, Stand::End, true);
        assert_eq!(text.matches("FAILED: ").count(), 20, "{text}");
        assert!(
            text.contains(&format!(
                "... {} more failed (--json lists the first {})",
                n - 20,
                ledger::MAX_FAILED_KEPT
            )),
            "{text}"
        );
        let json = serde_json::to_value(report(
            &l,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &gpu_activity::busy(None, None),
            None,
        ))
        .unwrap();
        let p = &json["processes"][0];
        assert_eq!(
            p["failed_allocs"].as_array().unwrap().len(),
            ledger::MAX_FAILED_KEPT
        );
        assert_eq!(p["failed_allocs_not_kept"], 30);
    }

    #[test]
    fn memory_held_before_the_trace_is_shown_beside_the_ledger() {
        use sleuth_core::{ProcessGpuSample, SamplePhase};
        let mb = 1u64 << 20;
        let row = |ts, pid, b, phase| ProcessGpuSample {
            ts_ns: ts,
            gpu: 0,
            pid,
            used_bytes: Some(b),
            sm_pct: None,
            phase,
        };
        let mut data = sleuth_core::TraceData {
            calls: vec![sleuth_core::CallEvent {
                ts_ns: 100,
                dur_ns: 10,
                pid: 7,
                tid: 7,
                op: sleuth_core::op_by_name("cudaFree").unwrap().id,
                ptr: Some(0xdead),
                ..Default::default()
            }],
            process_gpu: vec![
                row(10, 7, 1190 * mb, SamplePhase::Start),
                row(10, 8, 5 * mb, SamplePhase::Start),
                row(900, 7, 1190 * mb, SamplePhase::End),
                row(900, 8, 5 * mb, SamplePhase::End),
            ],
            ..Default::default()
        };
        data.stats
            .insert(sleuth_core::held::PROCESS_POLLS_STAT.into(), 2);
        let mut l = ledger(&data, None);
        let helds = held_by_pid(&data, &mut l, None);
        assert_eq!(l.len(), 2, "pid 8 made no call but holds memory: shown");
        let text = render(&l, &BTreeMap::new(), &helds, 0, Stand::End, false);
        assert_mentions(
            &text,
            &[
                "held before tracing: 1.2 GiB (NVML)",
                "allocations made before the trace are not itemized",
                "during the trace: +0 B / -0 B",
                "1 free(s) of memory allocated before the trace",
                "device live at trace end (allocations made during the trace): 0 B",
                "held before tracing: 5.0 MiB (NVML)",
            ],
        );
        assert!(!text.contains("device live at trace end: 0 B"), "{text}");
    }

    /// `memory --at T` compares NVML's readings taken by T with the ledger
    /// at T: the trace end's reading beside the moment's ledger put the
    /// allocations made after T in "more than the ledger explains", and a
    /// process that exited after T read as exited (round 55).
    #[test]
    fn at_a_moment_nvml_is_read_as_it_stood_then() {
        let mb = 1u64 << 20;
        use sleuth_core::SamplePhase;
        let row = |ts, b, phase| sleuth_core::ProcessGpuSample {
            ts_ns: ts,
            gpu: 0,
            pid: 7,
            used_bytes: Some(b),
            sm_pct: None,
            phase,
        };
        let alloc = |ts, ptr| sleuth_core::CallEvent {
            ts_ns: ts,
            dur_ns: 10,
            pid: 7,
            tid: 7,
            op: sleuth_core::op_by_name("cudaMalloc").unwrap().id,
            ptr: Some(ptr),
            size: Some(64 * mb),
            ..Default::default()
        };
        let mut data = sleuth_core::TraceData {
            start_ns: Some(0),
            end_ns: Some(1_000),
            calls: vec![alloc(100, 0xa000), alloc(500, 0xb000)],
            processes: vec![sleuth_core::ProcessInfo {
                pid: 7,
                comm: "train".into(),
                exit_ns: Some(950),
                ..Default::default()
            }],
            process_gpu: vec![
                row(10, 300 * mb, SamplePhase::Start),
                row(200, 364 * mb, SamplePhase::Sample),
                row(600, 428 * mb, SamplePhase::Sample),
                row(960, 0, SamplePhase::End),
            ],
            ..Default::default()
        };
        data.stats
            .insert(sleuth_core::held::PROCESS_POLLS_STAT.into(), 3);
        let mut l = ledger(&data, Some(300));
        let helds = held_by_pid(&data, &mut l, Some(300));
        let h = &helds[&7];
        assert_eq!(h.at_end_bytes, Some(364 * mb), "the last reading by then");
        assert!(!h.exited, "it exits after the moment");
        assert_eq!(
            h.unexplained_change_bytes, None,
            "a reading lags the ledger"
        );
        let text = render(
            &l,
            &BTreeMap::new(),
            &helds,
            0,
            Stand::At(300, "the trace started"),
            false,
        );
        assert_mentions(
            &text,
            &[
                "NVML at its last reading by then: 364.0 MiB",
                "during the trace: +64.0 MiB / -0 B",
                "device live at that moment (allocations made during the trace): 64.0 MiB",
            ],
        );
        assert!(
            !text.contains("exited") && !text.contains("explains"),
            "{text}"
        );
        // At the end the whole trace stands, as before.
        let mut l = ledger(&data, None);
        let helds = held_by_pid(&data, &mut l, None);
        assert!(helds[&7].exited);
        assert_eq!(helds[&7].at_end_bytes, Some(0));
    }

    /// A traced PyTorch-like process: one 20 MiB segment, two blocks, one freed.
    fn torch_trace() -> sleuth_core::TraceData {
        let call = |ts, op: &str, size, ptr| sleuth_core::CallEvent {
            ts_ns: ts,
            dur_ns: 10,
            pid: 9,
            tid: 9,
            op: sleuth_core::op_by_name(op).unwrap().id,
            size,
            ptr,
            ..Default::default()
        };
        let base = 0x7f00_0000_0000u64;
        sleuth_core::TraceData {
            calls: vec![call(100, "cudaMalloc", Some(20 << 20), Some(base))],
            blocks: sleuth_core::testing::torch_blocks(9, base, [200, 300, 400]).to_vec(),
            ..Default::default()
        }
    }

    /// In a trace taken with `--torch-allocator` (some process has a
    /// view), a process without one is not told to take such a trace
    /// (round 53's tester).
    #[test]
    fn a_process_without_allocator_events_beside_one_with_is_said_so() {
        let mut data = torch_trace();
        let mut other = data.calls[0].clone();
        (other.pid, other.tid, other.ptr) = (10, 10, Some(0x6000_0000_0000));
        data.calls.push(other);
        let l = ledger(&data, None);
        let a = allocator_views(&data, None, &l);
        assert_eq!(a.len(), 1);
        let text = render(&l, &a, &BTreeMap::new(), 0, Stand::End, false);
        assert!(
            text.contains("no PyTorch allocator event of this process was read"),
            "{text}"
        );
        assert!(!text.contains("need a trace taken with"), "{text}");
    }

    #[test]
    fn allocator_view_in_text_segments_and_json() {
        let data = torch_trace();
        let l = ledger(&data, None);
        let a = allocator_views(&data, None, &l);
        let text = render(&l, &a, &BTreeMap::new(), 0, Stand::End, true);
        assert_mentions(
            &text,
            &[
                "allocator (PyTorch): allocated 512 B   requested 300 B   rounding 212 B",
                "gap memory_reserved() - memory_allocated(): 20.0 MiB",
                "1 live block(s) pin it",
                "live blocks pinning 0x7f0000000000:",
            ],
        );
        let json = serde_json::to_value(report(
            &l,
            &a,
            &BTreeMap::new(),
            &gpu_activity::busy(None, None),
            None,
        ))
        .unwrap();
        let p = &json["processes"][0];
        assert_eq!(p["live_bytes"], 20 << 20);
        let al = &p["allocator"];
        assert_eq!(al["calibration"]["recognised"], true);
        assert_eq!(al["allocated_bytes"], 512);
        assert_eq!(al["gap_bytes"], (20 << 20) - 512);
        assert_eq!(al["segments"][0]["free_bytes"], (20 << 20) - 512);
        assert!(al["pools"]["large"].is_object());

        // A plain cudaMalloc no block used is in no pool (round 54's
        // tester: listed as a "large" segment beside "large pool: 1
        // segment(s)").
        let mut plain = torch_trace();
        let other = sleuth_core::CallEvent {
            ts_ns: 50,
            ptr: Some(0x7f10_0000_0000),
            ..plain.calls[0].clone()
        };
        plain.calls.insert(0, other);
        let l = ledger(&plain, None);
        let a = allocator_views(&plain, None, &l);
        let text = render(&l, &a, &BTreeMap::new(), 0, Stand::End, true);
        assert_mentions(
            &text,
            &[
                "large pool: 1 segment(s)",
                "segments (2; 1 not the caching allocator's, in no pool), most free first:",
            ],
        );
        let foreign = text
            .lines()
            .find(|l| l.contains("0x7f1000000000") && l.contains("no allocator block ever used it"))
            .expect("the plain allocation's row");
        assert!(foreign.contains(" - "), "{foreign}");
        assert!(!foreign.contains("large"), "{foreign}");

        // A layout that cannot be calibrated is refused, in words.
        let mut bad = torch_trace();
        for b in &mut bad.blocks {
            b.words = [0; sleuth_core::event::BLOCK_WORDS];
        }
        let l = ledger(&bad, None);
        let a = allocator_views(&bad, None, &l);
        let text = render(&l, &a, &BTreeMap::new(), 0, Stand::End, false);
        assert!(text.contains("allocator layout not recognised: "), "{text}");
        assert!(text.contains("showing the CUDA-level view"), "{text}");
    }
}
