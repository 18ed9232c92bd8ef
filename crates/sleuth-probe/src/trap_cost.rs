//! What the probes' traps cost on this machine: one trap of a kernel-counted
//! launch, and a recorded call's entry and return traps, measured as the
//! probes that take them are attached.
//!
//! Launches counted in the kernel (`--launches driver`, the default) cost
//! the traced thread one trap each, between its recorded calls: on-CPU time
//! that is the tracer's, not the program's. Round 56's tester measured 14.4
//! µs a trap on the 2-vCPU VM against 9 ns for the simulated launch itself
//! (a loop of 80,000 launches took 1.16 s traced, 0.69 ms untraced), and
//! the verdicts read that time as the program's host work: a GPU-bound loop
//! read 41% sync-stalled, another launch-bound. The verdicts take `traps x
//! cost` out of the host time they judge (sleuth-core's `bottleneck::views`).
//!
//! The cost is measured on a function of gpusleuth's own binary with the
//! `call_count` program attached, as the launches' probes are: the time per
//! call with the probe, less the time without it, the lowest of several
//! rounds each (a round preempted reads high, never low). The program
//! returns at once there (the tracer is never traced), so the figure is a
//! little under a counted launch's.
//!
//! What a trap costs depends on the probed function's first instruction
//! ([`EntryClass`]): x86's uprobes emulate a `push` (the kernel does its
//! work) but execute most other instructions out of line, single-stepped
//! (a second exception). Round 57 on an H200: libcuda's and libcudart's
//! functions begin with `push rbp`, the measured function with a `mov`,
//! and the trap read 6.3-7.9 us where the launch loop lost 2.6-3.5 us a
//! launch to tracing (1.88-2.08 s untraced, 2.42-2.62 s traced, 200,000
//! launches): the verdicts took twice the traps out. So the trap is
//! measured on a function that begins as the probed one does: one per
//! class, the class read from the library's first counted launch function.
//!
//! A recorded call takes two traps, at its entry (`call_entry`) and at its
//! return (`call_return`, a uretprobe); with `--launches full` every launch
//! is one, its nested driver launch another. Round 58 on the VM: a loop of
//! 4-us simulated launches read 42.3 us of host time a launch. The pair is
//! measured with gpusleuth's own process traced for the moment, so that the
//! programs do what they do on a traced call (`Capture::measure_call_trap_ns`;
//! in a ring under 1 MiB they return at once instead): 17.0-18.8 us, and the
//! loop 2.7-4.7 us a launch with the traps out (4.45 untraced; measured
//! with the programs returning at once, 5.9-8.6). Both measures attach as
//! the libraries' probes are: a uprobe_multi link where that path is on.

use crate::capture::{error_chain, CaptureError};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Instant;

/// How a probed function begins, which decides what a trap on it costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryClass {
    /// `push` of a register (x86-64 `0x50..=0x57`, `0x41 0x50..=0x57`):
    /// emulated where the kernel does (Linux 6.11 and later).
    Push,
    /// `endbr64` (`f3 0f 1e fa`), the first instruction of code built with
    /// CET (the simulated libraries: gcc's default here).
    Endbr,
    /// Any other instruction (or another architecture): executed out of
    /// line, single-stepped.
    Other,
}

impl EntryClass {
    /// The class of a function whose first bytes are `code`.
    pub fn of(code: &[u8]) -> EntryClass {
        if !cfg!(target_arch = "x86_64") {
            return EntryClass::Other;
        }
        match code {
            [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..] => EntryClass::Push,
            [0xf3, 0x0f, 0x1e, 0xfa, ..] => EntryClass::Endbr,
            _ => EntryClass::Other,
        }
    }

    /// The class of the function at file offset `offset` of `path`; None
    /// where its bytes cannot be read.
    pub fn at(path: &Path, offset: u64) -> Option<EntryClass> {
        use std::os::unix::fs::FileExt;
        let mut code = [0u8; 4];
        let f = std::fs::File::open(path).ok()?;
        f.read_exact_at(&mut code, offset).ok()?;
        Some(EntryClass::of(&code))
    }

    /// The measured function of this class (its symbol in gpusleuth's
    /// binary) and a pointer to call it through.
    fn target(self) -> (&'static str, extern "C" fn(u64) -> u64) {
        #[cfg(target_arch = "x86_64")]
        match self {
            EntryClass::Push => ("gpusleuth_trap_push", gpusleuth_trap_push),
            EntryClass::Endbr => ("gpusleuth_trap_endbr", gpusleuth_trap_endbr),
            EntryClass::Other => ("gpusleuth_trap_other", gpusleuth_trap_other),
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = self;
            ("gpusleuth_trap_target", gpusleuth_trap_target)
        }
    }
}

// The measured functions, one per class, each `x + 1`: written in assembly
// so that each begins with its class's instruction whatever the compiler
// would choose (the Rust function of round 56 began with a `mov`).
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.gpusleuth_trap,\"ax\",@progbits",
    ".p2align 4",
    ".globl gpusleuth_trap_push",
    ".type gpusleuth_trap_push,@function",
    "gpusleuth_trap_push:",
    "push rbp",
    "mov rbp, rsp",
    "lea rax, [rdi + 1]",
    "pop rbp",
    "ret",
    ".size gpusleuth_trap_push, . - gpusleuth_trap_push",
    ".p2align 4",
    ".globl gpusleuth_trap_endbr",
    ".type gpusleuth_trap_endbr,@function",
    "gpusleuth_trap_endbr:",
    "endbr64",
    "push rbp",
    "mov rbp, rsp",
    "lea rax, [rdi + 1]",
    "pop rbp",
    "ret",
    ".size gpusleuth_trap_endbr, . - gpusleuth_trap_endbr",
    ".p2align 4",
    ".globl gpusleuth_trap_other",
    ".type gpusleuth_trap_other,@function",
    "gpusleuth_trap_other:",
    "mov rax, rdi",
    "add rax, 1",
    "ret",
    ".size gpusleuth_trap_other, . - gpusleuth_trap_other",
    ".popsection",
);

