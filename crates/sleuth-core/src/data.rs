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

/// One NVML device-utilization sample: the share of `period_ns` (ending at
/// `ts_ns`) during which some kernel ran on GPU `gpu`. NVML's figure is "a
/// kernel was running", not SM occupancy: gpusleuth calls it GPU busy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuSample {
    /// End of the sample period, on the trace's monotonic clock (like `CallEvent::ts_ns`).
    pub ts_ns: u64,
    /// NVML device index.
    pub gpu: u32,
    /// 0..=100.
    pub busy_pct: f64,
    pub period_ns: u64,
}

/// What the driver says one process holds or uses on one GPU at one moment
/// (NVML per-process memory and, where the driver gives it, SM utilization).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ProcessGpuSample {
    pub ts_ns: u64,
    pub gpu: u32,
    pub pid: u32,
    /// Device memory NVML attributes to the process; None when not reported.
    pub used_bytes: Option<u64>,
    /// Per-process SM utilization (0..=100) over the last sample period; None when not reported.
    pub sm_pct: Option<f64>,
    pub phase: SamplePhase,
}

/// When a per-process sample was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplePhase {
    /// When tracing of the process began (the attach baseline).
    Start,
    /// Periodic, during the trace.
    Sample,
    /// When the trace ended (or the process exited).
    End,
}

impl SamplePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            SamplePhase::Start => "start",
            SamplePhase::Sample => "sample",
            SamplePhase::End => "end",
        }
    }
    pub fn parse(s: &str) -> Option<SamplePhase> {
        match s {
            "start" => Some(SamplePhase::Start),
            "sample" => Some(SamplePhase::Sample),
            "end" => Some(SamplePhase::End),
            _ => None,
        }
    }
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
    /// The window a reader scoped this data to (`--from/--to`, `--last`,
    /// MCP `since_ns`/`until_ns`), when it did: the findings' shares of
    /// "the trace" are of the trace's span clipped to it (round 51), while
    /// the examples' offsets still count from the trace's start.
    pub window_ns: (Option<u64>, Option<u64>),
    /// Wall-clock ns = monotonic ns + this offset.
    pub realtime_offset_ns: i64,
    /// Whether per-call host context (runnable/blocked split) was captured.
    /// False for imported traces that lack it.
    pub has_host_context: bool,
    /// The file records no host pointer for copies (written before
    /// `call_host_ptrs`, schema version 1): whether a copy's host memory
    /// was pinned, so `pageable_copy`, cannot be told. False where they
    /// are recorded (every trace since 2026-12-01) or not applicable.
    pub copy_host_ptrs_unknown: bool,
    /// Call sites by stack id (calls and blocks name them by `stack_id`).
    pub stacks: BTreeMap<u64, crate::sites::Stack>,
    /// GPU busy samples by time; `None` when GPU activity was not captured
    /// (no NVML, an imported trace, a trace older than the table).
    pub gpu_samples: Option<Vec<GpuSample>>,
    /// The running counts of kernel-counted calls the tracer sampled, by
    /// time (`op_count_samples`); `None` where not read (a run's files, a
    /// trace older than the table): counted launches then cannot be placed
    /// in time (`findings::bottleneck::LaunchPlaces`).
    pub count_samples: Option<Vec<crate::counted::CountSample>>,
    /// Where a read file's running counts ended: each kernel-counted op's
    /// total of the file (on a run's counts, as its samples), at its
    /// process's exit in the file or the file's end; none for a file still
    /// being written. They close the last sample period of each file, so
    /// the launches counted after a file's last sample are placed in a
    /// window too (`findings::bottleneck::LaunchPlaces`; round 59's tester:
    /// a window over a run's files left a file's last 3,800 launches and a
    /// short last file's 3,200 out, and read host-bound).
    pub count_ends: Vec<crate::counted::CountSample>,
    /// Per-process driver view (memory held, SM use) by time; empty when not captured.
    pub process_gpu: Vec<ProcessGpuSample>,
    /// The readings taken when tracing began are not in `process_gpu`: a
    /// run of `trace --rotate` whose first file `--keep` deleted. What each
    /// process held before the trace is then unknown, not 0.
    pub process_gpu_start_lost: bool,
    /// NCCL calls with their arguments, by start time (also in `calls`); empty when none.
    pub nccl: Vec<crate::nccl::NcclEvent>,
    /// Host of each process, and its pid there (a merged trace may renumber
    /// colliding pids). Processes absent here ran on `hostname`.
    pub hosts: BTreeMap<u32, NodeProcess>,
    /// Host of the trace session (of the first node, for a merged trace).
    pub hostname: String,
}

/// Where a process of a merged trace ran.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeProcess {
    pub host: String,
    /// The process's pid on that host.
    pub pid: u32,
}

impl TraceData {
    pub fn process(&self, pid: u32) -> Option<&ProcessInfo> {
        self.processes.iter().find(|p| p.pid == pid)
    }
    pub fn comm_of(&self, pid: u32) -> &str {
        self.process(pid).map(|p| p.comm.as_str()).unwrap_or("?")
    }
    /// Host a process ran on, and its pid there.
    pub fn node_of(&self, pid: u32) -> NodeProcess {
        self.hosts
            .get(&pid)
            .cloned()
            .unwrap_or_else(|| NodeProcess {
                host: self.hostname.clone(),
                pid,
            })
    }
}
