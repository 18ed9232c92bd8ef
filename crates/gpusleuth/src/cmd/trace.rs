//! `gpusleuth trace`: capture CUDA calls and host context into a trace database.

use crate::gpu_sampler::{self, GpuSampler};
use crate::held_child::{self, HeldChild};
use crate::live::{Frame, LiveFeed, LiveView};
use crate::{procinfo, signals};
use anyhow::{bail, Context, Result};
use sleuth_core::record::stat;
use sleuth_core::stats::{EDGE_CUT_BY_EXIT, EDGE_OPEN_AT_END};
use sleuth_probe::{discover, monotonic_ns, CaptureSession, Captured, LaunchMode, SessionOptions};
use sleuth_store::{
    LibraryInfo, NoteLevel, SessionInfo, TraceWriter, WriteSummary, WriterHandle, WriterOptions,
};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod earlier;
mod end_notes;
mod rotation;
use earlier::EarlierFiles;
use end_notes::{coverage_warning, lost_warning};
use rotation::Rotation;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  sudo gpusleuth trace -- python3 train.py\n  sudo gpusleuth trace --pid 4821 --duration 30s\n  sudo gpusleuth trace            (every process that uses CUDA, until Ctrl-C)"
)]
pub struct Args {
    /// Trace database to write (default: ./gpusleuth-YYYYMMDD-HHMMSS.db).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Replace the database file if it exists.
    #[arg(long)]
    pub force: bool,
    /// Attach to running processes (repeatable; their descendants are traced too: those running at the attach and those forked later).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Stop after this long (e.g. 30s, 500ms, 2m; a unit is required).
    #[arg(long, value_parser = crate::args::positive_duration)]
    pub duration: Option<Duration>,
    /// What happens to a launched command still running when --duration
    /// ends the trace: `leave` it running (untraced; its pid is printed) or
    /// `kill` it (SIGTERM, SIGKILL after 5 s; its last calls are recorded;
    /// `trace` then exits with the command's status, as whenever it ends:
    /// 143 after SIGTERM, 137 after SIGKILL).
    #[arg(
        long = "on-duration",
        value_enum,
        default_value = "leave",
        requires = "duration"
    )]
    pub on_duration: OnDuration,
    /// How kernel launches are captured.
    #[arg(
        long,
        default_value = "driver",
        value_parser = clap::builder::TypedValueParser::map(
            clap::builder::EnumValueParser::<Launches>::new(),
            LaunchMode::from
        )
    )]
    pub launches: LaunchMode,
    /// Also probe PyTorch's caching allocator (libc10_cuda.so): allocated vs
    /// reserved, the blocks that pin each segment (`memory --segments`). Costs
    /// two probe hits per tensor allocation and per free.
    #[arg(long = "torch-allocator")]
    pub torch_allocator: bool,
    /// Also probe this library file: libcudart.so*, libcuda.so* or libc10_cuda.so (repeatable).
    #[arg(long = "cuda-lib", value_name = "PATH")]
    pub cuda_libs: Vec<PathBuf>,
    /// Database size cap (e.g. 512M, 2G); past it calls are counted, not
    /// stored. With --rotate it caps each file (the next file starts empty).
    #[arg(long = "max-db", default_value = "1G", value_parser = crate::args::db_cap)]
    pub max_db: u64,
    /// Start a new file every DURATION (e.g. 1h, 10m): --db then names a
    /// directory that receives part-000001.db, part-000002.db, ..., each a
    /// complete trace; `stats --db DIR` answers over the whole run.
    #[arg(long, value_name = "DURATION", value_parser = crate::args::positive_duration)]
    pub rotate: Option<Duration>,
    /// With --rotate: keep only the last N files (the oldest are deleted
    /// once the next one is complete; the file being written is never deleted).
    #[arg(long, value_name = "N", requires = "rotate", value_parser = clap::value_parser!(u64).range(1..))]
    pub keep: Option<u64>,
    /// Check finished files as their first reader would (after waiting for
    /// each to be 2 s old) and keep what they passed in the checks cache, so
    /// the first command on them skips those checks; `off` never. The last
    /// file is checked before `trace` exits if it has at least SIZE (Ctrl-C
    /// skips it); a run's rotated files in the background whatever their
    /// size, while the trace runs (a run's readers open all of them).
    #[arg(long, value_name = "SIZE|off", default_value = crate::precheck::DEFAULT_MIN, value_parser = crate::precheck::parse_min)]
    pub precheck: crate::precheck::MinBytes,
    /// Kernel ring buffer size (e.g. 8M, 64M; rounded up to a power of two,
    /// at least 4K): more absorbs longer bursts before events are dropped
    /// (drops are always counted and reported).
    /// It counts once in the tracer's resident memory (its pages are mapped
    /// once): 4M takes 4 MiB off, at half the room.
    #[arg(long = "ring-size", default_value = "8M", value_parser = crate::args::size)]
    pub ring_size: u64,
    /// Call sites (Python file/function/line and native frames) of
    /// allocations, frees, failed and slow calls: on or off.
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub sites: bool,
    /// Also capture the site of any recorded call at least this long
    /// (e.g. 1ms, 500us; 0 turns it off). Launches are never captured.
    #[arg(long = "site-slow", default_value = "1ms", value_parser = crate::args::duration)]
    pub site_slow: Duration,
    /// Complete, on a low-priority thread while this trace records, the
    /// files earlier tracers left unfinished beside its output (killed:
    /// SIGKILL, the OOM killer, a node that went down): the runs and the
    /// `gpusleuth-*.db` files in its directory, as `gpusleuth finish --db`
    /// of that directory does. For a service or pod that writes a run per
    /// start; what it did is noted in this trace.
    #[arg(long = "finish-killed")]
    pub finish_killed: bool,
    /// Create this file once probes are attached (for scripts and tests).
    #[arg(long = "ready-file", value_name = "PATH")]
    pub ready_file: Option<PathBuf>,
    /// Serve OpenMetrics on http://ADDR/metrics while tracing (a bare port binds loopback).
    #[arg(long, value_name = "ADDR", value_parser = crate::metrics::parse_addr)]
    pub metrics: Option<std::net::SocketAddr>,
    /// No live view; only the final summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// The command to launch and trace, with its children (any bytes: a
    /// file name that is not UTF-8 is passed on as it is).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<std::ffi::OsString>,
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("'{s}' is not on or off")),
    }
}

/// `--launches`, as clap lists and checks it; the probe layer's own type
/// stays free of clap.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Launches {
    /// Count cuLaunchKernel/Ex in the kernel (1 trap per launch).
    Driver,
    /// Also count cudaLaunchKernel (2 traps per runtime launch).
    All,
    /// Per-call latency and errors (4 traps per runtime launch).
    Full,
    /// Do not probe launches.
    Off,
}

impl From<Launches> for LaunchMode {
    fn from(l: Launches) -> LaunchMode {
        match l {
            Launches::Driver => LaunchMode::Driver,
            Launches::All => LaunchMode::All,
            Launches::Full => LaunchMode::Full,
            Launches::Off => LaunchMode::Off,
        }
    }
}

/// `--on-duration`: the launched command's fate when the time is up.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum OnDuration {
    /// Stop tracing; the command keeps running, untraced.
    Leave,
    /// End the command: SIGTERM, then SIGKILL after 5 s.
    Kill,
}

/// How long a command ended by `--on-duration kill` gets after each signal.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// What is being traced.
enum Target {
    Launch(Vec<std::ffi::OsString>),
    Pids(Vec<u32>),
    All,
}

