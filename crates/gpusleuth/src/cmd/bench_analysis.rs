//! The storage and analysis half of `gpusleuth bench`: how fast the writer
//! stores events (the pipeline's ceiling behind the ring buffer), how many
//! bytes each event takes, and the wall time and peak RSS of each analysis
//! command run as a child process on the stored trace. No eBPF: the events
//! are synthetic, shaped like a contended CUDA program.

use anyhow::{Context, Result};
use serde::Serialize;
use sleuth_core::event::BLOCK_WORDS;
use sleuth_core::{op_by_name, BlockEvent, CallEvent, Culprit, Event, WaitEvent, WaitKind, Waker};
use sleuth_store::{SessionInfo, Trace, TraceWriter, WriterHandle, WriterOptions};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

#[derive(Serialize)]
pub struct AnalysisBench {
    pub calls: u64,
    pub waits: u64,
    /// PyTorch allocator events (`--analysis-allocator`).
    pub allocator_events: u64,
    /// Events handed to the writer until `finish()` returned (culprit join included).
    pub write_ms: f64,
    pub write_events_per_s: f64,
    /// CPU (user+sys) of this process while writing, per event: the writer
    /// thread plus the loop generating the events (an upper bound for the writer).
    pub write_cpu_us_per_event: f64,
    pub db_mb: f64,
    pub bytes_per_event: f64,
    /// Whether `stats` could answer from rollups (no call row read).
    pub rollups: bool,
    /// Each analysis command on the stored trace, as a child process.
    pub commands: Vec<CommandRun>,
    /// `--precheck-kept`: the check of the kept trace as `trace` makes it.
    pub precheck: Option<Precheck>,
}

/// What checking the kept trace for later reads cost (what the end of a
/// `trace` of that file grows by).
#[derive(Serialize)]
pub struct Precheck {
    /// `saved`, or why nothing was saved.
    pub outcome: String,
    /// Waiting for the file to be 2 s old (after the keep's rename).
    pub wait_ms: f64,
    pub check_ms: f64,
    pub check_cpu_ms: f64,
}

#[derive(Serialize)]
pub struct CommandRun {
    pub command: String,
    pub wall_ms: f64,
    pub peak_rss_mb: f64,
}

/// Op ids by name, looked up once (the op table is the one source of ids).
struct Ops {
    memcpy: u16,
    sync: u16,
    malloc: u16,
    free: u16,
    launch: u16,
    mem_create: u16,
    mem_map: u16,
    mem_unmap: u16,
    mem_release: u16,
    block_malloc: u16,
    block_free: u16,
}

impl Ops {
    fn new() -> Result<Ops> {
        let id = |n: &str| {
            op_by_name(n)
                .map(|i| i.id)
                .with_context(|| format!("op {n} is not in the op table"))
        };
        Ok(Ops {
            memcpy: id("cudaMemcpy")?,
            sync: id("cudaStreamSynchronize")?,
            malloc: id("cudaMalloc")?,
            free: id("cudaFree")?,
            launch: id("cudaLaunchKernel")?,
            mem_create: id("cuMemCreate")?,
            mem_map: id("cuMemMap")?,
            mem_unmap: id("cuMemUnmap")?,
            mem_release: id("cuMemRelease")?,
            block_malloc: id("DeviceCachingAllocator::malloc")?,
            block_free: id("DeviceCachingAllocator::free")?,
        })
    }
}

/// Where the synthetic trace's clock and pids start. SQLite stores an
/// integer in 1, 2, 3, 4, 6 or 8 bytes by its magnitude, so a trace's size
/// depends on them, not only on its mix: a time past 2^47 ns (39 hours
/// since boot) takes 8 bytes, below 6; a pid or tid past 32,767 takes 3,
/// below 128 one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Magnitudes {
    /// The session's start on the tracer's clock (monotonic ns since boot).
    pub clock_ns: u64,
    /// Process 0's pid (its threads' tids follow it).
    pub pid: u32,
}

impl Magnitudes {
    /// A machine that has just booted: times from 1 ms, pids from 100 (the
    /// bench's trace until round 27, and the H200 device's: pid 725 about
    /// 100 s after boot in `examples/h200-contention.db`).
    pub const FRESH: Magnitudes = Magnitudes {
        clock_ns: 0,
        pid: 100,
    };
    /// A machine up an hour, pids from 100: each time takes 6 bytes, as in
    /// a 10M-call trace (its calls reach past 2^31 ns), where a trace of
    /// 200,000 calls from 1 ms stores 4-byte times.
    #[cfg(test)]
    const UP_AN_HOUR: Magnitudes = Magnitudes {
        clock_ns: 3_600 * 1_000_000_000,
        pid: 100,
    };
    /// A node that has run for days (a node agent's usual case): 10 days
    /// since boot, host pids near 3 million (64-bit kernels allow 4,194,304).
    pub const NODE: Magnitudes = Magnitudes {
        clock_ns: 10 * 86_400 * 1_000_000_000,
        pid: 3_000_100,
    };

    /// The pid of the synthetic trace's process `k` (0 is [`Self::pid`]).
    fn pid_of(self, k: u64) -> u32 {
        self.pid + 1000 * k as u32
    }
}

/// The synthetic trace to write.
#[derive(Clone, Copy, Debug)]
pub struct Synthetic {
    pub calls: u64,
    /// Processes the calls are spread over.
    pub procs: u64,
    /// With PyTorch caching-allocator events.
    pub allocator: bool,
    pub at: Magnitudes,
}

