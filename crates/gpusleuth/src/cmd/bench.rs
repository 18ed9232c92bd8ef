//! `gpusleuth bench`: tracing overhead and capture throughput, measured on the
//! simulated CUDA workloads in one invocation.
//!
//! Each repetition runs every workload untraced and then traced by this very
//! binary (`gpusleuth trace` as a child), interleaved, so machine drift hits
//! both sides alike. The workload times its own hot section (`stamp` steps),
//! so attach and database finalization are not counted as overhead; they are
//! reported separately through gpusleuth's CPU time and peak RSS.

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sleuth_sim::{materialize, SimPaths};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(clap::Args)]
pub struct Args {
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Repetitions of each untraced/traced pair (medians are reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub reps: u32,
    /// Kernel launches per launch-heavy run.
    #[arg(long, default_value_t = 20_000)]
    pub launches: u64,
    /// Thread round trips per context-switch-heavy run.
    #[arg(long, default_value_t = 20_000)]
    pub switches: u64,
    /// malloc+free pairs in the throughput run (4 call records each).
    #[arg(long, default_value_t = 20_000)]
    pub calls: u64,
    /// malloc+free pairs in the allocation-heavy runs (call sites on and off).
    #[arg(long = "alloc-pairs", default_value_t = 5_000)]
    pub alloc_pairs: u64,
    /// Calls in the synthetic stored trace that `stats` and `explain` are timed on.
    #[arg(long = "analysis-calls", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub analysis_calls: u64,
    /// Processes the synthetic stored trace's calls are spread over (each
    /// with the whole mix on 4 threads; pids 100, 1100, 2100, ...).
    #[arg(long = "analysis-procs", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub analysis_procs: u64,
    /// Add PyTorch caching-allocator events to the synthetic trace (what
    /// `trace --torch-allocator` stores): each process's main thread makes
    /// a 20 MiB segment and takes and gives back a 2 MiB block of it every
    /// 64 calls (2 allocator events per 64 calls).
    #[arg(long = "analysis-allocator")]
    pub analysis_allocator: bool,
    /// Give the synthetic trace the clock and pids of a node that has run
    /// for days (10 days since boot, pids near 3,000,000) instead of a
    /// machine that just booted (times from 1 ms, pids from 100): SQLite
    /// stores larger integers in more bytes, so the database's size depends
    /// on them.
    #[arg(long = "analysis-long-uptime")]
    pub analysis_long_uptime: bool,
    /// Also write the synthetic trace as a run of this many files (as
    /// `trace --rotate` leaves one: part-NNNNNN.db, each carrying the run's
    /// ledger to the next) and time `memory`, `explain` and `report` of the
    /// run's directory and `explain --last` of its last files; 0 skips it.
    #[arg(long = "analysis-run-files", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub analysis_run_files: u64,
    /// Launches per run of the tracer-footprint flood (`--launches full`,
    /// workload pinned to CPU 0; runs of N and 4N, placement on and off); 0 skips it.
    #[arg(long = "footprint-launches", default_value_t = 50_000)]
    pub footprint_launches: u64,
    /// Only the tracer-footprint flood (see --footprint-launches).
    #[arg(long = "footprint-only", conflicts_with = "analysis_only")]
    pub footprint_only: bool,
    /// Only the storage and analysis part (no eBPF, no root needed): write
    /// the synthetic trace and time each analysis command on it.
    #[arg(long = "analysis-only")]
    pub analysis_only: bool,
    /// Keep the synthetic stored trace at this path (to time other builds
    /// on it), and the run of `--analysis-run-files` at PATH.run.
    #[arg(long = "keep-trace")]
    pub keep_trace: Option<PathBuf>,
    /// Check the kept trace as `trace` checks the files it wrote (`trace
    /// --precheck`: into the checks cache, once it is 2 s old) and report
    /// what that cost; the timed commands ran before it, without the cache.
    #[arg(long = "precheck-kept", requires = "keep_trace")]
    pub precheck_kept: bool,
}

/// One workload measured untraced and traced.
#[derive(Serialize)]
struct Overhead {
    name: String,
    trace_args: Vec<String>,
    ops: u64,
    untraced_ms: f64,
    traced_ms: f64,
    ratio: f64,
    added_us_per_op: f64,
    /// Added time per op ÷ the cost of one bare probe trap (same run).
    traps_per_op: Option<f64>,
}

#[derive(Serialize)]
struct Throughput {
    calls: u64,
    events_stored: u64,
    section_ms: f64,
    events_per_s: f64,
    drops: u64,
}

/// What the tracer itself cost in one flood run (issue 16).
#[derive(Serialize)]
struct Footprint {
    launches: u64,
    /// Tracer threads placed away from the traced threads (`GPUSLEUTH_PLACEMENT`).
    placement: bool,
    events_stored: u64,
    drops: u64,
    /// Tracer CPU per stored event while tracing (the file's completion excluded).
    poller_us_per_event: f64,
    writer_us_per_event: f64,
    helpers_us_per_event: f64,
    /// Poller + writer.
    tracer_us_per_event: f64,
    /// Where that time went: the poller's and the writer's time in the
    /// kernel (system time), the writer's inside its commits (WAL writes,
    /// checkpoints), and how many transactions it committed.
    poller_sys_us_per_event: f64,
    writer_sys_us_per_event: f64,
    writer_commit_us_per_event: f64,
    writer_batches: u64,
    /// The writer's CPU per stored event completing the file after the
    /// stop (culprits, rollups, late indexes: `COMPLETION_CPU_STAT`).
    completion_us_per_event: f64,
    /// Runnable time of the traced threads, all of it and the part while one
    /// of the tracer's threads held their CPU (from the trace's wait records).
    traced_runnable_ms: f64,
    runnable_by_tracer_ms: f64,
    /// `trace`'s peak RSS, the end-of-trace summary included.
    peak_rss_mb: f64,
    /// The placement note of the trace, if any.
    placement_note: Option<String>,
}

#[derive(Serialize)]
struct Report {
    reps: u32,
    probe_trap_us: f64,
    /// Added time per call-site capture: allocation-heavy run with sites on
    /// minus the same run with `--sites off`, per runtime call (each
    /// cudaMalloc and cudaFree takes one; nested driver calls take none).
    site_capture_us: f64,
    overheads: Vec<Overhead>,
    throughput: Throughput,
    /// Writer throughput and analysis time on a large stored trace.
    analysis: super::bench_analysis::AnalysisBench,
    /// gpusleuth's own CPU time (user+sys) and peak RSS over the traced runs.
    tracer_cpu_ms_median: f64,
    tracer_peak_rss_mb: f64,
    footprint: Vec<Footprint>,
}

/// Resources of one finished child (and its waited-for descendants).
pub(super) struct Usage {
    cpu_ms: f64,
    pub(super) max_rss_kb: i64,
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(args: Args) -> Result<i32> {
    if args.analysis_only {
        return run_analysis_only(&args);
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench traces workloads with eBPF and needs root: run it with sudo");
    }
    let scratch =
        Scratch(std::env::temp_dir().join(format!("gpusleuth-bench-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0)
        .with_context(|| format!("cannot create {}", scratch.0.display()))?;
    let sim = materialize(&scratch.0).context("cannot write the simulated CUDA libraries")?;
    let exe = std::env::current_exe().context("cannot find the gpusleuth binary")?;
    let b = Bench {
        sim,
        exe,
        dir: scratch.0.clone(),
    };

    if args.footprint_only {
        let n = args.footprint_launches.max(1);
        // Interleaved repetitions: machine drift hits every configuration alike.
        let rows = (0..args.reps)
            .flat_map(|_| [(n, true), (n, false), (4 * n, true)])
            .map(|(l, p)| b.footprint(l, p))
            .collect::<Result<Vec<_>>>()?;
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&rows)?)?;
        } else {
            out!("{}", render_footprint(&rows))?;
        }
        return Ok(0);
    }
    // (name, script body, ops, trace args). `cu_launch` with one driver probe
    // per call is the reference: its added time per call is one trap.
    let n = args.launches;
    let cases: Vec<(&str, String, u64, Vec<&str>)> = vec![
        (
            "probe reference: cuLaunchKernel (1 trap)",
            format!("cu_launch {n}"),
            n,
            vec![],
        ),
        (
            "launch-heavy, default (--launches driver)",
            format!("launch {n}"),
            n,
            vec![],
        ),
        (
            "launch-heavy, --launches full",
            format!("launch {n}"),
            n,
            vec!["--launches", "full"],
        ),
        (
            "allocation-heavy, call sites on (default)",
            format!("churn {}", args.alloc_pairs),
            2 * args.alloc_pairs,
            vec![],
        ),
        (
            "allocation-heavy, --sites off",
            format!("churn {}", args.alloc_pairs),
            2 * args.alloc_pairs,
            vec!["--sites", "off"],
        ),
        (
            "context-switch-heavy (scheduler probes)",
            format!("pingpong {}", args.switches),
            2 * args.switches,
            vec![],
        ),
    ];
    let mut untraced: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut traced: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut tracer_cpu = Vec::new();
    let mut peak_rss_kb = 0i64;
    let mut workload_cpu = Vec::new();
    for rep in 0..args.reps {
        for (i, (_, body, _, trace_args)) in cases.iter().enumerate() {
            let (ms, usage) = b
                .untraced(body)
                .with_context(|| format!("untraced run {rep}"))?;
            untraced[i].push(ms);
            workload_cpu.push((i, usage.cpu_ms));
            let (ms, usage, _) = b.traced(body, trace_args)?;
            traced[i].push(ms);
            let own = workload_cpu
                .iter()
                .filter(|(j, _)| *j == i)
                .map(|(_, c)| *c)
                .fold(f64::NAN, f64::min);
            tracer_cpu.push((usage.cpu_ms - own).max(0.0));
            peak_rss_kb = peak_rss_kb.max(usage.max_rss_kb);
        }
    }
    let trap_us = (median(&traced[0]) - median(&untraced[0])) * 1000.0 / n as f64;
    // Cases 3 and 4: the same allocation-heavy run with sites on and off.
    let site_capture_us =
        (median(&traced[3]) - median(&traced[4])) * 1000.0 / (2 * args.alloc_pairs) as f64;
    let overheads = cases
        .iter()
        .enumerate()
        .map(|(i, (name, _, ops, trace_args))| {
            let (u, t) = (median(&untraced[i]), median(&traced[i]));
            let added = (t - u) * 1000.0 / *ops as f64;
            let launch = name.starts_with("launch-heavy") || i == 0;
            Overhead {
                name: name.to_string(),
                trace_args: trace_args.iter().map(|s| s.to_string()).collect(),
                ops: *ops,
                untraced_ms: u,
                traced_ms: t,
                ratio: t / u,
                added_us_per_op: added,
                traps_per_op: (launch && trap_us > 0.0).then(|| added / trap_us),
            }
        })
        .collect();

    // Throughput: many short calls, every one stored as a record.
    let body = format!("churn {}", args.calls);
    let (section_ms, usage, db) = b.traced(&body, &[])?;
    peak_rss_kb = peak_rss_kb.max(usage.max_rss_kb);
    let stats = sleuth_store::Trace::open(&db)
        .and_then(|t| t.stats())
        .with_context(|| format!("cannot read {}", db.display()))?;
    ran_as_scripted(
        "throughput churn",
        &crate::load::stats_of(&db, None)?,
        &["cudaMalloc", "cuMemAlloc_v2", "cudaFree", "cuMemFree_v2"],
        4 * args.calls,
        stats.get("drop_ring_full_call").copied().unwrap_or(0),
    )?;
    let events_stored = ["events_call", "events_wait", "events_proc"]
        .iter()
        .map(|k| stats.get(*k).copied().unwrap_or(0))
        .sum();
    let drops = stats
        .iter()
        .filter(|(k, _)| k.starts_with("drop_"))
        .map(|(_, v)| *v)
        .sum();
    let n = args.footprint_launches;
    let footprint = [(n, true), (n, false), (4 * n, true)]
        .into_iter()
        .filter(|_| n > 0)
        .map(|(l, p)| b.footprint(l, p))
        .collect::<Result<Vec<_>>>()?;
    let report = Report {
        footprint,
        reps: args.reps,
        probe_trap_us: trap_us,
        site_capture_us,
        overheads,
        throughput: Throughput {
            calls: 4 * args.calls,
            events_stored,
            section_ms,
            events_per_s: events_stored as f64 / (section_ms / 1000.0),
            drops,
        },
        tracer_cpu_ms_median: median(&tracer_cpu),
        tracer_peak_rss_mb: peak_rss_kb as f64 / 1024.0,
        analysis: super::bench_analysis::run(
            &b.dir,
            args.synthetic(),
            Some(&b.exe),
            args.keep_trace.as_deref(),
            args.precheck_kept,
            args.analysis_run_files,
        )?,
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        out!("{}", render(&report))?;
    }
    Ok(0)
}

impl Args {
    /// The synthetic stored trace the analysis part writes.
    fn synthetic(&self) -> super::bench_analysis::Synthetic {
        use super::bench_analysis::{Magnitudes, Synthetic};
        Synthetic {
            calls: self.analysis_calls,
            procs: self.analysis_procs,
            allocator: self.analysis_allocator,
            at: match self.analysis_long_uptime {
                true => Magnitudes::NODE,
                false => Magnitudes::FRESH,
            },
        }
    }
}

/// `--analysis-only`: the storage and analysis part alone.
fn run_analysis_only(args: &Args) -> Result<i32> {
    let scratch = Scratch(
        std::env::temp_dir().join(format!("gpusleuth-bench-analysis-{}", std::process::id())),
    );
    std::fs::create_dir_all(&scratch.0)
        .with_context(|| format!("cannot create {}", scratch.0.display()))?;
    let exe = std::env::current_exe().context("cannot find the gpusleuth binary")?;
    let a = super::bench_analysis::run(
        &scratch.0,
        args.synthetic(),
        Some(&exe),
        args.keep_trace.as_deref(),
        args.precheck_kept,
        args.analysis_run_files,
    )?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&a)?)?;
    } else {
        out!("{}", super::bench_analysis::render(&a))?;
    }
    Ok(0)
}