/// Where a trace without `--db` goes: a name of its start time in the
/// working directory, one not taken (a service restarted within the second
/// gets `-2`, `-3`, ...): the deploy files rely on it, since a restarted
/// tracer must never stop at an earlier start's trace (docs/deploy.md).
fn default_db_path(rotating: bool) -> PathBuf {
    let stamp = chrono::Local::now()
        .format("gpusleuth-%Y%m%d-%H%M%S")
        .to_string();
    free_name(&stamp, if rotating { "" } else { ".db" }, |p| {
        std::fs::symlink_metadata(p).is_ok()
    })
}

/// `{stem}{ext}`, or the first of `{stem}-2{ext}`, `{stem}-3{ext}`, ...
/// that `taken` says is free. A name taken between this look and the
/// trace's creation is still refused there: nothing is ever overwritten.
fn free_name(stem: &str, ext: &str, taken: impl Fn(&Path) -> bool) -> PathBuf {
    (1u32..)
        .map(|n| match n {
            1 => PathBuf::from(format!("{stem}{ext}")),
            n => PathBuf::from(format!("{stem}-{n}{ext}")),
        })
        .find(|p| !taken(p))
        .expect("some suffix is free")
}

/// Finds a command the way execvp will.
fn resolve_in_path(cmd: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt as _;
    if cmd.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(cmd));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

/// A launched command as one line of text (stored and shown as a label:
/// bytes that are not UTF-8 replaced).
fn command_line(cmd: &[std::ffi::OsString]) -> String {
    cmd.iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

fn realtime_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

fn uname_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The run's clock base (`sleuth_store::file_clock`), an hour before its
/// start unless `GPUSLEUTH_CLOCK_MARGIN_S` names another margin.
fn clock_base(start_mono: u64) -> Result<u64> {
    use sleuth_store::file_clock::{clock_base_with_margin, MARGIN_ENV, MARGIN_NS};
    let margin = match std::env::var(MARGIN_ENV) {
        Err(_) => MARGIN_NS,
        Ok(v) => match v.parse::<u64>() {
            Ok(s) if s <= 86_400 * 365 => s * 1_000_000_000,
            _ => {
                bail!("{MARGIN_ENV}={v:?}: a whole number of seconds (at most a year) is expected")
            }
        },
    };
    Ok(clock_base_with_margin(start_mono, margin))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// At most two malloc arenas for the whole tracer. glibc gives each thread
/// that allocates its own arena (up to 8 per CPU) and keeps what it frees
/// resident there: with the poller, writer, live view, symbolizer and GPU
/// sampler each holding one, the tracer's anonymous memory on the 16-CPU
/// H200 host was 26 MiB; capped at two, 14 MiB (scripts/gpu/tracer_smaps.py,
/// docs/benchmarks.md). The threads allocate in batches, not per event, so
/// sharing arenas costs no measurable contention.
///
/// And fixed thresholds: blocks of 1 MiB or more are mapped (and given
/// back when freed), free memory at the top of an arena is kept up to
/// 8 MiB. glibc's default raises its mmap threshold to the size of each
/// large block freed (up to 32 MiB), after which the ledgers and lists a
/// file's completion builds came from the arenas and stayed resident when
/// freed: a trace of a program holding 65,536 allocations peaked at
/// 57-68 MB in one file (56 MB with these thresholds) and 91-101 MB with
/// `--rotate 1s` (docs/benchmarks.md "Live and failed allocations in the
/// tracer's footprint (round 21)"). A fixed mmap threshold alone also
/// fixes the trim threshold at 128 KiB, and the arenas' tops shrinking and
/// growing again cost the poller 10% per event; at 8 MiB no cost shows
/// (`scripts/tracer_ab.py`, 5 interleaved reps).
fn tune_malloc() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes tuning parameters of glibc's allocator;
    // called first in `trace`, before the tracer starts its threads.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 8 << 20);
    }
}