impl Synthetic {
    /// `calls` calls of one process, no allocator events, a fresh machine's magnitudes.
    #[cfg(test)]
    fn fresh(calls: u64) -> Synthetic {
        Synthetic {
            calls,
            procs: 1,
            allocator: false,
            at: Magnitudes::FRESH,
        }
    }
}

/// One call starts every this many ns, on the 4 threads in turn: each
/// thread starts one every 20 µs.
const CALL_EVERY_NS: u64 = 5_000;
/// The longest call: under a thread's 20 µs between starts, with room for
/// a sleep after it, so a thread's calls and waits never overlap (they did
/// before round 25: calls of up to 52 µs every 20 µs, "135% inside CUDA
/// calls" in each thread's split).
const LONGEST_CALL_NS: u64 = 15_000;
/// Where a wait inside a call begins, after the call's start.
const WAIT_INSIDE_AFTER_NS: u64 = 200;
/// The caching allocator's segment of each process (a `cudaMalloc` in its
/// first round, never freed) and the blocks carved from it.
const SEGMENT_BYTES: u64 = 20 << 20;
const BLOCK_BYTES: u64 = 2 << 20;
/// A page of the virtual memory API (`cuMemCreate`'s granularity on
/// NVIDIA GPUs).
const VMM_PAGE_BYTES: u64 = 2 << 20;

/// Where process `k`'s allocator segment lies.
fn segment_base(k: u64) -> u64 {
    0x7d00_0000_0000 + (k << 32)
}

/// Where `Block`'s size, requested size and pointer lie (8-byte words):
/// where the calibration found them in torch 2.11 on the H200
/// (docs/gpu/h200-allocator-check-2026-11-30.txt).
const BLOCK_SIZE_WORD: usize = 7;
const BLOCK_REQUESTED_WORD: usize = 8;
const BLOCK_PTR_WORD: usize = 10;

/// A PyTorch caching-allocator event (`DeviceCachingAllocator::malloc` or
/// `::free`) of the block at `ptr`, its `Block` words in torch 2.11's
/// layout (the other words differ from event to event).
fn block_event(
    op: u16,
    pid: u32,
    (start, since_boot): (u64, u64),
    round: u64,
    ptr: u64,
    malloc: bool,
) -> BlockEvent {
    let requested = BLOCK_BYTES - 100;
    // Words that change with every event, as a `Block`'s do, but not with
    // how long the machine has been up (memory contents are no times:
    // `since_boot` is the session's start on the clock).
    let mut words = [0x5555_0000_0000 + start - since_boot; BLOCK_WORDS];
    words[BLOCK_SIZE_WORD] = BLOCK_BYTES;
    words[BLOCK_REQUESTED_WORD] = requested;
    words[BLOCK_PTR_WORD] = ptr;
    BlockEvent {
        op,
        pid,
        tid: pid,
        start_ns: start,
        end_ns: start + 300,
        requested: malloc.then_some(requested),
        // The `Block` object's own (host) address: one per round.
        block: 0x5600_0000_0000 + round * 64,
        words,
        stack_id: None,
    }
}

