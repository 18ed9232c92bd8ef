//! Taking one process's finding aggregates out once every call of it is
//! in, so that whoever feeds a whole trace (the writer's end-of-file pass,
//! one process at a time) holds one process's aggregates at a time, not
//! every process's: a node agent's file names thousands of short-lived
//! processes, and each one's per-op examples and per-thread histograms
//! were held to the end of the file (issue 16, round 46).
//!
//! What stays: the whole trace's op aggregates (the processes' merged as
//! each is taken, what [`FindingInputs::settle`] would have made of them)
//! and the pinned host ranges still live (carried to a run's next file).

use super::{FindingInputs, OpInputs, ThreadInputs};

/// One process's aggregates, as taken out by [`FindingInputs::take_process`].
#[derive(Debug, Default)]
pub struct ProcessInputs {
    /// Its ops' aggregates by op id, ascending (`process_ops`).
    pub ops: Vec<(u16, OpInputs)>,
    /// Its threads' aggregates by tid, in the order asked for.
    pub threads: Vec<(u32, ThreadInputs)>,
    /// Its first call's start and last call's end (`spans`).
    pub span: Option<(u64, u64)>,
}

impl FindingInputs {
    /// Takes process `pid`'s aggregates out (those of threads `tids`, its
    /// ops' and its span) once every call of it has been fed, in start
    /// order and in end order: its ops are first added to the whole
    /// trace's when those are made from the processes'
    /// ([`FindingInputs::whole_from_processes`]), so the whole trace's are
    /// those of every call fed, taken or not. Its pinned ranges stay when
    /// some are live (a run's next file judges copies against them).
    pub fn take_process(&mut self, pid: u32, tids: &[u32]) -> ProcessInputs {
        let mut out = ProcessInputs::default();
        if let Some(map) = self.process_ops.as_mut() {
            let taken = crate::rollup::take_range(map, (pid, 0)..=(pid, u16::MAX));
            out.ops = taken.into_iter().map(|((_, op), o)| (op, o)).collect();
        }
        if self.whole_from_processes {
            let res = self.res;
            for (op, o) in &out.ops {
                self.ops
                    .entry(*op)
                    .or_insert_with(|| OpInputs::new(res))
                    .add_same_trace(o);
            }
        }
        for &tid in tids {
            if let Some(t) = self.threads.remove(&(pid, tid)) {
                out.threads.push((tid, t));
            }
        }
        out.span = self.spans.remove(&pid);
        if self.pinned.get(&pid).is_some_and(|r| r.live.is_empty()) {
            self.pinned.remove(&pid);
        }
        out
    }

    /// Forgets process `pid`'s pinned ranges, live or not: an aggregate
    /// whose end state nobody reads (an op's scope) once the process's
    /// calls are all in.
    pub fn forget_pinned(&mut self, pid: u32) {
        self.pinned.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::CallEvent;
    use crate::findings::inputs::Resolution;
    use crate::ops::op_by_name;

    fn call(pid: u32, tid: u32, op: &str, ts: u64, dur: u64) -> CallEvent {
        CallEvent {
            pid,
            tid,
            op: op_by_name(op).unwrap().id,
            ts_ns: ts,
            dur_ns: dur,
            ..Default::default()
        }
    }

    fn calls() -> Vec<CallEvent> {
        let mut v = Vec::new();
        for (i, pid) in [10u32, 10, 11, 12, 12, 12].into_iter().enumerate() {
            let i = i as u64;
            v.push(call(
                pid,
                pid + i as u32 % 2,
                "cudaLaunchKernel",
                i * 100,
                5 + i,
            ));
            let mut copy = call(pid, pid, "cudaMemcpy", i * 100 + 20, 40 + 3 * i);
            (copy.runnable_ns, copy.host_ptr, copy.size) = (i, Some(0x1000), Some(64));
            v.push(copy);
            v.push(call(pid, pid, "cudaDeviceSynchronize", i * 100 + 70, 9 * i));
        }
        v
    }

    #[test]
    fn taking_each_process_leaves_the_whole_traces_ops_as_settling_makes_them() {
        let all = calls();
        let mut settled = FindingInputs::new(Resolution::Bucketed, None).whole_from_processes();
        let mut taken = FindingInputs::new(Resolution::Bucketed, None).whole_from_processes();
        for (i, c) in all.iter().enumerate() {
            settled.add_call(i, c, &[]);
            taken.add_call(i, c, &[]);
        }
        settled.settle();
        let mut threads = 0;
        let mut ops = 0;
        for pid in [10u32, 11, 12] {
            let p = taken.take_process(pid, &[pid, pid + 1]);
            threads += p.threads.len();
            ops += p.ops.len();
            for (op, o) in &p.ops {
                let want = &settled.process_ops.as_ref().unwrap()[&(pid, *op)];
                assert_eq!(
                    serde_json::to_value(o).unwrap(),
                    serde_json::to_value(want).unwrap()
                );
            }
            assert_eq!(p.span, settled.spans.get(&pid).copied());
        }
        taken.settle();
        assert_eq!(threads, settled.threads.len());
        assert_eq!(ops, settled.process_ops.as_ref().unwrap().len());
        assert!(taken.threads.is_empty() && taken.spans.is_empty());
        assert!(taken.process_ops.as_ref().unwrap().is_empty());
        assert_eq!(
            serde_json::to_value(&taken.ops).unwrap(),
            serde_json::to_value(&settled.ops).unwrap()
        );
    }
}
