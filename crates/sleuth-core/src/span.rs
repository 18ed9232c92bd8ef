//! The one definition of a trace's time span, used by every command, the
//! report, the export, the findings and the MCP server.
//!
//! Two views of the same trace, both defined here so no output invents a
//! third:
//! - the **span** (`start_ns..end_ns`): the recording session when the trace
//!   says when it started and ended, else the first call's start to the last
//!   call's end. Offsets a user types (`memory --at 1.5s`) and durations a
//!   user reads ("the trace lasts 12s") are on this span.
//! - the **extent** (`origin_ns..extent_end_ns`): the span widened to cover
//!   every recorded event, so a time axis can draw a wait that began before
//!   tracing started (its thread was already asleep) without a negative time.

use crate::TraceData;

/// Where a trace begins and ends, in CLOCK_MONOTONIC nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TraceSpan {
    /// Session start, or the first call's start.
    pub start_ns: u64,
    /// Session end, or the last call's end; never before `start_ns`.
    pub end_ns: u64,
    /// The earliest recorded event or `start_ns`, whichever is older.
    pub origin_ns: u64,
    /// The latest recorded event or `end_ns`, whichever is newer.
    pub extent_end_ns: u64,
}

impl TraceSpan {
    /// The span of `data`; all zero for a trace with no session times and no events.
    pub fn of(data: &TraceData) -> TraceSpan {
        let first_call = data.calls.iter().map(|c| c.ts_ns).min();
        let last_call = data.calls.iter().map(|c| c.end_ns()).max();
        let start_ns = data.start_ns.or(first_call).unwrap_or(0);
        let end_ns = data.end_ns.or(last_call).unwrap_or(start_ns).max(start_ns);
        let earliest = first_call
            .into_iter()
            .chain(data.waits.iter().map(|w| w.off_ns))
            .chain(data.procs.iter().map(|p| p.ts_ns))
            .min();
        let latest = last_call
            .into_iter()
            .chain(data.waits.iter().map(|w| w.on_ns))
            .chain(data.procs.iter().map(|p| p.ts_ns))
            .max();
        // Without session times the extent starts at the first event of any
        // kind, as the span starts at the first call.
        let origin_ns = match data.start_ns {
            Some(_) => earliest.map_or(start_ns, |e| e.min(start_ns)),
            None => earliest.unwrap_or(start_ns),
        };
        let extent_end_ns = latest.map_or(end_ns, |l| l.max(end_ns));
        TraceSpan {
            start_ns,
            end_ns,
            origin_ns,
            extent_end_ns,
        }
    }

    /// How long the trace lasts (`end_ns - start_ns`).
    pub fn duration_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }

    /// How long a time axis covering every event must be.
    pub fn extent_ns(&self) -> u64 {
        self.extent_end_ns - self.origin_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CallEvent, ProcEvent, ProcKind, WaitEvent, WaitKind};

    fn call(ts_ns: u64, dur_ns: u64) -> CallEvent {
        CallEvent {
            ts_ns,
            dur_ns,
            ..Default::default()
        }
    }

    #[test]
    fn session_times_win_over_calls() {
        let d = TraceData {
            start_ns: Some(100),
            end_ns: Some(900),
            calls: vec![call(200, 50), call(300, 100)],
            ..Default::default()
        };
        let s = TraceSpan::of(&d);
        assert_eq!((s.start_ns, s.end_ns, s.duration_ns()), (100, 900, 800));
        assert_eq!((s.origin_ns, s.extent_end_ns), (100, 900));
    }

    #[test]
    fn without_session_times_the_calls_bound_the_span() {
        // Calls out of order: the span is min start to max end, not first/last.
        let d = TraceData {
            calls: vec![call(300, 500), call(200, 10)],
            ..Default::default()
        };
        let s = TraceSpan::of(&d);
        assert_eq!((s.start_ns, s.end_ns, s.duration_ns()), (200, 800, 600));
    }

    #[test]
    fn extent_covers_waits_and_lifecycle_events_outside_the_session() {
        let d = TraceData {
            start_ns: Some(1_000),
            end_ns: Some(2_000),
            calls: vec![call(1_100, 10)],
            waits: vec![WaitEvent {
                pid: 1,
                tid: 1,
                kind: WaitKind::Blocked,
                off_ns: 400,
                wake_ns: 1_200,
                on_ns: 1_300,
                prev_state: 1,
                cpu: 0,
                culprits: Vec::new(),
                waker: None,
            }],
            procs: vec![ProcEvent {
                kind: ProcKind::Exit,
                ts_ns: 2_500,
                pid: 1,
                tid: 1,
                ppid: 0,
                exit_code: 0,
                comm: String::new(),
            }],
            ..Default::default()
        };
        let s = TraceSpan::of(&d);
        assert_eq!(s.duration_ns(), 1_000, "the span stays the session");
        assert_eq!(
            (s.origin_ns, s.extent_end_ns, s.extent_ns()),
            (400, 2_500, 2_100)
        );
    }

    #[test]
    fn an_end_before_the_start_and_an_empty_trace_give_no_negative_span() {
        let d = TraceData {
            start_ns: Some(500),
            end_ns: Some(100),
            ..Default::default()
        };
        let s = TraceSpan::of(&d);
        assert_eq!((s.start_ns, s.end_ns, s.duration_ns()), (500, 500, 0));
        assert_eq!(TraceSpan::of(&TraceData::default()), TraceSpan::default());
    }
}