// SAFETY: the three are defined in the assembly above with C's ABI (rdi
// in, rax out, callee-saved registers and the stack restored), read no
// memory and touch no state: any argument is sound, so they are `safe`.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    safe fn gpusleuth_trap_push(x: u64) -> u64;
    safe fn gpusleuth_trap_endbr(x: u64) -> u64;
    safe fn gpusleuth_trap_other(x: u64) -> u64;
}

/// The probed function elsewhere: never inlined, exported under this name
/// so the binary's symbol table holds it.
#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
#[inline(never)]
pub extern "C" fn gpusleuth_trap_target(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(1)
}

/// Calls per round, and rounds with and without the probe.
const CALLS: u32 = 500;
const ROUNDS: usize = 5;

/// Nanoseconds per call of `target`, the lowest of [`ROUNDS`] rounds.
fn per_call_ns(target: extern "C" fn(u64) -> u64) -> u64 {
    let f = std::hint::black_box(target);
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

/// The cost to the calling thread of the probes `attach` sets on this
/// process's function of `class` (given the binary and the function's file
/// offset; they stay attached until what it returns is dropped): one trap
/// for `call_count`, an entry and a return trap for a recorded call's
/// `call_entry` and `call_return`. Errors say why it could not be measured
/// (a binary without its symbol table, an attach refused).
pub(crate) fn measure<L>(
    class: EntryClass,
    attach: impl FnOnce(&Path, u64) -> Result<L, CaptureError>,
) -> Result<u64, CaptureError> {
    let exe = std::fs::read_link("/proc/self/exe").map_err(|e| CaptureError::Attach {
        path: "/proc/self/exe".into(),
        reason: e.to_string(),
    })?;
    let (name, target) = class.target();
    let offset = target_offset(&exe, name)?;
    let bare = per_call_ns(target);
    let attached = attach(&exe, offset)?;
    let probed = per_call_ns(target);
    drop(attached);
    Ok(probed.saturating_sub(bare))
}

/// Attaches `programs` (loaded uprobe or uretprobe programs of `bpf`) at
/// `offset` of `exe`, for this process only, with `cookie`: the links,
/// which detach when dropped. The one-by-one attach, where the batched one
/// is off.
pub(crate) fn attach_one_by_one(
    bpf: &mut aya::Ebpf,
    programs: &[&str],
    exe: &Path,
    offset: u64,
    cookie: u64,
) -> Result<Vec<aya::programs::uprobe::UProbeLink>, CaptureError> {
    let pid = NonZeroU32::new(std::process::id()).expect("a process id is never 0");
    let mut links = Vec::with_capacity(programs.len());
    for &prog in programs {
        let p = crate::capture::loaded_uprobe(bpf, prog)?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: Some(cookie),
        };
        let attach_error = |e: &dyn std::error::Error| CaptureError::Attach {
            path: exe.display().to_string(),
            reason: error_chain(e),
        };
        let id = p
            .attach(point, exe, UProbeScope::OneProcess(pid))
            .map_err(|e| attach_error(&e))?;
        links.push(p.take_link(id).map_err(|e| attach_error(&e))?);
    }
    Ok(links)
}

/// The file offset of function `name` in `exe`.
fn target_offset(exe: &Path, name: &str) -> Result<u64, CaptureError> {
    crate::symbols::SymbolOffsets::read_only(exe, name)
        .map_err(|reason| CaptureError::Attach {
            path: exe.display().to_string(),
            reason,
        })?
        .get(name)
        .ok_or_else(|| CaptureError::Attach {
            path: exe.display().to_string(),
            reason: format!("{name} is not in its symbol table"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_is_classed_by_its_first_instruction() {
        // libcuda.so.1's and libcudart.so.13's entry points on the H200
        // (580.159.04, CUDA 13), and the simulated libraries' (gcc, CET).
        let libcuda = [0x55, 0x48, 0x89, 0xe5, 0x41, 0x54];
        let sim = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48];
        let x86 = cfg!(target_arch = "x86_64");
        let (push, endbr) = if x86 {
            (EntryClass::Push, EntryClass::Endbr)
        } else {
            (EntryClass::Other, EntryClass::Other)
        };
        assert_eq!(EntryClass::of(&libcuda), push);
        assert_eq!(EntryClass::of(&[0x41, 0x57, 0x41, 0x56]), push);
        assert_eq!(EntryClass::of(&sim), endbr);
        // round 56's measured function: `mov [rsp-8], rdi`.
        assert_eq!(EntryClass::of(&[0x48, 0x89, 0x7c, 0x24]), EntryClass::Other);
        assert_eq!(EntryClass::of(&[]), EntryClass::Other);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn each_measured_function_begins_as_its_class_says() {
        // The binary's own bytes: the assembler kept each first instruction.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        for class in [EntryClass::Push, EntryClass::Endbr, EntryClass::Other] {
            let (name, f) = class.target();
            assert_eq!(f(41), 42, "{name}");
            let offset = target_offset(&exe, name).unwrap();
            assert_eq!(EntryClass::at(&exe, offset), Some(class), "{name}");
        }
    }
}