pub fn run(args: Args) -> Result<i32> {
    // From the start: a SIGTERM or Ctrl-C while the probes attach stops
    // the trace cleanly instead of killing it with its file unfinished
    // (round 50: `systemctl stop` right after a start left such a file).
    signals::install();
    tune_malloc();
    // Before the first connection; the tracer runs no caller's SQL.
    sleuth_store::turn_off_memory_statistics();
    let target = match (args.command.is_empty(), args.pids.is_empty()) {
        (false, false) => bail!("give either --pid or a command after --, not both"),
        (false, true) => Target::Launch(args.command.clone()),
        (true, false) => Target::Pids(args.pids.clone()),
        (true, true) => Target::All,
    };
    if let Target::Pids(pids) = &target {
        for &p in pids {
            if p == 0 || !procinfo::alive(p) {
                bail!("no such process: {p}");
            }
        }
    }
    if let Target::Launch(cmd) = &target {
        // Known before any file is touched (so `--force` never loses the old
        // trace to a typo); an exec failure later still removes the new file.
        if std::env::var_os("PATH").is_some()
            && !resolve_in_path(&cmd[0]).is_some_and(|p| p.is_file())
        {
            bail!(
                "cannot run '{}': {}",
                cmd[0].to_string_lossy(),
                std::io::Error::from_raw_os_error(libc::ENOENT)
            );
        }
    }
    if let Some(f) = &args.ready_file {
        // A file already there would tell a waiting script "ready" too early.
        if std::fs::symlink_metadata(f).is_ok() {
            bail!("--ready-file {}: already exists", f.display());
        }
    }
    if args.on_duration == OnDuration::Kill && !matches!(target, Target::Launch(_)) {
        bail!("--on-duration kill ends a command launched by `trace -- COMMAND`; it never ends processes attached with --pid or found running");
    }
    for lib in &args.cuda_libs {
        if !lib.exists() {
            bail!("--cuda-lib {}: no such file", lib.display());
        }
        if discover::lib_file(lib).is_none() {
            bail!(
                "--cuda-lib {}: not a libcudart.so* or libcuda.so* file",
                lib.display()
            );
        }
    }
    sleuth_probe::preflight()?;

    let out = args
        .db
        .clone()
        .unwrap_or_else(|| default_db_path(args.rotate.is_some()));
    let db = match args.rotate {
        Some(_) => {
            prepare_run_dir(&out, args.force)?;
            out.join(sleuth_store::run::part_name(1))
        }
        None => {
            if args.force && out.is_file() {
                crate::output_file::refuse_live_writer(&out, "--db")?;
            }
            out.clone()
        }
    };
    let start_mono = monotonic_ns();
    let realtime_offset_ns = realtime_ns() - start_mono as i64;
    let info = SessionInfo {
        started_unix_ns: realtime_ns(),
        start_mono_ns: start_mono,
        realtime_offset_ns,
        hostname: hostname(),
        kernel: uname_release(),
        // `args_os`: a path that is not UTF-8 (`--db $'t\xff.db'`) panicked
        // `args()` (round 60's tester); stored lossily, as a label.
        command: std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" "),
        target: match &target {
            Target::Launch(c) => command_line(c),
            Target::Pids(p) => format!(
                "pids {}",
                p.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            ),
            Target::All => "all CUDA processes".into(),
        },
        launch_mode: args.launches.as_str().into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        // One base for the whole run: its files' carried states share a clock.
        clock_base_ns: clock_base(start_mono)?,
    };
    // Said before anything starts (after the settings' own errors), with
    // the way out: the writer's refusal named the path twice, no hint.
    if args.rotate.is_none() && !args.force && std::fs::symlink_metadata(&db).is_ok() {
        bail!(
            "--db {}: already exists (refusing to overwrite it; {})",
            db.display(),
            crate::load::FORCE_HINT
        );
    }
    let opts = WriterOptions {
        max_db_bytes: args.max_db,
        overwrite: args.force,
        background: true,
        // Events come in batches of up to EVENT_BATCH: the queue holds as
        // many events as before, in far fewer (preallocated) slots.
        queue_capacity: EVENTS_QUEUED / EVENT_BATCH,
        // Each file's completion carries the run's memory ledger to the next.
        run: args
            .rotate
            .map(|_| sleuth_store::run_ledger::RunLink::new_run()),
        tracer_pid: Some(std::process::id()),
        ..Default::default()
    };
    let rotation = args.rotate.map(|every| Rotation {
        dir: out.clone(),
        every,
        keep: args.keep,
        n: 1,
        next_at: Instant::now() + every,
        info: info.clone(),
        opts: WriterOptions {
            overwrite: false,
            ..opts.clone()
        },
        stored: Stored::default(),
        finishing: None,
        totals: WriteSummary::default(),
        precheck: None,
        held_by_earlier: false,
    });
    let writer = TraceWriter::create(&db, info, opts)
        .with_context(|| format!("cannot create trace database {}", db.display()))?;
    let handle = writer.handle();
    // Stopped before anything was started: no command launched, no file left.
    if signals::interrupts() > 0 {
        drop(handle);
        discard(writer, &db);
        if rotation.is_some() {
            let _ = std::fs::remove_dir(&out);
        }
        eprintln!("gpusleuth: interrupted before tracing started: nothing recorded");
        return Ok(130);
    }
    // Until the command runs (or the processes are attached) nothing has been
    // traced: a failure here leaves no database behind.
    let (mut session, sinks, child) = match start(&args, &target, &handle, start_mono) {
        Ok(started) => started,
        Err(e) => {
            drop(handle);
            discard(writer, &db);
            if rotation.is_some() {
                // Only if empty: never a directory that holds anything else.
                let _ = std::fs::remove_dir(&out);
            }
            return Err(e);
        }
    };
    // The baseline: what the driver says each process holds now that it is traced
    // (a launched command has not run yet: it held nothing).
    let sampler = GpuSampler::start(
        &handle,
        realtime_offset_ns,
        start_mono,
        match &target {
            Target::All => gpu_sampler::Scope::All,
            Target::Pids(p) => gpu_sampler::Scope::Pids(p.iter().copied().collect()),
            Target::Launch(_) => gpu_sampler::Scope::Pids(HashSet::new()),
        },
        sinks.metrics.clone(),
    );
    if let (Some(s), Some(pid)) = (&sampler, child) {
        s.set_pids([pid]);
    }
    session.mark_started();
    if let Some(f) = &args.ready_file {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        // Created, never overwritten, never through a symlink; private like the trace.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(f)
            .and_then(|mut file| file.write_all(b"ready\n"))
            .with_context(|| format!("cannot write --ready-file {}", f.display()))?;
    }
    if !args.quiet {
        eprintln!(
            "{}",
            crate::term_text::terminal_safe(&format!(
                "gpusleuth: tracing {} → {} ({} libraries probed, launches: {})",
                match &target {
                    Target::Launch(c) => command_line(c),
                    Target::Pids(p) => format!(
                        "pid {}",
                        p.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                    ),
                    Target::All => "every CUDA process".into(),
                },
                match &rotation {
                    Some(r) => format!(
                        "{}/ (a new file every {}{})",
                        out.display(),
                        sleuth_core::units::fmt_ns(
                            u64::try_from(r.every.as_nanos()).unwrap_or(u64::MAX)
                        ),
                        r.keep
                            .map(|k| format!(", the last {k} kept"))
                            .unwrap_or_default()
                    ),
                    None => db.display().to_string(),
                },
                session.attached().count(),
                args.launches.as_str()
            ))
        );
    }
    trace_loop(
        &args,
        &target,
        Output {
            path: out,
            writer,
            handle,
            rotation,
        },
        session,
        sinks,
        child,
        sampler,
    )
}

/// Where the trace goes: one file, or (`--rotate`) the run directory and
/// the file being written now.
struct Output {
    /// `--db`: the file, or the run directory.
    path: PathBuf,
    writer: TraceWriter,
    handle: WriterHandle,
    rotation: Option<Rotation>,
}

/// Makes `dir` ready for a run's files: created (mode 0700: traces hold
/// command lines and paths) or an existing directory with no run in it
/// (`--force` removes the old run's files, and only those).
fn prepare_run_dir(dir: &Path, force: bool) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create run directory {}", dir.display())),
        Err(e) => Err(e).with_context(|| format!("--db {}", dir.display())),
        Ok(m) if !m.is_dir() => bail!(
            "--db {}: exists and is not a directory (with --rotate, --db names a directory of files)",
            dir.display()
        ),
        Ok(_) => {
            let old = sleuth_store::run::run_files(dir)?;
            if !old.is_empty() && !force {
                bail!(
                    "--db {}: already holds a run ({} files); {}",
                    dir.display(),
                    old.len(),
                    crate::load::FORCE_HINT
                );
            }
            for (_, f) in &old {
                crate::output_file::refuse_live_writer(f, "--db")?;
            }
            for (_, f) in old {
                sleuth_store::outfile::remove_database(&f);
            }
            Ok(())
        }
    }
}

/// Counters a run's earlier files already stored: each file stores its own
/// share, so a run's files add up to the session's totals.
#[derive(Clone, Default)]
struct Stored {
    counters: [u64; stat::MAX],
    counts: sleuth_probe::RecordCounts,
    op_counts: Vec<sleuth_core::OpCount>,
}

/// This file's share of the kernel's counters (`now` minus what earlier
/// files stored, `before`), each under its class's name (drop_, edge_, or
/// bare). Stored at the file's end with the rest, and every second while
/// it is written ([`COUNTERS_EVERY`]): a file whose tracer is killed says
/// what was lost up to then, not the zeros it starts with. (The tracer's
/// pid, which lets `explain` recognise its threads, is in each file from
/// its creation: `WriterOptions::tracer_pid`.)
fn store_kernel_counters(
    handle: &WriterHandle,
    now: &[u64; stat::MAX],
    before: &[u64; stat::MAX],
) -> Result<(), sleuth_store::StoreError> {
    for (i, (n, b)) in now.iter().zip(before).enumerate() {
        if let Some(name) = sleuth_store::drop_stat_name(i) {
            handle.set_stat(name, n.saturating_sub(*b))?;
        }
    }
    Ok(())
}

/// How often the kernel's counters are stored while a file is written.
const COUNTERS_EVERY: Duration = Duration::from_secs(1);

/// Stores the session's counters minus what `before` says earlier files
/// stored; returns the new totals.
fn store_counters(
    handle: &WriterHandle,
    session: &CaptureSession,
    before: &Stored,
) -> Result<Stored, sleuth_store::StoreError> {
    let now = Stored {
        counters: session.losses().counters(),
        counts: session.counts(),
        op_counts: session.op_counts(),
    };
    store_kernel_counters(handle, &now.counters, &before.counters)?;
    let (c, b) = (now.counts, before.counts);
    handle.set_stat("events_call", c.calls.saturating_sub(b.calls))?;
    handle.set_stat("events_wait", c.waits.saturating_sub(b.waits))?;
    handle.set_stat("events_proc", c.procs.saturating_sub(b.procs))?;
    handle.set_stat(
        "decode_errors",
        c.decode_errors.saturating_sub(b.decode_errors),
    )?;
    handle.set_stat("sites_stored", c.stacks.saturating_sub(b.stacks))?;
    if let Some(ns) = session.trap_ns() {
        handle.set_stat(sleuth_core::threads::PROBE_TRAP_STAT, ns)?;
    }
    if let Some(ns) = session.call_trap_ns() {
        handle.set_stat(sleuth_core::threads::PROBE_CALL_TRAP_STAT, ns)?;
    }
    handle.set_op_counts(file_share(&now.op_counts, &before.op_counts))?;
    Ok(now)
}