/// The op mix, per 16 calls on each of 4 threads: 8 launches, 3 copies
/// (every 40th call preempted by a "hog"), 2 syncs that sleep (woken by a
/// peer thread), a malloc/free pair (each thread's allocation its own, freed
/// by its next call); every fourth round a 2 MiB VMM page made (create,
/// map) and given back (unmap, release) in place of 4 launches; a thread
/// sleeps 2 µs after every tenth call. With `allocator`, each process's
/// main thread (its first) also makes the caching allocator's segment (a
/// 20 MiB `cudaMalloc` in place of a launch of its first round), and in
/// every round takes a 2 MiB block from it after one launch and gives it
/// back after another (`--torch-allocator`'s events). Calls last 1–15 µs,
/// across the histogram's exact buckets (< 2,048 ns) and its log ones; a
/// thread's calls and waits follow one another without overlapping. With
/// `procs` processes, each run of 64 calls (one round of the mix on the 4
/// threads) goes to the next process in turn: every process has the whole mix.
fn events(ops: &Ops, shape: Synthetic) -> impl Iterator<Item = Event> + '_ {
    let Synthetic {
        calls: n_calls,
        procs,
        allocator,
        at,
    } = shape;
    (0..n_calls).flat_map(move |i| {
        let pid = at.pid_of((i / 64) % procs);
        let tid = pid + (i % 4) as u32;
        let ts = at.clock_ns + 1_000_000 + i * CALL_EVERY_NS;
        let slot = (i / 4) % 16;
        let proc_k = (i / 64) % procs;
        // The process's own round: its allocator's segment is made in its
        // first one (main thread, slot 2), its block taken at slot 3 and
        // given back at slot 6.
        let proc_round = i / 64 / procs;
        let main_thread = i % 4 == 0;
        let makes_segment = allocator && main_thread && proc_round == 0 && slot == 2;
        // Every fourth round each thread makes a VMM page (create, map:
        // slots 0, 1) and gives it back (unmap, release: slots 4, 5).
        let op = match slot {
            _ if makes_segment => ops.malloc,
            0 if (i / 64) % 4 == 0 => ops.mem_create,
            1 if (i / 64) % 4 == 0 => ops.mem_map,
            4 if (i / 64) % 4 == 0 => ops.mem_unmap,
            5 if (i / 64) % 4 == 0 => ops.mem_release,
            0..=7 => ops.launch,
            8..=10 => ops.memcpy,
            11 | 12 => ops.sync,
            13 => ops.malloc,
            14 => ops.free,
            _ => ops.launch,
        };
        let preempted = op == ops.memcpy && i % 40 < 4;
        let blocked_sync = op == ops.sync;
        // Durations spread over 1–15 µs so the histogram is exercised.
        let dur = 1_000 + (i.wrapping_mul(2_654_435_761) % (LONGEST_CALL_NS - 1_000));
        let (runnable, blocked) = match (preempted, blocked_sync) {
            (true, _) => (dur / 2, 0),
            (_, true) => (0, dur * 3 / 4),
            _ => (0, 0),
        };
        // The thread's allocation and VMM page are given back in the round
        // that makes them: each thread reuses its own addresses (ranges
        // that grew with the round met the segments after 8M calls). The
        // page's handle is new each time.
        let thread = proc_k * 4 + i % 4;
        let (size, ptr) = if makes_segment {
            (SEGMENT_BYTES, segment_base(proc_k))
        } else if op == ops.malloc || op == ops.free {
            // One MiB apart, above the largest size (512 KiB).
            (4096 << (i % 8), 0x7e00_0000_0000 + thread * (1 << 20))
        } else if op == ops.mem_create || op == ops.mem_release {
            (
                VMM_PAGE_BYTES,
                0x7b00_0000_0000 + ((i / 64) * 4 + i % 4) * 0x1000,
            )
        } else if op == ops.mem_map || op == ops.mem_unmap {
            (VMM_PAGE_BYTES, 0x7c00_0000_0000 + thread * VMM_PAGE_BYTES)
        } else {
            (4096 << (i % 8), 0x7f00_0000_0000 + (i / 16) * 4096)
        };
        let call = CallEvent {
            ts_ns: ts,
            dur_ns: dur,
            pid,
            tid,
            op,
            size: Some(size),
            ptr: Some(ptr),
            runnable_ns: runnable,
            blocked_ns: blocked,
            cpu: (i % 2) as u32,
            ..Default::default()
        };
        let mut out = vec![Event::Call(call)];
        if allocator && main_thread && (slot == 3 || slot == 6) {
            // Between this call and the thread's next (the sleep after
            // every tenth call starts 500 ns after the call).
            let ptr = segment_base(proc_k) + (proc_round % 10) * BLOCK_BYTES;
            let (op, malloc) = if slot == 3 {
                (ops.block_malloc, true)
            } else {
                (ops.block_free, false)
            };
            out.push(Event::Block(block_event(
                op,
                pid,
                (ts + dur + 100, at.clock_ns),
                i / 64,
                ptr,
                malloc,
            )));
        }
        if i % 10 == 0 || preempted || blocked_sync {
            let inside = preempted || blocked_sync;
            // A preemption or a sync's sleep inside its call; otherwise the
            // thread sleeps 2 µs after the call, before its next one.
            let (off, blocked) = if inside {
                (ts + WAIT_INSIDE_AFTER_NS, blocked)
            } else {
                (ts + dur + 500, 2_000)
            };
            out.push(Event::Wait(WaitEvent {
                pid,
                tid,
                kind: if preempted {
                    WaitKind::Preempted
                } else {
                    WaitKind::Blocked
                },
                off_ns: off,
                wake_ns: off + blocked,
                on_ns: off + blocked + runnable,
                prev_state: if preempted { 0 } else { 2 },
                cpu: (i % 2) as u32,
                culprits: if preempted {
                    vec![Culprit {
                        pid: 200,
                        tid: 200,
                        comm: "hog".into(),
                        ns: runnable,
                    }]
                } else {
                    Vec::new()
                },
                waker: blocked_sync.then(|| Waker {
                    pid,
                    tid: pid + ((i + 1) % 4) as u32,
                    comm: "worker".into(),
                    irq: false,
                }),
            }));
        }
        out
    })
}

