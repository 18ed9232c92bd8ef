//! What the trace-level outputs (`explain`, `report`, `export`) derive from
//! one trace, computed once: the span, the per-call culprits, the memory
//! ledgers and the explanation built from them. The report and the export
//! show the same findings, culprits and ledger as `explain` because they read
//! them from this one object instead of recomputing their own.

use crate::culprits::call_culprits;
use crate::findings::{explain_from, Explanation};
use crate::ledger::{ledger, ProcessLedger};
use crate::{Culprit, TraceData, TraceSpan};

pub struct Analysis {
    pub span: TraceSpan,
    /// Tasks that held the CPU during each call, aligned with `data.calls`.
    pub per_call_culprits: Vec<Vec<Culprit>>,
    /// The memory ledger of every process at the end of the trace.
    pub ledgers: Vec<ProcessLedger>,
    pub explanation: Explanation,
}

impl Analysis {
    pub fn of(data: &TraceData) -> Analysis {
        let per_call_culprits =
            call_culprits(&data.calls, &data.waits, crate::threads::tracer_pid(data));
        let ledgers = ledger(data, None);
        let explanation = explain_from(data, &per_call_culprits, &ledgers);
        Analysis {
            span: TraceSpan::of(data),
            per_call_culprits,
            ledgers,
            explanation,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::explain_report;
    use crate::CallEvent;

    #[test]
    fn the_analysis_explains_like_explain_report() {
        // A failed 1 GiB cudaMalloc: one finding, one ledger, one culprit list.
        let data = TraceData {
            start_ns: Some(0),
            end_ns: Some(10_000),
            calls: vec![CallEvent {
                ts_ns: 100,
                dur_ns: 50,
                pid: 7,
                tid: 7,
                op: 1,
                ret: 2,
                size: Some(1 << 30),
                ..Default::default()
            }],
            ..Default::default()
        };
        let a = Analysis::of(&data);
        let direct = explain_report(&data);
        assert_eq!(
            serde_json::to_value(&a.explanation).ok(),
            serde_json::to_value(&direct).ok()
        );
        assert!(!a.explanation.findings.is_empty());
        assert_eq!(a.ledgers.len(), 1);
        assert_eq!(a.per_call_culprits.len(), 1);
        assert_eq!(a.span.duration_ns(), 10_000);
    }
}
