//! Test fixtures, not part of the API: what the unit tests of several
//! modules share, and (through the `testing` feature, which only
//! dev-dependencies turn on) what other crates' tests build their traces
//! from, so one hand-built event means the same thing everywhere.
//!
//! Helpers panic on an unknown op name: a typo in a test must fail it.

use crate::data::{ProcessInfo, TraceData};
use crate::event::{BlockEvent, CallEvent, BLOCK_WORDS};
use crate::ops::op_by_name;
use crate::sites::{Frame, FrameKind};

/// One millisecond, in the nanoseconds every timestamp is kept in.
pub const MS: u64 = 1_000_000;
/// One microsecond, in nanoseconds.
pub const US: u64 = 1_000;

/// Successive xorshift64 values from `seed` (which must not be 0): the
/// deterministic pseudo-random sequence the property-style tests sweep with
/// (the same seed gives the same cases on every run).
pub fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// The id of the op named `op`.
fn op_id(op: &str) -> u16 {
    op_by_name(op)
        .unwrap_or_else(|| panic!("unknown op {op}"))
        .id
}

/// A call of `op` by pid/tid 100 at `ts`, lasting `dur`.
pub fn call(op: &str, ts: u64, dur: u64) -> CallEvent {
    CallEvent {
        ts_ns: ts,
        dur_ns: dur,
        pid: 100,
        tid: 100,
        op: op_id(op),
        ..Default::default()
    }
}

/// `n` calls of `ops`, one every µs, from pids 7 and 9 (`threads` threads
/// each: tids pid, pid + 1, ...), with pseudo-random durations and runnable
/// time, each with one culprit ("noisy", pids 50-52) holding that runnable
/// time; the same `seed` gives the same calls. In start order.
pub fn noisy_calls(
    seed: u64,
    n: u64,
    ops: &[&str],
    threads: u32,
) -> Vec<(CallEvent, Vec<crate::event::Culprit>)> {
    let mut next = xorshift(seed);
    (0..n)
        .map(|i| {
            let seed = next();
            let mut c = call(ops[(seed >> 8) as usize % ops.len()], i * 1000, seed % 900);
            c.pid = [7, 9][(seed % 2) as usize];
            c.tid = c.pid + (seed >> 4) as u32 % threads;
            c.runnable_ns = (seed >> 20) % 300;
            let k = crate::event::Culprit {
                pid: 50 + (seed >> 30) as u32 % 3,
                tid: 1,
                comm: "noisy".into(),
                ns: c.runnable_ns,
            };
            (c, vec![k])
        })
        .collect()
}

/// A 10 µs `cudaMalloc` of `size` bytes returning `ptr`, by pid/tid 100.
pub fn alloc(ts: u64, size: u64, ptr: u64) -> CallEvent {
    let mut c = call("cudaMalloc", ts, 10 * US);
    c.size = Some(size);
    c.ptr = Some(ptr);
    c
}

/// A 10 µs `cudaMalloc` of `size` bytes by pid/tid 100 that failed with
/// cudaErrorMemoryAllocation (2), so returned no pointer.
pub fn failed_alloc(ts: u64, size: u64) -> CallEvent {
    let mut c = alloc(ts, size, 0);
    c.ret = 2;
    c.ptr = None;
    c
}

/// A 10 µs `cudaFree` of `ptr`, by pid/tid 100.
pub fn free(ts: u64, ptr: u64) -> CallEvent {
    let mut c = call("cudaFree", ts, 10 * US);
    c.ptr = Some(ptr);
    c
}

/// Fails, showing every line, unless one of `lines` (notes, inconsistencies)
/// passes `check`.
pub fn assert_some_line(lines: &[String], check: impl Fn(&str) -> bool) {
    assert!(lines.iter().any(|l| check(l)), "{lines:?}");
}

/// The one-process trace the findings tests build on: pid 100 named
/// "train", with host context, spanning 0 to the end of its last call.
pub fn trace(calls: Vec<CallEvent>) -> TraceData {
    let end = calls.iter().map(|c| c.end_ns()).max().unwrap_or(0);
    TraceData {
        calls,
        processes: vec![ProcessInfo {
            pid: 100,
            comm: "train".into(),
            ..Default::default()
        }],
        start_ns: Some(0),
        end_ns: Some(end),
        has_host_context: true,
        ..Default::default()
    }
}

/// A Python frame: `func` at `file`:`line`.
pub fn py_frame(file: &str, line: u32, func: &str) -> Frame {
    Frame {
        kind: Some(FrameKind::Python),
        function: Some(func.into()),
        file: Some(file.into()),
        line: Some(line),
        ..Default::default()
    }
}

/// A PyTorch caching-allocator record (`op` is one of the
/// `DeviceCachingAllocator::*` ops) of pid/tid `pid`, 5 ns long, ending at
/// `ts`, for the block at address `block` whose first words are `words`.
pub fn block_event(
    pid: u32,
    ts: u64,
    op: &str,
    block: u64,
    requested: Option<u64>,
    words: [u64; BLOCK_WORDS],
) -> BlockEvent {
    BlockEvent {
        op: op_id(op),
        pid,
        tid: pid,
        start_ns: ts - 5,
        end_ns: ts,
        requested,
        block,
        words,
        stack_id: None,
    }
}

/// [`block_event`] for a block that covers `size` bytes at `ptr`, its words
/// in the layout the calibration recognises (size at word 6, requested size
/// at 7, pointer at 9) and a value unique to `ts` elsewhere.
pub fn torch_block(
    pid: u32,
    ts: u64,
    op: &str,
    block: u64,
    ptr: u64,
    size: u64,
    requested: Option<u64>,
) -> BlockEvent {
    let mut words = [0x5555_0000_0000u64 + ts; BLOCK_WORDS];
    words[6] = size;
    words[7] = requested.unwrap_or(size - 100);
    words[9] = ptr;
    block_event(pid, ts, op, block, requested, words)
}

/// The allocator's life the memory tests replay in a segment at `base`: a
/// 4 MiB block (4 MiB - 100 asked for) and a 512 B block (300 asked for)
/// carved from it, then the first freed, at `ts[0]`, `ts[1]`, `ts[2]`.
pub fn torch_blocks(pid: u32, base: u64, ts: [u64; 3]) -> [BlockEvent; 3] {
    let malloc = "DeviceCachingAllocator::malloc";
    [
        torch_block(
            pid,
            ts[0],
            malloc,
            0xa,
            base,
            4 << 20,
            Some((4 << 20) - 100),
        ),
        torch_block(pid, ts[1], malloc, 0xb, base + (4 << 20), 512, Some(300)),
        torch_block(
            pid,
            ts[2],
            "DeviceCachingAllocator::free",
            0xa,
            base,
            4 << 20,
            None,
        ),
    ]
}

/// A run's files as a reader's replay reads them (`sleuth_store`'s
/// `run_steps`): each file's steps in replay order, every step of a file
/// before every step of the next.
pub struct FilesInOrder<'a>(pub &'a [TraceData]);

impl crate::allocator::StepSource for FilesInOrder<'_> {
    fn for_each_step(
        &self,
        pid: u32,
        until: Option<u64>,
        visit: &mut dyn FnMut(crate::allocator::Step<'_>) -> bool,
    ) {
        for d in self.0 {
            let mut more = true;
            d.for_each_step(pid, until, &mut |s| {
                more = visit(s);
                more
            });
            if !more {
                return;
            }
        }
    }
}
