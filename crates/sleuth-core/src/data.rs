//! A whole trace in memory, as the analyses consume it. The store loads it;
//! tests build it by hand.

use crate::event::{BlockEvent, CallEvent, OpCount, ProcEvent, WaitEvent};
use serde::Serialize;
use std::collections::BTreeMap;

/// What is known about one traced process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub cmdline: String,
    /// First time the process was seen (monotonic ns).
    pub start_ns: Option<u64>,
    pub exit_ns: Option<u64>,
    /// Wait status at exit: `(code << 8) | signal`.
    pub exit_code: Option<i32>,
    pub oom_victim: bool,
}

/// A trace: calls sorted by start time, waits sorted by `on_ns`, lifecycle
/// events sorted by time, kernel-counted hot paths, and loss counters.
#[derive(Debug, Clone, Default)]
pub struct TraceData {
    pub calls: Vec<CallEvent>,
    pub waits: Vec<WaitEvent>,
    pub procs: Vec<ProcEvent>,
    pub counts: Vec<OpCount>,
    /// PyTorch caching-allocator events (`trace --torch-allocator`), by `end_ns`.
    pub blocks: Vec<BlockEvent>,
    pub processes: Vec<ProcessInfo>,
    /// Named counters: events per kind, drops per cause (see `record::stat::NAMES`).
    pub stats: BTreeMap<String, u64>,
    /// Trace start and end (monotonic ns), when known.
    pub start_ns: Option<u64>,
    pub end_ns: Option<u64>,
    /// Wall-clock ns = monotonic ns + this offset.
    pub realtime_offset_ns: i64,
    /// Whether per-call host context (runnable/blocked split) was captured.
    /// False for imported traces that lack it.
    pub has_host_context: bool,
}

impl TraceData {
    pub fn process(&self, pid: u32) -> Option<&ProcessInfo> {
        self.processes.iter().find(|p| p.pid == pid)
    }
    pub fn comm_of(&self, pid: u32) -> &str {
        self.process(pid).map(|p| p.comm.as_str()).unwrap_or("?")
    }
}
