//! Typed events: what the kernel side reports, after decoding.
//!
//! Timestamps are CLOCK_MONOTONIC nanoseconds (`bpf_ktime_get_ns`); a trace
//! session stores the offset to wall-clock time.

use crate::ops::{op_by_id, Layer, OpInfo};
use serde::Serialize;

/// One completed CUDA call. `Default` is an empty successful call (op 0),
/// for building events field by field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CallEvent {
    /// Start of the call (monotonic ns).
    pub ts_ns: u64,
    /// Wall duration of the call.
    pub dur_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// Op id (see [`crate::ops::OPS`]).
    pub op: u16,
    /// Return code (`cudaError_t` / `CUresult`); 0 is success.
    pub ret: i64,
    /// Byte count the call was asked for (allocations, copies, memsets).
    pub size: Option<u64>,
    /// The pointer or handle the call produced (allocations: read at return)
    /// or consumed (frees, copies' destination, kernel function).
    pub ptr: Option<u64>,
    /// Stream argument, when passed in a register.
    pub stream: Option<u64>,
    /// `cudaMemcpyKind` of runtime copies.
    pub kind: Option<u64>,
    /// Host-side pointer of a host<->device copy (source of H2D, destination
    /// of D2H), to tell pinned from pageable memory. None for other calls.
    pub host_ptr: Option<u64>,
    /// A driver call made from inside a runtime call on the same thread
    /// (e.g. `cuMemAlloc_v2` inside `cudaMalloc`): not counted twice in the ledger.
    pub nested: bool,
    /// Time inside the call spent runnable but not running (CPU taken by others).
    pub runnable_ns: u64,
    /// Time inside the call spent blocked (sleeping: GPU wait, lock, I/O).
    pub blocked_ns: u64,
    /// CPU the call returned on.
    pub cpu: u32,
    /// Call site: id of a [`crate::sites::Stack`] (allocations, frees,
    /// failed and slow calls; None when not captured).
    pub stack_id: Option<u64>,
}

impl CallEvent {
    pub fn info(&self) -> Option<&'static OpInfo> {
        op_by_id(self.op)
    }
    pub fn op_name(&self) -> &'static str {
        self.info().map(|o| o.name).unwrap_or("unknown")
    }
    pub fn layer(&self) -> Option<Layer> {
        self.info().map(|o| o.layer)
    }
    pub fn end_ns(&self) -> u64 {
        self.ts_ns.saturating_add(self.dur_ns)
    }
    /// On-CPU time: wall minus runnable minus blocked. The three add up to `dur_ns`.
    pub fn on_cpu_ns(&self) -> u64 {
        self.dur_ns
            .saturating_sub(self.runnable_ns)
            .saturating_sub(self.blocked_ns)
    }
    /// Whether the call returned an error. A function that returns no status
    /// (`void`, see [`OpInfo::returns_status`]) never fails: its return
    /// register holds whatever was left there.
    pub fn failed(&self) -> bool {
        self.ret != 0 && self.has_status()
    }
    /// Whether `ret` means anything for this call's op.
    pub fn has_status(&self) -> bool {
        self.info().is_none_or(|o| o.returns_status)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    /// Switched out while still runnable: another task took the CPU.
    Preempted,
    /// Switched out sleeping (S, D, ...), later woken, then maybe waited for a CPU.
    Blocked,
}

impl WaitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitKind::Preempted => "preempted",
            WaitKind::Blocked => "blocked",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "preempted" => Some(WaitKind::Preempted),
            "blocked" => Some(WaitKind::Blocked),
            _ => None,
        }
    }
}

/// A task that held the CPU while a traced thread was runnable and waiting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Culprit {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// Runnable-waiting time of the traced thread while this task ran.
    pub ns: u64,
}

/// Who woke a blocked thread (`sched_waking`, read in the waker's context).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waker {
    /// Process (tgid) of the waking task; 0 for an interrupt on an idle CPU.
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// The wakeup came from interrupt context (a timer expiring, a device
    /// completing I/O): `pid`/`comm` then name the task that happened to be
    /// interrupted, not a task the thread waited for.
    pub irq: bool,
}

impl Waker {
    /// Whether a task (not an interrupt, not an idle CPU) did the wakeup.
    pub fn is_task(&self) -> bool {
        !self.irq && self.tid != 0
    }
}

/// One off-CPU interval of a traced thread.
/// Blocked part: `[off_ns, wake_ns)`; runnable part: `[wake_ns, on_ns)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaitEvent {
    pub pid: u32,
    pub tid: u32,
    pub kind: WaitKind,
    pub off_ns: u64,
    pub wake_ns: u64,
    pub on_ns: u64,
    /// Raw task state at switch-out (0 runnable, 1 S, 2 D, ...).
    pub prev_state: u32,
    pub cpu: u32,
    pub culprits: Vec<Culprit>,
    /// Who woke the thread (blocked waits only; None when not seen, for
    /// preemptions, and in traces recorded before wakers were captured).
    pub waker: Option<Waker>,
}

impl WaitEvent {
    pub fn blocked_ns(&self) -> u64 {
        self.wake_ns.saturating_sub(self.off_ns)
    }
    pub fn runnable_ns(&self) -> u64 {
        self.on_ns.saturating_sub(self.wake_ns)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcKind {
    Fork,
    Exec,
    Exit,
    OomVictim,
}

impl ProcKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcKind::Fork => "fork",
            ProcKind::Exec => "exec",
            ProcKind::Exit => "exit",
            ProcKind::OomVictim => "oom_victim",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fork" => Some(ProcKind::Fork),
            "exec" => Some(ProcKind::Exec),
            "exit" => Some(ProcKind::Exit),
            "oom_victim" => Some(ProcKind::OomVictim),
            _ => None,
        }
    }
}

/// Process lifecycle event of a traced process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcEvent {
    pub kind: ProcKind,
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// Parent pid (fork only).
    pub ppid: u32,
    /// Wait status at exit: `(code << 8) | signal`.
    pub exit_code: i32,
    pub comm: String,
}

/// Calls of a hot-path op counted in the kernel, per process (no per-call record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpCount {
    pub pid: u32,
    pub op: u16,
    pub count: u64,
}

/// Words of PyTorch's `Block` struct captured per allocator event.
pub const BLOCK_WORDS: usize = 16;

/// One caching-allocator event (`--torch-allocator`): a block handed out
/// (`DeviceCachingAllocator::malloc`, read at return), given back to the
/// cache (`::free`, read at entry) or a segment released to CUDA
/// (`::release_block`, read at entry). The `Block` struct's layout depends on
/// the torch version, so the raw words are kept and the field offsets are
/// calibrated from the data (see `allocator.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockEvent {
    /// Op id (64 malloc, 65 free, 66 release_block).
    pub op: u16,
    pub pid: u32,
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// malloc: the size asked for (before rounding).
    pub requested: Option<u64>,
    /// Address of the `Block` (0 when malloc returned none: out of memory).
    pub block: u64,
    /// The first `BLOCK_WORDS` 8-byte words of the `Block` (zeros if unreadable).
    pub words: [u64; BLOCK_WORDS],
    /// Call site of a block allocation (None when not captured).
    pub stack_id: Option<u64>,
}

/// Anything the capture path produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Call(CallEvent),
    Wait(WaitEvent),
    Proc(ProcEvent),
    Block(BlockEvent),
    /// An NCCL call (also a call: stored with the others, and with its arguments).
    Nccl(crate::nccl::NcclEvent),
}
