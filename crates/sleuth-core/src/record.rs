//! Byte-exact mirror of `bpf/gpusleuth.h` and decoding of ring-buffer records.
//!
//! The kernel writes these structs; user space reads them from the ring
//! buffer as bytes. The size/offset tests below fail if the two drift.

use crate::event::{
    BlockEvent, CallEvent, Culprit, Event, ProcEvent, ProcKind, WaitEvent, WaitKind, Waker,
    BLOCK_WORDS,
};
use crate::ops::op_by_id;

pub const COMM_LEN: usize = 16;
pub const NARGS: usize = 6;
pub const MAX_CULPRITS: usize = 4;

pub const REC_CALL: u32 = 1;
pub const REC_WAIT: u32 = 2;
pub const REC_PROC: u32 = 3;
pub const REC_BLOCK: u32 = 4;
pub const REC_NCCL: u32 = 5;
pub const REC_STACK: u32 = 6;

/// `RawWait::waker_flags`: a waker was seen (`sched_waking` while the thread slept).
pub const WAKER_KNOWN: u32 = 1;
/// `RawWait::waker_flags`: the wakeup ran in interrupt context (timer, device).
pub const WAKER_IRQ: u32 = 2;

/// `gs_wait.kind` (`GS_WAIT_*`).
pub mod wait_kind {
    /// Switched out while runnable: the CPU was taken.
    pub const PREEMPTED: u32 = 1;
    /// Switched out sleeping, woken, then waited for a CPU.
    pub const BLOCKED: u32 = 2;
}

/// `gs_proc.event` (`GS_PROC_*`).
pub mod proc_kind {
    pub const FORK: u32 = 1;
    pub const EXEC: u32 = 2;
    pub const EXIT: u32 = 3;
    pub const OOM_VICTIM: u32 = 4;
}

pub const CALL_NESTED: u32 = 1;
pub const CALL_OUT_VALID: u32 = 2;

pub const COOKIE_RUNTIME: u64 = 1 << 20;
/// Emit a Block record, reading the Block* from the return value.
pub const COOKIE_BLOCK_RET: u64 = 1 << 21;
/// Emit a Block record, reading the Block* from argument 1 at entry.
pub const COOKIE_BLOCK_ARG1: u64 = 1 << 22;
/// Emit an NCCL record (a call plus the caller's stack words at entry).
pub const COOKIE_NCCL: u64 = 1 << 23;
/// Stack words an NCCL record carries (`GS_NCCL_STACK_WORDS`).
pub const NCCL_STACK_WORDS: usize = 4;
/// Capture the call site of every call of this op (not only failed or slow ones).
pub const COOKIE_STACK: u64 = 1 << 24;

/// Native frames (return addresses) kept per stack (`GS_NATIVE_DEPTH`).
pub const NATIVE_DEPTH: usize = 32;
/// Python frames kept per stack (`GS_PY_DEPTH`).
pub const PY_DEPTH: usize = 64;

/// `gs_stack.flags`.
pub mod stack_flag {
    /// Native frames filled the cap: the stack may be truncated.
    pub const NATIVE_FULL: u32 = 1;
    /// The user stack could not be read at all.
    pub const NATIVE_ERR: u32 = 2;
    /// The process runs a recognised CPython.
    pub const PY: u32 = 4;
    /// More Python frames than the cap (the outermost were dropped).
    pub const PY_TRUNC: u32 = 8;
    /// CPython process, but the calling thread has no Python thread state.
    pub const PY_NO_THREAD: u32 = 16;
}

/// `gs_py_layout.kind`: which frame chain the kernel walks.
pub mod py_frames {
    /// 3.10: `tstate->frame`, a `PyFrameObject` chain.
    pub const V310: u32 = 1;
    /// 3.11, 3.12: `tstate->cframe->current_frame`, `_PyInterpreterFrame` chain.
    pub const V311: u32 = 2;
    /// 3.13: `tstate->current_frame`.
    pub const V313: u32 = 3;
}

/// Builds the attach cookie the kernel side reads (see `GS_COOKIE_*` in the header).
pub fn cookie(op: u16, out_arg: u8, runtime: bool) -> u64 {
    (op as u64) | ((out_arg as u64 & 0xf) << 16) | if runtime { COOKIE_RUNTIME } else { 0 }
}