/// The kernel counts of this file: the session's minus what earlier files
/// of a rotating run stored (`before`), zeros left out.
fn file_share(
    now: &[sleuth_core::OpCount],
    before: &[sleuth_core::OpCount],
) -> Vec<sleuth_core::OpCount> {
    // By key: a node agent's lists hold a few thousand processes, and each
    // 200 ms scan takes this share (a search of `before` per entry was
    // quadratic).
    let earlier_of: std::collections::HashMap<(u32, u16), u64> =
        before.iter().map(|x| ((x.pid, x.op), x.count)).collect();
    now.iter()
        .filter_map(|oc| {
            let earlier = earlier_of.get(&(oc.pid, oc.op)).copied().unwrap_or(0);
            let count = oc.count.saturating_sub(earlier);
            (count > 0).then(|| sleuth_core::OpCount {
                count,
                ..oc.clone()
            })
        })
        .collect()
}

/// Samples of the kernel-counted ops' running counts (this file's share),
/// taken with each 200 ms scan and stored when they changed: a time window
/// places those calls by them (`sleuth_core::counted`).
#[derive(Default)]
struct CountSampler {
    /// This file's counts as last stored.
    sent: Vec<sleuth_core::OpCount>,
}

impl CountSampler {
    /// The counts that changed since the last sample, dated `ts_ns`.
    fn sample(
        &mut self,
        now: &[sleuth_core::OpCount],
        before: &[sleuth_core::OpCount],
        ts_ns: u64,
    ) -> Vec<sleuth_core::counted::CountSample> {
        let share = file_share(now, before);
        let changed = share
            .iter()
            .filter(|c| !self.sent.contains(c))
            .map(|c| sleuth_core::counted::CountSample {
                ts_ns,
                pid: c.pid,
                op: c.op,
                count: c.count,
            })
            .collect();
        self.sent = share;
        changed
    }

    /// A new file of a rotating run counts from zero again.
    fn new_file(&mut self) {
        self.sent.clear();
    }
}

/// The record of an attached library, as the trace stores it.
fn library_info(a: &sleuth_probe::AttachedLib) -> LibraryInfo {
    LibraryInfo {
        path: a.lib.path.display().to_string(),
        layer: Some(a.lib.layer),
        dev: Some(a.lib.dev),
        ino: Some(a.lib.ino),
        attached_mono_ns: Some(a.attached_mono_ns),
        probes: a.probes as u32,
        missing: a.missing.iter().map(|s| s.to_string()).collect(),
    }
}

/// Re-applies the tracer threads' placement for the traced processes (the
/// session's and `scanned`); a changed decision becomes a note.
fn place(
    placement: &mut Option<sleuth_probe::placement::Placement>,
    session: &CaptureSession,
    scanned: &[u32],
    sinks: &mut Sinks,
) {
    let Some(p) = placement.as_mut() else {
        return;
    };
    let mut traced = session.known_pids();
    traced.extend(scanned);
    traced.sort_unstable();
    traced.dedup();
    if let Some(d) = p.update(&traced) {
        sinks.note(NoteLevel::Info, format!("placement: {}", d.describe()));
    }
}

/// Removes a trace that recorded nothing (its command never started).
fn discard(writer: TraceWriter, db: &Path) {
    let _ = writer.finish();
    sleuth_store::outfile::remove_database(db);
}

/// Loads the probes, attaches to what is known, and launches the command
/// (or marks the given pids as traced). Returns the launched command's pid.
fn start(
    args: &Args,
    target: &Target,
    handle: &WriterHandle,
    start_mono: u64,
) -> Result<(CaptureSession, Sinks, Option<u32>)> {
    let ring_bytes =
        u32::try_from(args.ring_size).map_err(|_| anyhow::anyhow!("--ring-size: at most 2G"))?;
    let opts = SessionOptions {
        trace_all: matches!(target, Target::All),
        launch_mode: args.launches,
        ring_bytes,
        sites: sleuth_probe::SiteOptions {
            on: args.sites,
            slow_ns: u64::try_from(args.site_slow.as_nanos()).unwrap_or(u64::MAX),
        },
        torch_allocator: args.torch_allocator,
    };
    let mut session = CaptureSession::start(&opts, start_mono)?;
    let metrics = args.metrics.map(crate::metrics::serve).transpose()?;
    let mut sinks = Sinks::new(handle.clone(), start_mono, !args.quiet, metrics);

    // Libraries known before anything runs: explicit, the command's environment, standard places.
    let env = discover::process_env();
    let mut extra_dirs = discover::env_dirs(&env);
    extra_dirs.extend(
        args.cuda_libs
            .iter()
            .filter_map(|p| p.parent().map(Path::to_path_buf)),
    );
    if let Target::Launch(cmd) = target {
        if let Some(exe) = resolve_in_path(&cmd[0]) {
            extra_dirs.extend(sleuth_probe::symbols::runpath_dirs(&exe));
        }
    }
    // `--pid`: the processes named and their descendants already running
    // (the kernel follows only forks from the attach on); their memory
    // maps name the CUDA libraries a launcher's program loaded.
    let (pids, running_descendants) = match target {
        Target::Pids(p) => {
            let roots: std::collections::BTreeSet<u32> = p.iter().copied().collect();
            let below = crate::procinfo::descendants(&roots);
            (p.iter().chain(&below).copied().collect::<Vec<u32>>(), below)
        }
        _ => (Vec::new(), Vec::new()),
    };
    session.discover(&args.cuda_libs, &extra_dirs, &pids, |c| sinks.take(c));

    let mut child: Option<u32> = None;
    match target {
        Target::Launch(cmd) => {
            let held: HeldChild = held_child::spawn_held(cmd)?;
            let pid = held.pid;
            if let Err(e) = session.trace_pid(pid, |c| sinks.take(c)) {
                held.abandon();
                return Err(e.into());
            }
            held.release(&cmd[0].to_string_lossy())?;
            signals::mark_command_started();
            child = Some(pid);
        }
        Target::Pids(pids) => {
            for &p in pids {
                session.trace_pid(p, |c| sinks.take(c))?;
                handle.add_note(
                    NoteLevel::Info,
                    format!("attached to running process {p}: its calls before the trace started were not seen"),
                )?;
            }
            // Their descendants already running: the kernel follows only
            // forks from now on. Those found before the libraries were
            // searched, then a walk once they are traced, so that a child
            // forked meanwhile by a process not yet traced is found too.
            let mut traced: std::collections::BTreeSet<u32> = pids.iter().copied().collect();
            let mut added = Vec::new();
            let mut found = running_descendants;
            for _ in 0..2 {
                found.extend(crate::procinfo::descendants(&traced));
                let fresh: Vec<u32> = found.drain(..).filter(|&d| traced.insert(d)).collect();
                if fresh.is_empty() {
                    break;
                }
                for &d in &fresh {
                    session.trace_pid(d, |c| sinks.take(c))?;
                }
                added.extend(fresh);
            }
            if !added.is_empty() {
                let shown: Vec<String> = added.iter().take(20).map(u32::to_string).collect();
                handle.add_note(
                    NoteLevel::Info,
                    format!(
                        "also attached to {} process(es) descending from them that were already running \
                         (pids {}{}): their calls before the trace started were not seen",
                        added.len(),
                        shown.join(", "),
                        if added.len() > shown.len() { ", …" } else { "" }
                    ),
                )?;
            }
        }
        Target::All => {}
    }
    Ok((session, sinks, child))
}