struct Bench {
    sim: SimPaths,
    exe: PathBuf,
    dir: PathBuf,
}

impl Bench {
    /// The workload's script: the body between two timestamps.
    fn script(&self, body: &str) -> Result<(String, PathBuf)> {
        let stamps = self.dir.join("stamps");
        match std::fs::remove_file(&stamps) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).context("cannot reset the timestamp file")
            }
            _ => {}
        }
        let s = stamps.display();
        Ok((format!("stamp {s}; {body}; stamp {s}"), stamps))
    }

    fn untraced(&self, body: &str) -> Result<(f64, Usage)> {
        let (script, stamps) = self.script(body)?;
        let mut cmd = Command::new(&self.sim.workload);
        cmd.arg(script);
        let usage = run_child(cmd)?;
        Ok((section_ms(&stamps)?, usage))
    }

    fn traced(&self, body: &str, trace_args: &[&str]) -> Result<(f64, Usage, PathBuf)> {
        self.traced_env(body, trace_args, true)
    }

    /// One flood of `--launches full` launches from a workload pinned to
    /// CPU 0, and what the tracer cost it.
    fn footprint(&self, launches: u64, placement: bool) -> Result<Footprint> {
        let body = format!("pin 0; launch {launches}");
        let (_, usage, db) = self.traced_env(&body, &["--launches", "full"], placement)?;
        let trace = sleuth_store::Trace::open(&db)?;
        let stats = trace.stats()?;
        let get = |k: &str| stats.get(k).copied().unwrap_or(0);
        let events_stored: u64 = ["events_call", "events_wait", "events_proc"]
            .iter()
            .map(|k| get(k))
            .sum();
        let per_event = |ns: u64| ns as f64 / 1000.0 / events_stored.max(1) as f64;
        let report = crate::load::stats_of(&db, None)?;
        ran_as_scripted(
            "footprint flood",
            &report,
            &["cudaLaunchKernel", "cuLaunchKernel"],
            2 * launches,
            get("drop_ring_full_call"),
        )?;
        let traced_runnable: u64 = report
            .threads
            .iter()
            .map(|t| t.in_calls.runnable_ns + t.between.runnable_ns)
            .sum();
        let by_tracer: u64 = report.threads.iter().map(|t| t.tracer_runnable_ns).sum();
        let placement_note = trace
            .notes()?
            .into_iter()
            .map(|n| n.text)
            .rfind(|t| t.starts_with("placement:"));
        Ok(Footprint {
            launches,
            placement,
            events_stored,
            drops: stats
                .iter()
                .filter(|(k, _)| k.starts_with("drop_"))
                .map(|(_, v)| *v)
                .sum(),
            poller_us_per_event: per_event(get("tracer_cpu_ns_poller")),
            writer_us_per_event: per_event(get("tracer_cpu_ns_writer")),
            helpers_us_per_event: per_event(get("tracer_cpu_ns_helpers")),
            tracer_us_per_event: per_event(
                get("tracer_cpu_ns_poller") + get("tracer_cpu_ns_writer"),
            ),
            poller_sys_us_per_event: per_event(get("tracer_sys_ns_poller")),
            writer_sys_us_per_event: per_event(get("tracer_sys_ns_writer")),
            writer_commit_us_per_event: per_event(get("writer_cpu_ns_commit")),
            writer_batches: get("writer_batches"),
            completion_us_per_event: per_event(get(sleuth_store::COMPLETION_CPU_STAT)),
            traced_runnable_ms: traced_runnable as f64 / 1e6,
            runnable_by_tracer_ms: by_tracer as f64 / 1e6,
            peak_rss_mb: usage.max_rss_kb as f64 / 1024.0,
            placement_note,
        })
    }

    fn traced_env(
        &self,
        body: &str,
        trace_args: &[&str],
        placement: bool,
    ) -> Result<(f64, Usage, PathBuf)> {
        let (script, stamps) = self.script(body)?;
        let db = self.dir.join("bench.db");
        let mut cmd = Command::new(&self.exe);
        cmd.args(["trace", "--quiet", "--force", "--db"])
            .arg(&db)
            .arg("--cuda-lib")
            .arg(&self.sim.libcudart)
            .arg("--cuda-lib")
            .arg(&self.sim.libcuda)
            .args(trace_args)
            // What the tracer costs while tracing, not the check of its
            // file after (which would also add an entry to the user's cache).
            .args(["--precheck", "off"])
            .arg("--")
            .arg(&self.sim.workload)
            .arg(script);
        if !placement {
            cmd.env(sleuth_probe::placement::PLACEMENT_ENV, "off");
        }
        let usage = run_child(cmd).context("traced run")?;
        Ok((section_ms(&stamps)?, usage, db))
    }
}