/// Process CPU time (user+sys) in ms.
fn own_cpu_ms() -> f64 {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a pointer to a live local.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Writes the synthetic trace `shape` into `dir`, then (with `exe`, this
/// gpusleuth binary) times each analysis command on it as a child process.
pub fn run(
    dir: &Path,
    shape: Synthetic,
    exe: Option<&Path>,
    keep: Option<&Path>,
    precheck_kept: bool,
    run_files: u64,
) -> Result<AnalysisBench> {
    let ops = Ops::new()?;
    let db = dir.join("analysis.db");
    let _ = std::fs::remove_file(&db);
    let t = Instant::now();
    let cpu0 = own_cpu_ms();
    let (writer, h) = synthetic_writer(&db, shape, shape.at.clock_ns, None)?;
    let mut n_events = 0u64;
    let mut waits = 0u64;
    let mut blocks = 0u64;
    for ev in events(&ops, shape) {
        waits += matches!(ev, Event::Wait(_)) as u64;
        blocks += matches!(ev, Event::Block(_)) as u64;
        n_events += 1;
        h.send(ev)?;
    }
    let n_calls = shape.calls;
    h.set_session_end(shape.at.clock_ns + 1_000_000 + n_calls * 5_000)?;
    drop(h);
    writer.finish()?;
    let write_ms = t.elapsed().as_secs_f64() * 1e3;
    let write_cpu_ms = own_cpu_ms() - cpu0;
    let db_bytes = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);

    let trace = Trace::open(&db)?;
    let stats = trace.stats_report(None)?;
    let rollups = stats.is_some();
    if let Some(s) = &stats {
        anyhow::ensure!(!s.ops.is_empty(), "the synthetic trace produced no stats");
    }
    drop(trace);
    let mut commands = Vec::new();
    if let Some(exe) = exe {
        let out = dir.join("analysis-out");
        let db_s = db.display().to_string();
        let out_s = out.display().to_string();
        let runs: [(&str, Vec<&str>); 6] = [
            ("stats", vec!["stats", "--json", "--db", &db_s]),
            ("explain", vec!["explain", "--json", "--db", &db_s]),
            ("memory", vec!["memory", "--json", "--db", &db_s]),
            (
                "report",
                vec!["report", "--force", "-o", &out_s, "--db", &db_s],
            ),
            (
                "export",
                vec!["export", "--force", "-o", &out_s, "--db", &db_s],
            ),
            (
                "export pftrace",
                vec![
                    "export", "--format", "pftrace", "--force", "-o", &out_s, "--db", &db_s,
                ],
            ),
        ];
        for (name, argv) in runs {
            // Each command as on a file it never read: no checks cache.
            commands.push(timed(exe, name, &argv, Path::new(""))?);
        }
        commands.extend(moments_and_windows(exe, &db, n_calls)?);
        let _ = std::fs::remove_file(&out);
        if run_files > 0 {
            let run_dir = dir.join("analysis-run");
            let _ = std::fs::remove_dir_all(&run_dir);
            write_run(&ops, shape, &run_dir, run_files)?;
            commands.extend(run_commands(exe, &run_dir, n_calls)?);
            match keep.map(kept_run) {
                Some(k) => std::fs::rename(&run_dir, &k)
                    .with_context(|| format!("cannot keep the run at {}", k.display()))?,
                None => {
                    let _ = std::fs::remove_dir_all(&run_dir);
                }
            }
        }
    }
    match keep {
        Some(k) => std::fs::rename(&db, k)
            .or_else(|_| std::fs::copy(&db, k).map(|_| ()))
            .with_context(|| format!("cannot keep the trace at {}", k.display()))?,
        None => {
            let _ = std::fs::remove_file(&db);
        }
    }
    let precheck = match keep.filter(|_| precheck_kept) {
        Some(k) => Some(precheck(k)?),
        None => None,
    };
    Ok(AnalysisBench {
        calls: n_calls,
        waits,
        allocator_events: blocks,
        write_ms,
        write_events_per_s: n_events as f64 / (write_ms / 1e3),
        write_cpu_us_per_event: write_cpu_ms * 1e3 / n_events.max(1) as f64,
        db_mb: db_bytes as f64 / 1048576.0,
        bytes_per_event: db_bytes as f64 / n_events.max(1) as f64,
        rollups,
        commands,
        precheck,
    })
}

/// What a moment and a window cost early and late in the file (6% and
/// 90% into its calls): a moment replays the memory calls (and allocator
/// events) from the file's start, so a late one reads most of the file; a
/// window's allocator views take up the replay the writer stored along
/// the file (allocator checkpoints), so early and late cost the same.
/// Timed as a user's next command is: a first one paid the checks into a
/// checks cache of the bench's own (timed too, as the first read).
fn moments_and_windows(exe: &Path, db: &Path, n_calls: u64) -> Result<Vec<CommandRun>> {
    let dir = db.parent().unwrap_or(Path::new("."));
    // The calls span 5 µs each (`events`).
    let at = |f: f64| format!("{}us", (n_calls as f64 * 5.0 * f) as u64);
    let db_s = db.display().to_string();
    let out_s = dir.join("analysis-out").display().to_string();
    let (early, early_end, late, late_end) = (at(0.06), at(0.08), at(0.90), at(0.92));
    let runs: [(&str, Vec<&str>); 7] = [
        (
            "memory --at, first read",
            vec!["memory", "--json", "--db", &db_s, "--at", &early],
        ),
        (
            "memory --at 6%",
            vec!["memory", "--json", "--db", &db_s, "--at", &early],
        ),
        (
            "memory --at 92%",
            vec!["memory", "--json", "--db", &db_s, "--at", &late_end],
        ),
        (
            "explain 6-8%",
            vec![
                "explain", "--json", "--db", &db_s, "--from", &early, "--to", &early_end,
            ],
        ),
        (
            "explain 90-92%",
            vec![
                "explain", "--json", "--db", &db_s, "--from", &late, "--to", &late_end,
            ],
        ),
        (
            "report 90-92%",
            vec![
                "report", "--force", "-o", &out_s, "--db", &db_s, "--from", &late, "--to",
                &late_end,
            ],
        ),
        (
            "stats 90-92%",
            vec![
                "stats", "--json", "--db", &db_s, "--from", &late, "--to", &late_end,
            ],
        ),
    ];
    timed_in_turn(exe, &runs, &dir.join("analysis-checks-cache"))
}

/// Each of `runs` (a name and its command line) [`timed`] in turn, sharing
/// the checks cache `cache` (empty first, removed after): the first one
/// pays the checks the others find done.
fn timed_in_turn(exe: &Path, runs: &[(&str, Vec<&str>)], cache: &Path) -> Result<Vec<CommandRun>> {
    let _ = std::fs::remove_dir_all(cache);
    let out = runs
        .iter()
        .map(|(name, argv)| timed(exe, name, argv, cache))
        .collect::<Result<Vec<_>>>();
    let _ = std::fs::remove_dir_all(cache);
    out
}

/// Where `--keep-trace PATH` keeps the run of `--analysis-run-files`:
/// the directory `PATH.run` (replaced).
fn kept_run(keep: &Path) -> std::path::PathBuf {
    let mut name = keep.as_os_str().to_owned();
    name.push(".run");
    let k = std::path::PathBuf::from(name);
    let _ = std::fs::remove_dir_all(&k);
    k
}

/// A writer of the synthetic trace's processes at `path`, its session
/// beginning at `start`, as file `run` of a run when given.
fn synthetic_writer(
    path: &Path,
    shape: Synthetic,
    start: u64,
    run: Option<sleuth_store::run_ledger::RunLink>,
) -> Result<(TraceWriter, WriterHandle)> {
    let writer = TraceWriter::create(
        path,
        SessionInfo {
            start_mono_ns: start,
            // The run's clock base, as `trace` sets it: every file of a run has it.
            clock_base_ns: sleuth_store::file_clock::clock_base_for(shape.at.clock_ns),
            ..Default::default()
        },
        WriterOptions {
            max_db_bytes: 64 << 30,
            run,
            ..Default::default()
        },
    )
    .with_context(|| format!("cannot create {}", path.display()))?;
    let h = writer.handle();
    for k in 0..shape.procs {
        h.set_process(sleuth_core::ProcessInfo {
            pid: shape.at.pid_of(k),
            comm: "train".into(),
            ..Default::default()
        })?;
    }
    Ok((writer, h))
}

/// The synthetic trace written again as a run of `files` files, as
/// `trace --rotate` leaves one in `dir`: the events cut into files of as
/// many calls each, at a call (a record belongs to the file open when it
/// is drained), each file completed (and its run's ledger carried to the
/// next) before the next one begins, as the tracer's rotation does.
fn write_run(ops: &Ops, shape: Synthetic, dir: &Path, files: u64) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let link = sleuth_store::run_ledger::RunLink::new_run();
    let per_file = shape.calls.div_ceil(files).max(1);
    let open = |n: u64, start: u64| {
        let path = dir.join(sleuth_store::run::part_name(n));
        synthetic_writer(&path, shape, start, Some(link.for_file(n)))
    };
    let close = |(writer, h): (TraceWriter, WriterHandle), end: u64| -> Result<()> {
        h.set_session_end(end)?;
        drop(h);
        writer.finish()?;
        Ok(())
    };
    let mut n = 1;
    let mut current = open(n, shape.at.clock_ns)?;
    let mut calls = 0u64;
    for ev in events(ops, shape) {
        if let Event::Call(c) = &ev {
            if calls > 0 && calls.is_multiple_of(per_file) {
                close(current, c.ts_ns)?;
                n += 1;
                current = open(n, c.ts_ns)?;
            }
            calls += 1;
        }
        current.1.send(ev)?;
    }
    close(
        current,
        shape.at.clock_ns + 1_000_000 + shape.calls * CALL_EVERY_NS,
    )
}