/// Traces until a stop condition, then completes the database and reports.
#[allow(clippy::too_many_arguments)]
fn trace_loop(
    args: &Args,
    target: &Target,
    output: Output,
    mut session: CaptureSession,
    mut sinks: Sinks,
    child: Option<u32>,
    sampler: Option<GpuSampler>,
) -> Result<i32> {
    let Output {
        path: out,
        mut writer,
        mut handle,
        mut rotation,
    } = output;
    let start_mono = session.start_mono();
    let t0 = Instant::now();
    let mut last_scan = Instant::now();
    let mut count_sampler = CountSampler::default();
    // Read our CPUs now, before any pinning (the launched command is already running).
    let mut placement = sleuth_probe::placement::Placement::from_env();
    place(&mut placement, &session, &[], &mut sinks);
    // After the first placement, which moves this thread off the traced
    // command's CPUs as soon as it can (the command already runs): the
    // checking thread starts there, and later updates place it with the
    // other helpers. With `--precheck off` the checks cache is not even read.
    let prechecker = match args.precheck.0 {
        Some(_) => crate::precheck::Prechecker::start(args.precheck, crate::checks_memo::memo()),
        None => None,
    };
    if let Some(r) = rotation.as_mut() {
        r.precheck = prechecker.as_ref().map(|p| p.queue());
    }
    // Once the probes are attached: it never delays the capture's start.
    let mut earlier = match args.finish_killed.then(|| EarlierFiles::start(&out)) {
        Some(Ok(e)) => Some(e),
        Some(Err(why)) => {
            sinks.note(NoteLevel::Warn, why);
            None
        }
        None => None,
    };
    let mut last_render = Instant::now();
    let mut last_place = Instant::now();
    // Each file holds the tracer's pid and zero counters from its creation.
    let mut last_counters = Instant::now();
    let mut child_exit: Option<i32> = None;
    let mut child_exit_at: Option<Instant> = None;
    // Stop requests passed on to the launched command (see below); one
    // counted before the command was released came while the probes
    // attached (`run` stops before that on an earlier one); one after it
    // is the loop's to judge.
    let mut passed_on = 0usize;
    let mut told_interrupt = false;
    let stopped_while_starting = signals::before_command_started() > 0;
    // Whether the loop ended because --duration was reached.
    let duration_up = loop {
        let drained = session.poll(Duration::from_millis(50), |c| sinks.take(c));
        sinks.flush_events();
        sinks.live.flush();
        if (1..SMALL_BATCH).contains(&drained) {
            std::thread::sleep(POLL_NAP);
        }
        if let Some(pid) = child {
            if child_exit.is_none() {
                if let Some(code) = held_child::try_wait(pid) {
                    child_exit = Some(code);
                    child_exit_at = Some(Instant::now());
                }
            }
        }
        // A SIGTERM reaches this process alone (Ctrl-C reaches the whole
        // group): it is passed on to the launched command, whose exit ends
        // the trace, as a container's or a service's stop expects (round 50:
        // one SIGTERM was ignored until the command ended by itself). So is
        // any stop that came while the probes attached, before the command
        // ran to receive it.
        if let (Some(pid), None) = (child, child_exit) {
            let early = passed_on == 0 && stopped_while_starting;
            if signals::terms() > passed_on || early {
                passed_on = signals::terms().max(1);
                // SAFETY: kill(2) with our own unreaped child's pid (it
                // cannot be reused before we reap it) and a valid signal.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                sinks.note(
                    NoteLevel::Info,
                    "stop requested: SIGTERM passed on to the traced command; the trace ends when it exits"
                        .into(),
                );
            }
        }
        // An interrupt that is not a SIGTERM (passed on above) waits for
        // the command, which a terminal's Ctrl-C reached too; sent to the
        // tracer alone (`kill -INT`) the wait was silent (round 51's
        // tester): said once, with how to stop now.
        if let (Some(pid), None) = (child, child_exit) {
            let interrupts = signals::interrupts().saturating_sub(signals::terms());
            if interrupts == 1 && !told_interrupt {
                told_interrupt = true;
                eprintln!(
                    "gpusleuth: interrupt: the trace ends when the command (pid {pid}) exits; interrupt again to stop it now (the command then runs on, untraced)"
                );
            }
        }
        // Stop conditions.
        let interrupts = signals::interrupts();
        let traced_left = || session.traced_pids().into_iter().any(procinfo::alive);
        let stop = match &target {
            // Ctrl-C reaches the command too; a second one stops us regardless.
            Target::Launch(_) => {
                interrupts >= 2
                    || child_exit_at
                        .is_some_and(|t| !traced_left() || t.elapsed() > Duration::from_secs(2))
            }
            Target::Pids(_) => interrupts >= 1 || !traced_left(),
            Target::All => interrupts >= 1,
        };
        if stop || sinks.writer_error.is_some() {
            break false;
        }
        if args.duration.is_some_and(|d| t0.elapsed() >= d) {
            break true;
        }
        if let Some(notes) = earlier.as_mut().and_then(EarlierFiles::take_done) {
            earlier_notes(notes, args.quiet, &mut sinks);
        }
        // One completion at a time: the earlier tracers' files count as one.
        let finishing_earlier = earlier.as_ref().is_some_and(EarlierFiles::busy);
        let due = rotation
            .as_mut()
            .is_some_and(|r| r.due(Instant::now(), finishing_earlier));
        if let (true, Some(r)) = (due, rotation.as_mut()) {
            r.rotate(
                &mut writer,
                &mut handle,
                &mut session,
                &mut sinks,
                sampler.as_ref(),
            );
            count_sampler.new_file();
        }
        // A launched program often sets its CPUs as it starts (`taskset` in
        // a wrapper, a framework's own pinning): until the next placement the
        // tracer's threads may run on them. In the first second the known
        // threads are placed again every 20 ms, not only with each rescan.
        if t0.elapsed() < EARLY_PLACEMENT && last_place.elapsed() >= EARLY_PLACEMENT_EVERY {
            last_place = Instant::now();
            place(&mut placement, &session, &[], &mut sinks);
        }
        if last_scan.elapsed() >= Duration::from_nanos(sleuth_core::counted::SAMPLE_PERIOD_NS) {
            last_scan = Instant::now();
            let op_counts = session.op_counts();
            let before = rotation
                .as_ref()
                .map_or(&[][..], |r| &r.stored.op_counts[..]);
            let samples = count_sampler.sample(&op_counts, before, monotonic_ns());
            if !samples.is_empty() {
                let r = handle.add_count_samples(samples);
                sinks.check(r);
            }
            // The metrics and the live view's op table (its kernel-counted ops).
            if sinks.live.wants_events() {
                sinks
                    .live
                    .set_kernel_counters(session.losses().counters(), op_counts);
            }
            let pids = session.scan_pids();
            if let Some(s) = &sampler {
                s.set_pids(pids.iter().copied());
            }
            session.rescan(&pids, |c| sinks.take(c));
            // With every rescan: a traced program may change its affinity or start threads.
            place(&mut placement, &session, &pids, &mut sinks);
        }
        if last_counters.elapsed() >= COUNTERS_EVERY {
            last_counters = Instant::now();
            let before = rotation
                .as_ref()
                .map_or([0; stat::MAX], |r| r.stored.counters);
            let r = store_kernel_counters(&handle, &session.losses().counters(), &before);
            sinks.check(r);
        }
        if last_render.elapsed() >= Duration::from_secs(if live_tty() { 1 } else { 5 }) {
            last_render = Instant::now();
            sinks.live.render(Frame {
                elapsed_s: t0.elapsed().as_secs_f64(),
                records: session.counts().records,
                drops: session.losses().total(),
                start_ns: start_mono,
                now_ns: monotonic_ns(),
            });
        }
    };
    // The time is up while the launched command still runs: end it or say
    // that it keeps running (never leave it without a word).
    let mut fate: Option<String> = None;
    if let (true, Some(pid), None) = (duration_up, child, child_exit) {
        let cmd = match target {
            Target::Launch(c) => command_line(c),
            _ => String::new(),
        };
        let text = match args.on_duration {
            OnDuration::Kill => {
                let (code, how) = end_command(pid, &mut session, &mut sinks);
                child_exit = Some(code);
                format!("--duration reached: ended `{cmd}` (pid {pid}) with {how}")
            }
            OnDuration::Leave => format!(
                "--duration reached: `{cmd}` (pid {pid}) keeps running, no longer traced \
                 (--on-duration kill ends it when the time is up)"
            ),
        };
        sinks.live.clear();
        eprintln!("gpusleuth: {text}");
        fate = Some(text);
    }
    if let Some(e) = earlier.as_mut() {
        // Done since the loop's last look, or still running: said either way.
        let notes = e
            .take_done()
            .or_else(|| e.unfinished_note().map(|t| vec![(NoteLevel::Warn, t)]));
        earlier_notes(notes.unwrap_or_default(), args.quiet, &mut sinks);
    }
    // Final drain: records already in the ring buffer. Bounded: a traced
    // process that keeps running (`--pid`, all-processes mode) keeps producing
    // records, and an unbounded drain never ended.
    let drain_until = Instant::now() + FINAL_DRAIN;
    while Instant::now() < drain_until
        && session.poll(Duration::from_millis(20), |c| sinks.take(c)) > 0
    {}
    sinks.flush_events();
    let end_mono = monotonic_ns();
    // A call whose thread is gone did not stay open: its thread exited
    // mid-call (killed), and it was counted as open at the end (round 51's
    // tester).
    let (open_calls, cut_by_exit) =
        session
            .open_call_threads()
            .into_iter()
            .fold((0u64, 0u64), |(open, cut), tid| {
                if crate::procinfo::alive(tid) {
                    (open + 1, cut)
                } else {
                    (open, cut + 1)
                }
            });
    if let Some(s) = sampler {
        s.finish();
    }

    let losses = session.losses();
    let counts = session.counts();
    let op_counts = session.op_counts();

    let counted_calls: u64 = op_counts.iter().map(|c| c.count).sum();
    let coverage = coverage_warning(
        session.attached().count(),
        session.unprobed(),
        counts.calls + counted_calls,
    );
    let finish_meta = || -> Result<(), sleuth_store::StoreError> {
        if let Some(text) = &fate {
            handle.add_note(NoteLevel::Info, text.clone())?;
        }
        if let Some((NoteLevel::Warn, text)) = &coverage {
            handle.add_note(NoteLevel::Warn, text.clone())?;
        }
        // This file's share of the counters (all of them without --rotate).
        let before = rotation
            .as_ref()
            .map(|r| r.stored.clone())
            .unwrap_or_default();
        store_counters(&handle, &session, &before)?;
        handle.set_stat(format!("edge_{EDGE_OPEN_AT_END}"), open_calls)?;
        handle.set_stat(format!("edge_{EDGE_CUT_BY_EXIT}"), cut_by_exit)?;
        // Kernel state left behind by traced processes: 0 once they all exited.
        let (traced_left, threads_left) = session.map_occupancy();
        handle.set_stat("map_traced_left", traced_left as u64)?;
        handle.set_stat("map_threads_left", threads_left as u64)?;
        handle.set_stat("map_counts_left", session.op_count_entries() as u64)?;
        // Runs the kernel skipped (its per-CPU recursion guard): what they
        // would have recorded is missing and no ring-buffer counter saw it.
        let skipped = session.program_misses();
        let total: u64 = skipped.iter().map(|(_, n)| n).sum();
        handle.set_stat("bpf_skipped_runs", total)?;
        if total > 0 {
            let each: Vec<String> = skipped.iter().map(|(p, n)| format!("{p} {n}")).collect();
            handle.add_note(
                NoteLevel::Warn,
                format!(
                    "the kernel skipped {total} runs of gpusleuth's eBPF programs since the trace started ({}): \
                     what they would have recorded (a call, or the scheduler time of a switch) is missing",
                    each.join(", ")
                ),
            )?;
        }
        handle.set_session_end(end_mono)?;
        // The tracer's own CPU while tracing (the file's completion after this
        // is not in it): `bench` divides it by the events stored.
        let cpu = sleuth_probe::placement::tracer_cpu();
        handle.set_stat("tracer_cpu_ns_poller", cpu.poller_ns)?;
        handle.set_stat("tracer_cpu_ns_writer", cpu.writer_ns)?;
        handle.set_stat("tracer_cpu_ns_helpers", cpu.helpers_ns)?;
        handle.set_stat("tracer_sys_ns_poller", cpu.poller_sys_ns)?;
        handle.set_stat("tracer_sys_ns_writer", cpu.writer_sys_ns)?;
        if child.is_some() && child_exit.is_none() && signals::interrupts() >= 2 {
            handle.add_note(
                NoteLevel::Warn,
                "trace stopped by a second interrupt before the command exited",
            )?;
        }
        Ok(())
    };
    let meta_result = finish_meta();
    drop(handle);
    if let Some(e) = sinks.writer_error.take() {
        eprintln!("gpusleuth: warning: the database writer failed during the trace ({e}); what was committed before is kept");
    }
    sinks.live.finish();
    drop(sinks);
    drop(session); // detaches every probe before the report
    let db = writer.path().to_path_buf();
    // One completion at a time, in file order, the last file's too: it
    // carries the run's memory ledger from the previous file's completion
    // (`sleuth_store::run_ledger`), which must be done.
    if let Some(r) = rotation.as_mut() {
        r.join_previous();
    }
    let mut summary = writer
        .finish()
        .context("cannot finish the trace database")?;
    meta_result.context("cannot store the trace's counters")?;
    // Queued now: the check starts once the file has settled, while the
    // summary below is read and printed.
    let prechecking = prechecker.as_ref().is_some_and(|p| p.queue().send(&db));
    let last_file = db.clone();
    // A run: the earlier files' counts too, and the answer over the run.
    let (db, files) = match rotation {
        Some(r) => {
            let n = r.n;
            summary = r.finish(summary);
            let kept = sleuth_store::run::run_files(&out).map_or(0, |f| f.len());
            (out, format!(" ({n} files written, {kept} kept)"))
        }
        None => (db, String::new()),
    };

    if summary.kept_wal {
        eprintln!(
            "gpusleuth: warning: {}: complete, but a reader had it open as it was completed: it stays in WAL mode, its -wal beside it part of it, until `gpusleuth finish --db {}` makes it one file",
            db.display(),
            db.display()
        );
    }
    if !args.quiet {
        // The final table comes from the database: exact, and what a later `stats` shows.
        // Read from the rollups: the summary must not load the whole trace.
        let report = crate::load::stats_of(&db, None)?;
        eprint!(
            "{}",
            crate::term_text::terminal_safe(&crate::render::stats::render(&report))
        );
    }
    eprintln!(
        "{}",
        crate::term_text::terminal_safe(&format!(
        "gpusleuth: trace saved to {}{files} — {} calls, {} waits, {} process events recorded; dropped: {} (ring buffer full), {} (kernel maps full), {} ({}); attach edges (not losses): {} return(s) of calls begun before tracing, {} call(s) open at the end{}",
        db.display(),
        summary.calls_stored,
        summary.waits_stored,
        summary.proc_events_stored,
        losses.ring(),
        losses.maps(),
        summary.dropped_db_full,
        match summary.disk_ran_low {
            Some(_) => "the disk ran low",
            None => "database cap",
        },
        losses.unmatched_return,
        open_calls,
        match cut_by_exit {
            0 => String::new(),
            n => format!(", {n} call(s) cut short by their thread's exit"),
        }
    ))
    );
    let launches_recorded = args.launches == LaunchMode::Full;
    if let Some(text) = lost_warning(
        &losses,
        (summary.dropped_db_full, summary.disk_ran_low),
        summary.events_received,
        launches_recorded,
    ) {
        eprintln!("gpusleuth: warning: {text}");
    }
    if losses.switch_in_unseen > 0 {
        eprintln!(
            "gpusleuth: note: {} switch(es) to a traced thread were not seen by the scheduler probe (a kernel gap); their waits were closed at the thread's next probe, the switch-in dated by its CPU time (switch_in_unseen)",
            losses.switch_in_unseen
        );
    }
    if let Some((level, text)) = coverage {
        let tag = if level == NoteLevel::Warn {
            "warning"
        } else {
            "note"
        };
        eprintln!("gpusleuth: {tag}: {text}");
    }
    if let Some(p) = prechecker {
        if prechecking && !args.quiet {
            eprintln!(
                "gpusleuth: checking {} for later reads (it must be 2 s old first; Ctrl-C skips, --precheck off turns this off)",
                last_file.display()
            );
        }
        // Any interrupt from now on ends the wait or the check.
        let base = signals::interrupts();
        for (path, outcome) in p.finish(|| signals::interrupts() > base) {
            let line = crate::precheck::outcome_line(&path, &outcome);
            if let (Some(line), true, false) = (line, path == last_file, args.quiet) {
                eprintln!("{line}");
            }
        }
    }
    Ok(match (child, child_exit) {
        (_, Some(code)) => code,
        // Stopped by Ctrl-C before the command ended: the shell's convention.
        (Some(_), None) if signals::interrupts() > 0 => 130,
        _ => 0,
    })
}