/// Indices of the kernel's `stats` array (`GS_STAT_*`).
pub mod stat {
    pub const RING_DROP_CALL: usize = 0;
    pub const RING_DROP_WAIT: usize = 1;
    pub const RING_DROP_PROC: usize = 2;
    pub const INFLIGHT_FULL: usize = 3;
    pub const THREAD_FULL: usize = 4;
    pub const COUNT_FULL: usize = 5;
    pub const UNMATCHED_RETURN: usize = 6;
    pub const TRACED_FULL: usize = 7;
    pub const RING_DROP_BLOCK: usize = 8;
    pub const RING_DROP_NCCL: usize = 9;
    pub const RING_DROP_STACK: usize = 10;
    /// A traced thread ran without our `sched_switch` program seeing the
    /// switch to it: its wait was closed by the next probe, the switch-in
    /// dated by the thread's CPU time since its switch-out.
    pub const SWITCH_IN_UNSEEN: usize = 11;
    pub const MAX: usize = 12;
    pub const NAMES: [&str; MAX] = [
        "ring_full_call",
        "ring_full_wait",
        "ring_full_proc",
        "inflight_map_full",
        "thread_map_full",
        "count_map_full",
        "unmatched_return",
        "traced_map_full",
        "ring_full_block",
        "ring_full_nccl",
        "ring_full_stack",
        "switch_in_unseen",
    ];

    /// Whether counter `i` is an expected edge of attaching to running
    /// processes rather than a loss: a return whose entry was not seen
    /// because the call began before its process was traced. (The in-flight
    /// map holds 65,536 calls, so an eviction would need that many open at
    /// once; a failed entry insert is counted as `inflight_map_full`.)
    pub fn is_attach_edge(i: usize) -> bool {
        i == UNMATCHED_RETURN
    }

