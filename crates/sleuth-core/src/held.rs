//! What each traced process held on the GPU before the trace began, as the
//! driver says, beside what the trace itself saw.
//!
//! The ledger counts only allocations made while tracing. A process attached
//! with `trace --pid` (or picked up in the all-processes mode) usually already
//! holds memory: NVML's per-process used memory, read when tracing of the
//! process began (phase `start`), during the trace and when it ended (phase
//! `end`), is the baseline. Allocations made before the trace are not
//! itemized (the trace never saw them); frees of them are counted (the
//! ledger's unmatched frees) but their sizes are not seen at CUDA level.
//! What NVML's change over the trace leaves unexplained by the ledger's
//! allocations and frees is reported as such: frees of pre-trace memory, and
//! memory the driver charges to the process outside the CUDA allocation
//! calls (context, module and library workspaces).

use crate::data::{SamplePhase, TraceData};
use crate::ledger::ProcessLedger;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// `stats` counter written by `trace`: polls in which NVML per-process memory
/// was read. Present and non-zero = the baseline was measured; a traced
/// process NVML did not list then held no device memory (no context).
pub const PROCESS_POLLS_STAT: &str = "nvml_process_polls";

/// One GPU's figures for one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuHeld {
    pub gpu: u32,
    /// NVML used memory when tracing of the process began (None: not listed then).
    pub at_start_bytes: Option<u64>,
    /// At the last reading (the `end` phase when taken).
    pub last_bytes: Option<u64>,
    pub max_bytes: Option<u64>,
}

/// The driver's view of one process beside the ledger's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldMemory {
    pub pid: u32,
    /// NVML per-process memory was read during this trace.
    pub measured: bool,
    /// Device memory the process held when its tracing began, per NVML (Σ over
    /// GPUs). 0 when measured and NVML did not list the process then; None
    /// when not measured, or NVML listed it without a figure.
    pub before_trace_bytes: Option<u64>,
    /// NVML's figure at the end of the trace (or the last reading before the
    /// process exited; 0 once it is gone).
    pub at_end_bytes: Option<u64>,
    /// Highest NVML figure seen during the trace.
    pub max_bytes: Option<u64>,
    pub gpus: Vec<GpuHeld>,
    /// Ledger: device bytes allocated during the trace (+X).
    pub allocated_during_bytes: u64,
    /// Ledger: device bytes of those freed during the trace (−Y).
    pub freed_during_bytes: u64,
    /// Frees of memory the trace never saw allocated (allocated before it).
    pub pre_trace_frees: u64,
    /// NVML's change over the trace minus the ledger's (`allocated − freed`):
    /// negative when pre-trace memory was freed, positive when the driver
    /// charged memory outside the traced allocation calls. None unless both
    /// ends were measured, and None for a process that exited during the
    /// trace: the driver released all its memory then (NVML's 0 at the end),
    /// which the ledger's live bytes at exit do not count as freed.
    pub unexplained_change_bytes: Option<i64>,
    /// The process exited during the trace: `at_end_bytes` is NVML's figure
    /// after its exit (0: the driver released its memory).
    pub exited: bool,
    /// NVML's readings when tracing began were in a run's first file, which
    /// `--keep` deleted: `before_trace_bytes` is unknown (None).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub start_lost: bool,
}

impl HeldMemory {
    /// The baseline in one line, for `memory`, `explain` and the report.
    pub fn line(&self, fmt_bytes: impl Fn(u64) -> String) -> String {
        if !self.measured {
            return "held before tracing: not measured (no NVML per-process memory in this trace); \
                    allocations made before the trace are not itemized"
                .into();
        }
        let before = match self.before_trace_bytes {
            Some(b) => format!("{} (NVML)", fmt_bytes(b)),
            None if self.start_lost => {
                "unknown (NVML's readings when tracing began were in the run's first file, deleted by --keep)"
                    .into()
            }
            None => "unknown (NVML listed the process without a figure)".into(),
        };
        let mut s = format!(
            "held before tracing: {before}; allocations made before the trace are not itemized; \
             during the trace: +{} / -{}",
            fmt_bytes(self.allocated_during_bytes),
            fmt_bytes(self.freed_during_bytes)
        );
        if self.pre_trace_frees > 0 {
            s.push_str(&format!(
                "; {} free(s) of memory allocated before the trace (sizes not seen by the trace)",
                self.pre_trace_frees
            ));
        }
        s
    }
}

/// The driver's view of every process the trace has NVML readings or a
/// ledger for, by pid.
pub fn held(data: &TraceData, ledgers: &[ProcessLedger]) -> Vec<HeldMemory> {
    held_until(data, ledgers, None)
}