/// What the run's readers cost (`--analysis-run-files`): `memory`,
/// `explain` and `report` of its directory (the whole run, as one trace)
/// and `explain --last` of its last 8%, timed as a user's next command
/// (the first read, a `memory` timed too, paid the files' checks into a
/// checks cache of the bench's own).
fn run_commands(exe: &Path, run: &Path, n_calls: u64) -> Result<Vec<CommandRun>> {
    let dir = run.parent().unwrap_or(Path::new("."));
    let run_s = run.display().to_string();
    let out_s = dir.join("analysis-run-out").display().to_string();
    let last = format!("{}us", (n_calls as f64 * 5.0 * 0.08) as u64);
    // `memory` reads every file's memory calls (their checks paid then);
    // `stats` reads none.
    let runs: [(&str, Vec<&str>); 6] = [
        (
            "run: memory, first read",
            vec!["memory", "--json", "--db", &run_s],
        ),
        ("run: stats", vec!["stats", "--json", "--db", &run_s]),
        ("run: memory", vec!["memory", "--json", "--db", &run_s]),
        ("run: explain", vec!["explain", "--json", "--db", &run_s]),
        (
            "run: report",
            vec!["report", "--force", "-o", &out_s, "--db", &run_s],
        ),
        (
            "run: explain --last 8%",
            vec!["explain", "--json", "--db", &run_s, "--last", &last],
        ),
    ];
    let out = timed_in_turn(exe, &runs, &dir.join("analysis-run-checks-cache"));
    let _ = std::fs::remove_file(&out_s);
    out
}

/// Runs `exe` with `argv` (the command `name`) with its checks cache in
/// `cache` (none when empty): its wall time and its own peak RSS.
fn timed(exe: &Path, name: &str, argv: &[&str], cache: &Path) -> Result<CommandRun> {
    let mut cmd = Command::new(exe);
    cmd.args(argv).env(sleuth_store::CACHE_DIR_ENV, cache);
    let t = Instant::now();
    let usage = super::bench::run_child(cmd).with_context(|| format!("{name} failed"))?;
    Ok(CommandRun {
        command: name.into(),
        wall_ms: t.elapsed().as_secs_f64() * 1e3,
        peak_rss_mb: usage.max_rss_kb as f64 / 1024.0,
    })
}

/// Checks the kept trace at `path` as `trace` checks its files (`precheck`).
fn precheck(path: &Path) -> Result<Precheck> {
    let memo = crate::checks_memo::memo();
    anyhow::ensure!(
        memo.saves(),
        "--precheck-kept: no checks cache to save into ({} is empty)",
        sleuth_store::CACHE_DIR_ENV
    );
    let budget = sleuth_store::ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT);
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    Ok(match crate::precheck::check(memo, path, &budget) {
        crate::precheck::Outcome::Saved {
            waited,
            checked,
            cpu,
        } => Precheck {
            outcome: "saved".into(),
            wait_ms: ms(waited),
            check_ms: ms(checked),
            check_cpu_ms: ms(cpu),
        },
        other => Precheck {
            outcome: format!("{other:?}"),
            wait_ms: f64::NAN,
            check_ms: f64::NAN,
            check_cpu_ms: f64::NAN,
        },
    })
}

