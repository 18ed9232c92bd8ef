//! `gpusleuth demo`: the whole pipeline on a built-in simulated CUDA workload.
//!
//! With root and eBPF: trace the simulated workload (shipped inside the
//! binary) while a CPU hog shares its CPU, then explain the trace. Without:
//! say why, and explain a trace recorded the same way (bundled).

use anyhow::{Context, Result};
use std::io::Write as _;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A real trace from an NVIDIA H200: a PyTorch matmul + synchronize loop with a
/// CPU-burning neighbour on its core (issue 7, scenario 2; see examples/README.md).
static BUNDLED_TRACE: &[u8] = include_bytes!("../../../../examples/h200-contention.db");

#[derive(clap::Args)]
pub struct Args {
    /// Keep the demo's files (trace database, simulated libraries) in this folder
    /// (new files only: refused where one of them is already there).
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// Explain the bundled trace even when live tracing is possible.
    #[arg(long)]
    pub offline: bool,
}

/// The scenario: pinned to CPU 0 beside the hog, it spins in copies from
/// pageable memory (on-CPU work the hog steals time from), sleeps in syncs
/// (GPU waits: blocked, not the hog's fault), launches kernels, leaks 128 KiB
/// on every step and asks for more memory than the device has.
const SCENARIO: &str = "pin 0; malloc 64000000 weights; \
    repeat 25 { spin 4 8388608; sync_sleep 6; launch 40; malloc 131072 }; malloc 1e15; free weights; exit 0";

pub fn run(args: Args) -> Result<i32> {
    // Ctrl-C and SIGTERM are counted, not fatal: the demo always gets to
    // remove its temporary folder (a live trace stops at the interrupt).
    crate::signals::install();
    // Decided first: a kept folder is checked for the files this way writes.
    let offline_why = match args.offline {
        true => Some("--offline given".to_string()),
        false => sleuth_probe::preflight().err().map(|why| why.to_string()),
    };
    let dir = match &args.keep {
        Some(d) => {
            refuse_kept_files(d, offline_why.is_none())?;
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
            d.clone()
        }
        None => private_temp_dir()?,
    };
    let keep = args.keep.is_some();
    let result = match &offline_why {
        None => live(&dir, keep),
        Some(why) => explain_bundled(&dir, why),
    };
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if crate::signals::interrupts() > 0 {
        eprintln!("gpusleuth: demo interrupted");
        return Ok(130);
    }
    result
}

/// What the demo writes in its folder: live, the trace (and the side files
/// SQLite may leave beside it), the hog's ready file and the simulated
/// libraries' folder; else the bundled trace, read where it is written.
fn written_names(live: bool) -> &'static [&'static str] {
    match live {
        true => &[
            "demo.db",
            "demo.db-wal",
            "demo.db-shm",
            "demo.db-journal",
            "hog.ready",
            "sim",
        ],
        false => &[
            "h200-contention.db",
            "h200-contention.db-wal",
            "h200-contention.db-shm",
            "h200-contention.db-journal",
        ],
    }
}

/// Refuses a `--keep` folder that already holds anything the demo would
/// write there, before anything is written: the demo removed a user's
/// `demo.db` and traced over it, and wrote the bundled trace through a
/// link planted at its name (as root, over any file; round 51). What is
/// there is never removed nor replaced: an earlier demo's files are kept
/// too, and the demo asks for another folder.
fn refuse_kept_files(dir: &Path, live: bool) -> Result<()> {
    for name in written_names(live) {
        let path = dir.join(name);
        // Not followed: a link (even a dangling one) is something there.
        if std::fs::symlink_metadata(&path).is_ok() {
            anyhow::bail!(
                "{}: already exists (demo --keep writes only new files and never replaces one: name an empty or new folder)",
                path.display()
            );
        }
    }
    Ok(())
}