/// Stores what `--finish-killed` did in this trace (warnings are printed
/// by `Sinks::note`; the rest unless `--quiet`).
fn earlier_notes(notes: Vec<(NoteLevel, String)>, quiet: bool, sinks: &mut Sinks) {
    for (level, text) in notes {
        if level == NoteLevel::Info && !quiet {
            sinks.live.clear();
            eprintln!("gpusleuth: {text}");
        }
        sinks.note(level, text);
    }
}

fn live_tty() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
}

/// Ends the launched command (our own unreaped child, so its pid cannot have
/// been reused): SIGTERM, then SIGKILL after [`KILL_GRACE`], recording its
/// last calls meanwhile. Returns its exit status and the signal that ended it.
fn end_command(pid: u32, session: &mut CaptureSession, sinks: &mut Sinks) -> (i32, &'static str) {
    for (sig, how) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGKILL, "SIGKILL")] {
        // SAFETY: kill(2) on our own child, not yet reaped (see above).
        unsafe { libc::kill(pid as i32, sig) };
        let deadline = Instant::now() + KILL_GRACE;
        while Instant::now() < deadline {
            session.poll(Duration::from_millis(20), |c| sinks.take(c));
            sinks.flush_events();
            if let Some(code) = held_child::try_wait(pid) {
                return (code, how);
            }
        }
    }
    // Not reaped 5 s after SIGKILL (stuck in the kernel): say what was sent.
    (128 + libc::SIGKILL, "SIGKILL (not yet reaped)")
}