/// [`held`] as the driver saw it by `until_ns` (the whole trace when None):
/// only the readings taken by then, "at end" meaning the last of them, a
/// process exited only if it exited by then. For ledgers replayed to that
/// moment (`memory --at`): NVML's figure at the trace's end beside a
/// ledger of an earlier moment would put the difference of the two
/// moments in "unexplained" (round 55). The change is compared with the
/// ledger only where the trace's end reading is among them: a reading of
/// the 200 ms poll lags the ledger's moment.
pub fn held_until(
    data: &TraceData,
    ledgers: &[ProcessLedger],
    until_ns: Option<u64>,
) -> Vec<HeldMemory> {
    let measured = data.stats.get(PROCESS_POLLS_STAT).is_some_and(|&n| n > 0);
    let by_pid: BTreeMap<u32, &ProcessLedger> = ledgers.iter().map(|l| (l.pid, l)).collect();
    let until = until_ns.unwrap_or(u64::MAX);
    let mut pids: BTreeSet<u32> = by_pid.keys().copied().collect();
    pids.extend(
        data.process_gpu
            .iter()
            .filter(|s| s.ts_ns <= until)
            .map(|s| s.pid),
    );
    pids.into_iter()
        .map(|pid| one(data, pid, by_pid.get(&pid).copied(), measured, until))
        .collect()
}

/// Each process of `helds` the ledgers do not list gets an empty ledger
/// (its name and exit from `data`), so that a process NVML says holds
/// memory is shown, never as holding nothing; the ledgers end by pid.
pub fn list_held_only(ledgers: &mut Vec<ProcessLedger>, helds: &[HeldMemory], data: &TraceData) {
    for h in helds {
        if !ledgers.iter().any(|l| l.pid == h.pid) {
            let info = data.process(h.pid);
            ledgers.push(crate::ledger::empty_ledger(
                h.pid,
                info.map(|p| p.comm.clone()).unwrap_or_else(|| "?".into()),
                info.and_then(|p| p.exit_ns),
            ));
        }
    }
    ledgers.sort_by_key(|l| l.pid);
}