/// The analysis part as text.
pub fn render(a: &AnalysisBench) -> String {
    // The allocator events count as events too (`bytes_per_event`).
    let blocks = match a.allocator_events {
        0 => String::new(),
        n => format!(" + {n} allocator events"),
    };
    let mut s = format!(
        "stored trace of {} calls + {} waits{blocks} (synthetic): written in {:.0} ms = {:.0} events/s, \
         {:.2} µs CPU per event; {:.0} MiB = {:.1} bytes per event; stats from rollups: {}\n",
        a.calls,
        a.waits,
        a.write_ms,
        a.write_events_per_s,
        a.write_cpu_us_per_event,
        a.db_mb,
        a.bytes_per_event,
        if a.rollups { "yes" } else { "no" }
    );
    for c in &a.commands {
        s += &format!(
            "  {:<24} {:>9.0} ms wall {:>9.1} MB peak RSS\n",
            c.command, c.wall_ms, c.peak_rss_mb
        );
    }
    if let Some(p) = &a.precheck {
        s += &format!(
            "kept trace checked for later reads ({}): {:.0} ms waiting for it to settle, {:.0} ms checking, {:.0} ms CPU\n",
            p.outcome, p.wait_ms, p.check_ms, p.check_cpu_ms
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn the_synthetic_trace_round_trips_with_rollups_and_names_the_hog() {
        let dir = std::env::temp_dir().join(format!("gs-bench-analysis-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = run(&dir, Synthetic::fresh(4_000), None, None, false, 0).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(r.calls, 4_000);
        assert!(r.waits >= 400);
        assert!(
            r.rollups,
            "a trace the writer finished answers stats from rollups"
        );
        assert!(r.bytes_per_event > 0.0 && r.commands.is_empty());
    }

    /// `--analysis-run-files`: the synthetic trace cut into a run of files
    /// whose tracer-carried ledger and allocator views are those of the
    /// trace written as one file.
    #[test]
    fn the_synthetic_run_is_the_trace_cut_into_files() {
        let dir = std::env::temp_dir().join(format!("gs-bench-run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let shape = Synthetic {
            allocator: true,
            ..Synthetic::fresh(6_400)
        };
        let (one, run_dir) = (dir.join("one.db"), dir.join("run"));
        run(&dir, shape, None, Some(&one), false, 0).unwrap();
        write_run(&Ops::new().unwrap(), shape, &run_dir, 3).unwrap();
        assert_eq!(sleuth_store::run::run_files(&run_dir).unwrap().len(), 3);
        let budget = sleuth_store::ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT);
        let memo = sleuth_store::CheckMemo::new();
        let r = sleuth_store::run_explain::load_memory(&run_dir, None, budget, &memo).unwrap();
        assert_eq!(r.replayed_memory_calls, 0, "the ledger the writer carried");
        let data = Trace::open(&one).unwrap().load(None).unwrap();
        let ledgers = sleuth_core::ledger::ledger(&data, None);
        let live = |l: &[sleuth_core::ledger::ProcessLedger]| -> Vec<(u32, u64)> {
            l.iter().map(|p| (p.pid, p.live_bytes)).collect()
        };
        assert_eq!(live(&r.ledgers), live(&ledgers));
        let want = sleuth_core::allocator::allocator_views(&data, None, &ledgers);
        let got = r.allocator_views().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(got.values().all(|v| v.state.is_some()));
        assert_eq!(
            serde_json::to_value(&got).unwrap(),
            serde_json::to_value(&want).unwrap()
        );
    }

    /// Several processes each get the whole mix, on their own 4 threads.
    #[test]
    fn the_synthetic_trace_spreads_over_processes() {
        let ops = Ops::new().unwrap();
        let calls = |procs| -> Vec<CallEvent> {
            events(
                &ops,
                Synthetic {
                    procs,
                    allocator: true,
                    ..Synthetic::fresh(64 * 6)
                },
            )
            .filter_map(|e| match e {
                Event::Call(c) => Some(c),
                _ => None,
            })
            .collect()
        };
        let one = calls(1);
        assert!(one
            .iter()
            .all(|c| c.pid == 100 && (100..104).contains(&c.tid)));
        let three = calls(3);
        for k in 0..3 {
            let pid = Magnitudes::FRESH.pid_of(k);
            let mine: Vec<&CallEvent> = three.iter().filter(|c| c.pid == pid).collect();
            assert_eq!(mine.len(), 128, "pid {pid}");
            assert!(mine.iter().all(|c| (pid..pid + 4).contains(&c.tid)));
            let mut mix: Vec<u16> = mine.iter().map(|c| c.op).collect();
            mix.sort_unstable();
            mix.dedup();
            assert!(
                mix.len() >= 5,
                "pid {pid}: launches, copies, syncs, malloc, free"
            );
        }
    }

    /// Issue 16's target for the database, on this realistic mix: a size,
    /// not a timing. What a trace of any length costs per event is the
    /// marginal size: the bytes the next events add. The rollup and finding
    /// aggregate tables grow with ops × histogram buckets × threads, not with
    /// events (at 200,000 calls they still add ~8 bytes per event, at 10M a
    /// fraction of one), so the size of a 100,000-call trace is taken off
    /// that of a 200,000-call one, on a machine up an hour (6-byte times, as
    /// at 10M: from 1 ms they took 4 and the marginal size read 2–5 bytes
    /// low). With allocator events too. Round 27: 76.5 and 78.7 bytes per
    /// added event, against 76.9 and 79.1 per event at 10M (round 26's
    /// 80.6 and 84.1 there).
    #[test]
    fn the_mix_is_stored_in_at_most_80_bytes_per_event() {
        let dir = std::env::temp_dir().join(format!("gs-bench-bytes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for allocator in [false, true] {
            let shape = |calls| Synthetic {
                allocator,
                at: Magnitudes::UP_AN_HOUR,
                ..Synthetic::fresh(calls)
            };
            let small = run(&dir, shape(100_000), None, None, false, 0).unwrap();
            let large = run(&dir, shape(200_000), None, None, false, 0).unwrap();
            assert!(small.rollups && large.rollups);
            assert_eq!(large.allocator_events > 0, allocator);
            let bytes = |r: &AnalysisBench| r.db_mb * 1048576.0;
            let events = |r: &AnalysisBench| (r.calls + r.waits + r.allocator_events) as f64;
            let marginal = (bytes(&large) - bytes(&small)) / (events(&large) - events(&small));
            assert!(
                marginal <= 80.0,
                "allocator events {allocator}: {marginal:.1} bytes per added event ({:.1} per event at 200,000 calls)",
                large.bytes_per_event
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A node's clock and pids change the numbers read, not the trace: the
    /// same per-op statistics and event counts, times past 2^47 ns and pids
    /// past 2^21 as read, and more bytes per event (its tids take 3 bytes in
    /// SQLite's records, 1 on a fresh machine; its times are stored on the
    /// trace's clock, 6 bytes, and its pids as the threads' distance to
    /// them, since round 33).
    #[test]
    fn a_nodes_magnitudes_change_the_sizes_not_the_answers() {
        let dir = std::env::temp_dir().join(format!("gs-bench-node-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (fresh_db, node_db) = (dir.join("fresh.db"), dir.join("node.db"));
        let shape = Synthetic::fresh(20_000);
        let fresh = run(&dir, shape, None, Some(&fresh_db), false, 0).unwrap();
        let node = Synthetic {
            at: Magnitudes::NODE,
            ..shape
        };
        let node = run(&dir, node, None, Some(&node_db), false, 0).unwrap();
        assert_eq!((fresh.calls, fresh.waits), (node.calls, node.waits));
        assert!(
            node.bytes_per_event > fresh.bytes_per_event + 4.0,
            "{} vs {} bytes per event",
            node.bytes_per_event,
            fresh.bytes_per_event
        );
        let ops = |db: &Path| {
            let stats = Trace::open(db).unwrap().stats_report(None).unwrap();
            serde_json::to_value(stats.expect("rollups").ops).unwrap()
        };
        assert_eq!(ops(&fresh_db), ops(&node_db));
        // Stored on the trace's clock (6 bytes each), CLOCK_MONOTONIC past
        // 2^47 ns once its base is added; pids past 2^21, stored as the
        // threads' distance to them.
        let c = rusqlite::Connection::open(&node_db).unwrap();
        let (ts, last, pid, off, base): (i64, i64, i64, i64, i64) = c
            .query_row(
                "SELECT min(ts_ns), max(ts_ns + dur_ns), min(pid), (SELECT min(off_ns) FROM waits),
                    (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'clock_base_ns')
                 FROM call_rows",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .unwrap();
        assert!(
            ts + base > 1 << 47 && off + base > 1 << 47 && last < 1 << 47 && pid > 1 << 21,
            "{ts} {off} {last} {base} {pid}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A thread does one thing at a time: its calls follow one another,
    /// each wait lies inside one of its calls or between two, and a
    /// malloc's pointer is never one still live (each free frees the
    /// allocation its thread made last).
    #[test]
    fn a_threads_calls_and_waits_never_overlap() {
        let ops = Ops::new().unwrap();
        for procs in [1, 3] {
            let evs: Vec<Event> = events(
                &ops,
                Synthetic {
                    procs,
                    allocator: true,
                    ..Synthetic::fresh(64 * 40)
                },
            )
            .collect();
            let mut by_tid: HashMap<u32, (Vec<&CallEvent>, Vec<&WaitEvent>)> = HashMap::new();
            for e in &evs {
                match e {
                    Event::Call(c) => by_tid.entry(c.tid).or_default().0.push(c),
                    Event::Wait(w) => by_tid.entry(w.tid).or_default().1.push(w),
                    _ => {}
                }
            }
            assert_eq!(by_tid.len() as u64, 4 * procs);
            for (tid, (calls, waits)) in &by_tid {
                for pair in calls.windows(2) {
                    assert!(
                        pair[0].ts_ns + pair[0].dur_ns <= pair[1].ts_ns,
                        "tid {tid}: a call at {} overlaps the next",
                        pair[0].ts_ns
                    );
                }
                for w in waits {
                    assert!(w.off_ns <= w.wake_ns && w.wake_ns <= w.on_ns);
                    let inside = calls
                        .iter()
                        .any(|c| c.ts_ns <= w.off_ns && w.on_ns <= c.ts_ns + c.dur_ns);
                    let crossing = calls
                        .iter()
                        .any(|c| w.off_ns < c.ts_ns + c.dur_ns && c.ts_ns < w.on_ns);
                    assert!(
                        inside || !crossing,
                        "tid {tid}: a wait at {} straddles a call",
                        w.off_ns
                    );
                }
            }
            let mut live: HashMap<u64, u64> = HashMap::new();
            let mut frees = 0;
            let mut vmm = std::collections::HashSet::new();
            let mut vmm_gone = 0;
            for c in evs.iter().filter_map(|e| match e {
                Event::Call(c) => Some(c),
                _ => None,
            }) {
                let p = c.ptr.unwrap();
                if c.op == ops.malloc {
                    let size = c.size.unwrap();
                    assert!(
                        live.iter().all(|(&q, &n)| p + size <= q || q + n <= p),
                        "a malloc at {p:#x} meets a live allocation"
                    );
                    live.insert(p, size);
                } else if c.op == ops.free {
                    assert!(live.remove(&p).is_some(), "a free of {p:#x}, not live");
                    frees += 1;
                } else if c.op == ops.mem_create {
                    assert!(vmm.insert((false, p)), "handle {p:#x} made twice");
                } else if c.op == ops.mem_map {
                    let size = c.size.unwrap();
                    assert!(
                        live.iter().all(|(&q, &n)| p + size <= q || q + n <= p),
                        "a page mapped at {p:#x} meets a live allocation"
                    );
                    assert!(vmm.insert((true, p)), "{p:#x} mapped twice");
                    live.insert(p, size);
                } else if c.op == ops.mem_release || c.op == ops.mem_unmap {
                    assert!(vmm.remove(&(c.op == ops.mem_unmap, p)), "{p:#x} not made");
                    if c.op == ops.mem_unmap {
                        live.remove(&p);
                    }
                    vmm_gone += 1;
                }
            }
            assert!(vmm.is_empty() && vmm_gone > 0, "every VMM page given back");
            // What stays: each process's allocator segment.
            let segments: Vec<u64> = (0..procs).map(segment_base).collect();
            let mut left: Vec<u64> = live.keys().copied().collect();
            left.sort_unstable();
            assert_eq!(left, segments);
            assert!(frees > 0);
            // The allocator's blocks: on the main thread, between its
            // calls, inside the segment, one taken at a time and given back.
            let mut taken: HashMap<u32, u64> = HashMap::new();
            let mut blocks = 0;
            for b in evs.iter().filter_map(|e| match e {
                Event::Block(b) => Some(b),
                _ => None,
            }) {
                blocks += 1;
                let (calls, _) = &by_tid[&b.tid];
                assert!(calls
                    .iter()
                    .all(|c| b.end_ns <= c.ts_ns || c.ts_ns + c.dur_ns <= b.start_ns));
                let seg = segment_base(u64::from((b.pid - 100) / 1000));
                let ptr = b.words[BLOCK_PTR_WORD];
                assert!(seg <= ptr && ptr + b.words[BLOCK_SIZE_WORD] <= seg + SEGMENT_BYTES);
                if b.op == ops.block_malloc {
                    assert!(taken.insert(b.pid, ptr).is_none());
                } else {
                    assert_eq!(taken.remove(&b.pid), Some(ptr));
                }
            }
            assert!(blocks >= 2 * 40 && taken.is_empty());
        }
    }

    /// The allocator mix's views, streamed from the file (`memory`'s and
    /// MCP `memory`'s way), equal those of the loaded trace: at the end,
    /// between a block's malloc and its free, and before the segment.
    #[test]
    fn the_allocator_mix_gives_the_loaded_views_streamed() {
        let dir = std::env::temp_dir().join(format!("gs-bench-alloc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("kept.db");
        run(
            &dir,
            Synthetic {
                procs: 2,
                allocator: true,
                ..Synthetic::fresh(6_400)
            },
            None,
            Some(&db),
            false,
            0,
        )
        .unwrap();
        let trace = Trace::open(&db).unwrap();
        let data = trace.load(None).unwrap();
        assert!(data.blocks.len() >= 200);
        let mt = sleuth_store::stream::MemoryTrace::open(
            &trace,
            None,
            sleuth_store::ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT),
        )
        .unwrap();
        let mid_block = data.blocks[100].end_ns + 1;
        for at in [None, Some(mid_block), Some(1_000_000)] {
            let l = sleuth_core::ledger::ledger(&data, at);
            let want = sleuth_core::allocator::allocator_views(&data, at, &l);
            assert_eq!(want.len(), 2);
            assert!(want.values().all(|v| v.state.is_some()));
            assert_eq!(mt.allocator_views(at, &l).unwrap(), want, "at {at:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_mix_has_every_kind_it_claims() {
        let ops = Ops::new().unwrap();
        let evs: Vec<Event> = events(
            &ops,
            Synthetic {
                allocator: true,
                ..Synthetic::fresh(4_096)
            },
        )
        .collect();
        let calls: Vec<&CallEvent> = evs
            .iter()
            .filter_map(|e| match e {
                Event::Call(c) => Some(c),
                _ => None,
            })
            .collect();
        for op in [
            ops.memcpy,
            ops.sync,
            ops.malloc,
            ops.free,
            ops.launch,
            ops.mem_create,
            ops.mem_map,
            ops.mem_unmap,
            ops.mem_release,
        ] {
            assert!(calls.iter().any(|c| c.op == op), "op {op} missing");
        }
        for op in [ops.block_malloc, ops.block_free] {
            assert!(
                evs.iter()
                    .any(|e| matches!(e, Event::Block(b) if b.op == op)),
                "allocator op {op} missing"
            );
        }
        let hog = evs
            .iter()
            .any(|e| matches!(e, Event::Wait(w) if w.culprits.iter().any(|c| c.comm == "hog")));
        assert!(hog);
    }
}