/// A poll that drained fewer records than this is followed by [`POLL_NAP`].
const SMALL_BATCH: usize = 512;
/// The pause after a small batch. Records wake no one (`BPF_RB_NO_WAKEUP`
/// below a quarter-full ring), but the loop polled again at once whenever a
/// drain found anything, and during a flood there always was something: a
/// draining thread on a CPU of its own (the placement's aim) spun, paying a
/// loop, its checks and a message to the writer for every few records (most
/// of the tracer's CPU per event on the 16-CPU H200: docs/benchmarks.md,
/// round 7). Pausing lets the ring buffer collect records meanwhile, so one
/// pass carries hundreds of them. 2 ms is far below what the ring absorbs
/// (the default 8 MiB holds ~60,000 call records of 136 bytes: it fills
/// during a pause only above 30 million records a second, where each uprobe
/// trap costs a CPU about a microsecond) and below what a person sees in the
/// live view.
const POLL_NAP: Duration = Duration::from_millis(2);
/// How long after the start, and how often, the tracer's threads are placed
/// again besides each rescan (see the loop).
const EARLY_PLACEMENT: Duration = Duration::from_secs(1);
const EARLY_PLACEMENT_EVERY: Duration = Duration::from_millis(20);

/// Longest time spent draining the ring buffer after the trace stopped.
const FINAL_DRAIN: Duration = Duration::from_millis(500);

/// Where the session's output goes: the database writer (on this thread:
/// `send` only queues for the writer's own thread), and the live view and
/// metrics (on their own thread, fed in batches).
struct Sinks {
    handle: WriterHandle,
    start_mono: u64,
    live: LiveFeed,
    /// `--metrics`: live counters served over HTTP (also read by the GPU sampler).
    metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    /// First error from the database writer; tracing stops on it.
    writer_error: Option<String>,
    /// Call sites: native names added on a thread of their own.
    stacks: crate::sites::StackSink,
    /// Events taken from the ring buffer and not yet handed to the writer:
    /// sent as one message per poll (or per [`EVENT_BATCH`]), so the channel
    /// costs once per batch instead of once per event.
    pending: Vec<sleuth_core::Event>,
}

/// Most events handed to the writer in one message.
const EVENT_BATCH: usize = 256;
/// Events in flight to the writer before the draining thread waits (the
/// writer's queue counts messages: this many events in full batches).
const EVENTS_QUEUED: usize = 16_384;

impl Drop for Sinks {
    fn drop(&mut self) {
        self.flush_events();
    }
}

impl Sinks {
    fn new(
        handle: WriterHandle,
        start_mono: u64,
        live_view: bool,
        metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    ) -> Sinks {
        Sinks {
            handle,
            start_mono,
            live: LiveFeed::start(LiveView::new(live_view), metrics.clone()),
            metrics,
            writer_error: None,
            stacks: crate::sites::StackSink::default(),
            pending: Vec::with_capacity(EVENT_BATCH),
        }
    }