fn one(
    data: &TraceData,
    pid: u32,
    l: Option<&ProcessLedger>,
    measured: bool,
    until: u64,
) -> HeldMemory {
    let mut gpus: BTreeMap<u32, GpuHeld> = BTreeMap::new();
    let mut ended = false;
    let by_then = |s: &&crate::data::ProcessGpuSample| s.pid == pid && s.ts_ns <= until;
    // Samples are stored by time; within one process and GPU the last reading wins.
    for s in data.process_gpu.iter().filter(by_then) {
        let g = gpus.entry(s.gpu).or_insert(GpuHeld {
            gpu: s.gpu,
            at_start_bytes: None,
            last_bytes: None,
            max_bytes: None,
        });
        if s.phase == SamplePhase::Start {
            g.at_start_bytes = s.used_bytes;
        }
        if let Some(b) = s.used_bytes {
            g.last_bytes = Some(b);
            g.max_bytes = Some(g.max_bytes.map_or(b, |m| m.max(b)));
        }
        ended |= s.phase == SamplePhase::End;
    }
    let starts: Vec<Option<u64>> = data
        .process_gpu
        .iter()
        .filter(by_then)
        .filter(|s| s.phase == SamplePhase::Start)
        .map(|s| s.used_bytes)
        .collect();
    let sum = |f: &dyn Fn(&GpuHeld) -> Option<u64>| -> Option<u64> {
        gpus.values().map(f).try_fold(0u64, |a, b| Some(a + b?))
    };
    let before_trace_bytes = if !measured || data.process_gpu_start_lost {
        None
    } else {
        // Not listed when its tracing began: no context, nothing held.
        starts.iter().try_fold(0u64, |a, b| Some(a + (*b)?))
    };
    let at_end_bytes = if !measured {
        None
    } else if gpus.is_empty() {
        Some(0)
    } else {
        sum(&|g| g.last_bytes)
    };
    let max_bytes = if measured {
        sum(&|g| g.max_bytes)
    } else {
        None
    };
    let (alloc, freed, unmatched) = l.map_or((0, 0, 0), |l| {
        (l.allocated_bytes, l.freed_bytes, l.unmatched_frees)
    });
    let exited = l.and_then(|l| l.exit_ns).is_some_and(|e| e <= until)
        || data
            .process(pid)
            .and_then(|p| p.exit_ns)
            .is_some_and(|e| e <= until);
    let unexplained = match (before_trace_bytes, at_end_bytes) {
        (Some(b), Some(e)) if ended && !exited => {
            Some(e as i64 - b as i64 - (alloc as i64 - freed as i64))
        }
        _ => None,
    };
    HeldMemory {
        pid,
        measured,
        before_trace_bytes,
        at_end_bytes,
        max_bytes,
        gpus: gpus.into_values().collect(),
        allocated_during_bytes: alloc,
        freed_during_bytes: freed,
        pre_trace_frees: unmatched,
        unexplained_change_bytes: unexplained,
        exited,
        start_lost: measured && data.process_gpu_start_lost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ProcessGpuSample;
    use crate::event::CallEvent;
    use crate::ops::op_by_name;

    fn sample(ts: u64, pid: u32, bytes: u64, phase: SamplePhase) -> ProcessGpuSample {
        ProcessGpuSample {
            ts_ns: ts,
            gpu: 0,
            pid,
            used_bytes: Some(bytes),
            sm_pct: None,
            phase,
        }
    }

    fn call(op: &str, ts: u64, size: Option<u64>, ptr: u64) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: 10,
            pid: 7,
            tid: 7,
            op: op_by_name(op).expect("op").id,
            size,
            ptr: Some(ptr),
            ..Default::default()
        }
    }

    fn trace(samples: Vec<ProcessGpuSample>, polls: u64) -> TraceData {
        let mut d = TraceData {
            calls: vec![
                call("cudaFree", 100, None, 0xdead), // allocated before the trace
                call("cudaMalloc", 200, Some(50 << 20), 0x1000),
                call("cudaMalloc", 300, Some(30 << 20), 0x2000),
                call("cudaFree", 400, None, 0x2000),
            ],
            process_gpu: samples,
            ..Default::default()
        };
        d.stats.insert(PROCESS_POLLS_STAT.into(), polls);
        d
    }

    #[test]
    fn baseline_beside_the_ledger_and_the_unexplained_change() {
        let mb = 1u64 << 20;
        let d = trace(
            vec![
                sample(10, 7, 150 * mb, SamplePhase::Start),
                sample(250, 7, 200 * mb, SamplePhase::Sample),
                sample(500, 7, 70 * mb, SamplePhase::End),
            ],
            3,
        );
        let ledgers = crate::ledger::ledger(&d, None);
        let h = held(&d, &ledgers);
        assert_eq!(h.len(), 1);
        let h = &h[0];
        assert!(h.measured);
        assert_eq!(h.before_trace_bytes, Some(150 * mb));
        assert_eq!(h.at_end_bytes, Some(70 * mb));
        assert_eq!(h.max_bytes, Some(200 * mb));
        assert_eq!(h.allocated_during_bytes, 80 * mb);
        assert_eq!(h.freed_during_bytes, 30 * mb);
        assert_eq!(h.pre_trace_frees, 1);
        // 70 − 150 − (80 − 30) = −130 MiB: the pre-trace free was 100 MiB, the rest driver-side.
        assert_eq!(h.unexplained_change_bytes, Some(-130 * mb as i64));
        let line = h.line(|b| format!("{b}"));
        assert!(
            line.contains(&format!("held before tracing: {} (NVML)", 150 * mb)),
            "{line}"
        );
        assert!(line.contains("not itemized"), "{line}");
        assert!(
            line.contains(&format!("+{} / -{}", 80 * mb, 30 * mb)),
            "{line}"
        );
        assert!(
            line.contains("1 free(s) of memory allocated before the trace"),
            "{line}"
        );
    }

    #[test]
    fn unlisted_at_start_means_nothing_held_and_no_readings_means_not_measured() {
        let d = trace(vec![sample(600, 7, 10, SamplePhase::End)], 2);
        let h = &held(&d, &crate::ledger::ledger(&d, None))[0];
        assert_eq!(h.before_trace_bytes, Some(0));
        assert_eq!(h.at_end_bytes, Some(10));
        let d = trace(Vec::new(), 0);
        let h = &held(&d, &crate::ledger::ledger(&d, None))[0];
        assert!(!h.measured);
        assert_eq!(h.before_trace_bytes, None);
        assert_eq!(h.unexplained_change_bytes, None);
        assert!(h.line(|b| b.to_string()).contains("not measured"));
    }

    #[test]
    fn a_process_that_exited_is_not_compared_with_nvmls_zero_after_exit() {
        let mb = 1u64 << 20;
        let mut d = trace(
            vec![
                sample(10, 7, 150 * mb, SamplePhase::Start),
                sample(250, 7, 200 * mb, SamplePhase::Sample),
                // Gone at the end: the sampler's row for a process no longer listed.
                sample(500, 7, 0, SamplePhase::End),
            ],
            3,
        );
        d.processes.push(crate::data::ProcessInfo {
            pid: 7,
            exit_ns: Some(450),
            ..Default::default()
        });
        let h = &held(&d, &crate::ledger::ledger(&d, None))[0];
        assert!(h.exited);
        assert_eq!(h.at_end_bytes, Some(0));
        // 0 − 150 − 50 would blame 200 MiB on frees the trace never saw.
        assert_eq!(h.unexplained_change_bytes, None);
        assert_eq!(h.before_trace_bytes, Some(150 * mb));
    }

    #[test]
    fn a_run_without_its_first_file_does_not_know_what_was_held_before() {
        let mut d = trace(vec![sample(500, 7, 70 << 20, SamplePhase::End)], 3);
        d.process_gpu_start_lost = true;
        let h = &held(&d, &crate::ledger::ledger(&d, None))[0];
        assert_eq!(h.before_trace_bytes, None, "not 0: the reading was deleted");
        assert_eq!(h.unexplained_change_bytes, None);
        assert!(h.start_lost);
        let line = h.line(|b| b.to_string());
        assert!(line.contains("deleted by --keep"), "{line}");
    }

    #[test]
    fn a_process_with_readings_but_no_call_is_still_shown() {
        let mut d = trace(vec![sample(10, 9, 1 << 30, SamplePhase::Start)], 1);
        d.calls.clear();
        let h = held(&d, &crate::ledger::ledger(&d, None));
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].pid, 9);
        assert_eq!(h[0].before_trace_bytes, Some(1 << 30));
    }
}
