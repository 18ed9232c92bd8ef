//! What one uprobe trap costs on this machine, measured as the capture
//! starts.
//!
//! Launches counted in the kernel (`--launches driver`, the default) cost
//! the traced thread one trap each, between its recorded calls: on-CPU time
//! that is the tracer's, not the program's. Round 56's tester measured 14.4
//! µs a trap on the 2-vCPU VM against 9 ns for the simulated launch itself
//! (a loop of 80,000 launches took 1.16 s traced, 0.69 ms untraced), and
//! the verdicts read that time as the program's host work: a GPU-bound loop
//! read 41% sync-stalled, another launch-bound. On an H200 a trap costs ~1.6
//! µs against ~3 µs for a real launch. The verdicts take `traps x cost`
//! out of the host time they judge (sleuth-core's `bottleneck::views`).
//!
//! The cost is measured on a function of gpusleuth's own binary
//! ([`gpusleuth_trap_target`]) with the `call_count` program attached, as
//! the launches' probes are: the time per call with the probe, less the time
//! without it, the lowest of several rounds each (a round preempted reads
//! high, never low). The program returns at once there (the tracer is never
//! traced), so the figure is a little under a counted launch's.

use crate::capture::{error_chain, CaptureError};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::UProbe;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Instant;

/// The probed function: never inlined, exported under this name so the
/// binary's symbol table holds it.
#[no_mangle]
#[inline(never)]
pub extern "C" fn gpusleuth_trap_target(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(1)
}

/// Calls per round, and rounds with and without the probe.
const CALLS: u32 = 500;
const ROUNDS: usize = 5;

/// Nanoseconds per call of the target, the lowest of [`ROUNDS`] rounds.
fn per_call_ns() -> u64 {
    let f: extern "C" fn(u64) -> u64 = std::hint::black_box(gpusleuth_trap_target);
    (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            let mut x = 0u64;
            for _ in 0..CALLS {
                x = f(x);
            }
            std::hint::black_box(x);
            t.elapsed().as_nanos() as u64 / u64::from(CALLS)
        })
        .min()
        .unwrap_or(0)
}

/// The cost of one trap of `prog` (loaded) attached to the target in this
/// process's executable. Errors say why it could not be measured (a binary
/// without its symbol table, an attach refused).
pub(crate) fn measure(prog: &mut UProbe, cookie: u64) -> Result<u64, CaptureError> {
    let exe = std::fs::read_link("/proc/self/exe").map_err(|e| CaptureError::Attach {
        path: "/proc/self/exe".into(),
        reason: e.to_string(),
    })?;
    let offset = target_offset(&exe)?;
    let bare = per_call_ns();
    let pid = NonZeroU32::new(std::process::id()).expect("a process id is never 0");
    let point = UProbeAttachPoint {
        location: UProbeAttachLocation::AbsoluteOffset(offset),
        cookie: Some(cookie),
    };
    let link = prog
        .attach(point, &exe, UProbeScope::OneProcess(pid))
        .map_err(|e| CaptureError::Attach {
            path: exe.display().to_string(),
            reason: error_chain(&e),
        })?;
    let probed = per_call_ns();
    let _ = prog.detach(link);
    Ok(probed.saturating_sub(bare))
}

/// The target's file offset in `exe`.
fn target_offset(exe: &Path) -> Result<u64, CaptureError> {
    crate::symbols::SymbolOffsets::read_only(exe, "gpusleuth_trap_target")
        .map_err(|reason| CaptureError::Attach {
            path: exe.display().to_string(),
            reason,
        })?
        .get("gpusleuth_trap_target")
        .ok_or_else(|| CaptureError::Attach {
            path: exe.display().to_string(),
            reason: "gpusleuth_trap_target is not in its symbol table".into(),
        })
}