    /// Hands the pending events to the writer (end of a poll, and before
    /// anything else is sent, so the writer sees everything in capture order).
    fn flush_events(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        // A full batch goes as it is; a part of one (the end of a poll, a
        // process or a stack captured between events) goes in a buffer of
        // its own size, `pending` kept. The writer holds what it received
        // for up to 100 ms before a commit: a fresh 256-event buffer (70 KB)
        // per message held ~500 of them at once, 34 MiB of the tracer's
        // peak, while ~300 short-lived processes a second each flushed a
        // few events at a time (round 54, heaptrack).
        let evs = match self.pending.len() >= EVENT_BATCH {
            true => std::mem::replace(&mut self.pending, Vec::with_capacity(EVENT_BATCH)),
            false => self.pending.drain(..).collect(),
        };
        let r = self.handle.send_batch(evs);
        self.check(r);
    }

    fn check(&mut self, r: Result<(), sleuth_store::StoreError>) {
        if let Err(e) = r {
            self.writer_error.get_or_insert_with(|| e.to_string());
        }
    }

    /// Stores a note, printed as a warning too when it is one.
    fn note(&mut self, level: NoteLevel, text: String) {
        self.flush_events();
        if level == NoteLevel::Warn {
            // Printed as well as stored: lost coverage must be seen while tracing.
            self.live.clear();
            eprintln!("gpusleuth: warning: {text}");
        }
        let r = self.handle.add_note(level, text);
        self.check(r);
    }

    /// Names process `pid` in the file, first seen at `first_seen_ns`.
    fn process_seen(&mut self, pid: u32, first_seen_ns: u64) {
        self.flush_events();
        let info = procinfo::read(pid, first_seen_ns);
        if self.live.wants_events() {
            self.live.set_process(info.clone());
        }
        let r = self.handle.set_process(info);
        self.check(r);
    }

    fn take(&mut self, c: Captured) {
        if !matches!(c, Captured::Event(_)) {
            self.flush_events();
        }
        match c {
            Captured::Event(ev) => {
                self.live.observe(&ev);
                self.pending.push(ev);
                if self.pending.len() >= EVENT_BATCH {
                    self.flush_events();
                }
            }
            Captured::Stack(stack) => {
                let r = self.stacks.submit(stack, &self.handle);
                self.check(r);
            }
            Captured::Process(pid) => self.process_seen(pid, monotonic_ns()),
            Captured::Attached { lib: a, late } => {
                let secs = a.attached_mono_ns.saturating_sub(self.start_mono) as f64 / 1e9;
                let r = self.handle.add_library(library_info(&a));
                self.check(r);
                if a.lib.layer == sleuth_core::Layer::Torch && a.probes == 0 {
                    self.note(NoteLevel::Warn, format!(
                        "PyTorch caching-allocator entry points not found in {} (missing: {}): this torch build is \
                         not recognised, allocated/reserved come from the CUDA-level view only",
                        a.lib.path.display(),
                        a.missing.join(", ")
                    ));
                }
                if late && a.probes > 0 {
                    let r = self.handle.add_note(
                        NoteLevel::Warn,
                        format!(
                            "{} was found in a traced process's memory map and probed at +{secs:.3}s; calls through it before then were not seen",
                            a.lib.path.display()
                        ),
                    );
                    self.check(r);
                }
            }
            Captured::NotProbed(e) => self.note(NoteLevel::Warn, format!("not probed: {e}")),
            Captured::Note { warn, text } => self.note(
                if warn {
                    NoteLevel::Warn
                } else {
                    NoteLevel::Info
                },
                text,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(argv: &[&str]) -> Result<Args, String> {
        use clap::Parser as _;
        let argv = std::iter::once("trace").chain(argv.iter().copied());
        Cli::try_parse_from(argv)
            .map(|c| c.args)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_default_name_taken_gets_the_next_free_suffix() {
        let taken = ["t.db", "t-2.db"].map(PathBuf::from);
        let free = |ext| free_name("t", ext, |p: &Path| taken.iter().any(|t| t == p));
        assert_eq!(free(".db"), PathBuf::from("t-3.db"));
        assert_eq!(free(""), PathBuf::from("t"));
    }

    /// The `trace` arguments of the container in deploy/daemonset.yaml
    /// (the items of its `args:` list, comments left out).
    fn daemonset_trace_args(yaml: &str) -> Vec<String> {
        let mut lines = yaml.lines().skip_while(|l| l.trim() != "args:").skip(1);
        let mut args = Vec::new();
        for l in lines.by_ref() {
            let t = l.trim();
            if t.starts_with('#') {
                continue;
            }
            let Some(item) = t.strip_prefix("- ") else {
                break;
            };
            args.push(item.trim_matches('"').to_string());
        }
        args
    }

    /// What the deploy files run parses, and records as a node agent must:
    /// a rotated run with a bound on its files, named per start (no --db), so
    /// that a restarted service or container starts a run of its own where a
    /// fixed name was refused as existing, and completes the files a killed
    /// predecessor left (docs/deploy.md).
    #[test]
    fn the_deploy_files_run_a_bounded_rotated_run_named_per_start() {
        let yaml = include_str!("../../../../deploy/daemonset.yaml");
        let from_yaml = daemonset_trace_args(yaml);
        assert_eq!(
            from_yaml.first().map(String::as_str),
            Some("trace"),
            "{from_yaml:?}"
        );
        assert!(yaml.contains("workingDir: /var/lib/gpusleuth"));
        let unit = include_str!("../../../../deploy/gpusleuth.service");
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart=/usr/local/bin/gpusleuth "))
            .expect("ExecStart runs the binary itself");
        assert!(unit.contains("WorkingDirectory=/var/lib/gpusleuth"));
        let from_unit: Vec<String> = exec.split_whitespace().map(String::from).collect();
        for argv in [&from_yaml, &from_unit] {
            assert_eq!(argv[0], "trace");
            let rest: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
            let a = parse(&rest).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            assert!(
                a.db.is_none(),
                "{argv:?}: a fixed name is refused at a restart"
            );
            assert_eq!(a.rotate, Some(Duration::from_secs(15 * 60)), "{argv:?}");
            assert_eq!(a.keep, Some(32), "{argv:?}");
            assert_eq!(a.max_db, 512 << 20, "{argv:?}");
            assert!(a.metrics.is_some(), "{argv:?}");
            assert!(
                a.finish_killed,
                "{argv:?}: a start completes what a killed predecessor left"
            );
        }
    }

    #[test]
    fn options_use_the_shared_duration_size_and_launch_parsers() {
        let a = parse(&[
            "--duration",
            "1.5s",
            "--max-db",
            "512M",
            "--launches",
            "full",
            "--site-slow",
            "0",
        ])
        .expect("valid options");
        assert_eq!(a.duration, Some(Duration::from_millis(1500)));
        assert_eq!(a.max_db, 512 << 20);
        assert_eq!(a.launches, LaunchMode::Full);
        assert_eq!(a.site_slow, Duration::ZERO);
        let d = parse(&[]).expect("defaults");
        assert_eq!((d.launches, d.ring_size), (LaunchMode::Driver, 8 << 20));
        assert_eq!(d.site_slow, Duration::from_millis(1));
        let e = parse(&["--duration", "1.5"]).err().unwrap_or_default();
        assert!(e.contains("write 1.5s"), "{e}");
        assert!(parse(&["--duration", "0s"]).is_err());
        assert!(parse(&["--launches", "some"]).is_err());
        assert!(parse(&["--ring-size", "lots"]).is_err());
    }
}