/// A simulated workload of the bench ran as its script says: the calls of
/// `ops` it made, stored or counted lost (`calls_lost`), are `expected`,
/// and none failed. Round 40 found the device's runs had timed launches
/// the real driver refused (the workload had loaded it through
/// `LD_LIBRARY_PATH`), each failed call carrying its call site: twice the
/// writer's cost per event, reported as the tracer's.
fn ran_as_scripted(
    what: &str,
    report: &sleuth_core::stats::StatsReport,
    ops: &[&str],
    expected: u64,
    calls_lost: u64,
) -> Result<()> {
    let counted: u64 = report
        .ops
        .iter()
        .filter(|o| ops.contains(&o.op))
        .map(|o| o.count)
        .sum();
    let seen = counted + calls_lost;
    let failed: u64 = report.ops.iter().filter_map(|o| o.errors).sum();
    if failed > 0 || seen != expected {
        anyhow::bail!(
            "the {what} did not run as scripted: {seen} calls of {} recorded or lost (expected \
             {expected}), {failed} failed; the workload may have loaded another libcuda.so.1 \
             than the simulated one",
            ops.join(", ")
        );
    }
    Ok(())
}

/// Runs a child to completion, returning its resource usage (wait4). A
/// gpusleuth child reports its own peak RSS (`crate::peak_rss`): the kernel's
/// `ru_maxrss` of a child includes the bench's resident set at the spawn,
/// a floor of tens of MB once the bench has written a large trace.
pub(super) fn run_child(mut cmd: Command) -> Result<Usage> {
    /// The child's peak RSS file, removed whatever happens.
    struct PeakFile(PathBuf);
    impl Drop for PeakFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let peak_file = PeakFile(std::env::temp_dir().join(format!(
        "gpusleuth-bench-peak-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )));
    let _ = std::fs::remove_file(&peak_file.0);
    cmd.env(crate::peak_rss::PEAK_RSS_ENV, &peak_file.0);
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start a benchmark process")?;
    let pid = child.id() as libc::pid_t;
    let mut stderr = child.stderr.context("no stderr pipe")?;
    let mut err = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut err).context("cannot read child stderr")?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own unwaited child (Child::wait was never called),
    // and both out-pointers refer to live locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    if r != pid {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        let line = err
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        bail!("benchmark process failed (status {status:#x}): {line}");
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    let reported = crate::peak_rss::read_reported(&peak_file.0);
    Ok(Usage {
        cpu_ms: tv(ru.ru_utime) + tv(ru.ru_stime),
        max_rss_kb: reported
            .and_then(|kb| i64::try_from(kb).ok())
            .unwrap_or(ru.ru_maxrss),
    })
}

/// Milliseconds between the workload's two `stamp` lines.
fn section_ms(stamps: &Path) -> Result<f64> {
    let text = std::fs::read_to_string(stamps).context("the workload wrote no timestamps")?;
    let v: Vec<u64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    match v.as_slice() {
        [a, b] if b >= a => Ok((b - a) as f64 / 1e6),
        _ => bail!("unexpected timestamps from the workload: {text:?}"),
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn render(r: &Report) -> String {
    let mut s = format!(
        "gpusleuth bench ({} reps, medians; one probe trap ≈ {:.2} µs here)\n\n{:<44} {:>9} {:>12} {:>11} {:>7} {:>11} {:>9}\n",
        r.reps, r.probe_trap_us, "workload", "ops", "untraced ms", "traced ms", "ratio", "added µs/op", "traps/op"
    );
    for o in &r.overheads {
        let traps = o
            .traps_per_op
            .map(|t| format!("{t:.2}"))
            .unwrap_or_else(|| "-".into());
        s += &format!(
            "{:<44} {:>9} {:>12.1} {:>11.1} {:>7.3} {:>11.2} {:>9}\n",
            o.name, o.ops, o.untraced_ms, o.traced_ms, o.ratio, o.added_us_per_op, traps
        );
    }
    s += &format!(
        "call sites: {:.2} µs added per capture (allocation-heavy, sites on vs --sites off; native frames only here)\n",
        r.site_capture_us
    );
    let t = &r.throughput;
    s += &format!(
        "\nthroughput: {} calls, {} events stored in {:.1} ms = {:.0} events/s, drops {}\n",
        t.calls, t.events_stored, t.section_ms, t.events_per_s, t.drops
    );
    s += &format!(
        "gpusleuth itself: {:.0} ms CPU per traced run (median), peak RSS {:.1} MB\n",
        r.tracer_cpu_ms_median, r.tracer_peak_rss_mb
    );
    s += &render_footprint(&r.footprint);
    s += &super::bench_analysis::render(&r.analysis);
    s
}

/// Tracer CPU per event added between two floods.
#[derive(Debug, PartialEq)]
struct Marginal {
    /// (smaller, larger) flood, in launches.
    launches: (u64, u64),
    poller_us: f64,
    writer_us: f64,
    tracer_us: f64,
    completion_us: f64,
    poller_sys_us: f64,
    writer_sys_us: f64,
    writer_commit_us: f64,
}

/// The CPU per event that the larger flood with placement on added to the
/// smaller one: what the tracer costs per event once the fixed costs of a
/// trace (attaching, kernel BTF, symbol reads, the end-of-trace aggregates'
/// set-up) are paid, which the per-event averages of a short flood include.
/// None without two such floods of different sizes.
fn marginal(rows: &[Footprint]) -> Option<Marginal> {
    let on: Vec<&Footprint> = rows.iter().filter(|f| f.placement).collect();
    let small = on.iter().min_by_key(|f| f.events_stored)?;
    let large = on.iter().max_by_key(|f| f.events_stored)?;
    let added = large.events_stored.checked_sub(small.events_stored)? as f64;
    if large.launches == small.launches || added <= 0.0 {
        return None;
    }
    // One per-event column: its total over the larger flood minus the smaller's, per added event.
    let per_added = |per_event: fn(&Footprint) -> f64| {
        let total = |f: &Footprint| per_event(f) * f.events_stored as f64;
        (total(large) - total(small)) / added
    };
    let poller_us = per_added(|f| f.poller_us_per_event);
    let writer_us = per_added(|f| f.writer_us_per_event);
    let completion_us = per_added(|f| f.completion_us_per_event);
    Some(Marginal {
        launches: (small.launches, large.launches),
        poller_us,
        writer_us,
        tracer_us: poller_us + writer_us,
        completion_us,
        poller_sys_us: per_added(|f| f.poller_sys_us_per_event),
        writer_sys_us: per_added(|f| f.writer_sys_us_per_event),
        writer_commit_us: per_added(|f| f.writer_commit_us_per_event),
    })
}

/// The footprint rows; empty when there are none.
fn render_footprint(rows: &[Footprint]) -> String {
    let mut s = String::new();
    if rows.is_empty() {
        return s;
    }
    s += &format!(
            "\ntracer footprint (--launches full flood, workload pinned to CPU 0):\n{:>9} {:>9} {:>9} {:>6} {:>12} {:>12} {:>12} {:>12} {:>15} {:>13} {:>15} {:>8}\n",
            "launches", "placement", "events", "drops", "poller µs/ev", "writer µs/ev", "p+w µs/ev", "helpers µs/ev", "completion µs/ev", "runnable ms", "by tracer ms", "RSS MB"
        );
    for f in rows {
        s += &format!(
                "{:>9} {:>9} {:>9} {:>6} {:>12.2} {:>12.2} {:>12.2} {:>12.2} {:>15.2} {:>13.1} {:>15.1} {:>8.1}\n",
                f.launches,
                if f.placement { "on" } else { "off" },
                f.events_stored,
                f.drops,
                f.poller_us_per_event,
                f.writer_us_per_event,
                f.tracer_us_per_event,
                f.helpers_us_per_event,
                f.completion_us_per_event,
                f.traced_runnable_ms,
                f.runnable_by_tracer_ms,
                f.peak_rss_mb
            );
    }
    if let Some(m) = marginal(rows) {
        s += &format!(
            "  per added event ({} vs {} launches, placement on): poller {:.2}, writer {:.2}, p+w {:.2} µs; completing the file after the stop {:.2} µs\n",
            m.launches.1, m.launches.0, m.poller_us, m.writer_us, m.tracer_us, m.completion_us
        );
        s += &format!(
            "    of which in the kernel: poller {:.2}, writer {:.2} µs; inside the writer's commits {:.2} µs ({})\n",
            m.poller_sys_us,
            m.writer_sys_us,
            m.writer_commit_us,
            rows.iter()
                .filter(|f| f.placement)
                .map(|f| format!("{} transactions for {} events", f.writer_batches, f.events_stored))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let notes: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter_map(|f| f.placement_note.as_deref())
        .collect();
    for note in notes {
        s += &format!("  last {note}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        launches: u64,
        placement: bool,
        events: u64,
        poller_s: f64,
        writer_s: f64,
        completion_s: f64,
    ) -> Footprint {
        let per = |s: f64| s * 1e6 / events as f64;
        Footprint {
            launches,
            placement,
            events_stored: events,
            drops: 0,
            poller_us_per_event: per(poller_s),
            writer_us_per_event: per(writer_s),
            helpers_us_per_event: 0.0,
            tracer_us_per_event: per(poller_s + writer_s),
            poller_sys_us_per_event: per(poller_s / 4.0),
            writer_sys_us_per_event: per(writer_s / 2.0),
            writer_commit_us_per_event: per(writer_s / 4.0),
            writer_batches: events / 1000,
            completion_us_per_event: per(completion_s),
            traced_runnable_ms: 0.0,
            runnable_by_tracer_ms: 0.0,
            peak_rss_mb: 0.0,
            placement_note: None,
        }
    }

    #[test]
    fn the_marginal_cost_leaves_the_fixed_cost_out() {
        // 0.2 s of fixed poller cost and 1 µs per event for each thread;
        // the completion 0.1 s fixed and 3 µs per event.
        let rows = [
            row(200_000, true, 400_000, 0.2 + 0.4, 0.4, 0.1 + 1.2),
            row(200_000, false, 400_000, 9.0, 9.0, 9.0),
            row(800_000, true, 1_600_000, 0.2 + 1.6, 1.6, 0.1 + 4.8),
        ];
        let m = marginal(&rows).unwrap();
        assert_eq!(m.launches, (200_000, 800_000));
        assert!((m.poller_us - 1.0).abs() < 1e-9, "{m:?}");
        assert!((m.writer_us - 1.0).abs() < 1e-9, "{m:?}");
        assert!((m.tracer_us - 2.0).abs() < 1e-9, "{m:?}");
        assert!((m.completion_us - 3.0).abs() < 1e-9, "{m:?}");
        assert!((m.poller_sys_us - 0.25).abs() < 1e-9, "{m:?}");
        assert!((m.writer_sys_us - 0.5).abs() < 1e-9, "{m:?}");
        assert!((m.writer_commit_us - 0.25).abs() < 1e-9, "{m:?}");
        let text = render_footprint(&rows);
        assert!(text.contains(
            "per added event (800000 vs 200000 launches, placement on): poller 1.00, writer 1.00, p+w 2.00 µs; completing the file after the stop 3.00 µs"
        ));
        assert!(
            text.contains("of which in the kernel: poller 0.25, writer 0.50 µs; inside the writer's commits 0.25 µs (400 transactions for 400000 events, 1600 transactions for 1600000 events)"),
            "{text}"
        );
        // One flood size only: nothing to subtract.
        assert_eq!(marginal(&rows[..2]), None);
    }

    #[test]
    fn a_flood_whose_launches_failed_or_went_missing_is_refused() {
        use sleuth_core::testing::{call, trace};
        let flood = |launches: u64, driver: u64, ret: i64| {
            let mut calls = Vec::new();
            for i in 0..launches {
                let mut c = call("cudaLaunchKernel", i * 1000, 100);
                c.ret = ret;
                calls.push(c);
            }
            for i in 0..driver {
                let mut c = call("cuLaunchKernel", i * 1000 + 10, 50);
                c.ret = ret;
                calls.push(c);
            }
            sleuth_core::stats::compute(&trace(calls))
        };
        let launches = ["cudaLaunchKernel", "cuLaunchKernel"];
        let check = |r, lost| ran_as_scripted("flood", &r, &launches, 20, lost);
        // Every launch a runtime and a driver call, stored or counted lost.
        assert!(check(flood(10, 10, 0), 0).is_ok());
        assert!(check(flood(10, 7, 0), 3).is_ok());
        // The driver's calls not seen (another libcuda.so.1, unprobed).
        let e = check(flood(10, 0, 0), 0).unwrap_err().to_string();
        assert!(
            e.contains("the flood did not run as scripted: 10 calls of cudaLaunchKernel, cuLaunchKernel recorded or lost (expected 20), 0 failed"),
            "{e}"
        );
        // Every call failed (a real driver without a context).
        let e = check(flood(10, 10, 3), 0).unwrap_err().to_string();
        assert!(e.contains("20 failed"), "{e}");
        // Calls of other ops are not counted as the script's.
        let e = ran_as_scripted("churn", &flood(10, 10, 0), &["cudaMalloc"], 10, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("0 calls of cudaMalloc recorded or lost (expected 10)"),
            "{e}"
        );
    }
}