    /// The name of an attach-edge counter in `stats` (`edge_` + this) and metrics.
    pub fn edge_name(i: usize) -> &'static str {
        match i {
            UNMATCHED_RETURN => "return_without_entry",
            _ => NAMES.get(i).copied().unwrap_or("unknown"),
        }
    }

    /// Whether loss counter `i` counts records lost because the ring buffer
    /// was full (`ring_full_*`); the other losses are full kernel maps.
    pub fn is_ring_drop(i: usize) -> bool {
        NAMES.get(i).is_some_and(|n| n.starts_with("ring_full_"))
    }

    /// Whether counter `i` counts intervals the capture settled itself
    /// because the kernel did not run our program for an event (stored
    /// under its own name, `switch_in_unseen`): nothing was lost, but those
    /// waits' switch-in times are estimates.
    pub fn is_settled_gap(i: usize) -> bool {
        i == SWITCH_IN_UNSEEN
    }

    /// Indices of the real loss counters (every counter but the attach
    /// edges and the settled gaps).
    pub fn losses() -> impl Iterator<Item = usize> {
        (0..MAX).filter(|&i| !is_attach_edge(i) && !is_settled_gap(i))
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCall {
    pub r#type: u32,
    pub op: u32,
    pub pid: u32,
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub args: [u64; NARGS],
    pub out: u64,
    pub ret: i64,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
    pub flags: u32,
    pub cpu: u32,
    pub stack_id: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCulprit {
    pub pid: u32,
    pub tid: u32,
    pub ns: u64,
    pub comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RawWait {
    pub r#type: u32,
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub off_ns: u64,
    pub wake_ns: u64,
    pub on_ns: u64,
    pub prev_state: u32,
    pub cpu: u32,
    pub n_culprits: u32,
    pub pad: u32,
    pub culprits: [RawCulprit; MAX_CULPRITS],
    /// The task that woke the thread (see `WAKER_*` in `waker_flags`).
    pub waker_pid: u32,
    pub waker_tid: u32,
    pub waker_comm: [u8; COMM_LEN],
    pub waker_flags: u32,
    pub pad2: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RawProc {
    pub r#type: u32,
    pub event: u32,
    pub pid: u32,
    pub tid: u32,
    pub ppid: u32,
    pub exit_code: i32,
    pub ts_ns: u64,
    pub comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RawBlock {
    pub r#type: u32,
    pub op: u32,
    pub pid: u32,
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub requested: u64,
    pub block: u64,
    pub words: [u64; BLOCK_WORDS],
    pub stack_id: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawPyFrame {
    /// Address of the frame's code object.
    pub code: u64,
    /// The frame's raw instruction field (3.10: `f_lasti`; 3.11+: a pointer).
    pub instr: u64,
}

/// One distinct call site, sent once per id (`struct gs_stack`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawStack {
    pub r#type: u32,
    pub pid: u32,
    pub id: u64,
    pub n_native: u32,
    pub n_py: u32,
    pub flags: u32,
    pub pad: u32,
    pub native: [u64; NATIVE_DEPTH],
    pub py: [RawPyFrame; PY_DEPTH],
}

impl Default for RawStack {
    fn default() -> Self {
        RawStack {
            r#type: REC_STACK,
            pid: 0,
            id: 0,
            n_native: 0,
            n_py: 0,
            flags: 0,
            pad: 0,
            native: [0; NATIVE_DEPTH],
            py: [RawPyFrame::default(); PY_DEPTH],
        }
    }
}

impl RawStack {
    /// Native return addresses, innermost first.
    pub fn native_frames(&self) -> &[u64] {
        &self.native[..(self.n_native as usize).min(NATIVE_DEPTH)]
    }
    /// Python (code, instruction) pairs, innermost first.
    pub fn py_frames(&self) -> &[RawPyFrame] {
        &self.py[..(self.n_py as usize).min(PY_DEPTH)]
    }
}

/// How the kernel walks one process's CPython frames (`struct gs_py_layout`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawPyLayout {
    pub runtime: u64,
    pub kind: u32,
    pub runtime_interp_head: u32,
    pub interp_threads_head: u32,
    pub tstate_next: u32,
    pub tstate_thread_id: u32,
    pub tstate_frame: u32,
    pub cframe_current: u32,
    pub frame_previous: u32,
    pub frame_code: u32,
    pub frame_instr: u32,
    pub frame_owner: u32,
    pub instr_size: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RawNccl {
    pub r#type: u32,
    pub op: u32,
    pub pid: u32,
    pub tid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub args: [u64; NARGS],
    pub stack: [u64; NCCL_STACK_WORDS],
    pub out: u64,
    pub ret: i64,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
    pub flags: u32,
    pub cpu: u32,
}

/// Key of the kernel's `op_counts` map (`struct gs_count_key`): hot-path
/// calls counted per process and op.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CountKey {
    pub pid: u32,
    pub op: u32,
}

/// Value of the kernel's `threads` map (`struct thread_state` in
/// gpusleuth.bpf.c). User space only counts its entries, but the map's value
/// size must match for the map to open at all.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ThreadState {
    /// Switched out at.
    pub off_ns: u64,
    /// Woken at (== `off_ns` when preempted).
    pub wake_ns: u64,
    pub runnable_total: u64,
    pub blocked_total: u64,
    /// `THREAD_ON_CPU`, `THREAD_RUNNABLE` or `THREAD_BLOCKED`.
    pub state: u32,
    pub prev_state: u32,
    /// Runtime-layer calls in flight on this thread.
    pub rt_depth: u32,
    pub waker_flags: u32,
    pub waker_pid: u32,
    pub waker_tid: u32,
    pub waker_comm: [u8; COMM_LEN],
    /// Its CPU time (`se.sum_exec_runtime`) at switch-out: dates a
    /// switch-in the scheduler probe did not see.
    pub ran_at_off: u64,
}

/// Value of the kernel's `inflight` map (`struct inflight_call` in
/// gpusleuth.bpf.c): a call entered and not yet returned. Only its keys are read.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct InflightCall {
    pub start_ns: u64,
    pub args: [u64; NARGS],
    pub runnable_snap: u64,
    pub blocked_snap: u64,
    pub flags: u32,
    pub pad: u32,
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Short { need: usize, got: usize },
    UnknownType(u32),
    UnknownOp(u32),
    BadValue(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Short { need, got } => {
                write!(f, "record too short: {got} bytes, need {need}")
            }
            DecodeError::UnknownType(t) => write!(f, "unknown record type {t}"),
            DecodeError::UnknownOp(o) => write!(f, "unknown op id {o}"),
            DecodeError::BadValue(what) => write!(f, "bad value in record: {what}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Reads a `#[repr(C)]` plain-old-data struct from the start of `buf`.
fn read_pod<T: Copy + Default>(buf: &[u8]) -> Result<T, DecodeError> {
    let need = std::mem::size_of::<T>();
    if buf.len() < need {
        return Err(DecodeError::Short {
            need,
            got: buf.len(),
        });
    }
    let mut out = T::default();
    // SAFETY: T is a #[repr(C)] struct of integers and byte arrays (every bit
    // pattern is valid), `buf` holds at least size_of::<T>() bytes, and the
    // destination is a distinct, properly aligned local.
    unsafe {
        std::ptr::copy_nonoverlapping(buf.as_ptr(), (&mut out as *mut T).cast::<u8>(), need);
    }
    Ok(out)
}

fn comm_to_string(comm: &[u8; COMM_LEN]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// Decodes one ring-buffer record.
pub fn decode(buf: &[u8]) -> Result<Event, DecodeError> {
    if buf.len() < 4 {
        return Err(DecodeError::Short {
            need: 4,
            got: buf.len(),
        });
    }
    let ty = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
    match ty {
        REC_CALL => decode_call(&read_pod::<RawCall>(buf)?).map(Event::Call),
        REC_WAIT => decode_wait(&read_pod::<RawWait>(buf)?).map(Event::Wait),
        REC_PROC => decode_proc(&read_pod::<RawProc>(buf)?).map(Event::Proc),
        REC_BLOCK => decode_block(&read_pod::<RawBlock>(buf)?).map(Event::Block),
        REC_NCCL => decode_nccl(&read_pod::<RawNccl>(buf)?).map(Event::Nccl),
        // Stacks are resolved against the live process before they become
        // data: callers take them with `decode_stack` first.
        other => Err(DecodeError::UnknownType(other)),
    }
}

/// The record's type (its first u32), if it has one.
pub fn record_type(buf: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(buf.get(..4)?.try_into().ok()?))
}

/// Decodes a stack record (`REC_STACK`).
pub fn decode_stack(buf: &[u8]) -> Result<RawStack, DecodeError> {
    let s = read_pod::<RawStack>(buf)?;
    if s.r#type != REC_STACK {
        return Err(DecodeError::UnknownType(s.r#type));
    }
    if s.n_native as usize > NATIVE_DEPTH || s.n_py as usize > PY_DEPTH {
        return Err(DecodeError::BadValue("stack frame count over the cap"));
    }
    Ok(s)
}

/// The op a timed record names, once the record is known to end no earlier
/// than it starts (`backwards` says which record did not).
fn timed_op(
    op: u32,
    start_ns: u64,
    end_ns: u64,
    backwards: &'static str,
) -> Result<&'static crate::ops::OpInfo, DecodeError> {
    let info = u16::try_from(op)
        .ok()
        .and_then(op_by_id)
        .ok_or(DecodeError::UnknownOp(op))?;
    if end_ns < start_ns {
        return Err(DecodeError::BadValue(backwards));
    }
    Ok(info)
}

/// Turns a raw call into an event, decoding the arguments the op table names.
pub fn decode_call(r: &RawCall) -> Result<CallEvent, DecodeError> {
    let info = timed_op(r.op, r.start_ns, r.end_ns, "call ends before it starts")?;
    let arg = |i: Option<u8>| i.map(|i| r.args[i as usize]);
    let out_valid = r.flags & CALL_OUT_VALID != 0;
    let ptr = if info.out_arg > 0 {
        // Produced pointer: only meaningful when read and the call succeeded.
        (out_valid && r.ret == 0).then_some(r.out)
    } else {
        arg(info.ptr_arg)
    };
    let kind = arg(info.kind_arg);
    Ok(CallEvent {
        host_ptr: crate::ops::host_ptr_arg(info, kind).map(|i| r.args[i as usize]),
        ts_ns: r.start_ns,
        dur_ns: r.end_ns - r.start_ns,
        pid: r.pid,
        tid: r.tid,
        op: info.id,
        // cudaError_t and CUresult are 32-bit enums; a function that returns
        // no status leaves garbage in the register, stored as 0.
        ret: if info.returns_status {
            r.ret as i32 as i64
        } else {
            0
        },
        size: arg(info.size_arg),
        ptr,
        stream: arg(info.stream_arg),
        kind,
        nested: r.flags & CALL_NESTED != 0,
        runnable_ns: r.runnable_ns,
        blocked_ns: r.blocked_ns,
        cpu: r.cpu,
        stack_id: (r.stack_id != 0).then_some(r.stack_id),
    })
}

/// `ncclInProgress`: a non-blocking communicator call still running.
const NCCL_IN_PROGRESS: i32 = 7;

/// Turns a raw NCCL record into an event (a call plus its decoded arguments).
pub fn decode_nccl(r: &RawNccl) -> Result<crate::nccl::NcclEvent, DecodeError> {
    let info = timed_op(
        r.op,
        r.start_ns,
        r.end_ns,
        "NCCL call ends before it starts",
    )?;
    let call = CallEvent {
        ts_ns: r.start_ns,
        dur_ns: r.end_ns - r.start_ns,
        pid: r.pid,
        tid: r.tid,
        op: info.id,
        ret: r.ret as i32 as i64, // ncclResult_t is a 32-bit enum
        nested: r.flags & CALL_NESTED != 0,
        runnable_ns: r.runnable_ns,
        blocked_ns: r.blocked_ns,
        cpu: r.cpu,
        ..Default::default()
    };
    // The created communicator: only meaningful when read and the call
    // succeeded, or (non-blocking communicators) returned ncclInProgress (7):
    // the handle is then valid and completes in the background.
    let created = matches!(r.ret as i32, 0 | NCCL_IN_PROGRESS);
    let out = (info.out_arg > 0 && r.flags & CALL_OUT_VALID != 0 && created).then_some(r.out);
    Ok(crate::nccl::decode(call, &r.args, &r.stack, out))
}

pub fn decode_wait(r: &RawWait) -> Result<WaitEvent, DecodeError> {
    let kind = match r.kind {
        wait_kind::PREEMPTED => WaitKind::Preempted,
        wait_kind::BLOCKED => WaitKind::Blocked,
        _ => return Err(DecodeError::BadValue("wait kind")),
    };
    if !(r.off_ns <= r.wake_ns && r.wake_ns <= r.on_ns) {
        return Err(DecodeError::BadValue("wait interval out of order"));
    }
    let n = (r.n_culprits as usize).min(MAX_CULPRITS);
    let culprits = r.culprits[..n]
        .iter()
        .map(|c| Culprit {
            pid: c.pid,
            tid: c.tid,
            comm: comm_to_string(&c.comm),
            ns: c.ns,
        })
        .collect();
    Ok(WaitEvent {
        pid: r.pid,
        tid: r.tid,
        kind,
        off_ns: r.off_ns,
        wake_ns: r.wake_ns,
        on_ns: r.on_ns,
        prev_state: r.prev_state,
        cpu: r.cpu,
        culprits,
        waker: (r.waker_flags & WAKER_KNOWN != 0).then(|| Waker {
            pid: r.waker_pid,
            tid: r.waker_tid,
            comm: comm_to_string(&r.waker_comm),
            irq: r.waker_flags & WAKER_IRQ != 0,
        }),
    })
}

pub fn decode_block(r: &RawBlock) -> Result<BlockEvent, DecodeError> {
    let info = timed_op(
        r.op,
        r.start_ns,
        r.end_ns,
        "allocator call ends before it starts",
    )?;
    Ok(BlockEvent {
        op: info.id,
        pid: r.pid,
        tid: r.tid,
        start_ns: r.start_ns,
        end_ns: r.end_ns,
        requested: (info.class == crate::ops::OpClass::BlockAlloc).then_some(r.requested),
        block: r.block,
        words: r.words,
        stack_id: (r.stack_id != 0).then_some(r.stack_id),
    })
}

pub fn decode_proc(r: &RawProc) -> Result<ProcEvent, DecodeError> {
    let kind = match r.event {
        proc_kind::FORK => ProcKind::Fork,
        proc_kind::EXEC => ProcKind::Exec,
        proc_kind::EXIT => ProcKind::Exit,
        proc_kind::OOM_VICTIM => ProcKind::OomVictim,
        _ => return Err(DecodeError::BadValue("process event kind")),
    };
    Ok(ProcEvent {
        kind,
        ts_ns: r.ts_ns,
        pid: r.pid,
        tid: r.tid,
        ppid: r.ppid,
        exit_code: r.exit_code,
        comm: comm_to_string(&r.comm),
    })
}

/// A `#[repr(C)]` record struct with no padding bytes: every byte of a value
/// is initialised, so it may be viewed as bytes.
///
/// # Safety
/// The implementor's size must equal the sum of its fields' sizes (the
/// layout tests pin both), and every bit pattern must be valid.
#[cfg(test)]
unsafe trait PaddingFree: Copy {}
// SAFETY (all impls): `layouts_match_the_c_header` and `no_padding` below pin
// each struct's size to the sum of its fields; all fields are integers or
// arrays of integers.
#[cfg(test)]
unsafe impl PaddingFree for RawCall {}
#[cfg(test)]
unsafe impl PaddingFree for RawWait {}
#[cfg(test)]
unsafe impl PaddingFree for RawProc {}
#[cfg(test)]
unsafe impl PaddingFree for RawBlock {}
#[cfg(test)]
unsafe impl PaddingFree for RawNccl {}
#[cfg(test)]
unsafe impl PaddingFree for RawStack {}

/// A record as the kernel would write it (tests only).
#[cfg(test)]
fn as_bytes<T: PaddingFree>(v: &T) -> Vec<u8> {
    let n = std::mem::size_of::<T>();
    let mut out = vec![0u8; n];
    // SAFETY: T has no padding (PaddingFree), so all size_of::<T>() bytes of
    // the valid reference are initialised; the buffer holds exactly n bytes.
    unsafe { std::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), out.as_mut_ptr(), n) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    // These mirror bpf/gpusleuth.h; the C compiler lays the structs out the same way.
    #[test]
    fn layouts_match_the_c_header() {
        assert_eq!(size_of::<RawCall>(), 128);
        assert_eq!(offset_of!(RawCall, stack_id), 120);
        assert_eq!(size_of::<RawNccl>(), 152);
        assert_eq!(offset_of!(RawNccl, args), 32);
        assert_eq!(offset_of!(RawNccl, stack), 80);
        assert_eq!(offset_of!(RawNccl, out), 112);
        assert_eq!(offset_of!(RawNccl, ret), 120);
        assert_eq!(offset_of!(RawNccl, flags), 144);
        assert_eq!(offset_of!(RawCall, start_ns), 16);
        assert_eq!(offset_of!(RawCall, args), 32);
        assert_eq!(offset_of!(RawCall, out), 80);
        assert_eq!(offset_of!(RawCall, ret), 88);
        assert_eq!(offset_of!(RawCall, runnable_ns), 96);
        assert_eq!(offset_of!(RawCall, blocked_ns), 104);
        assert_eq!(offset_of!(RawCall, flags), 112);
        assert_eq!(offset_of!(RawCall, cpu), 116);
        assert_eq!(size_of::<RawCulprit>(), 32);
        assert_eq!(size_of::<RawWait>(), 216);
        assert_eq!(offset_of!(RawWait, culprits), 56);
        assert_eq!(offset_of!(RawWait, waker_pid), 184);
        assert_eq!(offset_of!(RawWait, waker_comm), 192);
        assert_eq!(offset_of!(RawWait, waker_flags), 208);
        assert_eq!(size_of::<RawProc>(), 48);
        assert_eq!(offset_of!(RawProc, comm), 32);
        assert_eq!(size_of::<RawBlock>(), 184);
        assert_eq!(offset_of!(RawBlock, words), 48);
        assert_eq!(offset_of!(RawBlock, stack_id), 176);
        assert_eq!(size_of::<RawPyFrame>(), 16);
        assert_eq!(size_of::<RawStack>(), 1312);
        assert_eq!(offset_of!(RawStack, native), 32);
        assert_eq!(offset_of!(RawStack, py), 288);
        assert_eq!(size_of::<RawPyLayout>(), 56);
        assert_eq!(offset_of!(RawPyLayout, kind), 8);
        assert_eq!(offset_of!(RawPyLayout, instr_size), 52);
        assert_eq!(size_of::<CountKey>(), 8);
        assert_eq!(offset_of!(CountKey, op), 4);
        assert_eq!(size_of::<ThreadState>(), 80);
        assert_eq!(offset_of!(ThreadState, state), 32);
        assert_eq!(offset_of!(ThreadState, waker_tid), 52);
        assert_eq!(offset_of!(ThreadState, waker_comm), 56);
        assert_eq!(offset_of!(ThreadState, ran_at_off), 72);
        assert_eq!(size_of::<InflightCall>(), 80);
        assert_eq!(offset_of!(InflightCall, runnable_snap), 56);
        assert_eq!(offset_of!(InflightCall, flags), 72);
    }

    /// `as_bytes` may only view padding-free structs: each one's size is the
    /// sum of its fields' sizes.
    #[test]
    fn no_padding() {
        let sum = |fields: &[usize]| fields.iter().sum::<usize>();
        assert_eq!(
            size_of::<RawCall>(),
            sum(&[4 * 4, 8 * 2, 8 * NARGS, 8 * 4, 4 * 2, 8])
        );
        assert_eq!(size_of::<RawCulprit>(), sum(&[4 * 2, 8, COMM_LEN]));
        assert_eq!(
            size_of::<RawWait>(),
            sum(&[
                4 * 4,
                8 * 3,
                4 * 4,
                32 * MAX_CULPRITS,
                4 * 2,
                COMM_LEN,
                4 * 2
            ])
        );
        assert_eq!(size_of::<RawProc>(), sum(&[4 * 6, 8, COMM_LEN]));
        assert_eq!(
            size_of::<RawBlock>(),
            sum(&[4 * 4, 8 * 4, 8 * BLOCK_WORDS, 8])
        );
        assert_eq!(
            size_of::<RawNccl>(),
            sum(&[4 * 4, 8 * 2, 8 * NARGS, 8 * NCCL_STACK_WORDS, 8 * 4, 4 * 2])
        );
        assert_eq!(
            size_of::<RawStack>(),
            sum(&[4 * 2, 8, 4 * 4, 8 * NATIVE_DEPTH, 16 * PY_DEPTH])
        );
    }

    fn comm(s: &str) -> [u8; COMM_LEN] {
        let mut c = [0u8; COMM_LEN];
        c[..s.len()].copy_from_slice(s.as_bytes());
        c
    }

    #[test]
    fn decodes_an_allocation_with_its_returned_pointer() {
        let raw = RawCall {
            r#type: REC_CALL,
            op: 1,
            pid: 10,
            tid: 11,
            start_ns: 1000,
            end_ns: 1500,
            args: [0x7ffd_0000, 4096, 0, 0, 0, 0],
            out: 0x7f00_0000_1000,
            ret: 0,
            runnable_ns: 100,
            blocked_ns: 50,
            flags: CALL_OUT_VALID,
            cpu: 1,
            stack_id: 0,
        };
        let Event::Call(c) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(c.op_name(), "cudaMalloc");
        assert_eq!(c.size, Some(4096));
        assert_eq!(c.ptr, Some(0x7f00_0000_1000));
        assert_eq!(c.dur_ns, 500);
        assert_eq!(c.on_cpu_ns(), 350);
        assert_eq!(c.on_cpu_ns() + c.runnable_ns + c.blocked_ns, c.dur_ns);
    }

    #[test]
    fn failed_allocation_has_no_pointer_and_keeps_its_error() {
        let raw = RawCall {
            r#type: REC_CALL,
            op: 1,
            start_ns: 5,
            end_ns: 9,
            ret: 2,
            out: 0xdead,
            flags: CALL_OUT_VALID,
            args: [1, 1 << 40, 0, 0, 0, 0],
            ..Default::default()
        };
        let Event::Call(c) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(c.ret, 2);
        assert!(c.failed());
        assert_eq!(c.ptr, None);
        assert_eq!(c.size, Some(1 << 40));
    }

    #[test]
    fn free_takes_pointer_from_argument() {
        let raw = RawCall {
            r#type: REC_CALL,
            op: 2,
            start_ns: 5,
            end_ns: 9,
            args: [0xabc, 0, 0, 0, 0, 0],
            ..Default::default()
        };
        let Event::Call(c) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(c.ptr, Some(0xabc));
        assert_eq!(c.size, None);
    }

    #[test]
    fn decodes_wait_with_culprits() {
        let mut raw = RawWait {
            r#type: REC_WAIT,
            kind: wait_kind::PREEMPTED,
            pid: 3,
            tid: 4,
            off_ns: 10,
            wake_ns: 10,
            on_ns: 40,
            n_culprits: 1,
            ..Default::default()
        };
        raw.culprits[0] = RawCulprit {
            pid: 77,
            tid: 78,
            ns: 30,
            comm: comm("hog"),
        };
        let Event::Wait(w) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(w.kind, WaitKind::Preempted);
        assert_eq!(w.runnable_ns(), 30);
        assert_eq!(w.blocked_ns(), 0);
        assert_eq!(
            w.culprits,
            vec![Culprit {
                pid: 77,
                tid: 78,
                comm: "hog".into(),
                ns: 30
            }]
        );
        assert_eq!(w.waker, None, "no waker flag, no waker");
    }

    #[test]
    fn decodes_the_waker_of_a_blocked_wait() {
        let mut raw = RawWait {
            r#type: REC_WAIT,
            kind: wait_kind::BLOCKED,
            pid: 3,
            tid: 4,
            off_ns: 10,
            wake_ns: 30,
            on_ns: 40,
            waker_pid: 90,
            waker_tid: 91,
            waker_comm: comm("pt_data_worker"),
            waker_flags: WAKER_KNOWN,
            ..Default::default()
        };
        let Event::Wait(w) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        let k = w.waker.clone().unwrap();
        assert_eq!(
            (k.pid, k.tid, k.comm.as_str(), k.irq),
            (90, 91, "pt_data_worker", false)
        );
        assert!(k.is_task());
        raw.waker_flags = WAKER_KNOWN | WAKER_IRQ;
        let Event::Wait(w) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        assert!(w.waker.unwrap().irq);
    }

    #[test]
    fn decodes_proc_exit() {
        let raw = RawProc {
            r#type: REC_PROC,
            event: proc_kind::EXIT,
            pid: 9,
            tid: 9,
            exit_code: 3 << 8,
            ts_ns: 77,
            comm: comm("python3"),
            ..Default::default()
        };
        let Event::Proc(p) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(p.kind, ProcKind::Exit);
        assert_eq!(p.exit_code >> 8, 3);
        assert_eq!(p.comm, "python3");
    }

    #[test]
    fn decodes_an_allocator_block() {
        let mut raw = RawBlock {
            r#type: REC_BLOCK,
            op: 64,
            pid: 5,
            tid: 6,
            start_ns: 10,
            end_ns: 20,
            requested: 1000,
            block: 0xb10c,
            ..Default::default()
        };
        raw.words[7] = 1024;
        let Event::Block(b) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(b.requested, Some(1000));
        assert_eq!(b.block, 0xb10c);
        assert_eq!(b.words[7], 1024);
        let raw = RawBlock {
            r#type: REC_BLOCK,
            op: 65,
            requested: 0x5555,
            ..Default::default()
        };
        let Event::Block(b) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(b.requested, None, "free has no requested size");
    }

    #[test]
    fn decodes_an_nccl_init_with_its_communicator() {
        let mut raw = RawNccl {
            r#type: REC_NCCL,
            op: 80, // ncclCommInitRank
            pid: 7,
            tid: 7,
            start_ns: 100,
            end_ns: 500,
            out: 0xc0111,
            flags: CALL_OUT_VALID,
            ..Default::default()
        };
        raw.args[1] = 2; // nranks
        raw.args[2] = 1; // rank
        raw.stack[0] = 0xff;
        let Event::Nccl(n) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(n.call.dur_ns, 400);
        assert_eq!(
            (n.rank, n.nranks, n.new_comm),
            (Some(1), Some(2), Some(0xc0111))
        );
        assert_eq!(
            n.unique_id.as_deref(),
            Some("ff000000000000000000000000000000")
        );
        raw.ret = 7; // ncclInProgress: a non-blocking init, the handle is valid
        let Event::Nccl(n) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(n.new_comm, Some(0xc0111));
        raw.ret = 3; // ncclInternalError: no communicator was created
        let Event::Nccl(n) = decode(&as_bytes(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(n.new_comm, None);
        assert_eq!(n.call.ret, 3);
    }

    #[test]
    fn decodes_a_stack_and_calls_name_it() {
        let mut raw = RawStack {
            pid: 7,
            id: 0xfeed,
            n_native: 2,
            n_py: 1,
            flags: stack_flag::PY,
            ..Default::default()
        };
        raw.native[0] = 0x401000;
        raw.native[1] = 0x402000;
        raw.py[0] = RawPyFrame {
            code: 0x7f00,
            instr: 0x7f10,
        };
        let bytes = as_bytes(&raw);
        assert_eq!(record_type(&bytes), Some(REC_STACK));
        let s = decode_stack(&bytes).unwrap();
        assert_eq!(s.native_frames(), &[0x401000, 0x402000]);
        assert_eq!(s.py_frames().len(), 1);
        assert!(decode(&bytes).is_err(), "stacks are not plain events");
        raw.n_py = PY_DEPTH as u32 + 1;
        assert!(decode_stack(&as_bytes(&raw)).is_err());
        let call = RawCall {
            r#type: REC_CALL,
            op: 1,
            stack_id: 0xfeed,
            ..Default::default()
        };
        let Event::Call(c) = decode(&as_bytes(&call)).unwrap() else {
            panic!()
        };
        assert_eq!(c.stack_id, Some(0xfeed));
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(decode(&[1, 0]), Err(DecodeError::Short { .. })));
        assert!(matches!(
            decode(&[9, 0, 0, 0]),
            Err(DecodeError::UnknownType(9))
        ));
        let raw = RawCall {
            r#type: REC_CALL,
            op: 999,
            ..Default::default()
        };
        assert!(matches!(
            decode(&as_bytes(&raw)),
            Err(DecodeError::UnknownOp(999))
        ));
        let raw = RawCall {
            r#type: REC_CALL,
            op: 1,
            start_ns: 10,
            end_ns: 5,
            ..Default::default()
        };
        assert!(decode(&as_bytes(&raw)).is_err());
        let short = &as_bytes(&RawCall {
            r#type: REC_CALL,
            op: 1,
            ..Default::default()
        })[..64];
        assert!(matches!(decode(short), Err(DecodeError::Short { .. })));
    }
}