/// A new folder only we can use (mkdtemp: unpredictable name, mode 0700),
/// so nothing planted in the shared temp folder is written through.
fn private_temp_dir() -> Result<PathBuf> {
    let template = std::env::temp_dir().join("gpusleuth-demo-XXXXXX");
    let mut bytes = std::ffi::CString::new(template.into_os_string().into_vec())
        .context("temporary folder path contains a NUL byte")?
        .into_bytes_with_nul();
    // SAFETY: `bytes` is a writable NUL-terminated template ending in XXXXXX;
    // mkdtemp replaces those characters in place and returns it or NULL.
    let r = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
    if r.is_null() {
        return Err(std::io::Error::last_os_error()).with_context(|| {
            format!(
                "cannot create a folder in {}",
                std::env::temp_dir().display()
            )
        });
    }
    bytes.pop(); // the NUL
    Ok(PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

fn live(dir: &Path, keep: bool) -> Result<i32> {
    // A folder of our own (refused if something took the name since the
    // check): nothing planted in it is written through.
    let sim_dir = dir.join("sim");
    let sim = std::fs::create_dir(&sim_dir)
        .and_then(|()| sleuth_sim::materialize(&sim_dir))
        .with_context(|| {
            format!(
                "cannot write the simulated CUDA libraries in {}",
                sim_dir.display()
            )
        })?;
    let db = dir.join("demo.db");
    outln!("gpusleuth demo: tracing a simulated CUDA program (real eBPF on simulated libcudart/libcuda).")?;
    outln!(
        "  ground truth: the program is pinned to CPU 0; `{}` busy-loops on CPU 0 beside it;",
        sleuth_sim::HOG_COMM
    )?;
    outln!("  it spins in 25 copies (CPU work), sleeps in 25 syncs (GPU waits), launches 1000 kernels,")?;
    outln!("  leaks 128 KiB on each of its 25 steps (3.1 MiB), and one cudaMalloc asks for 1e15 bytes (must fail).\n")?;

    keep_off_cpu0();
    let ready = dir.join("hog.ready");
    let mut hog = Command::new(&sim.hog)
        .args(["0", "3000"])
        .arg(&ready)
        .stdin(Stdio::null())
        .spawn()
        .context("cannot start the CPU hog")?;
    for _ in 0..200 {
        if ready.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let trace_args = crate::capture::Args {
        db: Some(db.clone()),
        // Checked absent before (`refuse_kept_files`); one that appeared
        // since is kept, the trace refused.
        force: false,
        pids: Vec::new(),
        duration: Some(Duration::from_secs(30)),
        on_duration: crate::capture::OnDuration::Kill,
        launches: sleuth_probe::LaunchMode::Driver,
        cuda_libs: vec![sim.libcudart.clone(), sim.libcuda.clone()],
        max_db: 256 << 20,
        rotate: None,
        keep: None,
        // A scratch trace of a few calls: nothing for a later read to skip.
        precheck: crate::precheck::MinBytes(None),
        ring_size: sleuth_probe::DEFAULT_RING_BYTES as u64,
        torch_allocator: false,
        sites: true,
        site_slow: Duration::from_millis(1),
        finish_killed: false,
        ready_file: None,
        quiet: true,
        metrics: None,
        command: vec![sim.workload.clone().into_os_string(), SCENARIO.into()],
    };
    let traced = crate::capture::run(trace_args);
    let _ = hog.kill();
    let _ = hog.wait();
    let code = traced?;
    if crate::signals::interrupts() > 0 {
        return Ok(130);
    }
    if code != 0 {
        anyhow::bail!("the simulated workload exited with {code}");
    }
    if keep {
        outln!("\n== gpusleuth explain --db {}\n", db.display())?;
    } else {
        // The folder goes when the demo ends: name no path that will not exist.
        outln!("\n== gpusleuth explain (the trace is deleted when the demo ends; `demo --keep DIR` keeps it)\n")?;
    }
    explain(db)
}

/// The demo's last step: `gpusleuth explain` of the trace, as text.
fn explain(db: PathBuf) -> Result<i32> {
    let input = crate::args::TraceInput { db, pid: None };
    crate::render::explain::print(
        &input,
        crate::window::WindowArgs::default(),
        crate::render::explain::Style::Text,
    )
}

/// The tracer's own threads stay off the contended CPU 0 where the machine
/// has another one: the demo is about the hog, not about us.
fn keep_off_cpu0() {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n < 2 {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it;
    // sched_setaffinity(0, ...) applies to this thread, inherited by threads spawned later.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for cpu in 1..n.min(libc::CPU_SETSIZE as libc::c_long) as usize {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn explain_bundled(dir: &Path, why: &str) -> Result<i32> {
    outln!("gpusleuth demo: not tracing live ({why}).")?;
    outln!("Explaining a real trace instead, recorded on an NVIDIA H200 (driver 580.159.04, torch 2.11):")?;
    outln!("  a PyTorch matmul + synchronize loop pinned to one CPU; after 6 s a CPU-burning")?;
    outln!("  neighbour (`gs-neighbour`) starts on the same CPU. (examples/h200-contention.db)\n")?;
    let db = dir.join("h200-contention.db");
    // A new file: never through a link, never over a file (`refuse_kept_files`).
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&db)
        .and_then(|mut f| f.write_all(BUNDLED_TRACE))
        .with_context(|| format!("cannot write {}", db.display()))?;
    explain(db)
}
